"""The state store's side of leading by topic (docs/design/scale-out.md, "Balanced leadership"): new
share-partitions go where ``memory.home`` says, an adopted copy is written with the state epoch it
is given, and replay, finding copies of one share-partition in several partitions (a move between
proxies cut short), keeps the one with the highest state epoch.

Against the simulated topic of ``test_state_memory``: whatever the writes, moves of the home and
failures, the store's state equals a replay of what landed.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kshare.share.state.codec import RECORD_SNAPSHOT, encode_share_key, encode_snapshot_value, is_normalized
from kshare.share.state.memory import (
    ADOPT_SHARE,
    DELETE_SHARE,
    REFRESH_SHARE,
    WRITE_SHARE,
    InMemoryState,
    WriteStats,
)
from kshare.share.states import ShareSnapshot, ShareUpdate, StateBatch, normalize
from kshare.share.store import SharePartitionKey
from tests.unit.test_state_memory import KEYS, Topic, batches, encode, land, view

keys = st.sampled_from(KEYS)
# a copy another proxy holds: a durable state as the store keeps it (normalized)
copies = st.builds(lambda start, bs: normalize(ShareSnapshot(start, bs)), st.integers(0, 8), batches).filter(
    is_normalized
)
op = st.one_of(
    st.tuples(st.just(WRITE_SHARE), keys, st.builds(ShareUpdate, st.sampled_from([-1, -1, 5, 12]), batches)),
    st.tuples(st.just(WRITE_SHARE), keys, st.builds(ShareSnapshot, st.integers(-1, 8), st.just(()))),
    st.tuples(st.just(ADOPT_SHARE), keys, copies, st.integers(0, 6)),
    st.tuples(st.just(DELETE_SHARE), keys),
    st.tuples(st.just(REFRESH_SHARE), keys),
)
rounds = st.lists(
    st.tuples(
        st.lists(st.lists(op, min_size=1, max_size=3), min_size=1, max_size=3),  # writes of a round
        st.integers(0, 2),  # where new share-partitions go during this round (the home moves)
        st.one_of(st.just(set()), st.just(set()), st.sets(st.integers(0, 2))),  # partitions that fail
    ),
    min_size=1,
    max_size=15,
)


@settings(max_examples=400, deadline=None)
@given(rounds=rounds)
def test_the_state_equals_a_replay_whatever_the_home_and_the_adoptions(rounds) -> None:
    m = InMemoryState(3, WriteStats(), snapshot_after_updates=3, snapshot_slack_bytes=None)
    home = [0]
    m.home = lambda key: home[0]
    topic = Topic(3)
    for writes, where, failed in rounds:
        ops = [o for w in writes for o in w]
        if any(o[0] == DELETE_SHARE and any(x[1] == o[1] for x in ops[i + 1 :]) for i, o in enumerate(ops)):
            # A round that deletes a share-partition where it is and creates it again at the home
            # (elsewhere): if only the tombstone lands, the store rolls the share-partition back (it
            # is written again, whole, where it was, at its next write) while a replay sees it
            # deleted until then. Such a round lands or fails here as a whole.
            failed = {0, 1, 2} if failed else set()
        home[0] = where
        r, out = encode(m, writes)
        land(topic, m, r, out, failed)
        assert view(m) == view(topic.replayed())
        # and each share-partition is where the store says: created at the home of its time, kept there
        assert {k: e.partition for k, e in m.entries.items()} == {
            k: e.partition for k, e in topic.replayed().entries.items()
        }


def test_an_adopted_copy_has_the_state_epoch_given_and_stays_where_the_key_is() -> None:
    m = InMemoryState(3, WriteStats())
    m.home = lambda key: 2
    key = KEYS[0]
    _, out = encode(m, [[(ADOPT_SHARE, key, ShareSnapshot(7, (StateBatch(9, 9, 2, 1),)), 4)]])
    assert [(r.partition, r.kind) for r in out] == [(2, "snapshot")]
    assert m.entries[key].state_epoch == 4 and m.entries[key].state == ShareSnapshot(
        7, (StateBatch(9, 9, 2, 1),)
    )
    m.home = lambda key: 0  # the home moved: the key stays where it is
    _, out = encode(m, [[(ADOPT_SHARE, key, ShareSnapshot(8, ()), 6)]])
    assert [(r.partition, r.kind) for r in out] == [(2, "snapshot")]
    assert (m.entries[key].state_epoch, m.entries[key].snapshot_epoch) == (6, 1)


def _snapshot(topic: Topic, p: int, key: SharePartitionKey, start: int, state_epoch: int) -> None:
    topic.append(
        p,
        encode_share_key(RECORD_SNAPSHOT, key),
        encode_snapshot_value(0, state_epoch, 1, ShareSnapshot(start, ())),
    )


def test_replay_keeps_the_copy_with_the_highest_state_epoch() -> None:
    """A move cut short leaves the old copy beside the new one (in one proxy's partitions after a
    failover): whichever partition is read first, the newer copy is the state, and a tombstone of
    the older one does not delete it."""
    key = KEYS[1]
    for newer in (0, 1):  # replay reads partition 0 first: the newer copy read first, then last
        older = 1 - newer
        topic = Topic(2)
        _snapshot(topic, older, key, 10, state_epoch=1)
        _snapshot(topic, newer, key, 20, state_epoch=2)
        assert topic.replayed().entries[key].state == ShareSnapshot(20, ())
        topic.append(older, encode_share_key(RECORD_SNAPSHOT, key), None)  # the old copy dropped
        assert topic.replayed().entries[key].state == ShareSnapshot(20, ())
        topic.append(newer, encode_share_key(RECORD_SNAPSHOT, key), None)  # and the new one deleted
        assert key not in topic.replayed().entries
