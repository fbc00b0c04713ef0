"""One client connection: the asyncio shell around its request frames and the answers it is owed.

The hot path is a relay: a request's header (12 bytes; a little more for Produce, whose ``acks``
says whether a response will come) is read, then the rest of the frame streams to the broker as
it arrives (the splitting is ``frames.RequestFramer``'s; what each frame is, ``begin``'s, after
``filters.INTERCEPTIONS``). Responses stream back the same way (``upstream.UpstreamConnection``)
when nothing is queued ahead of them and nothing needs rewriting. Only responses named in
``filters`` and requests the proxy serves itself are buffered and decoded.

Response order: every request that expects a response takes a ``Slot`` in ``ClientConnection.order``
(``answers.AnswerOrder``) when its header is read; responses are written to the client strictly
in slot order, so locally served answers and forwarded ones interleave correctly under pipelining.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import struct
from collections import OrderedDict, deque
from contextvars import ContextVar
from time import perf_counter
from typing import TYPE_CHECKING, Any

from ..protocol import messages
from ..protocol.codegen import DecodeError
from ..protocol.codes import ErrorCode
from . import filters
from .answers import AnswerOrder, Slot, _rest_after
from .frames import COLLECT, FORWARD, HEAD, MIN_REQUEST_SIZE, SIZE, WAIT, RequestFramer, produce_header
from .upstream import UpstreamConnection

if TYPE_CHECKING:
    from collections.abc import Callable

    from .server import Proxy

log = logging.getLogger("kshare.proxy")

_VERSION = struct.Struct(">h")
# read for every forwarded frame: module globals, not attributes of ``filters``
_DOWNGRADES = filters.DOWNGRADES
_PRODUCE, _SASL_HANDSHAKE, _SASL_AUTHENTICATE = filters.PRODUCE, filters.SASL_HANDSHAKE, filters.SASL_AUTHENTICATE
_ACKS_ZERO_PREFIX_LIMIT = 64 * 1024  # a Produce header plus transactional id never needs more
# Correlation ids of acks=0 Produce requests remembered per connection, in case the broker answers
# them after all (Tansu does; Kafka never does, hence the bound).
_UNANSWERED_LIMIT = 4096
_HOLDS_RECHECK_S = 0.1  # see ClientConnection._check_holds
_REJECT_ANSWER_TIMEOUT = 30.0  # how long a rejected connection waits for the answers it is owed
BROKER_NOT_AVAILABLE = ErrorCode.BROKER_NOT_AVAILABLE.value
_UNANSWERED_QUIET_S = 1.0  # see ClientConnection.can_reattach
# A new client connection's own broker gets this long to accept before another broker stands in
# (when there is another): a TCP connect on a network takes milliseconds, a TLS handshake to a
# loaded broker a few hundred; a host that is down never answers.
FIRST_CANDIDATE_TIMEOUT_S = 3.0
# The slot a locally served request's handler answers: set in the handler's own task (its context
# is a copy), so ``send_ahead`` knows which response it begins.
_SERVING: ContextVar[Slot | None] = ContextVar("kshare_serving", default=None)


class ClientConnection(asyncio.BufferedProtocol):
    """A client's connection to one proxy listener (the bootstrap listener or broker ``node_id``)."""

    def __init__(self, proxy: Proxy, node_id: int | None) -> None:
        self.proxy = proxy
        self.node_id = node_id
        self.transport: asyncio.Transport | None = None
        self.upstream: UpstreamConnection | None = None
        self.peer = "?"
        # request frames: those read before the broker connection is up wait in ``frames.held``
        self.frames = RequestFramer(self, proxy.config.max_frame_bytes)
        self._collecting: Slot | None = None  # the slot of the frame ``frames`` is collecting
        # response ordering
        self.order = AnswerOrder()
        self.awaiting_upstream: deque[Slot] = deque()
        self.unanswered: OrderedDict[int, None] = OrderedDict()  # acks=0 Produce correlation ids
        self.closed = False
        self.ending = False  # a request was rejected: read no more, close once the answers owed are out
        self.unreachable = False  # the broker could not be reached: answer the client's ApiVersions, close
        # The upstream connection closed under an idle client (a broker restarting, or closing an idle
        # connection): a new one is being made, to that broker or, while it is away, to another
        # (which answers as Kafka does: NOT_LEADER_OR_FOLLOWER, NOT_COORDINATOR, new leaders in
        # Metadata). Meanwhile requests are read and served as usual; forwarded ones wait in
        # ``_backlog``. The client keeps its connection and with it its share sessions.
        self.reattaching = False
        self._backlog: list[bytes] = []
        self.upstream_addr: tuple[str, int] | None = None  # the broker the upstream connection goes to
        self.sasl = False  # the client authenticated upstream (SASL): a new connection cannot be made for it
        self.unanswered_at = -1e9  # when the last request without a response (acks=0 Produce) went up
        self.served_here = False  # the proxy answered a request of this client itself (share groups)
        self._tasks: set[asyncio.Task] = set()
        # the proxy's own requests on this client's upstream connection, waiting for a frame boundary
        self._probes: list[tuple[Slot, bytes]] = []
        self._probe_ids = 0
        # Writes are gathered while one chunk of received bytes is handled and go out together
        # (one writev instead of a send per frame and per response header): None when not gathering.
        self._to_broker: list | None = None  # this client's requests, to its upstream connection
        self._to_client: list | None = None  # responses, to this client
        self._lend = False  # whether slices of the read buffer go to the broker as views (ReadBuffer)
        # written responses whose buffers the transport may still hold (Slot.release): released
        # once its write buffer is empty, or the connection is gone
        self._holds: list[Callable[[], None]] = []
        self._holds_timer: asyncio.TimerHandle | None = None

    # -- lifecycle ------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.proxy.connections.add(self)
        transport.pause_reading()  # nothing is read until the broker connection is up
        self._spawn(self._connect_upstream())

    async def _open_upstream(self, host: str, port: int, timeout: float) -> UpstreamConnection:
        tls = self.proxy.config.upstream_security.ssl  # the client's SASL frames pass through inside it
        _, upstream = await asyncio.wait_for(
            asyncio.get_running_loop().create_connection(
                lambda: UpstreamConnection(self), host, port, ssl=tls, server_hostname=host if tls else None),
            timeout)
        return upstream

    async def _connect_upstream(self) -> None:
        candidates = self.proxy.brokers.upstream_candidates(self.node_id)
        last: Exception | None = None
        timeout = self.proxy.config.upstream_connect_timeout
        for i, (host, port) in enumerate(candidates):
            try:
                # A broker whose host is down drops connection attempts instead of refusing them:
                # while another broker could answer, do not keep the client waiting the whole
                # connect timeout (a stand-in serves it until its broker answers again).
                wait = timeout if i == len(candidates) - 1 else min(timeout, FIRST_CANDIDATE_TIMEOUT_S)
                upstream = await self._open_upstream(host, port, wait)
            except (TimeoutError, OSError) as exc:
                last = exc
                continue
            if upstream.closed:  # closed before it was ours (its connection_lost saw no client of it)
                last = ConnectionError("closed at once")
                continue
            self.upstream, self.upstream_addr = upstream, (host, port)
            self.proxy.brokers.attached(self)  # on a stand-in (its broker refused): moved back later
            self.proxy.upstream_reached()
            if not self.closed and self.transport is not None:
                self.transport.resume_reading()
                self.frames.resume()
            return
        where = "bootstrap" if self.node_id is None else f"broker {self.node_id}"
        self.proxy.upstream_unreachable(f"client {self.peer}: cannot reach the {where} upstream "
                                        f"{', '.join(f'{h}:{p}' for h, p in candidates) or '(unknown broker)'}", last)
        self._answer_unreachable()

    def can_reattach(self) -> bool:
        """Whether the upstream connection may be replaced under this client: nothing is owed or
        half-sent on it, and it carries no authentication of the client's (SASL) a new one would lack."""
        # A broker also closes a connection on a request it cannot parse; one that expects an answer
        # shows (awaiting_upstream), one that does not (acks=0 Produce) only by coming just before:
        # the client then sees its connection closed, as from Kafka.
        # Only for a client the proxy serves itself (a share consumer: its share sessions and what
        # it acquired live on this connection); any other client (a producer, an admin) sees what
        # Kafka shows, its connection closed, and reconnects.
        return (self.served_here and not self.closed and not self.ending and not self.sasl
                and not self.awaiting_upstream and not self.frames.forward_left and self.transport is not None
                and perf_counter() - self.unanswered_at > _UNANSWERED_QUIET_S)

    def reattach(self) -> None:
        self.upstream = None
        self.reattaching = True
        self._spawn(self._reattach_upstream())

    def rehome(self) -> None:
        """This listener's broker is back: move the upstream connection to it from the broker that
        stood in. From a frame boundary on, new requests wait in the backlog while the answers owed
        on the old connection come in; then the new connection takes the backlog."""
        if self.closed or self.reattaching or self.upstream is None:
            return
        if self.frames.forward_left:  # in the middle of a request: at its end
            asyncio.get_running_loop().call_later(0.01, self.rehome)
            return
        self.reattaching = True
        self._spawn(self._rehome_when_drained(self.upstream))

    async def _rehome_when_drained(self, old: UpstreamConnection) -> None:
        # the answers owed on the old connection: up to the last request sent there (the requests
        # read since take their places behind it, but wait in the backlog for the new connection)
        last = self.awaiting_upstream[-1] if self.awaiting_upstream else None
        while last is not None and last in self.awaiting_upstream and not self.closed and self.upstream is old:
            await asyncio.sleep(0.005)
        if self.closed or self.upstream is not old:
            return  # lost meanwhile: its connection_lost re-attached or closed the client
        if self.sasl:  # authenticated as the client on the stand-in: it reconnects, to its broker
            self.close()
            return
        self.upstream = None
        old.close()
        await self._reattach_upstream()

    async def _reattach_upstream(self) -> None:
        """One pass over the brokers (this listener's first, unless it is away): the first that
        accepts takes the backlog. None does: the cluster is down, as far as the proxy can tell,
        and the client sees what Kafka shows then, its connection closed."""
        for host, port in self.proxy.brokers.reattach_candidates(self.node_id):
            if self.closed:
                return
            try:
                upstream = await self._open_upstream(host, port, min(self.proxy.config.upstream_connect_timeout, 2.0))
            except (TimeoutError, OSError):
                continue
            if self.closed:
                upstream.close()
                return
            if upstream.closed:  # closed before it was ours
                continue
            self.upstream, self.upstream_addr, self.reattaching = upstream, (host, port), False
            self.proxy.brokers.attached(self)
            backlog, self._backlog = self._backlog, []
            if backlog and upstream.transport is not None:
                upstream.transport.writelines(backlog)
            if not self.frames.forward_left:
                self._send_probes()
            return
        log.info("client %s: its broker closed the connection and no other broker answered; closing client",
                 self.peer)
        self.close()

    def _answer_unreachable(self) -> None:
        """Tell the client why before closing: its ApiVersions gets BROKER_NOT_AVAILABLE.

        A closed connection says nothing; an ApiVersions error makes Kafka clients log the error
        name, then disconnect and retry as they would anyway (Kafka's NetworkClient does exactly
        that for any ApiVersions error but UNSUPPORTED_VERSION), and lets kshare's own tools say
        that the proxy's cluster is unreachable. Anything else is answered by closing.
        """
        self.unreachable = True
        asyncio.get_running_loop().call_later(_REJECT_ANSWER_TIMEOUT, self.close)
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()
        self._answer_unreachable_frames()

    def _answer_unreachable_frames(self) -> None:
        buf = self.frames.held
        if self.closed or len(buf) < 12:
            return
        size, api_key, version, corr = HEAD.unpack_from(buf, 0)
        if api_key != filters.API_VERSIONS or not MIN_REQUEST_SIZE <= size <= self.proxy.config.max_frame_bytes:
            self.close()
            return
        if len(buf) < 4 + size:
            return
        cls = messages.message_class("ApiVersionsResponse")
        if version > messages.api(api_key).max_version:
            version = 0  # the client reads a v0 answer first when it is newer than us, as from Kafka
        if self.transport is not None:
            self.transport.write(messages.encode_response(
                api_key, version, corr, cls(error_code=BROKER_NOT_AVAILABLE, api_keys=[])))
        self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed:
            missing = self.frames.missing()
            if missing:
                log.info("client %s: connection closed %d byte(s) short of the end of a request frame",
                         self.peer, missing)
        self.closed = True
        self.proxy.client_closed(self)
        if self.upstream is not None:
            self.upstream.close()
        for task in self._tasks:
            task.cancel()
        self._release_holds()

    def close(self) -> None:
        if not self.closed:
            if self._to_client:
                self.flush_client()  # the answers gathered so far go out before the connection closes
            self.closed = True
            self.frames.stop()
            if self.transport is not None:
                self.transport.close()
            if self.upstream is not None:
                self.upstream.close()
            self._release_holds()

    def _release_holds(self) -> None:
        """The connection is gone: nothing it held stays held (answers never written included)."""
        holds, self._holds = self._holds, []
        holds += [slot.release for slot in self.order if slot.release is not None]
        for slot in self.order:
            slot.release = None
        for release in holds:
            release()

    def _check_holds(self) -> None:
        """Release the written responses' holds once the transport has handed every byte to the
        kernel (it keeps the buffers it could not write yet, the answers' records among them).
        Checked at each write, read and resume; while bytes wait below the transport's high-water
        mark nothing else would come (no resume_writing), so also shortly after."""
        if not self._holds:
            return
        if self.transport is None or self.closed or not self.transport.get_write_buffer_size():
            holds, self._holds = self._holds, []
            for release in holds:
                release()
        elif self._holds_timer is None:
            self._holds_timer = asyncio.get_running_loop().call_later(_HOLDS_RECHECK_S, self._recheck_holds)

    def _recheck_holds(self) -> None:
        self._holds_timer = None
        self._check_holds()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _reject(self, reason: str) -> None:
        """Close the connection the way Kafka does for a request it cannot parse: one log line."""
        log.warning("client %s: %s; closing connection", self.peer, reason)
        self.proxy.stats.rejected += 1
        self._close_when_answered()

    def _close_when_answered(self) -> None:
        """Take no more requests; close once the responses owed for earlier ones are written.

        Kafka reads a connection's next request only after answering the one before, so requests
        pipelined ahead of a bad one are answered before the connection closes: so here. Whatever
        else arrives is dropped, but still read, so that a client hanging up is noticed at once.
        """
        self.ending = True
        self.frames.stop()
        if not self.order:
            # requests read ahead of the bad one in this same read (acks=0 Produce owes nothing)
            # still go to the broker, as they would had they come in a read of their own
            self.flush_upstream()
            self.close()
            return
        asyncio.get_running_loop().call_later(_REJECT_ANSWER_TIMEOUT, self.close)

    # -- the proxy's own requests, as the client ---------------------------------------------------
    def probe(self, api_key: int, version: int, body: Any) -> asyncio.Future:
        """Send a request of the proxy's own on this client's upstream connection, so that the
        cluster answers it as it answers the client (same authenticated principal, same ACLs); the
        future gets the decoded response. Correlation ids are negative (clients count up from 0),
        and the request is written between the client's requests, never inside one."""
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        if self.closed or ((self.upstream is None or self.upstream.closed) and not self.reattaching):
            fut.set_exception(ConnectionError("the client's connection is closed"))
            return fut
        self._probe_ids = (self._probe_ids + 1) % 0x7FFFFFFF
        corr = -1 - self._probe_ids
        slot = Slot(api_key, version, corr)
        slot.probe = fut
        frame = bytes(messages.encode_request(api_key, version, corr, "kshare-authorization", body))
        self._probes.append((slot, frame))
        if not self.frames.forward_left:
            self._send_probes()
        return fut

    def _send_probes(self) -> None:
        """Write the waiting probes (at a frame boundary of the client's requests)."""
        if self.upstream is None or self.upstream.transport is None:
            return
        for slot, frame in self._probes:
            self.awaiting_upstream.append(slot)
            self.send_upstream(frame)
        self._probes.clear()

    # -- writes ---------------------------------------------------------------------------------
    def send_upstream(self, data: bytes | memoryview) -> None:
        if self._to_broker is not None:
            self._to_broker.append(data)
        elif self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.write(data)

    def send_client(self, data: bytes | bytearray | memoryview | list) -> None:
        """Write to the client (``data`` may be a list of buffers: a spliced response)."""
        if self._to_client is not None:
            if data.__class__ is list:
                self._to_client.extend(data)  # type: ignore[arg-type]
            else:
                self._to_client.append(data)
        elif self.transport is not None and not self.closed:
            if data.__class__ is list:
                self.transport.writelines(data)  # type: ignore[arg-type]
            else:
                self.transport.write(data)  # type: ignore[arg-type]
            if self._holds:
                self._check_holds()

    def flush_upstream(self) -> None:
        out, self._to_broker = self._to_broker, None
        if out and self.reattaching:
            self._backlog.append(b"".join(out))  # copied: slices of the read buffer do not last
            return
        if out and self.upstream is not None and self.upstream.transport is not None and not self.upstream.closed:
            if not self._lend:  # slices of the shared read buffer: the transport may not keep them
                self.upstream.transport.write(b"".join(out))
            elif len(out) == 1:
                self.upstream.transport.write(out[0])
            else:
                self.upstream.transport.writelines(out)

    def flush_client(self) -> None:
        out, self._to_client = self._to_client, None
        if out and self.transport is not None and not self.closed:
            if len(out) == 1:
                self.transport.write(out[0])
            else:
                self.transport.writelines(out)
        if self._holds:
            self._check_holds()

    # -- flow control: a slow reader on one side pauses the other ------------------------------
    def pause_writing(self) -> None:
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.resume_reading()
        if self._holds:
            self._check_holds()

    # -- requests -------------------------------------------------------------------------------
    def get_buffer(self, sizehint: int) -> memoryview:
        return self.proxy.reads.view

    def buffer_updated(self, nbytes: int) -> None:
        reads = self.proxy.reads
        out = self.upstream.transport if self.upstream is not None else None
        self._lend = reads.may_lend(out)
        self._received(reads.view[:nbytes])
        if self._lend:
            reads.returned(out)

    def _received(self, data: memoryview) -> None:
        if self._holds:  # a client that asks again has most likely read the last answer
            self._check_holds()
        if self.closed or self.ending:
            return
        if self.upstream is None and not self.reattaching:  # first connection: hold everything until it is up
            self.frames.hold(data)
            if self.unreachable:
                self._answer_unreachable_frames()
            return
        self._to_broker = []
        try:
            self.frames.feed(data)
        finally:
            self.flush_upstream()

    # -- the frame splitter's sink: what each request frame is (see filters.INTERCEPTIONS) --------
    def begin(self, buf: bytearray | memoryview, pos: int, size: int, api_key: int, version: int,
              corr: int) -> int | str:
        proxy = self.proxy
        if proxy.handler_for(api_key, version) is not None or (proxy.view is not None and filters.reads_request(api_key)):
            slot = Slot(api_key, version, corr)
            self.order.append(slot)
            proxy.stats.count(api_key)
            self._collecting = slot
            return COLLECT
        bad = proxy.check_forwardable(api_key, version)
        if bad is not None:
            return bad
        if api_key == _SASL_HANDSHAKE or api_key == _SASL_AUTHENTICATE:
            self.sasl = True
        expects_response = True
        transactional = False
        if api_key == _PRODUCE:
            head = produce_header(buf, version, pos, pos + 4 + size)
            if head is None:
                if len(buf) >= min(pos + 4 + size, pos + _ACKS_ZERO_PREFIX_LIMIT):
                    return "malformed Produce request header"
                return WAIT  # for more of the header
            acks, transactional = head
            expects_response = acks != 0
        down = _DOWNGRADES.get(api_key)
        if down is not None and version > down.version and not (transactional and down.keep_transactional):
            _VERSION.pack_into(buf, pos + 6, down.version)  # in place: reads are writable
            version = down.version
        if expects_response:
            slot = Slot(api_key, version, corr)
            self.order.append(slot)
            self.awaiting_upstream.append(slot)
        else:
            self.unanswered[corr] = None
            self.unanswered_at = perf_counter()
            if len(self.unanswered) > _UNANSWERED_LIMIT:
                self.unanswered.popitem(last=False)
        proxy.stats.requests[api_key] += 1  # (ProxyStats.count, without a call per frame)
        return FORWARD

    def forward(self, data: bytes | memoryview) -> None:
        self.send_upstream(data)

    def forwarded(self) -> None:
        if self._probes:
            self._send_probes()

    def collected(self, frame: bytes) -> None:
        slot, self._collecting = self._collecting, None
        assert slot is not None
        self._serve(slot, frame)

    def refuse(self, reason: str) -> None:
        self._reject(reason)

    def _serve(self, slot: Slot, frame: bytes) -> None:
        try:
            if slot.version in messages.api(slot.api_key).request.valid:
                header, body = messages.decode_request(memoryview(frame))
            else:  # the ApiVersions fallback answers without reading a body it cannot know
                header, body = messages.parse_request_header(memoryview(frame)), None
        except DecodeError as exc:
            self.order.remove(slot)  # never answered: the answers owed are those before it
            self._reject(f"malformed {filters.api_name(slot.api_key)} v{slot.version} request: {exc}")
            return
        handler = self.proxy.handler_for(slot.api_key, slot.version)
        if handler is None or not self.proxy.serves(slot.api_key, header, body):
            # not ours after all (e.g. DescribeConfigs of a topic), or read only for the rewrite
            # of its response (FindCoordinator in an instance group): forward it in its turn
            if handler is None:
                bad = self.proxy.check_forwardable(slot.api_key, slot.version)
                if bad is not None:
                    self.order.remove(slot)
                    self._reject(bad)
                    return
                slot.request = body
            self.awaiting_upstream.append(slot)
            self.send_upstream(SIZE.pack(len(frame)) + frame)
            return
        self.served_here = True
        self._spawn(self._run_handler(handler, slot, header, body))

    async def _run_handler(self, handler: Any, slot: Slot, header: Any, body: Any) -> None:
        _SERVING.set(slot)
        try:
            result = handler(self, header, body)
            if inspect.isawaitable(result):
                result = await result
            response_version, response = result
            if slot.ahead is not None and slot.ahead_rest is not None and slot.ahead_rest[0] is response:
                # the very body whose beginning went ahead, unchanged since: its rest was encoded
                # then (not again now, between the cluster's answer and the client's)
                slot.data = slot.ahead_rest[1]
            elif slot.ahead is None:
                slot.data = messages.encode_response_pieces(slot.api_key, response_version, slot.corr, response)
            else:
                pieces = messages.encode_response_pieces(slot.api_key, response_version, slot.corr, response)
                rest = _rest_after(slot.ahead, pieces)
                if rest is None:
                    # what went ahead assumed the handler's pending writes would succeed: one failed
                    # (logged where it failed), and the client must not read a frame that says
                    # otherwise. It retries on a new connection; what it was sent is not confirmed.
                    log.info("client %s: a state write failed after the beginning of the %s answer was "
                             "sent; closing the connection (the client retries)", self.peer,
                             filters.api_name(slot.api_key))
                    self.close()
                    return
                slot.data = rest
        except Exception:
            log.exception("client %s: handler for %s failed; closing", self.peer, filters.api_name(slot.api_key))
            self.close()
            return
        finally:
            # tasks the handler started keep a copy of its context, and with it the slot: not the
            # records it wrote ahead
            slot.ahead = slot.ahead_rest = None
        self.flush()

    def send_ahead(self, pieces: list, rest: tuple[Any, list] | None = None) -> bool:
        """Write the beginning of the response the calling handler is still working on, when it
        is the next response owed (else nothing is written; returns whether it was).

        For a handler whose answer waits on something that will most likely not change it (a
        ShareFetch waiting for its acknowledgements' durable writes, whose records are ready): the
        records travel while it waits. The response it finally returns should encode to these same
        buffers first; the rest follows, or, if it changed, the connection closes (the client
        never has a frame it could read). ``rest``: (the response body ``pieces`` were encoded
        from, the rest of that encoding); should the handler return that same body object, it
        promises it did not change it, and the rest is written as it is, not encoded again."""
        slot = _SERVING.get()
        if slot is None or self.closed or not self.order.is_next(slot) or slot.ahead is not None:
            return False
        slot.ahead = pieces
        slot.ahead_rest = rest
        self.send_client(pieces)
        return True

    def release_when_sent(self, release: Callable[[], None]) -> bool:
        """Call ``release`` once the response the calling handler returns has left the process
        (written, and taken from the transport's buffer by the kernel), or the connection is gone.
        For what the response's buffers keep alive (records an answer slices from fetched data).
        Returns False, calling nothing, outside a handler: the caller releases itself."""
        slot = _SERVING.get()
        if slot is None or slot.release is not None:
            return False
        if self.closed:
            release()
            return True
        slot.release = release
        return True

    # -- responses ------------------------------------------------------------------------------
    def flush(self) -> None:
        """Write every response at the head of the order that is ready."""
        order = self.order
        while (slot := order.next_ready()) is not None:
            if slot.release is not None:
                self._holds.append(slot.release)
                slot.release = None
            self.send_client(slot.data)  # type: ignore[arg-type]
            slot.data = None
            self.proxy.stats.answered(slot.api_key, perf_counter() - slot.started)
        if self.ending and not order:
            self.close()
