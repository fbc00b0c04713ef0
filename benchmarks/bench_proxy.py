"""Produce and consume throughput: direct to Apache Kafka, through a bare byte relay, through kshare.

Run by hand (not in CI), from the repository root with the project's venv:

    python benchmarks/bench_proxy.py            # 500,000 records x {100 B, 1 KiB}, 4 partitions
    python benchmarks/bench_proxy.py --quick    # a short smoke run (20,000 records, one round)

One Apache Kafka 3.9.2 broker (``tests.brokers.KafkaBroker``) serves all three configurations
in one run:

* ``direct``: the clients bootstrap from the broker's PLAINTEXT listener;
* ``relay``: the clients bootstrap from ``benchmarks/relay.py`` (asyncio on uvloop, 1 MiB reads,
  no parsing). The relay rewrites nothing, so the broker gets a second listener, RELAY, whose
  advertised address is the relay's port: metadata asked through the relay names the relay, and
  the clients stay on it. The relay forwards to that RELAY listener;
* ``kshare``: the clients bootstrap from ``python -m kshare proxy --upstream <PLAINTEXT>``.

The relay and the proxy are subprocesses, each with its own process (and interpreter); the
clients (confluent-kafka, i.e. librdkafka) run in this process. Every run uses a fresh topic of
``--partitions`` partitions: the Producer writes ``--records`` values (linger 10 ms, 1 MB
batches, a queue big enough to never block), then a Consumer assigned to every partition from
the beginning reads exactly those records back (checked with the consumer's positions).
Clocks: produce from the first ``produce()`` to the end of ``flush()``; consume from
``assign()`` to the last record (both clients have fetched metadata before the clock starts).
MB are 10^6 bytes of record values.

The configurations run in alternating order (direct, relay, kshare, kshare, relay, direct; again
``--rounds`` times) and the table reports the median per configuration, with the ratios
kshare/relay and kshare/direct, and the CPU time the relay and the proxy process used per run.

Afterwards (unless ``--profile none``) a second proxy runs under a profiler (``cprofile``:
``python -m cProfile -m kshare proxy``; ``py-spy``: ``py-spy record`` attached to it, if py-spy
is installed) while the consumer reads ``--profile-passes`` times through it, and the top
functions are printed.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import io
import json
import os
import platform
import pstats
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.brokers import KAFKA_3, KafkaBroker, free_port  # noqa: E402

CONFIGS = ("direct", "relay", "kshare")
_CLK_TCK = os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------------------------
# processes


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime, stime


class Child:
    """A subprocess that prints a ready line; its output is kept (drained by a thread)."""

    def __init__(self, name: str, cmd: list[str], ready: str, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.cmd = cmd
        self.ready = re.compile(ready)
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[str] | None = None
        self.output: list[str] = []

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 60.0) -> Child:
        self.proc = subprocess.Popen(
            self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=self.env, cwd=ROOT
        )
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"{self.name} exited at start:\n" + "".join(self.output))
            self.output.append(line)
            if self.ready.search(line):
                threading.Thread(target=self._drain, daemon=True).start()
                return self
        raise RuntimeError(f"{self.name} not ready in {timeout:.0f} s:\n" + "".join(self.output))

    def _drain(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


PROXY_CMD = [sys.executable, "-m", "kshare"]  # --proxy-cmd replaces it (to compare variants)


def start_proxy(upstream: str, *, profile_to: Path | None = None) -> tuple[Child, str]:
    """``kshare proxy --upstream upstream`` on a free port; under cProfile with ``profile_to``."""
    port = free_port()
    cmd = list(PROXY_CMD)
    if profile_to is not None:
        cmd[1:1] = ["-m", "cProfile", "-o", str(profile_to)]
    cmd += ["proxy", "--upstream", upstream, "--port", str(port), "--broker-port-base", "0"]
    child = Child("kshare proxy", cmd, r"upstream cluster has \d+ broker").start()
    return child, f"127.0.0.1:{port}"


# --------------------------------------------------------------------------------------------
# clients


def _quiet(_: object) -> None:
    pass


def produce(bootstrap: str, topic: str, records: int, value_size: int, partitions: int) -> float:
    """Seconds to produce ``records`` values of ``value_size`` bytes, spread evenly over partitions."""
    from confluent_kafka import KafkaException, Producer

    errors: list[object] = []
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 10,
            "batch.size": 1_000_000,
            "batch.num.messages": 100_000,
            "queue.buffering.max.messages": 2_000_000,
            "queue.buffering.max.kbytes": 2_097_151,
            "compression.type": "none",
            "acks": "all",
            "delivery.report.only.error": True,
            "on_delivery": lambda err, msg: errors.append(err),
            "error_cb": _quiet,
        }
    )
    producer.list_topics(topic, timeout=10)  # connected, metadata known: the clock starts at the first record
    value = os.urandom(value_size)
    send = producer.produce
    t0 = time.perf_counter()
    for i in range(records):
        try:
            send(topic, value, partition=i % partitions)
        except BufferError:
            producer.poll(0.05)
            send(topic, value, partition=i % partitions)
    left = producer.flush(300)
    elapsed = time.perf_counter() - t0
    if left or errors:
        raise KafkaException(f"produce to {topic} via {bootstrap}: {left} undelivered, errors {errors[:3]}")
    return elapsed


def consume(bootstrap: str, topic: str, records: int, partitions: int, timeout: float = 300.0) -> float:
    """Seconds to read ``records`` records of ``topic`` from the beginning of every partition."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "error_cb": _quiet,
        }
    )
    try:
        consumer.list_topics(topic, timeout=10)
        tps = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)]
        take = consumer.consume
        n = 0
        t0 = time.perf_counter()
        consumer.assign(tps)
        deadline = time.monotonic() + timeout
        while n < records:
            n += len(take(10_000, 1.0))
            if time.monotonic() > deadline:
                raise TimeoutError(f"consumed {n} of {records} records of {topic} via {bootstrap}")
        elapsed = time.perf_counter() - t0
        # every counted message was a record (no error events): the positions add up to the count
        positions = consumer.position([TopicPartition(topic, p) for p in range(partitions)])
        total = sum(tp.offset for tp in positions)
        if n != records or total != records:
            raise RuntimeError(
                f"{topic} via {bootstrap}: consumed {n}, positions add up to {total}, want {records}"
            )
        return elapsed
    finally:
        consumer.close()


# --------------------------------------------------------------------------------------------
# the runs


@dataclass
class Sample:
    config: str
    value_size: int
    produce_s: float
    consume_s: float
    cpu_produce_s: float | None = None  # CPU of the relay / proxy process during the produce
    cpu_consume_s: float | None = None


@dataclass
class Bench:
    broker: KafkaBroker
    bootstraps: dict[str, str]
    pids: dict[str, int]
    records: int
    partitions: int
    samples: list[Sample] = field(default_factory=list)

    def run_one(self, config: str, value_size: int, *, warmup: bool = False) -> Sample:
        topic = f"bench-{config}-{value_size}-{uuid.uuid4().hex[:8]}"
        self.broker.create_topic(topic, self.partitions)
        bootstrap = self.bootstraps[config]
        pid = self.pids.get(config)
        try:
            c0 = _cpu_seconds(pid) if pid else None
            p_s = produce(bootstrap, topic, self.records, value_size, self.partitions)
            c1 = _cpu_seconds(pid) if pid else None
            c_s = consume(bootstrap, topic, self.records, self.partitions)
            c2 = _cpu_seconds(pid) if pid else None
        finally:
            with contextlib.suppress(Exception):
                self.broker.delete_topic(topic)
        s = Sample(config, value_size, p_s, c_s)
        if pid:
            s.cpu_produce_s, s.cpu_consume_s = c1 - c0, c2 - c1  # type: ignore[operator]
        if not warmup:
            self.samples.append(s)
        mb = self.records * value_size / 1e6
        print(
            f"  {'(warm-up) ' if warmup else ''}{config:>6} {value_size:>5} B: produce {self.records / p_s:>10,.0f} rec/s {mb / p_s:7.1f} MB/s"
            f" | consume {self.records / c_s:>10,.0f} rec/s {mb / c_s:7.1f} MB/s"
            + (f" | cpu {s.cpu_produce_s:.2f} s + {s.cpu_consume_s:.2f} s" if pid else "")
            + f" | load {os.getloadavg()[0]:.1f}",
            flush=True,
        )
        return s


def order_for(rounds: int) -> list[str]:
    out: list[str] = []
    for r in range(rounds):
        out += [*CONFIGS, *reversed(CONFIGS)] if r % 2 == 0 else [*reversed(CONFIGS), *CONFIGS]
    return out


def summarize(samples: list[Sample], records: int, sizes: list[int]) -> str:
    lines = [
        "| workload | value | direct rec/s (MB/s) | relay rec/s (MB/s) | kshare rec/s (MB/s) "
        "| kshare/relay | kshare/direct | relay/direct | CPU s relay / kshare | CPU kshare/relay |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for kind in ("produce", "consume"):
        for size in sizes:
            med: dict[str, float] = {}
            cpu: dict[str, float] = {}
            for config in CONFIGS:
                ss = [s for s in samples if s.config == config and s.value_size == size]
                med[config] = statistics.median(getattr(s, f"{kind}_s") for s in ss)
                cpus = [getattr(s, f"cpu_{kind}_s") for s in ss if getattr(s, f"cpu_{kind}_s") is not None]
                if cpus:
                    cpu[config] = statistics.median(cpus)

            cell = {c: f"{records / med[c]:,.0f} ({records * size / 1e6 / med[c]:.1f})" for c in CONFIGS}

            rate = {c: 1 / med[c] for c in CONFIGS}
            lines.append(
                f"| {kind} | {size} B | {cell['direct']} | {cell['relay']} | {cell['kshare']} "
                f"| {rate['kshare'] / rate['relay']:.2f} | {rate['kshare'] / rate['direct']:.2f} "
                f"| {rate['relay'] / rate['direct']:.2f} "
                f"| {cpu.get('relay', float('nan')):.2f} / {cpu.get('kshare', float('nan')):.2f} "
                f"| {_ratio(cpu.get('kshare'), cpu.get('relay')):.2f} |"
            )
    return "\n".join(lines)


def _ratio(a: float | None, b: float | None) -> float:
    return a / b if a is not None and b else float("nan")


def samples_table(samples: list[Sample], records: int) -> str:
    lines = ["| # | config | value | produce rec/s | consume rec/s |", "| ---: | --- | ---: | ---: | ---: |"]
    for i, s in enumerate(samples, 1):
        lines.append(
            f"| {i} | {s.config} | {s.value_size} B | {records / s.produce_s:,.0f} | {records / s.consume_s:,.0f} |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# profiling


def _py_spy() -> str | None:
    venv_bin = Path(sys.executable).parent / "py-spy"
    return str(venv_bin) if venv_bin.exists() else shutil.which("py-spy")


def profile(
    broker: KafkaBroker,
    how: str,
    records: int,
    partitions: int,
    value_size: int,
    passes: int,
    top: int,
    outdir: Path,
    *,
    native: bool = False,
    load: str = "consume",
) -> str:
    """Consume (or produce) ``passes`` times through a profiled proxy; return the report (text)."""
    topic = broker.create_topic(f"bench-profile-{value_size}-{uuid.uuid4().hex[:8]}", partitions)
    if load == "consume":
        produce(broker.bootstrap, topic, records, value_size, partitions)

    def run_load(bootstrap: str) -> list[float]:
        if load == "consume":
            return [consume(bootstrap, topic, records, partitions) for _ in range(passes)]
        return [produce(bootstrap, topic, records, value_size, partitions) for _ in range(passes)]

    out = io.StringIO()
    try:
        if how == "cprofile":
            stats_path = outdir / f"proxy-{load}-{value_size}.pstats"
            proxy, bootstrap = start_proxy(broker.bootstrap, profile_to=stats_path)
            try:
                secs = run_load(bootstrap)
            finally:
                proxy.stop()
            print(
                f"cProfile of the proxy, {passes} {load} passes of {records:,} x {value_size} B "
                f"({', '.join(f'{records / s:,.0f}' for s in secs)} rec/s under the profiler); {stats_path}",
                file=out,
            )
            st = pstats.Stats(str(stats_path), stream=out)
            st.strip_dirs().sort_stats("tottime").print_stats(top)
            st.sort_stats("cumulative").print_stats(top)
        elif how == "py-spy":
            spy = _py_spy()
            if spy is None:
                return "py-spy is not installed (pip install py-spy)\n"
            proxy, bootstrap = start_proxy(broker.bootstrap)
            raw = outdir / f"proxy-{load}-{value_size}.pyspy.txt"
            rec = subprocess.Popen(
                [
                    spy,
                    "record",
                    "--pid",
                    str(proxy.pid),
                    "--rate",
                    "500",
                    "--format",
                    "raw",
                    "--output",
                    str(raw),
                    *(["--native"] if native else ["--nonblocking"]),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            try:
                time.sleep(1.0)  # py-spy attaches
                secs = run_load(bootstrap)
            finally:
                rec.send_signal(signal.SIGINT)
                spy_out, _ = rec.communicate(timeout=60)
                proxy.stop()
            print(
                f"py-spy of the proxy (500 Hz, idle excluded), {passes} {load} passes of {records:,} x "
                f"{value_size} B ({', '.join(f'{records / s:,.0f}' for s in secs)} rec/s); {raw}",
                file=out,
            )
            if not raw.exists():
                print(spy_out, file=out)
            else:
                print(collapse_report(raw.read_text(), top), file=out)
        else:
            raise ValueError(how)
        notes = [line for line in proxy.output if re.search(r"WARNING|ERROR|Traceback|never awaited", line)]
        if notes:
            print("proxy log lines worth a look:\n" + "".join(notes[-20:]), file=out)
    finally:
        with contextlib.suppress(Exception):
            broker.delete_topic(topic)
    return out.getvalue()


def collapse_report(text: str, top: int) -> str:
    """Self and inclusive sample shares per function from py-spy's raw (collapsed stacks) output."""
    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        # "func (path/file.py:123)" -> "func (file.py)": per function, not per line
        names = [re.sub(r"^(.*) \((?:.*/)?([^/:]+)(?::\d+)?\)$", r"\1 (\2)", f) for f in stack.split(";")]
        own[names[-1]] += n
        for name in set(names):
            incl[name] += n
    if not total:
        return "(no samples)"
    rows = [
        f"{total} samples; self = on top of the stack, incl = anywhere in it",
        "",
        "self%  incl%  function",
    ]
    for name, n in own.most_common(top):
        rows.append(f"{100 * n / total:5.1f}  {100 * incl[name] / total:5.1f}  {name}")
    rows += ["", "by inclusive share:", "incl%  function"]
    for name, n in incl.most_common(top):
        rows.append(f"{100 * n / total:5.1f}  {name}")
    return "\n".join(rows)


# --------------------------------------------------------------------------------------------


def machine_info() -> dict[str, object]:
    info: dict[str, object] = {
        "nproc": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(Exception):
        import confluent_kafka
        import uvloop

        info["confluent_kafka"] = importlib.metadata.version("confluent-kafka")
        info["librdkafka"] = confluent_kafka.libversion()[0]
        info["uvloop"] = uvloop.__version__
    with contextlib.suppress(Exception):
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "kshare"], capture_output=True, text=True, cwd=ROOT
        ).stdout.strip()
        info["kshare_commit"] = head.stdout.strip() + (" (kshare/ has local changes)" if dirty else "")
    with contextlib.suppress(Exception):
        java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()[0]
        info["java"] = java
    return info


def figures(
    broker: KafkaBroker,
    relay_port: int,
    relay_in: int,
    records: int,
    rounds: int,
    sizes: list[int],
    partitions: int,
    warmup: bool,
) -> list[Sample]:
    h = broker.host
    relay = proxy = None
    try:
        relay_cmd = [sys.executable, str(ROOT / "benchmarks" / "relay.py")]
        relay_cmd += ["--listen", f"{h}:{relay_port}", "--upstream", f"{h}:{relay_in}"]
        relay = Child("relay", relay_cmd, r"relay listening").start()
        proxy, proxy_bootstrap = start_proxy(broker.bootstrap)
        bench = Bench(
            broker,
            {"direct": broker.bootstrap, "relay": f"{h}:{relay_port}", "kshare": proxy_bootstrap},
            {"relay": relay.pid, "kshare": proxy.pid},
            records,
            partitions,
        )
        if warmup:  # the broker's JIT, page cache and the processes' first connections
            for config in CONFIGS:
                bench.run_one(config, sizes[0], warmup=True)
        for size in sizes:
            print(f"values of {size} B:", flush=True)
            for config in order_for(rounds):
                bench.run_one(config, size)
        return bench.samples
    finally:
        for child in (proxy, relay):
            if child is not None:
                child.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short smoke run: 20,000 records, one round")
    parser.add_argument("--records", type=int, default=None, help="records per run (default 500,000)")
    parser.add_argument("--sizes", default="100,1024", help="value sizes in bytes (default 100,1024)")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="rounds of the order direct, relay, kshare, kshare, relay, direct (default 3)",
    )
    parser.add_argument(
        "--no-warmup",
        dest="warmup",
        action="store_false",
        help="skip the untimed first run of each configuration",
    )
    parser.add_argument("--kafka", default=KAFKA_3, help=f"Apache Kafka version (default {KAFKA_3})")
    parser.add_argument("--profile", default="cprofile", choices=["cprofile", "py-spy", "none"])
    parser.add_argument(
        "--profile-size", type=int, default=None, help="value size for the profile (default 100)"
    )
    parser.add_argument("--profile-passes", type=int, default=None, help="consume passes under the profiler")
    parser.add_argument("--profile-only", action="store_true", help="skip the figures, only profile")
    parser.add_argument("--profile-load", default="consume", choices=["consume", "produce"])
    parser.add_argument("--native", action="store_true", help="py-spy: include native (C) frames")
    parser.add_argument(
        "--proxy-cmd",
        default=None,
        help="command that runs the kshare CLI (default: python -m kshare), e.g. to compare a variant",
    )
    parser.add_argument("--top", type=int, default=25, help="functions to list from the profile")
    parser.add_argument("--json", type=Path, default=None, help="also write the samples here")
    args = parser.parse_args(argv)
    if args.proxy_cmd:
        PROXY_CMD[:] = shlex.split(args.proxy_cmd)
    records = args.records or (20_000 if args.quick else 500_000)
    rounds = args.rounds or (1 if args.quick else 3)
    sizes = [int(s) for s in args.sizes.split(",")]
    passes = args.profile_passes or (1 if args.quick else 3)
    outdir = Path(tempfile.mkdtemp(prefix="kshare-bench-"))

    info = machine_info()
    print("command:", shlex.join([Path(sys.executable).name, *sys.argv]))
    print("machine:", json.dumps(info))
    print(
        f"{records:,} records per run, {args.partitions} partitions, values {sizes} B, "
        f"{rounds} round(s) of {' '.join(order_for(1))}",
        flush=True,
    )

    broker = KafkaBroker(args.kafka)
    relay_port, relay_in = free_port(), free_port()
    h = broker.host
    # a second listener, advertised at the relay: clients that bootstrap from the relay stay on it
    broker.extra_config.update(
        {
            "listeners": f"PLAINTEXT://{h}:{broker.port},CONTROLLER://{h}:{broker.controller_port},"
            f"RELAY://{h}:{relay_in}",
            "advertised.listeners": f"PLAINTEXT://{h}:{broker.port},RELAY://{h}:{relay_port}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,RELAY:PLAINTEXT",
        }
    )
    with broker:
        print(f"Apache Kafka {args.kafka} on {broker.bootstrap} (relay listener {h}:{relay_in})", flush=True)
        if not args.profile_only:
            samples = figures(
                broker, relay_port, relay_in, records, rounds, sizes, args.partitions, args.warmup
            )
            print()
            print(
                f"Medians of {2 * rounds} runs per configuration, {records:,} records, {args.partitions} "
                "partitions (MB = 10^6 B of values; CPU s = CPU time of the relay / proxy process per run):"
            )
            print()
            print(summarize(samples, records, sizes))
            print()
            print(samples_table(samples, records))
            if args.json:
                doc = {
                    "machine": info,
                    "records": records,
                    "partitions": args.partitions,
                    "samples": [s.__dict__ for s in samples],
                }
                args.json.write_text(json.dumps(doc, indent=2) + "\n")
        if args.profile != "none":
            print()
            size = args.profile_size or sizes[0]
            print(
                profile(
                    broker,
                    args.profile,
                    records,
                    args.partitions,
                    size,
                    passes,
                    args.top,
                    outdir,
                    native=args.native,
                    load=args.profile_load,
                ),
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
