"""Scale-out: several kshare proxies as one service (``--instance-group``) in front of Apache Kafka 3.9.

Run by hand (not in CI), from the repository root with the project's venv:

    python benchmarks/bench_scale_out.py            # the full run (about 15-20 minutes on 2 cores)
    python benchmarks/bench_scale_out.py --quick    # a smoke run (a few minutes; results go to a temp dir)
    python benchmarks/bench_scale_out.py --only throughput --rounds 5
    python benchmarks/bench_scale_out.py --only failover --timeouts 6000

One Apache Kafka 3.9.2 broker starts in the script (``tests.brokers``). Every proxy is a subprocess
(``python -m kshare proxy --instance-group NAME --instance-session-timeout-ms MS --metrics-port M``,
a fresh instance group and state topic per run), so its CPU time can be read from /proc and it can be
SIGKILLed. A service of N proxies is "settled" once every proxy's ``/ready`` is ready with the same
``ownership_epoch`` and their ``state_partitions`` split the state topic's partitions. Clients
bootstrap from all proxies (``127.0.0.1:p1,127.0.0.1:p2,...``); the share group gets
``share.auto.offset.reset=earliest`` and ``share.heartbeat.interval.ms=500`` through the proxies
(IncrementalAlterConfigs on the GROUP resource). Which proxy leads which partition comes from
Metadata (``AdminClient.list_topics``): virtual node id = slot * 2**20 + broker id, and each proxy's
per-broker listener port is known (``--broker-port-base``), so a leader maps to its proxy.

Part 1, throughput (``--only throughput``): ``--records`` values of ``--size`` bytes over
``--partitions`` partitions, produced beforehand straight to Kafka (large producer batches), read
by ``--consumers`` confluent-kafka ``ShareConsumer`` processes (implicit acknowledgement) through
1, 2 and 3 proxies, a fresh share group each time. Configurations alternate (1,2,3,3,2,1,...) for
``--rounds`` rounds; medians are reported, and ratios against 1 proxy. Clock: from the consumers'
first ``poll()`` (all start together, the group join included) to the last record; first record to
last record too. CPU: utime+stime of every proxy process from /proc/<pid>/stat over that window,
per million records, in total and per proxy (the split), with the broker's and the consumers' CPU
for context. On 2 cores the total throughput cannot scale with proxies (they, the broker and the
consumers share the same 2 cores): the CPU split is the measured part, and "N proxies on N cores"
is a paper model from it (stated as such in the report). Every run checks that each record was
read (distinct partition/offset pairs = records).

Part 2, failover (``--only failover``): 3 proxies, ``--fo-consumers`` ShareConsumers (threads) in
explicit mode acknowledging every record (ACCEPT, then ``commit_sync``, as
tests/integration/test_crash_recovery.py's AckingConsumer), for each state variant and session
timeout (``--timeouts``):

* first unthrottled until the variant's number of records is acknowledged (this builds the state),
* then throttled to ``--fo-rate`` records/s in total for ``--fo-pre`` seconds (the baseline; the data
  is produced in batches of ``--fo-batch`` records, since kshare hands out whole producer batches),
* then one proxy is SIGKILLed: the proxy coordinating the share group if it leads a data partition,
  else the one leading most of them (the report says which); for ``small`` once more killing the
  proxy leading most partitions that is not the coordinator,
* the run goes on until the survivors logged their take-over and then ``--fo-post`` seconds more.

Reported per run: kill -> the survivors' "took over state partition(s)" line (read from their
output); kill -> the first record of a partition the killed proxy led *that was then acknowledged
successfully* (so it came from the new owner; records librdkafka had fetched from the killed proxy
before the kill may still be handed out, and their acknowledgements fail: "first delivery" is shown
too); kill -> steady again (the start of the first 0.5 s bucket from which 2 s of buckets in a row
each run at >= 90 % of the pre-kill total rate, with the killed proxy's partitions at >= 50 % of
their pre-kill rate); the lowest total rate (0.5 s bucket) in between; what the survivors replayed (state records and bytes, share-partitions
and groups, replay seconds, from their logs); redeliveries, and any record delivered again after its
acknowledgement was confirmed (must be none). Variants (``--variants``):

* ``small``: 12 partitions, 50,000 records acknowledged before the kill;
* ``large``: 12 partitions, 500,000 records acknowledged before the kill;
* ``many``:  ``--many-partitions`` (480) partitions, i.e. many share-partitions to replay.

Results: ``--outdir`` (default benchmarks/results/scale-out/; with --quick a temp directory):
``scale-out.md`` (tables), ``scale-out.json`` (raw), and PNG plots when matplotlib is importable.
The load average is printed with every run; the machine may be shared.
"""

from __future__ import annotations

import argparse
import array
import atexit
import contextlib
import json
import multiprocessing as mp
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from bench_proxy import _cpu_seconds, machine_info  # noqa: E402
from bench_proxy import produce as produce_fast  # noqa: E402

from tests.brokers import KAFKA_3, KafkaBroker, free_port  # noqa: E402

HEARTBEAT_MS = 500
LIMITS = ["group.share.min.heartbeat.interval.ms=100", "group.share.min.session.timeout.ms=1000"]
SLOT_SHIFT = 20  # virtual node id = slot * 2**20 + upstream broker id


def _quiet(*_: object) -> None:
    pass


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def say(*args: object) -> None:
    print(*args, flush=True)


# --------------------------------------------------------------------------------------------
# kshare proxies as subprocesses (every one started is registered, so every one is stopped)

_STARTED: list[subprocess.Popen] = []


def _cleanup() -> None:
    for proc in _STARTED:
        if proc.poll() is None:
            with contextlib.suppress(Exception):
                proc.kill()
                proc.wait(10)


atexit.register(_cleanup)


class ProxyProc:
    """One ``python -m kshare proxy`` of an instance group; its output is kept with the monotonic
    time each line was read."""

    def __init__(self, upstream: str, broker_id: int, state_topic: str, state_partitions: int, group: str | None,
                 session_ms: int, name: str) -> None:
        self.name = name
        self.port = free_port()
        self.broker_port = free_port()
        self.metrics_port = free_port()
        self.cmd = [sys.executable, "-m", "kshare", "proxy", "--upstream", upstream, "--port", str(self.port),
                    "--broker-port-base", str(self.broker_port - broker_id), "--state-topic", state_topic,
                    "--state-topic-partitions", str(state_partitions), "--metrics-port", str(self.metrics_port)]
        if group is not None:
            self.cmd += ["--instance-group", group, "--instance-session-timeout-ms", str(session_ms)]
        for limit in LIMITS:
            self.cmd += ["--group-limit", limit]
        self.proc: subprocess.Popen | None = None
        self.lines: list[tuple[float, str]] = []
        self.killed_at: float | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> ProxyProc:
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        _STARTED.append(self.proc)
        threading.Thread(target=self._drain, daemon=True, name=f"drain-{self.name}").start()
        return self

    def _drain(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line))

    def text(self) -> str:
        return "".join(line for _, line in self.lines)

    def ready(self) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/ready", timeout=2) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as exc:  # 503 while not ready: the body still says why
            with contextlib.suppress(Exception):
                return json.loads(exc.read())
            return None
        except Exception:  # noqa: BLE001 - not listening yet
            return None

    def cpu(self) -> float:
        try:
            return _cpu_seconds(self.pid)
        except OSError:
            return float("nan")

    def kill(self) -> None:
        assert self.proc is not None
        self.killed_at = time.monotonic()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def notes(self) -> list[str]:
        """Lines worth a look: tracebacks, errors, warnings."""
        return [line for _, line in self.lines
                if "Traceback" in line or " ERROR " in line or " WARNING " in line or line.startswith(("  File",))]


def start_service(k3: KafkaBroker, n: int, session_ms: int, state_partitions: int,
                  timeout: float = 120.0) -> list[ProxyProc]:
    """N proxies of a fresh instance group (fresh state topic), started together; returns once settled.
    ``n == 0``: one proxy without --instance-group (the single-proxy mode, as a reference)."""
    plain = n == 0
    n = max(n, 1)
    tag = uuid.uuid4().hex[:8]
    state_topic = f"__kshare_bench_so_{tag}"
    proxies = [ProxyProc(k3.bootstrap, k3.node_id, state_topic, state_partitions, None if plain else f"bench-so-{tag}", session_ms,
                         f"proxy{i}") for i in range(n)]
    for p in proxies:
        p.start()
    t0 = time.monotonic()
    try:
        while True:
            for p in proxies:
                if p.proc is not None and p.proc.poll() is not None:
                    raise RuntimeError(f"{p.name} exited:\n{p.text()[-4000:]}")
            st = [p.ready() for p in proxies]
            if plain and st[0] and st[0].get("ready"):
                return proxies
            if all(s and s.get("ready") for s in st):
                epochs = {s["ownership_epoch"] for s in st}  # type: ignore[index]
                owned = [q for s in st for q in s["state_partitions"]]  # type: ignore[index]
                if len(epochs) == 1 and sorted(owned) == list(range(state_partitions)):
                    return proxies
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"{n} proxies not settled in {timeout:.0f} s: {st}\n{proxies[0].text()[-3000:]}")
            time.sleep(0.2)
    except BaseException:
        for p in proxies:
            p.stop()
        raise


def bootstrap_of(proxies: list[ProxyProc]) -> str:
    return ",".join(p.bootstrap for p in proxies if p.killed_at is None)


def leaders(proxies: list[ProxyProc], topic: str) -> dict[int, tuple[int, str]]:
    """partition -> (proxy slot, proxy name) from Metadata through the proxies."""
    from confluent_kafka.admin import AdminClient

    by_port = {p.broker_port: p.name for p in proxies}
    if len(proxies) == 1:  # without an instance group node ids are the broker's
        return {q: (0, proxies[0].name) for q in range(_partitions(proxies[0].bootstrap, topic))}
    client = AdminClient({"bootstrap.servers": bootstrap_of(proxies), "error_cb": _quiet})
    md = client.list_topics(topic, timeout=20)
    out = {}
    for pid, pm in md.topics[topic].partitions.items():
        b = md.brokers[pm.leader]
        out[pid] = (pm.leader >> SLOT_SHIFT, by_port.get(b.port, f"?{b.host}:{b.port}"))
    return out


def _partitions(bootstrap: str, topic: str) -> int:
    from confluent_kafka.admin import AdminClient

    md = AdminClient({"bootstrap.servers": bootstrap, "error_cb": _quiet}).list_topics(topic, timeout=20)
    return len(md.topics[topic].partitions)


def share_group(bootstrap: str, group: str) -> None:
    """share.auto.offset.reset=earliest (and a 500 ms heartbeat) on the GROUP resource, through the proxies."""
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    configs = {"share.auto.offset.reset": "earliest", "share.heartbeat.interval.ms": HEARTBEAT_MS}
    entries = [ConfigEntry(k, str(v), incremental_operation=AlterConfigOpType.SET) for k, v in configs.items()]
    client = AdminClient({"bootstrap.servers": bootstrap, "error_cb": _quiet})
    for fut in client.incremental_alter_configs([ConfigResource(ResourceType.GROUP, group,
                                                                incremental_configs=entries)]).values():
        fut.result(30)


def group_coordinator(proxies: list[ProxyProc], group: str, state_partitions: int) -> str | None:
    from kshare.share.state_codec import partition_for_group

    sp = partition_for_group(group, state_partitions)
    for p in proxies:
        st = p.ready() or {}
        if sp in st.get("state_partitions", []):
            return p.name
    return None


# --------------------------------------------------------------------------------------------
# part 1: throughput and CPU with 1, 2, 3 proxies


def _consume_worker(bootstrap: str, group: str, topic: str, ready, start, stop, done, results) -> None:
    from confluent_kafka import ShareConsumer

    c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group, "error_cb": _quiet, "log_level": 3})
    c.subscribe([topic])
    keys = array.array("q")
    first = last = None
    ready.release()
    start.wait()
    try:
        while not stop.is_set():
            msgs = c.poll(0.2)
            got = 0
            for m in msgs:
                if m.error() is None:
                    keys.append((m.partition() << 40) | m.offset())
                    got += 1
            if got:
                now = time.monotonic()
                first = first if first is not None else now
                last = now
                with done.get_lock():
                    done.value += got
    finally:
        with contextlib.suppress(Exception):
            c.close()
        results.put((os.getpid(), first, last, keys.tobytes()))


@dataclass
class ThroughputRun:
    proxies: int  # 0: one proxy without an instance group
    round: int
    seconds: float  # first poll -> last record
    data_seconds: float  # first record -> last record
    records: int
    distinct: int
    delivered: int
    proxy_cpu: list[float]  # per proxy, CPU seconds over the window
    broker_cpu: float
    consumer_cpu: float
    leaders: dict[str, int]  # proxy -> data partitions it led
    idle_cpu: float  # the proxies' CPU while idle before the run, cores (CPU s per s), summed
    load_before: str
    load_after: str

    @property
    def rate(self) -> float:
        return self.records / self.seconds

    @property
    def cpu_per_m(self) -> float:
        return sum(self.proxy_cpu) / self.records * 1e6


def _proc_cpu(pid: int) -> float:
    try:
        return _cpu_seconds(pid)
    except OSError:
        return 0.0


def throughput_run(k3: KafkaBroker, n: int, rnd: int, topic: str, records: int, consumers: int,
                   state_partitions: int, timeout: float) -> ThroughputRun:
    before = load()
    proxies = start_service(k3, n, 10_000, state_partitions)
    ctx = mp.get_context("spawn")
    procs: list[Any] = []
    try:
        boot = bootstrap_of(proxies)
        lead = leaders(proxies, topic)
        split = {p.name: sum(1 for _, name in lead.values() if name == p.name) for p in proxies}
        group = f"bench-so-{uuid.uuid4().hex[:8]}"
        share_group(boot, group)
        i0, ti = [p.cpu() for p in proxies], time.monotonic()
        time.sleep(2.0)
        idle = sum(p.cpu() - a for p, a in zip(proxies, i0, strict=True)) / (time.monotonic() - ti)
        ready, start, stop = ctx.Semaphore(0), ctx.Event(), ctx.Event()
        done, results = ctx.Value("q", 0), ctx.Queue()
        procs = [ctx.Process(target=_consume_worker, args=(boot, group, topic, ready, start, stop, done, results),
                             daemon=True) for _ in range(consumers)]
        for pr in procs:
            pr.start()
        for _ in procs:
            if not ready.acquire(timeout=60):
                raise TimeoutError("consumers not ready")
        cpu0 = [p.cpu() for p in proxies]
        b0 = _proc_cpu(k3.pid) if k3.pid else 0.0
        c0 = sum(_proc_cpu(pr.pid) for pr in procs)
        t0 = time.monotonic()
        start.set()
        deadline = t0 + timeout
        while done.value < records:
            if time.monotonic() > deadline:
                raise TimeoutError(f"read {done.value} of {records} through {n} proxies")
            time.sleep(0.005)
        t1 = time.monotonic()
        cpu1 = [p.cpu() for p in proxies]
        b1 = _proc_cpu(k3.pid) if k3.pid else 0.0
        c1 = sum(_proc_cpu(pr.pid) for pr in procs)
        stop.set()
        got = [results.get(timeout=120) for _ in procs]
        for pr in procs:
            pr.join(30)
        keys: set[int] = set()
        delivered = 0
        for _, _, _, raw in got:
            a = array.array("q")
            a.frombytes(raw)
            delivered += len(a)
            keys.update(a)
        firsts = [g[1] for g in got if g[1] is not None]
        lasts = [g[2] for g in got if g[2] is not None]
        # the clock stops when the count reached ``records`` (t1): the last record is at most t1
        last = min(t1, max(lasts)) if lasts else t1
        run = ThroughputRun(n, rnd, last - t0, last - min(firsts), records, len(keys), delivered,
                            [b - a for a, b in zip(cpu0, cpu1, strict=True)], b1 - b0, c1 - c0, split, idle, before, load())
    finally:
        for pr in procs:
            if pr.is_alive():
                pr.kill()
        for p in proxies:
            p.stop()
        notes = [f"{p.name}: {line}" for p in proxies for line in p.notes()]
        if notes:
            say("  proxy log lines worth a look:\n  " + "  ".join(notes[-15:]))
    return run


def throughput_part(k3: KafkaBroker, records: int, size: int, partitions: int, consumers: int, rounds: int,
                    state_partitions: int, counts: list[int]) -> list[ThroughputRun]:
    topic = f"bench-so-{size}-{uuid.uuid4().hex[:8]}"
    k3.create_topic(topic, partitions)
    secs = produce_fast(k3.bootstrap, topic, records, size, partitions)
    say(f"produced {records:,} x {size} B to {partitions} partitions in {secs:.1f} s; load {load()}")
    runs = []
    for r in range(rounds):
        for n in (counts if r % 2 == 0 else list(reversed(counts))):
            run = throughput_run(k3, n, r, topic, records, consumers, state_partitions, timeout=600)
            runs.append(run)
            split = " ".join(f"{c:.1f}" for c in run.proxy_cpu)
            say(f"  round {r} {_label(n)}: {run.rate:>9,.0f} rec/s ({run.seconds:.2f} s; first->last record "
                f"{records / run.data_seconds:,.0f} rec/s) | proxy CPU {sum(run.proxy_cpu):.1f} s "
                f"[{split}] = {run.cpu_per_m:.1f} s/M | broker {run.broker_cpu:.1f} s, consumers "
                f"{run.consumer_cpu:.1f} s | idle proxies {run.idle_cpu:.0%} | leaders {run.leaders} | distinct {run.distinct:,}/{records:,}, "
                f"delivered {run.delivered:,} | load {run.load_before} -> {run.load_after}")
            if run.distinct != records:
                say(f"  !! {records - run.distinct} record(s) never read")
    with contextlib.suppress(Exception):
        k3.delete_topic(topic)
    return runs


def _label(n: int) -> str:
    return "1 proxy, no instance group" if n == 0 else f"{n} proxy(ies)"


def throughput_tables(runs: list[ThroughputRun], counts: list[int]) -> tuple[str, dict[int, dict[str, float]]]:
    med: dict[int, dict[str, float]] = {}
    for n in counts:
        rs = [r for r in runs if r.proxies == n]
        shares = [sorted((c / sum(r.proxy_cpu) for c in r.proxy_cpu), reverse=True) for r in rs]
        med[n] = {
            "rate": statistics.median(r.rate for r in rs),
            "data_rate": statistics.median(r.records / r.data_seconds for r in rs),
            "cpu_per_m": statistics.median(r.cpu_per_m for r in rs),
            "max_share": statistics.median(s[0] for s in shares),
            "broker_per_m": statistics.median(r.broker_cpu / r.records * 1e6 for r in rs),
            "consumer_per_m": statistics.median(r.consumer_cpu / r.records * 1e6 for r in rs),
            "idle": statistics.median(r.idle_cpu for r in rs),
            "runs": len(rs),
        }
        for i in range(max(n, 1)):
            med[n][f"share{i}"] = statistics.median(s[i] for s in shares)
    base = med[1] if 1 in med else med[counts[0]]
    lines = ["| proxies | runs | records/s (first poll -> last) | vs 1 proxy | records/s (first -> last record) "
             "| proxy CPU s / M records (all proxies) | vs 1 proxy | per-proxy CPU split (busiest first) "
             "| broker CPU s / M | consumers CPU s / M | proxies idle (cores) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |"]
    for n in counts:
        m = med[n]
        split = " / ".join(f"{m[f'share{i}']:.0%}" for i in range(max(n, 1)))
        lines.append(f"| {_label(n)} | {m['runs']} | {m['rate']:,.0f} | {m['rate'] / base['rate']:.2f} | {m['data_rate']:,.0f} "
                     f"| {m['cpu_per_m']:.1f} | {m['cpu_per_m'] / base['cpu_per_m']:.2f} | {split} "
                     f"| {m['broker_per_m']:.1f} | {m['consumer_per_m']:.1f} | {m['idle']:.2f} |")
    lines += ["", "Model, not a measurement: N proxies on N cores of their own, each proxy CPU-bound. The "
              "proxies need C_N CPU seconds per million records in total (measured above with N proxies) "
              "and the busiest carries a share s_max of it, so the proxy tier saturates at "
              "1e6 / (C_N x s_max) records/s (the busiest proxy's core full); the broker and the "
              "consumers are assumed not to be the limit.", "",
              "| proxies (cores) | C_N s / M | s_max | per-proxy CPU s / M (busiest) | proxy-bound ceiling rec/s "
              "| vs 1 proxy |", "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    ceil1 = 1e6 / (base["cpu_per_m"] * base["max_share"])
    for n in counts:
        if n == 0:
            continue
        m = med[n]
        ceiling = 1e6 / (m["cpu_per_m"] * m["max_share"])
        lines.append(f"| {n} | {m['cpu_per_m']:.1f} | {m['max_share']:.2f} | {m['cpu_per_m'] * m['max_share']:.1f} "
                     f"| {ceiling:,.0f} | {ceiling / ceil1:.2f} |")
    return "\n".join(lines), med


# --------------------------------------------------------------------------------------------
# part 2: failover


@dataclass
class Ledger:
    deliveries: list[tuple[float, int, int, int, int]] = field(default_factory=list)  # t, consumer, p, offset, count
    confirmed: dict[tuple[int, int], float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    commit_errors: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    poll_errors: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    refused: int = 0


class Throttle:
    """Records/s per consumer once set (None: as fast as it goes)."""

    def __init__(self) -> None:
        self.rate: float | None = None
        self.since = 0.0

    def set(self, rate: float | None) -> None:
        self.since = time.monotonic()
        self.rate = rate


def _err_name(exc: Any) -> str:
    err = exc.args[0] if exc.args else exc
    name = getattr(err, "name", None)
    return name() if callable(name) else type(exc).__name__


class AckingConsumer:
    """A ShareConsumer in explicit mode in a thread: poll, record, ACCEPT all, commit_sync (as
    tests/integration/test_crash_recovery.py's)."""

    def __init__(self, index: int, bootstrap: str, group: str, topic: str, ledger: Ledger, throttle: Throttle,
                 max_poll: int) -> None:
        from confluent_kafka import ShareConsumer

        self.index, self.ledger, self.throttle = index, ledger, throttle
        self.consumer = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group, "error_cb": _quiet,
                                       "log_level": 0, "share.acknowledgement.mode": "explicit",
                                       "max.poll.records": max_poll, "socket.timeout.ms": 10000})
        self.consumer.subscribe([topic])
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name=f"acking-{index}")
        self.count_since = 0
        self.error: BaseException | None = None

    def start(self) -> AckingConsumer:
        self.thread.start()
        return self

    def _run(self) -> None:
        from confluent_kafka import AcknowledgeType, KafkaException

        c, led = self.consumer, self.ledger
        since = None
        try:
            while not self._stop.is_set():
                th = self.throttle
                if th.rate is not None:
                    if since != th.since:
                        since, self.count_since = th.since, 0
                    ahead = since + self.count_since / th.rate - time.monotonic()
                    if ahead > 0:
                        time.sleep(min(ahead, 0.5))
                        continue
                try:
                    msgs = c.poll(0.2)
                except KafkaException as exc:
                    with led.lock:
                        led.poll_errors[_err_name(exc)] += 1
                    time.sleep(0.05)
                    continue
                now = time.monotonic()
                got: dict[int, list[int]] = defaultdict(list)
                for m in msgs:
                    if m.error() is not None:
                        with led.lock:
                            led.poll_errors[m.error().name()] += 1
                        continue
                    led.deliveries.append((now, self.index, m.partition(), m.offset(), m.delivery_count() or 0))
                    try:
                        c.acknowledge(m, AcknowledgeType.ACCEPT)
                    except Exception:  # noqa: BLE001 - no longer in flight on the client
                        led.refused += 1
                        continue
                    got[m.partition()].append(m.offset())
                self.count_since += sum(len(v) for v in got.values())
                if not got:
                    continue
                try:
                    res = c.commit_sync(15)
                except KafkaException as exc:
                    with led.lock:
                        led.commit_errors[_err_name(exc)] += 1
                    continue
                t = time.monotonic()
                with led.lock:
                    for tp, err in (res or {}).items():
                        if err is None and tp.partition in got:
                            for o in got[tp.partition]:
                                led.confirmed.setdefault((tp.partition, o), t)
                        elif err is not None:
                            led.commit_errors[_err_name(err)] += 1
        except BaseException as exc:  # noqa: BLE001
            self.error = exc

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        self.thread.join(30)
        with contextlib.suppress(Exception):
            self.consumer.close()


VARIANTS = {"small": (12, 50_000), "large": (12, 500_000), "many": (None, 50_000)}
TAKEOVER = re.compile(r"took over state partition\(s\) ([\d,]+) in ([\d.]+) s \((\d+) share-partition\(s\), "
                      r"(\d+) group\(s\)\)")
LOADED = re.compile(r"state topic \S+ partitions \[([\d, ]*)\] loaded in ([\d.]+) s: (\d+) share-partitions, "
                    r"(\d+) groups from (\d+) records \((\d+) bytes\)")


@dataclass
class FailoverRun:
    variant: str
    session_ms: int
    partitions: int
    acked_before: int
    killed: str
    killed_was_coordinator: bool
    killed_partitions: list[int]
    killed_state_partitions: list[int]
    pre_rate: float
    pre_killed_rate: float
    takeover_s: float | None  # kill -> the last survivor's take-over line
    takeover_lines: list[str]
    replay: dict[str, float]  # summed over the survivors' replays of the killed proxy's partitions
    first_any_s: float | None  # kill -> first delivery from a killed partition
    first_acked_s: float | None  # kill -> first delivery from a killed partition that was then acknowledged
    steady_s: float | None
    min_rate: float
    redelivered: int
    after_confirmation: int
    commit_errors: dict[str, int]
    poll_errors: dict[str, int]
    load_before: str
    load_after: str
    series: dict[str, list[float]]  # 0.5 s buckets from kill - pre: t, total, killed
    proxy_notes: list[str]


def produce_batched(bootstrap: str, topic: str, n: int, size: int, partitions: int, batch: int) -> float:
    """``n`` values of ``size`` bytes round-robin over the partitions in producer batches of at most
    ``batch`` records (kshare hands out whole batches: small ones keep the delivery rate smooth)."""
    from confluent_kafka import Producer

    errors: list[Any] = []
    prod = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.num.messages": batch, "acks": "all",
                     "queue.buffering.max.messages": 2_000_000, "compression.type": "none",
                     "error_cb": _quiet, "delivery.report.only.error": True,
                     "on_delivery": lambda err, msg: errors.append(err)})
    value = os.urandom(size)
    t0 = time.perf_counter()
    for i in range(n):
        while True:
            try:
                prod.produce(topic, value, partition=i % partitions)
                break
            except BufferError:
                prod.poll(0.05)
    left = prod.flush(300)
    if left or errors:
        raise RuntimeError(f"produce to {topic}: {left} undelivered, errors {errors[:3]}")
    return time.perf_counter() - t0


def wait_for(cond, timeout: float, what: str, step: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(step)


def failover_run(k3: KafkaBroker, variant: str, session_ms: int, partitions: int, acked: int, consumers: int,
                 rate: float, pre: float, post: float, max_poll: int, state_partitions: int,
                 victim_kind: str, batch: int) -> FailoverRun:
    before = load()
    topic = f"bench-so-fo-{uuid.uuid4().hex[:8]}"
    k3.create_topic(topic, partitions)
    extra = int(rate * (pre + session_ms / 1000 + post + 20) * 2.5)
    secs = produce_batched(k3.bootstrap, topic, acked + extra, 100, partitions, batch)
    say(f"  {variant}, session {session_ms} ms: produced {acked + extra:,} x 100 B to {partitions} partitions "
        f"(batches of {batch}) in {secs:.1f} s; load {load()}")
    proxies = start_service(k3, 3, session_ms, state_partitions)
    cons: list[AckingConsumer] = []
    ledger, throttle = Ledger(), Throttle()
    try:
        boot = bootstrap_of(proxies)
        group = f"bench-so-fo-{uuid.uuid4().hex[:8]}"
        share_group(boot, group)
        cons = [AckingConsumer(i, boot, group, topic, ledger, throttle, max_poll).start() for i in range(consumers)]
        t_build = time.monotonic()
        wait_for(lambda: len(ledger.confirmed) >= acked or any(c.error for c in cons), 900,
                 f"{acked} records acknowledged", 0.2)
        build_s = time.monotonic() - t_build
        say(f"    {len(ledger.confirmed):,} acknowledged in {build_s:.1f} s "
            f"({len(ledger.confirmed) / build_s:,.0f} rec/s); throttling to {rate:,.0f} rec/s for {pre:.0f} s")
        throttle.set(rate / consumers)
        time.sleep(pre)
        lead = leaders(proxies, topic)
        coord = group_coordinator(proxies, group, state_partitions)
        counts = defaultdict(int)
        for _, name in lead.values():
            counts[name] += 1
        victim = next((p for p in proxies if p.name == coord), None)
        if victim_kind == "other" or victim is None or counts[victim.name] == 0:
            victim = max((p for p in proxies if victim_kind != "other" or p.name != coord),
                         key=lambda p: counts[p.name])
        killed_parts = sorted(q for q, (_, name) in lead.items() if name == victim.name)
        killed_sp = sorted((victim.ready() or {}).get("state_partitions", []))
        survivors = [p for p in proxies if p is not victim]
        marks = {p.name: len(p.lines) for p in survivors}
        acked_before = len(ledger.confirmed)
        victim.kill()
        t_kill = victim.killed_at
        assert t_kill is not None
        say(f"    SIGKILL {victim.name} (group coordinator: {victim.name == coord}; led {len(killed_parts)} of "
            f"{partitions} partitions, state partitions {killed_sp}); {acked_before:,} acknowledged")
        wanted = set(killed_sp)

        def taken_over() -> bool:
            got = set()
            for p in survivors:
                for _, line in p.lines[marks[p.name]:]:
                    m = TAKEOVER.search(line)
                    if m:
                        got.update(int(x) for x in m.group(1).split(","))
            return wanted <= got

        with contextlib.suppress(TimeoutError):
            wait_for(taken_over, session_ms / 1000 + 60, "take-over")
        time.sleep(post)
        throttle_end = time.monotonic()
        for c in cons:
            c.stop()
        for c in cons:
            c.close()
        errors = [repr(c.error) for c in cons if c.error]
        if errors:
            say(f"    !! consumer errors: {errors}")
        # ---- analysis
        take_lines, take_times, replay = [], [], defaultdict(float)
        for p in survivors:
            for t, line in p.lines[marks[p.name]:]:
                m = TAKEOVER.search(line)
                if m and set(int(x) for x in m.group(1).split(",")) & wanted:
                    take_lines.append(f"{p.name} +{t - t_kill:.2f} s: {line.strip()[-160:]}")
                    take_times.append(t - t_kill)
                    replay["takeover_seconds_max"] = max(replay["takeover_seconds_max"], float(m.group(2)))
                    replay["share_partitions"] += int(m.group(3))
                    replay["groups"] += int(m.group(4))
                m = LOADED.search(line)
                if m and set(int(x) for x in m.group(1).replace(" ", "").split(",") if x) & wanted:
                    replay["replay_seconds_max"] = max(replay["replay_seconds_max"], float(m.group(2)))
                    replay["records"] += int(m.group(5))
                    replay["bytes"] += int(m.group(6))
        kp = set(killed_parts)
        dels = ledger.deliveries
        after_kill = [d for d in dels if d[0] >= t_kill and d[2] in kp]
        first_any = min((d[0] for d in after_kill), default=None)
        first_acked = min((d[0] for d in after_kill if (d[2], d[3]) in ledger.confirmed), default=None)
        step = 0.5
        t_start = t_kill - pre + 1.0  # the first second of throttling left out (ramp)
        nb = int((throttle_end - t_start) / step)
        total, killed = [0] * nb, [0] * nb
        per_consumer = [[0] * nb for _ in cons]
        for d in dels:
            i = int((d[0] - t_start) // step)
            if 0 <= i < nb:
                total[i] += 1
                per_consumer[d[1]][i] += 1
                if d[2] in kp:
                    killed[i] += 1
        k0 = int((t_kill - t_start) // step)
        pre_rate = sum(total[:k0]) / max(k0 * step, 1e-9)
        pre_killed = sum(killed[:k0]) / max(k0 * step, 1e-9)
        steady = None
        win = int(2.0 / step)
        for i in range(k0, nb - win + 1):
            if all(total[j] / step >= 0.9 * pre_rate and killed[j] / step >= 0.5 * pre_killed
                   for j in range(i, i + win)):
                steady = t_start + i * step - t_kill
                break
        end_i = k0 + int(((steady if steady is not None else (throttle_end - t_kill))) / step)
        min_rate = min((total[j] / step for j in range(k0, max(k0 + 1, min(end_i, nb)))), default=0.0)
        seen: dict[tuple[int, int], int] = defaultdict(int)
        for d in dels:
            seen[(d[2], d[3])] += 1
        redelivered = sum(1 for v in seen.values() if v > 1)
        after_conf = sum(1 for d in dels if (d[2], d[3]) in ledger.confirmed and d[0] > ledger.confirmed[(d[2], d[3])])
        run = FailoverRun(
            variant, session_ms, partitions, acked_before, victim.name, victim.name == coord, killed_parts, killed_sp,
            pre_rate, pre_killed, max(take_times) if take_times else None, take_lines, dict(replay),
            None if first_any is None else first_any - t_kill, None if first_acked is None else first_acked - t_kill,
            steady, min_rate, redelivered, after_conf, dict(ledger.commit_errors), dict(ledger.poll_errors),
            before, load(),
            {"t": [round(t_start + i * step - t_kill, 3) for i in range(nb)], "total": [x / step for x in total],
             "killed": [x / step for x in killed]}
            | {f"consumer{c}": [x / step for x in row] for c, row in enumerate(per_consumer)},
            [f"{p.name}: {line}" for p in survivors for line in p.notes()][-30:])
        say(f"    take-over +{_f(run.takeover_s)} s; first record of a killed partition +{_f(run.first_any_s)}"
            f" s, first acknowledged +{_f(run.first_acked_s)} s; steady +{_f(steady)} s (pre-kill {pre_rate:,.0f} "
            f"rec/s, {pre_killed:,.0f} from the killed partitions; lowest {min_rate:,.0f}); replayed "
            f"{int(replay['records']):,} records ({int(replay['bytes']):,} B), {int(replay['share_partitions'])} "
            f"share-partitions, {int(replay['groups'])} group(s), replay {replay['replay_seconds_max']:.2f} s; "
            f"redelivered {redelivered:,}, after confirmation {after_conf}; commit errors "
            f"{dict(ledger.commit_errors)}; load {before} -> {run.load_after}")
        for line in take_lines:
            say(f"      {line}")
        if any("Traceback" in n for n in run.proxy_notes):
            say("    !! traceback in a survivor's output:\n      " + "      ".join(run.proxy_notes))
        return run
    finally:
        for c in cons:
            c.stop()
        for c in cons:
            if c.thread.is_alive():
                c.close()
        for p in proxies:
            p.stop()
        with contextlib.suppress(Exception):
            k3.delete_topic(topic)


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def failover_table(runs: list[FailoverRun]) -> str:
    lines = ["| state | session timeout | partitions | acked before kill | killed proxy (leads / coordinator) "
             "| kill -> take-over logged | replayed: records, bytes, share-partitions, groups | replay s "
             "| kill -> first record of a killed partition (acknowledged) | kill -> steady | lowest rate / pre-kill "
             "| redelivered | delivered after confirmed |",
             "| --- | ---: | ---: | ---: | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in runs:
        rp = r.replay
        lines.append(
            f"| {r.variant} | {r.session_ms} ms | {r.partitions} | {r.acked_before:,} | "
            f"{len(r.killed_partitions)} partitions / {'yes' if r.killed_was_coordinator else 'no'} | "
            f"{_f(r.takeover_s)} s | {int(rp.get('records', 0)):,}, {int(rp.get('bytes', 0)):,} B, "
            f"{int(rp.get('share_partitions', 0))}, {int(rp.get('groups', 0))} | {rp.get('replay_seconds_max', 0):.2f} | "
            f"{_f(r.first_acked_s)} s (any: {_f(r.first_any_s)} s) | {_f(r.steady_s)} s | "
            f"{r.min_rate:,.0f} / {r.pre_rate:,.0f} | {r.redelivered:,} | {r.after_confirmation} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# plots


def plots(outdir: Path, tput: list[ThroughputRun], med: dict[int, dict[str, float]], fo: list[FailoverRun]) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # noqa: BLE001
        return []
    made = []
    if med:
        ns = sorted(med)
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
        names = ["1, no group" if n == 0 else str(n) for n in ns]
        a1.bar(names, [med[n]["rate"] for n in ns], color="tab:blue")
        a1.set_xlabel("proxies (2 cores shared)")
        a1.set_ylabel("records/s (median)")
        a1.set_title("share consumption throughput")
        bottom = [0.0] * len(ns)
        for i in range(max(ns)):
            vals = [med[n]["cpu_per_m"] * med[n].get(f"share{i}", 0.0) for n in ns]
            a2.bar(names, vals, bottom=bottom, label=f"proxy {i + 1} (busiest first)")
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
        a2.set_xlabel("proxies")
        a2.set_ylabel("proxy CPU s per million records")
        a2.set_title("proxy CPU, split per proxy")
        a2.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(outdir / "scale-out-throughput.png", dpi=110)
        plt.close(fig)
        made.append("scale-out-throughput.png")
    if fo:
        fig, axes = plt.subplots(len(fo), 1, figsize=(10, 2.4 * len(fo)), sharex=True, squeeze=False)
        for ax, r in zip(axes[:, 0], fo, strict=True):
            ax.plot(r.series["t"], r.series["total"], label="all partitions", lw=1)
            ax.plot(r.series["t"], r.series["killed"], label="the killed proxy's partitions", lw=1)
            ax.axvline(0, color="red", lw=0.8)
            if r.takeover_s is not None:
                ax.axvline(r.takeover_s, color="green", lw=0.8, ls="--")
            who = "the group coordinator" if r.killed_was_coordinator else "not the coordinator"
            ax.set_title(f"{r.variant}, session {r.session_ms} ms, killed {who}: SIGKILL at 0 (red), take-over logged (green)",
                         fontsize=9)
            ax.set_ylabel("rec/s")
        axes[0, 0].legend(fontsize=8)
        axes[-1, 0].set_xlabel("seconds from SIGKILL (0.5 s buckets)")
        fig.tight_layout()
        fig.savefig(outdir / "scale-out-failover.png", dpi=110)
        plt.close(fig)
        made.append("scale-out-failover.png")
    return made


# --------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 100,000 records, 1 round, one failover")
    parser.add_argument("--only", choices=["throughput", "failover"], default=None)
    parser.add_argument("--records", type=int, default=None, help="throughput: records (500,000)")
    parser.add_argument("--size", type=int, default=100, help="throughput: value bytes (100)")
    parser.add_argument("--partitions", type=int, default=12, help="throughput: partitions (12)")
    parser.add_argument("--consumers", type=int, default=3, help="throughput: ShareConsumer processes (3)")
    parser.add_argument("--proxies", default="0,1,2,3",
                        help="throughput: proxy counts; 0 is one proxy without --instance-group (0,1,2,3)")
    parser.add_argument("--rounds", type=int, default=None, help="throughput: rounds of 1,2,3 / 3,2,1 (3)")
    parser.add_argument("--state-partitions", type=int, default=10, help="state-topic partitions (10, the default)")
    parser.add_argument("--timeouts", default=None, help="failover: session timeouts in ms (6000,10000)")
    parser.add_argument("--variants", default=None, help="failover: small,large,many (all)")
    parser.add_argument("--many-partitions", type=int, default=480, help="failover 'many': partitions (480)")
    parser.add_argument("--fo-consumers", type=int, default=3)
    parser.add_argument("--fo-rate", type=float, default=5000.0, help="failover: records/s during the measurement")
    parser.add_argument("--fo-pre", type=float, default=6.0, help="failover: seconds of throttled load before the kill")
    parser.add_argument("--fo-post", type=float, default=10.0, help="failover: seconds after the take-over")
    parser.add_argument("--fo-max-poll", type=int, default=200, help="failover: max.poll.records")
    parser.add_argument("--fo-batch", type=int, default=50, help="failover: records per producer batch (50)")
    parser.add_argument("--outdir", default=None)
    args = parser.parse_args(argv)

    records = args.records or (200_000 if args.quick else 500_000)
    rounds = args.rounds or (1 if args.quick else 3)
    counts = [int(x) for x in args.proxies.split(",")]
    timeouts = [int(x) for x in (args.timeouts or ("6000" if args.quick else "6000,10000")).split(",")]
    variants = (args.variants or ("small" if args.quick else "small,large,many")).split(",")
    outdir = Path(args.outdir) if args.outdir else (
        Path(os.environ.get("TMPDIR", "/tmp")) / "kshare-bench-scale-out" if args.quick
        else ROOT / "benchmarks" / "results" / "scale-out")
    outdir.mkdir(parents=True, exist_ok=True)

    def stop_on_signal(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop_on_signal)
    info = machine_info()
    say("machine:", info)
    up0 = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    say("uptime:", up0)
    t_start = time.monotonic()
    tput: list[ThroughputRun] = []
    fo: list[FailoverRun] = []
    report: list[str] = []
    med: dict[int, dict[str, float]] = {}
    try:
        with KafkaBroker(KAFKA_3) as k3:
            say(f"broker: Kafka {KAFKA_3} at {k3.bootstrap} (pid {k3.pid})")
            if args.only in (None, "throughput"):
                say(f"\n== throughput: {records:,} x {args.size} B, {args.partitions} partitions, {args.consumers} "
                    f"ShareConsumer processes, proxies {counts} (0: no instance group), {rounds} round(s)")
                tput = throughput_part(k3, records, args.size, args.partitions, args.consumers, rounds,
                                       args.state_partitions, counts)
                table, med = throughput_tables(tput, counts)
                report += [f"### Throughput and CPU, 1-{max(counts)} proxies (one instance group)", "",
                           f"{records:,} records x {args.size} B over {args.partitions} partitions (produced "
                           f"beforehand), {args.consumers} ShareConsumer processes (implicit acknowledgement) "
                           f"bootstrapped from all proxies, a fresh group and service per run, "
                           f"{args.state_partitions} state partitions; configurations alternated over {rounds} "
                           f"round(s), medians. One Kafka 3.9 broker, proxies and consumers on the same 2 cores.",
                           "", table, ""]
            if args.only in (None, "failover"):
                for variant in variants:
                    parts, acked = VARIANTS[variant]
                    parts = parts or args.many_partitions
                    if args.quick:
                        acked = min(acked, 20_000)
                    plan = [(ms, "coordinator") for ms in timeouts]
                    if variant == "small":
                        plan.append((timeouts[0], "other"))
                    for ms, kind in plan:
                        say(f"\n== failover: {variant} ({parts} partitions, {acked:,} acknowledged first), session "
                            f"timeout {ms} ms, killing the {'group coordinator' if kind == 'coordinator' else 'proxy leading most partitions, not the coordinator'}")
                        fo.append(failover_run(k3, variant, ms, parts, acked, args.fo_consumers, args.fo_rate,
                                               args.fo_pre, args.fo_post, args.fo_max_poll, args.state_partitions,
                                               kind, args.fo_batch))
                report += ["### Failover: SIGKILL of one of 3 proxies under load", "",
                           f"{args.fo_consumers} ShareConsumers (explicit ACCEPT + commit_sync, max.poll.records "
                           f"{args.fo_max_poll}) bootstrapped from the 3 proxies; unthrottled until the state is "
                           f"built, then {args.fo_rate:,.0f} records/s in total for {args.fo_pre:.0f} s, then "
                           f"SIGKILL. Times from the SIGKILL. {args.state_partitions} state partitions.", "",
                           failover_table(fo), ""]
    finally:
        _cleanup()
        up1 = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
        say(f"\nuptime: {up1}\ntotal {time.monotonic() - t_start:.0f} s\n")
        raw = {"machine": info, "uptime_before": up0, "uptime_after": up1, "args": vars(args),
               "throughput": [asdict(r) | {"rate": r.rate, "cpu_per_m": r.cpu_per_m} for r in tput],
               "throughput_medians": med, "failover": [asdict(r) for r in fo]}
        (outdir / "scale-out.json").write_text(json.dumps(raw, indent=1, default=str) + "\n")
    made = plots(outdir, tput, med, fo)
    head = [f"# Scale-out benchmark ({'quick' if args.quick else 'full'} run)", "",
            "`python benchmarks/bench_scale_out.py" + (" --quick" if args.quick else "") + "`", "",
            f"Machine: {info.get('nproc')} cores, {info.get('cpu', '?')}, Python {info.get('python')}, "
            f"confluent-kafka {info.get('confluent_kafka')}, Apache Kafka {KAFKA_3}, kshare {info.get('kshare_commit')}.",
            f"Load average before: `{up0}`; after: `{up1}`.", ""]
    text = "\n".join(head + report + [f"![{m}]({m})" for m in made]) + "\n"
    (outdir / "scale-out.md").write_text(text)
    say(text)
    say(f"results in {outdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
