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

Each run reads the data topic directly from the cluster afterwards (every partition to its high
watermark) and asserts: every record of it is delivered, once (kshare redelivers nothing), and
every delivery is a record of it at that partition and offset with that value (a stale replica
serving old or other data would show as a delivery the log does not hold); every record the
producer's delivery reports acknowledged is in it where the report says; a fresh consumer of the
group gets nothing, through the same kshare and through a kshare started afresh on the moved state
topic after the first was SIGKILLed (the acknowledgements are durable); no stretch longer than
``STALL_S`` with records available and none delivered; the kshare process alive throughout, no
traceback in its log. Per-fault figures are printed (``pytest -s``).

A record the *producer* wrote twice (two offsets, one value) is two records here, each delivered
once. librdkafka's idempotent producer does write twice, rarely, when a leader moves: a request
behind one that met NOT_LEADER_OR_FOLLOWER meets OUT_OF_ORDER_SEQUENCE_NUMBER at the new leader,
the producer bumps its epoch, and a record of another partition whose first attempt was written
is written again (confluentinc/librdkafka#4953). The epoch bump is the client's, with or without
kshare: in four runs of this module with idempotence logs, the reassignment test's producer
through kshare bumped in three, the direct one (KIP-951 leader hints in its answers) in two, a
direct one asking for Produce versions without leader hints (as kshare asks the broker for
non-transactional Produce v9, kshare/proxy/filters.py) in one; the lagging-broker test's through
kshare once. Over 32 later reassignment runs: through kshare 10 runs with a bump and 4 with a
record written twice, directly 3 and 1, directly without hints 2 and 1 (docs/benchmarks/failover.md,
"Producers: a record written twice after a leader move"): the client's doing, made likelier
through kshare for a reason not established (kshare relays each connection's requests and answers
in order). Each run prints, for the producer
through kshare and the two direct controls, the records written twice and the epoch bumps of its
idempotence log (``debug=eos``, kept in the test's directory).

Why no redelivery at all: kshare keeps the share-partitions' state (what is acquired, by whom,
what is acknowledged) in the proxy, which none of these faults touches. No client connection to
kshare closes (a moved leader is a NOT_LEADER_OR_FOLLOWER and a Metadata round trip for the
client's own Fetch/Produce, an upstream reconnection for kshare's), so no member loses what it
acquired; a state write that meets a leader change is retried, not failed; the consumers take
each batch within milliseconds, far inside the 30 s acquisition lock. A redelivery would need a
state write failed past its retries (the share-partition rebuilt from durable state) or a lock
running out: both are failures here. Native Kafka, whose share-partition leader *is* the data
partition's leader, loses every in-flight acquisition when a leadership moves.

On the session's three-node cluster (``cluster3``, tests/conftest.py); opt-in (``KSHARE_FAILOVER_TESTS=1``):
about a minute each, on top of the cluster.
"""

from __future__ import annotations

import logging
import os
import signal
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import NewTopic

from kshare.bench.procs import ProxyProcess
from tests.harness.cluster import ThreeNodeCluster
from tests.harness.cluster_moves import (
    MovesLoad,
    Part,
    assignment,
    elect_preferred,
    epoch_bumps,
    histograms,
    in_progress,
    latency_between,
    reassign,
    report,
    wait_leaders,
    wait_reassigned,
    written_twice,
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


class Run:
    """One test's topic, kshare process (its own state topic) and load."""

    def __init__(self, cluster: ThreeNodeCluster, name: str, log_dir: Path, *, size: int = 256) -> None:
        self.cluster = cluster
        self.name = name
        # the session's cluster (tests/conftest.py): an earlier test may have restarted a node
        assert cluster.wait_in_sync(120), cluster.under_replicated()
        suffix = uuid.uuid4().hex[:8]
        self.topic, self.group, self.state_topic = (
            f"{name}-{suffix}",
            f"{name}-{suffix}",
            f"__kshare_{name}_{suffix}",
        )
        # the control: the same producer writing the same way to a topic of its own, directly
        # and another asking for Produce versions older than KIP-951's leader hints (as kshare
        # asks the broker for non-transactional Produce v9: the client learns a new leader from
        # NOT_LEADER_OR_FOLLOWER and a Metadata refresh, not from the answer)
        self.direct_topic, self.hintless_topic = f"{name}-direct-{suffix}", f"{name}-hintless-{suffix}"
        admin = cluster.admin()
        for t in (self.topic, self.direct_topic, self.hintless_topic):
            admin.create_topics([NewTopic(t, PARTITIONS, 3)])[t].result(30)
        assert cluster.wait_preferred_leaders([self.topic, self.direct_topic, self.hintless_topic], 60)
        self.proxy_args = [
            "--state-topic",
            self.state_topic,
            "--state-topic-partitions",
            str(STATE_PARTITIONS),
            "--state-topic-replication-factor",
            "3",
        ]
        self.log_dir = log_dir
        self.marks: list[tuple[str, dict[str, dict[float, float]]]] = []  # (fault, histograms then)
        self.restarted: ProxyProcess | None = None
        self.proxy = self.kshare("")
        self.proxy.start(120)
        assert cluster.wait_preferred_leaders([self.state_topic], 60)
        share_group(self.proxy.bootstrap, self.group)
        self.load = MovesLoad(
            self.proxy.bootstrap,
            self.topic,
            self.group,
            partitions=PARTITIONS,
            rate=RATE,
            size=size,
            producer_log=log_dir / "producer-through-kshare.log",
        )
        self.hintless = MovesLoad(
            cluster.bootstrap,
            self.hintless_topic,
            "",
            partitions=PARTITIONS,
            rate=RATE,
            size=size,
            consumers=0,
            producer_log=log_dir / "producer-direct-hintless.log",
            producer_conf={"api.version.request": False, "broker.version.fallback": "2.8.0"},
        )
        self.direct = MovesLoad(
            cluster.bootstrap,
            self.direct_topic,
            "",
            partitions=PARTITIONS,
            rate=RATE,
            size=size,
            consumers=0,
            producer_log=log_dir / "producer-direct.log",
        )

    def kshare(self, tag: str) -> ProxyProcess:
        """A ``kshare proxy`` process on the run's state topic, its log kept in the test's directory."""
        name = f"kshare-{self.name}{tag}"
        return ProxyProcess(
            self.cluster.bootstrap,
            self.proxy_args,
            name=name,
            keep_lines=None,
            log_path=self.log_dir / f"{name}.log",
        )

    @property
    def topics(self) -> list[str]:
        """The topics whose partitions the faults move: the data topic, kshare's state topic and
        the control producer's topic."""
        return [self.topic, self.state_topic, self.direct_topic, self.hintless_topic]

    def parts(self) -> list[Part]:
        return sorted(assignment(self.cluster, self.topics))

    def start(self) -> None:
        self.load.start_producer()
        self.direct.start_producer()
        self.hintless.start_producer()
        self.burst(PREFILL)
        self.load.wait_reported(PREFILL, 60)
        self.load.start_consumers()
        time.sleep(SETTLE_S)

    def burst(self, n: int) -> None:
        """``n`` more records at once, through kshare and (the control) directly."""
        self.load.burst(n)
        self.direct.burst(n)
        self.hintless.burst(n)

    def fault(self, name: str, partitions: Iterable[int] = ()) -> None:
        """A fault (or a step of one) begins now: its window in the timeline, and the proxy's
        latency histograms at its start (each window's state writes and ShareFetch answers)."""
        self.load.fault(name, partitions)
        self.marks.append((name, histograms(self.proxy.metrics_port)))

    def latencies(self) -> dict[str, str]:
        """Per window: the state writes and ShareFetch answers in it, and the slowest bucket."""
        marks = [*self.marks, ("end", histograms(self.proxy.metrics_port))]
        return {
            f"{what} latency, {name}": latency_between(before[what], after[what])
            for (name, before), (_n, after) in zip(marks, marks[1:], strict=False)
            for what in before
        }

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
            self.direct.stop_producer()
            self.hintless.stop_producer()
            load.wait_delivered(120)
            records = load.read_log(self.cluster.bootstrap)
            load.wait_delivered(30, records)  # a record the producer wrote twice is delivered twice
            time.sleep(2)  # the consumers' last acknowledgements go with their next poll or close
            t_end = time.monotonic()
        finally:
            stop_all(load.loops)
        newcomer = newcomer_gets(self.proxy.bootstrap, self.group, self.topic, NEWCOMER_S)
        metrics = self.proxy.metrics()
        latencies = self.latencies()
        res = load.analysis(t_end, records)
        producers = {
            "through kshare": (self.load, records),
            "directly": (self.direct, None),
            "directly, Produce without leader hints": (self.hintless, None),
        }
        duplicates = {}
        for what, (ld, recs) in producers.items():
            twice = written_twice(recs if recs is not None else ld.read_log(self.cluster.bootstrap))
            assert ld.producer_log is not None
            errseq, bumps = epoch_bumps(ld.producer_log)
            duplicates[what] = (
                f"{len(ld.reported)} acknowledged, {len(twice)} written twice "
                f"{dict(list(twice.items())[:3])}, {errseq} requests failed for skipped "
                f"sequence numbers, {bumps} epoch bumps ({ld.producer_log.name})"
            )
        figures = {
            **{f"idempotent producer {what}": text for what, text in duplicates.items()},
            "kshare_state_batches_resent_total": metrics.get("kshare_state_batches_resent_total", 0),
            "kshare_share_lock_timeouts_total": metrics.get("kshare_share_lock_timeouts_total", 0),
            "kshare log": self.proxy.log_path,
            "kshare warnings and errors": [line.split(" - ")[-1] for line in self.proxy.notes(20)],
            **latencies,
            **(extra or {}),
        }
        report(self.name, res, figures)
        alive = self.proxy.running
        # What the consumers were told is acknowledged is in the state topic, whose partitions
        # moved: a kshare started afresh on it (the first one SIGKILLed, nothing flushed) gives
        # a newcomer nothing either.
        self.proxy.stop(signal.SIGKILL)
        self.restarted = self.kshare("-restarted")
        self.restarted.start(120)
        newcomer_after_restart = newcomer_gets(self.restarted.bootstrap, self.group, self.topic, NEWCOMER_S)
        self.restarted.stop()
        outputs = [*self.proxy.output, *self.restarted.output]
        tracebacks = [i for i, line in enumerate(outputs) if "Traceback" in line]
        notes = self.proxy.notes(40)

        assert not load.failed, load.failed[:5]
        misplaced = load.acknowledged_not_in_log(records)
        assert misplaced == [], load.misplaced(records, misplaced[:5])
        assert res["lost"] == 0, [(k >> 40, k & (1 << 40) - 1) for k in res["lost_ids"]]
        assert load.not_in_log(records) == [], load.not_in_log(records)[:5]
        again = Counter((p, o) for _t, _rid, p, o, _v in load.deliveries())
        assert res["redeliveries"] == 0, (res["redeliveries"], [po for po, n in again.items() if n > 1][:10])
        assert newcomer == [], [g.value[:8] for g in newcomer[:10]]
        assert newcomer_after_restart == [], [g.value[:8] for g in newcomer_after_restart[:10]]
        assert res["longest_stall_s"] <= STALL_S, (res["stalls"], res["windows"])
        assert alive, notes
        assert self.restarted.proc is not None and self.restarted.proc.returncode == 0, self.restarted.notes(
            40
        )
        assert tracebacks == [], "".join(outputs[tracebacks[0] : tracebacks[0] + 40])
        return res

    def close(self) -> None:
        for lp in self.load.loops:
            if not lp.closed:
                lp.stop()
        self.load._stop.set()
        self.direct._stop.set()
        self.hintless._stop.set()
        self.proxy.stop()
        if self.restarted is not None:
            self.restarted.stop()


@pytest.fixture
def runs(cluster3: ThreeNodeCluster) -> Iterator[list[Run]]:
    made: list[Run] = []
    yield made
    for run in made:
        run.close()


def test_a_partition_reassignment_moves_leaders_and_replicas_losing_and_redelivering_nothing(
    cluster3: ThreeNodeCluster, runs: list[Run], tmp_path: Path
) -> None:
    run = Run(cluster3, "reassign", tmp_path)
    runs.append(run)
    run.start()
    before = assignment(cluster3, run.topics)
    # 1. every partition's leader leaves its replicas: replication factor 3 -> 2, the leadership moves
    shrink = {k: [n for n in r if n != leader] for k, (r, leader, _i) in before.items()}
    run.fault("shrink (leader removed)", range(PARTITIONS))
    reassign(cluster3, shrink)
    shrink_s = wait_reassigned(cluster3, shrink)
    moved = assignment(cluster3, run.topics)
    assert all(moved[k][1] != before[k][1] for k in before), (before, moved)  # every leader moved
    time.sleep(SETTLE_S)
    # 2. and comes back as the preferred replica: 2 -> 3, its replica copied again, the leadership back
    grow = {k: [leader, *shrink[k]] for k, (_r, leader, _i) in before.items()}
    run.fault("grow (leader back first)", range(PARTITIONS))
    reassign(cluster3, grow)
    grow_s = wait_reassigned(cluster3, grow)
    back_s = wait_leaders(cluster3, {k: leader for k, (_r, leader, _i) in before.items()}, 60)
    run.fault("leaders back", range(PARTITIONS))
    time.sleep(SETTLE_S)
    run.finish(
        {
            "shrink reassignment done in": f"{shrink_s:.1f} s",
            "grow reassignment done in": f"{grow_s:.1f} s, preferred leaders back {back_s:.1f} s later",
        }
    )


def test_preferred_leader_elections_twice_in_a_row_lose_and_redeliver_nothing(
    cluster3: ThreeNodeCluster, runs: list[Run], tmp_path: Path
) -> None:
    run = Run(cluster3, "elect", tmp_path)
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
        run.fault(f"election {round_}", range(PARTITIONS))
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
    cluster3: ThreeNodeCluster, runs: list[Run], tmp_path: Path
) -> None:
    run = Run(cluster3, "lagging", tmp_path, size=1024)
    runs.append(run)
    run.start()
    node = 2
    assert cluster3.wait_preferred_leaders(run.topics, 60)
    led = run.leading(node)
    state_led = [
        p for (t, p), (_r, leader, _i) in assignment(cluster3, [run.state_topic]).items() if leader == node
    ]
    run.fault(f"node {node} stopped (SIGTERM)", led)
    cluster3.stop_node(node)
    n = len(run.load.sent)
    run.burst(20_000)  # 20 MB its replicas miss (and as much of the control's)
    run.load.wait_reported(n + 20_000, 120)
    run.fault(f"node {node} started", led)
    t_start = time.monotonic()
    cluster3.start_node(node)
    lagging = cluster3.under_replicated()
    in_sync = cluster3.wait_in_sync(120)
    caught_up_s = time.monotonic() - t_start
    assert in_sync, cluster3.under_replicated()
    assert cluster3.wait_preferred_leaders(run.topics, 60)
    run.fault(f"node {node}'s leaderships back", led)
    back_s = time.monotonic() - t_start
    time.sleep(SETTLE_S)
    run.finish(
        {
            "stopped node led": f"data partitions {led}, state partitions {state_led}",
            "partitions out of the ISR when it was back in the metadata": len(lagging),
            "in sync again": f"{caught_up_s:.1f} s after its start, leaderships back {back_s:.1f} s after",
        }
    )
