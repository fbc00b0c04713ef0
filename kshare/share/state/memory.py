"""The state store's in-memory copy of the durable state, and what it writes next (compaction).

:class:`InMemoryState` holds every share-partition's state and every group record as the store
last wrote (or replayed) them. Encoding a produce round applies each queued write to it and
decides what goes on the topic: a ShareUpdate, or a ShareSnapshot in its place when the
share-partition has ``snapshot_after_updates`` updates or ``snapshot_after_bytes`` bytes of
update values since its latest snapshot, when a write of it failed before (``resync``), or when
the snapshot is at most ``snapshot_slack_bytes`` bigger than the update (the common case: the
SPSO moved and little is in flight; it lets pruning follow the head of the log). Every round
keeps its own undo, so a failed round rolls back to the last acknowledged state.

Pure: no I/O, no asyncio. The store sends the records and reports each one's offset or error.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from ..states import TERMINAL_STATES, ShareSnapshot, ShareUpdate, StateBatch, apply_update, normalize
from ..store import GroupRecord, SharePartitionKey
from .codec import (
    RECORD_SNAPSHOT,
    RECORD_UPDATE,
    encode_group_key,
    encode_group_value,
    encode_share_key,
    encode_snapshot_value,
    encode_update_value,
    partition_for,
    partition_for_group,
    snapshot_value_size,
    update_value_size,
)
from .rounds import QueuedWrite, Round


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
    resent_batches: int = 0  # batches sent again to a new leader (pipelined_producer: leader moves)
    prunes: int = 0  # DeleteRecords rounds
    pruned_records: int = 0  # by how much log start offsets moved in total
    max_round_records: int = 0


# What a queued write asks for: (kind, ...) tuples, encoded by InMemoryState.encode_round.
WRITE_SHARE = 0  # (WRITE_SHARE, key, ShareSnapshot | ShareUpdate)
WRITE_GROUP = 1  # (WRITE_GROUP, GroupRecord)
DELETE_SHARE = 2  # (DELETE_SHARE, key)
DELETE_GROUP = 3  # (DELETE_GROUP, group id, keys): the group and every share-partition of it
REFRESH_SHARE = 4  # (REFRESH_SHARE, key): a snapshot of the state as it is, same state epoch
REFRESH_GROUP = 5  # (REFRESH_GROUP, group id): the group record again
# (ADOPT_SHARE, key, ShareSnapshot, state epoch): a copy taken over from another proxy of an
# instance group, written with that state epoch where this store keeps the key (else at its home)
ADOPT_SHARE = 6


def refs_of(ops: list[tuple]) -> frozenset | None:
    """What these operations touch: share-partition keys and ("group", id) (the round scheduler's
    ``refs``); None for a flush (no operations) or a group deletion (every share-partition of
    the group, as known only when it is encoded)."""
    refs = []
    for op in ops:
        kind = op[0]
        if kind in (WRITE_SHARE, DELETE_SHARE, REFRESH_SHARE, ADOPT_SHARE):
            refs.append(op[1])
        elif kind == WRITE_GROUP:
            refs.append(("group", op[1].group_id))
        elif kind == REFRESH_GROUP:
            refs.append(("group", op[1]))
        else:
            return None
    return frozenset(refs) if refs else None


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
_SNAPSHOT_OFFSET = 2 + _ENTRY_FIELDS.index("snapshot_offset")  # in a share-partition's undo tuple


class ShareEntry:
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

    def saved(self) -> tuple:
        """What :meth:`restore` puts back (a round's undo)."""
        return (self, self.state, *(getattr(self, f) for f in _ENTRY_FIELDS))

    def restore(self, saved: tuple) -> None:
        self.set_state(saved[1])
        for f, v in zip(_ENTRY_FIELDS, saved[2:], strict=True):
            setattr(self, f, v)


class GroupEntry:
    """The store's view of one group record."""

    __slots__ = ("record", "partition", "offset", "resync")

    def __init__(self, record: GroupRecord, partition: int) -> None:
        self.record = record
        self.partition = partition
        self.offset: int | None = None  # offset of the latest acknowledged group record
        self.resync = False


@dataclass(slots=True)
class OutRecord:
    """One record of a round and what to update when it is acknowledged."""

    item: QueuedWrite
    partition: int
    key: bytes
    value: bytes | None
    kind: str  # "snapshot" | "update" | "group" | "tombstone"
    owner: Any = None  # ShareEntry / GroupEntry whose offsets to record
    ref: Any = None  # SharePartitionKey, or ("group", group id): what to roll back on failure
    offset: int = -1
    error: BaseException | None = None


def copy_group(record: GroupRecord) -> GroupRecord:
    return replace(
        record,
        configs=dict(record.configs),
        topics=dict(record.topics),
        topic_partitions=dict(record.topic_partitions),
    )


def check_batches(batches: Iterable[StateBatch], what: str) -> None:
    for b in batches:
        first, last, state, count = b
        if not (0 <= first <= last):
            raise ValueError(f"{what}: state batch {first}-{last} is not a valid offset range")
        if state not in (0, 2, 4):
            raise ValueError(f"{what}: delivery state {state} is not durable (0, 2 or 4)")
        if not (0 <= count <= 0x7FFF):
            raise ValueError(f"{what}: delivery count {count} out of range")


def check_key(key: SharePartitionKey) -> None:
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


class InMemoryState:
    """Every share-partition's state and group record, as written or replayed; the state topic's
    partition offsets as last known; and the encoding of produce rounds onto both."""

    def __init__(self, partitions: int, stats: WriteStats, *, leader_epoch: int = 0,
                 snapshot_after_updates: int = 500, snapshot_after_bytes: int = 64 * 1024,
                 snapshot_slack_bytes: int | None = 24) -> None:
        self.partitions = partitions  # of the state topic
        self.stats = stats
        self.leader_epoch = leader_epoch
        self.snapshot_after_updates = snapshot_after_updates
        self.snapshot_after_bytes = snapshot_after_bytes
        self.snapshot_slack_bytes = snapshot_slack_bytes
        self.entries: dict[SharePartitionKey, ShareEntry] = {}
        self.groups: dict[str, GroupEntry] = {}
        self.log_start: dict[int, int] = {}  # log start offset per partition (as last known)
        self.log_end: dict[int, int] = {}  # end offset per partition (as last known)
        self._undo: dict[Any, tuple | None] | None = None  # of the round being encoded
        # where a share-partition without an entry goes (an instance group leading by topic keeps
        # it with its leader); None: where its topic-partition hashes (partition_for)
        self.home: Callable[[SharePartitionKey], int] | None = None

    def clear(self) -> None:
        self.entries.clear()
        self.groups.clear()

    def forget_partitions(self, gone: set[int]) -> None:
        """Drop the share-partitions and groups of these state partitions (released by an
        instance group's proxy)."""
        for key in [k for k, e in self.entries.items() if e.partition in gone]:
            del self.entries[key]
        for gid in [g for g, v in self.groups.items() if v.partition in gone]:
            del self.groups[gid]

    def partition_of(self, key: SharePartitionKey) -> int:
        e = self.entries.get(key)
        return e.partition if e is not None else self._home(key)

    def _home(self, key: SharePartitionKey) -> int:
        return self.home(key) if self.home is not None else partition_for(key, self.partitions)

    # -- a round: encode, then settle (or roll back) -----------------------------------------------

    def encode_round(self, r: Round) -> list[OutRecord]:
        """The records of a round, each write applied to the state (undo kept in the round)."""
        out: list[OutRecord] = []
        self._undo = r.undo
        try:
            for item in r.items:
                for op in item.ops:
                    self._encode(item, op, out)
        finally:
            self._undo = None
        self.stats.rounds += 1
        self.stats.max_round_records = max(self.stats.max_round_records, len(out))
        return out

    def settle(self, out: list[OutRecord], undo: dict[Any, tuple | None]) -> tuple[bool, bool]:
        """Record what the cluster acknowledged (offsets, counts) and roll back every
        share-partition or group a record of which failed; each failure also goes to its write
        (``item.error``). Returns (a snapshot or group record was acknowledged, something failed).
        """
        stats = self.stats
        log_end = self.log_end
        wrote_snapshots = False
        failed: dict[Any, None] = {}
        for rec in out:
            if rec.error is not None:
                stats.failed_records += 1
                if rec.item.error is None:
                    rec.item.error = rec.error
                if rec.ref is not None:
                    failed[rec.ref] = None
                continue
            stats.records += 1
            stats.bytes += len(rec.key) + (len(rec.value) if rec.value is not None else 0)
            p = rec.partition
            if rec.offset + 1 > log_end.get(p, 0):
                log_end[p] = rec.offset + 1
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
            self.roll_back(ref, undo)
        undo.clear()
        return wrote_snapshots, bool(failed)

    def roll_back_round(self, undo: dict[Any, tuple | None]) -> None:
        """A whole round failed: everything it touched back to how it was before it."""
        for ref in list(undo):
            self.roll_back(ref, undo)
        undo.clear()

    def roll_back(self, ref: Any, undo: dict[Any, tuple | None]) -> None:
        """A record of ``ref`` failed: back to its state before the round, and resync it."""
        saved = undo.get(ref)
        if isinstance(ref, SharePartitionKey):
            if saved is None:
                self.entries.pop(ref, None)
                return
            e = saved[0]
            e.restore(saved)
            e.resync = True
            self.entries[ref] = e
        else:
            if saved is None:
                self.groups.pop(ref[1], None)
                return
            g, g.record, g.offset = saved[0], saved[1], saved[2]
            g.resync = True
            self.groups[ref[1]] = g

    @staticmethod
    def pins_of(undo: dict[Any, tuple | None]) -> Iterator[tuple[int, int | None]]:
        """(partition, offset) of the latest acknowledged snapshot / group record of everything a
        round in flight changed: still what replay needs until the round is acknowledged."""
        for ref, saved in undo.items():
            if saved is None:
                continue
            if isinstance(ref, SharePartitionKey):
                yield saved[0].partition, saved[_SNAPSHOT_OFFSET]
            else:
                yield saved[0].partition, saved[2]

    # -- encoding: decide what goes on the topic and apply it to the state -----------------------

    def _save(self, ref: Any) -> None:
        """Remember how ``ref`` (a share-partition key or ("group", id)) was before the round being
        encoded."""
        undo = self._undo
        assert undo is not None, "_save outside encode_round"
        if ref in undo:
            return
        if isinstance(ref, SharePartitionKey):
            e = self.entries.get(ref)
            undo[ref] = None if e is None else e.saved()
        else:
            g = self.groups.get(ref[1])
            undo[ref] = None if g is None else (g, g.record, g.offset)

    def _encode(self, item: QueuedWrite, op: tuple, out: list[OutRecord]) -> None:
        kind = op[0]
        if kind == WRITE_SHARE:
            self._encode_share(item, op[1], op[2], out)
        elif kind == WRITE_GROUP:
            record: GroupRecord = op[1]
            self._save(("group", record.group_id))
            g = self.groups.get(record.group_id)
            if g is None:
                g = self.groups[record.group_id] = GroupEntry(
                    record, partition_for_group(record.group_id, self.partitions)
                )
            g.record = record
            self._emit_group(item, g, out)
        elif kind == REFRESH_SHARE:
            # the state as of now (writes queued before this one are applied), same state epoch
            self._save(op[1])
            e = self.entries.get(op[1])
            if e is not None:
                e.snapshot_epoch += 1
                self.stats.refreshes += 1
                self._emit_snapshot(item, op[1], e, out)
        elif kind == REFRESH_GROUP:
            self._save(("group", op[1]))
            g = self.groups.get(op[1])
            if g is not None:
                self.stats.refreshes += 1
                self._emit_group(item, g, out)
        elif kind == DELETE_SHARE:
            self._encode_tombstone(item, op[1], out)
        elif kind == ADOPT_SHARE:
            # written where this store keeps the key already, else at its home: an older copy is told
            # from it by its lower state epoch (replay keeps the higher one across partitions)
            _, key, snapshot, state_epoch = op
            self._save(key)
            old = self.entries.get(key)
            if old is None:
                e = self.entries[key] = ShareEntry(normalize(snapshot), self._home(key), 0, state_epoch)
            else:
                e = old
                e.set_state(normalize(snapshot))
                e.snapshot_epoch += 1
                e.state_epoch = state_epoch
            self._emit_snapshot(item, key, e, out)
        elif kind == DELETE_GROUP:
            _, group_id, keys = op
            doomed = dict.fromkeys(keys)
            doomed.update(dict.fromkeys(k for k in self.entries if k.group_id == group_id))
            for k in doomed:
                self._encode_tombstone(item, k, out)
            ref = ("group", group_id)
            self._save(ref)
            g = self.groups.pop(group_id, None)
            partition = g.partition if g is not None else partition_for_group(group_id, self.partitions)
            out.append(OutRecord(item, partition, encode_group_key(group_id), None, "tombstone", ref=ref))

    def _emit_group(self, item: QueuedWrite, g: GroupEntry, out: list[OutRecord]) -> None:
        g.resync = False
        gid = g.record.group_id
        value = encode_group_value(g.record)
        out.append(OutRecord(item, g.partition, encode_group_key(gid), value, "group", g, ("group", gid)))

    def _encode_tombstone(self, item: QueuedWrite, key: SharePartitionKey, out: list[OutRecord]) -> None:
        self._save(key)
        e = self.entries.pop(key, None)
        partition = e.partition if e is not None else self._home(key)
        out.append(OutRecord(item, partition, encode_share_key(RECORD_SNAPSHOT, key), None, "tombstone", ref=key))

    def _encode_share(
        self,
        item: QueuedWrite,
        key: SharePartitionKey,
        content: ShareSnapshot | ShareUpdate,
        out: list[OutRecord],
    ) -> None:
        self._save(key)
        e = self.entries.get(key)
        if isinstance(content, ShareSnapshot):
            state = normalize(content)
            if e is None:
                e = self.entries[key] = ShareEntry(state, self._home(key))
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
            e = self.entries[key] = ShareEntry(state, self._home(key))
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
        out.append(OutRecord(item, e.partition, encode_share_key(RECORD_UPDATE, key), value, "update", e, key))

    def _emit_snapshot(self, item: QueuedWrite, key: SharePartitionKey, e: ShareEntry,
                       out: list[OutRecord]) -> None:
        e.updates = 0
        e.update_bytes = 0
        e.resync = False
        e.leader_epoch = self.leader_epoch
        value = encode_snapshot_value(
            e.snapshot_epoch, e.state_epoch, self.leader_epoch, ShareSnapshot(e.start, e.batches)
        )
        out.append(OutRecord(item, e.partition, encode_share_key(RECORD_SNAPSHOT, key), value, "snapshot", e, key))


__all__ = [
    "ADOPT_SHARE",
    "DELETE_GROUP",
    "DELETE_SHARE",
    "REFRESH_GROUP",
    "REFRESH_SHARE",
    "WRITE_GROUP",
    "WRITE_SHARE",
    "GroupEntry",
    "InMemoryState",
    "OutRecord",
    "ShareEntry",
    "WriteStats",
    "apply_update_in_place",
    "check_batches",
    "check_key",
    "copy_group",
    "refs_of",
]
