"""The ``engine`` scenario of ``kshare bench`` (no broker): the share-partition engine
(:class:`kshare.share.partition.SharePartition`) alone, in this process.

1. Acquire + accept of ``records`` records in 500-record batches on one partition (whole-batch path),
   and the same with 1 % of the records released once (each is redelivered and then accepted), against
   a naive per-offset engine (one dict entry per record, what franz-go's kfake keeps) on
   ``baseline_records`` records in the same run: records/s by CPU time (the engine's own cost, meaningful
   on a shared machine) and by wall-clock time, best of ``repeats``. The loop plays a consumer: fetch
   from ``next_fetch_offset()`` (four upstream batches per fetch), acquire up to 500 records, acknowledge
   everything acquired.
2. Key-ordered sharing (``kshare.share.ordering=key``): CPU us per record of the same loop with the
   records' keys, 20 and 10,000 distinct keys, against the unordered engine in the same run.
3. tracemalloc of an engine holding 2,000 in-flight records in its worst layouts, against the naive
   engine.

(Was ``benchmarks/bench_share_partition.py`` and the engine part of ``benchmarks/bench_key_order.py``.)
"""

from __future__ import annotations

import gc
import random
import time
import tracemalloc
from array import array
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...share.partition import AcquireMode, FetchedBatch, SharePartition
from ...share.record_keys import key_hash
from ..format import fmt_num, table
from .common import results, scenario

if TYPE_CHECKING:
    from ..runner import Env, Progress

BATCH = 500
FETCH_BATCHES = 4
ACCEPT, RELEASE = 1, 2
SIZES = (
    {"records": 10_000_000, "baseline_records": 1_000_000, "key_order_records": 200_000, "in_flight": 2_000},
    {"records": 200_000, "baseline_records": 20_000, "key_order_records": 20_000, "in_flight": 2_000},
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def make_log(records: int) -> list[FetchedBatch]:
    return [FetchedBatch(base, base + BATCH - 1) for base in range(0, records, BATCH)]


def release_plans(batches: int, fraction: float, seed: int = 7) -> list[bytes | None]:
    """Per batch: the per-offset acknowledge types of its first delivery (None = accept all)."""
    rng = random.Random(seed)
    per_batch = round(BATCH * fraction)
    plans: list[bytes | None] = []
    for _ in range(batches):
        if per_batch == 0:
            plans.append(None)
            continue
        types = bytearray([ACCEPT]) * BATCH
        for pos in rng.sample(range(BATCH), per_batch):
            types[pos] = RELEASE
        plans.append(bytes(types))
    return plans


def consume(engine: Any, log: list[FetchedBatch], plans: list[bytes | None]) -> int:
    """Play one consumer until the log is drained; returns the number of records accepted."""
    accepted = 0
    end = log[-1].last_offset + 1
    while engine.start_offset < end:
        offset = engine.next_fetch_offset()
        i = offset // BATCH
        result = engine.acquire("m", log[i : i + FETCH_BATCHES], BATCH, fetch_offset=offset)
        acks = []
        for first, last, count in result.records:
            plan = plans[first // BATCH] if count == 1 else None
            if plan is None:
                acks.append((first, last, ACCEPT))
                accepted += last - first + 1
            else:
                acks.append((first, last, plan))  # a new batch is acquired whole: first == its base
                accepted += plan.count(ACCEPT)
        error, _ = engine.acknowledge("m", acks)
        if error:
            raise RuntimeError(f"acknowledge failed: error {error}")
    return accepted


class NaivePartition:
    """Per-offset baseline: one dict entry per in-flight record, loops per record."""

    def __init__(self, start: int, clock: Callable[[], int], limit: int = 5, lock_ms: int = 30_000) -> None:
        self.start_offset = start
        self.end_offset = start
        self.records: dict[int, list] = {}  # offset -> [state, count, member, deadline]
        self.clock = clock
        self.limit = limit
        self.lock_ms = lock_ms

    def next_fetch_offset(self) -> int:
        for o in range(self.start_offset, self.end_offset):
            if self.records[o][0] == 0:
                return o
        return self.end_offset

    def acquire(self, member: str, batches: list[FetchedBatch], max_records: int,
                fetch_offset: int | None = None) -> Any:
        deadline = self.clock() + self.lock_ms
        out: list[list[int]] = []
        budget = max_records
        for b in batches:
            if budget <= 0:
                break
            for o in range(max(b.base_offset, self.start_offset), b.last_offset + 1):
                rec = self.records.get(o)
                if rec is None:
                    rec = self.records[o] = [0, 0, None, 0]
                    self.end_offset = o + 1
                if rec[0] != 0:
                    continue
                rec[0], rec[1], rec[2], rec[3] = 1, rec[1] + 1, member, deadline
                budget -= 1
                if out and out[-1][1] + 1 == o and out[-1][2] == rec[1]:
                    out[-1][1] = o
                else:
                    out.append([o, o, rec[1]])

        class Result:
            records = out

        return Result

    def acknowledge(self, member: str, batches: list[tuple[int, int, Any]]) -> tuple[int, None]:
        for first, last, _types in batches:
            for o in range(first, last + 1):
                rec = self.records.get(o)
                if rec is None or rec[0] != 1 or rec[2] != member:
                    return 121, None
        for first, last, types in batches:
            for o in range(first, last + 1):
                t = types if isinstance(types, int) else types[o - first]
                rec = self.records[o]
                if t == ACCEPT:
                    rec[0] = 2
                elif t == RELEASE:
                    rec[0] = 4 if rec[1] >= self.limit else 0
                else:
                    rec[0] = 4
                rec[2] = None
        while self.start_offset < self.end_offset and self.records[self.start_offset][0] in (2, 4):
            del self.records[self.start_offset]
            self.start_offset += 1
        return 0, None


def rates(factory: Callable[[], Any], records: int, fraction: float, repeats: int) -> tuple[float, float]:
    """Best records/s over ``repeats`` runs, by CPU time and by wall-clock time."""
    log = make_log(records)
    plans = release_plans(len(log), fraction)
    best_cpu = best_wall = 0.0
    for _ in range(repeats):
        engine = factory()
        gc.collect()
        c0, w0 = time.process_time(), time.perf_counter()
        accepted = consume(engine, log, plans)
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        if accepted != records:
            raise RuntimeError(f"{accepted} of {records} records accepted")
        best_cpu = max(best_cpu, records / max(cpu, 1e-9))
        best_wall = max(best_wall, records / max(wall, 1e-9))
    return best_cpu, best_wall


class _Keys:
    def __init__(self, offsets: array, keys: array) -> None:
        self.offsets = offsets
        self.keys = keys


def key_order_cost(n_keys: int | None, records: int) -> float:
    """CPU us per record: fetch a batch, acquire it (key-ordered with ``n_keys`` distinct keys, unordered
    if None), accept what was acquired."""
    rng = random.Random(1)
    ids = [key_hash(f"key-{i}".encode()) for i in range(n_keys or 1)]
    sp = SharePartition(0, max_record_locks=10 * BATCH, key_ordered=n_keys is not None)
    log = []
    for base in range(0, records, BATCH):
        offs = array("q", range(base, base + BATCH))
        keys = array("q", (ids[rng.randrange(len(ids))] for _ in range(BATCH)))
        log.append((FetchedBatch(base, base + BATCH - 1), _Keys(offs, keys)))
    started = time.process_time()
    while sp.start_offset < records:
        offset = sp.next_fetch_offset()
        window = log[offset // BATCH : offset // BATCH + FETCH_BATCHES]
        fetched = [b for b, _ in window]
        keys = [k for _, k in window] if n_keys is not None else None
        result = sp.acquire("m", fetched, BATCH, fetch_offset=offset, record_keys=keys)
        if not result.records:
            break
        sp.acknowledge("m", [(a.first_offset, a.last_offset, ACCEPT) for a in result.records])
    took = time.process_time() - started
    if sp.start_offset < records:
        raise RuntimeError(f"key-ordered engine stuck at offset {sp.start_offset} of {records}")
    return took / records * 1e6


def memory_worst_case(in_flight: int) -> dict[str, int]:
    """Bytes held by ``in_flight`` records in the worst layouts (tracemalloc)."""
    figures: dict[str, int] = {}

    def measure(name: str, build: Callable[[], Any]) -> None:
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        keep = build()
        gc.collect()  # also empties CPython's free lists, which still hold the call's temporaries
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        figures[name] = sum(s.size_diff for s in after.compare_to(before, "filename"))
        del keep

    members = [f"member-{i}" for i in range(7)]  # a shell passes its sessions' id strings

    def distinct_locks() -> SharePartition:
        # one record per acquisition, each with its own lock deadline: one range and one lock-heap entry per
        # record, nothing can merge
        clock = FakeClock()
        sp = SharePartition(0, clock=clock, max_record_locks=in_flight)
        batch = [FetchedBatch(0, in_flight - 1)]
        for o in range(in_flight):
            clock.now += 1
            sp.acquire(members[o % 7], batch, 1, AcquireMode.RECORD_LIMIT, fetch_offset=o)
        return sp

    def alternating() -> SharePartition:
        # one acquisition, every other record released: alternating Available/Acquired ranges
        sp = SharePartition(0, clock=FakeClock(), max_record_locks=in_flight)
        sp.acquire("m", [FetchedBatch(0, in_flight - 1)], in_flight)
        sp.acknowledge("m", [(o, o, RELEASE) for o in range(0, in_flight, 2)])
        return sp

    def whole_batches() -> SharePartition:
        sp = SharePartition(0, clock=FakeClock(), max_record_locks=in_flight)
        sp.acquire("m", [FetchedBatch(b, b + BATCH - 1) for b in range(0, in_flight, BATCH)], in_flight)
        return sp

    def naive_distinct_locks() -> NaivePartition:
        clock = FakeClock()
        sp = NaivePartition(0, clock)
        for o in range(in_flight):
            clock.now += 1
            sp.acquire(members[o % 7], [FetchedBatch(o, in_flight - 1)], 1)
        return sp

    def naive_one_batch() -> NaivePartition:
        sp = NaivePartition(0, FakeClock())
        sp.acquire("m", [FetchedBatch(0, in_flight - 1)], in_flight)
        return sp

    measure("range engine: distinct lock per record (worst case)", distinct_locks)
    measure("range engine: alternating Available/Acquired", alternating)
    measure(f"range engine: whole {BATCH}-record batches", whole_batches)
    measure("naive per-offset: distinct lock per record", naive_distinct_locks)
    measure("naive per-offset: one acquisition", naive_one_batch)
    return figures


def run(env: Env | None, progress: Progress, *, records: int, baseline_records: int, key_order_records: int,
        in_flight: int, repeats: int = 3) -> dict[str, Any]:
    progress.begin("engine", 2 * 2 + 3 + 1)
    rows = []
    for label, fraction in (("whole batches, all accepted", 0.0), ("1% released once", 0.01)):
        cpu, wall = rates(lambda: SharePartition(0, clock=FakeClock()), records, fraction, repeats)
        progress.step(f"range engine, {label}: {cpu:,.0f} rec/s")
        base_cpu, base_wall = rates(lambda: NaivePartition(0, FakeClock()), baseline_records, fraction, 1)
        progress.step(f"naive engine, {label}: {base_cpu:,.0f} rec/s")
        rows.append({"case": label, "engine_rps_cpu": cpu, "engine_rps_wall": wall, "naive_rps_cpu": base_cpu,
                     "naive_rps_wall": base_wall, "engine_vs_naive_cpu": cpu / base_cpu})
    key_order = []
    unordered = key_order_cost(None, key_order_records)
    progress.step(f"unordered: {unordered:.2f} us/record")
    for n_keys in (20, 10_000):
        us = key_order_cost(n_keys, key_order_records)
        progress.step(f"key-ordered, {n_keys} keys: {us:.2f} us/record")
        key_order.append({"keys": n_keys, "us_per_record": us, "unordered_us_per_record": unordered,
                          "vs_unordered": us / unordered})
    memory = memory_worst_case(in_flight)
    progress.step("memory")
    progress.end()
    return results(
        {"records": records, "baseline_records": baseline_records, "key_order_records": key_order_records,
         "in_flight": in_flight, "batch": BATCH, "repeats": repeats},
        rows,
        key_order=key_order,
        memory_bytes=memory,
    )


def section(res: dict[str, Any]) -> list[str]:
    cfg = res.get("config", {})
    out = [
        f"One consumer drains {fmt_num(cfg.get('records'))} records in {cfg.get('batch', BATCH)}-record batches "
        f"(the naive per-offset engine {fmt_num(cfg.get('baseline_records'))}), best of {cfg.get('repeats', '?')}; "
        "records/s by CPU time and by wall-clock time.",
        "",
    ]
    out += table(
        ["case", "range engine rec/s (CPU)", "(wall)", "naive per-offset rec/s (CPU)", "(wall)", "engine / naive (CPU)"],
        [[r["case"], fmt_num(r["engine_rps_cpu"]), fmt_num(r["engine_rps_wall"]), fmt_num(r["naive_rps_cpu"]),
          fmt_num(r["naive_rps_wall"]), f"{fmt_num(r['engine_vs_naive_cpu'], 1)}x"] for r in res.get("rows", [])],
    )
    out += ["", f"Key-ordered sharing, {fmt_num(cfg.get('key_order_records'))} records with random keys:", ""]
    out += table(
        ["distinct keys", "CPU us/record", "unordered us/record", "key-ordered / unordered"],
        [[fmt_num(r["keys"]), fmt_num(r["us_per_record"], 2), fmt_num(r["unordered_us_per_record"], 2),
          fmt_num(r["vs_unordered"], 2)] for r in res.get("key_order", [])],
    )
    out += ["", f"{fmt_num(cfg.get('in_flight'))} in-flight records:", ""]
    out += table(["layout", "bytes (tracemalloc)"],
                 [[name, fmt_num(size)] for name, size in res.get("memory_bytes", {}).items()])
    return out + [""]


SCENARIO = scenario(
    __name__, "The share-partition engine alone: acquire + accept, key order, memory",
    needs=frozenset(), opt_in=True, max_repeats=3,
)
