"""The failover scenario's analysis, pure (no I/O but reading a log file): from the deliveries, the
records available, the faults' windows and the acknowledgements of a run, what was lost, redelivered,
and how long records waited with none delivered (:mod:`kshare.bench.scenarios.failover`)."""

from __future__ import annotations

import heapq
import math
import re
from pathlib import Path
from typing import Any


def overlap_max(intervals: list[tuple[float, float]], start: float, end: float) -> float:
    """The longest part of any interval inside [start, end)."""
    return max((min(b, end) - max(a, start) for a, b in intervals if b > start and a < end), default=0.0)


def failover_analysis(deliveries: list[tuple[float, int, int]], available: dict[int, float],
                      windows: list[dict[str, Any]], acks: list[tuple[float, float]],
                      t_end: float) -> dict[str, Any]:
    """What a failover run's timeline says.

    ``deliveries``: (time, record id, partition) of every delivery, any consumer; ``available``: record
    id -> the time it could first be delivered (the records produced before: when the consumers started;
    the others: when the producer's delivery report said the cluster had them), for every record the
    cluster acknowledged; ``windows``: dicts with ``name``, ``start``, ``end`` and, for a fault,
    ``signal`` (the time it was sent) and ``partitions`` (those its broker led); ``acks``: (sent,
    acknowledged) times of the producer's records that were written; ``t_end``: when the consumers
    stopped.

    A delivery of a record delivered before is a redelivery, counted in the window it happened in.
    A *stall* is a stretch without any delivery during which some record was available and not yet
    delivered (from the first delivery on: the group's first join is not a failover's doing); a record
    delivered before and given again counts as delivered, so it is left out of it. The producer's stall
    is the longest time between two successful delivery reports."""
    deliveries = sorted(deliveries)
    first: dict[int, float] = {}
    redelivered = []
    for t, rid, _p in deliveries:
        if rid in first:
            redelivered.append(t)
        else:
            first[rid] = t
    # stalls: gaps between deliveries in which a record was available and not yet delivered
    heap = [(a, rid) for rid, a in available.items()]
    heapq.heapify(heap)
    stalls: list[tuple[float, float]] = []
    times = [t for t, _, _ in deliveries]
    edges = list(zip(times, [*times[1:], t_end], strict=True)) if times else []
    for prev, nxt in edges:
        if nxt <= prev:
            continue
        while heap and first.get(heap[0][1], math.inf) <= prev:
            heapq.heappop(heap)
        if heap and heap[0][0] < nxt:
            stalls.append((max(heap[0][0], prev), nxt))
    lost = sorted(rid for rid in available if rid not in first)
    ack_times = sorted(b for _, b in acks)
    producer_gaps = list(zip(ack_times, ack_times[1:], strict=False))
    out_windows = []
    for w in windows:
        start, end = w["start"], w["end"]
        inside = [(t, rid, p) for t, rid, p in deliveries if start <= t < end]
        re_n = sum(1 for t in redelivered if start <= t < end)
        row: dict[str, Any] = {
            **{k: v for k, v in w.items() if k not in ("start", "end")},
            "start": start,
            "end": end,
            "deliveries": len(inside),
            "redeliveries": re_n,
            "longest_stall_s": overlap_max(stalls, start, end),
            "producer_longest_gap_s": overlap_max(producer_gaps, start, end),
            "producer_longest_wait_s": max((b - a for a, b in acks if start <= a < end), default=math.nan),
        }
        if "signal" in w:
            sig = w["signal"]
            after = [t for t, _, _ in deliveries if t >= sig]
            row["first_record_s"] = after[0] - sig if after else math.nan
            per_part = {}
            for p in w.get("partitions", []):
                ts = [t for t, _, q in deliveries if q == p and t >= sig]
                per_part[p] = ts[0] - sig if ts else math.nan
            row["first_record_of_its_partitions_s"] = max(per_part.values()) if per_part else math.nan
            row["first_record_per_partition_s"] = per_part
        out_windows.append(row)
    return {
        "records": len(available),
        "delivered": len([r for r in available if r in first]),
        "lost": len(lost),
        "lost_ids": lost[:20],
        "deliveries": len(deliveries),
        "redeliveries": len(redelivered),
        "stalls": stalls,
        "producer_longest_gap_s": max((b - a for a, b in producer_gaps), default=math.nan),
        "windows": out_windows,
    }


def timeline(deliveries: list[tuple[float, int, int]], acks: list[tuple[float, float]], t0: float,
              t_end: float) -> dict[str, list[int]]:
    """Per second from ``t0``: deliveries, redeliveries and the producer's acknowledged records."""
    n = max(1, math.ceil(t_end - t0))
    dl, rd, pr = [0] * n, [0] * n, [0] * n
    seen: set[int] = set()
    for t, rid, _ in sorted(deliveries):
        i = min(n - 1, max(0, int(t - t0)))
        dl[i] += 1
        if rid in seen:
            rd[i] += 1
        seen.add(rid)
    for _, b in acks:
        pr[min(n - 1, max(0, int(b - t0)))] += 1
    return {"deliveries": dl, "redeliveries": rd, "produced": pr}


def log_levels(path: Path) -> dict[str, Any]:
    """WARNING / ERROR / traceback lines of a kshare log: counts and the distinct messages (numbers
    and addresses masked), each with its count."""
    counts = {"WARNING": 0, "ERROR": 0, "CRITICAL": 0, "Traceback": 0}
    distinct: dict[str, int] = {}
    first: dict[str, str] = {}
    if path.exists():
        for line in path.read_text(errors="replace").splitlines():
            level = next((lv for lv in ("WARNING", "ERROR", "CRITICAL") if f" {lv} " in line), None)
            if "Traceback" in line:
                counts["Traceback"] += 1
            if level is None:
                continue
            counts[level] += 1
            msg = line.split(f" {level} ", 1)[1]
            key = f"{level} " + re.sub(r"\d+", "N", msg)[:160]
            distinct[key] = distinct.get(key, 0) + 1
            first.setdefault(key, line.rstrip()[:300])
    return {"counts": counts,
            "distinct": [{"count": n, "pattern": k, "first": first[k]}
                         for k, n in sorted(distinct.items(), key=lambda kv: -kv[1])][:40]}
