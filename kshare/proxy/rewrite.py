"""Response rewriters: every broker address a client can learn is replaced by the proxy's own.

Each rewriter takes the decoded response body, its version and the proxy, mutates the body in
place and may be a coroutine (a new broker needs a listener before a client learns its address).
"""

from __future__ import annotations

import hashlib
import logging
from typing import TYPE_CHECKING, Any

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
    for broker in body.brokers:
        broker.host, broker.port = await proxy.brokers.expose(broker.node_id, broker.host, broker.port)
    if body.brokers:  # an error answer (e.g. to a malformed request) lists none: not a cluster change
        await proxy.brokers.forget_missing({b.node_id for b in body.brokers})
    if version >= 10:
        for topic in body.topics:
            if topic.topic_id == ZERO_UUID and topic.name and topic.error_code == 0:
                topic.topic_id = synthetic_topic_id(topic.name)
            if topic.name and topic.topic_id != ZERO_UUID:
                proxy.topics.learn(topic.name, topic.topic_id)


async def rewrite_find_coordinator(proxy: Proxy, body: Any, version: int) -> None:
    if version < 4:
        if body.error_code == 0:
            body.host, body.port = await proxy.brokers.expose(body.node_id, body.host, body.port)
        return
    for coordinator in body.coordinators:
        if coordinator.error_code == 0:
            coordinator.host, coordinator.port = await proxy.brokers.expose(
                coordinator.node_id, coordinator.host, coordinator.port
            )


async def rewrite_describe_cluster(proxy: Proxy, body: Any, version: int) -> None:
    for broker in body.brokers:  # DescribeClusterBroker names its id BrokerId, not NodeId
        broker.host, broker.port = await proxy.brokers.expose(broker.broker_id, broker.host, broker.port)


async def rewrite_node_endpoints(proxy: Proxy, body: Any, version: int) -> None:
    """Produce v10+ and Fetch v16+ name the new leader's endpoint on NOT_LEADER_OR_FOLLOWER."""
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
