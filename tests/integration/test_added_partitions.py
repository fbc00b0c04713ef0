"""Partitions added to a topic a share group reads: their records reach the group, from their first.

A partition added after the group started reading its topic starts at its beginning whatever the
group's ``share.auto.offset.reset`` (``ShareGroupService._initial_offset``, as Kafka initialises
new partitions at offset 0): the group is set to ``latest`` here and the records are written to
the new partitions before kshare can know of them (it learns new partitions at its next metadata
refresh, the consumer at its next heartbeat), so a new share-partition started at the end would
skip them all.

The producer waits until its own metadata shows the new partitions before it writes. A Kafka
cluster answers CreatePartitions once its controller has committed them; each broker learns of
them a little later, and a librdkafka producer asked to write to a partition beyond the count its
metadata shows fails those records at once (``_UNKNOWN_PARTITION``). On three nodes a producer made
right after CreatePartitions met such a broker in most runs (through kshare 5 of 5, directly 2 of
5): a test that did not look at the delivery reports then waited 90 s for records that were never
written, and read as kshare never reading the new partitions (their high watermark stayed 0).

On the session's single Kafka 3.9 broker, and on the session's three KRaft nodes (``cluster3``)
with replication factor 3, where the new partitions' leaders are spread over the brokers.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewPartitions

from kshare.bench.brokers import KafkaBroker, create_topic
from tests.harness.cluster import ThreeNodeCluster
from tests.harness.share import (
    ConsumerLoop,
    ShareProxyThread,
    quiet_logger,
    share_group,
    stop_all,
    wait_until,
)

log = logging.getLogger("kshare.tests.added_partitions")

BEFORE, AFTER = 2, 4  # partitions before and after CreatePartitions
# From CreatePartitions to the last record: kshare looking the topic up (at once), the consumer's
# next heartbeat (5 s apart by default) and a metadata round trip.
DELIVERY_S = 30.0
# From CreatePartitions through the proxy to kshare knowing the new partitions: a metadata round
# trip or a few (a broker of three may learn of them a little after the controller). Measured
# 0.01-0.3 s; before kshare read the answer, its next refresh came up to 5 s later.
KNOWN_S = 1.5


def _initialised(proxy: ShareProxyThread, group: str, topic: str) -> int:
    """How many of the group's share-partitions of ``topic`` kshare has initialised."""

    def count() -> int:
        svc = proxy.service
        info = svc.upstream.topics.get(topic)
        if info is None:
            return 0
        return sum(1 for key, sp in svc.partitions.items()
                   if key.group_id == group and key.topic_id == info.topic_id and sp.engine is not None)

    return proxy.call(count)


def _known_partitions(proxy: ShareProxyThread, topic: str) -> int:
    def count() -> int:
        info = proxy.service.upstream.topics.get(topic)
        return info.partitions if info is not None else 0

    return proxy.call(count)


def _produce(bootstrap: str, topic: str, values: list[bytes], partitions: list[int]) -> None:
    """``values`` round-robin over ``partitions``, once the producer's metadata shows all of them;
    every delivery report checked."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": "all", "logger": quiet_logger()})
    wait_until(lambda: len(p.list_topics(topic, timeout=10).topics[topic].partitions) > max(partitions), 30,
               f"the producer's metadata to show partition {max(partitions)} of {topic}")
    failed: list[str] = []

    def report(err, _msg) -> None:
        if err is not None:
            failed.append(str(err))

    for i, v in enumerate(values):
        p.produce(topic, value=v, partition=partitions[i % len(partitions)], on_delivery=report)
    assert p.flush(30) == 0
    assert not failed, failed[:3]


def _added_partitions_are_read(proxy: ShareProxyThread, topic: str, group: str, cluster: str | None = None) -> None:
    """``cluster``: add the partitions straight on the cluster (not through kshare); kshare then
    learns of them from the next Metadata answer a client gets through it."""
    share_group(proxy.bootstrap, group, share_auto_offset_reset="latest")
    loop = ConsumerLoop("c", proxy.bootstrap, group, topic).start()
    try:
        # latest: only what is written once the group's share-partitions exist is read
        wait_until(lambda: _initialised(proxy, group, topic) == BEFORE, 30, "the first share-partitions")
        first = [b"first-%03d" % i for i in range(20)]
        _produce(proxy.bootstrap, topic, first, list(range(BEFORE)))
        wait_until(lambda: set(first) <= set(loop.values()), 30, "the records of the first partitions")

        # through kshare, as an operator would (kafka-topics --alter), or straight on the cluster
        admin = AdminClient({"bootstrap.servers": cluster or proxy.bootstrap, "logger": quiet_logger()})
        admin.create_partitions([NewPartitions(topic, AFTER)])[topic].result(30)
        t0 = time.monotonic()
        if cluster is not None:
            # a client's Metadata through kshare is the first to show them (a producer's would)
            client = AdminClient({"bootstrap.servers": proxy.bootstrap, "logger": quiet_logger()})
            wait_until(lambda: len(client.list_topics(topic, timeout=10).topics[topic].partitions) == AFTER, 30,
                       "the cluster's metadata to show the added partitions")
            t0 = time.monotonic()
        # The CreatePartitions or Metadata answer on its way back through the proxy tells the share
        # layer, which looks the topic up at once (TopicWatch) instead of at its next refresh (5 s apart).
        wait_until(lambda: _known_partitions(proxy, topic) == AFTER, KNOWN_S,
                   "kshare to know the added partitions after an answer through it showed them")
        log.info("kshare knew the added partitions %.2f s after an answer through it showed them",
                 time.monotonic() - t0)
        added = [b"added-%03d" % i for i in range(100)]
        _produce(proxy.bootstrap, topic, added, list(range(BEFORE, AFTER)))
        wait_until(lambda: set(added) <= set(loop.values()), DELIVERY_S, "the records of the added partitions")
        log.info("records of the added partitions delivered %.1f s after CreatePartitions", time.monotonic() - t0)
    finally:
        stop_all([loop])
    counts = Counter(loop.values())
    assert all(counts[v] == 1 for v in first + added), [v for v in first + added if counts[v] != 1][:5]
    assert {g.partition for g in loop.received if g.value in set(added)} == set(range(BEFORE, AFTER))


@pytest.mark.parametrize("added", ["through kshare", "on the cluster"])
def test_added_partitions_are_read_from_their_beginning(kafka39: KafkaBroker, kshare39: ShareProxyThread,
                                                        topic_name: str, added: str) -> None:
    kafka39.create_topic(topic_name, BEFORE)
    _added_partitions_are_read(kshare39, topic_name, f"added-{uuid.uuid4().hex[:8]}",
                               kafka39.bootstrap if added == "on the cluster" else None)


@pytest.mark.timeout(300)
def test_added_partitions_are_read_on_three_nodes(cluster3: ThreeNodeCluster, topic_name: str) -> None:
    create_topic(cluster3.bootstrap, topic_name, BEFORE, 30.0, replication_factor=3)
    with ShareProxyThread(cluster3.bootstrap, state_topic_replication_factor=3) as proxy:
        _added_partitions_are_read(proxy, topic_name, f"added-{uuid.uuid4().hex[:8]}")
