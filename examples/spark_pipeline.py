"""A jobs pipeline on Spark: a 1-partition topic read by 4 tasks at once through a share group.

Start kshare (with its embedded broker) in one shell, then run this in another:

    kshare proxy
    python examples/spark_pipeline.py --produce 2000 --output /tmp/kshare-jobs

It creates the topic ``jobs`` (one partition) if needed, starts the share group ``workers`` at the
beginning of the topic, produces ``--produce`` jobs (``--poison`` of them malformed), and runs a
streaming query in which 4 tasks per micro-batch read the one partition as 4 members of the share
group, each job taking 5 ms of work, results appended to Parquet under ``--output``. Jobs that do
not parse are rejected from the sink (``kshare.spark.reject``): never delivered again, and on the
group's dead-letter topic if it has one. It stops once every good job is done and prints the
throughput; it exits 0 once the share group has acknowledged every job (1 if some are still in
flight after a minute). Needs ``pip install 'kshare[spark]'`` and Java 17+.
"""

from __future__ import annotations

import argparse
import asyncio
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

from kshare.clients.admin import ShareGroupAdmin
from kshare.clients.settings import parse_bootstrap
from kshare.spark import register, reject


def prepare(bootstrap: str, topic: str, group: str, jobs: int, poison: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    if topic not in admin.list_topics(timeout=10).topics:
        admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(30)
    reset = ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)
    for fut in admin.incremental_alter_configs([ConfigResource(ResourceType.GROUP, group,
                                                               incremental_configs=[reset])]).values():
        fut.result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    bad = {i * jobs // poison for i in range(poison)} if poison else set()
    for i in range(jobs):
        value = f"payload {i}" if i not in bad else f"\ufffd not a job {i}"
        producer.produce(topic, key=f"job-{i}".encode(), value=value.encode())
        if i % 1000 == 999:
            producer.flush(30)
    producer.flush(30)


def work(value: bytes) -> str | None:
    """The job's result, or None when it does not parse."""
    if not value.startswith(b"payload "):
        return None
    time.sleep(0.005)  # stands for 5 ms of real work per job (I/O bound: a call out, a write)
    return value.decode().upper()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bootstrap", default="127.0.0.1:9192", help="the kshare proxy (default %(default)s)")
    ap.add_argument("--topic", default="jobs")
    ap.add_argument("--group", default="workers")
    ap.add_argument("--produce", type=int, default=2000, help="jobs to produce first (0: none)")
    ap.add_argument("--poison", type=int, default=20, help="how many of the produced jobs are malformed")
    ap.add_argument("--expect", type=int, default=None,
                    help="stop after this many jobs (default: --produce minus --poison)")
    ap.add_argument("--tasks", type=int, default=4, help="share members reading per micro-batch")
    ap.add_argument("--output", default="/tmp/kshare-jobs", help="Parquet directory (and its checkpoint)")
    args = ap.parse_args()
    poison = min(args.poison, args.produce)
    expect = args.expect if args.expect is not None else args.produce - poison

    prepare(args.bootstrap, args.topic, args.group, args.produce, poison)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master(f"local[{args.tasks}]").appName("kshare-pipeline")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", args.tasks)
             .getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    source = {"kafka.bootstrap.servers": args.bootstrap, "kafka.share.group.id": args.group,
              "subscribe": args.topic, "parallelism": args.tasks, "maxRecordsPerTask": 250, "maxWaitMs": 500}
    jobs = spark.readStream.format("kshare").options(**source).load()
    work_udf = F.udf(work, "string")
    data = os.path.join(args.output, "data")

    def sink(batch, _batch_id: int) -> None:
        # Two actions on the micro-batch: persist it so that both see the same records (each action
        # would otherwise read new records from the share group) and the work runs once.
        results = batch.select(F.col("key").cast("string").alias("job"), work_udf("value").alias("result"),
                               "topic", "partition", "offset", "deliveryCount").persist()
        results.filter("result IS NOT NULL").drop("topic").write.mode("append").parquet(data)
        reject(results.filter("result IS NULL"), options=source)  # malformed: never delivered again
        results.unpersist()

    query = (jobs.writeStream.foreachBatch(sink)
             .option("checkpointLocation", os.path.join(args.output, "checkpoint")).start())
    started, done = time.monotonic(), 0
    try:
        while done < expect:
            time.sleep(1)
            if query.exception() is not None:
                raise SystemExit(f"the query failed: {query.exception()}")
            if os.path.isdir(data):
                with contextlib.suppress(Exception):  # no output yet
                    done = spark.read.parquet(data).count()
            print(f"{done} of {expect} jobs done", flush=True)
        took = time.monotonic() - started
        # Spark commits a micro-batch when it plans the next one, and the workers then acknowledge
        # its records: wait for that before stopping, or the last batch's jobs are redelivered.
        left = settled(args.bootstrap, args.group, args.topic)
    finally:
        query.stop()
    print(f"{done} jobs in {took:.1f} s: {done / took:.0f} jobs/s with {args.tasks} tasks "
          f"(ideal {args.tasks * 200}/s); results in {args.output}/data")
    spark.stop()
    if left:
        print(f"{left} job(s) of topic {args.topic} are not acknowledged yet: the share group delivers them "
              f"again", file=sys.stderr)
        return 1
    print(f"every job of topic {args.topic} is acknowledged (group {args.group} has no lag)")
    return 0


def settled(bootstrap: str, group: str, topic: str, timeout: float = 60.0) -> int:
    """Wait until the share group has acknowledged (or rejected) every record of ``topic``; the
    records still in flight after ``timeout`` seconds."""
    async def lag() -> int:
        async with ShareGroupAdmin(parse_bootstrap(bootstrap)) as admin:
            offsets = await admin.describe_offsets(group, {topic: [0]})
        return sum(o.lag or 0 for o in offsets)

    deadline = time.monotonic() + timeout
    while (left := asyncio.run(lag())) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


if __name__ == "__main__":
    sys.exit(main())
