"""The state-copy exchange between proxies leading by topic, coalesced (kshare.share.copy_exchange;
docs/design/scale-out.md "The state follows its leader"): three real ``kshare proxy`` processes of
one instance group in front of the session's Apache Kafka 3.9 broker, one group reading a
60-partition topic.

Before a leader first serves a share-partition at a map epoch it asks every other proxy for its
copy, and tells the holders of older copies to drop them. One request per share-partition and
peer made a group starting on many partitions send as many requests to each proxy; the
confirmations one ShareFetch (or several members' fetches) starts together now go in one request
per peer, group and epoch. Counted by ``kshare_instance_state_exchange_{requests,partitions}_total``
(the share-partitions carried are what one request each used to send), at the group's start on
the three and after a rebalance (a proxy leaves with SIGTERM: the two left take over what it led),
while every record is read once from where the group was.
"""

from __future__ import annotations

import signal
import time
import uuid

import pytest

from kshare.bench.ledgers import AckingConsumer, Ledger
from tests.harness.brokers import KafkaBroker
from tests.harness.ledgers import GROUP_CONFIGS, end_offsets, produce_fast
from tests.harness.scale_out import Member, Service, ledger_state
from tests.harness.share import share_group

PARTITIONS = 60


@pytest.fixture
def by_topic(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KSHARE_INSTANCE_LEADERSHIP", raising=False)  # the default: leading by topic


def exchanged(p: Member) -> dict[str, float]:
    """What ``p`` sent the others: requests and share-partitions, by request (read, drop)."""
    out = {}
    for what in ("requests", "partitions"):
        for labels, value in p.samples(f"kshare_instance_state_exchange_{what}_total"):
            out[f"{labels['request']}_{what}"] = value
    return out


def total(counts: list[dict[str, float]], key: str) -> float:
    return sum(c.get(key, 0.0) for c in counts)


def read_once(
    svc: Service, members: list[Member], group: str, topic: str, start: dict[int, int], ends: dict[int, int]
) -> None:
    """Consumers through ``members`` until every record from ``start`` to ``ends`` is confirmed, each once."""
    ledger = Ledger()
    bootstrap = ",".join(p.bootstrap for p in members)
    consumers = [AckingConsumer(i, bootstrap, group, topic, ledger).start() for i in range(len(members))]
    wanted = sum(ends[p] - start.get(p, 0) for p in ends)
    try:
        svc.wait(
            lambda: len(ledger.confirmed) >= wanted,
            120,
            f"the records of {topic} confirmed",
            lambda: ledger_state(ledger),
        )
        time.sleep(1.0)  # a redelivery would show up
    finally:
        for c in consumers:
            c.stop()
    with ledger.lock:
        got = sorted((d.partition, d.offset) for d in ledger.deliveries)
    assert got == sorted((p, o) for p in ends for o in range(start.get(p, 0), ends[p]))


def test_confirmations_of_many_partitions_go_in_few_requests(kafka39: KafkaBroker, by_topic: None) -> None:
    uid = uuid.uuid4().hex[:8]
    topic, group = f"exchange-{uid}", f"share-exchange-{uid}"
    kafka39.create_topic(topic, partitions=PARTITIONS)
    produce_fast(kafka39.bootstrap, topic, 5 * PARTITIONS, PARTITIONS)
    svc = Service(kafka39, "exchange")
    report = {}
    try:
        svc.start()
        share_group(svc.proxies[0].bootstrap, group, **GROUP_CONFIGS)
        first = end_offsets(kafka39.bootstrap, topic, PARTITIONS)
        read_once(svc, svc.proxies, group, topic, {}, first)
        start = [exchanged(p) for p in svc.proxies]
        report["start"] = start

        gone, rest = svc.proxies[2], svc.proxies[:2]
        gone.current.send_signal(signal.SIGTERM)
        assert gone.current.wait(30) == 0, gone.output()
        svc.wait_balanced(rest, 60)
        before = [exchanged(p) for p in rest]
        produce_fast(kafka39.bootstrap, topic, 5 * PARTITIONS, PARTITIONS)
        ends = end_offsets(kafka39.bootstrap, topic, PARTITIONS)
        read_once(svc, rest, group, topic, first, ends)
        after = [exchanged(p) for p in rest]
        moved = [{k: a.get(k, 0.0) - b.get(k, 0.0) for k in a} for a, b in zip(after, before, strict=True)]
        report["after the rebalance"] = moved
    finally:
        svc.stop()
    print("exchange:", report)
    # At the start every proxy confirms the share-partitions it leads (a third each) with both
    # others: 2 x 60 questions in all, once each, one request each before they were coalesced
    assert total(start, "read_partitions") >= 2 * PARTITIONS, report
    assert total(start, "read_requests") <= total(start, "read_partitions") / 4, report
    # After the rebalance the two left confirm what the third led (20) with each other, some of
    # them taken over (copies moved, older ones dropped). Fewer go together here: members' fetches
    # come one by one to their new leaders (2-4 requests in 5 runs)
    assert total(moved, "read_partitions") >= PARTITIONS // 3, report
    assert total(moved, "read_requests") <= total(moved, "read_partitions") / 3, report
    assert total(moved, "drop_requests") <= total(moved, "drop_partitions"), report
    assert not svc.tracebacks(), svc.tracebacks()
