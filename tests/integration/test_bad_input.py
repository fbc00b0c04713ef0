"""Bad input gets a clear answer and loses nothing (issue 2, item 4).

Every malformed frame is sent to a real proxy (``ProxyThread``) in front of Apache Kafka 3.9 and,
where it means something, straight to the same broker: the proxy must end the connection exactly
when Kafka does (or give the same answer), write one log line naming the client, and leave every
other connection alone -- an unrelated client doing Metadata requests in a loop on its own
connection, and in ``test_good_clients_unaffected_by_a_stream_of_bad_frames`` a confluent-kafka
producer and consumer, see no error and lose no record.

Kafka's rules, checked here against the broker itself:

* a size prefix that is negative or over ``socket.request.max.bytes``, a frame too short for a
  request header, an unknown API key, an API the listener does not offer, a version out of range,
  a body that does not parse: the connection is closed, nothing is answered;
* ApiVersions is the exception: a version the broker does not know gets an UNSUPPORTED_VERSION
  answer in v0 form (header v2 read as for any flexible version), and the connection stays up;
* requests pipelined ahead of the bad one are answered before the connection closes;
* a frame cut short: nothing happens until the client gives up and closes.

Also here: the proxy in front of a broker that goes away and comes back (``broker_factory``).
The fuzzing of the same paths is in ``test_fuzz.py``; both use the helpers of ``tests.harness.bad_input``.
"""

from __future__ import annotations

import logging
import random
import socket
import struct
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from kshare.protocol import messages
from tests.harness.bad_input import (
    PROXY_LOGGER,
    UNSUPPORTED_VERSION,
    Exchange,
    GoodTraffic,
    MetadataLoop,
    api_versions_error,
    api_versions_request,
    complete_frames,
    corr_of,
    exchange,
    hostport,
    lines_for,
    metadata_request,
    raw_frame,
    unexpected_errors,
)
from tests.harness.proxies import ProxyThread

# kafka-python (its record batch builder, used for one Produce request) loads its schemas the old way
pytestmark = pytest.mark.filterwarnings("ignore:.*is deprecated. Use files:DeprecationWarning")

@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(logging.INFO, logger="kshare")  # asyncio's WARNING and up reach it as they are
    yield caplog
    assert unexpected_errors(caplog) == []


# ------------------------------------------------------------------------------------------------
# the cases


@dataclass(frozen=True)
class Case:
    name: str
    data: bytes
    outcome: str  # "rejected": the proxy closes it (WARNING); "broker-closes": forwarded, Kafka closes
    #               it (the proxy then closes, INFO); "answered": UNSUPPORTED_VERSION, stays open
    reason: str = ""  # in the log line
    half_close: bool = False  # we shut our side after sending (a client giving up)
    kafka_only: bool = False  # depends on what Kafka 3.9 offers


def _produce_body(acks: int, tail: bytes) -> bytes:
    """Produce v9: null transactional id (compact), acks, timeout, then ``tail`` as the topic data."""
    return b"\x00" + struct.pack(">hi", acks, 30000) + tail


_rng = random.Random(20240932)
_GARBAGE = b"\xde\xad\xbe\xef" + _rng.randbytes(60)  # api key 0xdead: negative, never valid

CASES = [
    Case("size-negative", struct.pack(">i", -1) + b"\x00" * 16, "rejected", "invalid frame size -1"),
    Case("size-min-int", struct.pack(">i", -(2**31)) + b"\x00" * 16, "rejected", "invalid frame size"),
    Case(
        "size-over-kafka-limit",
        struct.pack(">i", 200 * 1024 * 1024) + raw_frame(3, 12)[4:],
        "rejected",
        "exceeds the limit of 104857600",
    ),
    Case("empty-frame", struct.pack(">i", 0), "rejected", "too short for a request header"),
    Case(
        "frame-shorter-than-header",
        struct.pack(">i", 5) + b"\x00\x03\x00\x0c\x00",
        "rejected",
        "too short for a request header",
    ),
    Case("header-without-client-id-length", struct.pack(">ihhi", 8, 3, 12, 7), "rejected", "too short"),
    Case("garbage", struct.pack(">i", len(_GARBAGE)) + _GARBAGE, "rejected", "unknown API key -8531"),
    Case("api-key-9999", raw_frame(9999, 0), "rejected", "unknown API key 9999"),
    Case("api-key-32767", raw_frame(32767, 0), "rejected", "unknown API key 32767"),
    # LeaderAndIsr: a real API, but a KRaft broker does not offer it on its client listener
    Case(
        "api-not-offered-leader-and-isr", raw_frame(4, 7, body=b"\x00" * 24), "rejected", "unknown API key 4"
    ),
    Case("metadata-v99", raw_frame(3, 99), "rejected", "Metadata v99 is outside the supported range"),
    Case("metadata-v-1", raw_frame(3, -1), "rejected", "Metadata v-1 is outside the supported range"),
    Case("fetch-v-1", raw_frame(1, -1), "rejected", "Fetch v-1 is outside the supported range"),
    Case(
        "produce-v99",
        raw_frame(0, 99, body=_produce_body(-1, b"\x01")),
        "rejected",
        "Produce v99 is outside the supported range",
    ),
    Case(
        "api-versions-v99-header-v1",
        raw_frame(18, 99, header_tags=False),
        "rejected",
        "malformed ApiVersions v99 request",
    ),
    Case("api-versions-v99", raw_frame(18, 99), "answered"),
    Case("api-versions-v5-with-body", raw_frame(18, 5, body=b"\x05kafka\x041.0\x00"), "answered"),
    # below the range: forwarded, and Kafka answers UNSUPPORTED_VERSION itself
    Case("api-versions-v-1", raw_frame(18, -1), "answered", kafka_only=True),
    Case(
        "metadata-garbage-body",
        raw_frame(3, 12, body=b"\xff" * 30),
        "broker-closes",
        "first Metadata v12 correlation id 7",
    ),
    Case(
        "metadata-truncated-client-id",
        struct.pack(">ihhih", 12, 3, 12, 7, 50) + b"ab",
        "broker-closes",
        "first Metadata v12",
    ),
    Case(
        "produce-garbage-topics",
        raw_frame(0, 9, body=_produce_body(-1, b"\xff" * 20)),
        "broker-closes",
        "first Produce v9 correlation id 7",
    ),
    Case(
        "produce-acks0-garbage-topics",
        raw_frame(0, 9, body=_produce_body(0, b"\xff" * 20)),
        "broker-closes",
        "no request unanswered",
    ),
    Case(
        "truncated-frame-then-close",
        struct.pack(">i", 100) + raw_frame(3, 12)[4:],
        "client-closes",
        f"connection closed {100 - len(raw_frame(3, 12)[4:])} byte(s) short",
        half_close=True,
    ),
    Case(
        "truncated-header-then-close",
        struct.pack(">i", 60) + b"\x00\x03\x00",
        "client-closes",
        "connection closed 57 byte(s) short",
        half_close=True,
    ),
    Case(
        "truncated-size-prefix-then-close",
        b"\x00\x00",
        "client-closes",
        "connection closed 2 byte(s) short",
        half_close=True,
    ),
]


def _send(case: Case, address: str) -> Exchange:
    """Send the case's bytes to ``address``; an answer is awaited where the case expects one."""
    return exchange(address, case.data, half_close=case.half_close,
                    expect_frames=1 if case.outcome == "answered" else 0)


def _check_proxy_outcome(case: Case, got: Exchange, caplog: pytest.LogCaptureFixture) -> None:
    if case.outcome == "answered":
        assert not got.closed, f"{case.name}: the proxy closed the connection"
        (frame,) = got.frames
        assert corr_of(frame) == 7
        assert api_versions_error(frame) == UNSUPPORTED_VERSION
        assert lines_for(caplog, got.peer, want=0, settle=0.1) == []
        return
    assert got.closed, f"{case.name}: the proxy left the connection open"
    assert got.data == b"", f"{case.name}: the proxy answered {got.data!r}"
    assert got.seconds < 5, f"{case.name}: closed only after {got.seconds:.1f} s"
    lines = lines_for(caplog, got.peer)
    assert len(lines) == 1, [r.getMessage() for r in lines]
    (line,) = lines
    assert case.reason in line.getMessage()
    assert line.levelno == (logging.WARNING if case.outcome == "rejected" else logging.INFO), (
        line.getMessage()
    )


@pytest.fixture
def kafka_proxy(kafka39) -> Iterator[ProxyThread]:
    with ProxyThread(kafka39.bootstrap) as proxy:
        yield proxy


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_bad_frame_handled_like_kafka(case: Case, kafka39, kafka_proxy: ProxyThread, logs) -> None:
    """The same bytes to Kafka 3.9 and through the proxy: both close, or both answer the same way;
    the proxy writes one line about it; a client on another connection does not notice."""
    direct = _send(case, kafka39.bootstrap)
    with MetadataLoop(kafka_proxy.bootstrap) as other:
        before = kafka_proxy.proxy.stats.rejected
        proxied = _send(case, kafka_proxy.bootstrap)
        _check_proxy_outcome(case, proxied, logs)
        assert kafka_proxy.proxy.stats.rejected == before + (case.outcome == "rejected")
        other.check(at_least=other.count + 5)  # still answered after the bad frame
    # Kafka did the same
    assert direct.closed == proxied.closed, f"Kafka {'closed' if direct.closed else 'kept'} the connection"
    if case.outcome == "answered":
        assert [corr_of(f) for f in direct.frames] == [corr_of(f) for f in proxied.frames]
        assert [api_versions_error(f) for f in direct.frames] == [
            api_versions_error(f) for f in proxied.frames
        ]
    else:
        assert direct.data == b""


@pytest.mark.parametrize("case", [c for c in CASES if not c.kafka_only], ids=lambda c: c.name)
def test_bad_frame_handled_in_front_of_tansu(case: Case, tansu, logs) -> None:
    """In front of Tansu the proxy still behaves as Kafka does (Tansu itself differs: it has no frame
    size limit and closes on ApiVersions v99), and other clients do not notice."""
    if case.outcome == "broker-closes":
        assert exchange(tansu.bootstrap, case.data).closed, "Tansu accepts it: not a bad frame there"
    with ProxyThread(tansu.bootstrap) as proxy, MetadataLoop(proxy.bootstrap) as other:
        got = _send(case, proxy.bootstrap)
        _check_proxy_outcome(case, got, logs)
        other.check(at_least=other.count + 5)  # still answered after the bad frame


def test_truncated_frame_waits_like_kafka(kafka39, kafka_proxy: ProxyThread, logs) -> None:
    """A size prefix promising more than is sent: Kafka waits for the rest, so does the proxy (no
    answer, no close, no log line) -- until the client goes away, which gets one line."""
    data = struct.pack(">i", 500) + metadata_request(7)[4:]
    socks = []
    try:
        for address in (kafka39.bootstrap, kafka_proxy.bootstrap):
            sock = socket.create_connection(hostport(address), timeout=1.5)
            sock.sendall(data)
            socks.append(sock)
        with MetadataLoop(kafka_proxy.bootstrap) as other:
            for sock in socks:
                with pytest.raises(TimeoutError):
                    sock.recv(100)  # nothing comes back, and the connection is not closed
            other.check(at_least=20)
        ip, port = socks[1].getsockname()[:2]
        assert lines_for(logs, f"{ip}:{port}", want=0, settle=0) == []
    finally:
        for sock in socks:
            sock.close()
    (line,) = lines_for(logs, f"{ip}:{port}")
    assert f"closed {500 + 4 - len(data)} byte(s) short" in line.getMessage()


def test_requests_before_a_bad_frame_are_answered(kafka39, kafka_proxy: ProxyThread, logs) -> None:
    """Kafka answers what was pipelined ahead of a bad frame, then closes: the proxy too (the
    Produce before the bad frame is both written and acknowledged, nothing is lost)."""
    topic = kafka39.create_topic(f"bad-input-pipelined-{uuid.uuid4().hex[:8]}")
    produce = _acks_all_produce(topic, b"before-the-bad-frame", corr=3)
    data = (
        api_versions_request(1)
        + metadata_request(2, [topic])
        + produce
        + raw_frame(18, 99)
        + raw_frame(9999, 0, corr=5)
        + metadata_request(6)
    )
    direct = exchange(kafka39.bootstrap, data, expect_frames=4)
    proxied = exchange(kafka_proxy.bootstrap, data, expect_frames=4)
    for got in (direct, proxied):
        assert got.closed
        assert [corr_of(f) for f in got.frames] == [1, 2, 3, 7]
        produce_response = messages.decode_response(0, 9, memoryview(got.frames[2]))
        assert [p.error_code for t in produce_response.responses for p in t.partition_responses] == [0]
    (line,) = lines_for(logs, proxied.peer)
    assert "unknown API key 9999" in line.getMessage()
    # both records are there: one written directly, one through the proxy
    with MetadataLoop(kafka_proxy.bootstrap, topic) as other:
        other.check()
    assert _count_records(kafka39.bootstrap, topic, 2) == 2


def _acks_all_produce(topic: str, value: bytes, corr: int) -> bytes:
    """A Produce v9 request (acks=-1) of one record to partition 0 of ``topic``."""
    from kafka.record.memory_records import MemoryRecordsBuilder

    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 20)
    builder.append(timestamp=None, key=None, value=value, headers=[])
    builder.close()
    cls = messages.message_class("ProduceRequest")
    partition = cls.PartitionProduceData(index=0, records=bytes(builder.buffer()))
    body = cls(
        transactional_id=None,
        acks=-1,
        timeout_ms=30000,
        topic_data=[cls.TopicProduceData(name=topic, partition_data=[partition])],
    )
    return bytes(messages.encode_request(0, 9, corr, "good", body))


def _count_records(bootstrap: str, topic: str, expect: int, timeout: float = 30.0) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"count-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        n, deadline = 0, time.monotonic() + timeout
        while n < expect and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                n += 1
        while (msg := consumer.poll(0.5)) is not None:  # and nothing more
            n += msg.error() is None
        return n
    finally:
        consumer.close()


def test_oversize_frame_one_warning_other_connections_unaffected(kafka39, logs) -> None:
    """``max_frame_bytes`` is the proxy's socket.request.max.bytes: a frame one byte over is closed
    at once (its header is enough) with exactly one WARNING; a frame of exactly the limit is
    served; a producer of large records on another connection carries on."""
    limit = 256 * 1024
    topic = kafka39.create_topic(f"bad-input-oversize-{uuid.uuid4().hex[:8]}")
    with (
        ProxyThread(kafka39.bootstrap, max_frame_bytes=limit) as proxy,
        MetadataLoop(proxy.bootstrap) as other,
    ):
        from confluent_kafka import Producer

        errors: list[object] = []
        producer = Producer(
            {
                "bootstrap.servers": proxy.bootstrap,
                "linger.ms": 0,
                "acks": "all",
                "error_cb": errors.append,
                "message.max.bytes": limit - 4096,
            }
        )
        big = bytes(random.Random(1).randbytes(limit - 8192))
        producer.produce(topic, value=big, on_delivery=lambda err, _m: err and errors.append(err))
        assert producer.flush(30) == 0

        # one byte over: the header is all the proxy needs
        over = struct.pack(">i", limit + 1) + raw_frame(0, 9)[4:]
        got = exchange(proxy.bootstrap, over)
        assert got.closed and got.data == b"" and got.seconds < 2
        (line,) = lines_for(logs, got.peer)
        assert line.levelno == logging.WARNING
        assert line.getMessage() == (
            f"client {got.peer}: frame of {limit + 1} bytes exceeds the limit of {limit}; closing connection"
        )
        assert proxy.proxy.stats.rejected == 1

        # exactly at the limit: forwarded and answered
        at_limit = _metadata_request_of_size(limit, corr=9)
        got = exchange(proxy.bootstrap, at_limit, expect_frames=1, wait=0.2)
        assert not got.closed and [corr_of(f) for f in got.frames] == [9]
        assert proxy.proxy.stats.rejected == 1

        producer.produce(topic, value=big, on_delivery=lambda err, _m: err and errors.append(err))
        assert producer.flush(30) == 0
        assert errors == []
        other.check(at_least=10)
    warnings = [r for r in logs.records if r.name == PROXY_LOGGER and r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert _count_records(kafka39.bootstrap, topic, 2) == 2


def _metadata_request_of_size(total: int, corr: int) -> bytes:
    """A Metadata v12 request frame of exactly ``total`` bytes after its size prefix: names of
    topics that do not exist (auto-creation off), the last one cut to fit."""
    names: list[str] = []
    while len(metadata_request(corr, names)) - 4 + 300 <= total:
        names.append(f"bad-input-no-such-topic-{len(names):06d}-" + "x" * 200)
    for extra in range(1, 300):
        candidate = metadata_request(corr, [*names, "y" * extra])
        if len(candidate) - 4 == total:
            return candidate
    raise AssertionError("cannot build a frame of that size")


def test_good_clients_unaffected_by_a_stream_of_bad_frames(kafka39, kafka_proxy: ProxyThread, logs) -> None:
    """Every bad frame above, several times over, on new connections (both proxy listeners), while a
    confluent-kafka producer and consumer and a Metadata loop run through the same proxy: they see
    no error and every acknowledged record is read back exactly once."""
    topic = kafka39.create_topic(f"bad-input-good-{uuid.uuid4().hex[:8]}", partitions=3)
    broker_listener = (
        f"{kafka_proxy.config.advertised}:{next(iter(kafka_proxy.proxy.brokers.ports.values()))}"
    )
    with (
        GoodTraffic(kafka_proxy.bootstrap, topic, 3) as good,
        MetadataLoop(kafka_proxy.bootstrap, topic) as other,
    ):
        good.wait_flowing()
        sent = 0
        for round_ in range(4):
            for case in CASES:
                address = kafka_proxy.bootstrap if round_ % 2 == 0 else broker_listener
                answered = case.outcome == "answered"
                got = exchange(
                    address,
                    case.data,
                    half_close=case.half_close,
                    wait=0.05 if answered else 5,
                    expect_frames=1 if answered else 0,
                )
                assert got.closed == (case.outcome != "answered"), case.name
                sent += 1
        other.check(at_least=50)
        n = good.finish()
    assert n > 200
    assert sent == 4 * len(CASES)
    assert kafka_proxy.proxy.stats.rejected == 4 * sum(c.outcome == "rejected" for c in CASES)


def test_error_answer_to_one_client_changes_nothing_for_others(
    kafka39, kafka_proxy: ProxyThread, logs
) -> None:
    """Kafka answers a Metadata v10 request naming a topic id with INVALID_REQUEST and an empty
    broker list. That is one client's mistake, not the cluster losing its brokers: the proxy must
    keep its broker listeners (it used to close them, and reopen them on another port)."""
    proxy = kafka_proxy.proxy
    assert proxy is not None
    ports = dict(proxy.brokers.ports)
    node_listener = f"{kafka_proxy.config.advertised}:{ports[1]}"
    cls = messages.message_class("MetadataRequest")
    body = cls(
        topics=[cls.MetadataRequestTopic(name="x", topic_id=b"\x01" * 16)], allow_auto_topic_creation=False
    )
    bad = bytes(messages.encode_request(3, 10, 7, "odd", body))
    with MetadataLoop(node_listener) as other:
        direct = exchange(kafka39.bootstrap, bad, expect_frames=1, wait=0.2)
        got = exchange(kafka_proxy.bootstrap, bad, expect_frames=1, wait=0.2)
        for answer in (direct, got):
            assert not answer.closed
            (frame,) = answer.frames
            resp = messages.decode_response(3, 10, memoryview(frame))
            assert resp.brokers == [] and [t.error_code for t in resp.topics] == [42]
        time.sleep(0.2)
        other.check(at_least=5)
    assert proxy.brokers.ports == ports
    with MetadataLoop(node_listener) as again:
        again.check()


# ------------------------------------------------------------------------------------------------
# the broker behind the proxy goes away and comes back


def test_upstream_broker_going_away_and_back(broker_factory, logs) -> None:
    """The broker stops: the client connections through the proxy drop (what a broker failure looks
    like); a new connection's ApiVersions is answered BROKER_NOT_AVAILABLE at once while it is down
    (so clients and kshare's tools can say why) and the connection closed, with one WARNING for the
    first such client (not one per client); it comes back on the same port and data: the proxy
    serves again, the producer's retries go through, every acknowledged record is there."""
    from confluent_kafka import Producer

    broker = broker_factory("kafka39")
    topic = broker.create_topic("going-away", partitions=2)
    with ProxyThread(broker.bootstrap, upstream_connect_timeout=2) as proxy:
        node_listener = f"{proxy.config.advertised}:{proxy.proxy.brokers.ports[broker.node_id]}"
        acked: dict[bytes, tuple[int, int]] = {}
        errors: list[str] = []

        def report(err, msg) -> None:
            if err is not None:
                errors.append(f"{msg.value()!r}: {err}")
            else:
                acked[msg.value()] = (msg.partition(), msg.offset())

        producer = Producer(
            {
                "bootstrap.servers": proxy.bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 5,
                "message.timeout.ms": 120000,
                "reconnect.backoff.max.ms": 500,
                "logger": logging.getLogger("kshare.tests.librdkafka"),
            }
        )
        for i in range(100):
            producer.produce(topic, value=f"before-{i}".encode(), on_delivery=report)
        assert producer.flush(30) == 0 and errors == []

        # an idle client connection through the proxy (handshake done)
        idle = socket.create_connection(hostport(proxy.bootstrap), timeout=10)
        idle.sendall(api_versions_request(1))
        assert complete_frames(idle.recv(65536)) == 1

        broker.stop()
        t0 = time.monotonic()
        idle.settimeout(10)
        assert idle.recv(100) == b"", "the proxy kept a client connection to a stopped broker"
        assert time.monotonic() - t0 < 5
        idle.close()

        for address in (proxy.bootstrap, node_listener):
            got = exchange(address, api_versions_request(2), expect_frames=1)
            assert got.closed, address
            (frame,) = got.frames
            answer = messages.decode_response(18, 3, memoryview(frame))
            assert struct.unpack_from(">i", frame)[0] == 2 and answer.error_code == 8, (address, answer)
            assert got.seconds < 3, f"{address}: closed only after {got.seconds:.1f} s"
        # the producer reconnecting and these two clients: one WARNING in all, within a minute
        warned = [r for r in logs.records if r.name == PROXY_LOGGER and r.levelno >= logging.WARNING
                  and "cannot reach the" in r.getMessage() and "client " in r.getMessage()]
        assert len(warned) == 1, [r.getMessage() for r in warned]

        # produced while the broker is down: retried until it is back
        for i in range(100):
            producer.produce(topic, value=f"during-{i}".encode(), on_delivery=report)
        producer.poll(1)
        broker.restart()
        assert producer.flush(90) == 0
        assert errors == []
        assert len(acked) == 200

        with MetadataLoop(proxy.bootstrap, topic) as other:
            other.check()
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer(
            {
                "bootstrap.servers": proxy.bootstrap,
                "group.id": "going-away-check",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
        consumer.assign([TopicPartition(topic, p, 0) for p in range(2)])
        got_back: dict[bytes, tuple[int, int]] = {}
        deadline = time.monotonic() + 60
        try:
            while len(got_back) < len(acked) and time.monotonic() < deadline:
                msg = consumer.poll(0.5)
                if msg is not None:
                    assert msg.error() is None, msg.error()
                    assert msg.value() not in got_back, f"duplicate {msg.value()!r}"
                    got_back[msg.value()] = (msg.partition(), msg.offset())
        finally:
            consumer.close()
        assert got_back == acked


def _produce_v11(topic: str, value: bytes, corr: int) -> bytes:
    """As ``_acks_all_produce``, as Produce v11 (the proxy asks the broker for v9)."""
    frame = bytearray(_acks_all_produce(topic, value, corr))
    struct.pack_into(">h", frame, 6, 11)  # v9 and v11 requests have the same layout
    return bytes(frame)


def _fetch_v16(topic_id: bytes, corr: int) -> bytes:
    """Fetch v16 of partition 0 from offset 0 (the proxy asks the broker for v15)."""
    cls = messages.message_class("FetchRequest")
    body = cls(
        max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1,
        topics=[cls.FetchTopic(topic_id=topic_id, partitions=[cls.FetchPartition(
            partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1, log_start_offset=-1,
            partition_max_bytes=1 << 20)])],
        forgotten_topics_data=[], rack_id="",
    )
    return bytes(messages.encode_request(1, 16, corr, "good", body))


def _send_in_pieces(address: str, data: bytes, cuts: list[int], frames: int) -> Exchange:
    """Send ``data`` cut at ``cuts``, pausing between the pieces so that each is a read of its own."""
    t0 = time.monotonic()
    with socket.create_connection(hostport(address), timeout=10) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        ip, port = sock.getsockname()[:2]
        for a, z in zip([0, *cuts], [*cuts, len(data)], strict=True):
            sock.sendall(data[a:z])
            time.sleep(0.02)
        got = bytearray()
        while complete_frames(got) < frames:
            chunk = sock.recv(1 << 20)
            if not chunk:
                break
            got += chunk
    return Exchange(closed=False, data=bytes(got), peer=f"{ip}:{port}", seconds=time.monotonic() - t0)


def test_frames_cut_anywhere_arrive_whole(kafka39, kafka_proxy: ProxyThread, logs) -> None:
    """The proxy reads a request's header where it arrived, in the read that brought it, and
    gathers the header first only when it is split between reads; a Produce v11 and a Fetch v16
    have their version lowered on the way (v9, v15), in place (reads are writable).
    The same pipeline, cut at random places (always once inside a request header) with each piece
    a read of its own, gets every answer in order, and each Produce is written exactly once."""
    topic = kafka39.create_topic(f"bad-input-cuts-{uuid.uuid4().hex[:8]}")
    meta = exchange(kafka39.bootstrap, metadata_request(1, [topic]), expect_frames=1, wait=0.1)
    (topic_id,) = [t.topic_id for t in messages.decode_response(3, 12, memoryview(meta.frames[0])).topics]
    rng = random.Random(932)
    trials = 12
    for trial in range(trials):
        frames = [api_versions_request(1), metadata_request(2, [topic]),
                  _produce_v11(topic, b"cut-%02d" % trial, 3), _fetch_v16(topic_id, 4), metadata_request(5)]
        data = b"".join(frames)
        starts = [sum(len(f) for f in frames[:i]) for i in range(len(frames))]
        inside = rng.choice(starts) + rng.randrange(1, 12)  # inside a header (its first 12 bytes)
        cuts = sorted({inside, *(rng.randrange(1, len(data)) for _ in range(rng.randrange(0, 5)))})
        got = _send_in_pieces(kafka_proxy.bootstrap, data, cuts, len(frames))
        assert [corr_of(f) for f in got.frames] == [1, 2, 3, 4, 5], (trial, cuts)
        produced = messages.decode_response(0, 11, memoryview(got.frames[2]))
        assert [(p.error_code, p.base_offset) for t in produced.responses for p in t.partition_responses] == [
            (0, trial)], (trial, cuts)
        fetched = messages.decode_response(1, 16, memoryview(got.frames[3]))
        (part,) = [p for t in fetched.responses for p in t.partitions]
        assert part.error_code == 0 and part.high_watermark == trial + 1, (trial, cuts)
    assert [r.getMessage() for r in logs.records if r.name == PROXY_LOGGER and r.levelno >= logging.WARNING] == []
    assert not unexpected_errors(logs)
    assert _count_records(kafka39.bootstrap, topic, trials) == trials
