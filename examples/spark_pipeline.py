"""A jobs pipeline on Spark: a 1-partition topic read by 4 tasks at once through a share group.

Start kshare (with its embedded broker) in one shell, then run this in another:

    kshare proxy
    python examples/spark_pipeline.py --produce 2000 --output /tmp/kshare-jobs

It creates the topic ``jobs`` (one partition) if needed, starts the share group ``workers`` at the
beginning of the topic, produces ``--produce`` jobs, and runs a streaming query in which 4 tasks per
micro-batch read the one partition as 4 members of the share group, each job taking 5 ms of
work, results appended to Parquet under ``--output``. It stops once every job is done and prints
the throughput. Needs ``pip install 'kshare[spark]'`` and Java 17+.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

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

from kshare.spark import register


def prepare(bootstrap: str, topic: str, group: str, jobs: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    if topic not in admin.list_topics(timeout=10).topics:
        admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(30)
    reset = ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)
    for fut in admin.incremental_alter_configs([ConfigResource(ResourceType.GROUP, group,
                                                               incremental_configs=[reset])]).values():
        fut.result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(jobs):
        producer.produce(topic, key=f"job-{i}".encode(), value=f"payload {i}".encode())
        if i % 1000 == 999:
            producer.flush(30)
    producer.flush(30)


def work(value: bytes) -> str:
    time.sleep(0.005)  # stands for 5 ms of real work per job (I/O bound: a call out, a write)
    return value.decode().upper()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bootstrap", default="127.0.0.1:9192", help="the kshare proxy (default %(default)s)")
    ap.add_argument("--topic", default="jobs")
    ap.add_argument("--group", default="workers")
    ap.add_argument("--produce", type=int, default=2000, help="jobs to produce first (0: none)")
    ap.add_argument("--expect", type=int, default=None, help="stop after this many jobs (default: --produce)")
    ap.add_argument("--tasks", type=int, default=4, help="share members reading per micro-batch")
    ap.add_argument("--output", default="/tmp/kshare-jobs", help="Parquet directory (and its checkpoint)")
    args = ap.parse_args()
    expect = args.expect if args.expect is not None else args.produce

    prepare(args.bootstrap, args.topic, args.group, args.produce)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master(f"local[{args.tasks}]").appName("kshare-pipeline")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", args.tasks)
             .getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    jobs = (spark.readStream.format("kshare")
            .option("kafka.bootstrap.servers", args.bootstrap)
            .option("kafka.share.group.id", args.group)
            .option("subscribe", args.topic)
            .option("parallelism", args.tasks)
            .option("maxRecordsPerTask", 250)
            .option("maxWaitMs", 500)
            .load())
    results = jobs.select(F.col("key").cast("string").alias("job"), F.udf(work, "string")("value").alias("result"),
                          "partition", "offset", "deliveryCount")
    query = (results.writeStream.format("parquet").option("path", os.path.join(args.output, "data"))
             .option("checkpointLocation", os.path.join(args.output, "checkpoint")).start())
    started, done = time.monotonic(), 0
    try:
        while done < expect:
            time.sleep(1)
            if query.exception() is not None:
                raise SystemExit(f"the query failed: {query.exception()}")
            with contextlib.suppress(Exception):  # no output yet
                done = spark.read.parquet(os.path.join(args.output, "data")).count()
            print(f"{done} of {expect} jobs done", flush=True)
    finally:
        query.stop()
    took = time.monotonic() - started
    print(f"{done} jobs in {took:.1f} s: {done / took:.0f} jobs/s with {args.tasks} tasks "
          f"(ideal {args.tasks * 200}/s); results in {args.output}/data")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
