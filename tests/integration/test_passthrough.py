"""The pass-through proxy is transparent: real clients, real brokers, proxied vs direct.

For each upstream (Apache Kafka 3.9 and Tansu) one proxy runs for the whole module. Every test does
the same thing through the proxy and directly against the broker and requires the same outcome,
except for broker addresses, which through the proxy must always be the proxy's own listeners.

* confluent-kafka, kafka-python 3 and aiokafka produce keyed records with headers and read them back
  in a consumer group (subscribe): the records read through the proxy and directly are identical.
  Tansu's group coordination works directly and through the proxy, so groups are used on both.
* Admin calls (confluent AdminClient, KafkaAdminClient) give the same answers.
* Raw requests (``kshare.client.KafkaConnection``): FindCoordinator batched (v4+) and single (v0-v3),
  Metadata v0/v1/v9/v12, DescribeCluster, ApiVersions (including a version newer than we know).
* Transactions, multi-MB records and acks=0 Produce pipelined with other requests.
* NodeEndpoints in Produce v10+/Fetch v16+ NOT_LEADER_OR_FOLLOWER answers, on a 2-broker Kafka cluster.
* ApiVersions capped at the codec's versions, on Kafka 4.4 (the only upstream newer than the codec).
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
from confluent_kafka import Consumer, ConsumerGroupState, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from kshare.clients.connection import KafkaConnection
from kshare.protocol import messages
from kshare.proxy import filters
from tests.harness import clients
from tests.harness.cluster import KafkaCluster
from tests.harness.proxies import ProxyThread

PRODUCE, FETCH, METADATA, FIND_COORDINATOR, API_VERSIONS, DESCRIBE_CLUSTER = 0, 1, 3, 10, 18, 60
NOT_LEADER_OR_FOLLOWER = 6
COORDINATOR_NOT_AVAILABLE = 15
UNSUPPORTED_VERSION = 35
ZERO_UUID = bytes(16)
N = 30  # records produced per side (through the proxy, and directly) in a round trip


# ------------------------------------------------------------------------------------------------
# fixtures


@dataclass
class Side:
    """One upstream broker and the proxy in front of it."""

    name: str
    broker: object  # tests.harness.brokers.KafkaBroker | TansuBroker
    proxy: ProxyThread

    @property
    def direct(self) -> str:
        return self.broker.bootstrap

    @property
    def proxied(self) -> str:
        return self.proxy.bootstrap

    @property
    def real_address(self) -> tuple[str, int]:
        return self.broker.host, self.broker.port

    def listeners(self) -> dict[int, tuple[str, int]]:
        """node id -> the proxy listener clients must be sent to (``proxy.brokers.ports``)."""
        brokers = self.proxy.proxy.brokers
        ports = self.proxy.call(lambda: dict(brokers.ports))
        return {node: (self.proxy.config.advertised, port) for node, port in ports.items()}

    def proxy_addresses(self) -> set[tuple[str, int]]:
        return set(self.listeners().values()) | {_hostport(self.proxied)}

    def unproxy(self, host: str, port: int) -> tuple[str, int]:
        """The real broker address behind a proxy listener address."""
        upstream = self.proxy.call(lambda: dict(self.proxy.proxy.brokers.upstream))
        for node, addr in self.listeners().items():
            if addr == (host, port):
                return upstream[node]
        raise AssertionError(f"{host}:{port} is not a proxy listener ({self.listeners()})")


def _hostport(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


@pytest.fixture(
    scope="module",
    params=[
        pytest.param("kafka39", marks=pytest.mark.kafka, id="kafka39"),
        pytest.param("tansu", marks=pytest.mark.tansu, id="tansu"),
    ],
)
def side(request: pytest.FixtureRequest) -> Iterator[Side]:
    """One proxy per upstream, shared by the module's tests."""
    broker = request.getfixturevalue(request.param)
    with ProxyThread(broker.bootstrap) as proxy:
        yield Side(request.param, broker, proxy)


@pytest.fixture(scope="module")
def live_group(side: Side) -> Iterator[tuple[str, str]]:
    """(group, topic): a consumer group with one confluent member, joined through the proxy and
    alive for the module (librdkafka heartbeats from its own thread)."""
    suffix = uuid.uuid4().hex[:8]
    topic, group = f"live-{suffix}", f"live-group-{suffix}"
    side.broker.create_topic(topic, partitions=2)
    consumer = Consumer(
        {
            "bootstrap.servers": side.proxied,
            "group.id": group,
            "client.id": "live-member",
            "session.timeout.ms": clients.SESSION_TIMEOUT_MS,
            "heartbeat.interval.ms": clients.HEARTBEAT_MS,
            "max.poll.interval.ms": 900_000,
            "logger": clients._quiet(),
        }
    )
    consumer.subscribe([topic])
    deadline = time.monotonic() + 60
    while not consumer.assignment():
        assert time.monotonic() < deadline, "the live group's member never got an assignment"
        consumer.poll(0.2)
    # Tansu lists (ListGroups) only groups that committed offsets: commit some, as a real member would
    consumer.commit(
        offsets=[TopicPartition(topic, p.partition, 0) for p in consumer.assignment()], asynchronous=False
    )
    try:
        yield group, topic
    finally:
        consumer.close()


def _admin(bootstrap: str) -> AdminClient:
    return AdminClient(
        {"bootstrap.servers": bootstrap, "logger": clients._quiet(), "socket.timeout.ms": 10000}
    )


def run(coro):
    return asyncio.run(coro)


async def _open(address: str | tuple[str, int]) -> KafkaConnection:
    host, port = _hostport(address) if isinstance(address, str) else address
    return await KafkaConnection.open(host, port, client_id="kshare-passthrough-test")


def _versions(address: str | tuple[str, int]) -> dict[int, tuple[int, int]]:
    """The API versions a listener advertises (ApiVersions v3, as KafkaConnection asks)."""

    async def ask():
        conn = await _open(address)
        await conn.close()
        return conn.versions

    return run(ask())


def _outcome(fn, *args):
    """("ok", result) or ("error", exception type, message): for calls that may fail alike both ways."""
    try:
        return "ok", fn(*args)
    except Exception as exc:  # noqa: BLE001 - compared, not swallowed
        return "error", type(exc).__name__, str(exc)


def _wait(predicate, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


# ------------------------------------------------------------------------------------------------
# produce / consume round trips with each client library


@pytest.mark.parametrize("library", list(clients.LIBRARIES))
def test_round_trip_same_as_direct(side: Side, library: str, topic_name: str) -> None:
    produce, consume = clients.LIBRARIES[library]
    side.broker.create_topic(topic_name, partitions=3)
    sent = {"proxy": clients.make_records("proxy", N), "direct": clients.make_records("direct", N)}

    acked = {
        "proxy": produce(side.proxied, topic_name, sent["proxy"]),
        "direct": produce(side.direct, topic_name, sent["direct"]),
    }

    # the same keys, the same client library: the same partitions either way
    key_partitions = {
        via: {key: {acked[via][value][0] for k, value, _ in sent[via] if k == key} for key, _, _ in sent[via]}
        for via in sent
    }
    assert key_partitions["proxy"] == key_partitions["direct"]
    assert all(len(parts) == 1 for parts in key_partitions["proxy"].values())

    with ThreadPoolExecutor(2) as pool:  # both consumer groups join at once (Tansu joins take ~3 s)
        via_proxy = pool.submit(consume, side.proxied, topic_name, f"proxied-{topic_name}", 2 * N)
        via_direct = pool.submit(consume, side.direct, topic_name, f"direct-{topic_name}", 2 * N)
        proxied, direct = via_proxy.result(), via_direct.result()

    assert len(proxied.records) == 2 * N
    assert sorted(proxied.records) == sorted(direct.records)

    # and they are what was produced, where the producers were told it went
    outgoing = {value: (key, headers) for via in sent for key, value, headers in sent[via]}
    positions = {**acked["proxy"], **acked["direct"]}
    for rec in proxied.records:
        assert rec.topic == topic_name
        assert (rec.key, list(rec.headers)) == outgoing[rec.value]
        assert (rec.partition, rec.offset) == positions[rec.value]

    # every broker the proxied consumer learned of or talked to, the coordinator included, is the
    # proxy; the direct one saw the real broker
    assert proxied.addresses and proxied.addresses <= side.proxy_addresses(), proxied.addresses
    assert proxied.coordinator in side.listeners().values()
    assert direct.coordinator == side.real_address
    assert not direct.addresses & side.proxy_addresses()


def test_transactions_same_as_direct(side: Side, topic_name: str) -> None:
    """Transactional producers (FindCoordinator for a transactional id, InitProducerId,
    AddPartitionsToTxn, EndTxn) through the proxy, read back with read_committed."""
    side.broker.create_topic(topic_name, partitions=2)
    n = 8
    producers = {
        via: clients.confluent_transactions(bootstrap, topic_name, via, n)
        for via, bootstrap in (("proxy", side.proxied), ("direct", side.direct))
    }
    assert producers["proxy"].coordinator in side.listeners().values()
    assert producers["proxy"].addresses <= side.proxy_addresses(), producers["proxy"].addresses
    assert producers["direct"].coordinator == side.real_address

    # Tansu drops aborted records altogether (read_uncommitted does not see them either, directly)
    with ThreadPoolExecutor(2) as pool:
        futures = [
            pool.submit(
                clients.confluent_consume,
                bootstrap,
                topic_name,
                f"{via}-{topic_name}",
                2 * n,
                **{"isolation.level": "read_committed"},
            )
            for via, bootstrap in (("proxied", side.proxied), ("direct", side.direct))
        ]
        proxied, direct = (f.result() for f in futures)
    assert sorted(proxied.records) == sorted(direct.records)
    values = sorted(r.value.decode() for r in proxied.records)
    assert values == sorted(f"{via}-commit-{i}" for via in producers for i in range(n))


def test_large_records_same_as_direct(side: Side, topic_name: str) -> None:
    """Produce requests and Fetch responses of several MB, relayed in many reads and writes."""
    side.broker.create_topic(topic_name, partitions=2)
    blob = os.urandom(256 * 1024)
    records = [
        (f"big-{i}".encode(), blob + i.to_bytes(2, "big"), [("n", str(i).encode())]) for i in range(16)
    ]
    acked = clients.confluent_produce(side.proxied, topic_name, records, **{"batch.size": 4 * 1024 * 1024})
    assert len(acked) == len(records)
    with ThreadPoolExecutor(2) as pool:
        futures = [
            pool.submit(clients.confluent_consume, bootstrap, topic_name, f"{via}-{topic_name}", len(records))
            for via, bootstrap in (("proxied", side.proxied), ("direct", side.direct))
        ]
        proxied, direct = (f.result() for f in futures)
    assert sorted(proxied.records) == sorted(direct.records)
    assert sorted(r.value for r in proxied.records) == sorted(value for _, value, _ in records)


def test_produce_acks_zero_keeps_responses_in_order(side: Side, topic_name: str) -> None:
    """acks=0 Produce requests get no response: pipelined between requests that do, the proxy must
    keep every other response matched to its request."""
    side.broker.create_topic(topic_name, partitions=1)
    Produce = messages.message_class("ProduceRequest")

    def batch(i: int) -> bytes:
        from kafka.record.memory_records import MemoryRecordsBuilder

        builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 16)
        builder.append(int(time.time() * 1000), f"k{i}".encode(), f"acks0-{i}".encode(), [])
        builder.close()
        return bytes(builder.buffer())

    async def pipeline() -> list:
        conn = await _open(side.proxied)
        try:
            version = conn.best_version(PRODUCE)
            pending = []
            for i in range(20):
                partition = Produce.PartitionProduceData(index=0, records=batch(i))
                request = Produce(
                    transactional_id=None,
                    acks=0,
                    timeout_ms=5000,
                    topic_data=[Produce.TopicProduceData(name=topic_name, partition_data=[partition])],
                )
                await conn.request(PRODUCE, version, request, expect_response=False)
                pending.append(
                    asyncio.ensure_future(conn.request(METADATA, 1, _metadata_request(1, topic_name)))
                )
            return await asyncio.gather(*pending)
        finally:
            await conn.close()

    answers = run(pipeline())
    assert len(answers) == 20
    assert all([t.name for t in md.topics] == [topic_name] for md in answers)
    # and a librdkafka producer with acks=0 through the proxy
    records = clients.make_records("acks0-client", 20)
    clients.confluent_produce(side.proxied, topic_name, records, acks=0)
    read = clients.confluent_consume(side.direct, topic_name, f"check-{topic_name}", 40)
    values = {r.value for r in read.records}
    assert {f"acks0-{i}".encode() for i in range(20)} <= values
    assert {value for _, value, _ in records} <= values


# ------------------------------------------------------------------------------------------------
# admin clients


def _topic_view(md) -> dict:
    return {
        name: (
            None if t.error is None else t.error.code(),
            {p.id: (p.leader, tuple(p.replicas), tuple(p.isrs)) for p in t.partitions.values()},
        )
        for name, t in md.topics.items()
    }


def _configs(result: dict) -> dict:
    ((_, fut),) = result.items()
    return {
        name: (e.value, e.source, e.is_read_only, e.is_sensitive, e.is_default)
        for name, e in fut.result(30).items()
    }


def _group_view(g) -> tuple:
    members = sorted(
        (
            m.member_id,
            m.client_id,
            m.host,
            sorted((tp.topic, tp.partition) for tp in m.assignment.topic_partitions),
        )
        for m in g.members
    )
    return (
        g.group_id,
        g.is_simple_consumer_group,
        g.state,
        g.partition_assignor,
        g.type,
        g.coordinator.id,
        members,
    )


def test_confluent_admin_same_as_direct(side: Side, live_group: tuple[str, str], topic_name: str) -> None:
    proxied, direct = _admin(side.proxied), _admin(side.direct)
    listeners = side.listeners()

    # create, with partitions and a config, through the proxy
    new = NewTopic(topic_name, num_partitions=4, replication_factor=1, config={"retention.ms": "3600000"})
    proxied.create_topics([new], operation_timeout=30, request_timeout=30)[topic_name].result(30)
    _wait(lambda: topic_name in direct.list_topics(timeout=10).topics, "the new topic to be visible directly")

    # list topics: the same topics and partitions; brokers at the proxy
    md_p, md_d = proxied.list_topics(timeout=10), direct.list_topics(timeout=10)
    assert _topic_view(md_p) == _topic_view(md_d)
    assert len(md_p.topics[topic_name].partitions) == 4
    assert md_p.cluster_id == md_d.cluster_id and md_p.controller_id == md_d.controller_id
    assert {n: (b.host, b.port) for n, b in md_p.brokers.items()} == listeners
    assert {(b.host, b.port) for b in md_d.brokers.values()} == {side.real_address}

    # describe cluster
    dc_p, dc_d = proxied.describe_cluster().result(30), direct.describe_cluster().result(30)
    assert dc_p.cluster_id == dc_d.cluster_id
    assert (dc_p.controller.id if dc_p.controller else None) == (
        dc_d.controller.id if dc_d.controller else None
    )
    assert {n.id: (n.host, n.port) for n in dc_p.nodes} == listeners
    assert [n.id for n in dc_p.nodes] == [n.id for n in dc_d.nodes]
    if dc_p.controller is not None:
        assert (dc_p.controller.host, dc_p.controller.port) == listeners[dc_p.controller.id]

    # describe the topic's configs
    resource = ConfigResource(ResourceType.TOPIC, topic_name)
    configs_p = _configs(proxied.describe_configs([resource], request_timeout=30))
    assert configs_p == _configs(direct.describe_configs([resource], request_timeout=30))

    # consumer groups: listed and described alike; the coordinator at the proxy
    group, _ = live_group
    listed_p = proxied.list_consumer_groups(request_timeout=30).result(30)
    listed_d = direct.list_consumer_groups(request_timeout=30).result(30)
    view = lambda listing: sorted(  # noqa: E731
        (g.group_id, g.is_simple_consumer_group, g.state, g.type) for g in listing.valid
    )
    assert view(listed_p) == view(listed_d)
    assert group in {g.group_id for g in listed_p.valid}
    g_p = proxied.describe_consumer_groups([group], request_timeout=30)[group].result(30)
    g_d = direct.describe_consumer_groups([group], request_timeout=30)[group].result(30)
    assert _group_view(g_p) == _group_view(g_d)
    assert g_p.state == ConsumerGroupState.STABLE
    if side.name.startswith("kafka"):
        # Tansu describes a stable group without its members (and its leader's member id as the
        # protocol): the same directly, which is all that is required of the proxy
        assert [m.client_id for m in g_p.members] == ["live-member"]
    assert (g_p.coordinator.host, g_p.coordinator.port) == listeners[g_p.coordinator.id]
    assert (g_d.coordinator.host, g_d.coordinator.port) == side.real_address

    # delete, through the proxy
    proxied.delete_topics([topic_name], operation_timeout=30, request_timeout=30)[topic_name].result(30)
    _wait(lambda: topic_name not in direct.list_topics(timeout=10).topics, "the topic to disappear directly")
    assert topic_name not in proxied.list_topics(timeout=10).topics


def test_kafka_python_admin_same_as_direct(side: Side, live_group: tuple[str, str], topic_name: str) -> None:
    from kafka.admin import ConfigResource as KpConfigResource
    from kafka.admin import ConfigResourceType

    proxied, direct = clients.kafka_python_admin(side.proxied), clients.kafka_python_admin(side.direct)
    listeners = side.listeners()
    try:
        created = proxied.create_topics({topic_name: {"num_partitions": 2, "replication_factor": 1}})
        assert [(t["name"], t["error_code"]) for t in created["topics"]] == [(topic_name, 0)]
        _wait(lambda: topic_name in direct.list_topics(), "the new topic to be visible directly")

        assert sorted(proxied.list_topics()) == sorted(direct.list_topics())
        described_p, described_d = proxied.describe_topics([topic_name]), direct.describe_topics([topic_name])
        assert described_p == described_d
        assert len(described_p[0]["partitions"]) == 2

        # describe_cluster is a DescribeCluster request (on brokers that have it)
        cluster_p, cluster_d = proxied.describe_cluster(), direct.describe_cluster()
        assert {b["broker_id"]: (b["host"], b["port"]) for b in cluster_p["brokers"]} == listeners
        assert {(b["host"], b["port"]) for b in cluster_d["brokers"]} == {side.real_address}
        strip = lambda c: {**c, "brokers": sorted((b["broker_id"], b["rack"]) for b in c["brokers"])}  # noqa: E731
        assert strip(cluster_p) == strip(cluster_d)
        # the connections it holds go to the proxy
        assert {(b.host, b.port) for b in proxied._manager.cluster.brokers()} <= set(listeners.values())

        resource = [KpConfigResource(ConfigResourceType.TOPIC, topic_name)]
        for config_filter in ("modified", "all"):
            assert proxied.describe_configs(resource, config_filter=config_filter) == direct.describe_configs(
                resource, config_filter=config_filter
            )

        group, _ = live_group
        groups_p = sorted(proxied.list_groups(), key=lambda g: g["group_id"])
        assert groups_p == sorted(direct.list_groups(), key=lambda g: g["group_id"])
        assert group in {g["group_id"] for g in groups_p}
        # kafka-python 3.0.12 cannot read Tansu's authorized operations (ValueError: 15 is not a valid
        # ACLOperation), directly as well: the same outcome either way is what is asked of the proxy
        described = _outcome(proxied.describe_groups, [group])
        assert described == _outcome(direct.describe_groups, [group])
        if side.name.startswith("kafka"):
            assert described[0] == "ok" and described[1][group]["group_state"] == "Stable", described

        proxied.delete_topics([topic_name])
        _wait(lambda: topic_name not in direct.list_topics(), "the topic to disappear directly")
    finally:
        proxied.close()
        direct.close()


def test_client_metadata_brokers_are_proxy_listeners(side: Side) -> None:
    """What each client library keeps as the cluster's brokers is the proxy."""
    from kafka import KafkaConsumer

    listeners = side.listeners()
    md = _admin(side.proxied).list_topics(timeout=10)
    assert {n: (b.host, b.port) for n, b in md.brokers.items()} == listeners

    consumer = KafkaConsumer(bootstrap_servers=side.proxied)
    try:
        consumer.topics()  # a full Metadata round trip
        brokers = {b.node_id: (b.host, b.port) for b in consumer._client.cluster.brokers()}
    finally:
        consumer.close()
    assert brokers == listeners


# ------------------------------------------------------------------------------------------------
# raw requests through the proxy


def _find_coordinator(side: Side, version: int, keys: list[str]):
    """FindCoordinator for group ``keys`` at ``version`` through the proxy and directly, retried while
    a coordinator is not available yet (a fresh Kafka creates __consumer_offsets on first use)."""
    FindCoordinator = messages.message_class("FindCoordinatorRequest")
    if version >= 4:
        request = FindCoordinator(key_type=0, coordinator_keys=keys)
    else:
        (key,) = keys
        request = FindCoordinator(key=key, key_type=0)

    async def ask(address):
        conn = await _open(address)
        try:
            deadline = time.monotonic() + 30
            while True:
                resp = await conn.request(FIND_COORDINATOR, version, request)
                errors = [c.error_code for c in resp.coordinators] if version >= 4 else [resp.error_code]
                if COORDINATOR_NOT_AVAILABLE not in errors or time.monotonic() > deadline:
                    return resp
                await asyncio.sleep(0.2)
        finally:
            await conn.close()

    async def both():
        return await asyncio.gather(ask(side.proxied), ask(side.direct))

    return run(both())


def test_find_coordinator_batched_and_single(side: Side, live_group: tuple[str, str]) -> None:
    listeners = side.listeners()
    group, _ = live_group
    keys = [group, f"other-{uuid.uuid4().hex[:6]}", f"third-{uuid.uuid4().hex[:6]}"]
    lo, hi = _versions(side.proxied)[FIND_COORDINATOR]

    for version in range(max(lo, 4), hi + 1):  # batched coordinator keys
        proxied, direct = _find_coordinator(side, version, keys)
        assert [c.key for c in proxied.coordinators] == keys
        for c_p, c_d in zip(proxied.coordinators, direct.coordinators, strict=True):
            assert c_p.error_code == 0, c_p
            assert (c_p.key, c_p.node_id, c_p.error_code) == (c_d.key, c_d.node_id, c_d.error_code)
            assert (c_p.host, c_p.port) == listeners[c_p.node_id], f"v{version}: {c_p}"
            assert (c_d.host, c_d.port) == side.real_address
    assert hi >= 4

    for version in range(lo, min(hi, 3) + 1):  # one key, the address at the top level
        proxied, direct = _find_coordinator(side, version, [group])
        assert proxied.error_code == 0, proxied
        assert (proxied.error_code, proxied.node_id) == (direct.error_code, direct.node_id)
        assert (proxied.host, proxied.port) == listeners[proxied.node_id], f"v{version}: {proxied}"
        assert (direct.host, direct.port) == side.real_address


def _metadata_request(version: int, topic: str | None = None, topic_id: bytes = ZERO_UUID):
    Metadata = messages.message_class("MetadataRequest")
    if topic is None and not topic_id.strip(b"\0"):
        topics = None if version >= 1 else []  # v0: an empty list means all topics
    else:
        topics = [Metadata.MetadataRequestTopic(name=topic, topic_id=topic_id)]
    return Metadata(topics=topics, allow_auto_topic_creation=False)


def test_metadata_versions(side: Side, topic_name: str) -> None:
    side.broker.create_topic(topic_name, partitions=2)
    listeners = side.listeners()

    async def ask(address, version, request):
        conn = await _open(address)
        try:
            return await conn.request(METADATA, version, request)
        finally:
            await conn.close()

    async def both(version, request):
        return await asyncio.gather(ask(side.proxied, version, request), ask(side.direct, version, request))

    topic_ids = set()
    for version in (0, 1, 9, 12):
        for request in (_metadata_request(version), _metadata_request(version, topic_name)):
            proxied, direct = run(both(version, request))
            assert {b.node_id: (b.host, b.port) for b in proxied.brokers} == listeners, f"v{version}"
            assert {(b.host, b.port) for b in direct.brokers} == {side.real_address}
            assert [b.node_id for b in proxied.brokers] == [b.node_id for b in direct.brokers]
            # apart from the addresses, the same answer
            for b in proxied.brokers:
                b.host, b.port = side.unproxy(b.host, b.port)
            proxied.topics.sort(key=lambda t: t.name)
            direct.topics.sort(key=lambda t: t.name)
            ours = [t for t in proxied.topics if t.name == topic_name]
            assert len(ours) == 1 and len(ours[0].partitions) == 2, f"v{version}: {ours}"
            if version >= 10:
                assert ours[0].topic_id != ZERO_UUID, f"v{version}: no topic id"
                topic_ids.add(ours[0].topic_id)
                # an upstream without topic ids gets stable synthetic ones; otherwise ids pass unchanged
                for t_p, t_d in zip(proxied.topics, direct.topics, strict=True):
                    if t_d.topic_id != ZERO_UUID:
                        assert t_p.topic_id == t_d.topic_id
                    t_p.topic_id = t_d.topic_id
            assert proxied == direct, f"Metadata v{version}"
    assert len(topic_ids) == 1
    (topic_id,) = topic_ids
    registry = side.proxy.proxy.topics
    assert side.proxy.call(lambda: registry.by_name.get(topic_name)) == topic_id

    # v12 by topic id: whatever the broker answers directly, the proxy answers too
    proxied, direct = run(both(12, _metadata_request(12, None, topic_id)))
    for b in proxied.brokers:
        b.host, b.port = side.unproxy(b.host, b.port)
    assert proxied == direct


def test_describe_cluster_versions(side: Side) -> None:
    listeners = side.listeners()

    async def ask(address, version):
        conn = await _open(address)
        try:
            Request = messages.message_class("DescribeClusterRequest")
            return await conn.request(DESCRIBE_CLUSTER, version, Request())
        finally:
            await conn.close()

    lo, hi = _versions(side.proxied)[DESCRIBE_CLUSTER]
    for version in range(lo, hi + 1):
        proxied, direct = run(ask(side.proxied, version)), run(ask(side.direct, version))
        assert {b.broker_id: (b.host, b.port) for b in proxied.brokers} == listeners, f"v{version}"
        assert {(b.host, b.port) for b in direct.brokers} == {side.real_address}
        for b in proxied.brokers:
            b.host, b.port = side.unproxy(b.host, b.port)
        assert proxied == direct, f"DescribeCluster v{version}"


# ------------------------------------------------------------------------------------------------
# ApiVersions


def _expected_api_versions(side: Side, direct) -> list[tuple[int, int, int]]:
    served = side.proxy.call(side.proxy.proxy.served_versions)
    capped = {
        key: (messages.api(key).min_version, messages.api(key).max_version)
        for key in filters.RESPONSE_FILTERS
    }
    assert {PRODUCE, FETCH, METADATA, FIND_COORDINATOR, DESCRIBE_CLUSTER, API_VERSIONS} <= set(capped)
    out = []
    for e in direct.api_keys:
        if e.api_key in served:
            continue
        lo, hi = e.min_version, e.max_version
        if e.api_key in capped:
            lo, hi = max(lo, capped[e.api_key][0]), min(hi, capped[e.api_key][1])
            if lo > hi:
                continue
        out.append((e.api_key, lo, hi))
    out += [(key, lo, hi) for key, (lo, hi) in served.items()]
    return sorted(out)


def test_api_versions(side: Side) -> None:
    Request = messages.message_class("ApiVersionsRequest")

    async def ask(address, version):
        conn = await _open(address)
        try:
            return await conn.request(
                API_VERSIONS,
                version,
                Request(client_software_name="kshare-test", client_software_version="1.0"),
            )
        finally:
            await conn.close()

    top = min(messages.api(API_VERSIONS).max_version, _versions(side.direct)[API_VERSIONS][1])
    for version in sorted({0, 3, top}):
        proxied, direct = run(ask(side.proxied, version)), run(ask(side.direct, version))
        assert proxied.error_code == direct.error_code == 0
        got = [(e.api_key, e.min_version, e.max_version) for e in proxied.api_keys]
        assert got == _expected_api_versions(side, direct), f"ApiVersions v{version}"
        # everything else (features, throttle, ...) untouched
        proxied.api_keys = direct.api_keys
        assert proxied == direct


def test_api_versions_capped_at_codec_versions(kafka4) -> None:
    """Kafka 4.4 speaks Produce/Fetch versions newer than the codec's specs: through the proxy a
    client is offered only versions whose responses the proxy can decode and rewrite."""
    with ProxyThread(kafka4.bootstrap) as proxy:
        direct, proxied = _versions(kafka4.bootstrap), _versions(proxy.bootstrap)
        served = proxy.call(proxy.proxy.served_versions)
    capped = [
        key
        for key in filters.RESPONSE_FILTERS
        if key in direct and direct[key][1] > messages.api(key).max_version
    ]
    assert capped, f"Kafka {kafka4.version} speaks no version newer than the codec: nothing to check"
    for key in filters.RESPONSE_FILTERS:
        if key in direct and key not in served:
            spec = messages.api(key)
            expect = (max(direct[key][0], spec.min_version), min(direct[key][1], spec.max_version))
            assert proxied[key] == expect, (messages.api(key).name, direct[key], proxied[key])
    assert {k: v for k, v in proxied.items() if k not in filters.RESPONSE_FILTERS and k not in served} == {
        k: v for k, v in direct.items() if k not in filters.RESPONSE_FILTERS and k not in served
    }


def _raw_api_versions(address: tuple[str, int], version: int) -> bytes:
    """An ApiVersions request at ``version`` (v3+ body, header v2); the raw response frame."""
    client_id = b"kshare-test"
    body = b"\x0bkshare-test" + b"\x041.0" + b"\x00"  # compact strings, no tagged fields
    frame = struct.pack(">hhih", API_VERSIONS, version, 4242, len(client_id)) + client_id + b"\x00" + body
    with socket.create_connection(address, timeout=10) as s:
        s.sendall(struct.pack(">i", len(frame)) + frame)
        data = b""
        while len(data) < 4 or len(data) < 4 + struct.unpack_from(">i", data)[0]:
            chunk = s.recv(65536)
            assert chunk, f"connection closed after {len(data)} bytes"
            data += chunk
    return data


def _parse_api_versions_v0(data: bytes) -> tuple[int, int, list[tuple[int, int, int]]]:
    size, corr, error = struct.unpack_from(">iih", data)
    (count,) = struct.unpack_from(">i", data, 10)
    entries = [struct.unpack_from(">hhh", data, 14 + 6 * i) for i in range(count)]
    assert size == 4 + 2 + 4 + 6 * count == len(data) - 4, data
    return corr, error, entries


@pytest.mark.parametrize("version", [5, 99])
def test_api_versions_newer_than_known(side: Side, version: int) -> None:
    """A client newer than the proxy gets UNSUPPORTED_VERSION in v0 form with ApiVersions' range."""
    a = messages.api(API_VERSIONS)
    assert version > a.max_version
    proxied = _raw_api_versions(_hostport(side.proxied), version)
    assert _parse_api_versions_v0(proxied) == (
        4242,
        UNSUPPORTED_VERSION,
        [(API_VERSIONS, a.min_version, a.max_version)],
    )
    if side.name.startswith("kafka"):  # exactly what Apache Kafka itself answers
        assert proxied == _raw_api_versions(side.real_address, version)
    # the connection stays usable, as with Kafka: the client retries with a version from the range
    assert _versions(side.proxied)


# ------------------------------------------------------------------------------------------------
# NodeEndpoints: the new leader's address in NOT_LEADER_OR_FOLLOWER answers


def _fetch_downgraded(api: str, version: int) -> bool:
    """Whether the proxy forwards this request as an older version: Fetch v16+ (as
    filters.FETCH_SERVED_AS) and non-transactional Produce v10+ (as filters.PRODUCE_SERVED_AS)."""
    if api == "fetch":
        return version > filters.FETCH_SERVED_AS
    return api == "produce" and version > filters.PRODUCE_SERVED_AS


def _one_record_batch() -> bytes:
    from kafka.record.memory_records import MemoryRecordsBuilder

    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 16)
    builder.append(int(time.time() * 1000), b"k", b"v", [])
    builder.close()
    return bytes(builder.buffer())


@pytest.mark.kafka
@pytest.mark.timeout(240)
def test_node_endpoints_point_at_proxy() -> None:
    """Slow (~25 s: a 2-broker Kafka 3.9 cluster). Partition 0 lives on node 1 only; Produce v10/v11
    and Fetch v16/v17 sent to node 2 get NOT_LEADER_OR_FOLLOWER with node 1's endpoint (KIP-951).
    Through the proxy that endpoint must be the proxy's listener for node 1 -- or absent, for the
    Fetch versions the proxy forwards as v15 -- and never the broker's real address."""
    topic = f"node-endpoints-{uuid.uuid4().hex[:8]}"
    Produce = messages.message_class("ProduceRequest")
    Fetch = messages.message_class("FetchRequest")

    with KafkaCluster() as cluster, ProxyThread(cluster.controller.bootstrap) as proxy:
        cluster.create_topic(topic, [[1]])
        ports = proxy.call(lambda: dict(proxy.proxy.brokers.ports))
        assert set(ports) == {1, 2}
        host = proxy.config.advertised
        node1_proxy, node1_real = (host, ports[1]), (cluster.controller.host, cluster.controller.port)

        async def exchange(node2: tuple[str, int]) -> dict:
            conn = await _open(node2)
            try:
                md = await conn.request(METADATA, 12, _metadata_request(12, topic))
                topic_id = md.topics[0].topic_id
                assert md.topics[0].partitions[0].leader_id == 1
                out = {}
                for version in (10, 11):
                    if version > conn.versions[PRODUCE][1]:
                        continue
                    for txn in (None, "node-endpoints-txn"):
                        partition = Produce.PartitionProduceData(index=0, records=_one_record_batch())
                        request = Produce(
                            transactional_id=txn,
                            acks=-1,
                            timeout_ms=5000,
                            topic_data=[Produce.TopicProduceData(name=topic, partition_data=[partition])],
                        )
                        api = "produce" if txn is None else "produce-txn"
                        out[(api, version)] = await conn.request(PRODUCE, version, request)
                for version in (16, 17):
                    if version > conn.versions[FETCH][1]:
                        continue
                    partition = Fetch.FetchPartition(
                        partition=0,
                        current_leader_epoch=-1,
                        fetch_offset=0,
                        last_fetched_epoch=-1,
                        log_start_offset=-1,
                        partition_max_bytes=1 << 20,
                    )
                    request = Fetch(
                        max_wait_ms=100,
                        min_bytes=1,
                        max_bytes=1 << 20,
                        isolation_level=0,
                        session_id=0,
                        session_epoch=-1,
                        topics=[Fetch.FetchTopic(topic_id=topic_id, partitions=[partition])],
                        forgotten_topics_data=[],
                        rack_id="",
                    )
                    out[("fetch", version)] = await conn.request(FETCH, version, request)
                return out
            finally:
                await conn.close()

        def partition(api: str, resp):
            return (
                resp.responses[0].partition_responses if api.startswith("produce") else resp.responses[0].partitions
            )[0]

        def settled(answers: dict) -> bool:
            # right after the topic's creation node 2 may not name the leader yet (-1, no endpoints)
            return all(
                partition(api, r).current_leader.leader_id == 1
                for (api, version), r in answers.items()
                if not _fetch_downgraded(api, version)
            )

        deadline = time.monotonic() + 30
        while True:
            proxied = run(exchange((host, ports[2])))
            direct = run(exchange((cluster.broker.host, cluster.broker.port)))
            if (settled(proxied) and settled(direct)) or time.monotonic() > deadline:
                break
            time.sleep(0.5)

    assert set(proxied) == {("produce", 10), ("produce", 11), ("produce-txn", 10), ("produce-txn", 11),
                            ("fetch", 16), ("fetch", 17)}
    for (api, version), resp in proxied.items():
        p = partition(api, resp)
        endpoints = [(n.node_id, n.host, n.port) for n in resp.node_endpoints]
        assert p.error_code == NOT_LEADER_OR_FOLLOWER, (api, version, p)
        if _fetch_downgraded(api, version):
            # The proxy forwards Fetch v16+ as v15 and non-transactional Produce v10+ as v9
            # (filters.FETCH_SERVED_AS, PRODUCE_SERVED_AS), and Kafka fills neither CurrentLeader
            # nor NodeEndpoints below those (KIP-951): the client finds the new leader with a
            # Metadata refresh, and no broker address reaches it.
            assert (p.current_leader.leader_id, endpoints) == (-1, []), (api, version, p, endpoints)
        else:
            assert p.current_leader.leader_id == 1, (api, version, p)
            assert endpoints == [(1, *node1_proxy)], (api, version, endpoints)
        # directly, node 2 names node 1 at its real address
        d = direct[(api, version)]
        assert partition(api, d).current_leader.leader_id == 1
        assert [(n.node_id, n.host, n.port) for n in d.node_endpoints] == [(1, *node1_real)]
