"""The proxy's connection to a broker on behalf of one client connection: responses back.

A response's head (size, correlation id) is read and matched to the oldest request sent; then its
body streams to the client as it arrives when its answer is the next one owed and nothing needs
rewriting (``filters.response_filter``), or is gathered, decoded and rewritten first.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import struct
from time import perf_counter
from typing import TYPE_CHECKING, Any

from ..protocol import messages
from ..protocol.codegen import DecodeError
from . import filters
from .answers import Slot
from .frames import SIZE

if TYPE_CHECKING:
    from .connection import ClientConnection

log = logging.getLogger("kshare.proxy")

_HEAD_OUT = struct.Struct(">ii")  # a response's size and correlation id


class UpstreamConnection(asyncio.BufferedProtocol):
    """The proxy's connection to one broker on behalf of one client connection."""

    def __init__(self, client: ClientConnection) -> None:
        self.client = client
        self.transport: asyncio.Transport | None = None
        self._head = bytearray()  # the first 8 bytes (size, correlation id) of a response
        self._slot: Slot | None = None
        self._left = 0  # bytes of the current response body still to come
        self._chunks: list[bytes] | None = None  # set when buffering the current response
        self._discard = False  # the current response answers an acks=0 Produce: dropped
        self._lend = False  # whether chunks of the read buffer go to the client as views (ReadBuffer)
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        client = self.client
        if client.upstream is not self:
            return  # one the client has replaced already (re-attached, or rehomed)
        gone = ConnectionError("the upstream connection closed")
        for slot in [*client.awaiting_upstream, *(s for s, _ in client._probes)]:
            if slot.probe is not None and not slot.probe.done():
                slot.probe.set_exception(gone)
                slot.probe.exception()  # retrieved: its caller may be gone
        client._probes.clear()
        if client.can_reattach():
            log.debug("client %s: upstream connection closed (%s) with nothing owed; reconnecting", client.peer,
                      exc or "EOF")
            client.reattach()
            return
        if not client.closed:
            # The client sees what a broker failure looks like: its connection drops. The broker
            # also closes a connection on a request it cannot parse: name the first unanswered one
            # (unless the client's connection was being ended for a bad request: logged already).
            waiting = client.awaiting_upstream
            pending = (
                f"{len(waiting)} request(s) unanswered, first {filters.api_name(waiting[0].api_key)} v{waiting[0].version}"
                f" correlation id {waiting[0].corr}" if waiting else "no request unanswered"
            )
            if not client.ending:
                log.info("client %s: upstream broker closed the connection (%s; %s); closing client",
                         client.peer, exc or "EOF", pending)
            client.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()

    def pause_writing(self) -> None:
        if self.client.transport is not None:
            self.client.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.client.transport is not None and not self.client.closed:
            self.client.transport.resume_reading()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.client.proxy.reads.view

    def buffer_updated(self, nbytes: int) -> None:
        client = self.client
        reads = client.proxy.reads
        out = client.transport
        self._lend = reads.may_lend(out)
        client._to_client = []
        try:
            self._take(reads.view[:nbytes])
        finally:
            client.flush_client()
            if self._lend:
                reads.returned(out)

    def _take(self, view: memoryview) -> None:
        client = self.client
        i, n = 0, len(view)
        while i < n and not self.closed:
            if self._left:
                take = min(self._left, n - i)
                chunk = view[i : i + take] if take < n else view
                if self._discard:
                    pass
                elif self._chunks is None:
                    client.send_client(chunk if self._lend else bytes(chunk))
                else:
                    self._chunks.append(bytes(chunk))
                self._left -= take
                i += take
                if not self._left:
                    self._finish_response()
                continue
            need = 8 - len(self._head)
            take = min(need, n - i)
            self._head += view[i : i + take]
            i += take
            if len(self._head) == 8:
                self._start_response()

    def _start_response(self) -> None:
        client = self.client
        size, corr = struct.unpack(">ii", self._head)
        self._head.clear()
        if corr in client.unanswered and not (client.awaiting_upstream and client.awaiting_upstream[0].corr == corr):
            # A response to an acks=0 Produce (Tansu sends them): the client expects none, as from
            # Kafka, and a client talking to such a broker directly skips it too.
            del client.unanswered[corr]
            self._discard = True
            self._left = size - 4
            if not self._left:
                self._finish_response()
            return
        if not client.awaiting_upstream:
            log.error("client %s: broker sent a response nobody asked for (correlation id %d)", client.peer, corr)
            client.close()
            return
        slot = client.awaiting_upstream.popleft()
        if slot.corr != corr:
            log.error("client %s: broker answered correlation id %d, expected %d", client.peer, corr, slot.corr)
            client.close()
            return
        self._slot = slot
        self._left = size - 4
        if filters.response_filter(slot.api_key, slot.version) is None and client.order.is_next(slot):
            slot.streaming = True
            self._chunks = None
            client.send_client(_HEAD_OUT.pack(size, corr))
        else:
            self._chunks = [SIZE.pack(size), SIZE.pack(corr)]
        if not self._left:
            self._finish_response()

    def _finish_response(self) -> None:
        if self._discard:
            self._discard = False
            return
        client = self.client
        slot = self._slot
        assert slot is not None
        self._slot = None
        if slot.probe is not None:
            frame = b"".join(self._chunks or ())
            self._chunks = None
            if not slot.probe.done():
                try:
                    slot.probe.set_result(messages.decode_response(slot.api_key, slot.version, memoryview(frame)[4:]))
                except DecodeError as exc:
                    slot.probe.set_exception(exc)
            return
        if self._chunks is None:  # streamed
            done = client.order.popleft()
            client.proxy.stats.answered(done.api_key, perf_counter() - done.started)
            client.flush()
            return
        frame = b"".join(self._chunks)
        self._chunks = None
        f = filters.response_filter(slot.api_key, slot.version)
        if f is None:
            slot.data = frame
            client.flush()
            return
        try:
            body = messages.decode_response(slot.api_key, slot.version, memoryview(frame)[4:])
        except DecodeError as exc:
            # e.g. an ApiVersions UNSUPPORTED_VERSION answer in v0 form: pass it on untouched
            log.debug("client %s: cannot decode %s v%d response (%s); passing through",
                      client.peer, filters.api_name(slot.api_key), slot.version, exc)
            slot.data = frame
            client.flush()
            return
        if f.applies is not None and not f.applies(body):
            slot.data = frame
            client.flush()
            return
        if inspect.iscoroutinefunction(f.rewrite):
            # started inside the task: if the client goes away first and the task is cancelled
            # before it runs, no rewrite coroutine is left never awaited
            client._spawn(self._finish_rewrite(slot, f, body, frame))
        else:
            f.rewrite(client.proxy, body, slot.version)
            if f.only_reads:
                slot.data = frame
                client.flush()
            else:
                self._store_rewritten(slot, body, frame)

    async def _finish_rewrite(self, slot: Slot, f: filters.ResponseFilter, body: Any, frame: bytes) -> None:
        try:
            if f.reads_request:
                await f.rewrite(self.client.proxy, body, slot.version, slot.request)
            else:
                await f.rewrite(self.client.proxy, body, slot.version)
        except Exception:
            log.exception("client %s: rewriting %s response failed; closing", self.client.peer, filters.api_name(slot.api_key))
            self.client.close()
            return
        self._store_rewritten(slot, body, frame)

    def _store_rewritten(self, slot: Slot, body: Any, frame: bytes) -> None:
        header_end = 4 + messages.response_body_offset(slot.api_key, slot.version, memoryview(frame)[4:])
        out = bytearray(frame[:header_end])
        messages.codec_for(messages.api(slot.api_key).response, slot.version).encode(body, out)
        struct.pack_into(">i", out, 0, len(out) - 4)
        slot.data = out
        self.client.flush()

