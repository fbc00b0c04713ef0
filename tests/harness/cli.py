"""kshare as a user runs it from a shell: ``kshare ARGS`` to completion (:func:`run_kshare`), and
``kshare proxy`` in the background with its log (stderr) and stdout in files apart
(:class:`KshareProxy`), for the first-hour and console tests."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from kshare.bench.procs import _die_with_parent, free_port, port_open
from kshare.embedded.process import terminate

log = logging.getLogger("kshare.tests.cli")

REPO = Path(__file__).resolve().parents[2]
# ``python -m kshare`` with the repository root as working directory: this checkout's code
KSHARE = [sys.executable, "-m", "kshare"]


def user_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **extra}
    return env


def run_kshare(*args: str, input: str | None = None, timeout: float = 60.0,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``kshare ARGS`` as a user types it; killed after ``timeout`` seconds."""
    t0 = time.monotonic()
    proc = subprocess.run([*KSHARE, *args], input=input, capture_output=True, text=True, timeout=timeout,
                          cwd=REPO, env=env or user_env(), stdin=None if input is not None else subprocess.DEVNULL)
    log.info("kshare %s -> %d in %.1f s\nstdout: %s\nstderr: %s", " ".join(args), proc.returncode,
             time.monotonic() - t0, proc.stdout, proc.stderr)
    return proc


def one_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line, got {len(lines)}:\n{text}"
    return lines[0]


def http_get(url: str, timeout: float = 10.0) -> tuple[int, str]:
    """(status, body) of a GET; error statuses are answers too."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _cmdline(pid: int) -> bytes | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None


def _descendants(pid: int) -> dict[int, bytes]:
    """Child processes of ``pid``, recursively, with their command lines (Linux /proc)."""
    out: dict[int, bytes] = {}
    todo = [pid]
    while todo:
        p = todo.pop()
        for children in Path(f"/proc/{p}/task").glob("*/children"):
            with contextlib.suppress(OSError, ValueError):
                for c in map(int, children.read_text().split()):
                    cmd = _cmdline(c)
                    if c not in out and cmd is not None:
                        out[c] = cmd
                        todo.append(c)
    return out


class KshareProxy:
    """``python -m kshare proxy --port P --broker-port-base 0 --metrics-port M ARGS`` as a child process.

    Its stderr (the log) goes to a file, read at any time with :meth:`log`.
    """

    def __init__(self, workdir: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.metrics_port = free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.metrics_address = f"127.0.0.1:{self.metrics_port}"
        self.args = ["proxy", "--port", str(self.port), "--broker-port-base", "0",
                     "--metrics-port", str(self.metrics_port), *args]
        self.env = env or user_env()
        workdir.mkdir(parents=True, exist_ok=True)
        self.stderr_path = workdir / "proxy.stderr"
        self.stdout_path = workdir / "proxy.stdout"
        self.process: subprocess.Popen | None = None
        self.children: dict[int, bytes] = {}  # what it started (the embedded broker): pid -> command line
        self.started_at = 0.0

    def url(self, path: str) -> str:
        return f"http://{self.metrics_address}{path}"

    def start(self) -> KshareProxy:
        log.info("starting kshare %s", " ".join(self.args))
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.process = subprocess.Popen(_die_with_parent([*KSHARE, *self.args]), stdin=subprocess.DEVNULL,
                                            stdout=out, stderr=err, cwd=REPO, env=self.env)
        self.started_at = time.monotonic()
        return self

    @contextlib.contextmanager
    def accepting(self, timeout: float = 30.0) -> Iterator[KshareProxy]:
        """Started, once its port accepts connections; stopped at the end of the ``with`` block."""
        try:
            self.start().wait_accepting(timeout)
            yield self
        finally:
            self.stop()

    def log(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")
        except OSError:
            return ""

    def _check_alive(self) -> None:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"the proxy exited ({self.process.returncode}):\n{self.log()}")

    def wait_accepting(self, timeout: float = 30.0) -> None:
        """Until the bootstrap port accepts connections (polled every 20 ms)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            if port_open(self.port):
                self._note_children()
                return
            time.sleep(0.02)
        raise AssertionError(f"the proxy did not listen on {self.bootstrap} in {timeout:.0f} s:\n{self.log()}")

    def wait_log(self, pattern: str, timeout: float = 60.0) -> re.Match:
        """Until a log line matches ``pattern`` (the harness's own wait, independent of ``kshare ready``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            m = re.search(pattern, self.log())
            if m:
                return m
            time.sleep(0.1)
        raise AssertionError(f"no log line matching {pattern!r} in {timeout:.0f} s:\n{self.log()}")

    def wait_loaded(self, timeout: float = 60.0) -> None:
        self.wait_log(r"share state loaded in", timeout)

    def _note_children(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.children.update(_descendants(self.process.pid))

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 15 s; then whatever it started (the embedded broker) is killed too."""
        if self.process is None:
            return
        self._note_children()
        terminate(self.process, 15)
        for pid, cmd in self.children.items():
            if _cmdline(pid) == cmd:  # the same process still running: the proxy left it behind
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
                    log.warning("killed process %d left behind by the proxy: %r", pid, cmd)
        self.children.clear()
        log.info("proxy log:\n%s", self.log())
