"""What the embedded brokers (:mod:`.kafka`, :mod:`.tansu`) share: stopping their process, and
``with`` on a broker that is started and stopped."""

from __future__ import annotations

import subprocess
from typing import Any, Self


def terminate(proc: subprocess.Popen[Any] | None, timeout: float) -> bool:
    """SIGTERM a running ``proc``, SIGKILL it after ``timeout`` s; True when it had to be killed."""
    if proc is None or proc.poll() is not None:
        return False
    proc.terminate()
    try:
        proc.wait(timeout)
        return False
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return True


class EmbeddedProcess:
    """An embedded broker's process: ``with EmbeddedKafka(...) as b:`` starts it (``start`` returns the
    broker) and stops it at the end."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
