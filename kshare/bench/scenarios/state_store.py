"""The ``state_store`` scenario of ``kshare bench`` (run only when named): the cost of the durable
share-partition state, bytes on the state topic and recovery time, measured on the store itself
(:class:`kshare.share.state.topic_store.TopicStateStore` in this process, no proxy) against the fronted
cluster. Each part writes to a fresh state topic with the store's defaults but pruning off, so the topic
keeps every byte written.

**Write volume.** A real ``SharePartition`` engine per share-partition is driven the way a share consumer
drives it: fetch (acquire) up to 500 records from 500-record upstream batches, then acknowledge them in
one go -- every record accepted, or each record released with probability ``release_rate`` (1 %; a
released record is delivered again by a later fetch and then accepted or released again). Every durable
change the engine returns is written with ``store.write`` and awaited before the next fetch, as the
share-group service does. A run stops once ``records`` records were accepted in total; with N
share-partitions (``share_partitions``) N engines run concurrently, each accepting ``records`` / N, so
their writes share produce rounds. Reported per million accepted records: writes, state records
(snapshots / updates), key + value bytes (what the store serialized), bytes on disk (the partitions'
``.log`` segment files, record batches with all Kafka framing: only when the bench started the cluster)
and produce rounds; and the wall time.

**Recovery.** ``recovery_keys`` share-partitions each with ``recovery_inflight`` in-flight records in the
worst shape (every record its own state range: Available with delivery counts 1-4 alternating with
Acknowledged/Archived, a 40 KB ShareSnapshot for 2,000 records). Measured, best of 3:
``TopicStateStore.start()`` of a new store (create its clients, read the topic from the beginning to the
end offsets, decode, replay), for (a) one snapshot per share-partition and (b) the same plus
``recovery_updates`` ShareUpdate records per share-partition, each changing 10 single-record ranges.

(Was ``benchmarks/bench_state_store.py``.)
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import uvloop

from ...share.partition import FetchedBatch, SharePartition
from ...share.state.topic_store import TopicStateStore
from ...share.states import ShareSnapshot, ShareUpdate, StateBatch
from ...share.store import SharePartitionKey
from .. import clients
from ..format import fmt_num, table
from .common import UPSTREAM, results, scenario

if TYPE_CHECKING:
    from ..runner import Env, Progress

LOG_BATCH = 500
FETCH_MAX = 500
ACCEPT, RELEASE = 1, 2
NO_PRUNING = {"prune_interval_s": 1e9, "prune_after_records": 1 << 60}
SIZES = (
    {"records": 1_000_000, "share_partitions": [1, 100], "release_rate": 0.01, "recovery_keys": 1000,
     "recovery_inflight": 2000, "recovery_updates": 100},
    {"records": 100_000, "share_partitions": [1, 100], "release_rate": 0.01, "recovery_keys": 100,
     "recovery_inflight": 2000, "recovery_updates": 20},
)


class Clock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def topic_bytes_on_disk(data_dir: Path | None, topic: str) -> int | None:
    """Bytes of the ``.log`` segment files of ``topic``'s partitions in a broker's data directory."""
    if data_dir is None:
        return None
    total = 0
    for d in data_dir.glob(f"{topic}-*"):
        if d.name.rsplit("-", 1)[0] == topic:
            total += sum(f.stat().st_size for f in d.glob("*.log"))
    return total


async def drive(store: TopicStateStore, key: SharePartitionKey, target: int, release_rate: float,
                rng: random.Random) -> tuple[int, int]:
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
        error, update = sp.acknowledge("c", acks)
        if error:
            raise RuntimeError(f"acknowledge failed: error {error}")
        if update is not None:
            await store.write([(key, update)])
            writes += 1
    return accepted, writes


async def write_volume(bootstrap: str, data_dir: Path | None, name: str, records: int, share_partitions: int,
                       release_rate: float, seed: int) -> dict[str, Any]:
    topic = f"bench-state-{uuid.uuid4().hex[:8]}"
    store = TopicStateStore(bootstrap, topic=topic, partitions=10, **NO_PRUNING)
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
    on_disk = topic_bytes_on_disk(data_dir, topic)
    await asyncio.to_thread(clients.delete_topic, bootstrap, topic)
    accepted = sum(a for a, _ in results)

    def per_million(value: float | None) -> float | None:
        return None if value is None else value * 1_000_000 / accepted

    return {
        "workload": name, "share_partitions": share_partitions, "accepted": accepted,
        "writes_per_m": per_million(sum(w for _, w in results)), "records_per_m": per_million(s.records),
        "snapshots_per_m": per_million(s.snapshots), "updates_per_m": per_million(s.updates),
        "serialized_kb_per_m": per_million(s.bytes / 1e3), "on_disk_kb_per_m": per_million(
            None if on_disk is None else on_disk / 1e3),
        "on_disk_per_record": None if on_disk is None else on_disk / max(s.records, 1),
        "rounds_per_m": per_million(s.rounds), "seconds": seconds,
    }


def worst_case_snapshot(start: int, inflight: int) -> ShareSnapshot:
    batches = []
    for i in range(inflight):
        o = start + i
        if i % 2 == 0:
            batches.append(StateBatch(o, o, 0, 1 + (i // 2) % 4))
        else:
            batches.append(StateBatch(o, o, 2 if (i // 2) % 2 else 4, 1))
    return ShareSnapshot(start, tuple(batches))


async def recovery(bootstrap: str, data_dir: Path | None, keys: int, inflight: int, updates: int,
                   rng: random.Random) -> list[dict[str, Any]]:
    topic = f"bench-recovery-{uuid.uuid4().hex[:8]}"
    topic_id = uuid.uuid4().bytes
    sps = [SharePartitionKey(f"bench-group-{i % 10}", topic_id, i) for i in range(keys)]
    out: list[dict[str, Any]] = []
    try:
        store = TopicStateStore(bootstrap, topic=topic, partitions=10, **NO_PRUNING)
        await store.start()
        try:
            chunk = 50  # 50 x 40 KB per produce round
            for i in range(0, keys, chunk):
                await asyncio.gather(
                    *(store.write([(k, worst_case_snapshot(1000, inflight))]) for k in sps[i : i + chunk])
                )
        finally:
            await store.close()
        out.append(await measure_recovery(bootstrap, data_dir, topic, "worst-case snapshots only",
                                          store.share_partitions()))
        store = TopicStateStore(bootstrap, topic=topic, partitions=10, **NO_PRUNING)
        await store.start()
        try:
            for _ in range(updates):
                writes = []
                for k in sps:
                    offs = rng.sample(range(1000, 1000 + inflight), 10)
                    batches = tuple(StateBatch(o, o, 0, 5 + rng.randrange(3)) for o in sorted(offs))
                    writes.append((k, ShareUpdate(-1, batches)))
                await asyncio.gather(*(store.write([w]) for w in writes))
            if store.stats.compactions or store.stats.snapshots:
                raise RuntimeError(f"the updates were compacted into snapshots: {store.stats}")
        finally:
            await store.close()
        out.append(await measure_recovery(bootstrap, data_dir, topic, f"worst-case snapshots + {updates} updates "
                                          "each", store.share_partitions()))
    finally:
        await asyncio.to_thread(clients.delete_topic, bootstrap, topic)
    return out


async def measure_recovery(bootstrap: str, data_dir: Path | None, topic: str, name: str,
                           expected: dict) -> dict[str, Any]:
    best: dict[str, Any] | None = None
    for _ in range(3):
        store = TopicStateStore(bootstrap, topic=topic, **NO_PRUNING)
        t0, c0 = time.monotonic(), time.process_time()
        await store.start()
        seconds, cpu = time.monotonic() - t0, time.process_time() - c0
        await store.close()
        if store.share_partitions() != expected or store.load_stats.skipped:
            raise RuntimeError(f"{name}: the state read back differs from the state written")
        if best is None or seconds < best["seconds"]:
            on_disk = topic_bytes_on_disk(data_dir, topic)
            best = {"content": name, "share_partitions": len(expected), "records": store.load_stats.records,
                    "mb_read": store.load_stats.bytes / 1e6, "on_disk_mb": None if on_disk is None else on_disk / 1e6,
                    "ranges": sum(len(s.state_batches) for s in expected.values()), "seconds": seconds,
                    "cpu_seconds": cpu}
    assert best is not None
    return best


def run(env: Env, progress: Progress, *, records: int, share_partitions: list[int], release_rate: float,
        recovery_keys: int, recovery_inflight: int, recovery_updates: int) -> dict[str, Any]:
    bootstrap = env.upstream()
    data_dir = env.upstream_data_dir()
    progress.begin("state_store", 2 * len(share_partitions) + 1)

    async def main() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        rows = []
        for sps in share_partitions:
            for i, (name, rate) in enumerate((("whole batches accepted", 0.0),
                                             (f"{release_rate:.0%} released", release_rate))):
                row = await write_volume(bootstrap, data_dir, name, records, sps, rate, 1 + i)
                rows.append(row)
                progress.step(f"{sps} share-partition(s), {name}: {fmt_num(row['serialized_kb_per_m'], 1)} KB "
                              "serialized per million records")
        rec = await recovery(bootstrap, data_dir, recovery_keys, recovery_inflight, recovery_updates,
                             random.Random(3))
        progress.step(f"recovery: {rec[-1]['seconds']:.2f} s")
        return rows, rec

    rows, rec = uvloop.run(main())  # the proxy's event loop
    progress.end()
    return results(
        {"records": records, "share_partitions": share_partitions, "release_rate": release_rate,
         "recovery_keys": recovery_keys, "recovery_inflight": recovery_inflight,
         "recovery_updates": recovery_updates, "on_disk": data_dir is not None},
        rows,
        recovery=rec,
    )


def section(res: dict[str, Any]) -> list[str]:
    cfg = res.get("config", {})
    out = [
        "Bytes on the state topic per million accepted records: fetches of up to 500 records from 500-record "
        "upstream batches, each acknowledged in one go. *serialized*: key + value bytes the store wrote; "
        "*on disk*: the topic's `.log` segment bytes (record batch headers, record framing, key, value)"
        + ("" if cfg.get("on_disk", True) else " (not measured: a cluster of --upstream)")
        + f". Each run accepted {fmt_num(cfg.get('records'))} records.",
        "",
    ]
    out += table(
        ["workload", "share-partitions", "writes", "state records (snapshots / updates)", "serialized KB",
         "on disk KB", "on disk / record B", "produce rounds", "wall time s"],
        [[r["workload"], fmt_num(r["share_partitions"]), fmt_num(r["writes_per_m"]),
          f"{fmt_num(r['records_per_m'])} ({fmt_num(r['snapshots_per_m'])} / {fmt_num(r['updates_per_m'])})",
          fmt_num(r["serialized_kb_per_m"], 1), fmt_num(r["on_disk_kb_per_m"], 1), fmt_num(r["on_disk_per_record"]),
          fmt_num(r["rounds_per_m"]), fmt_num(r["seconds"], 1)] for r in res.get("rows", [])],
    )
    out += ["", f"Recovery (`TopicStateStore.start()` of a new store): {fmt_num(cfg.get('recovery_keys'))} "
            f"share-partitions, {fmt_num(cfg.get('recovery_inflight'))} in-flight records each, every record its "
            "own state range (the worst case). Best of 3 runs.", ""]
    out += table(
        ["topic content", "state records", "MB read (key + value)", "MB on disk", "state ranges rebuilt",
         "load time s", "CPU time s"],
        [[r["content"], fmt_num(r["records"]), fmt_num(r["mb_read"], 1), fmt_num(r["on_disk_mb"], 1),
          fmt_num(r["ranges"]), fmt_num(r["seconds"], 2), fmt_num(r["cpu_seconds"], 2)]
         for r in res.get("recovery", [])],
    )
    return out + [""]


SCENARIO = scenario(
    __name__, "The state store: bytes on the state topic per million accepted records, recovery time",
    needs=frozenset({UPSTREAM}), opt_in=True, repeats=False,
)
