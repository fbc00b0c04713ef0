"""The share-group service: the lifecycle of groups, share sessions and share-partitions.

It owns the group coordinator, the share sessions, one ``SharePartitionState`` per share-partition
(created on first use, its engine loaded from durable state, dropped with its group or when another
proxy takes it over), the cached partition logs and the timers (member sessions, acquisition locks,
topic changes). The per-API handlers in ``kshare.share.handlers`` resolve their share-partitions
here once and then work on those objects (``kshare.share.partition_state``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine, Iterable
from typing import TYPE_CHECKING, Any

from ..protocol import messages
from ..protocol.codes import ApiKey
from .authorization import ShareAuthorizer
from .config import BrokerLimits, GroupConfig, parse_duration_ms
from .coordinator import GroupCoordinator, ShareGroup
from .dead_letter_writer import DeadLetterWriter
from .drain import drain
from .errors import ErrorCode
from .handlers import HANDLERS
from .instance_group import InstanceGroup
from .instance_service import InstanceGroupMember
from .leaving import SHARE_REQUESTS, Leaving, leave
from .ownership import LocalOwnership, Ownership
from .partition import SharePartition
from .partition_log import PartitionLog, PartitionLogs
from .partition_state import LockTimers, PartitionContext, SharePartitionState
from .peers import PeerClient
from .sessions import ShareSessionCache
from .states import ShareSnapshot
from .stats import CONNECTION_CLOSED, MEMBER_EXPIRED, MEMBER_LEFT, ShareStats
from .store import GroupRecord, SharePartitionKey, StateStore
from .tasks import shared_task
from .topic_watch import TopicWatch
from .upstream import EARLIEST, LATEST, TopicInfo, UpstreamCluster
from .upstream_checks import check_upstream
from .write_queue import WriteFailed, gathering_writes

if TYPE_CHECKING:
    from .frontend import Frontend

log = logging.getLogger("kshare.share")


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


DEFAULT_RECORD_CACHE_BYTES = 256 << 20
LOG_IDLE_S = 60.0  # a partition log unused this long is dropped with its cache
MAX_PRIMING = 64  # share-partitions made ready ahead of their ShareFetches at once (prime)


class ShareGroupService(InstanceGroupMember):
    def __init__(self, proxy: Frontend | None, store: StateStore, upstream: UpstreamCluster, *,
                 limits: BrokerLimits | None = None, ownership: Ownership | None = None,
                 clock=_now_ms, record_cache_bytes: int = DEFAULT_RECORD_CACHE_BYTES) -> None:
        self.proxy = proxy
        # One budget for the raw batches cached by every PartitionLog, divided among the logs in
        # use; a log nobody read for LOG_IDLE_S is dropped (see _sweep_logs).
        self.record_cache_bytes = record_cache_bytes
        self.partition_logs = PartitionLogs(upstream, record_cache_bytes, LOG_IDLE_S)
        self.cache_pool = self.partition_logs.pool  # one budget for every partition log's cache
        self.logs: dict[tuple[bytes, int, bool], PartitionLog] = self.partition_logs.by_key
        self.store = store
        self.upstream = upstream
        self.limits = limits or BrokerLimits()
        self.ownership = ownership or LocalOwnership()
        self.clock = clock
        self.coordinator = GroupCoordinator(upstream.topic_view, clock=clock, limits=self.limits)
        self.sessions = ShareSessionCache(self.limits.max_share_sessions)
        self.partitions: dict[SharePartitionKey, SharePartitionState] = {}
        self.loaded = False
        self.load_error: str | None = None  # why the last load attempt failed, while loading
        self._loaded_event = asyncio.Event()
        self.stats = ShareStats()
        self.locks = LockTimers()
        self.dead_letters = DeadLetterWriter(upstream, self.partition_logs)
        self._tasks: list[asyncio.Task] = []
        self.stopping = False
        self.broken: str | None = None  # why the service cannot go on (a loop of it ended): see _keep
        self._group_writes: dict[str, asyncio.Task] = {}
        self._releases: set[asyncio.Task] = set()  # releases after connections closed, kept referenced
        self._priming: set[asyncio.Task] = set()  # share-partitions a session added, made ready (prime)
        # An instance group (several proxies as one service): set by the app before start. Its
        # ownership decides what this proxy serves; peers answers what other proxies own.
        self.instances: InstanceGroup | None = None
        self.peers: PeerClient | None = None
        self._remote_configs: dict[str, float] = {}  # group id -> when its configs were last asked
        self._asking_configs: dict[str, asyncio.Task] = {}  # group id -> the question in flight
        self.draining = False  # stopping: nothing is handed out any more (drain)
        self.leaving: Leaving | None = None  # leaving the instance group on SIGTERM (kshare.share.leaving)
        # (share-partition, ownership epoch) whose confirmation was put off and said so (instance_service)
        self.unconfirmed_said: set[tuple[SharePartitionKey, int]] = set()
        # confirmations put off, by why: "claims" (this proxy's own not settled), "peer" (one did not answer)
        self.confirmations_put_off: dict[str, int] = {"claims": 0, "peer": 0}
        self._topic_watch = TopicWatch()  # topics seen changed, looked up before the next refresh
        self._topics_wakeup = asyncio.Event()
        self._started_topics: set[tuple[str, str]] = set()  # (group, topic) whose first initialisation was logged
        self._ownership_lock = asyncio.Lock()  # ownership changes one at a time (maps, fencings)
        # whether a client may do what it asks, as the cluster decides (asked as the client)
        self.authz = ShareAuthorizer()
        # what each share-partition is given to do its own work (acquire, acknowledge, persist)
        self.partition_context = PartitionContext(
            store=store, stats=self.stats, clock=clock, logs=self.partition_logs, locks=self.locks,
            dead_letters=self.dead_letters, coordinator=self.coordinator, initialise=self._initialise,
            owns=self.ownership_of)

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
            await self._join_instances()
        for record in self.store.groups().values():
            self._adopt_group(record)
        for key in self.store.share_partitions():
            self.coordinator.ensure_group(key.group_id)
        self.loaded = True
        self._loaded_event.set()
        self._keep(self._timers(), "lock and session timers")
        self._keep(self._refresh_topics(), "topic refresh")
        if self.instances is not None:
            self._keep(self._refresh_remote_configs(), "group config refresh")
        log.info("share state loaded in %.2fs: %d group(s), %d share-partition(s)", time.monotonic() - started,
                 len(self.coordinator.groups), len(self.store.share_partitions()))

    def _keep(self, coro: Coroutine[Any, Any, None], what: str) -> None:
        """Run one of the service's loops for as long as the service runs. One that ends before
        :meth:`stop` is a bug: logged with its traceback, and the proxy reports itself not ready
        (``broken``, kshare_ready 0) instead of serving on without, say, lock expiries."""

        def ended(task: asyncio.Task) -> None:
            if self.stopping or task.cancelled():
                return
            exc = task.exception()
            self.broken = f"its {what} loop ended ({exc!r})"
            log.error("share service: %s", self.broken, exc_info=exc)

        task = asyncio.get_running_loop().create_task(coro)
        task.add_done_callback(ended)
        self._tasks.append(task)

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

    def ownership_of(self, key: SharePartitionKey) -> bool:
        """Whether this proxy leads the share-partition (its ownership may change at run time)."""
        return self.ownership.owns(key)

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

    async def drain(self, timeout_s: float) -> int:
        """Before a stop: hand nothing out any more and let the share consumers acknowledge what
        they hold, for up to ``timeout_s`` (kshare.share.drain). Returns the records still held."""
        if not self.loaded:
            return 0
        self.draining = True
        return await drain(self.partitions, timeout_s)

    async def leave_instance_group(self) -> None:
        """On SIGTERM, drained, in an instance group: leave it while the client connections stay
        open, refusing share requests and showing the others' map until the clients moved
        (kshare.share.leaving). A failure only costs the clients their next metadata refresh."""
        if self.instances is None or not self.loaded:
            return
        try:
            await leave(self)
        except Exception as exc:  # noqa: BLE001 - the stop goes on: the others take over anyway
            log.warning("leaving the instance group: %r; closing client connections now", exc)

    async def stop(self) -> None:
        self.stopping = True
        for task in [*self._tasks, *self._priming]:
            task.cancel()
        self.partition_logs.close()
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
        watch = getattr(self, "handover_watch", None)
        if watch is not None:
            await watch.close()
        if self.peers is not None:
            await self.peers.close()
        await self.store.close()
        await self.dead_letters.stop()
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

    async def member_gone(self, group_id: str, member_id: str, *, expired: bool = False) -> None:
        """A member left or was removed: release what it holds.

        A member that leaves still closes its share sessions itself (a final ShareAcknowledge);
        one removed for missing its session timeout (``expired``) is presumed dead, so its
        sessions go too.
        """
        if expired:
            self.sessions.close_member(group_id, member_id)
        await self.release_member(group_id, member_id, None, MEMBER_EXPIRED if expired else MEMBER_LEFT)

    def connection_closed(self, conn: object) -> None:
        """A client connection closed: its share sessions end, and what their members acquired on
        those partitions becomes available again at once, as on Kafka 4.4 (membership itself still
        follows the heartbeat session timeout)."""
        self.authz.forget(conn)
        for session in self.sessions.close_owner(conn):
            group_id, member_id, _ = session.key
            task = asyncio.get_running_loop().create_task(
                self.release_member(group_id, member_id, list(session.partitions), CONNECTION_CLOSED))
            self._releases.add(task)
            task.add_done_callback(self._release_done)

    def _release_done(self, task: asyncio.Task) -> None:
        self._releases.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("releasing what a member held failed: %r", exc, exc_info=exc)

    async def release_member(self, group_id: str, member_id: str, only: Iterable[tuple[bytes, int]] | None,
                             reason: str) -> None:
        """What the member holds on the group's share-partitions (``only`` these (topic id,
        partition), if given) goes back to the queue, counted under ``reason``
        (kshare.share.stats.RELEASE_REASONS); returns once that is durable.

        A session closing (or its connection) releases only the partitions the member does not
        fetch through another session: on a Kafka cluster each share-partition lives on its
        leader, and a client whose partition moved to another broker closes its session with the
        old one, which holds nothing of it any more. Here one share-partition serves every
        listener: releasing there would take back what the member just acquired through the new
        leader's listener (and may still acknowledge there), and deliver it again."""
        wanted = None if only is None else set(only) - self.sessions.partitions_of(group_id, member_id)
        writes = []
        released = 0
        with gathering_writes(self.store):
            for key, sp in list(self.partitions.items()):
                if key.group_id != group_id or sp.engine is None:
                    continue
                if wanted is not None and (key.topic_id, key.partition) not in wanted:
                    continue
                held = sp.engine.acquired_count()
                write = sp.release_member(member_id, reason)
                released += held - sp.engine.acquired_count()
                if write is not None:
                    writes.append(write)
        if released and reason == CONNECTION_CLOSED:
            # the one release an operator may not expect: a live client whose connection dropped
            # (a request timeout in the client, a load balancer's idle cut) loses what it held
            log.info("share group %s: %d record(s) held by member %s released: its connection closed", group_id,
                     released, member_id)
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
        task = shared_task(self._prime(self.share_partition(group_id, topic, partition), read_committed))
        self._priming.add(task)
        task.add_done_callback(self._priming.discard)

    async def _prime(self, sp: SharePartitionState, read_committed: bool) -> None:
        err, engine = await sp.load()
        if err or engine is None:
            return  # a ShareFetch reaching it meets the error itself
        plog = sp.log(read_committed)
        await plog.read(engine.next_fetch_offset(), plog.fetch_bytes)

    def share_partition(self, group_id: str, topic: TopicInfo, partition: int) -> SharePartitionState:
        """The group's share-partition of the topic-partition, created on first use (its engine is
        loaded by its ``load``)."""
        key = SharePartitionKey(group_id, topic.topic_id, partition)
        sp = self.partitions.get(key)
        if sp is None:
            sp = self.partitions[key] = SharePartitionState(key, topic, self.partition_context)
        return sp

    def drop_share_partitions(self, keys: Iterable[SharePartitionKey]) -> None:
        """Forget these share-partitions (their durable state was deleted)."""
        for key in keys:
            sp = self.partitions.pop(key, None)
            if sp is not None:
                sp.drop()

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
        sp.engine = SharePartition.from_snapshot(durable, clock=self.clock, **_engine_settings(cfg))
        sp.engine.paused = self.draining
        sp.broken = False
        sp.watch_locks()  # records waiting out a redelivery backoff come back when it ends
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
        settings = _engine_settings(group.config)
        for key, sp in self.partitions.items():
            if key.group_id == group.group_id and sp.engine is not None:
                for name, value in settings.items():
                    setattr(sp.engine, name, value)

    def record_cache_size(self) -> int:
        return self.cache_pool.total

    async def classic_group_exists(self, group_id: str) -> bool:
        """Whether the cluster has a consumer (or classic) group with this id, which a share group
        may not reuse (INCONSISTENT_GROUP_PROTOCOL)."""
        try:
            conn = await self.upstream.any_connection()
            find = messages.message_class("FindCoordinatorRequest")
            version = conn.best_version(ApiKey.FIND_COORDINATOR, hi=3)
            resp = await conn.request(ApiKey.FIND_COORDINATOR, version, find(key=group_id, key_type=0))
            if resp.error_code:
                return False
            coord = await self.upstream.connection(resp.node_id)
            describe = messages.message_class("DescribeGroupsRequest")
            dversion = coord.best_version(ApiKey.DESCRIBE_GROUPS, hi=5)
            groups = (await coord.request(ApiKey.DESCRIBE_GROUPS, dversion, describe(groups=[group_id]))).groups
        except Exception as exc:  # noqa: BLE001 - cannot tell: let the share group proceed
            log.debug("checking group %s upstream failed: %r", group_id, exc)
            return False
        # A group that does not exist is "Dead" on Kafka and "Empty" with no protocol on Tansu.
        return any(g.group_id == group_id and g.error_code == 0 and g.group_state not in ("Dead", "")
                   and (g.protocol_type or g.members) for g in groups)

    def register(self, proxy: Frontend) -> None:
        """Serve the share-group APIs on the proxy (and advertise them in ApiVersions)."""
        proxy.disconnect_listeners.append(self.connection_closed)
        proxy.topic_deletion_listeners.append(self.topics_deleted)
        proxy.topic_change_listeners.append(self.topics_changed)
        for h in HANDLERS:
            lo, hi = h.VERSIONS

            def bound(conn, header, body, _handle=h.handle, _share=h.API_KEY in SHARE_REQUESTS):
                if _share and self.leaving is not None:
                    self.leaving.request()  # a client that has not moved yet
                return _handle(self, conn, header, body)

            applies = getattr(h, "applies", None)
            if applies is not None:
                def applies_bound(header, body, _applies=applies):
                    return _applies(self, header, body)
            else:
                applies_bound = None
            proxy.serve(h.API_KEY, lo, hi, bound, applies_bound)

    # -- acquisition locks ----------------------------------------------------------------------------
    async def _timers(self) -> None:
        """Lock expiries and member session timeouts, each handled when due.

        Nothing here waits for the cluster: the release of an expired member's records runs as a
        task of its own, since its durable write can take as long as a state write may (a broker
        failover), and every lock of every share-partition would run late meanwhile. A failure in
        one share-partition is logged and the loop goes on: if this task ended, no lock would
        ever run out again and what stalled consumers hold would never come back."""
        while True:
            now = self.clock()
            while (sp := self.locks.pop_due(now, self.partitions)) is not None:
                try:
                    sp.expire_locks(now)
                except Exception as exc:  # noqa: BLE001 - a bug: logged, and the other locks still run out
                    log.error("expiring the locks of %s failed: %r", sp.key, exc, exc_info=exc)
            for group_id, member_id in self.coordinator.expire(now):
                log.info("share group %s: member %s missed its session timeout; removed", group_id, member_id)
                group = self.coordinator.group(group_id)
                if group is not None:
                    self.persist_group(group)
                task = asyncio.get_running_loop().create_task(self.member_gone(group_id, member_id, expired=True))
                self._releases.add(task)
                task.add_done_callback(self._release_done)
            deadlines = [d for d in (self.locks.next_deadline(), self.coordinator.next_deadline()) if d is not None]
            wait = (min(deadlines) - self.clock()) / 1000 if deadlines else 1.0
            self.locks.wakeup.clear()
            try:
                await asyncio.wait_for(self.locks.wakeup.wait(), timeout=max(0.005, min(wait, 1.0)))
            except TimeoutError:
                pass

    async def _refresh_topics(self) -> None:
        """Follow topic changes (new topics, partitions, deletions) for assignments: every 5 s, and
        at once (every 0.25 s until seen) for topics a client's answer showed changed
        (``topics_changed``)."""
        swept = time.monotonic()
        while True:
            try:
                await asyncio.wait_for(self._topics_wakeup.wait(), timeout=0.25 if self._topic_watch else 1.0)
            except TimeoutError:
                pass
            self._topics_wakeup.clear()
            if time.monotonic() - swept >= 1.0:
                swept = time.monotonic()
                self.partition_logs.sweep()
            try:
                await self.upstream.refresh_metadata(max_age=0.0 if self._topic_watch else 5.0)
            except Exception as exc:  # noqa: BLE001
                log.debug("metadata refresh failed: %r", exc)
                continue
            self._topic_watch.refreshed(self._known_partitions, time.monotonic())
            self._reassign()

    def _known_partitions(self, topic: str) -> int:
        info = self.upstream.topics.get(topic)
        return info.partitions if info is not None else 0

    def topics_changed(self, counts: dict[str, int]) -> None:
        """A CreateTopics, CreatePartitions or Metadata answer to a client showed these partition
        counts (-1: more than known): look the topics up now if that is more than kshare knows, so
        a group reading them gets the new partitions at its members' next heartbeat."""
        if self._topic_watch.seen(counts, self._known_partitions, time.monotonic()):
            self._topics_wakeup.set()

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


def _engine_settings(cfg: GroupConfig) -> dict[str, object]:
    """The group configs a share-partition engine follows, as its keyword arguments (and attributes)."""
    return {"delivery_count_limit": cfg.delivery_count_limit, "max_record_locks": cfg.max_record_locks,
            "record_lock_duration_ms": cfg.record_lock_duration_ms, "renew_enabled": cfg.renew_enabled,
            "redelivery_backoff_ms": cfg.redelivery_backoff_ms,
            "redelivery_backoff_max_ms": cfg.redelivery_backoff_max_ms, "key_ordered": cfg.key_ordered}
