"""Moving partitions of a multi-node cluster as an operator does, and a load to move them under.

``reassign`` runs Apache Kafka's own ``kafka-reassign-partitions`` (``ReassignPartitionsCommand``
from the cluster's release: an AlterPartitionReassignments through Kafka's Java AdminClient;
confluent-kafka has no call for it) and ``in_progress`` its ``--list`` (ListPartitionReassignments);
``elect_preferred`` is confluent-kafka's ElectLeaders. All of them talk to the cluster directly,
never through kshare.

:class:`MovesLoad` is what the faults happen under (``tests/integration/test_cluster_moves.py``):
an idempotent acks=all producer writing through kshare at a steady rate (plus bursts), confluent
``ShareConsumer`` loops draining through kshare, and the timeline both leave, analysed by the
failover benchmark's pure analysis (:func:`kshare.bench.scenarios.failover_analysis.failover_analysis`).
"""

from __future__ import annotations

import json
import logging
import math
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, ElectionType, KafkaException, Producer, TopicPartition

from kshare.bench.brokers import _java, ensure_kafka
from kshare.bench.scenarios.failover_analysis import failover_analysis, overlap_max
from kshare.bench.three_nodes import ThreeNodeCluster
from tests.harness.share import ConsumerLoop, quiet_logger

log = logging.getLogger("kshare.tests.cluster_moves")

Part = tuple[str, int]  # (topic, partition)

REASSIGN = "org.apache.kafka.tools.reassign.ReassignPartitionsCommand"


def kafka_tool(cluster: ThreeNodeCluster, main_class: str, *args: str, timeout: float = 180.0) -> str:
    """Run one of Apache Kafka's command-line tools (of the cluster's release) against the cluster;
    its output (AssertionError with it if it exits non-zero)."""
    cmd = [
        _java(),
        "-Xmx128m",
        "-XX:TieredStopAtLevel=1",
        "-XX:+UseSerialGC",
        "-Dlog4j.configuration=",
        "-cp",
        str(ensure_kafka(cluster.version) / "*"),
        main_class,
        "--bootstrap-server",
        cluster.bootstrap,
        *args,
    ]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{main_class} {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}"
    return proc.stdout


def assignment(
    cluster: ThreeNodeCluster, topics: Iterable[str]
) -> dict[Part, tuple[list[int], int, list[int]]]:
    """(topic, partition) -> (replicas, leader, in-sync replicas) as the cluster's metadata says now."""
    md = cluster.admin().list_topics(timeout=10)
    return {
        (t, p): (list(pm.replicas), pm.leader, list(pm.isrs))
        for t in topics
        for p, pm in md.topics[t].partitions.items()
    }


def reassign(cluster: ThreeNodeCluster, moves: Mapping[Part, list[int]]) -> None:
    """AlterPartitionReassignments: each partition's replicas become ``moves[part]`` (in that
    order: the first is the preferred leader), by ``kafka-reassign-partitions --execute``."""
    doc = {
        "version": 1,
        "partitions": [{"topic": t, "partition": p, "replicas": r} for (t, p), r in moves.items()],
    }
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(doc, f)
    try:
        out = kafka_tool(cluster, REASSIGN, "--reassignment-json-file", f.name, "--execute")
    finally:
        Path(f.name).unlink()
    assert "Successfully started" in out, out


def in_progress(cluster: ThreeNodeCluster) -> list[str]:
    """The reassignments the cluster has in progress (``kafka-reassign-partitions --list``: one
    line per partition after its header)."""
    out = kafka_tool(cluster, REASSIGN, "--list")
    lines = [line for line in out.splitlines() if line.strip()]
    if any("No partition reassignments found" in line for line in lines):
        return []
    return [line for line in lines if ":" in line and "Current partition reassignments" not in line] or lines


def wait_reassigned(
    cluster: ThreeNodeCluster, moves: Mapping[Part, list[int]], timeout: float = 120.0, *, listed: bool = True
) -> float:
    """Until every moved partition has exactly its new replicas, all in sync, and (``listed``) the
    cluster lists no reassignment in progress; seconds it took."""
    t0 = time.monotonic()
    topics = {t for t, _ in moves}
    while True:
        try:
            now = assignment(cluster, topics)
            done = all(now[k][0] == r and sorted(now[k][2]) == sorted(r) for k, r in moves.items())
        except Exception:  # noqa: BLE001 - a metadata request that failed: ask again
            done = False
        if done:
            break
        assert time.monotonic() - t0 < timeout, f"reassignment not done after {timeout:.0f} s: {now}"
        time.sleep(0.2)
    if listed:
        left = in_progress(cluster)
        assert left == [], left
    return time.monotonic() - t0


def elect_preferred(cluster: ThreeNodeCluster, parts: Iterable[Part]) -> dict[Part, str | None]:
    """ElectLeaders(PREFERRED) for ``parts``: each partition's error (None: its preferred replica
    was elected; ``ELECTION_NOT_NEEDED``: it led already)."""
    admin = cluster.admin()  # kept until the answer is in
    # (confluent-kafka 2.16 refuses request_timeout/operation_timeout here: "takes at most 4 arguments")
    res = admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition(t, p) for t, p in parts]).result(40)
    out: dict[Part, str | None] = {}
    for tp, err in res.items():
        if isinstance(err, KafkaException):
            err = err.args[0]
        out[(tp.topic, tp.partition)] = None if err is None else err.name()
    return out


def wait_leaders(cluster: ThreeNodeCluster, wanted: Mapping[Part, int], timeout: float = 60.0) -> float:
    """Until every partition of ``wanted`` is led by the node it names; seconds it took."""
    t0 = time.monotonic()
    topics = {t for t, _ in wanted}
    while True:
        try:
            now = assignment(cluster, topics)
            if all(now[k][1] == n for k, n in wanted.items()):
                return time.monotonic() - t0
        except Exception:  # noqa: BLE001 - a metadata request that failed: ask again
            pass
        assert time.monotonic() - t0 < timeout, f"leaders not {dict(wanted)} after {timeout:.0f} s"
        time.sleep(0.2)


# ------------------------------------------------------------------------------------------------
# the load


class MovesLoad:
    """A producer through kshare (idempotent, acks=all, round robin over ``partitions``; ``rate``
    records a second, plus what :meth:`burst` asks for) and ``consumers`` confluent ShareConsumer
    loops through kshare; every record's id is in its value (``%08d|`` and padding to ``size``).

    Records of the producer's delivery reports are what the cluster acknowledged: each must be
    delivered, at the (partition, offset) the report gave."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        group: str,
        *,
        partitions: int,
        rate: float,
        size: int = 256,
        consumers: int = 3,
        process_s: float = 0.003,
        max_poll_records: int = 100,
        producer_log: Path | None = None,
        producer_conf: Mapping[str, Any] | None = None,
    ) -> None:
        self.bootstrap, self.topic, self.group = bootstrap, topic, group
        self.partitions, self.rate, self.size = partitions, rate, size
        conf: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "logger": quiet_logger(),
        }
        if producer_log is not None:
            # librdkafka's idempotence log (producer ids, epoch bumps, drains: a few lines a
            # leader change) to a file: what a record written twice went through
            plog = logging.getLogger(f"kshare.tests.cluster_moves.producer.{topic}")
            plog.propagate = False
            plog.setLevel(logging.DEBUG)
            plog.addHandler(logging.FileHandler(producer_log))
            conf.update({"logger": plog, "debug": "eos"})
        conf.update(producer_conf or {})
        self.producer_log = producer_log
        self.producer = Producer(conf)
        self.sent: list[float] = []  # record id -> produce() time
        self.reported: dict[int, tuple[float, int, int]] = {}  # id -> (report time, partition, offset)
        self.failed: list[str] = []
        self._burst = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="moves-producer", daemon=True)
        self.loops = [
            ConsumerLoop(
                f"c{i}",
                bootstrap,
                group,
                topic,
                process_s=process_s,
                **{"max.poll.records": max_poll_records},
            )
            for i in range(consumers)
        ]
        self.consumers_started: float | None = None
        self.windows: list[dict[str, Any]] = []

    def value(self, i: int) -> bytes:
        return (b"%08d|" % i).ljust(self.size, b".")

    # producing

    def _send(self) -> None:
        i = len(self.sent)
        self.sent.append(time.monotonic())
        self.producer.produce(
            self.topic,
            self.value(i),
            partition=i % self.partitions,
            on_delivery=lambda err, msg, i=i: self._report(i, err, msg),
        )

    def _run(self) -> None:
        next_t = time.monotonic()
        while not self._stop.is_set():
            with self._lock:
                burst, self._burst = min(self._burst, 500), max(0, self._burst - 500)
            for _ in range(burst):
                try:
                    self._send()
                except BufferError:  # the producer's queue is full: let it drain
                    self.producer.poll(0.1)
                    self.sent.pop()
            if time.monotonic() >= next_t:
                self._send()
                next_t += 1 / self.rate
            self.producer.poll(min(0.01, max(0.0, next_t - time.monotonic())))
        self.producer.flush(120)

    def _report(self, i: int, err: Any, msg: Any) -> None:
        if err is None:
            self.reported[i] = (time.monotonic(), msg.partition(), msg.offset())
        else:
            self.failed.append(f"record {i}: {err}")

    def start_producer(self) -> MovesLoad:
        self._thread.start()
        return self

    def burst(self, n: int) -> None:
        """Produce ``n`` more records as fast as the producer takes them."""
        with self._lock:
            self._burst += n

    def stop_producer(self) -> None:
        self._stop.set()
        self._thread.join(150)
        assert not self._thread.is_alive(), "the producer did not finish flushing"

    def wait_reported(self, n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(self.reported) < n:
            assert time.monotonic() < deadline, (
                f"{len(self.reported)} of {n} records acknowledged by the cluster"
            )
            time.sleep(0.1)

    # consuming

    def start_consumers(self) -> MovesLoad:
        self.consumers_started = time.monotonic()
        for lp in self.loops:
            lp.start()
        return self

    def deliveries(self) -> list[tuple[float, int, int, int, bytes]]:
        """(time, record id, partition, offset, value) of every delivery, any consumer."""
        out = []
        for lp in self.loops:
            with lp.lock:
                got = list(lp.received)
            out += [(g.at, int(g.value[:8]), g.partition, g.offset, g.value) for g in got]
        return sorted(out)

    def undelivered(
        self, log: Mapping[tuple[int, int], bytes] | None = None
    ) -> set[int] | set[tuple[int, int]]:
        """The records acknowledged by the cluster (by id) never delivered, or with ``log`` the
        records of the log (by partition and offset)."""
        if log is None:
            return set(self.reported) - {rid for _, rid, *_ in self.deliveries()}
        return set(log) - {(p, o) for _t, _rid, p, o, _v in self.deliveries()}

    def wait_delivered(self, timeout: float, log: Mapping[tuple[int, int], bytes] | None = None) -> bool:
        """Until :meth:`undelivered` is empty (True) or ``timeout`` (False: the test's assertions
        say what is missing)."""
        deadline = time.monotonic() + timeout
        while self.undelivered(log):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.5)
        return True

    # faults and what they did

    def fault(self, name: str, partitions: Iterable[int] = ()) -> float:
        """Mark a fault (or a step of one) happening now: its window runs until the next one."""
        now = time.monotonic()
        if self.windows:
            self.windows[-1]["end"] = now
        self.windows.append(
            {"name": name, "start": now, "end": None, "signal": now, "partitions": sorted(set(partitions))}
        )
        return now

    def read_log(self, bootstrap: str, timeout: float = 60.0) -> dict[tuple[int, int], bytes]:
        """(partition, offset) -> value of every record of the topic, read with a plain consumer
        from ``bootstrap`` (the cluster itself) up to each partition's high watermark."""
        c = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"log-{time.monotonic_ns()}",
                "enable.auto.commit": False,
                "logger": quiet_logger(),
            }
        )
        try:
            ends = {
                p: c.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10)[1]
                for p in range(self.partitions)
            }
            c.assign([TopicPartition(self.topic, p, 0) for p in range(self.partitions)])
            out: dict[tuple[int, int], bytes] = {}
            deadline = time.monotonic() + timeout
            while any(sum(1 for q, _o in out if q == p) < n for p, n in ends.items()):
                assert time.monotonic() < deadline, (
                    f"read {len(out)} of {sum(ends.values())} records of {self.topic}"
                )
                for m in c.consume(1000, 0.5):
                    if m.error() is None:
                        out[(m.partition(), m.offset())] = m.value()
            return out
        finally:
            c.close()

    def analysis(self, t_end: float, log: Mapping[tuple[int, int], bytes]) -> dict[str, Any]:
        """What the run's timeline says (:func:`failover_analysis`), a record being a (partition,
        offset) of ``log`` (:meth:`read_log`): a record the producer wrote twice (at two offsets)
        is two records, each to be delivered once. Available: when the producer's report said the
        cluster had it (the consumers' start, for the records before)."""
        assert self.consumers_started is not None
        for w in self.windows:
            if w["end"] is None:
                w["end"] = t_end

        def key(p: int, o: int) -> int:
            return p << 40 | o

        available = {
            key(p, o): max(
                self.reported.get(int(v[:8]), (self.consumers_started,))[0], self.consumers_started
            )
            for (p, o), v in log.items()
        }
        acks = [(self.sent[i], t) for i, (t, _p, _o) in self.reported.items()]
        deliveries = [(t, key(p, o), p) for t, _rid, p, o, _v in self.deliveries()]
        res = failover_analysis(deliveries, available, self.windows, acks, t_end)
        res["longest_stall_s"] = max((b - a for a, b in res["stalls"]), default=0.0)
        # the same for each partition alone: how long its records waited while the consumers took
        # none of it (other partitions' records may have been delivered meanwhile)
        per_part: dict[int, list[tuple[float, float]]] = {}
        for p in range(self.partitions):
            mine = {k: a for k, a in available.items() if k >> 40 == p}
            per_part[p] = failover_analysis([d for d in deliveries if d[2] == p], mine, [], [], t_end)[
                "stalls"
            ]
        for w in res["windows"]:
            w["partition_stall_s"] = max(
                (overlap_max(per_part[p], w["start"], w["end"]) for p in w["partitions"]), default=math.nan
            )
        res["partition_stall_s"] = max((b - a for st in per_part.values() for a, b in st), default=0.0)
        t0 = self.windows[0]["start"] if self.windows else self.consumers_started
        res["partition_stalls"] = {
            p: max(((round(b - a, 1), round(a - t0, 1)) for a, b in st), default=(0.0, None))
            for p, st in per_part.items()
        }
        return res

    def not_in_log(self, log: Mapping[tuple[int, int], bytes]) -> list[tuple[int, int, bytes]]:
        """Deliveries of a (partition, offset) the log does not hold, or holds with another value:
        what a stale replica serving old or other data would give."""
        return [(p, o, v[:16]) for _t, _rid, p, o, v in self.deliveries() if log.get((p, o)) != v]

    def acknowledged_not_in_log(self, log: Mapping[tuple[int, int], bytes]) -> list[int]:
        """Records the cluster acknowledged that are not where their delivery report put them."""
        return [i for i, (_t, p, o) in self.reported.items() if log.get((p, o)) != self.value(i)]

    def misplaced(self, log: Mapping[tuple[int, int], bytes], ids: Iterable[int]) -> list[str]:
        """For records not where their delivery report put them: the report, what the log holds
        there, and where the record is."""
        where: dict[int, list[tuple[int, int]]] = {}
        for po, v in log.items():
            where.setdefault(int(v[:8]), []).append(po)
        out = []
        for i in ids:
            _t, p, o = self.reported[i]
            there = log.get((p, o))
            out.append(
                f"record {i}: reported at {p}/{o}, the log holds there "
                f"{'nothing' if there is None else there[:8]!r}, the record is at {sorted(where.get(i, []))}"
            )
        return out


def histograms(metrics_port: int) -> dict[str, dict[float, float]]:
    """The proxy's state-write latency and ShareFetch latency histograms now, cumulative counts by
    upper bound (``le``; ``inf`` the count), from its Prometheus page."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30).read().decode()
    wanted = {
        "state write": ("kshare_state_write_seconds_bucket{", ""),
        "ShareFetch": ("kshare_request_seconds_bucket{", 'api="ShareFetch"'),
    }
    out: dict[str, dict[float, float]] = {k: {} for k in wanted}
    for line in text.splitlines():
        for what, (prefix, label) in wanted.items():
            if line.startswith(prefix) and label in line:
                le = line.split('le="', 1)[1].split('"', 1)[0]
                out[what][math.inf if le == "+Inf" else float(le)] = float(line.rsplit(" ", 1)[1])
    return out


def latency_between(before: Mapping[float, float], after: Mapping[float, float]) -> str:
    """What a histogram's counts between two snapshots say: how many, and the slowest bucket
    reached (``<= 0.5 s``; ``> 10 s`` past the last bound)."""
    delta = {le: after.get(le, 0.0) - before.get(le, 0.0) for le in after}
    n = delta.get(math.inf, 0.0)
    if not n:
        return "none"
    slowest = min((le for le, c in delta.items() if c >= n), default=math.inf)
    if slowest == math.inf:
        last = max((le for le in delta if le != math.inf), default=0.0)
        return f"{n:.0f}, {n - delta.get(last, 0.0):.0f} of them > {last:g} s"
    below = max((le for le in delta if le < slowest), default=0.0)
    return f"{n:.0f}, slowest in ({below:g}, {slowest:g}] s ({n - delta.get(below, 0.0):.0f} of them)"


def epoch_bumps(producer_log: Path) -> tuple[int, int]:
    """(requests failed for skipped sequence numbers, epoch bumps) in a producer's idempotence log
    (librdkafka: a request behind a failed one meets OUT_OF_ORDER_SEQUENCE_NUMBER at the new leader,
    and the producer bumps its epoch; a record of another partition whose first attempt was
    possibly written is then written again: confluentinc/librdkafka#4953)."""
    text = producer_log.read_text() if producer_log.exists() else ""
    return text.count("skipped sequence numbers (PID"), text.count("bumped epoch to")


def written_twice(log: Mapping[tuple[int, int], bytes]) -> dict[int, list[tuple[int, int]]]:
    """Record id -> its (partition, offset)s, of the records the producer wrote more than once."""
    where: dict[int, list[tuple[int, int]]] = {}
    for po, v in sorted(log.items()):
        where.setdefault(int(v[:8]), []).append(po)
    return {i: pos for i, pos in where.items() if len(pos) > 1}


def report(test: str, res: dict[str, Any], extra: Mapping[str, object] = ()) -> str:
    """The per-fault figures of a run, printed (``pytest -s``) and returned."""
    rows = [
        f"[{test}] {res['records']} records in the topic, {res['delivered']} delivered, "
        f"{res['lost']} lost, {res['deliveries']} deliveries ({res['redeliveries']} redeliveries), "
        f"longest stall {res['longest_stall_s']:.1f} s (of one partition {res['partition_stall_s']:.1f} s), "
        f"producer's longest gap {res['producer_longest_gap_s']:.1f} s"
    ]
    rows += [f"[{test}]   {k}: {v}" for k, v in dict(extra).items()]
    rows.append(
        f"[{test}]   longest stall of each partition (seconds, from seconds after the first fault): "
        f"{res['partition_stalls']}"
    )
    for w in res["windows"]:
        rows.append(
            f"[{test}]   {w['name']:<28} {w['end'] - w['start']:6.1f} s: first record "
            f"{w.get('first_record_s', float('nan')):.2f} s after, of its partitions "
            f"{w.get('first_record_of_its_partitions_s', float('nan')):.2f} s; "
            f"{w['deliveries']} deliveries, {w['redeliveries']} redeliveries, "
            f"longest stall {w['longest_stall_s']:.1f} s (of its partitions {w['partition_stall_s']:.1f} s), "
            f"producer longest wait {w['producer_longest_wait_s']:.1f} s"
        )
    text = "\n".join(rows)
    print(text, flush=True)
    log.info("%s", text)
    return text
