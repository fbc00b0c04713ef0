"""KIP-932 worked example (seed 001): offsets 100-121, three consumers.

Every step checks the cumulative in-flight state and the exact state write
(WriteShareGroupState / ShareUpdate content) the KIP lists for it; fetch steps
write nothing. Replaying the writes must give the engine's own snapshot at every
step, and a crash at any step must restore the delivery counts the KIP describes.
"""

from __future__ import annotations

from kshare.share.partition import AcquiredRange, AcquireMode, FetchedBatch, SharePartition
from kshare.share.states import ShareSnapshot, ShareUpdate, StateBatch, replay

AVAILABLE, ACQUIRED, ACKED, ARCHIVED = 0, 1, 2, 4


class Clock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def cumulative(sp: SharePartition) -> list[tuple[int, int, int, int]]:
    """(first, last, state, delivery count) of every range, as the KIP's "Cumulative state" column."""
    return [(r.first_offset, r.last_offset, int(r.state), r.delivery_count) for r in sp.in_flight()]


def update(start: int, *batches: tuple[int, int, int, int]) -> ShareUpdate:
    return ShareUpdate(start, tuple(StateBatch(*b) for b in batches))


# The fetched data for the second half: batches as a producer could have written them.
LOG_110_120 = [FetchedBatch(110, 112), FetchedBatch(113, 118), FetchedBatch(119, 119), FetchedBatch(120, 120)]


def test_seed001_worked_example() -> None:
    clock = Clock()
    sp = SharePartition(100, clock=clock, record_lock_duration_ms=30_000)
    writes: list[ShareUpdate] = []
    initial = sp.snapshot()

    def check_durable() -> None:
        assert replay(initial, writes) == sp.snapshot()

    # Starting state of topic-partition with latest offset 100: SPSO=100, SPEO=100.
    assert (sp.start_offset, sp.end_offset) == (100, 100)
    assert initial == ShareSnapshot(100, ())

    # Fetch records 100-109: SPEO=110, records 100-109 (acquired, delivery count 1). No write.
    got = sp.acquire("c1", [FetchedBatch(100, 109)], 500)
    assert got.records == [AcquiredRange(100, 109, 1)]
    assert got.update is None
    assert (sp.start_offset, sp.end_offset) == (100, 110)
    assert cumulative(sp) == [(100, 109, ACQUIRED, 1)]

    # Acknowledge 100-109: SPSO=110, SPEO=110. Write {StartOffset 110, []}.
    ack = sp.acknowledge("c1", [(100, 109, 1)])
    assert ack.error_code == 0
    assert ack.update == update(110)
    writes.append(ack.update)
    assert (sp.start_offset, sp.end_offset) == (110, 110)
    assert cumulative(sp) == []
    check_durable()

    # Fetch records 110-119: consumer 1 gets 110-112, consumer 2 113-118, consumer 3 119.
    assert sp.acquire("c1", [FetchedBatch(110, 112)], 500).records == [AcquiredRange(110, 112, 1)]
    clock.now = 1_000
    assert sp.acquire("c2", [FetchedBatch(113, 118)], 500).records == [AcquiredRange(113, 118, 1)]
    got = sp.acquire("c3", [FetchedBatch(119, 119)], 500)
    assert got.records == [AcquiredRange(119, 119, 1)]
    assert got.update is None
    assert (sp.start_offset, sp.end_offset) == (110, 120)
    assert [(a, b, s, c) for a, b, s, c in cumulative(sp)] == [
        (110, 112, ACQUIRED, 1),
        (113, 118, ACQUIRED, 1),
        (119, 119, ACQUIRED, 1),
    ]

    # Release 110 (consumer 1): record 110 (available, delivery count 1).
    clock.now = 2_000
    ack = sp.acknowledge("c1", [(110, 110, 2)])
    assert ack.error_code == 0
    assert ack.update == update(-1, (110, 110, AVAILABLE, 1))
    writes.append(ack.update)
    assert cumulative(sp)[0] == (110, 110, AVAILABLE, 1)
    check_durable()

    # Acknowledge 119 (consumer 3): record 119 acknowledged.
    ack = sp.acknowledge("c3", [(119, 119, 1)])
    assert ack.update == update(-1, (119, 119, ACKED, 1))
    writes.append(ack.update)
    assert cumulative(sp) == [
        (110, 110, AVAILABLE, 1),
        (111, 112, ACQUIRED, 1),
        (113, 118, ACQUIRED, 1),
        (119, 119, ACKED, 1),
    ]
    check_durable()

    # Fetch records 110, 120 (consumer 1): the fetch starts at the released record 110.
    clock.now = 5_000
    assert sp.next_fetch_offset() == 110
    got = sp.acquire("c1", LOG_110_120, 500, fetch_offset=110)
    assert got.records == [AcquiredRange(110, 110, 2), AcquiredRange(120, 120, 1)]
    assert got.update is None  # an acquisition is never written
    assert (sp.start_offset, sp.end_offset) == (110, 121)
    assert cumulative(sp) == [
        (110, 110, ACQUIRED, 2),
        (111, 112, ACQUIRED, 1),
        (113, 118, ACQUIRED, 1),
        (119, 119, ACKED, 1),
        (120, 120, ACQUIRED, 1),
    ]
    # A crash now restores 110 as Available with the delivery count of its last write.
    restored = SharePartition.from_snapshot(initial, writes, clock=clock)
    assert cumulative(restored) == [(110, 110, AVAILABLE, 1), (111, 118, AVAILABLE, 0), (119, 119, ACKED, 1)]

    # Lock timeout elapsed 111, 112 (consumer 1's records): available, delivery count 1.
    assert sp.next_deadline() == 30_000
    clock.now = 30_000
    expired = sp.expire_locks(30_000)
    assert expired == update(-1, (111, 112, AVAILABLE, 1))
    writes.append(expired)
    assert cumulative(sp) == [
        (110, 110, ACQUIRED, 2),
        (111, 112, AVAILABLE, 1),
        (113, 118, ACQUIRED, 1),
        (119, 119, ACKED, 1),
        (120, 120, ACQUIRED, 1),
    ]
    check_durable()

    # Acknowledge 113-118 (consumer 2): records 113-118 acknowledged (write lists only 113-118).
    clock.now = 30_500
    ack = sp.acknowledge("c2", [(113, 118, 1)])
    assert ack.update == update(-1, (113, 118, ACKED, 1))
    writes.append(ack.update)
    assert cumulative(sp) == [
        (110, 110, ACQUIRED, 2),
        (111, 112, AVAILABLE, 1),
        (113, 119, ACKED, 1),
        (120, 120, ACQUIRED, 1),
    ]
    check_durable()

    # Fetch records 111, 112 (consumer 3): delivery count 2. No write.
    assert sp.next_fetch_offset() == 111
    got = sp.acquire("c3", LOG_110_120, 500, fetch_offset=111)
    assert got.records == [AcquiredRange(111, 112, 2)]
    assert got.update is None
    assert cumulative(sp) == [
        (110, 110, ACQUIRED, 2),
        (111, 112, ACQUIRED, 2),
        (113, 119, ACKED, 1),
        (120, 120, ACQUIRED, 1),
    ]

    # Acknowledge 110 (consumer 1): SPSO=111. Write {-1, [110-110 Acknowledged, count 2]}.
    ack = sp.acknowledge("c1", [(110, 110, 1)])
    assert ack.update == update(-1, (110, 110, ACKED, 2))
    writes.append(ack.update)
    assert (sp.start_offset, sp.end_offset) == (111, 121)
    assert cumulative(sp) == [(111, 112, ACQUIRED, 2), (113, 119, ACKED, 1), (120, 120, ACQUIRED, 1)]
    check_durable()

    # Acknowledge 111, 112 (consumer 3): SPSO=120. Write {StartOffset 120, []}.
    ack = sp.acknowledge("c3", [(111, 112, 1)])
    assert ack.update == update(120)
    writes.append(ack.update)
    assert (sp.start_offset, sp.end_offset) == (120, 121)
    assert cumulative(sp) == [(120, 120, ACQUIRED, 1)]
    check_durable()
    assert replay(initial, writes) == ShareSnapshot(120, ())


def test_seed001_with_record_limit_mode_from_one_batch() -> None:
    """Same split of 110-119 between three consumers when the producer wrote one batch."""
    clock = Clock()
    sp = SharePartition(110, clock=clock)
    batch = [FetchedBatch(110, 119)]
    limit = AcquireMode.RECORD_LIMIT
    assert sp.acquire("c1", batch, 3, limit).records == [AcquiredRange(110, 112, 1)]
    assert sp.acquire("c2", batch, 6, limit, fetch_offset=113).records == [AcquiredRange(113, 118, 1)]
    assert sp.acquire("c3", batch, 1, limit, fetch_offset=119).records == [AcquiredRange(119, 119, 1)]
    assert sp.end_offset == 120
    assert sp.acknowledge("c1", [(110, 110, 2)]).update == update(-1, (110, 110, AVAILABLE, 1))
    assert sp.acknowledge("c3", [(119, 119, 1)]).update == update(-1, (119, 119, ACKED, 1))
    # In batch-optimized mode the whole upstream batch would go to one consumer.
    other = SharePartition(110, clock=clock)
    assert other.acquire("c1", batch, 3).records == [AcquiredRange(110, 119, 1)]
