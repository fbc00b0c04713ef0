"""Raw Kafka frames and connections, well-behaved clients running beside bad input, and the checks of
the proxy's log: the helpers of the bad-input and fuzz tests."""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import struct
import threading
import time
import uuid
from dataclasses import dataclass

import pytest

from kshare.clients.connection import KafkaConnection
from kshare.protocol import messages
from kshare.protocol.codes import ErrorCode

PROXY_LOGGER = "kshare.proxy"
UNSUPPORTED_VERSION = ErrorCode.UNSUPPORTED_VERSION

# ------------------------------------------------------------------------------------------------
# frames


def raw_frame(
    api_key: int,
    version: int,
    corr: int = 7,
    body: bytes = b"",
    *,
    client_id: bytes | None = b"bad-input",
    header_tags: bool | None = None,
) -> bytes:
    """A request frame built by hand: header fields as given, ``body`` as is.

    ``header_tags`` adds the (empty) tagged-field section of header v2; by default it is there when
    Kafka reads header v2 for this api key and version.
    """
    if header_tags is None:
        a = messages.apis().get(api_key)
        header_tags = a is not None and a.request_header_version(version) >= 2
    head = struct.pack(">hhi", api_key, version, corr)
    head += struct.pack(">h", -1) if client_id is None else struct.pack(">h", len(client_id)) + client_id
    if header_tags:
        head += b"\x00"
    payload = head + body
    return struct.pack(">i", len(payload)) + payload


def request(
    api_key: int, version: int, corr: int, spec_name: str, client_id: str = "good", **fields
) -> bytes:
    """A well-formed request frame from the codec."""
    body = messages.message_class(spec_name)(**fields)
    return bytes(messages.encode_request(api_key, version, corr, client_id, body))


def metadata_request(corr: int, topics: list[str] | None = None, version: int = 12) -> bytes:
    cls = messages.message_class("MetadataRequest")
    topic_list = [] if topics is None else [cls.MetadataRequestTopic(name=t) for t in topics]
    return request(3, version, corr, "MetadataRequest", topics=topic_list, allow_auto_topic_creation=False)


def api_versions_request(corr: int, version: int = 3) -> bytes:
    return request(
        18,
        version,
        corr,
        "ApiVersionsRequest",
        client_software_name="kshare-tests",
        client_software_version="1",
    )


def split_frames(data: bytes) -> list[bytes]:
    """Response frames (size prefixes removed); a trailing partial frame is an error."""
    out, pos = [], 0
    while pos < len(data):
        assert len(data) - pos >= 4, f"partial size prefix at the end of {data[pos:]!r}"
        (size,) = struct.unpack_from(">i", data, pos)
        assert 4 <= size <= len(data) - pos - 4, f"bad response frame size {size}"
        out.append(data[pos + 4 : pos + 4 + size])
        pos += 4 + size
    return out


def corr_of(frame: bytes) -> int:
    return struct.unpack_from(">i", frame, 0)[0]


def api_versions_error(frame: bytes) -> int:
    """Error code of an ApiVersions response (header v0: the error code follows the correlation id)."""
    return struct.unpack_from(">h", frame, 4)[0]


# ------------------------------------------------------------------------------------------------
# raw connections


def hostport(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


@dataclass
class Exchange:
    closed: bool  # the other side closed (or reset) the connection
    data: bytes  # everything received
    peer: str  # our address as the other side sees it ("127.0.0.1:54321"), as the proxy logs it
    seconds: float  # until the close, or the wait when still open

    @property
    def frames(self) -> list[bytes]:
        return split_frames(self.data)


def exchange(
    address: str, data: bytes, *, half_close: bool = False, wait: float = 1.0, expect_frames: int = 0
) -> Exchange:
    """Connect, send ``data`` (then shut our side down if ``half_close``), read until the other side
    closes or ``wait`` seconds pass without it (after ``expect_frames`` complete responses)."""
    t0 = time.monotonic()
    with socket.create_connection(hostport(address), timeout=10) as sock:
        ip, port = sock.getsockname()[:2]
        sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        got = bytearray()
        deadline = None
        while True:
            if deadline is None and complete_frames(got) >= expect_frames:
                deadline = time.monotonic() + wait
            timeout = 10.0 if deadline is None else deadline - time.monotonic()
            if timeout <= 0:
                return Exchange(False, bytes(got), f"{ip}:{port}", time.monotonic() - t0)
            sock.settimeout(timeout)
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                if deadline is None:
                    raise AssertionError(f"no complete answer within 10 s: {bytes(got)!r}") from None
                continue
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return Exchange(True, bytes(got), f"{ip}:{port}", time.monotonic() - t0)
            got += chunk


def complete_frames(data: bytes | bytearray) -> int:
    n, pos = 0, 0
    while len(data) - pos >= 4:
        (size,) = struct.unpack_from(">i", data, pos)
        if len(data) - pos - 4 < size:
            break
        n, pos = n + 1, pos + 4 + size
    return n


# ------------------------------------------------------------------------------------------------
# logs


def lines_for(
    caplog: pytest.LogCaptureFixture, peer: str, *, want: int = 1, timeout: float = 3.0, settle: float = 0.2
) -> list[logging.LogRecord]:
    """The proxy's log records naming client ``peer``: wait for ``want`` of them, then a little more
    so that a second one would be seen too."""
    deadline = time.monotonic() + timeout

    def found() -> list[logging.LogRecord]:
        return [
            r for r in list(caplog.records) if r.name == PROXY_LOGGER and f"client {peer}:" in r.getMessage()
        ]

    while len(found()) < want and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(settle)
    return found()


def unexpected_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    """ERROR records of kshare and anything asyncio/uvloop reported (exceptions in callbacks, fatal
    errors, writes to closed sockets): none of these may happen, whatever the clients send. (The
    test clients' own logs, ``kshare.tests.*``, are theirs.)"""
    out = []
    for r in list(caplog.records):
        ours = r.name.startswith("kshare") and not r.name.startswith("kshare.tests")
        if (ours and (r.levelno >= logging.ERROR or r.exc_info)) or (
            r.name == "asyncio" and r.levelno >= logging.WARNING
        ):
            out.append(f"{r.name} {r.levelname} {r.getMessage()}")
    return out


# ------------------------------------------------------------------------------------------------
# well-behaved clients


class MetadataLoop:
    """An unrelated, well-behaved client: Metadata requests in a loop on ONE connection of its own
    (``kshare.client.KafkaConnection``), in its own thread. Any error or a dropped connection is
    recorded; ``count`` says how many answers it got."""

    def __init__(self, address: str, topic: str | None = None, interval: float = 0.005) -> None:
        self.host, self.port = hostport(address)
        self.topic = topic
        self.interval = interval
        self.count = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._main()), name="metadata-loop", daemon=True
        )

    async def _main(self) -> None:
        try:
            conn = await KafkaConnection.open(self.host, self.port, client_id="metadata-loop")
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.errors.append(f"open: {exc!r}")
            self._ready.set()
            return
        cls = messages.message_class("MetadataRequest")
        topics = [] if self.topic is None else [cls.MetadataRequestTopic(name=self.topic)]
        version = conn.best_version(3)
        try:
            while not self._stop.is_set():
                req = cls(topics=topics, allow_auto_topic_creation=False)
                resp = await asyncio.wait_for(conn.request(3, version, req), 10)
                if not resp.brokers:
                    self.errors.append(f"no brokers in {resp!r}")
                for t in resp.topics:
                    if t.error_code:
                        self.errors.append(f"topic {t.name}: error {t.error_code}")
                self.count += 1
                self._ready.set()
                await asyncio.sleep(self.interval)
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.errors.append(f"after {self.count} answers: {exc!r}")
        finally:
            self._ready.set()
            await conn.close()

    def __enter__(self) -> MetadataLoop:
        self._thread.start()
        assert self._ready.wait(15), "the metadata loop never got an answer"
        assert self.errors == []
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(15)

    def check(self, at_least: int = 1, timeout: float = 10.0) -> None:
        """No error so far, and (waiting up to ``timeout`` s for them) ``at_least`` answers."""
        deadline = time.monotonic() + timeout
        while self.count < at_least and not self.errors and time.monotonic() < deadline:
            time.sleep(0.01)
        assert self.errors == [], self.errors
        assert self.count >= at_least, f"only {self.count} Metadata answers"


class GoodTraffic:
    """A confluent-kafka producer and consumer through the proxy, both running the whole time.

    The producer sends numbered records (acks=all, idempotent) from its own thread; the consumer
    (a consumer group member) reads them back from another. ``finish()`` stops producing, waits
    until every acknowledged record has been read, and checks that neither client reported any
    error or delivery failure and that every record came back exactly once, intact.
    """

    def __init__(self, bootstrap: str, topic: str, partitions: int, *, interval: float = 0.002) -> None:
        self.bootstrap, self.topic, self.partitions, self.interval = bootstrap, topic, partitions, interval
        self.run_id = uuid.uuid4().hex[:8]
        self.errors: list[str] = []
        self.sent: dict[bytes, bytes] = {}  # value -> key
        self.acked: dict[bytes, tuple[int, int]] = {}
        self.received: dict[bytes, list[tuple[int, int, bytes | None]]] = {}
        self._stop_producing = threading.Event()
        self._stop_consuming = threading.Event()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._produce, name="good-producer", daemon=True),
            threading.Thread(target=self._consume, name="good-consumer", daemon=True),
        ]

    def _error_cb(self, who: str):
        return lambda err: self.errors.append(f"{who} error_cb: {err}")

    def _produce(self) -> None:
        from confluent_kafka import Producer

        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 5,
                "error_cb": self._error_cb("producer"),
                "logger": logging.getLogger("kshare.tests.librdkafka"),
            }
        )

        def report(err, msg) -> None:
            if err is not None:
                self.errors.append(f"delivery of {msg.value()!r}: {err}")
            else:
                with self._lock:
                    self.acked[msg.value()] = (msg.partition(), msg.offset())

        i = 0
        while not self._stop_producing.is_set():
            key = f"k{i % 11}".encode()
            value = f"{self.run_id}-{i:08d}-".encode() + bytes(random.Random(i).randbytes(i % 97))
            self.sent[value] = key
            producer.produce(self.topic, key=key, value=value, on_delivery=report)
            producer.poll(0)
            i += 1
            time.sleep(self.interval)
        if producer.flush(60) != 0:
            self.errors.append("producer: records left undelivered after 60 s")

    def _consume(self) -> None:
        from confluent_kafka import Consumer

        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"good-{self.run_id}",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": True,
                "session.timeout.ms": 6000,
                "heartbeat.interval.ms": 1000,
                "error_cb": self._error_cb("consumer"),
                "logger": logging.getLogger("kshare.tests.librdkafka"),
            }
        )
        consumer.subscribe([self.topic])
        try:
            while not self._stop_consuming.is_set():
                msg = consumer.poll(0.2)
                if msg is None:
                    continue
                if msg.error() is not None:
                    self.errors.append(f"consumer: {msg.error()}")
                    continue
                with self._lock:
                    self.received.setdefault(msg.value(), []).append(
                        (msg.partition(), msg.offset(), msg.key())
                    )
        finally:
            consumer.close()

    def __enter__(self) -> GoodTraffic:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop_producing.set()
        self._stop_consuming.set()
        for t in self._threads:
            t.join(90)

    def wait_flowing(self, records: int = 50, timeout: float = 60.0) -> None:
        """Until the consumer has read ``records`` records (the group is joined, data flows)."""
        deadline = time.monotonic() + timeout
        while len(self.received) < records:
            assert time.monotonic() < deadline, (
                f"good clients not flowing: {len(self.received)} read, {self.errors}"
            )
            assert self.errors == [], self.errors
            time.sleep(0.1)

    def finish(self, timeout: float = 90.0) -> int:
        """Stop producing; wait for every acknowledged record to be read; check everything."""
        self._stop_producing.set()
        self._threads[0].join(timeout)
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                missing = [v for v in self.acked if v not in self.received]
            if not missing or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        self._stop_consuming.set()
        self._threads[1].join(30)
        assert self.errors == [], self.errors[:20]
        assert set(self.acked) == set(self.sent), (
            f"{len(self.sent) - len(self.acked)} records never acknowledged"
        )
        assert missing == [], f"{len(missing)} acknowledged records never read back, e.g. {missing[:3]}"
        for value, reads in self.received.items():
            assert value in self.acked, f"read a record nobody produced: {value!r}"
            # the record read is the one acknowledged: same partition, offset and key
            assert {(p, o) for p, o, _ in reads} == {self.acked[value]}, (value, reads, self.acked[value])
            assert all(k == self.sent[value] for _, _, k in reads)
        return len(self.acked)
