"""The instance group's ownership decision (sans-I/O): balanced, sticky, stable slots."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kshare.share.ownership import (
    SLOT_STRIDE,
    Candidate,
    Instance,
    OwnershipMap,
    assign,
    split_node,
    state_partition_of,
    virtual_node,
)
from kshare.share.state_codec import partition_for_group


def cand(member: str, owned: list[int] | None = None, slot: int = -1, epoch: int = 0) -> Candidate:
    return Candidate(Instance(member, f"{member}.example", 9192, {1: 9193}, slot), owned or [], epoch)


def check_balanced(m: OwnershipMap, partitions: int) -> None:
    assert len(m.owners) == partitions
    counts = [m.owners.count(i) for i in range(len(m.instances))]
    if m.instances:
        assert all(o >= 0 for o in m.owners), "every partition has an owner"
        assert max(counts) - min(counts) <= 1, counts
    slots = [i.slot for i in m.instances]
    assert len(set(slots)) == len(slots) and all(s >= 0 for s in slots)


def test_three_proxies_split_ten_partitions() -> None:
    m = assign({k: cand(k) for k in ("a", "b", "c")}, 10)
    check_balanced(m, 10)
    assert sorted(len(m.partitions_of(k)) for k in "abc") == [3, 3, 4]
    assert sorted(p for k in "abc" for p in m.partitions_of(k)) == list(range(10))


def test_a_joining_proxy_moves_only_what_it_must() -> None:
    first = assign({k: cand(k) for k in ("a", "b")}, 10)
    owned = {k: first.partitions_of(k) for k in "ab"}
    slots = {i.id: i.slot for i in first.instances}
    second = assign({"a": cand("a", owned["a"], slots["a"], first.epoch),
                     "b": cand("b", owned["b"], slots["b"], first.epoch),
                     "c": cand("c")}, 10)
    check_balanced(second, 10)
    kept = sum(len(set(owned[k]) & set(second.partitions_of(k))) for k in "ab")
    assert kept == 10 - len(second.partitions_of("c"))  # c took 3, nothing else moved
    assert {i.id: i.slot for i in second.instances if i.id in slots} == slots
    assert second.epoch == first.epoch + 1


def test_a_leaving_proxy_hands_over_only_its_partitions() -> None:
    first = assign({k: cand(k) for k in ("a", "b", "c")}, 12)
    owned = {k: first.partitions_of(k) for k in "abc"}
    second = assign({k: cand(k, owned[k], epoch=first.epoch) for k in "ab"}, 12)
    check_balanced(second, 12)
    for k in "ab":
        assert set(owned[k]) <= set(second.partitions_of(k))


def test_slot_clash_keeps_one_and_renumbers_the_other() -> None:
    m = assign({"a": cand("a", slot=0), "b": cand("b", slot=0)}, 4)
    assert sorted(i.slot for i in m.instances) == [0, 1]
    assert next(i for i in m.instances if i.id == "a").slot == 0


def test_map_round_trips_and_routes() -> None:
    m = assign({k: cand(k) for k in ("a", "b", "c")}, 7)
    again = OwnershipMap.decode(m.encode())
    assert again == m
    tid = bytes(range(16))
    for p in range(20):
        owner = m.owner_of_topic_partition(tid, p)
        assert owner is not None and state_partition_of(tid, p, 7) in m.partitions_of(owner.id)
    g = m.owner_of_group("workers")
    assert g is not None and partition_for_group("workers", 7) in m.partitions_of(g.id)


def test_virtual_node_ids() -> None:
    assert split_node(virtual_node(3, 7)) == (3, 7)
    assert virtual_node(0, 5) == 5  # slot 0 keeps the upstream's own ids
    with pytest.raises(ValueError):
        virtual_node(1, SLOT_STRIDE)


def test_nobody_owns_nothing() -> None:
    m = assign({}, 5)
    assert m.owners == [-1] * 5 and m.owner(0) is None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 60), st.lists(st.sampled_from("abcdefgh"), min_size=1, max_size=8, unique=True),
       st.lists(st.sampled_from("abcdefgh"), min_size=1, max_size=8, unique=True))
def test_balanced_and_sticky_over_membership_changes(partitions, before, after) -> None:
    """Any change of members: still balanced, every partition owned once, and a member that stays
    keeps as many of its partitions as its new quota allows (it gives up only its surplus)."""
    first = assign({k: cand(k) for k in before}, partitions)
    check_balanced(first, partitions)
    prior = {i.id: (first.partitions_of(i.id), i.slot) for i in first.instances}
    cands = {k: cand(k, *prior[k], first.epoch) if k in prior else cand(k) for k in after}
    second = assign(cands, partitions)
    check_balanced(second, partitions)
    quota_low = partitions // len(after)
    for k in after:
        if k in prior:
            kept = set(prior[k][0]) & set(second.partitions_of(k))
            assert len(kept) >= min(len(prior[k][0]), quota_low)
            assert next(i for i in second.instances if i.id == k).slot == prior[k][1]
