"""Which queued state writes go out in which produce round, and when (sans-I/O).

The state store appends each write to a queue; :class:`RoundScheduler` decides what leaves the
queue as the next produce round. Rounds overlap (up to ``max_in_flight``), but never two that touch
the same share-partition or group: a write waits for every earlier round touching what it touches
to be settled (acknowledged, or failed and rolled back), and for every earlier queued write
touching it to have started. So each share-partition's and group's writes are encoded, sent and
settled one round after the other, each on the acknowledged (or rolled back) result of the one
before, and a failed round never has a later round of the same share-partition built on its
unacknowledged state.

A write whose ``refs`` are ``None`` (a flush, a group deletion: what it touches is known only once
it is encoded) goes after everything queued before it has been settled, alone, together with
everything queued after it. And when the store asks for it (an instance group's claims to renew,
a producer being replaced), every round runs alone.

Nothing here does I/O or knows what a write contains: the store encodes, sends and settles the
rounds it is given, and tells the scheduler when each one is settled. Time enters only through the
injected clock, for ``linger_s``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True, eq=False)
class QueuedWrite:
    """One caller's write: its operations, how its caller is told the outcome, what it touches."""

    ops: list[tuple]
    future: Any  # the caller's future; resolved by the store once the write's round is settled
    # what the write touches (share-partition keys, ("group", id)); None: it cannot be told before
    # it is encoded (a group deletion) or it must follow everything before it (a flush)
    refs: frozenset[Hashable] | None = None
    error: BaseException | None = None  # the first failure of one of its records
    queued_at: float = 0.0  # the scheduler's clock when it was queued


@dataclass(slots=True, eq=False)
class Round:
    """A produce round in flight: its writes, what they touch and how to undo it."""

    items: list[QueuedWrite]
    refs: frozenset[Hashable]  # union of the items' refs
    exclusive: bool  # nothing else in flight meanwhile
    # the state of every share-partition / group before this round (filled while it is encoded,
    # emptied once it is settled): what a failure rolls back to
    undo: dict[Any, Any] = field(default_factory=dict)


class RoundScheduler:
    """The queue of state writes and the produce rounds in flight."""

    def __init__(self, max_in_flight: int = 16, *, linger_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_in_flight = max(1, max_in_flight)
        self.linger_s = linger_s
        self.clock = clock
        self.queue: list[QueuedWrite] = []
        self.in_flight: dict[Round, None] = {}  # in launch order
        self._busy: dict[Hashable, int] = {}  # ref -> rounds in flight touching it (0 or 1)

    def add(self, item: QueuedWrite) -> None:
        item.queued_at = self.clock()
        self.queue.append(item)

    def busy(self, ref: Hashable) -> bool:
        """A round in flight touches ``ref``."""
        return ref in self._busy

    @property
    def idle(self) -> bool:
        """No round in flight."""
        return not self.in_flight

    def linger_left(self) -> float:
        """Seconds until the oldest queued write has waited ``linger_s`` (0: it may go now)."""
        if not self.linger_s or not self.queue:
            return 0.0
        return max(0.0, self.queue[0].queued_at + self.linger_s - self.clock())

    def next_round(self, *, alone: bool = False) -> Round | None:
        """The next round to start (already counted as in flight), or None if nothing may go now.

        ``alone``: every round runs with nothing else in flight (it takes the whole queue).
        Call again after each round is settled (:meth:`settled`); one call takes everything that
        may go, so a second call before that returns None.
        """
        queue = self.queue
        if not queue or len(self.in_flight) >= self.max_in_flight:
            return None
        if any(r.exclusive for r in self.in_flight):
            return None
        if alone:
            if self.in_flight:
                return None
            self.queue = []
            return self._launch(queue, exclusive=True)
        take: list[QueuedWrite] = []
        keep: list[QueuedWrite] = []
        blocked: set[Hashable] = set()
        busy = self._busy
        for i, it in enumerate(queue):
            if it.refs is None:  # a flush or a group deletion
                if keep or self.in_flight:
                    keep += queue[i:]
                    break
                take += queue[i:]  # with everything after it, alone
                self.queue = []
                return self._launch(take, exclusive=True)
            if not it.refs.isdisjoint(busy) or not it.refs.isdisjoint(blocked):
                keep.append(it)
                blocked.update(it.refs)
            else:
                take.append(it)
        self.queue = keep
        return self._launch(take, exclusive=False) if take else None

    def settled(self, r: Round) -> None:
        """``r`` was settled: its writes were acknowledged or failed, and what failed was rolled
        back. What it touched is free for the next round."""
        if r in self.in_flight:
            del self.in_flight[r]
            for ref in r.refs:
                n = self._busy[ref] - 1
                if n:
                    self._busy[ref] = n
                else:
                    del self._busy[ref]

    def _launch(self, items: list[QueuedWrite], *, exclusive: bool) -> Round:
        refs = frozenset().union(*(it.refs for it in items if it.refs is not None))
        r = Round(items, refs, exclusive)
        self.in_flight[r] = None
        for ref in refs:
            self._busy[ref] = self._busy.get(ref, 0) + 1
        return r


__all__ = ["QueuedWrite", "Round", "RoundScheduler"]
