"""Process control shared by the test suite and the benchmarks, one module per concept.

* :mod:`.machine`: :func:`free_port`, :func:`rss_bytes`, :func:`cpu_seconds`, small facts
  about the machine; :func:`eventually`, poll a condition until it holds, or fail after a
  timeout.
* :mod:`.redis_server`: :class:`RedisServer`, a private ``redis-server`` on a free port, with
  no persistence, that a test can kill and start again.
* :mod:`.processes`: :class:`ServiceProcess`, ``python -m MODULE --port 0 ...`` as a real
  subprocess, ready once it logs the port it listens on; :func:`relay_process` is one for
  ``token_relay``; :func:`relays_on`, two of them on one Redis.
* :mod:`.sse`: :class:`SseReader`, a minimal Server-Sent Events client over one real socket.
* :mod:`.nginx`: :class:`Nginx`, a real ``nginx`` running the repository's
  ``deploy/nginx.conf`` in front of relays.
* :mod:`.proxy`: :class:`Proxy`, a TCP proxy that can cut or freeze every connection at
  once; :class:`Balancer`, one that spreads connections over backends that may change;
  :class:`FrameLimitProxy`, a WebSocket proxy with a frame limit of its own (1009).
* :mod:`.webhooks`: :class:`WebhookReceiver`, a real HTTP server taking webhook POSTs.
* :mod:`.liveparts`: :class:`LiveParts`, each message's parts as a deltas subscriber
  rebuilds them from live frames.

None of it ships in the wheel, and the relay never uses it.
"""

from .liveparts import LiveParts
from .machine import cpu_seconds, eventually, free_port, rss_bytes
from .nginx import Nginx
from .npm import npm_installed
from .processes import ServiceProcess, relay_process, relays_on
from .proxy import Balancer, FrameLimitProxy, Proxy
from .redis_server import RedisServer
from .sse import SseEvent, SseReader
from .webhooks import Received, WebhookReceiver

__all__ = [
    "Balancer",
    "FrameLimitProxy",
    "LiveParts",
    "Nginx",
    "Proxy",
    "Received",
    "RedisServer",
    "ServiceProcess",
    "SseEvent",
    "SseReader",
    "WebhookReceiver",
    "cpu_seconds",
    "eventually",
    "free_port",
    "npm_installed",
    "relay_process",
    "relays_on",
    "rss_bytes",
]
