"""The Redis broker (``redis://HOST:PORT/DB``): many relay processes, one set of channels.

Theory of operation
-------------------
Per channel ``C``, Redis holds:

* ``tr:epoch:C`` the epoch, ``tr:offset:C`` the last offset and ``tr:seq:C``
  the last event number, all refreshed on use and kept for ``KEY_TTL``, from the
  channel's first terminal frame on (before it, a subscribe only reserves the
  epoch, in ``tr:reserved``, one hash for every channel, bounded by
  ``MAX_RESERVED_EPOCHS`` and ``RESERVED_EPOCH_TTL``: junk channel names create no
  key of their own); ``tr:channels`` lists the channels with such keys by last use, and
  past ``--max-history-channels`` of them a terminal script drops the least recently
  used one's keys, history and held ids, passing over those with a subscriber or a message in
  progress (see ``scripts``);
* ``tr:history:C`` a Stream of terminal frames with ids ``<offset>-0``, capped
  at ``--history-size`` and expiring ``--history-ttl`` after the last one;
* ``tr:live:C`` the set of messages in progress (``owner|id``), and for each
  the text so far in ``tr:text:owner|id`` (``APPEND``ed per delta, expiring
  after twice ``--idle-timeout`` without an update, so a crashed process's
  texts vanish). A structured message keeps there, instead, the text it had before its
  first chunk and what it applied since (``partlog``): a catch-up skips it (it is delivered
  whole), and a process taking its session over, or aborting it, rebuilds its parts.

Snapshots of messages in progress on other processes read those texts. Keeping
the text in Redis costs one ``APPEND`` per delta, inside the same script that
publishes the delta, so it adds no round trip; asking the owning process
instead would need a request, a reply and a timeout on every join, and would
fail exactly when the owner is slow.

Each change is one Lua script, so it is atomic: a terminal frame gets its
offset, joins the history and is published in one step, and a catch-up reads
offset, epoch, ``seq``, history and texts as one consistent cut.

Pub/sub topics: ``tr:m:C`` (terminal frames), ``tr:d:C`` (deltas, structured messages' chunks and
snapshots) and ``tr:i:INSTANCE`` (notes to that process: cancels for its producers, chat requests
for them and the answers about those). A
process subscribes to a channel's topics only while it has a local subscriber
there (``tr:d:C`` only for a deltas subscriber), so traffic reaches only the
processes that need it. A published event is ``KIND|SEQ|FRAME``: the frame is
serialized once, by the process that publishes it, and each receiving process
splits off the header and hands the frame bytes on without decoding them. A
delta travels as its fields (``d|SEQ|ID_BYTES|ID TEXT``) rather than as JSON, so
the receiving process can merge deltas (flush window, slow subscribers) without
parsing; it serializes each delta frame once for all its sockets.

Writes are queued and sent by one writer task in pipelines, so a producer's
events reach Redis in order without a round trip each. A message's deltas join its
queued write (one script per message per pipeline, not per delta), and a message whose
final comes while its open is still the last write queued goes whole, in one script
(``WHOLE``): it is never listed as in progress, since nobody could have seen it there.
The queue holds at most ``MAX_QUEUE`` writes and ``MAX_QUEUE_CHARS`` characters of the
text they carry, counted until the writer settled them (``Held``); past either, deltas are
not queued and their message is marked for a resync, and terminal writes are refused as
below. What it holds counts in ``memory_bytes``. The messages marked for a resync stay
within twice those in progress here (or ``MAX_DIRTY``): those that ended are forgotten as
the set grows. If Redis is down, terminal writes raise
:class:`~token_relay.core.errors.BrokerUnavailable` (the producer gets
``broker_unavailable`` and no ack, so it retries), deltas mark their message
for a resync, and the reader reconnects with backoff. Once it is back, every
message in progress here is rewritten to Redis (its full text, and a
``snapshot`` frame to deltas subscribers), and the listener is told so that
subscribers resume by offset: what was published meanwhile may have been missed.
A terminal write that timed out may still have run in Redis: the same owner's same frame,
sent again (the retried final, or the outbox's copy), publishes nothing more within
``--id-hold`` (``tr:published:C``) and is answered with the frame as published. The outbox
is sent again after any batch that went through, and a second after a try of it failed.

The package, one module per concept, behind :class:`RedisBroker` (``broker``):

* ``keys``: key and topic names, and their lifetimes;
* ``packing``: commands packed by hiredis;
* ``connections``: the pools and the scripts loaded there (``scripts``, the Lua);
* ``health``: the probe, and the outages seen;
* ``writes``: the writes queued, their arguments by name, and the runs of deltas;
* ``partlog``: a structured message's log, kept where its text would be;
* ``pipeline``: the queue, the writer task, and the resync of messages;
* ``outbox``: terminal frames kept while Redis is down;
* ``reader``: the pub/sub reader;
* ``catchup``: a channel's cut;
* ``sessions`` and ``leases``: producer sessions, and the reaping of a gone process's;
* ``requests``: the producers that take each channel's chat requests (``tr:q:C``), and
  handing a request to the newest, through its process's inbox;
* ``webhooks``: the webhook outbox.
"""

from __future__ import annotations

from .broker import RedisBroker
from .packing import PACKING

__all__ = ["PACKING", "RedisBroker"]
