"""Fair acquisition and whole batches (issue 43): a batch-optimized member takes whole batches only
where the records beyond its share add little to the time it holds them
(``kshare.share.fairness.FairShare.whole_batches``). Consumers that work on every record keep
their exact shares even when the backlog would give each of them several whole batches: whole
batches there would leave the lock budget to four of them at a time, as on Apache Kafka 4.4.

Real confluent-kafka ShareConsumers (client defaults, batch-optimized) through kshare in front of
Apache Kafka 3.9. The assertion is about fairness (records per consumer), not time."""

from __future__ import annotations

from tests.harness.brokers import KafkaBroker
from tests.harness.drain import drain
from tests.harness.drain import names as drain_names
from tests.harness.share import ShareProxyThread, share_group

CLIENT_DEFAULT_MAX_POLL = 500  # confluent-kafka ShareConsumer's max.poll.records default
FAIRNESS = 3  # the most records a consumer gets is at most this many times the fewest


def test_slow_consumers_share_a_backlog_of_many_batches(kshare39: ShareProxyThread, kafka39: KafkaBroker):
    """24 consumers of 5 ms a record on one partition, 600 records each waiting from the start (each
    one's share of the waiting records is more than a producer batch): within 3x of each other.
    Rounded up to whole batches whenever they fit the records waiting, the four first to fetch took
    12 to 24 times what the last one got."""
    topic, group = drain_names("fair-whole")
    kafka39.create_topic(topic, 1)
    share_group(kshare39.bootstrap, group, share_heartbeat_interval_ms=500)
    r = drain(kshare39.bootstrap, kafka39.bootstrap, topic, group, partitions=1, members=24, per_member=600,
              max_poll=CLIENT_DEFAULT_MAX_POLL, work_ms=5.0)
    assert r.missing == 0, r
    counts = r.per_member
    assert min(counts) > 0, counts
    assert max(counts) <= FAIRNESS * min(counts), counts
