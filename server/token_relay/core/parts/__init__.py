"""Assemble one message's parts from AI SDK chunks: text, reasoning, tools, sources, data.

Theory of operation
-------------------
A reply is not one text: it streams reasoning, tool calls, text, sources and data,
interleaved and in steps. A producer describes it with the chunks of the AI SDK's UI
message stream (``UIMessageChunk`` of the ``ai`` package, major 7), and
:class:`MessageParts` assembles them into the list of parts that ``ai``'s own
``readUIMessageStream`` would build from the same chunks (``message.parts``), key for
key and state for state. Keys that ``ai`` leaves ``undefined`` are absent, as they are
once the message is JSON.

Input, per part:

* ``text-start`` / ``text-delta`` / ``text-end`` and ``reasoning-start`` /
  ``reasoning-delta`` / ``reasoning-end`` (``id``; ``providerMetadata`` where ``ai``
  takes it; ``citations`` on ``text-end``). A start opens a part under its chunk id;
  deltas and the end find it by that id. An ended id may be started again: a new part.
* :meth:`MessageParts.delta`, a top-level delta naming no part, extends the message's
  *implicit* text part, chunk id ``"text"``. Its first delta (an empty one too) creates
  it where the message is then; ``text-start`` with id ``"text"`` opens it as well.
* Tool calls, by ``toolCallId`` (unique in the message). The part is
  ``tool-<toolName>`` (``dynamic-tool`` if ``dynamic``); its ``state`` follows::

      tool-input-start --> input-streaming --tool-input-delta--> input-streaming
      input-streaming, (none) --tool-input-available--> input-available
      input-streaming, (none) --tool-input-error--> output-error
      input-available --tool-approval-request--> approval-requested
      approval-requested --tool-approval-response--> approval-responded
      input-available, approval-*, output-available (preliminary)
          --tool-output-available--> output-available (final unless ``preliminary``)
      input-streaming, input-available, approval-*, output-available (preliminary)
          --tool-output-error--> output-error
      input-available, approval-* --tool-output-denied--> output-denied

  A final state takes nothing more (``part_ended``); another step out of order is
  ``invalid_chunk``. ``ai`` is looser; these are the steps whose compacted catch-up
  rebuilds the very same part. While the input streams (JSON text, or plain text if
  ``inputEncoding`` is ``"text"``), ``input`` is the text so far repaired into JSON
  as ``ai`` repairs it (``fixJson``, ported state for state; computed when the parts
  are read, not per delta), and ``rawInput`` the text itself.
* ``source-url``, ``source-document``, ``file``: a part each, as given.
* ``data-<name>``: a part as given; one with an ``id`` replaces the ``data`` of the
  part of the same type and id, in place. A ``transient`` one is not stored.
* ``start-step`` adds a ``step-start`` part. ``finish-step`` ends the text and
  reasoning parts still open (their state stays ``"streaming"``, as in ``ai``; later
  deltas for them are refused), as ``ai`` 5 and 6 do; ``ai`` 7 does nothing there, so
  both accept what this core accepts. A tool whose input still streams when the next
  step starts takes no more input chunks (``ai`` would add a second part for them).

One difference is ``ai``'s, not the parts': ``readUIMessageStream`` yields no new
message for ``start-step`` alone, so if nothing follows one, its last message lacks
the ``step-start`` part that its state (and :meth:`MessageParts.parts`) holds.

Message-level chunks (``start``, ``finish``, ``abort``, ``error``,
``message-metadata``) are not parts: the edge maps them. ``reasoning-file``,
``custom``, ``steering-message`` and ``reset-step`` (``ai`` 7 only) are refused too.

The seed's rules, for every part that carries text (text, reasoning, a tool's input
text): empty deltas count (the first creates the implicit part); a delta for an ended
part is refused (``part_ended``) and changes nothing; a UTF-16 surrogate pair split
across two deltas of one part is joined (:func:`~token_relay.core.surrogates.mend`), and
a half that never pairs becomes U+FFFD when the part ends.

Finalize (:meth:`MessageParts.finalize`, idempotent) completes the parts: every text
and reasoning part becomes ``"done"``; a tool whose input still streams gets its input
text parsed as JSON (``JSON.parse``'s rules, with ``ai``'s refusal of ``__proto__``),
as if ``tool-input-available`` came with it, or, when it is not JSON, fails as if
``tool-output-error`` came (the errorText says so; a static tool keeps the text in
``rawInput``, as ``ai`` does). Other parts stay as they are. After finalize, chunks
and deltas are ignored, as the seed ignores deltas for a finalized id. An aborted
message needs nothing here: its parts stay as they are, and the edge stops feeding it.

Compacted catch-up (:meth:`MessageParts.catch_up`): the chunks that rebuild
``parts()`` when fed after a ``start``: per part, in order, its start, ONE delta
holding its text so far, and its end if it has ended; a tool as its start, one input
delta, and one chunk per later stage it reached (the last output only); a step as
``start-step``; sources, files and data as themselves; a ``finish-step`` where one
closed parts. The chunks that arrive later then apply on top, so no part comes twice.
:func:`chunks_of` makes the same chunks of a list of parts alone (a completed message's
``parts``, to replay it as a stream), naming the text parts itself.

Errors and bounds. A chunk refused raises :class:`~token_relay.core.errors.PartRejected`
and changes nothing; its ``code`` is one of :data:`CODES`. Bounds (:class:`PartLimits`),
each refusing the chunk and keeping the part as it was:

* ``max_parts`` parts in the message (``too_many_parts``);
* ``max_part_chars`` characters in one text or reasoning part, and in any string
  field of a chunk (a url, a title, an errorText) (``part_too_large``);
* ``max_tool_input_chars`` characters of a tool's input text (``part_too_large``);
* ``max_data_bytes`` bytes of the compact UTF-8 JSON of any structured value: a data
  part's ``data``, a tool's ``input`` and ``output``, and the metadata objects
  (``providerMetadata``, ``toolMetadata``, ``citations``, approval values)
  (``part_too_large``).

Size. :meth:`MessageParts.chars` is what the message holds: the count the relay bounds
with ``--max-message-chars`` and counts toward ``--max-memory-bytes`` (with the parts of
the completed messages it keeps). It is the sum of

* the characters of every string a part keeps: the text of a text or reasoning part and a
  tool's input text (``rawInput`` is that text, counted once; half a surrogate pair held
  back counts once it is a character); the ids (a text or reasoning part's chunk id, but
  the implicit text part's ``"text"``, ``toolCallId``, ``sourceId``, a data part's ``id``);
  a tool's name and the name in ``data-<name>``; ``url``, ``title``, ``filename``,
  ``mediaType``, ``errorText``, ``inputEncoding``;
* the bytes of the compact UTF-8 JSON (as ``max_data_bytes`` measures it) of every JSON
  value a part keeps: a data part's ``data``, a tool's ``input`` (a string too) and
  ``output``, ``providerMetadata`` (a tool's ``callProviderMetadata`` and
  ``resultProviderMetadata``), ``toolMetadata``, ``citations`` as kept, and a tool's
  ``approval`` object (its id, descriptor, ``inputSchemaInput``, reasons, ``isAutomatic``,
  signature, ``approved``).

Nothing else counts: a part's type (but the name in it) and state, its booleans
(``providerExecuted``, ``preliminary``), and what the core keeps to find and order the
parts (a fixed size per part, and there are at most ``max_parts``). The count is of what the
parts hold now: a value replaced (a data part's ``data`` by id, a tool's part through its
states, ``providerMetadata`` given again, a preliminary output by the next) counts as it is
now, and one ``ai`` drops leaves the count (a tool's output on an error, its
``inputEncoding`` once its input is whole). So the same parts count the same however their
chunks came: split otherwise, as a catch-up, finalized here or rebuilt from the result.

The core keeps the values of the chunks it is given: the caller hands them over.
:meth:`MessageParts.parts` returns new dicts, whose nested values are shared.

The package, one module per concept, behind :class:`MessageParts` (``message``):

* ``refusals``: the codes of a refusal, and the bounds (:class:`PartLimits`);
* ``fields``: a chunk's fields read and checked, and JavaScript's ``undefined``;
* ``partialjson``: a tool's input parsed, or repaired, as ``ai`` does;
* ``records``: a part's text so far, and the records of text, reasoning and tool parts;
* ``state``: what a message's parts hold;
* ``texts``: text and reasoning chunks, and the implicit text part;
* ``tools``: the tool state machine;
* ``compaction``: the chunks that rebuild a list of parts (:func:`chunks_of`), under a
  message's catch-up too;
* ``message``: the chunks applied by kind, finalize, and the parts, text and catch-up read.

This package is pure: no I/O, no asyncio, no clock.
"""

from __future__ import annotations

from ..errors import PartRejected
from .compaction import chunks_of
from .fields import ABSENT as ABSENT
from .message import MESSAGE_CHUNKS as MESSAGE_CHUNKS
from .message import MessageParts
from .partialjson import partial_json
from .records import OUTPUT_STATES as OUTPUT_STATES
from .records import TERMINAL as TERMINAL
from .refusals import CODES, PartLimits
from .refusals import INVALID_CHUNK as INVALID_CHUNK
from .refusals import PART_ENDED as PART_ENDED
from .refusals import PART_EXISTS as PART_EXISTS
from .refusals import PART_TOO_LARGE as PART_TOO_LARGE
from .refusals import TOO_MANY_PARTS as TOO_MANY_PARTS
from .refusals import UNKNOWN_PART as UNKNOWN_PART
from .texts import IMPLICIT as IMPLICIT

__all__ = ["CODES", "MessageParts", "PartLimits", "PartRejected", "chunks_of"]

_partial_json = partial_json
"""The repair of a tool's streamed input, under the name its tests import."""
