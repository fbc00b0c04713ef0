"""The one buffer every connection of a proxy reads into."""

from __future__ import annotations

import asyncio


class ReadBuffer:
    """The buffer every connection of a proxy reads into (both are ``asyncio.BufferedProtocol``).

    uvloop copies each read of a plain ``asyncio.Protocol`` into a new ``bytes``; on the relay
    path that copy, and the allocation of the large objects it needs, was the largest part of the
    proxy's own work. Reads are handled one at a time, each to the end before the next, so one
    buffer serves them all as long as no transport keeps a view of it afterwards. What is read
    goes on as slices of the buffer only to a transport with nothing queued, which sends at once;
    to one already backed up it goes as a copy. Should a write begun with nothing queued not
    finish, the transport keeps the rest as a view: the buffer is left to it and a new one is
    made (``replace``). Anything kept past the read (a partial header, a request the proxy
    serves itself, a buffered response) is copied out of it.
    """

    SIZE = 1 << 20  # reads of up to 1 MiB: fewer system calls on the consume path

    __slots__ = ("view", "replaced")

    def __init__(self) -> None:
        self.view = memoryview(bytearray(self.SIZE))
        self.replaced = 0  # buffers left to a transport

    @staticmethod
    def may_lend(out: asyncio.Transport | None) -> bool:
        """Whether slices of the buffer may be written to ``out`` as they are: it sends at once."""
        return out is not None and not out.get_write_buffer_size() and not out.is_closing()

    def returned(self, out: asyncio.Transport | None) -> None:
        """After a read whose slices went to ``out``: if it kept what it could not send yet (a
        view), the buffer is left to it."""
        if out is not None and (out.get_write_buffer_size() or out.is_closing()):
            self.replace()

    def replace(self) -> None:
        self.view = memoryview(bytearray(self.SIZE))
        self.replaced += 1

