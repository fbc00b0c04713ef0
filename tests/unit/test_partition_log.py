"""The partition log cache (kshare.share.partition_log) against an in-memory upstream.

What it must do: serve reads of cached batches exactly as the log holds them (raw bytes, never
decoded), at a cost that does not grow with the number of cached batches; evict the oldest data
but never what was just fetched; wake listeners as soon as a long poll brings data, keep polling
while anybody listens, and cope with a broker that neither answers long polls early nor finds
data within a short MaxWaitMs (Tansu).
"""

from __future__ import annotations

import asyncio
import gc
import random
import struct
import time
import weakref

import pytest

from kshare.share import partition_log as pl
from kshare.share.errors import ErrorCode
from kshare.share.partition_log import PartitionLog
from kshare.share.records import Batch, split_batches
from kshare.share.upstream import FetchResult, TopicInfo

_HEADER = struct.Struct(">qiibIhiqqqhii")


def batch_bytes(base: int, count: int = 1, payload: int = 40, ts: int = 0, attributes: int = 0,
                producer_id: int = -1) -> bytes:
    """A v2 record batch: a valid header and ``payload`` opaque bytes (never decoded)."""
    body = bytes([base % 251]) * payload
    length = _HEADER.size - 12 + len(body)
    return _HEADER.pack(base, length, 0, 2, 0, attributes, count - 1, ts, ts, producer_id, 0, 0, count) + body


class FakeUpstream:
    """A partition log in memory, fetched like Kafka: the batch holding the offset first, at least
    one batch, long polls answered as soon as data comes (``wakes``), or only when their wait runs
    out (``wakes=False``: Tansu); ``slow_scan_ms``: a broker that answers empty when MaxWaitMs is
    shorter than that while there is data to find (Tansu's in-memory scan); ``holds``: one that,
    having found data, answers only when MaxWaitMs runs out (Tansu keeps collecting the batches
    that come meanwhile)."""

    def __init__(self, *, wakes: bool = True, slow_scan_ms: float = 0.0, holds: bool = False) -> None:
        self.batches: list[tuple[int, int, bytes]] = []  # base, last, bytes
        self.end = 0
        self.start = 0
        self.wakes = wakes
        self.slow_scan_ms = slow_scan_ms
        self.holds = holds
        self.in_flight = self.max_in_flight = 0
        self.fetches: list[tuple[int, int, str]] = []  # offset, max wait, lane
        self._arrived = asyncio.Event()

    @classmethod
    def holding(cls, batches: int, count: int = 1, *, payload: int = 40) -> FakeUpstream:
        """A log of ``batches`` batches of ``count`` records each, with nothing between them."""
        up = cls()
        for _ in range(batches):
            up.append(count, payload=payload)
        return up

    def append(self, count: int = 1, *, payload: int = 40, gap: int = 0, ts: int | None = None) -> None:
        base = self.end + gap
        stamp = ts if ts is not None else int(time.monotonic() * 1000)
        self.batches.append((base, base + count - 1, batch_bytes(base, count, payload, stamp)))
        self.end = base + count
        self._arrived.set()
        self._arrived = asyncio.Event()

    def _collect(self, offset: int, max_bytes: int) -> bytes:
        out = []
        size = 0
        for _base, last, data in self.batches:
            if last < offset:
                continue
            if out and size + len(data) > max_bytes:
                break
            out.append(data)
            size += len(data)
        return b"".join(out)

    async def fetch(self, topic, partition, offset, *, max_bytes=1 << 20, max_wait_ms=0, read_committed=False,
                    lane=""):
        self.fetches.append((offset, max_wait_ms, lane))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._fetch(offset, max_bytes, max_wait_ms)
        finally:
            self.in_flight -= 1

    async def _fetch(self, offset, max_bytes, max_wait_ms):
        if offset < self.start or offset > self.end:
            return FetchResult(ErrorCode.OFFSET_OUT_OF_RANGE)
        if offset < self.end:
            if self.slow_scan_ms and max(max_wait_ms, 1) < self.slow_scan_ms:
                await asyncio.sleep(max(max_wait_ms, 1) / 1000)
                return FetchResult(ErrorCode.NONE, self.end, self.end, self.start, [], memoryview(b""))
            if self.holds:
                await asyncio.sleep(max(max_wait_ms, 1) / 1000)
            data = self._collect(offset, max_bytes)
            return FetchResult(ErrorCode.NONE, self.end, self.end, self.start, [], memoryview(data))
        wait = max(max_wait_ms, 1) / 1000
        if self.wakes:
            try:
                await asyncio.wait_for(self._arrived.wait(), wait)
            except TimeoutError:
                pass
        else:
            await asyncio.sleep(wait)
        data = self._collect(offset, max_bytes) if offset < self.end else b""
        return FetchResult(ErrorCode.NONE, self.end, self.end, self.start, [], memoryview(data))

    async def list_offset(self, topic, partition, timestamp):
        return ErrorCode.NONE, self.start


class SlowUpstream(FakeUpstream):
    """Each Fetch takes 20 ms: a read that waits for one shows."""

    async def _fetch(self, offset, max_bytes, max_wait_ms):
        await asyncio.sleep(0.02)
        return await super()._fetch(offset, max_bytes, max_wait_ms)


TOPIC = TopicInfo("t", b"\x01" * 16, [1])


def make_log(up: FakeUpstream, **kw) -> PartitionLog:
    return PartitionLog(up, TOPIC, 0, False, **kw)  # type: ignore[arg-type]


def offsets(read) -> list[tuple[int, int]]:
    return [(b.base_offset, b.last_offset) for b, _ in read.batches]


# --------------------------------------------------------------------------------------------
# reads, stores, eviction


def test_cached_small_fetches_leave_nothing_for_the_garbage_collector() -> None:
    """Every object the collector tracks is visited by each full collection, which stops the proxy:
    a cache of 1-record fetches must not hold one per batch or per fetch (it held ~100,000, and
    full collections took 40-80 ms). Large fetches stay views of the response (no copy)."""
    async def main() -> None:
        up = FakeUpstream()
        plog = make_log(up)
        for i in range(2000):
            up.append(count=1)
            read = await plog.read(i, 1 << 20)
            assert offsets(read) == [(i, i)]
        gc.collect()  # the collector untracks plain tuples of untracked values when it meets them
        runs = plog._runs
        assert sum(len(r.batches) for r in runs) == 2000
        assert not any(gc.is_tracked(b) or gc.is_tracked(buf) for r in runs for b, buf in zip(r.batches, r.bufs, strict=True))
        read = await plog.read(0, 1 << 20)  # reads still hand out Batch named tuples
        assert isinstance(read.batches[0][0], Batch) and read.batches[0][0].base_offset == 0

        big = FakeUpstream()
        for _ in range(4):
            big.append(count=10, payload=pl.COPY_BELOW // 2)
        blog = make_log(big)
        read = await blog.read(0, 1 << 24)
        assert len(read.batches) == 4 and all(isinstance(v, memoryview) for _, v in read.batches)

    asyncio.run(main())


def test_reads_return_the_logs_batches_byte_for_byte() -> None:
    async def main() -> None:
        up = FakeUpstream()
        for i in range(50):
            up.append(count=1 + i % 3, gap=1 if i % 7 == 6 else 0)
        plog = make_log(up)
        read = await plog.read(0, 1 << 20)
        assert read.error_code == 0 and read.fetch_offset == 0
        assert b"".join(bytes(d) for _, d in read.batches) == up._collect(0, 1 << 20)
        assert offsets(read) == [(b, z) for b, z, _ in up.batches]
        # from the middle of a batch: that batch first; from a gap: the next batch
        base, last, _ = up.batches[10]
        assert offsets(await plog.read(last, 1 << 20))[0] == (base, last)
        gap_start = next(up.batches[i][1] + 1 for i in range(len(up.batches) - 1)
                         if up.batches[i + 1][0] > up.batches[i][1] + 1)
        first = offsets(await plog.read(gap_start, 1 << 20))[0]
        assert first[0] > gap_start
        assert len(up.fetches) == 1  # all from the cache

    asyncio.run(main())


def test_read_limits_bytes_and_until() -> None:
    async def main() -> None:
        up = FakeUpstream.holding(20, payload=40)
        plog = make_log(up)
        await plog.read(0, 1 << 20)
        size = len(up.batches[0][2])
        assert len((await plog.read(0, 3 * size)).batches) == 3
        assert len((await plog.read(0, 1)).batches) == 1  # always at least one
        assert offsets(await plog.read(5, 1 << 20, until=8)) == [(5, 5), (6, 6), (7, 7)]
        assert offsets(await plog.read(5, 1 << 20, until=5)) == [(5, 5)]

    asyncio.run(main())


def test_appended_fetches_join_one_run_and_reads_cross_touching_runs() -> None:
    async def main() -> None:
        up = FakeUpstream()
        plog = make_log(up)
        for i in range(100):
            up.append()
            read = await plog.read(i, 1 << 20)
            assert offsets(read) == [(i, i)]
        assert plog.covered() == [(0, 100)]
        assert offsets(await plog.read(0, 1 << 20)) == [(k, k) for k in range(100)]
        # a reader behind an evicted region fetches it again: a run of its own, touching the next
        plog2 = make_log(up)
        await plog2.read(50, 1 << 20)
        plog2.fetch_bytes = 5 * len(up.batches[0][2])
        await plog2.read(10, 1 << 20)
        assert plog2.covered() == [(10, 15), (50, 100)]
        plog2.fetch_bytes = 1 << 20
        await plog2.read(15, 1 << 20)  # 15..19, read ahead already; it reads ahead again
        while plog2._fetching:
            await asyncio.sleep(0)
        assert plog2.covered() == [(10, 50), (50, 100)]  # the gap filled up to the next run
        assert offsets(await plog2.read(10, 1 << 20)) == [(k, k) for k in range(10, 100)]

    asyncio.run(main())


def test_overlapping_fetches_keep_one_copy_of_each_batch() -> None:
    async def main() -> None:
        up = FakeUpstream.holding(30)
        plog = make_log(up)
        size = len(up.batches[0][2])
        await plog.read(10, 10 * size)  # 10..19
        await plog._fetch(0, 0, "")  # 0..29, overlapping both sides
        await plog._fetch(5, 0, "")
        assert plog.covered() == [(0, 10), (10, 30)]
        assert plog.cached_batches == 30
        assert plog.cached_bytes == 30 * (size + pl.BATCH_OVERHEAD)
        assert offsets(await plog.read(0, 1 << 20)) == [(k, k) for k in range(30)]

    asyncio.run(main())


def test_eviction_drops_the_oldest_never_what_was_just_fetched() -> None:
    async def main() -> None:
        up = FakeUpstream.holding(200, payload=100)
        size = len(up.batches[0][2]) + pl.BATCH_OVERHEAD
        plog = make_log(up, budget_bytes=50 * size, fetch_bytes=1 << 20)
        await plog.read(0, 1 << 20)  # all 200 fetched at once: kept although over budget
        assert plog.cached_batches == 200
        up.append(payload=100)
        await plog.read(200, 1 << 20)
        assert plog.cached_batches == 50 and plog.cached_bytes == 50 * size
        assert plog.covered() == [(151, 201)]
        # a reader far behind: what it fetched stays, the oldest of the rest goes
        plog.fetch_bytes = 10 * (size - pl.BATCH_OVERHEAD)
        read = await plog.read(3, 1 << 20)
        assert offsets(read)[0] == (3, 3)
        assert plog.covered()[0] == (3, 13)
        assert plog.cached_bytes <= 50 * size
        assert offsets(await plog.read(3, 1 << 20)) == [(k, k) for k in range(3, 13)]

    asyncio.run(main())


def test_eviction_drops_the_least_recently_used_stretch_first() -> None:
    """A new group (or a reset) reads from the start of a partition whose end is cached: under
    pressure the old end goes first, not the data just read ahead for that group (before, the
    lowest batches went first, and one consumer re-reading 16 partitions found one read in eight
    evicted before it got there)."""
    async def main() -> None:
        up = FakeUpstream.holding(100, payload=100)
        size = len(up.batches[0][2])
        plog = make_log(up, budget_bytes=1 << 20, fetch_bytes=30 * size)
        await plog.read(70, 1 << 20, later=[])  # the end: 70..99
        await plog.read(0, 10 * size, later=[])  # a reader from the start: 0..29 fetched
        await plog.read(10, 10 * size, later=[])
        assert plog.covered() == [(0, 30), (70, 100)]
        plog.trim(25 * (size + pl.BATCH_OVERHEAD))  # the budget shrinks (more logs in use)
        assert plog.covered() == [(5, 30)]  # the end first, then the oldest of the stretch in use
        fetches = len(up.fetches)
        assert offsets(await plog.read(20, 10 * size, later=[]))[0] == (20, 20)
        assert len(up.fetches) == fetches

    asyncio.run(main())


def test_evicted_batches_let_go_of_their_fetched_buffers_at_once() -> None:
    """The record cache keeps slices of the Fetch responses. A response's buffer must be free as
    soon as its last batch is evicted, not at a later compaction of the cache's lists: before,
    evicted batches held up to as much memory again as the budget, and the buffers of new
    Fetches came from fresh pages (page faults on the share fetch path)."""

    class Tracking(FakeUpstream):
        def __init__(self) -> None:
            super().__init__()
            self.responses: list[weakref.ref] = []

        async def _fetch(self, offset, max_bytes, max_wait_ms):
            res = await super()._fetch(offset, max_bytes, max_wait_ms)
            self.responses.append(weakref.ref(res.records))
            return res

    async def main() -> None:
        up = Tracking()
        for _ in range(200):
            up.append(payload=10_000)
        fetch = 10 * len(up.batches[0][2])
        assert fetch >= pl.COPY_BELOW  # cached as slices of the response, not copies
        plog = make_log(up, budget_bytes=3 * fetch + 100, fetch_bytes=fetch)
        offset = 0
        while offset < 200:
            read = await plog.read(offset, fetch)
            offset = read.batches[-1][0].last_offset + 1
            del read
            alive = sum(1 for r in up.responses if r() is not None)
            assert alive <= 5, f"{alive} of {len(up.responses)} fetched buffers still held at offset {offset}"
            assert plog.cached_bytes <= 3 * fetch + 100
        assert len(up.responses) >= 20

    asyncio.run(main())


def test_sequential_reads_find_the_next_data_fetched_ahead() -> None:
    """A consumer reading as fast as it can must not wait for a Fetch round trip every few share
    fetches: when the cached data after a read runs low and the cluster has more, the next Fetch
    starts in the background. Only the first read waits; the cache stays within its budget."""
    async def main() -> None:
        up = SlowUpstream()
        for _ in range(120):
            up.append(count=10, payload=8000)  # 8 batches per 64 KiB Fetch
        budget = 256 << 10
        plog = make_log(up, fetch_bytes=64 << 10, budget_bytes=budget)
        size = len(up.batches[0][2])
        offset, waited = 0, 0
        loop = asyncio.get_running_loop()
        while offset < up.end:
            t0 = loop.time()
            read = await plog.read(offset, 2 * size)
            if loop.time() - t0 >= 0.015:
                waited += 1
            assert read.batches and read.batches[0][0].base_offset == offset
            offset = read.batches[-1][0].last_offset + 1
            assert plog.cached_bytes <= budget + 64 << 10
            await asyncio.sleep(0.015)  # the consumer's work between share fetches
        assert waited == 1, f"{waited} reads waited for a Fetch"
        fetched = [o for o, _, _ in up.fetches]
        assert fetched == sorted(set(fetched))  # each offset fetched once, in order

        # a log the cluster has no more data for starts nothing
        done = len(up.fetches)
        await plog.read(up.end - 10, 1 << 20)
        await asyncio.sleep(0.05)
        assert len(up.fetches) == done

    asyncio.run(main())


async def reads_that_waited(plog: PartitionLog, end: int, read_bytes: int, work_s: float) -> int:
    """A consumer reading the log from 0 to ``end``, ``read_bytes`` a read with ``work_s`` between
    reads: how many reads waited for a Fetch (SlowUpstream's 20 ms)."""
    offset, waited = 0, 0
    loop = asyncio.get_running_loop()
    while offset < end:
        t0 = loop.time()
        read = await plog.read(offset, read_bytes)
        if loop.time() - t0 >= 0.015:
            waited += 1
        offset = read.batches[-1][0].last_offset + 1
        await asyncio.sleep(work_s)
    return waited


def test_a_reader_taking_whole_fetches_gets_reads_ahead_too() -> None:
    """A share consumer asking for as many bytes as one Fetch brings (1 KiB records: ~1 MB either
    way) takes all of each Fetch: its reads never find data cached past them, so read-ahead must
    start after a read that waited as well, not only after cache hits (it waited for every one)."""
    async def main() -> None:
        up = SlowUpstream()
        for _ in range(64):
            up.append(count=10, payload=8000)
        fetch = 64 << 10
        plog = make_log(up, fetch_bytes=fetch, budget_bytes=1 << 20)
        # exactly what one Fetch brings per read, 30 ms of the consumer's work between share fetches
        waited = await reads_that_waited(plog, up.end, fetch, 0.03)
        assert waited == 1, f"{waited} of {len(up.fetches)} reads waited for a Fetch"

    asyncio.run(main())


def test_read_ahead_asks_one_fetch_and_keeps_a_fetch_worth_ahead_of_small_reads() -> None:
    """A read-ahead asks for one Fetch's worth, never more (a large Fetch response in flight slows
    the state writes share fetches wait for), and small reads start it while less than a Fetch's
    worth is cached past them, so it arrives before they get there: only the first read waits."""
    class Sized(SlowUpstream):
        def __init__(self) -> None:
            super().__init__()
            self.asked: list[int] = []

        async def _fetch(self, offset, max_bytes, max_wait_ms):
            self.asked.append(max_bytes)
            return await super()._fetch(offset, max_bytes, max_wait_ms)

    async def main() -> None:
        up = Sized()
        for _ in range(400):
            up.append(count=5, payload=400)  # ~2 KB batches
        fetch = 64 << 10
        plog = make_log(up, fetch_bytes=fetch, budget_bytes=4 << 20)
        # two batches a read (1/16 of a Fetch); a Fetch (20 ms) takes five reads' time
        waited = await reads_that_waited(plog, up.end, 4 << 10, 0.004)
        assert waited == 1, f"{waited} of {len(up.asked)} reads waited for a Fetch"
        assert max(up.asked) <= fetch, up.asked

    asyncio.run(main())


def test_a_miss_asks_for_a_small_fetch_and_read_aheads_for_large_ones() -> None:
    """With room in the cache, a read-ahead asks for READ_AHEAD_BYTES, while a read that waits asks
    for no more than MISS_FETCH_BYTES (it comes sooner); a log whose share of the cache is small
    asks for less, never below MIN_FETCH_BYTES."""
    class Sized(FakeUpstream):
        def __init__(self) -> None:
            super().__init__()
            self.asked: list[tuple[int, int]] = []

        async def _fetch(self, offset, max_bytes, max_wait_ms):
            self.asked.append((offset, max_bytes))
            return await super()._fetch(offset, max_bytes, max_wait_ms)

    async def main() -> None:
        up = Sized()
        for _ in range(200):
            up.append(count=100, payload=100_000)  # ~100 KB batches, 20 MB in all
        plog = make_log(up, budget_bytes=64 << 20)
        assert pl.MISS_FETCH_BYTES <= pl.READ_AHEAD_BYTES
        read = await plog.read(0, 200 << 10)
        assert up.asked == [(0, pl.MISS_FETCH_BYTES)]
        await asyncio.sleep(0.01)
        ahead = read.batches[-1][0].last_offset + 1
        assert up.asked[1:] == [(up.asked[1][0], pl.READ_AHEAD_BYTES)] and up.asked[1][0] > ahead
        # what the read-ahead brought is read from the cache (READ_AHEAD_BYTES of 100 KB batches)
        start = up.asked[1][0]
        inside = start + (pl.READ_AHEAD_BYTES // 100_000 - 2) * 100 + 50
        read = await plog.read(inside, 200 << 10)
        assert offsets(read)[0][0] <= inside <= offsets(read)[0][1]
        assert [o for o, _ in up.asked].count(inside) == 0

        small = make_log(Sized(), budget_bytes=100 << 10)
        assert small.fetch_bytes == 100 << 10
        tiny = make_log(Sized(), budget_bytes=1 << 10)
        assert tiny.fetch_bytes == pl.MIN_FETCH_BYTES

    asyncio.run(main())


@pytest.mark.parametrize("budget_mb", [2, 3, 4, 6])
def test_a_log_with_a_few_megabytes_of_cache_still_reads_ahead(budget_mb: int) -> None:
    """With 64 logs in use, the default 256 MB cache gives each 4 MB: its read-aheads shrink to half
    of that (a read-ahead needs room for what is read and what comes ahead) instead of stopping,
    as 4 MB Fetches in a 4 MB share would. Only the first read of a whole-log reader waits."""
    async def main() -> None:
        up = SlowUpstream()
        for _ in range(600):
            up.append(count=10, payload=20_000)  # 20 KB batches, 12 MB in all
        budget = budget_mb << 20
        plog = make_log(up, budget_bytes=budget, fetch_bytes=4 << 20)
        assert plog.fetch_bytes == budget // 2
        # 10 batches a read; a Fetch (20 ms) takes a few reads' time
        waited = await reads_that_waited(plog, up.end, 200 << 10, 0.01)
        assert waited == 1, f"{waited} of {len(up.fetches)} reads waited for a Fetch"
        assert plog.cached_bytes <= budget + plog.fetch_bytes

    asyncio.run(main())


def test_fetch_sizes_follow_the_share_of_the_cache() -> None:
    mb = 1 << 20
    assert pl.fetch_size(4 * mb, 64 * mb) == 4 * mb
    assert pl.fetch_size(4 * mb, 5 * mb) == 5 * mb // 2
    assert pl.fetch_size(4 * mb, 2 * mb) == mb
    assert pl.fetch_size(4 * mb, 1536 << 10) == mb  # below two misses' Fetches: as before, 1 MB at most
    assert pl.fetch_size(4 * mb, 300 << 10) == 300 << 10
    assert pl.fetch_size(4 * mb, 1 << 10) == pl.MIN_FETCH_BYTES
    assert pl.fetch_size(64 << 10, 4 * mb) == 64 << 10  # never more than the log's own limit


def test_a_read_ahead_put_off_starts_when_asked_and_only_if_still_needed() -> None:
    """A share fetch that waits for its acknowledgements' writes puts its reads' read-aheads off
    (``later``): no Fetch starts until it calls ``fetch_ahead``, which then fetches the data after
    the cached stretch; asked again once another Fetch brought that data, it fetches nothing."""
    async def main() -> None:
        up = SlowUpstream()
        for _ in range(120):
            up.append(count=10, payload=8000)  # 8 batches per 64 KiB Fetch
        plog = make_log(up, fetch_bytes=64 << 10, budget_bytes=1 << 20)
        size = len(up.batches[0][2])
        later: list = []
        read = await plog.read(0, 2 * size, later=later)  # a miss: it waits for the first Fetch
        assert offsets(read)[0][0] == 0 and len(up.fetches) == 1
        assert [log for log, _ in later] == [plog]
        ahead = later[0][1]
        assert ahead == up.fetches[0][0] + 80  # right after what the first Fetch brought
        read = await plog.read(20, 2 * size, later=later)  # a hit: its read-ahead is put off as well
        await asyncio.sleep(0.05)
        assert len(up.fetches) == 1, "a read-ahead started although the caller put it off"
        assert {o for _, o in later} == {ahead}

        plog.fetch_ahead(ahead)
        plog.fetch_ahead(ahead)  # one Fetch per offset
        await asyncio.sleep(0.05)
        assert [o for o, _, _ in up.fetches] == [0, ahead]
        plog.fetch_ahead(ahead)  # cached now: nothing to fetch
        await asyncio.sleep(0.05)
        assert len(up.fetches) == 2
        read = await plog.read(ahead, 2 * size)
        assert offsets(read)[0][0] == ahead

    asyncio.run(main())


def test_many_logs_stay_within_one_budget_least_recently_used_first() -> None:
    """Each log keeps at least its last fetch, so 400 logs of 64 KiB fetches alone would hold
    25 MB: with one CachePool of 4 MB they hold no more than that together, the logs read longest
    ago give up their batches first, and the one just read keeps what it fetched."""
    async def main() -> None:
        budget = 4 << 20
        pool = pl.CachePool(budget)
        logs = []
        for i in range(400):
            up = FakeUpstream.holding(20, count=10, payload=8000)
            plog = PartitionLog(up, TopicInfo(f"t{i}", bytes([i % 256]) * 16, [1]), 0, False,  # type: ignore[arg-type]
                                fetch_bytes=64 << 10, budget_bytes=budget // 4, pool=pool)
            plog.last_used = float(i)
            read = await plog.read(0, 1 << 20)
            assert read.batches
            logs.append(plog)
            assert pool.total == sum(lg.cached_bytes for lg in logs)
            assert pool.total <= budget
        assert logs[-1].cached_bytes > 0  # the one just read keeps its fetch
        assert logs[0].cached_bytes == 0  # the least recently used gave theirs up
        pool.remove(logs[-1])
        assert pool.total == sum(lg.cached_bytes for lg in logs[:-1])

    asyncio.run(main())


def test_a_read_in_a_gap_is_served_from_the_cache_next_time() -> None:
    async def main() -> None:
        up = FakeUpstream.holding(5)
        up.append(gap=3)  # offsets 5-7 missing upstream (compacted)
        up.append()
        plog = make_log(up)
        await plog._fetch(8, 0, "")
        assert plog.covered() == [(8, 10)]
        assert offsets(await plog.read(6, 1 << 20)) == [(8, 8), (9, 9)]
        assert plog.covered() == [(6, 10)]
        fetches = len(up.fetches)
        assert offsets(await plog.read(6, 1 << 20)) == [(8, 8), (9, 9)]
        assert len(up.fetches) == fetches

    asyncio.run(main())


def test_read_committed_reads_carry_the_lso_and_the_aborted_transactions_of_their_fetches() -> None:
    async def main() -> None:
        up = FakeUpstream()
        plog = PartitionLog(up, TOPIC, 0, True)  # type: ignore[arg-type]
        first = b"".join(batch_bytes(i) for i in range(10))
        second = b"".join(batch_bytes(i) for i in range(10, 20))
        plog._store(0, FetchResult(0, 30, 12, 0, [(7, 3)], memoryview(first)))
        plog._store(10, FetchResult(0, 30, 20, 0, [(9, 15)], memoryview(second)))
        read = await plog.read(0, 1 << 20, None)
        assert len(read.batches) == 20 and read.lso == 20 and read.aborted == [(7, 3), (9, 15)]
        read = await plog.read(12, 1 << 20, None)
        assert read.lso == 20 and read.aborted == [(9, 15)]
        size = len(batch_bytes(0))
        read = await plog.read(2, 3 * size, None)
        # the highest LSO heard: every cached batch lies below the LSO of the fetch that brought it
        assert read.lso == 20 and read.aborted == [(7, 3)]

    asyncio.run(main())


def test_matches_a_model_under_random_fetches_reads_and_eviction() -> None:
    """Whatever the order of fetches, reads and evictions, a read returns consecutive batches of
    the log from the one holding the offset, and the byte count matches the batches cached."""

    async def main(seed: int) -> None:
        rnd = random.Random(seed)
        up = FakeUpstream()
        for _ in range(400):
            up.append(count=rnd.choice([1, 1, 1, 3]), payload=rnd.randrange(10, 200), gap=rnd.choice([0] * 9 + [2]))
        log_batches = [(b, z) for b, z, _ in up.batches]
        data = {b: d for b, _, d in up.batches}
        plog = make_log(up, budget_bytes=rnd.choice([4000, 20000, 1 << 20]), fetch_bytes=rnd.choice([300, 3000]))
        wholes = 0
        for _ in range(300):
            offset = rnd.randrange(0, up.end)
            until = rnd.choice([None, offset + rnd.randrange(1, 30)])
            read = await plog.read(offset, rnd.choice([1, 500, 5000]), until)
            got = offsets(read)
            assert got, (seed, offset)
            i = next(k for k, (_, z) in enumerate(log_batches) if z >= offset)
            assert got == log_batches[i:i + len(got)], (seed, offset)
            for b, view in read.batches:
                assert bytes(view) == data[b.base_offset]
            if read.whole is not None:  # one slice of every batch read, byte for byte
                assert bytes(read.whole) == b"".join(data[b.base_offset] for b, _ in read.batches)
            wholes += read.whole is not None
            if until is not None:
                assert all(b < until for b, _ in got[1:])
            cached = [Batch._make(b) for run in plog._runs for b in run.batches[run.head:]]
            assert plog.cached_batches == len(cached)
            assert plog.cached_bytes == sum(b.end - b.start + pl.BATCH_OVERHEAD for b in cached)
            spans = plog.covered()
            assert all(a < z for a, z in spans) and all(spans[k][1] <= spans[k + 1][0] for k in range(len(spans) - 1))
            assert plog._starts == [a for a, _ in spans]
        assert wholes > 100  # most reads lie within one fetch

    for seed in range(12):
        asyncio.run(main(seed))


def test_cost_per_batch_does_not_grow_with_the_cache() -> None:
    """200,000 single-record batches, each fetched and read on its own (a producer of tiny
    batches and a consumer keeping up): the last 20,000 cost about what the first 20,000 did."""

    async def main() -> list[float]:
        up = FakeUpstream()
        plog = make_log(up, budget_bytes=64 << 20)
        blocks = []
        n = 0
        for _ in range(10):
            t0 = time.perf_counter()
            for _ in range(20_000):
                up.batches = [(n, n, batch_bytes(n))]  # the upstream keeps only the new batch
                up.end = n + 1
                await plog._fetch(n, 0, "")
                read = await plog.read(n, 1 << 20, n + 1)
                assert offsets(read) == [(n, n)]
                n += 1
            blocks.append(time.perf_counter() - t0)
        assert plog.covered() == [(0, n)] and plog.cached_batches == n
        # and reads far back in a big cache
        t0 = time.perf_counter()
        for k in range(0, n, 97):
            assert offsets(await plog.read(k, 1 << 20, k + 1)) == [(k, k)]
        blocks.append(time.perf_counter() - t0)
        return blocks

    blocks = asyncio.run(main())
    first, last = min(blocks[:3]), min(blocks[-4:-1])
    assert last < 3 * first, blocks
    assert blocks[-1] < first, blocks


def test_eviction_cost_does_not_grow_with_the_cache() -> None:
    async def main() -> None:
        up = FakeUpstream()
        size = len(batch_bytes(0)) + pl.BATCH_OVERHEAD
        plog = make_log(up, budget_bytes=100_000 * size)
        t0 = time.perf_counter()
        for n in range(300_000):
            up.batches = [(n, n, batch_bytes(n))]
            up.end = n + 1
            await plog._fetch(n, 0, "")
        elapsed = time.perf_counter() - t0
        assert plog.cached_batches == 100_000
        assert plog.covered() == [(200_000, 300_000)]
        assert len(plog._runs[0].batches) < 2 * 100_000  # evicted batches are dropped in bulk
        assert elapsed < 30

    asyncio.run(main())


# --------------------------------------------------------------------------------------------
# long polls


def test_reads_at_the_end_wait_for_no_fetch_while_a_poll_runs() -> None:
    """A share fetch reads its partitions one after the other: a partition it has drained must not
    cost it a Fetch round trip each time. The first read at the end asks the cluster and leaves a
    poll running; until it is done, reads there return at once, and it caches new data as soon
    as the cluster has it."""
    async def main() -> None:
        up = SlowUpstream()
        for _ in range(5):
            up.append()
        plog = make_log(up)
        await plog.read(0, 1 << 20)
        fetches = len(up.fetches)
        assert not (await plog.read(5, 1 << 20)).batches  # asks the cluster once
        for _ in range(20):
            assert not (await plog.read(5, 1 << 20)).batches
        await asyncio.sleep(0.05)
        assert len(up.fetches) == fetches + 2  # that read's Fetch, and the poll's
        assert up.fetches[-1][:2] == (5, pl.POLL_WAIT_MS)
        up.append()
        for _ in range(100):
            if plog.covered()[-1][1] == 6:
                break
            await asyncio.sleep(0.01)
        assert offsets(await plog.read(5, 1 << 20)) == [(5, 5)]
        assert len(up.fetches) == fetches + 2  # the poll brought it
        plog.close()

    asyncio.run(main())


def test_drained_reads_leave_polls_running_on_a_bounded_number_of_logs(monkeypatch) -> None:
    """Each poll has a connection of its own to the broker: past MAX_DRAINED_POLLERS logs, a read
    at the end asks the cluster each time instead (10,000 share-partitions: 11 MB of RSS)."""
    monkeypatch.setattr(pl, "MAX_DRAINED_POLLERS", 2)

    async def main() -> None:
        pool = pl.CachePool(1 << 20)
        ups = [FakeUpstream() for _ in range(3)]
        logs = [PartitionLog(up, TOPIC, 0, False, pool=pool) for up in ups]  # type: ignore[arg-type]
        for up, plog in zip(ups, logs, strict=True):
            up.append()
            await plog.read(0, 1 << 20)
            for _ in range(3):
                assert not (await plog.read(1, 1 << 20)).batches
        await asyncio.sleep(0.01)
        assert [plog._poll is not None for plog in logs] == [True, True, False]
        assert [len(up.fetches) for up in ups] == [3, 3, 4]  # read, end, poll / read, end x 3
        pool.remove(logs[0])  # a log dropped (idle): its place goes to another
        assert not (await logs[2].read(1, 1 << 20)).batches
        await asyncio.sleep(0.01)
        assert logs[2]._poll is not None
        for plog in logs:
            plog.close()

    asyncio.run(main())


async def _listen(plog: PartitionLog) -> asyncio.Event:
    woke = asyncio.Event()
    plog.listeners.add(woke.set)
    return woke


def test_a_long_poll_wakes_listeners_as_soon_as_data_comes_and_keeps_polling() -> None:
    async def main() -> None:
        up = FakeUpstream()
        up.append()
        plog = make_log(up)
        await plog.read(0, 1 << 20)
        woke = await _listen(plog)
        plog.want_data_from(1)
        await asyncio.sleep(0.05)
        assert not woke.is_set()
        t0 = time.perf_counter()
        up.append()
        await asyncio.wait_for(woke.wait(), 1)
        assert time.perf_counter() - t0 < 0.1
        assert offsets(await plog.read(1, 1 << 20)) == [(1, 1)]
        # still listened to: the next poll is already waiting at the new end
        await asyncio.sleep(0.01)
        assert plog._poll is not None and not plog._poll.done() and plog._poll_offset == 2
        assert up.fetches[-1][0] == 2 and up.fetches[-1][1] == pl.POLL_WAIT_MS
        plog.listeners.clear()
        plog.close()

    asyncio.run(main())


def test_a_poll_that_ran_out_empty_polls_again_while_listened_to(monkeypatch) -> None:
    monkeypatch.setattr(pl, "POLL_WAIT_MS", 30)

    async def main() -> None:
        up = FakeUpstream()
        plog = make_log(up)
        woke = await _listen(plog)
        plog.want_data_from(0)
        await asyncio.sleep(0.1)  # three polls ran out
        assert len(up.fetches) >= 3
        up.append()
        await asyncio.wait_for(woke.wait(), 0.2)
        # nobody listens any more: the poll ends at its next answer
        plog.listeners.clear()
        await asyncio.sleep(0.1)
        assert plog._poll.done()

    asyncio.run(main())


def test_two_listeners_each_woken() -> None:
    async def main() -> None:
        up = FakeUpstream()
        plog = make_log(up)
        a, b = await _listen(plog), await _listen(plog)
        plog.want_data_from(0)
        plog.want_data_from(0)  # one poll only
        await asyncio.sleep(0.01)
        up.append()
        await asyncio.wait_for(asyncio.gather(a.wait(), b.wait()), 1)
        assert sum(1 for f in up.fetches if f[2].startswith("poll:")) <= 2
        plog.listeners.clear()
        plog.close()

    asyncio.run(main())


def test_a_broker_that_holds_long_polls_gets_quick_polls() -> None:
    """Tansu answers a long poll only when (half) its wait ran out; after two polls that brought
    batches produced over much of their wait, the log polls with short waits."""

    async def main() -> None:
        up = FakeUpstream(wakes=False)
        plog = make_log(up)
        woke = await _listen(plog)
        plog.want_data_from(0)
        stop = asyncio.Event()

        async def produce() -> None:
            while not stop.is_set():
                up.append()
                await asyncio.sleep(0.005)

        producer = asyncio.create_task(produce())
        deadline = time.monotonic() + 5
        while not plog._quick and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert plog._quick
        # from now on a record waits at most a quick poll
        await asyncio.sleep(0.1)
        waits = [w for _, w, lane in up.fetches[-10:] if lane.startswith("poll:")]
        assert waits and max(waits) <= pl.QUICK_MAX_WAIT_MS
        stop.set()
        await producer
        woke.clear()
        t0 = time.perf_counter()
        up.append()
        await asyncio.wait_for(woke.wait(), 1)
        assert time.perf_counter() - t0 < 0.15
        plog.listeners.clear()
        plog.close()

    asyncio.run(main())


def test_a_kafka_like_broker_keeps_long_polls() -> None:
    async def main() -> None:
        up = FakeUpstream()
        plog = make_log(up)
        woke = await _listen(plog)
        plog.want_data_from(0)
        for _ in range(20):
            await asyncio.sleep(0.03)
            up.append()
            await asyncio.wait_for(woke.wait(), 1)
            woke.clear()
        assert not plog._quick
        plog.listeners.clear()
        plog.close()

    asyncio.run(main())


def test_data_the_broker_did_not_find_in_time_is_fetched_with_time_to_find_it() -> None:
    """Tansu scans its in-memory log on every Fetch and answers empty if MaxWaitMs ran out first:
    when the answer says there is data past the offset, fetch again with more time, growing the
    wait until the data comes."""

    async def main() -> None:
        up = FakeUpstream(slow_scan_ms=20)
        for _ in range(5):
            up.append()
        plog = make_log(up)
        read = await plog.read(0, 1 << 20)
        assert offsets(read) == [(k, k) for k in range(5)]
        waits = [w for _, w, _ in up.fetches]
        assert waits[0] == 0 and waits == sorted(waits)
        assert 20 <= waits[-1] < 20 * pl.FIND_WAIT_GROW + 1 and all(w < 20 for w in waits[:-1])
        # past the known end: a short fetch first (is anything there?), then one with the wait learnt
        up.append()
        n = len(up.fetches)
        assert offsets(await plog.read(5, 1 << 20)) == [(5, 5)]
        assert [w for _, w, _ in up.fetches[n:]][0] == 0
        # known to be there, from a broker known to need the time: the wait learnt at once
        up.append()
        up.append()
        plog.high_watermark = plog.last_stable_offset = 8
        n = len(up.fetches)
        assert offsets(await plog.read(6, 1 << 20)) == [(6, 6), (7, 7)]
        assert all(0 < w < 20 * pl.FIND_WAIT_GROW + 1 for _, w, _ in up.fetches[n:])

    asyncio.run(main())


def test_a_broker_that_holds_fetches_until_max_wait_is_asked_for_no_more_than_it_needs() -> None:
    """Tansu also holds a Fetch that found data until MaxWaitMs runs out (it keeps collecting), so
    the wait given to find data is latency for every record: it must stay near what the broker
    needs (here 20 ms), never DATA_WAIT_MS (5 s: the p99 of kshare on Tansu before)."""

    async def main() -> None:
        up = FakeUpstream(slow_scan_ms=20, holds=True)
        plog = make_log(up, fetch_bytes=len(batch_bytes(0)))  # one batch a fetch: a fetch per read
        for _ in range(40):
            up.append()
        slowest = 0.0
        for k in range(40):
            t0 = time.perf_counter()
            assert offsets(await plog.read(k, 1 << 20)) == [(k, k)]
            slowest = max(slowest, time.perf_counter() - t0)
        waits = [w for _, w, _ in up.fetches]
        assert max(waits) < 20 * pl.FIND_WAIT_GROW ** 2 + 2
        # most fetches ask for about what the broker needs, and few come back empty
        assert 20 <= sorted(waits)[len(waits) // 2] <= 40
        assert len(up.fetches) < 40 * 1.5
        assert slowest < 0.5

    asyncio.run(main())


def test_a_slow_finder_gets_one_fetch_at_a_time_with_pauses() -> None:
    """Each Fetch costs such a broker CPU for as long as it holds it (Tansu: more as the log grows);
    back to back they starved its Produce path. One at a time per partition, each after a pause as
    long as the last one took, whoever asks (the long poll, share fetches)."""

    async def main() -> None:
        up = FakeUpstream(slow_scan_ms=20, holds=True, wakes=False)
        plog = make_log(up, fetch_bytes=len(batch_bytes(0)))
        for _ in range(10):
            up.append()
        assert offsets(await plog.read(0, 1 << 20)) == [(0, 0)]
        assert plog._slow_finder
        woke = await _listen(plog)
        plog.want_data_from(10)
        up.append()
        t0 = time.perf_counter()
        reads = await asyncio.gather(*(plog.read(k, 1 << 20) for k in range(1, 6)))
        elapsed = time.perf_counter() - t0
        assert [offsets(r)[0] for r in reads] == [(k, k) for k in range(1, 6)]
        assert up.max_in_flight == 1
        # five fetches of >= 20 ms each, with pauses as long between them (the poll's among them)
        assert elapsed >= 5 * 0.02 * (1 + pl.SLOW_FINDER_PAUSE) - 0.03
        await asyncio.wait_for(woke.wait(), 2)
        plog.listeners.clear()
        plog.close()

    asyncio.run(main())


def test_kafka_answering_empty_as_a_record_lands_is_no_slow_finder() -> None:
    """Kafka reads the log, then a record lands, then it answers empty with the new high watermark:
    the retry finds the record at once, and the log stays in Kafka mode (no waits, no pacing)."""

    class Racy(FakeUpstream):
        async def fetch(self, topic, partition, offset, **kw):
            if offset == self.end:
                self.append()
                self.fetches.append((offset, kw.get("max_wait_ms", 0), kw.get("lane", "")))
                return FetchResult(ErrorCode.NONE, self.end, self.end, self.start, [], memoryview(b""))
            return await super().fetch(topic, partition, offset, **kw)

    async def main() -> None:
        up = Racy()
        plog = make_log(up)
        for k in range(5):
            assert offsets(await plog.read(k, 1 << 20)) == [(k, k)]
        assert not plog._slow_finder
        assert max(w for _, w, _ in up.fetches) <= pl.FIND_WAIT_MIN_MS

    asyncio.run(main())


def test_kafka_never_gets_a_long_wait_for_data_it_has() -> None:
    """A Fetch waiting in the broker holds every request behind it on that connection: reads of
    data known to be there ask with no wait, as Kafka answers them at once."""

    async def main() -> None:
        up = FakeUpstream()
        plog = make_log(up, fetch_bytes=len(batch_bytes(0)))
        for _ in range(5):
            up.append()
        for k in range(5):
            assert offsets(await plog.read(k, 1 << 20))[0] == (k, k)
        assert all(w == 0 for _, w, _ in up.fetches)

    asyncio.run(main())


@pytest.mark.parametrize("budget", [1, 10_000])
def test_out_of_range_reports_the_log_start(budget: int) -> None:
    async def main() -> None:
        up = FakeUpstream.holding(10)
        up.start = 5
        plog = make_log(up, budget_bytes=budget)
        read = await plog.read(2, 1 << 20)
        assert read.error_code == ErrorCode.OFFSET_OUT_OF_RANGE and read.log_start_offset == 5
        assert offsets(await plog.read(5, 1 << 20))[0] == (5, 5)

    asyncio.run(main())


def test_split_batches_matches_the_helper() -> None:
    data = b"".join(batch_bytes(i * 2, 2, 10) for i in range(5))
    got = split_batches(memoryview(data))
    assert [(b.base_offset, b.last_offset, b.record_count) for b in got] == [(i * 2, i * 2 + 1, 2) for i in range(5)]
