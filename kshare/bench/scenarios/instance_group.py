"""kshare proxies of one instance group (``--instance-group``) as subprocesses, for the ``scale_out`` and
``scale_out_failover`` scenarios of ``kshare bench``: started together on a fresh state topic and
instance group, "settled" once every proxy's ``/ready`` is ready with the same ``ownership_epoch`` and their
``state_partitions`` split the state topic's partitions; each keeps its output with the time every line was
read (the failover reads the survivors' take-over lines), and can be SIGKILLed.

Which proxy leads which partition comes from Metadata: virtual node id = slot * 2**20 + broker id, and each
proxy's per-broker listener port is known (``--broker-port-base``), so a leader maps to its proxy (a fronted
cluster of one broker).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...share.state.codec import partition_for_group
from .. import clients
from ..procs import KSHARE_LIMITS, _die_with_parent, cpu_seconds, free_port, kshare_env

if TYPE_CHECKING:
    from ..runner import Env

log = logging.getLogger("kshare.bench.scale_out")

SLOT_SHIFT = 20  # virtual node id = slot * 2**20 + upstream broker id


@dataclass
class Upstream:
    """The fronted cluster as the scale-out scenarios use it: its bootstrap, the id of its (one) broker, the
    broker's pid when the bench started it (its CPU time is read), and the proxy arguments of the run."""

    bootstrap: str
    node_id: int
    pid: int | None
    proxy_args: list[str]


def upstream_of(env: Env) -> Upstream:
    bootstrap = env.upstream()
    broker = env.upstream_broker()
    if broker is not None:
        return Upstream(bootstrap, broker.node_id, broker.pid, list(env.proxy_args))
    md = clients.admin(bootstrap).list_topics(timeout=20)
    if len(md.brokers) != 1:
        raise RuntimeError(f"the scale-out scenarios map partition leaders to proxies on a cluster of one broker, "
                           f"not {len(md.brokers)}")
    return Upstream(bootstrap, next(iter(md.brokers)), None, list(env.proxy_args))


class ProxyProc:
    """One ``python -m kshare proxy`` of an instance group; its output is kept with the monotonic
    time each line was read."""

    def __init__(self, upstream: str, broker_id: int, state_topic: str, state_partitions: int, group: str | None,
                 session_ms: int, name: str, extra: list[str]) -> None:
        self.name = name
        self.port = free_port()
        self.broker_port = free_port()
        self.metrics_port = free_port()
        self.cmd = [sys.executable, "-m", "kshare", "proxy", "--upstream", upstream, "--port", str(self.port),
                    "--broker-port-base", str(self.broker_port - broker_id), "--state-topic", state_topic,
                    "--state-topic-partitions", str(state_partitions), "--metrics-port", str(self.metrics_port)]
        if group is not None:
            self.cmd += ["--instance-group", group, "--instance-session-timeout-ms", str(session_ms)]
        for limit in KSHARE_LIMITS:
            self.cmd += ["--group-limit", limit]
        self.cmd += extra
        self.proc: subprocess.Popen | None = None
        self.lines: list[tuple[float, str]] = []
        self.killed_at: float | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> ProxyProc:
        self.proc = subprocess.Popen(_die_with_parent(self.cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env={**os.environ, **kshare_env()}, start_new_session=True)
        threading.Thread(target=self._drain, daemon=True, name=f"drain-{self.name}").start()
        return self

    def _drain(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line))

    def text(self) -> str:
        return "".join(line for _, line in self.lines)

    def ready(self) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/ready", timeout=2) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as exc:  # 503 while not ready: the body still says why
            with contextlib.suppress(Exception):
                return json.loads(exc.read())
            return None
        except Exception:  # noqa: BLE001 - not listening yet
            return None

    def cpu(self) -> float:
        try:
            return cpu_seconds(self.pid)
        except OSError:
            return float("nan")

    def kill(self) -> None:
        assert self.proc is not None
        self.killed_at = time.monotonic()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def notes(self) -> list[str]:
        """Lines worth a look: tracebacks, errors, warnings."""
        return [line for _, line in self.lines
                if "Traceback" in line or " ERROR " in line or " WARNING " in line or line.startswith(("  File",))]


def start_service(k3: Upstream, n: int, session_ms: int, state_partitions: int,
                  timeout: float = 120.0) -> list[ProxyProc]:
    """N proxies of a fresh instance group (fresh state topic), started together; returns once settled.
    ``n == 0``: one proxy without --instance-group (the single-proxy mode, as a reference)."""
    plain = n == 0
    n = max(n, 1)
    tag = uuid.uuid4().hex[:8]
    state_topic = f"__kshare_bench_so_{tag}"
    proxies = [ProxyProc(k3.bootstrap, k3.node_id, state_topic, state_partitions, None if plain else f"bench-so-{tag}",
                         session_ms, f"proxy{i}", k3.proxy_args) for i in range(n)]
    for p in proxies:
        p.start()
    t0 = time.monotonic()
    try:
        while True:
            for p in proxies:
                if p.proc is not None and p.proc.poll() is not None:
                    raise RuntimeError(f"{p.name} exited:\n{p.text()[-4000:]}")
            st = [p.ready() for p in proxies]
            if plain and st[0] and st[0].get("ready"):
                return proxies
            if all(s and s.get("ready") for s in st):
                epochs = {s["ownership_epoch"] for s in st}  # type: ignore[index]
                owned = [q for s in st for q in s["state_partitions"]]  # type: ignore[index]
                if len(epochs) == 1 and sorted(owned) == list(range(state_partitions)):
                    return proxies
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"{n} proxies not settled in {timeout:.0f} s: {st}\n{proxies[0].text()[-3000:]}")
            time.sleep(0.2)
    except BaseException:
        for p in proxies:
            p.stop()
        raise


def bootstrap_of(proxies: list[ProxyProc]) -> str:
    return ",".join(p.bootstrap for p in proxies if p.killed_at is None)


def leaders(proxies: list[ProxyProc], topic: str) -> dict[int, tuple[int, str]]:
    """partition -> (proxy slot, proxy name) from Metadata through the proxies."""
    from confluent_kafka.admin import AdminClient

    by_port = {p.broker_port: p.name for p in proxies}
    if len(proxies) == 1:  # without an instance group node ids are the broker's
        return {q: (0, proxies[0].name) for q in range(_partitions(proxies[0].bootstrap, topic))}
    client = AdminClient({"bootstrap.servers": bootstrap_of(proxies), "error_cb": clients._quiet})
    md = client.list_topics(topic, timeout=20)
    out = {}
    for pid, pm in md.topics[topic].partitions.items():
        b = md.brokers[pm.leader]
        out[pid] = (pm.leader >> SLOT_SHIFT, by_port.get(b.port, f"?{b.host}:{b.port}"))
    return out


def _partitions(bootstrap: str, topic: str) -> int:
    from confluent_kafka.admin import AdminClient

    md = AdminClient({"bootstrap.servers": bootstrap, "error_cb": clients._quiet}).list_topics(topic, timeout=20)
    return len(md.topics[topic].partitions)


def group_coordinator(proxies: list[ProxyProc], group: str, state_partitions: int) -> str | None:
    sp = partition_for_group(group, state_partitions)
    for p in proxies:
        st = p.ready() or {}
        if sp in st.get("state_partitions", []):
            return p.name
    return None
