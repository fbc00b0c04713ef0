"""``examples/spark_pipeline.py`` as docs/guide/spark.md runs it, against ``kshare proxy`` on its default
embedded broker (Apache Kafka): every good job reaches the Parquet output, the poison ones are
rejected, and the share group is left with nothing to deliver (the example waits for the last
micro-batch's acknowledgements and says so). Real Spark in a subprocess, real proxy, real broker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.proxies import ProxyProcess

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'kshare[spark]')")
pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[2]


def test_the_pipeline_example_on_the_default_embedded_broker(embedded_kshare: ProxyProcess, tmp_path: Path) -> None:
    """The session's ``kshare proxy`` with no --upstream (tests/conftest.py): the embedded Apache Kafka."""
    bootstrap = embedded_kshare.bootstrap
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.run([sys.executable, "examples/spark_pipeline.py", "--bootstrap", bootstrap,
                           "--produce", "2000", "--output", str(tmp_path / "jobs")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    assert "1980 jobs in" in proc.stdout, proc.stdout[-2000:]
    assert "every job of topic jobs is acknowledged" in proc.stdout, proc.stdout[-2000:]
    # and independently of the example's own check: a new member of the group gets nothing
    consume = subprocess.run([sys.executable, "-m", "kshare", "consume", "--bootstrap-server", bootstrap,
                              "--group", "workers", "--topic", "jobs", "--timeout-ms", "3000"], cwd=REPO,
                             capture_output=True, text=True, timeout=60)
    assert consume.returncode == 0 and consume.stdout == "", (consume.stdout, consume.stderr)
