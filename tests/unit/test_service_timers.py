"""The share service's timer loop (``ShareGroupService._timers``): lock expiries and member session
timeouts. Run on its own with an injected clock, real ``LockTimers``, and share-partitions and a
coordinator of the test's own: a failure in one share-partition, or a member release waiting for
its durable write, must not stop the locks of the others from running out."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from kshare.share.partition_state import LockTimers
from kshare.share.service import ShareGroupService
from kshare.share.store import SharePartitionKey


class Partition:
    """A share-partition whose next lock runs out at ``deadline``; ``expire_locks`` records the call."""

    def __init__(self, name: str, deadline: int, *, fails: bool = False) -> None:
        self.key = SharePartitionKey("g", name.encode().ljust(16, b"-"), 0)
        self.deadline, self.fails = deadline, fails
        self.expired_at: list[int] = []
        self.lock_timer: int | None = None
        self.engine = SimpleNamespace(next_deadline=lambda: self.deadline)

    def expire_locks(self, now: int) -> None:
        self.expired_at.append(now)
        self.deadline = None
        if self.fails:
            raise RuntimeError("a bug in this share-partition")


class Coordinator:
    """One member whose session times out at ``due``."""

    def __init__(self, due: int) -> None:
        self.due: int | None = due

    def expire(self, now: int) -> list[tuple[str, str]]:
        if self.due is not None and now >= self.due:
            self.due = None
            return [("g", "m1")]
        return []

    def next_deadline(self) -> int | None:
        return self.due

    def group(self, _group_id: str) -> None:
        return None


def _service(partitions: list[Partition], coordinator: Coordinator, clock: list[int], gone: list) -> SimpleNamespace:
    locks = LockTimers()
    held = asyncio.get_running_loop().create_future()  # a release whose durable write never comes back

    async def member_gone(group_id: str, member_id: str, *, expired: bool = False) -> None:
        gone.append((group_id, member_id, expired))
        await held

    svc = SimpleNamespace(clock=lambda: clock[0], locks=locks, partitions={p.key: p for p in partitions},
                          coordinator=coordinator, persist_group=lambda g: None, member_gone=member_gone,
                          _releases=set())
    svc._release_done = lambda task: ShareGroupService._release_done(svc, task)
    for p in partitions:
        locks.watch(p)
    return svc


def test_a_failing_share_partition_and_a_slow_member_release_do_not_stop_the_other_locks() -> None:
    async def main() -> None:
        clock = [0]
        broken, slow_after, fine = Partition("broken", 10, fails=True), Partition("later", 50), Partition("fine", 10)
        gone: list = []
        svc = _service([broken, slow_after, fine], Coordinator(due=20), clock, gone)
        timers = asyncio.get_running_loop().create_task(ShareGroupService._timers(svc))
        try:
            for now in (10, 20, 50):
                clock[0] = now
                svc.locks.wakeup.set()
                for _ in range(20):
                    await asyncio.sleep(0)
            assert broken.expired_at == [10] and fine.expired_at == [10]
            assert gone == [("g", "m1", True)]  # its release waits for a write that never comes back ...
            assert slow_after.expired_at == [50]  # ... and the lock due after it ran out all the same
            assert not timers.done()
        finally:
            timers.cancel()

    asyncio.run(asyncio.wait_for(main(), 5))
