"""Leadership by topic (issue 42, docs/design/scale-out.md "Balanced leadership"): three real
``kshare proxy`` processes of one instance group (leading by topic, the default) in front of
the session's Apache Kafka 3.9 broker.

Metadata through any proxy names a 4-partition topic's leaders 2/1/1 and a 12-partition topic's
4/4/4 over the three proxies; ShareConsumers bootstrapped from all three read every record once;
when a proxy leaves (SIGTERM), only the partitions it led move. A state topic written the way
proxies leading by state partition write it (each share-partition where its topic-partition
hashes) is found: the proxies leading by topic take each share-partition's state over from
wherever it is, and the group goes on from its start offsets.
"""

from __future__ import annotations

import asyncio
import collections
import signal
import time
import uuid

import pytest

from kshare.bench.ledgers import AckingConsumer, Ledger
from kshare.proxy.virtual import split_node
from tests.harness.brokers import KafkaBroker
from tests.harness.ledgers import GROUP_CONFIGS, describe_offsets, end_offsets, produce_fast
from tests.harness.scale_out import STATE_PARTITIONS, Member, Service, ledger_state, topic_id_of
from tests.harness.share import admin, share_group, wait_until


@pytest.fixture
def by_topic(monkeypatch: pytest.MonkeyPatch) -> None:
    # the default: no KSHARE_INSTANCE_LEADERSHIP for the proxies started here to inherit
    monkeypatch.delenv("KSHARE_INSTANCE_LEADERSHIP", raising=False)


def leaders(svc: Service, via: Member, topic: str, partitions: int) -> dict[int, int]:
    """partition -> index of the proxy whose listener Metadata through ``via`` names its leader."""
    md = admin(via.bootstrap).list_topics(topic, timeout=15)
    brokers = {b.id: b.port for b in md.brokers.values()}
    by_port = {p.listener_port: p.index for p in svc.proxies}
    parts = md.topics[topic].partitions
    assert sorted(parts) == list(range(partitions)), parts
    out = {}
    for i, part in parts.items():
        assert split_node(part.leader)[1] is not None
        out[i] = by_port[brokers[part.leader]]
    return out


def agreed_leaders(svc: Service, members: list[Member], topic: str, partitions: int,
                   timeout: float = 30.0) -> dict[int, int]:
    """The leaders every one of ``members`` names alike (waits for them to agree)."""
    seen: dict[int, dict[int, int]] = {}

    def agree() -> bool:
        seen.clear()
        seen.update({p.index: leaders(svc, p, topic, partitions) for p in members})
        return len({tuple(sorted(v.items())) for v in seen.values()}) == 1 and \
            set(next(iter(seen.values())).values()) <= {p.index for p in members}

    svc.wait(agree, timeout, f"the proxies to name the same leaders of {topic}", lambda: seen)
    return next(iter(seen.values()))


def split(lead: dict[int, int], members: list[Member]) -> list[int]:
    c = collections.Counter(lead.values())
    return sorted((c.get(p.index, 0) for p in members), reverse=True)


def consume_all(svc: Service, group: str, topic: str, ends: dict[int, int], timeout: float = 120.0) -> Ledger:
    """Three ShareConsumers bootstrapped from every proxy until every record is confirmed once."""
    ledger = Ledger()
    total = sum(ends.values())
    consumers = [AckingConsumer(i, svc.bootstrap, group, topic, ledger).start() for i in range(3)]
    try:
        svc.wait(lambda: len(ledger.confirmed) >= total, timeout, f"every record of {topic} confirmed",
                 lambda: ledger_state(ledger, ends))
        time.sleep(1.0)  # a redelivery of anything would show up
    finally:
        for c in consumers:
            c.stop()
    state = ledger_state(ledger, ends)
    assert state["distinct"] == total and state["deliveries"] == total, state  # every record, once
    return ledger


def test_leaders_split_per_topic_and_every_record_read_once(kafka39: KafkaBroker, by_topic: None) -> None:
    uid = uuid.uuid4().hex[:8]
    topics = {f"lead4-{uid}": 4, f"lead12-{uid}": 12}
    for topic, n in topics.items():
        kafka39.create_topic(topic, partitions=n)
        produce_fast(kafka39.bootstrap, topic, 100 * n, n)
    svc = Service(kafka39, "lead")
    try:
        svc.start()
        want = {4: [2, 1, 1], 12: [4, 4, 4]}
        before = {}
        for topic, n in topics.items():
            before[topic] = agreed_leaders(svc, svc.proxies, topic, n)
            assert split(before[topic], svc.proxies) == want[n], before[topic]
        read_to = {}
        for topic, n in topics.items():
            group = f"share-{topic}"
            share_group(svc.proxies[0].bootstrap, group, **GROUP_CONFIGS)
            ends = read_to[topic] = end_offsets(kafka39.bootstrap, topic, n)
            consume_all(svc, group, topic, ends)
            spso = describe_offsets(svc.proxies[1].bootstrap, group)
            assert spso == ends, (spso, ends)
        # the leaders did not move while the groups read (their reports keep them where they are)
        for topic, n in topics.items():
            assert agreed_leaders(svc, svc.proxies, topic, n) == before[topic]

        # a proxy leaves: only the partitions it led move, and the two left split each topic evenly
        gone = svc.proxies[2]
        gone.current.send_signal(signal.SIGTERM)
        assert gone.current.wait(30) == 0, gone.output()
        rest = svc.proxies[:2]
        for topic, n in topics.items():
            after = agreed_leaders(svc, rest, topic, n, timeout=60)
            assert all(after[p] == i for p, i in before[topic].items() if i != gone.index), (before[topic], after)
            assert split(after, rest) == [n // 2 + n % 2, n // 2], after
        # and what it held is served by the others: more records, read once, from where the groups were
        for topic, n in topics.items():
            group = f"share-{topic}"
            produce_fast(kafka39.bootstrap, topic, 50 * n, n)
            ends = end_offsets(kafka39.bootstrap, topic, n)
            # the state of what the leaving proxy led is taken over by the new leaders (also when
            # described before they serve it)
            start = describe_offsets(svc.proxies[0].bootstrap, group)
            assert start == read_to[topic], (start, read_to[topic])
            ledger = Ledger()
            consumers = [AckingConsumer(i, ",".join(p.bootstrap for p in rest), group, topic, ledger).start()
                         for i in range(2)]
            try:
                wanted = sum(ends[p] - read_to[topic][p] for p in ends)
                svc.wait(lambda lg=ledger, w=wanted: len(lg.confirmed) >= w, 120,
                         f"the new records of {topic} confirmed", lambda lg=ledger: ledger_state(lg))
                time.sleep(1.0)
            finally:
                for c in consumers:
                    c.stop()
            with ledger.lock:
                got = sorted((d.partition, d.offset) for d in ledger.deliveries)
            assert got == sorted((p, o) for p in ends for o in range(read_to[topic][p], ends[p])), topic
    finally:
        svc.stop()
    assert not svc.tracebacks(), svc.tracebacks()


def test_state_written_by_state_partition_leaders_is_taken_over(kafka39: KafkaBroker, by_topic: None) -> None:
    """The upgrade: a state topic as proxies leading by state partition leave it (here written by an
    instance-group store claiming every state partition, each share-partition where its
    topic-partition hashes, as they write it) is read by proxies leading by topic: each
    share-partition's state moves to its leader, and the group reads on from its start offsets."""
    from kshare.share.state.codec import partition_for
    from kshare.share.state.topic_store import TopicStateStore
    from kshare.share.states import ShareSnapshot
    from kshare.share.store import GroupRecord, SharePartitionKey

    uid = uuid.uuid4().hex[:8]
    topic, n = f"upgrade-{uid}", 4
    kafka39.create_topic(topic, partitions=n)
    produce_fast(kafka39.bootstrap, topic, 100 * n, n)
    tid = topic_id_of(kafka39, topic)
    group = f"share-upgrade-{uid}"
    svc = Service(kafka39, "upgrade")
    starts = {p: 40 + p for p in range(n)}  # acknowledged up to here before the upgrade

    async def write_old_layout() -> set[int]:
        store = TopicStateStore([kafka39.bootstrap], topic=svc.state_topic, partitions=STATE_PARTITIONS,
                                transactional_prefix=f"kshare-state.{svc.instance_group}.{svc.state_topic}.",
                                write_timeout_s=20)
        await store.start()
        try:
            await store.claim(list(range(STATE_PARTITIONS)))
            keys = [SharePartitionKey(group, tid, p) for p in range(n)]
            await store.write([(k, ShareSnapshot(starts[k.partition], ())) for k in keys])
            await store.write_group(GroupRecord(group, 1, {"share.auto.offset.reset": "earliest"}, {tid: topic},
                                                {tid: n}))
            assert all(store.partition_of(k) == partition_for(k, STATE_PARTITIONS) for k in keys)
            return {store.partition_of(k) for k in keys}
        finally:
            await store.close()

    old_partitions = asyncio.run(write_old_layout())
    try:
        svc.start()
        lead = agreed_leaders(svc, svc.proxies, topic, n)
        assert split(lead, svc.proxies) == [2, 1, 1], lead
        ends = end_offsets(kafka39.bootstrap, topic, n)
        ledger = Ledger()
        consumers = [AckingConsumer(i, svc.bootstrap, group, topic, ledger).start() for i in range(3)]
        try:
            wanted = sum(ends[p] - starts[p] for p in ends)
            svc.wait(lambda: len(ledger.confirmed) >= wanted, 120, "the records past the old start offsets",
                     lambda: ledger_state(ledger))
            time.sleep(1.0)
        finally:
            for c in consumers:
                c.stop()
        with ledger.lock:
            got = sorted((d.partition, d.offset) for d in ledger.deliveries)
        # nothing below the start offsets written before the upgrade, everything above, once
        assert got == sorted((p, o) for p in ends for o in range(starts[p], ends[p]))
        wait_until(lambda: describe_offsets(svc.proxies[0].bootstrap, group) == ends, 30, "SPSOs at the end")
    finally:
        svc.stop()
    assert old_partitions  # the old layout was really written somewhere
    assert not svc.tracebacks(), svc.tracebacks()
