"""The share-group service: the asyncio shell around the sans-I/O cores.

It owns the group coordinator, the share sessions, one ``SharePartitionState`` per share-partition
(the engine plus its durable-write queue and its waiting fetches), the cached partition logs and
the timers (member sessions, acquisition locks, topic changes). The per-API handlers in
``kshare.share.handlers`` translate requests into calls on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import random
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

from ..protocol import messages
from . import dead_letter
from .authorization import ShareAuthorizer
from .config import BrokerLimits, parse_duration_ms
from .coordinator import GroupCoordinator, ShareGroup
from .errors import ErrorCode
from .fairness import FairShare
from .instance_group import InstanceGroup
from .instance_service import InstanceGroupMember
from .ownership import LocalOwnership, Ownership
from .partition import SharePartition
from .partition_log import CachePool, PartitionLog
from .peers import PeerClient
from .sessions import ShareSessionCache
from .state_fence import expect_fencing
from .states import ShareSnapshot, ShareUpdate
from .stats import ShareStats
from .store import GroupRecord, NotOwned, SharePartitionKey, StateStore, StoreWriteError
from .tasks import shared_task
from .upstream import EARLIEST, LATEST, TopicInfo, UpstreamCluster
from .upstream_checks import check_upstream

if TYPE_CHECKING:
    from ..proxy.server import Proxy

log = logging.getLogger("kshare.share")


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class WriteFailed(Exception):
    """A durable write was not acknowledged by the cluster; the change it carried is undone."""


DEFAULT_RECORD_CACHE_BYTES = 256 << 20
LOG_IDLE_S = 60.0  # a partition log unused this long is dropped with its cache
MAX_PRIMING = 64  # share-partitions made ready ahead of their ShareFetches at once (prime)


@dataclass(eq=False)
class SharePartitionState:
    """One share-partition: its engine, its ordered durable writes, the fetches waiting on it."""

    key: SharePartitionKey
    topic: TopicInfo
    engine: SharePartition | None = None
    init_task: asyncio.Task | None = None
    waiters: set[asyncio.Future] = field(default_factory=set)
    # durable writes: queued updates go out together once the previous write is acknowledged
    pending: list[ShareUpdate | ShareSnapshot] = field(default_factory=list)
    pending_done: asyncio.Future | None = None
    writing: bool = False
    writing_done: asyncio.Future | None = None  # the write under way resolves it
    broken: bool = False  # a write failed: rebuild from durable state before serving again
    fair: FairShare = field(default_factory=FairShare)  # the members fetching here, their shares
    lock_timer: int | None = None  # the earliest lock-expiry check queued for it (ms), if any
    # what the next write waits for first: dead letters that must be on the DLQ topic before the
    # write archiving their records (a failed one fails the write, and nothing is archived)
    gates: list[asyncio.Future] = field(default_factory=list)
    write_failing: bool = False  # the last write failed (logged once until one succeeds again)
    keys_warned: bool = False  # a batch whose keys could not be read was warned about (key-ordered groups)

    def wake(self) -> None:
        for fut in self.waiters:
            if not fut.done():
                fut.set_result(None)
        self.waiters.clear()


class ShareGroupService(InstanceGroupMember):
    def __init__(self, proxy: Proxy | None, store: StateStore, upstream: UpstreamCluster, *,
                 limits: BrokerLimits | None = None, ownership: Ownership | None = None,
                 clock=_now_ms, record_cache_bytes: int = DEFAULT_RECORD_CACHE_BYTES) -> None:
        self.proxy = proxy
        # One budget for the raw batches cached by every PartitionLog, divided among the logs in
        # use; a log nobody read for LOG_IDLE_S is dropped (see _sweep_logs).
        self.record_cache_bytes = record_cache_bytes
        self.cache_pool = CachePool(record_cache_bytes)  # one budget for every partition log's cache
        self.store = store
        self.upstream = upstream
        self.limits = limits or BrokerLimits()
        self.ownership = ownership or LocalOwnership()
        self.clock = clock
        self.coordinator = GroupCoordinator(upstream.topic_view, clock=clock, limits=self.limits)
        self.sessions = ShareSessionCache(self.limits.max_share_sessions)
        self.partitions: dict[SharePartitionKey, SharePartitionState] = {}
        self.logs: dict[tuple[bytes, int, bool], PartitionLog] = {}
        self.loaded = False
        self.load_error: str | None = None  # why the last load attempt failed, while loading
        self._loaded_event = asyncio.Event()
        self.stats = ShareStats()
        self._lock_heap: list[tuple[int, SharePartitionKey]] = []
        self._timer_wakeup = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._group_writes: dict[str, asyncio.Task] = {}
        self._releases: set[asyncio.Task] = set()  # releases after connections closed, kept referenced
        self._priming: set[asyncio.Task] = set()  # share-partitions a session added, made ready (prime)
        self._producer = None  # aiokafka producer for dead letters, created on first use
        # An instance group (several proxies as one service): set by the app before start. Its
        # ownership decides what this proxy serves; peers answers what other proxies own.
        self.instances: InstanceGroup | None = None
        self.peers: PeerClient | None = None
        self._remote_configs: dict[str, float] = {}  # group id -> when its configs were last asked
        self._asking_configs: dict[str, asyncio.Task] = {}  # group id -> the question in flight
        self._started_topics: set[tuple[str, str]] = set()  # (group, topic) whose first initialisation was logged
        self._ownership_lock = asyncio.Lock()  # ownership changes one at a time (maps, fencings)
        # whether a client may do what it asks, as the cluster decides (asked as the client)
        self.authz = ShareAuthorizer()

    # -- lifecycle ----------------------------------------------------------------------------------
    async def start(self) -> None:
        """Load durable state, then serve. Until loaded, share RPCs answer COORDINATOR_LOAD_IN_PROGRESS."""
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._load()))

    async def _load(self) -> None:
        started = time.monotonic()
        delay = 0.5
        warned_at = started  # the proxy reports an unreachable cluster at once: report only what lasts
        checked = False
        if hasattr(self.store, "checks"):
            self.store.checks = self.upstream.checks  # one set of findings, one metric
        while True:
            try:
                await self.upstream.refresh_metadata()
                if not checked:
                    await check_upstream(self.upstream.bootstrap_string, self.upstream.security, self.upstream.checks)
                    checked = True
                await self.store.start()
                break
            except Exception as exc:  # noqa: BLE001 - keep trying until the cluster is reachable
                self.load_error = str(exc) or type(exc).__name__
                now = time.monotonic()
                if now - warned_at >= 30:
                    warned_at = now
                    log.warning("loading the share state has failed for %.0f s (%s); retrying",
                                now - started, self.load_error)
                else:
                    log.debug("loading the share state failed (%r); retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10)
        self.load_error = None
        if self.instances is not None:
            expect_fencing(asyncio.get_running_loop())
            await self._join_instances()
        for record in self.store.groups().values():
            self._adopt_group(record)
        for key in self.store.share_partitions():
            self.coordinator.ensure_group(key.group_id)
        self.loaded = True
        self._loaded_event.set()
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._timers()))
        self._tasks.append(loop.create_task(self._refresh_topics()))
        if self.instances is not None:
            self._tasks.append(loop.create_task(self._refresh_remote_configs()))
        log.info("share state loaded in %.2fs: %d group(s), %d share-partition(s)", time.monotonic() - started,
                 len(self.coordinator.groups), len(self.store.share_partitions()))

    def _adopt_group(self, record: GroupRecord) -> None:
        """A durable group record becomes this proxy's group (at start, or when it takes the group over)."""
        group = self.coordinator.ensure_group(record.group_id, epoch=record.group_epoch, configs=record.configs)
        group.epoch = max(group.epoch, record.group_epoch)
        group.config.overrides = dict(record.configs)
        group.topics.update(record.topics)
        group.topic_partitions.update(record.topic_partitions)
        self.apply_config(group)

    # -- an instance group --------------------------------------------------------------------------
    def owns_group(self, group_id: str) -> bool:
        """Whether this proxy coordinates the group (always, unless in an instance group)."""
        return self.ownership.owns_group(group_id)

    def owns_partition(self, topic_id: bytes, partition: int) -> bool:
        """Whether this proxy is the share-partition leader of the topic-partition."""
        return self.ownership.owns_partition(topic_id, partition)

    def share_group(self, group_id: str) -> ShareGroup | None:
        """The share group, if this proxy coordinates it (a share-partition leader's copy of a group
        coordinated elsewhere only mirrors its configs: it is not the group)."""
        group = self.coordinator.group(group_id)
        return group if group is not None and self.owns_group(group_id) else None

    async def wait_loaded(self, timeout: float = 60.0) -> None:
        if not await self.until_loaded(timeout):
            raise TimeoutError(f"share state not loaded in {timeout} s: {self.load_error or 'in progress'}")

    async def until_loaded(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the state to be loaded; whether it is."""
        if not self.loaded:
            try:
                await asyncio.wait_for(self._loaded_event.wait(), timeout)
            except TimeoutError:
                pass
        return self.loaded

    async def stop(self) -> None:
        for task in [*self._tasks, *self._priming]:
            task.cancel()
        for plog in self.logs.values():
            plog.close()
        # the closed client connections' releases queue their writes first (bounded)
        if self._releases:
            await asyncio.wait(list(self._releases), timeout=5)
        # let queued durable writes finish so nothing answered is lost
        pending = [s.pending_done for s in self.partitions.values() if s.pending_done is not None]
        if pending:
            await asyncio.wait(pending, timeout=5)
        if self.instances is not None:
            # the in-flight writes are done: leave the group now, so the others take over at once
            await self.instances.stop()
        if self.peers is not None:
            await self.peers.close()
        await self.store.close()
        if self._producer is not None:
            await self._producer.stop()
        await self.upstream.close()

    # -- groups -------------------------------------------------------------------------------------
    def persist_group(self, group: ShareGroup) -> None:
        """Write the group's record (epoch, configs) in the background; later writes supersede.

        In an instance group only the group's coordinator writes it (another proxy's copy of the
        group only mirrors its configs)."""
        if not self.ownership.owns_group(group.group_id):
            return
        record = GroupRecord(group.group_id, group.epoch, dict(group.config.overrides), dict(group.topics),
                             dict(group.topic_partitions))
        prev = self._group_writes.get(group.group_id)

        async def write() -> None:
            if prev is not None:
                await asyncio.gather(prev, return_exceptions=True)
            try:
                await self.store.write_group(record)
            except Exception as exc:
                log.error("persisting share group %s failed: %r", group.group_id, exc)
                raise

        self._group_writes[group.group_id] = asyncio.get_running_loop().create_task(write())

    async def persist_group_now(self, group: ShareGroup) -> None:
        """Write the group's record and wait until it is durable (config changes are answered after)."""
        self.persist_group(group)
        write = self._group_writes.get(group.group_id)
        if write is not None:
            await write

    async def member_gone(self, group_id: str, member_id: str, *, close_sessions: bool = False) -> None:
        """A member left or was removed: release what it holds.

        A member that leaves still closes its share sessions itself (a final ShareAcknowledge);
        one removed for missing its session timeout is presumed dead, so its sessions go too.
        """
        if close_sessions:
            self.sessions.close_member(group_id, member_id)
        await self.release_member(group_id, member_id, None)

    def connection_closed(self, conn: object) -> None:
        """A client connection closed: its share sessions end, and what their members acquired on
        those partitions becomes available again at once, as on Kafka 4.4 (membership itself still
        follows the heartbeat session timeout)."""
        self.authz.forget(conn)
        for session in self.sessions.close_owner(conn):
            group_id, member_id, _ = session.key
            task = asyncio.get_running_loop().create_task(
                self.release_member(group_id, member_id, list(session.partitions)))
            self._releases.add(task)
            task.add_done_callback(self._releases.discard)

    async def release_member(self, group_id: str, member_id: str, only: Iterable[tuple[bytes, int]] | None) -> None:
        wanted = None if only is None else set(only)
        writes = []
        with self.gathering_writes():
            for key, sp in list(self.partitions.items()):
                if key.group_id != group_id or sp.engine is None:
                    continue
                if wanted is not None and (key.topic_id, key.partition) not in wanted:
                    continue
                sp.fair.leave(member_id)
                update = sp.engine.release_member(member_id)
                if update is not None:
                    # at the delivery count limit the records are archived: dead letters too
                    archived = list(sp.engine.archived)
                    writes.append(self.persist_with_dead_letters(sp, update, (), None, archived))
                    sp.wake()
        for fut in writes:
            try:
                await fut
            except WriteFailed:
                pass

    # -- share-partitions -----------------------------------------------------------------------------
    def prime(self, group_id: str, topic_id: bytes, partition: int, read_committed: bool) -> None:
        """A share session just added this share-partition: initialise it and read its first records
        in the background, so that the ShareFetches reaching it later in their rotation find both
        done. A ShareFetch stops at the first partitions that fill it; without this, a consumer of
        16 new share-partitions met the initialisation of each (its start offset, a durable write)
        and then its first Fetch, one partition per ShareFetch, after its first records (Kafka 4.4
        initialises every partition of a ShareFetch at once)."""
        key = SharePartitionKey(group_id, topic_id, partition)
        sp = self.partitions.get(key)
        if sp is not None and (sp.engine is not None or sp.init_task is not None):
            return  # ready, or on its way
        if len(self._priming) >= MAX_PRIMING:
            return  # a burst (1,000 members joining): the rest wait for their ShareFetches, as before
        topic = self.upstream.by_id.get(topic_id)
        if topic is None or not 0 <= partition < topic.partitions or not self.owns_partition(topic_id, partition):
            return  # the ShareFetch answers these with their errors
        task = shared_task(self._prime(self.partition_state(group_id, topic, partition), read_committed))
        self._priming.add(task)
        task.add_done_callback(self._priming.discard)

    async def _prime(self, sp: SharePartitionState, read_committed: bool) -> None:
        err, engine = await self.engine(sp)
        if err or engine is None:
            return  # a ShareFetch reaching it meets the error itself
        plog = self.partition_log(sp.topic, sp.key.partition, read_committed)
        await plog.read(engine.next_fetch_offset(), plog.fetch_bytes)

    def partition_state(self, group_id: str, topic: TopicInfo, partition: int) -> SharePartitionState:
        key = SharePartitionKey(group_id, topic.topic_id, partition)
        sp = self.partitions.get(key)
        if sp is None:
            sp = self.partitions[key] = SharePartitionState(key, topic)
        return sp

    async def engine(self, sp: SharePartitionState) -> tuple[int, SharePartition | None]:
        """The loaded engine of a share-partition, initialising it on first use (error code, engine)."""
        if sp.engine is not None and not sp.broken:
            return ErrorCode.NONE, sp.engine
        if not self.ownership.owns(sp.key):  # moved to another proxy of the instance group meanwhile
            return ErrorCode.NOT_LEADER_OR_FOLLOWER, None
        task = self.start_engine(sp)
        try:
            return await asyncio.shield(task)
        except WriteFailed:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, None
        except StoreWriteError as exc:  # its first state write (a broker restarting): tried again later
            log.info("share-partition %s %s-%d: its initial state was not written (%s); trying again at the next "
                     "fetch", sp.key.group_id, sp.topic.name, sp.key.partition, exc)
            return ErrorCode.NETWORK_EXCEPTION, None
        except NotOwned:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER, None

    def start_engine(self, sp: SharePartitionState) -> asyncio.Task:
        """The task initialising the share-partition's engine, started unless under way (for
        ``engine``, and for a ShareFetch that answers without waiting for it)."""
        if sp.init_task is None or sp.init_task.done():
            sp.init_task = shared_task(self._initialise(sp))
            # dropped once done (its awaiters hold it): a done task keeps its context, and with
            # it the request that started it, for as long as the share-partition lives (10,000
            # share-partitions: 7 MB)
            sp.init_task.add_done_callback(partial(_forget_init, sp))
        return sp.init_task

    async def _initialise(self, sp: SharePartitionState) -> tuple[int, SharePartition | None]:
        key = sp.key
        group = self.coordinator.ensure_group(key.group_id)
        if not await self.group_configs_from_owner(group, max_age=1.0):
            # without the group's configs its reset policy and limits are not known: the client retries
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, None
        cfg = group.config
        durable = self.store.share_partitions().get(key)
        if durable is None or durable.start_offset < 0:
            err, start = await self._initial_offset(group, sp.topic, key.partition)
            if err:
                return err, None
            snapshot = ShareSnapshot(start, ())
            await self.store.write([(key, snapshot)])
            durable = snapshot
            # once per group and topic at INFO: a group starting on a 1,000-partition topic would
            # otherwise write 1,000 lines that ask nothing of an operator
            first = (key.group_id, sp.topic.name) not in self._started_topics
            if first:
                self._started_topics.add((key.group_id, sp.topic.name))
            log.log(logging.INFO if first else logging.DEBUG,
                    "share-partition %s %s-%d initialised at offset %d (%s)%s", key.group_id, sp.topic.name,
                    key.partition, start, cfg.auto_offset_reset,
                    "; the topic's other new share-partitions of the group are logged at DEBUG" if first else "")
        sp.engine = SharePartition.from_snapshot(
            durable, clock=self.clock, delivery_count_limit=cfg.delivery_count_limit,
            max_record_locks=cfg.max_record_locks, record_lock_duration_ms=cfg.record_lock_duration_ms,
            renew_enabled=cfg.renew_enabled, redelivery_backoff_ms=cfg.redelivery_backoff_ms,
            redelivery_backoff_max_ms=cfg.redelivery_backoff_max_ms, key_ordered=cfg.key_ordered)
        sp.broken = False
        self.watch_locks(sp)  # records waiting out a redelivery backoff come back when it ends
        return ErrorCode.NONE, sp.engine

    async def _initial_offset(self, group: ShareGroup, topic: TopicInfo, partition: int) -> tuple[int, int]:
        """SPSO of a share-partition without state, from ``share.auto.offset.reset``."""
        reset = group.config.auto_offset_reset
        # A partition added to a topic after the group started reading it starts at its beginning,
        # so nothing produced to it is skipped (Kafka initialises new partitions at offset 0 too).
        known_count = group.topic_partitions.get(topic.topic_id)
        if known_count is None:
            group.topic_partitions[topic.topic_id] = topic.partitions
            group.topics[topic.topic_id] = topic.name
            self.persist_group(group)
        if reset == "earliest" or (known_count is not None and partition >= known_count):
            return await self.upstream.list_offset(topic, partition, EARLIEST)
        if reset == "latest":
            return await self.upstream.list_offset(topic, partition, LATEST)
        duration = parse_duration_ms(reset.removeprefix("by_duration:"))
        err, offset = await self.upstream.list_offset(topic, partition, int(time.time() * 1000) - duration)
        if not err and offset < 0:  # nothing that recent: start at the end
            return await self.upstream.list_offset(topic, partition, LATEST)
        return err, offset

    def apply_config(self, group: ShareGroup) -> None:
        """Group configs changed at run time: push them into the live engines (KIP-1240 for the limit)."""
        cfg = group.config
        for key, sp in self.partitions.items():
            if key.group_id == group.group_id and sp.engine is not None:
                sp.engine.delivery_count_limit = cfg.delivery_count_limit
                sp.engine.max_record_locks = cfg.max_record_locks
                sp.engine.record_lock_duration_ms = cfg.record_lock_duration_ms
                sp.engine.renew_enabled = cfg.renew_enabled
                sp.engine.redelivery_backoff_ms = cfg.redelivery_backoff_ms
                sp.engine.redelivery_backoff_max_ms = cfg.redelivery_backoff_max_ms
                sp.engine.key_ordered = cfg.key_ordered

    def partition_log(self, topic: TopicInfo, partition: int, read_committed: bool) -> PartitionLog:
        k = (topic.topic_id, partition, read_committed)
        plog = self.logs.get(k)
        if plog is None:
            plog = self.logs[k] = PartitionLog(self.upstream, topic, partition, read_committed,
                                               budget_bytes=self.record_cache_bytes, pool=self.cache_pool)
            self._share_cache()
        plog.last_used = time.monotonic()
        return plog

    def _share_cache(self) -> None:
        """An equal share of the record cache budget for every log in use, effective at once."""
        if self.logs:
            share = self.record_cache_bytes // len(self.logs)
            for plog in self.logs.values():
                if plog.budget_bytes != share:
                    plog.trim(share)

    def record_cache_size(self) -> int:
        return self.cache_pool.total

    def _sweep_logs(self) -> None:
        """Drop the logs nobody used for LOG_IDLE_S (their cache with them) and give the others an
        equal share of the record cache budget: memory follows the partitions in use, not every
        partition ever read."""
        now = time.monotonic()
        for k, plog in list(self.logs.items()):
            if now - plog.last_used > LOG_IDLE_S and not plog.busy():
                plog.close()
                self.cache_pool.remove(plog)
                del self.logs[k]
        self._share_cache()

    # -- durable writes -------------------------------------------------------------------------------
    def gathering_writes(self) -> contextlib.AbstractContextManager:
        """A block whose share-partition writes go to the cluster together (one Produce round when
        the store is idle) rather than the first alone: for requests touching several partitions."""
        gathering = getattr(self.store, "gathering", None)
        return gathering() if gathering is not None else contextlib.nullcontext()

    def persist(self, sp: SharePartitionState, change: ShareUpdate | ShareSnapshot | None) -> asyncio.Future:
        """Queue a durable write; the future resolves once the cluster acknowledged it (and every
        earlier write of this share-partition). Raises WriteFailed on failure."""
        loop = asyncio.get_running_loop()
        if change is None:  # a barrier: every write queued so far, the one under way included
            if sp.pending_done is not None and not sp.pending_done.done():
                return sp.pending_done
            if sp.writing_done is not None and not sp.writing_done.done():
                return sp.writing_done
            fut = loop.create_future()
            fut.set_result(None)
            return fut
        sp.pending.append(change)
        if sp.pending_done is None or sp.pending_done.done():
            sp.pending_done = loop.create_future()
        done = sp.pending_done
        if not sp.writing:
            sp.writing = True
            first = None
            submit = getattr(self.store, "submit", None)
            if submit is not None and not sp.gates:
                # Handed to the store now, so an idle store writes it before this caller goes on
                # (a turn of the event loop costs a queue wait when the proxy is busy); the
                # task below waits for it and writes whatever queues behind it.
                batch, sp.pending, sp.pending_done = sp.pending, [], None
                sp.writing_done = done
                started = time.perf_counter()
                try:
                    written = submit([(sp.key, c) for c in batch])
                except Exception as exc:  # noqa: BLE001 - reported as a failed write, by the task
                    written = loop.create_future()
                    written.set_exception(exc)
                first = (done, written, started)
            loop.create_task(self._write_loop(sp, first))
        return done

    async def _write_loop(self, sp: SharePartitionState,
                          first: tuple[asyncio.Future, asyncio.Future, float] | None = None) -> None:
        try:
            while sp.pending or first is not None:
                written: asyncio.Future | None = None
                if first is not None:
                    (done, written, started), first = first, None
                    gates: list = []
                else:
                    batch, done = sp.pending, sp.pending_done
                    gates = sp.gates
                    sp.pending, sp.pending_done, sp.gates = [], None, []
                    started = time.perf_counter()
                assert done is not None
                sp.writing_done = done
                try:
                    if gates:
                        await asyncio.gather(*gates)
                    if written is not None:
                        await written
                    else:
                        await self.store.write([(sp.key, change) for change in batch])
                    self.stats.on_state_write(time.perf_counter() - started)
                except Exception as exc:  # noqa: BLE001
                    what = "dead letters" if any(g.done() and not g.cancelled() and g.exception() for g in gates) \
                        else "durable write"
                    name = f"share-partition {sp.key.group_id} {sp.topic.name}-{sp.key.partition}"
                    if isinstance(exc, NotOwned):
                        # an instance group moved it (the move is logged once per state partition)
                        log.info("%s: its state write was refused (%s); what it carried (acknowledgements, "
                                 "releases) was not answered as done, and the new leader serves it", name, exc)
                    else:
                        log.log(logging.DEBUG if sp.write_failing else logging.ERROR,
                                "%s for %s failed: %r; rebuilding it from the state topic (further failures of "
                                "this share-partition are logged at DEBUG until a write succeeds)", what, name, exc)
                    sp.write_failing = True
                    # The engine moved ahead of what is durable: rebuild before serving it again.
                    sp.broken = True
                    sp.engine = None
                    if not done.done():
                        done.set_exception(WriteFailed(str(exc)))
                        done.exception()  # retrieved: waiters may be gone
                    if sp.pending_done is not None and not sp.pending_done.done():
                        sp.pending_done.set_exception(WriteFailed(str(exc)))
                        sp.pending_done.exception()
                    sp.pending, sp.pending_done, sp.gates = [], None, []
                    sp.wake()
                    return
                if sp.write_failing:
                    sp.write_failing = False
                    log.info("durable writes for %s succeed again", sp.key)
                if not done.done():
                    done.set_result(None)
        finally:
            sp.writing = False

    def persist_with_dead_letters(self, sp: SharePartitionState, update: ShareUpdate, ack_batches: Iterable,
                                  member_id: str | None,
                                  archived: Sequence[tuple[int, int, int]] | None = None) -> asyncio.Future:
        """Like ``persist``, but records the operation archived go to the group's DLQ topic first.

        ``archived``: the engine's ``archived`` right after the operation that produced ``update``
        (the update alone misses archived records the SPSO moved past).
        """
        group = self.coordinator.group(sp.key.group_id)
        if archived is None:
            archived = dead_letter.archived_offsets(update)
        if archived:
            self.stats.archived[(sp.key.group_id, sp.topic.name)] += sum(z - a + 1 for a, z, _ in archived)
        if group is None or not group.config.dlq_topic or not archived:
            return self.persist(sp, update)
        ack_batches = list(ack_batches)
        items = dead_letter.letters(archived, dead_letter.rejected_ranges(ack_batches),
                                    dead_letter.acked_ranges(ack_batches, 0))
        if not items:
            return self.persist(sp, update)
        # Queue the write now, so its order among this share-partition's writes is kept, behind a
        # gate: it goes to the state topic only once the dead letters are on the DLQ topic. If they
        # cannot be written, neither is the write (nor the others queued with it): the share-
        # partition is rebuilt from its durable state, so the records are not archived and come
        # back, instead of being archived without their dead letters.
        gate = asyncio.get_running_loop().create_task(self._produce_dead_letters(group, sp, items))
        gate.add_done_callback(_ignore_failure)
        sp.gates.append(gate)
        return self.persist(sp, update)

    async def _produce_dead_letters(self, group: ShareGroup, sp: SharePartitionState, items: list) -> None:
        cfg = group.config
        if cfg.dlq_copy_record:
            plog = self.partition_log(sp.topic, sp.key.partition, cfg.read_committed)
            raw = []
            for offset in sorted({d.offset for d in items}):
                if any(b.base_offset <= offset <= b.last_offset for b, _ in raw):
                    continue
                read = await plog.read(offset, 1 << 20)
                raw.extend(read.batches[:1])
            dead_letter.fill_from_batches(items, [data for _, data in raw])
        producer = await self._dlq_producer()
        sends = []
        for d in items:
            # the copy carries key and value; the original headers are not copied (as Kafka 4.4)
            headers = dead_letter.context_headers(group.group_id, sp.topic.name, sp.key.partition, d)
            key = d.key if cfg.dlq_copy_record else None
            value = d.value if cfg.dlq_copy_record else None
            if key is None and value is None:
                # context headers only (or a copied record without key and value): aiokafka's send()
                # refuses such a record, a batch of our own carries it
                sends.append(await self._send_null_record(producer, cfg.dlq_topic, headers))
            else:
                sends.append(await producer.send(cfg.dlq_topic, value=value, key=key, headers=headers))
        for fut in sends:
            await fut
        log.info("share group %s: %d record(s) of %s-%d dead-lettered to %s", group.group_id, len(items),
                 sp.topic.name, sp.key.partition, cfg.dlq_topic)

    @staticmethod
    async def _send_null_record(producer, topic: str, headers: list[tuple[str, bytes]]) -> asyncio.Future:
        """Produce a record with null key and null value (only headers) to a random partition."""
        partitions = sorted(await producer.partitions_for(topic))
        batch = producer.create_batch()
        batch.append(key=None, value=None, timestamp=None, headers=headers)
        batch.close()
        return await producer.send_batch(batch, topic, partition=random.choice(partitions))

    async def _dlq_producer(self):
        if self._producer is None:
            from aiokafka import AIOKafkaProducer

            producer = AIOKafkaProducer(
                bootstrap_servers=[f"{h}:{p}" for h, p in self.upstream.bootstrap],
                acks="all", enable_idempotence=True, client_id="kshare-dlq", **self.upstream.security.aiokafka_kwargs())
            await producer.start()
            self._producer = producer
        return self._producer

    def skip_to_log_start(self, sp: SharePartitionState, log_start: int) -> None:
        """Records below the log start are gone (retention, DeleteRecords): move the SPSO up to it."""
        engine = sp.engine
        if engine is None or log_start <= engine.start_offset:
            return
        update = engine.skip_to_log_start(log_start)
        if update is not None:
            log.info("share-partition %s %s-%d: records below %d were deleted upstream; SPSO moves there",
                     sp.key.group_id, sp.topic.name, sp.key.partition, log_start)
            self.persist(sp, update).add_done_callback(_ignore_failure)

    async def classic_group_exists(self, group_id: str) -> bool:
        """Whether the cluster has a consumer (or classic) group with this id, which a share group
        may not reuse (INCONSISTENT_GROUP_PROTOCOL)."""
        try:
            conn = await self.upstream.any_connection()
            find = messages.message_class("FindCoordinatorRequest")
            version = conn.best_version(10, hi=3)
            resp = await conn.request(10, version, find(key=group_id, key_type=0))
            if resp.error_code:
                return False
            coord = await self.upstream.connection(resp.node_id)
            describe = messages.message_class("DescribeGroupsRequest")
            dversion = coord.best_version(15, hi=5)
            groups = (await coord.request(15, dversion, describe(groups=[group_id]))).groups
        except Exception as exc:  # noqa: BLE001 - cannot tell: let the share group proceed
            log.debug("checking group %s upstream failed: %r", group_id, exc)
            return False
        # A group that does not exist is "Dead" on Kafka and "Empty" with no protocol on Tansu.
        return any(g.group_id == group_id and g.error_code == 0 and g.group_state not in ("Dead", "")
                   and (g.protocol_type or g.members) for g in groups)

    def register(self, proxy: Proxy) -> None:
        """Serve the share-group APIs on the proxy (and advertise them in ApiVersions)."""
        from .handlers import HANDLERS

        proxy.disconnect_listeners.append(self.connection_closed)
        proxy.topic_deletion_listeners.append(self.topics_deleted)
        for h in HANDLERS:
            lo, hi = h.VERSIONS

            def bound(conn, header, body, _handle=h.handle):
                return _handle(self, conn, header, body)

            applies = getattr(h, "applies", None)
            if applies is not None:
                def applies_bound(header, body, _applies=applies):
                    return _applies(self, header, body)
            else:
                applies_bound = None
            proxy.serve(h.API_KEY, lo, hi, bound, applies_bound)

    # -- acquisition locks ----------------------------------------------------------------------------
    def watch_locks(self, sp: SharePartitionState) -> None:
        if sp.engine is None:
            return
        deadline = sp.engine.next_deadline()
        if deadline is None or (sp.lock_timer is not None and sp.lock_timer <= deadline):
            return  # a check at or before it is queued already; it queues the next one
        # One queued check per partition, not one per acquisition: at 1,000 acquisitions a second
        # the heap held as many entries as records acquired within a lock duration.
        sp.lock_timer = deadline
        heapq.heappush(self._lock_heap, (deadline, sp.key))
        if deadline == self._lock_heap[0][0]:
            self._timer_wakeup.set()

    async def _timers(self) -> None:
        """Lock expiries and member session timeouts, each handled when due."""
        while True:
            now = self.clock()
            while self._lock_heap and self._lock_heap[0][0] <= now:
                due, key = heapq.heappop(self._lock_heap)
                sp = self.partitions.get(key)
                if sp is None:
                    continue
                if sp.lock_timer == due:
                    sp.lock_timer = None
                if sp.engine is None:
                    continue
                held = sp.engine.acquired_count()
                update = sp.engine.expire_locks(now)
                archived = list(sp.engine.archived)
                expired = held - sp.engine.acquired_count()
                if expired:
                    self.stats.lock_timeouts[(key.group_id, sp.topic.name)] += expired
                if update is not None:
                    self.persist_with_dead_letters(sp, update, (), None, archived).add_done_callback(_ignore_failure)
                sp.wake()
                self.watch_locks(sp)
            for group_id, member_id in self.coordinator.expire(now):
                log.info("share group %s: member %s missed its session timeout; removed", group_id, member_id)
                group = self.coordinator.group(group_id)
                if group is not None:
                    self.persist_group(group)
                await self.member_gone(group_id, member_id, close_sessions=True)
            deadlines = [d for d in (self._lock_heap[0][0] if self._lock_heap else None,
                                     self.coordinator.next_deadline()) if d is not None]
            wait = (min(deadlines) - self.clock()) / 1000 if deadlines else 1.0
            self._timer_wakeup.clear()
            try:
                await asyncio.wait_for(self._timer_wakeup.wait(), timeout=max(0.005, min(wait, 1.0)))
            except TimeoutError:
                pass

    async def _refresh_topics(self) -> None:
        """Follow topic changes (new topics, partitions, deletions) for assignments."""
        while True:
            await asyncio.sleep(1.0)
            self._sweep_logs()
            try:
                await self.upstream.refresh_metadata(max_age=5.0)
            except Exception as exc:  # noqa: BLE001
                log.debug("metadata refresh failed: %r", exc)
                continue
            self._reassign()

    def _reassign(self) -> None:
        for group_id in self.coordinator.refresh_topics():
            group = self.coordinator.group(group_id)
            if group is not None:
                self.persist_group(group)

    def topics_deleted(self, deleted: list[tuple[str | None, bytes | None]]) -> None:
        """A DeleteTopics through the proxy deleted these (name, topic id) topics: from now on
        their acknowledgements and fetches are answered UNKNOWN_TOPIC_ID, as Apache Kafka 4.4
        answers them once the deletion reached its metadata (KafkaApis looks every topic id of a
        ShareFetch or ShareAcknowledge up in its metadata cache), instead of NO_ERROR until the
        next metadata refresh (up to 5 s later). Deletions made elsewhere are seen at that refresh."""
        gone = self.upstream.forget_topics(deleted)
        if gone:
            log.info("topics deleted through the proxy: %s", ", ".join(sorted(t.name for t in gone)))
            self._reassign()

    # -- waiting --------------------------------------------------------------------------------------
    async def wait_for_records(self, states: Sequence[SharePartitionState], timeout_ms: int) -> None:
        """Until any of these share-partitions may have something to hand out, or the timeout."""
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
                group = self.coordinator.group(sp.key.group_id)
                rc = group.config.read_committed if group else False
                plog = self.partition_log(sp.topic, sp.key.partition, rc)
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


def _ignore_failure(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()
