"""Record states, the one table of state transitions, and the durable-state algebra.

Everything that decides how a record's state may change lives in ``TRANSITIONS``
below; the engine in :mod:`kshare.share.partition` only looks transitions up.
The second half of the module is the durable side (KIP-932 "__share_group_state"):
the ``StateBatch`` / ``ShareUpdate`` / ``ShareSnapshot`` shapes and the pure
functions that replay updates onto a snapshot, shared by the engine (to rebuild)
and by whoever stores the records (to compact them).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence
from enum import IntEnum
from typing import NamedTuple


class RecordState(IntEnum):
    """In-flight record state; the values are the KIP-932 wire/durable ids."""

    AVAILABLE = 0
    ACQUIRED = 1
    ACKNOWLEDGED = 2
    ARCHIVED = 4


class AcknowledgeType(IntEnum):
    """Acknowledge types of ShareFetch / ShareAcknowledge batches."""

    GAP = 0
    ACCEPT = 1
    RELEASE = 2
    REJECT = 3
    RENEW = 4


class AcquireMode(IntEnum):
    """ShareFetch v2 ShareAcquireMode: whole batches (may overshoot) or a strict record limit."""

    BATCH_OPTIMIZED = 0
    RECORD_LIMIT = 1


class Event(IntEnum):
    """Everything that can happen to an in-flight record."""

    ACQUIRE = 0  # handed to a member with an acquisition lock
    SKIP = 1  # never to be delivered: control record, aborted transaction, offset missing upstream
    ACCEPT = 2
    RELEASE = 3
    REJECT = 4
    GAP = 5  # the client found no record at this offset
    RENEW = 6  # KIP-1222: extend the lock, no state change
    LOCK_TIMEOUT = 7
    MEMBER_GONE = 8  # the member left, was fenced or closed its share session


class Transition(NamedTuple):
    """Where a record goes on an event.

    ``at_limit`` replaces ``target`` when the record has already used every delivery
    attempt (delivery count >= the group's current ``share.delivery.count.limit``,
    looked up at decision time so a changed limit applies to later decisions, KIP-1240).
    ``delivery_increment`` is added to the delivery count when the target is reached.
    ``new_lock`` says the target holds an acquisition lock with a fresh deadline.
    ``backoff`` says an Available target may be acquired again only once the group's redelivery
    backoff (``kshare.share.redelivery.backoff.ms``, growing with the delivery count) has passed;
    with the backoff off (the default) it is Available at once, as in Apache Kafka.
    """

    target: RecordState
    at_limit: RecordState
    delivery_increment: int = 0
    new_lock: bool = False
    backoff: bool = False  # back to Available only after the group's redelivery backoff (kshare)


_AVAILABLE = RecordState.AVAILABLE
_ACQUIRED = RecordState.ACQUIRED
_ACKNOWLEDGED = RecordState.ACKNOWLEDGED
_ARCHIVED = RecordState.ARCHIVED

#: The one table of legal record-state transitions; a missing key is an invalid transition
#: (INVALID_RECORD_STATE when a client asked for it). Acknowledged and Archived are terminal:
#: the SPSO moves past them and their state is discarded.
TRANSITIONS: dict[tuple[RecordState, Event], Transition] = {
    # An Available record that already had every delivery attempt (the limit was lowered at
    # run time) is archived instead of being delivered once more.
    (_AVAILABLE, Event.ACQUIRE): Transition(_ACQUIRED, _ARCHIVED, delivery_increment=1, new_lock=True),
    (_AVAILABLE, Event.SKIP): Transition(_ARCHIVED, _ARCHIVED),
    (_ACQUIRED, Event.ACCEPT): Transition(_ACKNOWLEDGED, _ACKNOWLEDGED),
    (_ACQUIRED, Event.RELEASE): Transition(_AVAILABLE, _ARCHIVED, backoff=True),
    (_ACQUIRED, Event.REJECT): Transition(_ARCHIVED, _ARCHIVED),
    (_ACQUIRED, Event.GAP): Transition(_ARCHIVED, _ARCHIVED),
    (_ACQUIRED, Event.RENEW): Transition(_ACQUIRED, _ACQUIRED, new_lock=True),
    (_ACQUIRED, Event.LOCK_TIMEOUT): Transition(_AVAILABLE, _ARCHIVED, backoff=True),
    # Since KAFKA-19972 a session release counts as a delivery attempt (a crashing consumer
    # must not loop on a poison record forever).
    (_ACQUIRED, Event.MEMBER_GONE): Transition(_AVAILABLE, _ARCHIVED),
}

#: Acknowledge type on the wire -> engine event.
ACK_TYPE_EVENTS: dict[int, Event] = {
    AcknowledgeType.GAP: Event.GAP,
    AcknowledgeType.ACCEPT: Event.ACCEPT,
    AcknowledgeType.RELEASE: Event.RELEASE,
    AcknowledgeType.REJECT: Event.REJECT,
    AcknowledgeType.RENEW: Event.RENEW,
}

TERMINAL_STATES = frozenset((_ACKNOWLEDGED, _ARCHIVED))


def durable_view(state: int, delivery_count: int) -> tuple[int, int] | None:
    """What the durable state says about a record, or None when it says nothing.

    Acquired is never persisted: an acquired record is durably what it was before the
    acquisition (Available with one delivery fewer, or nothing for a first delivery),
    which is how delivery counts survive a crash in KIP-932 (seed 001). Records never
    delivered (delivery count 0: fresh, or skipped control/aborted/missing offsets) are
    re-derived by fetching again, so they need no durable entry.
    """
    if state == _ACQUIRED:
        delivery_count -= 1
        state = _AVAILABLE
    if delivery_count <= 0:
        return None
    return (int(state), delivery_count)


class StateBatch(NamedTuple):
    """One durable state batch: offsets first..last share a delivery state and count."""

    first_offset: int
    last_offset: int
    delivery_state: int  # 0 Available, 2 Acknowledged, 4 Archived
    delivery_count: int


class ShareUpdate(NamedTuple):
    """Content of a ShareUpdate / WriteShareGroupState: a delta over the durable state."""

    start_offset: int  # -1 when unchanged
    state_batches: tuple[StateBatch, ...]


class ShareSnapshot(NamedTuple):
    """Content of a ShareSnapshot: the complete durable state of one share-partition."""

    start_offset: int
    state_batches: tuple[StateBatch, ...]


def clip_batches(batches: Iterable[StateBatch], start: int) -> list[StateBatch]:
    """The batches from offset ``start`` on: those wholly below it dropped, one across it cut there."""
    out = []
    for b in batches:
        if b.last_offset < start:
            continue
        if b.first_offset < start:
            b = b._replace(first_offset=start)
        out.append(b)
    return out


def merge_batches(batches: Iterable[StateBatch]) -> list[StateBatch]:
    """Join contiguous batches with the same state and count (input sorted, non-overlapping)."""
    out: list[StateBatch] = []
    for b in batches:
        if out:
            p = out[-1]
            if (
                p.last_offset + 1 == b.first_offset
                and p.delivery_state == b.delivery_state
                and p.delivery_count == b.delivery_count
            ):
                out[-1] = StateBatch(p.first_offset, b.last_offset, p.delivery_state, p.delivery_count)
                continue
        out.append(b)
    return out


def overlay(base: Sequence[StateBatch], batches: Iterable[StateBatch]) -> list[StateBatch]:
    """Write ``batches`` in order over ``base`` (sorted, non-overlapping); later writes win."""
    result = list(base)
    for b in batches:
        first, last = b.first_offset, b.last_offset
        if first > last:
            raise ValueError(f"state batch with first offset {first} > last offset {last}")
        lo = bisect_left(result, first, key=_last_offset)  # first batch ending at or after `first`
        hi = lo
        while hi < len(result) and result[hi].first_offset <= last:
            hi += 1
        replacement: list[StateBatch] = []
        if lo < hi and result[lo].first_offset < first:
            replacement.append(result[lo]._replace(last_offset=first - 1))
        replacement.append(b)
        if lo < hi and result[hi - 1].last_offset > last:
            replacement.append(result[hi - 1]._replace(first_offset=last + 1))
        result[lo:hi] = replacement
    return result


def _last_offset(b: StateBatch) -> int:
    return b.last_offset


def normalize(snapshot: ShareSnapshot) -> ShareSnapshot:
    """Drop state below the start offset and move the start past settled records.

    Records in Acknowledged or Archived state at the start offset are finished, so the
    start offset moves past them exactly as the share-partition leader moves its SPSO.
    """
    start = snapshot.start_offset
    batches = merge_batches(snapshot.state_batches)
    if start < 0:
        return ShareSnapshot(start, tuple(batches))
    i = 0
    kept = clip_batches(batches, start)
    while i < len(kept) and kept[i].first_offset == start and kept[i].delivery_state in TERMINAL_STATES:
        start = kept[i].last_offset + 1
        i += 1
    return ShareSnapshot(start, tuple(kept[i:]))


def apply_update(snapshot: ShareSnapshot, update: ShareUpdate) -> ShareSnapshot:
    """Replay one ShareUpdate onto a snapshot (the share coordinator's replay step)."""
    batches = overlay(snapshot.state_batches, update.state_batches)
    start = snapshot.start_offset if update.start_offset == -1 else update.start_offset
    return normalize(ShareSnapshot(start, tuple(batches)))


def replay(snapshot: ShareSnapshot, updates: Iterable[ShareUpdate]) -> ShareSnapshot:
    """The durable state: the latest snapshot with every later update applied in order."""
    current = normalize(snapshot)
    for u in updates:
        current = apply_update(current, u)
    return current
