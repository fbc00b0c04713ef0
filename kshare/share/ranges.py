"""Offset ranges of identical record state, kept in a sorted Python list.

The in-flight window [SPSO, SPEO) is tiled by ``StateRange`` objects with no holes and
no overlaps, so the range holding an offset is found with one ``bisect`` and the cost
of every operation grows with the number of distinct ranges, never with the number of
records. A range is split only when its records diverge and adjacent ranges that became
identical are merged again, so the whole-batch path keeps one range per batch.
"""

from __future__ import annotations

from bisect import bisect_right
from operator import attrgetter


class StateRange:
    """Offsets ``first..last`` (inclusive) that share state, delivery count and lock."""

    __slots__ = ("first", "last", "state", "count", "member", "deadline")

    def __init__(
        self,
        first: int,
        last: int,
        state: int,
        count: int,
        member: str | None = None,
        deadline: int = 0,
    ) -> None:
        self.first = first
        self.last = first if last == first else last  # one int object for single offsets
        self.state = state
        self.count = count
        self.member = member  # acquiring member id, only while Acquired
        # Acquired: lock deadline in clock milliseconds. Available: not to be acquired before it
        # (a redelivery backoff; 0 = at once). Terminal: 0.
        self.deadline = deadline

    def copy(self) -> StateRange:
        return StateRange(self.first, self.last, self.state, self.count, self.member, self.deadline)

    def same_state(self, other: StateRange) -> bool:
        """True when the two ranges may be one range (everything but the offsets equal)."""
        return (
            self.state == other.state
            and self.count == other.count
            and self.member == other.member
            and self.deadline == other.deadline
        )

    def __repr__(self) -> str:
        lock = f" {self.member}@{self.deadline}" if self.member is not None else ""
        return f"StateRange({self.first}-{self.last} state={self.state} count={self.count}{lock})"


_first = attrgetter("first")


def index_of(ranges: list[StateRange], offset: int) -> int:
    """Index of the range holding ``offset`` (ranges tile a window that contains it)."""
    return bisect_right(ranges, offset, key=_first) - 1


def isolate(ranges: list[StateRange], i: int, first: int, last: int) -> int:
    """Split ``ranges[i]`` so that ``first..last`` (inside it) is a range of its own.

    Returns the index of that range. At most two list insertions, no per-record work.
    """
    r = ranges[i]
    if first > r.first:
        left = r.copy()
        left.last = left.first if left.first == first - 1 else first - 1
        r.first = first
        ranges.insert(i, left)
        i += 1
    if last < r.last:
        right = r.copy()
        right.first = last + 1
        r.last = r.first if r.first == last else last
        ranges.insert(i + 1, right)
    return i


def merge_between(ranges: list[StateRange], lo: int, hi: int) -> None:
    """Merge identical neighbours among ``ranges[lo:hi]`` (indices clamped)."""
    lo = max(lo, 0)
    hi = min(hi, len(ranges))
    if hi - lo < 2:
        return
    merged: list[StateRange] = []
    p: StateRange | None = None
    for r in ranges[lo:hi]:
        if (
            p is not None
            and p.state == r.state
            and p.count == r.count
            and p.member == r.member
            and p.deadline == r.deadline
            and p.last + 1 == r.first
        ):
            p.last = r.last
            continue
        merged.append(r)
        p = r
    if len(merged) != hi - lo:
        ranges[lo:hi] = merged
