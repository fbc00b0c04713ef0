"""TopicStateStore against a real Apache Kafka 3.9 broker: writes, replay, compaction, pruning,
damaged records, a broker outage and concurrent writers. No mocks."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from collections.abc import Awaitable, Callable

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from kshare.share.partition import FetchedBatch, SharePartition
from kshare.share.state import codec as sc
from kshare.share.state.errors import StateStoreError, StateWriteError
from kshare.share.state.topic_admin import ALTERNATIVE_TOPIC
from kshare.share.state.topic_store import TopicStateStore
from kshare.share.states import ShareSnapshot, ShareUpdate, StateBatch
from kshare.share.store import GroupRecord, SharePartitionKey
from tests.harness.state import assert_replays_to, replayed, run, update

AVAILABLE, ACQUIRED, ACKED, ARCHIVED = 0, 1, 2, 4
TOPIC_ID = bytes.fromhex("9df82025324d4da6bf8c25bad9c4ce08")
KEY = SharePartitionKey("my-share-group", TOPIC_ID, 0)


class Clock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


async def read_topic(bootstrap: str, topic: str) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """Every record of the topic: (partition, offset, key, value), partitions in order."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        parts = sorted(consumer.partitions_for_topic(topic) or ())
        if not parts:
            await consumer._client.force_metadata_update()
            parts = sorted(consumer.partitions_for_topic(topic) or ())
        tps = [TopicPartition(topic, p) for p in parts]
        consumer.assign(tps)
        begin = await consumer.beginning_offsets(tps)
        end = await consumer.end_offsets(tps)
        for tp in tps:
            consumer.seek(tp, begin[tp])
        out: dict[int, list] = {p: [] for p in parts}
        remaining = {tp for tp in tps if end[tp] > begin[tp]}
        while remaining:
            got = await consumer.getmany(*remaining, timeout_ms=500)
            for tp, records in got.items():
                out[tp.partition] += [(tp.partition, r.offset, r.key, r.value) for r in records]
            for tp in list(remaining):
                if await consumer.position(tp) >= end[tp]:
                    remaining.discard(tp)
        return [r for p in parts for r in out[p]]
    finally:
        await consumer.stop()


async def log_start_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        return {tp.partition: off for tp, off in (await consumer.beginning_offsets(tps)).items()}
    finally:
        await consumer.stop()


# -- seed 001: the worked example, step by step through the topic --------------------------------

# The fetched data for the second half: batches as a producer could have written them.
LOG_110_120 = [FetchedBatch(110, 112), FetchedBatch(113, 118), FetchedBatch(119, 119), FetchedBatch(120, 120)]

# The state writes seed 001 lists, in order.
SEED001_WRITES = [
    update(110),
    update(-1, (110, 110, AVAILABLE, 1)),
    update(-1, (119, 119, ACKED, 1)),
    update(-1, (111, 112, AVAILABLE, 1)),
    update(-1, (113, 118, ACKED, 1)),
    update(-1, (110, 110, ACKED, 2)),
    update(120),
]


async def seed001(on_write: Callable[[str, ShareUpdate, SharePartition], Awaitable[None]]) -> SharePartition:
    """Drive the engine through seed 001; ``on_write`` gets every durable write."""
    clock = Clock()
    sp = SharePartition(100, clock=clock, record_lock_duration_ms=30_000)

    async def write(name: str, upd: ShareUpdate | None) -> None:
        assert upd is not None, name
        await on_write(name, upd, sp)

    sp.acquire("c1", [FetchedBatch(100, 109)], 500)
    await write("acknowledge 100-109", sp.acknowledge("c1", [(100, 109, 1)]).update)
    sp.acquire("c1", [FetchedBatch(110, 112)], 500)
    clock.now = 1_000
    sp.acquire("c2", [FetchedBatch(113, 118)], 500)
    sp.acquire("c3", [FetchedBatch(119, 119)], 500)
    clock.now = 2_000
    await write("release 110", sp.acknowledge("c1", [(110, 110, 2)]).update)
    await write("acknowledge 119", sp.acknowledge("c3", [(119, 119, 1)]).update)
    clock.now = 5_000
    got = sp.acquire("c1", LOG_110_120, 500, fetch_offset=110)
    assert got.update is None
    await on_write("fetch 110, 120 (no write)", None, sp)  # type: ignore[arg-type]
    clock.now = 30_000
    await write("lock timeout 111-112", sp.expire_locks(30_000))
    clock.now = 30_500
    await write("acknowledge 113-118", sp.acknowledge("c2", [(113, 118, 1)]).update)
    sp.acquire("c3", LOG_110_120, 500, fetch_offset=111)
    await write("acknowledge 110", sp.acknowledge("c1", [(110, 110, 1)]).update)
    await write("acknowledge 111-112", sp.acknowledge("c3", [(111, 112, 1)]).update)
    return sp


@pytest.mark.parametrize("slack", [None, 24], ids=["updates-only", "prefer-snapshots"])
def test_seed001_every_write_through_the_topic(kafka39, topic_name, slack) -> None:
    bs = kafka39.bootstrap

    async def main() -> None:
        store = TopicStateStore(
            bs, topic=topic_name, partitions=3, snapshot_slack_bytes=slack, prune_interval_s=3600
        )
        await store.start()
        engine_updates: list[ShareUpdate] = []
        states: list[ShareSnapshot] = []
        try:
            await store.write([(KEY, ShareSnapshot(100, ()))])

            async def on_write(name: str, upd: ShareUpdate | None, sp: SharePartition) -> None:
                if upd is not None:
                    engine_updates.append(upd)
                    states.append(sp.snapshot())
                    await store.write([(KEY, upd)])
                    assert store.share_partitions() == {KEY: sp.snapshot()}, name
                # a NEW store replays the topic and rebuilds the engine's durable state
                fresh = await replayed(bs, topic_name)
                assert fresh.load_stats.skipped == 0
                assert fresh.share_partitions() == {KEY: sp.snapshot()}, name
                if upd is None:
                    # a crash now: 110 comes back Available with the delivery count of its last write
                    restored = SharePartition.from_snapshot(fresh.share_partitions()[KEY])
                    assert [
                        (r.first_offset, r.last_offset, int(r.state), r.delivery_count)
                        for r in restored.in_flight()
                    ] == [(110, 110, AVAILABLE, 1), (111, 118, AVAILABLE, 0), (119, 119, ACKED, 1)]

            sp = await seed001(on_write)
            assert sp.snapshot() == ShareSnapshot(120, ())
        finally:
            await store.close()
        assert engine_updates == SEED001_WRITES

        records = await read_topic(bs, topic_name)
        partition = sc.partition_for(KEY, 3)
        assert {p for p, *_ in records} == {partition}
        decoded = [sc.decode_record(k, v) for _, _, k, v in records]
        assert decoded[0] == sc.SnapshotRecord(KEY, 0, 0, 0, ShareSnapshot(100, ()))
        assert len(decoded) == 1 + len(SEED001_WRITES)
        if slack is None:
            # exactly the ShareUpdate records of seed 001, all on snapshot epoch 0
            assert decoded[1:] == [sc.UpdateRecord(KEY, 0, 0, u) for u in SEED001_WRITES]
            return
        # the store may write a (small) snapshot in place of an update; each says the same
        epoch = 0
        for rec, upd, state in zip(decoded[1:], SEED001_WRITES, states, strict=True):
            if isinstance(rec, sc.SnapshotRecord):
                epoch += 1
                assert rec == sc.SnapshotRecord(KEY, epoch, 0, 0, state)
            else:
                assert rec == sc.UpdateRecord(KEY, epoch, 0, upd)
        # {StartOffset 110, []} and {StartOffset 120, []} leave nothing in flight: snapshots
        assert isinstance(decoded[1], sc.SnapshotRecord) and isinstance(decoded[-1], sc.SnapshotRecord)

    run(main())


# -- compaction and pruning ----------------------------------------------------------------------


def drive_with_gaps(sp: SharePartition, steps: int, start: int) -> list[ShareUpdate]:
    """c0 holds the first record forever (the SPSO stays put); c1 acquires 10 records at a time and
    accepts all but one, which it rejects, so the durable state keeps growing."""
    updates = []
    offset = start
    for _ in range(steps):
        sp.acquire("c1", [FetchedBatch(offset, offset + 9)], 500, fetch_offset=offset)
        reject = offset + 3
        acks = [(offset, reject - 1, 1), (reject, reject, 3), (reject + 1, offset + 9, 1)]
        res = sp.acknowledge("c1", acks)
        assert res.error_code == 0 and res.update is not None
        updates.append(res.update)
        offset += 10
    return updates


def test_compaction_and_pruning(kafka39, topic_name) -> None:
    bs = kafka39.bootstrap
    busy = KEY
    idle = SharePartitionKey("other-group", TOPIC_ID, 1)

    async def main() -> None:
        # one partition: the idle share-partition and the group record pin the busy one's log
        store = TopicStateStore(
            bs,
            topic=topic_name,
            partitions=1,
            snapshot_after_updates=20,
            snapshot_slack_bytes=None,
            refresh_after_records=50,
            prune_interval_s=3600,
        )
        await store.start()
        try:
            clock = Clock()
            sp = SharePartition(0, clock=clock, record_lock_duration_ms=3_600_000)
            sp.acquire("c0", [FetchedBatch(0, 0)], 1)
            await store.write([(busy, sp.snapshot()), (idle, ShareSnapshot(42, (StateBatch(43, 43, 0, 2),)))])
            await store.write_group(GroupRecord("my-share-group", 7, {"share.auto.offset.reset": "earliest"}))
            for upd in drive_with_gaps(sp, 70, 1):
                await store.write([(busy, upd)])
            assert store.share_partitions()[busy] == sp.snapshot()
            stats = store.stats
            # 70 updates with 20 per snapshot: 3 compactions; the rest are ShareUpdate records
            assert stats.compactions == 3
            assert stats.updates == 70 - 3
            assert store.snapshot_epoch(busy) == 3
            assert store.state_epoch(busy) == 0
            assert len(sp.snapshot().state_batches) > 100  # worth compacting
            end = stats.records  # one partition: offsets 0..end-1
            assert (await log_start_offsets(bs, topic_name, 1)) == {0: 0}

            # the idle share-partition (offset 0) and the group record (offset 1) lag > 50 behind:
            # they are rewritten, then everything below the oldest needed record goes
            moved = await store.prune()
            assert store.stats.refreshes == 2
            latest_busy_snapshot = store.memory.entries[busy].snapshot_offset
            assert latest_busy_snapshot is not None and latest_busy_snapshot > 60
            assert moved == {0: latest_busy_snapshot}
            assert (await log_start_offsets(bs, topic_name, 1)) == {0: latest_busy_snapshot}
            assert store.stats.pruned_records == latest_busy_snapshot
            assert latest_busy_snapshot < end

            # pruning again with nothing new moves nothing
            assert await store.prune() == {}
            # later writes keep working on top of the pruned log
            for upd in drive_with_gaps(sp, 5, 701):
                await store.write([(busy, upd)])
        finally:
            await store.close()

        fresh = await replayed(bs, topic_name)
        assert fresh.load_stats.skipped == 0
        assert fresh.share_partitions() == {
            busy: sp.snapshot(),
            idle: ShareSnapshot(42, (StateBatch(43, 43, 0, 2),)),
        }
        assert fresh.groups() == {
            "my-share-group": GroupRecord("my-share-group", 7, {"share.auto.offset.reset": "earliest"})
        }
        assert fresh.snapshot_epoch(busy) == 3 and fresh.snapshot_epoch(idle) == 1
        # what is left on the topic: the latest busy snapshot and what came after it
        records = await read_topic(bs, topic_name)
        assert records[0][1] == latest_busy_snapshot
        assert sc.decode_record(records[0][2], records[0][3]).key == busy

    run(main())


def test_snapshots_let_pruning_follow_the_head(kafka39, topic_name) -> None:
    """Whole-batch acknowledgements leave nothing in flight: every write is a tiny snapshot and the
    background pruner drops everything but the latest record of each share-partition."""
    bs = kafka39.bootstrap
    keys = [SharePartitionKey("g", TOPIC_ID, p) for p in range(4)]

    async def main() -> None:
        store = TopicStateStore(
            bs, topic=topic_name, partitions=2, prune_after_records=50, prune_min_interval_s=0.0
        )
        await store.start()
        try:
            for i in range(1, 51):
                await asyncio.gather(*(store.write([(k, update(i * 500))]) for k in keys))
            assert store.stats.updates == 0 and store.stats.snapshots == 200
            deadline = time.monotonic() + 30
            while store.stats.prunes == 0 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            await store.prune()
            starts = await log_start_offsets(bs, topic_name, 2)
            assert starts == store.log_start_offsets()
            assert sum(starts.values()) == 200 - len(keys)  # only the latest record of each key is left
        finally:
            await store.close()
        fresh = await replayed(bs, topic_name)
        assert fresh.share_partitions() == {k: ShareSnapshot(25_000, ()) for k in keys}
        assert fresh.load_stats.records == len(keys)

    run(main())


# -- damaged and foreign records -----------------------------------------------------------------


def test_damaged_and_foreign_records_are_skipped(kafka39, topic_name, caplog) -> None:
    bs = kafka39.bootstrap
    key_b = SharePartitionKey("group-b", TOPIC_ID, 3)
    orphan = SharePartitionKey("group-c", TOPIC_ID, 9)

    async def main() -> None:
        store = TopicStateStore(bs, topic=topic_name, partitions=2, snapshot_slack_bytes=None)
        await store.start()
        part = sc.partition_for(KEY, 2)
        good_key = sc.encode_share_key(sc.RECORD_SNAPSHOT, KEY)
        good_value = sc.encode_snapshot_value(0, 0, 0, ShareSnapshot(5, ()))
        garbage = [
            (b"\x00", b"v"),  # key too short
            (os.urandom(40), good_value),  # garbage key
            (b"\x00\x09" + good_key[2:], good_value),  # unknown record type (key version)
            (good_key, os.urandom(30)),  # garbage value
            (good_key, b"\x00\x05" + good_value[2:]),  # unknown value version
            (good_key, good_value[:-4]),  # truncated value
            (None, b"a foreign record without a key"),
            (
                sc.encode_share_key(sc.RECORD_UPDATE, orphan),
                sc.encode_update_value(0, 0, update(7)),
            ),  # no snapshot
            (good_key, b'{"json": "from another tool"}'),
        ]
        producer = AIOKafkaProducer(bootstrap_servers=bs)
        await producer.start()
        try:
            await store.write([(KEY, ShareSnapshot(100, ()))])
            for k, v in garbage[:5]:
                await producer.send_and_wait(topic_name, value=v, key=k, partition=part)
            await store.write([(KEY, update(-1, (100, 104, ACKED, 1), (105, 105, AVAILABLE, 2)))])
            await store.write([(key_b, ShareSnapshot(0, ()))])
            for k, v in garbage[5:]:
                await producer.send_and_wait(topic_name, value=v, key=k, partition=part)
            await store.write([(KEY, update(-1, (106, 106, ARCHIVED, 3)))])
            expected = store.share_partitions()
        finally:
            await producer.stop()
            await store.close()
        assert expected[KEY] == ShareSnapshot(105, (StateBatch(105, 105, 0, 2), StateBatch(106, 106, 4, 3)))

        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="kshare.share.state_topic"):
            fresh = await replayed(bs, topic_name, partitions=2)
        assert fresh.share_partitions() == expected
        assert fresh.load_stats.skipped == len(garbage)
        errors = [
            r for r in caplog.records if r.name == "kshare.share.state_topic" and r.levelno >= logging.ERROR
        ]
        assert len(errors) == len(garbage)  # exactly one logged error per skipped record
        messages = [r.getMessage() for r in errors]
        assert all("record skipped" in m for m in messages)
        assert any("unknown record type (key version) 9" in m for m in messages)
        assert any("unknown ShareSnapshot value version 5" in m for m in messages)
        assert any("without a ShareSnapshot" in m for m in messages)
        assert len({m.split(": record skipped")[0] for m in messages}) == len(garbage)  # distinct offsets

    run(main())


# -- a broker outage -----------------------------------------------------------------------------


def test_broker_restart(broker_factory, topic_name) -> None:
    """Soft restart: a write issued while the broker is down waits and completes after the restart.
    Hard kill with a short write timeout: the write raises StateWriteError and the store rolls the
    share-partitions back to their last acknowledged state (which the caller rebuilds its engines
    from); later writes heal the topic with snapshots. Nothing acknowledged is ever lost."""
    broker = broker_factory("kafka39")
    bs = broker.bootstrap
    keys = [SharePartitionKey("g", TOPIC_ID, p) for p in range(6)]

    async def main() -> None:
        engines = {k: SharePartition(0, clock=Clock()) for k in keys}

        def step(k: SharePartitionKey, n: int) -> ShareUpdate:
            sp = engines[k]
            start = sp.end_offset
            sp.acquire("c", [FetchedBatch(start, start + n - 1)], 500)
            res = sp.acknowledge("c", [(start, start, 2), (start + 1, start + n - 1, 1)])
            assert res.update is not None
            return res.update

        store = TopicStateStore(
            bs, topic=topic_name, partitions=3, write_timeout_s=120, prune_interval_s=3600
        )
        await store.start()
        try:
            await store.write([(k, sp.snapshot()) for k, sp in engines.items()])
            for _ in range(3):
                await store.write([(k, step(k, 5)) for k in keys])

            await asyncio.to_thread(broker.stop)
            pending = asyncio.create_task(store.write([(k, step(k, 5)) for k in keys]))
            await asyncio.sleep(2)
            assert not pending.done()  # waiting for the cluster, not failed and not acknowledged
            await asyncio.to_thread(broker.start)
            await asyncio.wait_for(pending, 120)  # acknowledged after the restart
            assert store.share_partitions() == {k: sp.snapshot() for k, sp in engines.items()}
        finally:
            await store.close()
        fresh = await replayed(bs, topic_name)
        assert fresh.share_partitions() == {k: sp.snapshot() for k, sp in engines.items()}

        store = TopicStateStore(bs, topic=topic_name, partitions=3, write_timeout_s=3, prune_interval_s=3600)
        await store.start()
        try:
            assert store.share_partitions() == {k: sp.snapshot() for k, sp in engines.items()}
            acknowledged = store.share_partitions()
            await asyncio.to_thread(broker.kill)
            t0 = time.monotonic()
            with pytest.raises(StateWriteError):
                await store.write([(k, step(k, 5)) for k in keys])
            assert time.monotonic() - t0 < 10
            # the store reports the last acknowledged state; like the service, rebuild the engines
            # (which moved ahead of what is durable) from it
            assert store.share_partitions() == acknowledged
            engines.update({k: SharePartition.from_snapshot(acknowledged[k], clock=Clock()) for k in keys})
            snapshots_before = store.stats.snapshots
            await asyncio.to_thread(broker.start)
            # the failed records may or may not have landed: the next write of each share-partition is
            # a full snapshot, so the topic matches the engines again
            for _attempt in range(40):
                try:
                    await store.write([(k, step(k, 5)) for k in keys])
                    break
                except StateWriteError:
                    durable = store.share_partitions()
                    engines.update({k: SharePartition.from_snapshot(durable[k], clock=Clock()) for k in keys})
                    await asyncio.sleep(0.5)
            else:
                pytest.fail("no write succeeded after the restart")
            assert store.stats.snapshots >= snapshots_before + len(keys)
            await store.write([(k, step(k, 5)) for k in keys])
            assert store.share_partitions() == {k: sp.snapshot() for k, sp in engines.items()}
        finally:
            await store.close()
        fresh = await replayed(bs, topic_name)
        assert fresh.share_partitions() == {k: sp.snapshot() for k, sp in engines.items()}
        # everything acknowledged before the crash is still there
        for k in keys:
            assert set(acknowledged[k].state_batches) <= set(fresh.share_partitions()[k].state_batches)

    run(main())


# -- concurrency ---------------------------------------------------------------------------------


def test_concurrent_writes_batch_into_few_rounds(kafka39, topic_name) -> None:
    bs = kafka39.bootstrap
    rng = random.Random(932)
    keys = [SharePartitionKey(f"group-{i % 10}", TOPIC_ID, i) for i in range(200)]

    async def main() -> None:
        engines = {k: SharePartition(1000 * i, clock=Clock()) for i, k in enumerate(keys)}
        writes: list[list[tuple[SharePartitionKey, ShareSnapshot | ShareUpdate]]] = []
        per_key: dict[SharePartitionKey, list] = {k: [(k, sp.snapshot())] for k, sp in engines.items()}
        for k, sp in engines.items():
            for _ in range(4):  # 200 snapshots + 800 updates = 1,000 writes
                start = sp.end_offset
                sp.acquire("c", [FetchedBatch(start, start + 9)], 500)
                types = [rng.choice([1, 1, 1, 2, 3]) for _ in range(10)]
                res = sp.acknowledge("c", [(start + i, start + i, t) for i, t in enumerate(types)])
                assert res.error_code == 0 and res.update is not None
                per_key[k].append((k, res.update))
        for i in range(5):  # interleave the share-partitions, keep each one's order
            writes += [[per_key[k][i]] for k in keys]
        assert len(writes) == 1000

        store = TopicStateStore(bs, topic=topic_name, partitions=10, prune_interval_s=3600)
        await store.start()
        try:
            rounds_before = store.stats.rounds
            t0 = time.monotonic()
            await asyncio.gather(*(store.write(w) for w in writes))
            elapsed = time.monotonic() - t0
            rounds = store.stats.rounds - rounds_before
            assert store.stats.writes == 1000 and store.stats.records == 1000
            assert rounds <= 3, rounds  # one produce round carries (nearly) everything
            assert store.stats.max_round_records >= 900
            assert store.share_partitions() == {k: sp.snapshot() for k, sp in engines.items()}
        finally:
            await store.close()
        print(f"1,000 concurrent writes: {rounds} produce round(s), {elapsed * 1000:.0f} ms")
        fresh = await replayed(bs, topic_name)
        assert fresh.share_partitions() == {k: sp.snapshot() for k, sp in engines.items()}
        assert fresh.load_stats.records == 1000 and fresh.load_stats.skipped == 0
        # every share-partition's records sit in one state-topic partition
        seen: dict[SharePartitionKey, set[int]] = {}
        for p, _, k, v in await read_topic(bs, topic_name):
            seen.setdefault(sc.decode_record(k, v).key, set()).add(p)
        assert all(len(ps) == 1 for ps in seen.values()) and len(seen) == 200
        assert len({p for ps in seen.values() for p in ps}) == 10

    run(main())


# -- deletion, groups, epochs, input checks ------------------------------------------------------


def test_deletions_groups_and_epochs(kafka39, topic_name) -> None:
    bs = kafka39.bootstrap
    a0, a1 = SharePartitionKey("a", TOPIC_ID, 0), SharePartitionKey("a", TOPIC_ID, 1)
    b0 = SharePartitionKey("b", TOPIC_ID, 0)
    t2 = bytes(16)

    async def main() -> None:
        store = TopicStateStore(bs, topic=topic_name, partitions=4, prune_interval_s=3600)
        await store.start()
        try:
            await store.write([(k, ShareSnapshot(10, ())) for k in (a0, a1, b0)])
            await store.write_group(
                GroupRecord("a", 3, {"share.record.lock.duration.ms": "15000"}, {TOPIC_ID: "t"})
            )
            await store.write_group(GroupRecord("b", 1, {}, {TOPIC_ID: "t", t2: "t2"}))
            # an SPSO reset (AlterShareGroupOffsets) writes a snapshot: a new state epoch
            await store.write([(b0, ShareSnapshot(500, ()))])
            assert store.state_epoch(b0) == 1 and store.snapshot_epoch(b0) == 1
            # the store writes this small update as a snapshot: new snapshot epoch, same state epoch
            await store.write([(b0, update(-1, (500, 509, AVAILABLE, 1)))])
            assert store.state_epoch(b0) == 1 and store.snapshot_epoch(b0) == 2
            # an update for a share-partition without state becomes its first snapshot
            fresh_key = SharePartitionKey("b", t2, 0)
            await store.write([(fresh_key, update(70, (71, 71, AVAILABLE, 1)))])
            assert store.share_partitions()[fresh_key] == ShareSnapshot(70, (StateBatch(71, 71, 0, 1),))
            await store.delete_share_partitions([a1])
            # delete group "a": a0 is not named but is the group's too, so it goes as well
            await store.delete_group("a", [])
            expected = {
                b0: ShareSnapshot(500, (StateBatch(500, 509, 0, 1),)),
                fresh_key: ShareSnapshot(70, (StateBatch(71, 71, 0, 1),)),
            }
            assert store.share_partitions() == expected
            assert set(store.groups()) == {"b"}

            with pytest.raises(ValueError):
                await store.write([(SharePartitionKey("x", b"short", 0), ShareSnapshot(0, ()))])
            with pytest.raises(ValueError):
                await store.write([(b0, update(-1, (5, 4, AVAILABLE, 1)))])
            with pytest.raises(ValueError):
                await store.write([(b0, update(-1, (5, 5, ACQUIRED, 1)))])
            with pytest.raises(TypeError):
                await store.write([(b0, (1, ()))])  # type: ignore[list-item]
            assert store.share_partitions() == expected
        finally:
            await store.close()
        with pytest.raises(StateStoreError):
            await store.write([(b0, update(600))])

        fresh = await replayed(bs, topic_name, partitions=4)
        assert fresh.share_partitions() == expected
        assert fresh.groups() == {"b": GroupRecord("b", 1, {}, {TOPIC_ID: "t", t2: "t2"})}
        assert fresh.state_epoch(b0) == 1 and fresh.snapshot_epoch(b0) == 2
        assert fresh.load_stats.tombstones == 3  # a1, a0 and group a
        # a re-created share-partition starts over
        async with TopicStateStore(bs, topic=topic_name, prune_interval_s=3600) as store:
            await store.write([(a0, ShareSnapshot(99, ()))])
        fresh = await replayed(bs, topic_name)
        assert fresh.share_partitions()[a0] == ShareSnapshot(99, ())

    run(main())


def test_existing_topic_partition_count_and_compacted_topic(kafka39, topic_name) -> None:
    bs = kafka39.bootstrap
    kafka39.create_topic(topic_name, partitions=2, configs={"cleanup.policy": "delete", "retention.ms": "-1"})
    kafka39.create_topic(topic_name + "-c", partitions=1, configs={"cleanup.policy": "compact"})

    async def main() -> None:
        async with TopicStateStore(bs, topic=topic_name, partitions=10, prune_interval_s=3600) as store:
            assert store.partitions == 2  # the topic's, not the configured count
            await store.write([(KEY, ShareSnapshot(1, ()))])
        with pytest.raises(StateStoreError, match="cleanup.policy"):
            await TopicStateStore(bs, topic=topic_name + "-c").start()

    run(main())


def test_created_topic_configs(kafka39, topic_name) -> None:
    bs = kafka39.bootstrap

    async def main() -> None:
        async with TopicStateStore(bs, topic=topic_name, partitions=5, prune_interval_s=3600):
            pass

    run(main())
    from confluent_kafka.admin import ConfigResource

    admin = kafka39.admin()
    res = ConfigResource(ConfigResource.Type.TOPIC, topic_name)
    configs = admin.describe_configs([res])[res].result(30)
    assert configs["cleanup.policy"].value == "delete"
    assert configs["retention.ms"].value == "-1"
    assert configs["retention.bytes"].value == "-1"
    assert configs["min.insync.replicas"].value == "1"  # one broker: replication factor 1
    md = admin.list_topics(topic=topic_name, timeout=10).topics[topic_name]
    assert len(md.partitions) == 5
    assert all(len(p.replicas) == 1 for p in md.partitions.values())


def test_kafka4_reserves_share_group_state(kafka4) -> None:
    """Apache Kafka 4.x owns __share_group_state: the store says so instead of failing every write."""

    async def main() -> None:
        with pytest.raises(StateStoreError, match="internal topic|cannot create"):
            await TopicStateStore(kafka4.bootstrap).start()
        async with TopicStateStore(kafka4.bootstrap, topic=ALTERNATIVE_TOPIC, prune_interval_s=3600) as store:
            await store.write([(KEY, ShareSnapshot(5, ()))])
        fresh = await replayed(kafka4.bootstrap, ALTERNATIVE_TOPIC)
        assert fresh.share_partitions()[KEY] == ShareSnapshot(5, ())

    run(main())


def test_failed_write_rolls_back_and_resyncs(kafka39, topic_name) -> None:
    """A write the cluster refuses (a record over the size limit) raises, leaves the store at the
    last acknowledged state, and the share-partition's next write is a full snapshot."""
    bs = kafka39.bootstrap
    other = SharePartitionKey("g2", TOPIC_ID, 5)

    async def main() -> None:
        store = TopicStateStore(
            bs, topic=topic_name, partitions=2, prune_interval_s=3600, snapshot_slack_bytes=None
        )
        await store.start()
        try:
            await store.write([(KEY, ShareSnapshot(0, ())), (other, ShareSnapshot(0, ()))])
            await store.write([(KEY, update(-1, (0, 0, AVAILABLE, 1)))])
            acknowledged = store.share_partitions()
            epoch = store.snapshot_epoch(KEY)
            # 60,000 ranges: a 1.2 MB record, over the producer's 1 MiB limit
            huge = update(-1, *((o, o, AVAILABLE if o % 2 else ACKED, 1) for o in range(10, 60_010)))
            with pytest.raises(StateWriteError, match="not sent"):
                await store.write([(KEY, huge), (other, update(-1, (3, 3, ARCHIVED, 1)))])
            # the other share-partition's record landed: it keeps its new state
            assert store.share_partitions() == {
                KEY: acknowledged[KEY],
                other: ShareSnapshot(0, (StateBatch(3, 3, ARCHIVED, 1),)),
            }
            assert store.snapshot_epoch(KEY) == epoch
            updates_before = store.stats.updates
            await store.write([(KEY, update(-1, (1, 1, AVAILABLE, 2)))])
            assert store.stats.updates == updates_before  # written as a snapshot (resync)
            assert store.snapshot_epoch(KEY) == epoch + 1
            expected = store.share_partitions()
            assert expected[KEY] == ShareSnapshot(0, (StateBatch(0, 0, 0, 1), StateBatch(1, 1, 0, 2)))
        finally:
            await store.close()
        await assert_replays_to(bs, topic_name, expected)

    run(main())


def test_start_up_fallbacks_are_one_warning_line_each(upstream, topic_name, caplog) -> None:
    """Kafka 3.9 grants idempotent producer ids and prunes; Tansu does neither (it refuses
    InitProducerId v0 and closes the connection on DeleteRecords). Either way the store works, and
    each of Tansu's deviations is told once at start-up, as one WARNING of kshare.upstream
    (upstream_checks: what the cluster does, what kshare does about it): no ERROR (aiokafka's
    own) and no other WARNING, then or on a later pruning round; on Kafka, none."""
    tansu = upstream.name == "tansu"

    async def main() -> None:
        store = TopicStateStore(upstream.bootstrap, topic=topic_name, partitions=1, prune_interval_s=3600)
        with caplog.at_level(logging.INFO):
            await store.start()
            try:
                for epoch in range(3):
                    await store.write_group(GroupRecord("g", epoch))
                moved = await store.prune()
                assert moved == ({} if tansu else {0: 2})  # the latest group record is kept
                assert store.share_partitions() == {} and store.groups()["g"].group_epoch == 2
            finally:
                await store.close()
        assert set(store.checks.deviations) == ({"producer_ids", "delete_records"} if tansu else set())

    run(main())
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name != "kshare.upstream"]
    assert loud == [], [r.getMessage() for r in loud]
    warned = [r.getMessage() for r in caplog.records if r.name == "kshare.upstream"]
    assert all(r.levelno == logging.WARNING for r in caplog.records if r.name == "kshare.upstream")
    assert sum("without idempotence" in m for m in warned) == (1 if tansu else 0), warned
    assert sum("is not pruned" in m for m in warned) == (1 if tansu else 0), warned
