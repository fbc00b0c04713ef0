"""Prometheus metrics: counters kept as events happen, gauges read from live state at scrape time.

Served by a small asyncio HTTP server on ``--metrics-port`` (``GET /metrics``, text exposition
format 0.0.4), so an operator's Prometheus can scrape the proxy like any broker exporter.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .proxy.server import Proxy
    from .share.service import ShareGroupService

log = logging.getLogger("kshare.metrics")

Labels = tuple[tuple[str, str], ...]

# seconds; covers a loopback round trip up to a long-polling fetch
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def _fmt_labels(labels: Labels) -> str:
    if not labels:
        return ""
    body = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
    return "{" + body + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Counter:
    def __init__(self, name: str, help_text: str) -> None:
        self.name, self.help = name, help_text
        self.values: dict[Labels, float] = defaultdict(float)

    def inc(self, amount: float = 1.0, **labels: object) -> None:
        self.values[tuple((k, str(v)) for k, v in labels.items())] += amount

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} counter"
        for labels, v in self.values.items():
            yield f"{self.name}{_fmt_labels(labels)} {v:g}"


class Histogram:
    def __init__(self, name: str, help_text: str, buckets: tuple[float, ...] = BUCKETS) -> None:
        self.name, self.help, self.buckets = name, help_text, buckets
        self.counts: dict[Labels, list[int]] = {}
        self.sums: dict[Labels, float] = defaultdict(float)

    def observe(self, seconds: float, **labels: object) -> None:
        key = tuple((k, str(v)) for k, v in labels.items())
        counts = self.counts.get(key)
        if counts is None:
            counts = self.counts[key] = [0] * (len(self.buckets) + 1)
        counts[bisect.bisect_left(self.buckets, seconds)] += 1
        self.sums[key] += seconds

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} histogram"
        for labels, counts in self.counts.items():
            total = 0
            for bound, c in zip((*self.buckets, float("inf")), counts, strict=True):
                total += c
                le = "+Inf" if bound == float("inf") else f"{bound:g}"
                yield f"{self.name}_bucket{_fmt_labels((*labels, ('le', le)))} {total}"
            yield f"{self.name}_sum{_fmt_labels(labels)} {self.sums[labels]:g}"
            yield f"{self.name}_count{_fmt_labels(labels)} {total}"


class Metrics:
    """Every metric kshare exports."""

    def __init__(self) -> None:
        self.request_seconds = Histogram("kshare_request_seconds", "Client request latency by API (header to response)")
        self.deliveries = Counter("kshare_share_deliveries_total", "Records handed to share consumers")
        self.acks = Counter("kshare_share_acknowledgements_total", "Records acknowledged, by type")
        self.archived = Counter("kshare_share_archived_total", "Records archived after delivery (rejected or limit reached)")
        self.lock_timeouts = Counter("kshare_share_lock_timeouts_total", "Acquisition locks that ran out")
        self.state_write_seconds = Histogram("kshare_state_write_seconds", "Durable state write latency")
        self.gauge_sources: list[Callable[[], Iterable[str]]] = []

    def render(self) -> str:
        lines: list[str] = []
        for m in (self.request_seconds, self.deliveries, self.acks, self.archived,
                  self.lock_timeouts, self.state_write_seconds):
            lines.extend(m.render())
        for source in self.gauge_sources:
            try:
                lines.extend(source())
            except Exception:  # noqa: BLE001 - a scrape must never break the proxy
                log.exception("collecting gauges failed")
        return "\n".join(lines) + "\n"


METRICS = Metrics()

ACK_TYPE_NAMES = {0: "gap", 1: "accept", 2: "release", 3: "reject", 4: "renew"}


def share_gauges(service: ShareGroupService) -> Iterable[str]:
    """Per group and share-partition state, read at scrape time (no cluster round trips)."""
    from .share.admin import settled_above_start

    yield "# HELP kshare_share_group_members Members of each share group"
    yield "# TYPE kshare_share_group_members gauge"
    for g in service.coordinator.groups.values():
        yield f'kshare_share_group_members{{group="{_escape(g.group_id)}",state="{g.state.value}"}} {len(g.members)}'
    rows = []
    for key, sp in service.partitions.items():
        engine = sp.engine
        if engine is None:
            continue
        labels = f'group="{_escape(key.group_id)}",topic="{_escape(sp.topic.name)}",partition="{key.partition}"'
        plog = None
        for rc in (False, True):
            plog = service.logs.get((key.topic_id, key.partition, rc)) or plog
        hw = plog.high_watermark if plog is not None else -1
        snapshot = engine.snapshot()
        lag = max(0, hw - engine.start_offset - settled_above_start(snapshot, hw)) if hw >= 0 else -1
        rows.append((labels, engine.start_offset, engine.end_offset, engine.in_flight_count,
                     engine.acquired_count(), lag))
    for name, idx, help_text in (("spso", 1, "Share-partition start offset"),
                                 ("speo", 2, "Share-partition end offset"),
                                 ("in_flight_records", 3, "Records between SPSO and SPEO"),
                                 ("acquired_records", 4, "Records currently acquired"),
                                 ("lag", 5, "Records not yet delivery-complete (from the last seen high watermark)")):
        yield f"# HELP kshare_share_partition_{name} {help_text}"
        yield f"# TYPE kshare_share_partition_{name} gauge"
        for row in rows:
            yield f"kshare_share_partition_{name}{{{row[0]}}} {row[idx]}"


def proxy_gauges(proxy: Proxy) -> Iterable[str]:
    from .protocol import messages

    yield "# HELP kshare_requests_total Client requests by API"
    yield "# TYPE kshare_requests_total counter"
    for key, n in sorted(proxy.stats.requests.items()):
        api = messages.apis().get(key)
        yield f'kshare_requests_total{{api="{api.name if api else key}"}} {n}'
    yield "# HELP kshare_rejected_connections_total Client connections closed for bad input"
    yield "# TYPE kshare_rejected_connections_total counter"
    yield f"kshare_rejected_connections_total {proxy.stats.rejected}"
    yield "# HELP kshare_client_connections Open client connections"
    yield "# TYPE kshare_client_connections gauge"
    yield f"kshare_client_connections {len(proxy.connections)}"
    yield "# HELP kshare_brokers Upstream brokers with a proxy listener"
    yield "# TYPE kshare_brokers gauge"
    yield f"kshare_brokers {len(proxy.brokers.listeners)}"


class MetricsServer:
    """``GET /metrics`` over HTTP/1.1 on the proxy's event loop."""

    def __init__(self, metrics: Metrics, host: str, port: int) -> None:
        self.metrics, self.host, self.port = metrics, host, port
        self.server: asyncio.Server | None = None

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = self.server.sockets[0].getsockname()[1]
        log.info("metrics on http://%s:%d/metrics", self.host, self.port)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            path = request.split(b" ", 2)[1] if request.count(b" ") >= 2 else b"/"
            if path.split(b"?")[0] in (b"/metrics", b"/"):
                status, body, ctype = "200 OK", self.metrics.render().encode(), "text/plain; version=0.0.4"
            else:
                status, body, ctype = "404 Not Found", b"not found\n", "text/plain"
            writer.write(f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                         f"Connection: close\r\n\r\n".encode() + body)
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()


def now() -> float:
    return time.perf_counter()
