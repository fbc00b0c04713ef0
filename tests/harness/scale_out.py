"""Several kshare proxies as one service (an instance group), for the scale-out tests: three
``python -m kshare proxy --instance-group NAME`` child processes (:class:`Member`, a
:class:`~tests.harness.proxies.KShareProcess` with a metrics port) in front of one broker, the
consumers and ledger of :mod:`kshare.bench.ledgers`, a steady producer, and the checks on the
ledger after a fault."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families

from kshare.bench.ledgers import AckingConsumer, Ledger, judge
from kshare.bench.procs import http_get, proxy_ready
from kshare.share.state import codec as sc
from kshare.share.store import SharePartitionKey
from tests.harness.brokers import KafkaBroker, free_port
from tests.harness.ledgers import (
    BATCH_RECORDS,
    INFLIGHT_LIMIT,
    produce_fast,
    topic_id_direct,
)
from tests.harness.proxies import KShareProcess
from tests.harness.share import quiet_logger, wait_until

PROXIES = 3
CONSUMERS = 3
PARTITIONS = 6  # of the data topic
STATE_PARTITIONS = 6
SESSION_MS = 6000  # --instance-session-timeout-ms
RATE = 300  # records per second produced while a fault happens
FENCE_LINES = ("was taken over by another proxy", "gave up state partition")


# ------------------------------------------------------------------------------------------------
# three proxies as one service


class Member(KShareProcess):
    """One proxy of the instance group: ``KShareProcess`` (fixed ports, every incarnation kept)
    with the instance-group options and a metrics port for ``/ready`` and ``/metrics``."""

    def __init__(self, broker: KafkaBroker, state_topic: str, instance_group: str, index: int) -> None:
        self.index = index
        self.metrics_port = free_port()
        super().__init__(broker, state_topic, "--state-topic-partitions", str(STATE_PARTITIONS),
                         "--instance-group", instance_group, "--instance-session-timeout-ms", str(SESSION_MS),
                         "--metrics-port", str(self.metrics_port), "--metrics-host", "127.0.0.1")
        # the listener standing for the upstream broker (KShareProcess passes base = port - node id)
        self.listener_port = int(self.args[self.args.index("--broker-port-base") + 1]) + broker.node_id
        self.paused = False  # SIGSTOPped

    @property
    def alive(self) -> bool:
        return bool(self.incarnations) and self.current.process is not None and self.current.process.poll() is None

    def ready(self) -> dict[str, Any] | None:
        return proxy_ready(self.metrics_port)

    def owned(self) -> frozenset[int] | None:
        r = self.ready()
        return None if r is None or not r.get("ready") else frozenset(r.get("state_partitions", ()))

    def samples(self, name: str) -> list[tuple[dict[str, str], float]]:
        """(labels, value) of every sample called ``name`` in /metrics."""
        got = http_get(self.metrics_port, "/metrics")
        if got is None or got[0] != 200:
            return []
        return [(s.labels, s.value) for fam in text_string_to_metric_families(got[1]) for s in fam.samples
                if s.name == name]

    def lines_since(self, mark: int) -> list[str]:
        return self.current.output[mark:]


class Service:
    """Three Members with one instance group and state topic (unique to the test)."""

    def __init__(self, broker: KafkaBroker, tag: str) -> None:
        uid = uuid.uuid4().hex[:8]
        self.broker = broker
        self.instance_group = f"scale-{tag}-{uid}"
        self.state_topic = f"__kshare_state_scale_{uid}"
        self.proxies = [Member(broker, self.state_topic, self.instance_group, i) for i in range(PROXIES)]

    @property
    def bootstrap(self) -> str:
        """Every proxy, as the consumers are bootstrapped."""
        return ",".join(p.bootstrap for p in self.proxies)

    def live(self) -> list[Member]:
        return [p for p in self.proxies if p.alive and not p.paused]

    def start(self) -> dict[int, frozenset[int]]:
        """Start the three at once; returns once their ownership is balanced (index -> owned)."""
        errors: list[BaseException] = []

        def run(p: Member) -> None:
            try:
                p.start(120)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(p,)) for p in self.proxies]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, f"{errors}\n{self.digest()}"
        return self.wait_balanced(self.proxies, 60)

    def ownership(self, members: Sequence[Member]) -> dict[int, frozenset[int] | None]:
        return {p.index: p.owned() for p in members}

    def balanced(self, members: Sequence[Member]) -> dict[int, frozenset[int]] | None:
        """index -> owned state partitions, if ``members`` are ready, all on the same ownership
        epoch, and own every state partition exactly once, evenly (else None)."""
        readies = {p.index: p.ready() for p in members}
        if any(r is None or not r.get("ready") for r in readies.values()):
            return None
        if len({r["ownership_epoch"] for r in readies.values()}) != 1:  # type: ignore[index]
            return None
        owned = {i: frozenset(r["state_partitions"]) for i, r in readies.items()}  # type: ignore[index]
        sizes = [len(s) for s in owned.values()]
        if min(sizes) < 1 or max(sizes) - min(sizes) > 1 or sum(sizes) != STATE_PARTITIONS:
            return None
        if frozenset().union(*owned.values()) != frozenset(range(STATE_PARTITIONS)):
            return None
        return owned

    def wait_balanced(self, members: Sequence[Member], timeout: float) -> dict[int, frozenset[int]]:
        def state() -> dict[str, Any]:
            readies = {p.index: p.ready() for p in self.proxies if p.alive}
            claimed = [s for r in readies.values() if r for s in r.get("state_partitions", ())]
            return {"claimed by nobody": sorted(set(range(STATE_PARTITIONS)) - set(claimed)),
                    "claimed twice": sorted({s for s in claimed if claimed.count(s) > 1}), "ready": readies}

        self.wait(lambda: self.balanced(members) is not None, timeout,
                  f"proxies {[p.index for p in members]} to split the state partitions", state)
        owned = self.balanced(members)
        assert owned is not None
        return owned

    def owner(self, state_partition: int, members: Sequence[Member] | None = None) -> Member | None:
        for p in members if members is not None else self.live():
            if state_partition in (p.owned() or ()):
                return p
        return None

    def wait(self, pred: Callable[[], bool], timeout: float, what: str,
             state: Callable[[], object] = lambda: None) -> None:
        """wait_until, failing with ``state()`` and the proxies' warnings and errors."""
        try:
            wait_until(pred, timeout, what, interval=0.2)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nstate: {state()}\n{self.digest()}") from None

    def digest(self) -> str:
        return "".join(f"=== proxy {p.index} (port {p.port}, listener {p.listener_port}) ===\n{p.digest()}"
                       for p in self.proxies)

    def tracebacks(self) -> list[str]:
        """Every traceback in the proxies' output, as the log line before it -> the exception."""
        out = []
        for p in self.proxies:
            for i, inc in enumerate(p.incarnations):
                lines = inc.output
                for j, line in enumerate(lines):
                    if line.startswith("Traceback"):
                        k = j + 1
                        while k < len(lines) and lines[k].startswith((" ", "\t")):
                            k += 1
                        last = lines[k].strip() if k < len(lines) else "?"
                        out.append(f"proxy {p.index} incarnation {i}: {lines[j - 1].strip() if j else ''} -> {last}")
        return out

    def stop(self) -> None:
        for p in self.proxies:
            if p.paused and p.alive:
                p.current.send_signal(signal.SIGCONT)
                p.paused = False
            p.stop()
        where = os.environ.get("KSHARE_SCALE_OUT_LOGS")  # a directory: every proxy's whole output
        if where:
            os.makedirs(where, exist_ok=True)
            for p in self.proxies:
                with open(os.path.join(where, f"{self.instance_group}-proxy{p.index}.log"), "w") as f:
                    f.write(p.output())

    def last_one_standing(self, survivor: Member) -> None:
        """SIGTERM every other live proxy (each must exit 0) and wait until ``survivor`` owns every
        state partition (claimed: fenced and replayed what the others committed)."""
        for p in self.live():
            if p is not survivor:
                p.current.send_signal(signal.SIGTERM)
                assert p.current.wait(30) == 0, p.output()
        self.wait(lambda: survivor.owned() == frozenset(range(STATE_PARTITIONS)), 60,
                  f"proxy {survivor.index} to own every state partition", survivor.ready)


def state_partition(group: str, tid: bytes, partition: int) -> int:
    return sc.partition_for(SharePartitionKey(group, tid, partition), STATE_PARTITIONS)


def by_state_partition() -> bool:
    """Whether the proxies started now lead by state partition (they inherit the environment)."""
    return os.environ.get("KSHARE_INSTANCE_LEADERSHIP", "").strip().lower() == "state-partition"


def live_spso(svc: Service, group: str, topic: str, tid: bytes) -> dict[int, int | None]:
    """partition -> SPSO as the share-partition's current owner shows it (None: unknown).

    Proxies leading by topic (the default; not KSHARE_INSTANCE_LEADERSHIP=state-partition) keep a
    share-partition's state with its leader, wherever it hashes: there, the highest SPSO any live
    proxy shows (an SPSO only moves forward, so a proxy that led it before shows no more than its leader)."""
    if not by_state_partition():
        best: dict[int, int | None] = dict.fromkeys(range(PARTITIONS))
        for p in svc.live():
            for labels, v in p.samples("kshare_share_partition_spso"):
                if labels.get("group") == group and labels.get("topic") == topic:
                    part = int(labels["partition"])
                    best[part] = max(int(v), best[part] if best[part] is not None else -1)
        return best
    owners: dict[int, Member] = {}
    for p in svc.live():
        for s in p.owned() or ():
            owners[s] = p
    rows: dict[int, dict[int, int]] = {}
    out: dict[int, int | None] = {}
    for part in range(PARTITIONS):
        m = owners.get(state_partition(group, tid, part))
        if m is None:
            out[part] = None
            continue
        if m.index not in rows:
            rows[m.index] = {int(labels["partition"]): int(v) for labels, v in m.samples("kshare_share_partition_spso")
                             if labels.get("group") == group and labels.get("topic") == topic}
        out[part] = rows[m.index].get(part)
    return out


def largest_gaps(ledger: Ledger, since: float, partitions: int = PARTITIONS) -> dict[int, float]:
    """Per partition, the longest time without a delivery from ``since`` on (counted from
    ``since`` to the first delivery, then between deliveries)."""
    with ledger.lock:
        times = sorted((d.partition, d.at) for d in ledger.deliveries if d.at >= since)
    out: dict[int, float] = {}
    for part in range(partitions):
        prev, gap = since, 0.0
        ts = [t for p, t in times if p == part]
        if not ts:
            out[part] = float("inf")
            continue
        for t in ts:
            gap, prev = max(gap, t - prev), t
        out[part] = round(gap, 2)
    return out


class SteadyProducer:
    """Records ``b"<i>"`` (i from ``start``) round-robin over the partitions at about ``rate`` per
    second, in producer batches of at most BATCH_RECORDS records, in its own thread."""

    def __init__(self, bootstrap: str, topic: str, *, start: int, rate: float = RATE) -> None:
        self.topic = topic
        self.rate = rate
        self.next = start
        self._start = start
        self.errors: list[Any] = []
        self._stop = threading.Event()
        self._producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                                   "batch.num.messages": BATCH_RECORDS, "acks": "all",
                                   "enable.idempotence": True, "logger": quiet_logger()})
        self._thread = threading.Thread(target=self._run, name="steady-producer", daemon=True)

    def start(self) -> SteadyProducer:
        self._thread.start()
        return self

    def _report(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self.errors.append(err)

    def _run(self) -> None:
        t0 = time.monotonic()
        while not self._stop.is_set():
            due = self._start + int((time.monotonic() - t0) * self.rate)
            while self.next < due:
                try:
                    self._producer.produce(self.topic, str(self.next).encode(), partition=self.next % PARTITIONS,
                                           on_delivery=self._report)
                except BufferError:
                    break
                self.next += 1
            self._producer.poll(0)
            time.sleep(0.02)

    def stop(self) -> int:
        """Stop producing; the number of the next record (every record below it is written)."""
        self._stop.set()
        self._thread.join(30)
        assert self._producer.flush(60) == 0
        assert not self.errors, self.errors[:5]
        return self.next


def topic_id_of(broker: KafkaBroker, topic: str) -> bytes:
    return asyncio.run(topic_id_direct(broker.bootstrap, topic))


def data_topic(broker: KafkaBroker, topic: str, records: int) -> bytes:
    """Create ``topic`` with PARTITIONS partitions and ``records`` records ``b"<i>"`` round-robin
    over them; its topic id."""
    broker.create_topic(topic, partitions=PARTITIONS)
    produce_fast(broker.bootstrap, topic, records, PARTITIONS)
    return topic_id_of(broker, topic)


def start_consumers(svc: Service, group: str, topic: str, ledger: Ledger) -> list[AckingConsumer]:
    """``CONSUMERS`` AckingConsumers bootstrapped from every proxy. With ``KSHARE_SCALE_OUT_LOGS``
    each also writes its librdkafka debug lines (cgrp, broker, fetch, metadata), timed by the
    wall clock (as the proxies' logs are) and ``time.monotonic()`` (as the ledger is), to ``<dir>/<instance group>-consumer<i>.log``."""
    return [AckingConsumer(i, svc.bootstrap, group, topic, ledger, config=_debug_config(svc, i)).start()
            for i in range(CONSUMERS)]


def _debug_config(svc: Service, index: int) -> dict[str, Any]:
    where = os.environ.get("KSHARE_SCALE_OUT_LOGS")
    if not where:
        return {}
    os.makedirs(where, exist_ok=True)
    logger = logging.getLogger(f"tests.scale_out.rdkafka.{svc.instance_group}.{index}")
    handler = logging.FileHandler(os.path.join(where, f"{svc.instance_group}-consumer{index}.log"), "w")
    handler.setFormatter(_MonotonicFormatter("%(created).3f %(monotonic).3f %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    return {"logger": logger, "debug": "cgrp,broker,fetch,metadata", "log_level": 7}


class _MonotonicFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        record.monotonic = time.monotonic()
        return super().format(record)


def stop_consumers(consumers: Sequence[AckingConsumer]) -> None:
    for c in consumers:
        c.stop()


def busiest(svc: Service, group: str, tid: bytes) -> Member:
    """The live proxy owning the most of the topic's share-partitions (ties: the group's coordinator)."""
    group_sp = sc.partition_for_group(group, STATE_PARTITIONS)

    def weight(p: Member) -> tuple[int, bool]:
        owned = p.owned() or frozenset()
        return sum(1 for part in range(PARTITIONS) if state_partition(group, tid, part) in owned), group_sp in owned

    return max(svc.live(), key=weight)


def ledger_state(ledger: Ledger, ends: dict[int, int] | None = None) -> dict[str, Any]:
    with ledger.lock:
        distinct = {(d.partition, d.offset) for d in ledger.deliveries}
        out: dict[str, Any] = {"deliveries": len(ledger.deliveries), "distinct": len(distinct),
                               "confirmed": len(ledger.confirmed), "failed_acks": ledger.failed_acks,
                               "commit_errors": dict(ledger.commit_errors), "poll_errors": dict(ledger.poll_errors),
                               "refused": ledger.refused}
    if ends is not None:
        out["missing"] = sorted((p, o) for p, end in ends.items() for o in range(end) if (p, o) not in distinct)[:20]
    return out


def finish(svc: Service, ledger: Ledger, group: str, topic: str, tid: bytes, ends: dict[int, int],
           timeout: float = 120.0) -> None:
    """Wait until every share-partition's owner shows its SPSO at the end offset, then one more
    second (a redelivery of anything would show up)."""
    svc.wait(lambda: live_spso(svc, group, topic, tid) == ends, timeout, "every SPSO at its end offset",
             lambda: {"spso": live_spso(svc, group, topic, tid), "ends": ends} | ledger_state(ledger, ends))
    time.sleep(1.0)


def check_ledger(ledger: Ledger, ends: dict[int, int], faults: list[float], report: dict[str, Any],
                 per_fault: int) -> None:
    """Nothing lost, nothing confirmed delivered again, no redelivery before the first fault, and at
    most ``per_fault`` x CONSUMERS x INFLIGHT_LIMIT redeliveries in all."""
    v = judge(ledger, ends, faults)
    report.update(v.summary())
    print(json.dumps(report, default=sorted))
    expected = {(p, o) for p, end in ends.items() for o in range(end)}
    got = {(d.partition, d.offset) for d in ledger.deliveries}
    assert got == expected, (sorted(expected - got)[:20], sorted(got - expected)[:20], report)
    assert not v.after_confirmation, (v.after_confirmation[:10], report)
    assert v.per_crash[0] == 0, report  # nothing delivered twice before a fault
    assert v.redeliveries <= per_fault * CONSUMERS * INFLIGHT_LIMIT, report
