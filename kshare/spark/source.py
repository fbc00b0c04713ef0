"""``ShareSource``: the ``kshare`` PySpark data source (streaming and batch), see docs/guide/spark.md.

Offsets are not positions in a log (a share group hands out whatever is available): a stream's
offset is ``{"stream": id, "batch": n}``, a counter that moves by one per micro-batch. The stream
id is made once by ``initialOffset`` and lives in the checkpoint; each run of the query (a reader
object on the driver) takes a fresh, larger run number and announces it on the commit channel
before any of its tasks read.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.types import StructType

from ..clients.share_member import ACCEPT, RELEASE, Record
from .commits import CommitChannel, Marker
from .options import NO_REUSE_REFUSED, SPECULATION_REFUSED, OptionError, Options, parse
from .worker import Tag, member_host

log = logging.getLogger("kshare.spark")

SCHEMA = ("key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
          "timestampType int, headers array<struct<key:string,value:binary>>, deliveryCount int")


class ShareInputPartition(InputPartition):
    """Everything a task needs: the reader that runs ``read`` is a fresh copy on the executor."""

    def __init__(self, opts: Options, stream: str, run: int, batch: int, index: int) -> None:
        super().__init__(index)
        self.opts, self.stream, self.run, self.batch, self.index = opts, stream, run, batch, index


class ShareSource(DataSource):
    """``spark.dataSource.register(ShareSource)``; then ``spark.readStream.format("kshare")`` or
    ``spark.read.format("kshare")`` with the options in docs/guide/spark.md."""

    default_parallelism: int | None = None  # set by kshare.spark.register(spark)

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        self.opts = parse(options, self.default_parallelism)  # fails fast, on the driver

    @classmethod
    def name(cls) -> str:
        return "kshare"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return ShareBatchReader(self.opts)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return ShareStreamReader(self.opts)


class ShareStreamReader(DataSourceStreamReader):
    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self._run: int | None = None
        self._base = 0
        self._committed = 0
        self._channel: CommitChannel | None = None
        self._new_stream = uuid.uuid4().hex[:16]

    def initialOffset(self) -> dict:
        # Deterministic: Spark asks again when it replays the first micro-batch after a restart.
        return {"batch": 0}

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        # Every trigger is a micro-batch: what the group has available is known only by fetching.
        assert start is not None, "kshare needs pyspark >= 4.2 (latestOffset with a start offset)"
        stream = start.get("stream") or self._new_stream
        self._announce(stream, start["batch"])
        log.debug("kshare: timeline: driver latestOffset -> batch %d", start["batch"] + 1)
        return {"stream": stream, "batch": start["batch"] + 1}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        if end["batch"] <= start["batch"] or "stream" not in end:
            return []
        run = self._announce(end["stream"], start["batch"])
        log.debug("kshare: timeline: driver partitions batch %d", end["batch"])
        return [ShareInputPartition(self.opts, end["stream"], run, end["batch"], i)
                for i in range(self.opts.parallelism)]

    def _announce(self, stream: str, committed: int) -> int:
        """On first use: take a run number larger than any before and tell the workers that
        micro-batches <= ``committed`` are committed (Spark plans from its commit log: they are).
        The stream id is made by the first ``latestOffset`` and then read from the offsets, which
        Spark keeps in the checkpoint."""
        if self._run is None:
            self._channel = CommitChannel(self.opts, stream)
            old = self._channel.read()
            self._run = max(time.time_ns(), old.run + 1 if old else 0)
            self._base = self._committed = committed
            self._channel.write(Marker(self._run, self._base, self._committed))
            log.info("kshare: stream %s run %d starts after micro-batch %d (previous marker %s)",
                     stream, self._run, self._base, old)
        return self._run

    def commit(self, end: dict) -> None:
        """Cumulative and idempotent: the marker only moves forward."""
        if "stream" not in end:
            return
        self._announce(end["stream"], end["batch"])
        if end["batch"] > self._committed:
            self._committed = end["batch"]
            assert self._channel is not None and self._run is not None
            t0 = time.monotonic()
            self._channel.write(Marker(self._run, self._base, self._committed))
            log.debug("kshare: timeline: driver commit batch %d, marker written in %.0f ms", end["batch"],
                      (time.monotonic() - t0) * 1000)
            log.info("kshare: stream %s run %d committed micro-batch %d", end["stream"], self._run, end["batch"])

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        assert isinstance(partition, ShareInputPartition)
        _refuse_unsupported()
        host = member_host(partition.opts)
        tag = Tag(partition.stream, partition.run, partition.batch, partition.index, _attempt())
        records, _ = host.read(tag, partition.opts.max_records, partition.opts.max_wait_ms)
        if not log.isEnabledFor(logging.DEBUG):
            return map(_row, records)
        return _handed(tag, map(_row, records))

    def stop(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None


class ShareBatchReader(DataSourceReader):
    """``spark.read``: each of ``parallelism`` tasks reads what is available (up to
    ``maxRecordsPerTask``, waiting up to ``maxWaitMs``) and accepts it once Spark has taken every
    row; a task that stops early or fails releases what it read."""

    def __init__(self, opts: Options) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        run = time.time_ns()
        return [ShareInputPartition(self.opts, "batch", run, 0, i) for i in range(self.opts.parallelism)]

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        assert isinstance(partition, ShareInputPartition)
        _refuse_unsupported()
        host = member_host(partition.opts)
        tag = Tag(partition.stream, partition.run, 0, partition.index, _attempt())
        # "available now": keep fetching until a fetch comes back empty after a short wait
        records, holding = host.read(tag, partition.opts.max_records, partition.opts.max_wait_ms, more_ms=250)
        done = False
        try:
            for r in records:
                yield _row(r)
            done = True
        finally:
            host.settle(holding, ACCEPT if done else RELEASE)


def _handed(tag: Any, rows: Iterator[tuple]) -> Iterator[tuple]:
    n = 0
    for row in rows:
        n += 1
        yield row
    log.debug("kshare: timeline: %s handed %d row(s) to Spark", tag, n)


def _refuse_unsupported() -> None:
    """Fail the task before it acquires anything if the session runs speculative attempts (Spark
    hands a task the session's settings as local properties) or does not reuse Python workers
    (pyspark's daemon is told to with SPARK_REUSE_WORKER): for a source registered without
    ``kshare.spark.register``, which refuses both on the driver."""
    tc = TaskContext.get()
    if tc is None:
        return
    if str(tc.getLocalProperty("spark.speculation") or "").strip().lower() == "true":
        raise OptionError(SPECULATION_REFUSED)
    if not os.environ.get("SPARK_REUSE_WORKER"):
        raise OptionError(NO_REUSE_REFUSED)


def _attempt() -> int:
    tc = TaskContext.get()
    return tc.attemptNumber() if tc is not None else 0


def _row(r: Record) -> tuple:
    return (r.key, r.value, r.topic, r.partition, r.offset, datetime.fromtimestamp(r.timestamp / 1000, UTC),
            r.timestamp_type, [(k, v) for k, v in r.headers], r.delivery_count)
