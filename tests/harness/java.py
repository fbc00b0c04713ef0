"""Apache Kafka's own Java ``KafkaShareConsumer`` for the tests: the driver
``tests/java/ShareConsumerDriver.java`` built on first use (:func:`java_share_driver`) and run as a
child process (:class:`JavaShareConsumer`)."""

from __future__ import annotations

import json
import logging
import subprocess
import threading
import time
from typing import Any

from kshare.bench.java_driver import JAVA_DIR, JAVA_SOURCES, java_share_driver
from tests.harness.share import Got

__all__ = ["JAVA_DIR", "JAVA_SOURCES", "JavaShareConsumer", "java_share_driver"]

log = logging.getLogger("kshare.tests.java")


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
