"""The Prometheus endpoint (issue 6): scraped over HTTP, its numbers match what the test did.

A real ShareConsumer works through kshare in front of Apache Kafka 3.9; counters are compared as
differences between a scrape before and after (they are process-wide), gauges as values.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import socket
import time
import urllib.error
import urllib.request
import uuid

import pytest
from confluent_kafka import AcknowledgeType

from tests.harness.share import (
    ShareProxyThread,
    produce,
    records_of,
    share_group,
    subscribed,
    wait_until,
)

pytestmark = pytest.mark.kafka

_LINE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})? (?P<value>\S+)$')


def scrape(port: int) -> dict[tuple[str, frozenset], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        assert m, f"not exposition format: {line!r}"
        labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group("labels") or ""))
        out[(m.group("name"), labels)] = float(m.group("value"))
    return out


def value(metrics: dict, name: str, **labels: object) -> float:
    return metrics.get((name, frozenset((k, str(v)) for k, v in labels.items())), 0.0)


def test_metrics_match_what_happened(kafka39) -> None:
    topic, group = f"metrics-{uuid.uuid4().hex[:8]}", f"metrics-{uuid.uuid4().hex[:8]}"
    kafka39.create_topic(topic, partitions=1)
    with ShareProxyThread(kafka39.bootstrap, metrics_port=0) as proxy:
        port = proxy.app.metrics_server.port
        share_group(proxy.bootstrap, group)
        produce(proxy.bootstrap, topic, [f"v{i}" for i in range(30)], per_batch=10)
        before = scrape(port)

        with subscribed(proxy.bootstrap, group, topic, explicit=True) as consumer:
            seen: set[int] = set()
            deadline = time.monotonic() + 60
            while len(seen) < 30 and time.monotonic() < deadline:
                msgs = records_of(consumer, 1.0)
                for m in msgs:
                    seen.add(m.offset())
                    consumer.acknowledge(m, AcknowledgeType.REJECT if m.offset() % 3 == 0 else AcknowledgeType.ACCEPT)
                if msgs:
                    consumer.commit_sync()
            assert len(seen) == 30
            during = scrape(port)
            assert value(during, "kshare_share_group_members", group=group, state="Stable") == 1
            # fair acquisition's view: one member fetches there and acquired all 30 records
            fair = {"group": group, "topic": topic, "partition": "0"}
            assert value(during, "kshare_share_partition_fetching_members", **fair) == 1
            per_member = {dict(k[1])["member"]: v for k, v in during.items()
                          if k[0] == "kshare_share_member_acquired_records_total" and fair.items() <= dict(k[1]).items()}
            assert list(per_member.values()) == [30.0], per_member

        labels = {"group": group, "topic": topic}
        wait_until(lambda: value(scrape(port), "kshare_share_partition_spso", partition=0, **labels) == 30, 20,
                   "SPSO gauge at 30")
        after = scrape(port)

    def delta(name: str, **extra: object) -> float:
        return value(after, name, **labels, **extra) - value(before, name, **labels, **extra)

    assert delta("kshare_share_deliveries_total") == 30
    assert delta("kshare_share_acknowledgements_total", type="accept") == 20
    assert delta("kshare_share_acknowledgements_total", type="reject") == 10
    assert delta("kshare_share_archived_total") == 10
    assert value(after, "kshare_share_partition_lag", partition=0, **labels) == 0
    assert value(after, "kshare_share_partition_acquired_records", partition=0, **labels) == 0
    assert value(after, "kshare_share_group_members", group=group, state="Empty") == 0
    # the proxy's own request accounting saw the share-group traffic
    assert value(after, "kshare_requests_total", api="ShareFetch") > value(before, "kshare_requests_total", api="ShareFetch")
    assert value(after, "kshare_request_seconds_count", api="ShareAcknowledge") + value(
        after, "kshare_request_seconds_count", api="ShareFetch") > 0
    assert value(after, "kshare_state_write_seconds_count") > value(before, "kshare_state_write_seconds_count")


def _ready(port: int) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _bootstrap_once(address: str) -> None:
    """A client connects (the proxy then dials the cluster for it) and the proxy answers or closes."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.settimeout(15)
        with contextlib.suppress(OSError):
            s.recv(1)


def test_ready_follows_a_later_cluster_outage(kafka39, caplog) -> None:
    """/ready is 503 while clients cannot reach the cluster, not only before the first contact,
    and 200 again soon after the cluster is back WITHOUT any client connecting through the proxy:
    the proxy re-probes the cluster itself (a proxy that is not ready gets no clients from a
    Kubernetes Service, so waiting for one would never end). The outage is logged once when it
    begins and once when it ends, not per attempt. (The session's broker is stopped here and
    started again, same port and data.)"""
    caplog.set_level(logging.WARNING, logger="kshare.proxy")
    with ShareProxyThread(kafka39.bootstrap, metrics_port=0) as proxy:
        port = proxy.app.metrics_server.port
        wait_until(lambda: _ready(port)[0] == 200, 30, "ready")
        kafka39.stop()
        try:
            _bootstrap_once(proxy.bootstrap)
            status, doc = _ready(port)
            assert status == 503 and "unreachable" in doc["reason"], (status, doc)
            # still down while the cluster is: the re-probes fail (several rounds of backoff)
            time.sleep(5)
            status, doc = _ready(port)
            assert status == 503 and "unreachable" in doc["reason"], (status, doc)
            connections = value(scrape(port), "kshare_requests_total", api="ApiVersions")
        finally:
            kafka39.start()

        back = time.monotonic()
        wait_until(lambda: _ready(port)[0] == 200, 10, "ready again without a client", interval=0.2)
        assert time.monotonic() - back < 10
        # no client request went through the proxy meanwhile
        assert value(scrape(port), "kshare_requests_total", api="ApiVersions") == connections
        assert proxy.app.proxy.connections == set()

    warnings = [r.getMessage() for r in caplog.records if r.name == "kshare.proxy" and r.levelno >= logging.WARNING]
    down = [m for m in warnings if "not ready until the cluster answers again" in m]
    again = [m for m in warnings if m.startswith("upstream cluster reachable again")]
    assert len(down) == 1 and len(again) == 1, warnings
    assert "answered the proxy's probe" in again[0], again


def test_a_share_service_loop_that_ends_makes_the_proxy_not_ready_and_not_live(kafka39, caplog) -> None:
    """A loop of the share service that ends while the proxy runs (a bug in kshare; here its lock
    timers, made to raise by the test) would leave records out forever without a word: it is
    logged once at ERROR, and /ready and /live answer 503 with the reason, so an orchestrator
    restarts the proxy. Other requests are still served."""
    caplog.set_level(logging.ERROR, logger="kshare.share")
    with ShareProxyThread(kafka39.bootstrap, metrics_port=0) as proxy:
        port = proxy.app.metrics_server.port
        wait_until(lambda: _ready(port)[0] == 200, 30, "ready")
        service = proxy.service

        def fail(now=None):
            raise RuntimeError("injected by the test")

        def inject() -> None:
            service.coordinator.expire = fail
            service.locks.wakeup.set()

        proxy.call(inject)
        wait_until(lambda: _ready(port)[0] == 503, 10, "not ready")
        status, doc = _ready(port)
        assert doc["share_state"] == "broken", doc
        assert doc["reason"] == ("the share service is broken: its lock and session timers loop ended "
                                 "(RuntimeError('injected by the test'))"), doc
        with pytest.raises(urllib.error.HTTPError) as live:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/live", timeout=10)
        assert live.value.code == 503 and json.loads(live.value.read())["live"] is False
        assert value(scrape(port), "kshare_ready") == 0
    errors = [r for r in caplog.records if r.name.startswith("kshare.share") and r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is not None, [r.getMessage() for r in errors]


def test_releases_and_refused_acknowledgements_are_counted(kafka39) -> None:
    """What explains a redelivery is exported: a member whose connection closes with records held
    (``kshare_share_member_releases_total{reason="connection_closed"}``), and acknowledgements the
    proxy refused (``kshare_share_acknowledgement_errors_total``, by error), each in records."""
    from tests.harness.share import Raw, acquired, partitions

    topic = group = f"metrics-releases-{uuid.uuid4().hex[:8]}"
    kafka39.create_topic(topic, partitions=1)
    with ShareProxyThread(kafka39.bootstrap, metrics_port=0) as proxy:
        port = proxy.app.metrics_server.port
        share_group(proxy.bootstrap, group)
        produce(proxy.bootstrap, topic, [f"v{i}" for i in range(10)], per_batch=10)

        async def main() -> None:
            raw = await Raw.open(proxy.bootstrap, "releases")
            tid = await raw.topic_id(topic)
            member, _ = await raw.join(group, topic)
            got = await raw.fetch(group, member, 0, {tid: [0]}, max_wait_ms=5000)
            assert acquired(got) == [(0, 9, 1)], got
            acked = await raw.ack(group, member, 1, {(tid, 0): [(0, 4, [1])]})
            assert partitions(acked)[(tid, 0)].error_code == 0, acked
            # offsets 0-4 are acknowledged already: refused, 5 records
            acked = await raw.ack(group, member, 2, {(tid, 0): [(0, 4, [1])]})
            assert partitions(acked)[(tid, 0)].error_code == 121, acked  # INVALID_RECORD_STATE
            await raw.close()  # with offsets 5-9 still held

        asyncio.run(main())
        labels = {"group": group, "topic": topic}
        wait_until(lambda: value(scrape(port), "kshare_share_member_releases_total", reason="connection_closed",
                                 **labels) == 5, 10, "5 records released by the connection's close")
        assert value(scrape(port), "kshare_share_acknowledgement_errors_total", error="INVALID_RECORD_STATE",
                     **labels) == 5
