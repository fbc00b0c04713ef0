"""Fair acquisition: with client defaults, every share consumer of a partition gets work.

Real confluent-kafka ShareConsumers with their default ``max.poll.records`` (500) through kshare
in front of Apache Kafka 3.9. On Apache Kafka 4.4 (and on kshare before fair acquisition) four
such consumers take a partition's whole lock budget (``share.partition.max.record.locks``, 2000)
and the rest wait; kshare divides the budget among the partition's members. The assertions are
about fairness (records per consumer), not time, so a loaded machine does not make them flaky.
"""

from __future__ import annotations

import time

from confluent_kafka import Producer

from tests.harness.brokers import KafkaBroker
from tests.harness.drain import drain
from tests.harness.drain import names as drain_names
from tests.harness.share import ShareProxyThread, share_consumer, share_group

CLIENT_DEFAULT_MAX_POLL = 500  # confluent-kafka ShareConsumer's max.poll.records default
FAIRNESS = 3  # the most records a consumer gets is at most this many times the fewest


def _fair_drain(proxy: ShareProxyThread, kafka39: KafkaBroker, members: int, *, churn: bool):
    topic, group = drain_names("fair")
    kafka39.create_topic(topic, 1)
    share_group(proxy.bootstrap, group, share_heartbeat_interval_ms=500)
    return drain(proxy.bootstrap, kafka39.bootstrap, topic, group, partitions=1, members=members,
                 per_member=120, max_poll=CLIENT_DEFAULT_MAX_POLL, work_ms=5.0,
                 joins=(0.3,) if churn else (), leaves=(0.6,) if churn else ())


def test_every_consumer_of_a_partition_gets_a_fair_part(kshare39, kafka39):
    """24 consumers with client defaults on one partition: all get records, within 3x of each other."""
    r = _fair_drain(kshare39, kafka39, 24, churn=False)
    assert r.missing == 0, r
    counts = r.per_member
    assert min(counts) > 0, counts
    assert max(counts) <= FAIRNESS * min(counts), counts


def test_fairness_holds_while_members_come_and_go(kshare39, kafka39):
    """One member joins at 30 % of the ideal time and one leaves at 60 %: those present all along
    stay within 3x of each other, and the newcomer gets records too."""
    r = _fair_drain(kshare39, kafka39, 24, churn=True)
    assert r.missing == 0, r
    leaver, *stayed, joiner = r.per_member  # drain() stops the first member; the joiner comes last
    assert min(stayed) > 0 and max(stayed) <= FAIRNESS * min(stayed), r.per_member
    assert joiner > 0, r.per_member


def test_a_consumer_alone_still_gets_full_batches(kshare39, kafka39):
    """Fairness only divides what members compete for: a lone consumer gets max.poll.records."""
    topic, group = drain_names("fair-alone")
    kafka39.create_topic(topic, 1)
    share_group(kshare39.bootstrap, group, share_heartbeat_interval_ms=500)
    producer = Producer({"bootstrap.servers": kafka39.bootstrap, "linger.ms": 50, "batch.num.messages": 1000,
                         "log_level": 3})
    for i in range(3000):
        producer.produce(topic, f"r-{i}".encode(), partition=0)
    assert producer.flush(30) == 0
    consumer = share_consumer(kshare39.bootstrap, group)
    consumer.subscribe([topic])
    sizes = []
    deadline = time.monotonic() + 60
    try:
        while sum(sizes) < 3000 and time.monotonic() < deadline:
            msgs = [m for m in consumer.poll(1.0) if m.error() is None]
            if msgs:
                sizes.append(len(msgs))
    finally:
        consumer.close()
    assert sum(sizes) == 3000, sizes
    assert max(sizes) >= CLIENT_DEFAULT_MAX_POLL, sizes
