"""Child processes of a benchmark and what is measured of them: CPU time and RSS (/proc), metrics,
py-spy profiles, the machine's description.

(Moved here from ``benchmarks/bench_proxy.py``, which imports them back.)
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

_CLK_TCK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")

# broker-level bounds low enough for a 500 ms share heartbeat, on kshare and on Kafka 4.4
HEARTBEAT_MS = 500
KSHARE_LIMITS = ("group.share.min.heartbeat.interval.ms=100", "group.share.min.session.timeout.ms=1000")
# Both brokers: a deleted bench topic's files go within a second, not a minute, so that most of
# the gigabytes a scenario writes are gone before the kernel writes them back to disk, where that
# write-back would run under the next timed runs.
BENCH_BROKER_CONFIG = {"log.segment.delete.delay.ms": 1000, "log.initial.task.delay.ms": 1000}
KAFKA4_CONFIG = {"group.share.min.heartbeat.interval.ms": 100, "group.share.min.session.timeout.ms": 1000,
                 **BENCH_BROKER_CONFIG}


# --------------------------------------------------------------------------------------------
# ports and children that die with the bench


_handed_out: set[int] = set()
_ports_lock = threading.Lock()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that is free now and was not returned before by this process."""
    with _ports_lock:
        for _ in range(100):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((host, 0))
                port = s.getsockname()[1]
            if port not in _handed_out:
                _handed_out.add(port)
                return port
    raise RuntimeError("no free port found")


def port_open(port: int, host: str = "127.0.0.1", timeout: float = 0.5) -> bool:
    """Whether something accepts TCP connections on ``host:port`` now."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _die_with_parent(cmd: list[str]) -> list[str]:
    """Prefix ``cmd`` so that it gets SIGKILL when this process dies (Linux ``setpriv --pdeathsig``).

    Only from the main thread: the parent-death signal fires when the *thread* that forked exits.
    """
    if threading.current_thread() is not threading.main_thread() or not sys.platform.startswith("linux"):
        return cmd
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "SIGKILL", "--", *cmd] if setpriv else cmd


# --------------------------------------------------------------------------------------------
# what is measured of a child


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime, stime


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` in bytes (Linux /proc)."""
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


class Child:
    """A subprocess that prints a ready line; its output is kept (drained by a thread)."""

    def __init__(
        self,
        name: str,
        cmd: list[str],
        ready: str,
        env: dict[str, str] | None = None,
        cwd: Path | str | None = None,
        log_path: Path | None = None,
        keep_lines: int | None = 5000,
    ) -> None:
        self.name = name
        self.keep_lines = keep_lines  # of the output, the last ones (None: all, for tests that index into it)
        self.cmd = cmd
        self.log_path = log_path  # the output is also written here
        self.ready = re.compile(ready)
        self.env = {**os.environ, **(env or {})}
        self.cwd = cwd
        self.proc: subprocess.Popen[str] | None = None
        self.output: list[str] = []

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 60.0) -> Child:
        self._log = open(self.log_path, "a", buffering=1) if self.log_path else None  # noqa: SIM115
        self.proc = subprocess.Popen(
            _die_with_parent(self.cmd),  # SIGKILLed if the bench dies
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=self.env,
            cwd=self.cwd,
            start_new_session=True,  # Ctrl-C of the bench does not reach it: stopped in order
        )
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                self.proc.wait(10)
                raise RuntimeError(f"{self.name} exited at start:\n" + "".join(self.output[-40:]))
            self.output.append(line)
            if self._log is not None:
                self._log.write(line)
            if self.ready.search(line):
                threading.Thread(target=self._drain, daemon=True).start()
                return self
        self.stop()
        raise RuntimeError(f"{self.name} not ready in {timeout:.0f} s:\n" + "".join(self.output[-40:]))

    def _drain(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)
            if self._log is not None:
                self._log.write(line)
            if self.keep_lines is not None and len(self.output) > self.keep_lines:
                del self.output[: len(self.output) // 5]
        if self._log is not None:
            self._log.close()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def send_signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 15.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def __enter__(self) -> Child:
        return self if self.proc is not None else self.start()  # started already: start(timeout=...)

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def notes(self, last: int = 20) -> list[str]:
        """Log lines worth a look (warnings, errors, tracebacks)."""
        pattern = re.compile(r" WARNING | ERROR |Traceback|never awaited")
        return [line.rstrip() for line in self.output if pattern.search(line)][-last:]


def http_get(port: int, path: str, timeout: float = 2.0) -> tuple[int, str] | None:
    """(status, body) of ``GET http://127.0.0.1:<port><path>`` (an error status is an answer too:
    /ready's 503 says why); None when nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return None


def proxy_ready(metrics_port: int) -> dict[str, Any] | None:
    """The /ready document of the proxy with that metrics port (ready or not), None if it does not answer."""
    got = http_get(metrics_port, "/ready")
    if got is None:
        return None
    with contextlib.suppress(ValueError):
        return json.loads(got[1])
    return None


def kshare_env() -> dict[str, str]:
    """The environment of a child ``python -m kshare``: the very kshare this process imported."""
    import kshare

    src = str(Path(kshare.__file__).resolve().parent.parent)
    path = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": src + (os.pathsep + path if path else "")}


class ProxyProcess(Child):
    """``python -m kshare proxy --upstream UPSTREAM`` on free ports, a state topic of its own and a
    metrics port; ``extra`` are more ``kshare proxy`` arguments (``kshare bench --proxy-arg``; a
    later option overrides an earlier one, e.g. ``--state-topic``).

    ``upstream=None``: no ``--upstream``, so the proxy starts its embedded broker (``extra`` may say
    which, ``--embedded``, and where, ``--data-dir``) and keeps the default state topic, as a user's
    proxy does; ``env`` adds to its environment (e.g. ``KSHARE_CACHE``).

    For the tests' launcher (``tests/harness/proxies.py``): ``port`` (0: a free one), ``metrics``
    (a metrics port or none), ``limits`` (the ``--group-limit`` s), ``ready`` (the line it is ready
    at; default: its share state loaded, or with ``--no-share-groups`` its upstream known) and
    ``keep_lines`` (see :class:`Child`)."""

    def __init__(
        self,
        upstream: str | None,
        extra: list[str] | tuple[str, ...] = (),
        *,
        name: str = "kshare",
        log_path: Path | None = None,
        env: dict[str, str] | None = None,
        port: int = 0,
        metrics: bool = True,
        limits: tuple[str, ...] = KSHARE_LIMITS,
        ready: str | None = None,
        keep_lines: int | None = 5000,
    ) -> None:
        self.port = port or free_port()
        self.metrics_port = free_port() if metrics else 0
        cmd = [sys.executable, "-m", "kshare", "proxy"]
        if upstream is not None:
            cmd += ["--upstream", upstream]
        cmd += ["--port", str(self.port), "--broker-port-base", "0"]
        if upstream is not None:
            cmd += ["--state-topic", f"__kshare_bench_{uuid.uuid4().hex[:8]}", "--state-topic-partitions", "1"]
        if metrics:
            cmd += ["--metrics-port", str(self.metrics_port)]
        for limit in limits:
            cmd += ["--group-limit", limit]
        cmd += list(extra)
        if ready is None:
            ready = r"upstream cluster has \d+ broker" if "--no-share-groups" in extra else r"share state loaded"
        super().__init__(name, cmd, ready, env={**kshare_env(), **(env or {})}, log_path=log_path,
                         keep_lines=keep_lines)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def ready(self) -> dict[str, Any] | None:
        """Its /ready document (ready or not), None while it does not answer."""
        return proxy_ready(self.metrics_port)

    def metrics(self) -> dict[str, float]:
        """The proxy's Prometheus metrics, unlabelled series summed by name."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        # 10,000 share-partitions x 1,000 members make a large page, slow to build on a busy machine
        text = urllib.request.urlopen(url, timeout=60).read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            name = re.split(r"[{ ]", line, maxsplit=1)[0]
            with contextlib.suppress(ValueError):
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        return out


def start_relay(listen: str, upstream: str, log_path: Path | None = None) -> Child:
    cmd = [sys.executable, "-m", "kshare.bench.relay", "--listen", listen, "--upstream", upstream]
    return Child("relay", cmd, r"relay listening", env=kshare_env(), log_path=log_path).start()


# --------------------------------------------------------------------------------------------
# profiling


def py_spy() -> str | None:
    venv_bin = Path(sys.executable).parent / "py-spy"
    return str(venv_bin) if venv_bin.exists() else shutil.which("py-spy")


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


def machine_info(repo: Path | None = None) -> dict[str, object]:
    """CPU, Python, client library versions, the kshare commit (of ``repo``, default: kshare's checkout)."""
    import kshare

    info: dict[str, object] = {
        "nproc": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "kshare": kshare.__version__,
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
    repo = repo or Path(kshare.__file__).resolve().parent.parent
    with contextlib.suppress(Exception):
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=repo
        )
        if head.returncode == 0:
            dirty = subprocess.run(
                ["git", "status", "--porcelain", "--", "kshare"], capture_output=True, text=True, cwd=repo
            ).stdout.strip()
            info["kshare_commit"] = head.stdout.strip() + (" (kshare/ has local changes)" if dirty else "")
    with contextlib.suppress(Exception):
        java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()[0]
        info["java"] = java
    return info
