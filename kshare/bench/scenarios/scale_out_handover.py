"""The hand-over part of the ``scale_out`` scenario of ``kshare bench`` (issue 42): how leadership splits and
what moving it costs, leading by topic (``--instance-leadership topic``, the default) and by state partition,
side by side in one run.

* **Splits**: 3 proxies; ``split_topics`` fresh topics each of 4 and of 12 partitions; the leaders Metadata
  names through the proxies, counted per proxy (issue 42's targets: 2/1/1 and 4/4/4).
* **SIGTERM rolling restart**: 3 proxies, ``ho_consumers`` ShareConsumers (explicit ACCEPT after ``ho_work_ms``
  of work a record, ``commit_sync`` once a poll of up to 100: each holds what it polled while it works on it)
  bootstrapped from all three, ``ho_records`` records
  produced at ``ho_rate`` records/s over ``ho_partitions`` partitions while each proxy in turn gets SIGTERM
  (it drains, ``--drain-timeout``, and leaves), the other two take over, and it is started again on the same
  ports; run leading by topic and by state partition with the default drain timeout, and by topic with
  ``--drain-timeout 0`` (a stop as before the drain). Reported: records delivered again (and as a share of the
  records), records delivered after their acknowledgement was confirmed (must be 0), records lost (must be
  0), the longest time any partition went without a delivery from the first SIGTERM on, and the longest time
  nothing at all was delivered.
* **SIGKILL**: the same load; the proxy leading most partitions is SIGKILLed (session ``ho_session_ms``).
  Reported: records delivered again against the records the killed proxy had acquired (its
  ``kshare_share_partition_acquired_records``, sampled every 0.1 s until the kill: the last sample and the
  most of the last second): acquisitions are not persisted (KIP-932), so those may come again, nothing else.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

from .. import clients
from ..procs import http_get, load
from .instance_group import ProxyProc, Upstream, bootstrap_of, leaders, log, start_service

MODES = ("topic", "state-partition")
QUIET = {"error_cb": clients._quiet, "log_level": 0}


@dataclass
class HandoverRun:
    kind: str  # "sigterm-rolling-restart" or "sigkill"
    leadership: str
    drain_timeout_s: float
    records: int
    delivered: int
    redelivered: int  # deliveries beyond each record's first
    after_confirmation: int
    lost: int
    never_confirmed: int  # delivered, never redelivered, and the client never learnt its acknowledgement
    longest_partition_gap_s: float
    longest_total_gap_s: float
    held_at_kill: int | None  # SIGKILL: the killed proxy's acquired records, last sample
    held_max_1s: int | None  # SIGKILL: the most in the last second before the kill
    steps: list[dict[str, float]]
    load_before: str
    load_after: str

    @property
    def redelivered_pct(self) -> float:
        return 100.0 * self.redelivered / max(1, self.records)


def _service(k3: Upstream, mode: str, drain_s: float, session_ms: int, state_partitions: int) -> list[ProxyProc]:
    args = [*k3.proxy_args, "--instance-leadership", mode, "--drain-timeout", str(drain_s)]
    return start_service(dataclasses.replace(k3, proxy_args=args), 3, session_ms, state_partitions)


def _settled(proxies: list[ProxyProc], state_partitions: int) -> bool:
    st = [p.ready() for p in proxies]
    if not all(s and s.get("ready") for s in st):
        return False
    owned = sorted(q for s in st for q in s["state_partitions"])  # type: ignore[index]
    return len({s["ownership_epoch"] for s in st}) == 1 and owned == list(range(state_partitions))  # type: ignore[index]


def _wait(cond: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout:.0f} s: {what}")
        time.sleep(0.1)


def splits_part(k3: Upstream, state_partitions: int, topics: int) -> list[dict[str, Any]]:
    """Leaders per proxy of ``topics`` fresh 4- and 12-partition topics, by mode."""
    rows = []
    for mode in MODES:
        proxies = _service(k3, mode, 10.0, 10_000, state_partitions)
        try:
            for n in (4, 12):
                for _ in range(topics):
                    topic = f"bench-so-split-{uuid.uuid4().hex[:8]}"
                    clients.create_topic(k3.bootstrap, topic, n)
                    counts = collections.Counter(name for _, name in leaders(proxies, topic).values())
                    rows.append({"leadership": mode, "partitions": n,
                                 "split": sorted((counts.get(p.name, 0) for p in proxies), reverse=True)})
        finally:
            for p in proxies:
                p.stop()
        log.info(f"  splits leading by {mode}: " + ", ".join(
            "/".join(map(str, r["split"])) for r in rows if r["leadership"] == mode))
    return rows


class _Load:
    """``records`` records ``b"<i>"`` round-robin over ``partitions`` at about ``rate`` a second, in a thread."""

    def __init__(self, bootstrap: str, topic: str, records: int, rate: float, partitions: int) -> None:
        from confluent_kafka import Producer

        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all",
                                  "enable.idempotence": True, **QUIET})
        self.topic, self.records, self.rate, self.partitions = topic, records, rate, partitions
        self.sent = 0
        self.thread = threading.Thread(target=self._run, daemon=True, name="ho-load")
        self.thread.start()

    def _run(self) -> None:
        t0 = time.monotonic()
        while self.sent < self.records:
            due = min(self.records, int((time.monotonic() - t0) * self.rate))
            while self.sent < due:
                try:
                    self.producer.produce(self.topic, str(self.sent).encode(), partition=self.sent % self.partitions)
                except BufferError:
                    break
                self.sent += 1
            self.producer.poll(0)
            time.sleep(0.02)
        self.producer.flush(60)


def _acquired(p: ProxyProc) -> int:
    got = http_get(p.metrics_port, "/metrics")
    if got is None or got[0] != 200:
        return 0
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in got[1].splitlines()
               if line.startswith("kshare_share_partition_acquired_records{"))


def _gaps(deliveries: list[Any], since: float, partitions: int) -> tuple[float, float]:
    """(the longest time one partition went without a delivery, the longest time without any), from ``since``."""
    times = sorted(d.at for d in deliveries if d.at >= since)
    total = max((b - a for a, b in zip([since, *times], times, strict=False)), default=0.0)
    by_part: dict[int, list[float]] = collections.defaultdict(list)
    for d in deliveries:
        if d.at >= since:
            by_part[d.partition].append(d.at)
    part = 0.0
    for q in range(partitions):
        ts = sorted(by_part.get(q, []))
        part = max(part, max((b - a for a, b in zip([since, *ts], ts, strict=False)), default=float("inf")))
    return round(part, 2), round(total, 2)


def handover_run(k3: Upstream, kind: str, mode: str, drain_s: float, *, records: int, rate: float, partitions: int,
                 consumers: int, session_ms: int, state_partitions: int, work_ms: float) -> HandoverRun:
    from ..ledgers import AckingConsumer, Ledger, judge  # confluent-kafka: imported when a run needs it

    before = load()
    topic = f"bench-so-ho-{uuid.uuid4().hex[:8]}"
    clients.create_topic(k3.bootstrap, topic, partitions)
    proxies = _service(k3, mode, drain_s, session_ms, state_partitions)
    ledger = Ledger()
    cons: list[AckingConsumer] = []
    steps: list[dict[str, float]] = []
    held_at_kill = held_max = None
    gen: _Load | None = None
    try:
        boot = bootstrap_of(proxies)
        group = f"bench-so-ho-{uuid.uuid4().hex[:8]}"
        clients.share_group(boot, group)
        cons = [AckingConsumer(i, boot, group, topic, ledger, max_poll=100, commit_callback=False, poll_s=0.2,
                               error_pause_s=0.05, work_s=work_ms / 1000, config=QUIET).start()
                for i in range(consumers)]
        gen = _Load(k3.bootstrap, topic, records, rate, partitions)
        _wait(lambda: len(ledger.confirmed) >= records // 8, 120, "the first eighth confirmed")
        first = time.monotonic()
        if kind == "sigkill":
            lead = leaders(proxies, topic)
            counts = collections.Counter(name for _, name in lead.values())
            victim = max(proxies, key=lambda p: counts[p.name])
            samples: collections.deque[tuple[float, int]] = collections.deque(maxlen=10)
            for _ in range(10):
                samples.append((time.monotonic(), _acquired(victim)))
                time.sleep(0.1)
            first = time.monotonic()
            victim.kill()
            held_at_kill, held_max = samples[-1][1], max(n for _, n in samples)
            survivors = [p for p in proxies if p is not victim]
            _wait(lambda: _settled(survivors, state_partitions), session_ms / 1000 + 60, "the survivors settled")
            steps.append({"taken_over_s": round(time.monotonic() - first, 2)})
        else:
            for p in proxies:
                t0 = time.monotonic()
                p.stop()  # SIGTERM: drain, then leave the instance group
                exited = time.monotonic()
                others = [q for q in proxies if q is not p]
                _wait(lambda others=others: _settled(others, state_partitions), 60, "the other two settled")
                handed = time.monotonic()
                p.start()
                _wait(lambda: _settled(proxies, state_partitions), 120, "the three settled again")
                steps.append({"exit_s": round(exited - t0, 2), "taken_over_s": round(handed - t0, 2),
                              "back_s": round(time.monotonic() - handed, 2)})
                time.sleep(1.0)
        gen.thread.join(600)
        ends = {q: records // partitions + (1 if q < records % partitions else 0) for q in range(partitions)}

        def delivered() -> set[tuple[int, int]]:
            with ledger.lock:
                return {(d.partition, d.offset) for d in ledger.deliveries}

        # every record delivered (not: confirmed; an acknowledgement whose answer a closed connection
        # lost is durable, and its record rightly not delivered again, but the ledger never confirms it)
        try:
            _wait(lambda: len(delivered()) >= records, 300, "every record delivered")
        except TimeoutError:
            got = delivered()
            short = {q: end - sum(1 for p, _ in got if p == q) for q, end in ends.items()}
            log.warning(f"  records not delivered per partition: { {q: n for q, n in short.items() if n} }")
            for p in proxies:
                log.warning(f"  {p.name}: " + "".join(p.notes()[-15:]))
            raise
        time.sleep(2.0)  # a redelivery would show
    finally:
        for c in cons:
            c.ask_to_stop()
        for c in cons:
            c.close(30)
        for p in proxies:
            p.stop()
    with ledger.lock:
        deliveries = list(ledger.deliveries)
    v = judge(ledger, ends, [first])
    lost = sum(ends.values()) - v.distinct  # 0: the wait above saw every record
    part_gap, total_gap = _gaps(deliveries, first, partitions)
    run = HandoverRun(kind, mode, drain_s, records, v.deliveries, v.redeliveries, len(v.after_confirmation), lost,
                      v.never_confirmed,
                      part_gap, total_gap, held_at_kill, held_max, steps, before, load())
    log.info(f"  {kind} leading by {mode}, drain {drain_s:g} s: {run.redelivered:,} of {records:,} delivered again "
             f"({run.redelivered_pct:.2f} %), {run.after_confirmation} after confirmation, {lost} lost; longest gap "
             f"{part_gap} s (a partition), {total_gap} s (all); held at kill {held_at_kill} (max {held_max}); "
             f"steps {steps}; load {before} -> {run.load_after}")
    return run


# (fault, leadership, drain timeout s) of every hand-over run
CONFIGS = (("sigterm-rolling-restart", "topic", 10.0), ("sigterm-rolling-restart", "state-partition", 10.0),
           ("sigterm-rolling-restart", "topic", 0.0), ("sigkill", "topic", 10.0), ("sigkill", "state-partition", 10.0))


def handover_part(k3: Upstream, *, records: int, rate: float, partitions: int, consumers: int, session_ms: int,
                  state_partitions: int, split_topics: int, work_ms: float,
                  configs: tuple[tuple[str, str, float], ...] = CONFIGS, repeats: int = 1) -> dict[str, Any]:
    splits = splits_part(k3, state_partitions, split_topics) if split_topics else []
    common = {"records": records, "rate": rate, "partitions": partitions, "consumers": consumers,
              "session_ms": session_ms, "state_partitions": state_partitions, "work_ms": work_ms}
    runs = []
    for kind, mode, drain_s in [c for c in configs for _ in range(repeats)]:
        try:
            runs.append(asdict(handover_run(k3, kind, mode, drain_s, **common)))
        except Exception as exc:  # noqa: BLE001 - reported; the other configurations still run
            log.warning(f"  {kind} leading by {mode}, drain {drain_s:g} s failed: {exc!r}")
            runs.append({"kind": kind, "leadership": mode, "drain_timeout_s": drain_s, "error": repr(exc)})
    return {"splits": splits, "runs": runs, "config": common}


def handover_section(part: dict[str, Any] | None) -> list[str]:
    if not part:
        return []
    cfg = part.get("config", {})
    out = ["Leaders per proxy (3 proxies, fresh topics; Metadata through the proxies):", "",
           "| leadership | partitions | splits |", "| --- | ---: | --- |"]
    by = collections.defaultdict(list)
    for r in part.get("splits", []):
        by[(r["leadership"], r["partitions"])].append("/".join(map(str, r["split"])))
    out += [f"| {mode} | {n} | {', '.join(s)} |" for (mode, n), s in sorted(by.items())]
    out += ["", f"Hand-overs under load: {cfg.get('records'):,} records at {cfg.get('rate'):,.0f}/s over "
            f"{cfg.get('partitions')} partitions, {cfg.get('consumers')} ShareConsumers (explicit ACCEPT after "
            f"{cfg.get('work_ms', 0):g} ms of work a record, commit_sync once a poll of up to 100) bootstrapped from 3 "
            f"proxies, session {cfg.get('session_ms')} ms:", "",
            "| fault | leadership | drain timeout | delivered again | % | after confirmation | lost | acknowledgement "
            "never confirmed | longest gap, a partition (s) | longest gap, all (s) | held by the killed proxy (last / "
            "max 1 s) | load |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    for r in part.get("runs", []):
        if "error" in r:
            out.append(f"| {r['kind']} | {r['leadership']} | {r['drain_timeout_s']:g} s | failed: {r['error']} "
                       "| | | | | | | | |")
            continue
        held = "" if r["held_at_kill"] is None else f"{r['held_at_kill']} / {r['held_max_1s']}"
        out.append(f"| {r['kind']} | {r['leadership']} | {r['drain_timeout_s']:g} s | {r['redelivered']:,} | "
                   f"{100.0 * r['redelivered'] / max(1, r['records']):.2f} | {r['after_confirmation']} | {r['lost']} | "
                   f"{r.get('never_confirmed', '')} | "
                   f"{r['longest_partition_gap_s']} | {r['longest_total_gap_s']} | {held} | "
                   f"{r['load_before']} -> {r['load_after']} |")
    return [*out, ""]


def main(argv: list[str] | None = None) -> None:
    """The part alone, against Apache Kafka 3.9 started as ``kshare bench`` does: results.json and results.md in
    ``--out``. ``--configs sigterm-rolling-restart:topic:10,sigkill:topic:10`` picks runs (default: all five)."""
    import argparse
    import json
    import logging
    import shlex
    import sys
    from pathlib import Path

    from .. import report, runner
    from ..procs import machine_info
    from .instance_group import upstream_of

    ap = argparse.ArgumentParser(prog="python -m kshare.bench.scenarios.scale_out_handover", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--upstream", help="front this cluster of one broker instead of starting Kafka 3.9")
    ap.add_argument("--proxy-arg", action="append", default=[])
    ap.add_argument("--records", type=int, default=40_000)
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--partitions", type=int, default=12)
    ap.add_argument("--consumers", type=int, default=4)
    ap.add_argument("--session-ms", type=int, default=6000)
    ap.add_argument("--state-partitions", type=int, default=10)
    ap.add_argument("--split-topics", type=int, default=5, help="0: no splits")
    ap.add_argument("--work-ms", type=float, default=2.0)
    ap.add_argument("--configs", default=",".join(f"{k}:{m}:{d:g}" for k, m, d in CONFIGS),
                    help="fault:leadership:drain-timeout, comma-separated")
    ap.add_argument("--repeats", type=int, default=1, help="runs of each configuration")
    args = ap.parse_args(argv)
    configs = []
    for item in args.configs.split(","):
        kind, mode, drain = item.split(":")
        if kind not in ("sigterm-rolling-restart", "sigkill") or mode not in MODES:
            ap.error(f"unknown configuration {item!r}")
        configs.append((kind, mode, float(drain)))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    options = runner.Options(out=args.out, only=["scale_out"], upstream=args.upstream, proxy_args=args.proxy_arg,
                             plots=False)
    args.out.mkdir(parents=True, exist_ok=True)
    env = runner.Env(options, runner.Progress())
    meta = {"command": shlex.join(["python", "-m", "kshare.bench.scenarios.scale_out_handover",
                                   *(argv if argv is not None else sys.argv[1:])]),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "repeats": {"scale_out": args.repeats},
            "machine": machine_info(), "load_before": load(), "proxy_args": args.proxy_arg,
            "upstream": args.upstream or "Apache Kafka 3.9 (started here)", "reference": "none"}
    t0 = time.monotonic()
    part: dict[str, Any] | None = None
    try:
        part = handover_part(upstream_of(env), records=args.records, rate=args.rate, partitions=args.partitions,
                             consumers=args.consumers, session_ms=args.session_ms,
                             state_partitions=args.state_partitions, split_topics=args.split_topics,
                             work_ms=args.work_ms, configs=tuple(configs), repeats=args.repeats)
    finally:
        env.close()
        meta["load_after"], meta["elapsed_s"] = load(), round(time.monotonic() - t0, 1)
        (args.out / "results.json").write_text(json.dumps(runner._jsonable({"meta": meta, "handover": part}),
                                                          indent=1) + "\n")
        head = report.markdown({"meta": meta, "scenarios": {}}).rstrip("\n").split("\n")
        (args.out / "results.md").write_text("\n".join(
            [*head, "", "## Scale-out: hand-overs (`scale_out`, its hand-over part)", "",
             *handover_section(part)]) + "\n")


if __name__ == "__main__":
    main()
