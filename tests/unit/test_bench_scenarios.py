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

# modules of the package that are not scenarios: what the scenarios share, the failover scenario's pure analysis
HELPERS = {"common", "failover_analysis"}
MICRO = {"codec", "engine", "record_keys"}

# smaller than --quick: a smoke run of each, well under a second
TINY = {
    "codec": {"seconds": 0.002, "scaling_partitions_per_topic": [5]},
    "engine": {"records": 5_000, "baseline_records": 1_000, "key_order_records": 2_000, "in_flight": 200},
    "record_keys": {"seconds": 0.001, "batches": 1, "value_sizes": [1024], "hash_keys": 1_000},
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
