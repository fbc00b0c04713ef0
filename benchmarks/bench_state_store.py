"""Cost of the durable share-partition state: bytes on the state topic and recovery time.

Run by hand (not in CI), from the repository root with the project's venv:

    python benchmarks/bench_state_store.py                 # the full run (a few minutes)
    python benchmarks/bench_state_store.py --quick         # a short smoke run
    python benchmarks/bench_state_store.py --out docs/benchmarks-state.md

One private Apache Kafka 3.9.2 broker (``tests.brokers.KafkaBroker``); each scenario writes to a
fresh state topic through :class:`kshare.share.state_topic.TopicStateStore` with its defaults
(pruning off, so the topic keeps every byte written).

**Write volume.** A real ``SharePartition`` engine per share-partition is driven the way a share
consumer drives it: fetch (acquire) up to 500 records from 500-record upstream batches, then
acknowledge them in one go -- every record accepted, or each record released with probability
``--release-rate`` (1 %; a released record is delivered again by a later fetch and then accepted
or released again). Every durable change the engine returns is written with ``store.write`` and
awaited before the next fetch, as the share-group service does. The run stops once
``--records`` records were accepted in total. With ``--share-partitions`` N > 1, N engines run
concurrently, each accepting ``--records`` / N records, so their writes share produce rounds.
Reported: state records written, key+value bytes (what the store serialized), bytes on disk (the
sum of the partitions' ``.log`` segment files: record batches with all Kafka framing), both per
million accepted records, produce rounds and wall time.

**Recovery.** ``--recovery-keys`` share-partitions (1,000) each with ``--recovery-inflight``
in-flight records (2,000) in the worst shape: every record its own state range (alternating
Available with delivery counts 1-4 and Acknowledged/Archived), i.e. a 2,000-batch ShareSnapshot
of 40 KB per share-partition. Measured: ``TopicStateStore.start()`` of a new store (create
clients, read the topic from the beginning to the end offsets, decode, replay), for (a) one
snapshot per share-partition and (b) the same plus ``--recovery-updates`` (100) ShareUpdate
records per share-partition, each changing 10 single-record ranges.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import uvloop  # noqa: E402

from kshare.share.partition import FetchedBatch, SharePartition  # noqa: E402
from kshare.share.state_topic import TopicStateStore  # noqa: E402
from kshare.share.states import ShareSnapshot, ShareUpdate, StateBatch  # noqa: E402
from kshare.share.store import SharePartitionKey  # noqa: E402
from tests.brokers import KAFKA_3, KafkaBroker  # noqa: E402

LOG_BATCH = 500
FETCH_MAX = 500
ACCEPT, RELEASE = 1, 2
NO_PRUNING = {"prune_interval_s": 1e9, "prune_after_records": 1 << 60}


class Clock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


@dataclass
class WriteResult:
    name: str
    share_partitions: int
    accepted: int
    writes: int
    records: int
    snapshots: int
    updates: int
    serialized: int
    on_disk: int
    rounds: int
    seconds: float

    def per_million(self, value: float) -> float:
        return value * 1_000_000 / self.accepted


@dataclass
class RecoveryResult:
    name: str
    share_partitions: int
    records: int
    bytes: int
    on_disk: int
    seconds: float
    cpu_seconds: float
    batches: int


def topic_bytes_on_disk(broker: KafkaBroker, topic: str) -> int:
    total = 0
    for d in broker.data_dir.glob(f"{topic}-*"):
        if d.name.rsplit("-", 1)[0] == topic:
            total += sum(f.stat().st_size for f in d.glob("*.log"))
    return total


async def drive(
    store: TopicStateStore, key: SharePartitionKey, target: int, release_rate: float, rng: random.Random
) -> tuple[int, int]:
    """Fetch/acknowledge until ``target`` records are accepted; returns (accepted, writes)."""
    sp = SharePartition(0, clock=Clock(), max_record_locks=1 << 30, record_lock_duration_ms=1 << 40)
    await store.write([(key, sp.snapshot())])
    writes = 1
    accepted = 0
    while accepted < target:
        off = sp.next_fetch_offset()
        b0 = off // LOG_BATCH
        fetched = [FetchedBatch(b * LOG_BATCH, b * LOG_BATCH + LOG_BATCH - 1) for b in range(b0, b0 + 3)]
        got = sp.acquire("c", fetched, FETCH_MAX, fetch_offset=off)
        acks: list[tuple[int, int, int]] = []
        for r in got.records:
            for o in range(r.first_offset, r.last_offset + 1):
                t = RELEASE if release_rate and rng.random() < release_rate else ACCEPT
                if t == ACCEPT:
                    accepted += 1
                if acks and acks[-1][2] == t and acks[-1][1] == o - 1:
                    acks[-1] = (acks[-1][0], o, t)
                else:
                    acks.append((o, o, t))
        res = sp.acknowledge("c", acks)
        assert res.error_code == 0, res
        if res.update is not None:
            await store.write([(key, res.update)])
            writes += 1
    return accepted, writes


async def write_scenario(
    broker: KafkaBroker, name: str, records: int, share_partitions: int, release_rate: float, seed: int
) -> WriteResult:
    topic = f"bench-state-{uuid.uuid4().hex[:8]}"
    store = TopicStateStore(broker.bootstrap, topic=topic, partitions=10, **NO_PRUNING)
    await store.start()
    topic_id = uuid.uuid4().bytes
    keys = [SharePartitionKey("bench-group", topic_id, p) for p in range(share_partitions)]
    per = records // share_partitions
    t0 = time.monotonic()
    try:
        results = await asyncio.gather(
            *(drive(store, k, per, release_rate, random.Random(seed + i)) for i, k in enumerate(keys))
        )
    finally:
        await store.close()
    seconds = time.monotonic() - t0
    await asyncio.sleep(0.5)
    s = store.stats
    return WriteResult(
        name=name,
        share_partitions=share_partitions,
        accepted=sum(a for a, _ in results),
        writes=sum(w for _, w in results),
        records=s.records,
        snapshots=s.snapshots,
        updates=s.updates,
        serialized=s.bytes,
        on_disk=topic_bytes_on_disk(broker, topic),
        rounds=s.rounds,
        seconds=seconds,
    )


def worst_case_snapshot(start: int, inflight: int) -> ShareSnapshot:
    batches = []
    for i in range(inflight):
        o = start + i
        if i % 2 == 0:
            batches.append(StateBatch(o, o, 0, 1 + (i // 2) % 4))
        else:
            batches.append(StateBatch(o, o, 2 if (i // 2) % 2 else 4, 1))
    return ShareSnapshot(start, tuple(batches))


async def recovery_scenario(
    broker: KafkaBroker, keys: int, inflight: int, updates: int, rng: random.Random
) -> list[RecoveryResult]:
    topic = f"bench-recovery-{uuid.uuid4().hex[:8]}"
    topic_id = uuid.uuid4().bytes
    sps = [SharePartitionKey(f"bench-group-{i % 10}", topic_id, i) for i in range(keys)]
    out: list[RecoveryResult] = []
    store = TopicStateStore(broker.bootstrap, topic=topic, partitions=10, **NO_PRUNING)
    await store.start()
    try:
        chunk = 50  # 50 x 40 KB per produce round
        for i in range(0, keys, chunk):
            await asyncio.gather(
                *(store.write([(k, worst_case_snapshot(1000, inflight))]) for k in sps[i : i + chunk])
            )
    finally:
        await store.close()
    expected = store.share_partitions()
    out.append(await measure_recovery(broker, topic, "worst-case snapshots only", expected))

    store = TopicStateStore(broker.bootstrap, topic=topic, partitions=10, **NO_PRUNING)
    await store.start()
    try:
        for _ in range(updates):
            writes = []
            for k in sps:
                offs = rng.sample(range(1000, 1000 + inflight), 10)
                writes.append(
                    (
                        k,
                        ShareUpdate(
                            -1, tuple(StateBatch(o, o, 0, 5 + rng.randrange(3)) for o in sorted(offs))
                        ),
                    )
                )
            await asyncio.gather(*(store.write([w]) for w in writes))
        assert store.stats.compactions == 0 and store.stats.snapshots == 0, store.stats
    finally:
        await store.close()
    expected = store.share_partitions()
    out.append(
        await measure_recovery(broker, topic, f"worst-case snapshots + {updates} updates each", expected)
    )
    return out


async def measure_recovery(broker: KafkaBroker, topic: str, name: str, expected: dict) -> RecoveryResult:
    best = None
    for _ in range(3):
        store = TopicStateStore(broker.bootstrap, topic=topic, **NO_PRUNING)
        t0, c0 = time.monotonic(), time.process_time()
        await store.start()
        seconds, cpu = time.monotonic() - t0, time.process_time() - c0
        await store.close()
        assert store.share_partitions() == expected
        assert store.load_stats.skipped == 0
        if best is None or seconds < best.seconds:
            best = RecoveryResult(
                name=name,
                share_partitions=len(expected),
                records=store.load_stats.records,
                bytes=store.load_stats.bytes,
                on_disk=topic_bytes_on_disk(broker, topic),
                seconds=seconds,
                cpu_seconds=cpu,
                batches=sum(len(s.state_batches) for s in expected.values()),
            )
    assert best is not None
    return best


def report(writes: list[WriteResult], recoveries: list[RecoveryResult], args: argparse.Namespace) -> str:
    cpu = platform.processor() or platform.machine()
    lines = [
        "# State store benchmarks",
        "",
        "Produced by `python benchmarks/bench_state_store.py"
        + (" --quick" if args.quick else "")
        + "` (see the script's docstring for the method).",
        f"Apache Kafka {KAFKA_3} (one local KRaft broker), Python {platform.python_version()} on uvloop, "
        f"{os.cpu_count()} CPUs ({cpu}), {time.strftime('%Y-%m-%d')}; load average at the end "
        f"{os.getloadavg()[0]:.1f}.",
        "",
        "## Bytes on the state topic per million accepted records",
        "",
        "Fetches of up to 500 records from 500-record upstream batches, each acknowledged in one go.",
        "*serialized*: key + value bytes the store wrote; *on disk*: the topic's `.log` segment bytes",
        "(record batch headers, record framing, key, value). Both per 1,000,000 accepted records.",
        "",
        "| workload | share-partitions | writes | state records (snapshots / updates) | serialized | on disk |"
        " on disk / write | produce rounds | wall time |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for w in writes:
        lines.append(
            f"| {w.name} | {w.share_partitions} | {w.per_million(w.writes):,.0f} | "
            f"{w.per_million(w.records):,.0f} ({w.per_million(w.snapshots):,.0f} / {w.per_million(w.updates):,.0f}) | "
            f"{w.per_million(w.serialized) / 1e3:,.1f} KB | {w.per_million(w.on_disk) / 1e3:,.1f} KB | "
            f"{w.on_disk / max(w.records, 1):,.0f} B | {w.per_million(w.rounds):,.0f} | "
            f"{w.seconds:,.1f} s |"
        )
    if writes:
        lines += [
            "",
            f"Each run accepted {writes[0].accepted:,} records in total (figures are scaled to 10^6).",
        ]
    else:
        lines = lines[:4] + ["(write-volume runs skipped: `--recovery-only`)"]
    lines += [
        "",
        "## Recovery (`TopicStateStore.start()` of a new store)",
        "",
        f"{recoveries[0].share_partitions:,} share-partitions, {args.recovery_inflight:,} in-flight records each, "
        "every record its own state range (the worst case). Best of 3 runs.",
        "",
        "| topic content | state records | bytes read (key + value) | on disk | state ranges rebuilt | load time"
        " | CPU time |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in recoveries:
        lines.append(
            f"| {r.name} | {r.records:,} | {r.bytes / 1e6:,.1f} MB | {r.on_disk / 1e6:,.1f} MB | "
            f"{r.batches:,} | {r.seconds:,.2f} s | {r.cpu_seconds:,.2f} s |"
        )
    lines.append("")
    return "\n".join(lines)


async def main_async(args: argparse.Namespace, broker: KafkaBroker) -> str:
    writes = []
    for sps in [] if args.recovery_only else args.share_partitions:
        writes.append(await write_scenario(broker, "whole batches accepted", args.records, sps, 0.0, 1))
        writes.append(
            await write_scenario(
                broker, f"{args.release_rate:.0%} released", args.records, sps, args.release_rate, 2
            )
        )
        print(f"  {sps} share-partition(s) done", flush=True)
    recoveries = await recovery_scenario(
        broker, args.recovery_keys, args.recovery_inflight, args.recovery_updates, random.Random(3)
    )
    return report(writes, recoveries, args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--share-partitions", type=lambda s: [int(x) for x in s.split(",")], default=[1, 100])
    parser.add_argument("--release-rate", type=float, default=0.01)
    parser.add_argument("--recovery-keys", type=int, default=1000)
    parser.add_argument("--recovery-inflight", type=int, default=2000)
    parser.add_argument("--recovery-updates", type=int, default=100)
    parser.add_argument(
        "--quick", action="store_true", help="100,000 records, 100 share-partitions to recover"
    )
    parser.add_argument("--out", type=Path, help="also write the report (markdown) to this file")
    parser.add_argument("--recovery-only", action="store_true", help="skip the write-volume runs")
    args = parser.parse_args(argv)
    if args.quick:
        args.records = 100_000
        args.recovery_keys = 100
        args.recovery_updates = 20
    broker = KafkaBroker(KAFKA_3, config={"log.segment.bytes": 1 << 30})
    with broker:
        print(f"broker {broker.bootstrap} ready", flush=True)
        text = uvloop.run(main_async(args, broker))
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
