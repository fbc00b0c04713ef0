"""Run the real kshare proxy for tests: in a thread of the test process, or as a subprocess
(:class:`ProxyProcess`, built on the bench's launcher; :class:`KShareProcess`: killed and started
again on the same ports).

Both are the product's own code paths (``Proxy`` on uvloop, or the ``kshare proxy`` command);
nothing here stands in for the proxy or the broker.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Self

from kshare.addresses import parse_hostports
from kshare.bench.brokers import KafkaBroker
from kshare.bench.procs import ProxyProcess as BenchProxyProcess
from kshare.bench.procs import free_port
from kshare.proxy.config import ProxyConfig
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


class ProxyProcess(BenchProxyProcess):
    """``python -m kshare proxy --port P --broker-port-base 0 ARGS`` as a child process (for signals,
    crashes and the CLI itself), on a free (or the given) bootstrap port: the bench's launcher with
    nothing added to ``ARGS`` (no metrics port, no group limits, no state topic) and every line of
    output kept. Ready once it knows the upstream cluster."""

    def __init__(self, *args: str, port: int = 0, env: dict | None = None) -> None:
        super().__init__(None, args, port=port, env=env, metrics=False, limits=(),
                         ready=r"upstream cluster has \d+ broker", keep_lines=None)

    @property
    def process(self) -> subprocess.Popen[str] | None:
        return self.proc


# broker-level bounds low enough for heartbeat intervals and session timeouts of a few seconds
LIMITS = ("--group-limit", "group.share.min.heartbeat.interval.ms=100",
          "--group-limit", "group.share.min.session.timeout.ms=1000",
          "--group-limit", "group.share.min.record.lock.duration.ms=1000")


class KShareProcess:
    """``python -m kshare proxy`` on fixed ports (bootstrap and broker listeners): every
    incarnation (a ProxyProcess) is kept for its output."""

    def __init__(self, broker: KafkaBroker, state_topic: str, *extra: str) -> None:
        self.port = free_port()
        broker_port = free_port()
        self.args = ("--upstream", broker.bootstrap, "--broker-port-base", str(broker_port - broker.node_id),
                     "--state-topic", state_topic, "--state-topic-partitions", "3", *LIMITS, *extra)
        self.incarnations: list[ProxyProcess] = []
        self.load_seconds: list[float] = []  # process start -> "share state loaded", per incarnation

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def current(self) -> ProxyProcess:
        return self.incarnations[-1]

    def start(self, timeout: float = 90.0, *, wait_loaded: bool = True) -> float:
        """Start an incarnation; returns once its share state is loaded (seconds it took), or
        with ``wait_loaded=False`` once it listens."""
        t0 = time.monotonic()
        proc = ProxyProcess(*self.args, port=self.port)
        self.incarnations.append(proc)
        proc.start(timeout)
        if not wait_loaded:
            return time.monotonic() - t0
        deadline = time.monotonic() + timeout
        while not any("share state loaded" in line for line in proc.output) and proc.running:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the share state not loaded in {timeout:.0f} s:\n" + "".join(proc.output[-40:]))
            time.sleep(0.1)
        if not proc.running:
            raise RuntimeError("kshare exited:\n" + "".join(proc.output))
        self.load_seconds.append(time.monotonic() - t0)
        return self.load_seconds[-1]

    def kill(self) -> None:
        """SIGKILL: no shutdown, nothing flushed."""
        self.current.send_signal(signal.SIGKILL)
        self.current.wait(10)

    def stop(self) -> None:
        for proc in self.incarnations:
            proc.stop()

    def output(self, i: int | None = None) -> str:
        procs = self.incarnations if i is None else [self.incarnations[i]]
        return "".join(f"--- incarnation {self.incarnations.index(p)} ---\n" + "".join(p.output) for p in procs)

    def digest(self, head: int = 60, tail: int = 20) -> str:
        """The first and last warnings/errors of every incarnation (for failure messages)."""
        out = []
        for i, p in enumerate(self.incarnations):
            lines = [line for line in p.output if " WARNING " in line or " ERROR " in line or "Traceback" in line
                     or line.startswith((" ", "\t")) or "Error" in line]
            if len(lines) > head + tail:
                lines = lines[:head] + [f"... {len(lines) - head - tail} more ...\n"] + lines[-tail:]
            out.append(f"--- incarnation {i}, exit code {p.process.poll() if p.process else None} ---\n" + "".join(lines))
        return "".join(out)

    def tracebacks(self) -> list[str]:
        return [line for p in self.incarnations for line in p.output if "Traceback" in line]

