"""Helpers for end-to-end share-group tests: kshare (proxy + share-group service) in a thread (and
the ``kshare39`` fixture), group configs through the proxy, producers (plain and transactional),
confluent ShareConsumer loops and their acknowledgement actions, a consumer process that holds its
records until killed, raw protocol calls (``Raw``) with the API keys and error codes they use, and
Apache Kafka's Java share consumer.

Nothing here stands in for the proxy, the broker or the client: ``ShareProxyThread`` runs the
product's ``KShare`` on uvloop, consumers are librdkafka's ``ShareConsumer``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import AcknowledgeType, Consumer, KafkaException, Producer, ShareConsumer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from kshare.addresses import parse_hostports
from kshare.app import KShare
from kshare.clients.connection import KafkaConnection
from kshare.protocol import messages
from kshare.protocol.codes import ApiKey, ErrorCode
from kshare.proxy.config import ProxyConfig
from kshare.share.config import BrokerLimits
from tests.harness.brokers import KafkaBroker
from tests.harness.proxies import LoopThread

log = logging.getLogger("kshare.tests.share")

# Broker-level bounds low enough for tests (Kafka's are 45 s session timeout, 5 s heartbeat).
TEST_LIMITS = BrokerLimits(min_session_timeout_ms=1000, min_heartbeat_interval_ms=100,
                           min_record_lock_duration_ms=1000)
# Kafka 4.4's broker-level bounds lowered as kshare's are here (TEST_LIMITS): its defaults allow
# lock durations of 15-60 s only, session timeouts from 45 s, heartbeats from 5 s.
KAFKA4_TEST_LIMITS = {
    "group.share.min.record.lock.duration.ms": TEST_LIMITS.min_record_lock_duration_ms,
    "group.share.min.session.timeout.ms": TEST_LIMITS.min_session_timeout_ms,
    "group.share.min.heartbeat.interval.ms": TEST_LIMITS.min_heartbeat_interval_ms,
}
HEARTBEAT_MS = 500  # share.heartbeat.interval.ms of the differential tests' groups: Kafka 4.4 assigns on a heartbeat

# API keys and error codes of the share-group RPCs the tests send themselves (from the specs), and
# the acknowledge types
METADATA, HEARTBEAT = ApiKey.METADATA, ApiKey.SHARE_GROUP_HEARTBEAT
SHARE_FETCH, SHARE_ACK = ApiKey.SHARE_FETCH, ApiKey.SHARE_ACKNOWLEDGE
FIND_COORDINATOR = ApiKey.FIND_COORDINATOR
NONE = ErrorCode.NONE
COORDINATOR_NOT_READY = (ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.COORDINATOR_NOT_AVAILABLE,
                         ErrorCode.NOT_COORDINATOR)
UNKNOWN_TOPIC_OR_PARTITION = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
INCONSISTENT_GROUP_PROTOCOL = ErrorCode.INCONSISTENT_GROUP_PROTOCOL
UNKNOWN_MEMBER_ID = ErrorCode.UNKNOWN_MEMBER_ID
INVALID_CONFIG = ErrorCode.INVALID_CONFIG
INVALID_REQUEST = ErrorCode.INVALID_REQUEST
UNKNOWN_TOPIC_ID = ErrorCode.UNKNOWN_TOPIC_ID
FENCED_MEMBER_EPOCH = ErrorCode.FENCED_MEMBER_EPOCH
INVALID_RECORD_STATE = ErrorCode.INVALID_RECORD_STATE
SHARE_SESSION_NOT_FOUND = ErrorCode.SHARE_SESSION_NOT_FOUND
INVALID_SHARE_SESSION_EPOCH = ErrorCode.INVALID_SHARE_SESSION_EPOCH
ACCEPT, RELEASE, REJECT = 1, 2, 3


def quiet_logger() -> logging.Logger:
    return logging.getLogger("kshare.tests.share.librdkafka")


# ------------------------------------------------------------------------------------------------
# kshare in a thread


class ShareProxyThread(LoopThread):
    """``KShare`` (proxy + share-group service with its state on the fronted cluster) on its own
    uvloop event loop in a background thread."""

    thread_name = "kshare-share-proxy"
    start_slack = 10.0
    join_timeout = 30.0

    def __init__(self, upstream: str, *, limits: BrokerLimits = TEST_LIMITS, start_timeout: float = 60.0,
                 metrics_port: int | None = None, **config: object) -> None:
        super().__init__()
        config.setdefault("bootstrap_port", 0)
        config.setdefault("broker_port_base", 0)
        # A state topic of its own: a store prunes its topic below what *it* knows, so two
        # instances must not share one (pass ``state_topic`` to restart on the same state).
        config.setdefault("state_topic", f"__kshare_state_test_{uuid.uuid4().hex[:10]}")
        config.setdefault("state_topic_partitions", 3)
        self.config = ProxyConfig(upstream=parse_hostports(upstream), group_limits=limits,
                                  **config)  # type: ignore[arg-type]
        self.start_timeout = start_timeout
        self.metrics_port = metrics_port  # 0: a free port, read back from app.metrics_server.port
        self.app: KShare | None = None

    @property
    def bootstrap(self) -> str:
        assert self.app is not None and self.app.proxy.bootstrap_port
        return f"{self.config.advertised}:{self.app.proxy.bootstrap_port}"

    @property
    def service(self):
        assert self.app is not None
        return self.app.service

    def _create(self) -> KShare:
        self.app = KShare(self.config, metrics_port=self.metrics_port, metrics_host="127.0.0.1")
        return self.app

    def start(self, timeout: float | None = None) -> ShareProxyThread:
        """Start and wait until the proxy serves and the share state is loaded (TimeoutError if not)."""
        return super().start(self.start_timeout if timeout is None else timeout)


@pytest.fixture(scope="module")
def kshare39(kafka39: KafkaBroker) -> Iterator[ShareProxyThread]:
    """Fixture: kshare in front of the session's Apache Kafka 3.9, one for each test module that
    takes it, by assignment: ``kshare39 = share.kshare39`` (pytest knows a fixture by the
    name it is assigned to; imported by name, it would be shadowed by the test arguments)."""
    with ShareProxyThread(kafka39.bootstrap) as proxy:
        yield proxy
        # a loop of the service that ended (lock expiry, say) fails no test by itself: the
        # records it would have freed just stay out; say so here, for the module that broke it
        assert proxy.service.broken is None, f"kshare39: {proxy.service.broken}"


def members(proxy: ShareProxyThread, group_id: str) -> dict[str, dict]:
    """member id -> assignment {topic id: partitions} of a share group, read on the proxy's loop."""

    def read() -> dict[str, dict]:
        g = proxy.service.coordinator.group(group_id)
        return {} if g is None else {m.member_id: dict(m.assignment) for m in g.members.values()}

    return proxy.call(read)


def wait_members(proxy: ShareProxyThread, group_id: str, n: int, timeout: float = 30.0) -> None:
    wait_until(lambda: len(m := members(proxy, group_id)) == n and all(m.values()), timeout,
               f"{n} assigned members in {group_id}")


# ------------------------------------------------------------------------------------------------
# admin through the proxy


def admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap, "logger": quiet_logger(), "socket.timeout.ms": 10000})


def set_group_configs(bootstrap: str, group: str, configs: dict[str, object]) -> None:
    """IncrementalAlterConfigs SET on the GROUP resource (through the proxy for share groups)."""
    entries = [ConfigEntry(k, str(v), incremental_operation=AlterConfigOpType.SET) for k, v in configs.items()]
    res = ConfigResource(ResourceType.GROUP, group, incremental_configs=entries)
    client = admin(bootstrap)  # kept alive until the answer is in (a destroyed handle fails the future)
    for fut in client.incremental_alter_configs([res]).values():
        fut.result(30)


def describe_group_configs(bootstrap: str, group: str) -> dict[str, str]:
    res = ConfigResource(ResourceType.GROUP, group)
    out = {}
    client = admin(bootstrap)
    for fut in client.describe_configs([res]).values():
        out.update({k: v.value for k, v in fut.result(30).items()})
    return out


def share_group(bootstrap: str, group: str, **configs: object) -> None:
    """Prepare a share group: ``share.auto.offset.reset=earliest`` plus ``configs`` (underscores in
    keyword names stand for dots)."""
    settings: dict[str, object] = {"share.auto.offset.reset": "earliest"}
    settings.update({k.replace("_", "."): v for k, v in configs.items()})
    set_group_configs(bootstrap, group, settings)


# ------------------------------------------------------------------------------------------------
# producing


def produce(bootstrap: str, topic: str, values: Sequence[bytes | str], *, partition: int | None = None,
            partitions: int | None = None, per_batch: int = 1, keys: Sequence[bytes | None] | None = None,
            headers: Sequence[list[tuple[str, bytes]]] | None = None) -> None:
    """Produce ``values`` in producer batches of ``per_batch`` records (linger 0, flush per batch),
    to ``partition``, or round-robin batch by batch over ``partitions`` partitions."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "logger": quiet_logger(),
                  "enable.idempotence": False, "acks": "all"})
    errors: list[Any] = []

    def report(err, _msg) -> None:
        if err is not None:
            errors.append(err)

    for i, v in enumerate(values):
        kw: dict[str, Any] = {"value": v, "on_delivery": report}
        if partition is not None:
            kw["partition"] = partition
        elif partitions is not None:
            kw["partition"] = (i // per_batch) % partitions
        if keys is not None:
            kw["key"] = keys[i]
        if headers is not None:
            kw["headers"] = headers[i]
        p.produce(topic, **kw)
        if (i + 1) % per_batch == 0:
            p.flush(30)
    assert p.flush(30) == 0
    assert not errors, errors


def values(prefix: str, n: int) -> list[bytes]:
    """``<prefix>-0`` ... ``<prefix>-<n-1>``."""
    return [f"{prefix}-{i}".encode() for i in range(n)]


def produce_poison_bad_good(bootstrap: str, topic: str, *, per_batch: int = 1) -> None:
    """The dead-letter tests' records: ``poison``, ``bad`` and ``good``, keyed ``k-<value>``, each
    with a header ``h`` (``p``, ``b``, ``g``)."""
    produce(bootstrap, topic, [b"poison", b"bad", b"good"], keys=[b"k-poison", b"k-bad", b"k-good"],
            headers=[[("h", b"p")], [("h", b"b")], [("h", b"g")]], per_batch=per_batch)


class Transactions:
    """A transactional producer (linger 0) writing to partition 0 of ``topic``: flushed once per
    transaction, or after every record with ``flush_each_record``."""

    def __init__(self, bootstrap: str, topic: str, *, flush_each_record: bool = False) -> None:
        self.topic = topic
        self.flush_each_record = flush_each_record
        self.producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{uuid.uuid4().hex[:8]}",
                                  "linger.ms": 0, "logger": quiet_logger()})
        self.producer.init_transactions(30)

    def txn(self, vals: Sequence[bytes], commit: bool | None) -> None:
        """One transaction of ``vals``: committed (True), aborted (False) or left open (None; see
        :meth:`commit`)."""
        p = self.producer
        p.begin_transaction()
        for v in vals:
            p.produce(self.topic, value=v, partition=0)
            if self.flush_each_record:
                p.flush(30)
        if not self.flush_each_record:
            p.flush(30)
        if commit is True:
            p.commit_transaction(30)
        elif commit is False:
            p.abort_transaction(30)

    def commit(self) -> None:
        """Commit the transaction left open."""
        self.producer.commit_transaction(30)


# ------------------------------------------------------------------------------------------------
# share consumers


@dataclass(frozen=True)
class Got:
    """One record a share consumer received."""

    consumer: str
    topic: str
    partition: int
    offset: int
    delivery_count: int
    key: bytes | None
    value: bytes | None
    at: float  # time.monotonic() when polled


def share_consumer(bootstrap: str, group: str, *, explicit: bool = False, **conf: object) -> ShareConsumer:
    config: dict[str, object] = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "logger": quiet_logger(),
        "socket.timeout.ms": 10000,
    }
    if explicit:
        config["share.acknowledgement.mode"] = "explicit"
    config.update(conf)
    return ShareConsumer(config)


def records_of(consumer: ShareConsumer, timeout: float) -> list[Any]:
    """One poll; the records (messages without error)."""
    msgs = consumer.poll(timeout)
    out = []
    for m in msgs:
        err = m.error()
        if err is not None:
            if err.code() == -191:  # _PARTITION_EOF, informational
                continue
            log.info("share consumer error: %s", err)
            continue
        out.append(m)
    return out


def got(name: str, m: Any) -> Got:
    return Got(name, m.topic(), m.partition(), m.offset(), m.delivery_count() or 0, m.key(), m.value(),
               time.monotonic())


class ConsumerLoop:
    """A ShareConsumer polling in its own thread until stopped; ``action(msg)`` returns the
    AcknowledgeType for explicit mode (None: leave it unacknowledged -> the loop stops polling)."""

    def __init__(self, name: str, bootstrap: str, group: str, topic: str | Iterable[str], *,
                 explicit: bool = False, action: Callable[[Any], int | None] | None = None,
                 poll_timeout: float = 0.5, process_s: float = 0.0, **conf: object) -> None:
        self.name = name
        self.topics = [topic] if isinstance(topic, str) else list(topic)
        self.explicit = explicit
        self.action = action
        self.poll_timeout = poll_timeout
        self.process_s = process_s
        self.consumer = share_consumer(bootstrap, group, explicit=explicit, **conf)
        self.received: list[Got] = []
        self.errors: list[BaseException] = []
        self.stuck = False  # an action left a record unacknowledged: no more polls
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"share-{name}", daemon=True)
        self.closed = False
        self.lock = threading.Lock()

    def start(self) -> ConsumerLoop:
        self.consumer.subscribe(self.topics)
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if self.stuck:
                    time.sleep(0.05)
                    continue
                msgs = records_of(self.consumer, self.poll_timeout)
                for m in msgs:
                    with self.lock:
                        self.received.append(got(self.name, m))
                    if self.process_s:
                        time.sleep(self.process_s)
                    if self.explicit:
                        ack = self.action(m) if self.action is not None else AcknowledgeType.ACCEPT
                        if ack is None:
                            self.stuck = True
                        else:
                            self.consumer.acknowledge(m, ack)
                if self.explicit and msgs and not self.stuck:
                    self.consumer.commit_async()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            log.exception("share consumer %s failed", self.name)
            self.errors.append(exc)

    def stop(self, *, close: bool = True) -> None:
        self._stop.set()
        self._thread.join(30)
        if close and not self.closed:
            self.closed = True
            try:
                self.consumer.close()
            except KafkaException as exc:
                log.info("closing %s: %s", self.name, exc)

    def values(self) -> list[bytes]:
        with self.lock:
            return [g.value for g in self.received]


def stop_all(loops: Iterable[ConsumerLoop]) -> None:
    """Stop (and close) every loop, then check that none of them failed."""
    loops = list(loops)
    for loop in loops:
        loop.stop()
    for loop in loops:
        assert not loop.errors, (loop.name, loop.errors)


def wait_received(loops: Sequence[ConsumerLoop], n: int, timeout: float, what: str = "every record") -> None:
    """Until the loops received ``n`` records between them."""
    wait_until(lambda: sum(len(lp.received) for lp in loops) >= n, timeout, what)


def acknowledger(seen: list[tuple], *, release: Collection[bytes] = (), release_once: Collection[bytes] = (),
                 reject: Collection[bytes] = (), offsets: bool = False) -> Callable[[Any], int]:
    """A ``ConsumerLoop`` action for explicit mode: notes every record in ``seen`` as (value,
    delivery count), or (offset, value, delivery count) with ``offsets``, and answers RELEASE for
    the values in ``release`` and for those in ``release_once`` on their first delivery, REJECT
    for the values in ``reject``, ACCEPT for the rest."""

    def action(m: Any) -> int:
        seen.append((m.offset(), m.value(), m.delivery_count()) if offsets else (m.value(), m.delivery_count()))
        if m.value() in release or (m.value() in release_once and m.delivery_count() == 1):
            return AcknowledgeType.RELEASE
        if m.value() in reject:
            return AcknowledgeType.REJECT
        return AcknowledgeType.ACCEPT

    return action


def wait_until(pred: Callable[[], bool], timeout: float, what: str = "condition", interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def poll_until(consumer: ShareConsumer, pred: Callable[[list[Any]], bool], timeout: float, *,
               name: str = "c", on_record: Callable[[Any], None] | None = None) -> list[Got]:
    """Poll ``consumer`` (in this thread) until ``pred(all records so far)`` or the timeout."""
    out: list[Got] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not pred(out):
        for m in records_of(consumer, 0.5):
            out.append(got(name, m))
            if on_record is not None:
                on_record(m)
    return out


@contextmanager
def subscribed(bootstrap: str, group: str, topic: str, *, explicit: bool = False,
               **conf: object) -> Iterator[ShareConsumer]:
    """A ``share_consumer`` subscribed to ``topic``, closed when the ``with`` block is left."""
    c = share_consumer(bootstrap, group, explicit=explicit, **conf)
    c.subscribe([topic])
    try:
        yield c
    finally:
        c.close()


def newcomer_gets(bootstrap: str, group: str, topic: str, seconds: float) -> list[Got]:
    """What a new consumer of the group receives in ``seconds`` (nothing, once every record is settled)."""
    with subscribed(bootstrap, group, topic) as c:
        return poll_until(c, lambda out: False, seconds)


def read_plain(bootstrap: str, topic: str, n: int, timeout: float = 30.0) -> list[Any]:
    """``n`` records of ``topic`` read with a plain (assign, earliest) consumer."""
    from confluent_kafka import TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"plain-{time.monotonic_ns()}",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest", "logger": quiet_logger()})
    md = c.list_topics(topic, timeout=10).topics[topic]
    c.assign([TopicPartition(topic, p, 0) for p in md.partitions])
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < n and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None or m.error() is not None:
                continue
            out.append(m)
    finally:
        c.close()
    return out


@dataclass
class Tally:
    """Records seen per value, for 'every record once' checks."""

    counts: dict[bytes, int] = field(default_factory=dict)

    def add(self, values: Iterable[bytes]) -> None:
        for v in values:
            self.counts[v] = self.counts.get(v, 0) + 1

    def duplicates(self) -> dict[bytes, int]:
        return {v: c for v, c in self.counts.items() if c > 1}


def assert_each_once(loops: Iterable[ConsumerLoop], expected: Iterable[bytes]) -> None:
    """Between them, the loops received every value of ``expected`` and none twice."""
    tally = Tally()
    for lp in loops:
        tally.add(lp.values())
    assert set(tally.counts) == set(expected)
    assert tally.duplicates() == {}


# ------------------------------------------------------------------------------------------------
# a consumer process that holds its records until it is killed

HOLDER_SCRIPT = r"""
import json, sys, time
from confluent_kafka import ShareConsumer
bootstrap, group, topic = sys.argv[1:4]
c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group,
                   "share.acknowledgement.mode": "explicit", "log_level": 0})
c.subscribe([topic])
while True:
    msgs = [m for m in c.poll(0.5) if m.error() is None]
    if msgs:
        for m in msgs:
            print(json.dumps([m.offset(), m.value().decode(), m.delivery_count()]), flush=True)
        break
print("HOLDING", flush=True)
while True:  # never acknowledges; heartbeats go on in librdkafka's threads until SIGKILL
    time.sleep(1)
"""


class HolderProcess:
    """An explicit-mode ShareConsumer in a child process: it takes its first records and holds
    them, never acknowledging, until it is killed. Entering the ``with`` block waits until it
    holds them (``held``: (offset, value, delivery count) each); leaving it kills the process if
    :meth:`kill` did not."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        self.args = [sys.executable, "-c", HOLDER_SCRIPT, bootstrap, group, topic]
        self.proc: subprocess.Popen | None = None
        self.held: list[tuple[int, bytes, int]] = []

    def __enter__(self) -> HolderProcess:
        self.proc = subprocess.Popen(self.args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        try:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                if line.startswith("HOLDING"):
                    break
                o, v, dc = json.loads(line)
                self.held.append((o, v.encode(), dc))
        except BaseException:
            self.__exit__()
            raise
        return self

    def kill(self) -> None:
        """SIGKILL (no leave, no acknowledgement, no goodbye), and wait for the process to end."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


# ------------------------------------------------------------------------------------------------
# raw share-group requests (ShareGroupHeartbeat, ShareFetch and ShareAcknowledge v1, the versions
# librdkafka sends), built by hand for exact control and for misbehaving on purpose

HeartbeatRequest = messages.message_class("ShareGroupHeartbeatRequest")
ShareFetchRequest = messages.message_class("ShareFetchRequest")
ShareAckRequest = messages.message_class("ShareAcknowledgeRequest")

# (topic id, partition) -> acknowledgement batches (first offset, last offset, acknowledge types)
Acks = dict[tuple[bytes, int], list[tuple[int, int, list[int]]]]


def hb_request(group: str, member: str, epoch: int, topics: list[str] | None = None) -> Any:
    return HeartbeatRequest(group_id=group, member_id=member, member_epoch=epoch, rack_id=None,
                            subscribed_topic_names=topics)


def fetch_request(group: str, member: str, epoch: int, parts: dict[bytes, list[int]] | None = None, *,
                  acks: Acks | None = None, forget: dict[bytes, list[int]] | None = None,
                  max_wait_ms: int = 0) -> Any:
    """ShareFetch of the partitions ``parts`` (topic id -> partitions) with ``acks`` piggybacked,
    forgetting ``forget``."""
    R = ShareFetchRequest
    topics: dict[bytes, dict[int, list]] = {}
    for tid, ps in (parts or {}).items():
        for p in ps:
            topics.setdefault(tid, {})[p] = []
    for (tid, p), batches in (acks or {}).items():
        topics.setdefault(tid, {})[p] = [
            R.AcknowledgementBatch(first_offset=a, last_offset=z, acknowledge_types=ty) for a, z, ty in batches]
    return R(group_id=group, member_id=member, share_session_epoch=epoch, max_wait_ms=max_wait_ms,
             min_bytes=1, max_bytes=1 << 20, max_records=100, batch_size=100,
             topics=[R.FetchTopic(topic_id=tid, partitions=[
                 R.FetchPartition(partition_index=p, acknowledgement_batches=b) for p, b in ps.items()])
                 for tid, ps in topics.items()],
             forgotten_topics_data=[R.ForgottenTopic(topic_id=t, partitions=ps) for t, ps in (forget or {}).items()])


def ack_request(group: str, member: str, epoch: int, acks: Acks) -> Any:
    R = ShareAckRequest
    topics: dict[bytes, list] = {}
    for (tid, p), batches in acks.items():
        topics.setdefault(tid, []).append(R.AcknowledgePartition(
            partition_index=p, acknowledgement_batches=[
                R.AcknowledgementBatch(first_offset=a, last_offset=z, acknowledge_types=ty)
                for a, z, ty in batches]))
    return R(group_id=group, member_id=member, share_session_epoch=epoch,
             topics=[R.AcknowledgeTopic(topic_id=t, partitions=ps) for t, ps in topics.items()])


def partitions(resp: Any) -> dict[tuple[bytes, int], Any]:
    """(topic id, partition) -> partition of a ShareFetch or ShareAcknowledge answer."""
    return {(t.topic_id, p.partition_index): p for t in resp.responses for p in t.partitions}


def acquired(resp: Any) -> list[tuple[int, int, int]]:
    """(first offset, last offset, delivery count) of every range a ShareFetch answer acquired."""
    return [(a.first_offset, a.last_offset, a.delivery_count)
            for p in partitions(resp).values() for a in p.acquired_records]


async def topic_id(conn: KafkaConnection, topic: str, *, attempts: int = 50) -> bytes:
    """The topic's id by Metadata, asked every 0.2 s until the topic has one."""
    Req = messages.message_class("MetadataRequest")
    version = conn.best_version(METADATA, hi=12)
    for _ in range(attempts):
        md = await conn.request(METADATA, version, Req(topics=[Req.MetadataRequestTopic(name=topic)],
                                                       allow_auto_topic_creation=False))
        for t in md.topics:
            if t.name == topic and t.error_code == 0 and t.topic_id != bytes(16):
                return t.topic_id
        await asyncio.sleep(0.2)
    raise AssertionError(f"no topic id for {topic}")


class Joining:
    """A new member heartbeating with its own ShareGroupHeartbeats until assigned a partition, refused,
    or out of time: what the raw clients' joins (blocking or asyncio) do between two heartbeats."""

    def __init__(self, topic: str, timeout: float) -> None:
        self.member, self.epoch = str(uuid.uuid4()), 0
        self.topics: list[str] | None = [topic]  # subscribed on the first heartbeat only
        self.deadline = time.monotonic() + timeout

    def coordinator_not_ready(self, r: Any) -> bool:
        """The answer asks to try again (the coordinator is loading or elsewhere) and there is time."""
        return r.error_code in COORDINATOR_NOT_READY and time.monotonic() < self.deadline

    def outcome(self, r: Any) -> tuple[str, int, Any] | None:
        """(member id, epoch, answer) once assigned, refused or out of time; else None (heartbeat
        again, as the member the answer names)."""
        if r.error_code or (r.assignment is not None and r.assignment.topic_partitions):
            return self.member, r.member_epoch, r
        if time.monotonic() > self.deadline:
            return self.member, r.member_epoch, r
        self.member, self.epoch, self.topics = r.member_id or self.member, r.member_epoch, None
        return None


class Raw:
    """Hand-built share-group requests on one connection."""

    def __init__(self, conn: KafkaConnection) -> None:
        self.conn = conn

    @classmethod
    async def open(cls, bootstrap: str, client_id: str = "raw") -> Raw:
        host, _, port = bootstrap.rpartition(":")
        return cls(await KafkaConnection.open(host, int(port), client_id=client_id))

    async def close(self) -> None:
        await self.conn.close()

    async def topic_id(self, topic: str, *, attempts: int = 100) -> bytes:
        return await topic_id(self.conn, topic, attempts=attempts)

    async def find_coordinator(self, group: str) -> Any:
        Req = messages.message_class("FindCoordinatorRequest")
        return await self.conn.request(FIND_COORDINATOR, 4, Req(key_type=0, coordinator_keys=[group]))

    async def hb(self, group: str, member: str, epoch: int, topics: list[str] | None = None) -> Any:
        return await self.conn.request(HEARTBEAT, 1, hb_request(group, member, epoch, topics))

    async def join(self, group: str, topic: str, timeout: float = 30.0) -> tuple[str, int]:
        """A new member, heartbeating until it has an assignment (Kafka 4.4 assigns on a later
        heartbeat); returns (member id, member epoch)."""
        member = str(uuid.uuid4())
        deadline = time.monotonic() + timeout
        r = await self.hb(group, member, 0, [topic])
        while r.error_code in COORDINATOR_NOT_READY and time.monotonic() < deadline:
            # A fresh Kafka creates its group coordinator's topic when a client first looks for a
            # coordinator (as real clients do before they join); until then it is not the coordinator.
            await self.find_coordinator(group)
            await asyncio.sleep(0.3)
            r = await self.hb(group, member, 0, [topic])
        assert r.error_code == NONE, r
        epoch = r.member_epoch
        while r.assignment is None or not r.assignment.topic_partitions:
            assert time.monotonic() < deadline, "no assignment"
            await asyncio.sleep(0.3)
            r = await self.hb(group, member, epoch, None)
            assert r.error_code == NONE, r
            epoch = r.member_epoch
        return member, epoch

    async def resubscribe(self, group: str, member: str, epoch: int, topics: list[str],
                          timeout: float = 30.0) -> list[int]:
        """Change the subscription; heartbeat until the assignment covers every topic. Returns
        the member epochs the answers carried, in order, without repeats."""
        seen = [epoch]
        r = await self.hb(group, member, epoch, topics)
        deadline = time.monotonic() + timeout
        while True:
            assert r.error_code == NONE, r
            if r.member_epoch != seen[-1]:
                seen.append(r.member_epoch)
            if r.assignment is not None and len(r.assignment.topic_partitions) == len(topics):
                return seen[1:]
            assert time.monotonic() < deadline, "no new assignment"
            await asyncio.sleep(0.3)
            r = await self.hb(group, member, seen[-1], None)

    async def fetch(self, group: str, member: str, epoch: int, parts: dict[bytes, list[int]] | None = None, *,
                    acks: Acks | None = None, forget: dict[bytes, list[int]] | None = None,
                    max_wait_ms: int = 0) -> Any:
        return await self.conn.request(SHARE_FETCH, 1, fetch_request(
            group, member, epoch, parts, acks=acks, forget=forget, max_wait_ms=max_wait_ms))

    async def ack(self, group: str, member: str, epoch: int, acks: Acks) -> Any:
        return await self.conn.request(SHARE_ACK, 1, ack_request(group, member, epoch, acks))
