"""The kshare Spark source's throughput: a streaming query over a 1-partition topic, 5 ms of work
per record, with parallelism 1, 2 and 4 (share members reading per micro-batch).

Reports records/s, the ratio to the ideal (parallelism x 200/s: what 5 ms per record allows with
no overhead at all) and the per-micro-batch overhead (mean micro-batch time minus the work of its
busiest task: planning, task launch, join or first fetch, commit). Runs against a kshare proxy
you started (``kshare proxy``, embedded broker) or any share-group cluster:

    kshare proxy --port 19292 &
    PYTHONPATH=. python benchmarks/bench_spark.py --bootstrap 127.0.0.1:19292

(``PYTHONPATH=.`` so that the driver and Spark's Python workers import this tree's kshare.)
``--source null`` runs the same query on a Python data source of made-up rows, no Kafka: what
Spark itself costs per micro-batch, the floor the kshare source cannot go under. The result
also has Spark's own account of a micro-batch (``StreamingQueryProgress.durationMs``, mean per
phase); ``KSHARE_SPARK_LOG=DEBUG`` logs the source's timeline of every micro-batch.

The work is a sleep (an I/O-bound job), so 2 cores do not bound it by CPU; Spark's own task
overhead and the Python workers do compete for the 2 cores. Figures: docs/spark.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from kshare.spark import register

WORK_S = 0.005


def prepare(bootstrap: str, records: int, record_locks: int | None = None) -> tuple[str, str]:
    topic = group = f"bench-spark-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(30)
    configs = [ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)]
    if record_locks:
        configs.append(ConfigEntry("share.partition.max.record.locks", str(record_locks),
                                   incremental_operation=AlterConfigOpType.SET))
    for fut in admin.incremental_alter_configs([ConfigResource(ResourceType.GROUP, group,
                                                               incremental_configs=configs)]).values():
        fut.result(30)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(records):
        p.produce(topic, value=f"job-{i}".encode())
        if i % 1000 == 999:
            p.flush(30)
    p.flush(30)
    return topic, group


def work(value: bytes) -> int:
    time.sleep(WORK_S)
    return len(value)


class NullSource(DataSource):
    """The same query shape with no Kafka at all: every micro-batch is ``parallelism`` tasks of
    ``maxRecordsPerTask`` rows made in the task. What Spark itself costs per micro-batch."""

    @classmethod
    def name(cls) -> str:
        return "kshare-bench-null"

    def schema(self) -> str:
        return "value binary"

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return NullStreamReader(int(self.options["parallelism"]), int(self.options["maxRecordsPerTask"]))


class NullStreamReader(DataSourceStreamReader):
    def __init__(self, parallelism: int, per_task: int) -> None:
        self.parallelism, self.per_task = parallelism, per_task

    def initialOffset(self) -> dict:
        return {"batch": 0}

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        _timeline("driver latestOffset")
        return {"batch": (start or {"batch": 0})["batch"] + 1}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        _timeline("driver partitions")
        return [InputPartition(i) for i in range(self.parallelism)] if end["batch"] > start["batch"] else []

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        _timeline(f"task {partition.value} read starts")
        return ((f"job-{i}".encode(),) for i in range(self.per_task))

    def commit(self, end: dict) -> None:
        pass


def _timeline(what: str) -> None:
    if os.environ.get("KSHARE_SPARK_LOG", "").upper() == "DEBUG":
        print(f"{time.strftime('%H:%M:%S')}.{int(time.time() * 1000) % 1000:03d} null source: {what}",
              file=sys.stderr, flush=True)


def run(spark: SparkSession, bootstrap: str, parallelism: int, records: int, per_task: int | None,
        source: str = "kshare", verbose: bool = False, record_locks: int | None = None) -> dict:
    seen: list[tuple[float, int, int]] = []  # (end time, rows, rows of the busiest task)

    def sink(df, _batch_id: int) -> None:
        rows = df.groupBy("task").count().collect()  # one action: a share source cannot replay
        seen.append((time.monotonic(), sum(r["count"] for r in rows), max((r["count"] for r in rows), default=0)))

    if source == "null":
        reader = (spark.readStream.format("kshare-bench-null").option("parallelism", parallelism)
                  .option("maxRecordsPerTask", per_task or 500))
    else:
        topic, group = prepare(bootstrap, records, record_locks)
        reader = (spark.readStream.format("kshare").option("kafka.bootstrap.servers", bootstrap)
                  .option("kafka.share.group.id", group).option("subscribe", topic)
                  .option("parallelism", parallelism))
        if per_task:  # else the source's defaults
            reader = reader.option("maxRecordsPerTask", per_task).option("maxWaitMs", 500)
    df = reader.load().select(F.udf(work, "int")("value").alias("n"), F.spark_partition_id().alias("task"))
    q = df.writeStream.foreachBatch(sink).start()
    t0 = time.monotonic()
    try:
        while sum(n for _, n, _ in seen) < records:
            if q.exception() is not None:
                raise SystemExit(f"query failed: {q.exception()}")
            time.sleep(0.2)
    finally:
        progress = [p for p in q.recentProgress if p.numInputRows > 0][1:]  # steady micro-batches
        q.stop()
    # Spark's own account of a micro-batch (StreamingQueryProgress.durationMs), mean per key
    phases = {k: round(statistics.mean(p.durationMs.get(k, 0) for p in progress))
              for k in ("latestOffset", "walCommit", "queryPlanning", "addBatch", "commitOffsets",
                        "triggerExecution")} if progress else {}
    busy = [s for s in seen if s[1] > 0]
    first = busy[0][0]
    # steady state: from the end of the first non-empty batch (members joined) to the last one
    steady_rows = sum(n for _, n, _ in busy[1:])
    steady_s = busy[-1][0] - first
    durations = [b[0] - a[0] for a, b in zip(busy, busy[1:], strict=False)]
    overheads = [d - top * WORK_S for d, (_, _, top) in zip(durations, busy[1:], strict=False)]
    if verbose:
        for d, o, (_, n, top) in zip(durations, overheads, busy[1:], strict=False):
            print(f"  micro-batch: {n} rows, busiest task {top}, {d * 1000:.0f} ms, overhead {o * 1000:.0f} ms",
                  file=sys.stderr)
    rate = steady_rows / steady_s if steady_s > 0 else float("nan")
    return {"parallelism": parallelism, "records": records, "records_per_s": round(rate, 1),
            "ratio_to_ideal": round(rate / (parallelism * 200), 3), "first_batch_s": round(first - t0, 2),
            "micro_batches": len(busy), "spark_phases_ms": phases, "overhead_per_batch_ms": round(statistics.mean(overheads) * 1000)
            if overheads else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bootstrap", default="127.0.0.1:9192")
    ap.add_argument("--parallelism", default="1,2,4")
    ap.add_argument("--seconds", type=float, default=15.0, help="ideal run time per parallelism")
    ap.add_argument("--per-task", type=int, default=250,
                    help="maxRecordsPerTask (with maxWaitMs 500); 0: the source's defaults")
    ap.add_argument("--source", choices=("kshare", "null"), default="kshare",
                    help="null: the same query on a Python source of made-up rows, no Kafka (Spark's floor)")
    ap.add_argument("--record-locks", type=int, default=0,
                    help="share.partition.max.record.locks of the group (0: the cluster's default, 2000)")
    ap.add_argument("--verbose", action="store_true", help="every micro-batch's rows, time and overhead")
    args = ap.parse_args()
    levels = [int(x) for x in args.parallelism.split(",")]
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master(f"local[{max(levels)}]").appName("kshare-bench")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", max(levels))
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    spark.dataSource.register(NullSource)
    results = []
    for p in levels:
        r = run(spark, args.bootstrap, p, int(p * 200 * args.seconds), args.per_task, args.source, args.verbose,
                args.record_locks)
        results.append(r)
        print(json.dumps(r), flush=True)
    print("\n| parallelism | records/s | ratio to ideal | overhead per micro-batch |\n| --- | --- | --- | --- |")
    for r in results:
        print(f"| {r['parallelism']} | {r['records_per_s']:.0f} | {r['ratio_to_ideal']:.2f} | "
              f"{r['overhead_per_batch_ms']} ms |")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
