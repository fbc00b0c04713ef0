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
import io
import json
import os
import pstats
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kshare.bench.clients import consume, produce  # noqa: E402, F401 - bench_share imports them from here
from kshare.bench.procs import Child as _Child  # noqa: E402
from kshare.bench.procs import collapse_report, machine_info  # noqa: E402, F401
from kshare.bench.procs import cpu_seconds as _cpu_seconds  # noqa: E402
from kshare.bench.procs import py_spy as _py_spy  # noqa: E402
from tests.brokers import KAFKA_3, KafkaBroker, free_port  # noqa: E402

CONFIGS = ("direct", "relay", "kshare")


# --------------------------------------------------------------------------------------------
# processes


class Child(_Child):
    """:class:`kshare.bench.procs.Child` run from the repository root (its ``python -m kshare`` is this checkout)."""

    def __init__(self, name: str, cmd: list[str], ready: str, env: dict[str, str] | None = None) -> None:
        super().__init__(name, cmd, ready, env=env, cwd=ROOT)


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


# --------------------------------------------------------------------------------------------


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
        relay_cmd = [sys.executable, "-m", "kshare.bench.relay"]
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
