"""Prometheus metrics and readiness, wired in by ``app.py``.

The proxy and the share layer keep plain counts (``ProxyStats``, ``ShareStats``) and expose two
latency hooks; nothing below this module knows about Prometheus. Here those counts become
metrics through ``prometheus_client`` custom collectors that read live state at scrape time
(no cluster round trips), the two latencies become histograms, and a small HTTP server on the
proxy's own event loop serves:

* ``GET /metrics``: the Prometheus text exposition (also ``/``);
* ``GET /ready``: 200 once the proxy knows its cluster and has loaded the share state, else 503;
  the body is JSON saying why (``ready``, ``reason``, ``upstream``, ``share_state``);
* ``GET /live``: 200 while the event loop answers.

Metric names are listed in docs/reference/metrics.md; changing one breaks operators' dashboards.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .protocol import messages
from .share.admin import settled_above_start
from .share.upstream_checks import CHECKS

if TYPE_CHECKING:
    from .proxy.server import Proxy
    from .share.service import ShareGroupService

log = logging.getLogger("kshare.metrics")

# No ``*_created`` series: they double the exposition and no dashboard of ours uses them.
disable_created_metrics()

# seconds; covers a loopback round trip up to a long-polling fetch
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ProxyCollector(Collector):
    """Requests, rejected and open connections, brokers: read from the proxy at scrape time."""

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy

    def collect(self) -> Iterable[Metric]:
        proxy = self.proxy
        requests = CounterMetricFamily("kshare_requests", "Client requests by API", labels=["api"])
        for key, n in sorted(proxy.stats.requests.items()):
            requests.add_metric([api_name(key)], n)
        yield requests
        yield CounterMetricFamily("kshare_rejected_connections", "Client connections closed for bad input",
                                  value=proxy.stats.rejected)
        yield GaugeMetricFamily("kshare_client_connections", "Open client connections", value=len(proxy.connections))
        yield GaugeMetricFamily("kshare_brokers", "Upstream brokers with a proxy listener",
                                value=len(proxy.brokers.listeners))
        yield GaugeMetricFamily("kshare_brokers_gone", "Upstream brokers gone (refusing connections or out of the "
                                "cluster metadata) and not yet back", value=len(proxy.brokers.gone))
        yield GaugeMetricFamily("kshare_client_connections_standing_in", "Client connections of a gone broker's "
                                "listener served through another broker until it is back",
                                value=sum(len(c) for c in proxy.brokers.standing_in.values()))


class ShareCollector(Collector):
    """Share-group counters and per group / share-partition gauges, read from live state."""

    def __init__(self, service: ShareGroupService) -> None:
        self.service = service

    def collect(self) -> Iterable[Metric]:
        service, stats = self.service, self.service.stats
        for name, help_text, counts in (
            ("kshare_share_deliveries", "Records handed to share consumers", stats.deliveries),
            ("kshare_share_archived", "Records archived after delivery (rejected or limit reached)", stats.archived),
            ("kshare_share_lock_timeouts", "Acquisition locks that ran out", stats.lock_timeouts),
        ):
            family = CounterMetricFamily(name, help_text, labels=["group", "topic"])
            for (group, topic), n in counts.items():
                family.add_metric([group, topic], n)
            yield family
        yield GaugeMetricFamily("kshare_record_cache_bytes", "Raw record batches cached for share fetches "
                                "(bytes plus a per-batch overhead)", value=service.record_cache_size())
        yield GaugeMetricFamily("kshare_record_cache_budget_bytes", "The record cache's budget (--record-cache-mb)",
                                value=service.record_cache_bytes)
        yield GaugeMetricFamily("kshare_record_cache_partitions", "Topic-partitions with a record cache in use",
                                value=len(service.logs))
        yield GaugeMetricFamily("kshare_answer_record_bytes", "Records held by ShareFetch answers being made or "
                                "waiting for the client's socket (at most half the record cache budget besides it)",
                                value=service.cache_pool.answer_bytes)
        if service.instances is not None:
            owned = getattr(service.ownership, "claimed", ())
            yield GaugeMetricFamily("kshare_instance_state_partitions", "State-topic partitions this proxy of the "
                                    "instance group owns (serves and writes)", value=len(owned))
            yield GaugeMetricFamily("kshare_instance_proxies", "Proxies in the instance group, as of the last "
                                    "ownership map", value=len(service.ownership.map.instances)
                                    if service.ownership.map is not None else 0)
            yield GaugeMetricFamily("kshare_instance_epoch", "Epoch of the instance group's last ownership map",
                                    value=service.ownership.epoch)
            exchange = getattr(service, "copy_exchange", None)  # kshare.share.copy_exchange, once used
            for name, help_text, attr in (
                ("kshare_instance_state_exchange_requests", "Requests sent to other proxies of the instance "
                 "group to read (read) or drop (drop) their copies of share-partitions' state", "requests"),
                ("kshare_instance_state_exchange_partitions", "Share-partitions those requests carried",
                 "partitions"),
            ):
                family = CounterMetricFamily(name, help_text, labels=["request"])
                counts = getattr(exchange, attr, None) or {}
                for kind in ("read", "drop"):
                    family.add_metric([kind], counts.get(kind, 0))
                yield family
            put_off = CounterMetricFamily("kshare_instance_confirmations_put_off", "Times a share-partition this "
                                          "proxy leads was not served yet because its state could not be confirmed "
                                          "(its fetches leave it out and try again)", labels=["reason"])
            for reason, n in service.confirmations_put_off.items():
                put_off.add_metric([reason], n)
            yield put_off
            elsewhere = getattr(service.ownership, "elsewhere", None)  # kshare.share.handovers_elsewhere
            if elsewhere is not None:
                yield GaugeMetricFamily("kshare_instance_handovers_named_elsewhere", "Topic-partitions this proxy "
                                        "names at the proxy still handing them over, not at their new leader",
                                        value=len(elsewhere))
                ended = CounterMetricFamily("kshare_instance_handovers_named", "Topic-partitions named at the proxy "
                                            "handing them over, by how that ended", labels=["ended"])
                for how, n in elsewhere.ended.items():
                    ended.add_metric([how], n)
                yield ended
        checks = service.upstream.checks
        deviation = GaugeMetricFamily("kshare_upstream_deviation", "1 where the fronted cluster deviates from Kafka "
                                      "in what kshare relies on (logged once at WARNING; docs/reference/proxy.md)",
                                      labels=["check"])
        for check in CHECKS:
            deviation.add_metric([check], 1 if check in checks.deviations else 0)
        yield deviation
        yield CounterMetricFamily("kshare_end_offset_corrections", "End offsets kshare corrected from the batches it "
                                  "read, on a cluster whose end offsets fall short of its records",
                                  value=checks.end_offset_corrections)
        yield CounterMetricFamily("kshare_state_batches_resent", "State-topic batches sent again to a partition's "
                                  "new leader (a broker restarting or failing)",
                                  value=getattr(getattr(service.store, "stats", None), "resent_batches", 0))
        yield CounterMetricFamily("kshare_authorization_checks", "Questions asked of the cluster, as a client, "
                                  "whether it may do what it asked of the share-group service", value=service.authz.probes)
        yield CounterMetricFamily("kshare_authorization_denials", "Of those, the ones the cluster refused",
                                  value=service.authz.denials)
        acks = CounterMetricFamily("kshare_share_acknowledgements", "Records acknowledged, by type",
                                   labels=["group", "topic", "type"])
        for labels, n in stats.acks.items():
            acks.add_metric(list(labels), n)
        yield acks
        releases = CounterMetricFamily("kshare_share_member_releases", "Records released without an acknowledgement "
                                       "because the member holding them went, by reason", labels=["group", "topic",
                                                                                                  "reason"])
        for labels, n in stats.member_releases.items():
            releases.add_metric(list(labels), n)
        yield releases
        ack_errors = CounterMetricFamily("kshare_share_acknowledgement_errors", "Records whose acknowledgement "
                                         "was answered with an error, by error", labels=["group", "topic", "error"])
        for labels, n in stats.ack_errors.items():
            ack_errors.add_metric(list(labels), n)
        yield ack_errors

        members = GaugeMetricFamily("kshare_share_group_members", "Members of each share group",
                                    labels=["group", "state"])
        for g in service.coordinator.groups.values():
            if service.owns_group(g.group_id):  # in an instance group, the group's coordinator reports it
                members.add_metric([g.group_id, g.state.value], len(g.members))
        yield members

        labels = ["group", "topic", "partition"]
        gauges = {name: GaugeMetricFamily(f"kshare_share_partition_{name}", help_text, labels=labels)
                  for name, help_text in (
                      ("spso", "Share-partition start offset"),
                      ("speo", "Share-partition end offset"),
                      ("in_flight_records", "Records between SPSO and SPEO"),
                      ("acquired_records", "Records currently acquired"),
                      ("lag", "Records not yet delivery-complete (from the last seen high watermark)"),
                      ("fetching_members", "Members that fetched from the share-partition within the lock "
                                           "duration (its lock budget is shared among them)"))}
        member_labels = [*labels, "member"]
        member_acquired = CounterMetricFamily(
            "kshare_share_member_acquired_records", "Records acquired per member per share-partition, "
            "while the member fetches there (fair acquisition)", labels=member_labels)
        member_held = GaugeMetricFamily("kshare_share_member_held_records",
                                        "Records a member holds acquired on a share-partition", labels=member_labels)
        for key, sp in service.partitions.items():
            engine = sp.engine
            if engine is None:
                continue
            row = [key.group_id, sp.topic.name, str(key.partition)]
            plog = service.logs.get((key.topic_id, key.partition, True)) or service.logs.get(
                (key.topic_id, key.partition, False))
            hw = plog.high_watermark if plog is not None else -1
            lag = -1
            if hw >= 0:
                lag = max(0, hw - engine.start_offset - settled_above_start(engine.snapshot(), hw))
            gauges["spso"].add_metric(row, engine.start_offset)
            gauges["speo"].add_metric(row, engine.end_offset)
            gauges["in_flight_records"].add_metric(row, engine.in_flight_count)
            gauges["acquired_records"].add_metric(row, engine.acquired_count())
            gauges["lag"].add_metric(row, lag)
            gauges["fetching_members"].add_metric(row, len(sp.fair.members))
            for member_id, m in sp.fair.members.items():
                member_row = [*row, member_id]
                member_acquired.add_metric(member_row, m.acquired_total)
                member_held.add_metric(member_row, engine.acquired_count(member_id))
        yield from gauges.values()
        yield member_acquired
        yield member_held


class Readiness(Collector):
    """Whether the proxy can do its job yet, and if not, why (also exported as ``kshare_ready``)."""

    def __init__(self, proxy: Proxy, service: ShareGroupService | None) -> None:
        self.proxy, self.service = proxy, service

    def status(self) -> dict[str, object]:
        upstream = ",".join(f"{h}:{p}" for h, p in self.proxy.config.upstream)
        reason = None
        if self.proxy.upstream_versions is None:
            why = self.proxy.upstream_error or "not contacted yet"
            reason = f"waiting for the upstream cluster ({why})"
        elif self.proxy.upstream_down is not None:
            reason = f"the upstream cluster is unreachable ({self.proxy.upstream_down[1]})"
        share_state = "disabled"
        if self.service is not None:
            share_state = "loaded" if self.service.loaded else "loading"
            if not self.service.loaded and reason is None:
                why = self.service.load_error or "in progress"
                reason = f"loading the share-group state: {why}"
            if self.service.broken is not None:
                share_state = "broken"
                reason = f"the share service is broken: {self.service.broken}"
        status: dict[str, object] = {"ready": reason is None, "reason": reason, "upstream": upstream,
                                     "share_state": share_state}
        if self.service is not None and self.service.instances is not None:
            ownership = self.service.ownership
            status["instance_group"] = self.service.instances.group_id
            status["state_partitions"] = sorted(getattr(ownership, "claimed", ()))
            status["ownership_epoch"] = ownership.epoch
        return status

    def collect(self) -> Iterable[Metric]:
        yield GaugeMetricFamily("kshare_ready", "1 once the cluster is known and the share state is loaded",
                                value=1 if self.status()["ready"] else 0)


class Metrics:
    """One proxy's registry: its collectors and the two latency histograms."""

    def __init__(self, proxy: Proxy, service: ShareGroupService | None) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        for standard in (ProcessCollector, PlatformCollector, GCCollector):  # process_*, python_*
            standard(registry=self.registry)
        self.readiness = Readiness(proxy, service)
        self.registry.register(ProxyCollector(proxy))
        self.registry.register(self.readiness)
        request_seconds = Histogram("kshare_request_seconds", "Client request latency by API (header to response)",
                                    ["api"], buckets=BUCKETS, registry=self.registry)
        by_key: dict[int, Callable[[float], None]] = {}

        def answered(api_key: int, seconds: float) -> None:
            observe = by_key.get(api_key)
            if observe is None:
                observe = by_key[api_key] = request_seconds.labels(api=api_name(api_key)).observe
            observe(seconds)

        proxy.stats.answered = answered
        if service is not None:
            self.registry.register(ShareCollector(service))
            state_write = Histogram("kshare_state_write_seconds", "Durable state write latency",
                                    buckets=BUCKETS, registry=self.registry)
            service.stats.on_state_write = state_write.observe

    def render(self) -> bytes:
        return generate_latest(self.registry)


class MetricsServer:
    """``/metrics``, ``/ready`` and ``/live`` over HTTP/1.1 on the proxy's event loop."""

    def __init__(self, metrics: Metrics, host: str, port: int) -> None:
        self.metrics, self.host, self.port = metrics, host, port
        self.server: asyncio.Server | None = None

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = self.server.sockets[0].getsockname()[1]
        log.info("metrics on http://%s:%d/metrics, readiness on /ready", self.host, self.port)

    def respond(self, path: bytes) -> tuple[str, bytes, str]:
        path = path.split(b"?")[0]
        if path in (b"/metrics", b"/"):
            try:
                return "200 OK", self.metrics.render(), CONTENT_TYPE_LATEST
            except Exception:  # noqa: BLE001 - a scrape must never break the proxy
                log.exception("collecting metrics failed")
                return "500 Internal Server Error", b"collecting metrics failed\n", "text/plain"
        if path == b"/ready":
            status = self.metrics.readiness.status()
            body = (json.dumps(status) + "\n").encode()
            return ("200 OK" if status["ready"] else "503 Service Unavailable"), body, "application/json"
        if path in (b"/live", b"/healthz"):
            # a share service with a loop ended (a bug, logged) is fixed by a restart: not live
            service = self.metrics.readiness.service
            if service is not None and service.broken is not None:
                body = (json.dumps({"live": False, "reason": f"the share service is broken: {service.broken}"})
                        + "\n").encode()
                return "503 Service Unavailable", body, "application/json"
            return "200 OK", b'{"live": true}\n', "application/json"
        return "404 Not Found", b"not found: try /metrics, /ready or /live\n", "text/plain"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            parts = request.split(b" ", 2)
            status, body, ctype = self.respond(parts[1] if len(parts) == 3 else b"/")
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


# Apache Kafka's API key names (ApiKeys), for the APIs kshare forwards without a spec of its own
# (e.g. 71, GetTelemetrySubscriptions, which librdkafka sends): labels only.
_KAFKA_API_NAMES = (
    "Produce Fetch ListOffsets Metadata LeaderAndIsr StopReplica UpdateMetadata ControlledShutdown OffsetCommit "
    "OffsetFetch FindCoordinator JoinGroup Heartbeat LeaveGroup SyncGroup DescribeGroups ListGroups SaslHandshake "
    "ApiVersions CreateTopics DeleteTopics DeleteRecords InitProducerId OffsetForLeaderEpoch AddPartitionsToTxn "
    "AddOffsetsToTxn EndTxn WriteTxnMarkers TxnOffsetCommit DescribeAcls CreateAcls DeleteAcls DescribeConfigs "
    "AlterConfigs AlterReplicaLogDirs DescribeLogDirs SaslAuthenticate CreatePartitions CreateDelegationToken "
    "RenewDelegationToken ExpireDelegationToken DescribeDelegationToken DeleteGroups ElectLeaders "
    "IncrementalAlterConfigs AlterPartitionReassignments ListPartitionReassignments OffsetDelete "
    "DescribeClientQuotas AlterClientQuotas DescribeUserScramCredentials AlterUserScramCredentials Vote "
    "BeginQuorumEpoch EndQuorumEpoch DescribeQuorum AlterPartition UpdateFeatures Envelope FetchSnapshot "
    "DescribeCluster DescribeProducers BrokerRegistration BrokerHeartbeat UnregisterBroker DescribeTransactions "
    "ListTransactions AllocateProducerIds ConsumerGroupHeartbeat ConsumerGroupDescribe ControllerRegistration "
    "GetTelemetrySubscriptions PushTelemetry AssignReplicasToDirs ListConfigResources DescribeTopicPartitions "
    "ShareGroupHeartbeat ShareGroupDescribe ShareFetch ShareAcknowledge AddRaftVoter RemoveRaftVoter "
    "UpdateRaftVoter InitializeShareGroupState ReadShareGroupState WriteShareGroupState DeleteShareGroupState "
    "ReadShareGroupStateSummary StreamsGroupHeartbeat StreamsGroupDescribe DescribeShareGroupOffsets "
    "AlterShareGroupOffsets DeleteShareGroupOffsets"
).split()


def api_name(key: int) -> str:
    a = messages.apis().get(key)
    if a is not None:
        return a.name
    return _KAFKA_API_NAMES[key] if 0 <= key < len(_KAFKA_API_NAMES) else str(key)
