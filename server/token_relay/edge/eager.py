"""A handler run eagerly: its first step now, in the caller's pass of the event loop; only
what is left once it waits goes on in a task.

A request whose answer is ready once its body is read (a Durable Streams append on the
store in this process) is then answered by the call that read it, for no task, no extra
pass of the loop and no timer: Python 3.12's eager tasks, for the handlers that are safe
to run so. Such a handler must not need a current task before it first waits (no
``asyncio.timeout``, as redis-py's calls use): the relay starts eagerly only what runs on
this process's own state.

If the handler raises in its first step, the exception reaches the caller; after that, it
is the task's, as for any spawned handler. A task cancelled while the handler waits cancels
what it waits for, as a task does, and the handler sees it there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

__all__ = ["start"]


def start(
    coroutine: Coroutine[Any, Any, None], spawn: Callable[[Coroutine[Any, Any, None]], None]
) -> bool:
    """Run ``coroutine`` up to where it first waits, and hand the rest to ``spawn`` (a task);
    True if it ran to its end within this call."""
    try:
        waited = coroutine.send(None)
    except StopIteration:
        return True
    spawn(_rest(coroutine, waited))
    return False


async def _rest(coroutine: Coroutine[Any, Any, None], waited: Any) -> None:
    """Step ``coroutine`` on, as a task steps its own: each time what it waits for is done
    (``None``: a bare yield, one pass of the loop)."""
    while True:
        try:
            if waited is None:
                await asyncio.sleep(0)
            else:
                # Yielded to a task, a future is marked as waited on; the task that takes it
                # clears the mark, as asyncio's own task does, before waiting on it.
                waited._asyncio_future_blocking = False
                await waited
        except asyncio.CancelledError as cancelled:
            if waited is None or not waited.cancelled():
                # This task was cancelled, not what the handler waits for: tell it so.
                try:
                    waited = coroutine.throw(cancelled)
                except StopIteration:
                    return
                continue
        except BaseException:
            pass
        try:
            waited = coroutine.send(None)
        except StopIteration:
            return
