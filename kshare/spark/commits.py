"""The commit channel: how the driver tells the executors' members "micro-batch N is committed".

The driver's ``commit(end)`` cannot reach the Python workers that hold the records, so it writes
a *marker* through Kafka itself: an offset commit of a consumer group of its own per stream
(``kshare-spark.<share group>.<stream id>``) on partition 0 of the first subscribed topic. The
committed offset is the last committed micro-batch, the metadata ``run:base`` says which run of
the query wrote it and which batches were already committed when that run started. Any reader of
the group (every worker polls it while it holds records) sees the same marker; offset commits need
nothing beyond READ on the group and topic, no topic to create.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from .options import Options

log = logging.getLogger("kshare.spark")

# coordinator errors librdkafka does not flag retriable but that pass once the group is placed
_ALSO_RETRIED = {KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE,
                 KafkaError.COORDINATOR_LOAD_IN_PROGRESS}


WRITE_CONFIRM_S = 30.0  # how long a marker written may take to read back before the query fails

METADATA_DROPPED = ("drops offset-commit metadata ({what}), which the kshare source's commit marker and rejects "
                    "ledger are kept in: the embedded Tansu broker does this (run kshare proxy on Apache Kafka, its "
                    "default embedded broker when Java 17+ is installed, or in front of a real cluster)")


class ChannelError(RuntimeError):
    """The commit channel cannot carry what the source relies on (one line, naming the cause)."""


@dataclass(frozen=True, slots=True)
class Marker:
    run: int  # the query run that wrote it; a later run has a larger number
    base: int  # micro-batches <= base were committed before that run started
    committed: int  # micro-batches <= committed are committed (by this run or before it)

    def decides(self, run: int, batch: int) -> str | None:
        """What a holder of records that micro-batch ``batch`` of run ``run`` read does now:
        "accept", "release", or None (not yet known)."""
        if run == self.run:
            return "accept" if batch <= self.committed else None
        if run < self.run:  # that run is over: what it did not commit never will be
            return "accept" if batch <= self.base else "release"
        return None  # a newer run than this marker: the marker is stale


def marker_group(opts: Options, stream: str) -> str:
    return f"kshare-spark.{opts.group}.{stream}"


def offsets_client(opts: Options, group: str) -> Consumer:
    """A librdkafka consumer that only commits and fetches offsets of ``group`` (never joins it)."""
    conf = {k: v for k, v in opts.kafka if k not in ("client.rack", "request.timeout.ms")}
    conf.update({"bootstrap.servers": opts.bootstrap, "group.id": group, "enable.auto.commit": False,
                 "logger": log})
    return Consumer(conf)


def retried(call: Callable[[], list[TopicPartition] | None], attempts: int = 20) -> list[TopicPartition]:
    """``call`` until none of its partitions has an error; retriable errors (a coordinator moving or
    loading, as after the offsets topic is created) are retried for a few seconds. librdkafka
    reports partition errors in the result, not as exceptions."""
    for attempt in range(attempts):
        try:
            tps = call() or []
            err = next((tp.error for tp in tps if tp.error is not None), None)
        except KafkaException as exc:
            tps, err = [], exc.args[0]
        if tps and err is None:
            return tps
        if attempt == attempts - 1 or (err is not None and not err.retriable() and err.code() not in _ALSO_RETRIED):
            raise KafkaException(err)
        time.sleep(min(1.0, 0.1 * (attempt + 1)))
    raise AssertionError("unreachable")


class CommitChannel:
    """Reads and writes the marker of one stream (blocking calls)."""

    def __init__(self, opts: Options, stream: str, group: str | None = None) -> None:
        self.group = group or marker_group(opts, stream)
        self._bootstrap = opts.bootstrap
        self._consumer = offsets_client(opts, self.group)
        self._tp = TopicPartition(opts.topics[0], 0)

    def read(self, timeout: float = 10.0) -> Marker | None:
        tp = self._retry(lambda: self._consumer.committed([self._tp], timeout=timeout))
        if tp.offset < 0 or not tp.metadata:
            return None
        run, _, base = tp.metadata.partition(":")
        return Marker(int(run), int(base), tp.offset)

    def write(self, marker: Marker, *, confirm_s: float = WRITE_CONFIRM_S) -> None:
        """Write ``marker`` and read it back: the workers decide from what they read, so a marker
        the cluster did not keep must stop the query with its cause, not leave the records held
        until commitTimeoutMs releases them. A later marker (another run) read back is fine."""
        deadline = time.monotonic() + confirm_s
        while True:
            self._write(marker.committed, f"{marker.run}:{marker.base}")
            tp = self._retry(lambda: self._consumer.committed([self._tp], timeout=10.0))
            if tp.offset >= 0 and tp.offset == marker.committed and not tp.metadata:
                raise ChannelError(f"kshare source: the cluster at {self._bootstrap} " + METADATA_DROPPED.format(
                    what=f"committed offset {marker.committed} of group {self.group} with metadata "
                         f"{marker.run}:{marker.base}, read back {tp.metadata!r}"))
            back = self.read()
            if back is not None and (back.run, back.committed) >= (marker.run, marker.committed):
                return
            if time.monotonic() > deadline:
                raise ChannelError(f"kshare source: the commit marker of group {self.group} at {self._bootstrap} "
                                   f"did not advance to micro-batch {marker.committed} within {confirm_s:.0f} s "
                                   f"(read back {back}): the workers cannot learn what Spark committed")
            time.sleep(0.5)

    def _write(self, offset: int, metadata: str) -> None:
        tp = TopicPartition(self._tp.topic, 0, offset, metadata=metadata)
        self._retry(lambda: self._consumer.commit(offsets=[tp], asynchronous=False))

    @staticmethod
    def _retry(call: Callable[[], list[TopicPartition] | None]) -> TopicPartition:
        return retried(call)[0]

    def close(self) -> None:
        self._consumer.close()


class RetryNotices:
    """Task attempts that started again: "attempt k of task i of micro-batch b of run r began",
    so whichever worker holds what an earlier attempt read releases it instead of accepting it
    at the commit (that attempt failed; its rows never reached the sink).

    One record per task index: the metadata of the committed offset of a marker group of its own
    (``<marker group>.retries.<index>``), newest last, within the broker's metadata limit. Writing
    is read-modify-write, safe only because the attempts of one task index never run at once (a
    task is tried again after its attempt failed; speculation is refused). With one record for
    all tasks, the two tasks of an executor that died were tried again at the same moment, and
    one notice could overwrite the other: at the commit, the worker holding that failed attempt's
    records accepted them, though its rows never reached the sink. One AdminClient reads and
    writes the records of every index (blocking calls)."""

    MAX_CHARS = 3000  # offset.metadata.max.bytes is 4096 by default

    def __init__(self, opts: Options, stream: str) -> None:
        conf = {k: v for k, v in opts.kafka if k not in ("client.rack", "request.timeout.ms")}
        conf.update({"bootstrap.servers": opts.bootstrap, "logger": log})
        self._admin = AdminClient(conf)
        self._prefix = marker_group(opts, stream) + ".retries."
        self._topic = opts.topics[0]

    def group(self, index: int) -> str:
        return f"{self._prefix}{index}"

    def _committed(self, index: int) -> TopicPartition:
        group = self.group(index)

        def call() -> list[TopicPartition]:
            request = [ConsumerGroupTopicPartitions(group, [TopicPartition(self._topic, 0)])]
            return self._admin.list_consumer_group_offsets(request)[group].result(10.0).topic_partitions

        return retried(call)[0]

    def notices(self, index: int) -> set[tuple[int, int, int]]:
        """(run, batch, attempt) of every attempt of task ``index`` that began again."""
        out = set()
        for item in (self._committed(index).metadata or "").split(";"):
            parts = item.split(":")
            if len(parts) == 3:
                out.add(tuple(int(x) for x in parts))
        return out  # type: ignore[return-value]

    def add(self, run: int, batch: int, index: int, attempt: int) -> None:
        group = self.group(index)
        tp = self._committed(index)
        items = [x for x in (tp.metadata or "").split(";") if x] + [f"{run}:{batch}:{attempt}"]
        while len(";".join(items)) > self.MAX_CHARS:
            items.pop(0)
        offset = TopicPartition(self._topic, 0, max(tp.offset, 0) + 1, metadata=";".join(items))

        def call() -> list[TopicPartition]:
            request = [ConsumerGroupTopicPartitions(group, [offset])]
            return self._admin.alter_consumer_group_offsets(request)[group].result(10.0).topic_partitions

        retried(call)

    def close(self) -> None:
        pass  # an AdminClient has no close: its handle goes with it
