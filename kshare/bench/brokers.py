"""Real Apache Kafka brokers for ``kshare bench`` (and, through ``tests/harness/brokers.py``, the tests).

* :func:`ensure_kafka` resolves an Apache Kafka broker (``kafka_2.13`` and its runtime
  dependencies) from Maven Central into a cache outside the repository and returns the
  directory of jars.  ``python -m kshare.bench.brokers fetch 3.9.2 4.4.0`` does the same from a shell.
* :class:`KafkaBroker` runs a single-node KRaft Apache Kafka (broker + controller in one JVM)
  on free loopback ports, optionally with share groups (Kafka 4.x).
* :class:`kshare.bench.three_nodes.ThreeNodeCluster` runs three such nodes as one KRaft cluster
  (``kshare bench --only failover``).

Brokers run in their own session/process group, are killed as a group, die with the process
that started them (parent-death signal, when started from the main thread) and are killed
at interpreter exit.  Only what the bench runs lives here: the tests' secure brokers (SASL, TLS,
ACLs) and the Tansu broker are test fixtures, in ``tests/harness/brokers.py``.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..embedded import distribution
from ..embedded.distribution import cache_root
from ..embedded.kafka import JVM_OPTS as _EMBEDDED_JVM_OPTS
from .clients import create_topic
from .procs import _die_with_parent, free_port, port_open

__all__ = [
    "KAFKA_3",
    "KAFKA_4",
    "BrokerError",
    "KafkaBroker",
    "cache_root",
    "ensure_kafka",
    "free_port",
]

log = logging.getLogger("kshare.bench.brokers")

KAFKA_3 = "3.9.2"
"""The Apache Kafka release without share groups that the tests proxy in front of."""
KAFKA_4 = "4.4.0"
"""The newest Apache Kafka release on Maven Central; has native share groups."""

_HERE = Path(__file__).resolve().parent
_KAFKA_DIR = _HERE / "kafka"
_POM = _KAFKA_DIR / "pom.xml"

# Maven Central has no kafka-tools-api / kafka-tools for these releases although kafka_2.13
# declares kafka-tools-api as a runtime dependency.  kafka-tools-api only holds a few interfaces
# (record readers, decoders) that the broker does not load; the given release's jar stands in.
_TOOLS_API_SUBSTITUTE = {"4.4.0": "4.3.1"}


class BrokerError(RuntimeError):
    """A broker could not be fetched, formatted or started."""


# --------------------------------------------------------------------------------------------
# fetching Apache Kafka from Maven Central


def _maven_args(version: str) -> list[str]:
    args = [f"-Dkafka.version={version}"]
    if int(version.split(".")[0]) >= 4:
        args.append("-Dlog4j2")
    if version in _TOOLS_API_SUBSTITUTE:
        args += ["-DnoTools", f"-Dkafka.tools.api.version={_TOOLS_API_SUBSTITUTE[version]}"]
    return args


def _recipe(version: str) -> str:
    """Digest of what decides the jar set: the pom and the Maven arguments for ``version``."""
    h = hashlib.sha256(_POM.read_bytes())
    h.update(" ".join(_maven_args(version)).encode())
    return h.hexdigest()[:16]


def ensure_kafka(version: str = KAFKA_3, *, timeout: float = 1200.0, quiet: bool = True) -> Path:
    """Return the directory holding the jars of Apache Kafka ``version``, fetching them if needed.

    A release kshare ships a manifest for (3.9.2, the embedded broker's) is downloaded as ``kshare
    proxy`` downloads it (:mod:`kshare.embedded.distribution`), so the tests and the embedded broker
    share one fetch. Other releases are resolved by Maven from kshare/bench/kafka/pom.xml. Either
    way the jars live in ``<cache_root()>/kafka-<version>/libs``, concurrent callers wait for one
    fetch, and a fetch cut short is redone.
    """
    try:
        if distribution.load_manifest(version) is not None:
            return distribution.fetch(version, timeout=timeout)
        recipe = _recipe(version)
        if distribution.is_complete(version, recipe):
            return distribution.libs_dir(version)
        with distribution.locked(version, timeout):
            if distribution.is_complete(version, recipe):  # someone else finished while we waited
                return distribution.libs_dir(version)
            libs = distribution.install(
                version, recipe, lambda target: _maven_fetch(version, target, timeout=timeout, quiet=quiet),
                maven_args=_maven_args(version))
            log.info("fetched Apache Kafka %s with Maven into %s", version, libs)
            return libs
    except distribution.FetchError as exc:
        raise BrokerError(str(exc)) from None


def _maven_fetch(version: str, target: Path, *, timeout: float, quiet: bool) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise BrokerError("Maven (mvn) is not on PATH; it is needed to fetch Apache Kafka")
    cmd = _die_with_parent([mvn, "-B", *(["-q"] if quiet else []), "-f", str(_POM), *_maven_args(version),
                            "dependency:copy-dependencies", "-DincludeScope=runtime", f"-DoutputDirectory={target}"])
    log.info("fetching Apache Kafka %s: %s", version, " ".join(cmd))
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise BrokerError(f"Maven did not fetch Apache Kafka {version} within {timeout:.0f} s") from e
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.splitlines()[-30:])
        raise BrokerError(f"Maven failed to fetch Apache Kafka {version} (exit {proc.returncode}):\n{tail}")


# --------------------------------------------------------------------------------------------
# process helpers


_live: set[_Process] = set()  # running brokers, killed at exit




def _tail(path: Path | None, lines: int = 60) -> str:
    if path is None or not path.exists():
        return "(no log)"
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - 64 * 1024))
        data = f.read().decode("utf-8", "replace")
    return "\n".join(data.splitlines()[-lines:]) or "(empty)"


def _quiet_logger() -> logging.Logger:
    return logging.getLogger("kshare.bench.brokers.librdkafka")


def _admin(bootstrap: str, **extra: Any):
    from confluent_kafka.admin import AdminClient

    conf = {"bootstrap.servers": bootstrap, "logger": _quiet_logger(), "socket.timeout.ms": 10000}
    conf.update(extra)
    return AdminClient(conf)


class _Process:
    """Common process handling: own process group, parent-death signal, SIGTERM/SIGKILL."""

    name = "broker"
    host = "127.0.0.1"
    stop_timeout = 20.0
    _stop_timeout_level = logging.WARNING
    port: int
    log_path: Path
    _stdout_path: Path

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.die_with_parent = True

    # -- properties
    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    # -- lifecycle
    def _spawn(
        self, cmd: list[str], *, env: Mapping[str, str] | None = None, cwd: Path | None = None
    ) -> None:
        if self.die_with_parent:
            cmd = _die_with_parent(cmd)
        out = open(self._stdout_path, "ab")
        try:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=dict(env) if env is not None else None,
                start_new_session=True,  # own session and process group: killpg() takes all of it
            )
        finally:
            out.close()
        _live.add(self)

    def _signal_group(self, sig: int) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)  # pgid == pid (start_new_session)

    def stop(self, timeout: float | None = None) -> None:
        """SIGTERM the process group, wait up to ``timeout`` s (default ``stop_timeout``), then SIGKILL it."""
        if self.proc is None:
            return
        if timeout is None:
            timeout = self.stop_timeout
        if self.proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.log(
                    self._stop_timeout_level,
                    "%s %s still running %.0f s after SIGTERM; killing",
                    self.name,
                    self.bootstrap,
                    timeout,
                )
        self._signal_group(signal.SIGKILL)  # stragglers in the group, if any
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        _live.discard(self)

    def kill(self) -> None:
        """SIGKILL the process group at once (a crash, for recovery tests)."""
        if self.proc is None:
            return
        self._signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        _live.discard(self)

    def _wait_ready(self, timeout: float, probe) -> None:
        deadline = time.monotonic() + timeout
        last_error: object = None
        while True:
            if self.proc is None or self.proc.poll() is not None:
                code = None if self.proc is None else self.proc.returncode
                raise BrokerError(
                    f"{self.name} exited with code {code} while starting.\n{self._logs_for_error()}"
                )
            if port_open(self.port):
                try:
                    if probe():
                        return
                except Exception as e:  # noqa: BLE001 - keep polling, report the last one
                    last_error = e
            if time.monotonic() > deadline:
                self.kill()
                raise BrokerError(
                    f"{self.name} on {self.bootstrap} not ready within {timeout:.0f} s "
                    f"(last probe error: {last_error!r}).\n{self._logs_for_error()}"
                )
            time.sleep(0.1)

    def _logs_for_error(self) -> str:
        parts = [f"--- tail of {self.log_path} ---\n{_tail(self.log_path)}"]
        if self._stdout_path != self.log_path:
            parts.append(f"--- tail of {self._stdout_path} ---\n{_tail(self._stdout_path, 30)}")
        return "\n".join(parts)

    def _probe_metadata(self) -> bool:
        md = _admin(self.bootstrap).list_topics(timeout=3)
        return bool(md.brokers)

    # -- topics
    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        configs: Mapping[str, str] | None = None,
        *,
        replication_factor: int = 1,
        timeout: float = 30.0,
    ) -> str:
        """Create ``name`` with confluent_kafka's AdminClient and wait until every partition has a leader."""
        try:
            return create_topic(self.bootstrap, name, partitions, timeout, configs=configs,
                                replication_factor=replication_factor)
        except TimeoutError as exc:
            raise BrokerError(str(exc)) from None

    def delete_topic(self, name: str, timeout: float = 30.0) -> None:
        admin = _admin(self.bootstrap)
        admin.delete_topics([name], operation_timeout=timeout, request_timeout=timeout)[name].result(timeout)

    def admin(self, **conf: Any):
        """A confluent_kafka AdminClient for this broker."""
        return _admin(self.bootstrap, **conf)

    # -- context manager
    def __enter__(self):
        if not self.running:
            try:
                self.start()
            except BaseException:
                self.close()
                raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.stop()

    def start(self):  # pragma: no cover - overridden
        raise NotImplementedError

    def restart(self, *, hard: bool = False):
        """Stop (SIGTERM, or SIGKILL with ``hard=True``) and start again on the same ports (and data,
        where the broker keeps it: Apache Kafka does, Tansu's memory storage does not)."""
        if hard:
            self.kill()
        else:
            self.stop()
        return self.start()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<{type(self).__name__} {self.bootstrap} {state}>"


# --------------------------------------------------------------------------------------------
# Apache Kafka


def _cluster_id() -> str:
    # Kafka's format: URL-safe base64 of a UUID. One starting with "-" would be read as an option
    # by the storage tool's argument parser, so draw again (Kafka's own tool does the same).
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def _start_timeout() -> float:
    """Seconds a broker may take to answer metadata: ``$KSHARE_BROKER_START_TIMEOUT`` or 90.

    An idle 2-core machine starts Kafka in 3-5 s; with the CPUs saturated by other work it was
    seen to take 40 s.
    """
    return float(os.environ.get("KSHARE_BROKER_START_TIMEOUT", "90"))


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return str(Path(home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise BrokerError("java is not on PATH (Java 17+ is needed to run Apache Kafka)")
    return java



# the embedded broker's options (small heap, short GC pauses), with a larger initial heap
DEFAULT_JVM_OPTS = ("-Xms256m", *(o for o in _EMBEDDED_JVM_OPTS if not o.startswith("-Xms")))


class KafkaBroker(_Process):
    """A single-node KRaft Apache Kafka (``process.roles=broker,controller``) on loopback.

    >>> with KafkaBroker("3.9.2") as kafka:
    ...     kafka.create_topic("t", partitions=3)
    ...     produce_to(kafka.bootstrap)

    ``share_groups=True`` (Kafka 4.x) formats the metadata log with ``share.version``
    (``share_version``, default: the release's default, 2 on 4.4 -- 2 adds the dead-letter queue);
    with ``share_groups=False`` a 4.x broker is formatted with ``share.version=0`` so it behaves
    like a cluster without share groups.  ``config`` overrides or adds server.properties entries.
    ``stop()`` keeps the data directory and ports, so ``start()``/``restart()`` bring the same
    broker back; ``close()`` (and leaving the ``with`` block) also deletes the directory.

    The tests' secure brokers (SASL and TLS listeners, users, ACLs) extend this class in
    ``tests/harness/brokers.py``.
    """

    name = "kafka"

    def __init__(
        self,
        version: str = KAFKA_3,
        *,
        share_groups: bool = False,
        share_version: int | None = None,
        auto_create_topics: bool = True,
        node_id: int = 1,
        config: Mapping[str, object] | None = None,
        jvm_opts: Iterable[str] | None = None,
        libs: Path | str | None = None,
        workdir: Path | str | None = None,
        keep_workdir: bool | None = None,
        start_timeout: float | None = None,
        die_with_parent: bool = True,
    ) -> None:
        super().__init__()
        self.version = version
        self.major = int(version.split(".")[0])
        if share_groups and self.major < 4:
            raise ValueError(f"Apache Kafka {version} has no share groups (needs 4.x)")
        self.share_groups = share_groups
        self.share_version = share_version
        self.auto_create_topics = auto_create_topics
        self.node_id = node_id
        self.extra_config = dict(config or {})
        self.jvm_opts = list(jvm_opts) if jvm_opts is not None else list(DEFAULT_JVM_OPTS)
        env_opts = os.environ.get("KSHARE_KAFKA_JVM_OPTS")
        if env_opts:
            self.jvm_opts += env_opts.split()
        self._libs = Path(libs) if libs is not None else None
        self.start_timeout = start_timeout if start_timeout is not None else _start_timeout()
        self.die_with_parent = die_with_parent
        if keep_workdir is None:
            keep_workdir = bool(os.environ.get("KSHARE_KEEP_BROKER_DIRS"))
        self.keep_workdir = keep_workdir
        self._own_workdir = workdir is None
        self.workdir = (
            Path(workdir)
            if workdir is not None
            else Path(tempfile.mkdtemp(prefix=f"kshare-kafka-{version}-"))
        )
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.data_dir = self.workdir / "data"
        self.config_path = self.workdir / "server.properties"
        self.log_path = self.workdir / "server.log"
        self._stdout_path = self.workdir / "stdout.log"
        self.port = free_port()
        self.controller_port = free_port()
        self.cluster_id = _cluster_id()
        self._formatted = False
        self.start_seconds: float | None = None

    # -- configuration
    def server_properties(self) -> dict[str, str]:
        props: dict[str, object] = {
            "process.roles": "broker,controller",
            "node.id": self.node_id,
            "controller.quorum.voters": f"{self.node_id}@{self.host}:{self.controller_port}",
            "listeners": f"PLAINTEXT://{self.host}:{self.port},CONTROLLER://{self.host}:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{self.host}:{self.port}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": self.data_dir,
            "num.partitions": 1,
            "default.replication.factor": 1,
            "min.insync.replicas": 1,
            "auto.create.topics.enable": str(self.auto_create_topics).lower(),
            "delete.topic.enable": "true",
            "offsets.topic.replication.factor": 1,
            "offsets.topic.num.partitions": 1,
            "offsets.topic.segment.bytes": 16 * 1024 * 1024,
            "transaction.state.log.replication.factor": 1,
            "transaction.state.log.min.isr": 1,
            "transaction.state.log.num.partitions": 1,
            "transaction.state.log.segment.bytes": 16 * 1024 * 1024,
            "group.initial.rebalance.delay.ms": 0,
            # a SIGKILLed broker re-registers only after its old session expired (default 9 s)
            "broker.heartbeat.interval.ms": 1000,
            "broker.session.timeout.ms": 4000,
            # a small footprint for a 2-core machine
            "num.network.threads": 2,
            "num.io.threads": 4,
            "background.threads": 2,
            "num.recovery.threads.per.data.dir": 1,
            "num.replica.fetchers": 1,
            "log.segment.bytes": 64 * 1024 * 1024,
            "log.index.size.max.bytes": 1024 * 1024,
            "log.cleaner.threads": 1,
            "log.cleaner.dedupe.buffer.size": 8 * 1024 * 1024,
            "log.retention.check.interval.ms": 60000,
            "socket.send.buffer.bytes": -1,
            "socket.receive.buffer.bytes": -1,
        }
        if self.major >= 4:
            props.update(
                {
                    "share.coordinator.state.topic.replication.factor": 1,
                    "share.coordinator.state.topic.min.isr": 1,
                    "share.coordinator.state.topic.num.partitions": 1,
                    "share.coordinator.state.topic.segment.bytes": 16 * 1024 * 1024,
                }
            )
        props.update(self.extra_config)
        return {k: str(v) for k, v in props.items()}

    def _write_config(self) -> None:
        lines = [f"{k}={v}" for k, v in self.server_properties().items()]
        self.config_path.write_text("# written by kshare/bench/brokers.py\n" + "\n".join(lines) + "\n")

    @property
    def libs(self) -> Path:
        if self._libs is None:
            self._libs = ensure_kafka(self.version)
        return self._libs

    def _classpath(self) -> str:
        return str(self.libs / "*")

    def _log_opts(self) -> list[str]:
        opts = [f"-Dkafka.logs.dir={self.workdir}"]
        if self.major >= 4:
            opts.append(f"-Dlog4j2.configurationFile={_KAFKA_DIR / 'log4j2.properties'}")
        else:
            opts.append(f"-Dlog4j.configuration=file:{_KAFKA_DIR / 'log4j.properties'}")
        return opts

    def format_cmd(self) -> list[str]:
        cmd = [
            _java(),
            "-Xmx256m",
            "-XX:TieredStopAtLevel=1",
            "-XX:+UseSerialGC",
            *self._log_opts(),
            "-cp",
            self._classpath(),
            "kafka.tools.StorageTool",
            "format",
            "-t",
            self.cluster_id,
            "-c",
            str(self.config_path),
        ]
        if self.major >= 4:
            if not self.share_groups:
                cmd += ["--feature", "share.version=0"]
            elif self.share_version is not None:
                cmd += ["--feature", f"share.version={self.share_version}"]
            # else: the release default (share.version=2 at metadata version 4.4-IV2)
        return cmd

    def _format(self) -> None:
        self._write_config()
        proc = subprocess.run(
            self.format_cmd(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120
        )
        if proc.returncode != 0:
            raise BrokerError(
                f"formatting {self.data_dir} failed (exit {proc.returncode}):\n{proc.stdout[-4000:]}"
            )
        self._formatted = True

    # -- lifecycle
    def start(self) -> KafkaBroker:
        """Format (first time only), start the JVM and wait until it serves metadata."""
        if self.running:
            return self
        t0 = time.monotonic()
        if not self._formatted:
            self._format()
        cmd = [
            _java(),
            *self.jvm_opts,
            *self._log_opts(),
            "-cp",
            self._classpath(),
            "kafka.Kafka",
            str(self.config_path),
        ]
        self._spawn(cmd, cwd=self.workdir)
        self._wait_ready(self.start_timeout, self._probe_metadata)
        self.start_seconds = time.monotonic() - t0
        log.info("Apache Kafka %s ready on %s in %.1f s", self.version, self.bootstrap, self.start_seconds)
        return self

    def close(self) -> None:
        self.stop()
        if self._own_workdir and not self.keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _probe_metadata(self) -> bool:
        md = _admin(self.bootstrap).list_topics(timeout=3)
        return self.node_id in md.brokers



def __getattr__(name: str) -> Any:
    # ThreeNodeCluster lives in .three_nodes, which builds on this module (kshare bench's failover
    # scenario imports it from here)
    if name in ("ThreeNodeCluster", "THREE_NODE_JVM_OPTS"):
        from . import three_nodes

        return getattr(three_nodes, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --------------------------------------------------------------------------------------------
# command line


def command_line(prog: str) -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The parser of ``fetch`` and ``run``, and its ``run`` sub-parser (the tests' harness adds options)."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_fetch = sub.add_parser("fetch", help="resolve Apache Kafka releases into the cache")
    p_fetch.add_argument("versions", nargs="*", default=[KAFKA_3, KAFKA_4])
    p_fetch.add_argument("-v", "--verbose", action="store_true", help="show Maven's output")
    p_run = sub.add_parser("run", help="run a broker in the foreground until Ctrl-C")
    p_run.add_argument("version", help="an Apache Kafka version")
    p_run.add_argument("--share-groups", action="store_true")
    p_run.add_argument("--no-auto-create", action="store_true")
    return parser, p_run


def _main(argv: list[str] | None = None, prog: str = "python -m kshare.bench.brokers") -> int:
    args = command_line(prog)[0].parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.cmd == "fetch":
        return fetch(args.versions, verbose=args.verbose)
    broker = KafkaBroker(args.version, share_groups=args.share_groups, auto_create_topics=not args.no_auto_create)
    return run_until_interrupted(broker, args.version)


def fetch(versions: Iterable[str], *, verbose: bool = False) -> int:
    """``fetch``: resolve each Apache Kafka release into the cache and say where it is."""
    for version in versions:
        t0 = time.monotonic()
        libs = ensure_kafka(version, quiet=not verbose)
        print(f"kafka {version}: {libs} ({len(list(libs.glob('*.jar')))} jars, {time.monotonic() - t0:.1f} s)")
    return 0


def run_until_interrupted(broker: _Process, version: str, describe: Any = None) -> int:
    """``run``: the broker in the foreground until Ctrl-C or SIGTERM; ``describe(broker)`` prints more."""
    with broker:
        print(f"{broker.name} {version} on {broker.bootstrap}, log {broker.log_path}", flush=True)
        if describe is not None:
            describe(broker)
        with contextlib.suppress(KeyboardInterrupt):
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
            while broker.running:
                time.sleep(1)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
