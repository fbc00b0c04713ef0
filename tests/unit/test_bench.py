"""``kshare bench`` without brokers: option parsing, the report and plots of a synthetic results dict,
the clear errors when Kafka or matplotlib is missing, and that ``tests.harness.brokers`` extends the package's brokers."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from kshare.bench import report, runner, scenarios
from kshare.bench.brokers import BrokerError
from kshare.bench.scenarios.common import cache_budget_mb
from kshare.bench.scenarios.failover_analysis import failover_analysis
from kshare.bench.scenarios.latency import latency_windows
from kshare.cli import main


def synthetic() -> dict:
    """A results dict as the runner builds it (JSON round trip: what results.json holds)."""
    pt_rows = []
    for kind in ("produce", "consume"):
        for size in (100, 1024):
            pt_rows.append(
                {
                    "workload": kind,
                    "value_size": size,
                    "records": 1000,
                    "direct_rps": 100_000.0,
                    "direct_mbps": 10.0,
                    "relay_rps": 90_000.0,
                    "relay_mbps": 9.0,
                    "kshare_rps": 88_000.0,
                    "kshare_mbps": 8.8,
                    "kshare_cpu_s": 0.2,
                    "kshare_mcores_per_mbps": 20.0,
                    "kshare_relay": 88 / 90,
                    "kshare_direct": 0.88,
                }
            )
    share_rows = [
        {
            "value_size": size,
            "partitions": p,
            "records": 1000,
            "classic_rps": 1e5,
            "kshare_rps": 2e5,
            "native_rps": 1.5e5,
            "classic_first_s": 0.3,
            "kshare_first_s": 0.5,
            "native_first_s": 1.1,
            "classic_total_rps": 9e4,
            "kshare_total_rps": 1e5,
            "native_total_rps": 8e4,
            "kshare_cpu_s": 1.0,
            "kshare_mcores_per_mbps": 30.0,
            "kshare_native": 4 / 3,
            "kshare_classic": 2.0,
        }
        for size in (100, 1024)
        for p in (1, 4)
    ]
    scaling_rows = [
        {
            "consumers": n,
            "partitions": p,
            "ideal_rps": n * 200.0,
            "kshare_rps": n * 190.0,
            "kshare_of_ideal": 0.95,
            "kshare_busy": n,
            "native_rps": n * 150.0,
            "native_of_ideal": 0.75,
            "native_busy": n,
        }
        for n, p in [(1, 1), (2, 1), (4, 1), (4, 4), (8, 4), (3, 2)]
    ]
    lat_rows = [
        {
            "system": s,
            "p50_ms": 1.0 + i,
            "p99_ms": 3.0 + i,
            "p999_ms": 6.0 + i,
            "max_ms": 20.0,
            "sent": 5000,
            "received": 5000,
            "duplicates": 0,
            "quantiles_ms": [0.5 + i + k / 100 for k in range(200)],
            "tail_ms": [3.0 + i + k for k in range(9)],
        }
        for i, s in enumerate(("direct", "kshare", "native"))
    ]
    ack_rows = [
        {
            "system": system,
            "rate": rate,
            "members": n,
            "acks": 100,
            "p50_ms": 1.0 + n / 16,
            "p99_ms": 4.0,
            "mean_ms": 1.5,
            "vs_one": (1.0 + n / 16) / (1 + 1 / 16),
        }
        for rate in (0.0, 400.0)
        for system in ("kshare", "native")
        for n in (1, 4, 16, 64)
    ]
    mem_row = {
        "groups": 10,
        "members_per_group": 100,
        "connections": 1000,
        "partitions": 1000,
        "share_partitions_touched": 10_000,
        "records_acquired": 1_000_000,
        "data_mb": 102.4,
        "cache_budget_mb": 64,
        "rss_idle_mb": 80.0,
        "rss_peak_mb": 300.0,
        "rss_loaded_mb": 280.0,
        "rss_after_close_mb": 200.0,
        "record_cache_mb": 63.0,
        "record_cache_budget_metric_mb": 64.0,
        "record_cache_partitions": 900.0,
        "client_connections_metric": 1000.0,
        "record_cache_mb_after_close": 60.0,
        "cpu_s": 12.0,
        "rss_limit_mb": 344.0,
    }
    cpu_rows = [
        {
            "workload": "pass-through consume",
            "value_size": 100,
            "mbps": 10.0,
            "cpu_s": 0.2,
            "mcores_per_mbps": 20.0,
        }
    ]
    embedded_rows = [
        {
            "system": system,
            "p50_ms": 1.5 + i,
            "p99_ms": 9.0 + i,
            "p999_ms": 15.0,
            "max_ms": 40.0,
            "sent": 63_000,
            "received": 63_000,
            "duplicates": 0,
            "measured": 60_000,
            "producer_lag_max_ms": 2.0,
            "window_p50_min_ms": 1.2 + i,
            "window_p50_max_ms": 2.5 + i,
            "window_p99_min_ms": 5.0 + i,
            "window_p99_max_ms": 20.0 + i,
            "windows": [
                {"start_s": t0, "received": 10_000, "p50_ms": 1.5 + i, "p99_ms": 9.0 + i, "max_ms": 12.0,
                 "warmup": t0 < 0}
                for t0 in (-30.0, -20.0, -10.0, 0.0, 10.0, 20.0)
            ],
        }
        for i, system in enumerate(("kshare", "native"))
    ]
    embedded_starts = [
        {"run": "first (empty cache, empty data dir)", "ready_s": 31.5, "broker_start_s": 27.0,
         "fetched_jars": 70, "fetched_mb": 90.0},
        *({"run": f"restart {i}", "ready_s": 6.0 + i, "broker_start_s": 4.0, "fetched_jars": 0} for i in (1, 2, 3)),
    ]
    spark_rows = [
        {"config": f"{kind} {p}p {n}t", "label": kind, "kind": kind, "source": kind.split("-")[0], "partitions": p,
         "tasks": n, "records": n * 6000, "record_locks": 4000 if kind != "kafka" else None, "runs": 1, "failed": 0,
         "records_per_s": 160.0 * n, "ideal_rps": 200.0 * n, "of_ideal": 0.8, "overhead_ms": 600.0 + i,
         "overhead_median_ms": 550.0, "second_batch_overhead_ms": 900.0, "rows_per_batch": 500.0 * n,
         "phases_ms": {"addBatch": 2900.0, "latestOffset": 10.0, "walCommit": 50.0, "commitOffsets": 50.0}}
        for p, n in ((1, 4), (2, 8)) for i, kind in enumerate(("kafka", "kshare"))
    ] + [
        {"config": f"kshare 1p {n}t", "label": "kshare", "kind": "kshare", "source": "kshare", "partitions": 1,
         "tasks": n, "records": n * 6000, "record_locks": 2000, "runs": 1, "failed": 0, "records_per_s": 160.0 * n,
         "ideal_rps": 200.0 * n, "of_ideal": 0.8, "overhead_ms": 600.0, "overhead_median_ms": 550.0,
         "second_batch_overhead_ms": 900.0, "rows_per_batch": 500.0 * n, "phases_ms": {}}
        for n in (1, 2, 8)
    ]
    spark_rows[1]["vs_kafka_rps"] = spark_rows[3]["vs_kafka_rps"] = 1.0
    failover_rows = [
        {"system": system, "records": 60_000, "lost": 0, "lost_ids": [], "deliveries": 60_000 + extra,
         "redeliveries": extra, "redelivered_pct": extra / 600, "roll_redeliveries": extra,
         "roll_redelivered_pct": extra / 600, "longest_stall_s": 2.5 + i, "baseline_longest_stall_s": 0.4,
         "producer_longest_gap_s": 6.0 + i, "producer_longest_wait_s": 7.0, "produce_failed": 0,
         "ack_failed": {"INVALID_RECORD_STATE": 3} if i else {}, "late_deliveries": 0, "seconds": 300.0,
         "drain_s": 40.0, "stalls_over_1s": [[100.0, 2.5]],
         "windows": [{"name": "before the faults", "at_s": 0.0, "deliveries": 9000, "redeliveries": 0,
                      "redelivered_pct": 0.0, "longest_stall_s": 0.4, "producer_longest_gap_s": 0.1,
                      "producer_longest_wait_s": 0.05}]
         + [{"name": f"SIGTERM node {n}", "at_s": 15.0 + 40 * n, "exit_s": 2.0, "back_s": 9.0, "in_sync_s": 12.0,
             "leaders_back_s": 20.0, "partitions": [n - 1, n + 2], "deliveries": 12_000, "redeliveries": extra // 3,
             "redelivered_pct": extra / 1800, "first_record_s": 0.05, "first_record_of_its_partitions_s": 1.5,
             "longest_stall_s": 2.5 + i, "producer_longest_gap_s": 6.0 + i, "producer_longest_wait_s": 7.0}
            for n in (1, 2, 3)],
         "timeline": {"deliveries": [600] * 300, "redeliveries": [extra // 300] * 300, "produced": [80] * 250},
         "faults_at_s": [{"fault": f"SIGTERM node {n}", "signal_s": 15.0 + 40 * n, "back_s": 24.0 + 40 * n}
                         for n in (1, 2, 3)],
         **({"proxy_running_at_end": True} if system == "kshare" else {})}
        for i, (system, extra) in enumerate((("kshare", 300), ("native", 120_000)))
    ]
    t = scenarios.target
    results = {
        "meta": {
            "command": "kshare bench --quick",
            "started": "2026-01-01T00:00:00Z",
            "elapsed_s": 123.0,
            "quick": True,
            "repeats": 1,
            "machine": {"nproc": 2, "python": "3.11"},
            "load_before": "1 1 1",
            "load_after": "2 2 2",
            "upstream": "Apache Kafka 3.9.2",
            "reference": "Apache Kafka 4.4.0",
            "proxy_log_notes": ["2026 WARNING kshare: something"],
        },
        "scenarios": {
            "passthrough": {
                "config": {
                    "records": {"100": 1000},
                    "partitions": 4,
                    "configs": ["direct", "relay", "kshare"],
                },
                "rows": pt_rows,
                "targets": [t("pass-through produce 100 B: kshare / relay", 88 / 90, 0.95, ">=")],
                "seconds": 10.0,
            },
            "share": {
                "config": {"records": {"100": 1000}, "configs": ["classic", "kshare", "native"]},
                "rows": share_rows,
                "targets": [t("share 100 B: kshare / native", 4 / 3, 1.0, ">=")],
            },
            "scaling": {
                "config": {"work_ms": 5.0, "seconds": 3.0, "max_poll_records": 25},
                "rows": scaling_rows,
                "targets": [],
            },
            "latency": {
                "config": {"rate": 5000.0, "seconds": 5.0},
                "rows": lat_rows,
                "targets": [t("added p99", 1.0, 2.0, "<=", "ms")],
            },
            "ack": {
                "config": {"records_per_ack": 50},
                "rows": ack_rows,
                "targets": [t("ack 16 / 1", 2 / (1 + 1 / 16), 2.0, "<=")],
            },
            "cpu": {
                "config": {"source": "measured here"},
                "rows": cpu_rows,
                "targets": [t("cpu", 20.0, 35.0, "<=", "mcores/(MB/s)")],
            },
            "memory": {
                "config": {},
                "rows": [mem_row],
                "targets": [t("peak RSS", 300.0, 344.0, "<=", "MB"), t("cache", 63.0, 64.0, "<=", "MB")],
            },
            "embedded": {
                "config": {"rate": 1000.0, "seconds": 60.0, "warmup_s": 30.0, "window_s": 10.0,
                           "command": "KSHARE_CACHE=c kshare proxy --embedded kafka"},
                "rows": embedded_rows,
                "starts": embedded_starts,
                "ready": {"first_s": 31.5, "later_s": [7.0, 8.0, 9.0], "later_median_s": 8.0},
                "targets": [t("window medians", 2.5, 3.0, "<=", "ms"), t("p99", 9.0, 25.0, "<=", "ms")],
            },
            "spark": {
                "config": {"seconds": 30.0, "per_task": 500, "work_ms": 5.0, "pairs": [[1, 4], [2, 8]],
                           "alone": [1, 2, 8], "cores": 8, "spark": "4.3.0",
                           "packages": "org.apache.spark:spark-sql-kafka-0-10_2.13:4.3.0"},
                "rows": spark_rows,
                "targets": [t("kshare / Kafka source", 1.0, 0.9, ">="), t("overhead", 1.0, 200.0, "<=", "ms")],
            },
            "failover": {
                "config": {"records_before": 40_000, "records_during": 20_000, "rate": 80.0, "partitions": 6,
                           "consumers": 4, "work_ms": 6.0, "max_poll": 100, "lock_ms": 15_000, "baseline_s": 15.0,
                           "settle_s": 5.0, "faults": ["SIGTERM node 1", "SIGTERM node 2", "SIGTERM node 3"],
                           "command": "kshare proxy --upstream a,b,c"},
                "rows": failover_rows,
                "proxy_log": {"counts": {"WARNING": 2, "ERROR": 0, "Traceback": 0},
                              "distinct": [{"count": 2, "pattern": "WARNING x", "first": "t WARNING broker 1 left"}]},
                "proxy_metrics": {"kshare_state_batches_resent_total": 4.0},
                "targets": [t("failover, kshare: records lost", 0, 0, "<="),
                            t("failover, kshare: redeliveries", 0.5, 10.0, "<=", "%")],
            },
        },
        "errors": {"other": "TimeoutError: synthetic"},
    }
    results["scenarios"]["aioconsumer"] = {
        "config": {"records": {100: 300_000}, "partitions": 4, "repeats": 5, "clients": ["confluent", "aio"],
                   "systems": ["kshare"], "max_poll_records": 500},
        "rows": [{"system": "kshare", "value_size": 100, "records": 300_000, "partitions": 4,
                  "confluent_rps": 400_000.0, "aio_rps": 360_000.0, "confluent_cpu_us": 0.8, "aio_cpu_us": 1.2,
                  "aio_vs_confluent": 0.9, "aio_vs_confluent_per_round": 0.88}],
        "targets": [],
    }
    return json.loads(json.dumps(results))


def test_markdown_has_every_section_and_marks_targets() -> None:
    results = synthetic()
    text = report.markdown(results)
    # the scenarios of a full run and the opt-in ones before issue 39 (the others': test_bench_scenarios.py)
    for name in results["scenarios"]:
        assert f"(`{name}`)" in text
    assert "| pass-through produce 100 B: kshare / relay | 0.98 | >= 0.95 | **met** |" in text
    assert "| share 100 B: kshare / native | 1.33 | >= 1.00 | **met** |" in text
    assert "**not met**" not in text
    assert "13 of 13 met." in text
    assert "**other failed**" in text
    assert "WARNING kshare: something" in text
    assert "| kshare | closed loop | 16 | 100 | - | 2.00 |" in text  # ack table
    assert "| native | 400 cycles/s | 16 | 100 | - | 2.00 |" in text
    assert "| 4 on 4 | 800 | 760 | 95% | 600 | 75% | 4 / 4 |" in text  # scaling table
    # embedded: both systems side by side, the windows after the warm-up only, the starts
    assert "| kshare, embedded Apache Kafka 3.9 | 1.50 | 9.00 | 15.00 | 40.0 | 1.20 - 2.50 | 5.00 - 20.00 |" in text
    assert "| 0-10 | 1.50 | 9.00 | 10,000 | 2.50 | 10.00 | 10,000 |" in text and "| -30--20 |" not in text
    assert "| first (empty cache, empty data dir) | 31.50 | 27.0 | 70 jars, 90 MB |" in text
    assert "**first 31.5 s, later 8.0 s median**" in text
    # spark: both sources side by side, then kshare alone
    assert "| 1, 4 | Spark's Kafka source | 640 | 80% | 1 | 600 (550) | 900 | 2,000 | 2,900 / 10 / 50 / 50 |" in text
    assert "| 2, 8 | kshare source | 1,280 | 80% | 1.00 | 601 (550) |" in text
    assert "| 8 | 2,000 | 1,600 | 1,280 | 80% | 600 (550) |" in text
    # failover: both systems side by side, then each one's faults
    assert "| | kshare on Kafka 3.9 | native Kafka 4.4 |" in text.replace("|  |", "| |")
    assert "| redeliveries over the roll + kill (% of the records) | 300 (0.5 %) | 120,000 (200.0 %) |" in text
    assert "| SIGTERM node 2 | 95 | 2.0 / 9.0 / 12 / 20 | 1,4 | 12,000 | 100 (0.2 %) | 0.05 | 1.50 | 2.50 |" in text
    assert "kshare's log: 2 WARNING, 0 ERROR, 0 traceback line(s)" in text and "`t WARNING broker 1 left`" in text


def test_target_met_and_not_met() -> None:
    assert scenarios.target("x", 0.9, 0.95, ">=")["met"] is False
    assert scenarios.target("x", 0.95, 0.95, ">=")["met"] is True
    assert scenarios.target("x", 2.5, 2.0, "<=")["met"] is False
    assert scenarios.target("x", float("nan"), 2.0, "<=")["met"] is False
    results = synthetic()
    results["scenarios"]["latency"]["targets"] = [scenarios.target("added p99", 3.5, 2.0, "<=", "ms")]
    assert "| added p99 | 3.50 ms | <= 2.00 ms | **not met** |" in report.markdown(results)


def test_plots_written(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    written = report.plots(synthetic(), tmp_path)
    assert sorted(written) == sorted(f"{name}.png" for name in synthetic()["scenarios"])
    for name in written:
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    results = synthetic()
    results["plots"] = written
    assert "![latency](latency.png)" in report.markdown(results)


def test_alternate_and_percentiles() -> None:
    assert scenarios.alternate(["a", "b", "c"], 0) == ["a", "b", "c"]
    assert scenarios.alternate(["a", "b", "c"], 1) == ["c", "b", "a"]
    xs = list(range(1, 1001))
    assert (
        scenarios.pct(xs, 0.5) == 500 and scenarios.pct(xs, 0.99) == 990 and scenarios.pct(xs, 0.999) == 999
    )
    assert cache_budget_mb(["--record-cache-mb", "32"], 64) == 32
    assert cache_budget_mb(["--record-cache-mb=16"], 64) == 16
    assert cache_budget_mb([], 64) == 64


def test_latency_windows() -> None:
    from array import array

    # 100 records/s, 10 s windows, the first 5 s (500 records) a warm-up
    seqs = array("q", range(2500))
    lat = array("d", [100.0 if s < 500 else 1.0 + (s % 1000) / 1000 for s in range(2500)])
    ws = latency_windows(seqs, lat, 100.0, 500, 10.0)
    assert [(w["start_s"], w["received"], w["warmup"]) for w in ws] == [
        (-10.0, 500, True), (0.0, 1000, False), (10.0, 1000, False)
    ]
    assert ws[0]["p50_ms"] == 100.0 and ws[1]["p50_ms"] == pytest.approx(1.499) and ws[1]["p99_ms"] == pytest.approx(1.989)


def test_failover_analysis() -> None:
    """Redeliveries per window, stalls only while a record was available and undelivered, the first
    record after a fault (of any partition, and of every partition its broker led), the producer's gaps."""
    # records 0-3 available at 0; 4 produced (acknowledged) at 10.5; 5 at 30 and never delivered
    available = {0: 0.0, 1: 0.0, 2: 0.0, 3: 0.0, 4: 10.5, 5: 30.0}
    deliveries = [(1.0, 0, 0), (1.0, 1, 1), (2.0, 2, 0), (12.0, 1, 1), (13.0, 4, 1), (20.0, 3, 0), (21.0, 3, 0)]
    windows = [{"name": "before", "start": 0.0, "end": 10.0},
               {"name": "SIGTERM node 1", "start": 10.0, "end": 40.0, "signal": 10.0, "partitions": [0, 1]}]
    acks = [(9.0, 9.5), (10.0, 10.5), (29.9, 30.0)]
    a = failover_analysis(deliveries, available, windows, acks, t_end=40.0)
    assert (a["records"], a["delivered"], a["lost"], a["lost_ids"]) == (6, 5, 1, [5])
    assert (a["deliveries"], a["redeliveries"]) == (7, 2)
    # 2 -> 12: record 3 was available (since 0) and undelivered; 13 -> 20 too; 21 -> 40: record 5 from 30
    assert a["stalls"][:1] == [(1.0, 2.0)] and (2.0, 12.0) in a["stalls"] and (13.0, 20.0) in a["stalls"]
    assert (30.0, 40.0) in a["stalls"] and not any(s == 21.0 for s, _ in a["stalls"])
    before, fault = a["windows"]
    assert (before["deliveries"], before["redeliveries"], before["longest_stall_s"]) == (3, 0, 8.0)
    assert (fault["deliveries"], fault["redeliveries"], fault["longest_stall_s"]) == (4, 2, 10.0)
    assert fault["first_record_s"] == 2.0 and fault["first_record_of_its_partitions_s"] == 10.0
    assert a["producer_longest_gap_s"] == 19.5 and fault["producer_longest_gap_s"] == 19.5
    assert before["producer_longest_wait_s"] == 0.5


def test_embedded_runs_only_when_named() -> None:
    assert "embedded" in scenarios.SCENARIOS and "embedded" not in runner.Options(out=Path("x")).scenarios
    assert "spark" in scenarios.SCENARIOS and "spark" not in runner.Options(out=Path("x")).scenarios
    assert "failover" in scenarios.SCENARIOS and "failover" not in runner.Options(out=Path("x")).scenarios
    assert "repeats" not in runner.scenario_args("failover", runner.Options(out=Path("x"), only=["failover"]))
    o = runner.Options(out=Path("x"), only=["embedded"], quick=True)
    assert o.scenarios == ["embedded"]
    args = runner.scenario_args("embedded", o)
    assert "repeats" not in args and args["seconds"] == 60.0
    assert runner.scenario_args("embedded", runner.Options(out=Path("x")))["seconds"] == 600.0


def test_per_round_ratio() -> None:
    # kshare's seconds first: kshare twice as fast in every round reads 2.0
    assert scenarios.per_round([1.0, 2.0, 1.5], [2.0, 4.0, 3.0]) == 2.0
    # a slow spell on one run of one side moves the per-round median less than it moves a side's median
    kshare, other = [1.0, 1.0, 1.4, 1.4, 1.0], [1.0, 1.0, 1.4, 1.4, 1.4]
    assert scenarios.per_round(kshare, other) == 1.0
    assert math.isnan(scenarios.per_round([], []))


def test_progress_one_line_per_step_when_not_a_terminal() -> None:
    out = io.StringIO()
    p = runner.Progress(out, tty=False)
    p.begin("share", 2)
    p.step("one")
    p.step("two")
    p.end()
    lines = out.getvalue().splitlines()
    assert len(lines) == 3 and lines[-1].startswith("[share      ] ########################   2/2")
    assert p.lines == ["share: one", "share: two"]


def test_options_and_sizes() -> None:
    o = runner.Options(out=Path("x"), only=["ack", "share"], quick=True)
    assert o.scenarios == ["share", "ack"] and o.n_repeats == 1
    assert runner.Options(out=Path("x")).n_repeats == 3
    assert set(runner.SIZES) == set(scenarios.SCENARIOS)
    assert runner.scenario_args("scaling", runner.Options(out=Path("x"), repeats=5))["repeats"] == 1
    assert "repeats" not in runner.scenario_args("memory", o)
    # a full run repeats the short share runs 7 times, unless --repeats or --quick say otherwise
    assert runner.scenario_args("share", runner.Options(out=Path("x")))["repeats"] == 7
    assert runner.scenario_args("passthrough", runner.Options(out=Path("x")))["repeats"] == 11
    assert runner.scenario_args("share", runner.Options(out=Path("x"), repeats=2))["repeats"] == 2
    assert runner.scenario_args("share", o)["repeats"] == 1
    assert runner.scenario_args("ack", runner.Options(out=Path("x")))["repeats"] == 3
    # the report says how often each scenario repeated (older results: one number)
    assert report._repeats({"passthrough": 5, "ack": 3, "share": 5}) == "repeats: 5 (passthrough, share), 3 (ack)"
    assert report._repeats(3) == "3 repeat(s)"


def test_cli_parses_options(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen = {}

    def fake_run(options: runner.Options) -> dict:
        seen["options"] = options
        return {"errors": {}}

    monkeypatch.setattr(runner, "run", fake_run)
    result = CliRunner().invoke(
        main,
        [
            "bench",
            "--out",
            str(tmp_path / "r"),
            "--only",
            "share",
            "--only",
            "ack",
            "--quick",
            "--repeats",
            "2",
            "--proxy-arg=--record-cache-mb",
            "--proxy-arg",
            "32",
            "--upstream",
            "h:1",
        ],
    )
    assert result.exit_code == 0, result.output
    o = seen["options"]
    assert (o.only, o.quick, o.repeats, o.upstream, o.proxy_args, o.out) == (
        ["share", "ack"],
        True,
        2,
        "h:1",
        ["--record-cache-mb", "32"],
        tmp_path / "r",
    )
    bad = CliRunner().invoke(main, ["bench", "--only", "nope"])
    assert bad.exit_code == 2 and "nope" in bad.output


def test_cli_prints_where_the_results_are(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The path of results.md is the one line on stdout (progress and notes go to stderr), also
    when a scenario failed (the others' results are there)."""
    out = tmp_path / "r"
    monkeypatch.setattr(runner, "run", lambda options: {"errors": {}})
    result = CliRunner().invoke(main, ["bench", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"{out / 'results.md'}\n"
    monkeypatch.setattr(runner, "run", lambda options: {"errors": {"share": "RuntimeError: boom"}})
    result = CliRunner().invoke(main, ["bench", "--out", str(out)])
    assert result.exit_code == 1
    assert result.stdout == f"{out / 'results.md'}\n"
    assert "1 scenario(s) failed: share" in result.stderr


def test_clear_error_without_kafka(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from kshare.bench import brokers

    def no_java() -> str:
        raise BrokerError("java is not on PATH (Java 17+ is needed to run Apache Kafka)")

    monkeypatch.setattr(brokers, "_java", no_java)
    result = CliRunner().invoke(main, ["bench", "--no-plots", "--out", str(tmp_path / "r")])
    assert result.exit_code == 1
    assert "Error: cannot run Apache Kafka: java is not on PATH" in result.output
    assert "Traceback" not in result.output


def test_clear_error_without_matplotlib(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import builtins

    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    result = CliRunner().invoke(main, ["bench", "--out", str(tmp_path / "r")])
    assert result.exit_code == 1
    assert "pip install 'kshare[bench]'" in result.output and "Traceback" not in result.output


def test_tests_harness_brokers_reexports_the_package() -> None:
    from kshare.bench import brokers
    from tests.harness import brokers as harness

    assert harness.KafkaBroker is brokers.KafkaBroker and harness.free_port is brokers.free_port
    assert harness.ensure_kafka is brokers.ensure_kafka and harness._java is brokers._java
    assert harness.SecureKafkaBroker.__mro__[1] is brokers.KafkaBroker  # the tests' secure brokers extend it
    assert (Path(brokers.__file__).parent / "kafka" / "pom.xml").is_file()


def test_aioconsumer_runs_only_when_named_and_reports_the_ratio() -> None:
    assert "aioconsumer" in scenarios.SCENARIOS and "aioconsumer" not in runner.Options(out=Path("x")).scenarios
    o = runner.Options(out=Path("x"), only=["aioconsumer"])
    assert o.scenarios == ["aioconsumer"] and runner.scenario_args("aioconsumer", o)["repeats"] == 5
    text = report.markdown(synthetic())
    assert "| kshare (3.9) | 100 B | 400,000 | 360,000 | 0.90 (0.88) | 0.80 | 1.20 |" in text
