"""The answers a client connection owes, in request order (no I/O).

Every request that expects a response takes a ``Slot`` in the connection's ``AnswerOrder`` when
its header is read. Responses are written to the client strictly in slot order, so answers the
proxy serves itself (which finish whenever their handlers do) and forwarded ones (which the
broker sends in order) interleave correctly under pipelining. A forwarded response may stream
to the client as it arrives only while its slot is the next one owed.
"""

from __future__ import annotations

from collections import deque
from time import perf_counter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable


class Slot:
    """A response owed to the client, in request order."""

    __slots__ = ("api_key", "version", "corr", "data", "streaming", "started", "request", "probe", "ahead",
                 "ahead_rest", "release")

    def __init__(self, api_key: int, version: int, corr: int) -> None:
        self.api_key = api_key
        self.version = version
        self.corr = corr
        self.data: bytes | bytearray | list | None = None  # a list: buffers to write in turn
        self.streaming = False
        self.started = perf_counter()
        self.request: Any = None  # the decoded request, for the few rewrites that need it
        self.probe: asyncio.Future | None = None  # the proxy's own request: its decoded response goes here
        self.ahead: list | None = None  # the beginning of a local response, written before the rest was known
        # (response body, the rest of its encoding): what follows ``ahead`` if the handler returns
        # that very body, unchanged since (see ``ClientConnection.send_ahead``)
        self.ahead_rest: tuple[Any, list] | None = None
        self.release: Callable[[], None] | None = None  # called once the response has left the process


class AnswerOrder(deque):
    """The slots of the answers owed, oldest first (a deque: ``order[0]`` is the next one owed)."""

    def is_next(self, slot: Slot) -> bool:
        """Whether ``slot``'s answer may be written now (streamed, or sent ahead)."""
        return bool(self) and self[0] is slot

    def next_ready(self) -> Slot | None:
        """The next answer owed, taken off, if its data is there; else None (it, or nothing, is owed)."""
        if self and self[0].data is not None:
            return self.popleft()
        return None


def _rest_after(ahead: list, pieces: list) -> list | None:
    """What is left of a response's ``pieces`` once ``ahead`` was written; None if the response
    does not begin with ``ahead`` (it changed since)."""
    n = len(ahead)
    if len(pieces) < n or not all(a is b or a == b for a, b in zip(ahead, pieces[:n], strict=True)):
        return None
    return pieces[n:]
