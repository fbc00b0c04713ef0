"""Smoke tests of the test upstreams themselves: real produce/consume round trips."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import AcknowledgeType, KafkaError, Producer, ShareConsumer
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from tests.harness.brokers import KafkaBroker
from tests.harness.clients import confluent_consume


def _produce(bootstrap: str, topic: str, n: int, partitions: int) -> list[bytes]:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    errors: list[KafkaError] = []
    values = [f"value-{i}".encode() for i in range(n)]
    for i, value in enumerate(values):
        producer.produce(
            topic,
            key=f"key-{i}".encode(),
            value=value,
            partition=i % partitions,
            on_delivery=lambda err, _msg: err and errors.append(err),
        )
    assert producer.flush(30) == 0
    assert errors == []
    return values


def test_produce_consume_round_trip(upstream, topic_name):
    partitions = 3
    upstream.create_topic(topic_name, partitions=partitions)
    values = _produce(upstream.bootstrap, topic_name, 30, partitions)

    # (Tansu answers a JoinGroup only after about half the session timeout: the harness keeps it short)
    messages = confluent_consume(upstream.bootstrap, topic_name, f"g-{topic_name}", len(values)).records

    assert sorted(m.value for m in messages) == sorted(values)
    for m in messages:
        i = int(m.value.split(b"-")[1])
        assert m.key == f"key-{i}".encode()
        assert m.partition == i % partitions
        assert m.topic == topic_name
    by_partition: dict[int, list[int]] = {}
    for m in messages:
        by_partition.setdefault(m.partition, []).append(m.offset)
    assert {p: sorted(o) for p, o in by_partition.items()} == {p: list(range(10)) for p in range(partitions)}
    assert all(offsets == sorted(offsets) for offsets in by_partition.values())


def test_create_topic_visible_in_metadata(upstream, topic_name):
    upstream.create_topic(topic_name, partitions=4)
    md = upstream.admin().list_topics(topic=topic_name, timeout=10)
    assert len(md.topics[topic_name].partitions) == 4
    assert [b.port for b in md.brokers.values()] == [upstream.port]


@pytest.mark.kafka
def test_kafka_restart_keeps_data_and_port(broker_factory, topic_name):
    broker: KafkaBroker = broker_factory("kafka39", auto_create_topics=False)
    broker.create_topic(topic_name, partitions=1)
    values = _produce(broker.bootstrap, topic_name, 5, 1)
    port = broker.port

    broker.restart(hard=True)  # SIGKILL, then start on the same directory

    assert broker.port == port and broker.running
    messages = confluent_consume(broker.bootstrap, topic_name, "after-restart", len(values)).records
    assert [m.value for m in messages] == values


def test_kafka4_share_group_round_trip(kafka4, topic_name):
    group = f"share-{topic_name}"
    kafka4.create_topic(topic_name, partitions=2)
    admin = kafka4.admin()
    earliest = ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)
    for fut in admin.incremental_alter_configs(
        [ConfigResource(ResourceType.GROUP, group, incremental_configs=[earliest])]
    ).values():
        fut.result(30)
    values = _produce(kafka4.bootstrap, topic_name, 10, 2)

    consumer = ShareConsumer(
        {"bootstrap.servers": kafka4.bootstrap, "group.id": group, "share.acknowledgement.mode": "explicit"}
    )
    consumer.subscribe([topic_name])
    accepted: list[bytes] = []
    released: bytes | None = None
    redelivery_count = None
    deadline = time.monotonic() + 60
    try:
        while len(accepted) < len(values) and time.monotonic() < deadline:
            batch = consumer.poll(1.0)
            for msg in batch:
                assert msg.error() is None, msg.error()
                if released is None:
                    released = msg.value()  # give the first record back once
                    consumer.acknowledge(msg, AcknowledgeType.RELEASE)
                    continue
                if msg.value() == released:
                    redelivery_count = msg.delivery_count()
                consumer.acknowledge(msg, AcknowledgeType.ACCEPT)
                accepted.append(msg.value())
            if batch:
                consumer.commit_sync(30)
    finally:
        consumer.close()

    assert sorted(accepted) == sorted(values)
    assert redelivery_count == 2


@pytest.mark.kafka
def test_bench_deletes_its_topics(kafka39, topic_name):
    """The bench's topics go when it is done with them (a dropped admin client once kept every one)."""
    from kshare.bench import clients

    clients.create_topic(kafka39.bootstrap, topic_name, 2)
    assert topic_name in kafka39.admin().list_topics(timeout=10).topics
    clients.delete_topic(kafka39.bootstrap, topic_name)
    assert topic_name not in kafka39.admin().list_topics(timeout=10).topics
