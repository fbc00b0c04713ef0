"""Response rewriters: every broker address a client can learn is replaced by the proxy's own.

Each rewriter takes the decoded response body, its version and the proxy, mutates the body in
place and may be a coroutine (a new broker needs a listener before a client learns its address).
"""

from __future__ import annotations

import hashlib
import logging
from typing import TYPE_CHECKING, Any

from .virtual import ClusterView, virtual_node

if TYPE_CHECKING:
    from .server import Proxy

log = logging.getLogger("kshare.proxy")

ZERO_UUID = bytes(16)


def synthetic_topic_id(topic: str) -> bytes:
    """A stable topic id for clusters older than Kafka 2.8, which have none.

    Share RPCs address topics by id, so an upstream without ids gets one derived from the name
    (a version-5 style UUID: SHA-1 of a fixed namespace and the name), the same in every proxy.
    """
    digest = bytearray(hashlib.sha1(b"kshare-topic-id:" + topic.encode()).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50
    digest[8] = (digest[8] & 0x3F) | 0x80
    return bytes(digest)


async def rewrite_metadata(proxy: Proxy, body: Any, version: int) -> None:
    real = [(b.node_id, b.host, b.port) for b in body.brokers]
    for broker in body.brokers:
        broker.host, broker.port = await proxy.brokers.expose(broker.node_id, broker.host, broker.port)
    if body.brokers:  # an error answer (e.g. to a malformed request) lists none: not a cluster change
        await proxy.brokers.forget_missing({node for node, _, _ in real})
    if version >= 10:
        for topic in body.topics:
            if topic.topic_id == ZERO_UUID and topic.name and topic.error_code == 0:
                topic.topic_id = synthetic_topic_id(topic.name)
            if topic.name and topic.topic_id != ZERO_UUID:
                proxy.topics.learn(topic.name, topic.topic_id)
    if proxy.topic_change_listeners:
        # The partition counts the cluster has now: a client's Metadata can be the first to show
        # partitions added (or a topic created) elsewhere, before the share layer's next refresh.
        counts = {t.name: len(t.partitions) for t in body.topics if t.error_code == 0 and t.name}
        if counts:
            for listener in proxy.topic_change_listeners:
                listener(counts)
    view = proxy.view
    if view is not None:
        _virtualize_metadata(proxy, view, body, version)


def note_deleted_topics(proxy: Proxy, body: Any, version: int) -> None:
    """DeleteTopics goes through unchanged; the topics it deleted are told to
    ``proxy.topic_deletion_listeners`` as (name, topic id) pairs (either may be None), so the share
    layer stops serving them at once, as a broker does, instead of at its next metadata refresh."""
    deleted = [(r.name, r.topic_id if version >= 6 and r.topic_id != ZERO_UUID else None)
               for r in body.responses if r.error_code == 0]
    if deleted:
        for listener in proxy.topic_deletion_listeners:
            listener(deleted)


def note_created_topics(proxy: Proxy, body: Any, version: int) -> None:
    """CreateTopics goes through unchanged; the topics it created are told to
    ``proxy.topic_change_listeners`` with their partition counts (-1 where the answer, before v5,
    does not say), so share groups subscribed to them get their partitions at once."""
    created = {t.name: (t.num_partitions if version >= 5 else -1) for t in body.topics if t.error_code == 0}
    _tell_topic_change(proxy, created)


def note_created_partitions(proxy: Proxy, body: Any, version: int) -> None:
    """CreatePartitions goes through unchanged; the topics it grew are told to
    ``proxy.topic_change_listeners`` (count -1: more partitions than known, the answer does not
    say how many), so their new share-partitions start at once, not at the next refresh."""
    _tell_topic_change(proxy, {r.name: -1 for r in body.results if r.error_code == 0})


def _tell_topic_change(proxy: Proxy, counts: dict[str, int]) -> None:
    if counts:
        for listener in proxy.topic_change_listeners:
            listener(counts)


def _every_listener(view: ClusterView, brokers: Any, broker_ids: Any) -> list[tuple[Any, int, str, int]]:
    """(broker entry, node id, host, port) of every proxy's listener for every upstream broker."""
    out = []
    for b, broker_id in zip(brokers, broker_ids, strict=True):
        for slot in sorted(view.peers):
            endpoint = view.endpoint(slot, broker_id)
            if endpoint is not None:
                out.append((b, *endpoint))
    return out


def _virtualize_metadata(proxy: Proxy, view: ClusterView, body: Any, version: int) -> None:
    """One virtual cluster: every proxy's listener for every broker is a node, and a partition's
    leader (with its replicas) is named through the listeners of the proxy that owns it."""
    body.brokers = [type(b)(node_id=node, host=host, port=port, rack=b.rack)
                    for b, node, host, port in _every_listener(view, body.brokers, [x.node_id for x in body.brokers])]
    if version >= 1 and body.controller_id >= 0:
        body.controller_id = virtual_node(view.me, body.controller_id)
    for topic in body.topics:
        topic_id = topic.topic_id if version >= 10 and topic.topic_id != ZERO_UUID else proxy.topics.by_name.get(topic.name)
        for p in topic.partitions:
            owner = view.partition_owner(topic_id, p.partition_index) if topic_id is not None else None
            slot = view.slot_for(owner, p.leader_id) if p.leader_id >= 0 else view.me
            if p.leader_id >= 0:
                p.leader_id = virtual_node(slot, p.leader_id)
            p.replica_nodes = [virtual_node(slot, r) for r in p.replica_nodes]
            p.isr_nodes = [virtual_node(slot, r) for r in p.isr_nodes]
            if version >= 5:
                p.offline_replicas = [virtual_node(slot, r) for r in p.offline_replicas]


GROUP_KEY = 0  # FindCoordinator key type of (consumer, classic and share) groups


async def _coordinator(proxy: Proxy, key: str, key_type: int, node_id: int, host: str, port: int) -> tuple[int, str, int]:
    host, port = await proxy.brokers.expose(node_id, host, port)
    view = proxy.view
    if view is None:
        return node_id, host, port
    # a group is coordinated through the listeners of the proxy owning its key (share groups are
    # served there; other groups are forwarded from there to their real coordinator)
    owner = view.group_owner(key) if key_type == GROUP_KEY else None
    endpoint = view.endpoint(view.slot_for(owner, node_id), node_id)
    return endpoint if endpoint is not None else (node_id, host, port)


async def rewrite_find_coordinator(proxy: Proxy, body: Any, version: int, request: Any = None) -> None:
    """``request``: the decoded request, read in an instance group (whose answer depends on the key)."""
    key_type = request.key_type if request is not None and version >= 1 else GROUP_KEY
    if version < 4:
        if body.error_code == 0:
            key = request.key if request is not None else ""
            body.node_id, body.host, body.port = await _coordinator(proxy, key, key_type, body.node_id, body.host,
                                                                    body.port)
        return
    for coordinator in body.coordinators:
        if coordinator.error_code == 0:
            coordinator.node_id, coordinator.host, coordinator.port = await _coordinator(
                proxy, coordinator.key, key_type, coordinator.node_id, coordinator.host, coordinator.port)


async def rewrite_describe_cluster(proxy: Proxy, body: Any, version: int) -> None:
    for broker in body.brokers:  # DescribeClusterBroker names its id BrokerId, not NodeId
        broker.host, broker.port = await proxy.brokers.expose(broker.broker_id, broker.host, broker.port)
    view = proxy.view
    if view is None:
        return
    body.brokers = [type(b)(broker_id=node, host=host, port=port, rack=b.rack)
                    for b, node, host, port in _every_listener(view, body.brokers, [x.broker_id for x in body.brokers])]
    if body.controller_id >= 0:
        body.controller_id = virtual_node(view.me, body.controller_id)


async def rewrite_node_endpoints(proxy: Proxy, body: Any, version: int) -> None:
    """Produce v10+ and Fetch v16+ name the new leader's endpoint on NOT_LEADER_OR_FOLLOWER.

    In an instance group the endpoints (and the leader ids beside them) would name real brokers,
    which are not nodes of the virtual cluster: they are dropped, and the client asks Metadata.
    """
    if proxy.view is not None:
        body.node_endpoints = []
        return
    for node in body.node_endpoints:
        node.host, node.port = await proxy.brokers.expose(node.node_id, node.host, node.port)


def needs_node_endpoint_rewrite(body: Any) -> bool:
    return bool(body.node_endpoints)


def rewrite_api_versions(proxy: Proxy, body: Any, version: int) -> None:
    """Advertise what a client can use through the proxy.

    Forwarded APIs keep the broker's ranges; APIs whose responses the proxy decodes are capped at
    the versions its specs know; APIs the proxy serves itself are replaced by (or added with) the
    proxy's own ranges.
    """
    if body.error_code != 0:
        return
    caps = proxy.version_caps
    served = proxy.served_versions()
    keys = []
    for entry in body.api_keys:
        if entry.api_key in served:
            continue
        cap = caps.get(entry.api_key)
        if cap is not None:
            lo, hi = max(entry.min_version, cap[0]), min(entry.max_version, cap[1])
            if lo > hi:
                continue
            entry.min_version, entry.max_version = lo, hi
        keys.append(entry)
    if served:
        entry_cls = type(body).ApiVersion
        for key, (lo, hi) in served.items():
            keys.append(entry_cls(api_key=key, min_version=lo, max_version=hi))
    keys.sort(key=lambda e: e.api_key)
    body.api_keys = keys
