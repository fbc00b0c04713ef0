"""One share-partition as the service serves it: its engine, its durable writes, its waiting
fetches, its fair shares and its lock timer.

The ShareFetch and ShareAcknowledge handlers resolve their share-partitions once
(``ShareGroupService.share_partition``) and then work on these objects: load the engine, acquire,
acknowledge, persist, release. Loading an engine the first time is the service's job (its
``initialise``, handed in through ``PartitionContext``), as is dropping share-partitions.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from . import dead_letter
from .errors import ErrorCode
from .fairness import FairShare
from .store import NotOwned, SharePartitionKey, StateStore, StoreWriteError
from .tasks import shared_task
from .write_queue import WriteFailed, WriteQueue, ignore_failure

if TYPE_CHECKING:
    from .coordinator import GroupCoordinator
    from .dead_letter_writer import DeadLetterWriter
    from .partition import SharePartition
    from .partition_log import PartitionLog, PartitionLogs
    from .states import ShareSnapshot, ShareUpdate
    from .stats import ShareStats
    from .upstream import TopicInfo

log = logging.getLogger("kshare.share")


@dataclass(slots=True, kw_only=True)
class PartitionContext:
    """What every share-partition of a service shares: given to each at creation, so a
    share-partition does its own work without going back to the service."""

    store: StateStore
    stats: ShareStats
    clock: Callable[[], int]
    logs: PartitionLogs
    locks: LockTimers
    dead_letters: DeadLetterWriter
    coordinator: GroupCoordinator  # the group's configs (its DLQ topic), looked up when records are archived
    # builds the engine from durable state (ShareGroupService._initialise)
    initialise: Callable[[SharePartitionState], Awaitable[tuple[int, SharePartition | None]]]
    owns: Callable[[SharePartitionKey], bool]  # whether this proxy leads the share-partition (instance groups)


class SharePartitionState:
    """One share-partition: its engine, its ordered durable writes, the fetches waiting on it."""

    __slots__ = ("key", "topic", "ctx", "engine", "init_task", "broken", "dropped", "waiters", "fair",
                 "lock_timer", "keys_warned", "writes", "__weakref__")

    def __init__(self, key: SharePartitionKey, topic: TopicInfo, ctx: PartitionContext) -> None:
        self.key = key
        self.topic = topic
        self.ctx = ctx
        self.engine: SharePartition | None = None
        self.init_task: asyncio.Task | None = None
        self.broken = False  # a write failed: rebuild from durable state before serving again
        self.dropped = False  # the service forgot it (its state deleted): a request holding it resolves again
        self.waiters: set[asyncio.Future] = set()
        self.fair = FairShare()  # the members fetching here, their shares
        self.lock_timer: int | None = None  # the earliest lock-expiry check queued for it (ms), if any
        self.keys_warned = False  # a batch whose keys could not be read was warned about (key-ordered groups)
        self.writes = WriteQueue(key, f"share-partition {key.group_id} {topic.name}-{key.partition}", ctx.store,
                                 ctx.stats, self._write_failed)

    def __repr__(self) -> str:
        return f"SharePartitionState({self.key!r}, engine={self.engine!r})"

    @property
    def ready(self) -> bool:
        """Its engine is loaded and matches what is durable."""
        return self.engine is not None and not self.broken

    @property
    def pending_done(self) -> asyncio.Future | None:
        """Resolved once the writes queued (not yet under way) are durable."""
        return self.writes.pending_done

    def wake(self) -> None:
        """Something may be acquirable now: the fetches waiting here look again."""
        for fut in self.waiters:
            if not fut.done():
                fut.set_result(None)
        self.waiters.clear()

    def log(self, read_committed: bool) -> PartitionLog:
        """The cached log of its topic-partition."""
        return self.ctx.logs.get(self.topic, self.key.partition, read_committed)

    # -- the engine ---------------------------------------------------------------------------------
    async def load(self) -> tuple[int, SharePartition | None]:
        """The loaded engine, initialising it on first use (error code, engine)."""
        if self.engine is not None and not self.broken:
            return ErrorCode.NONE, self.engine
        if not self.ctx.owns(self.key):  # moved to another proxy of the instance group meanwhile
            return ErrorCode.NOT_LEADER_OR_FOLLOWER, None
        task = self.start_loading()
        try:
            return await asyncio.shield(task)
        except WriteFailed:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, None
        except StoreWriteError as exc:  # its first state write (a broker restarting): tried again later
            log.info("share-partition %s %s-%d: its initial state was not written (%s); trying again at the next "
                     "fetch", self.key.group_id, self.topic.name, self.key.partition, exc)
            return ErrorCode.NETWORK_EXCEPTION, None
        except NotOwned:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER, None

    def start_loading(self) -> asyncio.Task:
        """The task initialising the engine, started unless under way (for ``load``, and for a
        ShareFetch that answers without waiting for it)."""
        if self.init_task is None or self.init_task.done():
            self.init_task = shared_task(self.ctx.initialise(self))
            # dropped once done (its awaiters hold it): a done task keeps its context, and with
            # it the request that started it, for as long as the share-partition lives (10,000
            # share-partitions: 7 MB)
            self.init_task.add_done_callback(partial(_forget_init, self))
        return self.init_task

    def drop(self) -> None:
        """The service forgot this share-partition: fetches waiting here look again, and find a new one."""
        self.dropped = True
        self.engine = None
        self.wake()

    def _write_failed(self) -> None:
        # The engine moved ahead of what is durable: rebuild before serving it again.
        self.broken = True
        self.engine = None
        self.wake()

    # -- durable writes -------------------------------------------------------------------------------
    def persist(self, change: ShareUpdate | ShareSnapshot | None) -> asyncio.Future:
        """Queue a durable write (None: a barrier); see ``WriteQueue.put``."""
        return self.writes.put(change)

    def persist_archived(self, update: ShareUpdate, ack_batches: Iterable[Any] = (),
                         archived: Sequence[tuple[int, int, int]] | None = None) -> asyncio.Future:
        """Like ``persist``, but the records the operation archived go to the group's DLQ topic first.

        ``archived``: the engine's ``archived`` right after the operation that produced ``update``
        (the update alone misses archived records the SPSO moved past)."""
        if archived is None:
            archived = dead_letter.archived_offsets(update)
        if not archived:
            return self.writes.put(update)
        ctx = self.ctx
        ctx.stats.archived[(self.key.group_id, self.topic.name)] += sum(z - a + 1 for a, z, _ in archived)
        group = ctx.coordinator.group(self.key.group_id)
        if group is None or not group.config.dlq_topic:
            return self.writes.put(update)
        ack_batches = list(ack_batches)
        items = dead_letter.letters(archived, dead_letter.rejected_ranges(ack_batches),
                                    dead_letter.acked_ranges(ack_batches, 0))
        if not items:
            return self.writes.put(update)
        # Queue the write now, so its order among this share-partition's writes is kept, behind a
        # gate: it goes to the state topic only once the dead letters are on the DLQ topic. If they
        # cannot be written, neither is the write (nor the others queued with it): the share-
        # partition is rebuilt from its durable state, so the records are not archived and come
        # back, instead of being archived without their dead letters.
        gate = ctx.dead_letters.send(group, self.topic, self.key.partition, items)
        gate.add_done_callback(ignore_failure)
        self.writes.gate(gate)
        return self.writes.put(update)

    # -- what changes the records' state --------------------------------------------------------------
    def acknowledge(self, engine: SharePartition, member_id: str,
                    batches: Sequence[Any]) -> tuple[int, asyncio.Future | None]:
        """Apply one member's acknowledgement batches (ShareFetch/ShareAcknowledge
        AcknowledgementBatches) atomically; (error code, the durable write or None)."""
        result = engine.acknowledge(member_id, [(b.first_offset, b.last_offset, b.acknowledge_types)
                                                for b in batches])
        if result.update is None:
            return result.error_code, None
        write = self.persist_archived(result.update, batches, list(engine.archived))
        self.wake()  # released records can go to another member now
        self.watch_locks()  # or, with a redelivery backoff, when it ends
        return result.error_code, write

    def release_member(self, member_id: str, reason: str) -> asyncio.Future | None:
        """What the member holds here goes back to the queue (archived at the delivery count limit,
        with dead letters), counted under ``reason`` (kshare.share.stats); the durable write, if any."""
        self.fair.leave(member_id)
        engine = self.engine
        if engine is None:
            return None
        held = engine.acquired_count()
        update = engine.release_member(member_id)
        if update is None:
            return None
        released = held - engine.acquired_count()
        if released:
            self.ctx.stats.member_releases[(self.key.group_id, self.topic.name, reason)] += released
        write = self.persist_archived(update, (), list(engine.archived))
        self.wake()
        return write

    def expire_locks(self, now: int) -> None:
        """Release the records whose acquisition locks ran out by ``now`` (the lock timer is due)."""
        engine = self.engine
        if engine is None:
            return
        held = engine.acquired_count()
        update = engine.expire_locks(now)
        archived = list(engine.archived)
        expired = held - engine.acquired_count()
        if expired:
            self.ctx.stats.lock_timeouts[(self.key.group_id, self.topic.name)] += expired
        if update is not None:
            self.persist_archived(update, (), archived).add_done_callback(ignore_failure)
        self.wake()
        self.watch_locks()

    def skip_to_log_start(self, log_start: int) -> None:
        """Records below the log start are gone (retention, DeleteRecords): move the SPSO up to it."""
        engine = self.engine
        if engine is None or log_start <= engine.start_offset:
            return
        update = engine.skip_to_log_start(log_start)
        if update is not None:
            log.info("share-partition %s %s-%d: records below %d were deleted upstream; SPSO moves there",
                     self.key.group_id, self.topic.name, self.key.partition, log_start)
            self.persist(update).add_done_callback(ignore_failure)

    def watch_locks(self) -> None:
        """Have the lock timer check this share-partition when its next lock or backoff ends."""
        self.ctx.locks.watch(self)


class LockTimers:
    """When each share-partition's next acquisition lock (or redelivery backoff) ends: one queued
    check per share-partition, not one per acquisition (at 1,000 acquisitions a second a heap
    of every lock held as many entries as records acquired within a lock duration)."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, SharePartitionKey]] = []
        self.wakeup = asyncio.Event()  # set when a check earlier than any queued was added

    def watch(self, sp: SharePartitionState) -> None:
        if sp.engine is None:
            return
        deadline = sp.engine.next_deadline()
        if deadline is None or (sp.lock_timer is not None and sp.lock_timer <= deadline):
            return  # a check at or before it is queued already; it queues the next one
        sp.lock_timer = deadline
        heapq.heappush(self._heap, (deadline, sp.key))
        if deadline == self._heap[0][0]:
            self.wakeup.set()

    def pop_due(self, now: int, partitions: dict[SharePartitionKey, SharePartitionState]) -> SharePartitionState | None:
        """The next share-partition (of those still in ``partitions``) whose check is due by ``now``."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            due, key = heapq.heappop(heap)
            sp = partitions.get(key)
            if sp is None:
                continue
            if sp.lock_timer == due:
                sp.lock_timer = None
            return sp
        return None

    def next_deadline(self) -> int | None:
        return self._heap[0][0] if self._heap else None


async def wait_for_records(states: Sequence[SharePartitionState], timeout_ms: int, read_committed: bool) -> None:
    """Until any of these share-partitions (of one group) may have something to hand out, or the timeout."""
    if timeout_ms <= 0:
        return
    if not states:  # a session without partitions waits out MaxWaitMs, as on a broker
        await asyncio.sleep(timeout_ms / 1000)
        return
    loop = asyncio.get_running_loop()
    fut = loop.create_future()

    def wake() -> None:
        if not fut.done():
            fut.set_result(None)

    logs = []
    for sp in states:
        sp.waiters.add(fut)
        # New upstream data only helps a share-partition with room in its window; a full one
        # waits for acknowledgements and lock expiries, which wake it through ``waiters``.
        if sp.engine is not None and not sp.engine.has_available() and sp.engine.can_acquire():
            plog = sp.log(read_committed)
            # a hook of this wait's own: another fetch waiting on the same partition removes
            # only its own when it is done
            plog.listeners.add(wake)
            logs.append(plog)
            plog.want_data_from(sp.engine.end_offset)
    try:
        await asyncio.wait_for(fut, timeout_ms / 1000)
    except TimeoutError:
        pass
    finally:
        for sp in states:
            sp.waiters.discard(fut)
        for plog in logs:
            plog.listeners.discard(wake)


def _forget_init(sp: SharePartitionState, task: asyncio.Task) -> None:
    if sp.init_task is task:
        sp.init_task = None
