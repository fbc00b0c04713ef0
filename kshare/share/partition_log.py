"""A cache of one topic-partition's raw record batches, fetched from the cluster on demand.

Share-partitions of every group reading a topic-partition share its ``PartitionLog``. The log
keeps the bytes of recent Fetch responses as ``Segment``s (a fetch offset and the complete
batches that followed it, headers parsed, bodies untouched) so redeliveries and other groups are
served without another round trip, re-reads from the cluster what was evicted, and runs at most
one long-polling Fetch to learn about new data as soon as the cluster has it.
"""

from __future__ import annotations

import asyncio
import logging
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field

from .errors import ErrorCode
from .records import Batch, split_batches
from .upstream import FetchResult, TopicInfo, UpstreamCluster

log = logging.getLogger("kshare.share")


def _last_offset(b: Batch) -> int:
    return b.last_offset


@dataclass(slots=True)
class Segment:
    """Complete batches fetched from ``start``: every offset in [start, end) is covered."""

    start: int
    end: int
    batches: list[Batch]
    data: memoryview  # the fetched bytes the batches point into
    lso: int
    aborted: list[tuple[int, int]]

    @property
    def size(self) -> int:
        return len(self.data)


@dataclass(slots=True)
class ReadResult:
    error_code: int
    fetch_offset: int = -1
    batches: list[tuple[Batch, memoryview]] = field(default_factory=list)  # batch, its bytes
    lso: int = -1
    aborted: list[tuple[int, int]] = field(default_factory=list)
    log_start_offset: int = -1


class PartitionLog:
    def __init__(self, upstream: UpstreamCluster, topic: TopicInfo, partition: int, read_committed: bool,
                 *, fetch_bytes: int = 1 << 20, budget_bytes: int = 16 << 20) -> None:
        self.upstream = upstream
        self.topic = topic
        self.partition = partition
        self.read_committed = read_committed
        self.fetch_bytes = fetch_bytes
        self.budget_bytes = budget_bytes
        self.segments: list[Segment] = []  # sorted by start
        self.cached_bytes = 0
        self.high_watermark = -1
        self.log_start_offset = -1
        self.listeners: set[Callable[[], None]] = set()  # told when new data arrived
        self._poll: asyncio.Task | None = None
        self._fetching: dict[int, asyncio.Task] = {}

    # -- reads --------------------------------------------------------------------------------------
    def _cached(self, offset: int, max_bytes: int, until: int | None = None) -> ReadResult | None:
        starts = [s.start for s in self.segments]
        i = bisect_right(starts, offset) - 1
        if i < 0 or self.segments[i].end <= offset:
            return None
        result = ReadResult(ErrorCode.NONE, fetch_offset=offset)
        size = 0
        seg = self.segments[i]
        # the first batch holding ``offset`` or later (a segment may hold thousands of batches)
        j = bisect_left(seg.batches, offset, key=_last_offset)
        while True:
            result.lso = seg.lso
            result.aborted.extend(seg.aborted)
            batches = seg.batches
            for k in range(j, len(batches)):
                b = batches[k]
                if result.batches and (size + (b.end - b.start) > max_bytes
                                       or (until is not None and b.base_offset >= until)):
                    return result
                result.batches.append((b, seg.data[b.start:b.end]))
                size += b.end - b.start
            i += 1
            if i >= len(self.segments) or self.segments[i].start != seg.end:
                return result
            seg = self.segments[i]
            j = 0

    async def read(self, offset: int, max_bytes: int, until: int | None = None) -> ReadResult:
        """Batches from ``offset`` on (the first may start before it), from cache or the cluster;
        with ``until``, none starting at or past it (but always at least one)."""
        cached = self._cached(offset, max_bytes, until)
        if cached is not None and cached.batches:
            return cached
        if 0 <= self.high_watermark <= offset and self._poll is not None and not self._poll.done():
            return ReadResult(ErrorCode.NONE, fetch_offset=offset)  # nothing new yet; the poll will tell
        task = self._fetching.get(offset)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._fetch(offset, 0, ""))
            self._fetching[offset] = task
            task.add_done_callback(lambda _t, o=offset: self._fetching.pop(o, None))
        res = await asyncio.shield(task)
        if res.error_code:
            return ReadResult(res.error_code, fetch_offset=offset, log_start_offset=res.log_start_offset)
        return self._cached(offset, max_bytes, until) or ReadResult(ErrorCode.NONE, fetch_offset=offset)

    async def _fetch(self, offset: int, max_wait_ms: int, lane: str) -> FetchResult:
        res = await self.upstream.fetch(self.topic, self.partition, offset, max_bytes=self.fetch_bytes,
                                        max_wait_ms=max_wait_ms, read_committed=self.read_committed, lane=lane)
        if res.error_code == ErrorCode.NONE:
            self._store(offset, res)
        elif res.error_code == ErrorCode.OFFSET_OUT_OF_RANGE:
            # find out where the log starts now (retention or deletion moved it)
            err, start = await self.upstream.list_offset(self.topic, self.partition, -2)
            if not err:
                res.log_start_offset = start
                self.log_start_offset = start
        return res

    def _store(self, offset: int, res: FetchResult) -> None:
        self.high_watermark = res.high_watermark
        self.log_start_offset = res.log_start_offset
        data = res.records if res.records is not None else memoryview(b"")
        batches = split_batches(data)
        if not batches:
            return
        end = batches[-1].last_offset + 1
        lso = res.last_stable_offset if res.last_stable_offset >= 0 else res.high_watermark
        seg = Segment(offset, end, batches, data, lso, res.aborted)
        # drop segments the new one covers entirely, then insert in order
        kept = [s for s in self.segments if not (offset <= s.start and s.end <= end)]
        self.cached_bytes -= sum(s.size for s in self.segments) - sum(s.size for s in kept)
        starts = [s.start for s in kept]
        kept.insert(bisect_right(starts, offset), seg)
        self.segments = kept
        self.cached_bytes += seg.size
        while self.cached_bytes > self.budget_bytes and len(self.segments) > 1:
            # evict the oldest data; a redelivery that needs it fetches it again. Never the
            # segment just stored: a reader behind the cached data (another group, an old
            # redelivery) fetched it to read it, and would otherwise fetch it again forever.
            old = self.segments.pop(1 if self.segments[0] is seg else 0)
            self.cached_bytes -= old.size

    # -- waiting for new data -------------------------------------------------------------------------
    def want_data_from(self, offset: int, max_wait_ms: int) -> None:
        """Make sure a long-polling Fetch at ``offset`` is running; listeners hear when data came."""
        if self._poll is not None and not self._poll.done():
            return
        self._poll = asyncio.get_running_loop().create_task(self._long_poll(offset, max_wait_ms))

    async def _long_poll(self, offset: int, max_wait_ms: int) -> None:
        lane = f"poll:{self.topic.name}:{self.partition}:{int(self.read_committed)}"
        res = await self._fetch(offset, max(max_wait_ms, 0), lane)
        if res.error_code or split_batches(res.records or memoryview(b"")):
            for notify in list(self.listeners):
                notify()
        elif res.error_code == ErrorCode.NONE:
            # the wait ran out with nothing new: wake nobody (their own deadline will)
            pass

    def close(self) -> None:
        if self._poll is not None:
            self._poll.cancel()
