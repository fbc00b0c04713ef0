"""kshare.spark.worker without Spark or Kafka: a read settles what the commit marker already
decides before it fetches (the locks of committed micro-batches are free before new records are
asked for), and keeps what the marker does not decide yet."""

from __future__ import annotations

import asyncio

from kshare.clients.share_member import ACCEPT, RELEASE, Acquired
from kshare.spark.commits import Marker
from kshare.spark.options import Options
from kshare.spark.worker import Holding, MemberHost, Tag


class FakeMember:
    closed = False
    renew_supported = True

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    async def wait_assigned(self, timeout: float) -> bool:
        return True

    async def fetch(self, max_records: int, max_wait_ms: int):
        self.calls.append(("fetch", max_records))
        return [], []

    async def acknowledge(self, acquired, ack_type: int) -> list[str]:
        self.calls.append(("ack", ack_type, sorted(r for a in acquired for r in a.ranges)))
        return []


class FakeChannel:
    def __init__(self, marker: Marker | None) -> None:
        self.marker = marker

    def read(self) -> Marker | None:
        return self.marker

    def notices(self, index: int) -> set:
        return set()


class FakeLedger:
    def read(self, tps) -> dict:
        return {}


def _host(marker: Marker | None, held_batch: int) -> tuple[MemberHost, FakeMember]:
    host = MemberHost.__new__(MemberHost)  # no event loop thread, no connection
    member = FakeMember()
    host.opts = Options("127.0.0.1:9092", "g", ("t",), 1)
    host.member = member  # type: ignore[assignment]
    acquired = Acquired(1, 0, b"\0" * 16, "t", 0, [(0, 9)])
    host.holdings = [Holding(Tag("s", 7, held_batch, 0), [acquired])]
    host._channels = {"s": FakeChannel(marker)}  # type: ignore[dict-item]
    host._notices = {"s": FakeChannel(None)}  # type: ignore[dict-item]
    host._ledger = FakeLedger()  # type: ignore[assignment]
    host._warned = set()
    host._deciding = None
    return host, member


def test_a_read_accepts_the_committed_batch_it_holds_before_fetching() -> None:
    host, member = _host(Marker(7, 0, 3), held_batch=3)
    records, holding = asyncio.run(host._read(Tag("s", 7, 4, 0), 10, 0, 20))
    assert member.calls[0] == ("ack", ACCEPT, [(0, 9)])
    assert member.calls[1][0] == "fetch"
    assert host.holdings == [] and records == []


def test_a_read_keeps_what_the_marker_does_not_decide_yet() -> None:
    host, member = _host(Marker(7, 0, 2), held_batch=3)  # batch 3 not committed yet
    asyncio.run(host._read(Tag("s", 7, 4, 0), 10, 0, 20))
    assert [c[0] for c in member.calls] == ["fetch"]
    assert [h.tag.batch for h in host.holdings] == [3]


class Notices:
    """Retry notices per task index: index -> {(run, batch, attempt)}."""

    def __init__(self, by_index: dict[int, set[tuple[int, int, int]]]) -> None:
        self.by_index = by_index

    def notices(self, index: int) -> set:
        return self.by_index.get(index, set())


def test_at_the_commit_a_failed_attempt_of_each_task_is_released_and_the_rest_accepted() -> None:
    """Two tasks of micro-batch 3 were tried again (attempt 1 began for tasks 0 and 1); this worker
    holds attempt 0 of both and of task 2, and attempt 1 of task 3's earlier batch: only what the
    failed attempts read is released at the commit."""
    host, member = _host(Marker(7, 0, 3), held_batch=3)

    def holding(index: int, first: int, attempt: int = 0, batch: int = 3) -> Holding:
        return Holding(Tag("s", 7, batch, index, attempt), [Acquired(1, 0, b"\0" * 16, "t", 0, [(first, first + 9)])])

    host.holdings = [holding(0, 0), holding(1, 10), holding(2, 20), holding(3, 30, attempt=1, batch=2)]
    host._notices = {"s": Notices({0: {(7, 3, 1)}, 1: {(7, 3, 1), (6, 3, 2)}, 3: {(7, 2, 1)}})}  # type: ignore[dict-item]
    asyncio.run(host._decide())
    assert member.calls == [("ack", ACCEPT, [(20, 29), (30, 39)]), ("ack", RELEASE, [(0, 9), (10, 19)])]
    assert host.holdings == []
