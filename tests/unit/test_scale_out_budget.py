"""The CPU budgets of the scale_out bench's budget part (kshare.bench.scenarios.scale_out_budget): a cgroup holds a
process to its quota and is gone afterwards; without a cgroup v1 cpu controller the part says why in one line."""

from __future__ import annotations

import subprocess
import sys
import time
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
