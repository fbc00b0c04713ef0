"""Partitions moving under share consumers on three nodes: nothing lost, nothing redelivered.

Apache Kafka 3.9 as three KRaft nodes (replication factor 3, ``min.insync.replicas`` 2,
``leader.imbalance.check.interval.seconds`` 10: a node's preferred leaderships come back to it
within about 10 s), a ``kshare proxy`` process in front (its state topic: 3 partitions,
replication factor 3), three confluent ``ShareConsumer``s draining a 6-partition topic through it
while an idempotent acks=all producer writes through it. An admin client talking to the cluster
directly (Kafka's own ``kafka-reassign-partitions``, confluent-kafka's ElectLeaders) moves the
partitions of the data topic *and* of kshare's state topic:

1. a partition reassignment: every partition's leader is taken out of its replicas (replication
   factor 3 -> 2, the leader moves), then put back as the first, preferred, replica (2 -> 3: its
   replica is copied again, and the leadership returns to it);
2. a preferred leader election, twice in a row: the replicas reordered without moving data, then
   ElectLeaders(PREFERRED) for every partition;
3. a broker stopped (SIGTERM) while a burst is produced, then started again: its replicas lag
   (out of the ISR) while it catches up, then its preferred leaderships return to it.

Each run asserts: every record the cluster acknowledged is delivered, where the producer's
report put it (a stale replica serving old data would show as a record at another offset, or
twice); a fresh consumer of the group afterwards gets nothing (the acknowledgements are durable);
no redelivery; no stretch longer than ``STALL_S`` with records available and none delivered; the
kshare process alive with no traceback in its log. Per-fault figures are printed (``pytest -s``).

Why no redelivery at all: kshare keeps the share-partitions' state (what is acquired, by whom,
what is acknowledged) in the proxy, which none of these faults touches. No client connection to
kshare closes (a moved leader is a NOT_LEADER_OR_FOLLOWER and a Metadata round trip for the
client's own Fetch/Produce, an upstream reconnection for kshare's), so no member loses what it
acquired; a state write that meets a leader change is retried, not failed; the consumers take
each batch within milliseconds, far inside the 30 s acquisition lock. A redelivery would need a
state write failed past its retries (the share-partition rebuilt from durable state) or a lock
running out: both are failures here. Native Kafka, whose share-partition leader *is* the data
partition's leader, loses every in-flight acquisition when a leadership moves.

Opt-in (``KSHARE_FAILOVER_TESTS=1``), like ``test_broker_roll.py``: three JVMs and a few minutes.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import NewTopic

from kshare.bench.procs import ProxyProcess
from tests.harness.cluster import ThreeNodeCluster
from tests.harness.cluster_moves import (
    MovesLoad,
    Part,
    assignment,
    elect_preferred,
    in_progress,
    reassign,
    report,
    wait_leaders,
    wait_reassigned,
)
from tests.harness.share import newcomer_gets, share_group, stop_all

log = logging.getLogger("kshare.tests.cluster_moves")

pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        not os.environ.get("KSHARE_FAILOVER_TESTS"),
        reason="set KSHARE_FAILOVER_TESTS=1 to run the three-node tests (issue 40)",
    ),
]

PARTITIONS = 6
STATE_PARTITIONS = 3
RATE = 100.0  # records a second through kshare, all the time
PREFILL = 3000  # records waiting when the consumers start
STALL_S = 10.0  # the longest a record may wait with none delivered
SETTLE_S = 5.0  # consumption between two steps of a fault
NEWCOMER_S = 8.0  # how long the fresh consumer of the group polls at the end


@pytest.fixture(scope="module")
def cluster3() -> Iterator[ThreeNodeCluster]:
    """One three-node cluster for the module's tests (each test has its own topic, group and kshare)."""
    with ThreeNodeCluster() as cluster:
        log.info("three-node cluster ready in %.1f s: %s", cluster.start_seconds, cluster.bootstrap)
        yield cluster


class Run:
    """One test's topic, kshare process (its own state topic) and load."""

    def __init__(self, cluster: ThreeNodeCluster, name: str, *, size: int = 256) -> None:
        self.cluster = cluster
        self.name = name
        suffix = uuid.uuid4().hex[:8]
        self.topic, self.group, self.state_topic = (
            f"{name}-{suffix}",
            f"{name}-{suffix}",
            f"__kshare_{name}_{suffix}",
        )
        admin = cluster.admin()
        admin.create_topics([NewTopic(self.topic, PARTITIONS, 3)])[self.topic].result(30)
        assert cluster.wait_preferred_leaders([self.topic], 60)
        self.proxy = ProxyProcess(
            cluster.bootstrap,
            [
                "--state-topic",
                self.state_topic,
                "--state-topic-partitions",
                str(STATE_PARTITIONS),
                "--state-topic-replication-factor",
                "3",
            ],
            name=f"kshare-{name}",
            keep_lines=None,
        )
        self.proxy.start(120)
        assert cluster.wait_preferred_leaders([self.state_topic], 60)
        share_group(self.proxy.bootstrap, self.group)
        self.load = MovesLoad(
            self.proxy.bootstrap, self.topic, self.group, partitions=PARTITIONS, rate=RATE, size=size
        )

    @property
    def topics(self) -> list[str]:
        return [self.topic, self.state_topic]

    def parts(self) -> list[Part]:
        return sorted(assignment(self.cluster, self.topics))

    def start(self) -> None:
        self.load.start_producer()
        self.load.burst(PREFILL)
        self.load.wait_reported(PREFILL, 60)
        self.load.start_consumers()
        time.sleep(SETTLE_S)

    def leading(self, node: int) -> list[int]:
        """Partitions of the data topic ``node`` leads now."""
        return [
            p for (t, p), (_r, leader, _i) in assignment(self.cluster, [self.topic]).items() if leader == node
        ]

    def finish(self, extra: dict[str, object] | None = None) -> dict:
        """Stop producing, wait for every record, stop the consumers, check everything the module's
        docstring promises; the per-fault figures printed."""
        load = self.load
        try:
            load.stop_producer()
            load.wait_delivered(120)
            time.sleep(2)  # the consumers' last acknowledgements go with their next poll or close
            t_end = time.monotonic()
        finally:
            stop_all(load.loops)
        newcomer = newcomer_gets(self.proxy.bootstrap, self.group, self.topic, NEWCOMER_S)
        metrics = self.proxy.metrics()
        res = load.analysis(t_end)
        figures = {
            "kshare_state_batches_resent_total": metrics.get("kshare_state_batches_resent_total", 0),
            "kshare_share_lock_timeouts_total": metrics.get("kshare_share_lock_timeouts_total", 0),
            "kshare warnings": sum(" WARNING " in line for line in self.proxy.output),
            **(extra or {}),
        }
        report(self.name, res, figures)
        alive = self.proxy.running
        self.proxy.stop()
        tracebacks = [i for i, line in enumerate(self.proxy.output) if "Traceback" in line]
        notes = self.proxy.notes(40)

        assert not load.failed, load.failed[:5]
        assert res["lost"] == 0, res["lost_ids"]
        assert load.misplaced() == [], load.misplaced()[:5]
        twice = {rid: n for rid, n in Counter(rid for _, rid, *_ in load.deliveries()).items() if n > 1}
        assert res["redeliveries"] == 0, (res["redeliveries"], sorted(twice.items())[:10])
        assert newcomer == [], [g.value[:8] for g in newcomer[:10]]
        assert res["longest_stall_s"] <= STALL_S, (res["stalls"], res["windows"])
        assert alive, notes
        assert self.proxy.proc is not None and self.proxy.proc.returncode == 0, (
            self.proxy.proc.returncode,
            notes,
        )
        assert tracebacks == [], "".join(self.proxy.output[tracebacks[0] : tracebacks[0] + 40])
        return res

    def close(self) -> None:
        for lp in self.load.loops:
            if not lp.closed:
                lp.stop()
        if not self.load._stop.is_set():
            self.load._stop.set()
        self.proxy.stop()


@pytest.fixture
def runs(cluster3: ThreeNodeCluster) -> Iterator[list[Run]]:
    made: list[Run] = []
    yield made
    for run in made:
        run.close()


def test_a_partition_reassignment_moves_leaders_and_replicas_losing_and_redelivering_nothing(
    cluster3: ThreeNodeCluster, runs: list[Run]
) -> None:
    run = Run(cluster3, "reassign")
    runs.append(run)
    run.start()
    before = assignment(cluster3, run.topics)
    # 1. every partition's leader leaves its replicas: replication factor 3 -> 2, the leadership moves
    shrink = {k: [n for n in r if n != leader] for k, (r, leader, _i) in before.items()}
    run.load.fault("shrink (leader removed)", range(PARTITIONS))
    reassign(cluster3, shrink)
    shrink_s = wait_reassigned(cluster3, shrink)
    moved = assignment(cluster3, run.topics)
    assert all(moved[k][1] != before[k][1] for k in before), (before, moved)  # every leader moved
    time.sleep(SETTLE_S)
    # 2. and comes back as the preferred replica: 2 -> 3, its replica copied again, the leadership back
    grow = {k: [leader, *shrink[k]] for k, (_r, leader, _i) in before.items()}
    run.load.fault("grow (leader back first)", range(PARTITIONS))
    reassign(cluster3, grow)
    grow_s = wait_reassigned(cluster3, grow)
    back_s = wait_leaders(cluster3, {k: leader for k, (_r, leader, _i) in before.items()}, 60)
    run.load.fault("leaders back")
    time.sleep(SETTLE_S)
    run.finish(
        {
            "shrink reassignment done in": f"{shrink_s:.1f} s",
            "grow reassignment done in": f"{grow_s:.1f} s, preferred leaders back {back_s:.1f} s later",
        }
    )


def test_preferred_leader_elections_twice_in_a_row_lose_and_redeliver_nothing(
    cluster3: ThreeNodeCluster, runs: list[Run]
) -> None:
    run = Run(cluster3, "elect")
    runs.append(run)
    run.start()
    elected: dict[str, object] = {}
    for round_ in (1, 2):
        before = assignment(cluster3, run.topics)
        # the next replica becomes the preferred one; no data moves (the same three replicas)
        order = {k: [*r[1:], r[0]] for k, (r, _leader, _i) in before.items()}
        assert all(order[k][0] != leader for k, (_r, leader, _i) in before.items())
        reassign(cluster3, order)
        # at once: the cluster's own leader rebalance (every 10 s) would elect them too
        wait_reassigned(cluster3, order, listed=False)
        run.load.fault(f"election {round_}", range(PARTITIONS))
        errors = elect_preferred(cluster3, order)
        assert in_progress(cluster3) == []
        # ELECTION_NOT_NEEDED: the cluster's own leader rebalance (every 10 s) elected it first
        assert set(errors.values()) <= {None, "ELECTION_NOT_NEEDED"}, errors
        took = wait_leaders(cluster3, {k: r[0] for k, r in order.items()}, 60)
        elected[f"round {round_}: partitions the election moved"] = (
            f"{sum(e is None for e in errors.values())} of {len(errors)} (the rest by the cluster's "
            f"leader rebalance), all led by their preferred replica {took:.1f} s after"
        )
        time.sleep(SETTLE_S)
    run.finish(elected)


def test_a_broker_back_with_lagging_replicas_loses_and_rereads_nothing(
    cluster3: ThreeNodeCluster, runs: list[Run]
) -> None:
    run = Run(cluster3, "lagging", size=1024)
    runs.append(run)
    run.start()
    node = 2
    assert cluster3.wait_preferred_leaders(run.topics, 60)
    led = run.leading(node)
    state_led = [
        p for (t, p), (_r, leader, _i) in assignment(cluster3, [run.state_topic]).items() if leader == node
    ]
    run.load.fault(f"node {node} stopped (SIGTERM)", led)
    cluster3.stop_node(node)
    n = len(run.load.sent)
    run.load.burst(20_000)  # 20 MB its replicas miss
    run.load.wait_reported(n + 20_000, 120)
    run.load.fault(f"node {node} started", led)
    t_start = time.monotonic()
    cluster3.start_node(node)
    lagging = cluster3.under_replicated()
    in_sync = cluster3.wait_in_sync(120)
    caught_up_s = time.monotonic() - t_start
    assert in_sync, cluster3.under_replicated()
    assert cluster3.wait_preferred_leaders(run.topics, 60)
    run.load.fault(f"node {node}'s leaderships back", led)
    back_s = time.monotonic() - t_start
    time.sleep(SETTLE_S)
    run.finish(
        {
            "stopped node led": f"data partitions {led}, state partitions {state_led}",
            "partitions out of the ISR when it was back in the metadata": len(lagging),
            "in sync again": f"{caught_up_s:.1f} s after its start, leaderships back {back_s:.1f} s after",
        }
    )
