"""The ``security`` scenario of ``kshare bench`` (run only when named): what TLS and authorization cost.

Two kshare proxies in front of the fronted cluster, started the same way except that one serves TLS on
its listeners (a throwaway self-signed certificate made with the ``openssl`` command line tool). In one
run, alternating (plain, tls, tls, plain, ...) over the repeats, medians reported with tls / plain:

* pass-through: a confluent-kafka Producer writes ``records`` values of ``value_size`` bytes through the
  proxy, then a Consumer assigned to every partition reads them back;
* share consumption: one ShareConsumer (implicit acknowledgement) reads the same topic as a fresh
  share group.

Authorization check (the plaintext proxy): kshare asks the cluster, on the client's own connection,
whether the client may describe the group before answering ShareGroupDescribe
(kshare/share/authorization.py). ``checks`` times, a fresh connection sends ShareGroupDescribe twice:
the first answer includes the question to the cluster (cold), the second uses the cached answer.
Reported: median and p90 of each, and their difference, the cost of one check.

(Was ``benchmarks/bench_security.py``.)
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...protocol import messages
from ...protocol.codes import ApiKey
from .. import clients
from ..format import fmt_num, fmt_ratio, fmt_size, table
from ..procs import ProxyProcess
from .common import UPSTREAM, alternate, median, pct, scenario

if TYPE_CHECKING:
    from ..runner import Env, Progress

CONFIGS = ("plain", "tls")
WORKLOADS = (("produce", "pass-through produce"), ("consume", "pass-through consume"),
             ("share", "share consumption (1 ShareConsumer)"))
SIZES = (
    {"records": 300_000, "value_size": 1024, "partitions": 4, "checks": 300},
    {"records": 30_000, "value_size": 1024, "partitions": 4, "checks": 50},
)


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A P-256 key and a self-signed certificate for 127.0.0.1 and localhost (the clients trust it as
    their CA)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("the security scenario needs the openssl command line tool")
    cert, key = directory / "server.pem", directory / "server.key"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
         "-subj", "/O=kshare bench/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )
    return cert, key


def produce(conf: dict[str, Any], topic: str, records: int, size: int, partitions: int) -> float:
    from confluent_kafka import Producer

    p = Producer({**conf, "linger.ms": 10, "batch.size": 1_000_000, "queue.buffering.max.messages": 2_000_000,
                  "queue.buffering.max.kbytes": 4_000_000, "error_cb": clients._quiet})
    value = b"x" * size
    t0 = time.perf_counter()
    for i in range(records):
        p.produce(topic, value, partition=i % partitions)
        if i % 10_000 == 0:
            p.poll(0)
    if p.flush(120):
        raise RuntimeError(f"{topic}: records left unsent after 120 s")
    return time.perf_counter() - t0


def consume(conf: dict[str, Any], topic: str, records: int, partitions: int, timeout: float = 300.0) -> float:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    c = Consumer({**conf, "group.id": f"bench-sec-{uuid.uuid4().hex[:6]}", "enable.auto.commit": False,
                  "fetch.max.bytes": 52_428_800, "error_cb": clients._quiet})
    try:
        c.list_topics(topic, timeout=10)
        n = 0
        t0 = time.perf_counter()
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        while n < records:
            if time.perf_counter() - t0 > timeout:
                raise TimeoutError(f"{topic}: {n} of {records} records consumed in {timeout:.0f} s")
            n += sum(1 for m in c.consume(10_000, 1.0) if m.error() is None)
        return time.perf_counter() - t0
    finally:
        c.close()


def consume_share(conf: dict[str, Any], topic: str, records: int, timeout: float = 300.0) -> float:
    from confluent_kafka import ShareConsumer
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    group = f"bench-sec-{uuid.uuid4().hex[:8]}"
    # through the proxy under test, over its listener (TLS or not): each proxy keeps its own group configs
    admin = AdminClient({**conf, "error_cb": clients._quiet})
    entry = ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[entry])
    for fut in admin.incremental_alter_configs([resource]).values():
        fut.result(30)
    c = ShareConsumer({**conf, "group.id": group, "error_cb": clients._quiet, "log_level": 3})
    c.subscribe([topic])
    n = 0
    t0 = time.perf_counter()
    try:
        while n < records:
            if time.perf_counter() - t0 > timeout:
                raise TimeoutError(f"{topic}: {n} of {records} records share-consumed in {timeout:.0f} s")
            n += sum(1 for m in c.poll(1.0) if m.error() is None)
        return time.perf_counter() - t0
    finally:
        c.close()


async def check_latency(bootstrap: str, checks: int) -> tuple[list[float], list[float]]:
    """ms of the first and of the second ShareGroupDescribe on each of ``checks`` fresh connections."""
    describe = messages.message_class("ShareGroupDescribeRequest")
    cold: list[float] = []
    warm: list[float] = []
    for i in range(checks):
        conn = await clients.connect(bootstrap, "bench-authz")
        try:
            version = conn.best_version(ApiKey.SHARE_GROUP_DESCRIBE)
            body = describe(group_ids=[f"bench-authz-{i % 7}"])
            for out in (cold, warm):
                t0 = time.perf_counter()
                await conn.request(ApiKey.SHARE_GROUP_DESCRIBE, version, body)
                out.append((time.perf_counter() - t0) * 1000)
        finally:
            await conn.close()
    return cold, warm


def run(env: Env, progress: Progress, *, records: int, value_size: int, partitions: int, checks: int,
        repeats: int) -> dict[str, Any]:
    upstream = env.upstream()
    tls_dir = Path(tempfile.mkdtemp(prefix="kshare-bench-tls-"))
    cert, key = self_signed(tls_dir)
    out = env.options.out
    proxies = {
        "plain": ProxyProcess(upstream, env.proxy_args, name="kshare-plain", log_path=out / "kshare-security-plain.log"),
        "tls": ProxyProcess(upstream, [*env.proxy_args, "--tls-cert", str(cert), "--tls-key", str(key)],
                            name="kshare-tls", log_path=out / "kshare-security-tls.log"),
    }
    # plain, tls, tls, plain; tls, plain, plain, tls; ...
    order = [c for r in range(repeats) for c in (alternate(CONFIGS, r) + alternate(CONFIGS, r + 1))]
    progress.begin("security", 2 + len(order) + 1)
    samples: list[dict[str, Any]] = []
    notes: list[str] = []
    try:
        for name, proxy in proxies.items():
            proxy.start(180)
            progress.step(f"{name} proxy at {proxy.bootstrap}")
        confs = {"plain": {"bootstrap.servers": proxies["plain"].bootstrap},
                 "tls": {"bootstrap.servers": proxies["tls"].bootstrap, "security.protocol": "SSL",
                         "ssl.ca.location": str(cert)}}
        for config in order:
            topic = clients.create_topic(upstream, f"bench-sec-{config}-{uuid.uuid4().hex[:6]}", partitions)
            try:
                conf = confs[config]
                p = produce(conf, topic, records, value_size, partitions)
                c = consume(conf, topic, records, partitions)
                s = consume_share(conf, topic, records)
            finally:
                clients.delete_topic(upstream, topic)
            samples.append({"config": config, "produce": records / p, "consume": records / c, "share": records / s})
            progress.step(f"{config}: produce {records / p:,.0f}, consume {records / c:,.0f}, "
                          f"share {records / s:,.0f} rec/s")
        cold, warm = asyncio.run(check_latency(proxies["plain"].bootstrap, checks))
        progress.step(f"authorization check: {median(cold) - median(warm):.2f} ms")
    finally:
        for proxy in proxies.values():
            proxy.stop()
            notes += proxy.notes()
        shutil.rmtree(tls_dir, ignore_errors=True)
    progress.end()
    rows = []
    for workload, label in WORKLOADS:
        plain = median([s[workload] for s in samples if s["config"] == "plain"])
        tls = median([s[workload] for s in samples if s["config"] == "tls"])
        rows.append({"workload": label, "plain_rps": plain, "tls_rps": tls, "tls_vs_plain": tls / plain,
                     "plain_mbps": plain * value_size / 1e6, "tls_mbps": tls * value_size / 1e6})
    cold.sort()
    warm.sort()
    check = {"cold_p50_ms": median(cold), "cold_p90_ms": pct(cold, 0.9), "warm_p50_ms": median(warm),
             "warm_p90_ms": pct(warm, 0.9), "cost_ms": median(cold) - median(warm)}
    return {
        "config": {"records": records, "value_size": value_size, "partitions": partitions, "checks": checks,
                   "repeats": repeats},
        "rows": rows,
        "authorization": check,
        "samples": samples,
        "targets": [],  # figures for the docs: TLS costs what the encryption costs
        "proxy_log_notes": notes,
    }


def section(res: dict[str, Any]) -> list[str]:
    cfg = res.get("config", {})
    out = [
        f"{fmt_num(cfg.get('records'))} x {fmt_size(cfg.get('value_size', 1024))} records over "
        f"{cfg.get('partitions', '?')} partitions through two kshare proxies, one with plaintext listeners, one "
        f"with TLS ones; {cfg.get('repeats', '?')} repeat(s) alternated, medians.",
        "",
    ]
    out += table(
        ["workload", "plaintext rec/s (MB/s)", "TLS rec/s (MB/s)", "TLS / plaintext"],
        [[r["workload"], f"{fmt_num(r['plain_rps'])} ({fmt_num(r['plain_mbps'], 1)})",
          f"{fmt_num(r['tls_rps'])} ({fmt_num(r['tls_mbps'], 1)})", fmt_ratio(r["tls_vs_plain"])]
         for r in res.get("rows", [])],
    )
    a = res.get("authorization", {})
    out += ["", f"Authorization check ({fmt_num(cfg.get('checks'))} fresh connections, ShareGroupDescribe twice "
            "each):", ""]
    out += table(
        ["", "median ms", "p90 ms"],
        [["first request (asks the cluster)", fmt_num(a.get("cold_p50_ms"), 2), fmt_num(a.get("cold_p90_ms"), 2)],
         ["second request (cached answer)", fmt_num(a.get("warm_p50_ms"), 2), fmt_num(a.get("warm_p90_ms"), 2)],
         ["the check's cost", fmt_num(a.get("cost_ms"), 2), ""]],
    )
    return out + [""]


SCENARIO = scenario(
    __name__, "What TLS listeners and the authorization check cost",
    needs=frozenset({UPSTREAM}),
    opt_in=True,  # figures for the docs (docs: security), not a regression watch
)
