"""kshare in front of a secured cluster (issue 13, docs/guide/security.md), end to end.

One ``kshare proxy`` child process per module in front of the session's ``kafka39_secure``: it
connects to the broker's SASL_SSL listener as the user ``kshare`` (SCRAM-SHA-512, its password in a
file, the test CA to verify the broker) and serves TLS to clients with a certificate of the test CA
(copies of ``tls_material``'s files, replaced by the reload test). Clients authenticate as
themselves with SCRAM through kshare; the ACLs of the cluster decide what they may do.

* alice, with READ on the topic and the group, consumes every record with librdkafka's
  ShareConsumer and with Apache Kafka's Java KafkaShareConsumer;
* the share-group RPCs answer what Kafka 4.4's native share groups answer to principals that lack
  an ACL, request for request (raw requests on SASL-authenticated connections, against kshare and
  against ``kafka44_secure``), and never hand out a record;
* a revoked READ takes effect within kshare's cache lifetime (30 s);
* wrong passwords, plaintext clients on the TLS port and expired client certificates are refused
  cleanly while good clients go on; certificates reload on SIGHUP and on file change.

What the test user ``kshare`` is granted is what the proxy needs: ALL on its state topic and READ
(which implies DESCRIBE) on the topics it serves (:data:`tests.harness.security.KSHARE_STATE_TOPIC_OPS`,
:data:`~tests.harness.security.KSHARE_TOPIC_OPS`); nothing on the cluster.

No set-up request goes through the broker's anonymous PLAINTEXT listener except topic creation and
producing test records; kshare and every client under test use the authenticated listeners.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import socket
import ssl
import struct
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer

from kshare.clients.connection import KafkaConnection
from kshare.protocol import messages
from kshare.security import AuthenticationFailed, ClientSecurity
from tests.harness.brokers import KafkaBroker
from tests.harness.java import JavaShareConsumer, java_share_driver
from tests.harness.proxies import ProxyProcess
from tests.harness.security import (
    GROUP_AUTHORIZATION_FAILED,
    KSHARE_STATE_TOPIC_OPS,
    NATIVE_SHARE_AUTH_ERRORS,
    TOPIC_AUTHORIZATION_FAILED,
    kshare_args,
    set_earliest,
    share_poll,
    start_kshare,
    start_secure_kshare,
)
from tests.harness.share import (
    NONE,
    ConsumerLoop,
    Joining,
    Raw,
    acquired,
    partitions,
    produce,
    values,
    wait_until,
)
from tests.harness.tls import TlsMaterial, _san, _sign

RUN = uuid.uuid4().hex[:6]
PREFIX = f"sec-{RUN}"  # every topic and group of this module starts with it
CACHE_TTL_S = 30.0  # kshare.share.authorization.DEFAULT_TTL_S: a revocation takes effect within it
REVOCATION_SLACK_S = 8.0
HANGUPS = 300  # TLS clients of the hang-up test
SHARE_DESCRIBE, DELETE_GROUPS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 77, 42, 17, 36


def _name(kind: str) -> str:
    return f"{PREFIX}-{kind}-{uuid.uuid4().hex[:6]}"


# ------------------------------------------------------------------------------------------------
# kshare as a child process


def _tracebacks(lines: list[str]) -> list[str]:
    return [line for line in lines if "Traceback" in line or re.search(r"\b(ERROR|CRITICAL)\b", line)]


@dataclass
class Secure:
    """The module's kshare in front of ``kafka39_secure``."""

    broker: KafkaBroker
    tls: TlsMaterial
    proxy: ProxyProcess
    cert: Path  # the files kshare serves (copies: the reload test replaces them)
    key: Path
    workdir: Path
    password_file: Path
    procs: list[ProxyProcess] = field(default_factory=list)  # every kshare of the module (output checked)

    @property
    def bootstrap(self) -> str:
        return self.proxy.bootstrap

    def conf(self, user: str, *, password: str | None = None, **extra: Any) -> dict[str, Any]:
        """librdkafka settings of ``user`` for kshare: SASL_SSL, SCRAM-SHA-512, trusting the test CA."""
        return self.broker.client_config(user, "SASL_SSL", "SCRAM-SHA-512", password=password,
                                         **{"bootstrap.servers": self.bootstrap, **extra})


@pytest.fixture(scope="module")
def secure(kafka39_secure: KafkaBroker, tls_material: TlsMaterial,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secure]:
    broker = kafka39_secure
    d = tmp_path_factory.mktemp("kshare-security")
    cert, key = d / "tls.crt", d / "tls.key"
    shutil.copyfile(tls_material.server_chain, cert)
    shutil.copyfile(tls_material.server_key, key)
    proxy, granted, password_file = start_secure_kshare(broker, tls_material, d, PREFIX, cert=cert, key=key)
    s = Secure(broker, tls_material, proxy, cert, key, d, password_file, [proxy])
    try:
        yield s
    finally:
        for p in s.procs:
            p.stop()
        broker.revoke(granted)
    for p in s.procs:
        assert _tracebacks(p.output) == [], "".join(p.output[-60:])


@pytest.fixture(autouse=True)
def _no_traceback_in_kshare(request: pytest.FixtureRequest) -> Iterator[None]:
    """No traceback (nor ERROR line) in any kshare's output during the test."""
    if "secure" not in request.fixturenames:
        yield
        return
    s: Secure = request.getfixturevalue("secure")
    marks = {id(p): len(p.output) for p in s.procs}
    yield
    for p in s.procs:
        new = p.output[marks.get(id(p), 0):]
        assert _tracebacks(new) == [], "kshare logged:\n" + "".join(new[-60:])


# ------------------------------------------------------------------------------------------------
# helpers


def _client_context(tls: TlsMaterial, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(tls.ca_cert))
    if cert is not None:
        ctx.load_cert_chain(cert, key)
    return ctx


async def _open(address: str, tls: TlsMaterial, user: str | None, password: str | None,
                mechanism: str = "SCRAM-SHA-512", client_id: str = "security-tests") -> Raw:
    """A raw connection over TLS, authenticated as ``user`` with SASL (none if ``user`` is None)."""
    host, _, port = address.rpartition(":")
    security = ClientSecurity(ssl=_client_context(tls), sasl_mechanism=mechanism if user else None,
                              username=user, password=password)
    return Raw(await KafkaConnection.open(host, int(port), client_id=client_id, security=security))


async def _sasl_plain_error(address: str, tls: TlsMaterial, user: str, password: str) -> int:
    """The error code of SaslAuthenticate (PLAIN) on a fresh TLS connection."""
    raw = await _open(address, tls, None, None)
    try:
        hs = await raw.conn.request(SASL_HANDSHAKE, 1, messages.message_class("SaslHandshakeRequest")(
            mechanism="PLAIN"))
        assert hs.error_code == NONE, hs
        auth = await raw.conn.request(SASL_AUTHENTICATE, 2, messages.message_class("SaslAuthenticateRequest")(
            auth_bytes=f"\0{user}\0{password}".encode()))
        return auth.error_code
    finally:
        await raw.close()


async def _join(raw: Raw, group: str, topic: str, timeout: float = 30.0) -> tuple[str, int, Any]:
    """Heartbeat as a new member until assigned (or refused): (member id, epoch, last answer)."""
    joining = Joining(topic, timeout)
    while True:
        r = await raw.hb(group, joining.member, joining.epoch, joining.topics)
        if joining.coordinator_not_ready(r):
            await raw.find_coordinator(group)
        elif (outcome := joining.outcome(r)) is not None:
            return outcome
        await asyncio.sleep(0.3)


def _first_partition_error(resp: Any) -> int | None:
    return next((p.error_code for p in partitions(resp).values()), None)


def _new_topic(broker: KafkaBroker, n: int) -> tuple[str, list[bytes]]:
    """A topic of this module with ``n`` records (created and produced on the set-up listener)."""
    topic = _name("t")
    broker.create_topic(topic)
    vals = values(topic, n)
    produce(broker.bootstrap, topic, vals)
    return topic, vals


# ------------------------------------------------------------------------------------------------
# 1. alice consumes through kshare (TLS to kshare, her SCRAM passing through to the broker)


def test_alice_consumes_with_share_consumer(secure: Secure):
    broker = secure.broker
    topic, vals = _new_topic(broker, 20)
    group = _name("g")
    granted = broker.grant("alice", "topic", topic, "READ") + broker.grant("alice", "group", group, "READ")
    try:
        set_earliest(secure.conf("admin"), group)
        got, errors = share_poll(secure.conf("alice"), topic, group, want=len(vals), timeout=30)
        assert errors == []
        assert sorted(got) == sorted(vals)
    finally:
        broker.revoke(granted)


def test_alice_consumes_with_java_share_consumer(secure: Secure):
    broker = secure.broker
    try:
        command = java_share_driver()
    except RuntimeError as exc:  # no Maven / javac on this machine
        pytest.skip(f"the Java ShareConsumerDriver cannot be built: {exc}")
    topic, vals = _new_topic(broker, 10)
    group = _name("g")
    granted = broker.grant("alice", "topic", topic, "READ") + broker.grant("alice", "group", group, "READ")
    try:
        set_earliest(secure.conf("admin"), group)
        conf = broker.java_client_config("alice", "SASL_SSL", "SCRAM-SHA-512")
        conf.pop("bootstrap.servers")
        java = JavaShareConsumer(command, secure.bootstrap, group, topic, max_records=len(vals),
                                 timeout_ms=30_000, configs=conf).start()
        try:
            rc = java.wait(60)
        finally:
            java.kill()
        assert rc == 0, java.diagnostics()
        assert sorted(java.values()) == sorted(vals), java.diagnostics()
    finally:
        broker.revoke(granted)


# ------------------------------------------------------------------------------------------------
# 2./3. what principals without the ACLs get, through kshare and from native Kafka 4.4


@dataclass
class System:
    name: str
    broker: KafkaBroker
    address: str  # where the clients under test connect (SASL_SSL)
    tls: TlsMaterial


def _system(request: pytest.FixtureRequest, name: str) -> System:
    if name == "kshare":
        s: Secure = request.getfixturevalue("secure")
        return System(name, s.broker, s.bootstrap, s.tls)
    broker: KafkaBroker = request.getfixturevalue("kafka44_secure")
    return System(name, broker, broker.secure_bootstrap["SASL_SSL"], request.getfixturevalue("tls_material"))


async def _authorization_answers(system: System) -> dict[str, Any]:
    """Every scenario of NATIVE_SHARE_AUTH_ERRORS, as raw requests to ``system`` (the same requests as
    test_secure_brokers.test_native_share_authorization_error_codes, over SASL_SSL with SCRAM); plus
    ``records_handed_out``: records any refused principal was given (must be 0)."""
    broker, address, tls = system.broker, system.address, system.tls
    users = broker.users
    topic, _ = await asyncio.to_thread(_new_topic, broker, 3)
    admin_conf = broker.client_config("admin", "SASL_SSL", "SCRAM-SHA-512", **{"bootstrap.servers": address})
    warm, g1, g2, g3 = (_name(k) for k in ("warm", "g1", "ref-g2", "ref-g3"))
    for g in (warm, g1, g2, g3):  # records to hand out, if anything were handed out
        await asyncio.to_thread(set_earliest, admin_conf, g)
    observed: dict[str, Any] = {"records_handed_out": 0}
    granted: list[Any] = []
    admin = await _open(address, tls, "admin", users["admin"])
    try:
        tid = await admin.topic_id(topic)
        # the group coordinator (and a fresh broker's __consumer_offsets) ready before any question
        _, _, r = await _join(admin, warm, topic)
        assert r.error_code == NONE and r.assignment.topic_partitions, r
    finally:
        await admin.close()

    try:
        observed["sasl_wrong_password"] = (await _sasl_plain_error(address, tls, "bob", "wrong"), None)

        # bob: READ and DESCRIBE on the topic, nothing on the group
        bob_topic = await asyncio.to_thread(broker.grant, "bob", "topic", topic, "READ", "DESCRIBE")
        granted += bob_topic
        c = await _open(address, tls, "bob", users["bob"])
        try:
            _, _, r = await _join(c, g1, topic)
            observed["heartbeat_without_group_read"] = (r.error_code, None)
            f = await c.fetch(g1, str(uuid.uuid4()), 0, {tid: [0]})
            observed["fetch_without_group_read"] = (f.error_code, _first_partition_error(f))
            observed["records_handed_out"] += len(acquired(f))
        finally:
            await c.close()
        await asyncio.to_thread(broker.revoke, bob_topic)

        # carol: READ on her groups, nothing on the topic
        granted += await asyncio.to_thread(broker.grant, "carol", "group", f"{PREFIX}-ref-g", "READ",
                                           pattern="PREFIXED")
        c = await _open(address, tls, "carol", users["carol"])
        try:
            _, _, r = await _join(c, g2, topic)
            observed["heartbeat_without_topic_acl"] = (r.error_code, None)
        finally:
            await c.close()

        # carol: DESCRIBE on the topic (joins and is assigned the partition) but no READ
        granted += await asyncio.to_thread(broker.grant, "carol", "topic", topic, "DESCRIBE")
        c = await _open(address, tls, "carol", users["carol"])  # a new connection: nothing cached
        try:
            member, _, r = await _join(c, g3, topic)
            observed["heartbeat_with_topic_describe_only"] = (r.error_code, None)
            assert r.assignment is not None and r.assignment.topic_partitions, r
            f = await c.fetch(g3, member, 0, {tid: [0]})
            observed["fetch_without_topic_read"] = (f.error_code, _first_partition_error(f))
            observed["records_handed_out"] += len(acquired(f))
            a = await c.ack(g3, member, 1, {(tid, 0): [(0, 0, [1])]})
            observed["ack_without_topic_read"] = (a.error_code, _first_partition_error(a))
            d = await c.conn.request(SHARE_DESCRIBE, 1, messages.message_class("ShareGroupDescribeRequest")(
                group_ids=[g3], include_authorized_operations=False))
            observed["describe_with_group_read"] = (NONE, d.groups[0].error_code)
            x = await c.conn.request(DELETE_GROUPS, 2, messages.message_class("DeleteGroupsRequest")(
                groups_names=[g3]))
            observed["delete_without_group_delete"] = (NONE, x.results[0].error_code)
        finally:
            await c.close()
        c = await _open(address, tls, "bob", users["bob"])
        try:
            d = await c.conn.request(SHARE_DESCRIBE, 1, messages.message_class("ShareGroupDescribeRequest")(
                group_ids=[g3], include_authorized_operations=False))
            observed["describe_without_group_describe"] = (NONE, d.groups[0].error_code)
        finally:
            await c.close()
    finally:
        await asyncio.to_thread(broker.revoke, granted)
    return observed


@pytest.fixture(scope="module")
def _answers() -> dict[str, Any]:
    return {}


def _answers_of(request: pytest.FixtureRequest, answers: dict[str, Any], name: str) -> dict[str, Any]:
    """The answers of ``name``, asked once per module (a failure too: reported by every scenario)."""
    if name not in answers:
        try:
            answers[name] = asyncio.run(_authorization_answers(_system(request, name)))
        except Exception as exc:  # noqa: BLE001 - kept for the other scenarios of this system
            answers[name] = exc
        print(f"{name} share-group authorization answers:", answers[name])
    if isinstance(answers[name], Exception):
        raise AssertionError(f"asking {name} failed: {answers[name]!r}") from answers[name]
    return answers[name]


SYSTEMS = [pytest.param("kshare", id="kshare"),
           pytest.param("kafka44", id="kafka44", marks=[pytest.mark.kafka, pytest.mark.kafka4])]


@pytest.mark.parametrize("scenario", list(NATIVE_SHARE_AUTH_ERRORS))
@pytest.mark.parametrize("system", SYSTEMS)
def test_share_authorization_error_codes(request: pytest.FixtureRequest, _answers, system: str, scenario: str):
    """(top-level error, first partition/group error) of each refused share-group request, through
    kshare and from native Kafka 4.4, equal to the reference table of test_secure_brokers."""
    observed = _answers_of(request, _answers, system)
    assert observed[scenario] == NATIVE_SHARE_AUTH_ERRORS[scenario]


@pytest.mark.parametrize("system", SYSTEMS)
def test_refused_principals_get_no_record(request: pytest.FixtureRequest, _answers, system: str):
    assert _answers_of(request, _answers, system)["records_handed_out"] == 0


def test_an_instance_group_on_the_secured_cluster_hands_over_on_sigterm(secure: Secure):
    """Two proxies as one instance group in front of the SASL_SSL listener, as user kshare with only
    the ACLs production.md lists for an instance group (its group ``kshare-instances.NAME``, its
    TransactionalId prefix, its state topic, the share groups for the proxies' questions to each
    other), and alice's share consumer reading a 4-partition topic through both. One proxy gets
    SIGTERM while she reads: it reads the other's new map (DescribeGroups, as kshare) and shows
    it before it closes. What alice held from the leaving proxy may come again; nothing is lost."""
    broker = secure.broker
    name = _name("ig")
    state_topic = f"__kshare_state_{name}"
    topic = _name("t")
    group = _name("g")
    broker.create_topic(topic, partitions=4)
    vals = values(topic, 400)
    produce(broker.bootstrap, topic, vals, partitions=4, per_batch=10)
    granted = broker.grant("kshare", "topic", state_topic, *KSHARE_STATE_TOPIC_OPS)
    granted += broker.grant("kshare", "group", f"kshare-instances.{name}", "READ", "DESCRIBE")
    granted += broker.grant("kshare", "transactional_id", f"kshare-state.{name}.", "WRITE", "DESCRIBE",
                            pattern="PREFIXED")
    granted += broker.grant("kshare", "group", group, "DESCRIBE", "READ", "DELETE", "DESCRIBE_CONFIGS")
    granted += broker.grant("alice", "topic", topic, "READ") + broker.grant("alice", "group", group, "READ")
    args = [*kshare_args(broker, secure.tls, cert=secure.cert, key=secure.key, password_file=secure.password_file,
                         state_topic=state_topic),
            "--state-topic-partitions", "2", "--instance-group", name, "--instance-session-timeout-ms", "6000"]
    proxies: list[ProxyProcess] = []
    got: list[bytes] = []
    stop = False
    errors: list[BaseException] = []

    def read() -> None:
        from confluent_kafka import ShareConsumer

        consumer = ShareConsumer({**secure.conf("alice", **{"bootstrap.servers": ",".join(p.bootstrap for p in proxies)}),
                                  "group.id": group})
        consumer.subscribe([topic])
        try:
            while not stop:
                for m in consumer.poll(0.3):
                    if m.error() is None:
                        got.append(m.value())
                        time.sleep(0.005)  # work on each record: the SIGTERM falls while she reads
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
        finally:
            consumer.close()

    try:
        for _ in range(2):
            proxies.append(start_kshare(args))
            secure.procs.append(proxies[-1])
        wait_until(lambda: any("over 2 proxies" in line for p in proxies for line in p.output), 60,
                   "both proxies in the instance group")
        set_earliest(secure.conf("admin", **{"bootstrap.servers": proxies[0].bootstrap}), group)
        import threading

        reader = threading.Thread(target=read, name="alice", daemon=True)
        reader.start()
        wait_until(lambda: len(got) >= 50 or errors, 60, "alice reading through the instance group")
        leaving = proxies[1]
        leaving.process.send_signal(signal.SIGTERM)
        assert leaving.process.wait(60) == 0, "".join(leaving.output[-40:])
        wait_until(lambda: set(got) >= set(vals) or errors, 90, "every record after the hand-over")
        stop = True
        reader.join(30)
        assert errors == []
        assert set(got) == set(vals), f"lost: {len(set(vals) - set(got))}"
        took_over = [line for line in leaving.output if "the others took over at ownership epoch" in line]
        not_read = [line for line in leaving.output if "new map not read" in line or "no map of the others" in line]
        assert took_over and not not_read, "".join(leaving.output[-40:])
    finally:
        stop = True
        for p in proxies:
            p.stop()
        if os.environ.get("KSHARE_DUMP"):
            for i, p in enumerate(proxies):
                Path(os.environ["KSHARE_DUMP"], f"proxy{i}.log").write_text("".join(p.output))
        broker.revoke(granted)


def test_bob_share_consumer_is_refused_through_kshare(secure: Secure):
    """librdkafka's ShareConsumer as bob through kshare: refused with the group, then the topic error,
    and never a record, though the topic has records and the group starts at the earliest."""
    broker = secure.broker
    topic, _ = _new_topic(broker, 5)
    bob = secure.conf("bob")
    granted: list[Any] = []
    try:
        # no ACL at all
        g = _name("bob")
        set_earliest(secure.conf("admin"), g)
        got, errors = share_poll(bob, topic, g, want=0, timeout=20)
        assert got == []
        assert errors[:1] == [GROUP_AUTHORIZATION_FAILED], errors
        # READ on the group, nothing on the topic
        g = _name("bob")
        set_earliest(secure.conf("admin"), g)
        granted += broker.grant("bob", "group", g, "READ")
        got, errors = share_poll(bob, topic, g, want=0, timeout=20)
        assert got == []
        assert errors[:1] == [TOPIC_AUTHORIZATION_FAILED], errors
        # and DESCRIBE on the topic: assigned the partition, refused its records
        granted += broker.grant("bob", "topic", topic, "DESCRIBE")
        got, errors = share_poll(bob, topic, g, want=0, timeout=20)
        assert got == []
        assert errors[:1] == [TOPIC_AUTHORIZATION_FAILED], errors
    finally:
        broker.revoke(granted)


# ------------------------------------------------------------------------------------------------
# 4. revocation


def test_revoked_topic_read_takes_effect_within_the_cache_lifetime(secure: Secure):
    """alice consumes (raw ShareFetch on her SASL connection through kshare, and a librdkafka
    ShareConsumer of another group); her topic READ is revoked; within CACHE_TTL_S (+ slack) kshare
    answers her partition with TOPIC_AUTHORIZATION_FAILED and hands out no more records."""
    broker = secure.broker
    topic, _ = _new_topic(broker, 1)
    group, group2 = _name("g"), _name("g")
    read = broker.grant("alice", "topic", topic, "READ")
    rest = broker.grant("alice", "topic", topic, "DESCRIBE")  # she stays a member: the heartbeat is fine
    rest += broker.grant("alice", "group", PREFIX, "READ", pattern="PREFIXED")
    for g in (group, group2):
        set_earliest(secure.conf("admin"), g)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})  # set-up listener
    loop = ConsumerLoop("alice-librdkafka", secure.bootstrap, group2, topic,
                        **{k: v for k, v in secure.conf("alice").items() if k != "bootstrap.servers"})
    result: dict[str, Any] = {}

    async def main() -> None:
        raw = await _open(secure.bootstrap, secure.tls, "alice", broker.users["alice"], client_id="alice")
        try:
            tid = await raw.topic_id(topic)
            member, _, r = await _join(raw, group, topic)
            assert r.error_code == NONE, r
            epoch, pending, n = 0, {}, 0
            revoked_at = refused_at = None
            after_refusal: list[Any] = []
            deadline = time.monotonic() + CACHE_TTL_S + REVOCATION_SLACK_S + 10
            while time.monotonic() < deadline:
                producer.produce(topic, value=f"live-{n}".encode())
                producer.flush(10)
                n += 1
                f = await raw.fetch(group, member, epoch, {tid: [0]} if epoch == 0 else None,
                                    acks=pending, max_wait_ms=500)
                assert f.error_code == NONE, f
                epoch += 1
                got = acquired(f)
                pending = {(tid, 0): [(a, z, [1]) for a, z, _ in got]} if got else {}
                err = _first_partition_error(f)
                if revoked_at is None:
                    assert err in (NONE, None), f
                    if got:  # consuming: now revoke (the READ answer was just cached)
                        await asyncio.to_thread(broker.revoke, read)
                        revoked_at = time.monotonic()
                elif refused_at is None:
                    if err == TOPIC_AUTHORIZATION_FAILED:
                        refused_at = time.monotonic()
                        assert not got, f
                else:
                    after_refusal.append((err, got))
                    if len(after_refusal) >= 4:
                        break
            result.update(revoked_at=revoked_at, refused_at=refused_at, after_refusal=after_refusal)
        finally:
            await raw.close()

    try:
        loop.start()
        wait_until(lambda: loop.received, 30, "alice's ShareConsumer to receive a record")
        asyncio.run(main())
        last_record = max(g.at for g in loop.received)
    finally:
        loop.stop()
        producer.flush(10)
        broker.revoke(rest)
        if not result.get("revoked_at"):
            broker.revoke(read)
    assert result["revoked_at"] is not None, "alice never received a record before the revocation"
    assert result["refused_at"] is not None, "kshare still handed alice records after the revocation"
    bound = result["refused_at"] - result["revoked_at"]
    print(f"revocation took effect after {bound:.1f} s (bound {CACHE_TTL_S:.0f} s)")
    assert bound <= CACHE_TTL_S + REVOCATION_SLACK_S, bound
    assert all(err == TOPIC_AUTHORIZATION_FAILED and not got for err, got in result["after_refusal"]), result
    # the librdkafka consumer of the same principal got nothing later than the bound either
    assert last_record - result["revoked_at"] <= CACHE_TTL_S + REVOCATION_SLACK_S


# ------------------------------------------------------------------------------------------------
# 5. refusals: wrong password, plaintext on the TLS port, expired client certificate


@contextmanager
def _alice_consuming(secure: Secure, bootstrap: str | None = None,
                     **conf: Any) -> Iterator[Callable[[str], None]]:
    """alice consuming a topic of her own in the background (librdkafka ShareConsumer, SASL_SSL to
    ``bootstrap``, default the module's kshare); ``check(label)`` produces three records and waits
    until she has them."""
    broker = secure.broker
    topic, group = _name("t"), _name("g")
    broker.create_topic(topic)
    granted = broker.grant("alice", "topic", topic, "READ") + broker.grant("alice", "group", group, "READ")
    client = {k: v for k, v in secure.conf("alice").items() if k != "bootstrap.servers"}
    client.update(conf)
    loop = ConsumerLoop("alice-meanwhile", bootstrap or secure.bootstrap, group, topic, **client)
    expected: list[bytes] = []

    def check(label: str) -> None:
        vals = values(f"{topic}-{label}", 3)
        expected.extend(vals)
        produce(broker.bootstrap, topic, vals)
        wait_until(lambda: set(expected) <= set(loop.values()), 30, f"alice's records ({label})")

    try:
        set_earliest(secure.conf("admin", **{"bootstrap.servers": bootstrap or secure.bootstrap, **conf}), group)
        loop.start()
        yield check
    finally:
        loop.stop()
        broker.revoke(granted)
    assert not loop.errors, loop.errors


def _errors_of_client(conf: dict[str, Any], timeout: float = 20.0) -> tuple[list[KafkaError], float]:
    """(errors reported, seconds until the first) of a producer asking for metadata."""
    errors: list[KafkaError] = []
    producer = Producer({**conf, "error_cb": errors.append, "reconnect.backoff.max.ms": 1000})
    start = time.monotonic()
    while not errors and time.monotonic() - start < timeout:
        try:
            producer.list_topics(timeout=1)
        except KafkaException:
            pass
        producer.poll(0.1)
    return errors, time.monotonic() - start


def _good_client_works(conf: dict[str, Any], topic: str) -> None:
    md = Producer(conf).list_topics(topic, timeout=10)
    assert md.topics[topic].error is None, md.topics[topic].error


def _good_client_works_on(secure: Secure, bootstrap: str) -> None:
    """alice lists the brokers through ``bootstrap`` (SASL_SSL)."""
    md = Producer(secure.conf("alice", **{"bootstrap.servers": bootstrap})).list_topics(timeout=10)
    assert md.brokers


def test_wrong_password_is_refused_cleanly(secure: Secure):
    """A wrong password through kshare: librdkafka reports an authentication error at once (no hang),
    a raw SCRAM exchange is refused; alice, consuming meanwhile, goes on."""
    with _alice_consuming(secure) as alice_meanwhile:
        alice_meanwhile("before")
        errors, seconds = _errors_of_client(secure.conf("alice", password="not-alice-secret"))
        assert errors and errors[0].code() == KafkaError._AUTHENTICATION, errors
        assert seconds < 15, seconds
        with pytest.raises(AuthenticationFailed):  # SaslAuthenticate answered with an error
            asyncio.run(_open(secure.bootstrap, secure.tls, "alice", "not-alice-secret"))
        errors, _ = _errors_of_client(secure.conf("mallory", password="x"))  # an unknown user, the same
        assert errors and errors[0].code() == KafkaError._AUTHENTICATION, errors
        alice_meanwhile("after")


def _plaintext_api_versions(address: str, timeout: float = 10.0) -> tuple[bytes | str, float]:
    """Send ApiVersions in the clear; what comes back ("closed", "reset" or bytes) and how fast."""
    host, _, port = address.rpartition(":")
    frame = messages.encode_request(18, 0, 1, "plaintext", messages.message_class("ApiVersionsRequest")())
    start = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(frame)
        try:
            data = s.recv(4096)
        except ConnectionResetError:
            return "reset", time.monotonic() - start
        except TimeoutError:
            return "hang", time.monotonic() - start
    return (data or "closed"), time.monotonic() - start


def test_plaintext_client_on_the_tls_port_is_refused(secure: Secure):
    """Kafka bytes in the clear on kshare's TLS port get no Kafka answer (closed, reset or a TLS
    alert) at once; librdkafka on SASL_PLAINTEXT reports an error; alice, consuming meanwhile, goes on."""
    with _alice_consuming(secure) as alice_meanwhile:
        alice_meanwhile("before")
        answer, seconds = _plaintext_api_versions(secure.bootstrap)
        print(f"plaintext ApiVersions on the TLS port: {answer!r} after {seconds:.2f} s")
        assert answer in ("closed", "reset") or (isinstance(answer, bytes) and answer[:1] == b"\x15"), answer
        assert seconds < 5, seconds
        errors, seconds = _errors_of_client(secure.conf("alice", **{"security.protocol": "sasl_plaintext"}))
        assert errors, "a plaintext client on kshare's TLS port was not refused"
        assert seconds < 15, seconds
        alice_meanwhile("after")


def _tls_refusal(address: str, tls: TlsMaterial, cert: Path | None, key: Path | None) -> str:
    """How a TLS client with ``cert`` fares against a server requiring client certificates: "ok" if an
    ApiVersions answer comes, else the error (a TLS 1.3 server refuses the certificate after the
    client's handshake is done: on the first read)."""
    host, _, port = address.rpartition(":")
    ctx = _client_context(tls, cert, key)
    frame = messages.encode_request(18, 0, 1, "mtls", messages.message_class("ApiVersionsRequest")())
    try:
        with socket.create_connection((host, int(port)), timeout=10) as raw, \
                ctx.wrap_socket(raw, server_hostname=host) as s:
            s.sendall(frame)
            head = s.recv(4)
            if len(head) < 4:
                return "closed"
            (size,) = struct.unpack(">i", head)
            return "ok" if size > 0 else "bad frame"
    except ssl.SSLError as exc:
        return f"ssl: {exc.reason or exc}"
    except (ConnectionResetError, BrokenPipeError) as exc:
        return f"reset: {exc}"
    except TimeoutError:
        return "hang"


def test_expired_client_certificate_is_refused(secure: Secure, tls_material: TlsMaterial):
    """kshare with --tls-client-ca (a process of its own): an expired client certificate, one of an
    untrusted CA, and none at all are refused at the handshake, at once; alice, with the valid client
    certificate, consumes through that kshare meanwhile."""
    broker, t = secure.broker, tls_material
    state_topic = f"__kshare_state_{PREFIX}_mtls"
    granted = broker.grant("kshare", "topic", state_topic, *KSHARE_STATE_TOPIC_OPS)
    mtls = start_kshare(kshare_args(broker, t, cert=t.server_chain, key=t.server_key,
                                      password_file=secure.password_file, state_topic=state_topic,
                                      client_ca=t.ca_cert))
    secure.procs.append(mtls)
    try:
        with _alice_consuming(secure, mtls.bootstrap, **{"ssl.certificate.location": str(t.client_cert),
                                                          "ssl.key.location": str(t.client_key)}) as alice_meanwhile:
            alice_meanwhile("before")
            for what, cert, key in (("expired", t.expired_cert, t.expired_key),
                                    ("untrusted", t.untrusted_cert, t.untrusted_key),
                                    ("none", None, None)):
                start = time.monotonic()
                outcome = _tls_refusal(mtls.bootstrap, t, cert, key)
                print(f"client certificate {what}: {outcome}")
                assert outcome not in ("ok", "hang"), (what, outcome)
                assert time.monotonic() - start < 5, (what, outcome)
            # librdkafka with the expired certificate cannot connect, and says so
            errors, _ = _errors_of_client(broker.client_config("alice", "SASL_SSL", "SCRAM-SHA-512", **{
                "bootstrap.servers": mtls.bootstrap, "ssl.certificate.location": str(t.expired_cert),
                "ssl.key.location": str(t.expired_key)}))
            assert errors and errors[0].code() in (KafkaError._SSL, KafkaError._TRANSPORT,
                                                   KafkaError._ALL_BROKERS_DOWN), errors
            assert _tls_refusal(mtls.bootstrap, t, t.client_cert, t.client_key) == "ok"
            alice_meanwhile("after")
    finally:
        mtls.stop()
        broker.revoke(granted)


# ------------------------------------------------------------------------------------------------
# 6. certificate reload


SERVER_EXTENSIONS = (
    "subjectAltName = {san}\n"
    "basicConstraints = critical,CA:FALSE\n"
    "keyUsage = critical,digitalSignature,keyEncipherment\n"
    "extendedKeyUsage = serverAuth,clientAuth\n"
    "authorityKeyIdentifier = keyid"
)


def _new_server_cert(tls: TlsMaterial, d: Path, name: str) -> tuple[Path, Path]:
    """A new server certificate (own key, serial and CN) of the test CA, for the same host names."""
    d.mkdir(parents=True, exist_ok=True)
    return _sign(d, name, f"kshare-{name}", (tls.ca_cert, tls.ca_key),
                 extensions=SERVER_EXTENSIONS.format(san=_san(tls.hosts)))


def _install(cert: Path, key: Path, dest_cert: Path, dest_key: Path) -> None:
    """Replace kshare's files, each in one rename (a watcher never sees half a file)."""
    for src, dest in ((key, dest_key), (cert, dest_cert)):
        tmp = dest.with_suffix(".new")
        shutil.copyfile(src, tmp)
        os.replace(tmp, dest)


def _served(address: str, tls: TlsMaterial) -> dict[str, Any]:
    """The certificate a new TLS connection is served (verified against the test CA)."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        s = _client_context(tls).wrap_socket(raw, server_hostname=host)
        served = {"der": s.getpeercert(binary_form=True), **s.getpeercert()}
        s.unwrap()  # says goodbye (close_notify); hanging up is test_tls_hang_up_after_the_handshake_...
        return served


def _der(pem: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(pem.read_text())


def test_certificates_reload_on_sighup_and_on_file_change(secure: Secure):
    """New connections get the new certificate after SIGHUP, and after the files change (no signal,
    checked every 5 s); a connection opened before keeps working on its session."""
    broker, tls = secure.broker, secure.tls
    topic, _ = _new_topic(broker, 1)
    granted = broker.grant("alice", "topic", topic, "DESCRIBE")
    d = secure.workdir / "reload"
    first = _new_server_cert(tls, d, "reloaded-1")
    second = _new_server_cert(tls, d, "reloaded-2")
    seen: dict[str, Any] = {}

    async def main() -> None:
        before = await asyncio.to_thread(_served, secure.bootstrap, tls)
        seen["before"] = before
        old = await _open(secure.bootstrap, tls, "alice", broker.users["alice"], client_id="old")
        try:
            assert await old.topic_id(topic)
            # SIGHUP
            await asyncio.to_thread(_install, *first, secure.cert, secure.key)
            secure.proxy.send_signal(signal.SIGHUP)
            deadline = time.monotonic() + 10
            while (now := await asyncio.to_thread(_served, secure.bootstrap, tls))["der"] != _der(first[0]):
                assert time.monotonic() < deadline, ("SIGHUP did not reload", now.get("subject"))
                await asyncio.sleep(0.2)
            seen["sighup"] = now
            assert await old.topic_id(topic)  # the old session goes on
            # a file change only: the watcher (every 5 s) reloads
            await asyncio.sleep(1.1)  # a modification time that differs for sure
            await asyncio.to_thread(_install, *second, secure.cert, secure.key)
            changed = time.monotonic()
            while (now := await asyncio.to_thread(_served, secure.bootstrap, tls))["der"] != _der(second[0]):
                assert time.monotonic() - changed < 15, ("the file change did not reload", now.get("subject"))
                await asyncio.sleep(0.5)
            seen["watch"] = now
            seen["watch_s"] = time.monotonic() - changed
            assert await old.topic_id(topic)
        finally:
            await old.close()

    try:
        asyncio.run(main())
        assert seen["before"]["der"] == _der(tls.server_cert)
        assert seen["sighup"]["serialNumber"] != seen["before"]["serialNumber"]
        assert ((("commonName", "kshare-reloaded-1"),) in seen["sighup"]["subject"]), seen["sighup"]["subject"]
        assert ((("commonName", "kshare-reloaded-2"),) in seen["watch"]["subject"]), seen["watch"]["subject"]
        print(f"file change picked up after {seen['watch_s']:.1f} s")
        # librdkafka clients verifying the new certificate work
        _good_client_works(secure.conf("alice"), topic)
        assert any("reloaded (SIGHUP)" in line for line in secure.proxy.output)
        assert any("reloaded (files changed)" in line for line in secure.proxy.output)
    finally:
        broker.revoke(granted)


def test_tls_hang_up_after_the_handshake_leaves_no_traceback(secure: Secure):
    """Clients that complete the TLS handshake and close the socket at once, without close_notify (TCP
    health checks of load balancers, scanners, the reload test's first version), are routine: kshare
    must not log them as fatal errors with a traceback. A kshare of its own, so that the module's
    output checks stay about their own tests."""
    broker, tls = secure.broker, secure.tls
    state_topic = f"__kshare_state_{PREFIX}_hangup"
    granted = broker.grant("kshare", "topic", state_topic, *KSHARE_STATE_TOPIC_OPS)
    proxy = start_kshare(kshare_args(broker, tls, cert=secure.cert, key=secure.key,
                                       password_file=secure.password_file, state_topic=state_topic))
    try:
        host, _, port = proxy.bootstrap.rpartition(":")
        ctx = _client_context(tls)
        for _ in range(HANGUPS):
            with socket.create_connection((host, int(port)), timeout=10) as raw:
                ctx.wrap_socket(raw, server_hostname=host).close()
        _good_client_works_on(secure, proxy.bootstrap)
    finally:
        proxy.stop()
        broker.revoke(granted)
    fatal = sum("Fatal error" in line for line in proxy.output)
    print(f"{fatal} of {HANGUPS} hang-ups logged as fatal errors")
    assert _tracebacks(proxy.output) == [], (f"{fatal} of {HANGUPS} hang-ups logged as fatal errors:\n"
                                             + "".join(proxy.output[-30:]))
