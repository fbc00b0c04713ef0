"""Fair acquisition (sans-I/O): how many records one member may acquire from a share-partition now.

A share-partition lends at most ``share.partition.max.record.locks`` records at a time. Handed
out first come, first served, with clients' default ``max.poll.records`` (500) four members take
the whole budget and every other member of the partition waits (Apache Kafka 4.4 does exactly
this). ``FairShare`` divides the budget among the members that fetch from the partition instead:

* Nobody is capped while the members' requests fit the budget together (a member alone, or a
  few members, still get full batches).
* Otherwise each member's share is the budget weighted by its pace (records it settles per
  second, measured from its own acquire-to-settle cycles, so a slow member holds fewer locks
  that a fast one could use); members not yet measured count as the median member. Weights
  are kept within ``PACE_SPREAD`` of the median so one outlier cannot starve or flood the rest.
* A member may acquire its share minus what it already holds, never below zero (it must work
  off what it holds first); a share is never less than one record.
* When fewer records are waiting than the members ask for, what is waiting is divided the same
  way (without counting what members hold), so the end of a burst is spread too.
* In batch-optimized mode (``whole_batches``) a member holding nothing here takes whole record
  batches, its share rounded up to the end of the batch that holds its last record, when the
  records beyond its share add little to the time it holds them (its time goes to round trips,
  not to work on each record: 100 asyncio consumers in one process, not 24 that work 5 ms on
  each record). Apache Kafka 4.4 hands out whole batches too, first come, first
  served (``SharePartition.acquire``: at most ``maxFetchRecords``
  and the lock budget's room, rounded up to the end of the batch holding the last of them). A
  share of a batch would otherwise cost the client the whole batch (a broker never re-encodes
  records, so it is sent whole) and cost everyone more fetches. The member then holds more than
  its share, so it takes nothing more here until it has settled them.

Members are those the assignment gives the partition to and that have not fetched from it yet,
and those that fetched from it within the lock duration and have not left (``leave``: session
closed or partition forgotten, member gone) -- except members that hold nothing here and have not
fetched for ``QUIET_MS``: they are not competing for records now (a Spark worker whose turn is
the next micro-batch, a consumer busy elsewhere) and count again at their next fetch. Time comes
from the caller, in milliseconds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

PACE_SPREAD = 8.0  # a member's weight stays within [median / 8, median * 8]
PACE_EWMA = 0.3  # weight of a new pace sample
DEFAULT_WANTED = 500  # what a member that has not fetched yet is taken to ask for (clients' default)
QUIET_MS = 2000  # a member holding nothing that has not fetched for this long is not competing
ROUND_UP_MS = 100  # whole batches when the records beyond a share add at most this to its hold (whole_batches)
FIT_EWMA = 0.2  # weight of a new cycle in a member's time-over-records fit
FIT_SPREAD = 0.25  # the fit's slope counts once the cycles' sizes vary by this (coefficient of variation)
FIT_CYCLES = 4  # ... and it has this many cycles


@dataclass(slots=True)
class _Member:
    last_fetch_ms: int
    wanted: int  # records its last fetch asked for
    ms_per_record: float | None = None  # measured pace, None until a first cycle completes
    cycle_start_ms: int = -1  # when it last went from holding nothing to holding records
    cycle_records: int = 0  # records acquired in the current cycle
    acquired_total: int = 0  # records acquired since it joined the partition (metrics)
    fit: list[float] | None = None  # cycles' records and ms, averaged: [n, ms, n*n, n*ms, ms*ms]
    fitted: int = 0  # cycles in the fit
    ms_per_extra: float | None = None  # how much longer its cycles last per record more (measured)


class FairShare:
    """The members fetching from one share-partition and their fair shares of its lock budget."""

    def __init__(self) -> None:
        self.members: dict[str, _Member] = {}
        self.seen: set[str] = set()  # members that fetched here since they joined the partition

    def fetching(self, member_id: str, wanted: int, held: int, now_ms: int) -> None:
        """A fetch from ``member_id`` asking for ``wanted`` records; it holds ``held`` here now.

        Holding nothing after a cycle of acquisitions closes the cycle: its length over the
        records acquired in it is one pace sample.
        """
        m = self.members.get(member_id)
        if m is None:
            self.members[member_id] = _Member(now_ms, wanted)
            self.seen.add(member_id)
            return
        m.last_fetch_ms = now_ms
        m.wanted = wanted
        if held == 0 and m.cycle_records > 0:
            n, ms = m.cycle_records, max(now_ms - m.cycle_start_ms, 1)
            sample = ms / n
            m.ms_per_record = sample if m.ms_per_record is None else (
                (1 - PACE_EWMA) * m.ms_per_record + PACE_EWMA * sample)
            _fit_cycle(m, n, ms)
            m.cycle_records = 0

    def acquired(self, member_id: str, count: int, now_ms: int) -> None:
        m = self.members.get(member_id)
        if m is None or count <= 0:
            return
        if m.cycle_records == 0:
            m.cycle_start_ms = now_ms
        m.cycle_records += count
        m.acquired_total += count

    def whole_batches(self, member_id: str, start: int, cap: int, batch_lasts: Iterable[int]) -> bool:
        """Batch-optimized mode, ``member_id`` holding nothing here and capped at ``cap`` records
        from offset ``start``: whether it takes whole batches, its cap rounded up to the end of
        the batch holding its ``cap``-th offset (``rounded_up``; the batches read, by their last
        offsets). Yes when the offsets beyond its cap add at most ``ROUND_UP_MS`` to the time it
        holds what it takes. Each adds at most its pace (a cycle's fixed part, its round trips,
        does not grow), and at most its measured cost of one record more where cycles of
        different sizes tell it (an upper bound: ``_fit_cycle``). A member working on every
        record (5 ms each) so takes at most 20 records more than its share, or batches held for
        seconds would pin the share-partition's window while the others wait for room; one
        whose time goes to round trips takes whole batches. Not before its pace is known.
        Counted in offsets: records others hold among them only make the acquisition smaller."""
        n = rounded_up(start, cap, batch_lasts)
        if n is None or n <= cap:
            return True  # nothing to round: the batches end within its cap
        m = self.members.get(member_id)
        if m is None or m.ms_per_record is None:
            return False  # no cycle of its own yet
        per_record = m.ms_per_record if m.ms_per_extra is None else min(m.ms_per_record, m.ms_per_extra)
        extra = (n - cap) * per_record
        return extra <= ROUND_UP_MS

    def leave(self, member_id: str) -> None:
        self.members.pop(member_id, None)
        self.seen.discard(member_id)

    def active(self, now_ms: int, idle_ms: int) -> dict[str, _Member]:
        """Members that fetched within ``idle_ms``; older ones are forgotten."""
        gone = [k for k, m in self.members.items() if now_ms - m.last_fetch_ms > idle_ms]
        for k in gone:
            del self.members[k]
        return self.members

    def share(self, member_id: str, budget: int, now_ms: int, idle_ms: int,
              assigned: Iterable[str] = (), held_of: Callable[[str], int] | None = None) -> int | None:
        """The member's share of ``budget`` records, None when nobody needs to be capped.

        ``assigned``: members the group's assignment gives the partition to. Those that have
        not fetched yet count too (asking for ``DEFAULT_WANTED``, at the median pace), so the
        first fetches after a start do not take the budget before the others arrive.
        ``held_of``: records a member holds here; with it, quiet members (see the module) do not
        count.
        """
        members, expected = self._competing(member_id, now_ms, idle_ms, assigned, held_of)
        return self._share(member_id, budget, members, expected, [])

    def _share(self, member_id: str, budget: int, members: dict[str, _Member], expected: list[str],
               weight: list[float]) -> int | None:
        """``share`` over members already counted; ``weight`` keeps the member's weight and the
        total once computed (``cap`` asks for two budgets over the same members: the weights,
        a sort over every member, once)."""
        if len(members) + len(expected) <= 1:
            return None
        if sum(m.wanted for m in members.values()) + DEFAULT_WANTED * len(expected) <= budget:
            return None
        if not weight:
            weights = _weights(members)
            median = _median(weights) if weights else 1.0
            weight += (weights.get(member_id, median), sum(weights.values()) + median * len(expected))
        return max(1, int(budget * weight[0] / weight[1]))

    def _competing(self, member_id: str, now_ms: int, idle_ms: int, assigned: Iterable[str],
                   held_of: Callable[[str], int] | None) -> tuple[dict[str, _Member], list[str]]:
        """The members competing for records here (those fetching, less the quiet ones), and the
        assigned ones expected to (not fetched here yet)."""
        members = self.active(now_ms, idle_ms)
        if held_of is not None:
            members = {k: m for k, m in members.items()
                       if k == member_id or now_ms - m.last_fetch_ms <= QUIET_MS or held_of(k) > 0}
        expected = [k for k in assigned if k not in self.members and k not in self.seen]
        return members, expected

    def count(self, member_id: str, now_ms: int, idle_ms: int, assigned: Iterable[str] = (),
              held_of: Callable[[str], int] | None = None) -> int:
        """How many members share the partition, as ``share`` counts them (at least 1)."""
        return max(1, len(self.sharing(member_id, now_ms, idle_ms, assigned, held_of)))

    def sharing(self, member_id: str, now_ms: int, idle_ms: int, assigned: Iterable[str] = (),
                held_of: Callable[[str], int] | None = None) -> list[str]:
        """The members sharing the partition, as ``share`` counts them."""
        members, expected = self._competing(member_id, now_ms, idle_ms, assigned, held_of)
        return [*members, *expected]

    def cap(self, member_id: str, held: int, budget: int, now_ms: int, idle_ms: int,
            assigned: Iterable[str] = (), available: int | None = None,
            held_of: Callable[[str], int] | None = None) -> int | None:
        """Records the member may acquire now, None = no cap.

        Two limits, the smaller applies: its share of the lock ``budget`` minus what it holds
        (locks are what a member's held records use up), and, when ``available`` (records no one
        holds) is given, its share of those -- so the last records of a burst are spread over
        the members instead of going to the first to ask. The second does not count what the
        member holds: a member holding records it has finished with but not yet acknowledged
        (a Spark task waiting for its micro-batch's commit) still gets its part of new ones.
        """
        members = self.members
        if (len(members) == 1 and member_id in members
                and all(k in members or k in self.seen for k in assigned)):
            return None  # alone here, nobody else expected: the common case, answered without sharing
        caps = []
        competing, expected = self._competing(member_id, now_ms, idle_ms, assigned, held_of)
        weight: list[float] = []
        s = self._share(member_id, budget, competing, expected, weight)
        if s is not None:
            caps.append(max(0, s - held))
        if available is not None:
            a = self._share(member_id, max(available, 1), competing, expected, weight)
            if a is not None:
                caps.append(a)
        return min(caps) if caps else None


def _fit_cycle(m: _Member, n: int, ms: int) -> None:
    """One more cycle of ``n`` records that lasted ``ms``: the least-squares fit of ms over records
    (moments averaged with ``FIT_EWMA``), and from it an upper bound of what one record more costs
    the member: the slope plus twice its standard error, so that a few noisy cycles (a loaded
    machine) do not pass for a member that works fast. Unknown (None) until the cycles' sizes
    vary (``FIT_SPREAD``) over ``FIT_CYCLES`` cycles."""
    sample = (n, ms, n * n, n * ms, ms * ms)
    if m.fit is None:
        m.fit = list(map(float, sample))
        return
    f = m.fit
    for i in range(5):
        f[i] += FIT_EWMA * (sample[i] - f[i])
    m.fitted += 1
    var_n = f[2] - f[0] * f[0]
    if m.fitted < FIT_CYCLES or var_n < (FIT_SPREAD * f[0]) ** 2:
        return
    slope = (f[3] - f[0] * f[1]) / var_n
    residual = max(0.0, f[4] - f[1] * f[1] - slope * slope * var_n)  # variance of ms the fit leaves
    cycles = min(m.fitted + 1, (2 - FIT_EWMA) / FIT_EWMA)  # what the averages weigh, in cycles
    m.ms_per_extra = max(0.0, slope + 2 * (residual / (var_n * cycles)) ** 0.5)


def rounded_up(start: int, cap: int, batch_lasts: Iterable[int]) -> int | None:
    """Offsets from ``start`` to the end of the batch holding the ``cap``-th one (the batches read,
    by their last offsets, ascending); None when they end before it (nothing to round)."""
    want = start + cap - 1
    for last in batch_lasts:
        if last >= want:
            return last - start + 1
    return None


def _median(weights: dict[str, float]) -> float:
    xs = sorted(weights.values())
    return xs[len(xs) // 2]


def _weights(members: dict[str, _Member]) -> dict[str, float]:
    """Records per ms for each member: measured, else the median's; clamped around the median."""
    paces = sorted(1.0 / max(m.ms_per_record, 1e-3) for m in members.values() if m.ms_per_record is not None)
    if not paces:
        return dict.fromkeys(members, 1.0)
    median = paces[len(paces) // 2]
    lo, hi = median / PACE_SPREAD, median * PACE_SPREAD
    out = {}
    for k, m in members.items():
        w = median if m.ms_per_record is None else 1.0 / max(m.ms_per_record, 1e-3)
        out[k] = min(max(w, lo), hi)
    return out
