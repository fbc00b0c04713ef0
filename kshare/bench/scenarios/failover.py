"""The ``failover`` scenario of ``kshare bench``: Failover: a three-node cluster's brokers restarted one by one, then one killed, under share
consumers and a producer; kshare on Kafka 3.9 beside native Kafka 4.4 share groups."""

from __future__ import annotations

import contextlib
import math
import multiprocessing as mp
import queue
import shlex
import shutil
import struct
import time
import uuid
from array import array
from typing import TYPE_CHECKING, Any

from .. import clients
from ..brokers import KAFKA_3, KAFKA_4
from ..format import COLORS, fmt_num, table
from ..procs import BENCH_BROKER_CONFIG, KAFKA4_CONFIG, ProxyProcess
from ..three_nodes import ThreeNodeCluster
from .common import KAFKA3, KAFKA4, produce_round_robin, scenario, target
from .failover_analysis import failover_analysis, log_levels, overlap_max, timeline

if TYPE_CHECKING:
    from ..runner import Env, Progress


# issue 40: a three-node cluster's brokers restarted one by one (SIGTERM) and one killed (SIGKILL) under four
# share consumers, kshare on Kafka 3.9 and native Kafka 4.4, one after the other. A fault's cycle (stop,
# start, replicas in sync, preferred leaders back, 5 s) took 15-20 s on the project's 2-core machine, the
# roll + kill about 80 s after 15 s of baseline: at 150 records/s the producer writes through all of it,
# and the four consumers (about 650 records/s at 6 ms a record) still have a backlog when the last fault
# comes
SIZES = (
    {"records_before": 40_000, "records_during": 20_000, "rate": 150.0},
    {"records_before": 4_000, "records_during": 3_000, "rate": 20.0, "baseline_s": 5.0, "settle_s": 2.0},
)


FAILOVER_REDELIVERY_TARGET_PCT = 10.0  # redeliveries over the roll + kill, % of the records
FAILOVER_STALL_TARGET_S = 10.0  # the longest time records were available and none was delivered
FAILOVER_FAULTS = (("SIGTERM", 1), ("SIGTERM", 2), ("SIGTERM", 3), ("SIGKILL", 2))
_ID = struct.Struct(">q")  # a record's value starts with its id


def _failover_consumer(name: str, bootstrap: str, group: str, topic: str, work_s: float, max_poll: int,
                       seen, counts, slot: int, ready, stop, out) -> None:
    """A ShareConsumer (implicit acknowledgement) until ``stop``: the id, partition and time of every
    delivery (the time ``poll()`` returned it), ``work_s`` of work a record; marks ``seen[id]`` and
    counts its deliveries in ``counts[slot]`` for the parent to watch. Sends what it got to ``out``."""
    from confluent_kafka import ShareConsumer

    ids, parts, times = array("q"), array("b"), array("d")
    errors: dict[str, int] = {}
    ack_failed: dict[str, int] = {}
    acked = [0]

    def on_error(err: Any) -> None:
        key = f"client: {err.name()}"
        errors[key] = errors.get(key, 0) + 1

    def on_commit(offsets: Any, exc: Any) -> None:
        n = sum(len(v) for v in offsets.values()) if offsets else 0
        if exc is None:
            acked[0] += n
        else:
            err = exc.args[0] if exc.args else exc
            key = err.name() if hasattr(err, "name") else str(err)
            ack_failed[key] = ack_failed.get(key, 0) + n

    c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group, "max.poll.records": max_poll,
                       "error_cb": on_error, "log_level": 0})  # errors counted, not printed
    c.set_acknowledgement_commit_callback(on_commit)
    c.subscribe([topic])
    ready.set()
    unpack = _ID.unpack_from
    try:
        while not stop.is_set():
            try:
                msgs = c.poll(0.1)
            except Exception as exc:  # noqa: BLE001 - counted; the consumer goes on, as an application would
                key = f"poll: {exc}"[:120]
                errors[key] = errors.get(key, 0) + 1
                time.sleep(0.1)
                continue
            now = time.monotonic()
            for m in msgs:
                if m.error() is not None:
                    key = f"record: {m.error().name()}"
                    errors[key] = errors.get(key, 0) + 1
                    continue
                (rid,) = unpack(m.value())
                ids.append(rid)
                parts.append(m.partition())
                times.append(now)
                seen[rid] = 1
                counts[slot] += 1
            for m in msgs:  # the work, after every delivery of the batch is noted
                if m.error() is None:
                    time.sleep(work_s)
    finally:
        with contextlib.suppress(Exception):
            c.close()
        out.put(("consumed", name, ids.tobytes(), parts.tobytes(), times.tobytes(), errors, ack_failed, acked[0]))


def _failover_producer(bootstrap: str, topic: str, first_id: int, n: int, rate: float, partitions: int,
                       size: int, go, out) -> None:
    """Idempotent, acks=all: ``n`` records (ids ``first_id``...) at ``rate`` a second from ``go``, round
    robin over the partitions; sends the time each was handed to ``produce()`` and the time its delivery
    report said it was written (NaN: failed), and the errors."""
    from confluent_kafka import Producer

    sent = array("d", [math.nan]) * n
    acked = array("d", [math.nan]) * n
    errors: dict[str, int] = {}

    def report(err: Any, msg: Any) -> None:
        i = _ID.unpack_from(msg.value())[0] - first_id
        if err is None:
            acked[i] = time.monotonic()
        else:
            errors[err.name()] = errors.get(err.name(), 0) + 1

    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5,
                  "message.timeout.ms": 300_000, "error_cb": clients._quiet, "log_level": 0})
    pad = b"." * max(0, size - _ID.size)
    go.wait()
    t0 = time.monotonic()
    lag_max = 0.0
    for i in range(n):
        due = t0 + i / rate
        while (wait := due - time.monotonic()) > 0:
            p.poll(wait)  # delivery reports are served (and timed) while waiting
        lag_max = max(lag_max, time.monotonic() - due)
        value = _ID.pack(first_id + i) + pad
        while True:
            try:
                p.produce(topic, value, partition=i % partitions, on_delivery=report)
                break
            except BufferError:
                p.poll(0.01)
        sent[i] = time.monotonic()
        p.poll(0)
    left = p.flush(600)
    out.put(("produced", sent.tobytes(), acked.tobytes(), errors, left, lag_max))


def _produce_ids(bootstrap: str, topic: str, n: int, partitions: int, size: int) -> None:
    """Records with ids 0..n-1, round robin over the partitions, idempotent and acks=all, as fast as
    the cluster takes them (producer batches of up to 16 KB, the Java client's default)."""
    from confluent_kafka import KafkaException, Producer

    failed: list[object] = []
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5,
                  "batch.size": 16384, "error_cb": clients._quiet, "log_level": 3,
                  "on_delivery": lambda err, _msg: failed.append(err) if err is not None else None})
    pad = b"." * max(0, size - _ID.size)
    produce_round_robin(p, topic, n, partitions, lambda i: _ID.pack(i) + pad)
    left = p.flush(300)
    if left or failed:
        raise KafkaException(f"producing to {topic}: {left} undelivered, errors {failed[:3]}")


def _failover_run(system: str, cluster: Any, bootstrap: str, progress: Progress, *, records_before: int,
                  records_during: int, rate: float, partitions: int, consumers: int, work_ms: float,
                  max_poll: int, lock_ms: int, baseline_s: float, settle_s: float, value_size: int,
                  drain_timeout_s: float, check: Any = None) -> dict[str, Any]:
    """One system's run on its started three-node ``cluster``; clients connect to ``bootstrap`` (the
    proxy for kshare, the cluster for native). ``check()`` raises if the proxy is gone."""
    from confluent_kafka.admin import NewTopic

    ctx = mp.get_context("spawn")
    topic = f"bench-failover-{uuid.uuid4().hex[:8]}"
    group = f"bench-failover-{uuid.uuid4().hex[:8]}"
    admin = cluster.admin()
    admin.create_topics([NewTopic(topic, partitions, 3)], request_timeout=60)[topic].result(60)
    if not cluster.wait_preferred_leaders([topic], 60):
        raise RuntimeError(f"{system}: topic {topic} has no leaders after 60 s")
    # the records before: straight to the cluster for both systems (the same batches)
    t = time.monotonic()
    _produce_ids(cluster.bootstrap, topic, records_before, partitions, value_size)
    clients.set_group_configs(bootstrap, group, {"share.auto.offset.reset": "earliest",
                                                 "share.heartbeat.interval.ms": clients.HEARTBEAT_MS,
                                                 "share.record.lock.duration.ms": lock_ms})
    progress.step(f"{system}: {records_before:,} records produced in {time.monotonic() - t:.1f} s")
    total = records_before + records_during
    seen = ctx.RawArray("B", total)
    counts = ctx.RawArray("q", consumers + 1)
    stop, late_stop, go = ctx.Event(), ctx.Event(), ctx.Event()
    out = ctx.Queue()
    readies = [ctx.Event() for _ in range(consumers + 1)]
    procs = [
        ctx.Process(target=_failover_consumer, daemon=True,
                    args=(f"c{i}", bootstrap, group, topic, work_ms / 1000, max_poll, seen, counts, i,
                          readies[i], stop, out))
        for i in range(consumers)
    ]
    producer = ctx.Process(target=_failover_producer, daemon=True,
                           args=(bootstrap, topic, records_before, records_during, rate, partitions,
                                 value_size, go, out))
    late = ctx.Process(target=_failover_consumer, daemon=True,
                       args=("late", bootstrap, group, topic, 0.0, max_poll, ctx.RawArray("B", total), counts,
                             consumers, readies[consumers], late_stop, out))
    got: dict[str, tuple] = {}
    produced: tuple | None = None

    def collect(until: float, want: set[str]) -> None:
        """Results from the queue until those of ``want`` (consumer names, "producer") are in."""
        nonlocal produced
        names, producer_too = want - {"producer"}, "producer" in want
        while (names - set(got) or (producer_too and produced is None)) and time.monotonic() < until:
            try:
                msg = out.get(timeout=0.5)
            except queue.Empty:
                continue
            if msg[0] == "produced":
                produced = msg
            else:
                got[msg[1]] = msg

    faults: list[dict[str, Any]] = []
    try:
        producer.start()
        t0 = time.monotonic()  # the consumers start: the records produced before are available
        for pr in procs:
            pr.start()
        for r in readies[:consumers]:
            if not r.wait(120):
                raise TimeoutError(f"{system}: a consumer did not start in 120 s")
        go.set()
        time.sleep(baseline_s)
        for sig, node in FAILOVER_FAULTS:
            if check is not None:
                check()
            led = sorted(p for p, leader in cluster.leaders(topic).items() if leader == node)
            fault: dict[str, Any] = {"fault": sig, "node": node, "partitions": led}
            fault["signal"] = time.monotonic()
            cluster.stop_node(node, hard=sig == "SIGKILL")
            fault["exited"] = time.monotonic()
            cluster.start_node(node, timeout=120)
            fault["back"] = time.monotonic()
            fault["in_sync"] = cluster.wait_in_sync(120)
            fault["in_sync_at"] = time.monotonic()
            fault["leaders_back"] = cluster.wait_preferred_leaders(None, 60)
            fault["leaders_back_at"] = time.monotonic()
            faults.append(fault)
            progress.step(
                f"{system}: {sig} node {node} ({len(led)} of the topic's leaders): exited in "
                f"{fault['exited'] - fault['signal']:.1f} s, back {fault['back'] - fault['exited']:.1f} s later, "
                f"in sync after {fault['in_sync_at'] - fault['signal']:.0f} s, leaders back after "
                f"{fault['leaders_back_at'] - fault['signal']:.0f} s; {sum(counts[:consumers]):,} deliveries so far"
            )
            time.sleep(settle_s)
        if check is not None:
            check()
        t_faults_done = time.monotonic()
        collect(t_faults_done + drain_timeout_s, {"producer"})
        if produced is None:
            raise TimeoutError(f"{system}: the producer did not finish")
        acked_during = array("d")
        acked_during.frombytes(produced[2])
        expected = list(range(records_before)) + [
            records_before + i for i, a in enumerate(acked_during) if not math.isnan(a)
        ]
        deadline = time.monotonic() + drain_timeout_s
        while time.monotonic() < deadline:
            flags = bytes(seen)
            if all(flags[i] for i in expected):
                break
            time.sleep(0.5)
        # then until no delivery came for a lock's duration and a bit: a lock that runs out is counted
        quiet_s = lock_ms / 1000 + 5
        last, last_change = sum(counts[:consumers]), time.monotonic()
        while time.monotonic() - last_change < quiet_s and time.monotonic() < deadline + quiet_s:
            time.sleep(0.5)
            now_n = sum(counts[:consumers])
            if now_n != last:
                last, last_change = now_n, time.monotonic()
        t_end = time.monotonic()
        stop.set()
        collect(time.monotonic() + 120, {f"c{i}" for i in range(consumers)})
        for pr in procs:
            pr.join(30)
        # acknowledged stays acknowledged: a newcomer to the group gets nothing
        late.start()
        readies[consumers].wait(60)
        time.sleep(8)
        late_stop.set()
        collect(time.monotonic() + 60, {"late"})
        late.join(30)
        progress.step(
            f"{system}: {sum(counts[:consumers]):,} deliveries of {len(expected):,} records, drained "
            f"{t_end - t_faults_done:.0f} s after the last fault; a newcomer got {counts[consumers]}"
        )
    finally:
        stop.set()
        late_stop.set()
        go.set()
        for pr in [*procs, producer, late]:
            if pr.pid is None:
                continue
            pr.join(5)
            if pr.is_alive():
                pr.kill()
    missing = {f"c{i}" for i in range(consumers)} - set(got)
    if missing:
        raise RuntimeError(f"{system}: no results from consumer(s) {sorted(missing)}")
    deliveries: list[tuple[float, int, int]] = []
    client_errors: dict[str, int] = {}
    ack_failed: dict[str, int] = {}
    acked_total = 0
    for name in sorted(got):
        if name == "late":
            continue
        _, _, ids_b, parts_b, times_b, errors, failed, acked = got[name]
        ids, parts, times = array("q"), array("b"), array("d")
        ids.frombytes(ids_b)
        parts.frombytes(parts_b)
        times.frombytes(times_b)
        deliveries += list(zip(times, ids, parts, strict=True))
        for k, v in errors.items():
            client_errors[k] = client_errors.get(k, 0) + v
        for k, v in failed.items():
            ack_failed[k] = ack_failed.get(k, 0) + v
        acked_total += acked
    late_ids = array("q")
    if "late" in got:
        late_ids.frombytes(got["late"][2])
    sent, acked_at = array("d"), array("d")
    sent.frombytes(produced[1])
    acked_at.frombytes(produced[2])
    available = {i: t0 for i in range(records_before)}
    acks = []
    slow: dict[tuple[int, int], list[float]] = {}  # (fault, partition) -> waits over 2 s
    signals = [f["signal"] for f in faults]
    for i, (s, a) in enumerate(zip(sent, acked_at, strict=True)):
        if not math.isnan(a):
            available[records_before + i] = a
            acks.append((s, a))
            if a - s > 2.0:
                slow.setdefault((sum(1 for x in signals if x <= s), i % partitions), []).append(a - s)
    windows = [{"name": "before the faults", "start": t0, "end": faults[0]["signal"]}]
    for i, f in enumerate(faults):
        end = faults[i + 1]["signal"] if i + 1 < len(faults) else t_end
        windows.append({"name": f"{f['fault']} node {f['node']}", "start": f["signal"], "end": end,
                        "signal": f["signal"], "partitions": f["partitions"]})
    a = failover_analysis(deliveries, available, windows, acks, t_end)
    roll = [w for w in a["windows"] if "signal" in w]
    roll_re = sum(w["redeliveries"] for w in roll)
    for w, f in zip(roll, faults, strict=True):
        w.update({
            "exit_s": f["exited"] - f["signal"],
            "back_s": f["back"] - f["signal"],
            "in_sync_s": f["in_sync_at"] - f["signal"] if f["in_sync"] else math.nan,
            "leaders_back_s": f["leaders_back_at"] - f["signal"] if f["leaders_back"] else math.nan,
        })
    for w in a["windows"]:
        w["at_s"] = w["start"] - t0
        w["seconds"] = w["end"] - w["start"]
        w["redelivered_pct"] = 100 * w["redeliveries"] / max(1, a["records"])
        for k in ("start", "end", "signal"):
            w.pop(k, None)
    stalls_roll = [(x, y) for x, y in a["stalls"] if y > faults[0]["signal"]]
    return {
        "system": system,
        "topic": topic,
        "records": a["records"],
        "produce_failed": sum(produced[3].values()),
        "produce_errors": produced[3],
        "produce_left": produced[4],
        "producer_lag_max_s": produced[5],
        "delivered": a["delivered"],
        "lost": a["lost"],
        "lost_ids": a["lost_ids"],
        "deliveries": a["deliveries"],
        "redeliveries": a["redeliveries"],
        "redelivered_pct": 100 * a["redeliveries"] / max(1, a["records"]),
        "roll_redeliveries": roll_re,
        "roll_redelivered_pct": 100 * roll_re / max(1, a["records"]),
        "longest_stall_s": overlap_max(stalls_roll, faults[0]["signal"], t_end),
        "baseline_longest_stall_s": a["windows"][0]["longest_stall_s"],
        "stalls_over_1s": [(round(x - t0, 2), round(y - x, 2)) for x, y in a["stalls"] if y - x > 1.0],
        "producer_longest_gap_s": a["producer_longest_gap_s"],
        "producer_longest_wait_s": max((b - s for s, b in acks), default=math.nan),
        # records that took over 2 s from produce() to their delivery report, per window and partition
        "slow_produce": [{"window": windows[w]["name"], "partition": p, "records": len(v), "max_wait_s": max(v)}
                         for (w, p), v in sorted(slow.items())],
        "late_deliveries": len(late_ids),
        "client_errors": client_errors,
        "ack_failed": ack_failed,
        "acked_by_clients": acked_total,
        "seconds": t_end - t0,
        "drain_s": t_end - t_faults_done,
        "windows": a["windows"],
        "timeline": timeline(deliveries, acks, t0, t_end),
        "faults_at_s": [{"fault": f"{f['fault']} node {f['node']}", "signal_s": f["signal"] - t0,
                         "back_s": f["back"] - t0} for f in faults],
    }


def run(env: Env, progress: Progress, *, records_before: int, records_during: int, rate: float,
        partitions: int = 6, consumers: int = 4, work_ms: float = 6.0, max_poll: int = 100,
        lock_ms: int = 15_000, baseline_s: float = 15.0, settle_s: float = 5.0, value_size: int = 100,
        drain_timeout_s: float = 600.0, systems: tuple[str, ...] = ("kshare", "native")) -> dict[str, Any]:
    """Three KRaft nodes (replication factor 3, ``min.insync.replicas`` 2) for each system, one after the
    other: Apache Kafka 3.9 with ``kshare proxy --upstream <the three>`` (its own process) and Apache
    Kafka 4.4 with share groups, used directly. A ``partitions``-partition topic with ``records_before``
    records; ``consumers`` ShareConsumers (each its own process; ``max.poll.records`` ``max_poll``,
    ``work_ms`` of work a record) drain it while an idempotent acks=all producer (its own process)
    writes ``records_during`` more at ``rate`` a second (through kshare for kshare); after
    ``baseline_s``, each broker in turn gets SIGTERM and is started again, then one is SIGKILLed and
    started again; before the next fault the bench waits (as a rolling restart does) until every
    replica is in sync and the preferred leaders are back, then ``settle_s``. The share groups'
    ``share.record.lock.duration.ms`` is ``lock_ms`` on both (native: also its broker default)."""

    out_dir = env.options.out / "failover"
    out_dir.mkdir(parents=True, exist_ok=True)
    progress.begin("failover", len(systems) * (3 + len(FAILOVER_FAULTS)))
    rows: list[dict[str, Any]] = []
    log_summary: dict[str, Any] = {}
    metrics: dict[str, float] = {}
    command = ""
    sizes = dict(records_before=records_before, records_during=records_during, rate=rate, partitions=partitions,
                 consumers=consumers, work_ms=work_ms, max_poll=max_poll, lock_ms=lock_ms, baseline_s=baseline_s,
                 settle_s=settle_s, value_size=value_size, drain_timeout_s=drain_timeout_s)
    for system in systems:
        if system == "kshare":
            cluster = ThreeNodeCluster(KAFKA_3, config=BENCH_BROKER_CONFIG)
        else:
            cluster = ThreeNodeCluster(KAFKA_4, share_groups=True, config={
                **KAFKA4_CONFIG, "group.share.record.lock.duration.ms": lock_ms,
                "share.coordinator.state.topic.num.partitions": 3})
        proxy: ProxyProcess | None = None
        try:
            t = time.monotonic()
            cluster.start(180)
            what = "Apache Kafka 3.9" if system == "kshare" else "Apache Kafka 4.4 with share groups"
            env.started[f"failover-{system}"] = f"{what}, three nodes at {cluster.bootstrap}"
            if system == "kshare":
                log_path = env.options.out / "kshare-failover.log"
                proxy = ProxyProcess(cluster.bootstrap, ["--state-topic-partitions", "3",
                                                         "--state-topic-replication-factor", "3", *env.proxy_args],
                                     name="kshare-failover", log_path=log_path)
                proxy.start(180)
                command = shlex.join(["kshare", *proxy.cmd[3:]])
                env.started["kshare-failover"] = f"kshare proxy at {proxy.bootstrap} (pid {proxy.pid})"
                bootstrap = proxy.bootstrap

                def check(p: ProxyProcess = proxy) -> None:
                    if not p.running:
                        raise RuntimeError("the kshare proxy exited:\n" + "".join(p.output[-30:]))
            else:
                bootstrap, check = cluster.bootstrap, None
            progress.step(f"{system}: three nodes up in {time.monotonic() - t:.0f} s")
            row = _failover_run(system, cluster, bootstrap, progress, check=check, **sizes)
            if proxy is not None:
                row["proxy_running_at_end"] = proxy.running
                with contextlib.suppress(Exception):
                    metrics = {k: v for k, v in proxy.metrics().items()
                               if k.startswith(("kshare_state_", "kshare_share_lock", "kshare_share_deliveries",
                                                "kshare_share_archived", "kshare_upstream", "kshare_client_conn"))
                               and not k.endswith(("_bucket", "_created"))}
            rows.append(row)
        finally:
            if proxy is not None:
                proxy.stop()
                log_summary = log_levels(proxy.log_path) if proxy.log_path else {}
                log_summary["notes"] = proxy.notes(30)
            for node_id, node in cluster.nodes.items():
                with contextlib.suppress(OSError):
                    shutil.copy(node.log_path, out_dir / f"{system}-node{node_id}.log")
            with contextlib.suppress(Exception):
                cluster.close()
    progress.end()
    by = {r["system"]: r for r in rows}
    targets = []
    k = by.get("kshare")
    if k is not None:
        n = by.get("native")
        targets = [
            target("failover, kshare: records lost", k["lost"], 0, "<="),
            target("failover, kshare: redeliveries over the roll + kill, % of the records",
                   k["roll_redelivered_pct"], FAILOVER_REDELIVERY_TARGET_PCT, "<=", "%"),
            target("failover, kshare: longest time records were available and none was delivered",
                   k["longest_stall_s"], FAILOVER_STALL_TARGET_S, "<=", "s"),
            target("failover, kshare: the producer's longest stall, no longer than on native 4.4",
                   k["producer_longest_gap_s"], n["producer_longest_gap_s"] if n else math.nan, "<=", "s"),
        ]
    return {
        "config": {**sizes, "faults": [f"{s} node {n}" for s, n in FAILOVER_FAULTS], "command": command,
                   "kshare_cluster": "Apache Kafka 3.9.2, three KRaft nodes",
                   "native_cluster": "Apache Kafka 4.4.0 with share groups, three KRaft nodes"},
        "rows": rows,
        "proxy_log": log_summary,
        "proxy_metrics": metrics,
        "targets": targets,
    }


# -- results.md and the plot ----------------------------------------------------------------------


_FAILOVER_NAMES = {"kshare": "kshare on Kafka 3.9", "native": "native Kafka 4.4"}


def section(res: dict[str, Any]) -> list[str]:
    cfg = res.get("config", {})
    rows = res.get("rows", [])
    out = [
        f"For each system its own three KRaft nodes (replication factor 3, `min.insync.replicas` 2), one "
        f"system after the other: Apache Kafka 3.9 with `kshare proxy --upstream <the three nodes>` (its own "
        f"process) and Apache Kafka 4.4 with share groups, used directly. A {cfg.get('partitions', 6)}-partition "
        f"topic with {fmt_num(cfg.get('records_before'))} records ({cfg.get('value_size', 100)} B, written straight "
        f"to the cluster on both); {cfg.get('consumers', 4)} confluent-kafka `ShareConsumer`s (each its own "
        f"process, implicit acknowledgement, `max.poll.records` {cfg.get('max_poll', 100)}, "
        f"{fmt_num(cfg.get('work_ms'), 0)} ms of work a record) drain it while an idempotent acks=all producer (its own "
        f"process) writes {fmt_num(cfg.get('records_during'))} more at {fmt_num(cfg.get('rate'))} a second (through "
        f"kshare for kshare, directly for native). After {fmt_num(cfg.get('baseline_s'))} s: "
        f"{', '.join(cfg.get('faults', []))}, one after the other; each node is started again at once, and "
        "before the next fault the bench waits, as a rolling restart does, until every replica is in sync "
        f"and the preferred leaders are back, then {fmt_num(cfg.get('settle_s'))} s. "
        f"`share.record.lock.duration.ms` {fmt_num(cfg.get('lock_ms'))} on both groups (native: also its "
        "broker default `group.share.record.lock.duration.ms`). The run ends when every record was "
        "delivered and no delivery came for a lock's duration + 5 s; then a new consumer of the group "
        "polls for 8 s (what was acknowledged must stay so: it gets nothing).",
        "",
        "*Redelivery*: a delivery of a record delivered before (counted in the window it happened in). "
        "*Stall*: a stretch without any delivery while some record was available and not yet delivered "
        "(from the first delivery on). *Producer's stall*: the longest time between two successful delivery "
        "reports; *longest produce wait*: the longest time one record took from `produce()` to its "
        "report. Times in seconds.",
        "",
    ]
    head = ["", *(_FAILOVER_NAMES.get(r["system"], r["system"]) for r in rows)]

    def line(label: str, key: str, digits: int = 0, fmt: Any = None) -> list[str]:
        return [label, *((fmt(r) if fmt else fmt_num(r.get(key), digits)) for r in rows)]

    lines = [
        line("records (acknowledged by the cluster)", "records"),
        line("records lost", "lost"),
        line("deliveries", "deliveries"),
        line("redeliveries, whole run (% of the records)", "", fmt=lambda r: (
            f"{fmt_num(r.get('redeliveries'))} ({fmt_num(r.get('redelivered_pct'), 1)} %)")),
        line("redeliveries over the roll + kill (% of the records)", "", fmt=lambda r: (
            f"{fmt_num(r.get('roll_redeliveries'))} ({fmt_num(r.get('roll_redelivered_pct'), 1)} %)")),
        line("longest stall from the first fault on", "longest_stall_s", 1),
        line("longest stall before the faults", "baseline_longest_stall_s", 1),
        line("producer's longest stall", "producer_longest_gap_s", 1),
        line("longest produce wait", "producer_longest_wait_s", 1),
        line("produce failures", "produce_failed"),
        line("failed acknowledgements (records)", "", fmt=lambda r: fmt_num(sum((r.get("ack_failed") or {}).values()))),
        line("a newcomer got, after the run", "late_deliveries"),
        line("run, s (drain after the last fault)", "", fmt=lambda r: (
            f"{fmt_num(r.get('seconds'))} ({fmt_num(r.get('drain_s'))})")),
    ]
    out += table(head, lines) + [""]
    for r in rows:
        name = _FAILOVER_NAMES.get(r["system"], r["system"])
        out += [f"**{name}**, per fault (window: from its signal to the next fault's; the last one to the end):", ""]
        wrows = []
        for w in r.get("windows", []):
            fault = "signal" in w or "exit_s" in w
            wrows.append([
                w.get("name", "?"),
                fmt_num(w.get("at_s"), 0),
                f"{fmt_num(w.get('exit_s'), 1)} / {fmt_num(w.get('back_s'), 1)} / {fmt_num(w.get('in_sync_s'), 0)} / "
                f"{fmt_num(w.get('leaders_back_s'), 0)}" if fault else "-",
                ",".join(str(p) for p in w.get("partitions", [])) if fault else "-",
                fmt_num(w.get("deliveries")),
                f"{fmt_num(w.get('redeliveries'))} ({fmt_num(w.get('redelivered_pct'), 1)} %)",
                fmt_num(w.get("first_record_s"), 2) if fault else "-",
                fmt_num(w.get("first_record_of_its_partitions_s"), 2) if fault else "-",
                fmt_num(w.get("longest_stall_s"), 2),
                fmt_num(w.get("producer_longest_gap_s"), 2),
                fmt_num(w.get("producer_longest_wait_s"), 2),
            ])
        out += table(
            ["window", "at s", "exited / back / in sync / leaders back, s after the signal", "its partitions",
             "deliveries", "redeliveries", "first record after the signal", "first record of each of its partitions",
             "longest stall", "producer's longest stall", "longest produce wait"],
            wrows,
        )
        out.append("")
        extra = []
        if r.get("lost"):
            extra.append(f"lost record ids (first 20): {r.get('lost_ids')}")
        if r.get("stalls_over_1s"):
            extra.append("stalls over 1 s (s after the consumers started, length): "
                         + ", ".join(f"{a:g} s: {b:g} s" for a, b in r["stalls_over_1s"][:20]))
        if r.get("client_errors"):
            extra.append(f"client errors: {r['client_errors']}")
        if r.get("ack_failed"):
            extra.append(f"acknowledgements that failed (records, by error): {r['ack_failed']}")
        if r.get("slow_produce"):
            extra.append("records that took over 2 s from `produce()` to their report (window, partition: "
                         "records, longest): " + "; ".join(
                             f"{x['window']}, {x['partition']}: {x['records']}, {fmt_num(x['max_wait_s'], 1)} s"
                             for x in r["slow_produce"]))
        if r.get("produce_errors"):
            extra.append(f"produce errors: {r['produce_errors']}")
        if "proxy_running_at_end" in r:
            extra.append(f"kshare proxy running at the end: {'yes' if r['proxy_running_at_end'] else '**no**'}")
        out += [f"* {e}" for e in extra] + ([""] if extra else [])
    plog = res.get("proxy_log") or {}
    if plog.get("counts"):
        c = plog["counts"]
        out += [f"kshare's log: {c.get('WARNING', 0)} WARNING, {c.get('ERROR', 0)} ERROR, "
                f"{c.get('Traceback', 0)} traceback line(s); the distinct messages (numbers masked):", ""]
        if plog.get("distinct"):
            out += table(["count", "first seen"], [[str(d["count"]), "`" + d["first"].replace("|", "/") + "`"]
                                                    for d in plog["distinct"]], "rl")
            out.append("")
    metrics = res.get("proxy_metrics") or {}
    if metrics:
        out += ["kshare's metrics at the end: " + ", ".join(f"`{k}` {fmt_num(v, 0 if float(v).is_integer() else 3)}"
                                                          for k, v in sorted(metrics.items())), ""]
    if cfg.get("command"):
        out += [f"The proxy: `{cfg['command']}`.", ""]
    return out


def plot(plt: Any, res: dict[str, Any]) -> Any:
    rows = res["rows"]
    fig, axes = plt.subplots(len(rows), 1, figsize=(12, 3.2 * len(rows)), squeeze=False)
    for ax, r in zip(axes[:, 0], rows, strict=True):
        tl = r.get("timeline") or {}
        for key, color, label in (("deliveries", COLORS.get(r["system"]), "deliveries/s"),
                                  ("redeliveries", "tab:red", "of them redeliveries"),
                                  ("produced", "tab:gray", "records produced/s (acknowledged)")):
            ys = tl.get(key, [])
            ax.plot(range(len(ys)), ys, color=color, lw=1, label=label)
        for i, f in enumerate(r.get("faults_at_s", [])):
            ax.axvspan(f["signal_s"], f["back_s"], color="tab:orange", alpha=0.2,
                       label="broker down (signal to back in the metadata)" if i == 0 else None)
            ax.text(f["signal_s"], ax.get_ylim()[1] * 0.95, f["fault"], fontsize=7, va="top", rotation=90)
        ax.set_xlabel("seconds after the consumers started")
        ax.set_ylabel("records / s")
        ax.set_title(f"{_FAILOVER_NAMES.get(r['system'], r['system'])}: {fmt_num(r.get('roll_redelivered_pct'), 1)} % "
                     f"redelivered over the faults, longest stall {fmt_num(r.get('longest_stall_s'), 1)} s, "
                     f"{fmt_num(r.get('lost'))} lost", fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
    return fig


SCENARIO = scenario(
    __name__,
    'Failover: three brokers restarted one by one and one killed under share consumers, kshare (Kafka 3.9) vs native Kafka 4.4',
    needs=frozenset({KAFKA3, KAFKA4}),
    opt_in=True,  # about 7 minutes: two three-node clusters of their own, one after the other
    repeats=False,
)
