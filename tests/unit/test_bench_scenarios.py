"""The scenarios of ``kshare bench``: each one module of :mod:`kshare.bench.scenarios`, registered and
listed by the command; the micro-benchmarks (no broker) run at a tiny size here and give results of the
shape the report reads."""

from __future__ import annotations

import io
import math
import pkgutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from kshare.bench import report, runner, scenarios
from kshare.bench.scenarios.common import Scenario
from kshare.cli import main

# modules of the package that are not scenarios: what the scenarios share, the failover scenario's pure
# analysis, the scale-out scenarios' proxies
HELPERS = {"common", "failover_analysis", "instance_group", "scale_out_budget", "scale_out_handover"}
MICRO = {"codec", "engine", "record_keys", "state_replay"}

# smaller than --quick: a smoke run of each, well under a second
TINY = {
    "codec": {"seconds": 0.002, "scaling_partitions_per_topic": [5]},
    "engine": {"records": 5_000, "baseline_records": 1_000, "key_order_records": 2_000, "in_flight": 200},
    "record_keys": {"seconds": 0.001, "batches": 1, "value_sizes": [1024], "hash_keys": 1_000},
    "state_replay": {"share_partitions": 20, "inflight": 200, "updates": 3},
}


def test_every_scenario_module_is_registered() -> None:
    modules = {m.name for m in pkgutil.iter_modules(scenarios.__path__)} - HELPERS
    assert modules == set(scenarios.REGISTRY)
    for name, s in scenarios.REGISTRY.items():
        assert isinstance(s, Scenario) and s.name == name and s.title
        assert s.run.__module__ == f"kshare.bench.scenarios.{name}"
        full, quick = s.sizes
        assert isinstance(full, dict) and isinstance(quick, dict)
    assert scenarios.SCENARIOS == tuple(scenarios.REGISTRY)
    assert {n for n, s in scenarios.REGISTRY.items() if s.broker_less} == MICRO
    # the micro-benchmarks run only when named: a full run measures kshare against the brokers
    assert not MICRO & set(runner.Options(out=Path("x")).scenarios)


def test_list_and_help_name_every_scenario() -> None:
    listed = CliRunner().invoke(main, ["bench", "--list"])
    assert listed.exit_code == 0, listed.output
    names = [line.split()[0] for line in listed.output.splitlines()]
    assert names == list(scenarios.SCENARIOS)
    assert "codec" in listed.output and "(no broker, only when named)" in listed.output
    helped = CliRunner().invoke(main, ["bench", "--help"])
    assert helped.exit_code == 0, helped.output
    flat = " ".join(helped.output.split())
    for name in scenarios.SCENARIOS:
        assert name in flat


def test_micro_scenarios_need_no_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    from kshare.bench import brokers

    def no_java() -> str:
        raise AssertionError("a micro-benchmark must not look for Java")

    monkeypatch.setattr(brokers, "_java", no_java)
    runner.check_prerequisites(runner.Options(out=Path("x"), only=sorted(MICRO), plots=False))
    assert runner._upstream(runner.Options(out=Path("x"), only=["codec"])).startswith("none")


@pytest.mark.parametrize("name", sorted(MICRO))
def test_micro_scenario_runs_and_reports(name: str) -> None:
    s = scenarios.REGISTRY[name]
    assert set(TINY[name]) == set(s.sizes[1])
    progress = runner.Progress(io.StringIO(), tty=False)
    res = s.run(None, progress, repeats=1, **TINY[name])
    assert set(res) >= {"config", "rows", "samples", "targets"}
    assert res["rows"] and all(isinstance(r, dict) for r in res["rows"])
    numbers = [v for r in res["rows"] for v in r.values() if isinstance(v, float)]
    assert numbers and all(v > 0 and math.isfinite(v) for v in numbers)
    text = report.markdown({"meta": {}, "scenarios": {name: res}})
    assert f"(`{name}`)" in text and s.title in text
    assert progress.done == progress.total  # one step per measured case
    if name == "codec":
        # kshare against kafka-python on every message kafka-python has
        assert [r["decode_vs_kafka_python"] is None for r in res["rows"]] == [False] * 4 + [True] * 2
        assert res["scaling"][0]["partitions"] == 50
    if name == "engine":
        assert [r["case"] for r in res["rows"]] == ["whole batches, all accepted", "1% released once"]
        assert [r["keys"] for r in res["key_order"]] == [20, 10_000]
        assert len(res["memory_bytes"]) == 5 and all(b > 0 for b in res["memory_bytes"].values())
    if name == "record_keys":
        assert [r["codec"] for r in res["rows"]] == ["none", "gzip", "snappy", "lz4", "zstd"]
        assert [r["decompress_share"] is None for r in res["rows"]] == [True] + [False] * 4
        assert len(res["hashes"]) == 5
    if name == "state_replay":
        snapshots, updates = res["rows"]
        assert (snapshots["records"], updates["records"]) == (20, 20 + 3 * 20)
        assert snapshots["ranges"] == 20 * 200  # every record its own range, as written


# sections read from results of this shape (what each run() returns); the scenarios of a full run, embedded,
# spark, failover and aioconsumer: tests/unit/test_bench.py
SECTIONS_TESTED_THERE = {"passthrough", "share", "scaling", "latency", "ack", "cpu", "memory", "embedded", "spark",
                         "failover", "aioconsumer"}


def _series(n: int) -> dict:
    return {"t": [0.5 * i - 2 for i in range(n)], "total": [100.0] * n, "killed": [30.0] * n}


SYNTHETIC = {
    "durability": {
        "config": {"samples": 100, "members": [1, 4], "records": 10_000, "release_rate": 0.01, "volume_partitions": 10,
                   "recovery_groups": 1, "recovery_partitions": 10, "recovery_inflight": 200, "recovery_runs": 2,
                   "on_disk": False},
        "rows": [{"name": "Produce acks=all to the cluster, 1 at a time", "members": 1, "samples": 100,
                  "p50_ms": 1.5, "p99_ms": 4.0, "mean_ms": 1.8},
                 {"name": "ShareAcknowledge of 1 record, 1 member", "members": 1, "samples": 100, "p50_ms": 3.0,
                  "p99_ms": 9.0, "mean_ms": 3.5, "state_write_ms": 2.0, "proxy_cpu": 0.4, "client_cpu": 0.2,
                  "vs_produce": 2.0}],
        "volume": [{"workload": "whole acquisitions accepted", "accepted": 10_000, "acks_per_m": 2000.0,
                    "released_per_m": 0.0, "state_records_per_m": 2100.0, "on_disk_kb_per_m": None,
                    "on_disk_per_record": None, "ack_p50_ms": 2.5, "ack_p99_ms": 7.0, "seconds": 3.2}],
        "recovery": {"share_partitions": 10, "inflight": 200, "state_mb": None, "to_loaded_s": [2.0, 3.0],
                     "logged_s": [0.5, 0.7], "to_first_fetch_s": [2.5, 3.5]},
        "targets": [],
    },
    "state_store": {
        "config": {"records": 10_000, "share_partitions": [1], "release_rate": 0.01, "recovery_keys": 10,
                   "recovery_inflight": 200, "recovery_updates": 5, "on_disk": True},
        "rows": [{"workload": "whole batches accepted", "share_partitions": 1, "accepted": 10_000,
                  "writes_per_m": 2000.0, "records_per_m": 2000.0, "snapshots_per_m": 100.0, "updates_per_m": 1900.0,
                  "serialized_kb_per_m": 150.5, "on_disk_kb_per_m": 300.25, "on_disk_per_record": 150.0,
                  "rounds_per_m": 2000.0, "seconds": 1.5}],
        "recovery": [{"content": "worst-case snapshots only", "share_partitions": 10, "records": 10, "mb_read": 0.4,
                      "on_disk_mb": 0.5, "ranges": 2000, "seconds": 0.25, "cpu_seconds": 0.2}],
        "targets": [],
    },
    "key_order": {
        "config": {"records": 1000, "keys": 20, "many_keys": 200, "work_ms": 2.0, "busy_records": 500,
                   "max_work_ms": 4.0, "consumers": 8, "repeats": 1, "kill_at": 1 / 3, "load": ["1.00 1.00 1.00"]},
        "rows": [{"keys": 20, "none": 3000.0, "key": 2400.0, "key_vs_none": 0.8, "key_vs_none_per_repeat": 0.8},
                 {"keys": 200, "none": 3000.0, "key": 2700.0, "key_vs_none": 0.9, "key_vs_none_per_repeat": 0.9}],
        "busy": [{"case": c, **{f"{k}_{o}": v for o in ("none", "key") for k, v in (
            ("busy", 5.0), ("records_per_s", 2500.0), ("useful_busy", 4.5), ("processed_again", 10.0),
            ("down_s", 0.5), ("stalled_s", 0.75), ("first_after_s", 0.25))}} for c in ("steady", "killed")],
        "targets": [],
    },
    "balance": {
        "config": {"per_member": 100, "work_ms": 5.0, "max_poll": 10, "repeats": 1},
        "rows": [{"members": 3, "partitions": 2, "churn": True, "kshare": 0.9, "native": 0.8, "kshare_vs_native": 1.125}],
        "fairness": [{"members": 24, "partitions": 1, "records": 2400, "work_ms": 5.0, "max_poll": 500, "kshare": 0.7,
                      "native": 0.5, "kshare_busy": 24, "native_busy": 12}],
        "targets": [],
    },
    "security": {
        "config": {"records": 1000, "value_size": 1024, "partitions": 4, "checks": 10, "repeats": 1},
        "rows": [{"workload": "pass-through produce", "plain_rps": 200_000.0, "tls_rps": 150_000.0,
                  "tls_vs_plain": 0.75, "plain_mbps": 204.8, "tls_mbps": 153.6}],
        "authorization": {"cold_p50_ms": 0.8, "cold_p90_ms": 1.2, "warm_p50_ms": 0.25, "warm_p90_ms": 0.3,
                          "cost_ms": 0.55},
        "targets": [],
    },
    "scale_out": {
        "config": {"records": 1000, "value_size": 100, "partitions": 12, "consumers": 3, "proxies": [1, 2],
                   "state_partitions": 10, "repeats": 1, "broker_cpu": True},
        "rows": [{"proxies": 1, "records_per_s": 1000.0}, {"proxies": 2, "records_per_s": 900.0}],
        "runs": [{"proxies": n, "round": 0, "seconds": 1.0 + n / 10, "data_seconds": 0.9, "records": 1000,
                  "distinct": 1000, "delivered": 1000, "proxy_cpu": [0.5] * n, "broker_cpu": 0.3,
                  "consumer_cpu": 0.4, "leaders": {f"proxy{i}": 12 // n for i in range(n)}, "idle_cpu": 0.01,
                  "load_before": "1.0 1.0 1.0", "load_after": "1.1 1.0 1.0"} for n in (1, 2)],
        "medians": {"1": {"rate": 1000.0, "cpu_per_m": 500.0, "share0": 1.0},
                    "2": {"rate": 900.0, "cpu_per_m": 1000.0, "share0": 0.5, "share1": 0.5}},
        "state_runs": [{"group": g, "round": 0, "writes": 1000, "seconds": 1.0 if g else 0.5,
                        "broker_cpu": 0.2 if g else 0.1, "store_cpu": 0.05, "load_before": "1", "load_after": "1"}
                       for g in (False, True)],
        "targets": [],
    },
    "aio100": {
        "config": {"records": 200_000, "members": 20, "partitions": 16, "value_size": 100, "max_poll_records": 500,
                   "clients": ["confluent", "aio"], "systems": ["kshare", "native"], "repeats": 1},
        "rows": [{"system": sys_, "client": c, "rps": 80_000.0, "cpu_us_per_record": 4.5, "cpu_data_us_per_record": 4.4,
                  "join_s": 0.4, "rss_start_mb": 42.0, "max_rss_mb": 115.0, "rss_growth_mb": 73.0,
                  "members_with_records": 20, "threads": 1.0,
                  "proxy_cpu_us_per_record": 2.1 if sys_ == "kshare" else float("nan")}
                 for sys_ in ("kshare", "native") for c in ("confluent", "aio")],
        "targets": [],
    },
    "scale_out_failover": {
        "config": {"state_partitions": 10, "fo_consumers": 3, "fo_rate": 5000.0, "fo_pre": 6.0, "fo_post": 10.0,
                   "fo_max_poll": 200, "fo_batch": 50},
        "rows": [{"variant": "small", "session_ms": 6000, "partitions": 12, "acked_before": 20_000,
                  "killed": "proxy1", "killed_was_coordinator": True, "killed_partitions": [0, 3],
                  "killed_state_partitions": [1], "pre_rate": 5000.0, "pre_killed_rate": 1600.0, "takeover_s": 6.5,
                  "takeover_lines": [], "replay": {"records": 40.0, "bytes": 4000.0, "share_partitions": 4.0,
                                                   "groups": 1.0, "replay_seconds_max": 0.05},
                  "first_any_s": 6.6, "first_acked_s": 6.8, "steady_s": 8.0, "min_rate": 3000.0, "redelivered": 10,
                  "after_confirmation": 0, "commit_errors": {}, "poll_errors": {}, "load_before": "1",
                  "load_after": "1", "series": _series(20), "proxy_notes": []}],
        "targets": [],
    },
}


def test_every_broker_scenario_has_its_section_tested() -> None:
    assert set(scenarios.REGISTRY) == MICRO | SECTIONS_TESTED_THERE | set(SYNTHETIC)


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_section_of_a_figures_scenario(name: str, tmp_path: Path) -> None:
    results = {"meta": {}, "scenarios": {name: SYNTHETIC[name]}}
    text = report.markdown(results)
    assert f"## {scenarios.REGISTRY[name].title} (`{name}`)" in text
    expected = {
        "durability": "| ShareAcknowledge of 1 record, 1 member | 100 | 3.00 | 9.00 | 3.50 | 2.00 | 2.0x | 40% / 20% |",
        "state_store": "| whole batches accepted | 1 | 2,000 | 2,000 (100 / 1,900) | 150.5 | 300.2 | 150 | 2,000 | 1.5 |",
        "key_order": "| killed | key-ordered | 5.00 (4.50) | 2,500 | 10 | 0.50 | 0.75 |",
        "balance": "| 24 on 1, 2,400, 5 ms | 500 | 0.50 (12/24 busy) | 0.70 (24/24 busy) |",
        "security": "| pass-through produce | 200,000 (204.8) | 150,000 (153.6) | 0.75 |",
        "scale_out": "| 2 proxy(ies) | 1 |",
        "scale_out_failover": "| small | 6000 ms | 12 | 20,000 | 2 partitions / yes |",
        "aio100": "| kshare (3.9) | aio | 80,000 | 4.50 | 4.40 | 2.10 | 0.4 | 42 | 115 | 73 | 20 | 1 |",
    }[name]
    assert expected in text, text
    if name == "scale_out":  # the state writes alone, with and without an instance group's claims
        assert "| instance group, all partitions claimed | 1 | 1,000 | 0.50 | 0.200 | 2.00 | 0.050 |" in text, text
    if scenarios.REGISTRY[name].plot is not None:
        pytest.importorskip("matplotlib")
        assert report.plots(results, tmp_path) == [f"{name}.png"]
