"""What key-ordered sharing (``kshare.share.ordering=key``) costs, run by hand (not in CI).

    /tmp/ci1/.venv/bin/python benchmarks/bench_key_order.py [--repeats 3] [--records 4000]

1. The engine alone (no I/O): CPU µs per record of acquire + accept cycles of 500-record
   batches, unordered against key-ordered with 20 and with 10,000 distinct keys.
2. End to end, through a kshare proxy process in front of Apache Kafka 3.9 (started as
   ``kshare bench`` starts them): one partition, ``--records`` records with ``--keys`` keys (20;
   100-byte values, 10 records per producer batch), 8 confluent ShareConsumers each "processing"
   every record for ``--work-ms`` (2 ms); the group unordered and key-ordered, alternated,
   ``--repeats`` times each.
   Prints records/s and the ordered/unordered ratio (medians).

Ratios are what to read: the machine is shared and absolute figures move by +-30 %.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import threading
import time
import uuid
from array import array
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--records", type=int, default=4000)
    ap.add_argument("--keys", type=int, default=20, help="distinct keys end to end (default 20)")
    ap.add_argument("--work-ms", type=float, default=2.0, help="processing per record end to end (default 2)")
    ap.add_argument("--no-e2e", action="store_true", help="the engine figures only")
    args = ap.parse_args()

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
