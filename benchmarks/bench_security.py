"""What TLS and authorization cost: kshare with plaintext listeners against kshare with TLS ones, and
the latency an authorization check adds to a share-group RPC.

Run by hand (not in CI), from the repository root with the project's venv:

    python benchmarks/bench_security.py            # 300,000 x 1 KiB records, 3 rounds
    python benchmarks/bench_security.py --quick    # a smoke run

One Apache Kafka 3.9.2 broker; two kshare proxies in front of it, started the same way except that
one serves TLS on its listeners (a throwaway CA and certificate from ``tests/tls.py``). In one run,
alternating (plain, tls, tls, plain, ...) over ``--rounds`` rounds, medians reported with tls/plain:

* pass-through: a confluent-kafka Producer writes ``--records`` values of ``--size`` bytes through
  the proxy, then a Consumer assigned to every partition reads them back;
* share consumption: one ShareConsumer (implicit acknowledgement) reads the same topic as a fresh
  share group.

Authorization check (the plaintext proxy): kshare asks the cluster, on the client's own
connection, whether the client may describe the group before answering ShareGroupDescribe
(kshare/share/authorization.py). ``--checks`` times, a fresh connection sends ShareGroupDescribe
twice: the first answer includes the question to the cluster (cold), the second uses the cached
answer. Reported: median and p90 of each, and their difference, the cost of one check.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_proxy import Child  # noqa: E402
from tests.brokers import KAFKA_3, KafkaBroker, free_port  # noqa: E402
from tests.tls import make_tls  # noqa: E402


def _quiet(*_: object) -> None:
    pass


def start_kshare(upstream: str, *extra: str) -> tuple[Child, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "kshare", "proxy", "--upstream", upstream, "--port", str(port),
           "--broker-port-base", "0", "--state-topic", f"__kshare_bench_{uuid.uuid4().hex[:8]}",
           "--state-topic-partitions", "1", *extra]
    return Child("kshare", cmd, r"share state loaded").start(120), f"127.0.0.1:{port}"


def produce(conf: dict, topic: str, records: int, size: int, partitions: int) -> float:
    from confluent_kafka import Producer

    p = Producer({**conf, "linger.ms": 10, "batch.size": 1_000_000, "queue.buffering.max.messages": 2_000_000,
                  "queue.buffering.max.kbytes": 4_000_000, "error_cb": _quiet})
    value = b"x" * size
    t0 = time.perf_counter()
    for i in range(records):
        p.produce(topic, value, partition=i % partitions)
        if i % 10_000 == 0:
            p.poll(0)
    assert p.flush(120) == 0
    return time.perf_counter() - t0


def consume(conf: dict, topic: str, records: int, partitions: int) -> float:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    c = Consumer({**conf, "group.id": f"b-{uuid.uuid4().hex[:6]}", "enable.auto.commit": False,
                  "fetch.max.bytes": 52_428_800, "error_cb": _quiet})
    try:
        c.list_topics(topic, timeout=10)
        n = 0
        t0 = time.perf_counter()
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        while n < records:
            n += sum(1 for m in c.consume(10_000, 1.0) if m.error() is None)
        return time.perf_counter() - t0
    finally:
        c.close()


def consume_share(conf: dict, topic: str, records: int) -> float:
    from confluent_kafka import ShareConsumer
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    group = f"bench-sec-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({**conf, "error_cb": _quiet})
    entry = ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)
    for fut in admin.incremental_alter_configs([ConfigResource(ResourceType.GROUP, group,
                                                               incremental_configs=[entry])]).values():
        fut.result(30)
    c = ShareConsumer({**conf, "group.id": group, "error_cb": _quiet, "log_level": 3})
    c.subscribe([topic])
    n = 0
    t0 = time.perf_counter()
    try:
        while n < records:
            n += sum(1 for m in c.poll(1.0) if m.error() is None)
        return time.perf_counter() - t0
    finally:
        c.close()


async def check_latency(bootstrap: str, checks: int) -> tuple[list[float], list[float]]:
    from kshare.client import KafkaConnection
    from kshare.protocol import messages

    host, _, port = bootstrap.rpartition(":")
    describe = messages.message_class("ShareGroupDescribeRequest")
    cold, warm = [], []
    for i in range(checks):
        conn = await KafkaConnection.open(host, int(port), "bench-authz")
        try:
            version = conn.best_version(77)
            body = describe(group_ids=[f"bench-authz-{i % 7}"])
            for out in (cold, warm):
                t0 = time.perf_counter()
                await conn.request(77, version, body)
                out.append((time.perf_counter() - t0) * 1000)
        finally:
            await conn.close()
    return cold, warm


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=300_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--checks", type=int, default=300)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "security")
    args = ap.parse_args(argv)
    if args.quick:
        args.records, args.rounds, args.checks = 30_000, 1, 50
    tls = make_tls(Path(tempfile.mkdtemp(prefix="kshare-bench-tls-")))
    broker = KafkaBroker(KAFKA_3).start()
    children: list[Child] = []
    try:
        plain, plain_bs = start_kshare(broker.bootstrap)
        children.append(plain)
        secure, secure_bs = start_kshare(broker.bootstrap, "--tls-cert", str(tls.server_cert),
                                         "--tls-key", str(tls.server_key))
        children.append(secure)
        confs = {"plain": {"bootstrap.servers": plain_bs},
                 "tls": {"bootstrap.servers": secure_bs, "security.protocol": "SSL",
                         "ssl.ca.location": str(tls.ca_cert)}}
        results: dict[str, dict[str, list[float]]] = {c: {"produce": [], "consume": [], "share": []} for c in confs}
        order = []
        for r in range(args.rounds):
            order += ["plain", "tls", "tls", "plain"] if r % 2 == 0 else ["tls", "plain", "plain", "tls"]
        for config in order:
            topic = f"bench-sec-{config}-{uuid.uuid4().hex[:6]}"
            broker.create_topic(topic, args.partitions)
            conf = confs[config]
            p = produce(conf, topic, args.records, args.size, args.partitions)
            c = consume(conf, topic, args.records, args.partitions)
            s = consume_share(conf, topic, args.records)
            for k, v in (("produce", p), ("consume", c), ("share", s)):
                results[config][k].append(args.records / v)
            print(f"  {config:>5}: produce {args.records / p:>9,.0f} rec/s  consume {args.records / c:>9,.0f} rec/s  "
                  f"share {args.records / s:>9,.0f} rec/s  load {os.getloadavg()[0]:.1f}", flush=True)
        cold, warm = asyncio.run(check_latency(plain_bs, args.checks))
    finally:
        for child in children:
            child.stop()
        broker.close()

    mb = args.size / 1e6
    lines = [f"# Security costs ({args.records:,} x {args.size} B records, {args.partitions} partitions, "
             f"{args.rounds} rounds alternated, medians; load average at the end {os.getloadavg()[0]:.1f})", "",
             "| workload | plaintext listeners rec/s (MB/s) | TLS listeners rec/s (MB/s) | TLS / plaintext |",
             "| --- | ---: | ---: | ---: |"]
    for k, name in (("produce", "pass-through produce"), ("consume", "pass-through consume"),
                    ("share", "share consumption (1 ShareConsumer)")):
        a, b = statistics.median(results["plain"][k]), statistics.median(results["tls"][k])
        lines.append(f"| {name} | {a:,.0f} ({a * mb:.1f}) | {b:,.0f} ({b * mb:.1f}) | {b / a:.2f} |")
    lines += ["", f"Authorization check ({args.checks} fresh connections, ShareGroupDescribe twice each):", "",
              "| | median ms | p90 ms |", "| --- | ---: | ---: |",
              f"| first request (asks the cluster) | {statistics.median(cold):.2f} | {pct(cold, 0.9):.2f} |",
              f"| second request (cached answer) | {statistics.median(warm):.2f} | {pct(warm, 0.9):.2f} |",
              f"| the check's cost | {statistics.median(cold) - statistics.median(warm):.2f} | |"]
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    if not args.quick:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "security.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
