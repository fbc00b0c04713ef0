"""``kshare bench``: start the brokers, the relay and the proxy, run the scenarios, write the results."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shlex
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from .brokers import KAFKA_3, KAFKA_4, BrokerError, KafkaBroker, ensure_kafka, free_port
from .procs import BENCH_BROKER_CONFIG, KAFKA4_CONFIG, Child, ProxyProcess, load, machine_info, start_relay
from .scenarios import OPT_IN, REGISTRY, SCENARIOS
from .scenarios.common import KAFKA3, KAFKA4, PYSPARK, UPSTREAM

log = logging.getLogger("kshare.bench")


class BenchError(Exception):
    """A clear reason the bench cannot run (shown without a traceback)."""


# sizes: (full run, --quick), each scenario's own (its module in kshare.bench.scenarios). On the project's
# 2-core machine (loaded) a full run took 20.5 minutes with latency runs of 30 s, 1,000,000 / 400,000 share
# records and 2,000 acks (the sizes now add about 3 minutes), --quick 3 minutes.
SIZES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {name: s.sizes for name, s in REGISTRY.items()}
# scenarios that take no --repeats (one long run each, or one load)
NO_REPEATS = tuple(name for name, s in REGISTRY.items() if not s.repeats)
# scenarios whose repeats are fewer than --repeats (their runs are long, and alternate anyway)
MAX_REPEATS = {name: s.max_repeats for name, s in REGISTRY.items() if s.max_repeats}
# scenarios with more repeats than the default 3 in a full run (their modules say why)
DEFAULT_REPEATS = {name: s.default_repeats for name, s in REGISTRY.items() if s.default_repeats}


@dataclass
class Options:
    out: Path
    only: list[str] = field(default_factory=list)
    quick: bool = False
    repeats: int | None = None
    upstream: str | None = None
    proxy_args: list[str] = field(default_factory=list)
    plots: bool = True

    @property
    def scenarios(self) -> list[str]:
        if self.only:
            return [s for s in SCENARIOS if s in self.only]
        return [s for s in SCENARIOS if s not in OPT_IN]

    @property
    def n_repeats(self) -> int:
        return self.repeats or (1 if self.quick else 3)


# --------------------------------------------------------------------------------------------
# progress: one bar per scenario, one line per step


class Progress:
    """``[share      ] ######.......... 12/54  kshare 100 B x4: 251,000 rec/s`` on stderr: redrawn in
    place on a terminal, one line per step otherwise (a log file stays readable)."""

    WIDTH = 24

    def __init__(self, stream: TextIO | None = None, tty: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.name = ""
        self.total = 0
        self.done = 0
        self.t0 = 0.0
        self.lines: list[str] = []  # every step, for the results

    def begin(self, name: str, total: int) -> None:
        self.name, self.total, self.done, self.t0 = name, max(total, 1), 0, time.monotonic()
        self._draw("starting")

    def step(self, text: str) -> None:
        self.done = min(self.done + 1, self.total)
        self.lines.append(f"{self.name}: {text}")
        self._draw(text)

    def end(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()

    def note(self, text: str) -> None:
        if self.tty:
            self.stream.write("\r\033[K")
        self.stream.write(text + "\n")
        self.stream.flush()

    def _draw(self, text: str) -> None:
        filled = int(self.WIDTH * self.done / self.total)
        bar = "#" * filled + "." * (self.WIDTH - filled)
        line = f"[{self.name:<11}] {bar} {self.done:>3}/{self.total:<3} {time.monotonic() - self.t0:5.0f}s  {text}"
        if self.tty:
            width = max(40, _columns() - 1)
            self.stream.write("\r\033[K" + line[:width])
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def _columns() -> int:
    with contextlib.suppress(OSError):
        return os.get_terminal_size(sys.stderr.fileno()).columns
    return 120


# --------------------------------------------------------------------------------------------
# what the scenarios run against, started on first use


class Env:
    def __init__(self, options: Options, progress: Progress) -> None:
        self.options = options
        self.progress = progress
        self.proxy_args = list(options.proxy_args)
        self._k3: KafkaBroker | None = None
        self._k4: KafkaBroker | None = None
        self._relay: Child | None = None
        self._relay_tried = False
        self._proxy: ProxyProcess | None = None
        self.relay_bootstrap = ""
        self._relay_in = 0
        self.started: dict[str, str] = {}
        self.data_left_mb: dict[str, float] = {}  # per broker version, at the end

    def upstream(self) -> str:
        """Bootstrap of the fronted cluster: ``--upstream``, or Apache Kafka 3.9 started here."""
        if self.options.upstream:
            return self.options.upstream
        if self._k3 is None:
            broker = KafkaBroker(KAFKA_3, config=BENCH_BROKER_CONFIG)
            h = broker.host
            relay_port, self._relay_in = free_port(), free_port()
            # a second listener advertised at the relay: clients bootstrapped from the relay stay on it
            broker.extra_config.update(
                {
                    "listeners": f"PLAINTEXT://{h}:{broker.port},CONTROLLER://{h}:{broker.controller_port},"
                    f"RELAY://{h}:{self._relay_in}",
                    "advertised.listeners": f"PLAINTEXT://{h}:{broker.port},RELAY://{h}:{relay_port}",
                    "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,RELAY:PLAINTEXT",
                    "log.segment.bytes": 256 * 1024 * 1024,
                }
            )
            self.relay_bootstrap = f"{h}:{relay_port}"
            self._k3 = self._start(broker, "kafka3", "(the fronted cluster)")
        return self._k3.bootstrap

    def upstream_broker(self) -> KafkaBroker | None:
        """The fronted broker when the bench started it (None for ``--upstream``)."""
        self.upstream()
        return self._k3

    def upstream_data_dir(self) -> Path | None:
        """The fronted broker's data directory when the bench started it (None for ``--upstream``): what a
        topic takes on disk."""
        self.upstream()
        return self._k3.data_dir if self._k3 is not None else None

    def kafka4(self) -> str:
        """Bootstrap of native Apache Kafka 4.4 with share groups (the reference)."""
        if self._k4 is None:
            broker = KafkaBroker(KAFKA_4, share_groups=True, config=KAFKA4_CONFIG)
            self._k4 = self._start(broker, "kafka4", "with share groups (the reference)")
        return self._k4.bootstrap

    def _start(self, broker: KafkaBroker, key: str, role: str) -> KafkaBroker:
        """Start ``broker``, saying so (``role``: what it is for), and list it in ``started`` under ``key``."""
        self.progress.note(f"starting Apache Kafka {broker.version} {role}")
        broker.start()
        self.started[key] = f"Apache Kafka {broker.version} at {broker.bootstrap} (log {broker.log_path})"
        return broker

    def relay(self) -> Child | None:
        """The bare relay in front of the 3.9 broker (none in front of an ``--upstream`` cluster: its brokers
        would have to advertise the relay)."""
        if not self._relay_tried:
            self._relay_tried = True
            self.upstream()
            if self._k3 is not None:
                self._relay = start_relay(
                    self.relay_bootstrap,
                    f"127.0.0.1:{self._relay_in}",
                    log_path=self.options.out / "relay.log",
                )
                self.started["relay"] = f"relay at {self.relay_bootstrap} (pid {self._relay.pid})"
        return self._relay

    def proxy(self) -> ProxyProcess:
        if self._proxy is None:
            proxy = ProxyProcess(self.upstream(), self.proxy_args, log_path=self.options.out / "kshare.log")
            self.progress.note("starting kshare proxy: " + shlex.join(proxy.cmd[1:]))
            proxy.start(180)
            self._proxy = proxy
            self.started["kshare"] = f"kshare proxy at {proxy.bootstrap} (pid {proxy.pid})"
        if not self._proxy.running:
            raise BenchError("the kshare proxy exited:\n" + "".join(self._proxy.output[-30:]))
        return self._proxy

    def close(self) -> list[str]:
        """Stop everything; the proxy's log lines worth a look."""
        notes: list[str] = []
        if self._proxy is not None:
            self._proxy.stop()
            notes = self._proxy.notes()
        for child in (self._relay,):
            if child is not None:
                child.stop()
        for broker in (self._k4, self._k3):
            if broker is not None:
                self.data_left_mb[broker.version] = round(_tree_bytes(broker.data_dir) / 2**20, 1)
                with contextlib.suppress(Exception):
                    broker.close()
        return notes


def _tree_bytes(root: Path) -> int:
    """Bytes the files under ``root`` take on disk (what a broker still holds: deleted bench topics
    should not). Blocks, not sizes: a partition's index files are sparse, 1 MB each to ``st_size``."""
    total = 0
    for dirpath, _, files in os.walk(root):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(dirpath, f)).st_blocks * 512
    return total


# --------------------------------------------------------------------------------------------


def check_prerequisites(options: Options) -> None:
    """Fail early and clearly: matplotlib, Java and the Kafka releases (fetched now if missing)."""
    chosen = [REGISTRY[name] for name in options.scenarios]
    if options.plots and any(s.plot for s in chosen):
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise BenchError("matplotlib is not installed: pip install 'kshare[bench]'") from None
    if not all(s.broker_less for s in chosen):
        try:
            import confluent_kafka  # noqa: F401
        except ImportError:
            raise BenchError("confluent-kafka is not installed: pip install 'kshare[bench]'") from None
    needs = set().union(*(s.needs for s in chosen))
    need = set()
    if (UPSTREAM in needs and not options.upstream) or KAFKA3 in needs:
        need.add(KAFKA_3)
    if KAFKA4 in needs:
        need.add(KAFKA_4)
    if PYSPARK in needs:
        from .sparkrun import pyspark_problem

        problem = pyspark_problem()
        if problem:
            raise BenchError(f"the spark scenario needs pyspark: {problem}")
    from .brokers import _java

    try:
        if need:
            _java()
        for version in sorted(need):
            ensure_kafka(version)
    except BrokerError as exc:
        raise BenchError(f"cannot run Apache Kafka: {exc}") from None


def scenario_args(name: str, options: Options) -> dict[str, Any]:
    full, quick = SIZES[name]
    args = dict(quick if options.quick else full)
    if name not in NO_REPEATS:
        repeats = options.n_repeats
        if options.repeats is None and not options.quick:
            repeats = DEFAULT_REPEATS.get(name, repeats)
        args["repeats"] = min(repeats, MAX_REPEATS.get(name, repeats))
    return args


def run(options: Options, *, stream: TextIO | None = None) -> dict[str, Any]:
    """Run the selected scenarios; writes results.json / results.md / plots into ``options.out`` (also
    after a failed scenario: what ran is kept). Returns the results."""
    from . import report

    check_prerequisites(options)
    options.out.mkdir(parents=True, exist_ok=True)
    progress = Progress(stream)
    env = Env(options, progress)
    t0 = time.monotonic()
    results: dict[str, Any] = {
        "meta": {
            "command": shlex.join(["kshare", *sys.argv[1:]]) if sys.argv else "kshare bench",
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "quick": options.quick,
            "repeats": {name: scenario_args(name, options).get("repeats", 1) for name in options.scenarios},
            "scenarios": options.scenarios,
            "upstream": _upstream(options),
            "reference": f"Apache Kafka {KAFKA_4} with share groups",
            "proxy_args": options.proxy_args,
            "machine": machine_info(),
            "load_before": load(),
        },
        "scenarios": {},
        "errors": {},
    }
    progress.note(f"kshare bench: {', '.join(options.scenarios)} -> {options.out}")

    def on_term(*_: object) -> None:
        raise KeyboardInterrupt  # stop what runs, clean up, keep what ran

    previous = signal.signal(signal.SIGTERM, on_term)
    interrupted = False
    try:
        for name in options.scenarios:
            args = scenario_args(name, options)
            started = time.monotonic()
            try:
                scenario = REGISTRY[name]
                if scenario.uses_earlier:
                    args["earlier"] = results["scenarios"]
                res = scenario.run(env, progress, **args)
            except KeyboardInterrupt:
                interrupted = True
                results["errors"][name] = "interrupted"
                progress.end()
                break
            except BrokerError as exc:
                raise BenchError(f"cannot run Apache Kafka: {exc}") from None
            except BenchError:
                raise
            except Exception as exc:  # noqa: BLE001 - the other scenarios still run
                progress.end()
                progress.note(f"{name}: failed: {exc!r}")
                log.debug("%s failed", name, exc_info=True)
                results["errors"][name] = f"{type(exc).__name__}: {exc}"
                continue
            res["seconds"] = round(time.monotonic() - started, 1)
            results["scenarios"][name] = res
            _write(results, options, report, final=False)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        # a second Ctrl-C must not leave the brokers and the proxy running
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        sigint = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            notes = env.close()
            results["meta"]["load_after"] = load()
            results["meta"]["elapsed_s"] = round(time.monotonic() - t0, 1)
            results["meta"]["started_processes"] = env.started
            results["meta"]["proxy_log_notes"] = notes
            results["meta"]["broker_data_left_mb"] = env.data_left_mb
            results["meta"]["steps"] = progress.lines
            _write(results, options, report, final=True)
        finally:
            signal.signal(signal.SIGTERM, previous)
            signal.signal(signal.SIGINT, sigint)
    if interrupted:
        raise KeyboardInterrupt
    progress.note(
        f"written: {options.out / 'results.md'}, results.json and {len(results.get('plots', []))} plot(s) "
        f"in {time.monotonic() - t0:.0f} s"
    )
    return results


def _upstream(options: Options) -> str:
    """The fronted cluster, as results.md names it."""
    needs = set().union(*(REGISTRY[name].needs for name in options.scenarios))
    if options.upstream:
        return options.upstream
    if UPSTREAM in needs:
        return f"Apache Kafka {KAFKA_3} (started by the bench)"
    if "failover" in options.scenarios:
        return f"Apache Kafka {KAFKA_3} as three nodes (started by the failover scenario)"
    if "embedded" in options.scenarios:
        return "none (the embedded scenario's kshare proxy starts its own broker)"
    return "none (no scenario of this run needs a broker)"


def _write(results: dict[str, Any], options: Options, report: Any, *, final: bool) -> None:
    if final and options.plots:
        results["plots"] = report.plots(results, options.out)
    (options.out / "results.json").write_text(json.dumps(_jsonable(results), indent=1) + "\n")
    (options.out / "results.md").write_text(report.markdown(results))


def _jsonable(x: Any) -> Any:
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return None
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, Path):
        return str(x)
    return x
