"""The state-write part of the ``scale_out`` scenario: what fencing costs, without consumers around it.

The share-consumption part of ``scale_out`` runs 500,000 records through in 1-3 s, with few state writes
(implicit acknowledgement acknowledges a whole fetch at once): the broker's CPU over such a run is a few
tenths of a second, too little to tell the cost of an instance group's fenced state writes from the noise
of a shared 2-core machine. Here the state store alone: ``writers`` concurrent writers (as many members
acknowledging), each writing one ShareUpdate after the other for ``seconds`` to its own share-partition,
through a :class:`~kshare.share.state.topic_store.TopicStateStore` with and without an instance group's
claims (``transactional_prefix``, all state partitions claimed), alternated, a fresh state topic each run.
Measured: writes/s, and the broker's and this process's CPU per thousand writes.

Runnable on its own (``python -m kshare.bench.state_writes --bootstrap HOST:PORT
--broker-pid PID``), so that the same load can be run against another checkout of kshare.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from dataclasses import asdict, dataclass

from .procs import cpu_seconds, load


@dataclass
class StateRun:
    group: bool  # an instance group's claims
    round: int
    writes: int
    seconds: float
    broker_cpu: float
    store_cpu: float
    load_before: str
    load_after: str

    @property
    def rate(self) -> float:
        return self.writes / self.seconds


async def _writes(bootstrap: str, group: bool, writers: int, seconds: float, partitions: int) -> tuple[int, float]:
    from kshare.share.state.topic_store import TopicStateStore
    from kshare.share.states import ShareSnapshot, ShareUpdate
    from kshare.share.store import SharePartitionKey

    topic = f"bench-state-{uuid.uuid4().hex[:8]}"
    store = TopicStateStore([bootstrap], topic=topic, partitions=partitions,
                            transactional_prefix=f"kshare-bench.{topic}." if group else None)
    await store.start()
    try:
        if group:
            await store.claim(range(partitions))
        tid = uuid.uuid4().bytes
        keys = [SharePartitionKey("bench", tid, i) for i in range(writers)]
        await store.write([(k, ShareSnapshot(0, ())) for k in keys])
        count = 0
        deadline = time.monotonic() + seconds

        async def writer(key: SharePartitionKey) -> None:
            nonlocal count
            n = 0
            while time.monotonic() < deadline:
                n += 1
                await store.write([(key, ShareUpdate(n, ()))])
                count += 1

        t0 = time.monotonic()
        await asyncio.gather(*(writer(k) for k in keys))
        return count, time.monotonic() - t0
    finally:
        await store.close()


def state_run(bootstrap: str, broker_pid: int | None, group: bool, rnd: int, writers: int, seconds: float,
              partitions: int) -> StateRun:
    before = load()
    b0 = cpu_seconds(broker_pid) if broker_pid else float("nan")
    p0 = time.process_time()
    writes, secs = asyncio.run(_writes(bootstrap, group, writers, seconds, partitions))
    p1 = time.process_time()
    b1 = cpu_seconds(broker_pid) if broker_pid else float("nan")
    return StateRun(group, rnd, writes, secs, b1 - b0, p1 - p0, before, load())


def state_part(bootstrap: str, broker_pid: int | None, writers: int, seconds: float, repeats: int,
               partitions: int = 10, log=print) -> list[StateRun]:
    runs = []
    for r in range(repeats):
        for group in ((False, True) if r % 2 == 0 else (True, False)):
            run = state_run(bootstrap, broker_pid, group, r, writers, seconds, partitions)
            runs.append(run)
            log(f"  state writes, round {r}, {'instance group (claims)' if group else 'no instance group'}: "
                f"{run.rate:,.0f} writes/s | broker {run.broker_cpu / run.writes * 1e3:.2f} s / 1000 writes | "
                f"store {run.store_cpu / run.writes * 1e3:.2f} s / 1000 writes | load {run.load_before} -> {run.load_after}")
    return runs


def state_table(runs: list[StateRun]) -> tuple[str, dict[str, dict[str, float]]]:
    med: dict[str, dict[str, float]] = {}
    for group in (False, True):
        rs = [r for r in runs if r.group == group]
        if rs:
            med["group" if group else "plain"] = {
                "rate": statistics.median(r.rate for r in rs),
                "broker_per_k": statistics.median(r.broker_cpu / r.writes * 1e3 for r in rs),
                "store_per_k": statistics.median(r.store_cpu / r.writes * 1e3 for r in rs),
                "runs": len(rs)}
    lines = ["| state store | runs | writes/s | vs no instance group | broker CPU s / 1000 writes | vs no instance group "
             "| store CPU s / 1000 writes |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    base = med.get("plain")
    for name, label in (("plain", "no instance group"), ("group", "instance group, all partitions claimed")):
        m = med.get(name)
        if m is None:
            continue
        vr = m["rate"] / base["rate"] if base else float("nan")
        vb = m["broker_per_k"] / base["broker_per_k"] if base and base["broker_per_k"] else float("nan")
        lines.append(f"| {label} | {m['runs']:.0f} | {m['rate']:,.0f} | {vr:.2f} | {m['broker_per_k']:.3f} | {vb:.2f} "
                     f"| {m['store_per_k']:.3f} |")
    return "\n".join(lines), med


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--broker-pid", type=int)
    ap.add_argument("--writers", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    runs = state_part(a.bootstrap, a.broker_pid, a.writers, a.seconds, a.repeats)
    print(state_table(runs)[0])
    if a.json:
        with open(a.json, "w") as f:
            json.dump([asdict(r) for r in runs], f, indent=1)


if __name__ == "__main__":
    main()
