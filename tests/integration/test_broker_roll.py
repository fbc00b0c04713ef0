"""A cluster of three brokers restarting them under share consumers: nothing lost, little redelivered.

Apache Kafka 3.9 as three KRaft nodes (replication factor 3, ``min.insync.replicas`` 2), kshare in
front, confluent ``ShareConsumer``s draining a 6-partition topic while a producer keeps writing
through kshare. Each broker in turn gets SIGTERM (a controlled shutdown, as a rolling restart) and
is started again, then one is SIGKILLed and started again.

The roll waits for every replica to be in sync before the next broker, as a rolling restart does.
What may be redelivered: the records a consumer held when its acknowledgement could not be written
(a state write that failed past its retries) or that it held past its lock while the cluster had no
leader for their state partition; records lost: none, ever. kshare holds the share state in the
proxy, which does not move when a broker does: a client keeps its connections to the proxy (they are
re-attached to another broker under it), its share sessions and what it acquired. Native Kafka
loses the acquired records of every moved share-partition leader (1 % of the records redelivered in
``kshare bench --only failover``, kshare none: docs/benchmarks/failover.md).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid

import pytest
from confluent_kafka import Producer

from tests.harness.cluster import ThreeNodeCluster
from tests.harness.proxies import ProxyThread
from tests.harness.share import (
    ConsumerLoop,
    Got,
    ShareProxyThread,
    quiet_logger,
    read_plain,
    share_group,
    stop_all,
)

log = logging.getLogger("kshare.tests.broker_roll")

# The session's three-node cluster (tests/conftest.py ``cluster3``); the benchmark (kshare bench
# --only failover) measures the same faults at a larger size, side by side with native Kafka 4.4.
# Opt-in: what makes it fail depends on the machine's load, not on kshare alone. Run beside other
# work at a load average of 20-30 it failed three ways; each failure now says why (the breakdown
# of redeliveries by cause, kshare_share_member_releases_total and
# kshare_share_acknowledgement_errors_total):
# * a consumer's session with a partition's old leader closing took back what it had acquired
#   through the new leader (fixed: test_session_moves.py);
# * one consumer acquired far more than it could work through within the lock duration (a
#   ShareFetch in batch-optimized mode takes whole producer batches, as on Kafka 4.4, and the
#   first consumer to fetch finds the whole backlog), so its locks ran out and its late
#   acknowledgements were refused (INVALID_RECORD_STATE): thousands of redeliveries, all of one
#   consumer's records, none tied to a fault;
# * records a consumer still held when it closed, released by the close, reached the newcomer.
# test_broker_return.py, test_state_leader_moves.py, test_session_moves.py and the three-node
# test_added_partitions.py run in CI.
pytestmark = [
    pytest.mark.timeout(420),
    pytest.mark.skipif(not os.environ.get("KSHARE_FAILOVER_TESTS"),
                       reason="set KSHARE_FAILOVER_TESTS=1 to run the broker-roll tests (issue 40)"),
]

RECORDS_BEFORE = 6000
RECORDS_DURING = 3000
CONSUMERS = 4
# how much longer a record produced through kshare may wait than one produced directly, both in
# the same run (one process, two producers: the machine's load is the same for both)
WAIT_SLACK_S = 3.0


class SteadyProducer:
    """Produces ``n`` records through kshare at ``rate`` a second, idempotent with acks=all."""

    def __init__(self, bootstrap: str, topic: str, prefix: str, n: int, rate: float) -> None:
        self.values = [b"%s-%06d" % (prefix.encode(), i) for i in range(n)]
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                                  "linger.ms": 5, "logger": quiet_logger()})
        self.rate = rate
        self.topic = topic
        self.failed: list[str] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        t0 = time.monotonic()
        for i, v in enumerate(self.values):
            delay = t0 + i / self.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            self.producer.produce(self.topic, value=v, on_delivery=self._report)
            self.producer.poll(0)
        self.producer.flush(120)

    def _report(self, err, _msg) -> None:
        if err is not None:
            self.failed.append(str(err))

    def start(self) -> SteadyProducer:
        self._thread.start()
        return self

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


def test_a_rolling_restart_and_a_crash_lose_nothing_and_redeliver_little(cluster3: ThreeNodeCluster) -> None:
    topic = f"roll-{uuid.uuid4().hex[:8]}"
    group = f"roll-{uuid.uuid4().hex[:8]}"
    admin = cluster3.admin()
    from confluent_kafka.admin import NewTopic

    admin.create_topics([NewTopic(topic, 6, 3)])[topic].result(30)
    with ShareProxyThread(cluster3.bootstrap, state_topic_replication_factor=3) as proxy:
        share_group(proxy.bootstrap, group)
        before = SteadyProducer(proxy.bootstrap, topic, "before", RECORDS_BEFORE, rate=100_000)
        before.start().join(60)
        assert not before.failed, before.failed[:3]
        loops = [ConsumerLoop(f"c{i}", proxy.bootstrap, group, topic, process_s=0.004,
                              **{"max.poll.records": 100}).start() for i in range(CONSUMERS)]
        during = SteadyProducer(proxy.bootstrap, topic, "during", RECORDS_DURING, rate=60).start()
        try:
            t0 = time.monotonic()
            # As a rolling restart does (Strimzi, kshare bench --only failover): the next broker only
            # once every replica is in sync again. Without that wait, a node still catching up when the
            # next one stops leaves partitions under min.insync.replicas: no acks=all write (the
            # producer's, kshare's state writes, native Kafka's share state) is accepted until it
            # catches up, which on a loaded machine took longer than a state write may wait.
            for node, hard in ((1, False), (2, False), (3, False), (2, True)):
                cluster3.restart(node, hard=hard)
                back = time.monotonic() - t0
                assert cluster3.wait_in_sync(120), cluster3.under_replicated()
                log.info("node %d restarted (%s) at %.1f s, replicas in sync at %.1f s", node,
                         "SIGKILL" if hard else "SIGTERM", back, time.monotonic() - t0)
            during.join(180)
            expected = set(before.values) | set(during.values)
            deadline = time.monotonic() + 120
            while not expected <= (seen := {v for lp in loops for v in lp.values()}):
                if time.monotonic() > deadline:
                    missing = sorted(expected - seen)
                    in_log = {m.value() for m in read_plain(cluster3.bootstrap, topic, len(expected), 30)}
                    raise AssertionError(
                        f"{len(missing)} of {len(expected)} records never delivered (e.g. {missing[:5]}), "
                        f"{len(set(missing) & in_log)} of them in the topic; producer failures "
                        f"{during.failed[:3]}; consumer errors: {[lp.errors for lp in loops]}")
                time.sleep(0.5)
        finally:
            stop_all(loops)
        assert not during.failed, during.failed[:3]
        deliveries = sum(len(lp.received) for lp in loops)
        redelivered = deliveries - len(expected)
        why = _redeliveries(loops, t0)
        stats = proxy.service.stats
        why["released by reason"] = {reason: n for (g, _t, reason), n in stats.member_releases.items() if g == group}
        why["lock timeouts"] = sum(n for (g, _t), n in stats.lock_timeouts.items() if g == group)
        why["acknowledgement errors"] = {e: n for (g, _t, e), n in stats.ack_errors.items() if g == group}
        log.info("%d records, %d deliveries, %d redeliveries (%.1f %%): %s", len(expected), deliveries, redelivered,
                 100 * redelivered / len(expected), why)
        assert redelivered <= 0.10 * len(expected), (deliveries, len(expected), why)
        # what was acknowledged stays so: a newcomer gets nothing
        late = ConsumerLoop("late", proxy.bootstrap, group, topic).start()
        time.sleep(5)
        stop_all([late])
        assert late.received == [], late.received[:5]



def _redeliveries(loops: list[ConsumerLoop], t0: float) -> dict[str, object]:
    """Where the deliveries past the first of each record came from: the same offset delivered again
    (by consumer that got it first, and by second of the run), or the same value at another offset
    (a producer's duplicate, which is no redelivery)."""
    firsts: dict[tuple[int, int], Got] = {}
    offsets_of: dict[bytes | None, set[tuple[int, int]]] = {}
    again: list[tuple[Got, Got]] = []
    for g in sorted((g for lp in loops for g in lp.received), key=lambda g: g.at):
        where = (g.partition, g.offset)
        offsets_of.setdefault(g.value, set()).add(where)
        if where in firsts:
            again.append((firsts[where], g))
        else:
            firsts[where] = g
    by_holder: dict[str, int] = {}
    by_second: dict[int, int] = {}
    for first, g in again:
        by_holder[first.consumer] = by_holder.get(first.consumer, 0) + 1
        by_second[int(g.at - t0)] = by_second.get(int(g.at - t0), 0) + 1
    return {"same offset again": len(again),
            "values at two offsets": sum(len(w) - 1 for w in offsets_of.values()),
            "first held by": by_holder, "redelivered at second": dict(sorted(by_second.items())),
            "delivery counts": sorted({g.delivery_count for _f, g in again})}


class TimedProducer:
    """An idempotent acks=all producer writing round robin over ``partitions`` at ``rate`` a second
    until stopped; keeps each record's partition, produce() time and delivery report time."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, rate: float) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                                  "linger.ms": 5, "logger": quiet_logger()})
        self.topic, self.partitions, self.rate = topic, partitions, rate
        self.sent: list[tuple[int, float]] = []  # (partition, produce() time), by record number
        self.reported: dict[int, float] = {}  # record number -> delivery report time (successful)
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        t0 = time.monotonic()
        while not self._stop.is_set():
            i = len(self.sent)
            delay = t0 + i / self.rate - time.monotonic()
            if delay > 0:
                self.producer.poll(min(delay, 0.01))  # delivery reports are timed as they are polled
                continue
            self.sent.append((i % self.partitions, time.monotonic()))
            self.producer.produce(self.topic, b"%06d" % i, partition=i % self.partitions,
                                  on_delivery=lambda err, _m, i=i: self._report(i, err))
            self.producer.poll(0)
        self.producer.flush(60)

    def _report(self, i: int, err) -> None:
        if err is None:
            self.reported[i] = time.monotonic()
        else:
            self.failed.append(str(err))

    def start(self) -> TimedProducer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(90)

    def longest_wait(self, since: float, until: float) -> tuple[float, int]:
        """The longest a record produced in [since, until) waited for its delivery report (one still
        without a report waited until ``until``), and its partition."""
        waits = [(min(self.reported.get(i, until), until) - t, p)
                 for i, (p, t) in enumerate(self.sent) if since <= t < until]
        return max(waits, default=(0.0, -1))


def test_a_producer_through_kshare_waits_no_longer_than_direct_when_a_broker_restarts(
        cluster3: ThreeNodeCluster) -> None:
    """A producer's stall through kshare after a broker's restart is no longer than directly
    (issue 40). The client connections of the restarted broker's listener are served through
    another broker while it is down; once it answers they move back to it. Before they did only if
    the proxy saw the broker leave the cluster's metadata, which a restart of a few seconds need
    not show: the stand-in kept answering NOT_LEADER_OR_FOLLOWER to every Produce for the
    partitions the broker led again, until something closed the connection. Whether a run meets
    that depends on timing (the producer reconnecting while the broker is down, no Metadata
    answer without it passing the proxy meanwhile): ``test_broker_return.py`` makes it happen
    every time; this one checks the outcome with real producers."""
    from confluent_kafka.admin import NewTopic

    topic = f"roll-produce-{uuid.uuid4().hex[:8]}"
    admin = cluster3.admin()  # kept: the future fails if the client is collected first
    admin.create_topics([NewTopic(topic, 6, 3)])[topic].result(30)
    assert cluster3.wait_preferred_leaders([topic], 60)
    with ProxyThread(cluster3.bootstrap) as proxy:
        through = TimedProducer(proxy.bootstrap, topic, 6, rate=60).start()
        direct = TimedProducer(cluster3.bootstrap, topic, 6, rate=60).start()
        try:
            time.sleep(5)
            t0 = time.monotonic()
            cluster3.restart(2)
            assert cluster3.wait_in_sync(120)
            assert cluster3.wait_preferred_leaders(None, 60)
            log.info("node 2 restarted, replicas in sync and leaders back after %.1f s", time.monotonic() - t0)
            time.sleep(10)  # what the producers wrote to the partitions node 2 leads again
            t_end = time.monotonic()
        finally:
            through.stop()
            direct.stop()
    (kshare_wait, kshare_part), (direct_wait, direct_part) = (through.longest_wait(t0, t_end),
                                                              direct.longest_wait(t0, t_end))
    log.info("longest produce wait after the restart: %.1f s through kshare (partition %d), %.1f s direct "
             "(partition %d)", kshare_wait, kshare_part, direct_wait, direct_part)
    assert not through.failed and not direct.failed, (through.failed[:3], direct.failed[:3])
    assert kshare_wait <= max(direct_wait, 1.0) + WAIT_SLACK_S, (kshare_wait, direct_wait)
