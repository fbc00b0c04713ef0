"""A small asyncio Kafka connection for the proxy's own requests to the cluster.

The proxy needs its own traffic (cluster ApiVersions and Metadata at start-up, and later the
Fetch/ListOffsets/Produce calls behind share groups). This is one connection to one broker with
pipelined requests matched to responses by correlation id, encoded with the spec-driven codec.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import struct
from collections.abc import Callable
from typing import Any

from ..protocol import messages
from ..protocol.codegen import DecodeError
from ..protocol.codes import ApiKey, ErrorCode
from ..security import ClientSecurity

log = logging.getLogger("kshare.client")  # its name before the module moved into kshare.clients

_SIZE = struct.Struct(">i")
# Responses are read into a buffer of this size; one that does not fit gets a buffer of its own,
# which the socket fills directly (a 1 MB Fetch response is copied once, by the kernel).
_SCRATCH = 64 << 10
_MAX_RESPONSE = 1 << 30



class ConnectionClosed(ConnectionError):
    pass


class ProxyUpstreamUnavailable(ConnectionError):
    """ApiVersions answered BROKER_NOT_AVAILABLE: what a kshare proxy says when its cluster is down
    (a Kafka broker never answers ApiVersions so)."""


class KafkaConnection:
    """One pipelined connection to one broker."""

    def __init__(self, host: str, port: int, client_id: str = "kshare") -> None:
        self.host = host
        self.port = port
        self.client_id = client_id
        self._transport: asyncio.Transport | None = None
        self._pending: dict[int, tuple[asyncio.Future, int, int, Callable[[asyncio.Future], None] | None]] = {}
        self._ids = itertools.count(1)
        self.versions: dict[int, tuple[int, int]] = {}
        self.closed = False

    @classmethod
    async def open(cls, host: str, port: int, client_id: str = "kshare", timeout: float = 10.0,
                   security: ClientSecurity | None = None) -> KafkaConnection:
        """Connect, exchange ApiVersions, and authenticate (TLS, SASL) as ``security`` says."""
        conn = cls(host, port, client_id)
        tls = security.ssl if security is not None else None
        conn._transport, _ = await asyncio.wait_for(asyncio.get_running_loop().create_connection(
            lambda: _Responses(conn), host, port, ssl=tls, server_hostname=host if tls else None), timeout)
        try:
            resp = await conn.request(ApiKey.API_VERSIONS, 3, messages.message_class("ApiVersionsRequest")(
                client_software_name="kshare", client_software_version="0.1.0"))
            if resp.error_code == ErrorCode.UNSUPPORTED_VERSION:
                resp = await conn.request(ApiKey.API_VERSIONS, 0, messages.message_class("ApiVersionsRequest")())
        except BaseException:  # also cancelled (a caller's timeout): do not leak the socket
            await conn.close()
            raise
        if resp.error_code:
            await conn.close()
            if resp.error_code == ErrorCode.BROKER_NOT_AVAILABLE:
                raise ProxyUpstreamUnavailable(f"{host}:{port} cannot reach its upstream Kafka cluster")
            raise ConnectionError(f"{host}:{port} answered ApiVersions with error code {resp.error_code}")
        conn.versions = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
        if security is not None and security.sasl_mechanism:
            try:
                await asyncio.wait_for(security.authenticate(conn), timeout)
            except BaseException:
                await conn.close()
                raise
        return conn

    def best_version(self, api_key: int, lo: int | None = None, hi: int | None = None) -> int:
        """The highest version both sides speak, within [lo, hi] if given."""
        theirs = self.versions.get(api_key)
        a = messages.api(api_key)
        if theirs is None:
            raise ConnectionError(f"broker {self.host}:{self.port} does not support api {a.name}")
        top = min(theirs[1], a.max_version, hi if hi is not None else 1 << 30)
        bottom = max(theirs[0], a.min_version, lo if lo is not None else 0)
        if top < bottom:
            raise ConnectionError(f"no common version of {a.name} with {self.host}:{self.port}")
        return top

    async def request(self, api_key: int, version: int, body: Any, *, expect_response: bool = True) -> Any:
        fut = self.send(api_key, version, body, expect_response=expect_response)
        if not expect_response:
            return None
        return await fut

    def send(self, api_key: int, version: int, body: Any, *, expect_response: bool = True,
             on_answer: Callable[[asyncio.Future], None] | None = None) -> asyncio.Future:
        """Write a request now (requests go out in the order of these calls); the future gets the
        decoded response (already done with None when none is expected). ``on_answer`` is called
        with the future as soon as it is done by an answer or a failure of the connection, in that
        same turn of the event loop (a done callback would run a turn later); not when the
        future is cancelled."""
        if self.closed or self._transport is None:
            raise ConnectionClosed(f"connection to {self.host}:{self.port} is closed")
        corr = next(self._ids) & 0x7FFFFFFF
        frame = messages.encode_request(api_key, version, corr, self.client_id, body)
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        if expect_response:
            self._pending[corr] = (fut, api_key, version, on_answer)
        else:
            fut.set_result(None)
        self._transport.write(frame)
        return fut

    def _deliver(self, frame: memoryview) -> None:
        """One response frame (without its size prefix) for the request waiting for it."""
        (corr,) = _SIZE.unpack_from(frame, 0)
        entry = self._pending.pop(corr, None)
        if entry is None:
            log.warning("response with unknown correlation id %d from %s:%d", corr, self.host, self.port)
            return
        fut, api_key, version, on_answer = entry
        if fut.done():
            return
        try:
            fut.set_result(messages.decode_response(api_key, version, frame))
        except DecodeError as exc:
            if api_key == ApiKey.API_VERSIONS:  # UNSUPPORTED_VERSION answers come back as ApiVersions v0
                try:
                    fut.set_result(messages.decode_response(ApiKey.API_VERSIONS, 0, frame))
                except DecodeError:
                    fut.set_exception(exc)
            else:
                fut.set_exception(exc)
        if on_answer is not None:
            self._answered(on_answer, fut)

    def _answered(self, on_answer: Callable[[asyncio.Future], None], fut: asyncio.Future) -> None:
        try:
            on_answer(fut)
        except Exception:  # noqa: BLE001 - as the event loop does for a done callback
            log.exception("callback for a response from %s:%d failed", self.host, self.port)

    def _fail(self, exc: Exception) -> None:
        self.closed = True
        pending, self._pending = self._pending, {}
        for fut, _, _, on_answer in pending.values():
            if not fut.done():
                fut.set_exception(exc)
                if on_answer is not None:
                    self._answered(on_answer, fut)

    async def close(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.close()
        self._fail(ConnectionClosed("connection closed"))


class _Responses(asyncio.BufferedProtocol):
    """Splits what the broker sends into response frames, with as few copies as possible: small
    responses are read into one scratch buffer (many per read), a large one into a buffer of its
    own that the socket fills directly."""

    def __init__(self, conn: KafkaConnection) -> None:
        self.conn = conn
        self._scratch = bytearray(_SCRATCH)
        self._have = 0  # bytes in the scratch buffer not yet handed out
        self._frame: bytearray | None = None  # a large response being filled
        self._filled = 0

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._frame is not None:
            return memoryview(self._frame)[self._filled :]
        return memoryview(self._scratch)[self._have :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._frame is not None:
            self._filled += nbytes
            if self._filled == len(self._frame):
                frame, self._frame = self._frame, None
                self.conn._deliver(memoryview(frame))
            return
        self._have += nbytes
        buf, have, pos = self._scratch, self._have, 0
        while have - pos >= 4:
            (size,) = _SIZE.unpack_from(buf, pos)
            if not 4 <= size <= _MAX_RESPONSE:
                self.conn._fail(ConnectionClosed(f"{self.conn.host}:{self.conn.port} sent a response frame of "
                                                 f"{size} bytes"))
                if self.conn._transport is not None:
                    self.conn._transport.close()
                self._have = 0
                return
            end = pos + 4 + size
            if end <= have:
                self.conn._deliver(memoryview(bytes(buf[pos + 4 : end])))
                pos = end
                continue
            if 4 + size > len(buf):  # too large for the scratch buffer: a buffer of its own
                frame = bytearray(size)
                got = have - pos - 4
                frame[:got] = buf[pos + 4 : have]
                self._frame, self._filled = frame, got
                pos = have
            break
        if pos:
            rest = have - pos
            if rest:
                buf[:rest] = buf[pos:have]
            self._have = rest

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn._fail(ConnectionClosed(f"connection to {self.conn.host}:{self.conn.port} lost: {exc!r}"))
