"""Apache Kafka's own Java ``KafkaShareConsumer`` for the tests: the driver
``tests/java/ShareConsumerDriver.java`` built on first use (:func:`java_share_driver`) and run as a
child process (:class:`JavaShareConsumer`)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from tests.harness.share import Got

log = logging.getLogger("kshare.tests.java")


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
    import shutil
    import subprocess

    from tests.harness.brokers import _java, cache_root

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

        self.proc = subprocess.Popen(self.args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=self.stderr, text=True)
        self._reader = threading.Thread(target=self._read, name=f"java-{self.name}", daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:

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
