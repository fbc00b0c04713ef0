"""The clients a benchmark drives: confluent-kafka producers and consumers (classic and share), admin
helpers, and a share-group member speaking the RPCs itself (:class:`Member`, over
:class:`kshare.client.KafkaConnection`), so that one RPC can be timed.

(``produce`` / ``consume`` come from ``benchmarks/bench_proxy.py``, ``consume_share`` /
``consume_classic`` from ``benchmarks/bench_share.py``, :class:`Member` from
``benchmarks/bench_ack_latency.py``.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..protocol.codes import ApiKey, ErrorCode
from .procs import HEARTBEAT_MS

_log = logging.getLogger("kshare.bench.clients")


def _quiet(*_: object) -> None:
    pass


def admin(bootstrap: str):
    from confluent_kafka.admin import AdminClient

    return AdminClient(
        {"bootstrap.servers": bootstrap, "error_cb": _quiet, "logger": _log, "socket.timeout.ms": 10000}
    )


def create_topic(bootstrap: str, name: str, partitions: int = 1, timeout: float = 60.0, *,
                 configs: Mapping[str, str] | None = None, replication_factor: int = 1) -> str:
    """Create ``name`` and wait until every partition has a leader (TimeoutError if not in ``timeout`` s)."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    client = admin(bootstrap)
    topic = NewTopic(name, num_partitions=partitions, replication_factor=replication_factor, config=dict(configs or {}))
    for attempt in range(3):
        try:
            client.create_topics([topic], operation_timeout=timeout, request_timeout=timeout)[name].result(timeout)
            break
        except KafkaException as exc:
            code = exc.args[0].code()
            if attempt and code == KafkaError.TOPIC_ALREADY_EXISTS:
                break  # the earlier attempt did create it
            # librdkafka fails a request in flight when it replaces its bootstrap connection by the
            # cluster's own broker (seen on a cluster of three just started): sent again
            if code not in (KafkaError._DESTROY_BROKER, KafkaError._TRANSPORT) or attempt == 2:
                raise
    deadline = time.monotonic() + timeout
    while True:
        md = client.list_topics(topic=name, timeout=10).topics.get(name)
        if (
            md is not None
            and md.error is None
            and len(md.partitions) == partitions
            and all(p.leader >= 0 for p in md.partitions.values())
        ):
            return name
        if time.monotonic() > deadline:
            raise TimeoutError(f"topic {name} has no leaders after {timeout:.0f} s: {md!r}")
        time.sleep(0.1)


def delete_topic(bootstrap: str, name: str) -> None:
    """Delete ``name`` (best effort: a failure is logged, the bench goes on).

    The client is held until the answer came: dropped sooner, librdkafka destroys its handle and
    the request never leaves (every bench topic then stayed on the broker's disk, 20 GB and
    more per run, and the write-back of it ran under the timed runs)."""
    client = admin(bootstrap)
    try:
        client.delete_topics([name], request_timeout=30)[name].result(30)
    except Exception as exc:  # noqa: BLE001 - what is left costs disk, not results
        _log.warning("deleting topic %s failed: %s", name, exc)


def set_group_configs(bootstrap: str, group: str, configs: dict[str, object], timeout: float = 60.0) -> None:
    """IncrementalAlterConfigs on the GROUP resource (retried while a proxy is still loading)."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    entries = [
        ConfigEntry(k, str(v), incremental_operation=AlterConfigOpType.SET) for k, v in configs.items()
    ]
    client = admin(bootstrap)
    deadline = time.monotonic() + timeout
    while True:
        try:
            resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=entries)
            for fut in client.incremental_alter_configs([resource]).values():
                fut.result(30)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def share_group(bootstrap: str, group: str) -> None:
    """Start at the earliest offset, heartbeat every 500 ms (Kafka 4.4 assigns on a heartbeat)."""
    set_group_configs(
        bootstrap, group, {"share.auto.offset.reset": "earliest", "share.heartbeat.interval.ms": HEARTBEAT_MS}
    )


# --------------------------------------------------------------------------------------------
# throughput


def produce(bootstrap: str, topic: str, records: int, value_size: int, partitions: int,
            linger_ms: int = 10) -> float:
    """Seconds to produce ``records`` values of ``value_size`` bytes, spread evenly over partitions.

    The producer cuts a partition's batch when it holds a megabyte or when ``linger_ms`` ran
    out, so with a short linger the batches depend on how fast the cluster takes them (one
    producer of 16 partitions of 1 KiB records: 1,034 batches on Kafka 3.9, 535 on 4.4). A long
    linger makes full batches wherever the records go: topics compared on two clusters then hold
    the same batches."""
    from confluent_kafka import KafkaException, Producer

    errors: list[object] = []
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": linger_ms,
            "batch.size": 1_000_000,
            "batch.num.messages": 100_000,
            "queue.buffering.max.messages": 2_000_000,
            "queue.buffering.max.kbytes": 2_097_151,
            "compression.type": "none",
            "acks": "all",
            "delivery.report.only.error": True,
            "on_delivery": lambda err, msg: errors.append(err),
            "error_cb": _quiet,
            "logger": _log,
        }
    )
    producer.list_topics(topic, timeout=10)  # connected, metadata known: the clock starts at the first record
    value = os.urandom(value_size)
    send = producer.produce
    t0 = time.perf_counter()
    for i in range(records):
        try:
            send(topic, value, partition=i % partitions)
        except BufferError:
            producer.poll(0.05)
            send(topic, value, partition=i % partitions)
    left = producer.flush(300)
    elapsed = time.perf_counter() - t0
    if left or errors:
        raise KafkaException(f"produce to {topic} via {bootstrap}: {left} undelivered, errors {errors[:3]}")
    return elapsed


def count_batches(bootstrap: str, topic: str) -> int:
    """How many record batches ``topic`` holds (read with Fetch requests, bodies never decoded):
    a share consumer's rate follows the batches it gets, so a comparison of two clusters shows it."""
    from ..share.records import split_batches
    from ..share.upstream import UpstreamCluster

    async def walk() -> int:
        host, _, port = bootstrap.rpartition(":")
        up = UpstreamCluster([(host, int(port))], client_id="kshare-bench")
        try:
            await up.refresh_metadata()
            info = up.topics[topic]
            count = 0
            for partition in range(info.partitions):
                offset = 0
                while True:
                    res = await up.fetch(info, partition, offset, max_bytes=8 << 20)
                    if res.error_code:
                        raise RuntimeError(f"fetch {topic}-{partition} at {offset}: error {res.error_code}")
                    batches = split_batches(res.records) if res.records is not None else []
                    if not batches:
                        break
                    count += len(batches)
                    offset = batches[-1].last_offset + 1
            return count
        finally:
            await up.close()

    return asyncio.run(walk())


def consume(bootstrap: str, topic: str, records: int, partitions: int, timeout: float = 300.0) -> float:
    """Seconds to read ``records`` records of ``topic`` from the beginning of every partition (assign)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            # librdkafka stops fetching a partition for this long once its local queue is full
            # (1 s by default): a reader slower than the fetches then idles for most of a second
            # in some runs and not others, and that, not the path measured, decided the time
            "fetch.queue.backoff.ms": 5,
            "error_cb": _quiet,
            "logger": _log,
        }
    )
    try:
        consumer.list_topics(topic, timeout=10)
        tps = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)]
        take = consumer.consume
        n = 0
        t0 = time.perf_counter()
        consumer.assign(tps)
        deadline = time.monotonic() + timeout
        while n < records:
            # never ask for more than is left: consume() waits its whole timeout for a batch it
            # cannot fill, which put a second of nothing at the end of some runs and not others
            n += len(take(min(10_000, records - n), 1.0))
            if time.monotonic() > deadline:
                raise TimeoutError(f"consumed {n} of {records} records of {topic} via {bootstrap}")
        elapsed = time.perf_counter() - t0
        # every counted message was a record (no error events): the positions add up to the count
        positions = consumer.position([TopicPartition(topic, p) for p in range(partitions)])
        total = sum(tp.offset for tp in positions)
        if n != records or total != records:
            raise RuntimeError(
                f"{topic} via {bootstrap}: consumed {n}, positions add up to {total}, want {records}"
            )
        return elapsed
    finally:
        consumer.close()


@dataclass
class ConsumeRun:
    seconds: float  # first poll (group join included) -> last record
    first_record_s: float  # first poll -> first record (the join)
    data_seconds: float  # first record -> last record


def consume_share(bootstrap: str, topic: str, records: int, timeout: float = 600.0) -> ConsumeRun:
    """One confluent-kafka ShareConsumer (implicit acknowledgement) of a fresh group reads ``records``."""
    from confluent_kafka import ShareConsumer

    group = f"bench-share-{uuid.uuid4().hex[:8]}"
    share_group(bootstrap, group)
    c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group, "error_cb": _quiet, "log_level": 3})
    c.subscribe([topic])
    return _poll_loop(c, lambda: c.poll(1.0), records, timeout, f"share consumer via {bootstrap}")


def consume_classic(bootstrap: str, topic: str, records: int, timeout: float = 600.0) -> ConsumeRun:
    """One classic consumer-group Consumer (subscribe, fresh group, from the earliest offset)."""
    from confluent_kafka import Consumer

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-classic-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": True,
            "error_cb": _quiet,
            "logger": _log,
        }
    )
    c.subscribe([topic])
    got = [0]  # records so far, to ask for no more than is left (see ``consume``)
    return _poll_loop(c, lambda: c.consume(min(500, records - got[0]), 1.0), records, timeout,
                      f"classic consumer via {bootstrap}", got)


def _poll_loop(c: Any, poll: Any, records: int, timeout: float, what: str, got: list[int] | None = None) -> ConsumeRun:
    n = 0
    first = None
    t0 = time.perf_counter()
    deadline = time.monotonic() + timeout
    try:
        while n < records:
            msgs = poll()
            for m in msgs:
                if m.error() is None:
                    n += 1
            if got is not None:
                got[0] = n
            if n and first is None:
                first = time.perf_counter()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} read {n} of {records}")
        t1 = time.perf_counter()
    finally:
        c.close()
    if n != records:
        raise RuntimeError(f"{what} read {n} records, want {records} (duplicates?)")
    first = first or t0
    return ConsumeRun(t1 - t0, first - t0, t1 - first)


# --------------------------------------------------------------------------------------------
# a share-group member speaking the RPCs itself

HEARTBEAT, SHARE_FETCH, SHARE_ACK = ApiKey.SHARE_GROUP_HEARTBEAT, ApiKey.SHARE_FETCH, ApiKey.SHARE_ACKNOWLEDGE
METADATA = ApiKey.METADATA
ACCEPT = 1
RETRIABLE = {ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.NOT_COORDINATOR}


async def connect(bootstrap: str, client_id: str):
    from kshare.clients.connection import KafkaConnection

    host, _, port = bootstrap.rpartition(":")
    return await KafkaConnection.open(host, int(port), client_id=client_id)


async def topic_id(conn: Any, topic: str) -> bytes:
    from kshare.protocol import messages

    Req = messages.message_class("MetadataRequest")
    version = conn.best_version(METADATA, hi=12)
    for _ in range(300):
        md = await conn.request(
            METADATA,
            version,
            Req(topics=[Req.MetadataRequestTopic(name=topic)], allow_auto_topic_creation=False),
        )
        for t in md.topics:
            if t.name == topic and t.error_code == 0 and t.topic_id != bytes(16):
                return t.topic_id
        await asyncio.sleep(0.1)
    raise RuntimeError(f"no topic id for {topic}")


async def find_coordinator(bootstrap: str, group: str, timeout: float = 60.0) -> None:
    """Ask for the group's coordinator until one answers. A fresh Kafka 4.4 broker creates its
    offsets topic only when a FindCoordinator asks for one: members that go straight to
    ShareGroupHeartbeat (as ``Member`` does) would be told "still loading" until then."""
    from kshare.protocol import messages

    Req = messages.message_class("FindCoordinatorRequest")
    conn = await connect(bootstrap, "bench-find-coordinator")
    try:
        deadline = time.monotonic() + timeout
        while True:
            version = conn.best_version(ApiKey.FIND_COORDINATOR, hi=4)
            resp = await conn.request(ApiKey.FIND_COORDINATOR, version, Req(key_type=0, coordinator_keys=[group]))
            codes = [c.error_code for c in resp.coordinators] if version >= 4 else [resp.error_code]
            if not any(codes):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"no coordinator for group {group}: error codes {codes}")
            await asyncio.sleep(0.5)
    finally:
        await conn.close()


def _batches(R: Any, batches: list[tuple[int, int, list[int]]]) -> list[Any]:
    """The acknowledgement batches (of request class ``R``) of (first offset, last offset, acknowledge types)."""
    return [R.AcknowledgementBatch(first_offset=a, last_offset=z, acknowledge_types=t) for a, z, t in batches]


class Member:
    """A share-group member on its own connection: ShareGroupHeartbeat, ShareFetch, ShareAcknowledge."""

    def __init__(self, conn: Any, group: str, tid: bytes) -> None:
        self.conn, self.group, self.topic_id = conn, group, tid
        self.member_id = str(uuid.uuid4())
        self.epoch = 0
        self.session = 0
        self.assigned: list[int] = []

    @classmethod
    async def join(
        cls, bootstrap: str, group: str, topic: str, *, tid: bytes | None = None, want: int = 1
    ) -> Member:
        """Join; returns once the member is assigned at least ``want`` partitions."""
        conn = await connect(bootstrap, "bench-member")
        self = cls(conn, group, tid or await topic_id(conn, topic))
        await self.heartbeat([topic])
        deadline = time.monotonic() + 120
        while len(self.assigned) < want and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            await self.heartbeat(None)
        if len(self.assigned) < want:
            raise RuntimeError(f"member assigned {self.assigned}")
        return self

    async def heartbeat(self, topics: list[str] | None) -> None:
        from kshare.protocol import messages

        Req = messages.message_class("ShareGroupHeartbeatRequest")
        for _ in range(600):
            resp = await self.conn.request(
                HEARTBEAT,
                1,
                Req(
                    group_id=self.group,
                    member_id=self.member_id,
                    member_epoch=self.epoch,
                    rack_id=None,
                    subscribed_topic_names=topics,
                ),
            )
            if resp.error_code in RETRIABLE:
                await asyncio.sleep(0.1)
                continue
            if resp.error_code:
                raise RuntimeError(f"heartbeat: {resp}")
            self.epoch = resp.member_epoch
            if resp.assignment is not None:
                self.assigned = sorted(p for t in resp.assignment.topic_partitions for p in t.partitions)
            return
        raise RuntimeError("heartbeat: still loading")

    async def fetch(
        self,
        partitions: list[int],
        *,
        max_records: int = 500,
        max_wait_ms: int = 1000,
        acks: dict[int, list[tuple[int, int, list[int]]]] | None = None,
    ) -> dict[int, list[tuple[int, int, int]]]:
        from kshare.protocol import messages

        R = messages.message_class("ShareFetchRequest")
        parts = sorted((set(partitions) if self.session == 0 else set()) | set(acks or {}))
        topics = (
            [
                R.FetchTopic(
                    topic_id=self.topic_id,
                    partitions=[
                        R.FetchPartition(
                            partition_index=p,
                            acknowledgement_batches=_batches(R, (acks or {}).get(p, [])),
                        )
                        for p in parts
                    ],
                )
            ]
            if parts
            else []
        )
        req = R(
            group_id=self.group,
            member_id=self.member_id,
            share_session_epoch=self.session,
            max_wait_ms=max_wait_ms,
            min_bytes=1,
            max_bytes=16 << 20,
            max_records=max_records,
            batch_size=max_records,
            topics=topics,
            forgotten_topics_data=[],
        )
        resp = await self.conn.request(SHARE_FETCH, 1, req)
        if resp.error_code:
            raise RuntimeError(f"ShareFetch: {resp.error_code} {resp.error_message}")
        self.session += 1
        out: dict[int, list[tuple[int, int, int]]] = {}
        for t in resp.responses:
            for p in t.partitions:
                if p.error_code in RETRIABLE:
                    continue
                if p.error_code:
                    raise RuntimeError(f"ShareFetch partition {p.partition_index}: {p.error_code}")
                out[p.partition_index] = [
                    (a.first_offset, a.last_offset, a.delivery_count) for a in p.acquired_records
                ]
        return out

    async def acknowledge(self, acks: dict[int, list[tuple[int, int, list[int]]]]) -> float:
        """One ShareAcknowledge; its round trip in seconds (every partition must succeed)."""
        from kshare.protocol import messages

        R = messages.message_class("ShareAcknowledgeRequest")
        req = R(
            group_id=self.group,
            member_id=self.member_id,
            share_session_epoch=self.session,
            topics=[
                R.AcknowledgeTopic(
                    topic_id=self.topic_id,
                    partitions=[
                        R.AcknowledgePartition(
                            partition_index=p,
                            acknowledgement_batches=_batches(R, batches),
                        )
                        for p, batches in acks.items()
                    ],
                )
            ],
        )
        t0 = time.perf_counter()
        resp = await self.conn.request(SHARE_ACK, 1, req)
        dt = time.perf_counter() - t0
        self.session += 1
        errors = [p.error_code for t in resp.responses for p in t.partitions if p.error_code]
        if resp.error_code or errors:
            raise RuntimeError(f"ShareAcknowledge: {resp.error_code} {errors}")
        return dt

    async def close(self, timeout: float = 10.0) -> None:
        """Leave the share session and the group (each answer awaited up to ``timeout``), close the connection."""
        from kshare.protocol import messages

        try:
            R = messages.message_class("ShareAcknowledgeRequest")
            req = R(group_id=self.group, member_id=self.member_id, share_session_epoch=-1, topics=[])
            await asyncio.wait_for(self.conn.request(SHARE_ACK, 1, req), timeout)
            Hb = messages.message_class("ShareGroupHeartbeatRequest")
            leave = self.conn.request(
                HEARTBEAT,
                1,
                Hb(
                    group_id=self.group,
                    member_id=self.member_id,
                    member_epoch=-1,
                    rack_id=None,
                    subscribed_topic_names=None,
                ),
            )
            await asyncio.wait_for(leave, timeout)
        except Exception:  # noqa: BLE001 - closing anyway
            pass
        finally:
            with contextlib.suppress(Exception):
                await self.conn.close()


@contextlib.asynccontextmanager
async def keepalive(members: list[Member], interval: float = 1.0):
    """Heartbeat the members in the background, all at once (their sessions would time out otherwise)."""

    async def one(m: Member) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(m.heartbeat(None), interval * 2)

    async def beat() -> None:
        while True:
            await asyncio.sleep(interval)
            await asyncio.gather(*(one(m) for m in list(members)))

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def produce_batches(
    bootstrap: str, topic: str, n: int, partitions: int, batch: int = 500, size: int = 10
) -> None:
    """``n`` records round-robin by batch over the partitions, producer batches of ``batch`` records."""
    from confluent_kafka import Producer

    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.num.messages": batch,
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 2_097_151,
            "acks": "all",
            "error_cb": _quiet,
            "logger": _log,
        }
    )
    value = os.urandom(size)
    for i in range(n):
        while True:
            try:
                p.produce(topic, value, partition=(i // batch) % partitions)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(300) == 0
