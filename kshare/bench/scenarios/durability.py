"""The ``durability`` scenario of ``kshare bench`` (run only when named): what durable acknowledgements
cost end to end through kshare -- their latency beside a Produce of the same size, the state topic's
bytes per million acknowledged records, and recovery.

A kshare proxy of its own in front of the fronted cluster (its own state topic, 10 partitions, so the
bytes on it can be counted); the clients speak the share-group RPCs themselves
(:class:`kshare.bench.clients.Member`), so what is timed is exactly one RPC.

**Acknowledgement latency.** ShareAcknowledge sent to response received, for acknowledgements that change
durable state: kshare answers only after the state write is acknowledged by the cluster (acks=all,
idempotent producer), so the write is inside the figure. (a) One member acknowledging one record per
ShareAcknowledge out of a 500-record acquisition, one request at a time; (b) N members of one group
(``members``) on a 16-partition topic, each acknowledging each whole acquisition in one ShareAcknowledge,
all at once (their state writes share produce rounds). Baseline in the same run: a Produce (acks=all, one
60-byte record, the size of a ShareUpdate) sent straight to the cluster, one at a time and 16 at a time;
*vs Produce* is a p50 over the baseline's p50 at the same concurrency. Also the mean of kshare's
``kshare_state_write_seconds`` over each part, and the CPU the proxy and this process (all members, one
event loop) used per wall-clock second.

**State-topic bytes per million acknowledged records.** ``records`` records (producer batches of 500) on
10 partitions; 10 members of one group fetch (up to 500 records a partition) and acknowledge each
acquisition in one ShareAcknowledge until every record is accepted: (i) everything accepted, (ii) every
record released with probability ``release_rate`` (released records come back and are accepted, or
released again). The members share the partitions (the assignor gives each several), so a
ShareAcknowledge may cover several partitions. Records appended to the state topic (its end offsets) and
bytes of its ``.log`` segment files (only when the bench started the cluster), per 10^6 accepted
records: the proxy's real traffic, group records and pruning included (the store alone: the
``state_store`` scenario).

**Recovery.** ``recovery_groups`` groups x a ``recovery_partitions``-partition topic, ``recovery_inflight``
in-flight records per share-partition in the worst shape (every record its own state range), written to a
fresh state topic with ``TopicStateStore``; then a kshare proxy is started on it ``recovery_runs`` times
(SIGKILLed in between): process start to "share state loaded", the load time kshare logs itself, and
process start to the first ShareFetch of a recovered share-partition that returns records (whose delivery
counts are checked against the snapshot).

(Was ``benchmarks/bench_ack_latency.py``. Its ``--ack-only`` member-count sweep is the ``ack`` scenario;
its ``--baseline-tree`` / ``--variant`` -- another kshare beside this one -- are two runs of this
scenario, one in each tree or environment.)
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import resource
import signal
import statistics
import time
import uuid
from typing import TYPE_CHECKING, Any

import uvloop

from ...protocol import messages
from ...protocol.codes import ApiKey, ErrorCode
from ...share.state.topic_store import TopicStateStore
from ...share.store import GroupRecord, SharePartitionKey
from .. import clients
from ..format import fmt_num, fmt_pct, table
from ..procs import ProxyProcess, cpu_seconds
from .common import UPSTREAM, pct, results, scenario
from .state_store import topic_bytes_on_disk, worst_case_snapshot

if TYPE_CHECKING:
    from pathlib import Path

    from ..runner import Env, Progress

ACCEPT, RELEASE = 1, 2
EARLIEST = {"share.auto.offset.reset": "earliest"}
VOLUME_PARTITIONS = 10
SIZES = (
    {"samples": 5000, "members": [1, 4, 16, 64], "records": 1_000_000, "release_rate": 0.01,
     "recovery_groups": 10, "recovery_partitions": 100, "recovery_inflight": 2000, "recovery_runs": 3},
    {"samples": 1000, "members": [1, 4, 16, 64], "records": 100_000, "release_rate": 0.01,
     "recovery_groups": 1, "recovery_partitions": 100, "recovery_inflight": 2000, "recovery_runs": 2},
)


def _process_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _write_seconds(proxy: ProxyProcess) -> tuple[float, float]:
    """(sum, count) of the proxy's kshare_state_write_seconds."""
    m = proxy.metrics()
    return m.get("kshare_state_write_seconds_sum", 0.0), m.get("kshare_state_write_seconds_count", 0.0)


def _latency_row(name: str, samples: list[float], members: int = 1, **more: Any) -> dict[str, Any]:
    s = sorted(samples)
    return {"name": name, "members": members, "samples": len(s), "p50_ms": pct(s, 0.5) * 1000,
            "p99_ms": pct(s, 0.99) * 1000, "mean_ms": statistics.fmean(s) * 1000 if s else float("nan"), **more}


async def _settled(ms: list[clients.Member], ok: Any, timeout: float = 60.0) -> None:
    """Heartbeat until the assignment satisfies ``ok`` (and no longer changes)."""
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        await asyncio.gather(*(m.heartbeat(None) for m in ms))
        now = [tuple(m.assigned) for m in ms]
        if now == last and ok(now):
            return
        last = now
        await asyncio.sleep(0.3)
    raise RuntimeError(f"assignment did not settle: {[m.assigned for m in ms]}")


async def ack_latency(proxy: ProxyProcess, topic: str, samples: int, *, per_record: bool, members: int,
                      name: str) -> dict[str, Any]:
    """``members`` members of one group on ``topic``, fetching and acknowledging until ``samples``
    ShareAcknowledge round trips were timed."""
    group = f"bench-lat-{uuid.uuid4().hex[:8]}"
    await asyncio.to_thread(clients.set_group_configs, proxy.bootstrap, group, EARLIEST)
    ms = [await clients.Member.join(proxy.bootstrap, group, topic) for _ in range(members)]
    # the assignor gives each member min(P, max(ceil(P/M), 8)) partitions (fewer past 16 members to a
    # partition), so members share partitions, as in any share group of more than P/8 members
    await _settled(ms, all)
    out: list[float] = []
    before = _write_seconds(proxy)
    cpu0, client0, t0 = cpu_seconds(proxy.pid), _process_cpu(), time.monotonic()

    async def run(m: clients.Member) -> None:
        parts = m.assigned[:1] if per_record else m.assigned
        while len(out) < samples:
            got = await m.fetch(parts)
            ranges = [(p, a, z) for p, rs in got.items() for a, z, _ in rs]
            if per_record:
                for p, a, z in ranges:
                    for o in range(a, z + 1):
                        out.append(await m.acknowledge({p: [(o, o, [ACCEPT])]}))
            elif ranges:
                acks: dict[int, list] = {}
                for p, a, z in ranges:
                    acks.setdefault(p, []).append((a, z, [ACCEPT]))
                out.append(await m.acknowledge(acks))

    try:
        async with clients.keepalive(ms):
            await asyncio.gather(*(run(m) for m in ms))
    finally:
        wall = time.monotonic() - t0
        cpu1, client1 = cpu_seconds(proxy.pid), _process_cpu()
        after = _write_seconds(proxy)
        await asyncio.gather(*(m.close() for m in ms))
    writes = after[1] - before[1]
    return _latency_row(name, out if per_record else out[:samples], members,
                        state_write_ms=(after[0] - before[0]) / writes * 1000 if writes else None,
                        proxy_cpu=(cpu1 - cpu0) / wall, client_cpu=(client1 - client0) / wall)


async def produce_latency(bootstrap: str, topic: str, samples: int, concurrency: int, name: str) -> dict[str, Any]:
    """Produce acks=all of one 60-byte record straight to the cluster, ``concurrency`` at a time."""
    from aiokafka.record.default_records import DefaultRecordBatchBuilder

    Req = messages.message_class("ProduceRequest")
    conns = [await clients.connect(bootstrap, "bench-produce") for _ in range(concurrency)]
    version = conns[0].best_version(ApiKey.PRODUCE, hi=9)
    out: list[float] = []
    warm = [0]
    new_topic = {ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.LEADER_NOT_AVAILABLE, ErrorCode.REQUEST_TIMED_OUT}

    async def run(conn: Any, partition: int) -> None:
        while len(out) < samples:
            b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0, producer_id=-1,
                                          producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
            b.append(0, timestamp=int(time.time() * 1000), key=os.urandom(30), value=os.urandom(30), headers=[])
            req = Req(transactional_id=None, acks=-1, timeout_ms=30000, topic_data=[Req.TopicProduceData(
                name=topic, partition_data=[Req.PartitionProduceData(index=partition, records=bytes(b.build()))])])
            t0 = time.perf_counter()
            resp = await conn.request(ApiKey.PRODUCE, version, req)
            dt = time.perf_counter() - t0
            code = resp.responses[0].partition_responses[0].error_code
            if code in new_topic:
                await asyncio.sleep(0.1)
                continue
            if code:
                raise RuntimeError(f"Produce: error {code}")
            warm[0] += 1
            if warm[0] > 50 * concurrency:  # the first requests of each connection are not counted
                out.append(dt)

    try:
        await asyncio.gather(*(run(c, i % 16) for i, c in enumerate(conns)))
    finally:
        for c in conns:
            await c.close()
    return _latency_row(name, out, concurrency)


def _end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-watermarks", "error_cb": clients._quiet})
    try:
        md = c.list_topics(topic, timeout=10).topics[topic]
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in md.partitions}
    finally:
        c.close()


async def state_volume(proxy: ProxyProcess, upstream: str, data_dir: Path | None, state_topic: str, topic: str,
                       release_rate: float, name: str, seed: int) -> dict[str, Any]:
    group = f"bench-vol-{uuid.uuid4().hex[:8]}"
    await asyncio.to_thread(clients.set_group_configs, proxy.bootstrap, group, EARLIEST)
    ends = await asyncio.to_thread(_end_offsets, upstream, topic)
    total = sum(ends.values())
    ms = [await clients.Member.join(proxy.bootstrap, group, topic) for _ in range(VOLUME_PARTITIONS)]
    # the assignor gives each member several partitions (min(P, max(ceil(P/M), 8)), fewer past 16 members
    # to a partition): they share partitions,
    # as real share consumers do; settled once every partition has members
    await _settled(ms, lambda now: all(now) and set().union(*map(set, now)) == set(ends))
    await asyncio.sleep(2.0)  # the group record writes of the joins are done
    rec0 = sum((await asyncio.to_thread(_end_offsets, upstream, state_topic)).values())
    disk0 = topic_bytes_on_disk(data_dir, state_topic)
    counts = {"accepted": 0, "released": 0, "acks": 0}
    done: set[tuple[int, int]] = set()
    latencies: list[float] = []
    t0 = time.monotonic()

    async def run(m: clients.Member, rng: random.Random) -> None:
        while len(done) < total:
            got = await m.fetch(m.assigned, max_wait_ms=200)
            acks: dict[int, list[tuple[int, int, list[int]]]] = {}
            for p, ranges in got.items():
                batches: list[tuple[int, int, list[int]]] = []
                for a, z, _ in ranges:
                    for o in range(a, z + 1):
                        t = RELEASE if release_rate and rng.random() < release_rate else ACCEPT
                        if t == ACCEPT:
                            done.add((p, o))
                            counts["accepted"] += 1
                        else:
                            counts["released"] += 1
                        if batches and batches[-1][2] == [t] and batches[-1][1] == o - 1:
                            batches[-1] = (batches[-1][0], o, [t])
                        else:
                            batches.append((o, o, [t]))
                if batches:
                    acks[p] = batches
            if acks:
                latencies.append(await m.acknowledge(acks))
                counts["acks"] += 1

    try:
        async with clients.keepalive(ms):
            await asyncio.gather(*(run(m, random.Random(seed + i)) for i, m in enumerate(ms)))
    finally:
        await asyncio.gather(*(m.close() for m in ms))
    seconds = time.monotonic() - t0
    if counts["accepted"] != total:
        raise RuntimeError(f"{name}: {counts['accepted']} of {total} records accepted")
    await asyncio.sleep(1.0)
    rec1 = sum((await asyncio.to_thread(_end_offsets, upstream, state_topic)).values())
    disk1 = topic_bytes_on_disk(data_dir, state_topic)
    on_disk = None if disk0 is None or disk1 is None else disk1 - disk0
    per_m = 1_000_000 / counts["accepted"]
    s = sorted(latencies)
    return {"workload": name, "accepted": counts["accepted"], "acks_per_m": counts["acks"] * per_m,
            "released_per_m": counts["released"] * per_m, "state_records_per_m": (rec1 - rec0) * per_m,
            "on_disk_kb_per_m": None if on_disk is None else on_disk * per_m / 1e3,
            "on_disk_per_record": None if on_disk is None else on_disk / max(rec1 - rec0, 1),
            "ack_p50_ms": pct(s, 0.5) * 1000, "ack_p99_ms": pct(s, 0.99) * 1000, "seconds": seconds}


async def seed_state(upstream: str, state_topic: str, topic: str, tid: bytes, groups: int, partitions: int,
                     inflight: int) -> None:
    store = TopicStateStore(upstream, topic=state_topic, partitions=10, prune_interval_s=1e9,
                            prune_after_records=1 << 60)
    await store.start()
    try:
        for g in range(groups):
            gid = f"recovery-{g}"
            await store.write_group(GroupRecord(gid, 1, dict(EARLIEST), {tid: topic}, {tid: partitions}))
            keys = [SharePartitionKey(gid, tid, p) for p in range(partitions)]
            for i in range(0, len(keys), 50):
                await asyncio.gather(*(store.write([(k, worst_case_snapshot(0, inflight))]) for k in keys[i:i + 50]))
    finally:
        await store.close()


async def first_records(bootstrap: str, topic: str, inflight: int) -> float:
    """Join recovery-0 and fetch partition 0 until records come back; checks their delivery counts."""
    t0 = time.monotonic()
    m = await clients.Member.join(bootstrap, "recovery-0", topic)
    expected = worst_case_snapshot(0, inflight)
    durable = {b.first_offset: b.delivery_count for b in expected.state_batches if b.delivery_state == 0}
    try:
        while True:
            got = (await m.fetch([0], max_records=inflight)).get(0, [])
            if got:
                for a, z, dc in got:
                    for o in range(a, z + 1):
                        if o not in durable or dc != durable[o] + 1:
                            raise RuntimeError(f"offset {o}: delivery count {dc}, durable {durable.get(o)}")
                return time.monotonic() - t0
    finally:
        # no final ShareAcknowledge: that would release (and persist) the acquired records, and the next
        # run would see delivery counts one higher; the SIGKILL that follows forgets them
        await m.conn.close()


def recovery(env: Env, progress: Progress, groups: int, partitions: int, inflight: int, runs: int) -> dict[str, Any]:
    upstream = env.upstream()
    state_topic = f"__kshare_bench_recovery_{uuid.uuid4().hex[:6]}"
    topic = clients.create_topic(upstream, f"bench-recovery-{uuid.uuid4().hex[:6]}", partitions)
    try:
        clients.produce_batches(upstream, topic, inflight * partitions, partitions)

        async def seed() -> None:
            conn = await clients.connect(upstream, "bench")
            try:
                tid = await clients.topic_id(conn, topic)
            finally:
                await conn.close()
            await seed_state(upstream, state_topic, topic, tid, groups, partitions, inflight)

        uvloop.run(seed())
        state_bytes = topic_bytes_on_disk(env.upstream_data_dir(), state_topic)
        progress.step(f"recovery: {groups * partitions} share-partitions written")
        to_loaded: list[float] = []
        logged: list[float] = []
        to_first_fetch: list[float] = []
        for i in range(runs):
            proxy = ProxyProcess(upstream, [*env.proxy_args, "--state-topic", state_topic,
                                            "--state-topic-partitions", "10"], name="kshare-recovery",
                                 log_path=env.options.out / "kshare-durability-recovery.log")
            t0 = time.monotonic()
            try:
                proxy.start(600)  # returns at "share state loaded"
                to_loaded.append(time.monotonic() - t0)
                m = next((re.search(r"share state loaded in ([0-9.]+)s", line) for line in proxy.output
                          if "share state loaded in" in line), None)
                logged.append(float(m.group(1)) if m else float("nan"))
                uvloop.run(first_records(proxy.bootstrap, topic, inflight))
                to_first_fetch.append(time.monotonic() - t0)
            finally:
                proxy.stop(signal.SIGKILL)
            progress.step(f"recovery {i + 1}: loaded in {to_loaded[-1]:.2f} s")
    finally:
        clients.delete_topic(upstream, topic)
        clients.delete_topic(upstream, state_topic)
    return {"share_partitions": groups * partitions, "inflight": inflight, "state_mb": None if state_bytes is None
            else state_bytes / 1e6, "to_loaded_s": to_loaded, "logged_s": logged, "to_first_fetch_s": to_first_fetch}


def run(env: Env, progress: Progress, *, samples: int, members: list[int], records: int, release_rate: float,
        recovery_groups: int, recovery_partitions: int, recovery_inflight: int, recovery_runs: int) -> dict[str, Any]:
    upstream = env.upstream()
    data_dir = env.upstream_data_dir()
    state_topic = f"__kshare_bench_state_{uuid.uuid4().hex[:6]}"
    proxy = ProxyProcess(upstream, [*env.proxy_args, "--state-topic", state_topic, "--state-topic-partitions", "10"],
                         name="kshare-durability", log_path=env.options.out / "kshare-durability.log")
    progress.begin("durability", 3 + len(members) + 2 + 1 + recovery_runs)
    latency: list[dict[str, Any]] = []
    volume: list[dict[str, Any]] = []
    topics: list[str] = []
    try:
        proxy.start(180)
        # 1. latency: a topic holding the acquisitions twice over on 16 partitions (each part a new group
        # reading from the start), and the Produce baseline's topic
        acquisitions = max(samples // 2, samples // 500 + 1)
        lat_topic = clients.create_topic(upstream, f"bench-lat-{uuid.uuid4().hex[:6]}", 16)
        base_topic = clients.create_topic(upstream, f"bench-base-{uuid.uuid4().hex[:6]}", 16)
        topics += [lat_topic, base_topic]
        clients.produce_batches(upstream, lat_topic, (2 * -(-acquisitions // 16) + 4) * 500 * 16, 16)
        parts = [
            lambda: produce_latency(upstream, base_topic, samples, 1, "Produce acks=all to the cluster, 1 at a time"),
            lambda: ack_latency(proxy, lat_topic, samples, per_record=True, members=1,
                                name="ShareAcknowledge of 1 record, 1 member"),
            lambda: produce_latency(upstream, base_topic, samples, 16, "Produce acks=all to the cluster, 16 at a time"),
        ]
        for n in members:
            parts.append(lambda n=n: ack_latency(
                proxy, lat_topic, samples // 5 if n == 1 else samples // 2, per_record=False, members=n,
                name=f"ShareAcknowledge of a 500-record acquisition, {n} member{'s at once' if n > 1 else ''}"))
        for make in parts:
            latency.append(uvloop.run(make()))
            progress.step(f"{latency[-1]['name']}: p50 {latency[-1]['p50_ms']:.2f} ms")
        base_one = next(r["p50_ms"] for r in latency if r["name"].startswith("Produce") and r["members"] == 1)
        base_16 = next(r["p50_ms"] for r in latency if r["name"].startswith("Produce") and r["members"] == 16)
        for r in latency:
            if not r["name"].startswith("Produce"):
                r["vs_produce"] = r["p50_ms"] / (base_16 if r["members"] > 1 else base_one)
        # 2. bytes on the state topic
        vol_topic = clients.create_topic(upstream, f"bench-vol-{uuid.uuid4().hex[:6]}", VOLUME_PARTITIONS)
        topics.append(vol_topic)
        clients.produce_batches(upstream, vol_topic, records, VOLUME_PARTITIONS)
        for rate, name, seed in ((0.0, "whole acquisitions accepted", 1), (release_rate, f"{release_rate:.0%} released",
                                                                           2)):
            volume.append(uvloop.run(state_volume(proxy, upstream, data_dir, state_topic, vol_topic, rate, name, seed)))
            progress.step(f"{name}: {fmt_num(volume[-1]['state_records_per_m'])} state records per million")
    finally:
        proxy.stop()
        notes = proxy.notes()
        for topic in topics:
            clients.delete_topic(upstream, topic)
    # 3. recovery, with proxies of its own
    rec = recovery(env, progress, recovery_groups, recovery_partitions, recovery_inflight, recovery_runs)
    progress.end()
    config = {"samples": samples, "members": members, "records": records, "release_rate": release_rate,
              "volume_partitions": VOLUME_PARTITIONS, "recovery_groups": recovery_groups,
              "recovery_partitions": recovery_partitions, "recovery_inflight": recovery_inflight,
              "recovery_runs": recovery_runs, "on_disk": data_dir is not None}
    return results(config, latency, volume=volume, recovery=rec, proxy_log_notes=notes)


def section(res: dict[str, Any]) -> list[str]:
    cfg = res.get("config", {})
    out = [
        "ShareAcknowledge sent to response received, in the client. *state write*: mean of kshare's "
        "`kshare_state_write_seconds` (queue wait + produce round, per share-partition write) over the same part. "
        "*vs Produce*: p50 over the p50 of the Produce baseline with the same concurrency. CPU: the proxy's and "
        "the clients' per wall-clock second.",
        "",
    ]
    out += table(
        ["part", "samples", "p50 ms", "p99 ms", "mean ms", "state write ms", "vs Produce", "proxy / client CPU"],
        [[r["name"], fmt_num(r["samples"]), fmt_num(r["p50_ms"], 2), fmt_num(r["p99_ms"], 2), fmt_num(r["mean_ms"], 2),
          fmt_num(r.get("state_write_ms"), 2), f"{fmt_num(r.get('vs_produce'), 1)}x" if r.get("vs_produce") else "-",
          f"{fmt_pct(r['proxy_cpu'])} / {fmt_pct(r['client_cpu'])}" if "proxy_cpu" in r else "-"]
         for r in res.get("rows", [])],
    )
    out += ["", f"Bytes on the state topic per 1,000,000 accepted records, end to end: {fmt_num(cfg.get('records'))} "
            f"records in producer batches of 500 on {cfg.get('volume_partitions', VOLUME_PARTITIONS)} partitions, as many "
            "members sharing them, each acquisition acknowledged in one ShareAcknowledge. *on "
            "disk*: growth of the state topic's `.log` files"
            + ("" if cfg.get("on_disk", True) else " (not measured: a cluster of --upstream)") + ".", ""]
    out += table(
        ["workload", "ShareAcknowledge", "released", "state records", "on disk KB", "on disk / state record B",
         "ack p50 / p99 ms", "wall time s"],
        [[v["workload"], fmt_num(v["acks_per_m"]), fmt_num(v["released_per_m"]), fmt_num(v["state_records_per_m"]),
          fmt_num(v["on_disk_kb_per_m"], 1), fmt_num(v["on_disk_per_record"]),
          f"{fmt_num(v['ack_p50_ms'], 2)} / {fmt_num(v['ack_p99_ms'], 2)}", fmt_num(v["seconds"], 1)]
         for v in res.get("volume", [])],
    )
    rec = res.get("recovery") or {}
    if rec:
        out += ["", f"Recovery through kshare: {fmt_num(rec.get('share_partitions'))} share-partitions x "
                f"{fmt_num(rec.get('inflight'))} in-flight records, every record its own state range "
                f"({fmt_num(rec.get('state_mb'), 1)} MB of state records on disk); kshare started on it "
                f"{len(rec.get('to_loaded_s', []))} times (SIGKILLed in between).", ""]
        lines = []
        for label, key in (('process start to "share state loaded"', "to_loaded_s"),
                           ("load time logged by kshare (state topic replay + groups)", "logged_s"),
                           ("process start to the first ShareFetch returning recovered records", "to_first_fetch_s")):
            xs = rec.get(key) or []
            lines.append([label, fmt_num(min(xs), 2), fmt_num(statistics.median(xs), 2), fmt_num(max(xs), 2)]
                         if xs else [label, "-", "-", "-"])
        out += table(["measure", "best s", "median s", "worst s"], lines)
    return out + [""]


SCENARIO = scenario(
    __name__, "Durable acknowledgements through kshare: latency vs a Produce, state-topic bytes, recovery",
    needs=frozenset({UPSTREAM}), opt_in=True, repeats=False,
)
