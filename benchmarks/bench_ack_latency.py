"""Durability costs end to end through kshare: acknowledgement latency, state-topic bytes, recovery.

Run by hand (not in CI), from the repository root with the project's venv:

    python benchmarks/bench_ack_latency.py                  # the full run (several minutes)
    python benchmarks/bench_ack_latency.py --quick          # a short smoke run
    python benchmarks/bench_ack_latency.py --out docs/benchmarks-durability.md

One private Apache Kafka 3.9 broker (``tests.brokers.KafkaBroker``, 1 GB log segments so no
state-topic segment is ever deleted) and kshare as a child process (``python -m kshare proxy``)
in front of it. The clients speak the share-group RPCs themselves through
``kshare.client.KafkaConnection`` (ShareGroupHeartbeat, ShareFetch, ShareAcknowledge), so what is
timed is exactly one RPC.

**Acknowledgement latency.** ShareAcknowledge sent to response received, measured in the client,
for acknowledgements that change durable state: kshare answers only after the state write is
acknowledged by the cluster (acks=all, idempotent producer), so the write is inside the figure.
(a) one member acknowledging one record per ShareAcknowledge (ACCEPT) out of a 500-record
acquisition, one request at a time; (b) N members of one group (``--members``, default 1, 4, 16,
64) on a 16-partition topic, each fetching (up to 500 records) and acknowledging each whole
acquisition in one ShareAcknowledge, all at once (their state writes share produce rounds). The
assignor gives every member min(16, max(ceil(16/N), 8)) partitions, so from 3 members on they
share partitions, as real share consumers do. Baseline in the same run: a Produce (acks=all, one
60-byte record, the size of a ShareUpdate) sent straight to the broker, one at a time, and 16 at a
time. The mean of kshare's own ``kshare_state_write_seconds`` histogram (queue wait + produce
round) over the scenario is reported too, and the CPU the proxy and the benchmark process (all
members, one asyncio loop) used per wall-clock second: the client is not the bottleneck while
that stays well under 100 %.

``--ack-only`` runs only (b), ``--repeats`` times, alternated with a second kshare from another
source tree (``--baseline-tree``, e.g. ``git worktree add /tmp/base <commit>``) or of this tree
with other environment variables (``--variant``), both in front of the same broker; the table
has the medians of p50 and p99 per member count:

    python benchmarks/bench_ack_latency.py --ack-only --samples 1000 --repeats 3 \
        --baseline-tree /tmp/base

**State-topic bytes per million acknowledged records.** 1,000,000 records (producer batches of
500) on 10 partitions; 10 members, one per partition, fetch (up to 500 records) and acknowledge
each acquisition in one ShareAcknowledge until every record is accepted: (i) everything
accepted, (ii) every record released with probability 1 % (released records come back and are
accepted, or released again with 1 %). Measured on the broker: records appended to the state
topic (end offsets) and bytes of its ``.log`` segment files (record batches with all Kafka
framing), both per 10^6 accepted records. ``benchmarks/bench_state_store.py`` measures the same
at the store level (a ``SharePartition`` engine driving ``TopicStateStore`` directly); this is
the proxy's real traffic, group records and pruning included.

**Recovery.** 1,000 share-partitions (10 groups x a 100-partition topic holding 2,000 records per
partition) with 2,000 in-flight records each in the worst shape (every record its own state range:
Available with delivery counts 1-4 alternating with Acknowledged/Archived, a 40 KB snapshot each,
``bench_state_store.worst_case_snapshot``) written to a fresh state topic with
``TopicStateStore``; then kshare is started on it (and SIGKILLed and started again, best of 3):
process start to the "share state loaded" log line, the load time kshare logs itself, and process
start to the first ShareFetch of a recovered share-partition that returns records (whose
delivery counts are checked against the snapshot). ``bench_state_store.py`` has the store-level
load time of the same topic content.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import random
import re
import resource
import signal
import statistics
import sys
import time
import urllib.request
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_state_store import topic_bytes_on_disk, worst_case_snapshot  # noqa: E402
from kshare.client import KafkaConnection  # noqa: E402
from kshare.protocol import messages  # noqa: E402
from kshare.share.state_topic import TopicStateStore  # noqa: E402
from kshare.share.store import GroupRecord, SharePartitionKey  # noqa: E402
from tests.brokers import KAFKA_3, KafkaBroker, free_port  # noqa: E402
from tests.proxy_harness import ProxyProcess  # noqa: E402

HEARTBEAT, SHARE_FETCH, SHARE_ACK, METADATA, PRODUCE = 76, 78, 79, 3, 0
ACCEPT, RELEASE = 1, 2
RETRIABLE = {14, 15, 16}
LIMITS = ("--group-limit", "group.share.min.heartbeat.interval.ms=100",
          "--group-limit", "group.share.min.session.timeout.ms=1000")
EARLIEST = {"share.auto.offset.reset": "earliest"}


# ------------------------------------------------------------------------------------------------
# kshare as a child process


class _TreeProxyProcess(ProxyProcess):
    """``python -m kshare proxy`` run from another source tree (``-m`` imports from the cwd)."""

    def __init__(self, *args: str, port: int, tree: Path, env: dict[str, str] | None = None) -> None:
        super().__init__(*args, port=port, env={**(env or {}), "PYTHONPATH": str(tree)})
        self.tree = tree

    def start(self, timeout: float = 30.0) -> ProxyProcess:
        import subprocess
        import threading

        self.process = subprocess.Popen([sys.executable, "-m", "kshare", *self.args], cwd=self.tree,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=self.env)
        deadline = time.monotonic() + timeout
        assert self.process.stdout is not None
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                raise RuntimeError("proxy exited at start:\n" + "".join(self.output))
            self.output.append(line)
            if re.search(r"upstream cluster has \d+ broker", line):
                threading.Thread(target=self._drain, daemon=True).start()
                return self
        raise RuntimeError("proxy not ready in time:\n" + "".join(self.output))


class KShare:
    def __init__(self, broker: KafkaBroker, state_topic: str, tree: Path | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.tree = tree
        self.env = env
        self.port = free_port()
        self.metrics_port = free_port()
        self.args = ("--upstream", broker.bootstrap, "--state-topic", state_topic, "--metrics-port",
                     str(self.metrics_port), *LIMITS)
        self.proc: ProxyProcess | None = None
        self.broker_port_base = free_port() - broker.node_id

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 600.0) -> tuple[float, float]:
        """(process start -> "share state loaded", the load time kshare logged)."""
        t0 = time.monotonic()
        args = (*self.args, "--broker-port-base", str(self.broker_port_base))
        self.proc = (ProxyProcess(*args, port=self.port, env=self.env) if self.tree is None
                     else _TreeProxyProcess(*args, port=self.port, tree=self.tree, env=self.env))
        self.proc.start(timeout)
        while True:
            for line in list(self.proc.output):
                m = re.search(r"share state loaded in ([0-9.]+)s", line)
                if m:
                    return time.monotonic() - t0, float(m.group(1))
            if self.proc.process.poll() is not None or time.monotonic() - t0 > timeout:
                raise RuntimeError("kshare did not load its state:\n" + "".join(self.proc.output[-50:]))
            time.sleep(0.005)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()

    def cpu_seconds(self) -> float:
        """User + system CPU time of the proxy process so far."""
        assert self.proc is not None and self.proc.process is not None
        fields = Path(f"/proc/{self.proc.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def state_write_seconds(self) -> tuple[float, int]:
        """(sum, count) of kshare_state_write_seconds."""
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).read().decode()
        total = count = 0.0
        for line in text.splitlines():
            if line.startswith("kshare_state_write_seconds_sum"):
                total += float(line.split()[-1])
            elif line.startswith("kshare_state_write_seconds_count"):
                count += float(line.split()[-1])
        return total, int(count)


# ------------------------------------------------------------------------------------------------
# a share-group member speaking the RPCs itself


async def connect(bootstrap: str, client_id: str) -> KafkaConnection:
    host, _, port = bootstrap.rpartition(":")
    return await KafkaConnection.open(host, int(port), client_id=client_id)


async def topic_id(conn: KafkaConnection, topic: str) -> bytes:
    Req = messages.message_class("MetadataRequest")
    version = conn.best_version(METADATA, hi=12)
    for _ in range(100):
        md = await conn.request(METADATA, version, Req(topics=[Req.MetadataRequestTopic(name=topic)],
                                                       allow_auto_topic_creation=False))
        for t in md.topics:
            if t.name == topic and t.error_code == 0 and t.topic_id != bytes(16):
                return t.topic_id
        await asyncio.sleep(0.1)
    raise RuntimeError(f"no topic id for {topic}")


class Member:
    def __init__(self, conn: KafkaConnection, group: str, tid: bytes) -> None:
        self.conn, self.group, self.topic_id = conn, group, tid
        self.member_id = str(uuid.uuid4())
        self.epoch = 0
        self.session = 0
        self.assigned: list[int] = []

    @classmethod
    async def join(cls, bootstrap: str, group: str, topic: str, *, want: int = 1) -> Member:
        """Join; returns once the member is assigned at least ``want`` partitions."""
        conn = await connect(bootstrap, "bench-member")
        self = cls(conn, group, await topic_id(conn, topic))
        await self.heartbeat([topic])
        deadline = time.monotonic() + 60
        while len(self.assigned) < want and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            await self.heartbeat(None)
        if len(self.assigned) < want:
            raise RuntimeError(f"member assigned {self.assigned}")
        return self

    async def heartbeat(self, topics: list[str] | None) -> None:
        Req = messages.message_class("ShareGroupHeartbeatRequest")
        for _ in range(600):
            resp = await self.conn.request(HEARTBEAT, 1, Req(group_id=self.group, member_id=self.member_id,
                                                              member_epoch=self.epoch, rack_id=None,
                                                              subscribed_topic_names=topics))
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

    async def fetch(self, partitions: list[int], *, max_records: int = 500, max_wait_ms: int = 1000,
                    acks: dict[int, list[tuple[int, int, list[int]]]] | None = None) -> dict[int, list[tuple[int, int, int]]]:
        R = messages.message_class("ShareFetchRequest")
        parts = sorted((set(partitions) if self.session == 0 else set()) | set(acks or {}))
        req = R(group_id=self.group, member_id=self.member_id, share_session_epoch=self.session,
                max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=16 << 20, max_records=max_records,
                batch_size=max_records,
                topics=[R.FetchTopic(topic_id=self.topic_id, partitions=[
                    R.FetchPartition(partition_index=p, acknowledgement_batches=[
                        R.AcknowledgementBatch(first_offset=a, last_offset=z, acknowledge_types=t)
                        for a, z, t in (acks or {}).get(p, [])]) for p in parts])] if parts else [],
                forgotten_topics_data=[])
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
                out[p.partition_index] = [(a.first_offset, a.last_offset, a.delivery_count) for a in p.acquired_records]
        return out

    async def acknowledge(self, acks: dict[int, list[tuple[int, int, list[int]]]]) -> float:
        """One ShareAcknowledge; its round trip in seconds (every partition must succeed)."""
        R = messages.message_class("ShareAcknowledgeRequest")
        req = R(group_id=self.group, member_id=self.member_id, share_session_epoch=self.session,
                topics=[R.AcknowledgeTopic(topic_id=self.topic_id, partitions=[R.AcknowledgePartition(
                    partition_index=p, acknowledgement_batches=[
                        R.AcknowledgementBatch(first_offset=a, last_offset=z, acknowledge_types=t)
                        for a, z, t in batches]) for p, batches in acks.items()])])
        t0 = time.perf_counter()
        resp = await self.conn.request(SHARE_ACK, 1, req)
        dt = time.perf_counter() - t0
        self.session += 1
        errors = [p.error_code for t in resp.responses for p in t.partitions if p.error_code]
        if resp.error_code or errors:
            raise RuntimeError(f"ShareAcknowledge: {resp.error_code} {errors}")
        return dt

    async def close(self) -> None:
        try:
            R = messages.message_class("ShareAcknowledgeRequest")
            await self.conn.request(SHARE_ACK, 1, R(group_id=self.group, member_id=self.member_id,
                                                    share_session_epoch=-1, topics=[]))
            Hb = messages.message_class("ShareGroupHeartbeatRequest")
            await self.conn.request(HEARTBEAT, 1, Hb(group_id=self.group, member_id=self.member_id,
                                                     member_epoch=-1, rack_id=None, subscribed_topic_names=None))
        finally:
            await self.conn.close()


@contextlib.asynccontextmanager
async def keepalive(members: list[Member], interval: float = 1.0):
    """Heartbeat the members in the background (their sessions would time out otherwise)."""

    async def beat() -> None:
        while True:
            await asyncio.sleep(interval)
            for m in members:
                await m.heartbeat(None)

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def set_configs(bootstrap: str, group: str, configs: dict[str, str]) -> None:
    Req = messages.message_class("IncrementalAlterConfigsRequest")
    conn = await connect(bootstrap, "bench-admin")
    try:
        for _ in range(600):
            resp = await conn.request(44, 1, Req(resources=[Req.AlterConfigsResource(
                resource_type=32, resource_name=group, configs=[
                    Req.AlterableConfig(name=k, config_operation=0, value=v) for k, v in configs.items()])],
                validate_only=False))
            code = resp.responses[0].error_code
            if code in RETRIABLE:
                await asyncio.sleep(0.1)
                continue
            if code:
                raise RuntimeError(f"IncrementalAlterConfigs: {code} {resp.responses[0].error_message}")
            return
    finally:
        await conn.close()


def produce(bootstrap: str, topic: str, n: int, partitions: int, batch: int = 500) -> None:
    """``n`` records (``b"<i>"``) round-robin by batch over the partitions, producer batches of ``batch``."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": batch,
                  "queue.buffering.max.messages": 1_000_000, "acks": "all"})
    for i in range(n):
        while True:
            try:
                p.produce(topic, str(i).encode(), partition=(i // batch) % partitions)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(120) == 0


def produce_per_partition(bootstrap: str, topic: str, counts: list[int], batch: int = 500) -> None:
    """``counts[p]`` records into partition ``p``, producer batches of ``batch``."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": batch,
                  "queue.buffering.max.messages": 1_000_000, "acks": "all"})
    for part, n in enumerate(counts):
        for i in range(n):
            while True:
                try:
                    p.produce(topic, str(i).encode(), partition=part)
                    break
                except BufferError:
                    p.poll(0.05)
    assert p.flush(300) == 0


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-watermarks"})
    try:
        md = c.list_topics(topic, timeout=10).topics[topic]
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in md.partitions}
    finally:
        c.close()


# ------------------------------------------------------------------------------------------------
# 1. acknowledgement latency


@dataclass
class Latency:
    name: str
    samples: list[float]
    write_mean: float | None = None  # kshare_state_write_seconds mean over the scenario
    members: int = 1
    proxy_cpu: float | None = None  # proxy CPU seconds per wall second over the scenario
    client_cpu: float | None = None  # the benchmark process's (all members') CPU seconds per wall second

    def pct(self, q: float) -> float:
        s = sorted(self.samples)
        return s[min(len(s) - 1, int(q * len(s)))] * 1000

    def row(self, baseline: float | None) -> str:
        ratio = f"{self.pct(0.5) / baseline:.1f}x" if baseline else "-"
        write = f"{self.write_mean * 1000:.2f} ms" if self.write_mean is not None else "-"
        return (f"| {self.name} | {len(self.samples):,} | {self.pct(0.5):.2f} ms | {self.pct(0.99):.2f} ms | "
                f"{statistics.fmean(self.samples) * 1000:.2f} ms | {write} | {ratio} |")

    def cpu(self) -> str:
        if self.proxy_cpu is None or self.client_cpu is None:
            return "- / -"
        return f"{self.proxy_cpu:.0%} / {self.client_cpu:.0%}"


def _process_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def ack_latency(kshare: KShare, broker: KafkaBroker, topic: str, samples: int, *, per_record: bool,
                      members: int, name: str, rate: float = 0.0) -> Latency:
    """``members`` members of one group on ``topic``, fetching and acknowledging until ``samples``
    ShareAcknowledge round trips were timed. ``rate`` > 0: all members together start at most
    ``rate`` fetch-and-acknowledge cycles per second (each member one per ``members / rate``
    seconds, at random phases), instead of each going as fast as it can."""
    group = f"lat-{uuid.uuid4().hex[:8]}"
    await set_configs(kshare.bootstrap, group, EARLIEST)
    ms = [await Member.join(kshare.bootstrap, group, topic) for _ in range(members)]
    # wait for the assignment to settle (the assignor gives each member min(P, max(ceil(P/M), 8))
    # partitions, so members share partitions: as in any share group of more than P/8 members)
    deadline, last = time.monotonic() + 60, None
    while time.monotonic() < deadline:
        for m in ms:
            await m.heartbeat(None)
        now = [tuple(m.assigned) for m in ms]
        if now == last and all(now):
            break
        last = now
        await asyncio.sleep(0.3)
    else:
        raise RuntimeError(f"assignment did not settle: {[m.assigned for m in ms]}")
    out: list[float] = []
    before = kshare.state_write_seconds()
    cpu0, client0, t0 = kshare.cpu_seconds(), _process_cpu(), time.monotonic()

    async def run(m: Member) -> None:
        parts = m.assigned[:1] if per_record else m.assigned
        cycle = members / rate if rate > 0 else 0.0
        next_at = time.monotonic() + random.random() * cycle
        while len(out) < samples:
            if cycle:
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
                next_at += cycle * (0.5 + random.random())
            got = await m.fetch(parts)
            ranges = [(p, a, z) for p, rs in got.items() for a, z, _ in rs]
            if not ranges:
                continue
            if per_record:
                for p, a, z in ranges:
                    for o in range(a, z + 1):
                        out.append(await m.acknowledge({p: [(o, o, [ACCEPT])]}))
            else:
                acks: dict[int, list] = {}
                for p, a, z in ranges:
                    acks.setdefault(p, []).append((a, z, [ACCEPT]))
                out.append(await m.acknowledge(acks))

    async with keepalive(ms):
        await asyncio.gather(*(run(m) for m in ms))
    wall = time.monotonic() - t0
    cpu1, client1 = kshare.cpu_seconds(), _process_cpu()
    after = kshare.state_write_seconds()
    for m in ms:
        await m.close()
    writes = after[1] - before[1]
    return Latency(name, out[:samples] if not per_record else out,
                   (after[0] - before[0]) / writes if writes else None, members,
                   (cpu1 - cpu0) / wall, (client1 - client0) / wall)


def latency_topic(broker: KafkaBroker, acks: int, partitions: int = 16) -> str:
    """A topic holding ``acks`` 500-record acquisitions twice over, spread over ``partitions``
    (each scenario is a new group reading from the start)."""
    topic = broker.create_topic(f"lat-{uuid.uuid4().hex[:6]}", partitions=partitions)
    produce_per_partition(broker.bootstrap, topic, [(2 * -(-acks // partitions) + 4) * 500] * partitions)
    return topic


async def produce_latency(broker: KafkaBroker, topic: str, samples: int, concurrency: int, name: str) -> Latency:
    from aiokafka.record.default_records import DefaultRecordBatchBuilder

    Req = messages.message_class("ProduceRequest")
    conns = [await connect(broker.bootstrap, "bench-produce") for _ in range(concurrency)]
    version = conns[0].best_version(PRODUCE, hi=9)
    out: list[float] = []
    warm = [0]

    async def run(conn: KafkaConnection, partition: int) -> None:
        while len(out) < samples:
            b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0, producer_id=-1,
                                          producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
            b.append(0, timestamp=int(time.time() * 1000), key=os.urandom(30), value=os.urandom(30), headers=[])
            req = Req(transactional_id=None, acks=-1, timeout_ms=30000, topic_data=[Req.TopicProduceData(
                name=topic, partition_data=[Req.PartitionProduceData(index=partition, records=bytes(b.build()))])])
            t0 = time.perf_counter()
            resp = await conn.request(PRODUCE, version, req)
            dt = time.perf_counter() - t0
            code = resp.responses[0].partition_responses[0].error_code
            if code in (6, 5, 7):  # NOT_LEADER_OR_FOLLOWER, LEADER_NOT_AVAILABLE, REQUEST_TIMED_OUT: a new topic
                await asyncio.sleep(0.1)
                continue
            if code:
                raise RuntimeError(f"Produce: error {code}")
            warm[0] += 1
            if warm[0] > 50 * concurrency:  # the first requests of each connection are not counted
                out.append(dt)

    await asyncio.gather(*(run(c, i % 16) for i, c in enumerate(conns)))
    for c in conns:
        await c.close()
    return Latency(name, out)


# ------------------------------------------------------------------------------------------------
# 2. bytes on the state topic


@dataclass
class Volume:
    name: str
    accepted: int
    released: int
    acks: int  # ShareAcknowledge requests
    records: int  # state records appended
    on_disk: int
    seconds: float
    latencies: list[float] = field(default_factory=list)

    def per_million(self, v: float) -> float:
        return v * 1_000_000 / self.accepted


async def state_volume(kshare: KShare, broker: KafkaBroker, state_topic: str, topic: str, partitions: int,
                       release_rate: float, name: str, seed: int) -> Volume:
    group = f"vol-{uuid.uuid4().hex[:8]}"
    await set_configs(kshare.bootstrap, group, EARLIEST)
    ends = end_offsets(broker.bootstrap, topic)
    total = sum(ends.values())
    ms = [await Member.join(kshare.bootstrap, group, topic) for _ in range(partitions)]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for m in ms:
            await m.heartbeat(None)
        if all(len(m.assigned) == 1 for m in ms) and len({m.assigned[0] for m in ms}) == partitions:
            break
        await asyncio.sleep(0.2)
    else:
        raise RuntimeError("assignment did not settle")
    await asyncio.sleep(2.0)  # group record writes of the joins are done
    rec0 = sum(end_offsets(broker.bootstrap, state_topic).values())
    disk0 = topic_bytes_on_disk(broker, state_topic)
    counts = {"accepted": 0, "released": 0, "acks": 0}
    latencies: list[float] = []
    t0 = time.monotonic()

    async def run(m: Member, rng: random.Random) -> None:
        p = m.assigned[0]
        done: set[int] = set()
        while len(done) < ends[p]:
            got = (await m.fetch([p])).get(p, [])
            if not got:
                continue
            batches: list[tuple[int, int, list[int]]] = []
            for a, z, _ in got:
                for o in range(a, z + 1):
                    t = RELEASE if release_rate and rng.random() < release_rate else ACCEPT
                    if t == ACCEPT:
                        done.add(o)
                        counts["accepted"] += 1
                    else:
                        counts["released"] += 1
                    if batches and batches[-1][2] == [t] and batches[-1][1] == o - 1:
                        batches[-1] = (batches[-1][0], o, [t])
                    else:
                        batches.append((o, o, [t]))
            latencies.append(await m.acknowledge({p: batches}))
            counts["acks"] += 1

    async with keepalive(ms):
        await asyncio.gather(*(run(m, random.Random(seed + i)) for i, m in enumerate(ms)))
    seconds = time.monotonic() - t0
    assert counts["accepted"] == total, (counts, total)
    await asyncio.sleep(1.0)
    rec1 = sum(end_offsets(broker.bootstrap, state_topic).values())
    disk1 = topic_bytes_on_disk(broker, state_topic)
    for m in ms:
        await m.close()
    return Volume(name, counts["accepted"], counts["released"], counts["acks"], rec1 - rec0, disk1 - disk0,
                  seconds, latencies)


# ------------------------------------------------------------------------------------------------
# 3. recovery


@dataclass
class Recovery:
    to_loaded: list[float]
    logged: list[float]
    to_first_fetch: list[float]
    share_partitions: int
    inflight: int
    state_bytes: int


async def seed_state(broker: KafkaBroker, state_topic: str, topic: str, tid: bytes, groups: int,
                     partitions: int, inflight: int) -> None:
    store = TopicStateStore(broker.bootstrap, topic=state_topic, partitions=10,
                            prune_interval_s=1e9, prune_after_records=1 << 60)
    await store.start()
    try:
        for g in range(groups):
            gid = f"recovery-{g}"
            await store.write_group(GroupRecord(gid, 1, dict(EARLIEST), {tid: topic}, {tid: partitions}))
            keys = [SharePartitionKey(gid, tid, p) for p in range(partitions)]
            for i in range(0, len(keys), 50):
                await asyncio.gather(*(store.write([(k, worst_case_snapshot(0, inflight))])
                                       for k in keys[i:i + 50]))
    finally:
        await store.close()


async def first_records(bootstrap: str, topic: str, inflight: int) -> float:
    """Join recovery-0 and fetch partition 0 until records come back; checks their delivery counts."""
    t0 = time.monotonic()
    m = await Member.join(bootstrap, "recovery-0", topic)
    try:
        while True:
            got = (await m.fetch([0], max_records=inflight)).get(0, [])
            if got:
                expected = worst_case_snapshot(0, inflight)
                durable = {b.first_offset: b.delivery_count for b in expected.state_batches if b.delivery_state == 0}
                for a, z, dc in got:
                    for o in range(a, z + 1):
                        assert o in durable and dc == durable[o] + 1, (o, dc, durable.get(o))
                return time.monotonic() - t0
    finally:
        # no final ShareAcknowledge: that would release (and persist) the acquired records, and the
        # next run would see delivery counts one higher; the SIGKILL that follows forgets them
        await m.conn.close()


def recovery(broker: KafkaBroker, groups: int, partitions: int, inflight: int, runs: int) -> Recovery:
    state_topic = f"__kshare_bench_recovery_{uuid.uuid4().hex[:6]}"
    topic = f"recovery-{uuid.uuid4().hex[:6]}"
    broker.create_topic(topic, partitions=partitions)
    produce(broker.bootstrap, topic, inflight * partitions, partitions)

    async def tid() -> bytes:
        conn = await connect(broker.bootstrap, "bench")
        try:
            return await topic_id(conn, topic)
        finally:
            await conn.close()

    t = asyncio.run(tid())
    asyncio.run(seed_state(broker, state_topic, topic, t, groups, partitions, inflight))
    result = Recovery([], [], [], groups * partitions, inflight, topic_bytes_on_disk(broker, state_topic))
    kshare = KShare(broker, state_topic)
    try:
        for _ in range(runs):
            t0 = time.monotonic()
            loaded, logged = kshare.start()
            asyncio.run(first_records(kshare.bootstrap, topic, inflight))
            result.to_first_fetch.append(time.monotonic() - t0)
            result.to_loaded.append(loaded)
            result.logged.append(logged)
            kshare.kill()
    finally:
        kshare.stop()
    return result


# ------------------------------------------------------------------------------------------------
# the run


def report(lat: list[Latency], vols: list[Volume], rec: Recovery, args: argparse.Namespace) -> str:
    cpu = platform.processor() or platform.machine()
    base_seq = next(x.pct(0.5) for x in lat if x.name.startswith("Produce") and "1 at a time" in x.name)
    base_conc = next(x.pct(0.5) for x in lat if x.name.startswith("Produce") and "16 at a time" in x.name)
    lines = [
        "## Acknowledgement round trip through kshare (state write included)",
        "",
        "ShareAcknowledge sent to response received, in the client. *state write*: mean of kshare's",
        "`kshare_state_write_seconds` (queue wait + produce round, per share-partition write) over the",
        "same scenario. *vs Produce*: p50 over the p50 of the Produce baseline with the same concurrency.",
        "",
        "| scenario | samples | p50 | p99 | mean | state write | vs Produce |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for x in lat:
        base = None if x.name.startswith("Produce") else (base_conc if x.members > 1 else base_seq)
        lines.append(x.row(base))
    lines += [
        "",
        "## Bytes on the state topic per 1,000,000 accepted records (end to end)",
        "",
        f"{vols[0].accepted:,} records in producer batches of 500 on {args.volume_partitions} partitions, "
        f"{args.volume_partitions} members (one per partition), each acquisition (up to 500 records) "
        "acknowledged in one ShareAcknowledge. *on disk*: growth of the state topic's `.log` files.",
        "",
        "| workload | ShareAcknowledge | released | state records | on disk | on disk / state record | "
        "ack p50 / p99 | wall time |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for v in vols:
        s = sorted(v.latencies)
        p50, p99 = s[len(s) // 2] * 1000, s[min(len(s) - 1, int(0.99 * len(s)))] * 1000
        lines.append(
            f"| {v.name} | {v.per_million(v.acks):,.0f} | {v.per_million(v.released):,.0f} | "
            f"{v.per_million(v.records):,.0f} | {v.per_million(v.on_disk) / 1e3:,.1f} KB | "
            f"{v.on_disk / max(v.records, 1):,.0f} B | {p50:.2f} / {p99:.2f} ms | {v.seconds:,.1f} s |")
    lines += [
        "",
        "## Recovery through kshare",
        "",
        f"{rec.share_partitions:,} share-partitions x {rec.inflight:,} in-flight records, every record its own "
        f"state range ({rec.state_bytes / 1e6:,.1f} MB of state records on disk); kshare started on it "
        f"{len(rec.to_loaded)} times (SIGKILLed in between).",
        "",
        "| measure | best | median | worst |",
        "| --- | ---: | ---: | ---: |",
    ]
    for label, xs in (("process start to \"share state loaded\"", rec.to_loaded),
                      ("load time logged by kshare (state topic replay + groups)", rec.logged),
                      ("process start to the first ShareFetch returning recovered records", rec.to_first_fetch)):
        lines.append(f"| {label} | {min(xs):.2f} s | {statistics.median(xs):.2f} s | {max(xs):.2f} s |")
    lines += [
        "",
        f"Apache Kafka {KAFKA_3} (one local KRaft broker), Python {platform.python_version()} on uvloop, "
        f"{os.cpu_count()} CPUs ({cpu}), {time.strftime('%Y-%m-%d')}, load average at the end "
        f"{os.getloadavg()[0]:.1f}. Command: "
        f"`python benchmarks/bench_ack_latency.py{' --quick' if args.quick else ''}`.",
        "",
    ]
    return "\n".join(lines)


def run_async(fn: Callable[[], Awaitable]) -> object:
    import uvloop

    return uvloop.run(fn())


def _load(rate: float) -> str:
    return f"{rate:,.0f} cycles/s in all" if rate > 0 else "as fast as they can"


def ack_only(args: argparse.Namespace, members: list[int]) -> int:
    """The whole-acquisition scenarios for every member count, alternated between this tree's
    kshare and the baseline tree's (if any), ``--repeats`` times: medians of p50 and p99."""
    samples = args.samples
    rates = [float(x) for x in args.rates.split(",") if x]
    broker = KafkaBroker(KAFKA_3, config={"log.segment.bytes": 1 << 30})
    with broker:
        print(f"broker {broker.bootstrap} ready", flush=True)
        proxies = {"this tree": KShare(broker, f"__kshare_bench_state_{uuid.uuid4().hex[:6]}")}
        for v in args.variant:
            label, _, assignments = v.partition(":")
            env = dict(a.split("=", 1) for a in assignments.split(",") if a)
            proxies[label] = KShare(broker, f"__kshare_bench_state_{uuid.uuid4().hex[:6]}", env=env)
        if args.baseline_tree is not None:
            proxies["baseline"] = KShare(broker, f"__kshare_bench_state_{uuid.uuid4().hex[:6]}",
                                         tree=args.baseline_tree.resolve())
        results: dict[tuple[str, int, float], list[Latency]] = {}
        try:
            for k in proxies.values():
                k.start()
            topic = latency_topic(broker, samples // 2, args.partitions)
            for r in range(args.repeats):
                order = list(proxies.items()) if r % 2 == 0 else list(reversed(proxies.items()))
                for rate in rates:
                    for n in members:
                        for label, k in order:
                            x = run_async(lambda k=k, n=n, label=label, rate=rate: ack_latency(
                                k, broker, topic, samples // 2, per_record=False, members=n, rate=rate,
                                name=f"{label}, {n} member(s), {_load(rate)}"))
                            results.setdefault((label, n, rate), []).append(x)
                            print(f"repeat {r + 1}: {x.row(None)} (proxy / client CPU {x.cpu()})", flush=True)
        finally:
            for k in proxies.values():
                k.stop()
    lines = [
        f"ShareAcknowledge of an acquisition (up to 500 records), N members of one group at once on "
        f"{args.partitions} partitions (each assigned min(P, max(ceil(P/N), 8)) of them), "
        f"{samples // 2:,} samples per run, medians of {args.repeats} alternated runs",
        "",
        "| load | kshare | members | p50 | p99 | state write (mean) | p50 / 1-member p50 | proxy / client CPU |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for rate in rates:
        for label in proxies:
            one = statistics.median(x.pct(0.5) for x in results[(label, members[0], rate)])
            for n in members:
                xs = results[(label, n, rate)]
                p50 = statistics.median(x.pct(0.5) for x in xs)
                p99 = statistics.median(x.pct(0.99) for x in xs)
                w = statistics.median(x.write_mean or 0 for x in xs) * 1000
                pc = statistics.median(x.proxy_cpu or 0 for x in xs)
                cc = statistics.median(x.client_cpu or 0 for x in xs)
                lines.append(f"| {_load(rate)} | {label} | {n} | {p50:.2f} ms | {p99:.2f} ms | {w:.2f} ms | "
                             f"{p50 / one:.1f}x | {pc:.0%} / {cc:.0%} |")
    lines += ["", f"load average at the end {os.getloadavg()[0]:.1f}; command: `python "
                  f"benchmarks/bench_ack_latency.py {' '.join(sys.argv[1:])}`", ""]
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=5000, help="latency samples per scenario")
    parser.add_argument("--records", type=int, default=1_000_000, help="records accepted per volume run")
    parser.add_argument("--volume-partitions", type=int, default=10)
    parser.add_argument("--release-rate", type=float, default=0.01)
    parser.add_argument("--recovery-groups", type=int, default=10)
    parser.add_argument("--recovery-partitions", type=int, default=100)
    parser.add_argument("--recovery-inflight", type=int, default=2000)
    parser.add_argument("--recovery-runs", type=int, default=3)
    parser.add_argument("--skip", default="", help="comma-separated: latency,volume,recovery")
    parser.add_argument("--quick", action="store_true",
                        help="1,000 samples, 100,000 records, 100 share-partitions to recover")
    parser.add_argument("--out", type=Path, help="also write the report (markdown) to this file")
    parser.add_argument("--members", default="1,4,16,64",
                        help="comma-separated member counts of the whole-acquisition latency scenarios")
    parser.add_argument("--ack-only", action="store_true",
                        help="only the whole-acquisition acknowledgement scenarios (--members), --repeats times "
                             "alternated, medians reported; with --baseline-tree, against a second kshare")
    parser.add_argument("--repeats", type=int, default=3, help="--ack-only: alternated repeats")
    parser.add_argument("--baseline-tree", type=Path,
                        help="--ack-only: a kshare source tree (e.g. a `git worktree` of the commit before) run "
                             "as a second proxy on the same broker, alternated with this tree's")
    parser.add_argument("--partitions", type=int, default=16,
                        help="--ack-only: partitions of the topic (8 x members: no two members share one)")
    parser.add_argument("--rates", default="0",
                        help="--ack-only: comma-separated total fetch-and-acknowledge cycles per second of all "
                             "members together (0: each member as fast as it can, a closed loop)")
    parser.add_argument("--variant", action="append", default=[], metavar="LABEL:NAME=VALUE,...",
                        help="--ack-only: one more kshare of this tree with these environment variables")
    args = parser.parse_args(argv)
    members = sorted({int(x) for x in args.members.split(",") if x})
    if args.quick:
        args.samples, args.records = 1000, 100_000
        args.recovery_groups, args.recovery_partitions, args.recovery_runs = 1, 100, 2
    skip = set(args.skip.split(",")) - {""}
    if args.ack_only:
        return ack_only(args, members)
    broker = KafkaBroker(KAFKA_3, config={"log.segment.bytes": 1 << 30})
    with broker:
        print(f"broker {broker.bootstrap} ready", flush=True)
        state_topic = f"__kshare_bench_state_{uuid.uuid4().hex[:6]}"
        kshare = KShare(broker, state_topic)
        kshare.start()
        lat: list[Latency] = []
        vols: list[Volume] = []
        try:
            if "latency" not in skip:
                lat_topic = latency_topic(broker, max(args.samples // 2, args.samples // 500 + 1))
                base_topic = broker.create_topic(f"base-{uuid.uuid4().hex[:6]}", partitions=16)
                makes = [
                    lambda: produce_latency(broker, base_topic, args.samples, 1, "Produce acks=all to the broker, 1 at a time"),
                    lambda: ack_latency(kshare, broker, lat_topic, args.samples, per_record=True, members=1,
                                        name="ShareAcknowledge of 1 record, 1 member"),
                    lambda: produce_latency(broker, base_topic, args.samples, 16, "Produce acks=all to the broker, 16 at a time"),
                ]
                for n in members:
                    makes.append(lambda n=n: ack_latency(
                        kshare, broker, lat_topic, args.samples // 5 if n == 1 else args.samples // 2,
                        per_record=False, members=n,
                        name=f"ShareAcknowledge of a 500-record acquisition, {n} member{'s at once' if n > 1 else ''}"))
                for make in makes:
                    lat.append(run_async(make))
                    print(lat[-1].row(None), f"(proxy / client CPU {lat[-1].cpu()})", flush=True)
            if "volume" not in skip:
                vol_topic = broker.create_topic(f"vol-{uuid.uuid4().hex[:6]}", partitions=args.volume_partitions)
                produce(broker.bootstrap, vol_topic, args.records, args.volume_partitions)
                for rate, name, seed in ((0.0, "whole acquisitions accepted", 1),
                                         (args.release_rate, f"{args.release_rate:.0%} released", 2)):
                    v = run_async(lambda r=rate, n=name, s=seed: state_volume(
                        kshare, broker, state_topic, vol_topic, args.volume_partitions, r, n, s))
                    vols.append(v)
                    print(f"{name}: {v.records} state records, {v.on_disk} bytes, {v.seconds:.1f} s", flush=True)
        finally:
            kshare.stop()
        rec = None
        if "recovery" not in skip:
            rec = recovery(broker, args.recovery_groups, args.recovery_partitions, args.recovery_inflight,
                           args.recovery_runs)
            print(f"recovery: {rec}", flush=True)
    if lat and vols and rec is not None:
        text = report(lat, vols, rec, args)
        print(text)
        if args.out:
            args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
