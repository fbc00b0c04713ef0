"""The ``memory`` scenario of ``kshare bench``: Proxy memory with many share-partitions and connections."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

from .. import clients
from ..format import COLORS, bar_axis, fmt_num, table
from ..procs import ProxyProcess, cpu_seconds, rss_bytes
from .common import MEMORY_OVERHEAD_MB, cache_budget_mb, scenario, target

if TYPE_CHECKING:
    from ..runner import Env, Progress


SIZES = (
    {"groups": 10, "members": 100, "partitions": 1000, "records": 200},
    {"groups": 2, "members": 10, "partitions": 100, "records": 20},
)


async def _memory_load(
    bootstrap: str, topic: str, groups: int, members: int, partitions: int, records: int, progress: Progress
) -> dict[str, Any]:
    conn = await clients.connect(bootstrap, "bench-memory")
    try:
        tid = await clients.topic_id(conn, topic)
    finally:
        await conn.close()
    names = [f"bench-memory-{g}-{uuid.uuid4().hex[:6]}" for g in range(groups)]
    for group in names:
        await asyncio.to_thread(
            clients.set_group_configs, bootstrap, group, {"share.auto.offset.reset": "earliest"}
        )
    sem = asyncio.Semaphore(64)

    async def join(group: str) -> clients.Member:
        async with sem:
            return await clients.Member.join(bootstrap, group, topic, tid=tid)

    all_members: list[clients.Member] = []
    touched: set[tuple[str, int]] = set()
    acquired = 0
    async with clients.keepalive(all_members, interval=5.0):
        for group in names:
            ms = list(await asyncio.gather(*(join(group) for _ in range(members))))
            all_members.extend(ms)
            deadline = time.monotonic() + 120  # until the assignment covers the topic
            while time.monotonic() < deadline:
                if len({p for m in ms for p in m.assigned}) == partitions:
                    break
                await asyncio.sleep(0.5)
                await asyncio.gather(*(m.heartbeat(None) for m in ms))
            progress.step(f"group {group}: {members} members joined; proxy connections up")

        async def read(m: clients.Member, mine: set[int]) -> int:
            n = 0
            pending = set(mine)
            for _ in range(10):
                if not pending:
                    break
                got = await m.fetch(sorted(pending), max_records=records * len(pending), max_wait_ms=500)
                acks: dict[int, list] = {}
                for p, ranges in got.items():
                    if ranges:
                        pending.discard(p)
                        touched.add((m.group, p))
                    for a, z, _ in ranges:
                        n += z - a + 1
                        acks.setdefault(p, []).append((a, z, [clients.ACCEPT]))
                if acks:
                    await m.acknowledge(acks)
            return n

        for group in names:
            ms = [m for m in all_members if m.group == group]
            # each partition is read by one of the members assigned it (the assignor may give every
            # member every partition)
            holders: dict[int, list[int]] = {}
            for j, m in enumerate(ms):
                for p in m.assigned:
                    holders.setdefault(p, []).append(j)
            mine: list[set[int]] = [set() for _ in ms]
            for p, js in holders.items():
                mine[js[p % len(js)]].add(p)
            acquired += sum(await asyncio.gather(*(read(m, mine[j]) for j, m in enumerate(ms))))
            progress.step(
                f"group {group}: {len({p for g, p in touched if g == group})} share-partitions read"
            )
        return {"members": all_members, "touched": len(touched), "acquired": acquired}


def run(env: Env, progress: Progress, *, groups: int, members: int, partitions: int, records: int,
        value_size: int = 1024, cache_mb: int = 64) -> dict[str, Any]:
    budget_mb = cache_budget_mb(env.proxy_args, cache_mb)
    extra = list(env.proxy_args)
    if "--record-cache-mb" not in " ".join(extra):
        extra += ["--record-cache-mb", str(budget_mb)]
    progress.begin("memory", 3 + 2 * groups)
    topic = clients.create_topic(env.upstream(), f"bench-memory-{uuid.uuid4().hex[:8]}", partitions)
    proxy = None
    try:
        clients.produce(env.upstream(), topic, records * partitions, value_size, partitions)
        progress.step(f"{records * partitions:,} x {value_size} B on {partitions} partitions produced")
        proxy = ProxyProcess(
            env.upstream(), extra, name="kshare (memory)", log_path=env.options.out / "kshare-memory.log"
        )
        proxy.start(180)
        time.sleep(2.0)
        rss_idle = rss_bytes(proxy.pid)
        progress.step(f"fresh proxy, --record-cache-mb {budget_mb}: RSS {rss_idle / 2**20:.0f} MB")
        peak = [rss_idle]
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.wait(0.25):
                with contextlib.suppress(OSError):
                    peak[0] = max(peak[0], rss_bytes(proxy.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()

        async def go() -> dict[str, Any]:
            got = await _memory_load(proxy.bootstrap, topic, groups, members, partitions, records, progress)
            await asyncio.sleep(2.0)
            got["metrics"] = await asyncio.to_thread(proxy.metrics)
            got["rss_loaded"] = rss_bytes(proxy.pid)
            await asyncio.gather(*(m.close() for m in got.pop("members")), return_exceptions=True)
            return got

        c0 = cpu_seconds(proxy.pid)
        got = asyncio.run(go())
        cpu_s = cpu_seconds(proxy.pid) - c0
        time.sleep(2.0)
        sampling.set()
        sampler.join(5)
        rss_after = rss_bytes(proxy.pid)
        metrics_after = proxy.metrics()
        progress.step(
            f"RSS idle {rss_idle / 2**20:.0f} MB, peak {peak[0] / 2**20:.0f} MB, "
            f"record cache {got['metrics'].get('kshare_record_cache_bytes', 0) / 2**20:.0f} MB"
        )
        notes = proxy.notes()
    finally:
        if proxy is not None:
            proxy.stop()
        clients.delete_topic(env.upstream(), topic)
    m = got["metrics"]
    row = {
        "groups": groups,
        "members_per_group": members,
        "connections": groups * members,
        "partitions": partitions,
        "share_partitions_touched": got["touched"],
        "records_acquired": got["acquired"],
        "data_mb": records * partitions * value_size / 1e6,
        "cache_budget_mb": budget_mb,
        "rss_idle_mb": rss_idle / 2**20,
        "rss_peak_mb": peak[0] / 2**20,
        "rss_loaded_mb": got["rss_loaded"] / 2**20,
        "rss_after_close_mb": rss_after / 2**20,
        "record_cache_mb": m.get("kshare_record_cache_bytes", float("nan")) / 2**20,
        "record_cache_budget_metric_mb": m.get("kshare_record_cache_budget_bytes", float("nan")) / 2**20,
        "record_cache_partitions": m.get("kshare_record_cache_partitions", float("nan")),
        "client_connections_metric": m.get("kshare_client_connections", float("nan")),
        "record_cache_mb_after_close": metrics_after.get("kshare_record_cache_bytes", float("nan")) / 2**20,
        "cpu_s": cpu_s,
    }
    limit = row["rss_idle_mb"] + budget_mb + MEMORY_OVERHEAD_MB
    row["rss_limit_mb"] = limit
    targets = [
        target(
            f"proxy peak RSS with {row['share_partitions_touched']:,} share-partitions and {row['connections']:,} "
            f"connections <= idle + {budget_mb} MB cache budget + {MEMORY_OVERHEAD_MB} MB",
            row["rss_peak_mb"],
            limit,
            "<=",
            "MB",
        ),
        target(
            "kshare_record_cache_bytes within --record-cache-mb",
            row["record_cache_mb"],
            budget_mb,
            "<=",
            "MB",
        ),
    ]
    return {
        "config": {
            "groups": groups,
            "members_per_group": members,
            "partitions": partitions,
            "records_per_partition": records,
            "value_size": value_size,
            "record_cache_mb": budget_mb,
            "fixed_overhead_mb": MEMORY_OVERHEAD_MB,
        },
        "rows": [row],
        "samples": [],
        "targets": targets,
        "notes": notes,
    }


# -- results.md and the plot ----------------------------------------------------------------------


def section(res: dict[str, Any]) -> list[str]:
    out = []
    for r in res.get("rows", []):
        out += [
            f"{r['groups']} share groups x {r['members_per_group']} members (one connection each) on a "
            f"{r['partitions']:,}-partition topic ({r['data_mb']:.0f} MB of records), each member fetching its "
            f"partitions and acknowledging what it got; a fresh proxy with `--record-cache-mb "
            f"{r['cache_budget_mb']}`.",
            "",
        ]
        out += table(
            ["figure", "value"],
            [
                ["share-partitions touched", fmt_num(r["share_partitions_touched"])],
                ["client connections (metric)", fmt_num(r["client_connections_metric"])],
                ["records acquired", fmt_num(r["records_acquired"])],
                ["RSS idle (before)", f"{fmt_num(r['rss_idle_mb'])} MB"],
                ["RSS peak", f"{fmt_num(r['rss_peak_mb'])} MB"],
                ["RSS loaded (after, connections open)", f"{fmt_num(r['rss_loaded_mb'])} MB"],
                ["RSS after the members left", f"{fmt_num(r['rss_after_close_mb'])} MB"],
                ["kshare_record_cache_bytes (loaded)", f"{fmt_num(r['record_cache_mb'], 1)} MB"],
                ["record cache budget", f"{r['cache_budget_mb']} MB"],
                ["partitions with a record cache", fmt_num(r["record_cache_partitions"])],
                ["limit: idle + budget + fixed overhead", f"{fmt_num(r['rss_limit_mb'])} MB"],
                ["proxy CPU during the load", f"{fmt_num(r['cpu_s'], 1)} s"],
            ],
            "lr",
        )
        out.append("")
    return out


def plot(plt: Any, res: dict[str, Any]) -> Any:
    r = res["rows"][0]
    fig, ax = plt.subplots(figsize=(7, 4))
    labels = ["idle", "peak", "loaded", "members left"]
    values = [r["rss_idle_mb"], r["rss_peak_mb"], r["rss_loaded_mb"], r["rss_after_close_mb"]]
    ax.bar(labels, values, color=COLORS["kshare"], label="proxy RSS")
    ax.bar(
        ["loaded"],
        [r["record_cache_mb"] or 0],
        color="tab:purple",
        width=0.4,
        label="kshare_record_cache_bytes",
    )
    ax.axhline(r["rss_limit_mb"], color="tab:red", ls=":", lw=1, label="idle + cache budget + fixed overhead")
    ax.set_title(
        f"{r['share_partitions_touched']:,} share-partitions, {r['connections']:,} connections", fontsize=10
    )
    bar_axis(ax, "MB")
    return fig


SCENARIO = scenario(
    __name__, 'Proxy memory with many share-partitions and connections',
    repeats=False,
)
