"""The ``scale_out`` scenario of ``kshare bench`` (run only when named): throughput and CPU of 1, 2 and 3 kshare
proxies as one service (``--instance-group``, :mod:`.instance_group`) in front of the fronted cluster.

``records`` values of ``value_size`` bytes over ``partitions`` partitions, produced beforehand straight to the
cluster, read by ``consumers`` confluent-kafka ``ShareConsumer`` processes (implicit acknowledgement)
bootstrapped from all proxies, through each of ``proxies`` proxies (``0``: one proxy without an instance
group), a fresh share group and service each time; the configurations alternate over the repeats
(1,2,3,3,2,1,...), medians, ratios against 1 proxy. Clock: from the consumers' first ``poll()`` (all start
together, the group join included) to the last record. CPU: utime+stime of every proxy over that window, per
million records, in total and per proxy (the split), with the broker's (when the bench started it) and the
consumers' for context. On 2 cores the total throughput cannot scale with proxies (they, the broker and the
consumers share the cores): the CPU split is the measured part, and "N proxies on N cores" is a model from
it (stated as such in the report). Every run checks that each record was read. Then the state writes alone
(:mod:`kshare.bench.state_writes`), with and without an instance group's claims: the consumption runs are too short
for the broker's CPU to show what fencing costs. Then the hand-overs (:mod:`.scale_out_handover`): the leaders'
split per proxy, a SIGTERM rolling restart and a SIGKILL under load, leading by topic and by state partition side
by side. Then two proxies against one, each held to the same small CPU budget (:mod:`.scale_out_budget`, a cgroup
per proxy: measured scaling, not the model). ``--quick``: 200,000 records, one proxy with and without an instance
group only, no hand-overs, no budgets.

(Was ``benchmarks/bench_scale_out.py --only throughput``; its failover part is ``scale_out_failover``.)
"""

from __future__ import annotations

import array
import contextlib
import multiprocessing as mp
import os
import statistics
import time
import uuid
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from .. import clients
from ..format import fmt_num
from ..procs import cpu_seconds, load
from ..state_writes import StateRun, state_part, state_table
from .common import UPSTREAM, results, scenario
from .instance_group import ProxyProc, Upstream, bootstrap_of, leaders, log, start_service, upstream_of
from .scale_out_budget import budget_part, budget_section, budget_targets
from .scale_out_handover import handover_part, handover_section

if TYPE_CHECKING:
    from ..runner import Env, Progress

# ho_*: the hand-over part (.scale_out_handover; ho_records 0 leaves it out), as issue 42 measured it; bu_*: the
# budget part (.scale_out_budget; bu_records 0 leaves it out), its own rounds
SIZES = (
    {"records": 500_000, "value_size": 100, "partitions": 12, "consumers": 3, "proxies": [0, 1, 2, 3],
     "state_partitions": 10, "state_writers": 16, "state_seconds": 8.0, "ho_records": 40_000, "ho_rate": 1000.0,
     "ho_partitions": 12, "ho_consumers": 4, "ho_session_ms": 6000, "ho_work_ms": 2.0, "split_topics": 5,
     "bu_records": 1_500_000, "bu_partitions": 4, "bu_consumers": 4, "bu_rounds": 4, "bu_cores": 0.07,
     "bu_period_ms": 20.0, "bu_clients": ["java", "confluent"]},
    {"records": 200_000, "value_size": 100, "partitions": 12, "consumers": 3, "proxies": [0, 1],
     "state_partitions": 10, "state_writers": 16, "state_seconds": 4.0, "ho_records": 0, "ho_rate": 1000.0,
     "ho_partitions": 12, "ho_consumers": 4, "ho_session_ms": 6000, "ho_work_ms": 2.0, "split_topics": 5,
     "bu_records": 0, "bu_partitions": 4, "bu_consumers": 4, "bu_rounds": 1, "bu_cores": 0.07, "bu_period_ms": 20.0,
     "bu_clients": ["java", "confluent"]},
)


class _Received:
    """What one consumer worker received: its keys (``partition << 40 | offset``) and the times of
    its first and last deliveries, added to the shared count ``done`` as they come; reported once."""

    def __init__(self, done) -> None:
        self.keys = array.array("q")
        self.first: float | None = None
        self.last: float | None = None
        self._done = done

    def took(self, n: int) -> None:
        if n:
            now = time.monotonic()
            self.first = self.first if self.first is not None else now
            self.last = now
            with self._done.get_lock():
                self._done.value += n

    def report(self, results) -> None:
        results.put((os.getpid(), self.first, self.last, self.keys.tobytes()))


def _consume_worker(bootstrap: str, group: str, topic: str, ready, start, stop, done, results) -> None:
    from confluent_kafka import ShareConsumer

    c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group, "error_cb": clients._quiet, "log_level": 3})
    c.subscribe([topic])
    received = _Received(done)
    ready.release()
    start.wait()
    try:
        while not stop.is_set():
            got = 0
            for m in c.poll(0.2):
                if m.error() is None:
                    received.keys.append((m.partition() << 40) | m.offset())
                    got += 1
            received.took(got)
    finally:
        with contextlib.suppress(Exception):
            c.close()
        received.report(results)


def _consume_worker_aio(bootstrap: str, group: str, topic: str, ready, start, stop, done, results) -> None:
    """``_consume_worker`` with kshare's own ``AIOShareConsumer`` (implicit acknowledgement) instead of
    confluent-kafka's ShareConsumer. It keeps a ShareFetch in every leader at once, where librdkafka
    fetches from one broker at a time (``rd_kafka_share_fetch_fanout_op``): the budget part compares
    the two."""
    import asyncio

    import uvloop

    from ...clients.share_consumer import AIOShareConsumer

    received = _Received(done)

    async def run() -> None:
        consumer = AIOShareConsumer(topic, bootstrap_servers=bootstrap, group_id=group, max_poll_records=5000)
        await consumer.start()
        try:
            ready.release()
            while not start.is_set():
                await asyncio.sleep(0.005)
            while not stop.is_set():
                got = 0
                for tp, records in (await consumer.getmany(timeout_ms=200)).items():
                    high = tp.partition << 40
                    received.keys.extend(high | r.offset for r in records)
                    got += len(records)
                received.took(got)
        finally:
            with contextlib.suppress(Exception):
                await consumer.stop()

    try:
        uvloop.run(run())
    finally:
        received.report(results)


def _consume_worker_java(bootstrap: str, group: str, topic: str, ready, start, stop, done, results) -> None:
    """``_consume_worker`` with Apache Kafka's own Java ``KafkaShareConsumer`` (implicit acknowledgement;
    :mod:`kshare.bench.java_driver`, one line per poll). It keeps a ShareFetch in every leader
    (``ShareConsumeRequestManager``: one request per node without one pending), where librdkafka fetches
    from one broker at a time."""
    import json
    import subprocess
    import threading

    from ..java_driver import java_share_driver

    received = _Received(done)
    proc = subprocess.Popen(
        [*java_share_driver(), "--bootstrap", bootstrap, "--group", group, "--topic", topic, "--summary", "true",
         "--control", "stdin", "--timeout-ms", "3600000", "--poll-ms", "200"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        line = proc.stdout.readline()
        if '"subscribed"' not in line:
            raise RuntimeError(f"the Java share consumer did not start: {line!r}")
        ready.release()
        start.wait()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        threading.Thread(target=lambda: (stop.wait(), proc.stdin.write("stop\n"), proc.stdin.flush()),
                         daemon=True).start()
        for line in proc.stdout:
            event = json.loads(line)
            if event.get("event") != "poll":
                continue
            for p, lo, hi in event["ranges"]:
                received.keys.extend(range((p << 40) | lo, ((p << 40) | hi) + 1))
            received.took(event["n"])
    finally:
        with contextlib.suppress(Exception):
            proc.wait(60)
        if proc.poll() is None:
            proc.kill()
        received.report(results)


CONSUMER_WORKERS = {"confluent": _consume_worker, "aio": _consume_worker_aio, "java": _consume_worker_java}


@dataclass
class ThroughputRun:
    proxies: int  # 0: one proxy without an instance group
    round: int
    seconds: float  # first poll -> last record
    data_seconds: float  # first record -> last record
    records: int
    distinct: int
    delivered: int
    proxy_cpu: list[float]  # per proxy, CPU seconds over the window
    broker_cpu: float
    consumer_cpu: float
    leaders: dict[str, int]  # proxy -> data partitions it led
    idle_cpu: float  # the proxies' CPU while idle before the run, cores (CPU s per s), summed
    load_before: str
    load_after: str

    @property
    def rate(self) -> float:
        return self.records / self.seconds

    @property
    def cpu_per_m(self) -> float:
        return sum(self.proxy_cpu) / self.records * 1e6


def stop_consumers(stop: Any, results: Any, procs: list[Any]) -> tuple[set[int], int, list[float], list[float]]:
    """Stop the ``_consume_worker`` processes and gather what they read: (distinct record indexes,
    deliveries, each one's first and last delivery time)."""
    stop.set()
    got = [results.get(timeout=120) for _ in procs]
    for pr in procs:
        pr.join(30)
    keys: set[int] = set()
    delivered = 0
    for _, _, _, raw in got:
        a = array.array("q")
        a.frombytes(raw)
        delivered += len(a)
        keys.update(a)
    return keys, delivered, [g[1] for g in got if g[1] is not None], [g[2] for g in got if g[2] is not None]


def tear_down(procs: list[Any], proxies: list[ProxyProc]) -> None:
    """Kill the consumer processes still running, stop the proxies, log what their logs hold worth a look."""
    for pr in procs:
        if pr.is_alive():
            pr.kill()
    for p in proxies:
        p.stop()
    notes = [f"{p.name}: {line}" for p in proxies for line in p.notes()]
    if notes:
        log.info("  proxy log lines worth a look:\n  " + "  ".join(notes[-15:]))


def _proc_cpu(pid: int) -> float:
    try:
        return cpu_seconds(pid)
    except OSError:
        return 0.0


def throughput_run(k3: Upstream, n: int, rnd: int, topic: str, records: int, consumers: int,
                   state_partitions: int, timeout: float) -> ThroughputRun:
    before = load()
    proxies = start_service(k3, n, 10_000, state_partitions)
    ctx = mp.get_context("spawn")
    procs: list[Any] = []
    try:
        boot = bootstrap_of(proxies)
        lead = leaders(proxies, topic)
        split = {p.name: sum(1 for _, name in lead.values() if name == p.name) for p in proxies}
        group = f"bench-so-{uuid.uuid4().hex[:8]}"
        clients.share_group(boot, group)
        i0, ti = [p.cpu() for p in proxies], time.monotonic()
        time.sleep(2.0)
        idle = sum(p.cpu() - a for p, a in zip(proxies, i0, strict=True)) / (time.monotonic() - ti)
        ready, start, stop = ctx.Semaphore(0), ctx.Event(), ctx.Event()
        done, results = ctx.Value("q", 0), ctx.Queue()
        procs = [ctx.Process(target=_consume_worker, args=(boot, group, topic, ready, start, stop, done, results),
                             daemon=True) for _ in range(consumers)]
        for pr in procs:
            pr.start()
        for _ in procs:
            if not ready.acquire(timeout=60):
                raise TimeoutError("consumers not ready")
        cpu0 = [p.cpu() for p in proxies]
        b0 = _proc_cpu(k3.pid) if k3.pid else float("nan")
        c0 = sum(_proc_cpu(pr.pid) for pr in procs)
        t0 = time.monotonic()
        start.set()
        deadline = t0 + timeout
        while done.value < records:
            if time.monotonic() > deadline:
                raise TimeoutError(f"read {done.value} of {records} through {n} proxies")
            time.sleep(0.005)
        t1 = time.monotonic()
        cpu1 = [p.cpu() for p in proxies]
        b1 = _proc_cpu(k3.pid) if k3.pid else float("nan")
        c1 = sum(_proc_cpu(pr.pid) for pr in procs)
        keys, delivered, firsts, lasts = stop_consumers(stop, results, procs)
        # the clock stops when the count reached ``records`` (t1): the last record is at most t1
        last = min(t1, max(lasts)) if lasts else t1
        run = ThroughputRun(n, rnd, last - t0, last - min(firsts), records, len(keys), delivered,
                            [b - a for a, b in zip(cpu0, cpu1, strict=True)], b1 - b0, c1 - c0, split, idle, before, load())
    finally:
        tear_down(procs, proxies)
    return run


def throughput_part(k3: Upstream, records: int, size: int, partitions: int, consumers: int, rounds: int,
                    state_partitions: int, counts: list[int]) -> list[ThroughputRun]:
    topic = f"bench-so-{size}-{uuid.uuid4().hex[:8]}"
    clients.create_topic(k3.bootstrap, topic, partitions)
    secs = clients.produce(k3.bootstrap, topic, records, size, partitions)
    log.info(f"produced {records:,} x {size} B to {partitions} partitions in {secs:.1f} s; load {load()}")
    runs = []
    for r in range(rounds):
        for n in (counts if r % 2 == 0 else list(reversed(counts))):
            run = throughput_run(k3, n, r, topic, records, consumers, state_partitions, timeout=600)
            runs.append(run)
            split = " ".join(f"{c:.1f}" for c in run.proxy_cpu)
            log.info(f"  round {r} {_label(n)}: {run.rate:>9,.0f} rec/s ({run.seconds:.2f} s; first->last record "
                f"{records / run.data_seconds:,.0f} rec/s) | proxy CPU {sum(run.proxy_cpu):.1f} s "
                f"[{split}] = {run.cpu_per_m:.1f} s/M | broker {run.broker_cpu:.1f} s, consumers "
                f"{run.consumer_cpu:.1f} s | idle proxies {run.idle_cpu:.0%} | leaders {run.leaders} | distinct {run.distinct:,}/{records:,}, "
                f"delivered {run.delivered:,} | load {run.load_before} -> {run.load_after}")
            if run.distinct != records:
                log.warning(f"  !! {records - run.distinct} record(s) never read")
    clients.delete_topic(k3.bootstrap, topic)
    return runs


def _label(n: int) -> str:
    return "1 proxy, no instance group" if n == 0 else f"{n} proxy(ies)"


def throughput_tables(runs: list[ThroughputRun], counts: list[int]) -> tuple[str, dict[int, dict[str, float]]]:
    med: dict[int, dict[str, float]] = {}
    for n in counts:
        rs = [r for r in runs if r.proxies == n]
        shares = [sorted((c / sum(r.proxy_cpu) for c in r.proxy_cpu), reverse=True) for r in rs]
        med[n] = {
            "rate": statistics.median(r.rate for r in rs),
            "data_rate": statistics.median(r.records / r.data_seconds for r in rs),
            "cpu_per_m": statistics.median(r.cpu_per_m for r in rs),
            "max_share": statistics.median(s[0] for s in shares),
            "broker_per_m": statistics.median(r.broker_cpu / r.records * 1e6 for r in rs),
            "consumer_per_m": statistics.median(r.consumer_cpu / r.records * 1e6 for r in rs),
            "idle": statistics.median(r.idle_cpu for r in rs),
            "runs": len(rs),
        }
        for i in range(max(n, 1)):
            med[n][f"share{i}"] = statistics.median(s[i] for s in shares)
    base = med[1] if 1 in med else med[counts[0]]
    lines = ["| proxies | runs | records/s (first poll -> last) | vs 1 proxy | records/s (first -> last record) "
             "| proxy CPU s / M records (all proxies) | vs 1 proxy | per-proxy CPU split (busiest first) "
             "| broker CPU s / M | consumers CPU s / M | proxies idle (cores) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |"]
    for n in counts:
        m = med[n]
        split = " / ".join(f"{m[f'share{i}']:.0%}" for i in range(max(n, 1)))
        lines.append(f"| {_label(n)} | {m['runs']} | {m['rate']:,.0f} | {m['rate'] / base['rate']:.2f} | {m['data_rate']:,.0f} "
                     f"| {m['cpu_per_m']:.1f} | {m['cpu_per_m'] / base['cpu_per_m']:.2f} | {split} "
                     f"| {m['broker_per_m']:.1f} | {m['consumer_per_m']:.1f} | {m['idle']:.2f} |")
    lines += ["", "Model, not a measurement: N proxies on N cores of their own, each proxy CPU-bound. The "
              "proxies need C_N CPU seconds per million records in total (measured above with N proxies) "
              "and the busiest carries a share s_max of it, so the proxy tier saturates at "
              "1e6 / (C_N x s_max) records/s (the busiest proxy's core full); the broker and the "
              "consumers are assumed not to be the limit.", "",
              "| proxies (cores) | C_N s / M | s_max | per-proxy CPU s / M (busiest) | proxy-bound ceiling rec/s "
              "| vs 1 proxy |", "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    ceil1 = 1e6 / (base["cpu_per_m"] * base["max_share"])
    for n in counts:
        if n == 0:
            continue
        m = med[n]
        ceiling = 1e6 / (m["cpu_per_m"] * m["max_share"])
        lines.append(f"| {n} | {m['cpu_per_m']:.1f} | {m['max_share']:.2f} | {m['cpu_per_m'] * m['max_share']:.1f} "
                     f"| {ceiling:,.0f} | {ceiling / ceil1:.2f} |")
    return "\n".join(lines), med


def run(env: Env, progress: Progress, *, records: int, value_size: int, partitions: int, consumers: int,
        proxies: list[int], state_partitions: int, state_writers: int, state_seconds: float,
        repeats: int, ho_records: int = 0, ho_rate: float = 1000.0, ho_partitions: int = 12, ho_consumers: int = 4,
        ho_session_ms: int = 6000, ho_work_ms: float = 2.0, split_topics: int = 5, bu_records: int = 0,
        bu_partitions: int = 4, bu_consumers: int = 4, bu_rounds: int = 4, bu_cores: float = 0.07,
        bu_period_ms: float = 20.0, bu_clients: list[str] | None = None) -> dict[str, Any]:
    k3 = upstream_of(env)
    progress.begin("scale_out", 2 + bool(ho_records) + bool(bu_records))
    tput = throughput_part(k3, records, value_size, partitions, consumers, repeats, state_partitions, proxies)
    progress.step(f"{len(tput)} runs")
    budget = None
    if bu_records:  # two proxies against one, each held to a CPU budget: scaling measured
        budget = budget_part(k3, records=bu_records, value_size=value_size, partitions=bu_partitions,
                             consumers=bu_consumers, rounds=bu_rounds, cores=bu_cores, period_ms=bu_period_ms,
                             ceiling=True, state_partitions=state_partitions,
                             consumer_clients=tuple(bu_clients or ("java", "confluent")))
        progress.step(budget.get("skipped") or f"{len(budget['runs'])} budget runs")
    handover = None
    if ho_records:  # leadership splits and hand-overs, by topic and by state partition side by side
        handover = handover_part(k3, records=ho_records, rate=ho_rate, partitions=ho_partitions,
                                 consumers=ho_consumers, session_ms=ho_session_ms, state_partitions=state_partitions,
                                 split_topics=split_topics, work_ms=ho_work_ms)
        progress.step(f"{len(handover['runs'])} hand-over runs")
    # the state writes alone: the cost of an instance group's fencing, with a resolution the short
    # consumption runs above do not have (kshare.bench.state_writes)
    state = state_part(k3.bootstrap, k3.pid, state_writers, state_seconds, repeats, state_partitions, log=log.info)
    progress.step(f"{len(state)} state-write runs")
    progress.end()
    _, med = throughput_tables(tput, proxies)
    base = med.get(1) or med[proxies[0]]
    rows = [{"proxies": n, "records_per_s": m["rate"], "vs_1_proxy": m["rate"] / base["rate"],
             "proxy_cpu_s_per_m": m["cpu_per_m"], "busiest_share": m["max_share"]} for n, m in med.items()]
    return results(
        {"records": records, "value_size": value_size, "partitions": partitions, "consumers": consumers,
         "proxies": proxies, "state_partitions": state_partitions, "repeats": repeats,
         "broker_cpu": k3.pid is not None, "state_writers": state_writers, "state_seconds": state_seconds},
        rows,
        runs=[asdict(r) for r in tput],
        medians={str(n): m for n, m in med.items()},
        state_runs=[asdict(r) for r in state],
        state_medians=state_table(state)[1],
        handover=handover,
        budget=budget,
        targets=budget_targets(budget),
    )


def section(res: dict[str, Any]) -> list[str]:
    cfg = res.get("config", {})
    runs = [ThroughputRun(**r) for r in res.get("runs", [])]
    text, _ = throughput_tables(runs, cfg.get("proxies", sorted({r.proxies for r in runs})))
    return [f"{fmt_num(cfg.get('records'))} records x {cfg.get('value_size')} B over {cfg.get('partitions')} "
            f"partitions (produced beforehand), {cfg.get('consumers')} ShareConsumer processes (implicit "
            "acknowledgement) bootstrapped from all proxies, a fresh group and service per run, "
            f"{cfg.get('state_partitions')} state partitions; configurations alternated over {cfg.get('repeats')} "
            "round(s), medians. The proxies, the broker and the consumers share the machine's cores.", "",
            *text.split("\n"), "", *budget_section(res.get("budget")), *_state_section(res),
            *handover_section(res.get("handover"))]


def _state_section(res: dict[str, Any]) -> list[str]:
    runs = [StateRun(**r) for r in res.get("state_runs", [])]
    if not runs:
        return []
    cfg = res.get("config", {})
    return [f"State writes alone (the cost of fencing): {cfg.get('state_writers')} concurrent writers, each "
            f"writing one ShareUpdate after the other to its own share-partition for {cfg.get('state_seconds')} s, "
            f"through the state store on {cfg.get('state_partitions')} state partitions with and without an "
            "instance group's claims, alternated, medians.", "", *state_table(runs)[0].split("\n"), ""]


def plot(plt: Any, res: dict[str, Any]) -> Any:
    med = {int(n): m for n, m in res.get("medians", {}).items()}
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    ns = sorted(med)
    names = ["1, no group" if n == 0 else str(n) for n in ns]
    a1.bar(names, [med[n]["rate"] for n in ns], color="tab:blue")
    a1.set_xlabel("proxies (cores shared)")
    a1.set_ylabel("records/s (median)")
    a1.set_title("share consumption throughput", fontsize=10)
    bottom = [0.0] * len(ns)
    for i in range(max(ns, default=0)):
        vals = [med[n]["cpu_per_m"] * med[n].get(f"share{i}", 0.0) for n in ns]
        a2.bar(names, vals, bottom=bottom, label=f"proxy {i + 1} (busiest first)")
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    a2.set_xlabel("proxies")
    a2.set_ylabel("proxy CPU s per million records")
    a2.set_title("proxy CPU, split per proxy", fontsize=10)
    a2.legend(fontsize=8)
    return fig


SCENARIO = scenario(
    __name__, "Scale-out: 1-3 kshare proxies as one instance group, throughput and the CPU split",
    needs=frozenset({UPSTREAM}),
    opt_in=True,  # about 10 minutes, 8 more for the hand-overs and 8 for the budgets
    max_repeats=3,
)
