"""The virtual cluster an instance group shows clients (sans-I/O): Metadata, DescribeCluster and
FindCoordinator answers rewritten from an ownership map, checked against the map itself.

Every answer is encoded and decoded again at its version, so what is checked is what a client reads.
"""

from __future__ import annotations

import asyncio
import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kshare.protocol import messages
from kshare.proxy import rewrite
from kshare.proxy.server import TopicRegistry
from kshare.proxy.virtual import ClusterView, Peer, split_node, virtual_node
from kshare.share.ownership import Candidate, GroupOwnership, Instance, assign
from kshare.share.state.codec import partition_for_group, state_partition_of

Metadata = messages.message_class("MetadataResponse")
FindCoordinator = messages.message_class("FindCoordinatorResponse")
FindCoordinatorRequest = messages.message_class("FindCoordinatorRequest")
DescribeCluster = messages.message_class("DescribeClusterResponse")


class _Brokers:
    """The proxy's broker map as the rewriters use it: this proxy's listener for broker b is 9300 + b."""

    async def expose(self, node_id: int, host: str, port: int) -> tuple[str, int]:
        return "me.example", 9300 + node_id

    async def forget_missing(self, live: set[int]) -> None:
        pass


class _Proxy:
    def __init__(self, view: ClusterView | None) -> None:
        self.view = view
        self.brokers = _Brokers()
        self.topics = TopicRegistry()
        self.topic_change_listeners: list = []


def roundtrip(api_key: int, version: int, body):
    frame = messages.encode_response(api_key, version, 7, body)
    return messages.decode_response(api_key, version, memoryview(frame)[4:])


def ownership_of(proxies: int, state_partitions: int, me: int) -> GroupOwnership:
    cands = {f"m{i}": Candidate(Instance(f"p{i}", f"p{i}.example", 9192, {b: 9400 + 10 * i + b for b in range(3)}))
             for i in range(proxies)}
    decision = assign(cands, state_partitions)
    ownership = GroupOwnership(f"p{me}", state_partitions)
    ownership.map = decision
    ownership.claimed = frozenset(decision.partitions_of(f"p{me}"))
    return ownership


def metadata(brokers: list[int], topics: dict[str, tuple[bytes, int]], version: int):
    parts = lambda n: [Metadata.MetadataResponsePartition(  # noqa: E731
        partition_index=p, leader_id=brokers[p % len(brokers)], leader_epoch=0,
        replica_nodes=[brokers[(p + k) % len(brokers)] for k in range(min(2, len(brokers)))],
        isr_nodes=[brokers[p % len(brokers)]], offline_replicas=[]) for p in range(n)]
    return Metadata(
        brokers=[Metadata.MetadataResponseBroker(node_id=b, host="kafka", port=9092, rack=None) for b in brokers],
        controller_id=brokers[0], cluster_id="c",
        topics=[Metadata.MetadataResponseTopic(error_code=0, name=name, topic_id=tid, partitions=parts(n))
                for name, (tid, n) in topics.items()])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(proxies=st.integers(1, 4), state_partitions=st.integers(1, 12), brokers=st.integers(1, 3),
       me=st.integers(0, 3), version=st.sampled_from([10, 12, 13]), partitions=st.integers(1, 16))
def test_metadata_names_each_partitions_owner(proxies, state_partitions, brokers, me, version, partitions) -> None:
    me %= proxies
    ownership = ownership_of(proxies, state_partitions, me)
    view = ownership.view()
    assert view is not None
    tid = uuid.uuid4().bytes
    body = metadata(list(range(brokers)), {"t": (tid, partitions)}, version)
    asyncio.run(rewrite.rewrite_metadata(_Proxy(view), body, version))
    body = roundtrip(3, version, body)

    nodes = {b.node_id: (b.host, b.port) for b in body.brokers}
    # every proxy's listener for every broker, each once
    assert len(nodes) == len(body.brokers) == proxies * brokers
    for inst in ownership.map.instances:
        for b in range(brokers):
            assert nodes[virtual_node(inst.slot, b)] == (inst.host, inst.broker_ports[b])
    assert split_node(body.controller_id) == (view.me, 0)
    for p in body.topics[0].partitions:
        owner = ownership.map.owner(state_partition_of(tid, p.partition_index, state_partitions))
        slot, broker = split_node(p.leader_id)
        assert slot == owner.slot and broker == p.partition_index % brokers
        assert p.leader_id in nodes
        assert all(split_node(r)[0] == slot and r in nodes for r in (*p.replica_nodes, *p.isr_nodes))


def test_metadata_is_untouched_without_a_view() -> None:
    tid = uuid.uuid4().bytes
    body = metadata([1, 2], {"t": (tid, 4)}, 12)
    asyncio.run(rewrite.rewrite_metadata(_Proxy(None), body, 12))
    assert [(b.node_id, b.host, b.port) for b in body.brokers] == [(1, "me.example", 9301), (2, "me.example", 9302)]
    assert [p.leader_id for p in body.topics[0].partitions] == [1, 2, 1, 2]


def test_metadata_tells_the_partition_counts_it_shows() -> None:
    # what the share layer reads to look up at once a topic grown elsewhere (TopicWatch)
    proxy = _Proxy(None)
    told: list[dict[str, int]] = []
    proxy.topic_change_listeners.append(told.append)
    body = metadata([1, 2], {"t": (uuid.uuid4().bytes, 4), "u": (uuid.uuid4().bytes, 1)}, 12)
    asyncio.run(rewrite.rewrite_metadata(proxy, body, 12))
    assert told == [{"t": 4, "u": 1}]


def test_a_peer_without_a_listener_for_a_broker_leaves_the_partition_here() -> None:
    # peer slot 1 does not serve broker 5 (it joined before broker 5 appeared, ports chosen by the OS)
    view = ClusterView(me=0, peers={0: Peer(0, "a", {5: 9305}), 1: Peer(1, "b", {})},
                       partition_owner=lambda t, p: 1)
    body = metadata([5], {"t": (uuid.uuid4().bytes, 2)}, 12)
    asyncio.run(rewrite.rewrite_metadata(_Proxy(view), body, 12))
    assert [b.node_id for b in body.brokers] == [5]
    assert {p.leader_id for p in body.topics[0].partitions} == {5}
    # with a port base the peer serves brokers it never reported
    view = ClusterView(me=0, peers={0: Peer(0, "a", {5: 9305}), 1: Peer(1, "b", {}, 9500)},
                       partition_owner=lambda t, p: 1)
    body = metadata([5], {"t": (uuid.uuid4().bytes, 2)}, 12)
    asyncio.run(rewrite.rewrite_metadata(_Proxy(view), body, 12))
    assert {(b.node_id, b.host, b.port) for b in body.brokers} == {(5, "a", 9305), (virtual_node(1, 5), "b", 9505)}
    assert {p.leader_id for p in body.topics[0].partitions} == {virtual_node(1, 5)}


@given(group=st.text(min_size=1, max_size=20), me=st.integers(0, 2), version=st.sampled_from([0, 3, 4, 6]))
@settings(max_examples=40, deadline=None)
def test_find_coordinator_names_the_groups_owner(group, me, version) -> None:
    ownership = ownership_of(3, 6, me)
    view = ownership.view()
    owner = ownership.map.owner(partition_for_group(group, 6))
    if version < 4:
        body = FindCoordinator(error_code=0, node_id=2, host="kafka", port=9092)
        request = FindCoordinatorRequest(key=group, key_type=0)
    else:
        body = FindCoordinator(coordinators=[FindCoordinator.Coordinator(key=group, node_id=2, host="kafka", port=9092,
                                                                         error_code=0)])
        request = FindCoordinatorRequest(key_type=0, coordinator_keys=[group])
    asyncio.run(rewrite.rewrite_find_coordinator(_Proxy(view), body, version, request))
    body = roundtrip(10, version, body)
    c = body if version < 4 else body.coordinators[0]
    assert (c.node_id, c.host, c.port) == (virtual_node(owner.slot, 2), owner.host, owner.broker_ports[2])


def test_transaction_coordinators_stay_on_this_proxy() -> None:
    ownership = ownership_of(3, 6, 1)
    view = ownership.view()
    body = FindCoordinator(coordinators=[FindCoordinator.Coordinator(key="tx", node_id=0, host="k", port=1, error_code=0)])
    asyncio.run(rewrite.rewrite_find_coordinator(_Proxy(view), body, 4, FindCoordinatorRequest(key_type=1,
                                                                                               coordinator_keys=["tx"])))
    assert split_node(body.coordinators[0].node_id) == (view.me, 0)


def test_describe_cluster_lists_every_proxy() -> None:
    ownership = ownership_of(3, 6, 0)
    body = DescribeCluster(error_code=0, cluster_id="c", controller_id=1, brokers=[
        DescribeCluster.DescribeClusterBroker(broker_id=b, host="kafka", port=9092, rack=None) for b in (0, 1)])
    asyncio.run(rewrite.rewrite_describe_cluster(_Proxy(ownership.view()), body, 1))
    body = roundtrip(60, 1, body)
    assert sorted(split_node(b.broker_id) for b in body.brokers) == [(s, b) for s in range(3) for b in (0, 1)]


def test_ownership_serves_what_is_claimed_not_what_the_map_says() -> None:
    ownership = ownership_of(2, 4, 0)
    mine = ownership.map.partitions_of("p0")
    ownership.claimed = frozenset()  # the map is known, the state not replayed yet
    tid = uuid.uuid4().bytes
    assert not ownership.owns_partition(tid, 0)
    ownership.claimed = frozenset(mine)
    for p in range(32):
        assert ownership.owns_partition(tid, p) == (state_partition_of(tid, p, 4) in mine)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(proxies=st.integers(2, 4), state_partitions=st.integers(1, 12), brokers=st.integers(1, 3),
       me=st.integers(0, 3), version=st.sampled_from([10, 12, 13]), partitions=st.integers(1, 16),
       group=st.text(min_size=1, max_size=12))
def test_a_leaving_proxy_names_the_others_owners(proxies, state_partitions, brokers, me, version, partitions,
                                                group) -> None:
    """A proxy leaving on SIGTERM (kshare.share.leaving) serves nothing any more and, once it read
    the map the others split ownership by without it, names their owners in its answers, with its
    own listeners still listed (its clients' connections stay open until they moved)."""
    me %= proxies
    ownership = ownership_of(proxies, state_partitions, me)
    mine = ownership.map.instance(f"p{me}")
    others = {f"m{i}": Candidate(inst) for i, inst in enumerate(ownership.map.instances) if inst.id != f"p{me}"}
    successors = assign(others, state_partitions)
    tid = uuid.uuid4().bytes

    ownership.leave()
    assert not any(ownership.owns_partition(tid, p) for p in range(partitions))
    assert not ownership.owns_group(group)
    before = ownership.view()  # the others' map not known yet: still the map it had
    assert before is not None and before.me == mine.slot

    ownership.successors = successors
    view = ownership.view()
    assert view is not None and view.me == mine.slot
    body = metadata(list(range(brokers)), {"t": (tid, partitions)}, version)
    asyncio.run(rewrite.rewrite_metadata(_Proxy(view), body, version))
    body = roundtrip(3, version, body)
    nodes = {b.node_id: (b.host, b.port) for b in body.brokers}
    for inst in [*successors.instances, mine]:
        for b in range(brokers):
            assert nodes[virtual_node(inst.slot, b)] == (inst.host, inst.broker_ports[b])
    for p in body.topics[0].partitions:
        owner = successors.owner_of_topic_partition(tid, p.partition_index)
        assert owner is not None and owner.id != f"p{me}"
        assert split_node(p.leader_id) == (owner.slot, p.partition_index % brokers)

    answer = FindCoordinator(throttle_time_ms=0, error_code=0, error_message=None, node_id=0, host="kafka", port=9092)
    asyncio.run(rewrite.rewrite_find_coordinator(_Proxy(view), answer, 3, FindCoordinatorRequest(key=group, key_type=0)))
    assert split_node(answer.node_id)[0] == successors.owner_of_group(group).slot
