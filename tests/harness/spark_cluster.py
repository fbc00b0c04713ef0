"""A Spark cluster for the test session: Spark's ``local-cluster[2,2,1024]`` master from the pyspark
install, a standalone master and two workers in the driver's JVM, each worker running one executor
JVM (``CoarseGrainedExecutorBackend``) with 2 cores: tasks run in separate executor processes, each
with its own Python workers and their share members, as on a real cluster. A worker relaunches an
executor that dies.

``spark_cluster`` (a session fixture; import it by assignment, ``spark_cluster =
spark_cluster_module.spark_cluster``): a :class:`SparkSessions`. ``get()`` is the shared cluster
session, started on first use (12-25 s on the 2-core machine) and again after an ``exclusive``
one; ``exclusive(master, conf)`` is a session of a test's own (dynamic allocation, ...) with the
shared one stopped first, since a Python process holds one SparkContext at a time. Mark such tests
``spark_own_session``: tests/conftest.py runs them last, so the shared session starts once. The
manager is process-wide, so modules importing the fixture share one session.

Executors write their logs under the pyspark install (``$SPARK_HOME/work/<app id>``: local-cluster
workers have no other work directory); ``executor_logs`` reads them, and the applications' folders
are removed when the test session ends.

``executors(spark)``: the pids of the application's executor JVMs, by executor id (from /proc).
``where_udf()``: a Python UDF naming the executor and the Python worker that runs it, per row.
``member_executors(proxy, group)``: the share group's members on a kshare proxy in this process,
with the executor each runs in (the process holding its share session's connection, from /proc);
``MemberWatch``: the same over time, with when each member went and its session deadline then.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

MASTER = "local-cluster[2,2,1024]"  # 2 workers x (2 cores, 1024 MB): 2 executor JVMs
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
CONF = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.driver.memory": "1g",
    "spark.executor.memory": "512m",
    "spark.executor.extraJavaOptions": "-XX:+UseSerialGC",  # 2 cores: fewer GC threads per JVM
    "spark.executorEnv.KSHARE_SPARK_LOG": "INFO",  # the source's activity in the executors' logs
    # What the sessions of tests vary, said every time: the first session's settings become the
    # JVM's system properties (pyspark launches it with them), the defaults of every later one.
    "spark.python.worker.reuse": "true",
    "spark.speculation": "false",
    "spark.dynamicAllocation.enabled": "false",
}


class SparkSessions:
    """At most one SparkSession in this process: the shared cluster session or a test's own."""

    def __init__(self) -> None:
        self.current: Any = None
        self.shared = False
        self.apps: list[str] = []

    def _start(self, master: str, conf: dict[str, str], *, source: bool = True) -> Any:
        from pyspark.sql import SparkSession

        from kshare.spark import register

        self.stop()
        # the driver JVM (started once per process) and the executors it launches inherit these
        os.environ["PYSPARK_PYTHON"] = sys.executable  # workers run this venv's Python, with kshare
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = SparkSession.builder.master(master).appName("kshare-tests")
        for k, v in {**CONF, **conf}.items():
            builder = builder.config(k, v)
        t0 = time.monotonic()
        s = builder.getOrCreate()
        s.sparkContext.setLogLevel("ERROR")
        self.current = s
        self.apps.append(s.sparkContext.applicationId)
        if master.startswith("local-cluster") and conf.get("spark.dynamicAllocation.enabled") != "true":
            wait_executors(s, int(master.split("[")[1].split(",")[0]), 90)
        if source:
            register(s)
        print(f"\nspark_cluster: {master} ready in {time.monotonic() - t0:.1f} s", file=sys.stderr)
        return s

    def get(self) -> Any:
        """The shared local-cluster session."""
        if self.current is None or not self.shared:
            self._start(MASTER, {})
            self.shared = True
        return self.current

    @contextmanager
    def exclusive(self, master: str = MASTER, conf: dict[str, str] | None = None, *,
                  source: bool = True) -> Iterator[Any]:
        """A session of the test's own (``conf`` added to :data:`CONF`; the ``kshare`` format
        registered unless ``source`` is false), stopped at the end; the next ``get()`` starts the
        shared one again."""
        s = self._start(master, conf or {}, source=source)
        self.shared = False
        try:
            yield s
        finally:
            self.stop()

    def stop(self) -> None:
        if self.current is not None:
            self.current.stop()
            self.current = None
            self.shared = False

    def remove_logs(self) -> None:
        for app in self.apps:
            shutil.rmtree(_work_dir() / app, ignore_errors=True)
        self.apps.clear()


def _work_dir() -> Path:
    from pyspark.find_spark_home import _find_spark_home

    return Path(_find_spark_home()) / "work"


_sessions: SparkSessions | None = None


@pytest.fixture(scope="session")
def spark_cluster() -> Iterator[SparkSessions]:
    """The process-wide :class:`SparkSessions` (stopped at the end of the test session)."""
    global _sessions
    if _sessions is None:
        _sessions = SparkSessions()
    try:
        yield _sessions
    finally:
        _sessions.stop()
        _sessions.remove_logs()


def executor_logs(app_id: str, grep: str = "kshare") -> str:
    """The lines of the application's executors' stderr containing ``grep``."""
    out = []
    for f in sorted((_work_dir() / app_id).glob("*/stderr")):
        lines = [line for line in f.read_text(errors="replace").splitlines() if grep in line]
        out += [f"executor {f.parent.name}: {line}" for line in lines]
    return "\n".join(out)


def wait_executors(spark: Any, n: int, timeout: float) -> dict[str, int]:
    """Wait until the application has ``n`` executor JVMs registered with the driver and running."""
    deadline = time.monotonic() + timeout
    while True:
        found = executors(spark)
        registered = spark.sparkContext._jsc.sc().getExecutorIds().size()
        if len(found) >= n and registered >= n:
            return found
        if time.monotonic() > deadline:
            raise TimeoutError(f"{registered} executor(s) registered, {len(found)} running; wanted {n}")
        time.sleep(0.2)


def executors(spark: Any) -> dict[str, int]:
    """{executor id: pid} of this application's executor JVMs running now."""
    app = spark.sparkContext.applicationId
    out: dict[str, int] = {}
    for pid, args in _processes():
        if EXECUTOR_CLASS in args and app in args and "--executor-id" in args:
            out[args[args.index("--executor-id") + 1]] = pid
    return out


def _processes() -> Iterator[tuple[int, list[str]]]:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if raw:
            yield int(entry.name), raw.decode(errors="replace").split("\0")


def parent_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[1])


def executor_of(pid: int) -> str | None:
    """The executor id of the executor JVM ``pid`` runs under (Python worker -> pyspark daemon ->
    executor JVM), or None."""
    for _ in range(4):
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
            if EXECUTOR_CLASS in args and "--executor-id" in args:
                return args[args.index("--executor-id") + 1]
            pid = parent_of(pid)
        except (OSError, ValueError, IndexError):
            return None
        if pid <= 1:
            return None
    return None


def where_udf(delay_ms: int = 0, touch: str | None = None) -> Any:
    """A Python UDF, value -> ``"<executor id>:<Python worker pid>"`` of the process running it
    ("driver" outside an executor), sleeping ``delay_ms`` per row; ``touch``: a directory where each
    row touches a file named after the executor (a test sees that work is under way there)."""
    from pyspark.sql import functions as F

    cache: dict[str, str] = {}
    marker = EXECUTOR_CLASS

    def where(_value):  # pickled by value: nothing from this module may be referenced by name
        import os
        import time

        who = cache.get("who")
        if who is None:
            pid, executor = os.getpid(), "driver"
            for _ in range(4):  # this Python worker -> pyspark's daemon -> the executor JVM
                with open(f"/proc/{pid}/stat") as f:
                    stat = f.read()
                pid = int(stat[stat.rindex(")") + 2:].split()[1])
                if pid <= 1:
                    break
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    args = f.read().decode(errors="replace").split("\0")
                if marker in args and "--executor-id" in args:
                    executor = args[args.index("--executor-id") + 1]
                    break
            who = cache["who"] = f"{executor}:{os.getpid()}"
        if touch is not None:
            open(os.path.join(touch, who.split(":")[0]), "a").close()
        if delay_ms:
            time.sleep(delay_ms / 1000.0)
        return who

    return F.udf(where, "string")


def member_executors(proxy: Any, group: str) -> dict[str, str | None]:
    """The members of ``group`` on ``proxy`` (a ShareProxyThread), each with the executor id of the
    process whose connection holds its share session (None: no session, or not in an executor)."""
    return {m: e for m, (e, _deadline) in _members(proxy, group).items()}


def _members(proxy: Any, group: str, attribute: Callable[[str], bool] = lambda _m: True,
             ) -> dict[str, tuple[str | None, int]]:
    """member id -> (executor id, session deadline in the proxy's ``time.monotonic`` ms); the
    executor is looked up (in /proc) for the members ``attribute`` names, None for the others."""

    def state() -> dict[str, tuple[int, int | None]]:
        g = proxy.service.coordinator.group(group)
        ports = {}
        for (gid, member, _node), session in proxy.service.sessions.sessions.items():
            peer = getattr(session.owner, "peer", "")
            if gid == group and ":" in peer:
                ports[member] = int(peer.rsplit(":", 1)[1])
        return {m.member_id: (m.deadline_ms, ports.get(m.member_id)) for m in (g.members.values() if g else ())}

    found = proxy.call(state)
    wanted = {m for m in found if attribute(m)}
    pids = _pids_by_local_port({port for m, (_d, port) in found.items() if m in wanted and port is not None})
    out: dict[str, tuple[str | None, int]] = {}
    for m, (deadline, port) in found.items():
        pid = pids.get(port) if port is not None and m in wanted else None
        out[m] = (executor_of(pid) if pid is not None else None, deadline)
    return out


class MemberWatch:
    """Watches the members of ``group`` on ``proxy`` (a ShareProxyThread in this process) from a
    thread, every 0.2 s: each member's executor, its session deadline (its last heartbeat plus the
    session timeout, the proxy's monotonic clock) and when it was first seen gone. A member gone
    well before its deadline left the group; one that timed out goes at its deadline."""

    def __init__(self, proxy: Any, group: str) -> None:
        self.proxy, self.group = proxy, group
        self.executor: dict[str, str | None] = {}
        self.deadline: dict[str, int] = {}
        self.gone: dict[str, int] = {}  # member -> time.monotonic() ms when first seen gone
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="member-watch", daemon=True)

    def __enter__(self) -> MemberWatch:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self._sample()

    def _sample(self) -> None:
        now = _members(self.proxy, self.group, attribute=lambda m: self.executor.get(m) is None)
        at = time.monotonic_ns() // 1_000_000
        for m, (executor, deadline) in now.items():
            if self.executor.get(m) is None:
                self.executor[m] = executor
            self.deadline[m] = deadline
        for m in set(self.executor) - set(now):
            self.gone.setdefault(m, at)

    def on(self, executor: str) -> set[str]:
        return {m for m, e in self.executor.items() if e == executor}

    def present(self) -> set[str]:
        return set(self.executor) - set(self.gone)

    def not_left(self, members: set[str], margin_ms: int) -> dict[str, int | None]:
        """Those of ``members`` not gone at least ``margin_ms`` before their session deadline (not
        gone: None; else how long before the deadline they went, in ms)."""
        out: dict[str, int | None] = {}
        for m in members:
            at = self.gone.get(m)
            if at is None or self.deadline[m] - at < margin_ms:
                out[m] = None if at is None else self.deadline[m] - at
        return out


def _pids_by_local_port(ports: set[int]) -> dict[int, int]:
    """The process owning the TCP socket bound to each local port of ``ports`` (IPv4 and IPv6)."""
    if not ports:
        return {}
    inodes: dict[str, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            port = int(cols[1].rsplit(":", 1)[1], 16)
            if port in ports and cols[9] != "0":
                inodes[f"socket:[{cols[9]}]"] = port
    out: dict[int, int] = {}
    for pid, _args in _processes():
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                port = inodes.get(os.readlink(fd))
            except OSError:
                continue
            if port is not None:
                out[port] = pid
    return out


def kshare_stream(spark: Any, bootstrap: str, topic: str, group: str, **opts: object) -> Any:
    """A streaming DataFrame of the kshare source: 4 tasks of up to 50 records, 500 ms waits, ``opts`` on top."""
    r = (spark.readStream.format("kshare").option("kafka.bootstrap.servers", bootstrap)
         .option("kafka.share.group.id", group).option("subscribe", topic)
         .option("parallelism", 4).option("maxRecordsPerTask", 50).option("maxWaitMs", 500))
    for k, v in opts.items():
        r = r.option(k, str(v))
    return r.load()


def share_state(proxy: Any, group: str, topic: str) -> str:
    """One line on ``group``'s share-partitions of ``topic`` on ``proxy`` (a ShareProxyThread): each
    state range of the window (offsets, state, delivery count, holder), the member releases and
    lock timeouts counted, and the group's members: what a test that waited in vain says."""

    def state() -> str:
        service = proxy.service
        parts = []
        for key, sp in service.partitions.items():
            if key.group_id != group or sp.engine is None or sp.topic.name != topic:
                continue
            engine = sp.engine
            ranges = [f"{r.first_offset}-{r.last_offset} {r.state.name} x{r.delivery_count}"
                      + (f" {r.member_id}" if r.member_id else "") + (" waits-for-key" if r.waits_for_key else "")
                      for r in engine.in_flight()]
            parts.append(f"p{key.partition}: spso {engine.start_offset} speo {engine.end_offset} [{'; '.join(ranges)}]")
        stats = service.stats
        releases = {r: n for (g, _t, r), n in stats.member_releases.items() if g == group}
        timeouts = sum(n for (g, _t), n in stats.lock_timeouts.items() if g == group)
        archived = sum(n for (g, _t), n in stats.archived.items() if g == group)
        g = service.coordinator.group(group)
        members = sorted(g.members) if g else []
        return (f"{'; '.join(parts) or 'no share-partition loaded'}; released by reason {releases}, lock timeouts "
                f"{timeouts}, archived {archived}; members {members}")

    return proxy.call(state)
