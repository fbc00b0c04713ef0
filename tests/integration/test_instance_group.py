"""Several proxies split ownership through a consumer group on a real Apache Kafka 3.9.

The membership alone (``kshare.share.instance_group``), without proxies around it: every state
partition has exactly one owner, every member sees the same map, and a member that leaves hands
its partitions to the others at once (LeaveGroup, no session timeout).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from kshare.share.instance_group import InstanceGroup
from kshare.share.ownership import Instance, OwnershipMap
from tests.harness.brokers import KafkaBroker

PARTITIONS = 6


class Member:
    def __init__(self, kafka: KafkaBroker, name: str, topic: str, port: int) -> None:
        self.changes: list[tuple[int, list[int], list[int]]] = []
        self.group = InstanceGroup([kafka.bootstrap], name, topic,
                                   Instance(uuid.uuid4().hex, "127.0.0.1", port, {1: port + 1}),
                                   self._changed, session_timeout_ms=6000, heartbeat_interval_ms=300)

    def _changed(self, m: OwnershipMap, gained: list[int], lost: list[int]) -> None:
        self.changes.append((m.epoch, gained, lost))


async def settled(members: list[Member], timeout: float = 30.0) -> OwnershipMap:
    """Until every member holds the same map and it gives each state partition to one of them."""
    deadline = time.monotonic() + timeout
    while True:
        maps = [m.group.map for m in members]
        if all(maps) and len({mp.encode() for mp in maps}) == 1:
            mp = maps[0]
            ids = {m.group.me.id for m in members}
            owned = sorted(p for m in members for p in m.group.owned)
            if {i.id for i in mp.instances} == ids and owned == list(range(PARTITIONS)):
                return mp
        assert time.monotonic() < deadline, [m.group.owned for m in members]
        await asyncio.sleep(0.1)


def test_three_members_split_then_one_leaves(kafka39: KafkaBroker) -> None:
    topic = f"state-{uuid.uuid4().hex[:8]}"
    kafka39.create_topic(topic, PARTITIONS)
    name = f"ig-{uuid.uuid4().hex[:8]}"

    async def main() -> None:
        members = [Member(kafka39, name, topic, 20000 + 10 * i) for i in range(3)]
        await asyncio.gather(*(m.group.start() for m in members))
        try:
            mp = await settled(members)
            assert sorted(len(m.group.owned) for m in members) == [2, 2, 2]
            assert len({m.group.me.slot for m in members}) == 3  # slots distinct, given by the leader
            for m in members:  # the map names every member's listeners, as it said at join
                inst = mp.instance(m.group.me.id)
                assert inst is not None and (inst.port, inst.broker_ports) == (m.group.me.port, {1: m.group.me.port + 1})
            before = {m.group.me.id: list(m.group.owned) for m in members}
            slots = {m.group.me.id: m.group.me.slot for m in members}

            gone = members.pop()
            started = time.monotonic()
            await gone.group.stop()
            mp2 = await settled(members, timeout=10)
            took = time.monotonic() - started
            assert took < 6, f"hand-over took {took:.1f} s: the leaving member should not wait out a session"
            assert mp2.epoch > mp.epoch
            for m in members:  # the survivors kept what they had and took the rest
                assert set(before[m.group.me.id]) <= set(m.group.owned)
                assert m.group.me.slot == slots[m.group.me.id]
                assert m.changes[-1][2] == []  # lost nothing
        finally:
            for m in members:
                await m.group.stop()

    asyncio.run(main())


def test_a_new_owner_fences_the_previous_one(kafka39: KafkaBroker) -> None:
    """Two claims of one state partition with the same transactional id, as an old and a new
    owner, each writing through a pipelined producer of its own: once the new one claimed, the
    old one's writes are refused by the partition's leader (it learns it was fenced, and its
    renewal is refused by the coordinator too), and a replay sees exactly what was acknowledged,
    each owner's records after its claim record."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from kshare.share.state.claims import decode_claim, is_claim
    from kshare.share.state.fence import Fenced, PartitionClaim
    from kshare.share.state.pipelined_producer import PipelinedProducer

    topic = f"state-{uuid.uuid4().hex[:8]}"
    kafka39.create_topic(topic, 2)
    txid = f"kshare-test.{topic}.1"

    async def write(claim: PartitionClaim, value: bytes) -> int:
        fut = claim.producer.enqueue(topic, value=value, key=b"k", partition=1)
        try:
            return (await fut).offset
        except Exception as exc:
            claim.write_failed(exc)
            raise

    async def main() -> list[bytes]:
        producers = [PipelinedProducer([kafka39.bootstrap], topic, claims=True, request_timeout_s=20) for _ in range(2)]
        for p in producers:
            await p.start()
        old, new = (PartitionClaim([kafka39.bootstrap], topic, 1, txid, p, ownership_epoch=e, timeout_s=20)
                    for p, e in zip(producers, (1, 2), strict=True))
        try:
            await old.start()
            await write(old, b"old-1")
            await write(old, b"old-2")
            await new.start()  # takes the partition over
            assert new.producer_id == old.producer_id and new.producer_epoch == old.producer_epoch + 1
            try:
                await write(old, b"old-3")
                raise AssertionError("the old owner's write went through after the take-over")
            except Exception as exc:  # noqa: BLE001 - the broker's refusal
                assert getattr(exc, "error_code", None) == 47, exc  # INVALID_PRODUCER_EPOCH
            assert old.fenced
            try:
                await old.renew()
                raise AssertionError("a fenced owner renewed its claim")
            except Fenced:
                pass
            await write(new, b"new-1")
            epoch = new.producer_epoch
            await new.renew()  # nobody claimed meanwhile: granted, a new epoch
            assert new.producer_epoch == epoch + 1 and not new.fenced
            await write(new, b"new-2")
        finally:
            for p in producers:
                await p.stop()
        consumer = AIOKafkaConsumer(bootstrap_servers=kafka39.bootstrap, isolation_level="read_committed",
                                    enable_auto_commit=False, auto_offset_reset="earliest")
        await consumer.start()
        try:
            tp = TopicPartition(topic, 1)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            end = (await consumer.end_offsets([tp]))[tp]
            values: list[bytes] = []
            while await consumer.position(tp) < end:
                for recs in (await consumer.getmany(tp, timeout_ms=1000)).values():
                    values += [f"claim{decode_claim(r.key, r.value).ownership_epoch}".encode() if is_claim(r.key)
                               else r.value for r in recs]
            return values
        finally:
            await consumer.stop()

    assert asyncio.run(main()) == [b"claim1", b"old-1", b"old-2", b"claim2", b"new-1", b"claim2", b"new-2"]


def test_a_store_claims_partitions_and_fences_the_previous_owner(kafka39: KafkaBroker) -> None:
    """Two instance-group stores over one state topic. A claims both partitions and writes
    state; B claims partition 1: it replays what A committed there, A's next write to it fails
    (fenced, and A is told), A's writes to partition 0 go on, and after A releases partition 1 it
    no longer holds that state."""
    from kshare.share.state.codec import partition_for
    from kshare.share.state.errors import StateWriteError
    from kshare.share.state.topic_store import TopicStateStore
    from kshare.share.states import ShareSnapshot
    from kshare.share.store import GroupRecord, SharePartitionKey

    topic = f"state-{uuid.uuid4().hex[:8]}"
    prefix = f"kshare-test.{topic}."
    tid = uuid.uuid4().bytes
    keys = {}
    for p in range(40):  # one share-partition key per state partition
        key = SharePartitionKey("g", tid, p)
        keys.setdefault(partition_for(key, 2), key)
    assert set(keys) == {0, 1}

    def store() -> TopicStateStore:
        return TopicStateStore([kafka39.bootstrap], topic=topic, partitions=2, transactional_prefix=prefix,
                               write_timeout_s=20)

    async def main() -> None:
        a, b = store(), store()
        a.leader_epoch, b.leader_epoch = 1, 2  # ownership epochs: b claims after a
        fenced: list[int] = []
        a.on_fenced = fenced.append
        await a.start()
        await b.start()
        try:
            await a.claim([0, 1])
            assert a.claimed() == [0, 1]
            await a.write([(keys[0], ShareSnapshot(10, ())), (keys[1], ShareSnapshot(20, ()))])
            await a.write_group(GroupRecord("g", 3))
            await a.write([(keys[1], ShareSnapshot(21, ()))])

            await b.claim([1])
            assert b.share_partition(keys[1]) == ShareSnapshot(21, ())
            assert b.share_partition(keys[0]) is None  # not its partition
            try:
                await a.write([(keys[1], ShareSnapshot(22, ()))])
                raise AssertionError("a fenced owner wrote")
            except StateWriteError:
                pass
            assert fenced == [1]
            await a.write([(keys[0], ShareSnapshot(11, ()))])  # its other partition is still its own
            await a.release([1])
            assert a.claimed() == [0] and a.share_partition(keys[1]) is None
            await b.write([(keys[1], ShareSnapshot(23, ()))])
        finally:
            await a.close()
            await b.close()
        # a third store claiming everything sees what was acknowledged, nothing of the refused write
        c = store()
        c.leader_epoch = 3
        await c.start()
        try:
            await c.claim([0, 1])
            assert c.share_partition(keys[0]) == ShareSnapshot(11, ())
            assert c.share_partition(keys[1]) == ShareSnapshot(23, ())
            assert c.load_stats.fenced_out == 0 and c.load_stats.skipped == 0
        finally:
            await c.close()

    asyncio.run(main())


def test_a_zombie_with_writes_in_flight_loses_nothing_it_was_told_was_written(kafka39: KafkaBroker) -> None:
    """Owner A writes one state partition from 8 writers (many rounds in flight) while B claims it:
    A's writes from then on are refused (A learns it was fenced), and for every share-partition B
    replayed exactly the last write A was told succeeded; a later replay agrees with B."""
    from kshare.share.state.codec import partition_for
    from kshare.share.state.errors import StateWriteError
    from kshare.share.state.topic_store import TopicStateStore
    from kshare.share.states import ShareSnapshot
    from kshare.share.store import SharePartitionKey

    topic = f"state-{uuid.uuid4().hex[:8]}"
    prefix = f"kshare-test.{topic}."
    tid = uuid.uuid4().bytes
    keys = [k for k in (SharePartitionKey("g", tid, i) for i in range(64)) if partition_for(k, 2) == 0][:8]
    assert len(keys) == 8

    def store(epoch: int) -> TopicStateStore:
        s = TopicStateStore([kafka39.bootstrap], topic=topic, partitions=2, transactional_prefix=prefix,
                            write_timeout_s=20)
        s.leader_epoch = epoch
        return s

    async def main() -> None:
        a, b = store(1), store(2)
        fenced: list[int] = []
        a.on_fenced = fenced.append
        await a.start()
        await b.start()
        acked: dict[SharePartitionKey, int] = {}
        refused = 0
        stop = asyncio.Event()

        async def writer(key: SharePartitionKey) -> None:
            nonlocal refused
            n = 0
            while not stop.is_set() and 0 not in a.fenced_partitions():
                n += 1
                try:
                    await a.write([(key, ShareSnapshot(n, ()))])
                    acked[key] = n
                except StateWriteError:
                    refused += 1
                    await asyncio.sleep(0.01)

        try:
            await a.claim([0])
            tasks = [asyncio.create_task(writer(k)) for k in keys]
            await asyncio.sleep(1.0)
            before = dict(acked)
            await b.claim([0])  # while a writes
            await asyncio.sleep(0.5)
            stop.set()
            await asyncio.gather(*tasks)
            assert fenced == [0] and refused > 0, (fenced, refused)
            assert all(acked[k] > before.get(k, 0) for k in keys)  # a wrote during the claim
            assert {k: b.share_partition(k) for k in keys} == {k: ShareSnapshot(acked[k], ()) for k in keys}
        finally:
            await a.close()
            await b.close()
        c = store(3)
        await c.start()
        try:
            await c.claim([0])
            assert {k: c.share_partition(k) for k in keys} == {k: ShareSnapshot(acked[k], ()) for k in keys}
            assert c.load_stats.fenced_out == 0
        finally:
            await c.close()

    asyncio.run(main())


def _one_state_partition() -> tuple[str, Any, int]:
    """A fresh state topic's name (2 partitions), a share-partition key and its state partition."""
    from kshare.share.state.codec import partition_for
    from kshare.share.store import SharePartitionKey

    key = SharePartitionKey("g", uuid.uuid4().bytes, 0)
    return f"state-{uuid.uuid4().hex[:8]}", key, partition_for(key, 2)


def _claiming_store(kafka39: KafkaBroker, topic: str, epoch: int) -> Any:
    """An instance group's store of ``topic`` (it claims the partitions it writes) at ownership ``epoch``."""
    from kshare.share.state.topic_store import TopicStateStore

    s = TopicStateStore([kafka39.bootstrap], topic=topic, partitions=2, transactional_prefix=f"kshare-test.{topic}.",
                        write_timeout_s=20)
    s.leader_epoch = epoch
    return s


def test_replay_keeps_out_what_the_broker_did_not_fence(kafka39: KafkaBroker) -> None:
    """Where the broker's fencing does not hold (the coordinator gave the transactional id a new
    producer id after it expired, or the leader forgot the old one), a write of the previous owner
    lands after the new owner's claim record. Played here by a zombie writing with a producer id
    of its own: the broker accepts it, and a replay still keeps it out of the state (claims.ClaimGuard)."""
    from kshare.share.state.codec import (
        RECORD_SNAPSHOT,
        encode_share_key,
        encode_snapshot_value,
    )
    from kshare.share.state.pipelined_producer import PipelinedProducer
    from kshare.share.state.topic_store import TopicStateStore
    from kshare.share.states import ShareSnapshot

    topic, key, p = _one_state_partition()

    def store(epoch: int) -> TopicStateStore:
        return _claiming_store(kafka39, topic, epoch)

    async def main() -> None:
        a, b = store(1), store(2)
        await a.start()
        await b.start()
        zombie = PipelinedProducer([kafka39.bootstrap], topic, request_timeout_s=20)  # an unfenced producer id
        await zombie.start()
        try:
            await a.claim([p])
            await a.write([(key, ShareSnapshot(10, ()))])
            await b.claim([p])
            assert b.share_partition(key) == ShareSnapshot(10, ())
            stale = encode_snapshot_value(0, 0, 1, ShareSnapshot(99, ()))  # what a, epoch 1, would write
            await (await zombie.send(topic, value=stale, key=encode_share_key(RECORD_SNAPSHOT, key), partition=p))
            await b.write([(key, ShareSnapshot(11, ()))])
            await zombie.send(topic, value=stale, key=encode_share_key(RECORD_SNAPSHOT, key), partition=p)
            await zombie.stop()  # sends it first
        finally:
            await a.close()
            await b.close()
        c = store(3)
        await c.start()
        try:
            await c.claim([p])
            assert c.share_partition(key) == ShareSnapshot(11, ())
            assert c.load_stats.fenced_out == 2
        finally:
            await c.close()

    asyncio.run(main())


def test_state_survives_a_full_restart_of_the_group_and_a_single_proxy_after_it(kafka39: KafkaBroker) -> None:
    """The ownership epochs of an instance group start again at 1 once every proxy of it stopped,
    so a claim record can follow one of a higher epoch; and a proxy without an instance group
    writes leader epoch 0 and no claim. Neither may be taken for a zombie on the next replay: the
    latest claim in the log counts (claims.ClaimGuard), epoch 0 is always state. Before, the
    state written after a full restart, or by a single proxy after the group, was ignored by the
    next replay (the state went back to what the group's last life wrote)."""
    from kshare.share.state.topic_store import TopicStateStore
    from kshare.share.states import ShareSnapshot

    topic, key, p = _one_state_partition()

    def member(epoch: int) -> TopicStateStore:
        return _claiming_store(kafka39, topic, epoch)

    async def life(store: TopicStateStore, expect: ShareSnapshot | None, write: ShareSnapshot) -> None:
        await store.start()
        try:
            if store.claims:
                await store.claim([p])
            assert store.share_partition(key) == expect
            await store.write([(key, write)])
        finally:
            await store.close()

    async def main() -> None:
        await life(member(7), None, ShareSnapshot(10, ()))  # the group's first life, epoch 7 by then
        await life(member(1), ShareSnapshot(10, ()), ShareSnapshot(11, ()))  # every proxy restarted
        await life(member(1), ShareSnapshot(11, ()), ShareSnapshot(12, ()))  # and again
        single = TopicStateStore([kafka39.bootstrap], topic=topic, partitions=2, write_timeout_s=20)
        await life(single, ShareSnapshot(12, ()), ShareSnapshot(13, ()))  # scaled down to one proxy
        await life(member(1), ShareSnapshot(13, ()), ShareSnapshot(14, ()))  # and back to a group
        last = TopicStateStore([kafka39.bootstrap], topic=topic, partitions=2, write_timeout_s=20)
        await last.start()
        try:
            assert last.share_partition(key) == ShareSnapshot(14, ())
            assert last.load_stats.fenced_out == 0
        finally:
            await last.close()

    asyncio.run(main())


def test_claims_are_renewed_on_time_and_after_a_failed_write(kafka39: KafkaBroker) -> None:
    """An idle owner renews its claims (a new epoch and a claim record, so neither the coordinator
    nor the leader forgets them), at the interval derived from the brokers' expiration configs
    (read with DescribeConfigs: a per-broker producer.id.expiration.ms of 2 days makes it 12 h)."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    from kshare.share.state.codec import partition_for
    from kshare.share.state.topic_store import TopicStateStore
    from kshare.share.states import ShareSnapshot, ShareUpdate
    from kshare.share.store import SharePartitionKey

    topic = f"state-{uuid.uuid4().hex[:8]}"
    key = SharePartitionKey("g", uuid.uuid4().bytes, 0)
    p = partition_for(key, 2)

    async def main() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka39.bootstrap)
        await admin.start()
        node = str((await admin.describe_cluster())["brokers"][0]["node_id"])
        broker = ConfigResource(ConfigResourceType.BROKER, node, configs={"producer.id.expiration.ms": "172800000"})
        await admin.alter_configs([broker])
        s = TopicStateStore([kafka39.bootstrap], topic=topic, partitions=2, transactional_prefix=f"kshare-test.{topic}.",
                            write_timeout_s=20)
        try:
            await s.start()
            assert s.claim_renewal_s == 12 * 3600
        finally:
            await admin.alter_configs([ConfigResource(ConfigResourceType.BROKER, node, configs={
                "producer.id.expiration.ms": "86400000"})])
            await admin.close()
        try:
            await s.claim([p])
            c = s._writers[p]
            await s.write([(key, ShareSnapshot(5, ()))])
            epoch, offset = c.producer_epoch, c.claim_offset
            s.claim_renewal_s = 0.4
            deadline = time.monotonic() + 10
            while c.producer_epoch == epoch and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert c.producer_epoch > epoch and c.claim_offset > offset and not c.fenced
            s.claim_renewal_s = 3600.0
            await s.write([(key, ShareUpdate(6, ()))])
            # a failed batch breaks the sequence: the claim is renewed before the next write
            c.needs_renewal = True
            epoch = c.producer_epoch
            await s.write([(key, ShareUpdate(7, ()))])
            assert c.producer_epoch == epoch + 1 and not c.needs_renewal
        finally:
            await s.close()
        again = TopicStateStore([kafka39.bootstrap], topic=topic, partitions=2,
                                transactional_prefix=f"kshare-test.{topic}.", write_timeout_s=20)
        await again.start()
        try:
            await again.claim([p])
            assert again.share_partition(key) == ShareSnapshot(7, ())
            assert again.load_stats.claims >= 4 and again.load_stats.skipped == 0
        finally:
            await again.close()

    asyncio.run(main())
