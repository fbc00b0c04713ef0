"""The ``ack`` scenario of ``kshare bench``: ShareAcknowledge round trip with concurrent members."""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import time
import uuid
from typing import TYPE_CHECKING, Any

from .. import clients
from ..format import COLORS, fmt_num, fmt_ratio, line_axis, table
from .common import alternate, median, pct, scenario, target

if TYPE_CHECKING:
    from ..runner import Env, Progress

ACK_TARGET = 2.0  # p50 with 16 concurrent members / p50 with one

SIZES = (
    {"member_counts": [1, 4, 16, 64], "samples_per_run": 3000, "paced_samples": 2000},
    {"member_counts": [1, 4, 16, 64], "samples_per_run": 64, "paced_samples": 64},
)


async def _ack_run(bootstrap: str, topic: str, members: int, acks_per_member: int, batch: int,
                   rate: float = 0.0, seconds: list[float] | None = None) -> list[float]:
    """``members`` members of a fresh group fetch ``batch`` records and acknowledge them in one
    ShareAcknowledge, until the run has ``acks_per_member * members`` round trips. ``rate`` 0: each
    member as fast as it can (a closed loop: the machine's slowest part sets the pace). ``rate`` > 0:
    the members together start about ``rate`` cycles a second, at random phases (the same load
    however many members carry it). The run's wall-clock seconds are appended to ``seconds``."""
    seconds = seconds if seconds is not None else []
    group = f"bench-ack-{uuid.uuid4().hex[:8]}"
    await asyncio.to_thread(
        clients.set_group_configs, bootstrap, group, {"share.auto.offset.reset": "earliest"}
    )
    await clients.find_coordinator(bootstrap, group)
    conn = await clients.connect(bootstrap, "bench-ack")
    try:
        tid = await clients.topic_id(conn, topic)
    finally:
        await conn.close()
    ms = list(
        await asyncio.gather(*(clients.Member.join(bootstrap, group, topic, tid=tid) for _ in range(members)))
    )
    try:
        # each member works on one partition, a partition of its own where the assignment allows
        deadline = time.monotonic() + 60
        while len({p for m in ms for p in m.assigned}) < members and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            await asyncio.gather(*(m.heartbeat(None) for m in ms))
        taken: set[int] = set()
        parts: list[int] = []
        for i, m in enumerate(ms):
            free = [p for p in m.assigned if p not in taken]
            parts.append(free[0] if free else m.assigned[i % len(m.assigned)])
            taken.add(parts[-1])
        out: list[float] = []

        # Until the run has its samples, not per member: members that had to share a partition
        # (the assignor may give every member every partition) may find theirs drained early.
        wanted = acks_per_member * members
        cycle = members / rate if rate > 0 else 0.0

        async def run(i: int, m: clients.Member) -> None:
            part = parts[i]
            next_at = time.monotonic() + random.random() * cycle
            while len(out) < wanted:
                if cycle:
                    await asyncio.sleep(max(0.0, next_at - time.monotonic()))
                    next_at += cycle * (0.5 + random.random())
                got = await m.fetch([part], max_records=batch)
                acks: dict[int, list] = {}
                for p, ranges in got.items():
                    for a, z, _ in ranges:
                        acks.setdefault(p, []).append((a, z, [clients.ACCEPT]))
                if not acks:
                    continue
                out.append(await m.acknowledge(acks))

        async with clients.keepalive(ms):
            started = time.monotonic()
            await asyncio.wait_for(asyncio.gather(*(run(i, m) for i, m in enumerate(ms))), 300)
            seconds.append(time.monotonic() - started)
        return out
    finally:
        await asyncio.gather(*(m.close() for m in ms), return_exceptions=True)


def run(env: Env, progress: Progress, *, member_counts: list[int], samples_per_run: int, repeats: int,
        batch: int = 50, paced_rate: float = 400.0, paced_samples: int = 2000,
        systems: tuple[str, ...] = ("kshare", "native")) -> dict[str, Any]:
    """ShareAcknowledge round trips of 1..N concurrent members, kshare (on 3.9) and native Kafka
    4.4, in two loads: a closed loop (every member as fast as it can) and ``paced_rate`` cycles a
    second shared by the members (0: none)."""
    boot = {"kshare": (env.proxy().bootstrap, env.upstream())} if "kshare" in systems else {}
    if "native" in systems:
        k4 = env.kafka4()
        boot["native"] = (k4, k4)
    loads = [0.0] + ([paced_rate] if paced_rate > 0 else [])
    progress.begin("ack", len(boot) * (len(member_counts) * (1 + repeats * len(loads)) + 1))
    topics: dict[tuple[str, int], str] = {}
    samples = []
    try:
        for name, (_, admin) in boot.items():
            for n in member_counts:
                per_member = math.ceil(max(samples_per_run, paced_samples) / n)
                topic = clients.create_topic(admin, f"bench-ack-{n}-{uuid.uuid4().hex[:8]}", n)
                # every run has a fresh group starting at the earliest offset: enough for the longest
                clients.produce_batches(admin, topic, n * (per_member + 5) * batch, n, batch)
                topics[name, n] = topic
                progress.step(f"{name}: {n} partition(s) produced")
        for name, (bootstrap, _) in boot.items():
            warm = member_counts[min(1, len(member_counts) - 1)]
            asyncio.run(_ack_run(bootstrap, topics[name, warm], warm, 5, batch))
            progress.step(f"{name}: warm-up with {warm} members")
        for rate in loads:
            wanted = samples_per_run if rate == 0 else paced_samples
            for r in range(repeats):
                for n in alternate(member_counts, r):
                    for name in alternate(list(boot), r + n):
                        took: list[float] = []
                        lat = sorted(
                            asyncio.run(
                                _ack_run(
                                    boot[name][0], topics[name, n], n, math.ceil(wanted / n), batch, rate, took
                                )
                            )
                        )
                        smp = {
                            "system": name,
                            "rate": rate,
                            "members": n,
                            "acks": len(lat),
                            "acks_per_s": len(lat) / took[0] if took and took[0] > 0 else float("nan"),
                            "p50_ms": pct(lat, 0.5) * 1000,
                            "p99_ms": pct(lat, 0.99) * 1000,
                            "mean_ms": statistics.fmean(lat) * 1000,
                        }
                        samples.append(smp)
                        load_text = "closed loop" if rate == 0 else f"{rate:.0f} cycles/s"
                        progress.step(
                            f"{name}, {load_text}, {n} member(s): p50 {smp['p50_ms']:.2f} ms, "
                            f"p99 {smp['p99_ms']:.2f} ms ({len(lat)} acks)"
                        )
    finally:
        for (name, _), topic in topics.items():
            clients.delete_topic(boot[name][1], topic)
    rows = []
    for rate in loads:
        for name in boot:
            for n in member_counts:
                ss = [x for x in samples if x["members"] == n and x["system"] == name and x["rate"] == rate]
                if ss:
                    rows.append(
                        {
                            "system": name,
                            "rate": rate,
                            "members": n,
                            "acks": sum(x["acks"] for x in ss),
                            "acks_per_s": median([x["acks_per_s"] for x in ss]),
                            "p50_ms": median([x["p50_ms"] for x in ss]),
                            "p99_ms": median([x["p99_ms"] for x in ss]),
                            "mean_ms": median([x["mean_ms"] for x in ss]),
                        }
                    )
    by = {(r["system"], r["rate"], r["members"]): r for r in rows}
    for r in rows:
        one = by.get((r["system"], r["rate"], 1))
        r["vs_one"] = r["p50_ms"] / one["p50_ms"] if one else float("nan")
    # The target compares 16 concurrent members with one at the same load, the paced one: what
    # concurrency itself costs (sessions, connections, state writes of many share-partitions at
    # once). In the closed loop 16 members ask for 16 times one member's load, and on the project's
    # 2 cores the proxy (a core), the broker and the bench's own members all run out of CPU, so the
    # p50 there grows with the members by Little's law whatever the system (native Kafka 4.4:
    # 4-6x); it is reported beside it with the throughput each system reached.
    targets = []
    load = paced_rate if paced_rate > 0 else 0.0
    if ("kshare", load, 16) in by:
        load_text = f"at {load:,.0f} cycles/s" if load else "closed loop"
        targets.append(
            target(
                f"ack p50 with 16 concurrent members / p50 with one ({load_text})",
                by["kshare", load, 16]["vs_one"],
                ACK_TARGET,
                "<=",
            )
        )
    progress.end()
    return {
        "config": {
            "members": member_counts,
            "samples_per_run": samples_per_run,
            "paced_rate": paced_rate,
            "paced_samples": paced_samples,
            "repeats": repeats,
            "records_per_ack": batch,
            "systems": list(boot),
        },
        "rows": rows,
        "samples": samples,
        "targets": targets,
    }


# -- results.md and the plot ----------------------------------------------------------------------


def section(res: dict[str, Any]) -> list[str]:
    cfg = res.get("config", {})
    rows = [
        [
            r.get("system", "kshare"),
            "closed loop" if not r.get("rate") else f"{r['rate']:,.0f} cycles/s",
            str(r["members"]),
            fmt_num(r["acks"]),
            fmt_num(r.get("acks_per_s", float("nan"))),
            fmt_num(r["p50_ms"], 2),
            fmt_num(r["p99_ms"], 2),
            fmt_num(r["mean_ms"], 2),
            fmt_ratio(r.get("vs_one")),
        ]
        for r in res.get("rows", [])
    ]
    text = [
        f"N members (each on its own connection and partition, `kshare.client.KafkaConnection`) fetch "
        f"{cfg.get('records_per_ack', '?')} records and acknowledge them (ACCEPT) in one ShareAcknowledge; the "
        "round trip includes the durable state write (kshare: a Produce with acks=all to the 3.9 cluster; "
        "native Kafka 4.4: its share coordinator's write). Two loads: a closed loop (every member as fast "
        "as it can, so on a small machine the CPU sets the pace and the p50 grows with the members by "
        "Little's law) and, where configured, a fixed number of fetch-and-acknowledge cycles a second "
        "shared by the members (the cost of concurrency itself, at the same load). The target is the paced "
        "load's; acks/s is the run's rate (in the closed loop, the throughput each system reached).",
        "",
    ]
    return (
        text
        + table(["system", "load", "members", "acks", "acks/s", "p50 ms", "p99 ms", "mean ms", "p50 / p50 of one"], rows)
        + [""]
    )


def plot(plt: Any, res: dict[str, Any]) -> Any:
    rows = res["rows"]
    loads = sorted({r.get("rate", 0.0) for r in rows})
    target_load = max(loads) if loads else 0.0  # the paced load where there is one (scenarios.ack)
    fig, axes = plt.subplots(1, len(loads), figsize=(6 * len(loads), 4), squeeze=False)
    for ax, rate in zip(axes[0], loads, strict=True):
        for system in ("kshare", "native"):
            rs = [r for r in rows if r.get("system", "kshare") == system and r.get("rate", 0.0) == rate]
            if not rs:
                continue
            xs = [r["members"] for r in rs]
            color = COLORS.get(system, None)
            ax.plot(xs, [r["p50_ms"] for r in rs], "o-", color=color, label=f"{system} p50")
            ax.plot(xs, [r["p99_ms"] for r in rs], "o--", color=color, alpha=0.5, label=f"{system} p99")
        one = next((r["p50_ms"] for r in rows if r.get("system", "kshare") == "kshare"
                    and r.get("rate", 0.0) == rate and r["members"] == 1), None)
        if one and rate == target_load:
            ax.axhline(2 * one, color="tab:red", lw=0.8, ls=":", label="target: 2 x kshare p50 of one member")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        line_axis(ax, "concurrent members", "ShareAcknowledge round trip (ms)",
                  "closed loop" if not rate else f"{rate:,.0f} cycles/s shared by the members")
    fig.tight_layout()
    return fig


SCENARIO = scenario(
    __name__, 'ShareAcknowledge round trip with concurrent members',
)
