"""Edge cases of the share-partition engine (kshare.share.partition)."""

from __future__ import annotations

import pytest

from kshare.share.errors import ErrorCode
from kshare.share.partition import AcquiredRange, FetchedBatch, SharePartition
from kshare.share.states import (
    AcquireMode,
    ShareSnapshot,
    ShareUpdate,
    StateBatch,
    apply_update,
    overlay,
    replay,
)

AVAILABLE, ACQUIRED, ACKED, ARCHIVED = 0, 1, 2, 4
GAP, ACCEPT, RELEASE, REJECT, RENEW = 0, 1, 2, 3, 4
INVALID_RECORD_STATE = ErrorCode.INVALID_RECORD_STATE
INVALID_REQUEST = ErrorCode.INVALID_REQUEST
FB = FetchedBatch


class Clock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def make(start: int = 0, **config: object) -> tuple[SharePartition, Clock]:
    clock = Clock()
    return SharePartition(start, clock=clock, **config), clock  # type: ignore[arg-type]


def states(sp: SharePartition) -> list[tuple[int, int, int, int]]:
    return [(r.first_offset, r.last_offset, int(r.state), r.delivery_count) for r in sp.in_flight()]


def upd(start: int, *batches: tuple[int, int, int, int]) -> ShareUpdate:
    return ShareUpdate(start, tuple(StateBatch(*b) for b in batches))


def redeliver(sp: SharePartition, member: str, batches: list[FetchedBatch], times: int) -> None:
    """Acquire and release the same records ``times`` times."""
    for _ in range(times):
        got = sp.acquire(member, batches, 500)
        assert got.records
        assert (
            sp.acknowledge(member, [(r.first_offset, r.last_offset, RELEASE) for r in got.records]).error_code
            == 0
        )


# ---------------------------------------------------------------- acknowledgement validation


def test_ack_of_offset_never_fetched() -> None:
    """As Kafka 4.4's SharePartition: past the last offset in flight is an invalid request, before
    the first one (or with nothing in flight) an invalid record state."""
    sp, _ = make(100)
    assert sp.acknowledge("m", [(100, 100, ACCEPT)]).error_code == INVALID_RECORD_STATE  # nothing in flight
    sp.acquire("m", [FB(100, 109)], 500)
    before = states(sp)
    assert sp.acknowledge("m", [(110, 110, ACCEPT)]).error_code == INVALID_REQUEST
    assert sp.acknowledge("m", [(105, 112, ACCEPT)]).error_code == INVALID_REQUEST
    assert sp.acknowledge("m", [(99, 100, ACCEPT)]).error_code == INVALID_RECORD_STATE
    assert sp.acknowledge("m", [(99, 112, ACCEPT)]).error_code == INVALID_RECORD_STATE
    assert states(sp) == before


def test_double_ack() -> None:
    sp, _ = make(100)
    sp.acquire("m", [FB(100, 109)], 500)
    assert sp.acknowledge("m", [(105, 109, ACCEPT)]).error_code == 0
    # Still in the window (SPSO at 100): the records are Acknowledged, not acquired.
    result = sp.acknowledge("m", [(105, 109, ACCEPT)])
    assert result == (INVALID_RECORD_STATE, None)
    assert sp.acknowledge("m", [(100, 104, ACCEPT)]).update == upd(110)
    # Below the SPSO now.
    assert sp.acknowledge("m", [(100, 109, ACCEPT)]).error_code == INVALID_RECORD_STATE


def test_ack_by_another_member_is_refused() -> None:
    sp, _ = make()
    sp.acquire("a", [FB(0, 9)], 500)
    assert sp.acknowledge("b", [(0, 9, ACCEPT)]).error_code == INVALID_RECORD_STATE
    assert states(sp) == [(0, 9, ACQUIRED, 1)]


def test_ack_after_lock_expiry() -> None:
    sp, clock = make(record_lock_duration_ms=1_000)
    sp.acquire("m", [FB(0, 9)], 500)
    clock.now = 1_000  # the deadline itself is expired
    result = sp.acknowledge("m", [(0, 9, ACCEPT)])
    assert result.error_code == INVALID_RECORD_STATE
    # The expiry the call processed on the way is still a durable change to write.
    assert result.update == upd(-1, (0, 9, AVAILABLE, 1))
    assert states(sp) == [(0, 9, AVAILABLE, 1)]
    # Another member may take the records again; the first member's ack stays invalid.
    assert sp.acquire("n", [FB(0, 9)], 500).records == [AcquiredRange(0, 9, 2)]
    assert sp.acknowledge("m", [(0, 9, ACCEPT)]).error_code == INVALID_RECORD_STATE


def test_expiry_folded_into_a_failed_ack_is_reported() -> None:
    sp, clock = make(record_lock_duration_ms=1_000)
    sp.acquire("m", [FB(0, 9)], 500)
    result = sp.acknowledge("m", [(0, 9, RELEASE)])  # Available, count 1: durable
    assert result.update == upd(-1, (0, 9, AVAILABLE, 1))
    sp.acquire("m", [FB(0, 9)], 500)  # count 2, not written
    clock.now = 5_000
    result = sp.acknowledge("m", [(0, 9, ACCEPT)])
    assert result.error_code == INVALID_RECORD_STATE
    assert result.update == upd(-1, (0, 9, AVAILABLE, 2))
    assert states(sp) == [(0, 9, AVAILABLE, 2)]


def test_ack_is_atomic_per_partition() -> None:
    sp, _ = make()
    sp.acquire("m", [FB(0, 9)], 500)
    sp.acquire("n", [FB(10, 19)], 500)
    before = states(sp)
    # First batch valid, second held by someone else: nothing changes.
    assert sp.acknowledge("m", [(0, 4, ACCEPT), (10, 12, ACCEPT)]) == (INVALID_RECORD_STATE, None)
    assert states(sp) == before
    assert sp.acknowledge("m", [(0, 4, ACCEPT), (5, 9, REJECT)]).error_code == 0
    assert sp.start_offset == 10


@pytest.mark.parametrize(
    "batch",
    [
        (5, 4, ACCEPT),  # first > last
        (0, 4, [ACCEPT, ACCEPT]),  # wrong number of per-offset types
        (0, 4, 7),  # unknown type
        (0, 1, [ACCEPT, 9]),
        (0, 1, [ACCEPT, -1]),
        (-1, 1, ACCEPT),
    ],
)
def test_malformed_acknowledgements(batch: tuple) -> None:
    sp, _ = make()
    sp.acquire("m", [FB(0, 9)], 500)
    assert sp.acknowledge("m", [batch]) == (INVALID_REQUEST, None)
    assert states(sp) == [(0, 9, ACQUIRED, 1)]


def test_overlapping_ack_batches_are_malformed() -> None:
    sp, _ = make()
    sp.acquire("m", [FB(0, 9)], 500)
    assert sp.acknowledge("m", [(0, 5, ACCEPT), (5, 9, ACCEPT)]).error_code == INVALID_REQUEST
    # Out of order but disjoint is fine.
    assert sp.acknowledge("m", [(6, 9, ACCEPT), (0, 5, ACCEPT)]) == (0, upd(10))


def test_per_offset_types() -> None:
    sp, _ = make()
    sp.acquire("m", [FB(0, 9)], 500)
    types = [ACCEPT, ACCEPT, RELEASE, REJECT, GAP, GAP, ACCEPT, RELEASE, RELEASE, ACCEPT]
    result = sp.acknowledge("m", [(0, 9, types)])
    assert result.error_code == 0
    assert result.update == upd(
        -1,
        (0, 1, ACKED, 1),
        (2, 2, AVAILABLE, 1),
        (3, 5, ARCHIVED, 1),
        (6, 6, ACKED, 1),
        (7, 8, AVAILABLE, 1),
        (9, 9, ACKED, 1),
    )
    assert sp.start_offset == 2
    assert states(sp) == [
        (2, 2, AVAILABLE, 1),
        (3, 5, ARCHIVED, 1),
        (6, 6, ACKED, 1),
        (7, 8, AVAILABLE, 1),
        (9, 9, ACKED, 1),
    ]


def test_single_type_as_list_of_one() -> None:
    sp, _ = make()
    sp.acquire("m", [FB(0, 9)], 500)
    assert sp.acknowledge("m", [(0, 9, [ACCEPT])]) == (0, upd(10))


def test_renew_disabled_and_enabled() -> None:
    sp, clock = make(record_lock_duration_ms=1_000)
    sp.acquire("m", [FB(0, 9)], 500)
    assert sp.acknowledge("m", [(0, 9, RENEW)]).error_code == INVALID_RECORD_STATE
    sp.renew_enabled = True
    clock.now = 600
    assert sp.acknowledge("m", [(0, 4, RENEW)]) == (0, None)  # nothing durable changes
    assert sp.next_deadline() == 1_000  # 5-9 still expire at 1000
    clock.now = 1_000
    assert sp.expire_locks() == upd(-1, (5, 9, AVAILABLE, 1))
    assert states(sp) == [(0, 4, ACQUIRED, 1), (5, 9, AVAILABLE, 1)]
    assert sp.next_deadline() == 1_600
    assert sp.acknowledge("m", [(0, 4, ACCEPT)]).error_code == 0


# ---------------------------------------------------------------- delivery count limit


def test_release_at_the_limit_archives() -> None:
    sp, _ = make(delivery_count_limit=3)
    redeliver(sp, "m", [FB(0, 9)], 2)
    assert states(sp) == [(0, 9, AVAILABLE, 2)]
    got = sp.acquire("m", [FB(0, 9)], 500)
    assert got.records == [AcquiredRange(0, 9, 3)]
    result = sp.acknowledge("m", [(0, 9, RELEASE)])
    assert result.update == upd(10)  # archived at the limit, so the SPSO moves past them
    assert sp.start_offset == 10


def test_lock_timeout_at_the_limit_archives() -> None:
    sp, clock = make(delivery_count_limit=2, record_lock_duration_ms=100)
    sp.acquire("m", [FB(0, 4)], 500)
    sp.acquire("m", [FB(5, 9)], 500)
    clock.now = 100
    assert sp.expire_locks() == upd(-1, (0, 9, AVAILABLE, 1))
    sp.acquire("m", [FB(0, 9)], 500)
    clock.now = 200
    assert sp.expire_locks() == upd(10)
    assert states(sp) == []


def test_limit_reached_mid_batch() -> None:
    sp, _ = make(delivery_count_limit=3)
    sp.acquire("m", [FB(0, 9)], 500)
    # Release only 0-4, twice: they reach delivery count 3 while 5-9 stay at 1.
    sp.acknowledge("m", [(0, 4, RELEASE)])
    assert sp.acquire("m", [FB(0, 9)], 500).records == [AcquiredRange(0, 4, 2)]
    sp.acknowledge("m", [(0, 4, RELEASE)])
    assert sp.acquire("m", [FB(0, 9)], 500).records == [AcquiredRange(0, 4, 3)]
    assert states(sp) == [(0, 4, ACQUIRED, 3), (5, 9, ACQUIRED, 1)]
    # One release for the whole batch: 0-4 are at the limit and are archived, 5-9 come back.
    result = sp.acknowledge("m", [(0, 9, RELEASE)])
    # The SPSO moves past exactly the records this write settles and 5-9 stay durable:
    # the write is a pure delta, as in seed 001 ("Acknowledge 110").
    assert result.update == upd(-1, (0, 4, ARCHIVED, 3), (5, 9, AVAILABLE, 1))
    assert sp.start_offset == 5
    assert states(sp) == [(5, 9, AVAILABLE, 1)]


def test_reject_archives_at_once() -> None:
    sp, _ = make()
    sp.acquire("m", [FB(0, 9)], 500)
    assert sp.acknowledge("m", [(3, 3, REJECT)]).update == upd(-1, (3, 3, ARCHIVED, 1))
    assert sp.acknowledge("m", [(0, 2, ACCEPT)]).update == upd(4)
    assert sp.acquire("m", [FB(0, 9)], 500).records == []


def test_lowered_limit_applies_to_later_decisions() -> None:
    """KIP-1240: Available records already at a lowered limit are archived, not delivered."""
    sp, _ = make(delivery_count_limit=5)
    redeliver(sp, "m", [FB(0, 4)], 3)  # 0-4 Available with count 3
    sp.acquire("m", [FB(5, 9)], 500)
    redeliver(sp, "m", [FB(5, 9)], 0)
    sp.delivery_count_limit = 3
    got = sp.acquire("m", [FB(0, 4), FB(5, 9), FB(10, 14)], 500, fetch_offset=0)
    assert got.records == [AcquiredRange(10, 14, 1)]
    assert got.update == upd(5)  # 0-4 archived with count 3 and passed by the SPSO
    # An acquired record over the new limit is archived when released.
    sp.delivery_count_limit = 1
    assert sp.acknowledge("m", [(5, 9, RELEASE)]).update == upd(10)
    # Raising the limit again lets records be redelivered.
    sp.delivery_count_limit = 5
    assert sp.acknowledge("m", [(10, 14, RELEASE)]).update == upd(-1, (10, 14, AVAILABLE, 1))
    assert sp.acquire("m", [FB(10, 14)], 500).records == [AcquiredRange(10, 14, 2)]


# ---------------------------------------------------------------- acquisition


def test_batch_optimized_overshoots_once() -> None:
    sp, _ = make()
    got = sp.acquire("m", [FB(0, 9), FB(10, 19), FB(20, 29)], 15)
    assert got.records == [AcquiredRange(0, 19, 1)]
    assert got.count == 20
    assert sp.end_offset == 20


def test_record_limit_never_exceeds_max_records() -> None:
    sp, _ = make()
    got = sp.acquire("m", [FB(0, 9), FB(10, 19)], 15, AcquireMode.RECORD_LIMIT)
    assert got.records == [AcquiredRange(0, 14, 1)]
    assert sp.end_offset == 15
    # Redeliveries count too.
    sp.acknowledge("m", [(0, 14, [RELEASE, ACCEPT] * 7 + [RELEASE])])
    got = sp.acquire("n", [FB(0, 9), FB(10, 19)], 5, AcquireMode.RECORD_LIMIT, fetch_offset=0)
    assert got.records == [
        AcquiredRange(0, 0, 2),
        AcquiredRange(2, 2, 2),
        AcquiredRange(4, 4, 2),
        AcquiredRange(6, 6, 2),
        AcquiredRange(8, 8, 2),
    ]
    got = sp.acquire("n", [FB(0, 9), FB(10, 19)], 5, AcquireMode.RECORD_LIMIT, fetch_offset=0)
    assert got.count == 5
    assert got.records == [
        AcquiredRange(10, 10, 2),
        AcquiredRange(12, 12, 2),
        AcquiredRange(14, 14, 2),
        AcquiredRange(15, 16, 1),
    ]


def test_adjacent_ranges_with_same_count_are_merged() -> None:
    sp, _ = make()
    got = sp.acquire("m", [FB(0, 4), FB(5, 9), FB(10, 14)], 500)
    assert got.records == [AcquiredRange(0, 14, 1)]
    assert len(sp.in_flight()) == 1


def test_in_flight_limit() -> None:
    sp, _ = make(max_record_locks=20)
    assert sp.acquire("m", [FB(0, 14), FB(15, 29), FB(30, 44)], 500).records == [AcquiredRange(0, 29, 1)]
    assert sp.in_flight_count == 30  # the batch crossing the limit is taken whole
    assert not sp.can_acquire()
    assert sp.acquire("n", [FB(30, 44)], 500).records == []
    # Redelivery inside the window is still possible at the limit.
    sp.acknowledge("m", [(5, 5, RELEASE)])
    assert sp.can_acquire()
    got = sp.acquire("n", [FB(0, 14), FB(15, 29), FB(30, 44)], 500, fetch_offset=5)
    assert got.records == [AcquiredRange(5, 5, 2)]
    # Record-limit mode does not cross the limit.
    sp2, _ = make(max_record_locks=20)
    got = sp2.acquire("m", [FB(0, 14), FB(15, 29)], 500, AcquireMode.RECORD_LIMIT)
    assert got.records == [AcquiredRange(0, 19, 1)]


def test_zero_max_records_or_no_data() -> None:
    sp, _ = make()
    assert sp.acquire("m", [FB(0, 9)], 0) == ([], 0, None)
    assert sp.acquire("m", [], 10) == ([], 0, None)


def test_batches_before_the_spso_are_ignored() -> None:
    sp, _ = make(100)
    got = sp.acquire("m", [FB(90, 104), FB(105, 109)], 500)
    assert got.records == [AcquiredRange(100, 109, 1)]


# ---------------------------------------------------------------- gaps, control batches, transactions


def test_gap_before_first_batch_and_between_batches() -> None:
    sp, _ = make(100)
    # Compaction removed 100-104 and 110-111.
    got = sp.acquire("m", [FB(105, 109), FB(112, 115)], 500, fetch_offset=100)
    assert got.records == [AcquiredRange(105, 109, 1), AcquiredRange(112, 115, 1)]
    assert got.update == upd(105)  # the missing head is skipped and the SPSO moves
    assert states(sp) == [(105, 109, ACQUIRED, 1), (110, 111, ARCHIVED, 0), (112, 115, ACQUIRED, 1)]
    # Acknowledging 105-109 moves the SPSO across the gap.
    assert sp.acknowledge("m", [(105, 109, ACCEPT)]).update == upd(112)


def test_gap_without_fetch_offset_leaves_a_hole_to_fetch_again() -> None:
    sp, _ = make(100)
    got = sp.acquire("m", [FB(105, 109)], 500)
    assert got.records == [AcquiredRange(105, 109, 1)]
    assert states(sp) == [(100, 104, AVAILABLE, 0), (105, 109, ACQUIRED, 1)]
    assert sp.next_fetch_offset() == 100
    got = sp.acquire("m", [FB(105, 109)], 500, fetch_offset=100)
    assert got.records == []
    assert got.update == upd(105)


def test_records_missing_after_delivery_are_archived() -> None:
    """A released record compacted away before redelivery: archived with its count, durably."""
    sp, _ = make()
    sp.acquire("m", [FB(0, 9)], 500)
    sp.acknowledge("m", [(0, 9, [ACCEPT] * 3 + [RELEASE] * 2 + [ACCEPT] * 5)])
    assert sp.next_fetch_offset() == 3
    got = sp.acquire("m", [FB(5, 9), FB(10, 12)], 500, fetch_offset=3)
    assert got.records == [AcquiredRange(10, 12, 1)]
    assert got.update == upd(10)


def test_control_batches_are_never_acquired() -> None:
    sp, _ = make()
    batches = [FB(0, 4, True, True, 7), FB(5, 9), FB(10, 10, True, True, 7), FB(11, 14)]
    got = sp.acquire("m", batches, 500)
    assert got.records == [AcquiredRange(5, 9, 1), AcquiredRange(11, 14, 1)]
    assert got.update == upd(5)
    assert sp.acknowledge("m", [(5, 9, ACCEPT)]).update == upd(11)


def test_trailing_control_batch_is_archived_even_at_max_records() -> None:
    sp, _ = make()
    batches = [FB(0, 9, False, True, 3), FB(10, 10, True, True, 3), FB(11, 20)]
    got = sp.acquire("m", batches, 10)
    assert got.records == [AcquiredRange(0, 9, 1)]
    assert sp.end_offset == 11
    assert sp.acknowledge("m", [(0, 9, ACCEPT)]).update == upd(11)


def test_aborted_transactions_are_archived() -> None:
    sp, _ = make()
    batches = [
        FB(0, 4, False, True, 1),  # pid 1, aborted
        FB(5, 9, False, True, 2),  # pid 2, committed
        FB(10, 14, False, False, -1),  # not transactional
        FB(15, 15, True, True, 1),  # abort marker of pid 1
        FB(16, 16, True, True, 2),  # commit marker of pid 2
        FB(17, 20, False, True, 1),  # pid 1 again, a new (committed) transaction
        FB(21, 21, True, True, 1),
    ]
    got = sp.acquire("m", batches, 500, lso=22, aborted_transactions=[(1, 0)])
    assert got.records == [AcquiredRange(5, 14, 1), AcquiredRange(17, 20, 1)]
    assert states(sp)[0] == (5, 14, ACQUIRED, 1)
    assert sp.acknowledge("m", [(5, 14, ACCEPT), (17, 20, ACCEPT)]).update == upd(22)


def test_read_uncommitted_delivers_aborted_records() -> None:
    sp, _ = make()
    got = sp.acquire("m", [FB(0, 4, False, True, 1), FB(5, 5, True, True, 1)], 500)
    assert got.records == [AcquiredRange(0, 4, 1)]


def test_lso_bounds_acquisition() -> None:
    sp, _ = make()
    batches = [FB(0, 9), FB(10, 19, False, True, 4), FB(20, 29)]
    got = sp.acquire("m", batches, 500, lso=15)
    assert got.records == [AcquiredRange(0, 14, 1)]
    assert sp.end_offset == 15
    got = sp.acquire("m", batches, 500, lso=15)
    assert got.records == []
    got = sp.acquire("m", batches, 500, lso=30, fetch_offset=15)
    assert got.records == [AcquiredRange(15, 29, 1)]


# ---------------------------------------------------------------- members, locks, reset


def test_release_member() -> None:
    sp, _ = make(delivery_count_limit=2)
    sp.acquire("a", [FB(0, 4)], 500)
    sp.acquire("b", [FB(5, 9)], 500)
    sp.acquire("a", [FB(10, 14)], 500)
    assert sp.release_member("a") == upd(-1, (0, 4, AVAILABLE, 1), (10, 14, AVAILABLE, 1))
    assert states(sp) == [(0, 4, AVAILABLE, 1), (5, 9, ACQUIRED, 1), (10, 14, AVAILABLE, 1)]
    assert sp.acquired_count("b") == 5
    sp.acquire("c", [FB(0, 4)], 500)
    # Second delivery attempt used up: archived; 10-14 stay durable so the write is a delta.
    assert sp.release_member("c") == upd(-1, (0, 4, ARCHIVED, 2))
    assert sp.start_offset == 5
    assert sp.release_member("nobody") is None


def test_next_deadline_tracks_the_earliest_lock() -> None:
    sp, clock = make(record_lock_duration_ms=1_000)
    assert sp.next_deadline() is None
    sp.acquire("a", [FB(0, 4)], 500)
    clock.now = 10
    sp.acquire("b", [FB(5, 9)], 500, lock_duration_ms=500)
    assert sp.next_deadline() == 510
    sp.acknowledge("b", [(5, 9, ACCEPT)])
    assert sp.next_deadline() == 1_000
    sp.acknowledge("a", [(0, 4, ACCEPT)])
    assert sp.next_deadline() is None


def test_reset_refused_while_acquired() -> None:
    sp, clock = make(100, record_lock_duration_ms=1_000)
    sp.acquire("m", [FB(100, 109)], 500)
    sp.acknowledge("m", [(100, 104, RELEASE)])
    result = sp.reset_start_offset(0)
    assert result.error_code == ErrorCode.NON_EMPTY_GROUP
    assert result.snapshot is None
    assert sp.start_offset == 100
    # Once the locks expired the reset goes through and discards all state.
    clock.now = 1_000
    result = sp.reset_start_offset(50)
    assert result == (0, ShareSnapshot(50, ()), None)
    assert (sp.start_offset, sp.end_offset, states(sp)) == (50, 50, [])
    assert sp.next_deadline() is None
    assert sp.acquire("m", [FB(50, 59)], 500).records == [AcquiredRange(50, 59, 1)]


def test_skip_to_log_start_keeps_acquired_records() -> None:
    sp, clock = make(100, record_lock_duration_ms=1_000)
    sp.acquire("m", [FB(100, 109)], 500)
    sp.acknowledge("m", [(100, 104, RELEASE)])  # 100-104 Available (count 1), 105-109 acquired
    assert sp.skip_to_log_start(107) == upd(105)  # 100-104 archived, nothing durable left in flight
    assert sp.archived == []  # gone upstream: nothing to dead-letter
    assert states(sp) == [(105, 109, ACQUIRED, 1)]
    assert sp.acknowledge("m", [(105, 109, ACCEPT)]).update == upd(110)
    # Far past the window: one range, SPSO = SPEO = log start.
    assert sp.skip_to_log_start(10**12) == upd(10**12)
    assert (sp.start_offset, sp.end_offset, states(sp)) == (10**12, 10**12, [])
    assert sp.skip_to_log_start(5) is None


def test_reset_forwards_after_release() -> None:
    sp, _ = make()
    sp.acquire("m", [FB(0, 9)], 500)
    sp.release_member("m")
    assert sp.reset_start_offset(1_000).snapshot == ShareSnapshot(1_000, ())
    assert sp.next_fetch_offset() == 1_000


# ---------------------------------------------------------------- durable state


def test_snapshot_and_restore() -> None:
    sp, clock = make(100)
    sp.acquire("m", [FB(100, 119)], 500)
    sp.acknowledge("m", [(100, 119, [RELEASE] * 2 + [ACCEPT] * 3 + [REJECT] + [ACCEPT] * 4 + [RELEASE] * 10)])
    sp.acquire("m", [FB(100, 119), FB(120, 129)], 500, fetch_offset=100)
    snap = sp.snapshot()
    assert snap == ShareSnapshot(
        100,
        (
            StateBatch(100, 101, AVAILABLE, 1),
            StateBatch(102, 104, ACKED, 1),
            StateBatch(105, 105, ARCHIVED, 1),
            StateBatch(106, 109, ACKED, 1),
            StateBatch(110, 119, AVAILABLE, 1),
        ),
    )
    restored = SharePartition.from_snapshot(snap, clock=clock)
    assert states(restored) == [
        (100, 101, AVAILABLE, 1),
        (102, 104, ACKED, 1),
        (105, 105, ARCHIVED, 1),
        (106, 109, ACKED, 1),
        (110, 119, AVAILABLE, 1),
    ]
    assert restored.end_offset == 120
    got = restored.acquire("x", [FB(100, 119), FB(120, 129)], 500, fetch_offset=100)
    assert got.records == [AcquiredRange(100, 101, 2), AcquiredRange(110, 119, 2), AcquiredRange(120, 129, 1)]


def test_restore_holes_are_fetched_as_new() -> None:
    snap = ShareSnapshot(0, (StateBatch(5, 5, ACKED, 1), StateBatch(8, 9, AVAILABLE, 2)))
    sp = SharePartition.from_snapshot(snap)
    assert states(sp) == [(0, 4, AVAILABLE, 0), (5, 5, ACKED, 1), (6, 7, AVAILABLE, 0), (8, 9, AVAILABLE, 2)]
    assert sp.next_fetch_offset() == 0
    got = sp.acquire("m", [FB(0, 9), FB(10, 11)], 500, fetch_offset=0)
    assert got.records == [
        AcquiredRange(0, 4, 1),
        AcquiredRange(6, 7, 1),
        AcquiredRange(8, 9, 3),
        AcquiredRange(10, 11, 1),
    ]


def test_restore_normalizes_settled_head_and_rejects_unset_start() -> None:
    snap = ShareSnapshot(
        10, (StateBatch(10, 14, ACKED, 1), StateBatch(15, 15, ARCHIVED, 2), StateBatch(16, 16, AVAILABLE, 1))
    )
    sp = SharePartition.from_snapshot(snap)
    assert sp.start_offset == 16
    with pytest.raises(ValueError):
        SharePartition.from_snapshot(ShareSnapshot(-1, ()))


def test_overlay_and_apply_update() -> None:
    base = [StateBatch(0, 9, AVAILABLE, 1), StateBatch(10, 19, ACKED, 1)]
    assert overlay(base, [StateBatch(5, 12, ARCHIVED, 2)]) == [
        StateBatch(0, 4, AVAILABLE, 1),
        StateBatch(5, 12, ARCHIVED, 2),
        StateBatch(13, 19, ACKED, 1),
    ]
    assert overlay(base, [StateBatch(3, 4, ACKED, 1)]) == [
        StateBatch(0, 2, AVAILABLE, 1),
        StateBatch(3, 4, ACKED, 1),
        StateBatch(5, 9, AVAILABLE, 1),
        StateBatch(10, 19, ACKED, 1),
    ]
    snap = ShareSnapshot(0, tuple(base))
    assert apply_update(snap, upd(-1, (0, 9, ACKED, 1))) == ShareSnapshot(20, ())
    assert apply_update(snap, upd(15)) == ShareSnapshot(20, ())
    assert apply_update(snap, upd(5)) == ShareSnapshot(
        5, (StateBatch(5, 9, AVAILABLE, 1), StateBatch(10, 19, ACKED, 1))
    )
    assert replay(snap, [upd(-1, (20, 20, ARCHIVED, 3)), upd(-1, (0, 9, ARCHIVED, 1))]) == ShareSnapshot(
        21, ()
    )


# ---------------------------------------------------------------- ranges stay few


def test_whole_batch_path_keeps_one_range_per_batch() -> None:
    sp, _ = make()
    offset = 0
    for _ in range(2_000):
        batch = FB(offset, offset + 499)
        got = sp.acquire("m", [batch], 500)
        assert got.records == [AcquiredRange(offset, offset + 499, 1)]
        assert len(sp.in_flight()) == 1
        assert sp.acknowledge("m", [(offset, offset + 499, ACCEPT)]).update == upd(offset + 500)
        offset += 500
    assert sp.in_flight() == []
    assert sp.next_deadline() is None
    assert sp._locks == []


def test_ranges_merge_back_after_divergence() -> None:
    sp, _ = make()
    sp.acquire("m", [FB(0, 99)], 500)
    sp.acknowledge("m", [(10, 10, ACCEPT)])
    sp.acknowledge("m", [(12, 12, ACCEPT)])
    assert len(sp.in_flight()) == 5
    sp.acknowledge("m", [(11, 11, ACCEPT)])
    assert states(sp) == [(0, 9, ACQUIRED, 1), (10, 12, ACKED, 1), (13, 99, ACQUIRED, 1)]
    sp.acknowledge("m", [(0, 9, RELEASE)])
    sp.acquire("n", [FB(0, 99)], 500, fetch_offset=0)
    assert states(sp)[0] == (0, 9, ACQUIRED, 2)
    sp.acknowledge("n", [(0, 9, ACCEPT)])
    assert states(sp) == [(13, 99, ACQUIRED, 1)]


def test_archived_lists_delivered_records_the_operation_archived() -> None:
    """For the dead-letter queue: the update alone misses records the SPSO moved past."""
    sp, _ = make(delivery_count_limit=2)
    sp.acquire("m", [FB(0, 9)], 500)
    assert sp.acknowledge("m", [(0, 9, [REJECT, ACCEPT, GAP] + [RELEASE] * 7)]).error_code == 0
    assert sp.archived == [(0, 0, 1), (2, 2, 1)]
    sp.acquire("m", [FB(0, 9)], 500)  # 3-9 again, delivery count 2 = the limit
    assert sp.archived == []
    result = sp.acknowledge("m", [(3, 9, RELEASE)])
    assert result.update == upd(10)  # the update does not name them ...
    assert sp.archived == [(3, 9, 2)]  # ... archived does
    # Records gone upstream (skipped) are not archived deliveries.
    sp2, _ = make()
    sp2.acquire("m", [FB(0, 4)], 500)
    sp2.acknowledge("m", [(0, 4, RELEASE)])
    sp2.acquire("m", [FB(5, 9)], 500, fetch_offset=0)
    assert sp2.archived == []
    assert sp2.start_offset == 5
