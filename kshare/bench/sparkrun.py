"""The ``spark`` scenario's Spark side: one process with one SparkSession (local mode, Spark's Kafka
source from Maven Central through ``spark.jars.packages``) that runs the planned streaming queries
one after the other and appends one JSON line per query to a results file.

    python -m kshare.bench.sparkrun PLAN.json

The plan (written by :func:`kshare.bench.scenarios.spark`): ``cores`` (``local[N]``), ``packages``,
``results`` (the JSON-lines file) and ``runs``, each a dict with ``source`` ("kshare" or "kafka"),
``bootstrap``, ``topic``, ``tasks``, ``per_task``, ``records`` and, for kshare, ``group`` and
``watch_ms``. Every query is the same: ``value`` -> a Python UDF that sleeps 5 ms -> ``foreachBatch``
counting the rows of each task (one action), default trigger; what is measured comes from
``StreamingQueryProgress`` (``query.recentProgress``).

Kept in a process of its own so that the JVM's and ivy's output go to a log file, and a hung or
crashed Spark is stopped with it. :func:`summarize` needs no pyspark.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
import tempfile
import time
import traceback
from datetime import datetime
from typing import Any

WORK_S = 0.005  # the UDF's sleep per record
PHASES = ("latestOffset", "walCommit", "queryPlanning", "addBatch", "commitOffsets", "triggerExecution")


def work(value: bytes) -> int:
    """The UDF: 5 ms of (I/O-bound) work per record."""
    time.sleep(WORK_S)
    return len(value)


KAFKA_ARTIFACT = "org.apache.spark:spark-sql-kafka-0-10_2.13"  # Spark 4 is Scala 2.13 only
MAVEN_METADATA = "https://repo1.maven.org/maven2/org/apache/spark/spark-sql-kafka-0-10_2.13/maven-metadata.xml"


def kafka_package(version: str, published: list[str] | None = None) -> str:
    """Spark's Kafka source for pyspark ``version``: the same version when Maven Central has it (or
    ``published`` is unknown), else the newest release there of the same major version not newer than
    it (a pyspark on PyPI can be ahead of Maven Central: 4.3.0 was, with 4.2.0 the newest there)."""
    def key(v: str) -> tuple[int, ...]:
        return tuple(int(x) for x in v.split("."))

    if not published or version in published:
        return f"{KAFKA_ARTIFACT}:{version}"
    releases = [v for v in published if re.fullmatch(r"\d+\.\d+\.\d+", v)
                and v.split(".")[0] == version.split(".")[0] and key(v) <= key(version)]
    return f"{KAFKA_ARTIFACT}:{max(releases, key=key)}" if releases else f"{KAFKA_ARTIFACT}:{version}"


def published_versions(timeout: float = 15.0) -> list[str] | None:
    """The versions of Spark's Kafka source on Maven Central (one request), None if unknown."""
    import urllib.request

    try:
        with urllib.request.urlopen(MAVEN_METADATA, timeout=timeout) as answer:
            return re.findall(r"<version>([^<]+)</version>", answer.read().decode())
    except OSError:
        return None


def pyspark_problem() -> str | None:
    """Why this machine cannot run the scenario's Spark side, or None."""
    try:
        import pyarrow  # noqa: F401
        import pyspark
    except ImportError as exc:
        return f"{exc.name} is not installed: pip install 'kshare[spark]' (pyspark 4.2+, pyarrow, cramjam)"
    major, minor = (int(x) for x in pyspark.__version__.split(".")[:2])
    if (major, minor) < (4, 2):
        return f"pyspark {pyspark.__version__} is too old for the kshare source: pip install 'pyspark>=4.2'"
    return None


# --------------------------------------------------------------------------------------------
# the figures of one query, from its progress


def summarize(batches: list[dict[str, Any]], tasks: int, records: int, work_s: float = WORK_S) -> dict[str, Any]:
    """Records/s and overhead per micro-batch of one query from its non-empty micro-batches (dicts of
    ``start`` (epoch s), ``rows``, ``durationMs`` and, from the sink, ``busiest``), in order.

    Steady state leaves out the first micro-batch (members join, the Python workers start): the rate
    is the rows of the later micro-batches over the time from the end of the first to the end of the
    last; the overhead of a micro-batch is its ``triggerExecution`` minus the ideal, rows x 5 ms /
    tasks."""
    batches = [b for b in batches if b["rows"] > 0]
    out: dict[str, Any] = {"batches": len(batches), "rows": sum(b["rows"] for b in batches), "records": records}
    if len(batches) < 2:
        return {**out, "records_per_s": float("nan"), "overhead_ms": float("nan")}
    ends = [b["start"] + b["durationMs"].get("triggerExecution", 0) / 1000 for b in batches]
    steady = batches[1:]
    span = ends[-1] - ends[0]
    rows = sum(b["rows"] for b in steady)
    overheads = [b["durationMs"].get("triggerExecution", 0) - b["rows"] * work_s * 1000 / tasks for b in steady]
    busiest = [b["durationMs"].get("triggerExecution", 0) - b["busiest"] * work_s * 1000
               for b in steady if b.get("busiest")]
    rate = rows / span if span > 0 else float("nan")
    return {
        **out,
        "records_per_s": rate,
        "ideal_rps": tasks / work_s,
        "of_ideal": rate * work_s / tasks,
        "overhead_ms": statistics.mean(overheads),
        "overhead_median_ms": statistics.median(overheads),
        "overhead_max_ms": max(overheads),
        # the old figure of docs/benchmarks/spark.md: the micro-batch minus the work of its busiest task
        "overhead_busiest_ms": statistics.mean(busiest) if busiest else float("nan"),
        "rows_per_batch": rows / len(steady),
        "first_batch_ms": batches[0]["durationMs"].get("triggerExecution", 0),
        "second_batch_overhead_ms": overheads[0],
        "phases_ms": {k: statistics.mean(b["durationMs"].get(k, 0) for b in steady) for k in PHASES},
        "gaps_ms": statistics.mean(
            max(0.0, (b["start"] - e) * 1000) for b, e in zip(batches[1:], ends, strict=False)
        ),
    }


# --------------------------------------------------------------------------------------------
# the Spark side (the child process)


def _session(cores: int, packages: str) -> Any:
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(f"local[{cores}]")
        .appName("kshare-bench-spark")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(cores))
        .config("spark.driver.memory", "2g")
    )
    if packages:
        builder = builder.config("spark.jars.packages", packages)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _kshare_format(spark: Any, watch_ms: float | None) -> str:
    """Register the kshare source under a name of its own whose readers set the workers' commit
    watch interval (``kshare.spark.worker.WATCH_INTERVAL_S``) before reading: Python workers are
    reused from one query to the next, so every query sets it, to ``watch_ms`` or to the code's
    value. A class made here is pickled by value (as ``kshare.spark.register`` does)."""
    from kshare.spark import worker
    from kshare.spark.source import ShareSource, ShareStreamReader

    watch_s = watch_ms / 1000.0 if watch_ms is not None else worker.WATCH_INTERVAL_S
    name = f"kshare-bench-watch{round(watch_s * 1000)}"

    class Reader(ShareStreamReader):
        def read(self, partition: Any) -> Any:
            from kshare.spark import worker as w

            w.WATCH_INTERVAL_S = watch_s
            return super().read(partition)

    class Source(ShareSource):
        default_parallelism = spark.sparkContext.defaultParallelism

        @classmethod
        def name(cls) -> str:
            return name

        def streamReader(self, schema: Any) -> Any:
            return Reader(self.opts)

    spark.dataSource.register(Source)
    return name


def run_query(spark: Any, run: dict[str, Any], checkpoints: str) -> dict[str, Any]:
    from pyspark.sql import functions as F

    tasks, per_task, records = run["tasks"], run["per_task"], run["records"]
    sink_seen: dict[int, tuple[int, int]] = {}  # batch id -> (rows, rows of the busiest task)

    def sink(df: Any, batch_id: int) -> None:
        # one action (a share source cannot replay); count("n") needs the UDF's result
        counts = df.groupBy(F.spark_partition_id().alias("task")).agg(F.count("n").alias("c")).collect()
        sink_seen[batch_id] = (sum(r["c"] for r in counts), max((r["c"] for r in counts), default=0))

    if run["source"] == "kshare":
        reader = (
            spark.readStream.format(_kshare_format(spark, run.get("watch_ms")))
            .option("kafka.bootstrap.servers", run["bootstrap"])
            .option("kafka.share.group.id", run["group"])
            .option("subscribe", run["topic"])
            .option("parallelism", tasks)
            .option("maxRecordsPerTask", per_task)
        )
    else:
        reader = (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", run["bootstrap"])
            .option("subscribe", run["topic"])
            .option("startingOffsets", "earliest")
            .option("minPartitions", tasks)
            .option("maxOffsetsPerTrigger", tasks * per_task)
        )
    df = reader.load().select(F.udf(work, "int")("value").alias("n"))
    checkpoint = tempfile.mkdtemp(prefix=f"{run['source']}-", dir=checkpoints)
    t0 = time.monotonic()
    timeout = run.get("timeout_s", 600.0)
    q = df.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint).start()
    error = None
    try:
        while sum(n for n, _ in sink_seen.values()) < records:
            if q.exception() is not None:
                raise RuntimeError(f"query failed: {str(q.exception()).splitlines()[0]}")
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"{sum(n for n, _ in sink_seen.values())} of {records} rows in {timeout:.0f} s")
            time.sleep(0.1)
        # the progress of the last micro-batch comes after its commit (the kshare source's marker:
        # its workers accept and hold nothing into the next query)
        last = max(sink_seen)
        deadline = time.monotonic() + 30
        while not any(p.batchId >= last for p in q.recentProgress) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
    except Exception as exc:  # noqa: BLE001 - reported in the results, the next query runs
        error = f"{type(exc).__name__}: {exc}"
    finally:
        progress = list(q.recentProgress)
        q.stop()
    elapsed = time.monotonic() - t0
    batches = []
    for p in progress:
        if p.numInputRows <= 0:
            continue
        start = datetime.fromisoformat(p.timestamp.replace("Z", "+00:00")).timestamp()
        rows, busiest = sink_seen.get(p.batchId, (p.numInputRows, 0))
        batches.append({"batch": p.batchId, "start": start, "rows": p.numInputRows, "sink_rows": rows,
                        "busiest": busiest, "durationMs": dict(p.durationMs)})
    batches.sort(key=lambda b: b["batch"])
    out = {**run, "elapsed_s": elapsed, "micro_batches": batches, "sink_rows": sum(n for n, _ in sink_seen.values()),
           **summarize(batches, tasks, records)}
    if error:
        out["error"] = error
    return out


def main(argv: list[str]) -> int:
    plan = json.loads(open(argv[0]).read())  # noqa: SIM115
    results = open(plan["results"], "a", buffering=1)  # noqa: SIM115

    def emit(d: dict[str, Any]) -> None:
        results.write(json.dumps(d, default=str) + "\n")

    t0 = time.monotonic()
    try:
        import pyspark

        spark = _session(plan["cores"], plan.get("packages", ""))
    except Exception as exc:  # noqa: BLE001
        emit({"event": "session", "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()})
        return 1
    emit({"event": "session", "pyspark": pyspark.__version__, "spark": spark.version,
          "session_s": time.monotonic() - t0, "master": spark.sparkContext.master,
          "packages": plan.get("packages", "")})
    checkpoints = tempfile.mkdtemp(prefix="kshare-bench-spark-")
    try:
        for run in plan["runs"]:
            try:
                emit({"event": "run", **run_query(spark, run, checkpoints)})
            except Exception as exc:  # noqa: BLE001
                emit({"event": "run", **run, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()})
    finally:
        spark.stop()
        import shutil

        shutil.rmtree(checkpoints, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
