"""What key-ordered sharing (``kshare.share.ordering=key``) costs, run by hand (not in CI).

    /tmp/ci1/.venv/bin/python benchmarks/bench_key_order.py [--repeats 3] [--records 4000]
    .venv/bin/python benchmarks/bench_key_order.py --busy --records 2000 [--baseline-src DIR]

1. The engine alone (no I/O): CPU µs per record of acquire + accept cycles of 500-record
   batches, unordered against key-ordered with 20 and with 10,000 distinct keys.
2. End to end, through a kshare proxy process in front of Apache Kafka 3.9 (started as
   ``kshare bench`` starts them): one partition, ``--records`` records with ``--keys`` keys (20;
   100-byte values, 10 records per producer batch), 8 confluent ShareConsumers each "processing"
   every record for ``--work-ms`` (2 ms); the group unordered and key-ordered, alternated,
   ``--repeats`` times each.
   Prints records/s and the ordered/unordered ratio (medians).

3. ``--busy``: how many of 8 explicit-mode consumers are busy on average (time spent processing /
   wall time) on one key-ordered partition, each record taking 0-``--max-work-ms`` ms; with
   ``--baseline-src DIR`` (e.g. ``git archive <commit> kshare protocol_specs | tar -x -C DIR``) an
   older kshare runs beside this one, alternated in the same run.

Ratios are what to read: the machine is shared and absolute figures move by +-30 %.
"""

from __future__ import annotations

import argparse
import random
import signal
import statistics
import sys
import threading
import time
import uuid
from array import array
from collections.abc import Callable
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kshare.share.partition import FetchedBatch, SharePartition  # noqa: E402
from kshare.share.record_keys import key_hash  # noqa: E402


class _Keys:
    def __init__(self, offsets: array, keys: array) -> None:
        self.offsets = offsets
        self.keys = keys


def engine_cost(n_keys: int | None, records: int = 200_000, batch: int = 500) -> float:
    """CPU µs per record: fetch a batch, acquire it, accept what was acquired."""
    rng = random.Random(1)
    ids = [key_hash(f"key-{i}".encode()) for i in range(n_keys or 1)]
    sp = SharePartition(0, max_record_locks=10 * batch, key_ordered=n_keys is not None)
    # the log: batches of `batch` records with random keys
    log = []
    for base in range(0, records, batch):
        offs = array("q", range(base, base + batch))
        keys = array("q", (ids[rng.randrange(len(ids))] for _ in range(batch)))
        log.append((FetchedBatch(base, base + batch - 1), _Keys(offs, keys)))
    done = 0
    started = time.process_time()
    while sp.start_offset < records:
        offset = sp.next_fetch_offset()
        first = offset // batch
        window = log[first:first + 4]
        fetched = [b for b, _ in window]
        keys = [k for _, k in window] if n_keys is not None else None
        result = sp.acquire("m", fetched, batch, fetch_offset=offset, record_keys=keys)
        if not result.records:
            break
        sp.acknowledge("m", [(a.first_offset, a.last_offset, 1) for a in result.records])
        done += result.count
    took = time.process_time() - started
    assert sp.start_offset >= records, sp
    return took / records * 1e6


def _member(bootstrap: str, group: str, topic: str, work_s: float, start: threading.Event,
            stop: threading.Event, times: list[float]) -> None:
    from confluent_kafka import ShareConsumer

    from kshare.bench import clients

    c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group, "error_cb": clients._quiet,
                       "log_level": 3})
    c.subscribe([topic])
    start.wait()
    try:
        while not stop.is_set():
            for m in c.poll(0.1):
                if m.error() is None:
                    time.sleep(work_s)
                    times.append(time.monotonic())
    finally:
        c.close()


def end_to_end(bootstrap: str, admin_bootstrap: str, records: int, ordering: str, consumers: int = 8,
               keys: int = 20, work_ms: float = 2.0) -> float:
    from confluent_kafka import Producer

    from kshare.bench import clients

    topic = clients.create_topic(admin_bootstrap, f"bench-keyorder-{uuid.uuid4().hex[:8]}", 1)
    group = f"bench-keyorder-{uuid.uuid4().hex[:8]}"
    try:
        p = Producer({"bootstrap.servers": admin_bootstrap, "linger.ms": 5, "batch.num.messages": 10,
                      "error_cb": clients._quiet, "log_level": 3})
        rng = random.Random(3)
        for i in range(records):
            p.produce(topic, b"." * 100, key=f"key-{rng.randrange(keys)}".encode(), partition=0)
            if i % 1000 == 999:
                p.poll(0)
        assert p.flush(60) == 0
        clients.share_group(bootstrap, group)
        clients.set_group_configs(bootstrap, group, {"kshare.share.ordering": ordering})
        start, stop = threading.Event(), threading.Event()
        times: list[list[float]] = [[] for _ in range(consumers)]
        threads = [threading.Thread(target=_member, args=(bootstrap, group, topic, work_ms / 1000, start, stop,
                                                          times[i]), daemon=True) for i in range(consumers)]
        for t in threads:
            t.start()
        time.sleep(2)  # let them join
        start.set()
        deadline = time.monotonic() + 300
        while sum(len(t) for t in times) < records and time.monotonic() < deadline:
            time.sleep(0.1)
        stop.set()
        for t in threads:
            t.join(30)
    finally:
        clients.delete_topic(admin_bootstrap, topic)
    every = sorted(x for t in times for x in t)
    if len(every) < records:
        raise RuntimeError(f"{ordering}: {len(every)} of {records} records in 300 s")
    return (len(every) - 1) / (every[-1] - every[0])


def _busy_member(bootstrap: str, group: str, topic: str, max_work_s: float, seed: int, start: threading.Event,
                 stop: threading.Event, done: list[tuple[bytes | None, int, float, float]]) -> None:
    """An explicit-mode ShareConsumer: each record "processed" for a random 0..max_work_s (seeded),
    then accepted; (key, offset, start, end) of each processing in ``done``."""
    from confluent_kafka import AcknowledgeType, ShareConsumer

    from kshare.bench import clients

    rng = random.Random(seed)
    c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group, "error_cb": clients._quiet,
                       "log_level": 3, "share.acknowledgement.mode": "explicit"})
    c.subscribe([topic])
    start.wait()
    try:
        while not stop.is_set():
            for m in c.poll(0.1):
                if m.error() is not None:
                    continue
                t0 = time.monotonic()
                time.sleep(rng.uniform(0, max_work_s))
                done.append((m.key(), m.offset(), t0, time.monotonic()))
                c.acknowledge(m, AcknowledgeType.ACCEPT)
    finally:
        c.close()


def busy_consumers(bootstrap: str, admin_bootstrap: str, records: int, ordering: str, consumers: int = 8,
                   keys: int = 20, max_work_ms: float = 4.0,
                   midway: Callable[[], None] | None = None) -> tuple[float, float]:
    """(consumers busy on average, records/s): ``consumers`` explicit-mode consumers on one
    partition of ``records`` records with ``keys`` keys (10 records a producer batch), each record
    "processed" for 0..``max_work_ms`` ms; busy = the time spent processing / the time from the first
    record's start to the last one's end. Checks key order when ordered. ``midway`` is called once a
    third of the records are processed (e.g. to SIGKILL and restart the proxy)."""
    from confluent_kafka import Producer

    from kshare.bench import clients

    topic = clients.create_topic(admin_bootstrap, f"bench-keybusy-{uuid.uuid4().hex[:8]}", 1)
    group = f"bench-keybusy-{uuid.uuid4().hex[:8]}"
    try:
        p = Producer({"bootstrap.servers": admin_bootstrap, "linger.ms": 5, "batch.num.messages": 10,
                      "error_cb": clients._quiet, "log_level": 3})
        rng = random.Random(3)
        for i in range(records):
            p.produce(topic, b"." * 100, key=f"key-{rng.randrange(keys)}".encode(), partition=0)
            if i % 1000 == 999:
                p.poll(0)
        assert p.flush(60) == 0
        clients.share_group(bootstrap, group)
        clients.set_group_configs(bootstrap, group, {"kshare.share.ordering": ordering})
        start, stop = threading.Event(), threading.Event()
        done: list[tuple[bytes | None, int, float, float]] = []
        threads = [threading.Thread(target=_busy_member, args=(bootstrap, group, topic, max_work_ms / 1000, i,
                                                               start, stop, done), daemon=True)
                   for i in range(consumers)]
        for t in threads:
            t.start()
        time.sleep(2)  # let them join
        start.set()
        deadline = time.monotonic() + 300
        while len({o for _, o, _, _ in done}) < records and time.monotonic() < deadline:
            if midway is not None and len(done) >= records // 3:
                midway()
                midway = None
            time.sleep(0.01)
        stop.set()
        for t in threads:
            t.join(30)
    finally:
        clients.delete_topic(admin_bootstrap, topic)
    if len({o for _, o, _, _ in done}) < records:
        raise RuntimeError(f"{ordering}: {len({o for _, o, _, _ in done})} of {records} records in 300 s")
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


def _restart(proxies: dict, name: str) -> None:
    """SIGKILL the proxy and start it again on the same ports and state topic."""
    from kshare.bench.procs import Child

    old = proxies[name]
    old.stop(signal.SIGKILL)
    new = Child(old.name, old.cmd, r"share state loaded", env=old.env, cwd=old.cwd)
    new.start(180)
    new.bootstrap = old.bootstrap  # type: ignore[attr-defined]
    proxies[name] = new


def busy_main(args: argparse.Namespace) -> None:
    """``--busy``: consumers busy, key-ordered, through this kshare and (``--baseline-src``) an
    older one side by side, alternated in one run."""
    from kshare.bench.procs import ProxyProcess
    from kshare.bench.runner import Env, Options, Progress

    out = Path("/tmp/kshare-bench-keyorder")
    out.mkdir(parents=True, exist_ok=True)
    env = Env(Options(out=out), Progress())
    proxies: dict[str, ProxyProcess] = {}
    try:
        upstream = env.upstream()
        proxies["this"] = env.proxy()
        if args.baseline_src:
            base = ProxyProcess(upstream, log_path=out / "kshare-baseline.log",
                                env={"PYTHONPATH": str(Path(args.baseline_src).resolve())})
            base.cwd = Path(args.baseline_src).resolve()  # ``python -m`` puts the working directory first
            base.start(180)
            proxies["baseline"] = base
        figures: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for r in range(args.repeats):
            order = list(proxies.items()) if r % 2 == 0 else list(reversed(proxies.items()))
            for name, _ in order:
                for ordering in args.orderings.split(","):
                    midway = partial(_restart, proxies, name) if args.kill else None
                    busy, rate = busy_consumers(proxies[name].bootstrap, upstream, args.records, ordering,
                                                keys=args.keys, max_work_ms=args.max_work_ms, midway=midway)
                    figures.setdefault((name, ordering), []).append((busy, rate))
                    print(f"  run {r + 1} {name} {ordering}: {busy:.2f} busy, {rate:,.0f} rec/s", file=sys.stderr)
        print()
        print(f"| 8 explicit consumers, 1 partition, {args.records:,} records, {args.keys} keys, "
              f"0-{args.max_work_ms:g} ms per record | consumers busy (median) | records/s (median) |")
        print("| --- | ---: | ---: |")
        for (name, ordering), xs in figures.items():
            print(f"| {name}, ordering={ordering} | {statistics.median(b for b, _ in xs):.2f} | "
                  f"{statistics.median(r for _, r in xs):,.0f} |")
    finally:
        for name, proxy in proxies.items():
            if name != "this" or args.kill:
                proxy.stop()
        env.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--records", type=int, default=4000)
    ap.add_argument("--keys", type=int, default=20, help="distinct keys end to end (default 20)")
    ap.add_argument("--work-ms", type=float, default=2.0, help="processing per record end to end (default 2)")
    ap.add_argument("--no-e2e", action="store_true", help="the engine figures only")
    ap.add_argument("--busy", action="store_true",
                    help="consumers busy instead: explicit-mode consumers, 0..--max-work-ms of work a record")
    ap.add_argument("--max-work-ms", type=float, default=4.0, help="--busy: most work a record (default 4)")
    ap.add_argument("--orderings", default="key", help="--busy: comma-separated, of key and none (default key)")
    ap.add_argument("--kill", action="store_true",
                    help="--busy: SIGKILL the proxy once a third of the records are processed, and restart it")
    ap.add_argument("--baseline-src", help="--busy: also through the kshare whose sources are here "
                    "(a directory holding kshare/ and protocol_specs/, e.g. from git archive)")
    args = ap.parse_args()
    if args.busy:
        busy_main(args)
        return

    print("| engine | µs per record (acquire + accept) | vs unordered |")
    print("| --- | ---: | ---: |")
    base = min(engine_cost(None) for _ in range(args.repeats))
    print(f"| unordered | {base:.2f} | 1.00 |")
    for n in (20, 10_000):
        cost = min(engine_cost(n) for _ in range(args.repeats))
        print(f"| key-ordered, {n:,} keys | {cost:.2f} | {cost / base:.1f} |")
    if args.no_e2e:
        return

    from kshare.bench.runner import Env, Options, Progress

    out = Path("/tmp/kshare-bench-keyorder")
    out.mkdir(parents=True, exist_ok=True)
    env = Env(Options(out=out), Progress())
    try:
        proxy = env.proxy()
        rates: dict[str, list[float]] = {"none": [], "key": []}
        for r in range(args.repeats):
            for ordering in (("none", "key") if r % 2 == 0 else ("key", "none")):
                rate = end_to_end(proxy.bootstrap, env.upstream(), args.records, ordering, keys=args.keys,
                                  work_ms=args.work_ms)
                rates[ordering].append(rate)
                print(f"  run {r + 1} {ordering}: {rate:,.0f} rec/s", file=sys.stderr)
        none, key = statistics.median(rates["none"]), statistics.median(rates["key"])
        print()
        print(f"| 8 consumers, 1 partition, {args.keys} keys, {args.work_ms:g} ms per record | records/s (median) |")
        print("| --- | ---: |")
        print(f"| unordered | {none:,.0f} |")
        print(f"| key-ordered | {key:,.0f} |")
        print(f"| ratio key-ordered / unordered | {key / none:.2f} |")
    finally:
        env.close()


if __name__ == "__main__":
    main()
