"""TopicWatch against a reference model: a topic is wanted from a sighting of more partitions than
known until a refresh shows at least that many or its patience runs out."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kshare.share.topic_watch import TopicWatch

TOPICS = st.sampled_from(["a", "b", "c"])
STEP = st.one_of(
    st.tuples(st.just("seen"), st.dictionaries(TOPICS, st.integers(-1, 6), max_size=3)),
    st.tuples(st.just("grow"), st.tuples(TOPICS, st.integers(0, 6))),  # the metadata now shows n
    st.tuples(st.just("refresh"), st.none()),
    st.tuples(st.just("wait"), st.floats(0.0, 3.0)),
)


@given(st.lists(STEP, max_size=40))
def test_wanted_until_seen_or_patience_runs_out(steps: list) -> None:
    watch = TopicWatch(patience_s=5.0)
    known: dict[str, int] = {}
    model: dict[str, tuple[int, float]] = {}  # topic -> (at least, until)
    now = 0.0
    for kind, arg in steps:
        if kind == "seen":
            newly = False
            for t, count in arg.items():
                have = known.get(t, 0)
                want = have + 1 if count < 0 else count
                if want > have and (t not in model or model[t][0] < want):
                    model[t] = (want, now + 5.0)
                    newly = True
            assert watch.seen(arg, lambda t: known.get(t, 0), now) == newly
        elif kind == "grow":
            known[arg[0]] = arg[1]
        elif kind == "refresh":
            watch.refreshed(lambda t: known.get(t, 0), now)
            model = {t: (w, u) for t, (w, u) in model.items() if known.get(t, 0) < w and now < u}
        else:
            now += arg
        assert bool(watch) == bool(model)
        assert all((t in watch) == (t in model) for t in ("a", "b", "c"))


def test_a_count_already_known_is_not_wanted() -> None:
    watch = TopicWatch()
    assert not watch.seen({"a": 4, "b": 2}, lambda t: 4 if t == "a" else 3, 0.0)
    assert not watch


def test_more_than_known_is_wanted_until_a_refresh_shows_one_more() -> None:
    watch = TopicWatch()
    known = {"a": 2}
    assert watch.seen({"a": -1}, lambda t: known.get(t, 0), 0.0)
    watch.refreshed(lambda t: known.get(t, 0), 0.3)  # a broker that had not learnt of it yet
    assert "a" in watch
    known["a"] = 4
    watch.refreshed(lambda t: known.get(t, 0), 0.6)
    assert not watch


def test_patience_runs_out() -> None:
    watch = TopicWatch(patience_s=5.0)
    assert watch.seen({"new": 3}, lambda t: 0, 0.0)  # e.g. a validate-only CreateTopics
    watch.refreshed(lambda t: 0, 4.9)
    assert "new" in watch
    watch.refreshed(lambda t: 0, 5.0)
    assert not watch
