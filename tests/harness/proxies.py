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
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Self

from kshare.proxy.config import ProxyConfig, parse_hostports
from kshare.proxy.server import Proxy


class LoopThread:
    """A server on its own uvloop event loop in a background thread.

    Subclasses create the server in :meth:`_create` (called on that loop): an object with
    ``async start()``, ``async wait_ready(timeout)`` and ``async stop()``.
    """

    thread_name = "kshare-proxy"
    start_slack = 5.0  # seconds the starting thread waits beyond the ready timeout
    join_timeout = 15.0  # seconds stop() waits for the thread

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped: asyncio.Event | None = None

    def _create(self) -> Any:
        raise NotImplementedError

    def start(self, timeout: float = 30.0) -> Self:
        """Start and wait until the server is ready (its error if it fails, TimeoutError if it is not ready)."""
        import uvloop

        started: Future = Future()

        async def main() -> None:
            server = None
            try:
                server = self._create()
                self._stopped = asyncio.Event()
                await server.start()
                await server.wait_ready(timeout)
            except BaseException as exc:  # noqa: BLE001 - reported to the starting thread
                started.set_exception(exc)
                if server is not None:
                    try:
                        await server.stop()
                    except Exception:  # noqa: BLE001
                        pass
                return
            started.set_result(None)
            await self._stopped.wait()
            await server.stop()

        def run() -> None:
            self.loop = uvloop.new_event_loop()
            asyncio.set_event_loop(self.loop)
            try:
                self.loop.run_until_complete(main())
            finally:
                self.loop.close()

        self._thread = threading.Thread(target=run, name=self.thread_name, daemon=True)
        self._thread.start()
        started.result(timeout + self.start_slack)
        return self

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on the server's loop and return its result (for inspecting state)."""
        assert self.loop is not None
        fut: Future = Future()

        def run() -> None:
            try:
                fut.set_result(fn(*args))
            except BaseException as exc:  # noqa: BLE001
                fut.set_exception(exc)

        self.loop.call_soon_threadsafe(run)
        return fut.result(10)

    def run(self, coro_fn: Callable[..., Any], *args: Any, timeout: float = 30.0) -> Any:
        """Run the coroutine ``coro_fn(*args)`` on the server's loop and return its result."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro_fn(*args), self.loop).result(timeout)

    def stop(self) -> None:
        if self.loop is not None and self._stopped is not None and self._thread is not None:
            try:
                self.loop.call_soon_threadsafe(self._stopped.set)
            except RuntimeError:  # loop already closed
                pass
            self._thread.join(self.join_timeout)
        self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ProxyThread(LoopThread):
    """The proxy on its own uvloop event loop in a background thread."""

    def __init__(self, upstream: str, **config: object) -> None:
        super().__init__()
        config.setdefault("bootstrap_port", 0)
        config.setdefault("broker_port_base", 0)
        self.config = ProxyConfig(upstream=parse_hostports(upstream), **config)  # type: ignore[arg-type]
        self.proxy: Proxy | None = None

    @property
    def bootstrap(self) -> str:
        assert self.proxy is not None and self.proxy.bootstrap_port
        return f"{self.config.advertised}:{self.proxy.bootstrap_port}"

    def _create(self) -> Proxy:
        self.proxy = Proxy(self.config)
        return self.proxy


class ProxyProcess:
    """``python -m kshare proxy`` as a child process (for signals, crashes and the CLI itself)."""

    def __init__(self, *args: str, port: int = 0, env: dict | None = None) -> None:
        from tests.harness.brokers import free_port

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
        return self if self.process is not None else self.start()  # started already: start(timeout=...)

    def __exit__(self, *exc: object) -> None:
        self.stop()
