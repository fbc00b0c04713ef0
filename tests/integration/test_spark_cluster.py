"""The kshare PySpark source on a Spark cluster: executors in JVMs of their own (Spark's
``local-cluster[2,2,1024]`` master: a standalone master, two workers, two executor JVMs with two
cores each; see tests/harness/spark_cluster.py), the real kshare proxy in a thread in front of
Apache Kafka 3.9 (and ``kshare proxy`` on its default embedded broker), records produced by
librdkafka.

* a micro-batch is read by members in both executor JVMs, and the group has members in both;
* an executor JVM SIGKILLed mid-batch: its members leave the group (pyspark's daemon SIGHUPs the
  workers), its records come back with a higher delivery count, nothing is lost or delivered to
  the sink twice, the query goes on, on the executor the worker relaunches too;
* ``spark.speculation=true`` and ``spark.python.worker.reuse=false`` are refused with one line, by
  ``register`` and by the tasks (sessions of their own, in local mode);
* dynamic allocation removing idle executors: their members leave the group then (a leave
  heartbeat), not at the session timeout (a session of its own);
* (without Spark) a worker process leaves the group whichever way pyspark ends it.

The last two start SparkSessions of their own (``spark_own_session``: run after every test using
the shared cluster).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'kshare[spark]')")

from pyspark.errors import StreamingQueryException  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402

from kshare.spark import OptionError, ShareSource, register  # noqa: E402
from tests.harness import share  # noqa: E402
from tests.harness import spark_cluster as cluster  # noqa: E402
from tests.harness.proxies import ProxyProcess  # noqa: E402
from tests.harness.share import produce, share_group, values, wait_until  # noqa: E402

pytestmark = pytest.mark.timeout(300)

SESSION_TIMEOUT_MS = 60_000  # a member that does not leave stays this long
SPECULATION = ("kshare source: spark.speculation=true is not supported (a losing speculative attempt's records "
               "would be accepted with the batch); set it to false")
NO_REUSE = ("kshare source: spark.python.worker.reuse=false is not supported (a Python worker that ends with its "
            "task releases the records it read before their micro-batch commits: each would be redelivered until "
            "archived); set it to true")


@pytest.fixture
def spark(spark_cluster: cluster.SparkSessions) -> SparkSession:
    return spark_cluster.get()


def _group(kafka39, kshare39, what: str) -> tuple[str, str]:
    topic = group = f"spark-cluster-{what}-{uuid.uuid4().hex[:8]}"
    kafka39.create_topic(topic, 1)
    share_group(kshare39.bootstrap, group, share_heartbeat_interval_ms=500,
                share_session_timeout_ms=SESSION_TIMEOUT_MS)
    return topic, group


_stream = cluster.kshare_stream


class Sink:
    """foreachBatch target: (micro-batch, value, deliveryCount, executor id, Python worker pid) per
    row; the source's rows carry a ``where`` column from :func:`cluster.where_udf`."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, bytes, int, str, int]] = []
        self.lock = threading.Lock()

    def __call__(self, df, batch_id: int) -> None:
        rows = df.select("value", "deliveryCount", "where").collect()
        with self.lock:
            for r in rows:
                executor, pid = r.where.split(":")
                self.rows.append((batch_id, bytes(r.value), r.deliveryCount, executor, int(pid)))

    def values(self) -> set[bytes]:
        with self.lock:
            return {v for _, v, _, _, _ in self.rows}

    def wait_for(self, expected: set[bytes], query, timeout: float = 90.0, *, proxy=None, group: str = "",
                 topic: str = "") -> None:
        """Until the sink has ``expected``; a timeout says how many are missing and, given the
        ``proxy``, where the group's share-partitions of ``topic`` stand."""
        def done() -> bool:
            if query.exception() is not None:
                raise AssertionError(f"query failed: {query.exception()}")
            return expected <= self.values()

        try:
            wait_until(done, timeout, f"{len(expected)} records in the sink", interval=0.2)
        except AssertionError as exc:
            missing = expected - self.values()
            where = cluster.share_state(proxy, group, topic) if proxy is not None else ""
            raise AssertionError(f"{exc}: {len(missing)} missing (e.g. {sorted(missing)[:3]}), "
                                 f"{len(self.rows)} rows in {len(self.executors_per_batch())} batches; {where}") from None

    def executors_per_batch(self) -> dict[int, set[str]]:
        out: dict[int, set[str]] = {}
        with self.lock:
            for batch, _v, _c, executor, _pid in self.rows:
                out.setdefault(batch, set()).add(executor)
        return out


def _start(df, sink: Sink, checkpoint: Path):
    return (df.writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="200 milliseconds").start())


def _cli_members(bootstrap: str, group: str) -> set[str]:
    """The group's member ids as ``kshare groups --describe --members`` lists them."""
    proc = subprocess.run([sys.executable, "-m", "kshare", "groups", "--bootstrap-server", bootstrap, "--describe",
                           "--group", group, "--members", "--output", "json"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    return {m["member_id"] for g in json.loads(proc.stdout) for m in g["members"]}


def test_one_micro_batch_is_read_in_both_executor_jvms(spark, kshare39, kafka39, tmp_path):
    topic, group = _group(kafka39, kshare39, "spread")
    expected = values("r", 600)
    produce(kshare39.bootstrap, topic, expected, per_batch=50)
    jvms = cluster.executors(spark)
    assert len(jvms) == 2, jvms
    sink = Sink()
    df = _stream(spark, kshare39.bootstrap, topic, group).withColumn("where", cluster.where_udf(delay_ms=2)("value"))
    q = _start(df, sink, tmp_path / "ck")
    try:
        sink.wait_for(set(expected), q)
        members = cluster.member_executors(kshare39, group)
        listed = _cli_members(kshare39.bootstrap, group)
    finally:
        q.stop()
    per_batch = sink.executors_per_batch()
    assert any(executors >= set(jvms) for executors in per_batch.values()), per_batch
    assert all(e in jvms for executors in per_batch.values() for e in executors), (per_batch, jvms)
    # the readers' members (their Python workers keep them between tasks) are in both JVMs, and
    # `kshare groups --describe --members` lists the same members
    assert set(members.values()) >= set(jvms), members
    assert listed == set(members), (listed, members)
    assert len(sink.rows) == len(expected)  # nothing twice: nothing failed


def test_an_executor_killed_mid_batch_loses_nothing(spark, kshare39, kafka39, tmp_path):
    topic, group = _group(kafka39, kshare39, "kill")
    first: list[bytes] = values("a", 1000)
    second: list[bytes] = []
    produce(kshare39.bootstrap, topic, first, per_batch=50)
    before = cluster.executors(spark)
    assert len(before) == 2, before
    busy = tmp_path / "busy"
    busy.mkdir()
    sink = Sink()
    df = (_stream(spark, kshare39.bootstrap, topic, group)  # 10 ms per record: 0.5 s per task
          .withColumn("where", cluster.where_udf(delay_ms=10, touch=str(busy))("value")))
    q = _start(df, sink, tmp_path / "ck")
    try:
        with cluster.MemberWatch(kshare39, group) as watch:
            wait_until(lambda: len(sink.values()) >= 200, 90, "a first micro-batch in the sink")
            for f in busy.iterdir():
                f.unlink()
            victim = sorted(before)[0]
            wait_until(lambda: (busy / victim).exists(), 30, f"executor {victim} processing a micro-batch")
            os.kill(before[victim], signal.SIGKILL)
            in_sink = len(sink.values())
            # pyspark's daemon outlives its JVM and SIGHUPs the workers: their members leave the group
            on_victim = watch.on(victim)
            wait_until(lambda: not on_victim & watch.present(), 15, f"the killed executor's {len(on_victim)} members leaving")
        assert on_victim and not watch.not_left(on_victim, SESSION_TIMEOUT_MS // 2), watch.not_left(on_victim, 0)
        sink.wait_for(set(first), q, timeout=120, proxy=kshare39, group=group, topic=topic)
        # the worker relaunches the executor, and the query reads there too
        wait_until(lambda: set(cluster.executors(spark)) - set(before), 60, "a relaunched executor")
        relaunched = set(cluster.executors(spark)) - set(before)
        deadline = time.monotonic() + 60
        while not relaunched & {e for b in sink.executors_per_batch().values() for e in b}:
            assert time.monotonic() < deadline, f"no rows read on the relaunched executor {relaunched}"
            more = values(f"b{len(second)}", 200)
            produce(kshare39.bootstrap, topic, more, per_batch=50)
            second += more
            sink.wait_for(set(second), q, proxy=kshare39, group=group, topic=topic)
        assert q.isActive and q.exception() is None
    finally:
        q.stop()
    counts: dict[bytes, list[int]] = {}
    for _b, v, c, _e, _p in sink.rows:
        counts.setdefault(v, []).append(c)
    assert set(counts) == set(first + second)  # nothing lost
    # once each: the first delivery of what the killed executor had acquired never reached the sink
    # (its tasks died with it); it came back with a higher delivery count
    assert all(len(cs) == 1 for cs in counts.values()), {v: cs for v, cs in counts.items() if len(cs) > 1}
    assert any(cs[0] >= 2 for cs in counts.values()), \
        f"nothing redelivered (killed with {in_sink} of {len(first)} records in the sink)"


WORKER = """
import os, signal, sys, time
from kshare.spark.options import parse
from kshare.spark.worker import member_host
bootstrap, group, topic, how = sys.argv[1:]
host = member_host(parse({"kafka.bootstrap.servers": bootstrap, "kafka.share.group.id": group, "subscribe": topic}))
print(host.member.member_id, flush=True)  # joined (its first heartbeat)
sys.stdin.readline()
if how == "os._exit":
    os._exit(0)
if how == "exit":
    sys.exit(0)
os.kill(os.getpid(), getattr(signal, how))
time.sleep(30)
"""


ENDINGS = {"os._exit": 0, "exit": 0, "SIGHUP": -signal.SIGHUP, "SIGTERM": -signal.SIGTERM, "SIGKILL": -signal.SIGKILL}


def test_a_worker_process_that_ends_leaves_the_group(kshare39, kafka39):
    """The ways a Python worker ends (pyspark's daemon: ``os._exit`` after its socket closed,
    SIGHUP when the daemon ends; a plain exit; SIGTERM), five processes with a member each: each
    member leaves the group at once (well before its session deadline), and each process still
    ends as it would have. SIGKILL cannot be caught: that member stays until the session timeout."""
    topic, group = _group(kafka39, kshare39, "exit")
    procs = {how: subprocess.Popen([sys.executable, "-c", WORKER, kshare39.bootstrap, group, topic, how],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for how in ENDINGS}
    try:
        members = {how: p.stdout.readline().strip() for how, p in procs.items()}  # type: ignore[union-attr]
        with cluster.MemberWatch(kshare39, group) as watch:
            assert set(members.values()) <= watch.present(), (members, watch.executor)
            for p in procs.values():
                p.stdin.write("go\n")  # type: ignore[union-attr]
                p.stdin.flush()  # type: ignore[union-attr]
            assert {how: p.wait(15) for how, p in procs.items()} == ENDINGS
            caught = {m for how, m in members.items() if how != "SIGKILL"}
            wait_until(lambda: not caught & watch.present(), 5, "the members leaving")
            time.sleep(1)
        assert not watch.not_left(caught, SESSION_TIMEOUT_MS // 2), watch.not_left(caught, 0)
        assert members["SIGKILL"] in watch.present()
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


@pytest.mark.spark_own_session
def test_speculation_and_workers_not_reused_are_refused_with_one_line(spark_cluster, tmp_path):
    """spark.speculation=true (Spark refuses ``spark.conf.set`` of it at runtime: it takes a session
    started with it) and spark.python.worker.reuse=false: ``register`` refuses each on the driver,
    and a source registered without it fails its tasks (so the query) with the same line, before
    they read anything. Against ``kshare proxy`` on its default embedded broker."""
    with ProxyProcess(env={"XDG_DATA_HOME": str(tmp_path / "xdg")}).start(timeout=120) as proxy:
        topic = group = f"spark-refused-{uuid.uuid4().hex[:8]}"
        produce(proxy.bootstrap, topic, values("s", 10))
        share_group(proxy.bootstrap, group)
        with spark_cluster.exclusive("local[2]", {"spark.speculation": "true"}, source=False) as s:
            with pytest.raises(OptionError) as err:
                register(s)
            assert str(err.value) == SPECULATION, str(err.value)
            s.dataSource.register(ShareSource)
            q = (_stream(s, proxy.bootstrap, topic, group, parallelism=2).writeStream.format("noop")
                 .option("checkpointLocation", str(tmp_path / "ck")).start())
            with pytest.raises(StreamingQueryException) as failed:
                q.awaitTermination(120)
            assert SPECULATION in str(failed.value)
        with spark_cluster.exclusive("local[2]", {"spark.python.worker.reuse": "false"}, source=False) as s:
            with pytest.raises(OptionError) as err:
                register(s)
            assert str(err.value) == NO_REUSE, str(err.value)
            s.dataSource.register(ShareSource)
            with pytest.raises(Exception) as failed:
                (s.read.format("kshare").option("kafka.bootstrap.servers", proxy.bootstrap)
                 .option("kafka.share.group.id", group).option("subscribe", topic).load().collect())
            assert NO_REUSE in str(failed.value)
        # nothing was read: the group still has all ten for its next reader
        assert len(share.newcomer_gets(proxy.bootstrap, group, topic, 3.0)) == 10


@pytest.mark.spark_own_session
def test_idle_executors_removed_by_dynamic_allocation_leave_the_group(spark_cluster, kshare39, kafka39, tmp_path):
    """Dynamic allocation removes executors idle for 5 s: pyspark's daemon ends their Python
    workers with SIGHUP, and their members leave the share group then (a leave heartbeat), not at
    the 60 s session timeout."""
    topic, group = _group(kafka39, kshare39, "dynalloc")
    expected = values("d", 200)
    produce(kshare39.bootstrap, topic, expected, per_batch=50)
    conf = {"spark.dynamicAllocation.enabled": "true", "spark.dynamicAllocation.executorIdleTimeout": "5s",
            "spark.dynamicAllocation.shuffleTracking.enabled": "true", "spark.dynamicAllocation.minExecutors": "0",
            "spark.dynamicAllocation.initialExecutors": "0", "spark.dynamicAllocation.maxExecutors": "2"}
    with spark_cluster.exclusive(cluster.MASTER, conf) as s, cluster.MemberWatch(kshare39, group) as watch:
        sink = Sink()
        df = _stream(s, kshare39.bootstrap, topic, group).withColumn("where", cluster.where_udf(delay_ms=5)("value"))
        q = _start(df, sink, tmp_path / "ck")
        try:
            sink.wait_for(set(expected), q, timeout=120)
        finally:
            q.stop()
        # idle now (the sink shuffles nothing): the executors go after 5 s, and with them their members
        wait_until(lambda: not cluster.executors(s), 60, "dynamic allocation removing the idle executors")
        try:
            wait_until(lambda: not watch.present(), 20, "the removed executors' members leaving the group")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{cluster.executor_logs(s.sparkContext.applicationId)}") from None
    readers = {e for b in sink.executors_per_batch().values() for e in b}
    assert len(readers) == 2 and set(watch.executor.values()) >= readers, (readers, watch.executor)
    # each went well before its session deadline: it left (a heartbeat with epoch -1)
    assert not watch.not_left(set(watch.executor), SESSION_TIMEOUT_MS // 2), watch.not_left(set(watch.executor), 0)
    assert not _cli_members(kshare39.bootstrap, group) & set(watch.executor)
