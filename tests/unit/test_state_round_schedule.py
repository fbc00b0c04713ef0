"""The state store's round scheduler (kshare.share.state.rounds.RoundScheduler), sans-I/O.

Property: whatever the writes, whatever order rounds are settled in and whenever every round must
run alone (a producer being replaced), each round started is the one a simple reference model
picks (a fixpoint over the queue, not the scheduler's single pass), and over the whole run
(1) no two rounds in flight touch the same share-partition or group, (2) each share-partition's /
group's writes start in the order they were queued, each only once every earlier round touching it
was settled (so it is encoded on that round's acknowledged or rolled-back result), (3) a flush or
group deletion starts alone, after everything queued before it started, (4) at most
``max_in_flight`` rounds are in flight, (5) everything queued starts exactly once.
"""

from __future__ import annotations

from collections.abc import Hashable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kshare.share.state.rounds import QueuedWrite, Round, RoundScheduler


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def write(*refs: Hashable) -> QueuedWrite:
    """A write touching ``refs``; none: a flush or a group deletion (refs unknown until encoded)."""
    return QueuedWrite([], None, frozenset(refs) if refs else None)


def model_next(queue: list[QueuedWrite], in_flight: list[Round], max_in_flight: int,
               alone: bool) -> tuple[list[QueuedWrite], bool] | None:
    """The reference: (the writes of the next round, exclusive), or None.

    A write may not go while a round in flight touches what it touches, nor while an earlier
    write touching the same thing stays queued: the writes kept are the closure, from the busy
    refs, of "shares a ref with an earlier kept write" (computed to a fixpoint). A flush or group
    deletion waits for everything before it and takes everything after it, alone.
    """
    if not queue or len(in_flight) >= max_in_flight or any(r.exclusive for r in in_flight):
        return None
    if alone:
        return None if in_flight else (list(queue), True)
    unknown = [i for i, it in enumerate(queue) if it.refs is None]
    if unknown and not in_flight:
        return list(queue), True
    head = queue[: unknown[0]] if unknown else queue
    busy = set().union(*(r.refs for r in in_flight))
    kept: set[int] = set()
    changed = True
    while changed:
        changed = False
        for i, it in enumerate(head):
            if i in kept:
                continue
            if it.refs & busy or any(it.refs & head[j].refs for j in kept if j < i):
                kept.add(i)
                changed = True
    take = [it for i, it in enumerate(head) if i not in kept]
    return (take, False) if take else None


refs = st.lists(st.integers(0, 4), min_size=1, max_size=3, unique=True)
one_write = st.one_of(st.just(None), refs, refs, refs, refs)  # None: a flush or group deletion
# a script: queue some writes, ask for a round (every round alone or not), settle some round in
# flight (by its rank in launch order; 0: none, so that rounds pile up); repeat
steps = st.lists(
    st.tuples(st.lists(one_write, max_size=4), st.booleans(), st.one_of(st.just(0), st.integers(1, 20))),
    min_size=1,
    max_size=30,
)


@settings(max_examples=1000, deadline=None)
@given(steps=steps, max_in_flight=st.integers(1, 4), rarely_alone=st.integers(0, 5))
def test_rounds_match_the_reference_model(steps, max_in_flight, rarely_alone) -> None:
    s = RoundScheduler(max_in_flight)
    queued: list[QueuedWrite] = []
    started: list[Round] = []
    settled_at: dict[int, int] = {}  # id(round) -> step at which it was settled
    started_at: dict[int, int] = {}
    t = 0

    def step(alone: bool) -> None:
        nonlocal t
        t += 1
        want = model_next(s.queue, list(s.in_flight), max_in_flight, alone)
        before = list(s.queue)
        r = s.next_round(alone=alone)
        if want is None:
            assert r is None
            assert s.queue == before
            return
        assert r is not None
        assert r.items == want[0] and r.exclusive == want[1]
        assert s.queue == [it for it in before if not any(it is x for x in r.items)]
        assert s.next_round(alone=alone) is None  # one call takes everything that may go
        check_start(s, r, started, queued)
        started.append(r)
        started_at[id(r)] = t

    def settle(r: Round) -> None:
        nonlocal t
        t += 1
        s.settled(r)
        settled_at[id(r)] = t
        assert r not in s.in_flight
        assert all(not s.busy(ref) for ref in r.refs)

    for new, alone, pick in steps:
        for w in new:
            item = write(*(w or ()))
            s.add(item)
            queued.append(item)
        step(alone and rarely_alone == 0)
        if s.in_flight and pick:
            in_flight = list(s.in_flight)
            settle(in_flight[pick % len(in_flight)])
    # the rest: settle rounds until everything started and settled (each turn starts or settles a
    # round, and there are no more rounds than writes)
    for _ in range(2 * len(queued) + 2):
        if not s.queue and s.idle:
            break
        step(False)
        if s.in_flight:
            settle(next(iter(s.in_flight)))
    assert not s.queue and s.idle, "writes left that never start"

    items = [it for r in started for it in r.items]
    assert sorted(map(id, items)) == sorted(map(id, queued))  # each exactly once
    position = {id(it): i for i, it in enumerate(items)}
    for ref in {ref for it in queued if it.refs for ref in it.refs}:
        order = [position[id(it)] for it in queued if it.refs is None or ref in it.refs]
        assert order == sorted(order), f"writes of {ref} out of order"
        # each round touching ref started after the one before it was settled
        touching = [r for r in started if ref in r.refs or any(it.refs is None for it in r.items)]
        for prev, nxt in zip(touching, touching[1:], strict=False):
            assert settled_at[id(prev)] < started_at[id(nxt)]


def check_start(s: RoundScheduler, r: Round, started: list[Round], queued: list[QueuedWrite]) -> None:
    assert r in s.in_flight
    assert len(s.in_flight) <= s.max_in_flight
    others = [o for o in s.in_flight if o is not r]
    for o in others:
        assert not (o.refs & r.refs), "two rounds in flight touch the same share-partition"
        assert not o.exclusive
    if any(it.refs is None for it in r.items) or r.exclusive:
        assert r.exclusive and not others
    assert all(s.busy(ref) for ref in r.refs)
    # everything queued before a flush / deletion in this round started no later than this round
    went = {id(it) for x in [*started, r] for it in x.items}
    for it in r.items:
        if it.refs is None:
            idx = next(i for i, q in enumerate(queued) if q is it)
            assert all(id(q) in went for q in queued[:idx])


def test_a_write_waits_for_the_round_of_what_it_touches() -> None:
    s = RoundScheduler(16)
    a, b, c = write("k1"), write("k2"), write("k1", "k3")
    s.add(a)
    ra = s.next_round()
    assert ra is not None and ra.items == [a] and not ra.exclusive
    s.add(b)
    s.add(c)
    rb = s.next_round()
    assert rb is not None and rb.items == [b]  # k2 is free; c touches k1, which is in flight
    assert s.queue == [c] and s.next_round() is None
    s.settled(ra)  # A acknowledged, or failed and rolled back: now C may be encoded on it
    rc = s.next_round()
    assert rc is not None and rc.items == [c]
    assert s.busy("k1") and s.busy("k2") and s.busy("k3")


def test_a_later_write_does_not_overtake_an_earlier_one_of_the_same_ref() -> None:
    s = RoundScheduler(16)
    s.add(first := write("k1"))
    r1 = s.next_round()
    s.add(blocked := write("k1", "k2"))
    s.add(later := write("k2"))  # k2 is free, but an earlier queued write of k2 waits: so does this
    s.add(free := write("k3"))
    r = s.next_round()
    assert r is not None and r.items == [free]
    assert s.queue == [blocked, later]
    assert r1 is not None and r1.items == [first]


def test_writes_of_one_ref_queued_together_go_in_one_round_in_order() -> None:
    s = RoundScheduler(16)
    ws = [write("k1") for _ in range(5)]
    for w in ws:
        s.add(w)
    r = s.next_round()
    assert r is not None and r.items == ws


def test_a_flush_goes_alone_after_everything_before_it() -> None:
    s = RoundScheduler(16)
    s.add(write("k1"))
    ra = s.next_round()
    s.add(b := write("k2"))
    s.add(flush := write())
    s.add(c := write("k3"))
    rb = s.next_round()
    assert rb is not None and rb.items == [b] and not rb.exclusive  # before the flush: goes
    assert s.queue == [flush, c] and s.next_round() is None
    assert ra is not None
    s.settled(ra)
    assert s.next_round() is None  # b still in flight
    s.settled(rb)
    rf = s.next_round()
    assert rf is not None and rf.items == [flush, c] and rf.exclusive
    s.add(d := write("k4"))
    assert s.next_round() is None  # nothing runs beside an exclusive round
    s.settled(rf)
    rd = s.next_round()
    assert rd is not None and rd.items == [d]


def test_alone_takes_the_whole_queue_once_nothing_is_in_flight() -> None:
    s = RoundScheduler(16)
    s.add(write("k1"))
    r1 = s.next_round()
    s.add(a := write("k2"))
    s.add(b := write("k1"))
    assert s.next_round(alone=True) is None  # a round is in flight
    assert r1 is not None
    s.settled(r1)
    r = s.next_round(alone=True)
    assert r is not None and r.items == [a, b] and r.exclusive and not s.queue


def test_rounds_in_flight_are_bounded() -> None:
    s = RoundScheduler(2)
    rounds = []
    for k in range(3):
        s.add(write(k))
        rounds.append(s.next_round())
    assert rounds[2] is None and len(s.in_flight) == 2
    assert s.queue[0].refs == frozenset({2})
    s.settled(rounds[0])
    r = s.next_round()
    assert r is not None and r.refs == frozenset({2})


def test_settled_twice_or_unknown_is_harmless() -> None:
    s = RoundScheduler(4)
    s.add(write("k"))
    r = s.next_round()
    assert r is not None
    s.settled(r)
    s.settled(r)
    assert s.idle and not s.busy("k")
    s.add(w := write("k"))
    r2 = s.next_round()
    assert r2 is not None and r2.items == [w]


def test_linger_on_the_injected_clock() -> None:
    clock = Clock()
    s = RoundScheduler(4, linger_s=0.010, clock=clock)
    assert s.linger_left() == 0.0  # nothing queued
    s.add(write("k1"))
    assert s.linger_left() == pytest.approx(0.010)
    clock.now += 0.004
    s.add(write("k2"))  # joins the oldest's wait, does not restart it
    assert s.linger_left() == pytest.approx(0.006)
    clock.now += 0.007
    assert s.linger_left() == 0.0
    r = s.next_round()
    assert r is not None and len(r.items) == 2
    s.add(write("k3"))
    assert s.linger_left() == pytest.approx(0.010)
    assert RoundScheduler(4, clock=clock).linger_left() == 0.0
