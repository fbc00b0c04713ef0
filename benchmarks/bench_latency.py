"""End-to-end latency soak: one producer at 1,000 single-record batches/s, one ShareConsumer.

Run by hand (not in CI), from the repository root with the project's venv (``pip install -e
'.[bench]'`` adds matplotlib for the plot):

    python benchmarks/bench_latency.py                  # 600 s each: kshare on Kafka 3.9, native Kafka 4.4
    python benchmarks/bench_latency.py --seconds 120 --tansu      # and kshare on its embedded Tansu
    python benchmarks/bench_latency.py --kshare-src /tmp/kshare-old --label before   # another checkout
    python benchmarks/bench_latency.py --plot-only --label after --compare benchmarks/results/latency/before.json

Systems (each started by the script, loopback only):

* ``kshare``: ``python -m kshare proxy`` (its own process) in front of Apache Kafka 3.9.2;
* ``native``: Apache Kafka 4.4.0 with its own share groups;
* ``tansu`` (``--tansu``): ``python -m kshare proxy`` without ``--upstream``, i.e. kshare with its
  embedded in-memory Tansu broker.

Per system, two processes (multiprocessing, spawn, so neither shares a GIL with anything): a
confluent-kafka ``Producer`` (``linger.ms`` 0, ``batch.num.messages`` 1: every record its own
batch and ProduceRequest, acks=all) sending ``--rate`` records a second on a fixed schedule to a
fresh 1-partition topic, each record carrying its sequence number and its send time
(``CLOCK_MONOTONIC``, comparable across processes), and one confluent-kafka ``ShareConsumer``
(implicit acknowledgement) of a fresh share group (``share.auto.offset.reset`` earliest,
``share.heartbeat.interval.ms`` 500) stamping each record with the time ``poll()`` returned it.
Clients of the kshare systems bootstrap from kshare (producer included), as deployed clients do.

First ``--warmup`` seconds (default 30) of the same load on a topic and group of their own, not
measured: a freshly started broker JVM compiles its hot paths under load and answers in seconds
meanwhile (native Kafka 4.4 as much as Kafka 3.9 behind kshare; ``--warmup 0`` shows it). The
measured topic, group and kshare's cache for them start fresh. Then the producer sends a probe
record every 50 ms until the consumer got one (the group join and the share-partition's
initialisation are not measured), and the producer runs for ``--seconds``. Latency = receive
time - send time of a record, grouped by send time into ``--window`` second windows; reported per
window: median, p99, max and records not received. After the producer stops, the consumer gets up
to ``--drain-seconds`` to receive what is left.

``--mode alternate`` (default) runs one system after the other, each with only its own broker
(and kshare) started: on a 2-core machine the two JVMs, kshare and four client processes side by
side are more than the cores, and the latencies then measure the overload (native Kafka 4.4
itself went to seconds that way). ``--mode concurrent`` runs them side by side, so that every
window of every system sees the same background load, for machines with cores to spare.

Output, in ``--outdir`` (default benchmarks/results/latency/): ``<label>.md`` (the table),
``<label>.json`` (windows, summary, configuration, machine, kshare CPU) and ``<label>.png``
(median and p99 per window over time; ``--compare`` adds the kshare lines of an earlier run's
JSON), ``<label>.kshare*.log`` (kshare's output), with ``--py-spy`` a profile of kshare.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing as mp
import os
import queue
import signal
import statistics
import struct
import subprocess
import sys
import time
import uuid
from array import array
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from bench_proxy import _cpu_seconds, _py_spy, collapse_report, machine_info  # noqa: E402

from tests.brokers import KAFKA_3, KAFKA_4, KafkaBroker, free_port  # noqa: E402

HEARTBEAT_MS = 500
KSHARE_LIMITS = ["group.share.min.heartbeat.interval.ms=100", "group.share.min.session.timeout.ms=1000"]
KAFKA4_CONFIG = {"group.share.min.heartbeat.interval.ms": 100, "group.share.min.session.timeout.ms": 1000}
MAX_SECONDS = 4 * 3600  # bounds: no soak longer than this, no rate above MAX_RATE
MAX_RATE = 20_000
STRAGGLE_S = 60.0  # a producer still behind schedule this long after the end stops there
_VALUE = struct.Struct(">qq")  # sequence number (-1: probe), send time (ns, CLOCK_MONOTONIC)
LABELS = {"kshare": "kshare on Kafka 3.9", "native": "native Kafka 4.4", "tansu": "kshare on embedded Tansu"}
COLORS = {"kshare": "tab:blue", "native": "tab:green", "tansu": "tab:orange"}


def _quiet(*_: object) -> None:
    pass


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


# --------------------------------------------------------------------------------------------
# kshare as its own process


class KshareProcess:
    """``python -m kshare proxy`` on a free port, its output kept in a file."""

    def __init__(self, name: str, upstream: str | None, logfile: Path, src: Path | None) -> None:
        self.name = name
        self.port = free_port()
        self.logfile = logfile
        cmd = [sys.executable, "-m", "kshare", "proxy", "--port", str(self.port), "--broker-port-base", "0",
               "--state-topic", f"__kshare_bench_{uuid.uuid4().hex[:8]}", "--state-topic-partitions", "1"]
        if upstream:
            cmd += ["--upstream", upstream]
        for limit in KSHARE_LIMITS:
            cmd += ["--group-limit", limit]
        env = dict(os.environ)
        cwd = ROOT
        if src is not None:
            # another checkout's kshare (e.g. a "before" worktree): only its code on the path
            env["PYTHONPATH"] = str(src)
            env["PYTHONSAFEPATH"] = "1"
            cwd = src
        self._out = open(logfile, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=self._out, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                     start_new_session=True)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited at start:\n{self.logfile.read_text()[-4000:]}")
            if "share state loaded" in self.logfile.read_text():
                return
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} not ready in {timeout:.0f} s:\n{self.logfile.read_text()[-4000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._out.close()


def start_systems(stack: contextlib.ExitStack, names: list[str], label: str, outdir: Path,
                  src: Path | None) -> list[System]:
    """Brokers and kshare processes of the named systems, stopped when ``stack`` closes."""
    systems: list[System] = []
    kshares: list[KshareProcess] = []
    for name in names:
        if name == "kshare":
            k3 = stack.enter_context(KafkaBroker(KAFKA_3))
            ks = KshareProcess("kshare", k3.bootstrap, outdir / f"{label}.kshare.log", src)
        elif name == "native":
            k4 = stack.enter_context(KafkaBroker(KAFKA_4, share_groups=True, config=KAFKA4_CONFIG))
            systems.append(System("native", k4.bootstrap))
            continue
        else:
            ks = KshareProcess("tansu", None, outdir / f"{label}.kshare-tansu.log", src)
        stack.callback(ks.stop)
        kshares.append(ks)
        systems.append(System(name, ks.bootstrap, ks))
    for ks in kshares:
        ks.wait_ready()
    return systems


def start_py_spy(ks: KshareProcess, raw: Path, seconds: float) -> tuple[Path, subprocess.Popen]:
    """py-spy (100 Hz, raw collapsed stacks) on kshare for ``seconds`` (a duration, not a signal:
    a background job may ignore SIGINT)."""
    spy = _py_spy()
    if spy is None:
        raise SystemExit("--py-spy: py-spy is not installed (pip install py-spy)")
    return raw, subprocess.Popen([spy, "record", "--pid", str(ks.pid), "--rate", "100", "--format", "raw",
                                  "--output", str(raw), "--nonblocking", "--duration", str(int(seconds))],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def finish_py_spy(raw: Path, pr: subprocess.Popen) -> None:
    with contextlib.suppress(subprocess.TimeoutExpired):
        pr.wait(120)
    if pr.poll() is None:
        pr.kill()
    if raw.exists():
        raw.with_suffix(".report.txt").write_text(collapse_report(raw.read_text(), 40) + "\n")
        print(f"py-spy: {raw.with_suffix('.report.txt')}", flush=True)


def set_group_configs(bootstrap: str, group: str, configs: dict[str, object]) -> None:
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    entries = [ConfigEntry(k, str(v), incremental_operation=AlterConfigOpType.SET) for k, v in configs.items()]
    client = AdminClient({"bootstrap.servers": bootstrap, "error_cb": _quiet})
    deadline = time.monotonic() + 60
    while True:
        try:
            for fut in client.incremental_alter_configs(
                    [ConfigResource(ResourceType.GROUP, group, incremental_configs=entries)]).values():
                fut.result(30)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def create_topic(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    client = AdminClient({"bootstrap.servers": bootstrap, "error_cb": _quiet})
    client.create_topics([NewTopic(topic, 1, 1)])[topic].result(60)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # until the leader is known
        md = client.list_topics(topic, timeout=10)
        t = md.topics.get(topic)
        if t is not None and t.error is None and t.partitions and t.partitions[0].leader >= 0:
            return
        time.sleep(0.2)
    raise TimeoutError(f"topic {topic} has no leader")


# --------------------------------------------------------------------------------------------
# the clients (each in its own process)


def _producer(bootstrap: str, topic: str, rate: float, seconds: float, size: int, go, t0, out) -> None:
    """Probes until ``go``; then ``rate`` records a second from ``t0`` for ``seconds``."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "batch.num.messages": 1, "acks": "all",
                  "error_cb": _quiet, "log_level": 3})
    pad = b"." * max(0, size - _VALUE.size)
    while not go.is_set():
        p.produce(topic, _VALUE.pack(-1, time.monotonic_ns()) + pad, partition=0)
        p.poll(0)
        go.wait(0.05)
    start = t0.value
    total = int(rate * seconds)
    sent = array("q")  # send times not yet reported, in sequence order
    lag_max = 0.0
    last_push = time.monotonic()
    stop_at = start + seconds + STRAGGLE_S  # a broker that cannot take the rate does not hold the run
    i = 0
    while i < total and time.monotonic() < stop_at:
        due = start + i / rate
        now = time.monotonic()
        if now < due:
            time.sleep(due - now)
        else:
            lag_max = max(lag_max, now - due)
        ns = time.monotonic_ns()
        try:
            p.produce(topic, _VALUE.pack(i, ns) + pad, partition=0)
        except BufferError:
            p.poll(0.01)
            continue
        sent.append(ns)
        i += 1
        p.poll(0)
        if ns / 1e9 - last_push >= 1.0:
            out.put(("sent", sent.tobytes()))
            sent = array("q")
            last_push = ns / 1e9
    out.put(("sent", sent.tobytes()))
    left = p.flush(30)
    out.put(("done", i, lag_max, left))


def _consumer(bootstrap: str, topic: str, group: str, poll_s: float, ready, stop, out) -> None:
    """Polls until ``stop``; pushes (sequence, send ns, receive ns) triples twice a second."""
    from confluent_kafka import ShareConsumer

    c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group, "error_cb": _quiet, "log_level": 3})
    c.subscribe([topic])
    got = array("q")
    last_push = time.monotonic()
    unpack = _VALUE.unpack_from
    try:
        while not stop.is_set():
            msgs = c.poll(poll_s)
            now = time.monotonic_ns()
            for m in msgs:
                if m.error() is not None:
                    continue
                seq, ns = unpack(m.value())
                if seq < 0:
                    ready.set()
                    continue
                got.extend((seq, ns, now))
            if now / 1e9 - last_push >= 0.5 and got:
                out.put(("got", got.tobytes()))
                got = array("q")
                last_push = now / 1e9
    finally:
        if got:
            out.put(("got", got.tobytes()))
        with contextlib.suppress(Exception):
            c.close()
        out.put(("closed",))


# --------------------------------------------------------------------------------------------
# one system under test


@dataclass
class System:
    name: str
    bootstrap: str
    kshare: KshareProcess | None = None
    topic: str = ""
    group: str = ""
    procs: list = field(default_factory=list)
    go: object = None
    ready: object = None
    stop: object = None
    t0: object = None
    out: object = None
    sent: array = field(default_factory=lambda: array("q"))
    sent_count: int = 0
    t0_ns: int = 0
    window: float = 10.0
    seen: set[int] = field(default_factory=set)  # sequence numbers received
    latencies: dict[int, list[float]] = field(default_factory=dict)  # window -> latencies (ms)
    duplicates: int = 0
    producer_done: bool = False
    producer_lag_max: float = 0.0
    unflushed: int = 0
    consumer_closed: bool = False
    cpu: list[tuple[float, float]] = field(default_factory=list)  # (monotonic, kshare CPU seconds)

    def drain(self) -> None:
        while True:
            try:
                msg = self.out.get_nowait()
            except queue.Empty:
                return
            kind = msg[0]
            if kind == "got":
                a = array("q")
                a.frombytes(msg[1])
                for k in range(0, len(a), 3):
                    if a[k] in self.seen:
                        self.duplicates += 1
                        continue
                    self.seen.add(a[k])
                    w = int((a[k + 1] - self.t0_ns) / 1e9 // self.window)
                    self.latencies.setdefault(w, []).append((a[k + 2] - a[k + 1]) / 1e6)
            elif kind == "sent":
                self.sent.frombytes(msg[1])
                self.sent_count = len(self.sent)
            elif kind == "done":
                self.producer_lag_max, self.unflushed = msg[2], msg[3]
                self.producer_done = True
            elif kind == "closed":
                self.consumer_closed = True

    def sample_cpu(self) -> None:
        if self.kshare is not None:
            with contextlib.suppress(OSError):
                self.cpu.append((time.monotonic(), _cpu_seconds(self.kshare.pid)))


def prepare(ctx, system: System, args, seconds: float) -> None:
    system.topic = f"bench-latency-{system.name}-{uuid.uuid4().hex[:8]}"
    system.group = f"bench-latency-{uuid.uuid4().hex[:8]}"
    create_topic(system.bootstrap, system.topic)
    set_group_configs(system.bootstrap, system.group, {"share.auto.offset.reset": "earliest",
                                                       "share.heartbeat.interval.ms": HEARTBEAT_MS})
    system.go, system.ready, system.stop = ctx.Event(), ctx.Event(), ctx.Event()
    system.t0 = ctx.Value("d", 0.0)
    system.out = ctx.Queue()
    system.procs = [
        ctx.Process(target=_consumer, args=(system.bootstrap, system.topic, system.group, args.poll_timeout,
                                            system.ready, system.stop, system.out), daemon=True),
        ctx.Process(target=_producer, args=(system.bootstrap, system.topic, args.rate, seconds, args.value_size,
                                            system.go, system.t0, system.out), daemon=True),
    ]
    for pr in system.procs:
        pr.start()


def window_stats(system: System, t0_ns: int, window: float, upto: float | None = None) -> list[dict]:
    """Per window (by send time): sent, received, median/p99/max latency in ms."""
    lat = system.latencies
    sent: dict[int, int] = {}
    for ns in system.sent:
        w = int((ns - t0_ns) / 1e9 // window)
        sent[w] = sent.get(w, 0) + 1
    n_windows = max([*lat, *sent, -1]) + 1
    if upto is not None:
        n_windows = min(n_windows, int(upto // window))
    rows = []
    for w in range(max(n_windows, 0)):
        xs = sorted(lat.get(w, []))
        row = {"start_s": w * window, "end_s": (w + 1) * window, "sent": sent.get(w), "received": len(xs)}
        if xs:
            row.update(median_ms=round(statistics.median(xs), 3), p99_ms=round(_pct(xs, 0.99), 3),
                       max_ms=round(xs[-1], 3))
        rows.append(row)
    return rows


def _pct(sorted_xs: list[float], q: float) -> float:
    return sorted_xs[min(len(sorted_xs) - 1, max(0, math.ceil(q * len(sorted_xs)) - 1))]


def cpu_per_window(system: System, t0: float, window: float, n: int) -> list[float | None]:
    """kshare's CPU share (of one core) per window."""
    out: list[float | None] = []
    for w in range(n):
        a, b = t0 + w * window, t0 + (w + 1) * window
        inside = [(t, c) for t, c in system.cpu if a - 0.6 <= t <= b + 0.6]
        if len(inside) < 2 or inside[-1][0] - inside[0][0] < window / 2:
            out.append(None)
        else:
            out.append(round((inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0]), 3))
    return out


def run(systems: list[System], args, ctx, seconds: float, label: str = "") -> float:
    """Start the systems' clients (fresh topics and groups), run for ``seconds``, drain; returns t0
    (monotonic seconds)."""
    for s in systems:
        prepare(ctx, s, args, seconds)
    deadline = time.monotonic() + 180
    for s in systems:
        while not s.ready.wait(0.5):
            s.drain()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{s.name}: the share consumer got no record in 180 s")
            if not all(pr.is_alive() for pr in s.procs):
                raise RuntimeError(f"{s.name}: a client process died")
    t0 = time.monotonic() + 1.0
    for s in systems:
        s.drain()  # probes only
        s.t0.value = t0
        s.t0_ns, s.window = int(t0 * 1e9), args.window
        s.go.set()
    print(f"{label}clock starts: {', '.join(s.name for s in systems)} at {args.rate:g} records/s for {seconds:g} s; "
          f"load {load()}", flush=True)
    t0_ns = int(t0 * 1e9)
    next_report = t0 + args.window + 1.0
    end = t0 + seconds
    while True:
        time.sleep(0.5)
        for s in systems:
            s.drain()
            s.sample_cpu()
        now = time.monotonic()
        if now >= next_report and next_report <= end + 1.0:
            w = int((next_report - 1.0 - t0) // args.window) - 1
            parts = []
            for s in systems:
                rows = window_stats(s, t0_ns, args.window, upto=(w + 1) * args.window)
                row = rows[w] if w < len(rows) else {}
                med, p99 = row.get("median_ms"), row.get("p99_ms")
                cpu = cpu_per_window(s, t0, args.window, w + 1)[w] if s.kshare else None
                parts.append(f"{s.name} " + (f"med {med:7.2f} p99 {p99:8.2f} ms" if med is not None else "no records")
                             + f" ({row.get('received', 0):>5}/{s.sent_count})"
                             + (f" cpu {cpu:.0%}" if cpu is not None else ""))
            print(f"{label}[{(w + 1) * args.window:5.0f} s] " + " | ".join(parts) + f" | load {load()}", flush=True)
            next_report += args.window
        if now >= next_report and next_report > end + 1.0:
            next_report = float("inf")
        if now >= end and all(s.producer_done for s in systems):
            break
        if now > end + STRAGGLE_S + 60:
            print(f"{label}a producer did not finish: " + ", ".join(
                f"{s.name} sent {s.sent_count:,} of {int(args.rate * seconds):,}" for s in systems), flush=True)
            break
    # drain: until every record sent arrived, or --drain-seconds
    drain_end = time.monotonic() + args.drain_seconds
    while time.monotonic() < drain_end:
        for s in systems:
            s.drain()
        if all(len(s.seen) >= len(s.sent) for s in systems):
            break
        time.sleep(0.2)
    for s in systems:
        s.stop.set()
    for s in systems:
        end_wait = time.monotonic() + 60
        while not s.consumer_closed and time.monotonic() < end_wait:
            s.drain()
            time.sleep(0.2)
        for pr in s.procs:
            pr.join(10)
            if pr.is_alive():
                pr.kill()
        s.drain()
    return t0


# --------------------------------------------------------------------------------------------
# report


def summary(rows: list[dict]) -> dict:
    meds = [r["median_ms"] for r in rows if "median_ms" in r]
    p99s = [r["p99_ms"] for r in rows if "p99_ms" in r]
    if not meds:
        return {}
    return {"median_of_window_medians_ms": round(statistics.median(meds), 3), "min_window_median_ms": min(meds),
            "max_window_median_ms": max(meds), "median_of_window_p99_ms": round(statistics.median(p99s), 3),
            "max_window_p99_ms": max(p99s)}


def table(results: dict, names: list[str]) -> str:
    head = "| window (s) | " + " | ".join(f"{n} median ms | {n} p99 ms" for n in names) + " |"
    sep = "| ---: | " + " | ".join("---: | ---:" for _ in names) + " |"
    lines = [head, sep]
    n = max(len(results[name]["windows"]) for name in names)
    for w in range(n):
        cells = []
        start = end = None
        for name in names:
            rows = results[name]["windows"]
            r = rows[w] if w < len(rows) else {}
            start, end = r.get("start_s", start), r.get("end_s", end)
            missing = (r.get("sent") or 0) - r.get("received", 0)
            mark = f" ({missing} lost)" if missing > 0 else ""
            cells.append(f"{r['median_ms']:.2f}{mark} | {r['p99_ms']:.2f}" if "median_ms" in r else "- | -")
        lines.append(f"| {start:g}-{end:g} | " + " | ".join(cells) + " |")
    lines += ["", "| system | median of window medians | max window median | median of window p99 | max window p99 "
              "| received / sent | duplicates | kshare CPU (mean) |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name in names:
        r = results[name]
        s = r["summary"]
        cpus = [c for c in r.get("kshare_cpu", []) if c is not None]
        cpu = f"{statistics.mean(cpus):.0%}" if cpus else "-"
        if s:
            lines.append(f"| {LABELS.get(name, name)} | {s['median_of_window_medians_ms']:.2f} ms "
                         f"| {s['max_window_median_ms']:.2f} ms | {s['median_of_window_p99_ms']:.2f} ms "
                         f"| {s['max_window_p99_ms']:.2f} ms | {r['received']:,} / {r['sent']:,} "
                         f"| {r['duplicates']} | {cpu} |")
    return "\n".join(lines)


def plot(results: dict, names: list[str], path: Path, title: str, compare: dict | None = None) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[bench]'): no plot", flush=True)
        return False
    fig, ax = plt.subplots(figsize=(8, 4.6), dpi=80)
    for name in names:
        rows = [r for r in results[name]["windows"] if "median_ms" in r]
        xs = [(r["start_s"] + r["end_s"]) / 2 for r in rows]
        color = COLORS.get(name)
        ax.plot(xs, [r["median_ms"] for r in rows], "-", color=color, label=f"{LABELS.get(name, name)} median")
        ax.plot(xs, [r["p99_ms"] for r in rows], "--", color=color, alpha=0.7, label=f"{LABELS.get(name, name)} p99")
    if compare is not None:
        tag = compare.get("label", "earlier")
        for name, res in compare["results"].items():
            if name == "native":
                continue  # the reference system once is enough
            rows = [r for r in res["windows"] if "median_ms" in r]
            xs = [(r["start_s"] + r["end_s"]) / 2 for r in rows]
            color = COLORS.get(name)
            ax.plot(xs, [r["median_ms"] for r in rows], ":", color=color, lw=1.2,
                    label=f"{LABELS.get(name, name)} median, {tag}")
            ax.plot(xs, [r["p99_ms"] for r in rows], ":", color=color, lw=0.8, alpha=0.5,
                    label=f"{LABELS.get(name, name)} p99, {tag}")
    ax.set_yscale("log")
    ax.set_xlabel("seconds since the producer started (send time)")
    ax.set_ylabel("end-to-end latency (ms)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def write_report(args, names: list[str], info: dict, results: dict, load_before: str, started: float,
                 outdir: Path, compare: dict | None) -> bool:
    """<label>.json, .md and .png of the systems measured so far; whether a plot was written."""
    done = [n for n in names if n in results]
    config = {"seconds": args.seconds, "warmup": args.warmup, "rate": args.rate, "value_size": args.value_size,
              "window": args.window, "mode": args.mode, "systems": done, "poll_timeout": args.poll_timeout,
              "command": " ".join([Path(sys.executable).name, *sys.argv])}
    report = {"config": config, "machine": info, "load_before": load_before, "load_after": load(),
              "elapsed_s": round(time.monotonic() - started, 1), "results": results}
    (outdir / f"{args.label}.json").write_text(json.dumps(report, indent=1) + "\n")
    (outdir / f"{args.label}.md").write_text(
        f"{config['command']}\n\nmode {args.mode}, {args.rate:g} records/s of {args.value_size} B for "
        f"{args.seconds:g} s, load {load_before} -> {report['load_after']}\n\n{table(results, done)}\n")
    return plot(results, done, outdir / f"{args.label}.png", plot_title(config, info), compare)


def plot_title(config: dict, info: dict) -> str:
    return (f"{config['rate']:g} single-record batches/s, one ShareConsumer, {config['seconds']:g} s, "
            f"{config['mode']}; kshare {info.get('kshare_commit', '')}")


def load_compare(path: str | None, label: str | None) -> dict | None:
    if not path:
        return None
    report = json.loads(Path(path).read_text())
    report["label"] = label or Path(path).stem
    return report


# --------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=600.0, help="soak length (default 600)")
    parser.add_argument("--rate", type=float, default=1000.0, help="records (= batches) per second (1000)")
    parser.add_argument("--value-size", type=int, default=100, help="bytes per record value (100)")
    parser.add_argument("--window", type=float, default=10.0, help="seconds per reported window (10)")
    parser.add_argument("--warmup", type=float, default=30.0,
                        help="seconds of the same load on other topics and groups first, not measured "
                             "(the brokers' JVMs warm up; default 30)")
    parser.add_argument("--systems", default="kshare,native", help="of kshare, native, tansu (default kshare,native)")
    parser.add_argument("--tansu", action="store_true", help="add kshare on its embedded Tansu broker")
    parser.add_argument("--mode", choices=["concurrent", "alternate"], default="alternate",
                        help="systems one after the other (default) or side by side")
    parser.add_argument("--poll-timeout", type=float, default=1.0, help="ShareConsumer.poll timeout, seconds")
    parser.add_argument("--drain-seconds", type=float, default=30.0)
    parser.add_argument("--outdir", default=str(ROOT / "benchmarks" / "results" / "latency"))
    parser.add_argument("--label", default="latency", help="name of the output files (default latency)")
    parser.add_argument("--kshare-src", default=None,
                        help="run kshare from this checkout (e.g. a git worktree of an older commit)")
    parser.add_argument("--py-spy", action="store_true", help="record kshare with py-spy during the soak")
    parser.add_argument("--compare", default=None, help="JSON of an earlier run: its kshare lines go into the plot")
    parser.add_argument("--compare-label", default=None, help="what to call the earlier run in the plot")
    parser.add_argument("--plot-only", action="store_true",
                        help="no run: plot <outdir>/<label>.json (with --compare) into <label>.png")
    args = parser.parse_args(argv)
    names = [n for n in args.systems.split(",") if n]
    if args.tansu and "tansu" not in names:
        names.append("tansu")
    if not set(names) <= set(LABELS) or not names:
        parser.error(f"--systems: of {', '.join(LABELS)}")
    if not 0 < args.seconds <= MAX_SECONDS or not 0 < args.rate <= MAX_RATE or args.window <= 0:
        parser.error(f"--seconds in (0, {MAX_SECONDS}], --rate in (0, {MAX_RATE}], --window > 0")
    outdir = Path(args.outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    compare = load_compare(args.compare, args.compare_label)
    if args.plot_only:
        report = json.loads((outdir / f"{args.label}.json").read_text())
        plotted = plot(report["results"], list(report["results"]), outdir / f"{args.label}.png",
                       plot_title(report["config"], report["machine"]), compare)
        print(f"written: {outdir / (args.label + '.png')}" if plotted else "no plot")
        return 0 if plotted else 1
    src = Path(args.kshare_src).resolve() if args.kshare_src else None
    ctx = mp.get_context("spawn")

    info = machine_info()
    if src is not None:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=src).stdout.strip()
        info["kshare_commit"] = f"{commit} ({src})" if commit else str(src)
    print("machine:", info, flush=True)
    print(f"load before: {load()}", flush=True)
    started = time.monotonic()
    results: dict[str, dict] = {}
    load_before = load()
    groups = [names] if args.mode == "concurrent" else [[n] for n in names]
    for group_names in groups:
        # in alternate mode each system's broker (and kshare) runs only during its own turn
        with contextlib.ExitStack() as stack:
            group = start_systems(stack, group_names, args.label, outdir, src)
            try:
                if args.warmup:
                    # the same load on topics and groups of its own, so the brokers' JVMs are
                    # compiled and warm; the measured topic, group and kshare's cache start fresh
                    run([System(s.name, s.bootstrap, s.kshare) for s in group], args, ctx, args.warmup,
                        "warm-up ")
                spies = [start_py_spy(s.kshare, outdir / f"{args.label}.{s.name}.pyspy.txt", args.seconds + 10)
                         for s in group if args.py_spy and s.kshare is not None]
                t0 = run(group, args, ctx, args.seconds)
            except (TimeoutError, RuntimeError) as exc:
                print(f"{', '.join(group_names)}: {exc}", flush=True)
                for s in group:
                    results[s.name] = {"label": LABELS[s.name], "windows": [], "summary": {}, "sent": 0,
                                       "received": 0, "duplicates": 0, "error": str(exc), "kshare_cpu": []}
            else:
                t0_ns = int(t0 * 1e9)
                for s in group:
                    windows = window_stats(s, t0_ns, args.window, upto=args.seconds)
                    cpu = cpu_per_window(s, t0, args.window, len(windows)) if s.kshare else []
                    for w, c in zip(windows, cpu, strict=False):
                        w["kshare_cpu"] = c
                    results[s.name] = {"label": LABELS[s.name], "windows": windows, "summary": summary(windows),
                                       "sent": len(s.sent), "received": len(s.seen), "duplicates": s.duplicates,
                                       "producer_lag_max_ms": round(s.producer_lag_max * 1000, 3),
                                       "unflushed": s.unflushed, "kshare_cpu": cpu}
                for raw, pr in spies:
                    finish_py_spy(raw, pr)
        # written after every turn: a later system that fails does not lose the earlier ones
        plotted = write_report(args, names, info, results, load_before, started, outdir, compare)
    load_after = load()
    text = table(results, names)
    print(f"\nload {load_before} -> {load_after}; {time.monotonic() - started:.0f} s in all\n")
    print(text)
    print(f"\nwritten: {outdir / (args.label + '.json')}, .md" + (", .png" if plotted else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
