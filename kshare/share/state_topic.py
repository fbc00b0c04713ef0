"""``TopicStateStore``: durable share-partition state on a topic of the fronted cluster.

The KIP-932 design (seed 001, ``docs/state-format.md``): a ``delete``-policy topic with unlimited
retention holds ShareSnapshot records (the whole durable state of a share-partition) and
ShareUpdate records (deltas over the latest snapshot), keyed by (group, topic id, partition) so
that every record of a share-partition is in one partition, in write order. The store

* **writes** through one idempotent ``acks=all`` producer. Callers append to a queue and await a
  future; the flusher sends everything pending that may go as one produce round and resolves the
  futures once every record of the round is acknowledged, so concurrent writes from many
  share-partitions and groups cost one round. Rounds overlap: a write arriving while a round is in
  flight is handed to the producer at once (aiokafka sends it the moment the request before it is
  answered) unless a round in flight touches the same share-partition or group, in which case it
  waits for that round to be settled (acknowledged, or failed and rolled back) and is then encoded
  on its result. So each share-partition's records are encoded, sent and settled strictly one
  round after the other, each round keeps its own undo, and a failed round can never have a later
  round of the same share-partition built on its unacknowledged state;
* **compacts**: it applies every write it makes to an in-memory copy of the durable state, counts
  updates and bytes per share-partition since its last snapshot and, past a threshold, writes a
  ShareSnapshot (computed with :func:`states.apply_update`) instead of the update. It also writes a
  snapshot whenever the snapshot is hardly bigger than the update (e.g. the SPSO moved and nothing
  is in flight), which is the common case and lets pruning follow the head of the log;
* **prunes** with DeleteRecords every state-topic partition below the oldest record replay still
  needs: the latest acknowledged snapshot of every live share-partition and the latest group
  record of every group in that partition. Idle share-partitions whose snapshot lags far behind
  the end of their partition are re-snapshotted first so they do not pin the log forever;
* **recovers** in :meth:`TopicStateStore.start` by reading every partition from its log start to
  the end offsets read at start and replaying: latest snapshot + later updates with the same
  snapshot epoch, group records, tombstones. Records it cannot decode are skipped, one logged
  error each.

Failure semantics: :meth:`write` returns only after the cluster acknowledged every record of the
call (``acks=all``), whatever other rounds are in flight. It raises :class:`StateWriteError` when
that did not happen within ``write_timeout_s`` (the records may still land later, in order). A
write the cluster acknowledges within the window succeeds even across a broker restart. After a
failed write the in-memory state (and the caller's engine) is ahead of the topic, so the next
write of that share-partition is a full snapshot, which makes the topic whole again; it is encoded
only once the failed round was rolled back.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..security import ClientSecurity
from .state.codec import (
    RECORD_SNAPSHOT,
    GroupTombstone,
    GroupValueRecord,
    ShareTombstone,
    SnapshotRecord,
    StateRecordError,
    UpdateRecord,
    decode_record,
    encode_group_key,
    encode_group_value,
    encode_share_key,
    encode_snapshot_value,
    encode_update_value,
    is_normalized,
    partition_for,
    partition_for_group,
    snapshot_value_size,
    update_value_size,
)
from .state.fence import Fenced, PartitionWriter
from .state.pipelined_producer import PipelinedProducer
from .states import (
    TERMINAL_STATES,
    ShareSnapshot,
    ShareUpdate,
    StateBatch,
    apply_update,
    normalize,
)
from .store import GroupRecord, NotOwned, SharePartitionKey, StateWrite, StoreWriteError
from .upstream_checks import UpstreamChecks, cluster_refusals

log = logging.getLogger(__name__)

DEFAULT_TOPIC = "__share_group_state"
#: The name to use where Kafka itself owns ``__share_group_state`` (Apache Kafka 4.x clusters).
ALTERNATIVE_TOPIC = "__kshare_share_group_state"


class StateStoreError(Exception):
    """The state store cannot do what was asked (not started, closed, misconfigured topic)."""


class StateWriteError(StateStoreError, StoreWriteError):
    """A write was not acknowledged by the cluster; it may or may not be on the topic."""


class StateNotOwned(StateWriteError, NotOwned):
    """An instance group's store does not (or no longer) own the state partition: nothing was written."""


@dataclass(slots=True)
class LoadStats:
    """What :meth:`TopicStateStore.start` found on the topic."""

    seconds: float = 0.0
    records: int = 0
    bytes: int = 0
    skipped: int = 0
    snapshots: int = 0
    updates: int = 0
    tombstones: int = 0
    group_records: int = 0
    share_partitions: int = 0
    groups: int = 0


@dataclass(slots=True)
class WriteStats:
    """Counters since start (``rounds`` = produce rounds: one flush of everything pending)."""

    rounds: int = 0
    writes: int = 0  # write()/write_group()/delete_*() calls completed (ok or not)
    records: int = 0  # records acknowledged by the cluster
    bytes: int = 0  # key + value bytes of those records
    snapshots: int = 0
    updates: int = 0
    compactions: int = 0  # snapshots written in place of an update past the thresholds
    refreshes: int = 0  # snapshots/group records rewritten so idle keys stop pinning the log
    tombstones: int = 0
    group_records: int = 0
    failed_records: int = 0
    resent_batches: int = 0  # batches sent again to a new leader (state_producer: leader moves)
    prunes: int = 0  # DeleteRecords rounds
    pruned_records: int = 0  # by how much log start offsets moved in total
    max_round_records: int = 0


_MAX = 1 << 63


def apply_update_in_place(start: int, batches: list[StateBatch], update: ShareUpdate) -> int:
    """:func:`states.apply_update` on a normalized state held as (start, list), in place.

    Returns the new start offset; ``batches`` is changed in place. Same result as
    ``apply_update(ShareSnapshot(start, tuple(batches)), update)`` whenever the input is normalized
    (merged, nothing below the start, no settled prefix; every state the store holds is), but
    the work is proportional to the update, not to the state: merging is local to each written
    range and the start moves with a bisect. Replaying a long chain of updates on a state with
    thousands of ranges is what makes this matter.
    """
    for b in update.state_batches:
        first, last, state, count = b
        if first > last:
            raise ValueError(f"state batch with first offset {first} > last offset {last}")
        # Batches are sorted, non-overlapping tuples: bisect compares whole tuples, in C.
        lo = bisect_left(batches, (first,))  # first batch starting at or after `first` ...
        if lo and batches[lo - 1][1] >= first:  # ... or the one before, if it covers `first`
            lo -= 1
        hi = bisect_right(batches, (last, _MAX))  # past every batch starting at or before `last`
        new = StateBatch(first, last, state, count)
        pos = lo
        if lo < hi:
            head, tail = batches[lo], batches[hi - 1]
            replacement = [new]
            if head[0] < first:
                replacement.insert(0, StateBatch(head[0], first - 1, head[2], head[3]))
                pos += 1
            if tail[1] > last:
                replacement.append(StateBatch(last + 1, tail[1], tail[2], tail[3]))
            batches[lo:hi] = replacement
        else:
            batches.insert(lo, new)
        # The list was merged; only the new batch can join a neighbour.
        if pos:
            left = batches[pos - 1]
            if left[1] + 1 == first and left[2] == state and left[3] == count:
                new = batches[pos - 1] = StateBatch(left[0], last, state, count)
                del batches[pos]
                pos -= 1
        if pos + 1 < len(batches):
            right = batches[pos + 1]
            if right[0] == last + 1 and right[2] == state and right[3] == count:
                batches[pos] = StateBatch(new[0], right[1], state, count)
                del batches[pos + 1]
    if update.start_offset != -1:
        start = update.start_offset
    if start < 0:
        return start
    k = bisect_left(batches, (start,))  # first batch starting at or after the start
    if k and batches[k - 1].last_offset >= start:
        k -= 1
    if k:
        del batches[:k]
    if batches and batches[0].first_offset < start:
        batches[0] = batches[0]._replace(first_offset=start)
    i = 0
    n = len(batches)
    while i < n and batches[i].first_offset == start and batches[i].delivery_state in TERMINAL_STATES:
        start = batches[i].last_offset + 1
        i += 1
    if i:
        del batches[:i]
    return start


_ENTRY_FIELDS = (
    "snapshot_epoch",
    "state_epoch",
    "leader_epoch",
    "updates",
    "update_bytes",
    "snapshot_offset",
    "resync",
)


def _entry_fields(e: _Entry) -> tuple:
    return tuple(getattr(e, f) for f in _ENTRY_FIELDS)


def _set_entry_fields(e: _Entry, values: tuple) -> None:
    for f, v in zip(_ENTRY_FIELDS, values, strict=True):
        setattr(e, f, v)


class _Entry:
    """The store's view of one share-partition (its durable state once every write landed)."""

    __slots__ = (
        "start",
        "batches",
        "snapshot_epoch",
        "state_epoch",
        "leader_epoch",
        "partition",
        "updates",
        "update_bytes",
        "snapshot_offset",
        "resync",
        "cached",
    )

    def __init__(
        self,
        state: ShareSnapshot,
        partition: int,
        snapshot_epoch: int = 0,
        state_epoch: int = 0,
        leader_epoch: int = 0,
    ) -> None:
        self.start = state.start_offset
        self.batches = list(state.state_batches)
        self.partition = partition
        self.snapshot_epoch = snapshot_epoch
        self.state_epoch = state_epoch
        self.leader_epoch = leader_epoch
        self.updates = 0  # updates since the latest snapshot
        self.update_bytes = 0
        self.snapshot_offset: int | None = None  # offset of the latest acknowledged snapshot
        self.resync = False  # a write failed: the next write must be a snapshot
        self.cached: ShareSnapshot | None = state  # ``state``, until start/batches change

    @property
    def state(self) -> ShareSnapshot:
        if self.cached is None:
            self.cached = ShareSnapshot(self.start, tuple(self.batches))
        return self.cached

    def set_state(self, state: ShareSnapshot) -> None:
        self.start = state.start_offset
        self.batches = list(state.state_batches)
        self.cached = state

    def apply(self, update: ShareUpdate) -> None:
        self.cached = None
        self.start = apply_update_in_place(self.start, self.batches, update)


class _Group:
    __slots__ = ("record", "partition", "offset", "resync")

    def __init__(self, record: GroupRecord, partition: int) -> None:
        self.record = record
        self.partition = partition
        self.offset: int | None = None  # offset of the latest acknowledged group record
        self.resync = False


# queued operations
_SP, _GROUP, _DEL_SP, _DEL_GROUP, _REFRESH_SP, _REFRESH_GROUP = range(6)


@dataclass(slots=True)
class _Pending:
    ops: list[tuple]
    future: asyncio.Future[None]
    error: BaseException | None = None
    records: int = 0
    # what the write touches (share-partition keys, ("group", id)); None: it cannot be told before
    # it is encoded (a group deletion) or it must follow everything before it (a flush)
    refs: frozenset | None = None


def _refs_of(ops: list[tuple]) -> frozenset | None:
    refs = []
    for op in ops:
        kind = op[0]
        if kind in (_SP, _DEL_SP, _REFRESH_SP):
            refs.append(op[1])
        elif kind == _GROUP:
            refs.append(("group", op[1].group_id))
        elif kind == _REFRESH_GROUP:
            refs.append(("group", op[1]))
        else:  # _DEL_GROUP: every share-partition of the group, as known when it is encoded
            return None
    return frozenset(refs) if refs else None


@dataclass(slots=True, eq=False)
class _Round:
    """A produce round in flight: its writes, what they touch and how to undo it.

    Rounds overlap (up to ``max_rounds_in_flight``), but never two that touch the same share-partition
    or group: a write waits for every earlier round touching what it touches to be settled, so the
    writes of one share-partition are encoded, sent and settled one round after the other, each on
    the acknowledged (or, after a failure, rolled back) result of the one before.
    """

    items: list[_Pending]
    refs: frozenset  # union of the items' refs
    exclusive: bool  # nothing else in flight meanwhile (group deletions, flushes, producer renewal)
    undo: dict[Any, tuple | None]  # the state of every share-partition / group before this round


@dataclass(slots=True)
class _Out:
    """One record of a round and what to update when it is acknowledged."""

    item: _Pending
    partition: int
    key: bytes
    value: bytes | None
    kind: str  # "snapshot" | "update" | "group" | "tombstone"
    owner: Any = None  # _Entry / _Group whose offsets to record
    ref: Any = None  # SharePartitionKey, or ("group", group id): what to roll back on failure
    offset: int = -1
    error: BaseException | None = None


def _copy_group(record: GroupRecord) -> GroupRecord:
    return replace(
        record,
        configs=dict(record.configs),
        topics=dict(record.topics),
        topic_partitions=dict(record.topic_partitions),
    )


def _check_batches(batches: Iterable[StateBatch], what: str) -> None:
    for b in batches:
        first, last, state, count = b
        if not (0 <= first <= last):
            raise ValueError(f"{what}: state batch {first}-{last} is not a valid offset range")
        if state not in (0, 2, 4):
            raise ValueError(f"{what}: delivery state {state} is not durable (0, 2 or 4)")
        if not (0 <= count <= 0x7FFF):
            raise ValueError(f"{what}: delivery count {count} out of range")


def _check_key(key: SharePartitionKey) -> None:
    if not isinstance(key, SharePartitionKey):
        raise TypeError(f"expected a SharePartitionKey, got {type(key).__name__}")
    if not isinstance(key.group_id, str):
        raise TypeError("the group id must be a str")
    if not isinstance(key.topic_id, bytes | bytearray) or len(key.topic_id) != 16:
        raise ValueError(f"{key}: the topic id must be 16 bytes")
    if not (0 <= key.partition <= 0x7FFFFFFF):
        raise ValueError(f"{key}: bad partition {key.partition}")
    if len(key.group_id.encode()) > 0x7FFF:
        raise ValueError("group id too long")


class TopicStateStore:
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
    its partition is rewritten first. ``write_timeout_s`` bounds every write (see the module doc).
    """

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
        writes only the partitions it claimed, each through a fenced transactional producer.

        ``producers``: idempotent producers (connections) the writes go through, state-topic
        partition ``p`` always through producer ``p % producers`` (so each partition's records keep
        their order, as with one). Produce rounds overlap up to ``max_rounds_in_flight`` (rounds
        touching the same share-partition or group never do); aiokafka keeps one request per
        producer and broker in flight, so several producers let rounds reach the broker at once."""
        if isinstance(bootstrap_servers, str):
            bootstrap_servers = [s for s in bootstrap_servers.split(",") if s]
        self.bootstrap_servers = list(bootstrap_servers)
        self.topic = topic
        self.partitions = partitions
        self.replication_factor = replication_factor
        self.min_insync_replicas = min_insync_replicas
        self.leader_epoch = leader_epoch
        self.snapshot_after_updates = snapshot_after_updates
        self.snapshot_after_bytes = snapshot_after_bytes
        self.snapshot_slack_bytes = snapshot_slack_bytes
        self.write_timeout_s = write_timeout_s
        self.linger_s = linger_ms / 1000.0
        self.producer_count = max(1, producers)
        self.max_rounds_in_flight = max(1, max_rounds_in_flight)
        self.prune_interval_s = prune_interval_s
        self.prune_after_records = prune_after_records
        self.prune_min_interval_s = prune_min_interval_s
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
        self._entries: dict[SharePartitionKey, _Entry] = {}
        self._groups: dict[str, _Group] = {}
        self._start: dict[int, int] = {}  # log start offset per partition (as last known)
        self._end: dict[int, int] = {}  # end offset per partition (as last known)
        self._queue: list[_Pending] = []
        self._gathering = 0  # > 0: inside gathering(); an idle store waits for its end to write
        self._rounds: set[_Round] = set()  # produce rounds in flight
        self._busy: dict[Any, int] = {}  # ref -> rounds in flight touching it (0 or 1)
        self._round_tasks: set[asyncio.Task[None]] = set()
        self._encoding: dict[Any, tuple | None] | None = None  # the undo of the round being encoded
        self._wake = asyncio.Event()
        self._prune_wake = asyncio.Event()
        self._since_prune = 0
        self._last_prune = 0.0
        self._prune_lock = asyncio.Lock()
        self._producers: list[Any] = []  # partition p's records go through _producers[p % len]
        self._idempotent = False
        self._prunes = True  # False where the cluster cannot DeleteRecords (Tansu)
        # an idempotent producer whose batch failed is replaced before the next round (see _round)
        self._replace_producer = False
        self._retiring: asyncio.Task[None] | None = None  # the replaced producer, delivering what it holds
        self._renew_failures = 0
        self._admin: Any = None
        self._flusher: asyncio.Task[None] | None = None
        self._maintenance: asyncio.Task[None] | None = None
        self._started = False
        self._closing = False
        self.transactional_prefix = transactional_prefix
        self._writers: dict[int, PartitionWriter] = {}  # claimed partitions (instance group only)
        self._round_lock = asyncio.Lock()
        # told the partitions another proxy fenced this one out of (instance group only)
        self.on_fenced: Callable[[int], None] | None = None

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
            created = await self._ensure_topic()
            if self.claims:
                self._entries.clear()
                self._groups.clear()
                self._started = True
                self._closing = False
                self._flusher = asyncio.create_task(self._flush_loop(), name="kshare-state-flusher")
                self._maintenance = asyncio.create_task(self._maintenance_loop(), name="kshare-state-pruner")
                return
            await self._load(empty=created)
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
                await self._start_producer(idempotent=refusal is None)
            except Exception as exc:  # noqa: BLE001 - a cluster that grants producer ids and then fails
                log.warning(
                    "the idempotent producer could not start (%r): state writes use acks=all without "
                    "idempotence (a write the cluster did not confirm may still have landed; "
                    "replaying it gives the same state)",
                    exc,
                )
                await self._start_producer(idempotent=False)
        except BaseException:
            await self._close_clients()
            raise
        self._started = True
        self._closing = False
        self._flusher = asyncio.create_task(self._flush_loop(), name="kshare-state-flusher")
        self._maintenance = asyncio.create_task(self._maintenance_loop(), name="kshare-state-pruner")

    async def _start_producer(self, *, idempotent: bool) -> None:
        old, self._producers = self._producers, []
        await asyncio.gather(*(p.stop() for p in old), return_exceptions=True)
        # Pipelined: every round's records go out at once, in order per partition (see
        # state_producer.py); what is sent again after a leader move goes before anything queued
        # behind it, so order holds without idempotence too.
        producers = [
            PipelinedProducer(self.bootstrap_servers, self.topic, idempotent=idempotent, security=self.security,
                              client_id=self.client_id, request_timeout_s=self.write_timeout_s,
                              retry_timeout_s=self.write_timeout_s * 2 / 3, on_resend=self._count_resend)
            for _ in range(min(self.producer_count, self.partitions))
        ]
        self._idempotent = idempotent
        try:
            # an idempotent producer gets its producer id here
            await asyncio.gather(*(p.start() for p in producers))
        except BaseException:
            await asyncio.gather(*(p.stop() for p in producers), return_exceptions=True)
            raise
        self._producers = producers

    def _count_resend(self) -> None:
        self.stats.resent_batches += 1

    async def _renew_producer(self) -> None:
        """Replace an idempotent producer one of whose batches failed.

        A batch gets its sequence number when it is sent, and may fail without reaching the broker
        (a connection lost, a partition without leader during a broker restart). The broker never
        sees that sequence number, so every later batch of the partition would fail with
        OutOfOrderSequenceNumber, forever. A new producer (new producer id) starts from sequence 0. The old one first delivers or fails what it still holds, so nothing it sent can
        land behind a record of the new one.
        """
        if self._retiring is None:
            old, self._producers = self._producers, []
            if old:
                self._retiring = asyncio.create_task(_stop_all(old))
        if self._retiring is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._retiring), self.write_timeout_s)
            except TimeoutError:
                raise StateWriteError("the replaced state producer still holds undelivered records") from None
            except Exception:  # noqa: BLE001 - it stopped either way
                pass
            self._retiring = None
        await self._start_producer(idempotent=True)
        self._replace_producer = False
        self._renew_failures = 0
        log.warning(
            "state topic %s: a state write failed in the producer; replaced the idempotent producer",
            self.topic,
        )

    def _late_outcome(self, fut: asyncio.Future) -> None:
        """Outcome of a send that was still pending when its round gave up on it."""
        if not fut.cancelled() and fut.exception() is not None and self._idempotent:
            self._replace_producer = True

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
        if self._maintenance is not None:
            self._maintenance.cancel()
            with contextlib.suppress(BaseException):
                await self._maintenance
        self._started = False
        await self._close_clients()

    async def _close_clients(self) -> None:
        writers, self._writers = list(self._writers.values()), {}
        await asyncio.gather(*(w.stop() for w in writers), return_exceptions=True)
        producers, admin = self._producers, self._admin
        self._producers, self._admin = [], None
        if self._retiring is not None:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(self._retiring, self.write_timeout_s)
            self._retiring = None
        await _stop_all(producers)
        if admin is not None:
            with contextlib.suppress(Exception):
                await admin.close()

    async def __aenter__(self) -> TopicStateStore:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- an instance group's partitions ------------------------------------------------------------

    async def claim(self, partitions: Sequence[int]) -> None:
        """Take these state partitions over: first each one's transactional producer starts, which
        makes the broker refuse the previous owner's writes (and abort its open transaction),
        then what was committed there is replayed. Writes of their share-partitions and groups
        are accepted from then on."""
        new = sorted(p for p in set(partitions) if p not in self._writers)
        if not new:
            return
        assert self.transactional_prefix is not None, "claim() is for an instance group's store"
        writers = {p: PartitionWriter(self.bootstrap_servers, self.topic, p, f"{self.transactional_prefix}{p}",
                                      write_timeout_s=self.write_timeout_s, producer_config=self._producer_config)
                   for p in new}
        try:
            await asyncio.gather(*(w.start() for w in writers.values()))
            await self._load(partitions=new)
        except BaseException:
            await asyncio.gather(*(w.stop() for w in writers.values()), return_exceptions=True)
            raise
        for key, e in self._entries.items():
            if e.partition in writers and partition_for(key, self.partitions) != e.partition:
                log.error("state topic %s: %s is in partition %d, the instance group looks for it in %d "
                          "(written by an older kshare): it will be served without that state",
                          self.topic, key, e.partition, partition_for(key, self.partitions))
        self._writers.update(writers)

    async def release(self, partitions: Sequence[int]) -> None:
        """Give these state partitions up: no more writes to them (a round in flight finishes
        first) and their share-partitions and groups leave memory."""
        gone = {p for p in partitions if p in self._writers}
        if not gone:
            return
        async with self._round_lock:
            writers = [self._writers.pop(p) for p in gone]
        for key in [k for k, e in self._entries.items() if e.partition in gone]:
            del self._entries[key]
        for gid in [g for g, v in self._groups.items() if v.partition in gone]:
            del self._groups[gid]
        await asyncio.gather(*(w.stop() for w in writers), return_exceptions=True)

    # -- reads -----------------------------------------------------------------------------------

    def share_partitions(self) -> dict[SharePartitionKey, ShareSnapshot]:
        """Durable state of every share-partition: replayed at start, then with every write applied.

        After a failed write: the last acknowledged state of the share-partitions it touched.
        Cheap to call repeatedly (each state is built once per change).
        """
        return {k: e.state for k, e in self._entries.items()}

    def share_partition(self, key: SharePartitionKey) -> ShareSnapshot | None:
        """``share_partitions().get(key)`` without building the dict."""
        e = self._entries.get(key)
        return None if e is None else e.state

    def groups(self) -> dict[str, GroupRecord]:
        return {g: _copy_group(v.record) for g, v in self._groups.items()}

    def state_epoch(self, key: SharePartitionKey) -> int | None:
        e = self._entries.get(key)
        return None if e is None else e.state_epoch

    def snapshot_epoch(self, key: SharePartitionKey) -> int | None:
        e = self._entries.get(key)
        return None if e is None else e.snapshot_epoch

    def partition_of(self, key: SharePartitionKey) -> int:
        """The state-topic partition holding ``key``'s records."""
        e = self._entries.get(key)
        return e.partition if e is not None else partition_for(key, self.partitions)

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
            _check_key(key)
            if isinstance(content, ShareSnapshot):
                if content.start_offset < -1:
                    raise ValueError(f"{key}: bad start offset {content.start_offset}")
            elif isinstance(content, ShareUpdate):
                if content.start_offset < -1:
                    raise ValueError(f"{key}: bad start offset {content.start_offset}")
            else:
                raise TypeError(f"expected a ShareSnapshot or ShareUpdate, got {type(content).__name__}")
            _check_batches(content.state_batches, str(key))
            ops.append((_SP, key, content))
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
        await self._submit([(_GROUP, _copy_group(record))])

    async def delete_group(self, group_id: str, keys: Sequence[SharePartitionKey]) -> None:
        """Forget the group record, the given share-partitions and any other of the group's."""
        for k in keys:
            _check_key(k)
        await self._submit([(_DEL_GROUP, group_id, tuple(keys))])

    async def delete_share_partitions(self, keys: Sequence[SharePartitionKey]) -> None:
        """Forget these share-partitions: a tombstone (null value) under each key."""
        for k in keys:
            _check_key(k)
        if keys:
            await self._submit([(_DEL_SP, k) for k in keys])

    async def flush(self) -> None:
        """Wait until everything queued so far has been through a produce round."""
        await self._submit([])

    async def _submit(self, ops: list[tuple]) -> None:
        await self._enqueue(ops)

    def _enqueue(self, ops: list[tuple]) -> asyncio.Future:
        if not self._started or self._closing:
            raise StateStoreError("the state store is not running")
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(ops, fut, refs=_refs_of(ops)))
        if not self._rounds and len(self._queue) == 1 and not self.linger_s and not self._gathering:
            # An idle store writes at once: no turn of the event loop between the caller (an
            # acknowledgement being applied) and its Produce request. Under load, rounds are in
            # flight and the flusher gathers what queues meanwhile into the next round.
            try:
                self._start_round()
            except Exception:  # noqa: BLE001 - the flusher tries again
                log.exception("state store: cannot start a produce round")
                self._wake.set()
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
            if not self._gathering and self._queue and not self._rounds and not self.linger_s:
                try:
                    self._start_round()
                except Exception:  # noqa: BLE001 - the flusher tries again
                    log.exception("state store: cannot start a produce round")
                    self._wake.set()

    # -- the flusher -----------------------------------------------------------------------------

    async def _flush_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self.linger_s and not self._closing:
                await asyncio.sleep(self.linger_s)
            try:
                self._start_round()
            except Exception:  # noqa: BLE001 - never let the flusher die
                log.exception("state store: cannot start a produce round")
            if self._closing and not self._queue and not self._rounds:
                return

    def _start_round(self) -> None:
        """Start a produce round with every queued write that may go now.

        A write goes when no round in flight touches what it touches, nor an earlier write still
        queued (so each share-partition's and group's writes keep their order); a flush or a group
        deletion goes after everything before it, alone. Rounds of an instance group's store, and
        the round that first replaces a producer, run alone too.
        """
        if not self._queue or len(self._rounds) >= self.max_rounds_in_flight:
            return
        if any(r.exclusive for r in self._rounds):
            return
        if self.claims or self._replace_producer or self._retiring is not None:
            if not self._rounds:
                items, self._queue = self._queue, []
                self._launch(items, exclusive=True)
            return
        take: list[_Pending] = []
        keep: list[_Pending] = []
        blocked: set[Any] = set()
        busy = self._busy
        for i, it in enumerate(self._queue):
            if it.refs is None:  # a flush or a group deletion
                if keep or self._rounds:
                    keep += self._queue[i:]
                    break
                take += self._queue[i:]  # with everything after it, alone (as one round always was)
                self._queue = []
                self._launch(take, exclusive=True)
                return
            if not it.refs.isdisjoint(busy) or not it.refs.isdisjoint(blocked):
                keep.append(it)
                blocked.update(it.refs)
            else:
                take.append(it)
        self._queue = keep
        if take:
            self._launch(take, exclusive=False)

    def _launch(self, items: list[_Pending], *, exclusive: bool) -> None:
        refs = frozenset().union(*(it.refs for it in items if it.refs is not None))
        r = _Round(items, refs, exclusive, {})
        self._rounds.add(r)
        for ref in refs:
            self._busy[ref] = self._busy.get(ref, 0) + 1
        # An ordinary round is encoded and written now, in the caller's turn of the event loop, and
        # settled by the answers' callbacks (each turn between an acknowledgement and its Produce
        # request, or between the Produce answer and the acknowledgement's, costs a queue wait when
        # the proxy is busy). Exclusive and claimed rounds may have to wait first (a producer to
        # replace, the instance group's claim), so a task does all of theirs.
        failed: Exception | None = None
        if not exclusive and not self.claims and self._producers:
            try:
                sent = self._send_round(r)
            except Exception as exc:  # noqa: BLE001 - reported by the round's task
                failed = exc
            else:
                self._settle_when_answered(r, *sent)
                return
        task = asyncio.get_running_loop().create_task(self._run_round(r, failed), name="kshare-state-round")
        self._round_tasks.add(task)
        task.add_done_callback(self._round_tasks.discard)

    def _settle_when_answered(self, r: _Round, out: list[_Out], sends: list[asyncio.Future | None]) -> None:
        """Settle a round written now as soon as its last Produce answer is in, from that answer's
        callback: no task to wake in between (each turn of the event loop between the cluster's
        answer and the acknowledgement's own answer is a queue wait when the proxy is busy)."""
        pending = [f for f in sends if f is not None]
        left = len(pending)
        loop = asyncio.get_running_loop()
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
        timer = loop.call_later(self.write_timeout_s, finish)
        for fut in pending:
            fut.add_done_callback(answered)

    def _round_failed(self, r: _Round, exc: Exception) -> None:
        log.exception("state store: produce round failed")
        for ref in list(r.undo):
            self._roll_back(ref, r.undo)
        r.undo.clear()
        for it in r.items:
            if not it.future.done():
                it.future.set_exception(StateWriteError(f"state write failed: {exc!r}"))

    def _round_done(self, r: _Round) -> None:
        self._rounds.discard(r)
        for ref in r.refs:
            n = self._busy[ref] - 1
            if n:
                self._busy[ref] = n
            else:
                del self._busy[ref]
        self._wake.set()

    async def _run_round(self, r: _Round, failed: Exception | None = None) -> None:
        try:
            if failed is not None:
                raise failed
            await self._round(r)
        except Exception as exc:  # noqa: BLE001 - reported to the callers
            self._round_failed(r, exc)
        finally:
            self._round_done(r)

    def _send_round(self, r: _Round) -> tuple[list[_Out], list[asyncio.Future | None]]:
        """Encode an ordinary round and hand its records to the producers, who write them now."""
        out = self._encode_round(r)
        producers = self._producers
        n = len(producers)
        sends: list[asyncio.Future | None] = []
        for rec in out:
            try:
                fut: asyncio.Future | None = producers[rec.partition % n].enqueue(
                    self.topic, value=rec.value, key=rec.key, partition=rec.partition
                )
            except Exception as exc:  # noqa: BLE001 - reported to the caller
                rec.error = StateWriteError(f"state record not sent: {exc!r}")
                fut = None
            sends.append(fut)
        for producer in producers:
            producer.flush()
        return out, sends

    async def _round(self, r: _Round) -> None:
        items = r.items
        if self.claims:
            async with self._round_lock:
                await self._round_claimed(r)
            return
        if r.exclusive and (self._replace_producer or self._retiring is not None):
            try:
                await self._renew_producer()
            except Exception as exc:  # noqa: BLE001 - this round fails, the next one tries again
                self._renew_failures += 1
                log.log(
                    logging.WARNING if self._renew_failures == 1 else logging.DEBUG,
                    "state topic %s: cannot replace the state producer yet: %r",
                    self.topic,
                    exc,
                )
                for it in items:
                    if not it.future.done():
                        it.future.set_exception(StateWriteError(f"state write failed: {exc!r}"))
                return
        producers = self._producers
        if not producers:
            for it in items:
                if not it.future.done():
                    it.future.set_exception(StateWriteError("the state producer is not running"))
            return
        out = self._encode_round(r)
        sends: list[asyncio.Future | None] = []
        deadline = time.monotonic() + self.write_timeout_s
        n = len(producers)
        try:
            # send() only waits when the producer's buffer for a partition is full
            async with asyncio.timeout(self.write_timeout_s):
                for rec in out:
                    try:
                        fut = await producers[rec.partition % n].send(
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
        await self._await_sends(r, out, sends, deadline)

    async def _await_sends(self, r: _Round, out: list[_Out], sends: list[asyncio.Future | None],
                           deadline: float) -> None:
        pending = [f for f in sends if f is not None]
        if pending:
            _, not_done = await asyncio.wait(pending, timeout=max(0.0, deadline - time.monotonic()))
            for fut in not_done:  # may still land later; retrieve the outcome so nothing warns
                fut.add_done_callback(self._late_outcome)
        self._record_outcomes(r, out, sends)

    def _record_outcomes(self, r: _Round, out: list[_Out], sends: list[asyncio.Future | None]) -> None:
        """Each record's offset or error from its send, then the round's writes settled."""
        for rec, fut in zip(out, sends, strict=True):
            if fut is None:
                continue
            if not fut.done():
                rec.error = StateWriteError(
                    f"state record not acknowledged within {self.write_timeout_s:.0f} s"
                )
            elif fut.cancelled():
                rec.error = StateWriteError("state record send cancelled")
            elif fut.exception() is not None:
                rec.error = StateWriteError(f"state record not written: {fut.exception()!r}")
                if self._idempotent:
                    self._replace_producer = True
            else:
                rec.offset = fut.result().offset
        self._settle(out, r)

    def _encode_round(self, r: _Round) -> list[_Out]:
        """The records of a round, each write applied to the in-memory state (undo kept in the round)."""
        out: list[_Out] = []
        self._encoding = r.undo
        try:
            for item in r.items:
                for op in item.ops:
                    self._encode(item, op, out)
        finally:
            self._encoding = None
        self.stats.rounds += 1
        self.stats.max_round_records = max(self.stats.max_round_records, len(out))
        return out

    async def _round_claimed(self, r: _Round) -> None:
        """An instance group's round: one transaction per claimed partition, all at once."""
        out = self._encode_round(r)
        by_partition: dict[int, list[_Out]] = defaultdict(list)
        for rec in out:
            by_partition[rec.partition].append(rec)

        async def write(p: int, recs: list[_Out]) -> None:
            writer = self._writers.get(p)
            if writer is None:
                for rec in recs:
                    rec.error = StateNotOwned(f"state partition {p} is not owned by this proxy")
                return
            try:
                offsets = await writer.write([(rec.key, rec.value) for rec in recs])
            except Fenced:
                for rec in recs:
                    rec.error = StateNotOwned(f"state partition {p} was taken over by another proxy")
                if self.on_fenced is not None and self._writers.get(p) is writer:  # not a replaced writer
                    self.on_fenced(p)
                return
            except Exception as exc:  # noqa: BLE001 - reported to the callers
                for rec in recs:
                    rec.error = StateWriteError(f"state write failed: {exc!r}")
                return
            for rec, off in zip(recs, offsets, strict=True):
                rec.offset = off

        await asyncio.gather(*(write(p, recs) for p, recs in by_partition.items()))
        self._settle(out, r)

    def _save(self, ref: Any) -> None:
        """Remember how ``ref`` (a share-partition key or ("group", id)) was before the round being
        encoded."""
        undo = self._encoding
        assert undo is not None, "_save outside _encode_round"
        if ref in undo:
            return
        if isinstance(ref, SharePartitionKey):
            e = self._entries.get(ref)
            undo[ref] = None if e is None else (e, e.state, *_entry_fields(e))
        else:
            g = self._groups.get(ref[1])
            undo[ref] = None if g is None else (g, g.record, g.offset)

    def _roll_back(self, ref: Any, undo: dict[Any, tuple | None]) -> None:
        """A record of ``ref`` failed: back to its state before the round, and resync it."""
        saved = undo.get(ref)
        if isinstance(ref, SharePartitionKey):
            if saved is None:
                self._entries.pop(ref, None)
                return
            e = saved[0]
            e.set_state(saved[1])
            _set_entry_fields(e, saved[2:])
            e.resync = True
            self._entries[ref] = e
        else:
            if saved is None:
                self._groups.pop(ref[1], None)
                return
            g, g.record, g.offset = saved[0], saved[1], saved[2]
            g.resync = True
            self._groups[ref[1]] = g

    def _settle(self, out: list[_Out], r: _Round) -> None:
        stats = self.stats
        items = r.items
        wrote_snapshots = False
        failed: dict[Any, None] = {}
        for rec in out:
            item = rec.item
            if rec.error is not None:
                stats.failed_records += 1
                if item.error is None:
                    item.error = rec.error
                if rec.ref is not None:
                    failed[rec.ref] = None
                continue
            stats.records += 1
            stats.bytes += len(rec.key) + (len(rec.value) if rec.value is not None else 0)
            p = rec.partition
            if rec.offset + 1 > self._end.get(p, 0):
                self._end[p] = rec.offset + 1
            if rec.kind == "snapshot":
                stats.snapshots += 1
                rec.owner.snapshot_offset = rec.offset
                wrote_snapshots = True
            elif rec.kind == "update":
                stats.updates += 1
            elif rec.kind == "group":
                stats.group_records += 1
                rec.owner.offset = rec.offset
                wrote_snapshots = True
            else:
                stats.tombstones += 1
        # What the caller sees after a failure is the last acknowledged state (to rebuild from);
        # the next write of a rolled-back share-partition or group is a full snapshot/record.
        for ref in failed:
            self._roll_back(ref, r.undo)
        r.undo.clear()
        if failed:
            self._prune_wake.set()  # the maintenance pass rewrites what failed
        self._since_prune += len(out)
        for item in items:
            stats.writes += 1
            if item.future.done():
                continue
            if item.error is None:
                item.future.set_result(None)
            else:
                item.future.set_exception(item.error)
        if wrote_snapshots and self._since_prune >= self.prune_after_records:
            self._prune_wake.set()

    # -- encoding: decide what goes on the topic and apply it to the in-memory state ------------

    def _encode(self, item: _Pending, op: tuple, out: list[_Out]) -> None:
        kind = op[0]
        if kind == _SP:
            self._encode_share(item, op[1], op[2], out)
        elif kind == _GROUP:
            record: GroupRecord = op[1]
            self._save(("group", record.group_id))
            g = self._groups.get(record.group_id)
            if g is None:
                g = self._groups[record.group_id] = _Group(
                    record, partition_for_group(record.group_id, self.partitions)
                )
            g.record = record
            self._emit_group(item, g, out)
        elif kind == _REFRESH_SP:
            # the state as of now (writes queued before this one are applied), same state epoch
            self._save(op[1])
            e = self._entries.get(op[1])
            if e is not None:
                e.snapshot_epoch += 1
                self.stats.refreshes += 1
                self._emit_snapshot(item, op[1], e, out)
        elif kind == _REFRESH_GROUP:
            self._save(("group", op[1]))
            g = self._groups.get(op[1])
            if g is not None:
                self.stats.refreshes += 1
                self._emit_group(item, g, out)
        elif kind == _DEL_SP:
            self._encode_tombstone(item, op[1], out)
        elif kind == _DEL_GROUP:
            _, group_id, keys = op
            doomed = dict.fromkeys(keys)
            doomed.update(dict.fromkeys(k for k in self._entries if k.group_id == group_id))
            for k in doomed:
                self._encode_tombstone(item, k, out)
            ref = ("group", group_id)
            self._save(ref)
            g = self._groups.pop(group_id, None)
            partition = g.partition if g is not None else partition_for_group(group_id, self.partitions)
            out.append(_Out(item, partition, encode_group_key(group_id), None, "tombstone", ref=ref))

    def _emit_group(self, item: _Pending, g: _Group, out: list[_Out]) -> None:
        g.resync = False
        gid = g.record.group_id
        value = encode_group_value(g.record)
        out.append(_Out(item, g.partition, encode_group_key(gid), value, "group", g, ("group", gid)))

    def _encode_tombstone(self, item: _Pending, key: SharePartitionKey, out: list[_Out]) -> None:
        self._save(key)
        e = self._entries.pop(key, None)
        partition = e.partition if e is not None else partition_for(key, self.partitions)
        out.append(_Out(item, partition, encode_share_key(RECORD_SNAPSHOT, key), None, "tombstone", ref=key))

    def _encode_share(
        self,
        item: _Pending,
        key: SharePartitionKey,
        content: ShareSnapshot | ShareUpdate,
        out: list[_Out],
    ) -> None:
        self._save(key)
        e = self._entries.get(key)
        if isinstance(content, ShareSnapshot):
            state = normalize(content)
            if e is None:
                e = self._entries[key] = _Entry(state, partition_for(key, self.partitions))
            else:  # a (re)initialisation: new snapshot epoch and new state epoch
                e.set_state(state)
                e.snapshot_epoch += 1
                e.state_epoch += 1
            self._emit_snapshot(item, key, e, out)
            return
        if e is None:
            # An update with no state to apply to: the base is "nothing known", and the first
            # record of a share-partition is always a snapshot.
            state = apply_update(ShareSnapshot(-1, ()), content)
            e = self._entries[key] = _Entry(state, partition_for(key, self.partitions))
            self._emit_snapshot(item, key, e, out)
            return
        e.apply(content)
        usize = update_value_size(len(content.state_batches))
        ssize = snapshot_value_size(len(e.batches))
        slack = self.snapshot_slack_bytes
        if e.resync or (slack is not None and ssize <= usize + slack):
            e.snapshot_epoch += 1
            self._emit_snapshot(item, key, e, out)
            return
        if e.updates + 1 > self.snapshot_after_updates or e.update_bytes + usize > self.snapshot_after_bytes:
            e.snapshot_epoch += 1
            self.stats.compactions += 1
            self._emit_snapshot(item, key, e, out)
            return
        e.updates += 1
        e.update_bytes += usize
        value = encode_update_value(e.snapshot_epoch, self.leader_epoch, content)
        out.append(_Out(item, e.partition, encode_share_key(1, key), value, "update", e, key))

    def _emit_snapshot(self, item: _Pending, key: SharePartitionKey, e: _Entry, out: list[_Out]) -> None:
        e.updates = 0
        e.update_bytes = 0
        e.resync = False
        e.leader_epoch = self.leader_epoch
        value = encode_snapshot_value(
            e.snapshot_epoch, e.state_epoch, self.leader_epoch, ShareSnapshot(e.start, e.batches)
        )
        out.append(_Out(item, e.partition, encode_share_key(RECORD_SNAPSHOT, key), value, "snapshot", e, key))

    # -- topic creation --------------------------------------------------------------------------

    async def _ensure_topic(self) -> bool:
        """Create the topic if missing (True when this call created it) and check it."""
        from aiokafka.admin import NewTopic

        admin = self._admin
        # list_topics, not a metadata request naming the topic: that would auto-create it
        # (auto.create.topics.enable) with the broker's default settings
        created = False
        if self.topic not in await admin.list_topics():
            cluster = await admin.describe_cluster()
            brokers = len(cluster.get("brokers", ())) or 1
            rf = self.replication_factor or min(3, brokers)
            min_isr = self.min_insync_replicas or (2 if rf >= 3 else 1)
            configs = {
                "cleanup.policy": "delete",
                "retention.ms": "-1",
                "retention.bytes": "-1",
                "min.insync.replicas": str(min_isr),
            }
            resp = await admin.create_topics(
                [NewTopic(self.topic, self.partitions, rf, topic_configs=configs)],
                timeout_ms=int(self.write_timeout_s * 1000),
            )
            for topic_error in resp.topic_errors:
                code, message = topic_error[1], topic_error[2] if len(topic_error) > 2 else None
                if code not in (0, 36):  # 36: TOPIC_ALREADY_EXISTS (someone else was faster)
                    raise StateStoreError(
                        f"cannot create the state topic {self.topic}: error {code} {message or ''}"
                    )
            created = not any(t[1] == 36 for t in resp.topic_errors)
            log.info(
                "created state topic %s: %d partitions, replication factor %d, min.insync.replicas %d",
                self.topic,
                self.partitions,
                rf,
                min_isr,
            )
        deadline = time.monotonic() + self.write_timeout_s
        while True:
            existing = await self._describe_topic()
            if existing is not None and existing[0] == 0 and all(p[2] >= 0 for p in existing[1]):
                break
            if existing is not None and existing[0] == 17:  # INVALID_TOPIC_EXCEPTION
                raise StateStoreError(f"invalid state topic name {self.topic!r}")
            if time.monotonic() > deadline:
                raise StateStoreError(f"state topic {self.topic} has no leaders: {existing!r}")
            await asyncio.sleep(0.1)
        if existing[2]:
            # Kafka 4.x reserves __share_group_state for its own share coordinator: clients may
            # not produce to it (INVALID_TOPIC_EXCEPTION), and a broker with share groups enabled
            # would replay our records as its own.
            raise StateStoreError(
                f"{self.topic} is an internal topic of this cluster (Apache Kafka 4.x): clients "
                "cannot write to it; configure another state topic name, e.g. "
                f"{ALTERNATIVE_TOPIC!r}"
            )
        count = len(existing[1])
        if count != self.partitions:
            log.warning(
                "state topic %s has %d partitions (configured %d): using %d",
                self.topic,
                count,
                self.partitions,
                count,
            )
            self.partitions = count
        await self._check_topic_configs()
        return created

    async def _describe_topic(self) -> tuple[int, list[tuple[int, int, int]], bool] | None:
        """(error code, [(error, partition, leader)], internal) of the topic, None if it does not exist."""
        for t in await self._admin.describe_topics([self.topic]):
            if t["topic"] != self.topic:
                continue
            if t["error_code"] == 3:  # UNKNOWN_TOPIC_OR_PARTITION
                return None
            parts = [(p["error_code"], p["partition"], p["leader"]) for p in t["partitions"]]
            return t["error_code"], parts, bool(t.get("is_internal"))
        return None

    async def _check_topic_configs(self) -> None:
        from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

        try:
            responses = await self._admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, self.topic)]
            )
        except Exception as exc:  # noqa: BLE001 - a check, not a requirement
            log.warning("could not read the configs of state topic %s: %r", self.topic, exc)
            return
        configs: dict[str, str] = {}
        for resp in responses:
            for resource in resp.resources:
                for entry in resource[4]:
                    configs[entry[0]] = entry[1]
        policy = configs.get("cleanup.policy", "delete")
        if "compact" in policy:
            raise StateStoreError(
                f"state topic {self.topic} has cleanup.policy={policy}: compaction would drop "
                "ShareUpdate records replay needs; it must be cleanup.policy=delete"
            )
        if configs.get("retention.ms", "-1") != "-1":
            log.warning(
                "state topic %s has retention.ms=%s: idle share-partitions can lose their state; "
                "set retention.ms=-1",
                self.topic,
                configs.get("retention.ms"),
            )

    # -- recovery --------------------------------------------------------------------------------

    async def _load(self, *, empty: bool = False, partitions: Sequence[int] | None = None) -> None:
        """Replay the topic (or, for an instance group, the claimed ``partitions``: their
        committed records only, adding to what the store holds)."""
        from aiokafka import AIOKafkaConsumer, TopicPartition

        t0 = time.monotonic()
        stats = self.load_stats = LoadStats()
        if partitions is None:
            self._entries.clear()
            self._groups.clear()
        if empty:  # just created: nothing to replay
            for p in range(self.partitions):
                self._start[p] = self._end[p] = 0
            log.info("state topic %s is new: nothing to load", self.topic)
            return
        conf: dict[str, Any] = {
            "enable_auto_commit": False,
            "auto_offset_reset": "earliest",
            "max_partition_fetch_bytes": 8 * 1024 * 1024,
            "fetch_max_bytes": 64 * 1024 * 1024,
            "request_timeout_ms": max(40_000, int(self.write_timeout_s * 1000)),
        }
        if partitions is not None:
            # transactional writes: what an aborted (fenced) transaction left is not state
            conf["isolation_level"] = "read_committed"
        conf.update(self._consumer_config)
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap_servers,
            group_id=None,
            client_id=f"{self.client_id}-load",
            **conf,
        )
        await consumer.start()
        # Replay allocates millions of small tuples that all stay alive: the cyclic collector
        # would walk them again and again (about a third of the load's CPU time). Off meanwhile.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            tps = [TopicPartition(self.topic, p) for p in (range(self.partitions) if partitions is None else partitions)]
            consumer.assign(tps)
            begin = await consumer.beginning_offsets(tps)
            end = await consumer.end_offsets(tps)
            for tp in tps:
                self._start[tp.partition] = begin[tp]
                self._end[tp.partition] = end[tp]
            remaining = {tp for tp in tps if end[tp] > begin[tp]}
            short_ends = self.checks.short_end_offsets
            for tp in tps:
                if tp in remaining:
                    consumer.seek(tp, begin[tp])
                else:
                    consumer.pause(tp)
            while remaining:
                batch = await consumer.getmany(*remaining, timeout_ms=500, max_records=100_000)
                for tp, records in batch.items():
                    p = tp.partition
                    for r in records:
                        if r.offset >= end[tp]:
                            if not short_ends:
                                break
                            # the cluster's end offset falls inside its last batch (upstream_checks):
                            # the rest of that batch was there all along
                            end[tp] = self._end[p] = r.offset + 1
                        stats.records += 1
                        stats.bytes += (r.serialized_key_size if r.serialized_key_size > 0 else 0) + (
                            r.serialized_value_size if r.serialized_value_size > 0 else 0
                        )
                        self._replay_one(p, r.offset, r.key, r.value)
                for tp in list(remaining):
                    if await consumer.position(tp) >= end[tp]:
                        remaining.discard(tp)
                        consumer.pause(tp)
        finally:
            if gc_was_enabled:
                gc.enable()
            await consumer.stop()
        stats.share_partitions = len(self._entries)
        stats.groups = len(self._groups)
        stats.seconds = time.monotonic() - t0
        log.info(
            "state topic %s%s loaded in %.2f s: %d share-partitions, %d groups from %d records (%d bytes), "
            "%d skipped",
            self.topic,
            "" if partitions is None else f" partitions {list(partitions)}",
            stats.seconds,
            stats.share_partitions,
            stats.groups,
            stats.records,
            stats.bytes,
            stats.skipped,
        )

    def _skip(self, partition: int, offset: int, reason: object) -> None:
        self.load_stats.skipped += 1
        log.error(
            "state topic %s partition %d offset %d: record skipped: %s", self.topic, partition, offset, reason
        )

    def _replay_one(self, partition: int, offset: int, key: bytes | None, value: bytes | None) -> None:
        """Apply one state-topic record to the in-memory state (the share coordinator's replay)."""
        stats = self.load_stats
        try:
            rec = decode_record(key, value)
        except StateRecordError as exc:
            self._skip(partition, offset, exc)
            return
        if isinstance(rec, SnapshotRecord):
            stats.snapshots += 1
            snap = rec.snapshot if is_normalized(rec.snapshot) else normalize(rec.snapshot)
            e = _Entry(snap, partition, rec.snapshot_epoch, rec.state_epoch, rec.leader_epoch)
            e.snapshot_offset = offset
            self._entries[rec.key] = e
        elif isinstance(rec, UpdateRecord):
            stats.updates += 1
            e = self._entries.get(rec.key)
            if e is None:
                self._skip(partition, offset, f"ShareUpdate for {rec.key} without a ShareSnapshot before it")
                return
            if rec.snapshot_epoch != e.snapshot_epoch % 65536:
                self._skip(
                    partition,
                    offset,
                    f"ShareUpdate for {rec.key} with snapshot epoch {rec.snapshot_epoch}, "
                    f"latest snapshot has {e.snapshot_epoch}",
                )
                return
            try:
                e.apply(rec.update)
            except ValueError as exc:
                self._skip(partition, offset, exc)
                return
            e.updates += 1
            e.update_bytes += len(value or b"")
        elif isinstance(rec, GroupValueRecord):
            stats.group_records += 1
            g = _Group(rec.record, partition)
            g.offset = offset
            self._groups[rec.record.group_id] = g
        elif isinstance(rec, ShareTombstone):
            stats.tombstones += 1
            self._entries.pop(rec.key, None)
        elif isinstance(rec, GroupTombstone):
            stats.tombstones += 1
            self._groups.pop(rec.group_id, None)

    # -- pruning ---------------------------------------------------------------------------------

    def prune_points(self) -> dict[int, int]:
        """Per partition: the lowest offset replay still needs (everything below may go)."""
        scope = self._writers if self.claims else range(self.partitions)
        low: dict[int, int] = {p: self._end.get(p, 0) for p in scope}
        pins: list[tuple[int, int | None]] = [
            (e.partition, e.snapshot_offset) for e in self._entries.values()
        ]
        pins += [(g.partition, g.offset) for g in self._groups.values()]
        # what a round in flight changed or deleted still counts until it is acknowledged
        for ref, saved in ((ref, saved) for r in self._rounds for ref, saved in r.undo.items()):
            if saved is None:
                continue
            if isinstance(ref, SharePartitionKey):
                pins.append((saved[0].partition, saved[2 + _ENTRY_FIELDS.index("snapshot_offset")]))
            else:
                pins.append((saved[0].partition, saved[2]))
        for partition, offset in pins:
            if offset is not None and partition in low and offset < low[partition]:
                low[partition] = offset
        return low

    async def refresh_idle(self) -> int:
        """Re-snapshot share-partitions (and rewrite group records) lagging far behind their
        partition's end, so they stop pinning the log. Returns how many were rewritten."""
        per_partition: dict[int, int] = defaultdict(int)
        for e in self._entries.values():
            per_partition[e.partition] += 1
        ops: list[tuple] = []
        for k, e in self._entries.items():
            lag_limit = max(self.refresh_after_records, 4 * per_partition[e.partition])
            if e.resync or (
                e.snapshot_offset is not None
                and self._end.get(e.partition, 0) - e.snapshot_offset > lag_limit
            ):
                ops.append((_REFRESH_SP, k))
        for g in self._groups.values():
            lag_limit = max(self.refresh_after_records, 4 * per_partition[g.partition])
            if g.resync or (g.offset is not None and self._end.get(g.partition, 0) - g.offset > lag_limit):
                ops.append((_REFRESH_GROUP, g.record.group_id))
        if ops:
            await self._submit(ops)
        return len(ops)

    async def prune(self, *, refresh: bool = True) -> dict[int, int]:
        """DeleteRecords below :meth:`prune_points` where that moves a log start offset.

        Returns the new log start offset of every partition it moved.
        """
        from aiokafka import TopicPartition
        from aiokafka.admin import RecordsToDelete

        async with self._prune_lock:
            if refresh:
                await self.refresh_idle()
            self._since_prune = 0
            self._last_prune = time.monotonic()
            if not self._prunes:
                return {}  # the re-snapshots above still keep replay short
            points = self.prune_points()
            todo = {
                TopicPartition(self.topic, p): RecordsToDelete(before_offset=off)
                for p, off in points.items()
                if off > self._start.get(p, 0)
            }
            if not todo:
                return {}
            result = await self._admin.delete_records(todo, timeout_ms=int(self.write_timeout_s * 1000))
            moved: dict[int, int] = {}
            for tp, low in result.items():
                before = self._start.get(tp.partition, 0)
                if low > before:
                    self.stats.pruned_records += low - before
                self._start[tp.partition] = low
                moved[tp.partition] = low
            self.stats.prunes += 1
            log.debug("state topic %s pruned: %s", self.topic, moved)
            return moved

    def log_start_offsets(self) -> dict[int, int]:
        return dict(self._start)

    async def _maintenance_loop(self) -> None:
        while not self._closing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._prune_wake.wait(), timeout=self.prune_interval_s)
            self._prune_wake.clear()
            if self._closing:
                return
            wait = self._last_prune + self.prune_min_interval_s - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            try:
                await self.prune()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - retried next interval
                log.warning("state topic %s: pruning failed: %r", self.topic, exc)


async def _stop_all(producers: list[Any]) -> None:
    """Stop producers (each delivers or fails what it holds first)."""
    await asyncio.gather(*(p.stop() for p in producers), return_exceptions=True)


__all__ = [
    "ALTERNATIVE_TOPIC",
    "DEFAULT_TOPIC",
    "LoadStats",
    "StateStoreError",
    "StateWriteError",
    "TopicStateStore",
    "WriteStats",
]
