"""Apache Kafka's own Java ``KafkaShareConsumer`` (kafka-clients 4.4) through kshare in front of Kafka 3.9.

A second real client besides librdkafka: ``tests/java/ShareConsumerDriver.java``, built once per
cache (Maven Central + javac, see ``tests.harness.java.java_share_driver``) and run as a child process
that prints one JSON line per record. One kshare runs for the module; each test has its own topic
and share group.
"""

from __future__ import annotations

import uuid
from collections import Counter

import pytest

from tests.harness.java import JavaShareConsumer, java_share_driver
from tests.harness.share import (
    newcomer_gets,
    produce,
    share_group,
    values,
    wait_until,
)


@pytest.fixture(scope="session")
def java_driver() -> list[str]:
    """The ShareConsumerDriver command line (built on first use, cached by content hash)."""

    return java_share_driver()




@pytest.fixture
def group() -> str:
    return f"java-share-{uuid.uuid4().hex[:12]}"


def finish(*consumers: JavaShareConsumer, timeout: float = 90.0) -> None:
    for c in consumers:
        try:
            rc = c.wait(timeout)
        except Exception:
            c.kill()
            raise
        assert rc == 0, f"{c.name} exited with {rc}\n{c.diagnostics()}"
        assert c.has_event("closed"), c.diagnostics()
        assert not [e for e in c.events if e.get("event") == "commit"], c.diagnostics()


def test_java_implicit(kafka39, kshare39, java_driver, topic_name, group):
    kafka39.create_topic(topic_name, partitions=2)
    share_group(kshare39.bootstrap, group)
    expected = values("j", 60)
    produce(kshare39.bootstrap, topic_name, expected, partitions=2, per_batch=3)
    java = JavaShareConsumer(java_driver, kshare39.bootstrap, group, topic_name, mode="implicit",
                             max_records=len(expected), timeout_ms=60_000).start()
    try:
        finish(java)
    finally:
        java.kill()
    assert Counter(java.values()) == Counter(expected), java.diagnostics()
    assert {g.partition for g in java.records} == {0, 1}
    assert all(g.delivery_count == 1 for g in java.records)
    assert newcomer_gets(kshare39.bootstrap, group, topic_name, 3) == []  # a librdkafka newcomer: all settled


def test_java_explicit_release_and_reject(kafka39, kshare39, java_driver, topic_name, group):
    kafka39.create_topic(topic_name, partitions=1)
    share_group(kshare39.bootstrap, group)
    produce(kshare39.bootstrap, topic_name, [b"release-me", b"reject-me", b"ok"])
    java = JavaShareConsumer(java_driver, kshare39.bootstrap, group, topic_name, mode="explicit",
                             ack="release-me@1=release,reject-me=reject,*=accept",
                             timeout_ms=30_000, idle_ms=4000).start()
    try:
        finish(java)
    finally:
        java.kill()
    seen = sorted((g.value, g.delivery_count) for g in java.records)
    assert seen == [(b"ok", 1), (b"reject-me", 1), (b"release-me", 1), (b"release-me", 2)], java.diagnostics()
    assert newcomer_gets(kshare39.bootstrap, group, topic_name, 3) == []  # a librdkafka newcomer: all settled


def test_java_lock_timeout(kafka39, kshare39, java_driver, topic_name, group):
    """A Java consumer that stops acknowledging keeps its records only for the lock duration;
    another Java consumer then gets them with delivery count 2."""
    kafka39.create_topic(topic_name, partitions=1)
    share_group(kshare39.bootstrap, group, **{"share.record.lock.duration.ms": 2000})
    produce(kshare39.bootstrap, topic_name, values("h", 5), per_batch=5)
    holder = JavaShareConsumer(java_driver, kshare39.bootstrap, group, topic_name, mode="explicit", ack="*=hold",
                               timeout_ms=60_000, name="holder").start()
    taker = None
    try:
        wait_until(lambda: holder.has_event("holding"), 60, "the holder's records")
        held = set(holder.values())
        held_at = holder.records[0].at
        assert held
        taker = JavaShareConsumer(java_driver, kshare39.bootstrap, group, topic_name, mode="explicit",
                                  max_records=len(held), timeout_ms=60_000, name="taker").start()
        finish(taker)
        # the holder stayed in the group all along (its heartbeats go on while it does not poll)
        g = kshare39.call(lambda: kshare39.service.coordinator.group(group))
        assert g is not None and len(g.members) >= 1
    finally:
        holder.kill()
        if taker is not None:
            taker.kill()
    taken = [r for r in taker.records if r.value in held]
    assert {r.value for r in taken} == held, taker.diagnostics()
    # The Java client keeps fetching in its background thread while the application holds records,
    # so after the first expiry the holder may take them once more into its buffer (delivery count
    # 2, never shown to the application: it stopped polling); then it stops fetching, and they
    # reach the taker after the second expiry (delivery count 3). A broker does the same.
    assert all(r.delivery_count in (2, 3) for r in taken), taken
    assert min(r.at for r in taken) - held_at >= 1.5  # not before the 2 s lock ran out
