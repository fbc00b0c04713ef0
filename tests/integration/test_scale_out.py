"""Several kshare proxies as one service (issue 12, docs/design/scale-out.md): three ``python -m kshare
proxy --instance-group NAME`` child processes in front of the session's Apache Kafka 3.9 broker,
splitting the state topic's partitions through the consumer group ``kshare-instances.<NAME>``.

Every test starts its own three proxies (distinct bootstrap, broker-listener and metrics ports),
with a state topic, instance group, data topic and share group of its own, and consumes with
librdkafka ``ShareConsumer``s bootstrapped from all three proxies. The consumers and the ledger of
what was delivered and confirmed are ``test_crash_recovery``'s (``AckingConsumer``, ``Ledger``,
``judge``): a record is *confirmed* once librdkafka reported its acknowledgement successful, and a
confirmed record must never be delivered again, whatever happens to any proxy.

What a fault may deliver again (the tests' bounds): records *acquired* through the proxy that
lost a share-partition (acquisitions are not persisted, KIP-932) and not yet confirmed -- per
consumer and per ownership move at most ``INFLIGHT_LIMIT`` (``test_crash_recovery``: one
ShareFetch the application holds plus one fetched in the background, each at most
``max.poll.records`` plus the rest of an upstream producer batch).

How the tests read a share-partition's start offset (SPSO): while several proxies run, from the
``kshare_share_partition_spso`` gauge of the proxy that owns the share-partition's state partition
(``/ready`` names them); at the end of a fault test from DescribeShareGroupOffsets through one
proxy (the group's coordinator asks the others for the state they hold), and then, durably, from
the one proxy left after the others were stopped with SIGTERM (it then owns, and replayed, every
state partition).

``KSHARE_SCALE_OUT_LOGS=<dir>`` keeps every proxy's whole output there (failure messages show only
their warnings and errors).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families

from kshare.proxy.virtual import split_node
from kshare.share import state_codec as sc
from kshare.share.store import SharePartitionKey
from kshare.tools.admin_client import ShareGroupAdmin
from tests.harness.brokers import KafkaBroker, free_port
from tests.harness.share import admin, quiet_logger, share_group, wait_until
from tests.integration.test_crash_recovery import (
    BATCH_RECORDS,
    GROUP_CONFIGS,
    INFLIGHT_LIMIT,
    AckingConsumer,
    KShareProcess,
    Ledger,
    _topic_id_direct,
    describe_offsets,
    end_offsets,
    judge,
    produce_fast,
)

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

    def _get(self, path: str) -> tuple[int, str] | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}{path}", timeout=2) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:  # 503 while not ready: the body says why
            return exc.code, exc.read().decode()
        except OSError:
            return None

    def ready(self) -> dict[str, Any] | None:
        got = self._get("/ready")
        return None if got is None else json.loads(got[1])

    def owned(self) -> frozenset[int] | None:
        r = self.ready()
        return None if r is None or not r.get("ready") else frozenset(r.get("state_partitions", ()))

    def samples(self, name: str) -> list[tuple[dict[str, str], float]]:
        """(labels, value) of every sample called ``name`` in /metrics."""
        got = self._get("/metrics")
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
                p.current.signal(signal.SIGCONT)
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
                p.current.signal(signal.SIGTERM)
                assert p.current.wait(30) == 0, p.output()
        self.wait(lambda: survivor.owned() == frozenset(range(STATE_PARTITIONS)), 60,
                  f"proxy {survivor.index} to own every state partition", survivor.ready)


def state_partition(group: str, tid: bytes, partition: int) -> int:
    return sc.partition_for(SharePartitionKey(group, tid, partition), STATE_PARTITIONS)


def live_spso(svc: Service, group: str, topic: str, tid: bytes) -> dict[int, int | None]:
    """partition -> SPSO as the share-partition's current owner shows it (None: unknown)."""
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
    return asyncio.run(_topic_id_direct(broker.bootstrap, topic))


def start_consumers(svc: Service, group: str, topic: str, ledger: Ledger) -> list[AckingConsumer]:
    return [AckingConsumer(i, svc.bootstrap, group, topic, ledger).start() for i in range(CONSUMERS)]


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


@pytest.fixture
def group() -> str:
    return f"share-{uuid.uuid4().hex[:12]}"


# ------------------------------------------------------------------------------------------------
# 1. the split, and consumption as through one proxy


def test_split_and_consume_like_one_proxy(kafka39, topic_name, group):
    """Three proxies split the 6 state partitions: each owns at least one (2 each: balanced), none
    is owned twice, all are owned, on one ownership epoch. Metadata from each proxy alone lists 3
    brokers (one per proxy for the single upstream broker, node ids slot * 2^20 + broker) and the
    same leader for every partition: the listener of the proxy owning the partition's state
    partition; FindCoordinator through each proxy names the same coordinator, a listener of the
    proxy owning the group's state partition. Three ShareConsumers bootstrapped from all three get
    each of 3,000 records exactly once (no fault: no redelivery), each proxy delivered exactly
    the records of the share-partitions it owns, and every SPSO reaches its end offset."""
    n = 3000
    kafka39.create_topic(topic_name, partitions=PARTITIONS)
    produce_fast(kafka39.bootstrap, topic_name, n, PARTITIONS)
    ends = end_offsets(kafka39.bootstrap, topic_name, PARTITIONS)
    tid = topic_id_of(kafka39, topic_name)
    svc = Service(kafka39, "split")
    ledger = Ledger()
    consumers: list[AckingConsumer] = []
    try:
        owned = svc.start()
        epoch = svc.proxies[0].ready()["ownership_epoch"]  # type: ignore[index]
        assert all(len(s) >= 1 for s in owned.values()), owned
        assert sorted(s for o in owned.values() for s in o) == list(range(STATE_PARTITIONS)), owned
        owner_of = {s: i for i, o in owned.items() for s in o}
        by_port = {p.listener_port: p.index for p in svc.proxies}

        # Metadata: every proxy shows the same virtual cluster
        leaders = {}
        for p in svc.proxies:
            md = admin(p.bootstrap).list_topics(topic_name, timeout=15)
            brokers = {b.id: (b.host, b.port) for b in md.brokers.values()}
            assert len(brokers) == PROXIES * 1, (p.index, brokers)  # one upstream broker
            assert {split_node(b)[1] for b in brokers} == {kafka39.node_id}, brokers
            assert {port for _, port in brokers.values()} == set(by_port), (brokers, by_port)
            parts = md.topics[topic_name].partitions
            assert sorted(parts) == list(range(PARTITIONS)), parts
            leaders[p.index] = {i: (parts[i].leader, brokers[parts[i].leader]) for i in parts}
            for i in parts:
                expected = owner_of[state_partition(group, tid, i)]
                assert by_port[brokers[parts[i].leader][1]] == expected, (p.index, i, leaders[p.index], owned)
        assert leaders[0] == leaders[1] == leaders[2], leaders

        share_group(svc.proxies[0].bootstrap, group, **GROUP_CONFIGS)

        # FindCoordinator: the same answer from every proxy, the group's owner
        coordinators = {p.index: asyncio.run(_coordinator(p.bootstrap, group)) for p in svc.proxies}
        assert len(set(coordinators.values())) == 1, coordinators
        group_owner = svc.proxies[owner_of[sc.partition_for_group(group, STATE_PARTITIONS)]]
        assert coordinators[0][2] in (group_owner.port, group_owner.listener_port), (coordinators, owned)

        consumers = start_consumers(svc, group, topic_name, ledger)
        finish(svc, ledger, group, topic_name, tid, ends, 90)
    finally:
        stop_consumers(consumers)
    try:
        served = {p.index: sum(int(v) for labels, v in p.samples("kshare_share_deliveries_total")
                               if labels.get("group") == group) for p in svc.proxies}
        gauges = {p.index: p.samples("kshare_instance_state_partitions") for p in svc.proxies}
        epochs = {p.index: p.ready()["ownership_epoch"] for p in svc.proxies}  # type: ignore[index]
    finally:
        svc.stop()
    state = ledger_state(ledger, ends) | {"served": served, "owned": owned, "epochs": epochs}
    print("split:", json.dumps(state, default=sorted))
    for c in consumers:
        assert not c.errors, (c.index, c.errors)
    assert set(epochs.values()) == {epoch}, (epochs, epoch)  # no ownership change meanwhile
    assert {i: [v for _, v in g] for i, g in gauges.items()} == {i: [len(o)] for i, o in owned.items()}, gauges
    assert sorted((d.partition, d.offset) for d in ledger.deliveries) == sorted(
        (p, o) for p, end in ends.items() for o in range(end)), state  # each exactly once
    assert len(ledger.confirmed) == n, state
    expected_served = {i: sum(end for part, end in ends.items() if state_partition(group, tid, part) in o)
                       for i, o in owned.items()}
    assert served == expected_served, state
    assert not svc.tracebacks(), "\n".join(svc.tracebacks())


async def _coordinator(bootstrap: str, group: str) -> tuple[int, str, int]:
    host, _, port = bootstrap.rpartition(":")
    async with ShareGroupAdmin([(host, int(port))], timeout_ms=15000) as a:
        node = await a.coordinator(group, fresh=True)
        return node.node_id, node.host, node.port


# ------------------------------------------------------------------------------------------------
# 2. SIGKILL of one proxy under load


def test_sigkill_one_proxy_under_load(kafka39, topic_name, group):
    """1,200 records, then 300 a second, over 6 partitions; 3 explicit-mode ShareConsumers
    (bootstrapped from all three proxies) accept and commit everything. The proxy owning the most
    of the topic's share-partitions is SIGKILLed. The other two take its state partitions over
    once its instance-group session (6 s) expires, and the consumers go on through them.

    May be delivered again: only what was acquired through the killed proxy and not confirmed
    (at most INFLIGHT_LIMIT per consumer). Asserted: every record delivered; no confirmed record
    delivered again; no redelivery before the kill and at most CONSUMERS x INFLIGHT_LIMIT after;
    every partition delivers again within 30 s of the kill (session timeout + replay + slack);
    every SPSO reaches its end offset: DescribeShareGroupOffsets through a survivor says so, and
    so does the last proxy after SIGTERM of the other survivor (it then owns and replayed every
    state partition)."""
    backlog = 1200
    kafka39.create_topic(topic_name, partitions=PARTITIONS)
    produce_fast(kafka39.bootstrap, topic_name, backlog, PARTITIONS)
    tid = topic_id_of(kafka39, topic_name)
    svc = Service(kafka39, "kill")
    ledger = Ledger()
    consumers: list[AckingConsumer] = []
    load: SteadyProducer | None = None
    report: dict[str, Any] = {}
    try:
        before = svc.start()
        share_group(svc.proxies[0].bootstrap, group, **GROUP_CONFIGS)
        consumers = start_consumers(svc, group, topic_name, ledger)
        load = SteadyProducer(kafka39.bootstrap, topic_name, start=backlog).start()
        svc.wait(lambda: ledger.confirmed_count() >= backlog, 60, "the backlog confirmed", lambda: ledger_state(ledger))
        victim = busiest(svc, group, tid)
        survivors = [p for p in svc.proxies if p is not victim]
        killed_at = time.monotonic()
        victim.kill()
        after = svc.wait_balanced(survivors, SESSION_MS / 1000 + 30)
        takeover_s = time.monotonic() - killed_at
        # keep producing well past the take-over: the survivors serve under load
        time.sleep(max(0.0, killed_at + SESSION_MS / 1000 + 8 - time.monotonic()))
        n = load.stop()
        load = None
        ends = end_offsets(kafka39.bootstrap, topic_name, PARTITIONS)
        assert sum(ends.values()) == n
        finish(svc, ledger, group, topic_name, tid, ends)
        stop_consumers(consumers)
        gaps = largest_gaps(ledger, killed_at)
        spread = describe_offsets(survivors[1].bootstrap, group)  # the survivors hold the state between them
        svc.last_one_standing(survivors[0])
        final = describe_offsets(survivors[0].bootstrap, group)
        report.update({"records": n, "victim": victim.index, "owned_before": before, "owned_after": after,
                       "takeover_s": round(takeover_s, 1), "gaps_s": gaps} | ledger_state(ledger))
    finally:
        if load is not None:
            load.stop()
        stop_consumers(consumers)
        svc.stop()
    for c in consumers:
        assert not c.errors, (c.index, c.errors)
    assert spread == ends, (spread, ends, svc.digest())
    assert final == ends, (final, ends, svc.digest())
    check_ledger(ledger, ends, [killed_at], report, per_fault=1)
    assert max(gaps.values()) < 30, (report, svc.digest())
    assert not svc.tracebacks(), "\n".join(svc.tracebacks())


# ------------------------------------------------------------------------------------------------
# 3. SIGSTOP past the session timeout, then SIGCONT


def test_sigstop_past_session_then_sigcont(kafka39, topic_name, group):
    """Under the same load, the proxy owning the most of the topic's share-partitions is
    SIGSTOPped for 15 s (past its 6 s instance-group session): the other two take its state
    partitions over (fencing its transactional state writers). Then SIGCONT: the resumed proxy,
    which still holds the old state in memory, must not serve or write what it lost -- its
    writes are refused ("was taken over by another proxy") or it learns the new map first ("gave
    up state partition"); it rejoins and the three split the state partitions again. Production
    goes on for 6 s after the resumption.

    May be delivered again: what was acquired through the paused proxy and not confirmed (at
    most INFLIGHT_LIMIT per consumer at the take-over, and as much again for what the resumed
    proxy held when it learnt it lost its partitions). Asserted: every record delivered, no
    confirmed record delivered again, no redelivery before the pause, at most 2 x CONSUMERS x
    INFLIGHT_LIMIT redeliveries, the group consumes what is produced after the resumption, every
    SPSO reaches its end offset (through a proxy, and durably, as in the SIGKILL test)."""
    backlog = 1200
    kafka39.create_topic(topic_name, partitions=PARTITIONS)
    produce_fast(kafka39.bootstrap, topic_name, backlog, PARTITIONS)
    tid = topic_id_of(kafka39, topic_name)
    svc = Service(kafka39, "stop")
    ledger = Ledger()
    consumers: list[AckingConsumer] = []
    load: SteadyProducer | None = None
    report: dict[str, Any] = {}
    try:
        before = svc.start()
        share_group(svc.proxies[0].bootstrap, group, **GROUP_CONFIGS)
        consumers = start_consumers(svc, group, topic_name, ledger)
        load = SteadyProducer(kafka39.bootstrap, topic_name, start=backlog).start()
        svc.wait(lambda: ledger.confirmed_count() >= backlog, 60, "the backlog confirmed", lambda: ledger_state(ledger))
        victim = busiest(svc, group, tid)
        survivors = [p for p in svc.proxies if p is not victim]
        stopped_at = time.monotonic()
        victim.current.signal(signal.SIGSTOP)
        victim.paused = True
        during = svc.wait_balanced(survivors, SESSION_MS / 1000 + 30)
        takeover_s = time.monotonic() - stopped_at
        time.sleep(max(0.0, stopped_at + 15 - time.monotonic()))
        mark = len(victim.current.output)
        resumed_at = time.monotonic()
        victim.current.signal(signal.SIGCONT)
        victim.paused = False
        after = svc.wait_balanced(svc.proxies, 60)
        rebalanced_at = time.monotonic()
        rebalanced_s = rebalanced_at - resumed_at
        produced_at_resume = load.next
        time.sleep(6)
        n = load.stop()
        load = None
        ends = end_offsets(kafka39.bootstrap, topic_name, PARTITIONS)
        assert sum(ends.values()) == n
        finish(svc, ledger, group, topic_name, tid, ends)
        stop_consumers(consumers)
        fence_lines = [line for line in victim.lines_since(mark) if any(s in line for s in FENCE_LINES)]
        late = sum(1 for d in ledger.deliveries if d.at > rebalanced_at)
        spread = describe_offsets(victim.bootstrap, group)  # the three hold the state between them
        svc.last_one_standing(survivors[0])
        final = describe_offsets(survivors[0].bootstrap, group)
        report.update({"records": n, "victim": victim.index, "owned_before": before, "owned_during": during,
                       "owned_after": after, "takeover_s": round(takeover_s, 1),
                       "rebalanced_after_resume_s": round(rebalanced_s, 1), "produced_at_resume": produced_at_resume,
                       "deliveries_after_resume": late, "fence_lines": fence_lines} | ledger_state(ledger))
    finally:
        if load is not None:
            load.stop()
        stop_consumers(consumers)
        svc.stop()
    for c in consumers:
        assert not c.errors, (c.index, c.errors)
    assert fence_lines, ("the resumed proxy never said it lost its state partitions", report,
                         "".join(victim.lines_since(mark)[-80:]))
    assert late > 0, report  # the three consumed together again
    assert spread == ends, (spread, ends, svc.digest())
    assert final == ends, (final, ends, svc.digest())
    check_ledger(ledger, ends, [stopped_at, resumed_at], report, per_fault=2)
    assert not svc.tracebacks(), "\n".join(svc.tracebacks())


# ------------------------------------------------------------------------------------------------
# 4. rolling restart with SIGTERM


def test_sigterm_rolling_restart_under_load(kafka39, topic_name, group):
    """Under the same load, each proxy in turn is stopped with SIGTERM (it finishes its state
    writes and leaves the instance group, so the others take over at once), and once the other
    two split its state partitions it is started again on the same ports and the three split
    them again (so each restart moves state partitions twice).

    May be delivered again: what was acquired through a proxy giving a share-partition up and not
    confirmed (at most INFLIGHT_LIMIT per consumer per ownership move). Asserted: every record
    delivered; no confirmed record delivered again; no redelivery before the first stop, at most
    6 x CONSUMERS x INFLIGHT_LIMIT in all; no partition goes more than 10 s without a delivery
    from the first stop on; every SPSO reaches its end offset (through a proxy, and durably, as in the SIGKILL test)."""
    backlog = 1200
    kafka39.create_topic(topic_name, partitions=PARTITIONS)
    produce_fast(kafka39.bootstrap, topic_name, backlog, PARTITIONS)
    tid = topic_id_of(kafka39, topic_name)
    svc = Service(kafka39, "roll")
    ledger = Ledger()
    consumers: list[AckingConsumer] = []
    load: SteadyProducer | None = None
    report: dict[str, Any] = {}
    moves: list[float] = []
    timings: list[dict[str, float]] = []
    try:
        svc.start()
        share_group(svc.proxies[0].bootstrap, group, **GROUP_CONFIGS)
        consumers = start_consumers(svc, group, topic_name, ledger)
        load = SteadyProducer(kafka39.bootstrap, topic_name, start=backlog).start()
        svc.wait(lambda: ledger.confirmed_count() >= backlog, 60, "the backlog confirmed", lambda: ledger_state(ledger))
        for p in svc.proxies:
            time.sleep(2.0)
            others = [q for q in svc.proxies if q is not p]
            t0 = time.monotonic()
            moves.append(t0)
            p.current.signal(signal.SIGTERM)
            assert p.current.wait(30) == 0, p.output()
            exited = time.monotonic()
            svc.wait_balanced(others, 30)
            handed = time.monotonic()
            moves.append(handed)
            p.start(120)
            svc.wait_balanced(svc.proxies, 60)
            timings.append({"exit_s": round(exited - t0, 2), "taken_over_s": round(handed - t0, 2),
                            "back_s": round(time.monotonic() - handed, 2)})
        time.sleep(3.0)
        n = load.stop()
        load = None
        ends = end_offsets(kafka39.bootstrap, topic_name, PARTITIONS)
        assert sum(ends.values()) == n
        finish(svc, ledger, group, topic_name, tid, ends)
        stop_consumers(consumers)
        gaps = largest_gaps(ledger, moves[0])
        survivor = svc.proxies[0]
        spread = describe_offsets(svc.proxies[2].bootstrap, group)  # the three hold the state between them
        svc.last_one_standing(survivor)
        final = describe_offsets(survivor.bootstrap, group)
        report.update({"records": n, "restarts": timings, "gaps_s": gaps} | ledger_state(ledger))
    finally:
        if load is not None:
            load.stop()
        stop_consumers(consumers)
        svc.stop()
    for c in consumers:
        assert not c.errors, (c.index, c.errors)
    assert spread == ends, (spread, ends, svc.digest())
    assert final == ends, (final, ends, svc.digest())
    check_ledger(ledger, ends, moves, report, per_fault=len(moves))
    assert max(gaps.values()) < 10, (report, svc.digest())
    assert not svc.tracebacks(), "\n".join(svc.tracebacks())


# ------------------------------------------------------------------------------------------------
# 5. admin from any proxy


@pytest.fixture(scope="module")
def consumed(kafka39: KafkaBroker) -> Iterator[tuple[Service, str, str, dict[int, int], bytes]]:
    """Three proxies, a group whose 3 consumers (still subscribed) consumed 600 records of a
    6-partition topic: (service, group, topic, end offsets, topic id)."""
    topic = f"scale-admin-{uuid.uuid4().hex[:8]}"
    group = f"share-{uuid.uuid4().hex[:12]}"
    kafka39.create_topic(topic, partitions=PARTITIONS)
    produce_fast(kafka39.bootstrap, topic, 600, PARTITIONS)
    ends = end_offsets(kafka39.bootstrap, topic, PARTITIONS)
    tid = topic_id_of(kafka39, topic)
    svc = Service(kafka39, "admin")
    ledger = Ledger()
    consumers: list[AckingConsumer] = []
    try:
        svc.start()
        share_group(svc.proxies[0].bootstrap, group, **GROUP_CONFIGS)
        consumers = start_consumers(svc, group, topic, ledger)
        finish(svc, ledger, group, topic, tid, ends, 90)
        svc.wait(lambda: len(_cli(svc.proxies[0], "--members", group)[0]["members"]) == CONSUMERS, 30,
                 "every consumer a member", lambda: _cli(svc.proxies[0], "--members", group))
        yield svc, group, topic, ends, tid
    finally:
        stop_consumers(consumers)
        svc.stop()


def _cli(p: Member, view: str, group: str) -> Any:
    r = subprocess.run([sys.executable, "-m", "kshare", "groups", "--bootstrap-server", p.bootstrap, "--describe",
                        "--group", group, view, "--output", "json", "--timeout", "15000"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, (p.index, view, r.stdout, r.stderr)
    return json.loads(r.stdout)


def test_admin_from_any_proxy_agrees(consumed):
    """``kshare groups --describe --group G`` (--state, --members, --offsets) run against each
    proxy alone gives the same answer: the group is Stable with the 3 consumers as members, the
    same coordinator (a listener of the proxy owning the group's state partition), and the same
    offsets document."""
    svc, group, topic, _ends, _tid = consumed
    answers: dict[str, dict[int, Any]] = {}
    for view in ("--state", "--members", "--offsets"):
        for _attempt in range(5):  # a member's heartbeat may land between two answers: ask again
            answers[view] = {p.index: _cli(p, view, group) for p in svc.proxies}
            if answers[view][0] == answers[view][1] == answers[view][2]:
                break
            time.sleep(1.0)
    for view, by_proxy in answers.items():
        assert by_proxy[0] == by_proxy[1] == by_proxy[2], (view, by_proxy)
    state = answers["--state"][0][0]
    assert state["state"] == "Stable" and state["members"] == CONSUMERS, state
    owner = svc.owner(sc.partition_for_group(group, STATE_PARTITIONS))
    assert owner is not None and state["coordinator"]["port"] in (owner.port, owner.listener_port), (state, owner)
    members = answers["--members"][0][0]["members"]
    assert len(members) == CONSUMERS, members
    assigned = sorted(p for m in members for p in m["assignment"].get(topic, []))
    assert set(assigned) == set(range(PARTITIONS)), members
    offsets = answers["--offsets"][0][0]["offsets"]
    assert sorted(o["partition"] for o in offsets) == list(range(PARTITIONS)), offsets
    assert not svc.tracebacks(), "\n".join(svc.tracebacks())


def test_admin_offsets_from_any_proxy(consumed):
    """DescribeShareGroupOffsets (ShareGroupAdmin.describe_offsets) through each proxy alone: every
    partition's SPSO at its end offset, whichever proxy holds the partition's state (the group's
    coordinator asks the share-partition leaders, as Kafka's asks its share coordinators)."""
    svc, group, _topic, ends, tid = consumed
    answers = {p.index: describe_offsets(p.bootstrap, group) for p in svc.proxies}
    owner = svc.owner(sc.partition_for_group(group, STATE_PARTITIONS))
    assert owner is not None
    elsewhere = sorted(part for part in range(PARTITIONS)
                       if state_partition(group, tid, part) not in (owner.owned() or ()))
    assert all(a == ends for a in answers.values()), (answers, ends, f"coordinator: proxy {owner.index}, "
                                                      f"partitions with state elsewhere: {elsewhere}", svc.digest())
    assert not svc.tracebacks(), "\n".join(svc.tracebacks())
