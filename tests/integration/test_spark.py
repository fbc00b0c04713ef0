"""The kshare PySpark source end to end: real Spark on a cluster (the test session's
``local-cluster[2,2,1024]``: two executor JVMs of two cores, task retries allowed; see
tests/harness/spark_cluster.py), the real kshare proxy in a thread in front of Apache Kafka
3.9, records produced by librdkafka.

One SparkSession for the test session (shared with test_spark_cluster.py); every test has its own
topic, share group and checkpoint.
The sink is ``foreachBatch`` collecting rows on the driver (one action per micro-batch: a share
source cannot replay, see docs/guide/spark.md).
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'kshare[spark]')")

from pyspark.errors import StreamingQueryException  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from kshare.share.dead_letter import HEADER_PREFIX, REASON_REJECTED  # noqa: E402
from kshare.spark import RejectError, reject  # noqa: E402
from kshare.spark.ledger import Entry, Ledger  # noqa: E402
from kshare.spark.options import parse_client  # noqa: E402
from tests.harness import share  # noqa: E402
from tests.harness import spark_cluster as cluster  # noqa: E402
from tests.harness.share import produce, share_group, values  # noqa: E402

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def spark(spark_cluster: cluster.SparkSessions) -> SparkSession:
    return spark_cluster.get()


def _names(kafka39, what: str) -> tuple[str, str]:
    suffix = uuid.uuid4().hex[:8]
    topic, group = f"spark-{what}-{suffix}", f"spark-{what}-{suffix}"
    kafka39.create_topic(topic, 1)
    return topic, group


_stream = cluster.kshare_stream


class Sink:
    """foreachBatch target: every row (value, deliveryCount, task) with its micro-batch id."""

    def __init__(self, fail_on: Callable[[int, list], bool] | None = None) -> None:
        self.rows: list[tuple[int, bytes, int, int]] = []
        self.failed_batch: list[tuple[bytes, int]] = []
        self.fail_on = fail_on
        self.lock = threading.Lock()

    def __call__(self, df, batch_id: int) -> None:
        rows = df.select("value", "deliveryCount", F.spark_partition_id().alias("task")).collect()
        if rows and self.fail_on is not None and self.fail_on(batch_id, rows):
            self.fail_on = None
            self.failed_batch = [(bytes(r.value), r.deliveryCount) for r in rows]
            raise RuntimeError(f"sink fails once, in micro-batch {batch_id}")
        with self.lock:
            self.rows += [(batch_id, bytes(r.value), r.deliveryCount, r.task) for r in rows]

    def values(self) -> set[bytes]:
        with self.lock:
            return {v for _, v, _, _ in self.rows}

    def wait_for(self, expected: set[bytes], timeout: float = 90.0, query=None) -> None:
        deadline = time.monotonic() + timeout
        while not expected <= self.values():
            if query is not None and query.exception() is not None:
                raise AssertionError(f"query failed: {query.exception()}")
            assert time.monotonic() < deadline, f"missing {len(expected - self.values())} of {len(expected)}"
            time.sleep(0.2)


def _start(df, sink: Sink, checkpoint: Path):
    return (df.writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="200 milliseconds").start())


def test_one_partition_is_read_by_every_task_and_all_records_arrive(spark, kshare39, kafka39, tmp_path):
    topic, group = _names(kafka39, "spread")
    share_group(kshare39.bootstrap, group, share_heartbeat_interval_ms=500)
    expected = values("r", 400)
    produce(kshare39.bootstrap, topic, expected, per_batch=20)
    sink = Sink()
    q = _start(_stream(spark, kshare39.bootstrap, topic, group), sink, tmp_path / "ck")
    try:
        sink.wait_for(set(expected), query=q)
    finally:
        q.stop()
    tasks_per_batch: dict[int, set[int]] = {}
    for batch, _v, _c, task in sink.rows:
        tasks_per_batch.setdefault(batch, set()).add(task)
    assert max(len(t) for t in tasks_per_batch.values()) >= 3, tasks_per_batch


@pytest.fixture(params=["kafka39", "embedded", "native44"])
def upstream_of(request) -> tuple[str, Callable[[str], None], dict[str, object]]:
    """(the source's bootstrap, a function creating a 1-partition topic): kshare in front of Apache
    Kafka 3.9, ``kshare proxy`` on its default embedded broker (the quick start's), or Apache Kafka
    4.4's own share groups without kshare."""
    if request.param == "kafka39":
        kafka39 = request.getfixturevalue("kafka39")
        return (request.getfixturevalue("kshare39").bootstrap, lambda topic: kafka39.create_topic(topic, 1),
                {"share_heartbeat_interval_ms": 500})
    if request.param == "native44":  # its broker keeps Kafka's heartbeat floor (5 s)
        kafka4 = request.getfixturevalue("kafka4")
        return kafka4.bootstrap, lambda topic: kafka4.create_topic(topic, 1), {}
    bootstrap = request.getfixturevalue("embedded_kshare").bootstrap

    def create(topic: str) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": bootstrap, "logger": share.quiet_logger()})
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)

    return bootstrap, create, {"share_heartbeat_interval_ms": 500}


def test_a_failing_sink_fails_the_query_and_a_restart_redelivers(spark, upstream_of, tmp_path):
    bootstrap, create, group_configs = upstream_of
    topic = group = f"spark-sinkfail-{uuid.uuid4().hex[:8]}"
    create(topic)
    share_group(bootstrap, group, **group_configs)
    expected = values("s", 200)
    produce(bootstrap, topic, expected, per_batch=20)
    sink = Sink(fail_on=lambda _batch, _rows: True)
    df = _stream(spark, bootstrap, topic, group)
    q = _start(df, sink, tmp_path / "ck")
    with pytest.raises(StreamingQueryException, match="sink fails once"):
        q.awaitTermination(120)
    assert sink.failed_batch
    q = _start(df, sink, tmp_path / "ck")  # the same checkpoint: the failed micro-batch is replayed
    try:
        sink.wait_for(set(expected), query=q)
    finally:
        q.stop()
    counts: dict[bytes, int] = {}
    for _b, v, c, _t in sink.rows:
        counts[v] = max(c, counts.get(v, 0))
    again = [v for v, _ in sink.failed_batch]
    assert all(counts[v] >= 2 for v in again), {v: counts[v] for v in again if counts[v] < 2}


def test_a_task_that_fails_once_loses_nothing(spark, kshare39, kafka39, tmp_path):
    topic, group = _names(kafka39, "taskfail")
    share_group(kshare39.bootstrap, group, share_heartbeat_interval_ms=500)
    expected = values("t", 200)
    produce(kshare39.bootstrap, topic, expected, per_batch=20)
    flag = str(tmp_path / "failed-once")

    @F.udf("binary")
    def fail_once(v: bytes) -> bytes:
        if not os.path.exists(flag):
            open(flag, "w").close()
            raise RuntimeError("this task fails once")
        return v

    sink = Sink()
    df = _stream(spark, kshare39.bootstrap, topic, group).withColumn("value", fail_once("value"))
    q = _start(df, sink, tmp_path / "ck")
    try:
        sink.wait_for(set(expected), query=q)
    finally:
        q.stop()
    assert os.path.exists(flag)


def test_stop_and_restart_loses_nothing(spark, kshare39, kafka39, tmp_path):
    topic, group = _names(kafka39, "restart")
    share_group(kshare39.bootstrap, group, share_heartbeat_interval_ms=500)
    first, second = values("a", 150), values("b", 150)
    produce(kshare39.bootstrap, topic, first, per_batch=10)
    sink = Sink()
    df = _stream(spark, kshare39.bootstrap, topic, group)
    q = _start(df, sink, tmp_path / "ck")
    try:
        sink.wait_for({first[0]}, query=q)
    finally:
        q.stop()
    produce(kshare39.bootstrap, topic, second, per_batch=10)
    q = _start(df, sink, tmp_path / "ck")
    try:
        sink.wait_for(set(first + second), query=q)
    finally:
        q.stop()


def test_a_batch_read_returns_every_available_record(spark, kshare39, kafka39):
    topic, group = _names(kafka39, "batch")
    share_group(kshare39.bootstrap, group, share_heartbeat_interval_ms=500)
    expected = values("x", 120)
    produce(kshare39.bootstrap, topic, expected, per_batch=10,
            headers=[[("h", b"1")]] * 120, keys=[b"k"] * 120)
    df = (spark.read.format("kshare").option("kafka.bootstrap.servers", kshare39.bootstrap)
          .option("kafka.share.group.id", group).option("subscribe", topic)
          .option("parallelism", 4).option("maxRecordsPerTask", 100).option("maxWaitMs", 2000).load())
    rows = df.collect()
    assert sorted(bytes(r.value) for r in rows) == sorted(expected)
    r = rows[0]
    assert (r.topic, r.partition, bytes(r.key), r.deliveryCount) == (topic, 0, b"k", 1)
    assert [(h.key, bytes(h.value)) for h in r.headers] == [("h", b"1")]
    # accepted when the tasks completed: nothing left for the next read
    assert df.collect() == []


@pytest.mark.parametrize("missing", ["kafka.bootstrap.servers", "kafka.share.group.id", "subscribe"])
def test_a_missing_option_is_a_one_line_error(spark, missing):
    opts = {"kafka.bootstrap.servers": "127.0.0.1:1", "kafka.share.group.id": "g", "subscribe": "t"}
    del opts[missing]
    with pytest.raises(Exception) as err:
        spark.readStream.format("kshare").options(**opts).load()
    assert f"kshare source: option '{missing}' is required (missing or empty)" in str(err.value)


def test_the_commit_channel_carries_the_marker(kshare39, kafka39):
    from kshare.spark.commits import CommitChannel, Marker
    from kshare.spark.options import parse

    topic, group = _names(kafka39, "marker")
    opts = parse({"kafka.bootstrap.servers": kshare39.bootstrap, "kafka.share.group.id": group, "subscribe": topic})
    writer, reader = CommitChannel(opts, "s1"), CommitChannel(opts, "s1")
    try:
        assert reader.read() is None
        writer.write(Marker(5, 2, 3))
        assert reader.read() == Marker(5, 2, 3)
        second = CommitChannel(opts, "s1")  # a new run writes the same offset with a new metadata
        second.write(Marker(6, 3, 3))
        second.close()
        assert reader.read() == Marker(6, 3, 3)
    finally:
        writer.close()
        reader.close()


def test_retry_notices_of_tasks_tried_again_at_once_are_all_kept(kshare39, kafka39):
    """The tasks an executor ran when it died are tried again at the same moment, each writing
    "attempt 1 of task i began" from a worker of its own; every notice must be kept, or the worker
    holding that task's failed attempt accepts its records at the commit (rows that never reached
    the sink). Eight workers write at once, twice each (attempts 1 and 2), through kshare."""
    from kshare.spark.commits import RetryNotices
    from kshare.spark.options import parse

    topic, group = _names(kafka39, "notices")
    opts = parse({"kafka.bootstrap.servers": kshare39.bootstrap, "kafka.share.group.id": group, "subscribe": topic})
    workers = [RetryNotices(opts, "s1") for _ in range(8)]
    start = threading.Barrier(len(workers))
    failures: list[BaseException] = []

    def task(index: int) -> None:
        try:
            for attempt in (1, 2):
                start.wait(30)
                workers[index].add(7, 3, index, attempt)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=task, args=(i,)) for i in range(len(workers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not failures, failures
    reader = RetryNotices(opts, "s1")
    assert {i: reader.notices(i) for i in range(len(workers))} == {i: {(7, 3, 1), (7, 3, 2)} for i in range(8)}


@pytest.fixture(scope="module")
def kshare_tansu(tansu) -> Iterator[share.ShareProxyThread]:
    """kshare in front of the real Tansu broker, which drops offset-commit metadata."""
    with share.ShareProxyThread(tansu.bootstrap) as proxy:
        yield proxy


def _tansu_names(tansu) -> tuple[str, str]:
    suffix = uuid.uuid4().hex[:8]
    tansu.create_topic(f"spark-tansu-{suffix}", 1)
    return f"spark-tansu-{suffix}", f"spark-tansu-{suffix}"


def test_the_commit_channel_refuses_a_cluster_that_drops_its_metadata(kshare_tansu, tansu):
    from kshare.spark.commits import ChannelError, CommitChannel, Marker
    from kshare.spark.options import parse

    topic, group = _tansu_names(tansu)
    opts = parse({"kafka.bootstrap.servers": kshare_tansu.bootstrap, "kafka.share.group.id": group,
                  "subscribe": topic})
    channel = CommitChannel(opts, "s1")
    try:
        with pytest.raises(ChannelError) as err:
            channel.write(Marker(5, 2, 3))
    finally:
        channel.close()
    line = str(err.value)
    assert "\n" not in line and "drops offset-commit metadata" in line and kshare_tansu.bootstrap in line, line


def test_reject_on_a_cluster_that_drops_its_metadata_says_why(kshare_tansu, tansu):
    topic, group = _tansu_names(tansu)
    with pytest.raises(RejectError) as err:
        reject([(topic, 0, 3)], bootstrap=kshare_tansu.bootstrap, group=group)
    line = str(err.value)
    assert "\n" not in line and "drops offset-commit metadata" in line, line


def test_the_query_fails_at_start_on_a_cluster_that_drops_its_metadata(spark, kshare_tansu, tansu, tmp_path):
    topic, group = _tansu_names(tansu)
    produce(kshare_tansu.bootstrap, topic, values("m", 20), per_batch=5)
    q = _start(_stream(spark, kshare_tansu.bootstrap, topic, group), Sink(), tmp_path / "ck")
    with pytest.raises(StreamingQueryException, match="drops offset-commit metadata"):
        q.awaitTermination(120)


def _start_offset(bootstrap: str, group: str, topic: str) -> int | None:
    """The share-partition start offset of partition 0 (DescribeShareGroupOffsets through kshare)."""
    from kshare.clients.admin import ShareGroupAdmin
    from kshare.clients.settings import parse_bootstrap

    async def ask():
        async with ShareGroupAdmin(parse_bootstrap(bootstrap)) as admin:
            return await admin.describe_offsets(group, {topic: [0]})

    (found,) = asyncio.run(ask())
    return found.start_offset


def _ledger(bootstrap: str, group: str, topic: str) -> Entry:
    ledger = Ledger(parse_client({"kafka.bootstrap.servers": bootstrap, "kafka.share.group.id": group}))
    try:
        return ledger.read([(topic, 0)])[(topic, 0)]
    finally:
        ledger.close()


def test_rejected_records_are_never_delivered_again(spark, kshare39, kafka39, tmp_path):
    """foreachBatch rejects the "poison" records and returns normally: they are archived (to the
    dead-letter topic), never delivered again, and every other record reaches the sink."""
    topic, group = _names(kafka39, "reject")
    dlq = f"dlq.{topic}"
    kafka39.create_topic(dlq, 1)
    share_group(kshare39.bootstrap, group, share_heartbeat_interval_ms=500, **{
        "errors.deadletterqueue.topic.name": dlq, "errors.deadletterqueue.copy.record.enable": "true"})
    first = [f"poison-{i}".encode() if i % 10 == 3 else f"w-{i}".encode() for i in range(120)]
    second = values("v", 10) + [b"poison-late"] + values("v2", 10)
    poison = [v for v in first + second if v.startswith(b"poison")]
    produce(kshare39.bootstrap, topic, first, per_batch=20)
    opts = {"kafka.bootstrap.servers": kshare39.bootstrap, "kafka.share.group.id": group, "subscribe": topic,
            "parallelism": "4", "maxRecordsPerTask": "50", "maxWaitMs": "500"}
    seen: list[tuple[bytes, int]] = []

    def sink(batch, _batch_id: int) -> None:
        batch.persist()  # two actions on the batch: both must see the same records
        seen.extend((bytes(r.value), r.deliveryCount) for r in batch.select("value", "deliveryCount").collect())
        reject(batch.filter(F.col("value").cast("string").startswith("poison")), options=opts)
        batch.unpersist()

    def wait_seen(expected: list[bytes]) -> None:
        share.wait_until(lambda: set(expected) <= {v for v, _ in seen} or q.exception() is not None,
                                 90, "every record in the sink")
        assert q.exception() is None, q.exception()

    def wait_start(offset: int) -> None:
        share.wait_until(lambda: _start_offset(kshare39.bootstrap, group, topic) == offset, 30,
                                 f"the start offset at {offset}")

    q = (spark.readStream.format("kshare").options(**opts).load().writeStream.foreachBatch(sink)
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(processingTime="200 milliseconds").start())
    try:
        wait_seen(first)
        wait_start(len(first))  # every record settled: accepted, or rejected (archived)
        produce(kshare39.bootstrap, topic, second, per_batch=7)
        wait_seen(second)  # later micro-batches: the rejected records do not come back
        wait_start(len(first) + len(second))
    finally:
        q.stop()
    counts: dict[bytes, list[int]] = {}
    for v, c in seen:
        counts.setdefault(v, []).append(c)
    assert {v: counts[v] for v in poison} == {v: [1] for v in poison}
    assert set(counts) == set(first + second)
    letters = share.read_plain(kafka39.bootstrap, dlq, len(poison) + 1, timeout=5)
    assert sorted(m.value() for m in letters) == sorted(poison)
    assert {dict(m.headers())[HEADER_PREFIX + "message"] for m in letters} == {REASON_REJECTED.encode()}
    # the last reject() pruned the first wave's offsets (below the start offset by then)
    late = len(first) + second.index(b"poison-late")
    assert _ledger(kshare39.bootstrap, group, topic).ranges == [(late, late)]


def test_reject_refuses_a_missing_column_and_an_oversized_set(spark, kshare39, kafka39):
    topic, group = _names(kafka39, "rejectbad")
    where = {"bootstrap": kshare39.bootstrap, "group": group}
    with pytest.raises(RejectError, match="^kshare.spark.reject: the rows have no offset column"):
        reject(spark.createDataFrame([(topic, 0)], "topic string, partition int"), **where)
    many = random.Random(1).sample(range(10**9), 3000)  # no pattern: ~4 bytes each in the ledger
    rows = spark.createDataFrame([(topic, 0, o) for o in many], "topic string, partition int, offset long")
    with pytest.raises(RejectError) as err:
        reject(rows, **where)
    message = str(err.value)
    assert "\n" not in message and f"3000 pending rejected offsets of {topic}-0" in message, message
    assert "offset.metadata.max.bytes (4096)" in message
    assert _ledger(kshare39.bootstrap, group, topic).text is None  # nothing written
    assert reject([(topic, 0, 5)], **where) == 1
    assert reject([{"topic": topic, "partition": 0, "offset": 7}], **where) == 1  # merged
    assert _ledger(kshare39.bootstrap, group, topic).ranges == [(5, 5), (7, 7)]
