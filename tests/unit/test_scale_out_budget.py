"""The CPU budgets of the scale_out bench's budget part (kshare.bench.scenarios.scale_out_budget): a cgroup holds a
process to its quota and is gone afterwards; without a cgroup v1 cpu controller the part says why in one line."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from kshare.bench.scenarios import scale_out_budget as budget


def test_without_a_cpu_controller_the_part_is_skipped_in_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(budget, "CGROUP_CPU", tmp_path / "no-cpu-controller")
    problem = budget.budget_problem()
    assert problem is not None and "cgroup v1 cpu controller" in problem
    part = budget.budget_part(
        None,
        records=1,
        value_size=1,
        partitions=1,
        consumers=1,
        rounds=1,  # type: ignore[arg-type]
        cores=0.1,
        period_ms=20.0,
        ceiling=False,
        state_partitions=1,
    )
    assert part["skipped"] == problem and part["runs"] == []
    assert budget.budget_section(part) == [f"Two budgeted proxies against one: skipped ({problem}).", ""]
    assert budget.budget_targets(part) == []


@pytest.mark.skipif(budget.budget_problem() is not None, reason=str(budget.budget_problem()))
def test_a_budget_holds_a_busy_process_to_its_quota_and_is_removed() -> None:
    b = budget.CpuBudget("unit-test", 0.1, 20_000).create()
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        b.add(spin.pid)
        s0, c0, t0 = b.stat(), budget._run_ns(spin.pid), time.monotonic()
        time.sleep(1.0)
        s1, c1, t1 = b.stat(), budget._run_ns(spin.pid), time.monotonic()
        used = (c1 - c0) / 1e9 / (t1 - t0)
        assert used < 0.15, f"a process held to 0.1 of a core used {used:.2f}"
        assert s1["nr_throttled"] - s0["nr_throttled"] > 0.8 * (s1["nr_periods"] - s0["nr_periods"])
    finally:
        spin.kill()
        spin.wait()
        b.remove()
    assert not b.path.exists()


def _run(client: str, config: str, rnd: int, seconds: float) -> dict:
    n = 1 if config.startswith("1") else 2
    return asdict(budget.BudgetRun(
        config=config, proxies=n, budget_cores=None if "unbudgeted" in config else 0.07, round=rnd,
        seconds=seconds, data_seconds=seconds * 0.9, records=1000, distinct=1000, delivered=1000,
        proxy_cpu=[0.07 * seconds] * n, proxy_periods=[50] * n, proxy_throttled=[49] * n,
        proxy_throttled_s=[0.5] * n, broker_cpu=0.1, consumer_cpu=0.1, idle_cores=1.0,
        proxy_requests=[{"ShareFetch": 10, "ShareFetch s": 1.0}] * n, proxy_state_writes=[10] * n,
        proxy_deliveries=[1000 // n] * n, rebalanced=False, leaders={f"proxy{i}": 4 // n for i in range(n)},
        load_before="1", load_after="1", client=client))


def test_each_client_gets_its_own_medians_section_and_target() -> None:
    """Two clients' runs in one part: each client's ratio comes from its own runs only (Java's two proxies
    twice as fast as its one, confluent's 1.25x), one section and one target each."""
    runs = [_run("java", "1 budgeted", r, 10.0) for r in range(2)] + \
        [_run("java", "2 budgeted", r, 5.0) for r in range(2)] + \
        [_run("confluent", "1 budgeted", r, 10.0) for r in range(2)] + \
        [_run("confluent", "2 budgeted", r, 8.0) for r in range(2)]
    part = {"config": {"budget_cores": 0.07, "period_ms": 20.0, "cpus": 2, "records": 1000, "value_size": 100,
                       "partitions": 4, "consumers": 4, "rounds": 2},
            "runs": runs, "skipped_clients": {"aio": "not wanted"},
            "medians": {c: budget.budget_medians(runs, c) for c in ("java", "confluent")}}
    assert part["medians"]["java"]["ratio_of_medians"] == pytest.approx(2.0)
    assert part["medians"]["confluent"]["ratio_of_medians"] == pytest.approx(1.25)
    targets = budget.budget_targets(part)
    assert [t["name"].split(",")[1].split("(")[0].strip() for t in targets] == \
        ["Java KafkaShareConsumer", "confluent-kafka ShareConsumer"]
    text = "\n".join(budget.budget_section(part))
    assert text.startswith("Two budgeted proxies against one: no kshare AIOShareConsumer runs (not wanted).")
    assert "**Java KafkaShareConsumer.**" in text and "**confluent-kafka ShareConsumer.**" in text
    assert "2.00x (ratio of medians" in text and "1.25x (ratio of medians" in text


def test_results_from_before_the_clients_read_as_confluents() -> None:
    runs = [{k: v for k, v in _run("confluent", c, 0, s).items() if k != "client"}
            for c, s in (("1 budgeted", 10.0), ("2 budgeted", 6.0))]
    part = {"config": {"budget_cores": 0.07, "period_ms": 20.0}, "runs": runs,
            "medians": budget.budget_medians(runs)}
    [t] = budget.budget_targets(part)
    assert "confluent-kafka ShareConsumer" in t["name"] and t["value"] == pytest.approx(10 / 6)


def test_an_unknown_client_is_named_in_one_line() -> None:
    assert budget.client_problem("nope") == "unknown client 'nope' (one of java, confluent, aio)"
    assert budget.client_problem("confluent") is None
