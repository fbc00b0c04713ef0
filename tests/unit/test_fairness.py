"""FairShare: the lock budget of a share-partition divided among the members fetching there."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kshare.share.fairness import PACE_SPREAD, QUIET_MS, ROUND_UP_MS, FairShare, rounded_up

IDLE = 30_000


def members(n: int, wanted: int = 500, now: int = 0) -> FairShare:
    fair = FairShare()
    for i in range(n):
        fair.fetching(f"m{i}", wanted, 0, now)
    return fair


def test_a_member_alone_is_never_capped():
    fair = members(1)
    assert fair.cap("m0", 0, 2000, 0, IDLE) is None


def test_members_whose_requests_fit_the_budget_get_full_batches():
    fair = members(4)  # 4 x 500 = the whole budget of 2000
    assert all(fair.cap(f"m{i}", 0, 2000, 0, IDLE) is None for i in range(4))


def test_many_members_share_the_budget_equally():
    fair = members(24)
    assert {fair.cap(f"m{i}", 0, 2000, 0, IDLE) for i in range(24)} == {2000 // 24}


def test_what_a_member_holds_counts_against_its_share():
    fair = members(24)
    share = fair.share("m0", 2000, 0, IDLE)
    assert fair.cap("m0", share - 10, 2000, 0, IDLE) == 10
    assert fair.cap("m0", share + 10, 2000, 0, IDLE) == 0


def test_a_share_is_never_below_one_record():
    fair = members(3000)
    assert fair.share("m7", 2000, 0, IDLE) == 1


def test_members_idle_past_the_window_or_gone_no_longer_count():
    fair = members(10)
    fair.fetching("m0", 500, 0, IDLE + 1)  # the only one still fetching
    assert fair.cap("m0", 0, 2000, IDLE + 1, IDLE) is None
    assert list(fair.members) == ["m0"]
    fair = members(10)
    for i in range(1, 10):
        fair.leave(f"m{i}")
    assert fair.cap("m0", 0, 2000, 0, IDLE) is None


def test_pace_is_measured_from_acquire_to_holding_nothing():
    fair = members(2)
    fair.acquired("m0", 100, 1_000)
    fair.fetching("m0", 500, 100, 1_200)  # still holds them: no sample yet
    assert fair.members["m0"].ms_per_record is None
    fair.fetching("m0", 500, 0, 1_500)  # settled all 100 in 500 ms
    assert fair.members["m0"].ms_per_record == 5.0


def test_a_slow_member_gets_a_smaller_share_than_fast_ones():
    fair = members(10)
    for i in range(10):
        fair.acquired(f"m{i}", 100, 0)
        fair.fetching(f"m{i}", 500, 0, 4_000 if i == 0 else 500)  # m0 is 8x slower
    slow, fast = fair.share("m0", 2000, 4_000, IDLE), fair.share("m1", 2000, 4_000, IDLE)
    assert slow is not None and fast is not None
    assert slow * 6 < fast


@given(
    paces=st.lists(st.one_of(st.none(), st.floats(0.01, 10_000)), min_size=2, max_size=60),
    budget=st.integers(1, 5000),
    wanted=st.integers(1, 1000),
)
def test_shares_add_up_to_the_budget_and_stay_near_the_median(paces, budget, wanted):
    fair = FairShare()
    for i, pace in enumerate(paces):
        fair.fetching(f"m{i}", wanted, 0, 0)
        fair.members[f"m{i}"].ms_per_record = pace
    shares = [fair.share(f"m{i}", budget, 0, IDLE) for i in range(len(paces))]
    if wanted * len(paces) <= budget:
        assert shares == [None] * len(paces)
        return
    assert all(s is not None and s >= 1 for s in shares)
    # rounding down, plus the one-record floor, is all that may exceed the budget
    assert sum(shares) <= budget + len(paces)  # type: ignore[arg-type]
    assert max(shares) <= (min(shares) + 1) * PACE_SPREAD ** 2  # type: ignore[type-var, operator]
    # equal paces (or all unknown) give equal shares
    if len({p for p in paces}) == 1:
        assert len(set(shares)) == 1


def test_assigned_members_that_have_not_fetched_yet_count():
    fair = members(1)  # the first member to fetch after a start
    assigned = [f"m{i}" for i in range(24)]
    assert fair.cap("m0", 0, 2000, 0, IDLE) is None
    assert fair.cap("m0", 0, 2000, 0, IDLE, assigned) == 2000 // 24
    assert fair.cap("m0", 0, 2000, 0, IDLE, assigned[:4]) is None  # 4 x 500 fit the budget


def test_what_is_waiting_is_spread_without_counting_what_members_hold():
    fair = members(2, wanted=500)  # 1,000 wanted: within the lock budget
    assert fair.cap("m0", 0, 2000, 0, IDLE) is None
    # 100 records waiting: 50 each, even for a member holding 400 it has not acknowledged yet
    assert fair.cap("m0", 400, 2000, 0, IDLE, available=100) == 50
    assert fair.cap("m1", 0, 2000, 0, IDLE, available=100) == 50
    assert fair.cap("m0", 400, 2000, 0, IDLE, available=5000) is None
    # the lock share still binds when it is the smaller one
    fair = members(24)
    assert fair.cap("m0", 80, 2000, 0, IDLE, available=5000) == 2000 // 24 - 80


def test_quiet_members_holding_nothing_do_not_compete():
    """Eight members (a Spark query at parallelism 4 whose Python workers take turns): the four
    reading now get 500 each out of 2,000, not 250 because the other four fetched a while ago."""

    fair = members(8, wanted=500, now=0)
    held = dict.fromkeys((f"m{i}" for i in range(8)), 0)
    assigned = list(held)
    now = QUIET_MS + 1000
    for i in range(4):  # the readers of this micro-batch fetch again
        fair.fetching(f"m{i}", 500, 0, now)
    assert fair.cap("m0", 0, 2000, now, IDLE, assigned, held_of=held.get) is None  # 4 x 500 fit
    # a quiet member still holding records (a slow consumer working off its batch) competes
    held["m5"] = 300
    assert fair.cap("m0", 0, 2000, now, IDLE, assigned, held_of=held.get) == 400
    # and a quiet one counts again once it fetches
    held["m5"] = 0
    fair.fetching("m6", 500, 0, now)
    assert fair.cap("m0", 0, 2000, now, IDLE, assigned, held_of=held.get) == 400
    # without holdings known, everyone that fetched within the lock duration counts (as before)
    assert fair.cap("m0", 0, 2000, now, IDLE, assigned) == 250


def test_assigned_members_count_until_their_first_fetch_only():
    """An assigned member that fetched once and then went quiet past the lock duration is not
    'expected' again (it would hold back everyone else's share)."""
    fair = members(2)
    assigned = [f"m{i}" for i in range(8)]
    later = IDLE + 1
    fair.fetching("m0", 500, 0, later)
    # m1 fetched at 0 and is forgotten; m2-m7 never fetched and still count
    assert fair.cap("m0", 0, 2000, later, IDLE, assigned) == 2000 // 7


@given(
    st.lists(st.tuples(st.integers(1, 1000), st.integers(0, 600), st.one_of(st.none(), st.integers(1, 5000))),
             min_size=1, max_size=30),
    st.integers(0, 10), st.integers(100, 5000), st.one_of(st.none(), st.integers(0, 20_000)), st.integers(0, 600),
)
def test_cap_is_the_smaller_of_the_two_shares(fetches, expected, budget, available, held):
    """``cap`` (which counts the members and weighs them once for both limits) against its
    definition from ``share``, asked on its own for each limit: the budget's share less what the
    member holds, and (when given) the share of what is waiting."""
    fair = FairShare()
    for i, (wanted, _, cycle_ms) in enumerate(fetches):
        fair.fetching(f"m{i}", wanted, 0, 0)
        if cycle_ms is not None:  # a measured pace: records acquired, then all settled
            fair.acquired(f"m{i}", wanted, 0)
            fair.fetching(f"m{i}", wanted, 0, cycle_ms)
    now = max((c or 0) for _, _, c in fetches)
    assigned = [f"m{i}" for i in range(len(fetches))] + [f"new{j}" for j in range(expected)]
    holds = {f"m{i}": h for i, (_, h, _) in enumerate(fetches)}
    held_of = holds.__getitem__

    def reference() -> int | None:
        if (len(fair.members) == 1 and "m0" in fair.members
                and all(k in fair.members or k in fair.seen for k in assigned)):
            return None
        caps = []
        s = fair.share("m0", budget, now, IDLE, assigned, held_of)
        if s is not None:
            caps.append(max(0, s - held))
        if available is not None:
            a = fair.share("m0", max(available, 1), now, IDLE, assigned, held_of)
            if a is not None:
                caps.append(a)
        return min(caps) if caps else None

    want = reference()
    assert fair.cap("m0", held, budget, now, IDLE, assigned, available, held_of) == want


def _batches(sizes: list[int], first: int) -> list[tuple[int, int]]:
    out, o = [], first
    for n in sizes:
        out.append((o, o + n - 1))
        o += n
    return out


@given(st.lists(st.integers(1, 2000), min_size=1, max_size=20), st.integers(0, 5000), st.integers(1, 3000))
def test_rounded_up_ends_at_the_end_of_the_batch_holding_the_cap(sizes, skip, cap):
    """Against a model that lists the offsets: from ``start`` (anywhere in the first batch) to the
    end of the batch holding the cap-th offset; None when the batches end before it."""
    batches = _batches(sizes, 1000)
    start = batches[0][0] + min(skip, sizes[0] - 1)
    offsets = [o for a, z in batches for o in range(max(a, start), z + 1)]
    if cap > len(offsets):
        expect = None
    else:
        end = next(z for a, z in batches if a <= offsets[cap - 1] <= z)
        expect = len([o for o in offsets if o <= end])
    assert rounded_up(start, cap, [z for _, z in batches]) == expect


def paced(n: int, ms_per_record: float, wanted: int = 500, records: int = 100) -> FairShare:
    """``n`` members that each acquired ``records`` records and settled them at ``ms_per_record``."""
    fair = members(n, wanted)
    for i in range(n):
        fair.acquired(f"m{i}", records, 0)
        fair.fetching(f"m{i}", wanted, 0, int(records * ms_per_record))
    return fair


def test_fast_members_take_whole_batches():
    """13 members, budget 2000: each may lock 153; a member that settles the 437 records beyond
    its share of a 590-record batch within ROUND_UP_MS takes the whole batch."""
    fair = paced(13, 0.1)
    cap = fair.cap("m0", 0, 2000, 10, IDLE, available=1_000_000)
    assert cap == 2000 // 13
    assert fair.whole_batches("m0", 0, cap, [589, 1179])
    assert fair.whole_batches("m0", 0, cap, [100, 200])  # the batches end within its cap


def test_slow_members_and_members_of_unknown_pace_take_exact_shares():
    """A batch they would hold longer (5 ms a record: the 437 records beyond the share 2 s more)
    would pin the share-partition's window while the others wait for room; a few records more
    are taken."""
    slow = paced(13, 5.0)
    assert not slow.whole_batches("m0", 0, 153, [589])
    assert slow.whole_batches("m0", 0, 153, [153 + ROUND_UP_MS // 5 - 1])  # 20 records more: 100 ms
    assert not slow.whole_batches("m0", 0, 153, [153 + ROUND_UP_MS // 5])
    assert not members(13).whole_batches("m0", 0, 153, [589])  # no cycle measured yet
    assert paced(13, ROUND_UP_MS / 437).whole_batches("m0", 0, 153, [589])
    assert not paced(13, 1.1 * ROUND_UP_MS / 437).whole_batches("m0", 0, 153, [589])


def test_a_cycle_of_round_trips_does_not_count_as_work_per_record():
    """Cycles of 150 and of 590 records that all last 300 ms (2 ms a record at 150): the records
    more cost nothing, and once the fit has seen enough cycles the member takes whole batches."""
    fair = members(2)
    t = 0
    for n in (150, 590) * 5:
        fair.acquired("m0", n, t)
        t += 300
        fair.fetching("m0", 500, 0, t)
    assert fair.members["m0"].ms_per_extra is not None and fair.members["m0"].ms_per_extra < 0.01
    assert fair.whole_batches("m0", 0, 150, [589])


def test_a_fit_of_noisy_cycles_counts_records_as_costly():
    """Cycles of a member working 5 ms a record whose sizes hardly vary: no slope; and where they
    vary with much noise, the upper bound stays high (no whole batches on the strength of noise)."""
    fair = members(2)
    t = 0
    for i, n in enumerate([80, 85, 83, 60, 100, 83, 40, 120, 83, 70]):
        fair.acquired("m0", n, t)
        t += int(5 * n + (300 if i % 2 else -150) + 200)
        fair.fetching("m0", 500, 0, t)
    assert not fair.whole_batches("m0", 0, 83, [400])


@given(st.floats(0.0, 10.0), st.floats(1.0, 500.0), st.lists(st.integers(50, 2000), min_size=5, max_size=12))
def test_the_cost_of_a_record_more_is_never_below_the_slope_of_exact_cycles(per_record, fixed, sizes):
    """Cycles lasting exactly ``fixed + per_record * n`` (whole ms): the bound the fit finds, once
    it has one, is at least ``per_record`` (less the ms rounding) and never negative."""
    fair = members(1)
    t = 0
    for n in sizes:
        fair.acquired("m0", n, t)
        t += max(1, round(fixed + per_record * n))
        fair.fetching("m0", 500, 0, t)
    bound = fair.members["m0"].ms_per_extra
    if bound is not None:
        assert bound >= 0
        assert bound >= per_record - 2.0 / (max(sizes) - min(sizes))
