"""``TopicStateStore``: the asyncio shell of the state store (see the package doc for the design).

It runs what the pure parts decide: the round scheduler (:mod:`.rounds`) picks the next produce
round, the in-memory state (:mod:`.memory`) encodes it, the producers (:mod:`.producers`) or an
instance group's fenced writers (:mod:`.fence`) send it, and the answers settle it. Replay at start
is :mod:`.replay`, pruning :mod:`.prune`, the topic's creation :mod:`.topic_admin`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

from ...security import ClientSecurity
from ..states import ShareSnapshot, ShareUpdate
from ..store import GroupRecord, SharePartitionKey, StateWrite
from ..upstream_checks import UpstreamChecks, cluster_refusals
from .claimed import ClaimedPartitions, retrieve
from .claims import renew_interval_ms
from .errors import StateNotOwned, StateStoreError, StateWriteError
from .fence import PartitionClaim
from .memory import (
    ADOPT_SHARE,
    DELETE_GROUP,
    DELETE_SHARE,
    WRITE_GROUP,
    WRITE_SHARE,
    InMemoryState,
    OutRecord,
    WriteStats,
    check_batches,
    check_key,
    copy_group,
    refs_of,
)
from .producers import StateProducers
from .prune import PruneSchedule, delete_below, prune_points, refresh_ops
from .replay import LoadStats, load
from .rounds import QueuedWrite, Round, RoundScheduler
from .topic_admin import DEFAULT_TOPIC, ensure_topic

log = logging.getLogger("kshare.share.state_topic")  # the state store's one logger, named as documented


def _on(part: str, name: str) -> property:
    """An attribute of the store kept by one of its parts (one copy, settable)."""
    return property(lambda self: getattr(getattr(self, part), name),
                    lambda self, value: setattr(getattr(self, part), name, value))


class TopicStateStore(ClaimedPartitions):
    """A :class:`kshare.share.store.StateStore` on a topic of the fronted (real) cluster.

    ``bootstrap_servers``: the real cluster (not the proxy). The topic is created if missing with
    ``partitions`` partitions, ``replication_factor`` (default min(3, brokers)),
    ``min.insync.replicas`` (default: 2 from 3 replicas up, else 1), ``cleanup.policy=delete``,
    ``retention.ms=-1`` and ``retention.bytes=-1``. An existing topic keeps its partition count
    (it must never change: the partition of a share-partition's records depends on it).

    Compaction: an update is written as a ShareSnapshot instead when the share-partition already
    has ``snapshot_after_updates`` updates or ``snapshot_after_bytes`` bytes of update values since
    its latest snapshot, or when the snapshot is at most ``snapshot_slack_bytes`` bigger than the
    update (``None``: never for that reason). Pruning runs every ``prune_interval_s``, and sooner
    (at most every ``prune_min_interval_s``) once ``prune_after_records`` records were written and
    some of them were snapshots; a share-partition or group whose latest snapshot / record lies
    more than max(``refresh_after_records``, 4 x keys in its partition) offsets behind the end of
    its partition is rewritten first. ``write_timeout_s`` bounds every write (see the package doc).
    """

    partitions = _on("memory", "partitions")
    leader_epoch = _on("memory", "leader_epoch")  # written with the state (an instance group's ownership epoch)
    snapshot_after_updates = _on("memory", "snapshot_after_updates")
    snapshot_after_bytes = _on("memory", "snapshot_after_bytes")
    snapshot_slack_bytes = _on("memory", "snapshot_slack_bytes")
    max_rounds_in_flight = _on("rounds", "max_in_flight")
    linger_s = _on("rounds", "linger_s")
    producer_count = _on("_producers", "count")
    prune_interval_s = _on("prune_schedule", "interval_s")
    prune_after_records = _on("prune_schedule", "after_records")
    prune_min_interval_s = _on("prune_schedule", "min_interval_s")

    def __init__(
        self,
        bootstrap_servers: str | Sequence[str],
        *,
        topic: str = DEFAULT_TOPIC,
        partitions: int = 10,
        replication_factor: int | None = None,
        min_insync_replicas: int | None = None,
        leader_epoch: int = 0,
        snapshot_after_updates: int = 500,
        snapshot_after_bytes: int = 64 * 1024,
        snapshot_slack_bytes: int | None = 24,
        write_timeout_s: float = 30.0,
        linger_ms: float = 0.0,
        producers: int = 1,
        max_rounds_in_flight: int = 16,
        prune_interval_s: float = 60.0,
        prune_after_records: int = 10_000,
        prune_min_interval_s: float = 5.0,
        refresh_after_records: int = 10_000,
        client_id: str = "kshare-state",
        producer_config: dict[str, Any] | None = None,
        admin_config: dict[str, Any] | None = None,
        consumer_config: dict[str, Any] | None = None,
        transactional_prefix: str | None = None,
        security: ClientSecurity | None = None,
    ) -> None:
        """``transactional_prefix``: an instance group's store (see :meth:`claim`): it loads and
        writes only the partitions it claimed, each with the producer id and epoch of its claim
        (fenced by the broker, :mod:`.fence`).

        ``producers``: idempotent producers (connections) the writes go through, state-topic
        partition ``p`` always through producer ``p % producers`` (so each partition's records keep
        their order, as with one). Produce rounds overlap up to ``max_rounds_in_flight`` (rounds
        touching the same share-partition or group never do); several producers let rounds reach
        the broker at once. ``linger_ms``: a write waits that long for others to go with it."""
        if isinstance(bootstrap_servers, str):
            bootstrap_servers = [s for s in bootstrap_servers.split(",") if s]
        self.bootstrap_servers = list(bootstrap_servers)
        self.topic = topic
        self.replication_factor = replication_factor
        self.min_insync_replicas = min_insync_replicas
        self.write_timeout_s = write_timeout_s
        self.refresh_after_records = refresh_after_records
        self.client_id = client_id
        # TLS and SASL to the cluster, for every client the store runs
        self.security = security or ClientSecurity()
        # what the cluster does differently (the service shares its own: one set of findings)
        self.checks = UpstreamChecks()
        auth = self.security.aiokafka_kwargs()
        self._producer_config = {**auth, **(producer_config or {})}
        self._admin_config = {**auth, **(admin_config or {})}
        self._consumer_config = {**auth, **(consumer_config or {})}

        self.load_stats = LoadStats()
        self.stats = WriteStats()
        self.memory = InMemoryState(partitions, self.stats, leader_epoch=leader_epoch,
                                    snapshot_after_updates=snapshot_after_updates,
                                    snapshot_after_bytes=snapshot_after_bytes,
                                    snapshot_slack_bytes=snapshot_slack_bytes)
        self.rounds = RoundScheduler(max_rounds_in_flight, linger_s=linger_ms / 1000.0)
        self.prune_schedule = PruneSchedule(prune_interval_s, prune_after_records, prune_min_interval_s)
        self._producers = StateProducers(self.bootstrap_servers, topic, count=producers, security=self.security,
                                         client_id=client_id, timeout_s=write_timeout_s, on_resend=self._count_resend)
        self._gathering = 0  # > 0: inside gathering(); an idle store waits for its end to write
        self._round_tasks: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._prune_wake = asyncio.Event()
        self._prune_lock = asyncio.Lock()
        self._prunes = True  # False where the cluster cannot DeleteRecords (Tansu)
        self._admin: Any = None
        self._flusher: asyncio.Task[None] | None = None
        self._maintenance: asyncio.Task[None] | None = None
        self._started = False
        self._closing = False
        self.transactional_prefix = transactional_prefix
        self._writers: dict[int, PartitionClaim] = {}  # claimed partitions (instance group only)
        self._round_lock = asyncio.Lock()  # an instance group's exclusive rounds (claim renewals), release
        # how often a claim is renewed (instance group only): set from the cluster's configs at start
        self.claim_renewal_s = renew_interval_ms(None, None) / 1000
        self._renewer: asyncio.Task[None] | None = None
        # share-partitions whose state this proxy handed over to another (an instance group leading
        # by topic): written no more until taken back (adopt, delete and refresh still go)
        self.frozen: set[SharePartitionKey] = set()
        # told the partitions another proxy fenced this one out of (instance group only)
        self.on_fenced: Callable[[int], None] | None = None
        # A test hook: called with each round whose answers are all in, before it is settled;
        # when it returns an awaitable, the round is settled once that is done (and stays in
        # flight meanwhile), so a test can hold one round's outcome while others start.
        self.settle_gate: Callable[[Round], Awaitable[None] | None] | None = None

    @property
    def claims(self) -> bool:
        """True for an instance group's store, which owns only the partitions it claimed."""
        return self.transactional_prefix is not None

    def claimed(self) -> list[int]:
        return sorted(self._writers)

    def fenced_partitions(self) -> set[int]:
        """Claimed partitions whose writer another proxy fenced (not released yet)."""
        return {p for p, w in self._writers.items() if w.fenced}

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect, create the topic if missing and replay it (the durable state is then loaded)."""
        if self._started:
            return
        from aiokafka.admin import AIOKafkaAdminClient

        self._wake = asyncio.Event()
        self._prune_wake = asyncio.Event()
        self._prune_lock = asyncio.Lock()
        admin_conf = {"request_timeout_ms": int(self.write_timeout_s * 1000), **self._admin_config}
        self._admin = AIOKafkaAdminClient(
            bootstrap_servers=self.bootstrap_servers, client_id=f"{self.client_id}-admin", **admin_conf
        )
        try:
            await self._admin.start()
            created, self.partitions = await ensure_topic(
                self._admin, self.topic, self.partitions, replication_factor=self.replication_factor,
                min_insync_replicas=self.min_insync_replicas, timeout_s=self.write_timeout_s)
            if self.claims:
                self.memory.clear()
                await self._producers.start(idempotent=True, partitions=self.partitions, claims=True)
                self.claim_renewal_s = await self._renewal_interval()
            else:
                await self._load(empty=created)
                await self._start_producers()
        except BaseException:
            await self._close_clients()
            raise
        self._started = True
        self._closing = False
        self._flusher = asyncio.create_task(self._flush_loop(), name="kshare-state-flusher")
        self._maintenance = asyncio.create_task(self._maintenance_loop(), name="kshare-state-pruner")
        if self.claims:
            self._renewer = asyncio.create_task(self._renew_loop(), name="kshare-state-claims")

    async def _load(self, *, empty: bool = False, partitions: Sequence[int] | None = None) -> None:
        self.load_stats = await load(
            self.memory, bootstrap_servers=self.bootstrap_servers, topic=self.topic, client_id=self.client_id,
            request_timeout_s=self.write_timeout_s, consumer_config=self._consumer_config,
            short_end_offsets=self.checks.short_end_offsets, empty=empty, partitions=partitions)

    async def _start_producers(self) -> None:
        # expected on Tansu: one line each at start-up (upstream_checks), and a metric
        refusal, no_pruning = await cluster_refusals(self.bootstrap_servers, self.topic, self.security)
        if refusal is not None:
            self.checks.found("producer_ids", refusal, "state writes use acks=all without idempotence (a write "
                              "the cluster did not confirm may still have landed; replaying it gives the same state)")
        if no_pruning is not None:
            self.checks.found("delete_records", no_pruning, f"the state topic {self.topic} is not pruned (it "
                              "keeps every state record written; replay stays short through re-snapshots)")
        self._prunes = no_pruning is None
        try:
            await self._producers.start(idempotent=refusal is None, partitions=self.partitions)
        except Exception as exc:  # noqa: BLE001 - a cluster that grants producer ids and then fails
            log.warning(
                "the idempotent producer could not start (%r): state writes use acks=all without "
                "idempotence (a write the cluster did not confirm may still have landed; "
                "replaying it gives the same state)",
                exc,
            )
            await self._producers.start(idempotent=False, partitions=self.partitions)

    def _count_resend(self) -> None:
        self.stats.resent_batches += 1

    async def close(self) -> None:
        """Flush pending writes and disconnect."""
        if not self._started:
            await self._close_clients()
            return
        self._closing = True
        self._wake.set()
        if self._flusher is not None:
            with contextlib.suppress(Exception):
                await self._flusher
        for task in (self._maintenance, self._renewer):
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        self._started = False
        await self._close_clients()

    async def _close_clients(self) -> None:
        writers, self._writers = list(self._writers.values()), {}
        await asyncio.gather(*(w.stop() for w in writers), return_exceptions=True)
        admin, self._admin = self._admin, None
        await self._producers.stop()
        if admin is not None:
            with contextlib.suppress(Exception):
                await admin.close()

    async def __aenter__(self) -> TopicStateStore:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- reads -----------------------------------------------------------------------------------

    def share_partitions(self) -> dict[SharePartitionKey, ShareSnapshot]:
        """Durable state of every share-partition: replayed at start, then with every write applied.

        After a failed write: the last acknowledged state of the share-partitions it touched.
        Cheap to call repeatedly (each state is built once per change).
        """
        return {k: e.state for k, e in self.memory.entries.items()}

    def share_partition(self, key: SharePartitionKey) -> ShareSnapshot | None:
        """``share_partitions().get(key)`` without building the dict."""
        e = self.memory.entries.get(key)
        return None if e is None else e.state

    def groups(self) -> dict[str, GroupRecord]:
        return {g: copy_group(v.record) for g, v in self.memory.groups.items()}

    def state_epoch(self, key: SharePartitionKey) -> int | None:
        e = self.memory.entries.get(key)
        return None if e is None else e.state_epoch

    def snapshot_epoch(self, key: SharePartitionKey) -> int | None:
        e = self.memory.entries.get(key)
        return None if e is None else e.snapshot_epoch

    def partition_of(self, key: SharePartitionKey) -> int:
        """The state-topic partition holding ``key``'s records."""
        return self.memory.partition_of(key)

    def log_start_offsets(self) -> dict[int, int]:
        return dict(self.memory.log_start)

    # -- writes ----------------------------------------------------------------------------------

    async def write(self, writes: Sequence[StateWrite]) -> None:
        """Make these writes durable (acks=all); batched with concurrent callers into one round.

        A ShareSnapshot replaces the share-partition's state and is a (re)initialisation: the
        state epoch goes up by one (0 for a share-partition the store has no state for). A
        ShareUpdate is a delta over the current state.
        """
        await self.submit(writes)

    def submit(self, writes: Sequence[StateWrite]) -> asyncio.Future:
        """``write`` without the coroutine: the writes are queued (and, when the store is idle,
        written) before this returns; the future resolves once they are durable. Invalid writes
        raise here."""
        ops: list[tuple] = []
        for key, content in writes:
            check_key(key)
            if key in self.frozen:
                raise StateNotOwned(f"{key} was handed over to another proxy")
            if not isinstance(content, ShareSnapshot | ShareUpdate):
                raise TypeError(f"expected a ShareSnapshot or ShareUpdate, got {type(content).__name__}")
            if content.start_offset < -1:
                raise ValueError(f"{key}: bad start offset {content.start_offset}")
            check_batches(content.state_batches, str(key))
            ops.append((WRITE_SHARE, key, content))
        if not ops:
            fut = asyncio.get_running_loop().create_future()
            fut.set_result(None)
            return fut
        return self._enqueue(ops)

    async def write_group(self, record: GroupRecord) -> None:
        """Persist a group record (durable on return)."""
        if not isinstance(record, GroupRecord):
            raise TypeError(f"expected a GroupRecord, got {type(record).__name__}")
        if not isinstance(record.group_id, str):
            raise TypeError("the group id must be a str")
        for tid in (*record.topics, *record.topic_partitions):
            if len(tid) != 16:
                raise ValueError("topic ids must be 16 bytes")
        await self._enqueue([(WRITE_GROUP, copy_group(record))])

    async def delete_group(self, group_id: str, keys: Sequence[SharePartitionKey]) -> None:
        """Forget the group record, the given share-partitions and any other of the group's."""
        for k in keys:
            check_key(k)
        await self._enqueue([(DELETE_GROUP, group_id, tuple(keys))])

    async def delete_share_partitions(self, keys: Sequence[SharePartitionKey]) -> None:
        """Forget these share-partitions: a tombstone (null value) under each key."""
        for k in keys:
            check_key(k)
        if keys:
            await self._enqueue([(DELETE_SHARE, k) for k in keys])

    async def adopt(self, key: SharePartitionKey, snapshot: ShareSnapshot, state_epoch: int) -> None:
        """Write a share-partition's state taken over from another proxy of an instance group, with
        the given state epoch, where this store keeps the key (else where ``memory.home`` says)."""
        check_key(key)
        check_batches(snapshot.state_batches, str(key))
        await self._enqueue([(ADOPT_SHARE, key, snapshot, state_epoch)])

    async def flush(self) -> None:
        """Wait until everything queued so far has been through a produce round."""
        await self._enqueue([])

    def _enqueue(self, ops: list[tuple]) -> asyncio.Future:
        if not self._started or self._closing:
            raise StateStoreError("the state store is not running")
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        rounds = self.rounds
        rounds.add(QueuedWrite(ops, fut, refs_of(ops)))
        if rounds.idle and len(rounds.queue) == 1 and not rounds.linger_s and not self._gathering:
            # An idle store writes at once: no turn of the event loop between the caller (an
            # acknowledgement being applied) and its Produce request. Under load, rounds are in
            # flight and the flusher gathers what queues meanwhile into the next round.
            self._start_round_now()
        else:
            self._wake.set()
        return fut

    @contextlib.contextmanager
    def gathering(self) -> Iterator[None]:
        """Writes submitted inside this block go out together, in one round when the store is idle.

        A request that acknowledges several share-partitions (a ShareFetch over 4 partitions)
        submits one write each. Without this, an idle store would write the first alone at once
        and the rest in a second round, and the broker answers one connection's requests in turn:
        the request would wait for two Produce round trips instead of one."""
        self._gathering += 1
        try:
            yield
        finally:
            self._gathering -= 1
            rounds = self.rounds
            if not self._gathering and rounds.queue and rounds.idle and not rounds.linger_s:
                self._start_round_now()

    # -- the flusher: rounds started, sent and settled -------------------------------------------

    async def _flush_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            linger = self.rounds.linger_left()
            if linger and not self._closing:
                await asyncio.sleep(linger)
            try:
                self._start_round()
            except Exception:  # noqa: BLE001 - never let the flusher die
                log.exception("state store: cannot start a produce round")
            if self._closing and not self.rounds.queue and self.rounds.idle:
                return

    def _start_round_now(self) -> None:
        """A round in the caller's turn of the event loop (the flusher tries again if it fails)."""
        try:
            self._start_round()
        except Exception:  # noqa: BLE001 - the flusher tries again
            log.exception("state store: cannot start a produce round")
            self._wake.set()

    def _start_round(self) -> None:
        """Start a produce round with every queued write that may go now (see :mod:`.rounds`).
        The round that first replaces a producer, or renews an instance group's claims, runs
        alone."""
        if self.claims:
            alone = any(c.renewal_due(self.claim_renewal_s) for c in self._writers.values())
        else:
            alone = self._producers.renewing
        r = self.rounds.next_round(alone=alone)
        if r is None:
            return
        # An ordinary round is encoded and written now, in the caller's turn of the event loop, and
        # settled by the answers' callbacks (each turn between an acknowledgement and its Produce
        # request, or between the Produce answer and the acknowledgement's, costs a queue wait when
        # the proxy is busy). Exclusive and claimed rounds may have to wait first (a producer to
        # replace, claims to renew), so a task does all of theirs.
        failed: Exception | None = None
        if not r.exclusive and self._producers.producers:
            try:
                sent = self._send_round(r)
            except Exception as exc:  # noqa: BLE001 - reported by the round's task
                failed = exc
            else:
                self._settle_when_answered(r, *sent)
                return
        self._spawn(self._run_round(r, failed))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro, name="kshare-state-round")
        self._round_tasks.add(task)
        task.add_done_callback(self._round_tasks.discard)

    def _send_round(self, r: Round) -> tuple[list[OutRecord], list[asyncio.Future | None]]:
        """Encode an ordinary round and hand its records to the producers, who write them now."""
        out = self.memory.encode_round(r)
        producers = self._producers
        sends: list[asyncio.Future | None] = []
        claims = self.claims
        for rec in out:
            if claims:
                refused = self._writable(rec.partition)
                if refused is not None:
                    rec.error = refused
                    sends.append(None)
                    continue
            try:
                fut: asyncio.Future | None = producers.for_partition(rec.partition).enqueue(
                    self.topic, value=rec.value, key=rec.key, partition=rec.partition
                )
            except Exception as exc:  # noqa: BLE001 - reported to the caller
                rec.error = StateWriteError(f"state record not sent: {exc!r}")
                fut = None
            sends.append(fut)
        for producer in producers.producers:
            producer.flush()
        return out, sends

    def _settle_when_answered(self, r: Round, out: list[OutRecord], sends: list[asyncio.Future | None]) -> None:
        """Settle a round written now as soon as its last Produce answer is in, from that answer's
        callback: no task to wake in between (each turn of the event loop between the cluster's
        answer and the acknowledgement's own answer is a queue wait when the proxy is busy)."""
        pending = [f for f in sends if f is not None]
        left = len(pending)
        timer: asyncio.TimerHandle | None = None
        finished = False

        def finish() -> None:
            nonlocal finished
            if finished:
                return
            finished = True
            if timer is not None:
                timer.cancel()
            for fut in pending:
                if not fut.done():  # may still land later; retrieve the outcome so nothing warns
                    fut.remove_done_callback(answered)
                    fut.add_done_callback(self._late_outcome)
            hold = self.settle_gate(r) if self.settle_gate is not None else None
            if hold is not None:
                self._spawn(self._settle_after(hold, r, out, sends))
                return
            try:
                self._record_outcomes(r, out, sends)
            except Exception as exc:  # noqa: BLE001 - reported to the callers
                self._round_failed(r, exc)
            finally:
                self._round_done(r)

        def answered(_: asyncio.Future) -> None:
            nonlocal left
            left -= 1
            if left == 0:
                finish()

        if not pending:
            finish()
            return
        timer = asyncio.get_running_loop().call_later(self.write_timeout_s, finish)
        for fut in pending:
            fut.add_done_callback(answered)

    async def _settle_after(self, hold: Awaitable[None], r: Round, out: list[OutRecord],
                            sends: list[asyncio.Future | None]) -> None:
        try:
            await hold
            self._record_outcomes(r, out, sends)
        except Exception as exc:  # noqa: BLE001 - reported to the callers
            self._round_failed(r, exc)
        finally:
            self._round_done(r)

    async def _gate(self, r: Round) -> None:
        hold = self.settle_gate(r) if self.settle_gate is not None else None
        if hold is not None:
            await hold

    def _round_failed(self, r: Round, exc: Exception) -> None:
        log.exception("state store: produce round failed")
        self.memory.roll_back_round(r.undo)
        for it in r.items:
            if not it.future.done():
                it.future.set_exception(StateWriteError(f"state write failed: {exc!r}"))

    def _round_done(self, r: Round) -> None:
        """After the round's outcome (and any rollback): what it touched is free for the next."""
        self.rounds.settled(r)
        self._wake.set()

    async def _run_round(self, r: Round, failed: Exception | None = None) -> None:
        try:
            if failed is not None:
                raise failed
            if self.claims:
                async with self._round_lock:
                    await self._renew_claims()
                    await self._round(r)
            else:
                await self._round(r)
        except Exception as exc:  # noqa: BLE001 - reported to the callers
            self._round_failed(r, exc)
        finally:
            self._round_done(r)

    async def _round(self, r: Round) -> None:
        """A round that runs in a task: an exclusive one (replacing the producers first if asked)."""
        producers = self._producers
        if r.exclusive and producers.renewing and not self.claims:
            try:
                await producers.renew(self.partitions)
            except Exception as exc:  # noqa: BLE001 - this round fails, the next one tries again
                producers.renew_failures += 1
                log.log(logging.WARNING if producers.renew_failures == 1 else logging.DEBUG,
                        "state topic %s: cannot replace the state producer yet: %r", self.topic, exc)
                self._fail_items(r, StateWriteError(f"state write failed: {exc!r}"))
                return
        if not producers.producers:
            self._fail_items(r, StateWriteError("the state producer is not running"))
            return
        out = self.memory.encode_round(r)
        sends: list[asyncio.Future | None] = []
        deadline = time.monotonic() + self.write_timeout_s
        try:
            # send() only waits when the producer's buffer for a partition is full
            async with asyncio.timeout(self.write_timeout_s):
                for rec in out:
                    if self.claims:
                        refused = self._writable(rec.partition)
                        if refused is not None:
                            rec.error = refused
                            sends.append(None)
                            continue
                    try:
                        fut = await producers.for_partition(rec.partition).send(
                            self.topic, value=rec.value, key=rec.key, partition=rec.partition
                        )
                    except Exception as exc:  # noqa: BLE001 - reported to the caller
                        rec.error = StateWriteError(f"state record not sent: {exc!r}")
                        fut = None
                    sends.append(fut)
        except TimeoutError:
            pass
        for rec in out[len(sends) :]:
            rec.error = StateWriteError(f"state record not sent within {self.write_timeout_s:.0f} s")
            sends.append(None)
        pending = [f for f in sends if f is not None]
        if pending:
            _, not_done = await asyncio.wait(pending, timeout=max(0.0, deadline - time.monotonic()))
            for fut in not_done:  # may still land later; retrieve the outcome so nothing warns
                fut.add_done_callback(self._late_outcome)
        await self._gate(r)
        self._record_outcomes(r, out, sends)

    @staticmethod
    def _fail_items(r: Round, exc: StateWriteError) -> None:
        for it in r.items:
            if not it.future.done():
                it.future.set_exception(exc)

    def _record_outcomes(self, r: Round, out: list[OutRecord], sends: list[asyncio.Future | None]) -> None:
        """Each record's offset or error from its send, then the round's writes settled."""
        claims = self._writers if self.claims else None
        for rec, fut in zip(out, sends, strict=True):
            if fut is None:
                continue
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                rec.offset = fut.result().offset
                continue
            exc = fut.exception() if fut.done() and not fut.cancelled() else None
            if not fut.done():
                rec.error = StateWriteError(f"state record not acknowledged within {self.write_timeout_s:.0f} s")
            elif exc is None:
                rec.error = StateWriteError("state record send cancelled")
            else:
                rec.error = StateWriteError(f"state record not written: {exc!r}")
            if claims is None:
                if exc is not None:
                    self._producers.send_failed()
                continue
            # an instance group's partition: fenced by another proxy's claim, or its sequence broken
            c = claims.get(rec.partition)
            was_fenced = c is not None and c.fenced
            if c is not None and c.write_failed(exc):
                rec.error = StateNotOwned(f"state partition {rec.partition} was taken over by another proxy")
                if self.on_fenced is not None and not was_fenced:  # told once per partition
                    self.on_fenced(rec.partition)
        self._settle(out, r)

    def _late_outcome(self, fut: asyncio.Future) -> None:
        """Outcome of a send still pending when its round gave up on it (the round marked an
        instance group's claim for renewal already)."""
        if self.claims:
            retrieve(fut)
        else:
            self._producers.late_outcome(fut)

    def _settle(self, out: list[OutRecord], r: Round) -> None:
        """The round's outcome into the state (failures rolled back), then to its callers."""
        wrote_snapshots, failed = self.memory.settle(out, r.undo)
        if self.prune_schedule.wrote(len(out), snapshots=wrote_snapshots, failed=failed):
            self._prune_wake.set()  # early: past the record threshold, or to rewrite what failed
        stats = self.stats
        for item in r.items:
            stats.writes += 1
            if item.future.done():
                continue
            if item.error is None:
                item.future.set_result(None)
            else:
                item.future.set_exception(item.error)

    # -- pruning ---------------------------------------------------------------------------------

    def prune_points(self) -> dict[int, int]:
        """Per partition: the lowest offset replay still needs (everything below may go)."""
        scope = self._writers if self.claims else range(self.partitions)
        return prune_points(self.memory, scope, (r.undo for r in self.rounds.in_flight))

    async def refresh_idle(self) -> int:
        """Re-snapshot share-partitions (and rewrite group records) lagging far behind their
        partition's end, so they stop pinning the log. Returns how many were rewritten."""
        ops = refresh_ops(self.memory, self.refresh_after_records)
        if self.claims:  # not what this proxy may not write (a fenced partition not yet given up)
            ops = self._writable_ops(ops)
        if ops:
            await self._enqueue(ops)
        return len(ops)

    async def prune(self, *, refresh: bool = True) -> dict[int, int]:
        """DeleteRecords below :meth:`prune_points` where that moves a log start offset.

        Returns the new log start offset of every partition it moved.
        """
        async with self._prune_lock:
            if refresh:
                await self.refresh_idle()
            self.prune_schedule.passed()
            if not self._prunes:
                return {}  # the re-snapshots above still keep replay short
            log_start = self.memory.log_start
            moved = await delete_below(self._admin, self.topic, self.prune_points(), log_start, self.write_timeout_s)
            if moved is None:
                return {}
            for p, low in moved.items():
                before = log_start.get(p, 0)
                if low > before:
                    self.stats.pruned_records += low - before
                log_start[p] = low
            self.stats.prunes += 1
            return moved

    async def _maintenance_loop(self) -> None:
        while not self._closing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._prune_wake.wait(), timeout=self.prune_interval_s)
            self._prune_wake.clear()
            if self._closing:
                return
            wait = self.prune_schedule.wait_s()
            if wait > 0:
                await asyncio.sleep(wait)
            try:
                await self.prune()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - retried next interval
                log.warning("state topic %s: pruning failed: %r", self.topic, exc)


__all__ = ["TopicStateStore"]
