"""The state store's pure parts against a simulated topic: the in-memory state and its compaction
(kshare.share.state.memory), replay (kshare.share.state.replay) and prune points
(kshare.share.state.prune). No broker: the "topic" is a list of records per partition, appended
to as a real one would be (a round's records of one partition land together, or not at all).

Properties, whatever the writes and failures: the store's state (states, snapshot and state epochs,
offsets of the latest snapshot / group record) always equals a replay of what landed on the topic;
and deleting every record below the prune points, even with a round in flight that then fails,
does not change what a replay gives.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kshare.share.state.codec import RECORD_SNAPSHOT, encode_share_key, encode_snapshot_value
from kshare.share.state.memory import (
    DELETE_GROUP,
    DELETE_SHARE,
    REFRESH_GROUP,
    REFRESH_SHARE,
    WRITE_GROUP,
    WRITE_SHARE,
    InMemoryState,
    WriteStats,
    refs_of,
)
from kshare.share.state.prune import PruneSchedule, prune_points, refresh_ops
from kshare.share.state.replay import LoadStats, RecordReplay
from kshare.share.state.rounds import QueuedWrite, Round
from kshare.share.states import ShareSnapshot, ShareUpdate, StateBatch
from kshare.share.store import GroupRecord, SharePartitionKey

TOPIC_ID = bytes(range(16))
KEYS = [SharePartitionKey(f"g{i % 2}", TOPIC_ID, i) for i in range(5)]
GROUPS = ["g0", "g1"]


class Topic:
    """The state topic as a list of (offset, key, value) per partition."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self.log: dict[int, list[tuple[int, bytes, bytes | None]]] = {p: [] for p in range(partitions)}
        self.next: dict[int, int] = dict.fromkeys(range(partitions), 0)

    def append(self, p: int, key: bytes, value: bytes | None) -> int:
        offset = self.next[p]
        self.next[p] += 1
        self.log[p].append((offset, key, value))
        return offset

    def prune(self, points: dict[int, int]) -> None:
        for p, low in points.items():
            self.log[p] = [r for r in self.log[p] if r[0] >= low]

    def replayed(self) -> InMemoryState:
        fresh = InMemoryState(self.partitions, WriteStats())
        replay = RecordReplay(fresh, LoadStats(), "t")
        for p in range(self.partitions):
            for offset, key, value in self.log[p]:
                replay.apply(p, offset, key, value)
        return fresh


def view(m: InMemoryState) -> tuple[dict, dict]:
    entries = {k: (e.state, e.snapshot_epoch, e.state_epoch, e.snapshot_offset) for k, e in m.entries.items()}
    groups = {g: (v.record, v.offset) for g, v in m.groups.items()}
    return entries, groups


def encode(m: InMemoryState, writes: list[list[tuple]]) -> tuple[Round, list]:
    r = Round([QueuedWrite(ops, None, refs_of(ops)) for ops in writes], frozenset(), False)
    return r, m.encode_round(r)


def land(topic: Topic, m: InMemoryState, r: Round, out: list, failed_partitions: set[int]) -> None:
    """The records of partitions that did not fail land; the round is settled."""
    for rec in out:
        if rec.partition in failed_partitions:
            rec.error = RuntimeError("not written")
        else:
            rec.offset = topic.append(rec.partition, rec.key, rec.value)
    m.settle(out, r.undo)


batches = st.lists(
    st.tuples(st.integers(0, 30), st.integers(0, 4), st.sampled_from([0, 2, 4]), st.integers(0, 3)).map(
        lambda t: StateBatch(t[0], t[0] + t[1], t[2], t[3])
    ),
    max_size=4,
).map(lambda bs: tuple(sorted({b.first_offset: b for b in bs}.values())))
keys = st.sampled_from(KEYS)
op = st.one_of(
    st.tuples(st.just(WRITE_SHARE), keys, st.builds(ShareUpdate, st.sampled_from([-1, -1, -1, 5, 12]), batches)),
    st.tuples(st.just(WRITE_SHARE), keys, st.builds(ShareUpdate, st.just(-1), batches)),
    st.tuples(st.just(WRITE_SHARE), keys, st.builds(ShareSnapshot, st.integers(-1, 8), st.just(()))),
    st.tuples(st.just(WRITE_GROUP), st.builds(GroupRecord, st.sampled_from(GROUPS), st.integers(0, 9))),
    st.tuples(st.just(DELETE_SHARE), keys),
    st.tuples(st.just(DELETE_GROUP), st.sampled_from(GROUPS), st.just(())),
    st.tuples(st.just(REFRESH_SHARE), keys),
)
rounds = st.lists(
    st.tuples(
        st.lists(st.lists(op, min_size=1, max_size=3), min_size=1, max_size=3),  # writes of a round
        st.one_of(st.just(set()), st.just(set()), st.sets(st.integers(0, 2))),  # partitions that fail
        st.booleans(),  # the round fails as a whole (nothing sent)
    ),
    min_size=1,
    max_size=15,
)


@settings(max_examples=400, deadline=None)
@given(rounds=rounds, partitions=st.integers(1, 3), after_updates=st.integers(1, 4),
       slack=st.sampled_from([None, 0, 24]))
def test_the_state_equals_a_replay_of_what_landed(rounds, partitions, after_updates, slack) -> None:
    m = InMemoryState(partitions, WriteStats(), snapshot_after_updates=after_updates, snapshot_slack_bytes=slack)
    topic = Topic(partitions)
    for writes, failed_partitions, whole_round_fails in rounds:
        r, out = encode(m, writes)
        if whole_round_fails:
            m.roll_back_round(r.undo)
        else:
            land(topic, m, r, out, failed_partitions)
        assert view(m) == view(topic.replayed())
    # what failed is rewritten (the maintenance pass) and the topic has it all
    r, out = encode(m, [refresh_ops(m, 1 << 30)] if refresh_ops(m, 1 << 30) else [[]])
    land(topic, m, r, out, set())
    assert not any(e.resync for e in m.entries.values()) and not any(g.resync for g in m.groups.values())
    assert view(m) == view(topic.replayed())


@settings(max_examples=300, deadline=None)
@given(before=rounds, during=st.lists(st.lists(op, min_size=1, max_size=3), min_size=1, max_size=3),
       partitions=st.integers(1, 3), outcome=st.sampled_from(["lands", "fails", "partly"]))
def test_pruning_below_the_prune_points_keeps_what_replay_needs(before, during, partitions, outcome) -> None:
    m = InMemoryState(partitions, WriteStats(), snapshot_after_updates=2, snapshot_slack_bytes=None)
    topic = Topic(partitions)
    for writes, failed_partitions, _ in before:
        r, out = encode(m, writes)
        land(topic, m, r, out, failed_partitions)
    r, out = encode(m, during)  # in flight while the pruning pass runs
    points = prune_points(m, range(partitions), [r.undo])
    assert all(points[p] <= topic.next[p] for p in range(partitions))
    topic.prune(points)
    if outcome == "fails":
        m.roll_back_round(r.undo)
    else:
        land(topic, m, r, out, {0} if outcome == "partly" else set())
    assert view(m) == view(topic.replayed())
    topic.prune(prune_points(m, range(partitions)))  # and again with nothing in flight
    assert view(m) == view(topic.replayed())


def test_compaction_thresholds() -> None:
    stats = WriteStats()
    m = InMemoryState(1, stats, snapshot_after_updates=2, snapshot_slack_bytes=None)
    key = KEYS[0]
    kinds = []
    for i in range(6):
        content = ShareSnapshot(0, ()) if i == 0 else ShareUpdate(-1, (StateBatch(i * 10, i * 10 + 1, 2, 1),))
        _, out = encode(m, [[(WRITE_SHARE, key, content)]])
        kinds.append(out[0].kind)
    # a snapshot first, then two updates, then a snapshot in place of the third (a compaction)
    assert kinds == ["snapshot", "update", "update", "snapshot", "update", "update"]
    assert stats.compactions == 1
    assert m.entries[key].snapshot_epoch == 1 and m.entries[key].state_epoch == 0


def test_a_snapshot_hardly_bigger_than_the_update_goes_instead() -> None:
    m = InMemoryState(1, WriteStats(), snapshot_slack_bytes=24)
    key = KEYS[0]
    encode(m, [[(WRITE_SHARE, key, ShareSnapshot(0, ()))]])
    # the SPSO moves past everything: the snapshot is empty, as small as the update
    _, out = encode(m, [[(WRITE_SHARE, key, ShareUpdate(10, (StateBatch(0, 9, 2, 1),)))]])
    assert out[0].kind == "snapshot" and m.entries[key].state == ShareSnapshot(10, ())


def test_a_reinitialisation_moves_the_state_epoch() -> None:
    m = InMemoryState(1, WriteStats())
    key = KEYS[0]
    encode(m, [[(WRITE_SHARE, key, ShareSnapshot(0, ()))]])
    _, out = encode(m, [[(WRITE_SHARE, key, ShareSnapshot(5, ()))]])
    assert m.entries[key].state_epoch == 1 and m.entries[key].snapshot_epoch == 1
    assert out[0].value == encode_snapshot_value(1, 1, 0, ShareSnapshot(5, ()))
    assert out[0].key == encode_share_key(RECORD_SNAPSHOT, key)


def test_a_rolled_back_share_partition_is_written_next_as_a_snapshot() -> None:
    m = InMemoryState(1, WriteStats(), snapshot_slack_bytes=None)
    topic = Topic(1)
    key = KEYS[0]
    r, out = encode(m, [[(WRITE_SHARE, key, ShareSnapshot(0, ()))]])
    land(topic, m, r, out, set())
    r, out = encode(m, [[(WRITE_SHARE, key, ShareUpdate(-1, (StateBatch(3, 4, 2, 1),)))]])
    assert out[0].kind == "update"
    land(topic, m, r, out, {0})
    assert r.items[0].error is not None and out[0].error is not None
    assert m.entries[key].resync and m.entries[key].state == ShareSnapshot(0, ())
    r, out = encode(m, [[(WRITE_SHARE, key, ShareUpdate(-1, (StateBatch(5, 5, 2, 1),)))]])
    assert out[0].kind == "snapshot" and not m.entries[key].resync
    land(topic, m, r, out, set())
    assert m.entries[key].state == ShareSnapshot(0, (StateBatch(5, 5, 2, 1),))
    assert view(m) == view(topic.replayed())


def test_refresh_picks_lagging_and_resync_keys() -> None:
    m = InMemoryState(1, WriteStats())
    topic = Topic(1)
    r, out = encode(m, [[(WRITE_SHARE, k, ShareSnapshot(0, ())) for k in KEYS[:2]], [(WRITE_GROUP, GroupRecord("g0"))]])
    land(topic, m, r, out, set())
    assert refresh_ops(m, 10) == []
    for i in range(12):  # the end of the partition moves on; KEYS[1] and the group stay behind
        r, out = encode(m, [[(WRITE_SHARE, KEYS[0], ShareSnapshot(i, ()))]])
        land(topic, m, r, out, set())
    assert sorted(map(repr, refresh_ops(m, 10))) == sorted(map(repr, [(REFRESH_SHARE, KEYS[1]), (REFRESH_GROUP, "g0")]))
    r, out = encode(m, [[(WRITE_SHARE, KEYS[2], ShareSnapshot(0, ()))]])
    land(topic, m, r, out, {0})  # failed: nothing to resync (it never existed), nothing to refresh
    assert KEYS[2] not in m.entries


def test_prune_schedule_on_the_injected_clock() -> None:
    now = [1000.0]
    s = PruneSchedule(interval_s=60, after_records=10, min_interval_s=5, clock=lambda: now[0])
    s.passed()
    assert not s.wrote(9, snapshots=True, failed=False)
    assert not s.wrote(5, snapshots=False, failed=False)  # past the count, but no snapshot to prune to
    assert s.wrote(1, snapshots=True, failed=False)
    assert s.wait_s() == 5.0
    now[0] += 3
    assert s.wait_s() == 2.0
    assert s.wrote(0, snapshots=False, failed=True)  # a failure: the pass rewrites it
    now[0] += 10
    assert s.wait_s() == 0.0
    s.passed()
    assert s.since == 0 and not s.wrote(1, snapshots=True, failed=False)
