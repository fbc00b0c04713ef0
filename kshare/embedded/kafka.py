"""The embedded Apache Kafka broker: one KRaft node (broker and controller in one JVM) on loopback.

``kshare proxy`` without ``--upstream`` starts one when Java 17+ is at hand, so a first try meets
a real Kafka: its jars are fetched once from Maven Central into the user's cache
(:mod:`.distribution`), its topics, records and kshare's share state live in a data directory that
outlives the proxy, it logs to a rolling file there, and it stops with the proxy (SIGTERM, or
the parent-death signal when the proxy is killed).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from . import distribution
from .process import EmbeddedProcess, terminate

log = logging.getLogger("kshare.embedded")

KAFKA_VERSION = "3.9.2"
"""The release embedded: the one kshare's tests front."""
MIN_JAVA = 17

# A laptop's footprint: a small heap, short GC pauses (the proxy's latency is the broker's too).
JVM_OPTS = (
    "-Xms128m",
    "-Xmx512m",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
    "-Djava.net.preferIPv4Stack=true",
)


class EmbeddedError(RuntimeError):
    """The embedded broker could not be fetched or started."""


def default_data_dir() -> Path:
    """``$XDG_DATA_HOME/kshare`` or ``~/.local/share/kshare``."""
    base = os.environ.get("XDG_DATA_HOME")
    return (Path(base).expanduser() if base else Path.home() / ".local" / "share") / "kshare"


def java_major(java: str) -> int | None:
    """The major version ``java -version`` reports (8 for 1.8), or None if it does not run."""
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not found:
        return None
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major


def find_java() -> tuple[str | None, str]:
    """(path of a Java 17+ ``java``, or None; what was found, for a message)."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home and (Path(home) / "bin" / "java").is_file() else shutil.which("java")
    if java is None:
        return None, "no java on PATH or in JAVA_HOME"
    major = java_major(java)
    if major is None:
        return None, f"{java} does not report a version"
    if major < MIN_JAVA:
        return None, f"{java} is Java {major}"
    return java, f"{java} is Java {major}"


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _cluster_id() -> str:
    # Kafka's format: URL-safe base64 of a UUID; one starting with "-" would read as an option.
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def _tail(path: Path, lines: int = 25) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 32 * 1024))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty)"


def _set_parent_death_signal() -> None:
    """In the child: SIGTERM (a clean shutdown) when the proxy dies, even by SIGKILL (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


@contextlib.contextmanager
def download_bar(manifest: distribution.Manifest) -> Iterator[distribution.Progress]:
    """A progress bar on stderr for the first fetch (log lines only, when stderr is not a terminal)."""
    mb = manifest.size / 1e6
    log.info("fetching Apache Kafka %s for the embedded broker: %d jars, %.0f MB from %s, once (cached in %s)",
             manifest.version, len(manifest.jars), mb, distribution.repository(), distribution.cache_root())
    if not sys.stderr.isatty():
        yield lambda n: None
        return
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    with Progress(TextColumn(f"Apache Kafka {manifest.version}"), BarColumn(), DownloadColumn(),
                  TransferSpeedColumn(), TimeRemainingColumn(), transient=True) as bar:
        task = bar.add_task("fetch", total=manifest.size)
        yield lambda n: bar.advance(task, n)


class EmbeddedKafka(EmbeddedProcess):
    """A single-node KRaft Apache Kafka whose data lives in ``data_dir / "embedded-kafka"``."""

    kind = "kafka"

    def __init__(self, data_dir: Path, *, java: str, host: str = "127.0.0.1", version: str = KAFKA_VERSION,
                 progress: Callable[[distribution.Manifest], contextlib.AbstractContextManager[distribution.Progress]]
                 | None = download_bar) -> None:
        self.java = java
        self.host = host
        self.version = version
        # absolute: the broker runs in its own directory and reads the paths it is given from there
        self.home = Path(data_dir).expanduser().resolve() / "embedded-kafka"
        self.log_dirs = self.home / "data"
        self.config_path = self.home / "server.properties"
        self.log_path = self.home / "server.log"
        self.stdout_path = self.home / "stdout.log"
        self.progress = progress
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.start_seconds: float | None = None
        self._lock: IO[str] | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def description(self) -> str:
        return f"Apache Kafka {self.version}"

    # -- start
    def start(self, timeout: float = 120.0) -> EmbeddedKafka:
        t0 = time.monotonic()
        self.home.mkdir(parents=True, exist_ok=True)
        self._take_lock()
        try:
            try:
                libs = distribution.fetch(self.version, progress=self.progress)
            except distribution.FetchError as exc:
                raise EmbeddedError(f"cannot fetch Apache Kafka {self.version}: {exc}") from None
            self.port = free_port(self.host)
            controller_port = free_port(self.host)
            self._write_config(controller_port)
            classpath = str(libs / "*")
            if not (self.log_dirs / "meta.properties").is_file():
                self._format(classpath)
            self._spawn(classpath)
            self._wait_listening(t0 + timeout)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def _take_lock(self) -> None:
        lock = open(self.home / ".lock", "a+")  # noqa: SIM115 - held while the broker runs
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            raise EmbeddedError(f"the embedded broker's data directory {self.home} is in use by another kshare "
                                f"proxy: stop it, or give this one another --data-dir") from None
        self._lock = lock

    def _write_config(self, controller_port: int) -> None:
        props: dict[str, object] = {
            "process.roles": "broker,controller",
            "node.id": 1,
            "controller.quorum.voters": f"1@{self.host}:{controller_port}",
            "listeners": f"PLAINTEXT://{self.host}:{self.port},CONTROLLER://{self.host}:{controller_port}",
            "advertised.listeners": f"PLAINTEXT://{self.host}:{self.port}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": self.log_dirs,
            "num.partitions": 1,
            "default.replication.factor": 1,
            "min.insync.replicas": 1,
            "auto.create.topics.enable": "true",
            "offsets.topic.replication.factor": 1,
            "offsets.topic.num.partitions": 1,
            "transaction.state.log.replication.factor": 1,
            "transaction.state.log.min.isr": 1,
            "transaction.state.log.num.partitions": 1,
            "group.initial.rebalance.delay.ms": 0,
            # a laptop's share of threads and disk
            "num.network.threads": 2,
            "num.io.threads": 4,
            "background.threads": 2,
            "num.recovery.threads.per.data.dir": 1,
            "log.segment.bytes": 64 * 1024 * 1024,
            "log.cleaner.threads": 1,
            "log.cleaner.dedupe.buffer.size": 8 * 1024 * 1024,
        }
        text = "# written by kshare proxy at every start (the ports change); the data is in log.dirs\n"
        self.config_path.write_text(text + "".join(f"{k}={v}\n" for k, v in props.items()))

    def _log_opts(self) -> list[str]:
        return [f"-Dkafka.logs.dir={self.home}",
                f"-Dlog4j.configuration=file:{Path(__file__).resolve().parent / 'log4j.properties'}"]

    def _format(self, classpath: str) -> None:
        """Format the metadata log, once: a restart finds it and keeps everything."""
        cmd = [self.java, "-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", *self._log_opts(),
               "-cp", classpath, "kafka.tools.StorageTool", "format", "-t", _cluster_id(),
               "-c", str(self.config_path)]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
        if proc.returncode != 0:
            raise EmbeddedError(f"formatting {self.log_dirs} failed (exit {proc.returncode}): "
                                f"{proc.stdout.strip()[-2000:]}")

    def _spawn(self, classpath: str) -> None:
        cmd = [self.java, *JVM_OPTS, *self._log_opts(), "-cp", classpath, "kafka.Kafka", str(self.config_path)]
        with open(self.stdout_path, "ab") as out:
            self.process = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=self.home,
                # its own session: a Ctrl-C in the terminal reaches the proxy, which stops the broker
                # after its last state writes
                start_new_session=True, preexec_fn=_set_parent_death_signal,
            )

    def _wait_listening(self, deadline: float) -> None:
        while True:
            assert self.process is not None
            if self.process.poll() is not None:
                raise EmbeddedError(f"the embedded Apache Kafka exited with code {self.process.returncode} while "
                                    f"starting; the end of {self.log_path}:\n{_tail(self.log_path)}")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5):
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise EmbeddedError(f"the embedded Apache Kafka did not listen on {self.bootstrap} in time; "
                                    f"the end of {self.log_path}:\n{_tail(self.log_path)}")
            time.sleep(0.1)

    # -- stop
    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (a controlled shutdown that keeps every record), SIGKILL after ``timeout``."""
        proc, self.process = self.process, None
        if terminate(proc, timeout):
            log.warning("the embedded Apache Kafka did not stop within %.0f s of SIGTERM: killed", timeout)
        if self._lock is not None:
            self._lock.close()
            self._lock = None
