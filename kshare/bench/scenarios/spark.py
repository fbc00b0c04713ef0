"""The ``spark`` scenario of ``kshare bench``: The kshare PySpark source vs Spark's own Kafka source (the query runs in
``python -m kshare.bench.sparkrun``)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from typing import TYPE_CHECKING, Any

from .. import clients, sparkrun
from ..format import bars, fmt_num, fmt_pct, fmt_ratio, table
from ..procs import _die_with_parent, kshare_env
from .common import PYSPARK, UPSTREAM, alternate, median, scenario, target

if TYPE_CHECKING:
    from ..runner import Env, Progress

SPARK_RATE_TARGET = 0.9  # the kshare source's records/s / Spark's Kafka source's (issue 38)
SPARK_OVERHEAD_TARGET_MS = 200.0  # the kshare source's overhead per micro-batch - the Kafka source's

# queries of 30 s of ideal work (12 micro-batches of 2.5 s), 9 per repeat (2 pairs side by side, each also
# with the kshare workers' commit watch at 20 ms instead of 100, and kshare alone at 3 more parallelisms),
# about 8 minutes a repeat on the project's 2-core machine
SIZES = (
    {"seconds": 30.0, "pairs": [(1, 4), (2, 8)], "alone": [1, 2, 4, 8], "watch_ms": [20]},
    {"seconds": 8.0, "pairs": [(1, 4), (2, 8)], "alone": [1, 8], "warmup": False},
)


def _produce_records(bootstrap: str, topic: str, records: int, size: int, partitions: int) -> None:
    """``records`` values of ``size`` bytes, round robin over the partitions, in producer batches of
    16 KB (the Java producer's default ``batch.size``; about 150 records of 100 B), as an application
    writes them: the topic both Spark sources read."""
    from confluent_kafka import KafkaException, Producer

    errors: list[object] = []
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 5,
            "batch.size": 16384,
            "compression.type": "none",
            "acks": "all",
            "delivery.report.only.error": True,
            "on_delivery": lambda err, msg: errors.append(err),
        }
    )
    value = bytes(size)
    for i in range(records):
        try:
            producer.produce(topic, value, partition=i % partitions)
        except BufferError:
            producer.poll(0.05)
            producer.produce(topic, value, partition=i % partitions)
    left = producer.flush(120)
    if left or errors:
        raise KafkaException(f"produce to {topic}: {left} undelivered, errors {errors[:3]}")


def _spark_locks(tasks: int, partitions: int, per_task: int, cap: int = 4000) -> int:
    """``share.partition.max.record.locks`` as docs/guide/spark.md advises: twice what one micro-batch's
    tasks hold of a partition (so micro-batch N+1 acquires while N waits for its commit), at least
    the default 2000 and at most kshare's default cap."""
    return max(2000, min(cap, 2 * math.ceil(tasks / partitions) * per_task))


def _spark_child(env: Env, progress: Progress, plan: dict[str, Any], label: dict[str, str],
                 timeout: float) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run ``plan`` in ``python -m kshare.bench.sparkrun`` (output to spark.log); one progress step
    per query. Returns the session's line and the queries' results."""

    out = env.options.out / "spark"
    out.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex[:6]
    plan_path, results_path = out / f"plan-{tag}.json", out / f"results-{tag}.jsonl"
    plan = {**plan, "results": str(results_path.resolve())}
    plan_path.write_text(json.dumps(plan, indent=1))
    results_path.write_text("")
    log = open(env.options.out / "spark.log", "a")  # noqa: SIM115
    child_env = {**os.environ, **kshare_env(), "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.Popen(
        _die_with_parent([sys.executable, "-m", "kshare.bench.sparkrun", str(plan_path.resolve())]),
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=child_env, start_new_session=True,
    )
    session: dict[str, Any] = {}
    runs: list[dict[str, Any]] = []
    seen = 0
    deadline = time.monotonic() + timeout
    try:
        while True:
            lines = results_path.read_text().splitlines()
            for line in lines[seen:]:
                d = json.loads(line)
                if d.get("event") == "session":
                    session = d
                    if "error" in d:
                        raise RuntimeError(f"Spark did not start: {d['error']} (see spark.log)")
                    progress.note(f"Spark {d['spark']} ({d['master']}, {d['packages'] or 'no packages'}) "
                                  f"ready in {d['session_s']:.0f} s")
                    continue
                runs.append(d)
                what = label.get(d.get("config", ""), d.get("config", ""))
                progress.step(
                    f"{what}: " + (f"failed: {d['error']}" if "error" in d else
                                   f"{d['records_per_s']:,.0f} rec/s ({d['of_ideal']:.0%} of ideal), overhead "
                                   f"{d['overhead_ms']:,.0f} ms per micro-batch")
                )
            seen = len(lines)
            if proc.poll() is not None:
                if len(runs) < len(plan["runs"]) and not session.get("error"):
                    raise RuntimeError(f"the Spark process exited ({proc.returncode}) after {len(runs)} of "
                                       f"{len(plan['runs'])} queries (see spark.log)")
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"the Spark queries did not finish within {timeout:.0f} s (see spark.log)")
            time.sleep(0.5)
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()
    return session, runs


def run(env: Env, progress: Progress, *, seconds: float, repeats: int,
        pairs: list[tuple[int, int]] | None = None, alone: list[int] | None = None, per_task: int = 500,
        value_size: int = 100, watch_ms: list[float] | None = None, warmup: bool = True) -> dict[str, Any]:
    """The kshare source (``format("kshare")``, through the kshare proxy) against Spark's own Kafka
    source (``format("kafka")``, directly on the fronted Kafka 3.9) in one Spark session, local mode:
    the same topic, a Python UDF of 5 ms per record, a ``foreachBatch`` sink counting rows, the default
    trigger. ``pairs`` (partitions, tasks): both sources side by side (kshare ``parallelism`` = tasks,
    the Kafka source's ``minPartitions`` = tasks and ``maxOffsetsPerTrigger`` = tasks x ``per_task``,
    kshare's ``maxRecordsPerTask``); ``alone``: the kshare source alone at these parallelisms on one
    partition (a pair's figure is reused for its parallelism). Each query reads ``tasks x 200 x
    seconds`` records (its ideal run time is ``seconds``). ``watch_ms``: more kshare configurations in
    the pairs, with the workers' commit watch at these intervals instead of the code's."""

    problem = sparkrun.pyspark_problem()
    if problem:
        raise RuntimeError(problem)
    import pyspark

    pairs = [tuple(p) for p in (pairs or [(1, 4), (2, 8)])]  # type: ignore[misc]
    alone = [p for p in (alone or [1, 2, 4, 8]) if (1, p) not in pairs]
    watch_ms = list(watch_ms or [])
    upstream = env.upstream()
    proxy = env.proxy()
    cores = max([t for _, t in pairs] + alone)
    rate = 1.0 / sparkrun.WORK_S  # per task
    kinds = ["kafka", "kshare", *(f"kshare-watch{w:g}" for w in watch_ms)]
    label = {}

    def records_for(tasks: int) -> int:
        # whole micro-batches: every one full, for both sources
        batch = tasks * per_task
        return max(3, round(tasks * rate * seconds / batch)) * batch

    topics: dict[tuple[int, int], str] = {}

    def topic_for(partitions: int, records: int) -> str:
        if (partitions, records) not in topics:
            name = clients.create_topic(upstream, f"bench-spark-{partitions}p-{uuid.uuid4().hex[:8]}", partitions)
            topics[(partitions, records)] = name
            _produce_records(upstream, name, records, value_size, partitions)
        return topics[(partitions, records)]

    def query(kind: str, partitions: int, tasks: int, records: int) -> dict[str, Any]:
        config = f"{kind} {partitions}p {tasks}t"
        topic = topic_for(partitions, records)
        q: dict[str, Any] = {"config": config, "kind": kind, "source": "kafka" if kind == "kafka" else "kshare",
                             "partitions": partitions, "tasks": tasks, "per_task": per_task, "records": records,
                             "topic": topic, "timeout_s": 10 * seconds + 300}
        if kind == "kafka":
            q["bootstrap"] = upstream
            label[config] = f"Kafka source, {partitions} partition(s), {tasks} tasks"
        else:
            group = f"bench-spark-{uuid.uuid4().hex[:8]}"
            locks = _spark_locks(tasks, partitions, per_task)
            clients.set_group_configs(proxy.bootstrap, group, {"share.auto.offset.reset": "earliest",
                                                               "share.partition.max.record.locks": locks})
            q.update(bootstrap=proxy.bootstrap, group=group, record_locks=locks)
            if kind != "kshare":
                q["watch_ms"] = float(kind.removeprefix("kshare-watch"))
            label[config] = f"{kind}, {partitions} partition(s), {tasks} tasks"
        return q

    runs: list[dict[str, Any]] = []
    if warmup:  # the JVM, the Python workers, the first connections: not measured
        wp, wt = pairs[0]
        for kind in kinds[:2]:
            runs.append({**query(kind, wp, wt, 3 * wt * per_task), "warmup": True})
    for r in range(repeats):
        for partitions, tasks in pairs:
            for kind in alternate(kinds, r):
                runs.append({**query(kind, partitions, tasks, records_for(tasks)), "repeat": r})
        for tasks in alternate(alone, r):
            runs.append({**query("kshare", 1, tasks, records_for(tasks)), "repeat": r})
    progress.begin("spark", len(runs))
    packages = sparkrun.kafka_package(pyspark.__version__, sparkrun.published_versions())
    plan = {"cores": cores, "packages": packages, "runs": runs}
    expected_s = sum(q["records"] / (q["tasks"] * rate) * 1.4 + 10 for q in runs)
    try:
        session, results = _spark_child(env, progress, plan, label, timeout=expected_s + 900)
    finally:
        for name in topics.values():
            clients.delete_topic(upstream, name)
    progress.end()
    samples = [s for s in results if not s.get("warmup")]

    def med(config: str, key: str) -> float:
        return median([s.get(key) for s in samples if s.get("config") == config and "error" not in s])

    rows: list[dict[str, Any]] = []
    configs = list(dict.fromkeys(s["config"] for s in runs if not s.get("warmup")))
    for config in configs:
        first = next(s for s in runs if s["config"] == config)
        done = [s for s in samples if s.get("config") == config and "error" not in s]
        row: dict[str, Any] = {
            "config": config,
            "label": label.get(config, config),
            "kind": first["kind"],
            "source": first["source"],
            "partitions": first["partitions"],
            "tasks": first["tasks"],
            "records": first["records"],
            "record_locks": first.get("record_locks"),
            "runs": len(done),
            "failed": len([s for s in samples if s.get("config") == config and "error" in s]),
            "records_per_s": med(config, "records_per_s"),
            "ideal_rps": first["tasks"] * rate,
            "overhead_ms": med(config, "overhead_ms"),
            "overhead_median_ms": med(config, "overhead_median_ms"),
            "overhead_busiest_ms": med(config, "overhead_busiest_ms"),
            "second_batch_overhead_ms": med(config, "second_batch_overhead_ms"),
            "first_batch_ms": med(config, "first_batch_ms"),
            "rows_per_batch": med(config, "rows_per_batch"),
            "batches": med(config, "batches"),
            "gaps_ms": med(config, "gaps_ms"),
            "rows_delivered": [s.get("rows") for s in done],
            "phases_ms": {k: median([s["phases_ms"].get(k) for s in done if s.get("phases_ms")])
                          for k in sparkrun.PHASES},
        }
        row["of_ideal"] = row["records_per_s"] / row["ideal_rps"]
        rows.append(row)
    targets = []
    by = {r["config"]: r for r in rows}
    for partitions, tasks in pairs:
        kafka, kshare = by.get(f"kafka {partitions}p {tasks}t"), by.get(f"kshare {partitions}p {tasks}t")
        if not kafka or not kshare:
            continue
        kshare["vs_kafka_rps"] = kshare["records_per_s"] / kafka["records_per_s"]
        kshare["vs_kafka_per_round"] = median([
            a["records_per_s"] / b["records_per_s"]
            for a, b in zip(
                [s for s in samples if s["config"] == kshare["config"] and "error" not in s],
                [s for s in samples if s["config"] == kafka["config"] and "error" not in s],
                strict=False,
            )
        ])
        kshare["overhead_over_kafka_ms"] = kshare["overhead_ms"] - kafka["overhead_ms"]
        for w in watch_ms:
            other = by.get(f"kshare-watch{w:g} {partitions}p {tasks}t")
            if other:
                other["vs_kafka_rps"] = other["records_per_s"] / kafka["records_per_s"]
                other["overhead_over_kafka_ms"] = other["overhead_ms"] - kafka["overhead_ms"]
        what = f"{partitions} partition{'s' if partitions > 1 else ''}, {tasks} tasks"
        targets += [
            target(f"Spark, {what}: kshare source / Kafka source, records/s", kshare["vs_kafka_rps"],
                   SPARK_RATE_TARGET, ">="),
            target(f"Spark, {what}: kshare's overhead per micro-batch - the Kafka source's",
                   kshare["overhead_over_kafka_ms"], SPARK_OVERHEAD_TARGET_MS, "<=", "ms"),
        ]
    return {
        "config": {
            "seconds": seconds,
            "per_task": per_task,
            "value_size": value_size,
            "work_ms": sparkrun.WORK_S * 1000,
            "pairs": pairs,
            "alone": alone,
            "watch_ms": watch_ms,
            "repeats": repeats,
            "cores": cores,
            "packages": packages,
            "spark": session.get("spark"),
            "session_s": session.get("session_s"),
            "kafka_bootstrap": "the Kafka 3.9 broker directly" if not env.options.upstream else "--upstream directly",
            "kshare_bootstrap": "kshare proxy",
        },
        "rows": rows,
        "samples": samples,
        "targets": targets,
    }


# -- results.md and the plot ----------------------------------------------------------------------


def section(res: dict[str, Any]) -> list[str]:
    cfg = res.get("config", {})
    per_task, work = cfg.get("per_task", 500), cfg.get("work_ms", 5)
    out = [
        f"One Spark session ({cfg.get('spark', '?')}, `local[{cfg.get('cores', '?')}]`, "
        f"`spark.jars.packages={cfg.get('packages', '?')}`), streaming queries one after the other: "
        f"`value` -> a Python UDF sleeping {work:g} ms -> `foreachBatch` counting the rows of each task (one "
        "action), default trigger (processing time 0). The kshare source (`format(\"kshare\")`) reads through "
        "the kshare proxy, `parallelism` = tasks, `maxRecordsPerTask` "
        f"{per_task}, a fresh share group each query with `share.partition.max.record.locks` twice what one "
        "micro-batch holds of a partition (at most 4000, kshare's default cap); Spark's Kafka source "
        "(`format(\"kafka\")`) reads the same topic from the Kafka 3.9 broker directly, `startingOffsets` "
        f"earliest, `minPartitions` = tasks, `maxOffsetsPerTrigger` = tasks x {per_task}. Topics of "
        f"{cfg.get('value_size', 100)} B records in 16 KB producer batches, tasks x {1000 / work:.0f} x "
        f"{fmt_num(cfg.get('seconds'))} s of records per query (whole micro-batches of tasks x {per_task}).",
        "",
        "From `StreamingQueryProgress` (`query.recentProgress`), the first micro-batch left out: records/s = "
        "the rows of the later micro-batches / the time from the end of the first to the end of the last; "
        f"overhead per micro-batch = `durationMs.triggerExecution` - rows x {work:g} ms / tasks (the ideal), "
        "mean (median in brackets); 2nd = the overhead of the first measured micro-batch (the Python "
        "workers' first read). Medians over the repeats.",
        "",
    ]
    rows = res.get("rows", [])
    pairs = [r for r in rows if any((r["partitions"], r["tasks"]) == tuple(p) for p in cfg.get("pairs", []))]
    alone = [r for r in rows if r["kind"] == "kshare" and r["partitions"] == 1]

    def phases(r: dict[str, Any]) -> str:
        ph = r.get("phases_ms") or {}
        return " / ".join(fmt_num(ph.get(k)) for k in ("addBatch", "latestOffset", "walCommit", "commitOffsets"))

    names = {"kafka": "Spark's Kafka source", "kshare": "kshare source"}
    out += table(
        ["partitions, tasks", "source", "records/s", "of ideal", "vs Kafka source", "overhead ms", "2nd ms",
         "rows / micro-batch", "addBatch / latestOffset / walCommit / commitOffsets ms"],
        [
            [
                f"{r['partitions']}, {r['tasks']}",
                names.get(r["kind"], r["kind"].replace("kshare-watch", "kshare source, commit watch ") + " ms"),
                fmt_num(r.get("records_per_s")),
                fmt_pct(r.get("of_ideal")),
                fmt_ratio(r.get("vs_kafka_rps")) if r["kind"] != "kafka" else "1",
                f"{fmt_num(r.get('overhead_ms'))} ({fmt_num(r.get('overhead_median_ms'))})",
                fmt_num(r.get("second_batch_overhead_ms")),
                fmt_num(r.get("rows_per_batch")),
                phases(r),
            ]
            for r in pairs
        ],
        "llrrrrrrr",
    )
    out.append("")
    out += _spark_rounds(res)
    if alone:
        out += ["The kshare source alone on one partition:", ""]
        out += table(
            ["parallelism", "record locks", "ideal rec/s", "records/s", "of ideal", "overhead ms", "2nd ms",
             "rows / micro-batch", "addBatch / latestOffset / walCommit / commitOffsets ms"],
            [
                [
                    str(r["tasks"]),
                    fmt_num(r.get("record_locks")),
                    fmt_num(r.get("ideal_rps")),
                    fmt_num(r.get("records_per_s")),
                    fmt_pct(r.get("of_ideal")),
                    f"{fmt_num(r.get('overhead_ms'))} ({fmt_num(r.get('overhead_median_ms'))})",
                    fmt_num(r.get("second_batch_overhead_ms")),
                    fmt_num(r.get("rows_per_batch")),
                    phases(r),
                ]
                for r in sorted(alone, key=lambda r: r["tasks"])
            ],
        )
        out.append("")
    failed = [r for r in rows if r.get("failed")]
    for r in failed:
        out += [f"**{r['label']}: {r['failed']} query(ies) failed** (see results.json, spark.log).", ""]
    return out


def _spark_rounds(res: dict[str, Any]) -> list[str]:
    """Round by round: each repeat ran the configurations of a pair one after the other."""
    samples = [s for s in res.get("samples", []) if "error" not in s and s.get("repeat") is not None]
    out = []
    for p, t in (tuple(x) for x in res.get("config", {}).get("pairs", [])):
        by = {(s["kind"], s["repeat"]): s for s in samples if (s["partitions"], s["tasks"]) == (p, t)}
        rounds = sorted({r for _, r in by})

        def pairs(a: str, b: str, by: dict = by, rounds: list = rounds) -> list[tuple[dict, dict]]:
            return [(by[(a, r)], by[(b, r)]) for r in rounds if (a, r) in by and (b, r) in by]

        ks = pairs("kshare", "kafka")
        if not ks:
            continue
        line = (
            f"{p} partition{'s' if p > 1 else ''} x {t} tasks, round by round: kshare / Kafka source records/s "
            + ", ".join(fmt_ratio(k["records_per_s"] / f["records_per_s"]) for k, f in ks)
            + "; kshare's overhead - the Kafka source's "
            + ", ".join(f"{k['overhead_ms'] - f['overhead_ms']:+,.0f}" for k, f in ks)
            + " ms"
        )
        for kind in sorted({k for k, _ in by if k.startswith("kshare-watch")}):
            ws = pairs(kind, "kshare")
            if ws:
                line += (f"; {kind.removeprefix('kshare-watch')} ms commit watch / 100 ms, records/s "
                         + ", ".join(fmt_ratio(w["records_per_s"] / k["records_per_s"]) for w, k in ws))
        out += [line + ".", ""]
    return out


def plot(plt: Any, res: dict[str, Any]) -> Any:
    rows = res["rows"]
    cfg = res.get("config", {})
    pairs = [tuple(p) for p in cfg.get("pairs", [])]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    groups = [f"{p} partition(s), {t} tasks" for p, t in pairs]
    kinds = list(dict.fromkeys(r["kind"] for r in rows if (r["partitions"], r["tasks"]) in pairs))
    by = {(r["kind"], r["partitions"], r["tasks"]): r for r in rows}
    bars(ax, groups, {k: [by.get((k, p, t), {}).get("records_per_s") for p, t in pairs] for k in kinds},
          "records/s (steady)")
    for i, (_, t) in enumerate(pairs):
        ax.plot([i - 0.45, i + 0.45], [t * 1000 / cfg.get("work_ms", 5.0)] * 2, color="black", lw=0.8, alpha=0.6)
    ax.set_title("side by side (black: the ideal, tasks x 200 rec/s)", fontsize=10)
    bars(ax2, groups, {k: [by.get((k, p, t), {}).get("overhead_ms") for p, t in pairs] for k in kinds},
          "overhead per micro-batch, ms")
    ax2.set_title("micro-batch time - rows x 5 ms / tasks", fontsize=10)
    return fig


SCENARIO = scenario(
    __name__, "The kshare PySpark source vs Spark's own Kafka source: 5 ms of work per record",
    needs=frozenset({UPSTREAM, PYSPARK}),
    opt_in=True,  # about 25 minutes; needs pyspark, and Spark's Kafka source from Maven Central
)
