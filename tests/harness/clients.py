"""Real Kafka clients driven the same way through the proxy and directly, for comparisons.

Each client library gets ``produce(bootstrap, topic, records)`` and
``consume(bootstrap, topic, group, n)``; consumers join a consumer group (subscribe) and report,
besides the records, every broker address the client learned or connected to, so a test can check
that a proxied client never leaves the proxy.

Records read are normalized to :class:`Rec` (topic, partition, offset, key, value, headers,
timestamp), the same tuple whatever library read them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

log = logging.getLogger("kshare.tests.clients")

# Tansu answers a JoinGroup after about half the session timeout: keep it as short as Kafka allows
# (group.min.session.timeout.ms = 6 s).
SESSION_TIMEOUT_MS = 6000
HEARTBEAT_MS = 1000
CONSUME_TIMEOUT = 60.0


class Rec(NamedTuple):
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp: int


Outgoing = tuple[bytes, bytes, list[tuple[str, bytes]]]  # key, value, headers


def make_records(label: str, n: int, distinct_keys: int = 7) -> list[Outgoing]:
    """``n`` keyed records; keys repeat (``distinct_keys`` of them) so partitioning can be compared."""
    return [
        (
            f"key-{i % distinct_keys}".encode(),
            f"{label}-{i}".encode(),
            [("i", str(i).encode()), ("via", label.encode()), ("empty", b"")],
        )
        for i in range(n)
    ]


@dataclass
class Consumed:
    records: list[Rec]
    # every (host, port) the client learned from the cluster or connected to
    addresses: set[tuple[str, int]] = field(default_factory=set)
    # the group coordinator the consumer used
    coordinator: tuple[str, int] | None = None


def _headers(raw) -> tuple[tuple[str, bytes], ...]:
    return tuple((k, bytes(v) if v is not None else b"") for k, v in (raw or ()))


def _hostport(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


# ------------------------------------------------------------------------------------------------
# confluent-kafka (librdkafka)


def _quiet() -> logging.Logger:
    return logging.getLogger("kshare.tests.clients.librdkafka")


def confluent_produce(
    bootstrap: str, topic: str, records: list[Outgoing], **conf: object
) -> dict[bytes, tuple[int, int]]:
    """Produce keyed records (default partitioner); return value -> (partition, offset)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "logger": _quiet(), **conf})
    done: dict[bytes, tuple[int, int]] = {}
    errors: list[object] = []

    def report(err, msg) -> None:
        if err is not None:
            errors.append(err)
        else:
            done[msg.value()] = (msg.partition(), msg.offset())

    for key, value, headers in records:
        producer.produce(topic, key=key, value=value, headers=headers, on_delivery=report)
    assert producer.flush(30) == 0, "confluent producer did not deliver everything"
    assert errors == [], errors
    return done


def polled(consumer, done: Callable[[], bool], timeout: float, interval: float) -> Iterator:
    """What a confluent consumer's polls give (messages and errors), every ``interval`` seconds
    until ``done()`` or ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        msg = consumer.poll(interval)
        if msg is not None:
            yield msg


def confluent_consume(bootstrap: str, topic: str, group: str, n: int, **conf: object) -> Consumed:
    """Subscribe in consumer group ``group`` and read ``n`` records (offsets committed)."""
    from confluent_kafka import Consumer

    stats: list[dict] = []
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": SESSION_TIMEOUT_MS,
            "heartbeat.interval.ms": HEARTBEAT_MS,
            "statistics.interval.ms": 200,
            "stats_cb": lambda text: stats.append(json.loads(text)),
            "logger": _quiet(),
            **conf,
        }
    )
    consumer.subscribe([topic])
    out: list[Rec] = []
    try:
        for msg in polled(consumer, lambda: len(out) >= n, CONSUME_TIMEOUT, 0.2):
            assert msg.error() is None, msg.error()
            out.append(
                Rec(
                    msg.topic(),
                    msg.partition(),
                    msg.offset(),
                    msg.key(),
                    msg.value(),
                    _headers(msg.headers()),
                    msg.timestamp()[1],
                )
            )
        consumer.commit(asynchronous=False)
        # one more statistics report, taken after the commit (the coordinator is then surely known)
        seen = len(stats)
        deadline = time.monotonic() + 5
        while len(stats) == seen and time.monotonic() < deadline:
            consumer.poll(0.1)
    finally:
        consumer.close()
    result = Consumed(out)
    result.addresses, logical = _stats_addresses(stats)
    result.coordinator = logical.get("GroupCoordinator")
    return result


def _stats_addresses(stats: list[dict]) -> tuple[set[tuple[str, int]], dict[str, tuple[str, int]]]:
    """Every broker address in librdkafka statistics, and those of its logical brokers
    (``GroupCoordinator``, ``TxnCoordinator``) by name."""
    addresses, logical = set(), {}
    for s in stats:
        for name, b in s.get("brokers", {}).items():
            if b.get("nodename"):
                addresses.add(_hostport(b["nodename"]))
                if "/" not in name and ":" not in name:
                    logical[name] = _hostport(b["nodename"])
    return addresses, logical


def confluent_transactions(bootstrap: str, topic: str, label: str, n: int) -> Consumed:
    """A transactional producer commits ``n`` records (``<label>-commit-<i>``) in one transaction
    and aborts ``n`` (``<label>-abort-<i>``) in another; returns the addresses it used, with the
    transaction coordinator as ``coordinator``."""
    from confluent_kafka import Producer

    stats: list[dict] = []
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"{label}-{topic}",
            "linger.ms": 5,
            "statistics.interval.ms": 200,
            "stats_cb": lambda text: stats.append(json.loads(text)),
            "logger": _quiet(),
        }
    )
    producer.init_transactions(60)
    for outcome in ("commit", "abort"):
        producer.begin_transaction()
        for i in range(n):
            producer.produce(topic, key=f"key-{i % 3}".encode(), value=f"{label}-{outcome}-{i}".encode())
        if outcome == "commit":
            producer.commit_transaction(60)
        else:
            producer.abort_transaction(60)
    seen = len(stats)
    deadline = time.monotonic() + 5
    while len(stats) == seen and time.monotonic() < deadline:
        producer.poll(0.1)
    producer.flush(10)
    result = Consumed([])
    result.addresses, logical = _stats_addresses(stats)
    result.coordinator = logical.get("TxnCoordinator")
    return result


# ------------------------------------------------------------------------------------------------
# kafka-python 3 and aiokafka (the same consumer settings, the same cluster metadata classes)


def _group_consumer_config(bootstrap: str, group: str) -> dict[str, object]:
    """A consumer in group ``group``, from the earliest offset, committing only when told."""
    return {
        "bootstrap_servers": bootstrap,
        "group_id": group,
        "auto_offset_reset": "earliest",
        "enable_auto_commit": False,
        "session_timeout_ms": SESSION_TIMEOUT_MS,
        "heartbeat_interval_ms": HEARTBEAT_MS,
    }


def _add_cluster_addresses(result: Consumed, cluster, coordinator_id: int | None) -> None:
    """Every broker of the client's cluster metadata, and the group coordinator, into ``result``."""
    for b in cluster.brokers():
        result.addresses.add((b.host, b.port))
    if coordinator_id is not None:
        md = cluster.broker_metadata(coordinator_id)
        result.coordinator = (md.host, md.port)
        result.addresses.add(result.coordinator)


# ------------------------------------------------------------------------------------------------
# kafka-python 3


def kafka_python_produce(bootstrap: str, topic: str, records: list[Outgoing]) -> dict[bytes, tuple[int, int]]:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    try:
        futures = [
            (value, producer.send(topic, key=key, value=value, headers=headers))
            for key, value, headers in records
        ]
        producer.flush(30)
        done = {}
        for value, fut in futures:
            md = fut.get(30)
            done[value] = (md.partition, md.offset)
        return done
    finally:
        producer.close(10)


def kafka_python_consume(bootstrap: str, topic: str, group: str, n: int) -> Consumed:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(**_group_consumer_config(bootstrap, group))
    # kafka-python 3.0.12 race, seen directly against Kafka 3.9 as well: a group leader that joins
    # before it has the topic's metadata assigns nothing ("No partition metadata for topic") and
    # never rejoins. Learn the topic's partitions first, then subscribe.
    assert consumer.partitions_for_topic(topic), f"no metadata for {topic}"
    consumer.subscribe([topic])
    out: list[Rec] = []
    deadline = time.monotonic() + CONSUME_TIMEOUT
    try:
        while len(out) < n and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=1000).values():  # returns as soon as records come
                for m in batch:
                    out.append(
                        Rec(m.topic, m.partition, m.offset, m.key, m.value, _headers(m.headers), m.timestamp)
                    )
        _kafka_python_commit(consumer)
        result = Consumed(out)
        _add_cluster_addresses(result, consumer._client.cluster, consumer._coordinator.coordinator_id)
        return result
    finally:
        consumer.close()


def _kafka_python_commit(consumer, timeout: float = 10.0) -> bool:
    """Commit the positions; True if committed.

    kafka-python 3.0.12 often rebalances right after its first assignment, and now and then never
    completes that rebalance: the SyncGroup response arrives but the consumer stays "rebalancing"
    (seen directly against Kafka 3.9 as often as through the proxy). Its commits then fail with
    RebalanceInProgressError; polling gives the rebalance a chance to finish, and after ``timeout``
    the commit is given up (the records read are what the tests compare).
    """
    from kafka.errors import CommitFailedError, RebalanceInProgressError

    positions = {tp: consumer.position(tp) for tp in consumer.assignment()}
    deadline = time.monotonic() + timeout
    while True:
        try:
            consumer.commit()
            return True
        except (RebalanceInProgressError, CommitFailedError) as exc:
            if time.monotonic() > deadline:
                log.warning(
                    "kafka-python consumer still rebalancing after %.0f s, not committing: %s", timeout, exc
                )
                return False
            consumer.poll(timeout_ms=1000, max_records=1, update_offsets=False)
            for tp, offset in positions.items():
                if tp in consumer.assignment():
                    consumer.seek(tp, offset)


def kafka_python_admin(bootstrap: str):
    from kafka import KafkaAdminClient

    return KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)


# ------------------------------------------------------------------------------------------------
# aiokafka


def aiokafka_produce(bootstrap: str, topic: str, records: list[Outgoing]) -> dict[bytes, tuple[int, int]]:
    async def run() -> dict[bytes, tuple[int, int]]:
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
        await producer.start()
        try:
            futures = [
                (value, await producer.send(topic, key=key, value=value, headers=headers))
                for key, value, headers in records
            ]
            done = {}
            for value, fut in futures:
                md = await fut
                done[value] = (md.partition, md.offset)
            return done
        finally:
            await producer.stop()

    return asyncio.run(run())


def aiokafka_consume(bootstrap: str, topic: str, group: str, n: int) -> Consumed:
    async def run() -> Consumed:
        from aiokafka import AIOKafkaConsumer

        consumer = AIOKafkaConsumer(topic, **_group_consumer_config(bootstrap, group))
        await consumer.start()
        out: list[Rec] = []
        deadline = time.monotonic() + CONSUME_TIMEOUT
        try:
            while len(out) < n and time.monotonic() < deadline:
                for batch in (await consumer.getmany(timeout_ms=200)).values():
                    for m in batch:
                        out.append(
                            Rec(
                                m.topic,
                                m.partition,
                                m.offset,
                                m.key,
                                m.value,
                                _headers(m.headers),
                                m.timestamp,
                            )
                        )
            await consumer.commit()
            result = Consumed(out)
            client = consumer._client
            _add_cluster_addresses(result, client.cluster, consumer._coordinator.coordinator_id)
            for conn in client._conns.values():  # every connection the client actually opened
                result.addresses.add((conn.host, conn.port))
            return result
        finally:
            await consumer.stop()

    return asyncio.run(run())


LIBRARIES = {
    "confluent": (confluent_produce, confluent_consume),
    "kafka-python": (kafka_python_produce, kafka_python_consume),
    "aiokafka": (aiokafka_produce, aiokafka_consume),
}
