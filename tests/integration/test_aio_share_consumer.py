"""``kshare.AIOShareConsumer`` against kshare (over Apache Kafka 3.9) and native Apache Kafka 4.4,
side by side, in the differential suite's style (tests/integration/test_share_differential.py):
each scenario is written once, as a coroutine of a ``Target``, runs against both targets at the
same time (one thread and event loop each), and what must agree is compared:

* records (partition, offset, key, value, headers, sizes) of every codec (none, gzip, snappy, lz4,
  zstd), each delivered once in implicit mode with delivery count 1, nothing left afterwards;
* explicit acknowledgements: ACCEPT once, RELEASE (redelivered with the count increased, up to
  ``share.delivery.count.limit``, then archived), REJECT (never again), RENEW, and the outcome
  ``commit()`` returns per partition, also for a record whose lock ran out (INVALID_RECORD_STATE);
* errors raised as aiokafka's exceptions with Kafka's error names: an unknown topic, a group at
  ``group.share.max.size`` (2 on both here);
* a member joining (the partitions rebalanced over both) and a member leaving with records held
  (they come back to the other member with delivery count 2).

kshare and Kafka 4.4 run for the module with the same lowered broker-level bounds (the differential
suite's) and ``group.share.max.size`` 2.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ssl
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from aiokafka.errors import ConsumerStoppedError
from aiokafka.structs import ConsumerRecord, TopicPartition
from confluent_kafka import Producer

from kshare import AIOShareConsumer
from kshare.clients.errors import KafkaError
from tests.harness.brokers import KAFKA4_VERSION, KafkaBroker
from tests.harness.security import (
    set_earliest,
    start_secure_kshare,
)
from tests.harness.share import (
    HEARTBEAT_MS,
    KAFKA4_TEST_LIMITS,
    TEST_LIMITS,
    ShareProxyThread,
    produce,
    quiet_logger,
    share_group,
    values,
)
from tests.harness.tls import TlsMaterial

KSHARE, KAFKA4 = "kshare", "kafka4"
MAX_GROUP_SIZE = 2

pytestmark = [pytest.mark.kafka, pytest.mark.kafka4]


@dataclasses.dataclass
class Target:
    name: str
    bootstrap: str
    broker: KafkaBroker

    def create_topic(self, topic: str, partitions: int = 1) -> None:
        self.broker.create_topic(topic, partitions)

    def configure(self, group: str, **configs: object) -> None:
        share_group(self.bootstrap, group, **{"share.heartbeat.interval.ms": HEARTBEAT_MS, **configs})

    def consumer(self, *topics: str, group: str, **kw: Any) -> AIOShareConsumer:
        kw.setdefault("fetch_max_wait_ms", 200)
        return AIOShareConsumer(*topics, bootstrap_servers=self.bootstrap, group_id=group, **kw)


@pytest.fixture(scope="module")
def kafka4_small_groups() -> Iterator[KafkaBroker]:
    config = {**KAFKA4_TEST_LIMITS, "group.share.max.size": MAX_GROUP_SIZE}
    with KafkaBroker(KAFKA4_VERSION, share_groups=True, config=config) as broker:
        yield broker


@pytest.fixture(scope="module")
def targets(kafka39: KafkaBroker, kafka4_small_groups: KafkaBroker) -> Iterator[dict[str, Target]]:
    limits = dataclasses.replace(TEST_LIMITS, max_group_size=MAX_GROUP_SIZE)
    with ShareProxyThread(kafka39.bootstrap, limits=limits) as proxy:
        yield {KSHARE: Target(KSHARE, proxy.bootstrap, kafka39),
               KAFKA4: Target(KAFKA4, kafka4_small_groups.bootstrap, kafka4_small_groups)}


@pytest.fixture
def names() -> tuple[str, str]:
    tag = uuid.uuid4().hex[:10]
    return f"aio-{tag}", f"aio-share-{tag}"


def on_both(targets: dict[str, Target], scenario: Callable[..., Awaitable[Any]], *args: Any) -> dict[str, Any]:
    """``scenario(target, *args)`` on both targets at once, each on an event loop of its own."""
    with ThreadPoolExecutor(2, thread_name_prefix="aio") as pool:
        futures = {name: pool.submit(asyncio.run, scenario(t, *args)) for name, t in targets.items()}
        return {name: f.result(120) for name, f in futures.items()}


async def until(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout} s")
        await asyncio.sleep(0.05)


def produce_codecs(bootstrap: str, topic: str, partitions: int) -> list[tuple[int, bytes, bytes, list]]:
    """Five producer batches of four records per partition, one per codec; returns (partition, key,
    value, headers) in offset order per partition."""
    out = []
    for codec in ("none", "gzip", "snappy", "lz4", "zstd"):
        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "compression.type": codec,
                      "enable.idempotence": False, "acks": "all", "logger": quiet_logger()})
        for part in range(partitions):
            for i in range(4):
                key, value = f"k-{codec}-{i}".encode(), f"{codec}-{part}-{i}".encode() * (1 + i)
                headers = [("codec", codec.encode()), ("i", str(i).encode())]
                p.produce(topic, key=key, value=value, headers=headers, partition=part)
                out.append((part, key, value, headers))
        assert p.flush(30) == 0
    return out


# ------------------------------------------------------------------------------------------------
# implicit mode: every codec, every record once


async def implicit_every_codec(t: Target, topic: str, group: str) -> dict[str, Any]:
    t.create_topic(topic, 2)
    t.configure(group)
    produced = produce_codecs(t.bootstrap, topic, 2)
    got: list[Any] = []
    async with t.consumer(topic, group=group, max_poll_records=7) as c:
        deadline = time.monotonic() + 60
        while len(got) < len(produced) and time.monotonic() < deadline:
            batch = await c.getmany(timeout_ms=500)
            assert all(len(rs) <= 7 for rs in batch.values())
            assert sum(len(rs) for rs in batch.values()) <= 7
            for tp, rs in batch.items():
                assert all((r.topic, r.partition) == tp for r in rs)
                got += rs
        assignment = c.assignment()
        await asyncio.sleep(1.0)  # anything delivered twice would show up now
        got += [r for rs in (await c.getmany(timeout_ms=500)).values() for r in rs]
    async with t.consumer(topic, group=group) as later:  # nothing is left for a newcomer
        left = [r for rs in (await later.getmany(timeout_ms=2000)).values() for r in rs]
    assert all(list(r._fields[:11]) == list(ConsumerRecord.__dataclass_fields__) for r in got)  # aiokafka's fields
    return {
        "records": sorted((r.partition, r.offset, r.key, r.value, [(k, bytes(v)) for k, v in r.headers],
                           r.serialized_key_size, r.serialized_value_size, r.timestamp_type, r.checksum,
                           r.delivery_count) for r in got),
        "produced": sorted((p, k, v, h) for p, k, v, h in produced),
        "assignment": sorted(assignment),
        "left": len(left),
    }


def test_implicit_mode_every_codec_once(targets, names):
    r = on_both(targets, implicit_every_codec, *names)
    topic = names[0]
    assert r[KSHARE] == r[KAFKA4]
    got = r[KSHARE]
    assert sorted((p, k, v, h) for p, _, k, v, h, *_ in got["records"]) == got["produced"]
    assert {rec[-1] for rec in got["records"]} == {1}  # delivery count 1, each once
    assert [o for p, o, *_ in got["records"] if p == 0] == list(range(20))
    assert got["assignment"] == [TopicPartition(topic, 0), TopicPartition(topic, 1)]
    assert got["left"] == 0


# ------------------------------------------------------------------------------------------------
# explicit mode: accept, release, reject, renew; outcomes


async def explicit_acknowledgements(t: Target, topic: str, group: str) -> dict[str, Any]:
    t.create_topic(topic, 1)
    t.configure(group, **{"share.delivery.count.limit": 3, "share.record.lock.duration.ms": 15000})
    p = Producer({"bootstrap.servers": t.bootstrap, "linger.ms": 50, "logger": quiet_logger()})
    for v in (b"accept", b"release-once", b"reject", b"poison", b"renew"):
        p.produce(topic, value=v, partition=0)
    assert p.flush(30) == 0
    seen: list[tuple[int, bytes, int]] = []
    outcomes: list[dict[TopicPartition, Any]] = []
    callbacks: list[dict[TopicPartition, Any]] = []
    renewed: dict[TopicPartition, Any] = {}
    async with t.consumer(topic, group=group, acknowledgement_mode="explicit",
                          acknowledgement_callback=callbacks.append) as c:
        deadline = time.monotonic() + 60
        while not ((3, b"poison", 3) in seen and (1, b"release-once", 2) in seen and (4, b"renew", 1) in seen):
            assert time.monotonic() < deadline, seen
            for rs in (await c.getmany(timeout_ms=500)).values():
                for r in rs:
                    seen.append((r.offset, r.value, r.delivery_count))
                    if r.value == b"renew":
                        c.acknowledge(r, "renew")
                        renewed = await c.commit()
                        c.acknowledge(r, "accept")
                    elif r.value in (b"poison",) or (r.value == b"release-once" and r.delivery_count == 1):
                        c.acknowledge(r, "release")
                    elif r.value == b"reject":
                        c.acknowledge(r, "reject")
                    else:
                        c.acknowledge(r)
                    with pytest.raises(KafkaError):  # once only
                        c.acknowledge(r, "accept")
            outcomes.append(await c.commit())
        await asyncio.sleep(2.0)  # an archived, rejected or accepted record must not come back
        late = [r.value for rs in (await c.getmany(timeout_ms=1000)).values() for r in rs]
    tp = TopicPartition(topic, 0)
    return {
        "deliveries": sorted(seen),
        "late": late,
        "outcomes": sorted({repr(o.get(tp)) for o in outcomes if o}),
        "renewed": {str(k): repr(v) for k, v in renewed.items()} if renewed else None,
        "callbacks": sorted({repr(o.get(tp)) for o in callbacks}),
    }


def test_explicit_accept_release_reject_renew(targets, names):
    """RELEASE -> redelivered with the count increased; REJECT -> never again; released every time ->
    delivered share.delivery.count.limit (3) times, then archived; RENEW keeps a record; every
    acknowledgement's outcome is None on both."""
    r = on_both(targets, explicit_acknowledgements, *names)
    assert r[KSHARE] == r[KAFKA4]
    assert r[KSHARE]["deliveries"] == [(0, b"accept", 1), (1, b"release-once", 1), (1, b"release-once", 2),
                                       (2, b"reject", 1), (3, b"poison", 1), (3, b"poison", 2), (3, b"poison", 3),
                                       (4, b"renew", 1)]
    assert r[KSHARE]["late"] == []
    assert r[KSHARE]["outcomes"] == ["None"] and r[KSHARE]["callbacks"] == ["None"]
    assert r[KSHARE]["renewed"] == {f"TopicPartition(topic='{names[0]}', partition=0)": "None"}


async def late_acknowledgement(t: Target, topic: str, group: str) -> dict[str, Any]:
    """A record held past its 1 s lock, then accepted: the outcome is INVALID_RECORD_STATE, and the
    record comes back (delivery count 2)."""
    t.create_topic(topic, 1)
    t.configure(group, **{"share.record.lock.duration.ms": 1000})
    p = Producer({"bootstrap.servers": t.bootstrap, "logger": quiet_logger()})
    p.produce(topic, value=b"slow", partition=0)
    assert p.flush(30) == 0
    async with t.consumer(topic, group=group, acknowledgement_mode="explicit") as c:
        first: list[Any] = []
        await until_records(c, first, 1, 30)
        await asyncio.sleep(2.0)  # the lock runs out
        c.acknowledge(first[0])
        outcome = await c.commit()
        again: list[Any] = []
        await until_records(c, again, 1, 30)
        c.acknowledge(again[0])
        final = await c.commit()
    tp = TopicPartition(topic, 0)
    err = outcome[tp]
    return {"first": [(r.offset, r.delivery_count) for r in first],
            "late_outcome": (type(err).__name__, err.errno, err.message) if err else None,
            "again": [(r.offset, r.delivery_count) for r in again], "final": final[tp]}


async def until_records(c: AIOShareConsumer, out: list[Any], n: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while len(out) < n:
        assert time.monotonic() < deadline, f"{len(out)} of {n} records"
        out += [r for rs in (await c.getmany(timeout_ms=500, max_records=n - len(out))).values() for r in rs]


def test_late_acknowledgement_is_invalid_record_state(targets, names):
    r = on_both(targets, late_acknowledgement, *names)
    assert r[KSHARE] == r[KAFKA4] == {"first": [(0, 1)], "late_outcome": ("InvalidRecordStateError", 121,
                                                                          "INVALID_RECORD_STATE"),
                                      "again": [(0, 2)], "final": None}


# ------------------------------------------------------------------------------------------------
# errors


async def _start_error(c: AIOShareConsumer) -> tuple[str, int | None, str | None] | None:
    """None if ``c`` starts, else what it raised (type, errno, message); ``c`` is stopped either way."""
    try:
        await c.start()
        return None
    except KafkaError as exc:
        return (type(exc).__name__, getattr(exc, "errno", None), getattr(exc, "message", None))
    finally:
        await c.stop()


async def errors(t: Target, topic: str, group: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    out["unknown_topic"] = await _start_error(t.consumer(f"{topic}-missing", group=group))
    t.create_topic(topic, 2)
    t.configure(group)
    members = [t.consumer(topic, group=group) for _ in range(MAX_GROUP_SIZE)]
    for m in members:
        await m.start()
    out["group_full"] = await _start_error(t.consumer(topic, group=group))
    await members[0].stop()  # room again: a new member joins
    again = t.consumer(topic, group=group)
    await again.start()
    for m in (again, *members[1:]):
        await m.stop()
    out["joined_after_a_leave"] = again.member_id is not None
    stopped = t.consumer(topic, group=group)
    await stopped.start()
    await stopped.stop()
    try:
        await stopped.getmany()
    except ConsumerStoppedError as exc:  # as aiokafka's consumer
        out["after_stop"] = type(exc).__name__
    return out


def test_errors_are_kafkas(targets, names):
    r = on_both(targets, errors, *names)
    assert r[KSHARE] == r[KAFKA4] == {
        "unknown_topic": ("UnknownTopicOrPartitionError", 3, "UNKNOWN_TOPIC_OR_PARTITION"),
        "group_full": ("GroupMaxSizeReachedError", 81, "GROUP_MAX_SIZE_REACHED"),
        "joined_after_a_leave": True,
        "after_stop": "ConsumerStoppedError",
    }


# ------------------------------------------------------------------------------------------------
# a member joins (rebalance), a member leaves holding records


async def join_and_leave(t: Target, topic: str, group: str) -> dict[str, Any]:
    parts = 4
    t.create_topic(topic, parts)
    t.configure(group, **{"share.record.lock.duration.ms": 60000})
    produce_values = values("r", 8 * parts)
    p = Producer({"bootstrap.servers": t.bootstrap, "linger.ms": 20, "logger": quiet_logger()})
    for i, v in enumerate(produce_values):
        p.produce(topic, value=v, partition=i % parts)
    assert p.flush(30) == 0
    every = set(produce_values)
    holder = t.consumer(topic, group=group, acknowledgement_mode="explicit", max_poll_records=3,
                        share_acquire_mode="record_limit")  # holds exactly what it was handed
    await holder.start()
    held: list[Any] = []
    await until_records(holder, held, 3, 60)
    alone = holder.assignment()
    taker = t.consumer(topic, group=group)
    await taker.start()
    await until(lambda: bool(taker.assignment()), 30, "an assignment for the second member")
    with contextlib.suppress(TimeoutError):  # the first member's shrinks on its next heartbeat
        await until(lambda: len(holder.assignment()) < parts, 3, "rebalance")
    shared = {"holder": len(holder.assignment()), "taker": len(taker.assignment()),
              "union": len(holder.assignment() | taker.assignment())}
    taken: list[Any] = []

    async def take(timeout: float, want: set[bytes] | None = None) -> None:
        deadline = time.monotonic() + timeout
        while want is None or not want <= {r.value for r in taken}:
            if time.monotonic() > deadline:
                assert want is None, f"the second member has {len(taken)} records"
                return
            taken.extend(r for rs in (await taker.getmany(timeout_ms=300)).values() for r in rs)

    await take(2.0)  # what the second member gets while the first holds its records
    await holder.stop()  # leaves: its records are released
    await take(40, every)
    await take(1.0)  # anything delivered twice would show up now
    await taker.stop()
    held_values = {r.value for r in held}
    counts = Counter(r.value for r in taken)
    return {
        "alone": len(alone),
        "shared": shared,
        "held": len(held),
        "held_came_back_with_count_2": sorted(r.delivery_count for r in taken if r.value in held_values),
        "others_count_1": {r.delivery_count for r in taken if r.value not in held_values},
        "each_once": set(counts.values()),
        "all": set(counts) == every,
    }


def test_member_joins_and_leaves(targets, names):
    """The first member has every partition; a second joins and the partitions are spread over both;
    the first leaves holding 3 records, which come back to the second with delivery count 2."""
    r = on_both(targets, join_and_leave, *names)
    shared = {name: run.pop("shared") for name, run in r.items()}  # how a cluster's assignor spreads them
    assert r[KSHARE] == r[KAFKA4]
    assert r[KSHARE]["alone"] == 4
    for name in (KSHARE, KAFKA4):
        assert shared[name]["union"] == 4 and shared[name]["taker"] >= 1, shared
    assert r[KSHARE]["held_came_back_with_count_2"] == [2, 2, 2]
    assert r[KSHARE]["others_count_1"] == {1} and r[KSHARE]["each_once"] == {1} and r[KSHARE]["all"]


async def holds_what_it_was_handed(t: Target, topic: str, group: str) -> dict[str, Any]:
    """Three producer batches of 10 records on one partition shared by two members. A member whose
    getmany hands out a whole batch (10 records, max_poll_records 10) does not fetch the next one
    ahead: the second member gets the second batch, not the third (a fetch ahead would have locked
    it, and the other members sharing the partition would wait for its lock)."""
    t.create_topic(topic, 1)
    t.configure(group)
    async with t.consumer(topic, group=group, max_poll_records=10) as a, \
            t.consumer(topic, group=group, max_poll_records=10) as b:
        await until(lambda: bool(a.assignment()) and bool(b.assignment()), 30, "both members assigned")
        await asyncio.to_thread(produce, t.bootstrap, topic, values(topic, 30), partition=0, per_batch=10)
        got_a: list[Any] = []
        await until_records(a, got_a, 10, 30)
        await asyncio.sleep(1.0)  # a fetch ahead would have come back by now
        got_b: list[Any] = []
        await until_records(b, got_b, 10, 30)
        return {"a": sorted(r.offset for r in got_a), "b": sorted(r.offset for r in got_b)}


def test_a_member_holds_what_it_was_handed(targets, names):
    r = on_both(targets, holds_what_it_was_handed, *names)
    assert r[KSHARE] == r[KAFKA4] == {"a": list(range(10)), "b": list(range(10, 20))}


async def resubscribe(t: Target, topic: str, group: str) -> dict[str, Any]:
    """subscribe() to another topic, unsubscribe() (the member leaves), subscribe() again (a new member)."""
    first, second = f"{topic}-a", f"{topic}-b"
    for name in (first, second):
        t.create_topic(name, 1)
        p = Producer({"bootstrap.servers": t.bootstrap, "logger": quiet_logger()})
        for v in values(name, 3):
            p.produce(name, value=v, partition=0)
        assert p.flush(30) == 0
    t.configure(group)
    out: dict[str, Any] = {}
    async with t.consumer(first, group=group) as c:
        got: list[Any] = []
        await until_records(c, got, 3, 30)
        out["first"] = sorted(r.value.decode().rsplit("-", 1)[1] for r in got)
        member = c.member_id
        c.subscribe([second])
        got = []
        await until_records(c, got, 3, 30)
        out["second"] = sorted((r.topic == second, r.value.decode().rsplit("-", 1)[1]) for r in got)
        out["subscription"] = c.subscription() == {second}
        out["same_member"] = c.member_id == member
        c.unsubscribe()
        await c.getmany(timeout_ms=200)  # the leave is done before the next getmany returns
        out["after_unsubscribe"] = (sorted(c.assignment()), sorted(c.subscription()))
        c.subscribe([first])
        await until(lambda: bool(c.assignment()), 30, "an assignment after subscribing again")
        out["new_member"] = c.member_id != member
        out["again"] = [r.value for rs in (await c.getmany(timeout_ms=1000)).values() for r in rs]  # all accepted
    return out


def test_subscribe_unsubscribe_subscribe(targets, names):
    r = on_both(targets, resubscribe, *names)
    assert r[KSHARE] == r[KAFKA4] == {
        "first": ["0", "1", "2"], "second": [(True, "0"), (True, "1"), (True, "2")], "subscription": True,
        "same_member": True, "after_unsubscribe": ([], []), "new_member": True, "again": [],
    }


# ------------------------------------------------------------------------------------------------
# TLS + SASL/SCRAM, and what the ACLs refuse: kshare (a proxy process serving TLS, its own SCRAM
# credentials to the broker) in front of ``kafka39_secure``, and ``kafka44_secure``'s SASL_SSL listener


@dataclasses.dataclass
class SecureTarget:
    name: str
    bootstrap: str
    broker: KafkaBroker
    tls: TlsMaterial

    def admin_conf(self) -> dict[str, Any]:
        return self.broker.client_config("admin", "SASL_SSL", "SCRAM-SHA-512", **{"bootstrap.servers": self.bootstrap})

    def consumer(self, topic: str, group: str, user: str, password: str | None = None) -> AIOShareConsumer:
        return AIOShareConsumer(topic, bootstrap_servers=self.bootstrap, group_id=group, fetch_max_wait_ms=200,
                                security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512",
                                sasl_plain_username=user,
                                sasl_plain_password=password if password is not None else self.broker.users[user],
                                ssl_context=ssl.create_default_context(cafile=str(self.tls.ca_cert)))


SECURE_PREFIX = f"aio-sec-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module")
def secure_targets(kafka39_secure: KafkaBroker, kafka44_secure: KafkaBroker, tls_material: TlsMaterial,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, SecureTarget]]:
    d = tmp_path_factory.mktemp("aio-secure")
    proxy, granted, _ = start_secure_kshare(kafka39_secure, tls_material, d, SECURE_PREFIX,
                                            cert=tls_material.server_chain, key=tls_material.server_key)
    try:
        yield {KSHARE: SecureTarget(KSHARE, proxy.bootstrap, kafka39_secure, tls_material),
               KAFKA4: SecureTarget(KAFKA4, kafka44_secure.secure_bootstrap["SASL_SSL"], kafka44_secure, tls_material)}
    finally:
        proxy.stop()
        kafka39_secure.revoke(granted)


def _error(exc: BaseException | None) -> tuple[str, int | None] | None:
    return None if exc is None else (type(exc).__name__, getattr(exc, "errno", None))


async def secure_scenario(t: SecureTarget, topic: str, group: str) -> dict[str, Any]:
    b = t.broker
    b.create_topic(topic)
    vals = values(topic, 10)
    await asyncio.to_thread(produce, b.bootstrap, topic, vals)
    groups = {who: f"{group}-{who}" for who in ("alice", "bob", "carol")}
    granted = b.grant("alice", "topic", topic, "READ") + b.grant("alice", "group", groups["alice"], "READ")
    granted += b.grant("bob", "group", groups["bob"], "READ") + b.grant("bob", "topic", topic, "DESCRIBE")
    granted += b.grant("carol", "topic", topic, "READ")  # and nothing on her group
    out: dict[str, Any] = {}
    try:
        for g in groups.values():
            await asyncio.to_thread(set_earliest, t.admin_conf(), g)
        async with t.consumer(topic, groups["alice"], "alice") as alice:
            got: list[Any] = []
            await until_records(alice, got, len(vals), 60)
        out["alice"] = sorted((r.value, r.delivery_count) for r in got)

        async def refusal(c: AIOShareConsumer, seconds: float) -> BaseException | None:
            try:
                await c.start()
                deadline = time.monotonic() + seconds
                while time.monotonic() < deadline:
                    if await c.getmany(timeout_ms=300):
                        return None
                return None
            except KafkaError as exc:
                return exc
            finally:
                await c.stop()

        # bob: READ on his group, DESCRIBE on the topic: assigned, refused its records
        out["bob"] = _error(await refusal(t.consumer(topic, groups["bob"], "bob"), 20))
        # carol: READ on the topic, nothing on her group
        out["carol"] = _error(await refusal(t.consumer(topic, groups["carol"], "carol"), 5))
        # alice with a wrong password
        out["wrong_password"] = _error(await refusal(t.consumer(topic, groups["alice"], "alice", "nope"), 1))
    finally:
        b.revoke(granted)
    out["values"] = sorted((v, 1) for v in vals) == out["alice"]
    return out


def test_tls_and_scram_and_refusals(secure_targets):
    """Through TLS and SASL/SCRAM-SHA-512 alice reads every record once; the ACLs' refusals are raised
    as Kafka names them, the same through kshare and from Kafka 4.4."""
    tag = uuid.uuid4().hex[:6]
    r = on_both(secure_targets, secure_scenario, f"{SECURE_PREFIX}-t-{tag}", f"{SECURE_PREFIX}-g-{tag}")
    alice = {name: run.pop("alice") for name, run in r.items()}  # the topic names differ
    assert r[KSHARE] == r[KAFKA4] == {
        "bob": ("TopicAuthorizationFailedError", 29),
        "carol": ("GroupAuthorizationFailedError", 30),
        "wrong_password": ("SaslAuthenticationFailed", 58),
        "values": True,
    }
    assert len(alice[KSHARE]) == len(alice[KAFKA4]) == 10
