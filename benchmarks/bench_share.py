"""Share-group throughput: kshare in front of Apache Kafka 3.9, a classic consumer, native share groups.

Run by hand (not in CI), from the repository root with the project's venv:

    python benchmarks/bench_share.py            # 1,000,000 records x {100 B, 1 KiB}; 1-16 consumers
    python benchmarks/bench_share.py --quick    # a short smoke run (50,000 records; 1, 2, 4 consumers)

Two brokers start in the script (``tests.brokers``): Apache Kafka 3.9.2 and Apache Kafka 4.4.0
with share groups, and kshare runs as a subprocess (``python -m kshare proxy``) in front of the
3.9 broker, so its CPU time can be measured (/proc) and it can be profiled (``--profile py-spy``).

Part 1, one consumer, ``--records`` values of each ``--sizes`` over ``--partitions`` partitions
(produced beforehand, large producer batches):

* ``kshare``: one confluent-kafka ``ShareConsumer`` (implicit acknowledgement) through kshare;
* ``classic``: one classic consumer-group ``Consumer`` (subscribe) straight to the 3.9 broker,
  reading the same topic;
* ``native``: one ``ShareConsumer`` (implicit acknowledgement) on Kafka 4.4's own share groups,
  reading a copy of the data produced there.

Clock: from the first ``poll()`` (the group join included) to the last record; the time from the
first record to the last is printed too. Every run uses a fresh group. Share groups start at
``earliest`` with ``share.heartbeat.interval.ms`` 500 on both (Kafka 4.4 assigns on a heartbeat,
so its 5 s default would add seconds to the join). The configurations alternate (classic, kshare,
native, native, kshare, classic ...) for ``--rounds`` rounds; the median is reported, with
kshare/classic and kshare/native.

Part 2, scaling: ``N`` ShareConsumers through kshare (N in ``--consumers``), each in its own
process (multiprocessing, spawn), on a 1-partition topic of N x 200 x ``--scale-seconds`` records
written in producer batches of ``--scale-batch`` records. Every record takes ``--process-ms`` of
processing (``time.sleep``); ``max.poll.records`` is each of ``--max-poll-records`` in turn. The
consumers subscribe, wait until all are ready, then poll. Reported: records/s over the window in
which all N consumers are busy (from the last consumer's first record to the first consumer's
last record), and over the whole run, against the ideal N x 1000 / process-ms and against the
ideal with the measured length of a ``time.sleep`` (longer than asked on a loaded machine), and
the load average.

Part 3, balance (``--only balance``): for each ``--mixes`` entry ``MxP``, M ShareConsumers (threads)
join a group on a P-partition topic, then M x ``--per-member`` records are produced round-robin in
producer batches of ``--balance-max-poll`` records (share fetches take whole batches); each record
takes ``--process-ms``. Reported: the drain ratio, ideal time over actual (tests/integration/drain.py),
kshare and native Kafka 4.4 alternated, median of ``--rounds``; once steady, once with one member
joining at 30 % and one leaving at 60 % of the ideal time.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from bench_proxy import Child, _cpu_seconds, _py_spy, collapse_report, machine_info  # noqa: E402
from bench_proxy import produce as produce_fast  # noqa: E402

from kshare.bench import clients  # noqa: E402
from kshare.bench.clients import set_group_configs, share_group  # noqa: E402, F401
from tests.brokers import KAFKA_3, KAFKA_4, KafkaBroker, free_port  # noqa: E402

HEARTBEAT_MS = 500
# broker-level bounds low enough for HEARTBEAT_MS, on kshare and on Kafka 4.4
KSHARE_LIMITS = ["group.share.min.heartbeat.interval.ms=100", "group.share.min.session.timeout.ms=1000"]
KAFKA4_CONFIG = {"group.share.min.heartbeat.interval.ms": 100, "group.share.min.session.timeout.ms": 1000}


def _quiet(*_: object) -> None:
    pass


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


# --------------------------------------------------------------------------------------------
# kshare


def start_kshare(upstream: str) -> tuple[Child, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "kshare", "proxy", "--upstream", upstream, "--port", str(port),
           "--broker-port-base", "0", "--state-topic", f"__kshare_bench_{uuid.uuid4().hex[:8]}",
           "--state-topic-partitions", "1"]
    for limit in KSHARE_LIMITS:
        cmd += ["--group-limit", limit]
    child = Child("kshare", cmd, r"share state loaded").start(120)
    return child, f"127.0.0.1:{port}"


# --------------------------------------------------------------------------------------------
# part 1: one consumer


@dataclass
class Run:
    config: str
    size: int
    seconds: float  # first poll -> last record
    data_seconds: float  # first record -> last record
    cpu: float | None  # kshare CPU seconds during the run


def consume_share(bootstrap: str, topic: str, records: int, timeout: float = 600.0) -> tuple[float, float]:
    """(first poll -> last record, first record -> last record) of one ShareConsumer of a fresh group."""
    run = clients.consume_share(bootstrap, topic, records, timeout)
    return run.seconds, run.data_seconds


def consume_classic(bootstrap: str, topic: str, records: int, timeout: float = 600.0) -> tuple[float, float]:
    """The same for a classic consumer-group Consumer."""
    run = clients.consume_classic(bootstrap, topic, records, timeout)
    return run.seconds, run.data_seconds


def throughput(k3: KafkaBroker, k4: KafkaBroker, kshare: Child, kshare_bootstrap: str, records: int,
               sizes: list[int], partitions: int, rounds: int, profile: str, outdir: Path) -> tuple[list[Run], str]:
    runs: list[Run] = []
    profile_text = ""
    order = ["classic", "kshare", "native"]
    for size in sizes:
        topic = f"bench-share-{size}-{uuid.uuid4().hex[:8]}"
        k3.create_topic(topic, partitions)
        k4.create_topic(topic, partitions)
        p3 = produce_fast(k3.bootstrap, topic, records, size, partitions)
        p4 = produce_fast(k4.bootstrap, topic, records, size, partitions)
        print(f"values of {size} B: produced {records:,} to 3.9 in {p3:.1f} s, to 4.4 in {p4:.1f} s; load {load()}",
              flush=True)
        for r in range(rounds):
            for config in (order if r % 2 == 0 else list(reversed(order))):
                c0 = _cpu_seconds(kshare.pid)
                if config == "kshare":
                    secs, data = consume_share(kshare_bootstrap, topic, records)
                elif config == "classic":
                    secs, data = consume_classic(k3.bootstrap, topic, records)
                else:
                    secs, data = consume_share(k4.bootstrap, topic, records)
                cpu = _cpu_seconds(kshare.pid) - c0 if config == "kshare" else None
                runs.append(Run(config, size, secs, data, cpu))
                print(f"  {config:>7} {size:>5} B: {records / secs:>10,.0f} rec/s (first poll -> last record "
                      f"{secs:.2f} s; first -> last record {records / data:,.0f} rec/s)"
                      + (f" | kshare CPU {cpu:.1f} s" if cpu is not None else "") + f" | load {load()}", flush=True)
        if profile == "py-spy" and size == sizes[0]:
            profile_text = profile_kshare(kshare, kshare_bootstrap, topic, records, size, outdir)
        for b in (k3, k4):
            with contextlib.suppress(Exception):
                b.delete_topic(topic)
    return runs, profile_text


def profile_kshare(kshare: Child, bootstrap: str, topic: str, records: int, size: int, outdir: Path) -> str:
    spy = _py_spy()
    if spy is None:
        return "py-spy is not installed\n"
    raw = outdir / f"kshare-share-consume-{size}.pyspy.txt"
    rec = subprocess.Popen([spy, "record", "--pid", str(kshare.pid), "--rate", "250", "--format", "raw",
                            "--output", str(raw), "--nonblocking"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        time.sleep(1.0)
        secs, _ = consume_share(bootstrap, topic, records)
    finally:
        rec.send_signal(signal.SIGINT)
        out, _ = rec.communicate(timeout=120)
    head = (f"py-spy of kshare (250 Hz, idle excluded) while one ShareConsumer read {records:,} x {size} B "
            f"({records / secs:,.0f} rec/s under the profiler); {raw}\n")
    return head + (collapse_report(raw.read_text(), 30) if raw.exists() else out)


def summarize(runs: list[Run], records: int, sizes: list[int]) -> str:
    lines = ["| value | classic direct (3.9) rec/s | kshare share (3.9) rec/s | native share (4.4) rec/s "
             "| kshare/classic | kshare/native | kshare CPU s per run |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for size in sizes:
        med = {c: statistics.median(r.seconds for r in runs if r.config == c and r.size == size)
               for c in ("classic", "kshare", "native")}
        cpu = statistics.median(r.cpu for r in runs if r.config == "kshare" and r.size == size and r.cpu is not None)
        rate = {c: records / s for c, s in med.items()}
        lines.append(f"| {size} B | {rate['classic']:,.0f} | {rate['kshare']:,.0f} | {rate['native']:,.0f} "
                     f"| {rate['kshare'] / rate['classic']:.2f} | {rate['kshare'] / rate['native']:.2f} | {cpu:.1f} |")
    lines += ["", "First record to last record (join excluded), medians:", "",
              "| value | classic rec/s | kshare rec/s | native rec/s | kshare/classic | kshare/native |",
              "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    for size in sizes:
        rate = {c: records / statistics.median(r.data_seconds for r in runs if r.config == c and r.size == size)
                for c in ("classic", "kshare", "native")}
        lines.append(f"| {size} B | {rate['classic']:,.0f} | {rate['kshare']:,.0f} | {rate['native']:,.0f} "
                     f"| {rate['kshare'] / rate['classic']:.2f} | {rate['kshare'] / rate['native']:.2f} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# part 2: scaling with slow consumers


def _scale_worker(bootstrap: str, group: str, topic: str, process_s: float, max_poll: int, ready, start, stop,
                  done, results) -> None:
    from confluent_kafka import ShareConsumer

    c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group, "max.poll.records": max_poll,
                       "error_cb": _quiet, "log_level": 3})
    c.subscribe([topic])
    ready.release()
    start.wait()
    times: list[float] = []
    offsets: list[int] = []
    slept = 0.0
    polls = 0  # polls that returned records, after the first one
    waited = 0.0  # seconds inside those poll() calls
    empty = 0
    try:
        while not stop.is_set():
            t0 = time.perf_counter()
            msgs = c.poll(0.1)
            if not msgs:
                empty += 1
            elif times:
                polls += 1
                waited += time.perf_counter() - t0
            for m in msgs:
                if m.error() is not None:
                    continue
                t0 = time.perf_counter()
                time.sleep(process_s)
                slept += time.perf_counter() - t0
                times.append(time.monotonic())  # CLOCK_MONOTONIC: comparable across processes
                offsets.append(m.offset())
                with done.get_lock():
                    done.value += 1
    finally:
        c.close()
        results.put((os.getpid(), times, offsets, slept, polls, waited, empty))


@dataclass
class Scale:
    consumers: int
    records: int
    window_rate: float
    overall_rate: float
    ideal: float
    sleep_ms: float  # mean measured length of one time.sleep(process_s)
    per_consumer: list[int]
    load_before: str
    load_after: str
    poll_ms: float  # mean time inside a poll() that returned records (the first excluded)
    records_per_poll: float
    kshare_cpu: float | None  # kshare CPU seconds during the run / run seconds




def scaling(k3: KafkaBroker, kshare_bootstrap: str, counts: list[int], seconds: float, process_ms: float,
            max_poll: int, batch: int, cpu_pid: int | None = None) -> list[Scale]:
    """``k3``: where the topics are created; ``kshare_bootstrap``: where the consumers connect
    (kshare, or a Kafka 4.4 broker for the native reference); ``cpu_pid``: kshare's process."""
    from confluent_kafka import Producer

    ctx = mp.get_context("spawn")
    out: list[Scale] = []
    for n in counts:
        total = int(n * 1000 / process_ms * seconds)
        topic = f"bench-scale-{n}-{uuid.uuid4().hex[:8]}"
        group = f"bench-scale-{uuid.uuid4().hex[:8]}"
        k3.create_topic(topic, 1)
        p = Producer({"bootstrap.servers": k3.bootstrap, "linger.ms": 5, "batch.num.messages": batch,
                      "error_cb": _quiet})
        for i in range(total):
            while True:
                try:
                    p.produce(topic, f"r-{i}".encode().ljust(100, b"."), partition=0)
                    break
                except BufferError:
                    p.poll(0.05)
        assert p.flush(120) == 0
        share_group(kshare_bootstrap, group)
        ready, start, stop = ctx.Semaphore(0), ctx.Event(), ctx.Event()
        done = ctx.Value("q", 0)
        results = ctx.Queue()
        procs = [ctx.Process(target=_scale_worker, args=(kshare_bootstrap, group, topic, process_ms / 1000,
                                                         max_poll, ready, start, stop, done, results), daemon=True)
                 for _ in range(n)]
        for pr in procs:
            pr.start()
        for _ in procs:
            if not ready.acquire(timeout=120):
                raise TimeoutError("a consumer process did not start")
        before = load()
        c0, t_start = (_cpu_seconds(cpu_pid) if cpu_pid else 0.0), time.monotonic()
        start.set()
        deadline = time.monotonic() + seconds * 4 + 60
        got: list[tuple] = []
        while done.value < total and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(0.5)  # a record delivered twice would be counted now
        cpu = (_cpu_seconds(cpu_pid) - c0) / (time.monotonic() - t_start) if cpu_pid else None
        stop.set()
        for _ in procs:
            got.append(results.get(timeout=120))
        for pr in procs:
            pr.join(30)
        after = load()
        times = sorted(t for g in got for t in g[1])
        offsets = [o for g in got for o in g[2]]
        if len(offsets) != total or len(set(offsets)) != total:
            print(f"  note: {len(offsets)} deliveries of {len(set(offsets))} distinct offsets, want {total}",
                  flush=True)
        busy = [g for g in got if g[1]]
        w0 = max(g[1][0] for g in busy)
        w1 = min(g[1][-1] for g in busy)
        in_window = sum(1 for t in times if w0 < t <= w1)
        window_rate = in_window / (w1 - w0) if w1 > w0 else float("nan")
        overall = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else float("nan")
        sleeps = sum(len(g[1]) for g in got)
        polls = sum(g[4] for g in got)
        s = Scale(n, total, window_rate, overall, n * 1000 / process_ms,
                  1000 * sum(g[3] for g in got) / max(sleeps, 1), sorted(len(g[1]) for g in got), before, after,
                  1000 * sum(g[5] for g in got) / max(polls, 1), sleeps / max(polls + len(busy), 1), cpu)
        out.append(s)
        print(f"  {n:>2} consumers: {window_rate:8,.0f} rec/s all busy ({window_rate / s.ideal:.0%} of {s.ideal:,.0f}), "
              f"{overall:8,.0f} rec/s overall; sleep {s.sleep_ms:.2f} ms; poll() {s.poll_ms:.1f} ms for "
              f"{s.records_per_poll:.1f} records" + (f"; kshare CPU {s.kshare_cpu:.0%}" if cpu is not None else "")
              + f"; per consumer {s.per_consumer}; "
              f"load {before} -> {after}", flush=True)
        with contextlib.suppress(Exception):
            k3.delete_topic(topic)
    return out


def scaling_table(rows: list[Scale], process_ms: float) -> str:
    lines = ["| consumers | records | ideal rec/s | all-busy rec/s | of ideal | of sleep-adjusted ideal "
             "| overall rec/s | mean sleep | poll() ms (records) | kshare CPU | records per consumer "
             "| load before -> after |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    for s in rows:
        adjusted = s.consumers * 1000 / s.sleep_ms
        cpu = f"{s.kshare_cpu:.0%}" if s.kshare_cpu is not None else "-"
        lines.append(f"| {s.consumers} | {s.records:,} | {s.ideal:,.0f} | {s.window_rate:,.0f} "
                     f"| {s.window_rate / s.ideal:.0%} | {s.window_rate / adjusted:.0%} | {s.overall_rate:,.0f} "
                     f"| {s.sleep_ms:.2f} ms | {s.poll_ms:.1f} ({s.records_per_poll:.1f}) | {cpu} "
                     f"| {min(s.per_consumer)}-{max(s.per_consumer)} | {s.load_before} -> {s.load_after} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# part 3: balance -- members / partitions mixes, drain time against the ideal


BALANCE_MIXES = "3x2,5x4,7x3,16x1,4x4,2x8"
PARTS = ["throughput", "scaling", "balance", "fairness"]


def drain_alternated(systems: dict[str, tuple[str, KafkaBroker]], rounds: int, prefix: str, partitions: int,
                     report: Callable[[str, object], None], **drain_args: object) -> dict[str, list]:
    """``rounds`` drains on each system (a fresh topic and group each), the order alternated per
    round; each result goes to ``report(system, result)`` as it comes."""
    from tests.integration.drain import drain, names

    got: dict[str, list] = {s: [] for s in systems}
    for r in range(rounds):
        for name in (list(systems) if r % 2 == 0 else list(reversed(systems))):
            bootstrap, broker = systems[name]
            topic, group = names(prefix)
            broker.create_topic(topic, partitions)
            share_group(bootstrap, group)
            res = drain(bootstrap, broker.bootstrap, topic, group, partitions=partitions, **drain_args)
            got[name].append(res)
            report(name, res)
            with contextlib.suppress(Exception):
                broker.delete_topic(topic)
    return got


def balance(k3: KafkaBroker, k4: KafkaBroker, kshare_bootstrap: str, mixes: list[tuple[int, int]], per_member: int,
            process_ms: float, max_poll: int, rounds: int, churn: bool) -> str:
    """Drain ratio (ideal / actual) per mix, kshare and native alternated, median of ``rounds``.

    tests/integration/drain.py runs it: members join first (threads), then members x per_member
    records are produced round-robin in batches of max.poll.records; with ``churn`` one member
    joins at 30 % of the ideal time and one leaves at 60 %."""
    systems = {"kshare": (kshare_bootstrap, k3), "native": (k4.bootstrap, k4)}
    rows = []
    for members, partitions in mixes:
        def report(name: str, res, members=members, partitions=partitions) -> None:
            print(f"  {members} on {partitions} {name:6}: {res.ratio:.2f} of ideal ({res.seconds:.2f} s vs "
                  f"{res.ideal:.2f} s); per member {res.per_member}", flush=True)

        got = drain_alternated(systems, rounds, "bench-balance", partitions, report, members=members,
                               work_ms=process_ms, per_member=per_member, max_poll=max_poll,
                               joins=(0.3,) if churn else (), leaves=(0.6,) if churn else ())
        med = {s: statistics.median(x.ratio for x in v) for s, v in got.items()}
        rows.append(f"| {members} on {partitions} | {med['kshare']:.2f} | {med['native']:.2f} | "
                    f"{med['kshare'] / med['native']:.2f} |")
    head = ["| members on partitions | kshare (Kafka 3.9) | native Kafka 4.4 | kshare / native |",
            "|---|---|---|---|"]
    return "\n".join(head + rows)


# --------------------------------------------------------------------------------------------
# part 4: fairness -- many consumers with client defaults (issue 17)


# (members, partitions, records, ms of work per record)
FAIRNESS_CASES = "24x1x6000x5,64x4x25600x5,100x2x20000x2"


def fairness(k3: KafkaBroker, k4: KafkaBroker, kshare_bootstrap: str, cases: list[tuple[int, int, int, float]],
             max_polls: list[int], rounds: int) -> str:
    """Drain ratio with many ShareConsumers, client defaults (max.poll.records 500) and a small
    max.poll.records as the control, kshare and native alternated, median of ``rounds``; also how
    many consumers got records, and the fewest and most one processed (fair acquisition shows there)."""
    systems = {"kshare": (kshare_bootstrap, k3), "native": (k4.bootstrap, k4)}
    head = "| members on partitions, records, work | " + " | ".join(
        f"{s}, max.poll.records {m}" for m in max_polls for s in ("native", "kshare")) + " |"
    rows = [head, "|---|" + "---|" * (2 * len(max_polls))]
    for members, partitions, records, work_ms in cases:
        cells = []
        for mpr in max_polls:
            def report(name: str, res, members=members, partitions=partitions, mpr=mpr) -> None:
                busy = sum(1 for n in res.per_member if n)
                print(f"  {members} on {partitions}, max.poll.records {mpr}, {name:6}: {res.ratio:.2f} of ideal "
                      f"({res.seconds:.2f} s vs {res.ideal:.2f} s); {busy}/{members} consumers got records, "
                      f"min {min(res.per_member)} max {max(res.per_member)}", flush=True)

            got = drain_alternated(systems, rounds, "bench-fair", partitions, report, members=members,
                                   work_ms=work_ms, per_member=max(1, records // members), max_poll=mpr,
                                   timeout=300)
            for name in ("native", "kshare"):
                runs = got[name]
                med = statistics.median(x.ratio for x in runs)
                busy = min(sum(1 for n in x.per_member if n) for x in runs)
                cells.append(f"{med:.2f} ({busy}/{members} busy)")
        rows.append(f"| {members} on {partitions}, {records:,}, {work_ms:g} ms | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 50,000 records, 1 round, 1/2/4 consumers")
    parser.add_argument("--records", type=int, default=None, help="records per single-consumer run (1,000,000)")
    parser.add_argument("--sizes", default="100,1024")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=None, help="rounds of the alternating order (default 2)")
    parser.add_argument("--consumers", default=None, help="scaling: consumer counts (default 1,2,4,8,16)")
    parser.add_argument("--scale-seconds", type=float, default=None, help="scaling: ideal seconds per run (10)")
    parser.add_argument("--process-ms", type=float, default=5.0)
    parser.add_argument("--max-poll-records", default="25,5",
                        help="scaling: max.poll.records, one series per value (default 25,5)")
    parser.add_argument("--scale-batch", type=int, default=1, help="scaling: records per producer batch")
    parser.add_argument("--scale-targets", default="kshare,native",
                        help="scaling through kshare and, as a reference, on Kafka 4.4's share groups")
    parser.add_argument("--skip", choices=PARTS, action="append", default=[])
    parser.add_argument("--only", choices=PARTS, default=None, help="run this part alone")
    parser.add_argument("--mixes", default=BALANCE_MIXES, help="balance: MEMBERSxPARTITIONS,... (default %(default)s)")
    parser.add_argument("--per-member", type=int, default=1000, help="balance: records per member (1000: 5 s ideal)")
    parser.add_argument("--balance-max-poll", type=int, default=10, help="balance: max.poll.records (10)")
    parser.add_argument("--fair-cases", default=FAIRNESS_CASES,
                        help="fairness: MEMBERSxPARTITIONSxRECORDSxWORK_MS,... (default %(default)s)")
    parser.add_argument("--fair-max-poll", default="500,10",
                        help="fairness: max.poll.records values; 500 is the clients' default (%(default)s)")
    parser.add_argument("--profile", choices=["none", "py-spy"], default="none",
                        help="py-spy kshare during one extra share-consumer run of the first size")
    parser.add_argument("--outdir", default=None, help="where profiles go (default: a temp directory)")
    args = parser.parse_args(argv)
    if args.only:
        args.skip = [part for part in PARTS if part != args.only]
    elif "fairness" not in args.skip:
        args.skip.append("fairness")  # long (100 consumers): only when asked for

    records = args.records or (50_000 if args.quick else 1_000_000)
    rounds = args.rounds or (1 if args.quick else 2)
    counts = [int(x) for x in (args.consumers or ("1,2,4" if args.quick else "1,2,4,8,16")).split(",")]
    seconds = args.scale_seconds or (4.0 if args.quick else 10.0)
    sizes = [int(x) for x in args.sizes.split(",")]
    outdir = Path(args.outdir) if args.outdir else Path(os.environ.get("TMPDIR", "/tmp")) / "kshare-bench-share"
    outdir.mkdir(parents=True, exist_ok=True)

    print("machine:", machine_info(), flush=True)
    print(f"uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}", flush=True)
    t_start = time.monotonic()
    with KafkaBroker(KAFKA_3) as k3, KafkaBroker(KAFKA_4, share_groups=True, config=KAFKA4_CONFIG) as k4:
        print(f"brokers: Kafka {KAFKA_3} at {k3.bootstrap}, Kafka {KAFKA_4} (share groups) at {k4.bootstrap}",
              flush=True)
        kshare, bootstrap = start_kshare(k3.bootstrap)
        try:
            report = []
            if "throughput" not in args.skip:
                print(f"\n== one consumer, {records:,} records, {args.partitions} partitions, {rounds} round(s)",
                      flush=True)
                runs, prof = throughput(k3, k4, kshare, bootstrap, records, sizes, args.partitions, rounds,
                                        args.profile, outdir)
                report += [f"One consumer, {records:,} records over {args.partitions} partitions, median of "
                           f"{rounds} run(s), first poll -> last record:", "", summarize(runs, records, sizes), ""]
                if prof:
                    report += ["```", prof, "```", ""]
            if "scaling" not in args.skip:
                for target in args.scale_targets.split(","):
                    for mpr in [int(x) for x in args.max_poll_records.split(",")]:
                        if target == "native" and mpr != int(args.max_poll_records.split(",")[0]):
                            continue  # the native reference: the first max.poll.records only
                        where = "kshare in front of Kafka 3.9" if target == "kshare" else "Kafka 4.4 native"
                        print(f"\n== scaling ({where}): {counts} consumers, {args.process_ms:g} ms per record, "
                              f"max.poll.records {mpr}, producer batches of {args.scale_batch}", flush=True)
                        if target == "kshare":
                            rows = scaling(k3, bootstrap, counts, seconds, args.process_ms, mpr, args.scale_batch,
                                           kshare.pid)
                        else:
                            rows = scaling(k4, k4.bootstrap, counts, seconds, args.process_ms, mpr,
                                           args.scale_batch)
                        report += [f"Scaling, {where}, 1 partition, {args.process_ms:g} ms per record, "
                                   f"max.poll.records {mpr}, producer batches of {args.scale_batch}:", "",
                                   scaling_table(rows, args.process_ms), ""]
            if "balance" not in args.skip:
                mixes = [tuple(int(x) for x in mix.split("x")) for mix in args.mixes.split(",")]
                for churn in (False, True):
                    what = "one member joins at 30 % and one leaves at 60 % of the ideal time" if churn else "steady"
                    print(f"\n== balance ({what}): {args.per_member} records per member, {args.process_ms:g} ms "
                          f"per record, max.poll.records {args.balance_max_poll}", flush=True)
                    table = balance(k3, k4, bootstrap, mixes, args.per_member, args.process_ms,
                                    args.balance_max_poll, rounds, churn)
                    report += [f"Balance ({what}), drain ratio ideal / actual, median of {rounds}:", "", table, ""]
            if "fairness" not in args.skip:
                cases = [(int(m), int(p), int(n), float(w))
                         for m, p, n, w in (c.split("x") for c in args.fair_cases.split(","))]
                max_polls = [int(x) for x in args.fair_max_poll.split(",")]
                print(f"\n== fairness: many consumers, max.poll.records {max_polls}", flush=True)
                table = fairness(k3, k4, bootstrap, cases, max_polls, rounds)
                report += [f"Fairness, drain ratio ideal / actual, median of {rounds} (busy: consumers that got "
                           "records, fewest of the runs):", "", table, ""]
        finally:
            kshare.stop()
            notes = [line for line in kshare.output if " WARNING " in line or " ERROR " in line or "Traceback" in line]
            if notes:
                print("kshare log lines worth a look:\n" + "".join(notes[-20:]), flush=True)
    print(f"\nuptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    print(f"total {time.monotonic() - t_start:.0f} s\n")
    print("\n".join(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
