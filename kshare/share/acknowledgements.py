"""A member's acknowledgements on a share-partition engine (ShareFetch/ShareAcknowledge
AcknowledgementBatches): parsed into runs of one acknowledge type each (``parse_acknowledgements``,
what can be checked without the engine's window), checked against the window (the member must
hold every offset) and applied atomically (``Acknowledging``, part of
``kshare.share.partition.SharePartition``). Each run moves its records through the transition of
its type in ``kshare.share.states.TRANSITIONS``.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence

from kshare.share.errors import ErrorCode
from kshare.share.partition_types import AcknowledgeResult
from kshare.share.ranges import StateRange, index_of, isolate
from kshare.share.states import ACK_TYPE_EVENTS, TRANSITIONS, AcknowledgeType, RecordState, Transition

VALID_ACK_TYPES = bytes(sorted(ACK_TYPE_EVENTS))
_ACQUIRED = RecordState.ACQUIRED
_ACK_TRANSITIONS: dict[int, Transition] = {
    ack_type: TRANSITIONS[(_ACQUIRED, event)] for ack_type, event in ACK_TYPE_EVENTS.items()
}


def parse_acknowledgements(
    batches: Iterable[tuple[int, int, int | Sequence[int]]],
    renew_enabled: bool,
) -> tuple[list[tuple[int, int, int]], list[tuple[int, int]], ErrorCode]:
    """(first, last, type) runs sorted by offset, the batches' (first, last) spans sorted, and
    the error of the first batch that is malformed (INVALID_REQUEST: bad offsets, types or
    lengths, overlapping batches) or renews while renewing is off (INVALID_RECORD_STATE).
    ``types`` is one type for the whole batch or one per offset."""
    plan: list[tuple[int, int, int]] = []
    spans: list[tuple[int, int]] = []
    for first, last, types in batches:
        if first < 0 or first > last:
            return [], [], ErrorCode.INVALID_REQUEST
        if isinstance(types, int):
            codes = bytes((types,)) if 0 <= types < 256 else b"\xff"
        else:
            try:
                codes = bytes(types)
            except (TypeError, ValueError):
                return [], [], ErrorCode.INVALID_REQUEST
        if len(codes) != 1 and len(codes) != last - first + 1:
            return [], [], ErrorCode.INVALID_REQUEST
        if codes.translate(None, VALID_ACK_TYPES):
            return [], [], ErrorCode.INVALID_REQUEST
        if not renew_enabled and AcknowledgeType.RENEW in codes:
            return [], [], ErrorCode.INVALID_RECORD_STATE
        if len(codes) == 1:
            plan.append((first, last, codes[0]))
        else:
            for start, end, ack_type in _type_runs(codes):
                plan.append((first + start, first + end, ack_type))
        spans.append((first, last))
    spans.sort()
    for k in range(1, len(spans)):
        if spans[k][0] <= spans[k - 1][1]:
            return [], [], ErrorCode.INVALID_REQUEST
    plan.sort()
    return plan, spans, ErrorCode.NONE


def _type_runs(codes: bytes) -> list[tuple[int, int, int]]:
    """Runs of equal acknowledge types as (start, end inclusive, type), found with bytes.find.

    Each type's next occurrence is searched in C and cached, so a 500-offset batch with a
    few releases costs a handful of calls instead of a Python step per offset.
    """
    n = len(codes)
    present = [t for t in VALID_ACK_TYPES if t in codes]
    if len(present) == 1:
        return [(0, n - 1, present[0])]
    next_at = dict.fromkeys(present, -1)
    runs = []
    p = 0
    while p < n:
        current = codes[p]
        q = n
        for t in present:
            if t != current:
                at = next_at[t]
                if at < p:
                    at = codes.find(t, p)
                    if at < 0:
                        at = n
                    next_at[t] = at
                if at < q:
                    q = at
        runs.append((p, q - 1, current))
        p = q
    return runs


class Acknowledging:
    """The acknowledgements of a share-partition engine. Uses the engine's window (``_ranges``,
    ``_spso``, ``_speo``, ``_locks``) and its primitives (``_begin``, ``_expire``, ``_apply``,
    ``_finish``)."""

    _ranges: list[StateRange]
    _spso: int
    _speo: int
    _locks: list[tuple[int, int, int]]
    _clock: Callable[[], int]
    renew_enabled: bool
    record_lock_duration_ms: int

    def acknowledge(
        self,
        member_id: str,
        batches: Iterable[tuple[int, int, int | Sequence[int]]],
    ) -> AcknowledgeResult:
        """Apply acknowledgement batches (first, last, types) of one member, atomically.

        ``types`` is one type for the whole range or one per offset. Every offset must be
        acquired by ``member_id`` with its lock still valid, else INVALID_RECORD_STATE and
        nothing changes; malformed batches, and batches reaching past the last offset in flight
        (as Kafka 4.4 answers them), give INVALID_REQUEST. Renew (4) is accepted only
        when ``renew_enabled``. Lock expiries due by now are processed first and their
        durable change is part of the returned update even when the acknowledgement fails.
        """
        now = self._clock()
        old_start = self._begin()
        self._expire(now)
        plan, error = self._plan_acknowledgements(member_id, batches)
        if error == ErrorCode.NONE and plan:
            self._apply_plan(plan, member_id, now + self.record_lock_duration_ms)
        return AcknowledgeResult(int(error), self._finish(old_start))

    def _plan_acknowledgements(
        self,
        member_id: str,
        batches: Iterable[tuple[int, int, int | Sequence[int]]],
    ) -> tuple[list[tuple[int, int, int]], ErrorCode]:
        """Validate everything first (atomicity); returns (first, last, type) runs to apply."""
        plan, spans, error = parse_acknowledgements(batches, self.renew_enabled)
        if error:
            return [], error
        for first, last in spans:
            # As Kafka's SharePartition: a batch starting before the in-flight records is an
            # invalid state, one reaching past the last of them an invalid request
            if self._spso < self._speo and first >= self._spso and last >= self._speo:
                return [], ErrorCode.INVALID_REQUEST
            if not self._held_by(member_id, first, last):
                return [], ErrorCode.INVALID_RECORD_STATE
        return plan, ErrorCode.NONE

    def _held_by(self, member_id: str, first: int, last: int) -> bool:
        """True when every offset of first..last is acquired by the member (lock valid)."""
        if first < self._spso or last >= self._speo:
            return False
        ranges = self._ranges
        i = index_of(ranges, first)
        while i < len(ranges):
            r = ranges[i]
            if r.first > last:
                return True
            if r.state != _ACQUIRED or r.member != member_id:
                return False
            i += 1
        return True

    def _apply_plan(self, plan: list[tuple[int, int, int]], member: str, deadline: int) -> None:
        """Apply validated, sorted (first, last, type) runs in one walk over the ranges."""
        ranges = self._ranges
        i = index_of(ranges, plan[0][0])
        for first, last, ack_type in plan:
            t = _ACK_TRANSITIONS[ack_type]
            while ranges[i].last < first:
                i += 1
            while i < len(ranges):
                r = ranges[i]
                if r.first > last:
                    break
                if r.first < first or r.last > last:
                    i = isolate(ranges, i, max(r.first, first), min(r.last, last))
                    r = ranges[i]
                self._apply(r, t, member, deadline)
                i += 1
            if ack_type == AcknowledgeType.RENEW:
                heapq.heappush(self._locks, (deadline, first, last))
