"""``ClientConnection`` and ``UpstreamConnection`` on transports that record what they are given
(no sockets, no broker): a client's pipeline of requests, cut into reads anywhere, reaches the
broker side as the same frames, downgraded as ``filters.INTERCEPTIONS`` says; answers the proxy
serves itself and scripted broker answers, finishing in any order, reach the client in request
order."""

from __future__ import annotations

import asyncio
import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from kshare.protocol import messages
from kshare.proxy import filters
from kshare.proxy.config import ProxyConfig
from kshare.proxy.connection import ClientConnection
from kshare.proxy.server import Proxy
from kshare.proxy.upstream import UpstreamConnection

HEARTBEAT = 12
Fetch = messages.message_class("FetchRequest")
Produce = messages.message_class("ProduceRequest")
Heartbeat = messages.message_class("HeartbeatRequest")
ShareGroupHeartbeat = messages.message_class("ShareGroupHeartbeatRequest")
ShareGroupHeartbeatResponse = messages.message_class("ShareGroupHeartbeatResponse")


class Transport:
    """Records the bytes written to it."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.closed = False

    def write(self, data) -> None:
        self.out += data

    def writelines(self, data) -> None:
        for d in data:
            self.out += d

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def connected(proxy: Proxy) -> tuple[ClientConnection, UpstreamConnection]:
    conn = ClientConnection(proxy, None)
    conn.transport = Transport()  # type: ignore[assignment]
    upstream = UpstreamConnection(conn)
    upstream.transport = Transport()  # type: ignore[assignment]
    conn.upstream = upstream
    return conn, upstream


def read_into(proxy: Proxy, protocol, data: bytes, cuts: list[int]) -> None:
    """``data`` as ``protocol`` reads it: in pieces, through the proxy's one read buffer."""
    bounds = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    for a, b in zip(bounds, bounds[1:], strict=False):
        proxy.reads.view[: b - a] = data[a:b]
        protocol.buffer_updated(b - a)


def frames_of(data: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(data):
        (size,) = struct.unpack_from(">i", data, pos)
        out.append(data[pos : pos + 4 + size])
        pos += 4 + size
    assert pos == len(data)
    return out


@st.composite
def forwarded_requests(draw) -> tuple[bytes, int, bool]:
    """(frame, the version the broker should be asked, whether a response is expected)."""
    corr = draw(st.integers(0, 2**31 - 1))
    kind = draw(st.sampled_from(["fetch", "produce", "heartbeat"]))
    if kind == "fetch":
        version = draw(st.integers(4, 17))
        body = Fetch(replica_id=-1, max_wait_ms=0, min_bytes=1, topics=[])
        return bytes(messages.encode_request(filters.FETCH, version, corr, "c", body)), min(version, 15), True
    if kind == "produce":
        version = draw(st.integers(3, 12))
        acks = draw(st.sampled_from([-1, 0, 1]))
        txn = draw(st.sampled_from([None, "txn"]))
        body = Produce(transactional_id=txn, acks=acks, timeout_ms=1000, topic_data=[Produce.TopicProduceData(
            name="t", partition_data=[Produce.PartitionProduceData(index=0, records=b"r" * draw(st.integers(0, 300)))])])
        frame = bytes(messages.encode_request(filters.PRODUCE, version, corr, "c", body))
        return frame, version if txn else min(version, 9), acks != 0
    version = draw(st.integers(0, 4))
    body = Heartbeat(group_id="g", generation_id=1, member_id="m")
    return bytes(messages.encode_request(HEARTBEAT, version, corr, "c", body)), version, True


@settings(max_examples=150, deadline=None)
@given(requests=st.lists(forwarded_requests(), min_size=1, max_size=8), cuts=st.lists(st.integers(0, 5000), max_size=10))
def test_forwarded_requests_reach_the_broker_as_sent_but_downgraded(requests, cuts) -> None:
    proxy = Proxy(ProxyConfig(upstream=[("127.0.0.1", 9)]))
    conn, upstream = connected(proxy)
    read_into(proxy, conn, b"".join(f for f, _, _ in requests), cuts)
    sent = frames_of(bytes(upstream.transport.out))  # type: ignore[union-attr]
    assert len(sent) == len(requests)
    for frame, (original, version, _) in zip(sent, requests, strict=True):
        assert struct.unpack_from(">h", frame, 6)[0] == version
        assert frame[:6] + frame[8:] == original[:6] + original[8:]  # nothing else changed
    owed = [(struct.unpack_from(">i", f, 8)[0], v) for f, v, answered in requests if answered]
    assert [(s.corr, s.version) for s in conn.order] == owed
    assert [s.corr for s in conn.awaiting_upstream] == [c for c, _ in owed]
    assert set(conn.unanswered) == {struct.unpack_from(">i", f, 8)[0] for f, _, answered in requests if not answered}
    assert not conn.closed and not conn.ending


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_served_and_forwarded_answers_reach_the_client_in_request_order(data) -> None:
    served = data.draw(st.lists(st.booleans(), min_size=1, max_size=8))  # per request: served by the proxy?
    cuts = data.draw(st.lists(st.integers(0, 2000), max_size=8))
    asyncio.run(_pipeline(data, served, cuts))


async def _pipeline(data, served: list[bool], cuts: list[int]) -> None:
    proxy = Proxy(ProxyConfig(upstream=[("127.0.0.1", 9)]))
    finish: dict[int, asyncio.Future] = {}

    async def handler(conn, header, body):
        await finish[header.correlation_id]
        return 1, ShareGroupHeartbeatResponse(error_code=0, member_id=body.member_id)

    proxy.serve(filters.SHARE_GROUP_HEARTBEAT, 1, 1, handler)
    conn, upstream = connected(proxy)
    loop = asyncio.get_running_loop()
    frames = []
    for corr, here in enumerate(served):
        if here:
            finish[corr] = loop.create_future()
            body = ShareGroupHeartbeat(group_id="g", member_id=f"m{corr}", member_epoch=0)
            frames.append(bytes(messages.encode_request(filters.SHARE_GROUP_HEARTBEAT, 1, corr, "c", body)))
        else:
            body = Heartbeat(group_id="g", generation_id=1, member_id=f"m{corr}")
            frames.append(bytes(messages.encode_request(HEARTBEAT, 4, corr, "c", body)))
    read_into(proxy, conn, b"".join(frames), cuts)
    for _ in range(3):
        await asyncio.sleep(0)  # the handlers start
    assert len(frames_of(bytes(upstream.transport.out))) == served.count(False)  # type: ignore[union-attr]

    # The broker answers in order; the handlers finish in any order.
    broker_owes = [c for c, here in enumerate(served) if not here]
    handlers = [c for c, here in enumerate(served) if here]
    while broker_owes or handlers:
        pick = data.draw(st.sampled_from((["broker"] if broker_owes else []) + handlers))
        if pick == "broker":
            corr = broker_owes.pop(0)
            answer = struct.pack(">iih", 6, corr, 0)  # HeartbeatResponse v4: error code, no tags (not read)
            read_into(proxy, upstream, answer, [data.draw(st.integers(0, 10))])
        else:
            handlers.remove(pick)
            finish[pick].set_result(None)
        for _ in range(3):
            await asyncio.sleep(0)

    answers = frames_of(bytes(conn.transport.out))  # type: ignore[union-attr]
    assert [struct.unpack_from(">i", a, 4)[0] for a in answers] == list(range(len(served)))
    for corr, answer in enumerate(answers):
        if served[corr]:
            assert messages.decode_response(filters.SHARE_GROUP_HEARTBEAT, 1, memoryview(answer)[4:]).member_id == f"m{corr}"
        else:
            assert answer == struct.pack(">iih", 6, corr, 0)  # streamed or kept, passed on untouched
    assert not conn.order and not conn.closed


@st.composite
def client_bytes(draw) -> bytes:
    """What a client may send: valid requests, requests for keys and versions the cluster lacks,
    bad sizes, garbage."""
    parts = []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["forwarded", "unknown", "size", "garbage"]))
        if kind == "forwarded":
            parts.append(draw(forwarded_requests())[0])
        elif kind == "unknown":
            key, version = draw(st.sampled_from([(9999, 0), (filters.FETCH, 99), (-1, 0)]))
            parts.append(struct.pack(">ihhih", 10, key, version, 1, -1))
        elif kind == "size":
            parts.append(struct.pack(">i", draw(st.sampled_from([-1, 5, 200 << 20]))) + b"\0" * 5)
        else:
            parts.append(draw(st.binary(max_size=40)))
    return b"".join(parts)


@settings(max_examples=150, deadline=None)
@given(data=client_bytes(), cuts=st.lists(st.integers(0, 5000), max_size=10))
def test_whatever_a_client_sends_where_the_reads_cut_it_changes_nothing(data: bytes, cuts: list[int]) -> None:
    """The proxy's fuzz test without a broker: the same bytes read whole or in pieces reach the
    broker side the same, owe the same answers, and end the connection (or not) the same."""

    async def run(pieces: list[int]) -> tuple:
        proxy = Proxy(ProxyConfig(upstream=[("127.0.0.1", 9)]))
        proxy.upstream_versions = {k: (a.min_version, a.max_version) for k, a in messages.apis().items()}
        conn, upstream = connected(proxy)
        read_into(proxy, conn, data, pieces)
        state = (bytes(upstream.transport.out), [s.corr for s in conn.order], conn.ending, conn.closed,  # type: ignore[union-attr]
                 proxy.stats.rejected, conn.frames.missing())
        conn.close()
        return state

    assert asyncio.run(run(cuts)) == asyncio.run(run([]))
