"""Helpers for end-to-end share-group tests: kshare (proxy + share-group service) in a thread,
group configs through the proxy, producers, confluent ShareConsumer loops, raw protocol calls.

Nothing here stands in for the proxy, the broker or the client: ``ShareProxyThread`` runs the
product's ``KShare`` on uvloop, consumers are librdkafka's ``ShareConsumer``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import AcknowledgeType, Consumer, KafkaException, Producer, ShareConsumer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from kshare.app import KShare
from kshare.proxy.config import ProxyConfig, parse_hostports
from kshare.share.config import BrokerLimits
from tests.proxy_harness import LoopThread

log = logging.getLogger("kshare.tests.share")

# Broker-level bounds low enough for tests (Kafka's are 45 s session timeout, 5 s heartbeat).
TEST_LIMITS = BrokerLimits(min_session_timeout_ms=1000, min_heartbeat_interval_ms=100,
                           min_record_lock_duration_ms=1000)


def quiet_logger() -> logging.Logger:
    return logging.getLogger("kshare.tests.share.librdkafka")


# ------------------------------------------------------------------------------------------------
# kshare in a thread


class ShareProxyThread(LoopThread):
    """``KShare`` (proxy + share-group service with its state on the fronted cluster) on its own
    uvloop event loop in a background thread."""

    thread_name = "kshare-share-proxy"
    start_slack = 10.0
    join_timeout = 30.0

    def __init__(self, upstream: str, *, limits: BrokerLimits = TEST_LIMITS, start_timeout: float = 60.0,
                 metrics_port: int | None = None, **config: object) -> None:
        super().__init__()
        config.setdefault("bootstrap_port", 0)
        config.setdefault("broker_port_base", 0)
        # A state topic of its own: a store prunes its topic below what *it* knows, so two
        # instances must not share one (pass ``state_topic`` to restart on the same state).
        config.setdefault("state_topic", f"__kshare_state_test_{uuid.uuid4().hex[:10]}")
        config.setdefault("state_topic_partitions", 3)
        self.config = ProxyConfig(upstream=parse_hostports(upstream), group_limits=limits,
                                  **config)  # type: ignore[arg-type]
        self.start_timeout = start_timeout
        self.metrics_port = metrics_port  # 0: a free port, read back from app.metrics_server.port
        self.app: KShare | None = None

    @property
    def bootstrap(self) -> str:
        assert self.app is not None and self.app.proxy.bootstrap_port
        return f"{self.config.advertised}:{self.app.proxy.bootstrap_port}"

    @property
    def service(self):
        assert self.app is not None
        return self.app.service

    def _create(self) -> KShare:
        self.app = KShare(self.config, metrics_port=self.metrics_port, metrics_host="127.0.0.1")
        return self.app

    def start(self, timeout: float | None = None) -> ShareProxyThread:
        """Start and wait until the proxy serves and the share state is loaded (TimeoutError if not)."""
        return super().start(self.start_timeout if timeout is None else timeout)


# ------------------------------------------------------------------------------------------------
# admin through the proxy


def admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap, "logger": quiet_logger(), "socket.timeout.ms": 10000})


def set_group_configs(bootstrap: str, group: str, configs: dict[str, object]) -> None:
    """IncrementalAlterConfigs SET on the GROUP resource (through the proxy for share groups)."""
    entries = [ConfigEntry(k, str(v), incremental_operation=AlterConfigOpType.SET) for k, v in configs.items()]
    res = ConfigResource(ResourceType.GROUP, group, incremental_configs=entries)
    client = admin(bootstrap)  # kept alive until the answer is in (a destroyed handle fails the future)
    for fut in client.incremental_alter_configs([res]).values():
        fut.result(30)


def describe_group_configs(bootstrap: str, group: str) -> dict[str, str]:
    res = ConfigResource(ResourceType.GROUP, group)
    out = {}
    client = admin(bootstrap)
    for fut in client.describe_configs([res]).values():
        out.update({k: v.value for k, v in fut.result(30).items()})
    return out


def share_group(bootstrap: str, group: str, **configs: object) -> None:
    """Prepare a share group: ``share.auto.offset.reset=earliest`` plus ``configs`` (underscores in
    keyword names stand for dots)."""
    settings: dict[str, object] = {"share.auto.offset.reset": "earliest"}
    settings.update({k.replace("_", "."): v for k, v in configs.items()})
    set_group_configs(bootstrap, group, settings)


# ------------------------------------------------------------------------------------------------
# producing


def produce(bootstrap: str, topic: str, values: Sequence[bytes | str], *, partition: int | None = None,
            partitions: int | None = None, per_batch: int = 1, keys: Sequence[bytes | None] | None = None,
            headers: Sequence[list[tuple[str, bytes]]] | None = None) -> None:
    """Produce ``values`` in producer batches of ``per_batch`` records (linger 0, flush per batch),
    to ``partition``, or round-robin batch by batch over ``partitions`` partitions."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "logger": quiet_logger(),
                  "enable.idempotence": False, "acks": "all"})
    errors: list[Any] = []

    def report(err, _msg) -> None:
        if err is not None:
            errors.append(err)

    for i, v in enumerate(values):
        kw: dict[str, Any] = {"value": v, "on_delivery": report}
        if partition is not None:
            kw["partition"] = partition
        elif partitions is not None:
            kw["partition"] = (i // per_batch) % partitions
        if keys is not None:
            kw["key"] = keys[i]
        if headers is not None:
            kw["headers"] = headers[i]
        p.produce(topic, **kw)
        if (i + 1) % per_batch == 0:
            p.flush(30)
    assert p.flush(30) == 0
    assert not errors, errors


# ------------------------------------------------------------------------------------------------
# share consumers


@dataclass(frozen=True)
class Got:
    """One record a share consumer received."""

    consumer: str
    topic: str
    partition: int
    offset: int
    delivery_count: int
    key: bytes | None
    value: bytes | None
    at: float  # time.monotonic() when polled


def share_consumer(bootstrap: str, group: str, *, explicit: bool = False, **conf: object) -> ShareConsumer:
    config: dict[str, object] = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "logger": quiet_logger(),
        "socket.timeout.ms": 10000,
    }
    if explicit:
        config["share.acknowledgement.mode"] = "explicit"
    config.update(conf)
    return ShareConsumer(config)


def records_of(consumer: ShareConsumer, timeout: float) -> list[Any]:
    """One poll; the records (messages without error)."""
    msgs = consumer.poll(timeout)
    out = []
    for m in msgs:
        err = m.error()
        if err is not None:
            if err.code() == -191:  # _PARTITION_EOF, informational
                continue
            log.info("share consumer error: %s", err)
            continue
        out.append(m)
    return out


def got(name: str, m: Any) -> Got:
    return Got(name, m.topic(), m.partition(), m.offset(), m.delivery_count() or 0, m.key(), m.value(),
               time.monotonic())


class ConsumerLoop:
    """A ShareConsumer polling in its own thread until stopped; ``action(msg)`` returns the
    AcknowledgeType for explicit mode (None: leave it unacknowledged -> the loop stops polling)."""

    def __init__(self, name: str, bootstrap: str, group: str, topic: str | Iterable[str], *,
                 explicit: bool = False, action: Callable[[Any], int | None] | None = None,
                 poll_timeout: float = 0.5, process_s: float = 0.0, **conf: object) -> None:
        self.name = name
        self.topics = [topic] if isinstance(topic, str) else list(topic)
        self.explicit = explicit
        self.action = action
        self.poll_timeout = poll_timeout
        self.process_s = process_s
        self.consumer = share_consumer(bootstrap, group, explicit=explicit, **conf)
        self.received: list[Got] = []
        self.errors: list[BaseException] = []
        self.stuck = False  # an action left a record unacknowledged: no more polls
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"share-{name}", daemon=True)
        self.closed = False
        self.lock = threading.Lock()

    def start(self) -> ConsumerLoop:
        self.consumer.subscribe(self.topics)
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if self.stuck:
                    time.sleep(0.05)
                    continue
                msgs = records_of(self.consumer, self.poll_timeout)
                for m in msgs:
                    with self.lock:
                        self.received.append(got(self.name, m))
                    if self.process_s:
                        time.sleep(self.process_s)
                    if self.explicit:
                        ack = self.action(m) if self.action is not None else AcknowledgeType.ACCEPT
                        if ack is None:
                            self.stuck = True
                        else:
                            self.consumer.acknowledge(m, ack)
                if self.explicit and msgs and not self.stuck:
                    self.consumer.commit_async()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            log.exception("share consumer %s failed", self.name)
            self.errors.append(exc)

    def stop(self, *, close: bool = True) -> None:
        self._stop.set()
        self._thread.join(30)
        if close and not self.closed:
            self.closed = True
            try:
                self.consumer.close()
            except KafkaException as exc:
                log.info("closing %s: %s", self.name, exc)

    def values(self) -> list[bytes]:
        with self.lock:
            return [g.value for g in self.received]


def wait_until(pred: Callable[[], bool], timeout: float, what: str = "condition", interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def poll_until(consumer: ShareConsumer, pred: Callable[[list[Any]], bool], timeout: float, *,
               name: str = "c", on_record: Callable[[Any], None] | None = None) -> list[Got]:
    """Poll ``consumer`` (in this thread) until ``pred(all records so far)`` or the timeout."""
    out: list[Got] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not pred(out):
        for m in records_of(consumer, 0.5):
            out.append(got(name, m))
            if on_record is not None:
                on_record(m)
    return out


def read_plain(bootstrap: str, topic: str, n: int, timeout: float = 30.0) -> list[Any]:
    """``n`` records of ``topic`` read with a plain (assign, earliest) consumer."""
    from confluent_kafka import TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"plain-{time.monotonic_ns()}",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest", "logger": quiet_logger()})
    md = c.list_topics(topic, timeout=10).topics[topic]
    c.assign([TopicPartition(topic, p, 0) for p in md.partitions])
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < n and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None or m.error() is not None:
                continue
            out.append(m)
    finally:
        c.close()
    return out


@dataclass
class Tally:
    """Records seen per value, for 'every record once' checks."""

    counts: dict[bytes, int] = field(default_factory=dict)

    def add(self, values: Iterable[bytes]) -> None:
        for v in values:
            self.counts[v] = self.counts.get(v, 0) + 1

    def duplicates(self) -> dict[bytes, int]:
        return {v: c for v, c in self.counts.items() if c > 1}


# ------------------------------------------------------------------------------------------------
# Apache Kafka's Java KafkaShareConsumer (tests/java/ShareConsumerDriver.java)

JAVA_DIR = Path(__file__).resolve().parent.parent / "java"
JAVA_SOURCES = (JAVA_DIR / "pom.xml", JAVA_DIR / "ShareConsumerDriver.java")


def java_share_driver(timeout: float = 600.0) -> list[str]:
    """The command line running ShareConsumerDriver, built on first use.

    kafka-clients and slf4j-simple are resolved from Maven Central (tests/java/pom.xml) and the
    driver compiled with javac into ``<cache_root()>/share-driver-<digest>``, where the digest
    covers the pom and the source: later calls (and later sessions) reuse the build. A lock file
    serialises concurrent builders; a half-finished build is redone.
    """
    import fcntl
    import hashlib
    import json
    import shutil
    import subprocess

    from tests.brokers import _java, cache_root

    digest = hashlib.sha256(b"".join(p.read_bytes() for p in JAVA_SOURCES)).hexdigest()[:16]
    root = cache_root() / f"share-driver-{digest}"
    libs, classes, marker = root / "libs", root / "classes", root / ".complete"
    java = _java()
    javac = str(Path(java).with_name("javac"))
    if not Path(javac).is_file():
        javac = shutil.which("javac") or "javac"
    command = [java, "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xss512k", "-Xmx256m",
               "-Djava.net.preferIPv4Stack=true", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
               "-cp", f"{classes}{os.pathsep}{libs}/*", "ShareConsumerDriver"]
    if marker.is_file():
        return command
    root.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f"share-driver-{digest}.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if marker.is_file():
                return command
            t0 = time.monotonic()
            for stale in (libs, classes):
                shutil.rmtree(stale, ignore_errors=True)
            mvn = shutil.which("mvn")
            if mvn is None:
                raise RuntimeError("Maven (mvn) is not on PATH; it is needed to fetch kafka-clients")
            partial = root / "libs.partial"
            for offline in (True, False):  # from the local Maven repository if it has it all (faster)
                shutil.rmtree(partial, ignore_errors=True)
                proc = subprocess.run(
                    [mvn, "-B", "-q", *(["-o"] if offline else []), "-f", str(JAVA_DIR / "pom.xml"),
                     "dependency:copy-dependencies", "-DincludeScope=runtime", f"-DoutputDirectory={partial}"],
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
                if proc.returncode == 0 and list(partial.glob("kafka-clients-*.jar")):
                    break
            if proc.returncode != 0 or not list(partial.glob("kafka-clients-*.jar")):
                raise RuntimeError(f"Maven failed to fetch kafka-clients (exit {proc.returncode}):\n"
                                   + "\n".join(proc.stdout.splitlines()[-30:]))
            partial.rename(libs)
            out = root / "classes.partial"
            shutil.rmtree(out, ignore_errors=True)
            proc = subprocess.run(
                [javac, "-nowarn", "-d", str(out), "-cp", f"{libs}/*", str(JAVA_DIR / "ShareConsumerDriver.java")],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
            if proc.returncode != 0:
                raise RuntimeError(f"javac failed (exit {proc.returncode}):\n{proc.stdout[-4000:]}")
            out.rename(classes)
            marker.write_text(json.dumps({"digest": digest, "seconds": round(time.monotonic() - t0, 1),
                                          "jars": sorted(p.name for p in libs.glob("*.jar"))}) + "\n")
            log.info("built ShareConsumerDriver in %s in %.1f s", root, time.monotonic() - t0)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return command


class JavaShareConsumer:
    """ShareConsumerDriver as a child process; its JSON lines are collected in a thread."""

    def __init__(self, command: list[str], bootstrap: str, group: str, topic: str, *, mode: str = "implicit",
                 ack: str | None = None, max_records: int = 0, timeout_ms: int = 60_000, idle_ms: int = 0,
                 configs: dict[str, object] | None = None, name: str = "java") -> None:
        import tempfile

        self.name = name
        args = ["--bootstrap", bootstrap, "--group", group, "--topic", topic, "--mode", mode,
                "--max-records", str(max_records), "--timeout-ms", str(timeout_ms), "--idle-ms", str(idle_ms)]
        if ack is not None:
            args += ["--ack", ack]
        for k, v in (configs or {}).items():
            args += ["--config", f"{k}={v}"]
        self.args = command + args
        self.stderr = tempfile.TemporaryFile()
        self.records: list[Got] = []
        self.events: list[dict] = []
        self.lines: list[str] = []
        self.proc: Any = None
        self._reader: threading.Thread | None = None
        self.lock = threading.Lock()

    def start(self) -> JavaShareConsumer:
        import subprocess

        self.proc = subprocess.Popen(self.args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=self.stderr, text=True)
        self._reader = threading.Thread(target=self._read, name=f"java-{self.name}", daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        import json

        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            with self.lock:
                if "event" in obj:
                    self.events.append(obj)
                else:
                    value = obj["value"].encode() if obj["value"] is not None else None
                    key = obj["key"].encode() if obj["key"] is not None else None
                    self.records.append(Got(self.name, "", obj["partition"], obj["offset"], obj["delivery_count"],
                                            key, value, time.monotonic()))

    def values(self) -> list[bytes]:
        with self.lock:
            return [g.value for g in self.records]

    def has_event(self, name: str) -> bool:
        with self.lock:
            return any(e.get("event") == name for e in self.events)

    def wait(self, timeout: float = 90.0) -> int:
        assert self.proc is not None
        rc = self.proc.wait(timeout)
        if self._reader is not None:
            self._reader.join(10)
        return rc

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self._reader is not None:
            self._reader.join(10)

    def diagnostics(self) -> str:
        self.stderr.seek(0)
        err = self.stderr.read().decode(errors="replace")
        return f"stdout:\n{''.join(self.lines)[-3000:]}\nstderr:\n{err[-6000:]}"
