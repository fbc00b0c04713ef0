"""Every proxy names the proxy still handing a topic-partition over as its leader until it is done
(kshare.share.handovers_elsewhere, sans-I/O): what a map lists as moved and from where
(``ownership.moved_from``), and what a proxy names meanwhile, both against reference models."""

from __future__ import annotations

import collections
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from kshare.share.handovers_elsewhere import MARGIN_S, HandoversElsewhere
from kshare.share.ownership import Candidate, GroupOwnership, Instance, OwnershipMap, assign
from kshare.share.state.codec import state_partition_of
from kshare.share.store import SharePartitionKey

NAMES = "abcdefgh"
TID = b"\x21" * 16
HEX = TID.hex()


def _cand(member: str, *, led: list[int] = (), handing: list[int] = (), epoch: int = 1,
          partitions: int = 12) -> Candidate:
    return Candidate(Instance(member, f"{member}.example", 9192, {1: 9193}), [], epoch,
                     {HEX: sorted({*led, *handing})} if led or handing else {}, {HEX: partitions},
                     {HEX: list(led)} if led else {}, {HEX: list(handing)} if handing else {})


def _ids(m: OwnershipMap) -> list[str]:
    return [i.id for i in m.instances]


def test_a_proxy_joining_lists_every_partition_it_takes_and_where_from() -> None:
    first = assign({k: _cand(k) for k in "abc"}, 10, by_topic=True)
    lead = [_ids(first)[i] for i in first.leaders[HEX]]
    assert first.moved_from == {}  # nobody named itself a leader before: nothing moves
    led = {k: [p for p, m in enumerate(lead) if m == k] for k in "abc"}
    joined = assign({**{k: _cand(k, led=led[k], epoch=first.epoch) for k in "abc"}, "d": _cand("d", epoch=0)},
                    10, by_topic=True)
    ids = _ids(joined)
    now = [ids[i] for i in joined.leaders[HEX]]
    assert collections.Counter(now)["d"] == 3
    row = joined.moved_from[HEX]
    for p in range(12):
        # a partition the newcomer takes is handed over from the one that led it; the rest stay
        assert (ids[row[p]] if row[p] >= 0 else None) == (lead[p] if now[p] != lead[p] else None), p


def test_one_still_handing_over_is_named_over_the_one_the_last_map_made_lead() -> None:
    """Partition 0 moved from b to c at the last map, and b is still handing it over when the next
    map is decided: b is what clients hold records from, so b is where it moves from (if the new
    map gives it back to b, nothing moves)."""
    cands = {"a": _cand("a", led=[1, 2, 3, 4], epoch=5), "b": _cand("b", led=[5, 6, 7, 8], handing=[0], epoch=5),
             "c": _cand("c", led=[0, 9, 10, 11], epoch=5)}
    m = assign(cands, 10, by_topic=True)
    ids = _ids(m)
    leader0 = ids[m.leaders[HEX][0]]
    row = m.moved_from.get(HEX, [-1] * 12)
    assert leader0 == "c" and ids[row[0]] == "b"
    assert all(i == -1 for p, i in enumerate(row) if p)  # the rest stay with whoever led them


candidates_st = st.dictionaries(
    st.sampled_from("abcde"),
    st.tuples(st.integers(0, 3), st.sets(st.integers(0, 7)), st.sets(st.integers(0, 7))),
    min_size=1, max_size=5)


@settings(max_examples=200, deadline=None)
@given(candidates_st)
def test_moved_from_against_a_model(raw: dict[str, tuple[int, set[int], set[int]]]) -> None:
    """Model: a partition moves from the member that reported handing it over, else from the one
    that reported leading it (of several, the newest epoch, then the greatest member id), when that
    member is not its leader in the new map."""
    cands = {k: _cand(k, led=sorted(led), handing=sorted(handing), epoch=epoch, partitions=8)
             for k, (epoch, led, handing) in raw.items()}
    m = assign(cands, 10, by_topic=True)
    ids = _ids(m)
    row = m.moved_from.get(HEX, [-1] * 8)
    for p in range(8):
        def newest(kind: int, p: int = p) -> str | None:
            claims = [(raw[k][0], k) for k in raw if p in raw[k][kind]]
            return max(claims)[1] if claims else None
        was = newest(2) or newest(1)
        leader = ids[m.leaders[HEX][p]]
        expected = was if was is not None and was != leader else None
        assert (ids[row[p]] if row[p] >= 0 else None) == expected, (p, raw, row)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


INSTANCES = [Instance(k, f"{k}.example", 9192, {1: 9193}, slot=s) for s, k in enumerate("abcd")]

op_st = st.one_of(
    st.tuples(st.just("map"), st.lists(st.integers(-1, 3), min_size=6, max_size=6), st.booleans()),
    st.tuples(st.just("tick"), st.floats(0, 8)),
    st.tuples(st.just("answer"), st.integers(0, 3), st.sets(st.integers(0, 5)), st.sets(st.integers(0, 5))),
    st.tuples(st.just("unreachable"), st.integers(0, 3)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(op_st, max_size=30))
def test_what_a_proxy_names_against_a_model(ops: list[tuple]) -> None:
    """Proxy ``a`` names the proxy a map moves a partition from (never itself) until that one
    answers it names another leader, cannot be asked, or the hand-over's timeout and the margin
    pass; a new map replaces what the one before listed."""
    timeout = 5.0
    clock = Clock()
    names = HandoversElsewhere(clock)
    model: dict[int, tuple[str, float]] = {}  # partition -> (instance id named, deadline)
    epoch = 0
    for op in ops:
        if op[0] == "map":
            _, row, by_topic = op
            epoch += 1
            m = OwnershipMap(epoch, INSTANCES, [0, 1, 2, 3], by_topic, {}, {HEX: row} if any(i >= 0 for i in row) else {})
            names.apply(m, "a", timeout)
            model = {p: (INSTANCES[i].id, clock.now + timeout + MARGIN_S) for p, i in enumerate(row)
                     if by_topic and i >= 0 and INSTANCES[i].id != "a"}
        elif op[0] == "tick":
            clock.now += op[1]
        elif op[0] == "answer":
            _, i, asked, still = op
            names.answered(INSTANCES[i].id, [(TID, p) for p in asked], [(TID, p) for p in still])
            for p in asked - still:
                if p in model and model[p][0] == INSTANCES[i].id:
                    del model[p]
        else:
            names.unreachable(INSTANCES[op[1]].id)
            model = {p: e for p, e in model.items() if e[0] != INSTANCES[op[1]].id}
        for p in range(6):
            e = model.get(p)
            want = next(i.slot for i in INSTANCES if i.id == e[0]) if e is not None and e[1] > clock.now else None
            assert names.slot(TID, p) == want, (p, model, clock.now)
        asking = names.to_ask()
        assert {(iid, p) for iid, (_, tps) in asking.items() for _, p in tps} == \
            {(e[0], p) for p, e in model.items() if e[1] > clock.now}


def test_the_metadata_of_every_proxy_names_the_one_handing_over_until_it_is_done() -> None:
    """Partition 0 moves from b to d. b names itself while it hands it over (its own ``releasing``);
    a and d name b until b is done, then d; b's moves are b's own to name."""
    moved = OwnershipMap(2, INSTANCES, [0, 1, 2, 3], True, {HEX: [3, 0, 1, 2]}, {HEX: [1, -1, -1, -1]})
    slot = {i.id: i.slot for i in INSTANCES}
    views = {}
    for me in "abd":
        own = GroupOwnership(me, 4)
        assert own.install(moved, 10.0) == (0 if me == "b" else 1)
        if me == "b":
            own.start_releasing([SharePartitionKey("g", TID, 0)])
        views[me] = (own, own.view())
    for me, (_, view) in views.items():
        assert view.partition_owner(TID, 0) == slot["b"], me
        assert view.partition_owner(TID, 1) == slot["a"], me  # the rest as the map says
    # b is done: it names d, and the others once they asked it
    b, _ = views["b"]
    b.stop_releasing([SharePartitionKey("g", TID, 0)])
    assert views["b"][1].partition_owner(TID, 0) == slot["d"]
    for me in "ad":
        own, view = views[me]
        assert own.elsewhere.to_ask() == {"b": (INSTANCES[1], [(TID, 0)])}
        assert own.elsewhere.answered("b", [(TID, 0)], []) and view.partition_owner(TID, 0) == slot["d"]
        assert not own.elsewhere.to_ask()
    # what b reports at the next join: what it leads, nothing handed over any more
    assert b.naming({}) == ({HEX: [2]}, {})
    # and of a topic the map does not list, what the fallback makes it lead
    other = b"\x22" * 16
    assert b.naming({other.hex(): 8})[0][other.hex()] == [p for p in range(8) if moved.leader_index(other, p) == 1]


def _join_moves(rng: random.Random, state_partitions: int, proxies: int, sizes: list[int]) -> list[tuple[str, int, bool, bool]]:
    """One more proxy joining ``proxies`` that lead topics of ``sizes`` partitions: for every
    partition an old proxy gives up, (old leader, partition, whether its home state partition moves
    too, whether that old leader had a partition left whose home stays with it to give instead)."""
    topics = {rng.randbytes(16).hex(): n for n in sizes}
    first = assign({k: _cand(k) for k in NAMES[:proxies]}, state_partitions, by_topic=True)
    # a balanced leadership of each topic, as a first map deals it
    lead = {t: [first.instances[first.leader_index(bytes.fromhex(t), p)].id for p in range(n)]
            for t, n in topics.items()}
    cands = {}
    for k in NAMES[:proxies]:
        led = {t: [p for p, m in enumerate(row) if m == k] for t, row in lead.items()}
        cands[k] = Candidate(Instance(k, f"{k}.example", 9192, {1: 9193}), first.partitions_of(k), first.epoch,
                             led, topics, led)
    cands[NAMES[proxies]] = Candidate(Instance(NAMES[proxies], "n.example", 9192, {1: 9193}), [], 0)
    joined = assign(cands, state_partitions, by_topic=True)
    out = []
    for t, row in lead.items():
        tid = bytes.fromhex(t)
        now = [joined.instances[i].id for i in joined.leaders[t]]
        for k in NAMES[:proxies]:
            mine, kept = first.partitions_of(k), set(joined.partitions_of(k))
            homes = {p: mine[state_partition_of(tid, p, len(mine))] for p, m in enumerate(row) if m == k}
            stays = [p for p in homes if homes[p] in kept and now[p] == k]
            for p in homes:
                if now[p] != k:
                    out.append((k, p, homes[p] not in kept, bool(stays)))
    return out


def test_a_join_moves_leadership_or_state_but_not_both_where_it_can() -> None:
    """A share-partition whose leader and state partition both move cannot be handed over or
    re-homed: what members hold of it is delivered again. A proxy that must give up state
    partitions keeps those holding most of what it leads, and of the partitions it must give up it
    gives up first those whose state partition it keeps: so one moves both only where its old
    leader kept no partition whose state stays with it. Over seeded joins of many topics, at most
    1 % of the partitions moved move both (about 20 % did before)."""
    rng = random.Random(42)
    moved = both = 0
    for state_partitions, proxies in ((10, 3), (6, 3), (10, 2)):
        for _ in range(30):
            for _k, _p, moves_both, had_other in _join_moves(rng, state_partitions, proxies, [4, 12, 8, 3, 16]):
                moved += 1
                both += moves_both
                assert not (moves_both and had_other), (state_partitions, proxies)  # avoidable: not done
    assert moved > 500 and both <= moved // 100, (both, moved)
