"""When a proxy leaving its instance group on SIGTERM closes its client connections
(kshare.share.leaving.Leaving, sans-I/O with a fake clock), and the instance group's heartbeat."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kshare.share.instance_group import HEARTBEAT_MAX_MS, heartbeat_ms
from kshare.share.leaving import LINGER_MAX_S, QUIET_S, Leaving


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_no_client_left_means_it_closes_after_the_quiet_time() -> None:
    clock = Clock()
    leaving = Leaving(clock)
    shown = clock()
    clock.now += QUIET_S - 0.01
    assert not leaving.moved(shown)
    clock.now += 0.02
    assert leaving.moved(shown)


def test_clients_still_asking_keep_it_open_until_they_stop() -> None:
    clock = Clock()
    leaving = Leaving(clock)
    shown = clock()
    for _ in range(int(LINGER_MAX_S / 0.1) - 2):  # a share request every 0.1 s
        clock.now += 0.1
        leaving.request()
        assert not leaving.moved(shown)
    clock.now += QUIET_S
    assert leaving.moved(shown)
    assert leaving.requests == int(LINGER_MAX_S / 0.1) - 2


def test_clients_that_never_stop_asking_are_cut_off_at_the_limit() -> None:
    clock = Clock()
    leaving = Leaving(clock)
    shown = clock()
    while clock.now - shown < LINGER_MAX_S - 0.05:
        clock.now += 0.05
        leaving.request()
        assert not leaving.moved(shown)
    clock.now += 0.05
    leaving.request()
    assert leaving.moved(shown)


def test_requests_before_the_new_map_was_shown_do_not_count() -> None:
    clock = Clock()
    leaving = Leaving(clock)
    leaving.request()  # refused while the others were still rebalancing
    clock.now += 2.0
    shown = clock()
    assert not leaving.moved(shown)
    clock.now += QUIET_S
    assert leaving.moved(shown)


@given(st.lists(st.floats(0.0, 1.0), max_size=40))
def test_it_closes_once_quiet_and_never_later_than_the_limit(gaps: list[float]) -> None:
    clock = Clock()
    leaving = Leaving(clock)
    shown = clock()
    last = shown
    for gap in gaps:
        clock.now += gap
        moved = leaving.moved(shown)
        assert moved == (clock.now - last >= QUIET_S or clock.now - shown >= LINGER_MAX_S)
        if moved:
            return
        leaving.request()
        last = clock.now
    clock.now += QUIET_S
    assert leaving.moved(shown)


@given(st.integers(1, 600_000))
def test_the_heartbeat_lets_the_others_learn_of_a_rebalance_within_half_a_second(session_ms: int) -> None:
    hb = heartbeat_ms(session_ms)
    assert 100 <= hb <= HEARTBEAT_MAX_MS == 500
    assert hb <= max(100, session_ms // 5)  # several heartbeats per session, as before
