"""Overlapping produce rounds of TopicStateStore against a real Apache Kafka 3.9 broker.

Rounds of different share-partitions are in flight together; a share-partition's writes never are
(each waits for the one before it to be acknowledged or rolled back). The failure case: a round
the broker refuses while a later round is already in flight, and a later write of the same
share-partition queued behind it. Nothing is acknowledged that is not durable, and the store's
state afterwards equals what a replay of the topic gives. No mocks.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable

import pytest

from kshare.share.state.errors import StateWriteError
from kshare.share.state.rounds import Round
from kshare.share.state.topic_store import TopicStateStore
from kshare.share.states import ShareSnapshot, ShareUpdate, StateBatch, apply_update, normalize
from kshare.share.store import SharePartitionKey
from tests.harness.state import assert_replays_to, replayed, run, update

AVAILABLE, ACKED, ARCHIVED = 0, 2, 4
TOPIC_ID = bytes.fromhex("0f3c2a1b4d5e6f708192a3b4c5d6e7f8")


async def until(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0)


def test_rounds_of_different_share_partitions_overlap(kafka39, topic_name) -> None:
    """Writes of other share-partitions go out while a round is in flight; one share-partition's
    writes wait for each other and keep their order."""
    bs = kafka39.bootstrap
    keys = [SharePartitionKey("g", TOPIC_ID, p) for p in range(8)]

    async def main() -> None:
        store = TopicStateStore(
            bs, topic=topic_name, partitions=4, prune_interval_s=3600, snapshot_slack_bytes=None
        )
        await store.start()
        try:
            await store.write([(k, ShareSnapshot(0, ())) for k in keys])
            most_in_flight = 0
            expected = {k: ShareSnapshot(0, ()) for k in keys}
            done = False

            async def watch() -> None:
                nonlocal most_in_flight
                while not done:
                    most_in_flight = max(most_in_flight, len(store.rounds.in_flight))
                    # a share-partition is in at most one round in flight
                    assert all(sum(k in r.refs for r in store.rounds.in_flight) <= 1 for k in keys)
                    await asyncio.sleep(0)

            async def writer(n: int, k: SharePartitionKey) -> None:
                batches: list[StateBatch] = []
                for i in range(30):
                    b = StateBatch(i * 10, i * 10 + 9, ACKED if i % 3 else AVAILABLE, 1)
                    await store.write([(k, ShareUpdate(-1, (b,)))])
                    batches.append(b)
                    await asyncio.sleep(0.0001 * ((n * 7 + i) % 5))  # out of step with the others
                expected[k] = normalize(ShareSnapshot(0, tuple(batches)))

            watcher = asyncio.create_task(watch())
            # two writers per share-partition would race their engines; one each, all at once
            await asyncio.gather(*(writer(n, k) for n, k in enumerate(keys)))
            done = True
            await watcher
            assert most_in_flight >= 2, most_in_flight  # rounds did overlap
            # the same share-partition written by many callers at once: order kept
            k = keys[0]
            writes = [update(-1, (1000 + i, 1000 + i, ACKED if i % 2 else ARCHIVED, 1)) for i in range(50)]
            await asyncio.gather(*(store.write([(k, w)]) for w in writes))
            # merged: 1000-1049 alternate ARCHIVED / ACKED
            got = store.share_partitions()
            assert got[k].state_batches[-50:] == tuple(
                StateBatch(1000 + i, 1000 + i, ACKED if i % 2 else ARCHIVED, 1) for i in range(50)
            )
            for other in keys[1:]:
                assert got[other] == expected[other]
        finally:
            await store.close()
        await assert_replays_to(bs, topic_name, got)

    run(main())


def test_failed_round_while_later_rounds_are_in_flight(kafka39, topic_name) -> None:
    """The broker refuses round A (its record is over the topic's max.message.bytes) while round C
    (another share-partition, same state partition and producer) is already in flight behind it,
    and write B of A's share-partition is queued. A raises; C may fail with it (the idempotent
    producer's sequence broke) and is then rolled back too; B is encoded only once A is rolled back,
    on the last acknowledged state, as a snapshot. Afterwards: every write that returned is on the
    topic, none that raised is in the store's state, and the store's state equals a replay.

    A's outcome is held (the store's settle gate) until C is in flight and B queued, whatever the
    broker's speed: A stays in flight however fast the broker refuses it."""
    bs = kafka39.bootstrap
    kafka39.create_topic(
        topic_name,
        partitions=1,
        configs={"cleanup.policy": "delete", "retention.ms": "-1", "max.message.bytes": "3000"},
    )
    k1, k2 = SharePartitionKey("g", TOPIC_ID, 1), SharePartitionKey("g", TOPIC_ID, 2)

    async def main() -> None:
        store = TopicStateStore(bs, topic=topic_name, partitions=1, prune_interval_s=3600,
                                snapshot_slack_bytes=None, write_timeout_s=10)
        await store.start()
        try:
            await store.write([(k1, ShareSnapshot(0, ())), (k2, ShareSnapshot(0, ()))])
            await store.write([(k1, update(-1, (0, 9, ACKED, 1)))])
            durable_k1 = store.share_partitions()[k1]
            epoch = store.snapshot_epoch(k1)
            # ~4 KB: over max.message.bytes (3000), under the producer's own 1 MiB limit, so the
            # broker refuses it after it was sent
            huge = update(-1, *((o, o, ACKED if o % 2 else ARCHIVED, 1) for o in range(100, 400)))
            release_a = asyncio.Event()
            held: list[Round] = []

            def hold_a(r: Round) -> Awaitable[None] | None:
                if k1 in r.refs and not held:  # A: B, the next round of k1, waits for A to be settled
                    held.append(r)
                    return release_a.wait()
                return None

            store.settle_gate = hold_a
            a = asyncio.create_task(store.write([(k1, huge)]))
            await until(lambda: len(store.rounds.in_flight) == 1)
            (round_a,) = store.rounds.in_flight
            c = asyncio.create_task(store.write([(k2, update(-1, (5, 5, ARCHIVED, 1)))]))
            b = asyncio.create_task(store.write([(k1, update(-1, (10, 10, AVAILABLE, 2)))]))
            await until(lambda: len(store.rounds.in_flight) == 2)  # C overlaps A ...
            assert round_a in store.rounds.in_flight  # ... which is still in flight (held, or not answered yet) ...
            queue = store.rounds.queue
            assert len(queue) == 1 and queue[0].refs == frozenset({k1})  # ... and B waits
            assert not a.done()
            release_a.set()
            with pytest.raises(StateWriteError):
                await a
            c_ok = True
            try:
                await c
            except StateWriteError:
                c_ok = False
            await b  # after A was rolled back; the producer was replaced first
            state = store.share_partitions()
            # A is not in the state, B is, on top of the last acknowledged state, as a snapshot
            assert state[k1] == apply_update(durable_k1, update(-1, (10, 10, AVAILABLE, 2)))
            # a snapshot (B itself, or the maintenance pass resyncing k1)
            assert store.snapshot_epoch(k1) > epoch
            if c_ok:
                assert state[k2] == ShareSnapshot(0, (StateBatch(5, 5, ARCHIVED, 1),))
            else:
                assert state[k2] == ShareSnapshot(0, ())
                await store.write([(k2, update(-1, (5, 5, ARCHIVED, 1)))])  # written again: heals
                state = store.share_partitions()
            # the store goes on writing
            await store.write([(k1, update(-1, (11, 11, ACKED, 1)))])
            state = store.share_partitions()
        finally:
            await store.close()
        fresh = await replayed(bs, topic_name, partitions=1)
        assert fresh.share_partitions() == state
        # (a replay may skip an update of k1 whose snapshot the failure-triggered pruning pass
        # deleted: one ERROR line, the state is whole from k1's later snapshot)

    run(main())


def test_writes_submitted_together_go_in_one_round(kafka39, topic_name) -> None:
    """A request acknowledging several share-partitions submits one write each: inside
    ``gathering()`` an idle store sends them as one round (one Produce request), where it would
    otherwise write the first at once and the rest in a round after it."""
    bs = kafka39.bootstrap
    keys = [SharePartitionKey("g", TOPIC_ID, p) for p in range(4)]

    async def main() -> None:
        store = TopicStateStore(bs, topic=topic_name, partitions=1, prune_interval_s=3600)
        await store.start()
        try:
            await store.write([(k, ShareSnapshot(0, ())) for k in keys])

            async def four(offset: int, gathered: bool) -> int:
                before = store.stats.rounds
                b = StateBatch(offset, offset + 9, ACKED, 1)
                if gathered:
                    with store.gathering():
                        futs = [store.submit([(k, ShareUpdate(-1, (b,)))]) for k in keys]
                        assert store.rounds.idle  # nothing sent before the block ends
                else:
                    futs = [store.submit([(k, ShareUpdate(-1, (b,)))]) for k in keys]
                await asyncio.gather(*futs)
                return store.stats.rounds - before

            assert await four(0, gathered=False) == 2  # the first alone, then the other three
            assert await four(10, gathered=True) == 1
            want = {k: ShareSnapshot(20, ()) for k in keys}  # 0-19 acknowledged: the start moved past
            assert store.share_partitions() == want
        finally:
            await store.close()
        fresh = await replayed(bs, topic_name)
        assert fresh.share_partitions() == want

    run(main())
