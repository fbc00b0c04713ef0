"""A cache of one topic-partition's raw record batches, fetched from the cluster on demand.

Share-partitions of every group reading a topic-partition share its ``PartitionLog``. The log
keeps the batches of recent Fetch responses (headers parsed, bodies untouched, each a slice of the
fetched bytes) so redeliveries and other groups are served without another round trip, re-reads
from the cluster what was evicted, and keeps one long-polling Fetch running while share fetches
wait, to learn about new data as soon as the cluster has it.

The cached batches are kept in ``_Run``s: stretches of offsets [start, end) of which every batch is
cached (offsets between batches are missing upstream: compacted or aborted-and-cleaned). Fetched
batches that continue a run are appended to it, others open a run of their own; runs never
overlap, and a read continues from one run into the next when they touch. So a read is a bisection
over the runs' starts and one over the run's last offsets, a store costs the new batches and a
bisection, and eviction drops the oldest batches from the front of a run, one at a time: none of
them depends on how many batches or fetches are cached (with 1-record producer batches that is
hundreds of thousands).
"""

from __future__ import annotations

import asyncio
import logging
import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field

from .errors import ErrorCode
from .records import Batch, split_batches
from .tasks import shared_task
from .upstream import FetchResult, TopicInfo, UpstreamCluster

log = logging.getLogger("kshare.share")

# Each cached batch costs Python objects besides its bytes (its ``Batch``, list slots, its last
# offset): counted against the budget so that a cache of tiny batches is bounded too.
BATCH_OVERHEAD = 160
# A long-polling Fetch asks the cluster to wait at most this long; while share fetches still wait
# the next one follows at once. The cluster answers as soon as one byte is there (MinBytes 1), so
# this bounds only how long a poll at an offset nobody wants any more keeps running.
POLL_WAIT_MS = 500
# A Fetch at an offset the cluster is known to have data for, to a broker that gave up at MaxWaitMs
# before it found the data (see PartitionLog._fetch): time to find it, learnt per partition between
# FIND_WAIT_MIN_MS and DATA_WAIT_MS. Such a broker (Tansu) also holds a Fetch that found data until
# MaxWaitMs runs out while more keeps coming, so the wait is what every record waits: as short as
# the broker allows, not DATA_WAIT_MS.
DATA_WAIT_MS = 5000
FIND_WAIT_MIN_MS = 4
FIND_WAIT_GROW = 1.5  # after an empty answer for lack of time
FIND_WAIT_SHRINK = 0.9  # after an answer with data: probe for a shorter wait
# Such a broker spends its CPU on a Fetch for as long as it holds it, and more as its log grows
# (Tansu: ~1 ms per 1,000 batches of the partition): back to back, fetches would take all of it and
# starve its Produce path (acks in seconds, then the records' latency). A partition's next Fetch to
# it starts only after a pause as long as the last one took.
SLOW_FINDER_PAUSE = 1.0
# Brokers that hold a long poll although data arrived (see PartitionLog._learn)
QUICK_WAIT_MS = 2
QUICK_MAX_WAIT_MS = 64
# At most this many logs of a pool keep a long poll running after a read found them drained (each
# poll has a connection of its own to the broker: with thousands of partitions, megabytes); the
# others ask the cluster at each read there, as before.
MAX_DRAINED_POLLERS = 64
# When the logs together exceed the cache budget, they give up batches down to this share of it.
RECLAIM_TO = 0.9
# The records of ShareFetch answers being made, or written but still waiting in the proxy for the
# client's socket to take them, may hold this share of the cache budget besides it (they are
# mostly the cache's own buffers, but an answer keeps what it read after the cache let it go).
# Past it, an answer that has records already takes no more (the client fetches again). Without
# a bound, a thousand members fetching 16 MB each could hold gigabytes; measured with 10,000
# share-partitions, 100 members fetching at once held 110 MB of answers above a 64 MB cache.
ANSWER_SHARE = 0.5
# Read ahead while the cached data after a read holds fewer than this many reads of its size (or
# less than one Fetch's worth).
READ_AHEAD_READS = 2
# The smallest Fetch a log with a small share of the record cache still asks for.
MIN_FETCH_BYTES = 64 << 10
# What a read-ahead asks for when the log's share of the cache allows. A read-ahead starts once the
# answer that wanted it is written, and a megabyte comes in while the client works through those
# records (about 0.8 ms for a megabyte of 1 KiB records): the next answer's acknowledgement write
# seldom meets it. A 4 MB one took about two cycles to come in, and the cycles it overlapped
# took 1.4-1.7x as long (the broker sending, the proxy receiving and the client on 2 cores).
# With warm brokers, one share consumer of 1 KiB records read 1.04-1.17x the records/s with 1 MB
# read-aheads than with 4 MB ones on 1, 4 and 16 partitions (level at 100 B). Cold brokers had
# said otherwise: a Fetch cost a JIT-compiling Kafka 3.9 about 1.1 ms of CPU, so fewer, larger ones
# won then (docs/benchmarks/README.md).
READ_AHEAD_BYTES = 1 << 20
# What a read that found nothing cached asks for: it waits for the answer, and a smaller one comes
# sooner (the read-ahead it starts then brings the rest).
MISS_FETCH_BYTES = 1 << 20
# Evicted batches are dropped from a run's lists in bulk, once this many have accumulated.
_COMPACT_AT = 1024
# Fetched bytes up to this size are cached as a copy (``bytes``), larger ones as the memoryview of
# the response. See ``_Run``: a memoryview is an object the garbage collector tracks, and with
# 1-record producer batches every Fetch brings one, so the cache held tens of thousands.
COPY_BELOW = 64 << 10

# A cached batch is kept as a plain tuple of its ``Batch`` fields, not as the ``Batch`` itself: the
# garbage collector stops tracking a plain tuple of ints, never a named tuple, and every tracked
# object is visited by every full collection. With 1-record producer batches the cache holds tens of
# thousands of them, and each full collection took 40-80 ms: the proxy's latency spikes.
_LAST, _START, _END = Batch._fields.index("last_offset"), Batch._fields.index("start"), Batch._fields.index("end")
_as_batch = tuple.__new__


class _Run:
    """Cached batches covering every offset of [start, end), sorted by offset."""

    __slots__ = ("start", "end", "lasts", "batches", "bufs", "head", "lso", "aborted", "used")

    def __init__(self, start: int, end: int) -> None:
        self.start = start
        self.end = end
        self.lasts: list[int] = []  # last offset of each batch, ascending (bisection)
        self.batches: list[tuple] = []  # each a ``Batch`` as a plain tuple (see _LAST)
        self.bufs: list[memoryview | bytes | None] = []  # the fetched bytes each batch points into (None: evicted)
        self.head = 0  # batches before ``head`` are evicted (dropped from the lists in bulk)
        self.lso = -1  # the highest last stable offset any of its fetches reported
        # aborted transactions per fetch that added batches: (first offset, end, [(producer, first)])
        self.aborted: list[tuple[int, int, list[tuple[int, int]]]] = []
        self.used = 0  # the log's tick when a read or a fetch last touched it (eviction order)

    def add(self, batches: list[Batch], buf: memoryview | bytes, lasts: list[int], lso: int,
            aborted: list[tuple[int, int]]) -> None:
        if aborted and batches:
            self.aborted.append((batches[0].base_offset, batches[-1].last_offset + 1, aborted))
        self.batches += map(tuple, batches)
        self.lasts += lasts
        self.bufs += [buf] * len(batches)
        self.lso = max(self.lso, lso)

    def compact(self) -> None:
        h = self.head
        del self.batches[:h], self.lasts[:h], self.bufs[:h]
        self.head = 0
        if self.aborted:
            self.aborted = [a for a in self.aborted if a[1] > self.start]


@dataclass(slots=True)
class _Fetched:
    error_code: int
    log_start_offset: int
    batches: list[Batch]


def _size(b: tuple) -> int:
    return b[_END] - b[_START] + BATCH_OVERHEAD


@dataclass(slots=True)
class ReadResult:
    error_code: int
    fetch_offset: int = -1
    batches: list[tuple[Batch, memoryview]] = field(default_factory=list)  # batch, its bytes
    lso: int = -1
    aborted: list[tuple[int, int]] = field(default_factory=list)
    log_start_offset: int = -1
    # every batch's bytes as one slice, when they lie next to each other in one fetched buffer
    # (the usual case): a response takes them without joining copies of the batches
    whole: memoryview | bytes | None = None


class CachePool:
    """One budget for the record cache of every partition log: each log keeps within its share of
    it (``PartitionLog.trim``), and when the logs together go over it anyway (each keeps at least
    its last fetch, and with thousands of logs those alone exceed any share) the least recently
    used logs give up their oldest batches first, so memory stays within the budget whatever the
    number of partitions read."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self.total = 0  # cached bytes of every log (with BATCH_OVERHEAD per batch)
        self.logs: set[PartitionLog] = set()
        self.drained_pollers: set[PartitionLog] = set()  # see MAX_DRAINED_POLLERS
        self.answer_bytes = 0  # records held by answers in the making or on their way (ANSWER_SHARE)

    def answer_room(self) -> int:
        """Bytes of records answers may still take (ANSWER_SHARE); <= 0 when they hold their share."""
        return int(self.budget_bytes * ANSWER_SHARE) - self.answer_bytes

    def hold_answer(self, n: int) -> None:
        self.answer_bytes += n

    def release_answer(self, n: int) -> None:
        self.answer_bytes -= n

    def remove(self, log: PartitionLog) -> None:
        self.drained_pollers.discard(log)
        if log in self.logs:
            self.logs.discard(log)
            self.total -= log.cached_bytes

    def may_poll_drained(self, log: PartitionLog) -> bool:
        pollers = self.drained_pollers
        if log in pollers:
            return True
        if len(pollers) < MAX_DRAINED_POLLERS:
            pollers.add(log)
            return True
        return False

    def reclaim(self, keep: PartitionLog, protect: list[tuple[_Run, int]]) -> None:
        """Back under the budget (to RECLAIM_TO of it, so that this is rare): the other logs' oldest
        batches first, least recently used log first; then ``keep``'s, except ``protect``."""
        target = int(self.budget_bytes * RECLAIM_TO)
        for log in sorted(self.logs, key=_last_used):
            if self.total <= target:
                return
            if log is not keep and log.cached_bytes:
                log._evict([], max(0, log.cached_bytes - (self.total - target)))
        if self.total > self.budget_bytes:
            keep._evict(protect, max(0, keep.cached_bytes - (self.total - target)))


def fetch_size(max_fetch_bytes: int, budget_bytes: int) -> int:
    """What a log's Fetches ask for with this share of the cache: at most half of it once that
    holds two misses' Fetches (a read-ahead needs room for what is read and what comes ahead:
    with 64 partitions in use, 4 MB shares, 4 MB Fetches would never read ahead), else at most a
    miss's Fetch and the share itself, never below MIN_FETCH_BYTES."""
    if budget_bytes >= 2 * MISS_FETCH_BYTES:
        return min(max_fetch_bytes, budget_bytes // 2)
    return min(max_fetch_bytes, MISS_FETCH_BYTES, max(MIN_FETCH_BYTES, budget_bytes))


def _last_used(log: PartitionLog) -> float:
    return log.last_used


def _run_used(run: _Run) -> int:
    return run.used


class PartitionLog:
    def __init__(self, upstream: UpstreamCluster, topic: TopicInfo, partition: int, read_committed: bool,
                 *, fetch_bytes: int = READ_AHEAD_BYTES, budget_bytes: int = 16 << 20,
                 pool: CachePool | None = None) -> None:
        self.upstream = upstream
        self.topic = topic
        self.partition = partition
        self.read_committed = read_committed
        self.max_fetch_bytes = fetch_bytes
        self.fetch_bytes = fetch_size(fetch_bytes, budget_bytes)
        self.budget_bytes = budget_bytes
        self._runs: list[_Run] = []  # sorted by start, never overlapping
        self._starts: list[int] = []  # their starts, for bisection
        self.cached_bytes = 0  # bytes of the cached batches + BATCH_OVERHEAD each
        self.cached_batches = 0
        self._tick = 0  # counts reads and stores: a run's ``used`` stamp
        self.high_watermark = -1
        self.last_stable_offset = -1
        self.log_start_offset = -1
        self.listeners: set[Callable[[], None]] = set()  # told when new data arrived
        self._poll: asyncio.Task | None = None
        self._poll_offset = -1  # where the running long poll fetches
        self._quick = False  # the cluster holds long polls although data came: poll with short waits
        self._suspects = 0  # polls in a row that looked so
        self._quick_wait = QUICK_WAIT_MS
        self._slow_finder = False  # the cluster answered empty for lack of time although data was there
        self._find_wait = FIND_WAIT_MIN_MS  # the MaxWaitMs such a cluster needs to find data (learnt)
        self._next_fetch_at = 0.0  # loop time before which no Fetch goes to such a cluster
        self._paced = asyncio.Lock()
        self._fetching: dict[int, asyncio.Task] = {}
        self.last_used = 0.0  # loop time a share fetch last read or waited here (set by the service)
        self.pool = pool
        if pool is not None:
            pool.logs.add(self)

    # -- reads --------------------------------------------------------------------------------------
    def _cached(self, offset: int, max_bytes: int, until: int | None = None) -> ReadResult | None:
        i = bisect_right(self._starts, offset) - 1
        if i < 0:
            return None
        runs = self._runs
        run = runs[i]
        if run.end <= offset:
            return None
        self._tick += 1
        tick = self._tick
        result = ReadResult(ErrorCode.NONE, fetch_offset=offset)
        out = result.batches
        size = 0
        span_buf: memoryview | bytes | None = None  # where the batches so far lie next to each other
        span_start = span_end = 0
        # the first batch holding ``offset`` or later
        j = bisect_left(run.lasts, offset, run.head)
        while True:
            batches, bufs = run.batches, run.bufs
            first = len(out)
            k, n_batches = j, len(batches)
            while k < n_batches:
                b = batches[k]
                n = b[_END] - b[_START]
                if out and (size + n > max_bytes or (until is not None and b[0] >= until)):
                    break
                buf = bufs[k]
                out.append((_as_batch(Batch, b), buf[b[_START]:b[_END]]))
                if span_end >= 0:
                    if span_buf is None:
                        span_buf, span_start, span_end = buf, b[_START], b[_END]
                    elif buf is span_buf and b[_START] == span_end:
                        span_end = b[_END]
                    else:
                        span_end = -1  # not one slice
                size += n
                k += 1
            if len(out) > first:
                run.used = tick
                if run.lso > result.lso:
                    result.lso = run.lso
                if run.aborted:
                    _add_aborted(result.aborted, run.aborted, out[first][0].base_offset, out[-1][0].last_offset)
            if k < n_batches or i + 1 >= len(runs) or runs[i + 1].start != run.end:
                if span_buf is not None and span_end >= 0:
                    result.whole = span_buf[span_start:span_end]
                return result  # stopped by a limit, or at the end of the cached stretch
            i += 1
            run = runs[i]
            j = run.head

    async def read(self, offset: int, max_bytes: int, until: int | None = None,
                   later: list[tuple[PartitionLog, int]] | None = None) -> ReadResult:
        """Batches from ``offset`` on (the first may start before it), from cache or the cluster;
        with ``until``, none starting at or past it (but always at least one).

        ``later``: the read-ahead this read wants is put there as (log, offset), for the caller to
        start with ``fetch_ahead`` once it waits for nothing more, instead of starting now."""
        cached = self._cached(offset, max_bytes, until)
        if cached is not None and cached.batches:
            self._read_ahead(offset, cached, later)
            return cached
        if 0 <= self._readable_end() <= offset and self._poll is not None and not self._poll.done():
            return ReadResult(ErrorCode.NONE, fetch_offset=offset)  # nothing new yet; the poll will tell
        for attempt in range(2):
            res, brought = await asyncio.shield(self._fetch_at(offset, min(self.fetch_bytes, MISS_FETCH_BYTES)))
            if res.error_code:
                return ReadResult(res.error_code, fetch_offset=offset, log_start_offset=res.log_start_offset)
            cached = self._cached(offset, max_bytes, until)
            if cached is not None and cached.batches:
                break
            if not brought or attempt:
                if (not brought and 0 <= self._readable_end() <= offset
                        and (self.pool is None or self.pool.may_poll_drained(self))):
                    # Read up to the end: a poll in the background learns of (and caches) the next
                    # data as soon as the cluster has it, and until it is done the reads here return
                    # at once (above) instead of each waiting for a Fetch that comes back empty: a
                    # share fetch looks at its partitions one after the other, and those it has
                    # drained would otherwise each cost it a round trip (one consumer, 16
                    # partitions: one read in ten, towards the end of the data).
                    self.want_data_from(offset)
                return ReadResult(ErrorCode.NONE, fetch_offset=offset)
            # what it brought was evicted before this read resumed (other fetches of this log
            # landed meanwhile, over its share of the cache): once more
        # after a miss too: a reader taking exactly what each Fetch brings would otherwise never
        # hit the cache, and so never start a read-ahead (every share fetch waiting for a Fetch)
        self._read_ahead(offset, cached, later)
        return cached

    def _fetch_at(self, offset: int, max_bytes: int | None = None) -> asyncio.Task:
        """The Fetch at ``offset``: the one running already, or a new one."""
        task = self._fetching.get(offset)
        if task is None:
            # no wait: the cluster answers at once with what it has (a broker that does not find
            # the data that fast, once seen, gets the time it needs to find it at once)
            wait = self._find_wait if self._slow_finder and self._readable_end() > offset else 0
            task = shared_task(self._fetch(offset, wait, "", max_bytes))
            self._fetching[offset] = task
            task.add_done_callback(lambda _t, o=offset: self._fetching.pop(o, None))
        return task

    def _read_ahead(self, offset: int, read: ReadResult, later: list[tuple[PartitionLog, int]] | None) -> None:
        """A read served ``offset`` on from the cache: if the cached stretch after it holds less
        than READ_AHEAD_READS more such reads, or less than one Fetch's worth of bytes, and the
        cluster has more, fetch the next data now, in the background, so that the next share
        fetches find it cached instead of waiting for a Fetch round trip.

        Each read-ahead asks for one Fetch's worth (``fetch_bytes``, READ_AHEAD_BYTES when the
        log's share of the cache allows), not more. Small reads keep a Fetch's worth ahead, so
        a read-ahead has many reads' time to arrive. (A larger one streams in for longer, beside
        the acknowledgement writes and answers of the share fetches that come meanwhile: see
        READ_AHEAD_BYTES.)

        With ``later`` the read-ahead is put there, not started: a share fetch waiting for the
        durable writes of its acknowledgements starts it once they are done (``fetch_ahead``), so
        that its Fetch response does not stream in while the writes are on their way (1 KiB
        records, one share consumer on 4 partitions: 1.07-1.19x the rate, the share fetch's time
        in the proxy 1.05 ms instead of 1.48)."""
        batches = read.batches
        served_end = batches[-1][0].last_offset + 1
        end = self._end_after(served_end - 1)
        if end >= self._readable_end():
            return
        span = served_end - batches[0][0].base_offset
        nbytes = len(read.whole) if read.whole is not None else sum(len(v) for _, v in batches)
        # in offsets: what READ_AHEAD_READS reads of this size, or fetch_bytes, cover
        enough = max(READ_AHEAD_READS * (served_end - offset), self.fetch_bytes * span // max(1, nbytes))
        if end - served_end >= enough:
            return
        if 2 * self.fetch_bytes > self.budget_bytes:
            return  # this log's share of the cache holds less than the read and the fetch ahead
        if later is not None:
            later.append((self, end))
        else:
            self.fetch_ahead(end)

    def fetch_ahead(self, offset: int) -> None:
        """Fetch one Fetch's worth at ``offset`` in the background, unless a Fetch there runs
        already or (a read-ahead started late) another one brought it meanwhile."""
        if offset in self._fetching or self._slow_finder or offset >= self._readable_end():
            return
        i = bisect_right(self._starts, offset) - 1
        if i >= 0 and self._runs[i].end > offset:
            return
        if self._poll is not None and not self._poll.done() and self._poll_offset == offset:
            return
        self._fetch_at(offset, self.fetch_bytes)  # nobody awaits it yet (shared_task: failures retrieved)

    def _readable_end(self) -> int:
        """Where the data a Fetch may return ends, as last heard (-1 unknown)."""
        return self.last_stable_offset if self.read_committed else self.high_watermark

    async def _fetch(self, offset: int, max_wait_ms: int, lane: str,
                     max_bytes: int | None = None) -> tuple[_Fetched, list[Batch]]:
        """A Fetch at ``offset``, its batches cached; (the result, the batches it brought)."""
        known = self._readable_end()
        res = await self._fetch_once(offset, max_wait_ms, lane, max_bytes)
        retried = False
        while (res.error_code == ErrorCode.NONE and not res.batches and max_wait_ms < DATA_WAIT_MS
               and self._readable_end() > offset):
            # Data is there, but the answer came without it: a broker that gives up when MaxWaitMs
            # runs out before it found the data (Tansu scans its in-memory log for every Fetch, in
            # time growing with the log: ~100 ms at 140,000 batches). Ask again, with more time.
            # (Kafka never does this: it answers with the data it has whatever MaxWaitMs is, so it
            # never sees a long wait here that would hold the requests behind it on the connection.)
            # The wait is learnt, not DATA_WAIT_MS at once: that broker also holds a Fetch that
            # found data until MaxWaitMs ends while new batches keep coming, so a long wait is
            # latency for every record (5 s with DATA_WAIT_MS).
            # Not from one empty answer about data it did not know of before: Kafka says so too when
            # a record lands between its read of the log and its answer; a retry then finds it.
            if not self._slow_finder and (known > offset or retried):
                self._slow_finder = True
                log.info("%s-%d: the cluster answers a Fetch empty when it did not find the data within "
                         "MaxWaitMs; fetching with the wait it needs (learnt, %d-%d ms)", self.topic.name,
                         self.partition, FIND_WAIT_MIN_MS, DATA_WAIT_MS)
            elif max_wait_ms >= self._find_wait:
                self._find_wait = min(DATA_WAIT_MS, int(self._find_wait * FIND_WAIT_GROW) + 1)
            retried = True
            max_wait_ms = self._find_wait
            res = await self._fetch_once(offset, max_wait_ms, lane, max_bytes)
        if res.batches and self._slow_finder and max_wait_ms >= self._find_wait:
            self._find_wait = max(FIND_WAIT_MIN_MS, int(self._find_wait * FIND_WAIT_SHRINK))
        return res, res.batches

    async def _fetch_once(self, offset: int, max_wait_ms: int, lane: str, max_bytes: int | None = None) -> _Fetched:
        max_bytes = max_bytes or self.fetch_bytes
        if self._slow_finder:
            async with self._paced:  # one at a time, each after a pause
                loop = asyncio.get_running_loop()
                delay = self._next_fetch_at - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                started = loop.time()
                try:
                    res = await self.upstream.fetch(self.topic, self.partition, offset, max_bytes=max_bytes,
                                                    max_wait_ms=max_wait_ms, read_committed=self.read_committed,
                                                    lane=lane)
                finally:
                    now = loop.time()
                    self._next_fetch_at = now + (now - started) * SLOW_FINDER_PAUSE
        else:
            res = await self.upstream.fetch(self.topic, self.partition, offset, max_bytes=max_bytes,
                                            max_wait_ms=max_wait_ms, read_committed=self.read_committed, lane=lane)
        batches: list[Batch] = []
        if res.error_code == ErrorCode.NONE:
            batches = self._store(offset, res)
        elif res.error_code == ErrorCode.OFFSET_OUT_OF_RANGE:
            # find out where the log starts now (retention or deletion moved it)
            err, start = await self.upstream.list_offset(self.topic, self.partition, -2)
            if not err:
                res.log_start_offset = start
                self.log_start_offset = start
        return _Fetched(res.error_code, res.log_start_offset, batches)

    # -- the cache ------------------------------------------------------------------------------------
    def _store(self, offset: int, res: FetchResult) -> list[Batch]:
        """Cache what a Fetch at ``offset`` returned; returns its batches."""
        self.high_watermark = res.high_watermark
        self.log_start_offset = res.log_start_offset
        lso = res.last_stable_offset if res.last_stable_offset >= 0 else res.high_watermark
        self.last_stable_offset = lso
        data = res.records if res.records is not None else memoryview(b"")
        batches = split_batches(data)
        if batches and batches[-1].last_offset >= res.high_watermark >= 0 and not self.read_committed:
            # Records at or past the high watermark the answer reports: Tansu reports its last
            # batch's base offset + 1, and Kafka itself may (it reads the high watermark before the
            # log, which a produce can move in between). The records are there: their end counts.
            # Not a deviation to report (upstream_checks' probe decides that), just the better number.
            self.high_watermark = lso = self.last_stable_offset = batches[-1].last_offset + 1
        if batches:
            end = batches[-1].end
            self._insert(offset, batches, bytes(data[:end]) if end < COPY_BELOW else data, lso, res.aborted or [])
        return batches

    def _insert(self, offset: int, batches: list[Batch], data: memoryview | bytes, lso: int,
                aborted: list[tuple[int, int]]) -> None:
        """Add the batches a Fetch at ``offset`` returned: every offset from ``offset`` (or the first
        batch, which may start before it) to the last batch's end is covered by them."""
        start = min(offset, batches[0].base_offset)
        end = batches[-1].last_offset + 1
        lasts = [b.last_offset for b in batches]
        before = self.cached_bytes
        self._tick += 1
        runs, starts = self._runs, self._starts
        i = bisect_right(starts, start) - 1
        prev: _Run | None = None  # the run the next new batches continue, if any
        cursor = start
        if i >= 0 and runs[i].end >= start:
            prev = runs[i]
            cursor = max(cursor, prev.end)
        i += 1  # runs[i]: the first run starting after ``start``
        k = 0  # next new batch to consider
        protect: list[tuple[_Run, int]] = []  # (run, first index) of the batches added now
        while cursor < end:
            gap_end = min(end, runs[i].start) if i < len(runs) else end
            if gap_end > cursor:
                # the new batches in [cursor, gap_end): the log's batch boundaries never change, so
                # a batch continuing a run starts at its end, and none crosses the next run's start
                k = bisect_left(lasts, cursor, k)
                if prev is not None and prev.end == cursor:
                    while k < len(batches) and batches[k].base_offset < cursor:
                        k += 1
                k1 = bisect_left(lasts, gap_end, k)
                if k1 > k:
                    piece = batches[k:k1]
                    if prev is not None and prev.end == cursor:
                        run = prev
                    else:
                        run = _Run(cursor, cursor)
                        runs.insert(i, run)
                        starts.insert(i, cursor)
                        i += 1
                    protect.append((run, len(run.batches)))
                    run.add(piece, data, lasts[k:k1], lso, aborted)
                    run.used = self._tick
                    run.end = gap_end
                    self.cached_bytes += piece[-1].end - piece[0].start + BATCH_OVERHEAD * len(piece)
                    self.cached_batches += len(piece)
                    prev = run
                    k = k1
                elif prev is not None and prev.end == cursor:
                    prev.end = gap_end  # offsets missing upstream, known to be missing
                elif i < len(runs) and runs[i].start == gap_end:
                    starts[i] = runs[i].start = cursor  # the same, just before the next run
                cursor = gap_end
            if i < len(runs) and runs[i].start <= cursor:
                prev = runs[i]
                cursor = max(cursor, prev.end)
                i += 1
        pool = self.pool
        if pool is not None:
            pool.total += self.cached_bytes - before
        if self.cached_bytes > self.budget_bytes:
            self._evict(protect)
        if pool is not None and pool.total > pool.budget_bytes:
            pool.reclaim(self, protect)

    def _evict(self, protect: list[tuple[_Run, int]], target: int | None = None) -> None:
        """Drop cached batches until within budget (or ``target`` bytes): the runs least recently
        read or stored first, the oldest (lowest) batches of each first. Never the batches just
        stored: a reader behind the cached data (another group, an old redelivery) fetched them to
        read them, and would otherwise fetch them again forever.

        By use, not by offset alone: a group reading from the start of a partition whose end is
        cached (a reset, a new group, a replay) reads ahead into a run of its own, below the old
        one; dropping the lowest batches first dropped exactly that read-ahead before the group
        got to it, and the old end stayed (one consumer re-reading 16 partitions with a new group:
        read-aheads after about half of its reads, instead of after nearly all)."""
        limit_bytes = self.budget_bytes if target is None else target
        before = self.cached_bytes
        guarded = {id(run): first for run, first in protect}
        runs = self._runs
        emptied = moved = False
        for run in sorted(runs, key=_run_used) if len(runs) > 1 else list(runs):
            if self.cached_bytes <= limit_bytes:
                break
            limit = guarded.get(id(run), len(run.batches))
            h = run.head
            if h >= limit:
                continue
            bufs = run.bufs
            while h < limit and self.cached_bytes > limit_bytes:
                b = run.batches[h]
                self.cached_bytes -= _size(b)
                self.cached_batches -= 1
                # the fetched buffer goes with its last batch, not at the next compaction: until
                # then the evicted batches held up to as much memory again as the budget
                bufs[h] = None
                h += 1
                run.start = b[_LAST] + 1
            run.head = h
            moved = True
            if h == len(run.batches):
                emptied = True
            elif h >= _COMPACT_AT and h * 2 >= len(run.batches):
                run.compact()
                if id(run) in guarded:  # the caller may evict again with ``protect`` (CachePool.reclaim)
                    protect[:] = [(r, first - h if r is run else first) for r, first in protect]
        if emptied:
            self._runs = runs = [run for run in runs if run.head < len(run.batches)]
        if moved:
            self._starts = [run.start for run in runs]
        if self.pool is not None:
            self.pool.total -= before - self.cached_bytes

    def trim(self, budget_bytes: int) -> None:
        """A new budget (the service divides one among the logs in use): evict down to it now.
        Fetches shrink with it (the batches a Fetch just brought are never evicted at once)."""
        self.budget_bytes = budget_bytes
        self.fetch_bytes = fetch_size(self.max_fetch_bytes, budget_bytes)
        if self.cached_bytes > budget_bytes:
            self._evict([])

    def busy(self) -> bool:
        """Someone waits here or a Fetch is running: not to be dropped."""
        return bool(self.listeners or self._fetching or (self._poll is not None and not self._poll.done()))

    def covered(self) -> list[tuple[int, int]]:
        """The cached stretches of offsets, (start, end) each (for tests and diagnostics)."""
        return [(r.start, r.end) for r in self._runs]

    # -- waiting for new data -------------------------------------------------------------------------
    def want_data_from(self, offset: int, max_wait_ms: int = POLL_WAIT_MS) -> None:
        """Make sure a long-polling Fetch is running while anybody listens, at ``offset`` (or, if one
        runs already, wherever it is); listeners hear as soon as it brought data (or an error).

        ``max_wait_ms`` is not used: the poll asks for at most ``POLL_WAIT_MS`` and, while
        listeners remain, polls again, so a wait that ends empty never leaves a listener deaf.
        """
        if self._poll is not None and not self._poll.done():
            return
        self._poll = asyncio.get_running_loop().create_task(self._long_poll(offset))

    async def _long_poll(self, offset: int) -> None:
        lane = f"poll:{self.topic.name}:{self.partition}:{int(self.read_committed)}"
        loop = asyncio.get_running_loop()
        while True:
            wait = self._quick_wait if self._quick else POLL_WAIT_MS
            if self._slow_finder:
                wait = max(wait, self._find_wait)  # a shorter poll would not find what comes
            self._poll_offset = offset
            started = loop.time()
            res, got = await self._fetch(offset, wait, lane)
            elapsed_ms = (loop.time() - started) * 1000
            self._learn(elapsed_ms, got)
            if res.error_code or got:
                for notify in list(self.listeners):
                    notify()
            if res.error_code or not self.listeners:
                return
            if got:
                # the listeners were woken and will read; the next poll is in flight meanwhile
                offset = max(offset, self._end_after(offset))
            elif elapsed_ms < wait / 2:
                # an empty answer that did not wait (a broker that does not long-poll): no busy loop
                await asyncio.sleep(0.002)

    def _learn(self, elapsed_ms: float, got: list[Batch]) -> None:
        """Some brokers (Tansu) do not answer a long-polling Fetch when data arrives, only when
        their wait runs out or at fixed points of it (Tansu: after half of it): a poll of 500 ms
        would hold records for 250 ms. Kafka answers as soon as MinBytes (1) are there, so a poll
        that waited brings the batch or two that just came. A poll that waited and brought batches
        produced over a good part of its wait, twice in a row, marks the cluster as one of those;
        from then on the polls ask for QUICK_WAIT_MS, doubling up to QUICK_MAX_WAIT_MS while
        nothing comes (an empty Fetch costs the broker little)."""
        if self._quick:
            self._quick_wait = QUICK_WAIT_MS if got else min(self._quick_wait * 2, QUICK_MAX_WAIT_MS)
            return
        if not got or elapsed_ms < 20:
            return  # no evidence: the wait ran out, or the data came (or was there) at once
        first, last = got[0].max_timestamp, got[-1].max_timestamp
        span = last - first if first >= 0 and last >= 0 else 0
        if len(got) >= 3 and span >= 10 and span >= 0.3 * elapsed_ms:
            self._suspects += 1
            if self._suspects >= 2:
                self._quick = True
                self._quick_wait = QUICK_WAIT_MS
                log.info("%s-%d: the cluster holds long-polling fetches although data arrived (a poll "
                         "of %.0f ms brought %d batches produced over %d ms); polling with waits of "
                         "%d-%d ms instead", self.topic.name, self.partition, elapsed_ms, len(got), span,
                         QUICK_WAIT_MS, QUICK_MAX_WAIT_MS)
        else:
            self._suspects = 0

    def _end_after(self, offset: int) -> int:
        """The end of the cached stretch holding ``offset`` (``offset`` if none does)."""
        i = bisect_right(self._starts, offset) - 1
        if i < 0 or self._runs[i].end <= offset:
            return offset
        runs = self._runs
        while i + 1 < len(runs) and runs[i + 1].start == runs[i].end:
            i += 1
        return runs[i].end

    def close(self) -> None:
        if self._poll is not None:
            self._poll.cancel()


def _add_aborted(out: list[tuple[int, int]], pieces: list[tuple[int, int, list[tuple[int, int]]]], lo: int,
                 hi: int) -> None:
    """The aborted transactions of the fetches that brought the batches lo..hi."""
    for first, end, entries in pieces:
        if first > hi:
            break
        if end > lo:
            out.extend(entries)


class PartitionLogs:
    """The partition logs in use, one per (topic id, partition, read_committed), sharing one
    record cache budget: each log in use gets an equal share, and a log nobody read for
    ``idle_s`` is dropped with its cache (``sweep``), so memory follows the partitions in use,
    not every partition ever read."""

    def __init__(self, upstream: UpstreamCluster, budget_bytes: int, idle_s: float) -> None:
        self.upstream = upstream
        self.budget_bytes = budget_bytes
        self.idle_s = idle_s
        self.pool = CachePool(budget_bytes)  # one budget for every partition log's cache
        self.by_key: dict[tuple[bytes, int, bool], PartitionLog] = {}

    def get(self, topic: TopicInfo, partition: int, read_committed: bool) -> PartitionLog:
        k = (topic.topic_id, partition, read_committed)
        plog = self.by_key.get(k)
        if plog is None:
            plog = self.by_key[k] = PartitionLog(self.upstream, topic, partition, read_committed,
                                                 budget_bytes=self.budget_bytes, pool=self.pool)
            self._share_budget()
        plog.last_used = time.monotonic()
        return plog

    def _share_budget(self) -> None:
        """An equal share of the record cache budget for every log in use, effective at once."""
        if self.by_key:
            share = self.budget_bytes // len(self.by_key)
            for plog in self.by_key.values():
                if plog.budget_bytes != share:
                    plog.trim(share)

    def sweep(self) -> None:
        """Drop the logs nobody used for ``idle_s`` (their cache with them), share the budget anew."""
        now = time.monotonic()
        for k, plog in list(self.by_key.items()):
            if now - plog.last_used > self.idle_s and not plog.busy():
                plog.close()
                self.pool.remove(plog)
                del self.by_key[k]
        self._share_budget()

    def close(self) -> None:
        for plog in self.by_key.values():
            plog.close()
