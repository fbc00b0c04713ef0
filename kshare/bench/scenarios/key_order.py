"""The ``key_order`` scenario of ``kshare bench`` (run only when named): what key-ordered sharing
(``kshare.share.ordering=key``) costs end to end, through kshare proxies in front of the fronted cluster
(the engine alone: the ``engine`` scenario). Every figure is key-ordered beside unordered, measured in the
same run, alternated over the repeats (medians).

1. Throughput: one partition of ``records`` records with ``keys`` keys, then ``many_keys`` keys (100-byte
   values, 10 records per producer batch), 8 confluent ShareConsumers each "processing" every record for
   ``work_ms``: records/s and key-ordered / unordered.
2. Consumers busy: 8 explicit-mode consumers on one partition of ``busy_records`` records with ``keys``
   keys, each record taking 0-``max_work_ms`` ms (seeded): how many of the 8 are busy on average, and
   records/s; once steady (the bench's proxy), once with a proxy of its own SIGKILLed when a third of the
   records are processed and started again at once (same port, same state topic). Busy = the time spent
   processing (records processed again after the kill included) / the wall time from the moment the
   consumers, joined, are told to go to the end of the last record's processing. Key order is checked:
   no record of a key is processed while an earlier one of that key is, nor before it.

Ratios are what to read: the machine is shared and absolute figures move by +-30 %.
"""

from __future__ import annotations

import logging
import math
import os
import random
import signal
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import clients
from ..format import fmt_num, fmt_ratio, table
from ..procs import ProxyProcess, free_port, load
from .common import UPSTREAM, alternate, median, scenario, target, work_member

if TYPE_CHECKING:
    from ..runner import Env, Progress

ORDERINGS = ("none", "key")
CONSUMERS = 8
SIZES = (
    {"records": 4000, "keys": 20, "many_keys": 200, "work_ms": 2.0, "busy_records": 2000, "max_work_ms": 4.0},
    {"records": 1000, "keys": 20, "many_keys": 200, "work_ms": 2.0, "busy_records": 500, "max_work_ms": 4.0},
)
# issue 41's targets: key-ordered / unordered records/s at 2 ms of work, and consumers busy across a kill
RATIO_TARGETS = {20: 0.6, 200: 0.8}
BUSY_KILLED_TARGET = 3.0
KILL_AT = 1 / 3  # of the records processed
# KSHARE_BENCH_REJOIN_LOG=<file>: the first consumer of the key-ordered runs across the kill writes its
# librdkafka debug lines (cgrp, broker, fetch), timed, there, with the kill and the restart marked
_REJOIN_LOG: dict[str, str] = {}


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


Processing = tuple[bytes | None, int, float, float]  # key, offset, start, end


def _busy_member(bootstrap: str, group: str, topic: str, max_work_s: float, seed: int, start: threading.Event,
                 stop: threading.Event, out: tuple[list[Processing], list[list[Processing]]]) -> None:
    """An explicit-mode ShareConsumer: each record "processed" for a random 0..max_work_s (seeded), then
    accepted (the acknowledgements go with its next poll's ShareFetch); (key, offset, start, end) of each
    processing in ``out[0]``, and grouped by the poll that returned them in ``out[1]`` (its own list)."""
    from confluent_kafka import AcknowledgeType, ShareConsumer

    done, polls = out
    rng = random.Random(seed)
    config: dict[str, Any] = {"bootstrap.servers": bootstrap, "group.id": group, "error_cb": clients._quiet,
                              "log_level": 3, "share.acknowledgement.mode": "explicit"}
    if seed == 0 and _REJOIN_LOG.get("path"):
        # the first consumer's librdkafka debug lines, timed (where its way back after a kill goes)
        logger = logging.getLogger(f"kshare.bench.key_order.rdkafka.{uuid.uuid4().hex[:6]}")
        handler = logging.FileHandler(_REJOIN_LOG["path"])
        handler.setFormatter(logging.Formatter("%(created).3f %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
        config.update({"logger": logger, "debug": "cgrp,broker,fetch", "log_level": 7})
    c = ShareConsumer(config)
    c.subscribe([topic])
    start.wait()
    try:
        while not stop.is_set():
            batch = []
            for m in c.poll(0.1):
                if m.error() is not None:
                    continue
                t0 = time.monotonic()
                time.sleep(rng.uniform(0, max_work_s))
                p = (m.key(), m.offset(), t0, time.monotonic())
                done.append(p)
                batch.append(p)
                c.acknowledge(m, AcknowledgeType.ACCEPT)
            if batch:
                polls.append(batch)
    finally:
        c.close()


def timeline(polls: list[list[list[Processing]]]) -> dict[str, float]:
    """Where a key's time goes between its records, from the consumers' side (each consumer's polls, in
    order): records per poll; a consumer's cycle (the end of a poll's last record to the start of the next
    poll's first: the poll call, the ShareFetch carrying the acknowledgements and its answer); and each
    key's consecutive records (by processing start) by how the second reached a consumer: in the same poll
    (a run), in the same consumer's next poll (the answer to the ShareFetch that carried the first's
    acknowledgement: affinity), a later poll of it, or another consumer, with the median gap (the first's
    end to the second's start) of each."""
    where: dict[tuple[bytes | None, int], tuple[int, int]] = {}
    cycles: list[float] = []
    sizes: list[int] = []
    for c, mine in enumerate(polls):
        for i, batch in enumerate(mine):
            sizes.append(len(batch))
            for k, o, _, _ in batch:
                where[(k, o)] = (c, i)
            if i:
                cycles.append(batch[0][2] - mine[i - 1][-1][3])
    every = sorted((p for mine in polls for batch in mine for p in batch), key=lambda p: p[2])
    last: dict[bytes | None, Processing] = {}
    gaps: dict[str, list[float]] = {"run": [], "next_poll": [], "later_poll": [], "other_consumer": []}
    for p in every:
        k = p[0]
        q = last.get(k)
        last[k] = p
        if q is None or k is None:
            continue
        (c0, i0), (c1, i1) = where[(k, q[1])], where[(k, p[1])]
        kind = ("other_consumer" if c0 != c1 else "run" if i0 == i1 else "next_poll" if i1 == i0 + 1
                else "later_poll")
        gaps[kind].append(p[2] - q[3])
    n = max(1, sum(len(g) for g in gaps.values()))
    out = {"records_per_poll": median(sizes), "cycle_ms": median(cycles) * 1000,
           "cycle_p90_ms": sorted(cycles)[max(0, math.ceil(0.9 * len(cycles)) - 1)] * 1000 if cycles else float("nan")}
    for kind, g in gaps.items():
        out[f"{kind}_share"] = len(g) / n
        out[f"{kind}_gap_ms"] = median(g) * 1000 if g else float("nan")
    return out


def _run_members(target: Callable[..., None], args: Callable[[int], tuple], results: list,
                 enough: Callable[[], bool], what: str, timeout: float = 300.0,
                 midway: tuple[Callable[[], bool], Callable[[], None]] | None = None) -> float:
    """``CONSUMERS`` threads of ``target(*args(i), start, stop, results[i])``, started together after they
    joined (2 s), until ``enough()``; ``midway``: (when, what) -- ``what()`` once ``when()`` holds. Returns
    when they were told to start."""
    start, stop = threading.Event(), threading.Event()
    threads = [threading.Thread(target=target, args=(*args(i), start, stop, results[i]), daemon=True)
               for i in range(CONSUMERS)]
    for t in threads:
        t.start()
    time.sleep(2)  # let them join
    t0 = time.monotonic()
    start.set()
    deadline = t0 + timeout
    while not enough() and time.monotonic() < deadline:
        if midway is not None and midway[0]():
            midway[1]()
            midway = None
        time.sleep(0.01)  # (``enough`` takes the consumers' GIL for a moment: not too often)
    stop.set()
    for t in threads:
        t.join(30)
    if not enough():
        raise RuntimeError(f"{what}: not every record in {timeout:.0f} s")
    return t0


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


class KilledProxy:
    """A kshare proxy of the scenario's own (the bench's stays up) that ``kill`` SIGKILLs and starts again
    at once on the same ports and state topic, as a supervisor would."""

    def __init__(self, env: Env, name: str) -> None:
        self.upstream = env.upstream()
        self.port = free_port()
        # fixed ports for the brokers too (the bench's proxies let the OS choose, which a restart would
        # change: the consumers would first have to find their broker again through the bootstrap)
        self.args = [*env.proxy_args, "--state-topic", f"__kshare_bench_kill_{uuid.uuid4().hex[:8]}",
                     "--broker-port-base", str(free_port() - 1)]
        self.log_path = env.options.out / f"{name}.log"
        self.proxy = self._start()
        self.killed_at = self.ready_at = 0.0

    def _start(self) -> ProxyProcess:
        p = ProxyProcess(self.upstream, self.args, name="kshare-killed", port=self.port, log_path=self.log_path)
        p.start(180)
        return p

    @property
    def bootstrap(self) -> str:
        return self.proxy.bootstrap

    def kill(self) -> None:
        self.killed_at = time.monotonic()
        _mark("SIGKILL")
        self.proxy.stop(signal.SIGKILL)
        self.proxy = self._start()
        self.ready_at = time.monotonic()
        _mark("restarted proxy ready")

    def stop(self) -> None:
        self.proxy.stop()


def busy_consumers(bootstrap: str, upstream: str, records: int, ordering: str, keys: int, max_work_ms: float,
                   killed: KilledProxy | None = None) -> dict[str, Any]:
    """``CONSUMERS`` explicit-mode consumers on one partition, each record "processed" for 0..``max_work_ms``
    ms: consumers busy on average (the time spent processing / the wall time from their start to the last
    record's end) and records/s; with ``killed``, that proxy is SIGKILLed and started again once a third of
    the records are processed. Checks key order when ordered."""
    topic = clients.create_topic(upstream, f"bench-keybusy-{uuid.uuid4().hex[:8]}", 1)
    group = f"bench-keybusy-{uuid.uuid4().hex[:8]}"
    done: list[Processing] = []
    polls: list[list[list[Processing]]] = [[] for _ in range(CONSUMERS)]
    midway = None
    if killed is not None:
        midway = (lambda: len(done) >= records * KILL_AT, killed.kill)
        path = os.environ.get("KSHARE_BENCH_REJOIN_LOG") if ordering == "key" else None
        if path:
            _REJOIN_LOG["path"] = path
            _mark(f"run of {records} records, ordering={ordering}")
    try:
        _produce_keyed(upstream, topic, records, keys)
        clients.share_group(bootstrap, group)
        clients.set_group_configs(bootstrap, group, {"kshare.share.ordering": ordering})
        t0 = _run_members(_busy_member, lambda i: (bootstrap, group, topic, max_work_ms / 1000, i),
                          [(done, polls[i]) for i in range(CONSUMERS)], lambda: len({o for _, o, _, _ in done}) >= records,
                          f"busy, ordering={ordering}", midway=midway)
    finally:
        _REJOIN_LOG.pop("path", None)
        clients.delete_topic(upstream, topic)
    if ordering == "key":
        check_key_order(done)
    last = max(b for _, _, _, b in done)
    final = {o: b - a for _, o, a, b in sorted(done, key=lambda d: d[2])}  # each record's last processing
    out = {"busy": sum(b - a for _, _, a, b in done) / (last - t0), "useful_busy": sum(final.values()) / (last - t0),
           "records_per_s": records / (last - t0), "to_first_s": min(a for _, _, a, _ in done) - t0,
           "processed_again": len(done) - records}
    if killed is None:
        out["timeline"] = timeline(polls)
    if killed is not None:
        after = [a for _, _, a, _ in done if a >= killed.ready_at]
        out["down_s"] = killed.ready_at - killed.killed_at  # SIGKILL -> the new proxy ready
        out["stalled_s"] = stalled(done, killed.killed_at)
        out["first_after_s"] = (min(after) - killed.ready_at) if after else float("nan")
    return out


def _mark(what: str) -> None:
    path = _REJOIN_LOG.get("path")
    if path:
        with open(path, "a") as f:
            f.write(f"{time.time():.3f} === {what}\n")


def check_key_order(done: list[tuple[bytes | None, int, float, float]]) -> None:
    """Per key: no two processings at once; a record processed only after every earlier record of
    its key was processed at least once; the last processings in offset order. A record processed
    again may follow later records of its key only in a replay in order: a run of the key whose
    acknowledgement the kill lost is delivered again whole (27, 35, 27, 35)."""
    by_key: dict[bytes | None, list[tuple[float, float, int]]] = {}
    for k, o, a, b in done:
        if k is not None:
            by_key.setdefault(k, []).append((a, b, o))
    for k, spans in by_key.items():
        spans.sort()
        offsets = sorted({o for _, _, o in spans})
        seen: set[int] = set()
        for i, (a, _, o) in enumerate(spans):
            if i and a < spans[i - 1][1]:
                raise RuntimeError(f"key {k!r}: offset {o} processed at once with {spans[i - 1][2]}")
            if any(p not in seen for p in offsets[:offsets.index(o)]):
                raise RuntimeError(f"key {k!r}: offset {o} processed before an earlier one of its key")
            seen.add(o)
        last = {o: i for i, (_, _, o) in enumerate(spans)}
        if sorted(last, key=last.__getitem__) != offsets:
            raise RuntimeError(f"key {k!r}: last processings out of offset order")


def stalled(done: list[tuple[bytes | None, int, float, float]], since: float) -> float:
    """The longest time after ``since`` during which no consumer processed anything."""
    spans = sorted((a, b) for _, _, a, b in done if b >= since)
    longest, busy_to = 0.0, since
    for a, b in spans:
        longest = max(longest, a - busy_to)
        busy_to = max(busy_to, b)
    return longest


def run(env: Env, progress: Progress, *, records: int, keys: int, many_keys: int, work_ms: float,
        busy_records: int, max_work_ms: float, repeats: int) -> dict[str, Any]:
    proxy = env.proxy()
    upstream = env.upstream()
    killed = KilledProxy(env, "kshare-key-order-killed")
    progress.begin("key_order", 4 * len(ORDERINGS) * repeats)
    samples: list[dict[str, Any]] = []
    loads = [load()]
    try:
        for r in range(repeats):
            for n_keys in (keys, many_keys):
                for ordering in alternate(list(ORDERINGS), r):
                    rate = end_to_end(proxy.bootstrap, upstream, records, ordering, n_keys, work_ms)
                    samples.append({"part": "throughput", "keys": n_keys, "ordering": ordering, "records_per_s": rate})
                    progress.step(f"{n_keys} keys, ordering={ordering}: {rate:,.0f} rec/s")
            for case in ("steady", "killed"):
                for ordering in alternate(list(ORDERINGS), r + 1):
                    s = busy_consumers(proxy.bootstrap if case == "steady" else killed.bootstrap, upstream,
                                       busy_records, ordering, keys, max_work_ms,
                                       killed if case == "killed" else None)
                    samples.append({"part": "busy", "case": case, "ordering": ordering, **s})
                    progress.step(f"busy, {case}, ordering={ordering}: {s['busy']:.2f} of {CONSUMERS} busy")
            loads.append(load())
    finally:
        killed.stop()
    progress.end()

    def med(key: str, **where: Any) -> float:
        return median([s[key] for s in samples if all(s.get(k) == v for k, v in where.items())])

    throughput = []
    for n_keys in (keys, many_keys):
        row = {"keys": n_keys, **{o: med("records_per_s", part="throughput", keys=n_keys, ordering=o)
                                  for o in ORDERINGS}}
        # the median over repeats of each repeat's ratio (its two runs side by side), and the ratio of medians
        per_repeat = [k["records_per_s"] / n["records_per_s"] for n, k in zip(
            [s for s in samples if s["part"] == "throughput" and s["keys"] == n_keys and s["ordering"] == "none"],
            [s for s in samples if s["part"] == "throughput" and s["keys"] == n_keys and s["ordering"] == "key"],
            strict=True)]
        row["key_vs_none"] = row["key"] / row["none"]
        row["key_vs_none_per_repeat"] = median(per_repeat)
        throughput.append(row)
    busy = []
    for case in ("steady", "killed"):
        row: dict[str, Any] = {"case": case}
        for o in ORDERINGS:
            for k in ("busy", "useful_busy", "records_per_s", "to_first_s", "processed_again"):
                row[f"{k}_{o}"] = med(k, part="busy", case=case, ordering=o)
            if case == "killed":
                for k in ("down_s", "stalled_s", "first_after_s"):
                    row[f"{k}_{o}"] = med(k, part="busy", case=case, ordering=o)
            else:
                lines = [s["timeline"] for s in samples if s["part"] == "busy" and s["case"] == case
                         and s["ordering"] == o and "timeline" in s]
                if lines:
                    row[f"timeline_{o}"] = {k: median([t[k] for t in lines]) for k in lines[0]}
        busy.append(row)
    targets = [target(f"key-ordered / unordered records/s, {n} keys, {work_ms:g} ms of work", row["key_vs_none"],
                      RATIO_TARGETS[n], ">=") for n, row in zip((keys, many_keys), throughput, strict=True)
               if n in RATIO_TARGETS]
    targets.append(target(f"consumers busy (of {CONSUMERS}), key-ordered, {keys} keys, 0-{max_work_ms:g} ms, "
                          "proxy SIGKILLed mid-run", busy[1]["busy_key"], BUSY_KILLED_TARGET, ">="))
    return {
        "config": {"records": records, "keys": keys, "many_keys": many_keys, "work_ms": work_ms,
                   "busy_records": busy_records, "max_work_ms": max_work_ms, "consumers": CONSUMERS,
                   "repeats": repeats, "kill_at": KILL_AT, "load": loads},
        "rows": throughput,
        "busy": busy,
        "samples": samples,
        "targets": targets,
    }


def section(res: dict[str, Any]) -> list[str]:
    cfg = res.get("config", {})
    n = cfg.get("consumers", CONSUMERS)
    out = [
        f"{n} share consumers on one partition, through kshare; medians of {cfg.get('repeats', '?')} alternated "
        f"repeat(s), load average (1, 5, 15 min) {' -> '.join(cfg.get('load', []))}. Throughput: "
        f"{fmt_num(cfg.get('records'))} records, {cfg.get('work_ms', '?')} ms of work each; the ratio is of the "
        "medians (per repeat, the median of each repeat's ratio).",
        "",
    ]
    out += table(
        ["keys", "unordered, records/s", "key-ordered, records/s", "key-ordered / unordered"],
        [[fmt_num(r["keys"]), fmt_num(r["none"]), fmt_num(r["key"]),
          f"{fmt_ratio(r['key_vs_none'])} ({fmt_ratio(r.get('key_vs_none_per_repeat'))})"]
         for r in res.get("rows", [])],
    )
    out += [
        "",
        f"Consumers busy: {fmt_num(cfg.get('busy_records'))} records, {cfg.get('keys', '?')} keys, explicit "
        f"acknowledgement, 0-{cfg.get('max_work_ms', '?')} ms of work each; busy = time spent processing / wall "
        "time from the consumers' start to the last record's end (key order checked; in brackets counting only "
        "each record's last processing, not the ones whose acknowledgement a kill lost). Killed: a proxy of its "
        "own SIGKILLed after a third of the records and started again at once on the same ports; down = SIGKILL "
        "to the new proxy ready, stalled = the longest time after the SIGKILL with nothing processed.",
        "",
    ]
    rows = []
    for r in res.get("busy", []):
        for o in ORDERINGS:
            rows.append([r["case"], "unordered" if o == "none" else "key-ordered",
                         f"{fmt_num(r[f'busy_{o}'], 2)} ({fmt_num(r.get(f'useful_busy_{o}'), 2)})",
                         fmt_num(r[f"records_per_s_{o}"]), fmt_num(r[f"processed_again_{o}"]),
                         fmt_num(r.get(f"down_s_{o}"), 2), fmt_num(r.get(f"stalled_s_{o}"), 2)])
    out += table(["case", "ordering", f"consumers busy (of {n}; last processings only)", "records/s",
                  "processed again", "down, s", "stalled, s"], rows, "llrrrrr")
    steady = next((r for r in res.get("busy", []) if r["case"] == "steady" and "timeline_key" in r), None)
    if steady is not None:
        out += [
            "",
            "Timeline, steady (from the consumers' side, medians over the repeats): records per poll; a consumer's "
            "cycle, the end of a poll's last record to the start of its next poll's first (the poll call, the "
            "ShareFetch carrying the acknowledgements, its answer), median and 90th percentile; and each key's "
            "consecutive records by how the second came: in the same poll (a run), in the same consumer's next "
            "poll (the answer to the ShareFetch carrying the first's acknowledgement), a later poll of it, another "
            "consumer -- share of the key's steps and median gap from the first's end to the second's start.",
            "",
        ]
        kinds = ("run", "next_poll", "later_poll", "other_consumer")
        trows = []
        for o in ORDERINGS:
            t = steady.get(f"timeline_{o}")
            if t is None:
                continue
            trows.append(["unordered" if o == "none" else "key-ordered", fmt_num(t["records_per_poll"], 1),
                          f"{fmt_num(t['cycle_ms'], 1)} / {fmt_num(t['cycle_p90_ms'], 1)}",
                          *(f"{t[f'{k}_share']:.0%}, {fmt_num(t[f'{k}_gap_ms'], 1)} ms" for k in kinds)])
        out += table(["ordering", "records per poll", "cycle, ms (median / p90)", "same poll", "next poll",
                      "later poll", "other consumer"], trows, "lrrrrrr")
    return [*out, ""]


SCENARIO = scenario(
    __name__, "Key-ordered sharing end to end: records/s and consumers busy, key-ordered vs unordered",
    needs=frozenset({UPSTREAM}), opt_in=True,
)
