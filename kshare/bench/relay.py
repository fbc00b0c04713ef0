"""A bare TCP byte relay on asyncio + uvloop: the ceiling a Python proxy can reach.

Every accepted connection gets one connection to ``--upstream``; bytes are copied both ways
as they come, with no parsing and no rewriting. Reads go into a 1 MiB buffer
(``asyncio.BufferedProtocol``) and are handed to the other side's transport without a copy;
only when the other side cannot take them at once (the transport keeps a reference to
the unsent part) is a fresh buffer allocated for the next read. A peer that cannot keep up
pauses reading on the other side (the usual asyncio flow control).

Nothing here knows about Kafka: for a client to stay on the relay, the broker must advertise
the relay's address (``kshare bench`` gives the broker a second listener advertised at the relay
port: :class:`kshare.bench.runner.Env`).

    python -m kshare.bench.relay --listen 127.0.0.1:19092 --upstream 127.0.0.1:9092

Prints ``relay listening on HOST:PORT -> HOST:PORT`` once it accepts connections; stops on
SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

READ_SIZE = 1 << 20  # 1 MiB


class _Side(asyncio.BufferedProtocol):
    """One end of a relayed connection; ``peer`` is the other end."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None
        self._buf = memoryview(bytearray(READ_SIZE))
        self._pending: list[bytes] = []  # read before the peer was connected
        self.closed = False

    # -- asyncio.BufferedProtocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._buf

    def buffer_updated(self, nbytes: int) -> None:
        peer = self.peer
        if peer is None or peer.transport is None:
            self._pending.append(bytes(self._buf[:nbytes]))
            return
        out = peer.transport
        out.write(self._buf[:nbytes])
        if out.get_write_buffer_size():
            # the transport holds a view of the unsent bytes: leave this buffer to it
            self._buf = memoryview(bytearray(READ_SIZE))

    def eof_received(self) -> bool | None:
        if self.peer is not None and self.peer.transport is not None and self.peer.transport.can_write_eof():
            self.peer.transport.write_eof()
        return True  # keep our write side open until the peer finishes too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.peer is not None and self.peer.transport is not None and not self.peer.closed:
            self.peer.transport.close()

    # -- flow control: our writes are backed up, so stop reading on the other side
    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None and not self.peer.closed:
            self.peer.transport.resume_reading()

    def flush_pending(self) -> None:
        assert self.peer is not None and self.peer.transport is not None
        for chunk in self._pending:
            self.peer.transport.write(chunk)
        self._pending.clear()


class _ClientSide(_Side):
    def __init__(self, upstream: tuple[str, int]) -> None:
        super().__init__()
        self.upstream = upstream

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        transport.pause_reading()  # type: ignore[attr-defined]
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, up = await loop.create_connection(_Side, *self.upstream)
        except OSError as exc:
            print(f"relay: cannot reach {self.upstream}: {exc}", file=sys.stderr)
            assert self.transport is not None
            self.transport.close()
            return
        up.peer, self.peer = self, up
        if self.closed:
            up.transport.close()  # type: ignore[union-attr]
            return
        self.flush_pending()
        assert self.transport is not None
        self.transport.resume_reading()  # type: ignore[attr-defined]


def _hostport(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host or "127.0.0.1", int(port)


async def serve(listen: tuple[str, int], upstream: tuple[str, int]) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _ClientSide(upstream), *listen, reuse_address=True)
    host, port = server.sockets[0].getsockname()[:2]
    print(f"relay listening on {host}:{port} -> {upstream[0]}:{upstream[1]}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kshare.bench.relay", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--listen", required=True, help="HOST:PORT to accept connections on")
    parser.add_argument("--upstream", required=True, help="HOST:PORT to relay to")
    args = parser.parse_args(argv)
    import uvloop

    uvloop.run(serve(_hostport(args.listen), _hostport(args.upstream)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
