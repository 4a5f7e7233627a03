"""``RelayProducer.forward``: a provider SDK's stream, as it is, forwarded as one message.

Theory of operation
-------------------
:func:`forward` opens the stream (an async iterator, a sync one, or a context manager such
as ``anthropic``'s ``messages.stream()``, entered here), reads its events, and picks the
translator by the first event's type (:func:`translator_for`): a ``chat.completion.chunk``
is Chat Completions, a ``response.*`` event the Responses API
(:mod:`token_relay.client.openai_chunks`), a ``message_start`` and its kin Anthropic's
Messages (:mod:`token_relay.client.anthropic_chunks`); ``openai``'s
``chat.completions.stream()`` wraps each chunk in a ``chunk`` event, which is unwrapped.
Neither SDK is imported: the
events say what they are. Each event's chunks go out with ``send_chunk`` as they come;
the final carries the meta (usage, ``finishReason``...) and its acknowledgement is
returned.

A sync stream is read in a worker thread, one event at a time, so the event loop never
blocks on the provider; to close it while that thread waits for the provider, its socket
is shut down first.

Stop: while it reads, :func:`forward` watches the producer for a Stop (a subscriber's
``cancel``) of its message. One that comes first stops the reading, closes the upstream
stream (``close()``/``aclose()``, or the context manager's exit: the HTTP response is
closed, so the provider stops generating), and ends the message with an ``abort``
event, reason ``cancelled``, its meta so far on it; :func:`forward` then returns None.
If the provider's stream fails, the message ends the same way with reason ``error``
(``meta.errorText`` says why) and the exception propagates.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import socket
from collections.abc import AsyncIterator
from typing import Any, Literal, Protocol

from ..core.errors import RelayError, UsageError
from ..core.protocol import Ack, Chunk, Meta
from .anthropic_chunks import EVENTS, MessagesChunks
from .openai_chunks import ChatCompletionsChunks, ResponsesChunks, field

__all__ = ["Relay", "Translator", "forward", "translator_for"]

ANTHROPIC_DERIVED = frozenset({"text", "thinking", "input_json", "citation", "signature"})
"""The events ``messages.stream()`` adds to the raw ones (they repeat them)."""

_END = object()


class Translator(Protocol):
    """A provider's stream events to chunks, keeping the message's meta."""

    meta: dict[str, Any]

    def feed(self, event: Any) -> list[Chunk]: ...

    def end(self) -> list[Chunk]: ...


class Relay(Protocol):
    """What :func:`forward` needs of a :class:`~token_relay.client.RelayProducer`."""

    async def send_chunk(
        self, message_id: str, chunk: Chunk, *, channel: str | None = ..., meta: Meta | None = ...
    ) -> None: ...

    async def finish(
        self, message_id: str, *, channel: str | None = ..., meta: Meta | None = ...
    ) -> Ack: ...

    async def abort(
        self,
        message_id: str,
        *,
        reason: Literal["cancelled", "error"] = ...,
        channel: str | None = ...,
        meta: Meta | None = ...,
    ) -> None: ...

    def stop_requested(self, message_id: str) -> asyncio.Event: ...

    def stop_done(self, message_id: str) -> None: ...


def translator_for(event: Any) -> Translator:
    """The translator for a stream whose first event is ``event``."""
    if field(event, "object") == "chat.completion.chunk":
        return ChatCompletionsChunks()
    kind = field(event, "type")
    if isinstance(kind, str):
        if kind.startswith("response.") or kind == "error":
            return ResponsesChunks()
        if kind in EVENTS or kind in ANTHROPIC_DERIVED:
            return MessagesChunks()
    raise UsageError(
        f"not an OpenAI Chat Completions, Responses or Anthropic Messages event: {event!r:.200}"
    )


@contextlib.asynccontextmanager
async def _opened(stream: Any) -> AsyncIterator[AsyncIterator[Any]]:
    """The stream's events; the stream is closed (or exited) on the way out."""
    if hasattr(stream, "__aiter__"):
        try:
            yield aiter(stream)
        finally:
            await _close(stream)
    elif hasattr(stream, "__iter__"):
        try:
            yield _threaded(iter(stream))
        finally:
            _shut_down(stream)
            await _close(stream)
    elif hasattr(stream, "__aenter__"):
        inner = await stream.__aenter__()
        try:
            async with _opened(inner) as opened:
                yield opened
        finally:
            await stream.__aexit__(None, None, None)
    elif hasattr(stream, "__enter__"):
        inner = await asyncio.to_thread(stream.__enter__)
        try:
            async with _opened(inner) as opened:
                yield opened
        finally:
            await asyncio.to_thread(stream.__exit__, None, None, None)
    else:
        raise UsageError(f"not a stream (no iterator, no context manager): {stream!r:.200}")


async def _close(stream: Any) -> None:
    """Close an SDK stream, sync or async (its HTTP response is closed with it), or a
    generator."""
    close = getattr(stream, "aclose", None) or getattr(stream, "close", None)
    if close is None:
        return
    if inspect.iscoroutinefunction(close):
        await close()
    else:
        await asyncio.to_thread(close)


def _shut_down(stream: Any) -> None:
    """Shut a sync stream's socket down, so that the worker thread blocked reading it wakes
    up and the provider sees the connection end (closing a socket that another thread
    reads closes nothing on Linux until that read returns). The socket is found through
    httpx's ``network_stream`` extension; a stream without one is only closed."""
    response = getattr(stream, "response", None)
    extensions = getattr(response, "extensions", None)
    network = extensions.get("network_stream") if isinstance(extensions, dict) else None
    get_extra_info = getattr(network, "get_extra_info", None)
    connection = get_extra_info("socket") if get_extra_info is not None else None
    if isinstance(connection, socket.socket):
        with contextlib.suppress(OSError):
            connection.shutdown(socket.SHUT_RDWR)


async def _threaded(events: Any) -> AsyncIterator[Any]:
    """A sync iterator's items, each read in a worker thread."""
    while True:
        event = await asyncio.to_thread(next, events, _END)
        if event is _END:
            return
        yield event


async def forward(
    relay: Relay, stream: Any, *, message_id: str, channel: str | None = None
) -> Ack | None:
    """Forward ``stream`` as message ``message_id``: its acknowledgement, or None if a Stop
    ended it first (the stream is then closed, and the message aborted, ``cancelled``)."""
    stop = relay.stop_requested(message_id)
    state: dict[str, Translator] = {}
    try:
        async with _opened(stream) as events:
            reading = asyncio.ensure_future(_pump(relay, events, message_id, channel, state))
            stopped = asyncio.ensure_future(stop.wait())
            try:
                await asyncio.wait({reading, stopped}, return_when=asyncio.FIRST_COMPLETED)
            except BaseException:
                reading.cancel()  # forward itself was cancelled: so is the reading
                raise
            finally:
                stopped.cancel()
            if not reading.done():
                reading.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reading
                meta = state["translator"].meta if "translator" in state else None
                await relay.abort(message_id, channel=channel, meta=meta)
                return None
            error = reading.exception()
            if error is not None:
                if "translator" in state:
                    meta = {**state["translator"].meta, "finishReason": "error"}
                    meta["errorText"] = str(error) or type(error).__name__
                    # A message the relay already gave up (MessageFailed) needs no abort.
                    with contextlib.suppress(RelayError):
                        await relay.abort(message_id, reason="error", channel=channel, meta=meta)
                raise error
            translator = state.get("translator")
            for chunk in translator.end() if translator is not None else ():
                await relay.send_chunk(message_id, chunk, channel=channel)
            meta = translator.meta if translator is not None else None
    finally:
        relay.stop_done(message_id)
    return await relay.finish(message_id, channel=channel, meta=meta)


async def _pump(
    relay: Relay,
    events: AsyncIterator[Any],
    message_id: str,
    channel: str | None,
    state: dict[str, Translator],
) -> None:
    """Read every event and send its chunks (the translator, once known, in ``state``)."""
    async for event in events:
        if field(event, "type") == "chunk" and field(event, "chunk") is not None:
            # openai's chat.completions.stream(): each raw chunk comes wrapped; the
            # events it adds (content.delta...) repeat them and translate to nothing.
            event = field(event, "chunk")
        translator = state.get("translator")
        if translator is None:
            translator = state["translator"] = translator_for(event)
        for chunk in translator.feed(event):
            await relay.send_chunk(message_id, chunk, channel=channel)
