"""Share-partition engine figures (run by hand, not part of the tests).

    /work/venv/bin/python benchmarks/bench_share_partition.py [--records N] [--baseline-records N]

1. Acquire + accept of N records in 500-record batches on one partition (whole-batch path).
2. The same with 1% of the records released once (each is redelivered and then accepted).
3. tracemalloc of an engine holding 2,000 in-flight records in worst-case single-offset ranges.

A naive per-offset engine (one dict entry per record, what franz-go's kfake keeps) runs the
same loops on fewer records for a ratio. The loop plays a consumer: fetch from
``next_fetch_offset()`` (four upstream batches per fetch), acquire with max_records=500,
acknowledge everything acquired.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kshare.share.partition import AcquireMode, FetchedBatch, SharePartition  # noqa: E402

BATCH = 500
FETCH_BATCHES = 4
ACCEPT, RELEASE = 1, 2


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


def consume(engine, log: list[FetchedBatch], plans: list[bytes | None]) -> int:
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
        assert error == 0
    return accepted


class NaivePartition:
    """Per-offset baseline: one dict entry per in-flight record, loops per record."""

    def __init__(self, start: int, clock, limit: int = 5, lock_ms: int = 30_000) -> None:
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

    def acquire(self, member, batches, max_records, fetch_offset=None):
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

    def acknowledge(self, member, batches):
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


def run(factory, records: int, fraction: float, repeat: int) -> tuple[float, float]:
    """Best records/s over ``repeat`` runs, by CPU time and by wall-clock time.

    CPU time (``process_time``) is the engine's own cost and stays meaningful on a
    machine shared with other work; wall-clock is reported next to it.
    """
    log = make_log(records)
    plans = release_plans(len(log), fraction)
    best_cpu = best_wall = 0.0
    for _ in range(repeat):
        engine = factory()
        gc.collect()
        c0, w0 = time.process_time(), time.perf_counter()
        accepted = consume(engine, log, plans)
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        assert accepted == records
        best_cpu = max(best_cpu, records / cpu)
        best_wall = max(best_wall, records / wall)
    return best_cpu, best_wall


def memory_worst_case(in_flight: int = 2_000) -> dict[str, int]:
    """Bytes held by 2,000 in-flight records in the worst layouts (tracemalloc)."""
    figures: dict[str, int] = {}

    def measure(name: str, build) -> None:
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

    def distinct_locks():
        # One record per acquisition, each with its own lock deadline: one range and one
        # lock-heap entry per record, nothing can merge.
        clock = FakeClock()
        sp = SharePartition(0, clock=clock, max_record_locks=in_flight)
        batch = [FetchedBatch(0, in_flight - 1)]
        for o in range(in_flight):
            clock.now += 1
            sp.acquire(members[o % 7], batch, 1, AcquireMode.RECORD_LIMIT, fetch_offset=o)
        assert len(sp.in_flight()) == in_flight
        return sp

    def alternating():
        # One acquisition, every other record released: alternating Available/Acquired ranges.
        sp = SharePartition(0, clock=FakeClock(), max_record_locks=in_flight)
        sp.acquire("m", [FetchedBatch(0, in_flight - 1)], in_flight)
        sp.acknowledge("m", [(o, o, RELEASE) for o in range(0, in_flight, 2)])
        assert len(sp.in_flight()) == in_flight
        return sp

    def whole_batches():
        sp = SharePartition(0, clock=FakeClock(), max_record_locks=in_flight)
        sp.acquire("m", [FetchedBatch(b, b + BATCH - 1) for b in range(0, in_flight, BATCH)], in_flight)
        return sp

    def naive_distinct_locks():
        clock = FakeClock()
        sp = NaivePartition(0, clock)
        for o in range(in_flight):
            clock.now += 1
            sp.acquire(members[o % 7], [FetchedBatch(o, in_flight - 1)], 1)
        return sp

    def naive_one_batch():
        sp = NaivePartition(0, FakeClock())
        sp.acquire("m", [FetchedBatch(0, in_flight - 1)], in_flight)
        return sp

    measure("range engine: distinct lock per record (worst case)", distinct_locks)
    measure("range engine: alternating Available/Acquired", alternating)
    measure("range engine: 4 whole 500-record batches", whole_batches)
    measure("naive per-offset: distinct lock per record", naive_distinct_locks)
    measure("naive per-offset: one acquisition", naive_one_batch)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--baseline-records", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    def engine() -> SharePartition:
        return SharePartition(0, clock=FakeClock())

    def baseline() -> NaivePartition:
        return NaivePartition(0, FakeClock())

    rows = []
    for label, fraction in (("whole batches, all accepted", 0.0), ("1% released once", 0.01)):
        fast_cpu, fast_wall = run(engine, args.records, fraction, args.repeat)
        slow_cpu, slow_wall = run(baseline, args.baseline_records, fraction, 1)
        rows.append((label, fast_cpu, fast_wall, slow_cpu, slow_wall))

    print(
        f"Python {sys.version.split()[0]}, {args.records:,} records (baseline {args.baseline_records:,}), "
        f"{BATCH}-record batches, best of {args.repeat}, load average {os.getloadavg()[0]:.1f}"
    )
    print()
    print(
        "| scenario | range engine records/s (CPU) | (wall) | naive per-offset records/s (CPU) | (wall) | ratio (CPU) |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for label, fast_cpu, fast_wall, slow_cpu, slow_wall in rows:
        print(
            f"| {label} | {fast_cpu:,.0f} | {fast_wall:,.0f} | {slow_cpu:,.0f} | {slow_wall:,.0f} "
            f"| {fast_cpu / slow_cpu:.1f}x |"
        )
    print()
    print("| 2,000 in-flight records | bytes (tracemalloc) |")
    print("| --- | ---: |")
    for name, size in memory_worst_case().items():
        print(f"| {name} | {size:,} |")


if __name__ == "__main__":
    main()
