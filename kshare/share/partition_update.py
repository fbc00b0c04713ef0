"""One engine operation's durable change, as the ShareUpdate the share-partition writes.

The engine records a state batch for every range whose durable view changed; this turns them,
with the SPSO before and after the operation, into the smallest update whose replay
(``kshare.share.states.replay``) gives the engine's new durable state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kshare.share.states import ShareUpdate, StateBatch, clip_batches, merge_batches, overlay


def durable_update(changes: list[StateBatch], old_start: int, new_start: int,
                   durable_state_remains: Callable[[], bool]) -> ShareUpdate | None:
    """The update of an operation that made ``changes`` (in the order made) and moved the SPSO
    from ``old_start`` to ``new_start``; None when nothing durable changed.
    ``durable_state_remains``: whether any durable state stays in flight (asked only if needed)."""
    if not changes:
        return None if new_start == old_start else ShareUpdate(new_start, ())
    batches = merge_batches(changes if _sorted_disjoint(changes) else overlay((), changes))
    if new_start == old_start:
        return ShareUpdate(-1, tuple(batches))
    # The SPSO moved. When the records it moved past are exactly the ones this update
    # settles and other durable state stays in flight, the update stays a pure delta:
    # replaying it moves the start past the settled records (seed 001, "Acknowledge 110").
    # Otherwise the new start offset is written and settles everything below it.
    if _covers(batches, old_start, new_start) and durable_state_remains():
        return ShareUpdate(-1, tuple(batches))
    return ShareUpdate(new_start, tuple(clip_batches(batches, new_start)))


def _sorted_disjoint(batches: Sequence[StateBatch]) -> bool:
    prev = -1
    for b in batches:
        if b.first_offset <= prev:
            return False
        prev = b.last_offset
    return True


def _covers(batches: Sequence[StateBatch], first: int, end: int) -> bool:
    """True when ``batches`` (sorted) cover every offset of first..end-1."""
    cursor = first
    for b in batches:
        if b.last_offset < cursor:
            continue
        if b.first_offset > cursor:
            return False
        cursor = b.last_offset + 1
        if cursor >= end:
            return True
    return cursor >= end
