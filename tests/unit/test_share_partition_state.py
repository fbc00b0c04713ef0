"""A share-partition as the service serves it (kshare.share.partition_state) and its ordered
durable writes (kshare.share.write_queue), over a store of the tests' own that answers each
write when the test says so."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from types import SimpleNamespace

import pytest

from kshare.share.errors import ErrorCode
from kshare.share.partition import FetchedBatch, SharePartition
from kshare.share.partition_state import LockTimers, PartitionContext, SharePartitionState, wait_for_records
from kshare.share.states import ShareSnapshot, ShareUpdate
from kshare.share.stats import ShareStats
from kshare.share.store import SharePartitionKey
from kshare.share.upstream import TopicInfo
from kshare.share.write_queue import WriteFailed, WriteQueue

KEY = SharePartitionKey("g", b"t" * 16, 0)
TOPIC = TopicInfo("t", b"t" * 16, [1])
ACCEPT, RELEASE = 1, 2


class HeldStore:
    """Each write waits until the test answers it (``answer``); what was written, in order."""

    def __init__(self) -> None:
        self.writes: list[tuple[list, asyncio.Future]] = []
        self.durable: list = []

    async def write(self, writes: Sequence) -> None:
        fut = asyncio.get_running_loop().create_future()
        self.writes.append((list(writes), fut))
        await fut
        self.durable.extend(c for _, c in writes)

    async def answer(self, error: Exception | None = None) -> None:
        while not any(not f.done() for _, f in self.writes):
            await asyncio.sleep(0)
        _, fut = next((w, f) for w, f in self.writes if not f.done())
        if error is None:
            fut.set_result(None)
        else:
            fut.set_exception(error)
        for _ in range(5):
            await asyncio.sleep(0)


def run(coro) -> None:
    asyncio.run(asyncio.wait_for(coro, 5))


def update(start: int) -> ShareUpdate:
    return ShareUpdate(start, ())


def queue_of_held_store() -> tuple[HeldStore, WriteQueue, list[int]]:
    """A write queue on a store that answers when told; ``failed`` gets a 1 at each failure."""
    store, failed = HeldStore(), []
    return store, WriteQueue(KEY, "share-partition g t-0", store, ShareStats(), lambda: failed.append(1)), failed


async def under_way(q: WriteQueue, write: ShareUpdate) -> asyncio.Future:
    """``write`` put and its write under way (the store holds it)."""
    fut = q.put(write)
    await asyncio.sleep(0)
    return fut


def test_writes_queued_behind_one_under_way_go_out_together_in_order():
    async def main() -> None:
        store, q, failed = queue_of_held_store()
        first = await under_way(q, update(1))
        second, third = q.put(update(2)), q.put(update(3))
        assert second is third  # one write carries both
        barrier = q.put(None)
        await store.answer()
        assert first.done() and not second.done()
        assert store.writes[1][0] == [(KEY, update(2)), (KEY, update(3))]
        await store.answer()
        assert second.done() and barrier.done()
        assert store.durable == [update(1), update(2), update(3)]
        assert q.put(None).done()  # nothing queued: a barrier is passed at once
        assert not failed

    run(main())


def test_a_failed_write_fails_what_is_queued_behind_it_and_the_owner_rebuilds():
    async def main() -> None:
        store, q, failed = queue_of_held_store()
        first = await under_way(q, update(1))
        second = q.put(update(2))
        await store.answer(RuntimeError("broker gone"))
        for fut in (first, second):
            with pytest.raises(WriteFailed):
                fut.result()
        assert failed == [1] and q.failing
        again = q.put(update(3))  # the next write goes out on its own
        await store.answer()
        assert again.done() and not again.exception() and not q.failing

    run(main())


def test_a_write_behind_a_failed_gate_is_not_written():
    async def main() -> None:
        store, q, failed = queue_of_held_store()
        blocker = await under_way(q, update(1))
        gate = asyncio.get_running_loop().create_future()
        q.gate(gate)  # dead letters the next write waits for
        gated = q.put(update(2))
        await store.answer()
        assert blocker.done()
        gate.set_exception(RuntimeError("DLQ topic refused"))
        for _ in range(5):
            await asyncio.sleep(0)
        with pytest.raises(WriteFailed):
            gated.result()
        assert failed == [1] and store.durable == [update(1)]

    run(main())


class Clock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def served(store: HeldStore, clock: Clock, locks: LockTimers) -> SharePartitionState:
    async def initialise(sp: SharePartitionState):
        sp.engine = SharePartition.from_snapshot(ShareSnapshot(0, ()), clock=clock, record_lock_duration_ms=100)
        return ErrorCode.NONE, sp.engine

    ctx = PartitionContext(store=store, stats=ShareStats(), clock=clock, logs=None, locks=locks,  # type: ignore[arg-type]
                           dead_letters=None, coordinator=SimpleNamespace(group=lambda _: None),  # type: ignore[arg-type]
                           initialise=initialise, owns=lambda _key: True)
    return SharePartitionState(KEY, TOPIC, ctx)


def test_a_share_partition_acknowledges_releases_and_expires_its_locks_itself():
    async def main() -> None:
        store, clock, locks = HeldStore(), Clock(), LockTimers()
        sp = served(store, clock, locks)
        err, engine = await sp.load()
        assert err == ErrorCode.NONE and engine is sp.engine and sp.ready
        assert engine.acquire("a", [FetchedBatch(0, 9)], 10).count == 10
        sp.watch_locks()
        waiting = asyncio.ensure_future(wait_for_records([sp], 5000, False))
        await asyncio.sleep(0)
        code, write = sp.acknowledge(engine, "a", [SimpleNamespace(first_offset=0, last_offset=4,
                                                                   acknowledge_types=[RELEASE])])
        assert code == ErrorCode.NONE and write is not None
        await asyncio.sleep(0)
        assert waiting.done()  # released records wake the fetches waiting here
        await store.answer()
        assert write.done() and store.durable
        # the lock timer finds the other five when their lock ends
        assert locks.pop_due(clock.now, {KEY: sp}) is None
        clock.now = 100
        due = locks.pop_due(clock.now, {KEY: sp})
        assert due is sp
        due.expire_locks(clock.now)
        assert engine.acquired_count() == 0
        assert sp.ctx.stats.lock_timeouts[("g", "t")] == 5
        await store.answer()
        # a member that leaves gives back what it holds; nothing held: nothing written
        assert sp.release_member("a", "member_left") is None
        sp.drop()
        assert sp.dropped and not sp.ready

    run(main())


def test_a_failed_write_makes_the_share_partition_rebuild_from_durable_state():
    async def main() -> None:
        store, clock, locks = HeldStore(), Clock(), LockTimers()
        sp = served(store, clock, locks)
        _, engine = await sp.load()
        engine.acquire("a", [FetchedBatch(0, 9)], 10)
        code, write = sp.acknowledge(engine, "a", [SimpleNamespace(first_offset=0, last_offset=9,
                                                                   acknowledge_types=[ACCEPT])])
        await store.answer(RuntimeError("not acknowledged"))
        with pytest.raises(WriteFailed):
            write.result()
        assert sp.engine is None and sp.broken and not sp.ready
        err, rebuilt = await sp.load()
        assert err == ErrorCode.NONE and rebuilt is not engine

    run(main())
