"""The ``key_order`` scenario of ``kshare bench`` (run only when named): what key-ordered sharing
(``kshare.share.ordering=key``) costs end to end, through the bench's kshare proxy in front of the fronted
cluster (the engine alone: the ``engine`` scenario).

1. Throughput: one partition of ``records`` records with ``keys`` keys (100-byte values, 10 records per
   producer batch), 8 confluent ShareConsumers each "processing" every record for ``work_ms``; the group
   unordered and key-ordered, alternated over the repeats. Records/s and key-ordered / unordered
   (medians).
2. Consumers busy: 8 explicit-mode consumers on one key-ordered (and one unordered) partition, each record
   taking 0-``max_work_ms`` ms (seeded): how many of the 8 are busy on average (time spent processing /
   wall time), and records/s. Key order is checked: no record of a key is processed while an earlier
   one of that key is, nor before it.

Ratios are what to read: the machine is shared and absolute figures move by +-30 %.

(Was ``benchmarks/bench_key_order.py`` end to end; its ``--baseline-src`` -- an older kshare beside this
one -- is two runs of ``kshare bench --only key_order``, one in each tree; its ``--kill`` -- the proxy
SIGKILLed midway -- is tests/integration's.)
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import clients
from ..format import fmt_num, fmt_ratio, table
from .common import UPSTREAM, alternate, median, polled, scenario, work_member

if TYPE_CHECKING:
    from ..runner import Env, Progress

ORDERINGS = ("none", "key")
CONSUMERS = 8
SIZES = (
    {"records": 4000, "keys": 20, "work_ms": 2.0, "busy_records": 2000, "max_work_ms": 4.0},
    {"records": 1000, "keys": 20, "work_ms": 2.0, "busy_records": 500, "max_work_ms": 4.0},
)


def _produce_keyed(bootstrap: str, topic: str, records: int, keys: int) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.num.messages": 10,
                  "error_cb": clients._quiet, "log_level": 3})
    rng = random.Random(3)
    for i in range(records):
        p.produce(topic, b"." * 100, key=f"key-{rng.randrange(keys)}".encode(), partition=0)
        if i % 1000 == 999:
            p.poll(0)
    if p.flush(60):
        raise RuntimeError(f"{topic}: records left unsent after 60 s")


def _member(bootstrap: str, group: str, topic: str, work_s: float, start: threading.Event,
            stop: threading.Event, times: list[float]) -> None:
    from confluent_kafka import ShareConsumer

    c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group, "error_cb": clients._quiet,
                       "log_level": 3})
    c.subscribe([topic])
    work_member(c, start, stop, work_s, times)


def _busy_member(bootstrap: str, group: str, topic: str, max_work_s: float, seed: int, start: threading.Event,
                 stop: threading.Event, done: list[tuple[bytes | None, int, float, float]]) -> None:
    """An explicit-mode ShareConsumer: each record "processed" for a random 0..max_work_s (seeded), then
    accepted; (key, offset, start, end) of each processing in ``done``."""
    from confluent_kafka import AcknowledgeType, ShareConsumer

    rng = random.Random(seed)
    c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group, "error_cb": clients._quiet,
                       "log_level": 3, "share.acknowledgement.mode": "explicit"})
    c.subscribe([topic])
    start.wait()
    try:
        for m in polled(c, stop):
            t0 = time.monotonic()
            time.sleep(rng.uniform(0, max_work_s))
            done.append((m.key(), m.offset(), t0, time.monotonic()))
            c.acknowledge(m, AcknowledgeType.ACCEPT)
    finally:
        c.close()


def _run_members(target: Callable[..., None], args: Callable[[int], tuple], results: list,
                 enough: Callable[[], bool], what: str, timeout: float = 300.0) -> None:
    """``CONSUMERS`` threads of ``target(*args(i), start, stop, results[i])``, started together after they
    joined (2 s), until ``enough()``."""
    start, stop = threading.Event(), threading.Event()
    threads = [threading.Thread(target=target, args=(*args(i), start, stop, results[i]), daemon=True)
               for i in range(CONSUMERS)]
    for t in threads:
        t.start()
    time.sleep(2)  # let them join
    start.set()
    deadline = time.monotonic() + timeout
    while not enough() and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join(30)
    if not enough():
        raise RuntimeError(f"{what}: not every record in {timeout:.0f} s")


def end_to_end(bootstrap: str, upstream: str, records: int, ordering: str, keys: int, work_ms: float) -> float:
    """Records/s of ``CONSUMERS`` share consumers on one partition, every record taking ``work_ms``."""
    topic = clients.create_topic(upstream, f"bench-keyorder-{uuid.uuid4().hex[:8]}", 1)
    group = f"bench-keyorder-{uuid.uuid4().hex[:8]}"
    try:
        _produce_keyed(upstream, topic, records, keys)
        clients.share_group(bootstrap, group)
        clients.set_group_configs(bootstrap, group, {"kshare.share.ordering": ordering})
        times: list[list[float]] = [[] for _ in range(CONSUMERS)]
        _run_members(_member, lambda i: (bootstrap, group, topic, work_ms / 1000), times,
                     lambda: sum(len(t) for t in times) >= records, f"ordering={ordering}")
    finally:
        clients.delete_topic(upstream, topic)
    every = sorted(x for t in times for x in t)
    return (len(every) - 1) / (every[-1] - every[0])


def busy_consumers(bootstrap: str, upstream: str, records: int, ordering: str, keys: int,
                   max_work_ms: float) -> tuple[float, float]:
    """(consumers busy on average, records/s) of ``CONSUMERS`` explicit-mode consumers on one partition,
    each record "processed" for 0..``max_work_ms`` ms; busy = the time spent processing / the time from the
    first record's start to the last one's end. Checks key order when ordered."""
    topic = clients.create_topic(upstream, f"bench-keybusy-{uuid.uuid4().hex[:8]}", 1)
    group = f"bench-keybusy-{uuid.uuid4().hex[:8]}"
    done: list[tuple[bytes | None, int, float, float]] = []
    try:
        _produce_keyed(upstream, topic, records, keys)
        clients.share_group(bootstrap, group)
        clients.set_group_configs(bootstrap, group, {"kshare.share.ordering": ordering})
        _run_members(_busy_member, lambda i: (bootstrap, group, topic, max_work_ms / 1000, i), [done] * CONSUMERS,
                     lambda: len({o for _, o, _, _ in done}) >= records, f"busy, ordering={ordering}")
    finally:
        clients.delete_topic(upstream, topic)
    if ordering == "key":
        by_key: dict[bytes | None, list[tuple[float, float, int]]] = {}
        for k, o, a, b in done:
            by_key.setdefault(k, []).append((a, b, o))
        for k, spans in by_key.items():
            spans.sort()
            for (_, b0, o0), (a1, _, o1) in zip(spans, spans[1:], strict=False):
                if a1 < b0 or o1 < o0:
                    raise RuntimeError(f"key {k!r}: offset {o1} processed at once with or before {o0}")
    first = min(a for _, _, a, _ in done)
    last = max(b for _, _, _, b in done)
    return sum(b - a for _, _, a, b in done) / (last - first), len(done) / (last - first)


def run(env: Env, progress: Progress, *, records: int, keys: int, work_ms: float, busy_records: int,
        max_work_ms: float, repeats: int) -> dict[str, Any]:
    proxy = env.proxy()
    upstream = env.upstream()
    progress.begin("key_order", 2 * len(ORDERINGS) * repeats)
    samples: list[dict[str, Any]] = []
    for r in range(repeats):
        for ordering in alternate(list(ORDERINGS), r):
            rate = end_to_end(proxy.bootstrap, upstream, records, ordering, keys, work_ms)
            samples.append({"part": "throughput", "ordering": ordering, "records_per_s": rate})
            progress.step(f"ordering={ordering}: {rate:,.0f} rec/s")
        for ordering in alternate(list(ORDERINGS), r + 1):
            busy, rate = busy_consumers(proxy.bootstrap, upstream, busy_records, ordering, keys, max_work_ms)
            samples.append({"part": "busy", "ordering": ordering, "busy": busy, "records_per_s": rate})
            progress.step(f"busy, ordering={ordering}: {busy:.2f} of {CONSUMERS} busy")
    progress.end()

    def med(part: str, ordering: str, key: str) -> float:
        return median([s[key] for s in samples if s["part"] == part and s["ordering"] == ordering])

    rows = [{"ordering": o, "records_per_s": med("throughput", o, "records_per_s"), "busy": med("busy", o, "busy"),
             "busy_records_per_s": med("busy", o, "records_per_s")} for o in ORDERINGS]
    return {
        "config": {"records": records, "keys": keys, "work_ms": work_ms, "busy_records": busy_records,
                   "max_work_ms": max_work_ms, "consumers": CONSUMERS, "repeats": repeats},
        "rows": rows,
        "key_vs_none": rows[1]["records_per_s"] / rows[0]["records_per_s"],
        "samples": samples,
        "targets": [],
    }


def section(res: dict[str, Any]) -> list[str]:
    cfg = res.get("config", {})
    n = cfg.get("consumers", CONSUMERS)
    out = [
        f"{n} share consumers on one partition with {cfg.get('keys', '?')} keys, through kshare; medians of "
        f"{cfg.get('repeats', '?')} alternated repeat(s). Throughput: {fmt_num(cfg.get('records'))} records, "
        f"{cfg.get('work_ms', '?')} ms of work each. Busy: {fmt_num(cfg.get('busy_records'))} records, "
        f"explicit acknowledgement, 0-{cfg.get('max_work_ms', '?')} ms of work each; consumers busy = time "
        "spent processing / wall time (key order checked).",
        "",
    ]
    out += table(
        ["ordering", "records/s", f"consumers busy (of {n})", "records/s (busy)"],
        [["unordered" if r["ordering"] == "none" else "key-ordered", fmt_num(r["records_per_s"]),
          fmt_num(r["busy"], 2), fmt_num(r["busy_records_per_s"])] for r in res.get("rows", [])],
    )
    return out + ["", f"Key-ordered / unordered, records/s: {fmt_ratio(res.get('key_vs_none'))}.", ""]


SCENARIO = scenario(
    __name__, "Key-ordered sharing end to end: records/s and consumers busy, key-ordered vs unordered",
    needs=frozenset({UPSTREAM}), opt_in=True,
)
