"""The ``aioconsumer`` scenario of ``kshare bench`` (run only when named: ``--only aioconsumer``):
records/s of one :class:`kshare.AIOShareConsumer` against one confluent-kafka (librdkafka)
``ShareConsumer``, both in implicit mode with ``max.poll.records`` 500, each reading a whole topic
of 4 partitions from a fresh share group, through kshare (in front of Kafka 3.9) and on native
Kafka 4.4, side by side in one run (issue 43: goal >= 0.8x confluent's).

The AIOShareConsumer runs on asyncio's default event loop (``aio``) and on uvloop
(``aio-uvloop``); every client runs in this process, one at a time, so its CPU time is this
process's (librdkafka's threads included)."""

from __future__ import annotations

import asyncio
import resource
import time
import uuid
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from .. import clients
from ..format import bars, fmt_num, fmt_ratio, fmt_size, table
from ..procs import load
from .common import KAFKA4, UPSTREAM, alternate, median, per_round, scenario, target

if TYPE_CHECKING:
    from ..runner import Env, Progress

AIO_TARGET = 0.8  # AIOShareConsumer records/s / confluent ShareConsumer's
MAX_POLL_RECORDS = 500
CLIENTS = ("confluent", "aio", "aio-uvloop")
SYSTEMS = ("kshare", "native")
FULL_BATCHES_LINGER_MS = 1000


@dataclass
class Run:
    seconds: float  # start -> last record (the join included)
    first_record_s: float
    data_seconds: float  # first record -> last record
    cpu_s: float  # this process's CPU time over the run
    max_rss_mb: float


class Reading:
    """One consumer reading ``records``: the clocks start at construction, :meth:`got` counts what each poll
    returned (the first record's time, the deadline), :meth:`end` stops the clocks (before the consumer
    closes) and :meth:`run` is the :class:`Run` (every record read, or an error)."""

    def __init__(self, who: str, bootstrap: str, records: int, timeout: float) -> None:
        self.who, self.bootstrap, self.records = who, bootstrap, records
        self.c0, self.t0 = time.process_time(), time.perf_counter()
        self.deadline = time.monotonic() + timeout
        self.n, self.first, self.t1, self.cpu = 0, None, 0.0, 0.0

    def wants_more(self) -> bool:
        return self.n < self.records

    def got(self, n: int) -> None:
        self.n += n
        if self.n and self.first is None:
            self.first = time.perf_counter()
        if time.monotonic() > self.deadline:
            raise TimeoutError(f"{self.who} read {self.n} of {self.records} via {self.bootstrap}")

    def end(self) -> None:
        self.t1, self.cpu = time.perf_counter(), time.process_time() - self.c0

    def run(self) -> Run:
        if self.n != self.records:
            raise RuntimeError(f"{self.who} read {self.n} records, want {self.records}")
        first = self.first or self.t0
        return Run(self.t1 - self.t0, first - self.t0, self.t1 - first, self.cpu, _max_rss_mb())


def confluent_run(bootstrap: str, topic: str, records: int, timeout: float = 600.0) -> Run:
    from confluent_kafka import ShareConsumer

    group = f"bench-aio-c-{uuid.uuid4().hex[:8]}"
    clients.share_group(bootstrap, group)
    reading = Reading("confluent ShareConsumer", bootstrap, records, timeout)
    c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group, "max.poll.records": MAX_POLL_RECORDS,
                       "error_cb": clients._quiet, "log_level": 3})
    c.subscribe([topic])
    try:
        while reading.wants_more():
            reading.got(sum(1 for m in c.poll(1.0) if m.error() is None))
        reading.end()
    finally:
        c.close()
    return reading.run()


def aio_run(bootstrap: str, topic: str, records: int, *, uvloop: bool = False, timeout: float = 600.0) -> Run:
    group = f"bench-aio-a-{uuid.uuid4().hex[:8]}"
    clients.share_group(bootstrap, group)

    async def main() -> Run:
        from kshare import AIOShareConsumer

        reading = Reading("AIOShareConsumer", bootstrap, records, timeout)
        async with AIOShareConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                                    max_poll_records=MAX_POLL_RECORDS) as c:
            while reading.wants_more():
                reading.got(sum(len(rs) for rs in (await c.getmany(timeout_ms=1000)).values()))
            reading.end()
        return reading.run()

    if uvloop:
        import uvloop as _uvloop

        return _uvloop.run(main())
    return asyncio.run(main())


def _max_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def run(env: Env, progress: Progress, *, records: dict[int, int], repeats: int, partitions: int = 4,
        client_names: list[str] | None = None, systems: list[str] | None = None,
        warmup: bool = True) -> dict[str, Any]:
    names = list(client_names or CLIENTS)
    systems = list(systems or SYSTEMS)
    bootstraps: dict[str, str] = {}
    if "kshare" in systems:
        bootstraps["kshare"] = env.proxy().bootstrap
    if "native" in systems:
        bootstraps["native"] = env.kafka4()
    producers = {"kshare": env.upstream(), "native": bootstraps.get("native", "")}
    sizes = sorted(records)
    configs = [(s, c) for s in systems for c in names]
    progress.begin("aioconsumer", len(sizes) * (1 + repeats * len(configs)) + (len(configs) if warmup else 0))
    samples: list[dict[str, Any]] = []

    def one(system: str, client: str, topic: str, n: int) -> Run:
        b = bootstraps[system]
        if client == "confluent":
            return confluent_run(b, topic, n)
        return aio_run(b, topic, n, uvloop=client == "aio-uvloop")

    for i, size in enumerate(sizes):
        n = records[size]
        topic = f"bench-aio-{size}-{uuid.uuid4().hex[:8]}"
        for system in systems:
            clients.create_topic(producers[system], topic, partitions)
            clients.produce(producers[system], topic, n, size, partitions, linger_ms=FULL_BATCHES_LINGER_MS)
        progress.step(f"{n:,} x {size} B on {partitions} partitions produced; load {load()}")
        try:
            rounds = [(None, c) for c in configs] if warmup and i == 0 else []
            rounds += [(r, c) for r in range(repeats) for c in alternate(configs, r)]
            for r, (system, client) in rounds:
                run = one(system, client, topic, n)
                if r is not None:
                    samples.append({"system": system, "client": client, "value_size": size, "records": n,
                                    "repeat": r} | asdict(run))
                progress.step(f"{'warm-up ' if r is None else ''}{system} {client} {size} B: "
                              f"{n / run.data_seconds:,.0f} rec/s, CPU {run.cpu_s * 1e6 / n:.2f} us/record")
        finally:
            for system in systems:
                clients.delete_topic(producers[system], topic)
    rows: list[dict[str, Any]] = []
    targets: list[dict[str, Any]] = []
    for system in systems:
        for size in sizes:
            n = records[size]
            row: dict[str, Any] = {"system": system, "value_size": size, "records": n, "partitions": partitions}
            secs: dict[str, list[float]] = {}
            for client in names:
                ss = [s for s in samples if (s["system"], s["client"], s["value_size"]) == (system, client, size)]
                secs[client] = [s["data_seconds"] for s in ss]
                row[f"{client}_rps"] = n / median(secs[client])
                row[f"{client}_first_s"] = median([s["first_record_s"] for s in ss])
                row[f"{client}_cpu_us"] = median([s["cpu_s"] for s in ss]) * 1e6 / n
            for client in names:
                if client != "confluent" and "confluent" in names:
                    row[f"{client}_vs_confluent"] = row[f"{client}_rps"] / row["confluent_rps"]
                    row[f"{client}_vs_confluent_per_round"] = per_round(secs[client], secs["confluent"])
            rows.append(row)
            what = f"{'through kshare' if system == 'kshare' else 'native Kafka 4.4'}, {size} B x {partitions}"
            for client in ("aio", "aio-uvloop"):
                if client in names and "confluent" in names:
                    targets.append(target(f"AIOShareConsumer ({'uvloop' if 'uv' in client else 'asyncio'}) / "
                                          f"confluent ShareConsumer records/s, {what}",
                                          row[f"{client}_vs_confluent"], AIO_TARGET, ">="))
    progress.end()
    return {
        "config": {"records": records, "partitions": partitions, "repeats": repeats, "clients": names,
                   "systems": systems, "max_poll_records": MAX_POLL_RECORDS, "warmup": warmup},
        "rows": rows,
        "samples": samples,
        "targets": targets,
    }


# -- results.md and the plot -------------------------------------------------------------------------


def section(res: dict[str, Any]) -> list[str]:
    cfg = res.get("config", {})
    names = cfg.get("clients", list(CLIENTS))
    out = [
        f"One consumer of a fresh share group reads a whole topic ({cfg.get('partitions', 4)} partitions), implicit "
        f"acknowledgement, `max.poll.records` {cfg.get('max_poll_records', MAX_POLL_RECORDS)}: confluent-kafka's "
        "`ShareConsumer` (librdkafka), `kshare.AIOShareConsumer` on asyncio's event loop (`aio`) and on uvloop "
        "(`aio-uvloop`); through kshare (Kafka 3.9) and on native Kafka 4.4. Records/s from the first record to "
        "the last; CPU is the consumer process's per record (librdkafka's threads included).",
        "",
    ]
    head = ["system", "size"]
    for c in names:
        head += [f"{c} rec/s"]
    head += [f"{c} / confluent (per round)" for c in names if c != "confluent"]
    head += [f"{c} CPU us/rec" for c in names]
    rows = []
    for r in res.get("rows", []):
        line = ["kshare (3.9)" if r["system"] == "kshare" else "native 4.4", fmt_size(r["value_size"])]
        line += [fmt_num(r.get(f"{c}_rps")) for c in names]
        line += [f"{fmt_ratio(r.get(f'{c}_vs_confluent'))} ({fmt_ratio(r.get(f'{c}_vs_confluent_per_round'))})"
                 for c in names if c != "confluent"]
        line += [fmt_num(r.get(f"{c}_cpu_us"), 2) for c in names]
        rows.append(line)
    out += table(head, rows, "ll" + "r" * (len(head) - 2))
    out.append("")
    return out


def plot(plt: Any, res: dict[str, Any]) -> Any:
    names = res["config"].get("clients", list(CLIENTS))
    rows = res["rows"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    groups = [f"{'kshare' if r['system'] == 'kshare' else 'native'} {fmt_size(r['value_size'])}" for r in rows]
    bars(ax1, groups, {c: [r.get(f"{c}_rps") for r in rows] for c in names}, "records/s (first -> last record)")
    ax1.set_title("one share consumer: steady rate", fontsize=10)
    bars(ax2, groups, {c: [r.get(f"{c}_cpu_us") for r in rows] for c in names}, "CPU us per record")
    ax2.set_title("consumer process CPU per record", fontsize=10)
    return fig


# runs of 1-3 s, 12 configurations a repeat (2 sizes x 3 clients x kshare and native 4.4), alternated; about
# 6 minutes with 5 repeats
SIZES = ({"records": {100: 300_000, 1024: 150_000}}, {"records": {100: 40_000, 1024: 20_000}})
SCENARIO = scenario(
    __name__, "kshare.AIOShareConsumer vs confluent-kafka's ShareConsumer: one consumer's records/s",
    needs=frozenset({UPSTREAM, KAFKA4}),
    opt_in=True,  # one figure for the docs rather than a regression watch
    default_repeats=5,
)
