"""The CPU-budget part of the ``scale_out`` scenario of ``kshare bench`` (issue 42): two proxies of one instance
group against one, each proxy held to the same fixed share of a core, so that the proxies and not the broker or
the consumers are what limits the service, and the scaling is measured rather than modelled.

**Why a cgroup budget and not ``taskset``.** The natural form is a core of its own per proxy (``taskset``) with
the broker and the consumers on the cores left. On the project's 2-core machine that leaves them nothing (and
even 3 cores would leave one core for a broker and 4 consumer processes, which would then be the limit). So each
proxy process is put into a cgroup (v1 ``cpu`` controller, ``/sys/fs/cgroup/cpu/<name>``) of its own with a CFS
quota of ``budget_cores`` of a core (``cpu.cfs_quota_us`` per ``cpu.cfs_period_us``): a proxy never runs for more
than that however idle the machine is, and the rest (broker, consumers, other work) shares what is left. Each run
reads the cgroup's ``cpu.stat`` (periods, throttled periods, throttled time) to show the proxy was held at its
quota, and the broker's and the consumers' CPU and the machine's idle time to show they had room. Needs root and
cgroup v1's cpu controller; without them the part is skipped with one line saying why. The cgroups are removed
after each run, also when it fails, and leftovers of an earlier run that died are removed before.

**Runs.** ``records`` values of ``value_size`` bytes over ``partitions`` (4) partitions, produced beforehand; for
each configuration a fresh instance group (leadership by topic, the default: 4 partitions split 2/2 between two
proxies) on a fresh state topic and a fresh share group, read by ``consumers`` (4) share consumer processes
(implicit acknowledgement, as the throughput part) bootstrapped from all proxies, of each client of ``clients``:
Apache Kafka's Java ``KafkaShareConsumer`` (``java``; :mod:`kshare.bench.java_driver`, skipped in one line
without Java and Maven), confluent-kafka's ``ShareConsumer`` (``confluent``) or kshare's ``AIOShareConsumer``
(``aio``). The client matters: Java keeps a ShareFetch in every leader at once (``ShareConsumeRequestManager``
sends one to each node without one pending), librdkafka fetches from one broker at a time
(``rd_kafka_share_fetch_fanout_op`` selects one fetch broker; the others get acknowledgements only, as
ShareAcknowledge requests of their own), and ``AIOShareConsumer`` fetches from every leader but waits for all
their answers before the next round.
Configurations: one budgeted proxy, two budgeted proxies and, with ``ceiling``, two proxies without a budget
(what the broker and the consumers carry when the proxies are not held: it must stay above the budgeted rates for
the comparison to be about the proxies); alternated over ``rounds`` rounds (forwards, backwards, ...), medians and
the per-round ratios of two budgeted proxies to one (issue 42's target: >= 1.7x). Clock as the throughput part:
from the consumers' first ``poll()`` to the last record (and first record to last, beside it).

Run alone: ``python -m kshare.bench.scenarios.scale_out_budget --out DIR`` (starts Apache Kafka 3.9 as the bench
does; ``--help``); in ``kshare bench --only scale_out`` it runs after the throughput part.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing as mp
import os
import statistics
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .. import clients
from ..procs import cpu_seconds, http_get, load
from .common import per_round, target
from .instance_group import ProxyProc, Upstream, bootstrap_of, leaders, log, start_service

CGROUP_CPU = Path("/sys/fs/cgroup/cpu")
PREFIX = "kshare-bench-budget-"
TARGET = 1.7  # issue 42: two budgeted proxies >= 1.7x one
CONFIGS = ("1 budgeted", "2 budgeted", "2 unbudgeted")
CLIENTS = {
    "java": "Java KafkaShareConsumer",
    "confluent": "confluent-kafka ShareConsumer",
    "aio": "kshare AIOShareConsumer",
}


class CpuBudget:
    """A cgroup v1 ``cpu`` cgroup holding processes to ``cores`` of a core (a CFS quota per period)."""

    def __init__(self, name: str, cores: float, period_us: int) -> None:
        self.path = CGROUP_CPU / f"{PREFIX}{name}"
        self.cores = cores
        self.period_us = period_us

    def create(self) -> CpuBudget:
        self.path.mkdir()
        (self.path / "cpu.cfs_period_us").write_text(str(self.period_us))
        # the kernel's least quota is 1 ms: a budget below 1 ms a period needs a longer period
        (self.path / "cpu.cfs_quota_us").write_text(str(max(1000, round(self.cores * self.period_us))))
        return self

    def add(self, pid: int) -> None:
        """Move ``pid`` with all its threads (v1: cgroup.procs moves the thread group)."""
        (self.path / "cgroup.procs").write_text(str(pid))

    def stat(self) -> dict[str, int]:
        """``cpu.stat``: nr_periods, nr_throttled, throttled_time (ns), ..."""
        out = {}
        for line in (self.path / "cpu.stat").read_text().splitlines():
            k, _, v = line.partition(" ")
            with contextlib.suppress(ValueError):
                out[k] = int(v)
        return out

    def remove(self) -> None:
        _remove(self.path)


def _remove(path: Path) -> None:
    """Move what is still in the cgroup at ``path`` back to the root cgroup, then remove it."""
    if not path.exists():
        return
    for _ in range(50):
        with contextlib.suppress(OSError):
            for pid in (path / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):  # gone meanwhile
                    (CGROUP_CPU / "cgroup.procs").write_text(pid)
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:  # EBUSY: a process still leaving
            time.sleep(0.1)
    log.warning(f"  could not remove the cgroup {path}")


def sweep() -> None:
    """Remove the budget cgroups an earlier run left behind (it was killed before its cleanup)."""
    with contextlib.suppress(OSError):
        for path in CGROUP_CPU.glob(f"{PREFIX}*"):
            _remove(path)


def budget_problem() -> str | None:
    """Why proxies cannot be given a CPU budget here, or None: a cgroup is created and removed to find out."""
    if not (CGROUP_CPU / "cpu.cfs_quota_us").exists():
        return f"no cgroup v1 cpu controller at {CGROUP_CPU} (cgroup v2 only, or not Linux)"
    probe = CpuBudget(f"probe-{os.getpid()}", 0.5, 100_000)
    try:
        probe.create()
    except OSError as exc:
        return f"cannot create a cgroup under {CGROUP_CPU} ({exc.strerror}; needs root)"
    finally:
        probe.remove()
    return None


@dataclass
class BudgetRun:
    config: str  # one of CONFIGS
    proxies: int
    budget_cores: float | None  # per proxy; None: no budget
    round: int
    seconds: float  # first poll -> last record
    data_seconds: float  # first record -> last record
    records: int
    distinct: int
    delivered: int
    proxy_cpu: list[float]  # per proxy, utime+stime over the window (s)
    proxy_periods: list[int]  # per proxy, CFS periods over the window (budgeted)
    proxy_throttled: list[int]  # of which the proxy was throttled
    proxy_throttled_s: list[float]  # time throttled
    broker_cpu: float
    consumer_cpu: float
    idle_cores: float  # the machine's idle time over the window, cores
    proxy_requests: list[
        dict[str, float]
    ]  # per proxy, client requests by API over the window ("<API> s": their time)
    proxy_state_writes: list[int]  # per proxy, durable state writes over the window
    proxy_deliveries: list[int]  # per proxy, records it handed to the consumers over the window
    rebalanced: bool  # the instance group's ownership epoch moved during the window
    leaders: dict[str, int]  # proxy -> partitions it led
    load_before: str
    load_after: str
    # per proxy, its CPU seconds (all threads) every SAMPLE_S from the start: when each one had work
    proxy_cpu_trace: list[list[float]] = dataclasses.field(default_factory=list)
    # CPU ns a fixed loop of Python took just before and after the run (thread time, so not the time other
    # processes ran): how much work a CPU second of this VM bought then, which the host's own load moves
    ns_per_op: float | None = None
    client: str = "confluent"  # the consumers' client (CLIENTS)

    @property
    def rate(self) -> float:
        return self.records / self.seconds

    @property
    def data_rate(self) -> float:
        return self.records / self.data_seconds

    def quota_used(self) -> list[float]:
        """Each proxy's CPU over the window as a share of its budget (1.0: at its quota all along)."""
        if not self.budget_cores:
            return []
        return [c / (self.seconds * self.budget_cores) for c in self.proxy_cpu]

    def busy_until(self) -> list[float]:
        """Per proxy, the share of the run after which it no longer used half its budget (CPU trace; 1.0: it
        worked to the end): a proxy that finished its partitions early idles on its budget while the other works."""
        if not self.budget_cores or not self.proxy_cpu_trace:
            return []
        out = []
        for tr in self.proxy_cpu_trace:
            busy = [
                i + 1 for i in range(len(tr) - 1) if tr[i + 1] - tr[i] >= 0.5 * self.budget_cores * SAMPLE_S
            ]
            out.append(min(1.0, (busy[-1] if busy else 0) * SAMPLE_S / self.seconds))
        return out

    def in_flight(self) -> list[float]:
        """Per proxy, the ShareFetch and ShareAcknowledge requests it held at a time on average (their summed
        time over the run's; Little's law): below the consumers' count, the consumers kept it waiting."""
        return [
            (q.get("ShareFetch s", 0.0) + q.get("ShareAcknowledge s", 0.0)) / self.seconds
            for q in self.proxy_requests
            if "ShareFetch s" in q
        ]

    def throttled_share(self) -> list[float]:
        return [
            t / p if p else float("nan")
            for t, p in zip(self.proxy_throttled, self.proxy_periods, strict=True)
        ]


def _proc_cpu(pid: int | None) -> float:
    if not pid:
        return float("nan")
    try:
        return cpu_seconds(pid)
    except OSError:
        return 0.0


def _tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and of its children, recursively (the Java consumers run as children of their
    worker processes; a child's CPU reaches its parent's counters only once it is waited for)."""
    total = _proc_cpu(pid)
    try:
        kids = [int(k) for k in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return total
    return total + sum(_tree_cpu(k) for k in kids)


def _idle_ticks() -> tuple[int, float]:
    """(idle + iowait ticks of all CPUs, monotonic time) from /proc/stat."""
    with open("/proc/stat") as f:
        fields = f.readline().split()
    return int(fields[4]) + int(fields[5]), time.monotonic()


STATE_WRITES, DELIVERIES = "state writes", "deliveries"
SAMPLE_S = 0.25


def _cpu_speed(n: int = 200_000) -> float:
    """CPU ns (this thread's) per turn of a fixed Python loop."""
    t = time.thread_time_ns()
    x = 0
    for i in range(n):
        x += i * i % 7
    return (time.thread_time_ns() - t) / n


def _run_ns(pid: int) -> int:
    """Time on a CPU of all the threads of ``pid`` in ns (/proc/<pid>/task/*/schedstat: finer than utime's ticks,
    which at a budget of a few % of a core count a handful a second)."""
    total = 0
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, ValueError), open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
    return total


def _epochs(proxies: list[ProxyProc]) -> list[Any]:
    return [(p.ready() or {}).get("ownership_epoch") for p in proxies]


def _counters(p: ProxyProc) -> dict[str, float]:
    """The proxy's client requests by API (``kshare_requests_total``), the time they took (``<API> s``: the
    sum of ``kshare_request_seconds``; over a run's length, how many were in the proxy at a time), its durable
    state writes and its deliveries, from /metrics (scraped outside the timed window's CPU readings)."""
    got = http_get(p.metrics_port, "/metrics", timeout=10)
    out: dict[str, float] = {}
    for line in got[1].splitlines() if got else []:
        if line.startswith("kshare_requests_total{"):
            api = line.split('api="', 1)[1].split('"', 1)[0]
            out[api] = int(float(line.rsplit(" ", 1)[1]))
        elif line.startswith("kshare_request_seconds_sum{"):
            api = line.split('api="', 1)[1].split('"', 1)[0]
            out[f"{api} s"] = float(line.rsplit(" ", 1)[1])
        elif line.startswith("kshare_state_write_seconds_count"):
            out[STATE_WRITES] = int(float(line.rsplit(" ", 1)[1]))
        elif line.startswith("kshare_share_deliveries_total{"):
            out[DELIVERIES] = out.get(DELIVERIES, 0) + int(float(line.rsplit(" ", 1)[1]))
    return out


def budget_run(
    k3: Upstream,
    config: str,
    rnd: int,
    topic: str,
    records: int,
    consumers: int,
    state_partitions: int,
    cores: float,
    period_us: int,
    timeout: float,
    client: str = "confluent",
) -> BudgetRun:
    from .scale_out import CONSUMER_WORKERS, stop_consumers, tear_down  # scale_out imports this module

    n = 1 if config.startswith("1") else 2
    budgeted = "unbudgeted" not in config
    before = load()
    budgets: list[CpuBudget] = []
    proxies: list[ProxyProc] = []
    procs: list[Any] = []
    ctx = mp.get_context("spawn")
    try:
        proxies = start_service(k3, n, 10_000, state_partitions)
        boot = bootstrap_of(proxies)
        lead = leaders(proxies, topic)
        split = {p.name: sum(1 for _, name in lead.values() if name == p.name) for p in proxies}
        group = f"bench-sob-{uuid.uuid4().hex[:8]}"
        clients.share_group(boot, group)
        ready, start, stop = ctx.Semaphore(0), ctx.Event(), ctx.Event()
        done, results = ctx.Value("q", 0), ctx.Queue()
        procs = [
            ctx.Process(
                target=CONSUMER_WORKERS[client],
                args=(boot, group, topic, ready, start, stop, done, results),
                daemon=True,
            )
            for _ in range(consumers)
        ]
        for pr in procs:
            pr.start()
        for _ in procs:
            if not ready.acquire(timeout=60):
                raise TimeoutError("consumers not ready")
        # the budgets from here on: a proxy held to a few % of a core while it still starts up (its first
        # state replay, the instance group's join) misses heartbeats and the group rebalances for a while
        if budgeted:
            tag = uuid.uuid4().hex[:6]
            for p in proxies:
                budgets.append(CpuBudget(f"{tag}-{p.name}", cores, period_us).create())
                budgets[-1].add(p.pid)
        epochs0 = _epochs(proxies)
        m0 = [_counters(p) for p in proxies]
        cpu0 = [p.cpu() for p in proxies]
        st0 = [b.stat() for b in budgets]
        b0, c0, i0 = _proc_cpu(k3.pid), sum(_tree_cpu(pr.pid) for pr in procs), _idle_ticks()
        t0 = time.monotonic()
        start.set()
        deadline = t0 + timeout
        speed0 = _cpu_speed()
        trace: list[list[float]] = [[] for _ in proxies]
        next_sample = t0
        while done.value < records:
            now = time.monotonic()
            if now > deadline:
                raise TimeoutError(f"read {done.value} of {records} through {config} proxies")
            if (
                now >= next_sample
            ):  # each proxy's CPU through the run, read from /proc (costs the proxy nothing)
                for tr, p in zip(trace, proxies, strict=True):
                    tr.append(_run_ns(p.pid) / 1e9)
                next_sample += SAMPLE_S
            time.sleep(0.005)
        t1 = time.monotonic()
        for tr, p in zip(trace, proxies, strict=True):
            tr.append(_run_ns(p.pid) / 1e9)
        speed1 = _cpu_speed()
        cpu1 = [p.cpu() for p in proxies]
        st1 = [b.stat() for b in budgets]
        b1, c1, i1 = _proc_cpu(k3.pid), sum(_tree_cpu(pr.pid) for pr in procs), _idle_ticks()
        m1 = [_counters(p) for p in proxies]
        epochs1 = _epochs(proxies)
        keys, delivered, firsts, lasts = stop_consumers(stop, results, procs)
        last = min(t1, max(lasts)) if lasts else t1  # the count reached ``records`` at t1
        tick = os.sysconf("SC_CLK_TCK")
        run = BudgetRun(
            config,
            n,
            cores if budgeted else None,
            rnd,
            last - t0,
            last - min(firsts),
            records,
            len(keys),
            delivered,
            [b - a for a, b in zip(cpu0, cpu1, strict=True)],
            [s1.get("nr_periods", 0) - s0.get("nr_periods", 0) for s0, s1 in zip(st0, st1, strict=True)],
            [s1.get("nr_throttled", 0) - s0.get("nr_throttled", 0) for s0, s1 in zip(st0, st1, strict=True)],
            [
                (s1.get("throttled_time", 0) - s0.get("throttled_time", 0)) / 1e9
                for s0, s1 in zip(st0, st1, strict=True)
            ],
            b1 - b0,
            c1 - c0,
            (i1[0] - i0[0]) / tick / (i1[1] - i0[1]),
            [
                {
                    k: round(v - a.get(k, 0), 4)
                    for k, v in b.items()
                    if k not in (STATE_WRITES, DELIVERIES) and v > a.get(k, 0)
                }
                for a, b in zip(m0, m1, strict=True)
            ],
            [b.get(STATE_WRITES, 0) - a.get(STATE_WRITES, 0) for a, b in zip(m0, m1, strict=True)],
            [b.get(DELIVERIES, 0) - a.get(DELIVERIES, 0) for a, b in zip(m0, m1, strict=True)],
            epochs0 != epochs1,
            split,
            before,
            load(),
            [[round(x - tr[0], 4) for x in tr] for tr in trace],
            (speed0 + speed1) / 2,
            client,
        )
    finally:
        try:
            tear_down(procs, proxies)
        finally:
            for b in budgets:
                b.remove()
    return run


def budget_part(
    k3: Upstream,
    *,
    records: int,
    value_size: int,
    partitions: int,
    consumers: int,
    rounds: int,
    cores: float,
    period_ms: float,
    ceiling: bool,
    state_partitions: int,
    consumer_clients: tuple[str, ...] = ("java", "confluent"),
) -> dict[str, Any]:
    """The runs of every configuration, alternated over ``rounds``, for each client of ``consumer_clients`` in turn;
    ``{"skipped": why}`` without cgroups; a client that cannot run here (no Java or Maven for ``java``) is
    left out, named with why in ``skipped_clients``."""
    cfg = {
        "records": records,
        "value_size": value_size,
        "partitions": partitions,
        "consumers": consumers,
        "rounds": rounds,
        "budget_cores": cores,
        "period_ms": period_ms,
        "ceiling": ceiling,
        "state_partitions": state_partitions,
        "clients": list(consumer_clients),
        "cpus": os.cpu_count(),
    }
    problem = budget_problem()
    if problem:
        log.warning(f"scale_out budget part skipped: {problem}")
        return {"config": cfg, "skipped": problem, "runs": []}
    skipped = {c: why for c in consumer_clients if (why := client_problem(c))}
    for c, why in skipped.items():
        log.warning(f"scale_out budget part: no {CLIENTS.get(c, c)} runs: {why}")
    sweep()
    configs = list(CONFIGS if ceiling else CONFIGS[:2])
    topic = f"bench-sob-{uuid.uuid4().hex[:8]}"
    clients.create_topic(k3.bootstrap, topic, partitions)
    secs = clients.produce(k3.bootstrap, topic, records, value_size, partitions)
    log.info(
        f"budget part: produced {records:,} x {value_size} B to {partitions} partitions in {secs:.1f} s; "
        f"{cores:g} of a core per budgeted proxy, period {period_ms:g} ms; load {load()}"
    )
    runs: list[dict[str, Any]] = []
    try:
        for client, r in ((c, r) for c in consumer_clients if c not in skipped for r in range(rounds)):
            for config in configs if r % 2 == 0 else list(reversed(configs)):
                try:
                    run = budget_run(
                        k3,
                        config,
                        r,
                        topic,
                        records,
                        consumers,
                        state_partitions,
                        cores,
                        round(period_ms * 1000),
                        timeout=600,
                        client=client,
                    )
                except Exception as exc:  # noqa: BLE001 - reported; the other runs still go
                    log.warning(f"  {client} round {r} {config}: failed: {exc!r}")
                    runs.append({"config": config, "round": r, "client": client, "error": repr(exc)})
                    continue
                runs.append(asdict(run))
                log.info(
                    f"  {client} round {r} {config}: {run.rate:>9,.0f} rec/s ({run.seconds:.2f} s; first->last record "
                    f"{run.data_rate:,.0f}) | proxy CPU [{' '.join(f'{c:.2f}' for c in run.proxy_cpu)}] s, "
                    f"quota used [{' '.join(f'{q:.2f}' for q in run.quota_used())}], throttled "
                    f"[{' '.join(f'{t:.0%}' for t in run.throttled_share())}] of periods, busy until "
                    f"[{' '.join(f'{b:.2f}' for b in run.busy_until())}] of the run | broker "
                    f"{run.broker_cpu / run.seconds:.2f} cores, consumers {run.consumer_cpu / run.seconds:.2f}, "
                    f"idle {run.idle_cores:.2f} | requests {run.proxy_requests}, state writes "
                    f"{run.proxy_state_writes}, delivered {run.proxy_deliveries}, rebalanced {run.rebalanced} | leaders {run.leaders} | distinct {run.distinct:,}/{records:,} "
                    f"| load {run.load_before} -> {run.load_after}"
                )
                if run.distinct != records:
                    log.warning(f"  !! {records - run.distinct} record(s) never read")
    finally:
        sweep()
        clients.delete_topic(k3.bootstrap, topic)
    return {"config": cfg, "runs": runs, "skipped_clients": skipped,
            "medians": {c: budget_medians(runs, c) for c in consumer_clients if c not in skipped}}


def client_problem(client: str) -> str | None:
    """Why ``client``'s consumers cannot run here (None: they can)."""
    if client not in CLIENTS:
        return f"unknown client {client!r} (one of {', '.join(CLIENTS)})"
    if client == "java":
        from ..java_driver import java_share_driver

        try:
            java_share_driver()
        except Exception as exc:  # noqa: BLE001 - reported in one line, the other clients still run
            return f"the Java driver could not be built: {str(exc).splitlines()[0] if str(exc) else repr(exc)}"
    return None


def _ok(runs: list[dict[str, Any]], config: str, client: str = "confluent") -> list[BudgetRun]:
    return [
        BudgetRun(**r)
        for r in runs
        if r.get("config") == config and r.get("client", "confluent") == client and "error" not in r
    ]


def _sharefetches(r: BudgetRun) -> int:
    return sum(q.get("ShareFetch", 0) for q in r.proxy_requests)


def budget_medians(runs: list[dict[str, Any]], client: str = "confluent") -> dict[str, Any]:
    med: dict[str, Any] = {}
    for config in CONFIGS:
        rs = _ok(runs, config, client)
        if not rs:
            continue
        med[config] = {
            "runs": len(rs),
            "rate": statistics.median(r.rate for r in rs),
            "data_rate": statistics.median(r.data_rate for r in rs),
            "proxy_cpu_cores": statistics.median(sum(r.proxy_cpu) / r.seconds for r in rs),
            "proxy_cpu_per_m": statistics.median(sum(r.proxy_cpu) / r.records * 1e6 for r in rs),
            "quota_used": statistics.median(q for r in rs for q in r.quota_used())
            if rs[0].budget_cores
            else None,
            "throttled": statistics.median(t for r in rs for t in r.throttled_share())
            if rs[0].budget_cores
            else None,
            "broker_cores": statistics.median(r.broker_cpu / r.seconds for r in rs),
            "broker_per_m": statistics.median(r.broker_cpu / r.records * 1e6 for r in rs),
            "consumer_cores": statistics.median(r.consumer_cpu / r.seconds for r in rs),
            "idle_cores": statistics.median(r.idle_cores for r in rs),
            "records_per_sharefetch": statistics.median(r.records / max(1, _sharefetches(r)) for r in rs),
            "proxy_ms_per_sharefetch": statistics.median(
                sum(r.proxy_cpu) * 1e3 / max(1, _sharefetches(r)) for r in rs
            ),
            "delivered_share": [
                statistics.median(
                    sorted((d / max(1, sum(r.proxy_deliveries)) for d in r.proxy_deliveries), reverse=True)[i]
                    for r in rs
                )
                for i in range(rs[0].proxies)
            ],
            "rebalanced": sum(r.rebalanced for r in rs),
            "state_writes_per_m": statistics.median(sum(r.proxy_state_writes) / r.records * 1e6 for r in rs),
            "splits": sorted(
                {"/".join(str(v) for v in sorted(r.leaders.values(), reverse=True)) for r in rs}
            ),
        }
    one, two = _ok(runs, CONFIGS[0], client), _ok(runs, CONFIGS[1], client)
    by_round = [(a, b) for a in one for b in two if a.round == b.round]
    med["per_round"] = [
        {"round": a.round, "ratio": b.rate / a.rate, "data_ratio": b.data_rate / a.data_rate}
        for a, b in by_round
    ]
    med["ratio_of_medians"] = (
        med[CONFIGS[1]]["rate"] / med[CONFIGS[0]]["rate"] if one and two else float("nan")
    )
    med["median_per_round"] = (
        per_round([b.seconds for _, b in by_round], [a.seconds for a, _ in by_round])
        if by_round
        else float("nan")
    )
    return med


def _medians_by_client(part: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per client, the medians (results from before the clients were a dimension: confluent's only)."""
    med = part.get("medians") or {}
    if "per_round" in med:  # one client's medians at the top: an older result
        return {"confluent": med}
    return med


def budget_targets(part: dict[str, Any] | None) -> list[dict[str, Any]]:
    if not part or part.get("skipped") or not part.get("medians"):
        return []
    return [
        target(
            f"two budgeted proxies vs one, {CLIENTS.get(client, client)} (records/s, ratio of medians)",
            med["ratio_of_medians"],
            TARGET,
            ">=",
            "x",
        )
        for client, med in _medians_by_client(part).items()
    ]


def _f(x: float | None, spec: str) -> str:
    return "" if x is None else format(x, spec)


def budget_section(part: dict[str, Any] | None) -> list[str]:
    if not part:
        return []
    if part.get("skipped"):
        return [f"Two budgeted proxies against one: skipped ({part['skipped']}).", ""]
    out = [f"Two budgeted proxies against one: no {CLIENTS.get(c, c)} runs ({why})." for c, why in
           (part.get("skipped_clients") or {}).items()]
    for client, med in _medians_by_client(part).items():
        out += _client_section(part, client, med)
    return out


def _client_section(part: dict[str, Any], client: str, med: dict[str, Any]) -> list[str]:
    cfg = part.get("config", {})
    out = [
        f"**{CLIENTS.get(client, client)}.**",
        "",
        f"Two proxies against one, each proxy held to {cfg.get('budget_cores'):g} of a core (its own cgroup, CFS "
        f"quota per {cfg.get('period_ms'):g} ms period; {cfg.get('cpus')} CPUs, too few for a core per proxy "
        f"beside the broker and the consumers): {cfg.get('records'):,} records x {cfg.get('value_size')} B over "
        f"{cfg.get('partitions')} partitions (produced beforehand), {cfg.get('consumers')} {CLIENTS.get(client, client)} "
        "processes (implicit acknowledgement) bootstrapped from all proxies, leadership by topic, a fresh "
        f"service and group per run; alternated over {cfg.get('rounds')} rounds, medians. Quota used: a "
        "proxy's CPU over the run / (run time x budget); throttled: the share of CFS periods in which it "
        "used up its quota.",
        "",
        "| configuration | runs | records/s (first poll -> last) | vs 1 budgeted | records/s (first -> last "
        "record) | leaders | records delivered per proxy | runs with a rebalance | proxy CPU (cores, all) "
        "| proxy CPU s / M | quota used | throttled periods "
        "| records / ShareFetch | proxy CPU ms / ShareFetch | state writes / M | broker (cores) | broker CPU s / M "
        "| consumers (cores) | machine idle (cores) |",
        "| --- | ---: | ---: | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: | ---: |",
    ]
    base = med.get(CONFIGS[0], {}).get("rate")
    for config in CONFIGS:
        m = med.get(config)
        if not m:
            continue
        vs = f"{m['rate'] / base:.2f}" if base else ""
        out.append(
            f"| {config} | {m['runs']} | {m['rate']:,.0f} | {vs} | {m['data_rate']:,.0f} | "
            f"{', '.join(m['splits'])} | {' / '.join(f'{x:.0%}' for x in m['delivered_share'])} | "
            f"{m['rebalanced']} | {m['proxy_cpu_cores']:.2f} | {m['proxy_cpu_per_m']:.2f} | "
            f"{_f(m['quota_used'], '.2f')} | {_f(m['throttled'], '.0%')} | {m['records_per_sharefetch']:,.0f} | "
            f"{m['proxy_ms_per_sharefetch']:.2f} | {m['state_writes_per_m']:,.0f} | {m['broker_cores']:.2f} | "
            f"{m['broker_per_m']:.2f} | {m['consumer_cores']:.2f} | {m['idle_cores']:.2f} |"
        )
    rounds = ", ".join(f"{p['ratio']:.2f}" for p in med.get("per_round", []))
    data = ", ".join(f"{p['data_ratio']:.2f}" for p in med.get("per_round", []))
    ratio = med.get("ratio_of_medians", float("nan"))
    out += [
        "",
        f"Two budgeted proxies / one: {ratio:.2f}x (ratio of medians; per round {rounds}; median of the "
        f"rounds {med.get('median_per_round', float('nan')):.2f}x; first record -> last per round {data}). "
        f"Target >= {TARGET}x: {'met' if ratio >= TARGET else 'not met'}.",
        "",
    ]
    runs = [r for r in part.get("runs", []) if r.get("client", "confluent") == client]
    out += _runs_table(runs)
    errors = [r for r in runs if "error" in r]
    out += [f"Failed: round {r['round']} {r['config']}: {r['error']}" for r in errors]
    return [*out, ""] if errors else out


def _runs_table(runs: list[dict[str, Any]]) -> list[str]:
    """Every run, in the order they ran: what a median hides (a slow spell of the machine, a bad run)."""
    out = [
        "Every run, in order:",
        "",
        "| round | configuration | records/s | first -> last record | proxy CPU s / M | CPU ns / loop turn "
        "| quota used | busy until | requests in the proxy | throttled "
        "| ShareFetches | broker CPU s / M | consumers (cores) | machine idle (cores) | rebalance | load before |",
        "| ---: | --- | ---: | ---: | ---: | ---: | --- | --- | --- | --- | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for d in runs:
        if "error" in d:
            out.append(f"| {d['round']} | {d['config']} | failed: {d['error']} | | | | | | | | | | | | | |")
            continue
        r = BudgetRun(**d)
        out.append(
            f"| {r.round} | {r.config} | {r.rate:,.0f} | {r.data_rate:,.0f} | {sum(r.proxy_cpu) / r.records * 1e6:.2f} "
            f"| {_f(r.ns_per_op, '.0f')} | {' / '.join(f'{q:.2f}' for q in r.quota_used())} | {' / '.join(f'{b:.2f}' for b in r.busy_until())} "
            f"| {' / '.join(f'{x:.1f}' for x in r.in_flight())} | {' / '.join(f'{t:.0%}' for t in r.throttled_share())} "
            f"| {_sharefetches(r):,} | {r.broker_cpu / r.records * 1e6:.2f} | {r.consumer_cpu / r.seconds:.2f} "
            f"| {r.idle_cores:.2f} | {'yes' if r.rebalanced else ''} | {r.load_before} |"
        )
    return [*out, ""]


# sizes of the part alone (python -m kshare.bench.scenarios.scale_out_budget), as in scale_out's full run. 0.07 of
# a core: one budgeted proxy then reads 70-110k records/s, two proxies without a budget 280-550k on the loaded
# 2-core machine, so the rest has room for well over 1.7x the one budgeted proxy; 1.5 M records: 15-20 s a run
DEFAULTS = {
    "records": 1_500_000,
    "value_size": 100,
    "partitions": 4,
    "consumers": 4,
    "rounds": 4,
    "cores": 0.07,
    "period_ms": 20.0,
    "ceiling": True,
    "state_partitions": 10,
    "clients": "java,confluent",
}


def main(argv: list[str] | None = None) -> None:
    """The part alone, against Apache Kafka 3.9 started as ``kshare bench`` does: results.json and results.md in
    ``--out``."""
    import argparse
    import json
    import logging
    import shlex
    import sys

    from .. import report, runner
    from ..procs import machine_info
    from .instance_group import upstream_of

    ap = argparse.ArgumentParser(
        prog="python -m kshare.bench.scenarios.scale_out_budget",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--upstream", help="front this cluster of one broker instead of starting Kafka 3.9")
    ap.add_argument("--proxy-arg", action="append", default=[])
    for key, value in DEFAULTS.items():
        if isinstance(value, bool):
            ap.add_argument(
                f"--no-{key}", dest=key, action="store_false", help=f"leave out the {key} configuration"
            )
        else:
            ap.add_argument(
                f"--{key.replace('_', '-')}", type=type(value), default=value, help=f"default {value}"
            )
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    options = runner.Options(
        out=args.out, only=["scale_out"], upstream=args.upstream, proxy_args=args.proxy_arg, plots=False
    )
    args.out.mkdir(parents=True, exist_ok=True)
    env = runner.Env(options, runner.Progress())
    meta = {
        "command": shlex.join(
            [
                "python",
                "-m",
                "kshare.bench.scenarios.scale_out_budget",
                *(argv if argv is not None else sys.argv[1:]),
            ]
        ),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "repeats": {"scale_out": args.rounds},
        "machine": machine_info(),
        "load_before": load(),
        "proxy_args": args.proxy_arg,
        "upstream": args.upstream or "Apache Kafka 3.9 (started here)",
        "reference": "none",
    }
    t0 = time.monotonic()
    part: dict[str, Any] | None = None
    try:
        k3 = upstream_of(env)
        sizes = {k: getattr(args, k) for k in DEFAULTS if k != "clients"}
        names = tuple(c.strip() for c in args.clients.split(",") if c.strip())
        part = budget_part(k3, **sizes, consumer_clients=names)
    finally:
        env.close()
        meta["load_after"], meta["elapsed_s"] = load(), round(time.monotonic() - t0, 1)
        results = {"meta": meta, "budget": part, "targets": budget_targets(part)}
        (args.out / "results.json").write_text(json.dumps(runner._jsonable(results), indent=1) + "\n")
        head = report.markdown({"meta": meta, "scenarios": {}}).rstrip("\n").split("\n")
        (args.out / "results.md").write_text(
            "\n".join(
                [
                    *head,
                    "",
                    "## Scale-out: two budgeted proxies against one (`scale_out`, its budget part)",
                    "",
                    *budget_section(part),
                ]
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
