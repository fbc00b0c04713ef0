"""The share-partition engine: KIP-932 in-flight record state, sans I/O.

One ``SharePartition`` per (share group, topic partition). It never sees record
bodies: the caller fetches from the upstream cluster, describes the record batches it
got (``FetchedBatch``) and the engine decides which offsets the member acquires. Every
mutating call returns the durable change it made (a ``ShareUpdate``) for the caller to
persist; time comes from an injected millisecond clock and the caller schedules a timer
for ``next_deadline()``.

State transitions are looked up in ``kshare.share.states.TRANSITIONS``; this module
only walks offset ranges (``kshare.share.ranges``) and applies them. The engine's other jobs
have modules of their own: acknowledgements (``acknowledgements``), key-ordered sharing
(``key_order``), building the durable update of an operation (``partition_update``); the types
of its calls are in ``partition_types``.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterable, Iterator, Sequence

from kshare.share.acknowledgements import Acknowledging
from kshare.share.errors import ErrorCode
from kshare.share.key_order import WAITS_FOR_KEY, KeyOrder, RecordKeys, add_piece
from kshare.share.partition_types import (
    AcknowledgeResult,
    AcquiredRange,
    AcquireResult,
    FetchedBatch,
    InFlightRange,
    ResetResult,
)
from kshare.share.partition_update import durable_update
from kshare.share.ranges import StateRange, index_of, isolate, merge_between
from kshare.share.states import (
    TERMINAL_STATES,
    TRANSITIONS,
    AcknowledgeType,
    AcquireMode,
    Event,
    RecordState,
    ShareSnapshot,
    ShareUpdate,
    StateBatch,
    Transition,
    durable_view,
    merge_batches,
    replay,
)

__all__ = [
    "AcknowledgeResult",
    "AcknowledgeType",
    "AcquireMode",
    "AcquireResult",
    "AcquiredRange",
    "FetchedBatch",
    "InFlightRange",
    "RecordState",
    "ResetResult",
    "SharePartition",
    "ShareSnapshot",
    "ShareUpdate",
    "StateBatch",
]

DEFAULT_DELIVERY_COUNT_LIMIT = 5
DEFAULT_MAX_RECORD_LOCKS = 2000
DEFAULT_RECORD_LOCK_DURATION_MS = 30_000

_AVAILABLE = RecordState.AVAILABLE
_ACQUIRED = RecordState.ACQUIRED
_ARCHIVED = RecordState.ARCHIVED

_T_ACQUIRE = TRANSITIONS[(_AVAILABLE, Event.ACQUIRE)]
_T_SKIP = TRANSITIONS[(_AVAILABLE, Event.SKIP)]
_T_LOCK_TIMEOUT = TRANSITIONS[(_ACQUIRED, Event.LOCK_TIMEOUT)]
_T_MEMBER_GONE = TRANSITIONS[(_ACQUIRED, Event.MEMBER_GONE)]


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class SharePartition(Acknowledging, KeyOrder):
    """In-flight state of one share-partition: SPSO, SPEO and offset ranges between them.

    Invariants: ``ranges`` tiles [SPSO, SPEO) exactly; the first range (if any) is not
    Acknowledged/Archived (the SPSO has moved past those); adjacent ranges differ.
    Available ranges with delivery count 0 are offsets never delivered (holes left by a
    restart); they are fetched and acquired like new records.
    """

    def __init__(
        self,
        start_offset: int,
        *,
        clock: Callable[[], int] = _monotonic_ms,
        delivery_count_limit: int = DEFAULT_DELIVERY_COUNT_LIMIT,
        max_record_locks: int = DEFAULT_MAX_RECORD_LOCKS,
        record_lock_duration_ms: int = DEFAULT_RECORD_LOCK_DURATION_MS,
        renew_enabled: bool = False,
        redelivery_backoff_ms: int = 0,
        redelivery_backoff_max_ms: int = 0,
        key_ordered: bool = False,
    ) -> None:
        if start_offset < 0:
            raise ValueError("start offset must be resolved (auto.offset.reset) before building the engine")
        self._clock = clock
        # A proxy draining before it stops (kshare.share.drain): nothing more is handed out, what
        # is held may still be acknowledged, released or time out.
        self.paused = False
        self._spso = start_offset
        self._speo = start_offset
        self._ranges: list[StateRange] = []
        # Lock deadlines: (deadline, first, last) entries, stale ones dropped lazily.
        self._locks: list[tuple[int, int, int]] = []
        # Ends of redelivery backoffs: (available at, first, last), stale ones dropped lazily.
        self._delays: list[tuple[int, int, int]] = []
        self._now = 0  # clock ms of the operation under way (set by _expire, which each one calls)
        # No Available record exists below this offset (cheap next_fetch_offset).
        self._available_from = start_offset
        # Per-operation scratch: offsets touched (for merging) and durable changes.
        self._touch_lo = 0
        self._touch_hi = -1
        self._changes: list[StateBatch] = []
        # Ranges the last operation archived after delivering them: (first, last, delivery count).
        self._archived: list[tuple[int, int, int]] = []
        # Offsets acquired per member, kept by every transition (fair shares need it per fetch).
        self._held: dict[str, int] = {}
        self.delivery_count_limit = delivery_count_limit
        self.max_record_locks = max_record_locks
        self.record_lock_duration_ms = record_lock_duration_ms
        self.renew_enabled = renew_enabled
        self.redelivery_backoff_ms = redelivery_backoff_ms
        self.redelivery_backoff_max_ms = redelivery_backoff_max_ms
        self._init_keys(start_offset)  # key-ordered sharing (kshare.share.key_order)
        self.key_ordered = key_ordered

    # ------------------------------------------------------------------ configuration

    @property
    def delivery_count_limit(self) -> int:
        """``share.delivery.count.limit``; a change applies to every later decision (KIP-1240)."""
        return self._limit

    @delivery_count_limit.setter
    def delivery_count_limit(self, value: int) -> None:
        if value < 1:
            raise ValueError("delivery count limit must be at least 1")
        self._limit = value

    def backoff_ms(self, delivery_count: int) -> int:
        """How long a record delivered ``delivery_count`` times waits before it may be acquired
        again after a release or a lock timeout: the backoff, doubled for every delivery after
        the first, at most the maximum (0: no backoff)."""
        base = self.redelivery_backoff_ms
        if base <= 0:
            return 0
        top = max(base, self.redelivery_backoff_max_ms)
        shift = max(0, delivery_count - 1)
        return top if shift >= 40 else min(top, base << shift)

    # ------------------------------------------------------------------ queries

    @property
    def archived(self) -> list[tuple[int, int, int]]:
        """(first, last, delivery count) of the delivered records the last operation archived
        (rejected, acknowledged as gaps, or released / timed out / given back / re-acquired at
        the delivery count limit). Records skipped because they are gone upstream are not here.

        The durable update cannot tell: when the SPSO moves past an archived record the update
        only carries the new start offset. The dead-letter queue needs exactly these records.
        """
        return self._archived

    @property
    def start_offset(self) -> int:
        """SPSO: every offset below it is finished."""
        return self._spso

    @property
    def end_offset(self) -> int:
        """SPEO (exclusive): the first offset not yet in flight."""
        return self._speo

    @property
    def in_flight_count(self) -> int:
        """Size of the in-flight window (what ``share.partition.max.record.locks`` bounds)."""
        return self._speo - self._spso

    def next_fetch_offset(self) -> int:
        """Where the next upstream fetch should start.

        The first Available offset in the window (a record to redeliver, or a hole never
        delivered); its upstream batch is re-read and only the Available offsets are
        acquired. With nothing Available it is the SPEO. In a key-ordered group, no later
        than the first offset of the window whose key is not known yet (after a restart).
        """
        offset = self._next_available()
        if self._key_ordered:
            keyed_to = max(self._keyed_to, self._spso)
            if keyed_to < offset:
                return keyed_to
        return offset

    def _next_available(self) -> int:
        ranges = self._ranges
        start = max(self._available_from, self._spso)
        if start >= self._speo:
            self._available_from = self._speo
            return self._speo
        i = index_of(ranges, start)
        n = len(ranges)
        now = self._clock() if self._delays else 0
        waiting = -1  # the first Available offset still in its redelivery backoff
        while i < n:
            r = ranges[i]
            if r.state == _AVAILABLE:
                if r.deadline > now:
                    if waiting < 0:
                        waiting = r.first
                    i += 1
                    continue
                self._available_from = r.first if waiting < 0 else waiting
                return max(r.first, start)
            i += 1
        self._available_from = self._speo if waiting < 0 else waiting
        return self._speo

    def has_available(self) -> bool:
        """True when the window holds records to deliver again (wake long-polling fetches)."""
        return self.next_fetch_offset() < self._speo

    def can_acquire(self) -> bool:
        """True when an acquire could hand out something: redeliveries or window room (and the
        share-partition is not paused)."""
        return not self.paused and (self.has_available() or self._speo - self._spso < self.max_record_locks)

    def next_deadline(self) -> int | None:
        """When the state next changes by itself (clock ms): the earliest lock deadline of an
        acquired record, or the end of a redelivery backoff if sooner; None when neither."""
        heap = self._locks
        lock = None
        while heap:
            deadline, first, last = heap[0]
            if last >= self._spso and self._holds_lock(deadline, first, last):
                lock = deadline
                break
            heapq.heappop(heap)
        delays = self._delays
        while delays:
            at, first, last = delays[0]
            if last >= self._spso and self._has_range(_AVAILABLE, at, first, last):
                return at if lock is None or at < lock else lock
            heapq.heappop(delays)
        return lock

    def in_flight(self) -> list[InFlightRange]:
        """The state ranges of the window, in offset order."""
        return [
            InFlightRange(
                r.first,
                r.last,
                RecordState(r.state),
                r.count,
                r.member,
                r.deadline if r.state == _ACQUIRED else None,
                r.deadline if r.state == _AVAILABLE and 0 < r.deadline < WAITS_FOR_KEY else None,
                r.state == _AVAILABLE and r.deadline == WAITS_FOR_KEY,
            )
            for r in self._ranges
        ]

    def acquired_count(self, member_id: str | None = None) -> int:
        """Offsets currently acquired (by one member, or by anyone), lock expiry not yet applied."""
        if member_id is not None:
            return self._held.get(member_id, 0)
        return sum(self._held.values())

    def snapshot(self) -> ShareSnapshot:
        """ShareSnapshot content of the current durable state (Acquired never appears)."""
        batches: list[StateBatch] = []
        for r in self._ranges:
            view = durable_view(r.state, r.count)
            if view is not None:
                batches.append(StateBatch(r.first, r.last, view[0], view[1]))
        return ShareSnapshot(self._spso, tuple(merge_batches(batches)))

    @classmethod
    def from_snapshot(
        cls,
        snapshot: ShareSnapshot,
        updates: Iterable[ShareUpdate] = (),
        **config: object,
    ) -> SharePartition:
        """Rebuild an engine from the durable state: a snapshot plus the updates after it.

        Keyword arguments are those of the constructor (clock, limits, ...). Offsets the
        durable state says nothing about are holes to be fetched again.
        """
        state = replay(snapshot, updates)
        if state.start_offset < 0:
            raise ValueError("durable start offset is -1: resolve share.auto.offset.reset first")
        engine = cls(state.start_offset, **config)  # type: ignore[arg-type]
        ranges = engine._ranges
        cursor = state.start_offset
        for b in state.state_batches:
            if b.first_offset > cursor:
                ranges.append(StateRange(cursor, b.first_offset - 1, _AVAILABLE, 0))
            # A persisted Acquired state (not written by this engine) cannot hold a lock any more.
            st = _AVAILABLE if b.delivery_state == _ACQUIRED else RecordState(b.delivery_state)
            # A backoff is not stored: a record delivered before waits its backoff again from
            # now (never sooner than the backoff after its last delivery, maybe later).
            delay = engine.backoff_ms(b.delivery_count) if st == _AVAILABLE and b.delivery_count else 0
            at = engine._clock() + delay if delay else 0
            ranges.append(StateRange(b.first_offset, b.last_offset, st, b.delivery_count, None, at))
            if at:
                heapq.heappush(engine._delays, (at, b.first_offset, b.last_offset))
            cursor = b.last_offset + 1
        engine._speo = cursor
        merge_between(ranges, 0, len(ranges))
        engine._advance_start()
        return engine

    # ------------------------------------------------------------------ acquire

    def acquire(
        self,
        member_id: str,
        fetched_batches: Sequence[FetchedBatch],
        max_records: int,
        mode: int = AcquireMode.BATCH_OPTIMIZED,
        *,
        fetch_offset: int | None = None,
        lso: int | None = None,
        aborted_transactions: Iterable[tuple[int, int]] | None = None,
        lock_duration_ms: int | None = None,
        record_keys: Sequence[RecordKeys | None] | None = None,
        max_keys: int | None = None,
    ) -> AcquireResult:
        """Acquire records of ``fetched_batches`` (sorted by offset) for ``member_id``.

        Batch-optimized mode takes every Available offset of a batch once it starts one,
        so ``max_records`` may be overshot by the last batch, as Kafka does; record-limit
        mode (ShareFetch v2) never acquires more than ``max_records``. New offsets enter
        the window only while it is smaller than ``max_record_locks`` (the batch that
        crosses the limit is still taken whole in batch-optimized mode).

        ``fetch_offset`` is where the upstream fetch started: offsets from there up to
        the first batch, and between batches, are missing upstream (compacted, deleted)
        and are archived. Without it nothing is inferred before the first batch.
        Control batches and, when ``aborted_transactions`` ((producer id, first offset)
        pairs of the Fetch response) is given, records of aborted transactions are
        archived, never delivered. With ``lso`` (read_committed) nothing at or past the
        last stable offset is touched.

        Key-ordered groups (``key_ordered``) also need ``record_keys``, one entry per fetched
        batch (None: a batch whose keys could not be read, taken as keyless): a record is
        acquired only when every earlier record of its key is finished, records waiting for
        their key are set aside until then, and ``max_keys`` bounds how many keyed records
        (so how many keys) this member takes, so that the keys spread over the members. Under
        that bound the next records of the keys this member finished last (acknowledged while
        holding them) are taken first, the other keys' heads then in offset order (affinity).
        """
        now = self._clock()
        old_start = self._begin()
        self._expire(now)
        if self._key_ordered:
            self._begin_keyed_acquire(member_id, fetched_batches, record_keys, fetch_offset, max_keys, max_records)
        pieces: list[list[int]] = []  # [first, last, delivery count], merged as they come
        total = 0
        if max_records > 0 and fetched_batches:
            deadline = now + (self.record_lock_duration_ms if lock_duration_ms is None else lock_duration_ms)
            total = self._acquire_batches(
                member_id,
                fetched_batches,
                max_records,
                mode == AcquireMode.RECORD_LIMIT,
                fetch_offset,
                lso,
                aborted_transactions,
                deadline,
                pieces,
            )
            if pieces:
                heapq.heappush(self._locks, (deadline, pieces[0][0], pieces[-1][1]))
        update = self._finish(old_start)
        return AcquireResult([AcquiredRange(a, b, c) for a, b, c in pieces], total, update)

    def _acquire_batches(
        self,
        member_id: str,
        fetched_batches: Sequence[FetchedBatch],
        max_records: int,
        record_limit: bool,
        fetch_offset: int | None,
        lso: int | None,
        aborted_transactions: Iterable[tuple[int, int]] | None,
        deadline: int,
        pieces: list[list[int]],
    ) -> int:
        """Walk the fetched batches in order; returns the number of offsets acquired."""
        budget = max_records
        acquired = 0
        aborted = sorted(aborted_transactions or (), key=lambda t: t[1])
        next_aborted = 0
        aborted_producers: set[int] = set()
        expected = fetch_offset  # next offset the fetched data should hold, None = unknown
        for base, last, is_control, is_transactional, producer_id in fetched_batches:
            if lso is not None and base >= lso:
                break
            # Transaction bookkeeping as a read_committed consumer does it, minus record bodies:
            # an aborted transaction's producer is tracked from its first offset until its
            # next control batch (the abort marker, as a producer has one transaction at a time).
            while next_aborted < len(aborted) and aborted[next_aborted][1] <= last:
                aborted_producers.add(aborted[next_aborted][0])
                next_aborted += 1
            skip = is_control or (is_transactional and producer_id in aborted_producers)
            if is_control:
                aborted_producers.discard(producer_id)
            if expected is not None and base > expected:
                self._skip_span(max(expected, self._spso), base - 1)
            lo = base if expected is None else max(base, expected)
            lo = max(lo, self._spso)
            hi = last if lso is None or last < lso else lso - 1
            if expected is None or last + 1 > expected:
                expected = last + 1
            if lo > hi:
                continue
            if skip:
                self._skip_span(lo, hi)
                continue
            if budget <= 0:
                break  # only skipped batches may follow the last acquired one
            if self._key_ordered:
                got, stop = self._acquire_keyed(lo, hi, member_id, deadline, budget if record_limit else None,
                                                pieces)
                acquired += got
                budget -= got
                if stop or (lso is not None and last >= lso):
                    break
                continue
            speo = self._speo
            # 1. Offsets already in the window: take the Available ones.
            if lo < speo:
                got, cut = self._acquire_span(
                    lo, min(hi, speo - 1), member_id, deadline, budget if record_limit else None, pieces
                )
                acquired += got
                budget -= got
                if cut:
                    break
            # 2. Offsets past the window: new records.
            if hi >= self._speo:
                start = max(lo, self._speo)
                window = self._speo - self._spso
                room = self.max_record_locks - window
                if room <= 0 or (record_limit and budget <= 0):
                    break
                if start > self._speo:
                    # Unknown offsets before this batch (no fetch_offset given): fetch again later.
                    self._append(StateRange(self._speo, start - 1, _AVAILABLE, 0))
                end = hi
                if record_limit:
                    end = min(hi, start + min(budget, room) - 1)
                self._append(StateRange(start, end, _ACQUIRED, 1, member_id, deadline))
                add_piece(pieces, start, end, 1)
                got = end - start + 1
                acquired += got
                budget -= got
                if end < hi:
                    break
            if lso is not None and last >= lso:
                break
        return acquired

    def _acquire_span(
        self,
        lo: int,
        hi: int,
        member_id: str,
        deadline: int,
        cap: int | None,
        pieces: list[list[int]],
    ) -> tuple[int, bool]:
        """Acquire the Available offsets of lo..hi (inside the window), at most ``cap``.

        Returns (offsets acquired, whether the cap stopped it before the end).
        """
        ranges = self._ranges
        i = index_of(ranges, lo)
        got = 0
        limit = self._limit
        while i < len(ranges):
            r = ranges[i]
            if r.first > hi:
                break
            if r.state != _AVAILABLE or r.deadline > self._now:  # or still in its backoff
                i += 1
                continue
            a = r.first if r.first > lo else lo
            b = r.last if r.last < hi else hi
            if cap is not None and r.count < limit:
                left = cap - got
                if left <= 0:
                    return got, True
                if b - a + 1 > left:
                    b = a + left - 1
            i = isolate(ranges, i, a, b)
            r = ranges[i]
            self._apply(r, _T_ACQUIRE, member_id, deadline)
            if r.state == _ACQUIRED:
                got += b - a + 1
                add_piece(pieces, a, b, r.count)
            i += 1
        return got, False

    def _touch(self, first: int, last: int) -> None:
        if first < self._touch_lo:
            self._touch_lo = first
        if last > self._touch_hi:
            self._touch_hi = last

    def _skip_span(self, lo: int, hi: int) -> None:
        """Archive lo..hi without delivering it (control, aborted or missing offsets)."""
        if lo > hi:
            return
        speo = self._speo
        if lo < speo:
            ranges = self._ranges
            i = index_of(ranges, lo)
            top = min(hi, speo - 1)
            while i < len(ranges):
                r = ranges[i]
                if r.first > top:
                    break
                if r.state == _AVAILABLE:
                    i = isolate(ranges, i, max(r.first, lo), min(r.last, top))
                    self._apply(ranges[i], _T_SKIP, None, 0)
                i += 1
        if hi >= self._speo:
            start = max(lo, self._speo)
            if start > self._speo:
                self._append(StateRange(self._speo, start - 1, _AVAILABLE, 0))
            self._append(StateRange(start, hi, _ARCHIVED, 0))
            if self._key_ordered:
                self._finish_keys(start, hi)

    def _append(self, r: StateRange) -> None:
        """Add a range at the SPEO (new offsets entering the window)."""
        ranges = self._ranges
        if ranges:
            p = ranges[-1]
            if p.same_state(r):
                p.last = r.last
            else:
                ranges.append(r)
        else:
            ranges.append(r)
        self._speo = r.last + 1
        if r.state == _ACQUIRED:
            self._hold(r.member, r.last - r.first + 1)
        if r.state == _AVAILABLE and r.first < self._available_from:
            self._available_from = r.first
        if r.first < self._touch_lo:
            self._touch_lo = r.first
        self._touch_hi = r.last

    # ------------------------------------------------------------------ locks and members

    def expire_locks(self, now: int | None = None) -> ShareUpdate | None:
        """Release every record whose lock deadline is <= now (Available, or Archived at the limit)."""
        old_start = self._begin()
        self._expire(self._clock() if now is None else now)
        return self._finish(old_start)

    def _expire(self, now: int) -> None:
        self._now = now
        for at, r in self._due_ranges(self._delays, now):  # backoffs that ended: plain Available again
            if r.state == _AVAILABLE and r.deadline == at:
                r.deadline = 0
                self._touch(r.first, r.last)
        for _, r in self._due_ranges(self._locks, now):
            if r.state == _ACQUIRED and r.deadline <= now:
                self._apply(r, _T_LOCK_TIMEOUT, None, 0)

    def _due_ranges(self, heap: list[tuple[int, int, int]], now: int) -> Iterator[tuple[int, StateRange]]:
        """Pop the (deadline, first, last) entries of ``heap`` due by ``now``; the ranges of the
        window each may name, with its deadline (the caller checks the entry still stands)."""
        ranges = self._ranges
        while heap and heap[0][0] <= now:
            at, first, last = heapq.heappop(heap)
            if last < self._spso:
                continue
            i = index_of(ranges, max(first, self._spso))
            while i < len(ranges):
                r = ranges[i]
                if r.first > last:
                    break
                yield at, r
                i += 1

    def _holds_lock(self, deadline: int, first: int, last: int) -> bool:
        return self._has_range(_ACQUIRED, deadline, first, last)

    def _has_range(self, state: int, deadline: int, first: int, last: int) -> bool:
        """True when a range of ``state`` with this ``deadline`` (a lock's, or a backoff's end)
        lies in first..last: the heap entry that named it still stands."""
        ranges = self._ranges
        if not ranges:
            return False
        i = index_of(ranges, max(first, self._spso))
        while i < len(ranges):
            r = ranges[i]
            if r.first > last:
                break
            if r.state == state and r.deadline == deadline:
                return True
            i += 1
        return False

    def release_member(self, member_id: str) -> ShareUpdate | None:
        """Release everything the member holds (it left, was fenced or closed its session).

        Counts as a delivery attempt, as Kafka does since KAFKA-19972: at the limit the
        records are archived.
        """
        old_start = self._begin()
        self._expire(self._clock())
        for r in self._ranges:
            if r.state == _ACQUIRED and r.member == member_id:
                self._apply(r, _T_MEMBER_GONE, None, 0)
        self._forget_member_keys(member_id)
        return self._finish(old_start)

    # ------------------------------------------------------------------ SPSO movement

    def skip_to_log_start(self, log_start_offset: int) -> ShareUpdate | None:
        """Records below the upstream log start are gone (retention, DeleteRecords): skip them.

        Available offsets below it are archived without a delivery and the SPSO moves up to
        it (one range, however far). Acquired ones keep their lock, since their member may
        still acknowledge them, and are skipped when they come back. Unlike
        ``reset_start_offset`` this works while records are acquired.
        """
        old_start = self._begin()
        self._expire(self._clock())
        if log_start_offset > self._spso:
            self._skip_span(self._spso, log_start_offset - 1)
        return self._finish(old_start)

    # ------------------------------------------------------------------ SPSO reset

    def reset_start_offset(self, offset: int) -> ResetResult:
        """Move the SPSO to ``offset`` (resolved by the caller), discarding in-flight state.

        Refused with NON_EMPTY_GROUP while any record is acquired (after processing the
        expired locks). On success the returned snapshot replaces the durable state.
        """
        if offset < 0:
            raise ValueError("offset must be >= 0")
        old_start = self._begin()
        self._expire(self._clock())
        if any(r.state == _ACQUIRED for r in self._ranges):
            return ResetResult(int(ErrorCode.NON_EMPTY_GROUP), None, self._finish(old_start))
        self._changes = []
        self._ranges.clear()
        self._locks.clear()
        self._delays.clear()
        self._forget_keys(offset)
        self._spso = self._speo = self._available_from = offset
        return ResetResult(int(ErrorCode.NONE), ShareSnapshot(offset, ()), None)

    # ------------------------------------------------------------------ internals

    def _begin(self) -> int:
        self._touch_lo = self._speo
        self._touch_hi = -1
        self._changes = []
        self._archived = []
        return self._spso

    def _apply(self, r: StateRange, t: Transition, member: str | None, deadline: int) -> None:
        """Move range ``r`` through transition ``t``, recording any durable change."""
        before = durable_view(r.state, r.count)
        holder = None
        if r.state == _ACQUIRED:
            if t is not _T_LOCK_TIMEOUT and t is not _T_MEMBER_GONE:
                holder = r.member  # finished by its member's acknowledgement, if terminal
            self._hold(r.member, r.first - r.last - 1)
        if r.count >= self._limit:
            target = t.at_limit
        else:
            target = t.target
            r.count += t.delivery_increment
        was = r.state
        r.state = target
        if target == _ARCHIVED and r.count > 0 and t is not _T_SKIP:
            self._archived.append((r.first, r.last, r.count))
        if self._key_ordered and (was == _ACQUIRED) != (target == _ACQUIRED):
            # (before _finish_keys forgets their keys) one member at a time holds a key's records
            self._count_out(r.first, r.last, member if target == _ACQUIRED else r.member, target == _ACQUIRED)
        if self._key_ordered and target in TERMINAL_STATES:
            # (acknowledged by the member holding it: its keys stay with it, see _acquire_keyed)
            self._finish_keys(r.first, r.last, holder)
        if target == _ACQUIRED:
            if t.new_lock:
                r.deadline = deadline
                if member is not None:
                    r.member = member
        else:
            r.member = None
            r.deadline = 0
            if target == _AVAILABLE:
                delay = self.backoff_ms(r.count) if t.backoff else 0
                if delay:
                    r.deadline = self._now + delay
                    heapq.heappush(self._delays, (r.deadline, r.first, r.last))
                if r.first < self._available_from:
                    self._available_from = r.first
        if target == _ACQUIRED:
            self._hold(r.member, r.last - r.first + 1)
        after = durable_view(target, r.count)
        if after != before:
            assert after is not None, "a durable entry never disappears without an SPSO move"
            self._changes.append(StateBatch(r.first, r.last, after[0], after[1]))
        if r.first < self._touch_lo:
            self._touch_lo = r.first
        if r.last > self._touch_hi:
            self._touch_hi = r.last

    def _hold(self, member: str | None, delta: int) -> None:
        if member is None:
            return
        n = self._held.get(member, 0) + delta
        if n:
            self._held[member] = n
        else:
            del self._held[member]

    def _finish(self, old_start: int) -> ShareUpdate | None:
        """Merge touched ranges, move the SPSO, and build the durable update of the operation."""
        ranges = self._ranges
        if self._key_ordered:
            self._wake_keys()  # the keys the operation finished or freed: their next records may go
        if self._touch_hi >= self._touch_lo and ranges:
            lo = index_of(ranges, max(self._touch_lo, ranges[0].first))
            hi = index_of(ranges, min(self._touch_hi, ranges[-1].last))
            merge_between(ranges, lo - 1, hi + 2)
        self._advance_start()
        changes = self._changes
        self._changes = []
        return durable_update(changes, old_start, self._spso, self._durable_state_remains)

    def _advance_start(self) -> None:
        """Move the SPSO past Acknowledged/Archived records and forget their state."""
        ranges = self._ranges
        k = 0
        n = len(ranges)
        while k < n and ranges[k].state in TERMINAL_STATES:
            k += 1
        if k:
            self._spso = ranges[k].first if k < n else self._speo
            del ranges[:k]
            for heap in (self._locks, self._delays):
                while heap and heap[0][2] < self._spso:
                    heapq.heappop(heap)

    def _durable_state_remains(self) -> bool:
        for r in self._ranges:
            if durable_view(r.state, r.count) is not None:
                return True
        return False

    def __repr__(self) -> str:
        return f"SharePartition(spso={self._spso}, speo={self._speo}, ranges={self._ranges!r})"
