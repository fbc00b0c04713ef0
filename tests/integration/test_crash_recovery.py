"""Crash recovery of kshare's durable share state (issue 5): the proxy SIGKILLed under load, restarts
without consumers, the upstream broker restarted under load, damaged records on the state topic.

Everything is real: ``python -m kshare proxy`` as a child process (``tests.harness.proxies.ProxyProcess``)
in front of Apache Kafka 3.9, librdkafka ``ShareConsumer``s (confluent-kafka) or raw share-group
RPCs (``kshare.client.KafkaConnection``). A restarted proxy listens on the same bootstrap *and*
broker ports (``--broker-port-base``), so clients reconnect to the addresses they already know.

What "acknowledged" means here: a consumer in explicit mode acknowledges every record it polled
(ACCEPT) and calls ``commit_sync()``. A record counts as *confirmed* once librdkafka reported its
acknowledgement as successful: ``commit_sync()`` returned ``None`` for its partition, or the
acknowledgement commit callback (``set_acknowledgement_commit_callback``) listed its offset with
no error. kshare answers an acknowledgement only after the state write carrying it was
acknowledged by the cluster (acks=all), so a confirmed record must never be delivered again,
whatever happens to the proxy afterwards.

What may be delivered again after a crash: records that were *acquired* from the crashed proxy
(acquisitions are never persisted, KIP-932) and whose acknowledgement was not confirmed -- records
the application still held, records whose acknowledgement was in flight (the write may even have
landed while the answer was lost: such a record is never redelivered and is never confirmed either,
which the final SPSO check covers), and records librdkafka had fetched but not yet handed out. Per
crash and consumer that is at most one ShareFetch worth: ``max.poll.records`` (librdkafka's
ShareFetch MaxRecords) plus the rest of the last upstream batch (kshare acquires whole producer
batches; the producer here caps them at ``BATCH_RECORDS``), at most twice (the batch the
application holds and one fetched in the background).

Sizes: ``test_proxy_sigkill_under_load`` produces ``KSHARE_CRASH_RECORDS`` records (default 20,000,
about a minute in CI; the issue's 200,000 with ``KSHARE_CRASH_RECORDS=200000``, a few minutes).
``KSHARE_CRASH_SEED`` fixes the random crash moments (printed by every run).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from typing import Any

import pytest
from confluent_kafka import AcknowledgeType, Producer

from kshare.bench.ledgers import AckingConsumer, Ledger, judge
from kshare.clients.connection import KafkaConnection
from kshare.protocol import messages
from kshare.share.state import codec as sc
from kshare.share.states import ShareSnapshot, ShareUpdate
from kshare.share.store import SharePartitionKey
from tests.harness.brokers import KafkaBroker
from tests.harness.ledgers import (
    GROUP_CONFIGS,
    INFLIGHT_LIMIT,
    describe_offsets,
    end_offsets,
    offsets_after_one_more_crash,
    produce_fast,
    spso_reached,
    topic_id_direct,
)
from tests.harness.proxies import KShareProcess
from tests.harness.share import (
    ACCEPT,
    HEARTBEAT,
    REJECT,
    RELEASE,
    SHARE_ACK,
    SHARE_FETCH,
    quiet_logger,
    share_consumer,
    share_group,
    subscribed,
    topic_id,
    wait_until,
)

log = logging.getLogger("kshare.tests.crash")

CRASH_RECORDS = int(os.environ.get("KSHARE_CRASH_RECORDS", "20000"))
CRASH_SEED = int(os.environ.get("KSHARE_CRASH_SEED", str(random.randrange(1 << 30))))
CONSUMERS = 4
PARTITIONS = 4
CRASHES = 3

AVAILABLE, ACKNOWLEDGED, ARCHIVED = 0, 2, 4
RETRIABLE = {14, 15, 16}  # COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR


@pytest.fixture
def group() -> str:
    return f"share-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def state_topic() -> str:
    return f"__kshare_state_crash_{uuid.uuid4().hex[:8]}"


# ------------------------------------------------------------------------------------------------
# 1. the proxy SIGKILLed three times while four consumers acknowledge


def test_proxy_sigkill_under_load(kafka39, topic_name, group, state_topic):
    """``KSHARE_CRASH_RECORDS`` records (20,000 by default, 200,000 on request) over 4 partitions;
    4 explicit-mode ShareConsumers accept and commit_sync everything while kshare is SIGKILLed at
    3 random moments (random points of progress, plus a random delay) and restarted on the same
    ports after a random pause.

    Afterwards: every record was delivered, and acknowledged -- every partition's SPSO is its end
    offset, also after one more SIGKILL and restart; no record whose acknowledgement was confirmed
    was delivered again; every redelivery happened after a crash, and per crash there are at most
    consumers x INFLIGHT_LIMIT of them (what the consumers can hold acquired but not confirmed)."""
    rng = random.Random(CRASH_SEED)
    print(f"\nKSHARE_CRASH_SEED={CRASH_SEED} KSHARE_CRASH_RECORDS={CRASH_RECORDS}")
    kafka39.create_topic(topic_name, partitions=PARTITIONS)
    produce_fast(kafka39.bootstrap, topic_name, CRASH_RECORDS, PARTITIONS)
    ends = end_offsets(kafka39.bootstrap, topic_name, PARTITIONS)
    assert sum(ends.values()) == CRASH_RECORDS

    kshare = KShareProcess(kafka39, state_topic)
    kshare.start()
    ledger = Ledger()
    consumers: list[AckingConsumer] = []
    crash_times: list[float] = []
    downtime: list[float] = []
    t_start = time.monotonic()
    try:
        share_group(kshare.bootstrap, group, **GROUP_CONFIGS)
        consumers = [AckingConsumer(i, kshare.bootstrap, group, topic_name, ledger).start() for i in range(CONSUMERS)]
        marks = sorted(rng.uniform(0.08, 0.8) for _ in range(CRASHES))
        for mark in marks:
            wait_until(lambda m=mark: ledger.confirmed_count() >= m * CRASH_RECORDS, 120 + CRASH_RECORDS / 500,
                       f"{mark:.0%} of the records confirmed", interval=0.005)
            time.sleep(rng.uniform(0, 0.3))
            crash_times.append(time.monotonic())
            kshare.kill()
            time.sleep(rng.uniform(0, 1.5))
            kshare.start()
            downtime.append(time.monotonic() - crash_times[-1])
        wait_until(lambda: spso_reached(kshare.bootstrap, group, ends), 120 + CRASH_RECORDS / 200,
                   "every partition's SPSO at its end offset", interval=1.0)
        consumed_s = time.monotonic() - t_start
        time.sleep(1.0)  # a redelivery of anything would show up now
    finally:
        for c in consumers:
            c.stop()
    final = offsets_after_one_more_crash(kshare, group)  # durable: the SPSOs are still at the end

    v = judge(ledger, ends, crash_times)
    report = v.summary() | {
        "seed": CRASH_SEED, "seconds": round(consumed_s, 1), "downtime_s": [round(d, 2) for d in downtime],
        "load_s": [round(s, 2) for s in kshare.load_seconds], "failed_acks": ledger.failed_acks,
        "commit_errors": dict(ledger.commit_errors), "poll_errors": dict(ledger.poll_errors),
        "refused": ledger.refused, "sync_only": ledger.sync_only}
    print("crash test:", json.dumps(report))
    for c in consumers:
        assert not c.errors, (c.index, c.errors)
    assert len(crash_times) == CRASHES
    assert final == ends, (final, ends)
    assert v.distinct == CRASH_RECORDS, report  # every record delivered at least once
    assert {(d.partition, d.offset) for d in ledger.deliveries} == {
        (p, o) for p, end in ends.items() for o in range(end)}
    assert not v.after_confirmation, (v.after_confirmation[:10], report)
    assert v.per_crash[0] == 0, report  # no redelivery before the first crash
    for n in v.per_crash[1:]:
        assert n <= CONSUMERS * INFLIGHT_LIMIT, report
    # acknowledged but never confirmed: the answer was lost in a crash (the write landed)
    assert v.never_confirmed <= CRASHES * CONSUMERS * INFLIGHT_LIMIT, report
    assert v.max_deliveries <= CRASHES + 1, report
    assert not kshare.tracebacks(), kshare.output()


# ------------------------------------------------------------------------------------------------
# raw share-group RPCs (exact control over what is acquired, released and rejected)


class RawMember:
    """One share-group member speaking the RPCs itself through a KafkaConnection."""

    def __init__(self, conn: KafkaConnection, group: str) -> None:
        self.conn = conn
        self.group = group
        self.member_id = str(uuid.uuid4())
        self.epoch = 0
        self.session = 0
        self.topic_id = b""

    @classmethod
    async def join(cls, bootstrap: str, group: str, topic: str) -> RawMember:
        host, _, port = bootstrap.rpartition(":")
        conn = await KafkaConnection.open(host, int(port), client_id="raw-member")
        self = cls(conn, group)
        self.topic_id = await topic_id(conn, topic)
        Req = messages.message_class("ShareGroupHeartbeatRequest")
        for _ in range(100):
            resp = await conn.request(HEARTBEAT, 1, Req(group_id=group, member_id=self.member_id,
                                                         member_epoch=self.epoch, rack_id=None,
                                                         subscribed_topic_names=[topic] if self.epoch == 0 else None))
            if resp.error_code in RETRIABLE:
                await asyncio.sleep(0.2)
                continue
            assert resp.error_code == 0, resp
            self.epoch = resp.member_epoch
            if resp.assignment is not None and resp.assignment.topic_partitions:
                return self
            await asyncio.sleep(0.1)
        raise AssertionError("no assignment")

    async def fetch(self, partitions: list[int], max_wait_ms: int = 2000, max_records: int = 500,
                    acks: dict[int, list[tuple[int, int, list[int]]]] | None = None) -> dict[int, list[tuple[int, int, int]]]:
        """One ShareFetch; partition -> acquired (first, last, delivery count)."""
        R = messages.message_class("ShareFetchRequest")
        # partitions join the share session with its first fetch; later ones name only acks
        parts = sorted((set(partitions) if self.session == 0 else set()) | set(acks or {}))
        req = R(group_id=self.group, member_id=self.member_id, share_session_epoch=self.session,
                max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=8 << 20, max_records=max_records, batch_size=max_records,
                topics=[R.FetchTopic(topic_id=self.topic_id, partitions=[
                    R.FetchPartition(partition_index=p, acknowledgement_batches=[
                        R.AcknowledgementBatch(first_offset=a, last_offset=z, acknowledge_types=t)
                        for a, z, t in (acks or {}).get(p, [])]) for p in parts])] if parts else [],
                forgotten_topics_data=[])
        resp = await self.conn.request(SHARE_FETCH, 1, req)
        assert resp.error_code == 0, resp
        self.session += 1
        out: dict[int, list[tuple[int, int, int]]] = {}
        for t in resp.responses:
            for p in t.partitions:
                assert p.error_code == 0 and p.acknowledge_error_code == 0, p
                out[p.partition_index] = [(a.first_offset, a.last_offset, a.delivery_count) for a in p.acquired_records]
        return out

    async def acknowledge(self, partition: int, batches: list[tuple[int, int, list[int]]]) -> int:
        """ShareAcknowledge; the partition's error code (answered once durable)."""
        R = messages.message_class("ShareAcknowledgeRequest")
        req = R(group_id=self.group, member_id=self.member_id, share_session_epoch=self.session,
                topics=[R.AcknowledgeTopic(topic_id=self.topic_id, partitions=[R.AcknowledgePartition(
                    partition_index=partition, acknowledgement_batches=[
                        R.AcknowledgementBatch(first_offset=a, last_offset=z, acknowledge_types=t)
                        for a, z, t in batches])])])
        resp = await self.conn.request(SHARE_ACK, 1, req)
        assert resp.error_code == 0, resp
        self.session += 1
        return next(p.error_code for t in resp.responses for p in t.partitions if p.partition_index == partition)

    async def close(self) -> None:
        """Close the share session (FINAL epoch) and leave the group."""
        R = messages.message_class("ShareAcknowledgeRequest")
        await self.conn.request(SHARE_ACK, 1, R(group_id=self.group, member_id=self.member_id,
                                                share_session_epoch=-1, topics=[]))
        Hb = messages.message_class("ShareGroupHeartbeatRequest")
        await self.conn.request(HEARTBEAT, 1, Hb(group_id=self.group, member_id=self.member_id, member_epoch=-1,
                                                 rack_id=None, subscribed_topic_names=None))
        await self.conn.close()


def expand(ranges: list[tuple[int, int, int]]) -> dict[int, int]:
    """offset -> delivery count of acquired ranges."""
    return {o: dc for a, z, dc in ranges for o in range(a, z + 1)}


async def decide(bootstrap: str, group: str, topic: str, n: int, releases: dict[int, int],
                 rejected: set[int]) -> None:
    """Through raw RPCs on partition 0 of ``topic`` (``n`` records): record ``o`` in ``releases``
    is released ``releases[o]`` times (its next delivery has count releases[o] + 1), the
    ``rejected`` ones are rejected, every other record is accepted. Every answer must be success."""
    m = await RawMember.join(bootstrap, group, topic)
    try:
        counts: Counter = Counter()
        decided: set[int] = set()
        held: list[int] = []  # last releases: sent together at the end, so they do not come back
        while len(decided) + len(held) < n:
            got = expand((await m.fetch([0])).get(0, []))
            assert got, f"nothing acquired; decided {sorted(decided)}, held {held}"
            batches = []
            for o, dc in sorted(got.items()):
                counts[o] += 1
                assert dc == counts[o], (o, dc, counts[o])
                assert o not in decided and o not in held, f"offset {o} delivered again after its last decision"
                if counts[o] < releases.get(o, 0):
                    batches.append((o, o, [RELEASE]))
                elif counts[o] == releases.get(o, 0):
                    held.append(o)
                else:
                    batches.append((o, o, [REJECT if o in rejected else ACCEPT]))
                    decided.add(o)
            if batches:
                assert await m.acknowledge(0, batches) == 0
        assert await m.acknowledge(0, [(o, o, [RELEASE]) for o in sorted(held)]) == 0
    finally:
        await m.close()


# ------------------------------------------------------------------------------------------------
# 2. restart with no consumers: SPSO, archived records and delivery counts survive


def _forty_decided(kafka39: KafkaBroker, topic: str, group: str, state_topic: str, releases: dict[int, int],
                  rejected: set[int]) -> KShareProcess:
    """A one-partition topic of 40 records; kshare started and the records decided through it
    (:func:`decide`: released ``releases[offset]`` times, ``rejected`` rejected, the rest accepted)."""
    kafka39.create_topic(topic, partitions=1)
    produce_fast(kafka39.bootstrap, topic, 40, 1)
    kshare = KShareProcess(kafka39, state_topic)
    kshare.start()
    try:
        share_group(kshare.bootstrap, group, **GROUP_CONFIGS)
        asyncio.run(decide(kshare.bootstrap, group, topic, 40, releases, rejected))
    except BaseException:
        kshare.stop()
        raise
    return kshare


def test_state_survives_restarts_without_consumers(kafka39, topic_name, group, state_topic):
    """40 records. Raw RPCs: 0-9 accepted, 10-12 released twice each, 13-19 accepted, 20-24
    rejected (archived above the SPSO), 25-29 released once, 30-39 accepted. SPSO 10. Then:
    SIGKILL, 3 s with no proxy at all, restart, 3 s with the proxy up but no consumer, SIGTERM,
    restart. The SPSO is 10 (DescribeShareGroupOffsets and ``kshare groups --describe --offsets
    --output json``), and a ShareConsumer then gets exactly 10-12 (delivery count 3), 25-29
    (count 2) and the 5 records produced meanwhile (count 1): nothing accepted, nothing rejected."""
    releases = dict.fromkeys((10, 11, 12), 2) | dict.fromkeys(range(25, 30), 1)
    rejected = set(range(20, 25))
    kshare = _forty_decided(kafka39, topic_name, group, state_topic, releases, rejected)
    try:
        assert describe_offsets(kshare.bootstrap, group) == {0: 10}
        kshare.kill()
        time.sleep(3.0)  # nobody there
        produce_fast(kafka39.bootstrap, topic_name, 5, 1, start=40)
        kshare.start()
        assert describe_offsets(kshare.bootstrap, group) == {0: 10}
        time.sleep(3.0)  # up, idle: lock timers, topic refreshes, pruning run
        kshare.current.send_signal(signal.SIGTERM)
        assert kshare.current.wait(30) == 0
        kshare.start()
        cli = subprocess.run([sys.executable, "-m", "kshare", "groups", "--bootstrap-server", kshare.bootstrap,
                              "--describe", "--group", group, "--offsets", "--output", "json"],
                             capture_output=True, text=True, timeout=60)
        assert cli.returncode == 0, cli.stderr
        doc = json.loads(cli.stdout)
        assert [(o["partition"], o["start_offset"]) for o in doc[0]["offsets"]] == [(0, 10)], doc

        c = share_consumer(kshare.bootstrap, group, explicit=True)
        c.subscribe([topic_name])
        got: list[tuple[int, int]] = []
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and len(got) < 13:
                for msg in c.poll(0.5):
                    if msg.error() is None:
                        got.append((msg.offset(), msg.delivery_count()))
                        c.acknowledge(msg, AcknowledgeType.ACCEPT)
                c.commit_sync(15)
            end = time.monotonic() + 2
            while time.monotonic() < end:  # nothing else may come
                for msg in c.poll(0.5):
                    if msg.error() is None:
                        got.append((msg.offset(), msg.delivery_count()))
                        c.acknowledge(msg, AcknowledgeType.ACCEPT)
                c.commit_sync(15)
        finally:
            c.close()
        expected = sorted([(o, n + 1) for o, n in releases.items()] + [(o, 1) for o in range(40, 45)])
        assert sorted(got) == expected
        wait_until(lambda: describe_offsets(kshare.bootstrap, group) == {0: 45}, 20, "SPSO 45")
    finally:
        kshare.stop()
    assert not kshare.tracebacks(), kshare.output()


# ------------------------------------------------------------------------------------------------
# 3. the upstream broker stopped and restarted under load


@pytest.mark.parametrize(("hard", "down_s"), [(False, 0.0), (True, 35.0)], ids=["sigterm", "sigkill-down-35s"])
def test_upstream_broker_restart_under_load(broker_factory, topic_name, group, state_topic, hard, down_s):
    """A private Kafka 3.9 broker is stopped (SIGTERM and started again at once, or SIGKILL and
    35 s down: longer than the state store's 30 s write timeout) on the same port and data while 4
    ShareConsumers acknowledge 8,000 records through one kshare process. Meanwhile the consumers
    see errors (failed acknowledgement commits, transport errors), kshare stays up, reconnects and
    rebuilds what a failed state write left behind; afterwards every record was delivered and
    acknowledged (SPSO at the end, also after a kshare restart), no confirmed acknowledgement was
    delivered again, and redeliveries all came after the outage began."""
    n = 8000
    broker = broker_factory("kafka39")
    broker.create_topic(topic_name, partitions=PARTITIONS)
    produce_fast(broker.bootstrap, topic_name, n, PARTITIONS)
    ends = end_offsets(broker.bootstrap, topic_name, PARTITIONS)
    kshare = KShareProcess(broker, state_topic)
    kshare.start()
    ledger = Ledger()
    consumers: list[AckingConsumer] = []
    try:
        # short locks: records held at the outage expire during it, so state writes wait on the
        # dead broker (and must not wedge the state producer once it is back)
        share_group(kshare.bootstrap, group, **GROUP_CONFIGS, **{"share.record.lock.duration.ms": 5000})
        consumers = [AckingConsumer(i, kshare.bootstrap, group, topic_name, ledger).start() for i in range(CONSUMERS)]
        wait_until(lambda: ledger.confirmed_count() >= 0.3 * n, 120, "30% confirmed", interval=0.005)
        outage = time.monotonic()
        before = ledger.confirmed_count()
        if hard:
            broker.kill()
        else:
            broker.stop()
        time.sleep(down_s)
        broker.start()
        back = time.monotonic()
        during = ledger.confirmed_count() - before
        try:
            wait_until(lambda: spso_reached(kshare.bootstrap, group, ends), 180, "every SPSO at its end", interval=1.0)
        except AssertionError:
            try:
                spso: Any = describe_offsets(kshare.bootstrap, group, timeout_ms=5000)
            except Exception as exc:  # noqa: BLE001
                spso = repr(exc)
            state = {"confirmed": ledger.confirmed_count(), "deliveries": len(ledger.deliveries),
                     "spso": spso, "ends": ends, "kshare_exit": kshare.current.process.poll(),
                     "failed_acks": ledger.failed_acks, "commit_errors": dict(ledger.commit_errors),
                     "poll_errors": dict(ledger.poll_errors), "outage_s": back - outage}
            raise AssertionError(f"{state}\n{kshare.digest()}") from None
        time.sleep(1.0)
        assert kshare.current.process.poll() is None, "kshare exited:\n" + kshare.output()
    finally:
        for c in consumers:
            c.stop()
    final = offsets_after_one_more_crash(kshare, group)
    v = judge(ledger, ends, [outage])
    out = kshare.output()
    report = v.summary() | {"outage_s": round(back - outage, 1), "confirmed_during_outage": during,
                            "failed_state_writes": out.count("durable write for"),
                            "producer_replaced": out.count("replaced the idempotent producer"),
                            "failed_acks": ledger.failed_acks, "commit_errors": dict(ledger.commit_errors),
                            "poll_errors": dict(ledger.poll_errors), "refused": ledger.refused}
    print("broker restart:", json.dumps(report))
    for c in consumers:
        assert not c.errors, (c.index, c.errors)
    assert final == ends, (final, ends)
    assert v.distinct == n, report
    assert not v.after_confirmation, (v.after_confirmation[:10], report)
    assert v.per_crash[0] == 0, report
    # clients noticed: acknowledgements failed or requests erred while the broker was away
    assert ledger.failed_acks or ledger.commit_errors or ledger.poll_errors, report
    assert not kshare.tracebacks(), kshare.output()


# ------------------------------------------------------------------------------------------------
# 4. damaged and foreign records on the state topic


def test_damaged_state_records_are_skipped(kafka39, topic_name, group, state_topic):
    """Records nobody can decode (and well-formed ones about things that do not exist) are produced
    to the state topic directly on the cluster, in the partition holding the group's records, after
    its state. kshare logs one error per damaged record, loads everything else and serves: the
    group's configs and SPSO are intact, the released records come back with their delivery
    count, nothing acknowledged or rejected does; a later restart replays the topic again."""
    releases = dict.fromkeys(range(20, 25), 1)
    rejected = set(range(25, 30))
    kshare = _forty_decided(kafka39, topic_name, group, state_topic, releases, rejected)
    try:
        assert describe_offsets(kshare.bootstrap, group) == {0: 20}
        kshare.kill()

        tid = asyncio.run(topic_id_direct(kafka39.bootstrap, topic_name))
        key = SharePartitionKey(group, tid, 0)
        part = sc.partition_for(key, 3)
        good_key = sc.encode_share_key(sc.RECORD_SNAPSHOT, key)
        good_value = sc.encode_snapshot_value(0, 0, 0, ShareSnapshot(5, ()))
        orphan = SharePartitionKey("no-such-group", uuid.uuid4().bytes, 3)
        damaged = [
            (b"\x00", b"v"),  # key too short
            (os.urandom(40), good_value),  # garbage key
            (b"\x00\x09" + good_key[2:], good_value),  # unknown record type
            (good_key, os.urandom(30)),  # garbage value under the group's own key
            (good_key, b"\x00\x05" + good_value[2:]),  # unknown value version
            (good_key, good_value[:-4]),  # truncated
            (None, b"a foreign record without a key"),
            (good_key, b'{"json": "from another tool"}'),
            (sc.encode_group_key(group), os.urandom(25)),  # the group's record, damaged
            (sc.encode_share_key(sc.RECORD_UPDATE, orphan), sc.encode_update_value(0, 0, ShareUpdate(7, ()))),
        ]
        # well-formed, but about a topic that does not exist: loaded, harmless
        foreign = [(sc.encode_share_key(sc.RECORD_SNAPSHOT, SharePartitionKey("foreign-group", uuid.uuid4().bytes, 0)),
                    sc.encode_snapshot_value(0, 0, 0, ShareSnapshot(3, ())))]
        p = Producer({"bootstrap.servers": kafka39.bootstrap, "logger": quiet_logger()})
        for i, (k, v) in enumerate(damaged + foreign):
            p.produce(state_topic, value=v, key=k, partition=part if i % 3 else (part + 1) % 3)
        assert p.flush(30) == 0

        kshare.start()
        out = "".join(kshare.current.output)
        skipped = [line for line in kshare.current.output if "record skipped" in line]
        assert len(skipped) == len(damaged), out
        assert all(" ERROR " in line for line in skipped), skipped
        assert f"{len(damaged)} skipped" in out
        assert describe_offsets(kshare.bootstrap, group) == {0: 20}
        from tests.harness.share import describe_group_configs

        configs = describe_group_configs(kshare.bootstrap, group)
        assert configs["share.auto.offset.reset"] == "earliest"
        assert configs["share.heartbeat.interval.ms"] == "500"

        got: list[tuple[int, int]] = []
        with subscribed(kshare.bootstrap, group, topic_name) as c:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and len(got) < 5:
                got += [(m.offset(), m.delivery_count()) for m in c.poll(0.5) if m.error() is None]
            end = time.monotonic() + 2
            while time.monotonic() < end:
                got += [(m.offset(), m.delivery_count()) for m in c.poll(0.5) if m.error() is None]
        assert sorted(got) == [(o, 2) for o in range(20, 25)]
        wait_until(lambda: describe_offsets(kshare.bootstrap, group) == {0: 40}, 20, "SPSO 40")

        kshare.kill()
        kshare.start()
        assert describe_offsets(kshare.bootstrap, group) == {0: 40}
        assert all(" ERROR " in line for line in kshare.current.output if "record skipped" in line)
    finally:
        kshare.stop()
    assert not kshare.tracebacks(), kshare.output()


# ------------------------------------------------------------------------------------------------
# 5. the state store alone through an outage longer than its write timeout


def test_state_writes_heal_after_an_outage_longer_than_the_write_timeout(broker_factory, state_topic):
    """Regression: aiokafka's idempotent producer may fail a batch it already gave a sequence number
    (expired while its partition had no leader after the broker came back); every later batch of
    that partition then failed with OutOfOrderSequenceNumber, forever. The store now replaces the
    producer, so writes succeed again within seconds of the restart, and a replay of the topic
    gives exactly the state the store holds."""
    from kshare.share.state.errors import StateWriteError
    from kshare.share.state.topic_store import TopicStateStore

    broker = broker_factory("kafka39")
    tid = uuid.uuid4().bytes
    keys = [SharePartitionKey("g", tid, p) for p in range(6)]

    async def main() -> tuple[Counter, dict, dict]:
        store = TopicStateStore(broker.bootstrap, topic=state_topic, partitions=3, write_timeout_s=5)
        await store.start()
        stop = False
        results: list[tuple[float, str]] = []

        async def writer(i: int, k: SharePartitionKey) -> None:
            n = 0
            while not stop:
                n += 1
                try:
                    await store.write([(k, ShareSnapshot(n * 10 + i, ()))])
                    results.append((time.monotonic(), "ok"))
                except StateWriteError as exc:
                    results.append((time.monotonic(), str(exc).split(":")[0]))
                    await asyncio.sleep(0.2)

        tasks = [asyncio.create_task(writer(i, k)) for i, k in enumerate(keys)]
        try:
            await asyncio.sleep(1)
            await asyncio.to_thread(broker.stop)
            await asyncio.sleep(6)  # longer than the write timeout
            await asyncio.to_thread(broker.start)
            back = time.monotonic()
            await asyncio.sleep(15)
            stop = True
            await asyncio.gather(*tasks)
            await store.flush()
        finally:
            await store.close()
        late = Counter(r for t, r in results if t > back + 10)
        fresh = TopicStateStore(broker.bootstrap, topic=state_topic, partitions=3)
        await fresh.start()
        await fresh.close()
        return late, store.share_partitions(), fresh.share_partitions()

    late, held, replayed = asyncio.run(main())
    assert late["ok"] > 0 and set(late) == {"ok"}, late
    assert replayed == held


# ------------------------------------------------------------------------------------------------
# 6. group configs asked for while a restarted kshare is still loading its state


def test_group_configs_while_the_state_loads(kafka39, group, state_topic):
    """Right after a restart, until the share state is loaded, DescribeConfigs and
    IncrementalAlterConfigs on a share group wait for the load (bounded: 20 s, then the retriable
    COORDINATOR_LOAD_IN_PROGRESS) and then answer: not the fronted cluster's view of the group
    (which knows no share groups), not a dropped connection, and no error that a client which does
    not retry (confluent-kafka's AdminClient) would give up on. The durable configs are served,
    and a change made then persists."""
    kshare = KShareProcess(kafka39, state_topic)
    kshare.start()
    try:
        share_group(kshare.bootstrap, group, **GROUP_CONFIGS)
        kshare.kill()
        asyncio.run(_seed_slow_load(kafka39.bootstrap, state_topic, 500))
        kshare.start(wait_loaded=False)
        answers = asyncio.run(_configs_until_loaded(kshare.bootstrap, group))
        wait_until(lambda: any("share state loaded" in line for line in kshare.current.output), 60, "the load")
        kshare.kill()
        kshare.start()
        final = asyncio.run(_configs_until_loaded(kshare.bootstrap, group, alter=False))
    finally:
        kshare.stop()
    codes = Counter((kind, code) for kind, code, _, _ in answers)
    assert set(codes) == {("describe", 0), ("alter", 0)}, codes
    assert answers[0][3] > 0.1, (answers[0], kshare.output())  # the first one was sent while loading
    for kind, code, configs, _ in answers:
        if kind == "describe" and code == 0:
            assert configs.get("share.auto.offset.reset") == "earliest", configs
    assert final[-1][2]["share.heartbeat.interval.ms"] == "600", final[-1]
    assert final[-1][2]["share.auto.offset.reset"] == "earliest", final[-1]
    assert not kshare.tracebacks(), kshare.output()


async def _seed_slow_load(bootstrap: str, state_topic: str, n: int) -> None:
    """``n`` share-partitions of another group with 2,000 single-record state ranges each."""
    from kshare.share.state.topic_store import TopicStateStore
    from kshare.share.states import StateBatch

    snapshot = ShareSnapshot(0, tuple(StateBatch(o, o, AVAILABLE if o % 2 else ACKNOWLEDGED, 1 + o % 3)
                                      for o in range(2000)))
    tid = uuid.uuid4().bytes
    store = TopicStateStore(bootstrap, topic=state_topic, partitions=3, prune_interval_s=3600)
    await store.start()
    try:
        for i in range(0, n, 50):
            await asyncio.gather(*(store.write([(SharePartitionKey("bulk", tid, p), snapshot)])
                                   for p in range(i, min(n, i + 50))))
    finally:
        await store.close()


async def _configs_until_loaded(bootstrap: str, group: str, *, alter: bool = True,
                                timeout: float = 60.0) -> list[tuple[str, int, dict[str, str], float]]:
    """DescribeConfigs (and IncrementalAlterConfigs share.heartbeat.interval.ms=600) of the group on
    one connection, over and over, until a describe succeeds after a successful alter (or at all,
    ``alter=False``). Every answer: (kind, error code, configs, seconds it took)."""
    host, _, port = bootstrap.rpartition(":")
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn = await KafkaConnection.open(host, int(port), client_id="configs")
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.02)
    Describe = messages.message_class("DescribeConfigsRequest")
    Alter = messages.message_class("IncrementalAlterConfigsRequest")
    dv, av = conn.best_version(32, hi=4), conn.best_version(44, hi=1)
    out: list[tuple[str, int, dict[str, str], float]] = []
    altered = not alter
    try:
        while time.monotonic() < deadline:
            sent = time.monotonic()
            r = (await conn.request(32, dv, Describe(
                resources=[Describe.DescribeConfigsResource(resource_type=32, resource_name=group,
                                                            configuration_keys=None)],
                include_synonyms=False, include_documentation=False))).results[0]
            out.append(("describe", r.error_code, {c.name: c.value for c in r.configs or []},
                        time.monotonic() - sent))
            if altered and r.error_code == 0:
                return out
            if not altered:
                sent = time.monotonic()
                a = (await conn.request(44, av, Alter(resources=[Alter.AlterConfigsResource(
                    resource_type=32, resource_name=group, configs=[Alter.AlterableConfig(
                        name="share.heartbeat.interval.ms", config_operation=0, value="600")])],
                    validate_only=False))).responses[0]
                out.append(("alter", a.error_code, {}, time.monotonic() - sent))
                altered = a.error_code == 0
            await asyncio.sleep(0.01)
        raise AssertionError(f"no successful answer in {timeout:.0f} s: {out[-5:]}")
    finally:
        await conn.close()
