"""The share session cache (kshare.share.sessions) against a reference model, with hypothesis:
sessions opened, used, closed, replaced and dropped with their connection or member, in any order.
Its indices (by connection, by member) and ``partitions_of`` must always say what the model says."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kshare.share.errors import ErrorCode
from kshare.share.sessions import FINAL_EPOCH, INITIAL_EPOCH, ShareSessionCache

GROUPS, MEMBERS, NODES, OWNERS = ("g",), ("m1", "m2", "m3"), (1, 2, 3), ("c1", "c2", "c3", "c4")
TPS = [(b"t" * 16, p) for p in range(4)]

key = st.tuples(st.sampled_from(GROUPS), st.sampled_from(MEMBERS), st.sampled_from(NODES))
op = st.one_of(
    st.tuples(st.just("open"), key, st.sampled_from(OWNERS), st.sets(st.sampled_from(TPS), max_size=3)),
    st.tuples(st.just("next"), key, st.sampled_from(OWNERS), st.sets(st.sampled_from(TPS), max_size=2),
              st.sets(st.sampled_from(TPS), max_size=2)),
    st.tuples(st.just("final"), key),
    st.tuples(st.just("close_owner"), st.sampled_from(OWNERS)),
    st.tuples(st.just("close_member"), st.sampled_from(GROUPS), st.sampled_from(MEMBERS)),
)


@given(st.lists(op, max_size=60), st.integers(min_value=1, max_value=6))
def test_the_cache_agrees_with_a_model(ops: list[tuple], limit: int) -> None:
    cache = ShareSessionCache(max_sessions=limit)
    model: dict[tuple, dict] = {}  # key -> {"owner", "epoch", "tps"}
    for o in ops:
        if o[0] == "open":
            _, k, owner, tps = o
            res = cache.open(k, INITIAL_EPOCH, tps, (), owner=owner)
            if k not in model and len(model) >= limit:
                assert res.error_code == ErrorCode.SHARE_SESSION_LIMIT_REACHED
            else:
                assert res.error_code == ErrorCode.NONE
                model[k] = {"owner": owner, "epoch": 1, "tps": set(tps)}
        elif o[0] == "next":
            _, k, owner, add, forget = o
            epoch = model[k]["epoch"] if k in model else 1
            res = cache.open(k, epoch, add, forget, owner=owner)
            if k not in model:
                assert res.error_code == ErrorCode.SHARE_SESSION_NOT_FOUND
            else:
                assert res.error_code == ErrorCode.NONE
                m = model[k]
                m["epoch"] += 1
                m["tps"] = (m["tps"] | add) - forget
                m["owner"] = owner
        elif o[0] == "final":
            res = cache.open(o[1], FINAL_EPOCH, (), ())
            assert (res.closed is not None) == (o[1] in model)
            model.pop(o[1], None)
        elif o[0] == "close_owner":
            closed = {s.key for s in cache.close_owner(o[1])}
            assert closed == {k for k, m in model.items() if m["owner"] == o[1]}
            for k in closed:
                del model[k]
        else:
            closed = {s.key for s in cache.close_member(o[1], o[2])}
            assert closed == {k for k in model if k[:2] == (o[1], o[2])}
            for k in closed:
                del model[k]
        assert set(cache.sessions) == set(model)
        for g in GROUPS:
            for member in MEMBERS:
                want = set().union(*(m["tps"] for k, m in model.items() if k[:2] == (g, member)))
                assert cache.partitions_of(g, member) == want
        assert {k for keys in cache.by_owner.values() for k in keys} == set(model)
        assert {k for keys in cache.by_member.values() for k in keys} == set(model)
