"""Delayed redelivery (kshare's own group configs, docs/design/ordering-and-backoff.md), end to end with
confluent-kafka's ShareConsumer through kshare in front of Apache Kafka 3.9.

A released record comes back only after ``kshare.share.redelivery.backoff.ms``, doubled for each
delivery after the first (at most ``kshare.share.redelivery.backoff.max.ms``); the records around
it go on at once; after a restart of the proxy the backoff starts again (a record never comes back
sooner than its backoff). Off by default: then everything is as in Apache Kafka (the differential
suite runs with the defaults).
"""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import AcknowledgeType

from tests.harness.share import (
    ShareProxyThread,
    describe_group_configs,
    produce,
    records_of,
    share_group,
    subscribed,
    values,
)

pytestmark = pytest.mark.kafka


BACKOFF_MS = 1500


@pytest.fixture
def group() -> str:
    return f"backoff-{uuid.uuid4().hex[:12]}"


def _release_offset_zero(consumer, times: int, timeout: float) -> tuple[list[tuple[int, float]], dict[int, float]]:
    """Poll: release offset 0 the first ``times`` deliveries, accept everything else. Returns
    offset 0's deliveries (delivery count, when) with the release times, and when the others
    came."""
    deliveries: list[tuple[int, float]] = []
    others: dict[int, float] = {}
    released_at: list[float] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and len(deliveries) <= times:
        for m in records_of(consumer, 0.2):
            now = time.monotonic()
            if m.offset() == 0:
                deliveries.append((m.delivery_count(), now))
                if len(deliveries) <= times:
                    consumer.acknowledge(m, AcknowledgeType.RELEASE)
                    released_at.append(now)
                else:
                    consumer.acknowledge(m, AcknowledgeType.ACCEPT)
            else:
                others.setdefault(m.offset(), now)
                consumer.acknowledge(m, AcknowledgeType.ACCEPT)
    return [(c, t - r) for (c, t), r in zip(deliveries[1:], released_at, strict=False)], others


def test_a_released_record_comes_back_only_after_its_backoff_each_time(kshare39, kafka39, topic_name, group):
    """Offset 0 is released twice: it comes back after >= 1.5 s, then after >= 3 s (doubled),
    with delivery counts 2 and 3; the records behind it are delivered meanwhile, at once."""
    kafka39.create_topic(topic_name, partitions=1)
    produce(kafka39.bootstrap, topic_name, values("b", 5), per_batch=1)
    share_group(kshare39.bootstrap, group, **{"kshare.share.redelivery.backoff.ms": BACKOFF_MS,
                                              "kshare.share.redelivery.backoff.max.ms": 60_000})
    assert describe_group_configs(kshare39.bootstrap, group)["kshare.share.redelivery.backoff.ms"] == str(BACKOFF_MS)
    with subscribed(kshare39.bootstrap, group, topic_name, explicit=True) as c:
        started = time.monotonic()
        gaps, others = _release_offset_zero(c, 2, 30)
    assert [count for count, _ in gaps] == [2, 3], gaps
    first, second = (gap for _, gap in gaps)
    assert first >= BACKOFF_MS / 1000, gaps
    assert second >= 2 * BACKOFF_MS / 1000, gaps
    assert first < BACKOFF_MS / 1000 + 5 and second < 2 * BACKOFF_MS / 1000 + 5, gaps  # and it does come back
    assert sorted(others) == [1, 2, 3, 4]
    assert max(others.values()) - started < BACKOFF_MS / 1000 + 5  # not held behind the released one


def test_the_backoff_is_capped_by_its_maximum(kshare39, kafka39, topic_name, group):
    kafka39.create_topic(topic_name, partitions=1)
    produce(kafka39.bootstrap, topic_name, values("m", 1), per_batch=1)
    share_group(kshare39.bootstrap, group, **{"kshare.share.redelivery.backoff.ms": 1000,
                                              "kshare.share.redelivery.backoff.max.ms": 1000})
    with subscribed(kshare39.bootstrap, group, topic_name, explicit=True) as c:
        gaps, _ = _release_offset_zero(c, 3, 30)
    assert [count for count, _ in gaps] == [2, 3, 4], gaps
    assert all(1.0 <= gap < 4.0 for _, gap in gaps), gaps  # 1 s each time, not 1, 2, 4 s


def test_off_by_default(kshare39, group):
    configs = describe_group_configs(kshare39.bootstrap, group)
    assert configs["kshare.share.redelivery.backoff.ms"] == "0"


def test_a_backoff_survives_a_restart_of_the_proxy(kafka39, topic_name, group):
    """A record released (backoff 4 s) before the proxy restarts is not delivered by the new proxy
    sooner than 4 s after it loads the share-partition: the backoff starts again there, so the
    record never comes back sooner than its backoff (it may come back later)."""
    state_topic = f"__kshare_state_backoff_{uuid.uuid4().hex[:8]}"
    kafka39.create_topic(topic_name, partitions=1)
    produce(kafka39.bootstrap, topic_name, values("r", 2), per_batch=1)
    backoff_s = 4.0
    with ShareProxyThread(kafka39.bootstrap, state_topic=state_topic) as first:
        share_group(first.bootstrap, group, **{"kshare.share.redelivery.backoff.ms": int(backoff_s * 1000)})
        with subscribed(first.bootstrap, group, topic_name, explicit=True) as c:
            deadline = time.monotonic() + 20
            released = False
            while not released and time.monotonic() < deadline:
                for m in records_of(c, 0.3):
                    if m.offset() == 0:
                        c.acknowledge(m, AcknowledgeType.RELEASE)
                        released = True
                    else:
                        c.acknowledge(m, AcknowledgeType.ACCEPT)
            assert released
            c.commit_sync(30)  # the release answered, so durable
    with ShareProxyThread(kafka39.bootstrap, state_topic=state_topic) as second:
        loaded = time.monotonic()
        with subscribed(second.bootstrap, group, topic_name, explicit=True) as c:
            back = None
            deadline = time.monotonic() + backoff_s + 20
            while back is None and time.monotonic() < deadline:
                for m in records_of(c, 0.2):
                    c.acknowledge(m, AcknowledgeType.ACCEPT)
                    if m.offset() == 0:
                        back = (m.delivery_count(), time.monotonic() - loaded)
    assert back is not None, "the released record never came back"
    assert back[0] == 2, back
    assert back[1] >= backoff_s, back
