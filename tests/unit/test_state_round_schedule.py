"""Which queued state writes TopicStateStore starts as a produce round, and when (pure logic).

Property: whatever the writes and whatever order rounds finish in, (1) no two rounds in flight
touch the same share-partition or group, (2) each share-partition's / group's writes start in the
order they were queued, (3) a flush or group deletion starts alone, after everything queued before
it finished, (4) everything queued starts eventually.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kshare.share.state_topic import _DEL_GROUP, _SP, TopicStateStore, _Pending, _refs_of, _Round
from kshare.share.states import ShareSnapshot
from kshare.share.store import SharePartitionKey

TOPIC_ID = bytes(16)


class Scheduler(TopicStateStore):
    """The store's scheduling with rounds recorded instead of sent."""

    def __init__(self, max_rounds: int) -> None:
        super().__init__("localhost:9092", max_rounds_in_flight=max_rounds)
        self.started: list[_Round] = []

    def _launch(self, items: list[_Pending], *, exclusive: bool) -> None:
        refs = frozenset().union(*(it.refs for it in items if it.refs is not None))
        r = _Round(items, refs, exclusive, {})
        self._rounds.add(r)
        for ref in refs:
            self._busy[ref] = self._busy.get(ref, 0) + 1
        self.started.append(r)

    def finish(self, r: _Round) -> None:
        self._rounds.discard(r)
        for ref in r.refs:
            self._busy[ref] -= 1
            if not self._busy[ref]:
                del self._busy[ref]


def ops_for(spec: tuple[str, tuple[int, ...]]) -> list[tuple]:
    kind, keys = spec
    if kind == "flush":
        return []
    if kind == "delete-group":
        return [(_DEL_GROUP, "g", ())]
    return [(_SP, SharePartitionKey("g", TOPIC_ID, k), ShareSnapshot(0, ())) for k in keys]


writes = st.tuples(
    st.sampled_from(["write"] * 8 + ["flush", "delete-group"]),
    st.lists(st.integers(0, 3), min_size=1, max_size=3, unique=True),
)
# a script: queue some writes, let the flusher run, finish some round in flight; repeat
steps = st.lists(st.tuples(st.lists(writes, max_size=4), st.integers(0, 20)), min_size=1, max_size=30)


@settings(max_examples=1000, deadline=None)
@given(steps=steps, max_rounds=st.integers(1, 4))
def test_round_schedule(steps, max_rounds) -> None:
    s = Scheduler(max_rounds)
    queued: list[_Pending] = []
    for new, pick in steps:
        for spec in new:
            ops = ops_for(spec)
            item = _Pending(ops, None, refs=_refs_of(ops))  # type: ignore[arg-type]
            s._queue.append(item)
            queued.append(item)
        before = len(s.started)
        s._start_round()
        for r in s.started[before:]:
            check_start(s, r, queued)
        if s._rounds and pick:
            s.finish(sorted(s._rounds, key=s.started.index)[pick % len(s._rounds)])
    while s._queue or s._rounds:  # the rest: finish rounds until everything started and settled
        before = len(s.started)
        s._start_round()
        for r in s.started[before:]:
            check_start(s, r, queued)
        if s._rounds:
            s.finish(sorted(s._rounds, key=s.started.index)[0])
    started = [it for r in s.started for it in r.items]
    assert sorted(map(id, started)) == sorted(map(id, queued))  # each exactly once
    # per ref: started in queued order
    position = {id(it): i for i, it in enumerate(started)}
    for ref in {ref for it in queued if it.refs for ref in it.refs}:
        order = [position[id(it)] for it in queued if it.refs is not None and ref in it.refs]
        assert order == sorted(order)


def check_start(s: Scheduler, r: _Round, queued: list[_Pending]) -> None:
    others = [o for o in s._rounds if o is not r]
    for o in others:
        assert not (o.refs & r.refs), "two rounds in flight touch the same share-partition"
        assert not o.exclusive
    if any(it.refs is None for it in r.items):
        assert r.exclusive and not others
    if r.exclusive:
        assert not others
    # everything queued before a flush / deletion in this round started no later than this round
    started = {id(it) for x in s.started for it in x.items}
    for it in r.items:
        if it.refs is None:
            idx = next(i for i, q in enumerate(queued) if q is it)
            assert all(id(q) in started for q in queued[:idx])
