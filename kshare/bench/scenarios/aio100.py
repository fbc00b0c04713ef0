"""The ``aio100`` scenario of ``kshare bench`` (run only when named: ``--only aio100``): 100 members of
one share group in one process, as 100 :class:`kshare.AIOShareConsumer` on one asyncio event loop
against 100 confluent-kafka (librdkafka) ``ShareConsumer`` on 100 threads, reading one topic of 16
partitions, through kshare (in front of Kafka 3.9) and on native Kafka 4.4, side by side in one run
(issue 43: CPU and memory per record).

Each run is a process of its own (``python -m kshare.bench.scenarios.aio100 <json>``) holding only
the consumers, so that its CPU time (user + system, every thread, from ``getrusage``) and its RSS
(``/proc/self/status``: ``VmRSS`` and its peak ``VmHWM``) are the consumers' alone: brokers, proxy and this
process are elsewhere. The process reports its figures as one JSON line.

The records are produced in batches of about 550 (64 KiB producer batches), so that a whole topic
is thousands of batches and every member gets some even when whole batches are acquired at a time.
Each run uses a fresh share group (reading from the earliest offset) on the same topic."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import subprocess
import sys
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

from .. import clients
from ..format import bars, fmt_num, table
from ..procs import cpu_seconds, load
from .common import KAFKA4, UPSTREAM, alternate, median, produce_round_robin, scenario

if TYPE_CHECKING:
    from ..runner import Env, Progress

CLIENTS = ("confluent", "aio")
SYSTEMS = ("kshare", "native")
MAX_POLL_RECORDS = 500
VALUE_SIZE = 100
PRODUCER_BATCH_BYTES = 64 * 1024


# -- the consumer process ----------------------------------------------------------------------------


def _status(field: str) -> float:
    """A number of ``/proc/self/status`` (kB for the sizes)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return float(line.split()[1])
    return float("nan")


def _status_mb(field: str) -> float:
    return _status(field) / 1024.0


def _rss_mb() -> float:
    return _status_mb("VmRSS:")


def _peak_rss_mb() -> float:
    """This process's peak RSS since its exec (``VmHWM``; ``ru_maxrss`` would be the bench's, whose
    fork it began as, when that was larger)."""
    return _status_mb("VmHWM:")


def _cpu_s() -> float:
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


class _Clock:
    """The consumer process's clocks: marks taken at the start, at the first record, when every record
    was read and when every member has closed."""

    def __init__(self, records: int, timeout: float) -> None:
        self.records = records
        self.deadline = time.monotonic() + timeout
        self.rss0 = _rss_mb()
        self.t0, self.cpu0 = time.perf_counter(), _cpu_s()
        self.usage0 = resource.getrusage(resource.RUSAGE_SELF)
        self.first: tuple[float, float] | None = None
        self.last: tuple[float, float, float, float] | None = None

    def seen(self, n: int) -> bool:
        """``n`` records read so far: True when all are."""
        if n and self.first is None:
            self.first = (time.perf_counter(), _cpu_s())
        if n >= self.records and self.last is None:
            self.last = (time.perf_counter(), _cpu_s(), _rss_mb(), _status("Threads:"))
        if time.monotonic() > self.deadline:
            raise TimeoutError(f"read {n} of {self.records} records")
        return self.last is not None

    def report(self, n: int, counts: list[int], members: int) -> dict[str, Any]:
        t_end, cpu_end = time.perf_counter(), _cpu_s()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        assert self.first is not None and self.last is not None
        (t1, c1), (t2, c2, rss_read, threads) = self.first, self.last
        return {
            "read": n,
            "members": members,
            "members_with_records": sum(1 for c in counts if c),
            "min_member_records": min(counts),
            "max_member_records": max(counts),
            "join_s": t1 - self.t0,
            "data_s": t2 - t1,
            "total_s": t_end - self.t0,
            "cpu_join_s": c1 - self.cpu0,
            "cpu_data_s": c2 - c1,
            "cpu_total_s": cpu_end - self.cpu0,
            "cpu_user_s": usage.ru_utime - self.usage0.ru_utime,  # the whole run's, user and system apart
            "cpu_system_s": usage.ru_stime - self.usage0.ru_stime,
            "context_switches": (usage.ru_nvcsw + usage.ru_nivcsw)
            - (self.usage0.ru_nvcsw + self.usage0.ru_nivcsw),
            "rss_start_mb": self.rss0,
            "rss_read_mb": rss_read,
            "rss_end_mb": _rss_mb(),
            "max_rss_mb": _peak_rss_mb(),
            "threads": threads,  # the OS's (librdkafka's included), when every record was read
        }


def confluent_members(
    bootstrap: str, topic: str, group: str, records: int, members: int, timeout: float
) -> dict[str, Any]:
    """``members`` confluent ``ShareConsumer`` on a thread each, until they read ``records`` together."""
    from confluent_kafka import ShareConsumer

    clock = _Clock(records, timeout)
    counts = [0] * members
    stop = threading.Event()
    failures: list[BaseException] = []

    def member(i: int) -> None:
        try:
            c = ShareConsumer(
                {
                    "bootstrap.servers": bootstrap,
                    "group.id": group,
                    "max.poll.records": MAX_POLL_RECORDS,
                    "error_cb": clients._quiet,
                    "log_level": 3,
                }
            )
            c.subscribe([topic])
            try:
                while not stop.is_set():
                    counts[i] += sum(1 for m in c.poll(0.5) if m.error() is None)
            finally:
                c.close()
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            failures.append(exc)
            stop.set()

    threads = [threading.Thread(target=member, args=(i,), daemon=True) for i in range(members)]
    for t in threads:
        t.start()
    try:
        while not clock.seen(sum(counts)) and not failures:
            time.sleep(0.02)
    finally:
        stop.set()
        for t in threads:
            t.join(120)
    if failures:
        raise failures[0]
    return clock.report(sum(counts), counts, members)


def aio_members(
    bootstrap: str, topic: str, group: str, records: int, members: int, timeout: float, uvloop: bool = False
) -> dict[str, Any]:
    """``members`` :class:`kshare.AIOShareConsumer` on one event loop, until they read ``records`` together."""
    from kshare import AIOShareConsumer

    async def main() -> dict[str, Any]:
        clock = _Clock(records, timeout)
        counts = [0] * members
        stop = asyncio.Event()

        async def member(i: int) -> None:
            async with AIOShareConsumer(
                topic, bootstrap_servers=bootstrap, group_id=group, max_poll_records=MAX_POLL_RECORDS
            ) as c:
                while not stop.is_set():
                    got = await c.getmany(timeout_ms=500)
                    for rs in got.values():
                        counts[i] += len(rs)

        tasks = [asyncio.create_task(member(i)) for i in range(members)]
        try:
            while not clock.seen(sum(counts)):
                done = [t for t in tasks if t.done()]
                for t in done:
                    t.result()  # a member that stopped early raises here
                await asyncio.sleep(0.02)
        finally:
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 120)
        return clock.report(sum(counts), counts, members)

    if uvloop:
        import uvloop as _uvloop

        return _uvloop.run(main())
    return asyncio.run(main())


def _child(args: dict[str, Any]) -> dict[str, Any]:
    kw = {k: args[k] for k in ("bootstrap", "topic", "group", "records", "members", "timeout")}
    if args["client"] == "confluent":
        return confluent_members(**kw)
    return aio_members(**kw, uvloop=args["client"] == "aio-uvloop")


def run_members(
    client: str, bootstrap: str, topic: str, records: int, members: int, timeout: float = 900.0
) -> dict[str, Any]:
    """One run in a process of its own, in a fresh share group."""
    group = f"bench-aio100-{client}-{uuid.uuid4().hex[:8]}"
    clients.share_group(bootstrap, group)
    args = {
        "client": client,
        "bootstrap": bootstrap,
        "topic": topic,
        "group": group,
        "records": records,
        "members": members,
        "timeout": timeout,
    }
    proc = subprocess.run(
        [sys.executable, "-m", __name__, json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=timeout + 180,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        raise RuntimeError(
            f"{client} x {members} via {bootstrap} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
        )
    return json.loads(lines[-1])


def produce(bootstrap: str, topic: str, records: int, partitions: int) -> None:
    """``records`` values of :data:`VALUE_SIZE` bytes round-robin, in producer batches of
    :data:`PRODUCER_BATCH_BYTES` (about 550 records)."""
    from confluent_kafka import Producer

    errors: list[object] = []
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 100,
            "batch.size": PRODUCER_BATCH_BYTES,
            "queue.buffering.max.messages": 2_000_000,
            "queue.buffering.max.kbytes": 2_097_151,
            "compression.type": "none",
            "acks": "all",
            "delivery.report.only.error": True,
            "on_delivery": lambda err, msg: errors.append(err),
            "error_cb": clients._quiet,
        }
    )
    produce_round_robin(p, topic, records, partitions, os.urandom(VALUE_SIZE))
    left = p.flush(300)
    if left or errors:
        raise RuntimeError(f"produce to {topic} via {bootstrap}: {left} undelivered, errors {errors[:3]}")


# -- the scenario ------------------------------------------------------------------------------------


def run(
    env: Env,
    progress: Progress,
    *,
    records: int,
    members: int,
    repeats: int,
    partitions: int = 16,
    client_names: list[str] | None = None,
    systems: list[str] | None = None,
) -> dict[str, Any]:
    names = list(client_names or CLIENTS)
    systems = list(systems or SYSTEMS)
    bootstraps: dict[str, str] = {}
    proxy_pid = 0
    if "kshare" in systems:
        proxy = env.proxy()
        bootstraps["kshare"] = proxy.bootstrap
        proxy_pid = proxy.pid
    if "native" in systems:
        bootstraps["native"] = env.kafka4()
    producers = {"kshare": env.upstream(), "native": bootstraps.get("native", "")}
    configs = [(s, c) for s in systems for c in names]
    progress.begin("aio100", 1 + repeats * len(configs))
    samples: list[dict[str, Any]] = []
    topic = f"bench-aio100-{uuid.uuid4().hex[:8]}"
    try:
        for system in systems:
            clients.create_topic(producers[system], topic, partitions)
            produce(producers[system], topic, records, partitions)
        batches = {s: clients.count_batches(producers[s], topic) for s in systems}
        progress.step(
            f"{records:,} x {VALUE_SIZE} B on {partitions} partitions produced "
            f"({', '.join(f'{s}: {b:,} batches' for s, b in batches.items())}); load {load()}"
        )
        for r in range(repeats):
            for system, client in alternate(configs, r):
                load_before = load()
                # the proxy's CPU over the run (user + system): what serving the members costs it
                proxy0 = cpu_seconds(proxy_pid) if system == "kshare" else float("nan")
                s = run_members(client, bootstraps[system], topic, records, members)
                s["proxy_cpu_s"] = cpu_seconds(proxy_pid) - proxy0 if system == "kshare" else float("nan")
                samples.append(
                    {"system": system, "client": client, "repeat": r, "records": records, "load": load_before}
                    | s
                )
                progress.step(
                    f"{system} {members} x {client}: {records / s['data_s']:,.0f} rec/s, "
                    f"CPU {s['cpu_total_s'] * 1e6 / records:.2f} us/record "
                    f"({s['cpu_data_s'] * 1e6 / records:.2f} reading), peak RSS {s['max_rss_mb']:.0f} MB "
                    f"(+{s['max_rss_mb'] - s['rss_start_mb']:.0f}), {s['members_with_records']} members "
                    f"with records"
                    + (
                        f", proxy CPU {s['proxy_cpu_s'] * 1e6 / records:.2f} us/record"
                        if system == "kshare"
                        else ""
                    )
                    + f"; load {load_before}"
                )
    finally:
        for system in systems:
            clients.delete_topic(producers[system], topic)
    rows: list[dict[str, Any]] = []
    for system in systems:
        for client in names:
            ss = [s for s in samples if (s["system"], s["client"]) == (system, client)]
            m = {
                k: median([s[k] for s in ss])
                for k in (
                    "join_s",
                    "data_s",
                    "total_s",
                    "cpu_join_s",
                    "cpu_data_s",
                    "cpu_total_s",
                    "rss_start_mb",
                    "rss_read_mb",
                    "max_rss_mb",
                    "members_with_records",
                    "threads",
                    "proxy_cpu_s",
                )
            }
            rows.append(
                {
                    "system": system,
                    "client": client,
                    "members": members,
                    "records": records,
                    "partitions": partitions,
                    "rps": records / m["data_s"],
                    "cpu_us_per_record": m["cpu_total_s"] * 1e6 / records,
                    "cpu_data_us_per_record": m["cpu_data_s"] * 1e6 / records,
                    "proxy_cpu_us_per_record": m["proxy_cpu_s"] * 1e6 / records,  # NaN on native
                    "rss_growth_mb": median([s["max_rss_mb"] - s["rss_start_mb"] for s in ss]),
                    "rss_bytes_per_record": median(
                        [(s["max_rss_mb"] - s["rss_start_mb"]) * 2**20 / records for s in ss]
                    ),
                }
                | m
            )
    progress.end()
    return {
        "config": {
            "records": records,
            "members": members,
            "partitions": partitions,
            "value_size": VALUE_SIZE,
            "producer_batch_bytes": PRODUCER_BATCH_BYTES,
            "repeats": repeats,
            "clients": names,
            "systems": systems,
            "max_poll_records": MAX_POLL_RECORDS,
            "batches": batches,
        },
        "rows": rows,
        "samples": samples,
        "targets": [],
    }


# -- results.md and the plot -------------------------------------------------------------------------


def section(res: dict[str, Any]) -> list[str]:
    cfg = res.get("config", {})
    out = [
        f"{cfg.get('members', 100)} members of one share group in one process read {cfg.get('records', 0):,} "
        f"records of {cfg.get('value_size', VALUE_SIZE)} B on {cfg.get('partitions', 16)} partitions (implicit "
        f"acknowledgement, `max.poll.records` {cfg.get('max_poll_records', MAX_POLL_RECORDS)}): confluent-kafka "
        "`ShareConsumer`s on a thread each against `kshare.AIOShareConsumer`s on one asyncio event loop, each "
        "side a process of its own. CPU is that process's (user + system, every thread) per record, from before "
        "the first member starts to after the last one closed (`reading`: first record to last); RSS is the "
        "process's: at the start (imports done), at its peak, and the peak's growth over the start. Proxy CPU: "
        "the kshare proxy process's (user + system) over the whole run, per record.",
        "",
    ]
    head = [
        "system",
        "client",
        "rec/s",
        "CPU us/rec",
        "CPU us/rec reading",
        "proxy CPU us/rec",
        "join s",
        "RSS start MB",
        "peak RSS MB",
        "growth MB",
        "members with records",
        "threads",
    ]
    rows = []
    for r in res.get("rows", []):
        rows.append(
            [
                "kshare (3.9)" if r["system"] == "kshare" else "native 4.4",
                r["client"],
                fmt_num(r["rps"]),
                fmt_num(r["cpu_us_per_record"], 2),
                fmt_num(r["cpu_data_us_per_record"], 2),
                fmt_num(r.get("proxy_cpu_us_per_record", float("nan")), 2),
                fmt_num(r["join_s"], 1),
                fmt_num(r["rss_start_mb"]),
                fmt_num(r["max_rss_mb"]),
                fmt_num(r["rss_growth_mb"]),
                fmt_num(r["members_with_records"]),
                fmt_num(r["threads"]),
            ]
        )
    out += table(head, rows, "ll" + "r" * (len(head) - 2))
    out.append("")
    return out


def plot(plt: Any, res: dict[str, Any]) -> Any:
    rows = res["rows"]
    names = res["config"].get("clients", list(CLIENTS))
    systems = res["config"].get("systems", list(SYSTEMS))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))

    def of(key: str) -> dict[str, list[float]]:
        return {
            c: [
                next((r[key] for r in rows if (r["system"], r["client"]) == (s, c)), float("nan"))
                for s in systems
            ]
            for c in names
        }

    bars(ax1, systems, of("cpu_us_per_record"), "CPU us per record (whole run)")
    ax1.set_title(f"{res['config'].get('members', 100)} share consumers in one process: CPU", fontsize=10)
    bars(ax2, systems, of("max_rss_mb"), "peak RSS (MB)")
    ax2.set_title("memory of the consumer process", fontsize=10)
    return fig


# one topic per run; 2 systems x 2 clients a repeat, each run some 10-40 s on a loaded 2-core machine
SIZES = ({"records": 2_000_000, "members": 100}, {"records": 200_000, "members": 20})
SCENARIO = scenario(
    __name__,
    "100 AIOShareConsumers on one event loop vs 100 confluent ShareConsumers on threads: CPU and memory",
    needs=frozenset({UPSTREAM, KAFKA4}),
    opt_in=True,  # heavy (100 members a side), a figure for the docs
    default_repeats=3,
)


if __name__ == "__main__":
    print(json.dumps(_child(json.loads(sys.argv[1]))), flush=True)
