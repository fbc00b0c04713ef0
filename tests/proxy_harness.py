"""Run the real kshare proxy for tests: in a thread of the test process, or as a subprocess.

Both are the product's own code paths (``Proxy`` on uvloop, or the ``kshare proxy`` command);
nothing here stands in for the proxy or the broker.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import Future

from kshare.proxy.config import ProxyConfig, parse_hostports
from kshare.proxy.server import Proxy


class ProxyThread:
    """The proxy on its own uvloop event loop in a background thread."""

    def __init__(self, upstream: str, **config: object) -> None:
        config.setdefault("bootstrap_port", 0)
        config.setdefault("broker_port_base", 0)
        self.config = ProxyConfig(upstream=parse_hostports(upstream), **config)  # type: ignore[arg-type]
        self.proxy: Proxy | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped: asyncio.Event | None = None

    @property
    def bootstrap(self) -> str:
        assert self.proxy is not None and self.proxy.bootstrap_port
        return f"{self.config.advertised}:{self.proxy.bootstrap_port}"

    def start(self, timeout: float = 30.0) -> ProxyThread:
        import uvloop

        started: Future = Future()

        async def main() -> None:
            try:
                self.proxy = Proxy(self.config)
                self._stopped = asyncio.Event()
                await self.proxy.start()
                await self.proxy.wait_ready(timeout)
            except BaseException as exc:  # noqa: BLE001 - reported to the starting thread
                started.set_exception(exc)
                return
            started.set_result(None)
            await self._stopped.wait()
            await self.proxy.stop()

        def run() -> None:
            self.loop = uvloop.new_event_loop()
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(main())
            self.loop.close()

        self._thread = threading.Thread(target=run, name="kshare-proxy", daemon=True)
        self._thread.start()
        started.result(timeout + 5)
        return self

    def call(self, fn, *args):
        """Run ``fn(*args)`` on the proxy's loop and return its result (for inspecting state)."""
        assert self.loop is not None
        fut: Future = Future()

        def run() -> None:
            try:
                fut.set_result(fn(*args))
            except BaseException as exc:  # noqa: BLE001
                fut.set_exception(exc)

        self.loop.call_soon_threadsafe(run)
        return fut.result(10)

    def stop(self) -> None:
        if self.loop is not None and self._stopped is not None and self._thread is not None:
            self.loop.call_soon_threadsafe(self._stopped.set)
            self._thread.join(15)
        self._thread = None

    def __enter__(self) -> ProxyThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ProxyProcess:
    """``python -m kshare proxy`` as a child process (for signals, crashes and the CLI itself)."""

    def __init__(self, *args: str, port: int = 0, env: dict | None = None) -> None:
        from tests.brokers import free_port

        self.port = port or free_port()
        self.args = ["proxy", "--port", str(self.port), "--broker-port-base", "0", *args]
        self.env = {**os.environ, **(env or {})}
        self.process: subprocess.Popen | None = None
        self.output: list[str] = []

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> ProxyProcess:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "kshare", *self.args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=self.env,
        )
        deadline = time.monotonic() + timeout
        assert self.process.stdout is not None
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                raise RuntimeError("proxy exited at start:\n" + "".join(self.output))
            self.output.append(line)
            if re.search(r"upstream cluster has \d+ broker", line):
                threading.Thread(target=self._drain, daemon=True).start()
                return self
        raise RuntimeError("proxy not ready in time:\n" + "".join(self.output))

    def _drain(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line)

    def signal(self, sig: int) -> None:
        assert self.process is not None
        self.process.send_signal(sig)

    def wait(self, timeout: float = 15.0) -> int:
        assert self.process is not None
        return self.process.wait(timeout)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> ProxyProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
