"""The ``scale_out_failover`` scenario of ``kshare bench`` (run only when named): one of 3 kshare proxies of an
instance group (:mod:`.instance_group`) SIGKILLed under share consumers.

``fo_consumers`` ShareConsumers (threads) in explicit mode acknowledging every record (ACCEPT, then
``commit_sync``), for each state variant and session timeout (``timeouts``): first unthrottled until the
variant's number of records is acknowledged (this builds the state), then throttled to ``fo_rate`` records/s
in total for ``fo_pre`` seconds (the data is produced in batches of ``fo_batch`` records, since kshare hands
out whole producer batches), then one proxy is SIGKILLed: the proxy coordinating the share group if it leads a
data partition, else the one leading most of them; for ``small`` once more killing the proxy leading most
partitions that is not the coordinator. The run goes on until the survivors logged their take-over and then
``fo_post`` seconds more.

Reported per run: kill -> the survivors' "took over state partition(s)" line; kill -> the first record of a
partition the killed proxy led that was then acknowledged successfully (so it came from the new owner;
records librdkafka had fetched from the killed proxy before the kill may still be handed out, and their
acknowledgements fail: "first delivery" is shown too); kill -> steady again (the start of the first 0.5 s
bucket from which 2 s of buckets in a row each run at >= 90 % of the pre-kill total rate, with the killed
proxy's partitions at >= 50 % of their pre-kill rate); the lowest total rate (0.5 s bucket) in between; what
the survivors replayed (state records and bytes, share-partitions and groups, replay seconds, from their
logs); redeliveries, and any record delivered again after its acknowledgement was confirmed (must be none).
Variants (``variants``): ``small``: 12 partitions, 50,000 records acknowledged before the kill; ``large``: 12
partitions, 500,000; ``many``: ``many_partitions`` partitions, i.e. many share-partitions to replay.

(Was ``benchmarks/bench_scale_out.py --only failover``.)
"""

from __future__ import annotations

import contextlib
import os
import re
import time
import uuid
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from .. import clients
from ..procs import load
from .common import UPSTREAM, produce_round_robin, scenario, target
from .instance_group import (
    Upstream,
    bootstrap_of,
    group_coordinator,
    leaders,
    log,
    start_service,
    upstream_of,
)

if TYPE_CHECKING:
    from ..ledgers import AckingConsumer
    from ..runner import Env, Progress

SIZES = (
    {"state_partitions": 10, "timeouts": [6000, 10000], "variants": ["small", "large", "many"],
     "many_partitions": 480, "fo_consumers": 3, "fo_rate": 5000.0, "fo_pre": 6.0, "fo_post": 10.0,
     "fo_max_poll": 200, "fo_batch": 50},
    {"state_partitions": 10, "timeouts": [6000], "variants": ["small"], "many_partitions": 480, "fo_consumers": 3,
     "fo_rate": 5000.0, "fo_pre": 6.0, "fo_post": 10.0, "fo_max_poll": 200, "fo_batch": 50, "acked_cap": 20_000},
)


VARIANTS = {"small": (12, 50_000), "large": (12, 500_000), "many": (None, 50_000)}
TAKEOVER = re.compile(r"took over state partition\(s\) ([\d,]+) in ([\d.]+) s \((\d+) share-partition\(s\), "
                      r"(\d+) group\(s\)\)")
LOADED = re.compile(r"state topic \S+ partitions \[([\d, ]*)\] loaded in ([\d.]+) s: (\d+) share-partitions, "
                    r"(\d+) groups from (\d+) records \((\d+) bytes\)")


@dataclass
class FailoverRun:
    variant: str
    session_ms: int
    partitions: int
    acked_before: int
    killed: str
    killed_was_coordinator: bool
    killed_partitions: list[int]
    killed_state_partitions: list[int]
    pre_rate: float
    pre_killed_rate: float
    takeover_s: float | None  # kill -> the last survivor's take-over line
    takeover_lines: list[str]
    replay: dict[str, float]  # summed over the survivors' replays of the killed proxy's partitions
    first_any_s: float | None  # kill -> first delivery from a killed partition
    first_acked_s: float | None  # kill -> first delivery from a killed partition that was then acknowledged
    steady_s: float | None
    min_rate: float
    redelivered: int
    after_confirmation: int
    commit_errors: dict[str, int]
    poll_errors: dict[str, int]
    load_before: str
    load_after: str
    series: dict[str, list[float]]  # 0.5 s buckets from kill - pre: t, total, killed
    proxy_notes: list[str]


def produce_batched(bootstrap: str, topic: str, n: int, size: int, partitions: int, batch: int) -> float:
    """``n`` values of ``size`` bytes round-robin over the partitions in producer batches of at most
    ``batch`` records (kshare hands out whole batches: small ones keep the delivery rate smooth)."""
    from confluent_kafka import Producer

    errors: list[Any] = []
    prod = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.num.messages": batch, "acks": "all",
                     "queue.buffering.max.messages": 2_000_000, "compression.type": "none",
                     "error_cb": clients._quiet, "delivery.report.only.error": True,
                     "on_delivery": lambda err, msg: errors.append(err)})
    value = os.urandom(size)
    t0 = time.perf_counter()
    produce_round_robin(prod, topic, n, partitions, value)
    left = prod.flush(300)
    if left or errors:
        raise RuntimeError(f"produce to {topic}: {left} undelivered, errors {errors[:3]}")
    return time.perf_counter() - t0


def wait_for(cond, timeout: float, what: str, step: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(step)


def failover_run(k3: Upstream, variant: str, session_ms: int, partitions: int, acked: int, consumers: int,
                 rate: float, pre: float, post: float, max_poll: int, state_partitions: int,
                 victim_kind: str, batch: int) -> FailoverRun:
    from ..ledgers import AckingConsumer, Ledger, Throttle  # confluent-kafka: imported when a run needs it

    before = load()
    topic = f"bench-so-fo-{uuid.uuid4().hex[:8]}"
    clients.create_topic(k3.bootstrap, topic, partitions)
    extra = int(rate * (pre + session_ms / 1000 + post + 20) * 2.5)
    secs = produce_batched(k3.bootstrap, topic, acked + extra, 100, partitions, batch)
    log.info(f"  {variant}, session {session_ms} ms: produced {acked + extra:,} x 100 B to {partitions} partitions "
        f"(batches of {batch}) in {secs:.1f} s; load {load()}")
    proxies = start_service(k3, 3, session_ms, state_partitions)
    cons: list[AckingConsumer] = []
    ledger, throttle = Ledger(), Throttle()
    try:
        boot = bootstrap_of(proxies)
        group = f"bench-so-fo-{uuid.uuid4().hex[:8]}"
        clients.share_group(boot, group)
        # confirmed by commit_sync()'s answer alone, polls of 0.2 s: the throttle holds the rate closely
        quiet = {"error_cb": clients._quiet, "log_level": 0}
        cons = [AckingConsumer(i, boot, group, topic, ledger, max_poll=max_poll, throttle=throttle,
                               commit_callback=False, poll_s=0.2, error_pause_s=0.05, config=quiet).start()
                for i in range(consumers)]
        t_build = time.monotonic()
        wait_for(lambda: len(ledger.confirmed) >= acked or any(c.errors for c in cons), 900,
                 f"{acked} records acknowledged", 0.2)
        build_s = time.monotonic() - t_build
        log.info(f"    {len(ledger.confirmed):,} acknowledged in {build_s:.1f} s "
            f"({len(ledger.confirmed) / build_s:,.0f} rec/s); throttling to {rate:,.0f} rec/s for {pre:.0f} s")
        throttle.set(rate / consumers)
        time.sleep(pre)
        lead = leaders(proxies, topic)
        coord = group_coordinator(proxies, group, state_partitions)
        counts = defaultdict(int)
        for _, name in lead.values():
            counts[name] += 1
        victim = next((p for p in proxies if p.name == coord), None)
        if victim_kind == "other" or victim is None or counts[victim.name] == 0:
            victim = max((p for p in proxies if victim_kind != "other" or p.name != coord),
                         key=lambda p: counts[p.name])
        killed_parts = sorted(q for q, (_, name) in lead.items() if name == victim.name)
        killed_sp = sorted((victim.ready() or {}).get("state_partitions", []))
        survivors = [p for p in proxies if p is not victim]
        marks = {p.name: len(p.lines) for p in survivors}
        acked_before = len(ledger.confirmed)
        victim.kill()
        t_kill = victim.killed_at
        assert t_kill is not None
        log.info(f"    SIGKILL {victim.name} (group coordinator: {victim.name == coord}; led {len(killed_parts)} of "
            f"{partitions} partitions, state partitions {killed_sp}); {acked_before:,} acknowledged")
        wanted = set(killed_sp)

        def taken_over() -> bool:
            got = set()
            for p in survivors:
                for _, line in p.lines[marks[p.name]:]:
                    m = TAKEOVER.search(line)
                    if m:
                        got.update(int(x) for x in m.group(1).split(","))
            return wanted <= got

        with contextlib.suppress(TimeoutError):
            wait_for(taken_over, session_ms / 1000 + 60, "take-over")
        time.sleep(post)
        throttle_end = time.monotonic()
        for c in cons:
            c.ask_to_stop()
        for c in cons:
            c.close(30)
        errors = [repr(e) for c in cons for e in c.errors]
        if errors:
            log.warning(f"    !! consumer errors: {errors}")
        # ---- analysis
        take_lines, take_times, replay = [], [], defaultdict(float)
        for p in survivors:
            for t, line in p.lines[marks[p.name]:]:
                m = TAKEOVER.search(line)
                if m and set(int(x) for x in m.group(1).split(",")) & wanted:
                    take_lines.append(f"{p.name} +{t - t_kill:.2f} s: {line.strip()[-160:]}")
                    take_times.append(t - t_kill)
                    replay["takeover_seconds_max"] = max(replay["takeover_seconds_max"], float(m.group(2)))
                    replay["share_partitions"] += int(m.group(3))
                    replay["groups"] += int(m.group(4))
                m = LOADED.search(line)
                if m and set(int(x) for x in m.group(1).replace(" ", "").split(",") if x) & wanted:
                    replay["replay_seconds_max"] = max(replay["replay_seconds_max"], float(m.group(2)))
                    replay["records"] += int(m.group(5))
                    replay["bytes"] += int(m.group(6))
        kp = set(killed_parts)
        dels = ledger.deliveries
        after_kill = [d for d in dels if d.at >= t_kill and d.partition in kp]
        first_any = min((d.at for d in after_kill), default=None)
        first_acked = min((d.at for d in after_kill if (d.partition, d.offset) in ledger.confirmed), default=None)
        step = 0.5
        t_start = t_kill - pre + 1.0  # the first second of throttling left out (ramp)
        nb = int((throttle_end - t_start) / step)
        total, killed = [0] * nb, [0] * nb
        per_consumer = [[0] * nb for _ in cons]
        for d in dels:
            i = int((d.at - t_start) // step)
            if 0 <= i < nb:
                total[i] += 1
                per_consumer[d.consumer][i] += 1
                if d.partition in kp:
                    killed[i] += 1
        k0 = int((t_kill - t_start) // step)
        pre_rate = sum(total[:k0]) / max(k0 * step, 1e-9)
        pre_killed = sum(killed[:k0]) / max(k0 * step, 1e-9)
        steady = None
        win = int(2.0 / step)
        for i in range(k0, nb - win + 1):
            if all(total[j] / step >= 0.9 * pre_rate and killed[j] / step >= 0.5 * pre_killed
                   for j in range(i, i + win)):
                steady = t_start + i * step - t_kill
                break
        end_i = k0 + int(((steady if steady is not None else (throttle_end - t_kill))) / step)
        min_rate = min((total[j] / step for j in range(k0, max(k0 + 1, min(end_i, nb)))), default=0.0)
        seen: dict[tuple[int, int], int] = defaultdict(int)
        for d in dels:
            seen[(d.partition, d.offset)] += 1
        redelivered = sum(1 for v in seen.values() if v > 1)
        after_conf = sum(1 for d in dels if d.at > ledger.confirmed.get((d.partition, d.offset), d.at))
        run = FailoverRun(
            variant, session_ms, partitions, acked_before, victim.name, victim.name == coord, killed_parts, killed_sp,
            pre_rate, pre_killed, max(take_times) if take_times else None, take_lines, dict(replay),
            None if first_any is None else first_any - t_kill, None if first_acked is None else first_acked - t_kill,
            steady, min_rate, redelivered, after_conf, dict(ledger.commit_errors), dict(ledger.poll_errors),
            before, load(),
            {"t": [round(t_start + i * step - t_kill, 3) for i in range(nb)], "total": [x / step for x in total],
             "killed": [x / step for x in killed]}
            | {f"consumer{c}": [x / step for x in row] for c, row in enumerate(per_consumer)},
            [f"{p.name}: {line}" for p in survivors for line in p.notes()][-30:])
        log.info(f"    take-over +{_f(run.takeover_s)} s; first record of a killed partition +{_f(run.first_any_s)}"
            f" s, first acknowledged +{_f(run.first_acked_s)} s; steady +{_f(steady)} s (pre-kill {pre_rate:,.0f} "
            f"rec/s, {pre_killed:,.0f} from the killed partitions; lowest {min_rate:,.0f}); replayed "
            f"{int(replay['records']):,} records ({int(replay['bytes']):,} B), {int(replay['share_partitions'])} "
            f"share-partitions, {int(replay['groups'])} group(s), replay {replay['replay_seconds_max']:.2f} s; "
            f"redelivered {redelivered:,}, after confirmation {after_conf}; commit errors "
            f"{dict(ledger.commit_errors)}; load {before} -> {run.load_after}")
        for line in take_lines:
            log.info(f"      {line}")
        if any("Traceback" in n for n in run.proxy_notes):
            log.warning("    !! traceback in a survivor's output:\n      " + "      ".join(run.proxy_notes))
        return run
    finally:
        for c in cons:
            c.ask_to_stop()
        for c in cons:
            if c.thread.is_alive():
                c.close(30)
        for p in proxies:
            p.stop()
        clients.delete_topic(k3.bootstrap, topic)


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def failover_table(runs: list[FailoverRun]) -> str:
    lines = ["| state | session timeout | partitions | acked before kill | killed proxy (leads / coordinator) "
             "| kill -> take-over logged | replayed: records, bytes, share-partitions, groups | replay s "
             "| kill -> first record of a killed partition (acknowledged) | kill -> steady | lowest rate / pre-kill "
             "| redelivered | delivered after confirmed |",
             "| --- | ---: | ---: | ---: | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in runs:
        rp = r.replay
        lines.append(
            f"| {r.variant} | {r.session_ms} ms | {r.partitions} | {r.acked_before:,} | "
            f"{len(r.killed_partitions)} partitions / {'yes' if r.killed_was_coordinator else 'no'} | "
            f"{_f(r.takeover_s)} s | {int(rp.get('records', 0)):,}, {int(rp.get('bytes', 0)):,} B, "
            f"{int(rp.get('share_partitions', 0))}, {int(rp.get('groups', 0))} | {rp.get('replay_seconds_max', 0):.2f} | "
            f"{_f(r.first_acked_s)} s (any: {_f(r.first_any_s)} s) | {_f(r.steady_s)} s | "
            f"{r.min_rate:,.0f} / {r.pre_rate:,.0f} | {r.redelivered:,} | {r.after_confirmation} |")
    return "\n".join(lines)


def run(env: Env, progress: Progress, *, state_partitions: int, timeouts: list[int], variants: list[str],
        many_partitions: int, fo_consumers: int, fo_rate: float, fo_pre: float, fo_post: float, fo_max_poll: int,
        fo_batch: int, acked_cap: int | None = None) -> dict[str, Any]:
    k3 = upstream_of(env)
    plan = []
    for variant in variants:
        parts, acked = VARIANTS[variant]
        kinds = [(ms, "coordinator") for ms in timeouts] + ([(timeouts[0], "other")] if variant == "small" else [])
        plan += [(variant, parts or many_partitions, min(acked, acked_cap or acked), ms, kind) for ms, kind in kinds]
    progress.begin("scale_out_failover", len(plan))
    runs = []
    for variant, parts, acked, ms, kind in plan:
        runs.append(failover_run(k3, variant, ms, parts, acked, fo_consumers, fo_rate, fo_pre, fo_post, fo_max_poll,
                                 state_partitions, kind, fo_batch))
        progress.step(f"{variant}, {ms} ms, killed {kind}: take-over +{_f(runs[-1].takeover_s)} s")
    progress.end()
    return {
        "config": {"state_partitions": state_partitions, "fo_consumers": fo_consumers, "fo_rate": fo_rate,
                   "fo_pre": fo_pre, "fo_post": fo_post, "fo_max_poll": fo_max_poll, "fo_batch": fo_batch},
        "rows": [asdict(r) for r in runs],
        "samples": [],
        "targets": [target("scale-out failover: records delivered again after their acknowledgement was confirmed",
                           sum(r.after_confirmation for r in runs), 0, "<=")],
        "proxy_log_notes": [n for r in runs for n in r.proxy_notes][-30:],
    }


def section(res: dict[str, Any]) -> list[str]:
    cfg = res.get("config", {})
    runs = [FailoverRun(**r) for r in res.get("rows", [])]
    return [f"{cfg.get('fo_consumers')} ShareConsumers (explicit ACCEPT + commit_sync, max.poll.records "
            f"{cfg.get('fo_max_poll')}) bootstrapped from 3 proxies of one instance group; unthrottled until the "
            f"state is built, then {cfg.get('fo_rate'):,.0f} records/s in total for {cfg.get('fo_pre')} s, then "
            f"SIGKILL of one proxy. Times from the SIGKILL; {cfg.get('state_partitions')} state partitions.", "",
            *failover_table(runs).split("\n"), ""]


def plot(plt: Any, res: dict[str, Any]) -> Any:
    runs = res.get("rows", [])
    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 2.4 * len(runs)), sharex=True, squeeze=False)
    for ax, r in zip(axes[:, 0], runs, strict=True):
        ax.plot(r["series"]["t"], r["series"]["total"], label="all partitions", lw=1)
        ax.plot(r["series"]["t"], r["series"]["killed"], label="the killed proxy's partitions", lw=1)
        ax.axvline(0, color="red", lw=0.8)
        if r.get("takeover_s") is not None:
            ax.axvline(r["takeover_s"], color="green", lw=0.8, ls="--")
        who = "the group coordinator" if r["killed_was_coordinator"] else "not the coordinator"
        ax.set_title(f"{r['variant']}, session {r['session_ms']} ms, killed {who}: SIGKILL at 0 (red), take-over "
                     "logged (green)", fontsize=9)
        ax.set_ylabel("rec/s")
    axes[0, 0].legend(fontsize=8)
    axes[-1, 0].set_xlabel("seconds from SIGKILL (0.5 s buckets)")
    return fig


SCENARIO = scenario(
    __name__, "Scale-out failover: one of 3 kshare proxies SIGKILLed under share consumers",
    needs=frozenset({UPSTREAM}),
    opt_in=True,  # 2-3 minutes a run: 7 runs in a full run
    repeats=False,
)
