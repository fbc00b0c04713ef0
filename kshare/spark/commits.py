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
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaException, TopicPartition

from .options import Options

log = logging.getLogger("kshare.spark")


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


class CommitChannel:
    """Reads and writes the marker of one stream (blocking calls)."""

    def __init__(self, opts: Options, stream: str) -> None:
        conf = {k: v for k, v in opts.kafka if k not in ("client.rack", "request.timeout.ms")}
        conf.update({"bootstrap.servers": opts.bootstrap, "group.id": marker_group(opts, stream),
                     "enable.auto.commit": False, "logger": log})
        self._consumer = Consumer(conf)
        self._tp = TopicPartition(opts.topics[0], 0)

    def read(self, timeout: float = 10.0) -> Marker | None:
        (tp,) = self._consumer.committed([self._tp], timeout=timeout)
        if tp.error is not None:
            raise KafkaException(tp.error)
        if tp.offset < 0 or not tp.metadata:
            return None
        run, _, base = tp.metadata.partition(":")
        return Marker(int(run), int(base), tp.offset)

    def write(self, marker: Marker, attempts: int = 5) -> None:
        tp = TopicPartition(self._tp.topic, 0, marker.committed, metadata=f"{marker.run}:{marker.base}")
        for attempt in range(attempts):
            try:
                self._consumer.commit(offsets=[tp], asynchronous=False)
                return
            except KafkaException as exc:
                if attempt == attempts - 1 or not exc.args[0].retriable():
                    raise
                time.sleep(0.2 * (attempt + 1))

    def close(self) -> None:
        self._consumer.close()
