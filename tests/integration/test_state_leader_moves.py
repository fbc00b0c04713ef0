"""State writes meeting leader moves of several state partitions at once are answered promptly.

Slow (~60 s: a 2-broker Kafka 3.9 cluster of its own, two preferred leader elections). The state
topic's producer (:class:`kshare.share.state.pipelined_producer.PipelinedProducer`) writes to two
partitions led by different brokers while both leaderships move together (replicas reordered with
Kafka's ``kafka-reassign-partitions``, then ElectLeaders(PREFERRED)): each partition's batches in
flight are refused with NOT_LEADER_OR_FOLLOWER and sent again to its new leader, and the records
queued meanwhile wait behind them (held) and go right after.

Before (issue 40), the records held for every partition but the last one routed were left held:
they went out only with that partition's next refused batch, at the next leader move (seconds
later: a 10 s stall of every share-partition in the three-node reassignment test, since a
share-partition's next write waits for its last) or never (the store's write timeout, 30 s, and a
share-partition rebuilt from the state topic). Every write here must be acknowledged within
``ANSWER_S`` of being queued, in order, each partition's records at consecutive offsets.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, ElectionType, TopicPartition
from confluent_kafka.admin import AdminClient

from kshare.share.state.pipelined_producer import PipelinedProducer
from tests.harness.cluster import KafkaCluster
from tests.harness.cluster_moves import reassign
from tests.harness.share import quiet_logger

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]

ANSWER_S = 8.0  # the longest a write may wait for its acknowledgement (a leader move: 0.1-5.4 s here)
ROUNDS = 2  # leader moves of both partitions; an answer held back past one would wait for the next
BETWEEN_S = 2.0 * ANSWER_S  # writing goes on this long after each move: a held write shows as late


class _Cluster:
    """The two-broker cluster as the reassignment helpers want it (version, bootstrap, admin)."""

    def __init__(self, cluster: KafkaCluster) -> None:
        self.version = cluster.version
        self.bootstrap = cluster.bootstrap
        self._cluster = cluster

    def admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.bootstrap, "logger": quiet_logger()})


@pytest.fixture(scope="module")
def cluster2() -> Iterator[KafkaCluster]:
    with KafkaCluster() as cluster:
        yield cluster


def _leaders(cluster: _Cluster, topic: str) -> dict[int, int]:
    md = cluster.admin().list_topics(topic=topic, timeout=10)
    return {p: pm.leader for p, pm in md.topics[topic].partitions.items()}


def _swap_leaders(cluster: _Cluster, topic: str) -> dict[int, int]:
    """Both partitions' preferred replicas swapped, then elected at once; the new leaders."""
    now = _leaders(cluster, topic)
    order = {(topic, p): [2, 1] if leader == 1 else [1, 2] for p, leader in now.items()}
    reassign(cluster, order)  # type: ignore[arg-type]
    wanted = {p: r[0] for (_t, p), r in order.items()}
    admin = cluster.admin()
    deadline = time.monotonic() + 60
    while True:
        # ElectLeaders until both are led by their new preferred replica (the reordering may not
        # have reached the controller at the first call: ELECTION_NOT_NEEDED then)
        admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition(topic, p) for p in wanted]).result(40)
        if _leaders(cluster, topic) == wanted:
            return wanted
        assert time.monotonic() < deadline, f"leaders {_leaders(cluster, topic)}, wanted {wanted}"
        time.sleep(0.2)


def _read(bootstrap: str, topic: str, partitions: int) -> dict[int, list[bytes]]:
    """Each partition's record values in offset order, read directly from the cluster."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"read-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "logger": quiet_logger(),
        }
    )
    try:
        ends = {
            p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)
        }
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        out: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(partitions)}
        deadline = time.monotonic() + 60
        while any(len(out[p]) < n for p, n in ends.items()):
            assert time.monotonic() < deadline, {p: (len(v), ends[p]) for p, v in out.items()}
            for m in c.consume(1000, 0.5):
                if m.error() is None:
                    out[m.partition()].append((m.offset(), m.value()))
        return {p: [v for _o, v in sorted(recs)] for p, recs in out.items()}
    finally:
        c.close()


def test_writes_queued_behind_batches_sent_again_to_several_new_leaders_are_answered_promptly(
    cluster2: KafkaCluster,
) -> None:
    cluster = _Cluster(cluster2)
    topic = cluster2.create_topic(f"__kshare_moves_{uuid.uuid4().hex[:8]}", [[1, 2], [2, 1]])
    answered: list[tuple[int, int, float, float, Any]] = []  # (partition, i, queued, answered, outcome)
    resent = 0

    def count_resend() -> None:
        nonlocal resent
        resent += 1

    async def run() -> list[dict[int, int]]:
        producer = PipelinedProducer(cluster.bootstrap.split(","), topic, on_resend=count_resend)
        await producer.start()
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        futures: list[asyncio.Future] = []

        def settled(p: int, i: int, queued: float, fut: asyncio.Future) -> None:
            outcome = fut.exception() if not fut.cancelled() else "cancelled"
            answered.append((p, i, queued, time.monotonic(), outcome or fut.result().offset))

        async def write() -> None:
            i = 0
            while not stop.is_set():
                for p in (0, 1):
                    queued = time.monotonic()
                    fut = producer.enqueue(topic, value=b"%d:%08d" % (p, i), partition=p)
                    fut.add_done_callback(lambda f, p=p, i=i, t=queued: settled(p, i, t, f))
                    futures.append(fut)
                i += 1
                await asyncio.sleep(0.002)

        writer = loop.create_task(write())
        moves = []
        try:
            await asyncio.sleep(1.0)
            for _ in range(ROUNDS):
                moves.append(await asyncio.to_thread(_swap_leaders, cluster, topic))
                await asyncio.sleep(BETWEEN_S)
        finally:
            stop.set()
            await writer
            # every write is answered (within ANSWER_S of its queueing, checked below), or the
            # test says which were not
            await asyncio.wait(futures, timeout=3 * ANSWER_S)
            await producer.stop()
        return moves

    moves = asyncio.run(run())
    sent = {(p, i) for p, i, *_ in answered}
    assert len(answered) == len(sent)
    failed = [(p, i, o) for p, i, _q, _a, o in answered if not isinstance(o, int)]
    assert failed == [], failed[:5]
    late = sorted(((round(a - q, 2), p, i) for p, i, q, a, _o in answered if a - q > ANSWER_S), reverse=True)
    # records never answered: still held when the test gave up on them
    total = max((i for _p, i, *_ in answered), default=-1) + 1
    unanswered = [(p, i) for p in (0, 1) for i in range(total) if (p, i) not in sent]
    assert unanswered == [] and late == [], (
        f"{len(unanswered)} writes never answered {unanswered[:5]}, {len(late)} answered after more than "
        f"{ANSWER_S} s {late[:5]} (leader moves {moves}, {resent} batches sent again)"
    )
    assert resent > 0, "no batch met a moved leader: the moves did not happen under the writes"
    # in order, each partition's records at consecutive offsets from 0, each once
    log = _read(cluster.bootstrap, topic, 2)
    for p in (0, 1):
        assert log[p] == [b"%d:%08d" % (p, i) for i in range(total)], (p, len(log[p]), total)
    offsets = {p: sorted(o for q, _i, _q, _a, o in answered if q == p) for p in (0, 1)}
    assert offsets == {p: list(range(total)) for p in (0, 1)}
