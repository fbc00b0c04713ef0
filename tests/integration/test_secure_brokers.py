"""The secure test brokers themselves (issue 13): SASL and TLS listeners, SCRAM/PLAIN users and ACLs
enforced by Apache Kafka's StandardAuthorizer, on 3.9 and on 4.4 with native share groups.

Besides proving the fixtures, this file records the reference answers kshare must reproduce: the
error codes native Kafka 4.4 gives on the wire for share-group requests that its ACLs refuse
(:data:`tests.harness.security.NATIVE_SHARE_AUTH_ERRORS`, checked by ``test_native_share_authorization_error_codes``).
"""

from __future__ import annotations

import socket
import struct
import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer

from kshare.protocol import messages
from tests.harness.brokers import KafkaBroker
from tests.harness.clients import polled
from tests.harness.security import (
    NATIVE_SHARE_AUTH_ERRORS,
    set_earliest,
    share_poll,
)
from tests.harness.share import NONE, Joining
from tests.harness.tls import TlsMaterial

# ------------------------------------------------------------------------------------------------
# helpers


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _produce(conf: dict[str, Any], topic: str, values: list[bytes], timeout: float = 30.0) -> list[Any]:
    """Produce ``values``; the delivery errors (None for each success)."""
    producer = Producer(conf)
    results: list[Any] = []
    for v in values:
        producer.produce(topic, value=v, on_delivery=lambda err, _m: results.append(err))
    producer.flush(timeout)
    return results


def _consume(conf: dict[str, Any], topic: str, group: str, n: int, timeout: float = 30.0):
    """(values, errors) of a classic consumer of ``group`` reading ``topic`` from the start."""
    consumer = Consumer(
        {**conf, "group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False}
    )
    consumer.subscribe([topic])
    values: list[bytes] = []
    errors: list[KafkaError] = []
    try:
        for msg in polled(consumer, lambda: len(values) >= n, timeout, 0.5):
            if msg.error() is not None:
                errors.append(msg.error())
                if msg.error().code() in (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED):
                    break
                continue
            values.append(msg.value())
    finally:
        consumer.close()
    return values, errors


def _errors_until(conf: dict[str, Any], *, timeout: float = 20.0) -> list[KafkaError]:
    """Errors (error_cb) of a producer with ``conf`` that asks for metadata, until the first one."""
    errors: list[KafkaError] = []
    producer = Producer({**conf, "error_cb": errors.append, "reconnect.backoff.max.ms": 1000})
    deadline = time.monotonic() + timeout
    while not errors and time.monotonic() < deadline:
        with pytest.raises(Exception):  # noqa: B017 - nothing can be listed without a connection
            producer.list_topics(timeout=1)
        producer.poll(0.1)
    return errors


class RawClient:
    """Hand-built requests on one blocking connection, optionally authenticated with SASL/PLAIN.

    Independent of the product's clients (only kshare's message codec is used), for the reference
    answers of the native broker.
    """

    def __init__(self, address: str, user: str | None = None, password: str | None = None) -> None:
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=15)
        self.correlation = 0
        self.sasl_error: int | None = None
        if user is not None:
            self.sasl_error = self._sasl_plain(user, password or "")

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("connection closed by the broker")
            buf += chunk
        return bytes(buf)

    def request(self, api_key: int, version: int, spec: str, **fields: Any) -> Any:
        self.correlation += 1
        body = messages.message_class(spec)(**fields)
        self.sock.sendall(messages.encode_request(api_key, version, self.correlation, "secure-tests", body))
        (size,) = struct.unpack(">i", self._read(4))
        frame = self._read(size)
        (correlation,) = struct.unpack_from(">i", frame)
        assert correlation == self.correlation
        return messages.decode_response(api_key, version, memoryview(frame))

    def _sasl_plain(self, user: str, password: str) -> int:
        hs = self.request(17, 1, "SaslHandshakeRequest", mechanism="PLAIN")
        if hs.error_code:
            return hs.error_code
        auth = self.request(
            36, 2, "SaslAuthenticateRequest", auth_bytes=f"\0{user}\0{password}".encode()
        )
        return auth.error_code

    # -- share groups (v1: what librdkafka and the Java client of 4.4 send)
    def topic_id(self, topic: str) -> bytes:
        cls = messages.message_class("MetadataRequest")
        for _ in range(100):
            md = self.request(
                3, 12, "MetadataRequest", topics=[cls.MetadataRequestTopic(name=topic)],
                allow_auto_topic_creation=False,
            )
            t = md.topics[0]
            if t.error_code == 0 and t.topic_id != bytes(16):
                return t.topic_id
            time.sleep(0.1)
        raise AssertionError(f"no topic id for {topic}: {md}")

    def find_coordinator(self, group: str) -> Any:
        return self.request(10, 4, "FindCoordinatorRequest", key_type=0, coordinator_keys=[group])

    def heartbeat(self, group: str, member: str, epoch: int, topics: list[str] | None) -> Any:
        return self.request(
            76, 1, "ShareGroupHeartbeatRequest", group_id=group, member_id=member, member_epoch=epoch,
            rack_id=None, subscribed_topic_names=topics,
        )

    def join(self, group: str, topic: str, timeout: float = 30.0) -> tuple[str, int, Any]:
        """Heartbeat as a new member until assigned a partition (or an error): (member, epoch, last answer)."""
        joining = Joining(topic, timeout)
        while True:
            r = self.heartbeat(group, joining.member, joining.epoch, joining.topics)
            if not joining.coordinator_not_ready(r) and (outcome := joining.outcome(r)) is not None:
                return outcome
            time.sleep(0.2)

    def share_fetch(self, group: str, member: str, session_epoch: int, tid: bytes, partition: int = 0) -> Any:
        R = messages.message_class("ShareFetchRequest")
        return self.request(
            78, 1, "ShareFetchRequest", group_id=group, member_id=member, share_session_epoch=session_epoch,
            max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, max_records=100, batch_size=100,
            topics=[R.FetchTopic(topic_id=tid, partitions=[
                R.FetchPartition(partition_index=partition, acknowledgement_batches=[])])],
            forgotten_topics_data=[],
        )

    def share_ack(self, group: str, member: str, session_epoch: int, tid: bytes, partition: int = 0) -> Any:
        R = messages.message_class("ShareAcknowledgeRequest")
        return self.request(
            79, 1, "ShareAcknowledgeRequest", group_id=group, member_id=member,
            share_session_epoch=session_epoch,
            topics=[R.AcknowledgeTopic(topic_id=tid, partitions=[R.AcknowledgePartition(
                partition_index=partition, acknowledgement_batches=[
                    R.AcknowledgementBatch(first_offset=0, last_offset=0, acknowledge_types=[1])])])],
        )


def _partition_errors(resp: Any) -> list[int]:
    return [p.error_code for t in resp.responses for p in t.partitions]


# ------------------------------------------------------------------------------------------------
# fixtures of this file


@pytest.fixture(params=["kafka39_secure", "kafka44_secure"])
def secure_broker(request: pytest.FixtureRequest) -> KafkaBroker:
    return request.getfixturevalue(request.param)


# ------------------------------------------------------------------------------------------------
# the TLS material


def test_tls_material(tls_material: TlsMaterial):
    import ssl

    ctx = ssl.create_default_context(cafile=str(tls_material.ca_cert))
    ctx.load_cert_chain(tls_material.client_cert, tls_material.client_key)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tls_material.server_chain, tls_material.server_key)
    for path in (tls_material.expired_cert, tls_material.untrusted_cert, tls_material.server_p12):
        assert path.is_file()
    assert tls_material.hosts == ("127.0.0.1", "localhost")


# ------------------------------------------------------------------------------------------------
# authenticated clients with and without ACLs (3.9 and 4.4)


@pytest.mark.parametrize(
    ("protocol", "mechanism"),
    [
        ("SASL_PLAINTEXT", "SCRAM-SHA-256"),
        ("SASL_PLAINTEXT", "PLAIN"),
        ("SASL_SSL", "SCRAM-SHA-512"),
        ("SSL", None),  # mutual TLS: the client certificate's CN=alice is User:alice
    ],
)
def test_alice_with_acls_produces_and_consumes(secure_broker: KafkaBroker, protocol, mechanism):
    broker = secure_broker
    topic, group = _unique("alice-t"), _unique("alice-g")
    broker.create_topic(topic)  # on the PLAINTEXT set-up listener (anonymous super user)
    granted = broker.grant("alice", "topic", topic, "READ", "WRITE", "DESCRIBE")
    granted += broker.grant("alice", "group", group, "READ")
    try:
        conf = broker.client_config("alice", protocol, mechanism)
        values = [f"v{i}".encode() for i in range(5)]
        assert _produce(conf, topic, values) == [None] * len(values)
        got, errors = _consume(conf, topic, group, len(values))
        assert errors == []
        assert sorted(got) == values
    finally:
        broker.revoke(granted)
    assert broker.describe_acls("alice") == []


def test_bob_without_acls_is_refused(secure_broker: KafkaBroker):
    broker = secure_broker
    topic = _unique("bob-t")
    broker.create_topic(topic)
    broker.grant("alice", "topic", topic, "WRITE")  # someone else's ACL: bob still has none
    try:
        conf = broker.client_config("bob", "SASL_SSL", "SCRAM-SHA-256", **{"message.timeout.ms": 10000})
        results = _produce(conf, topic, [b"x"])
        assert [e.code() for e in results] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]

        md = Producer(conf).list_topics(topic, timeout=10)
        assert md.topics[topic].error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

        # with READ on his group but nothing on the topic, bob's consumer is refused the topic
        group = _unique("bob-g")
        broker.grant("bob", "group", group, "READ")
        got, errors = _consume(conf, topic, group, 1, timeout=20)
        assert got == []
        assert [e.code() for e in errors][:1] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    finally:
        broker.revoke(user="alice")
        broker.revoke(user="bob")


@pytest.mark.parametrize(("protocol", "mechanism"), [("SASL_PLAINTEXT", "SCRAM-SHA-256"),
                                                     ("SASL_SSL", "SCRAM-SHA-512"),
                                                     ("SASL_PLAINTEXT", "PLAIN")])
def test_wrong_password_fails_authentication(kafka39_secure: KafkaBroker, protocol, mechanism):
    conf = kafka39_secure.client_config("alice", protocol, mechanism, password="not-alice-secret")
    errors = _errors_until(conf)
    assert errors, "no error reported"
    assert errors[0].code() == KafkaError._AUTHENTICATION, errors
    # an unknown user, the same
    errors = _errors_until(kafka39_secure.client_config("mallory", protocol, mechanism, password="x"))
    assert errors and errors[0].code() == KafkaError._AUTHENTICATION, errors


def test_tls_refusals(kafka39_secure: KafkaBroker, tls_material: TlsMaterial):
    broker = kafka39_secure
    # a client that trusts another CA refuses the broker's certificate
    conf = broker.client_config("alice", "SASL_SSL", **{"ssl.ca.location": str(tls_material.other_ca_cert)})
    errors = _errors_until(conf)
    assert errors and errors[0].code() in (KafkaError._SSL, KafkaError._TRANSPORT), errors
    # mutual TLS: an expired client certificate, and a certificate of an untrusted CA, are refused
    for cert, key in ((tls_material.expired_cert, tls_material.expired_key),
                      (tls_material.untrusted_cert, tls_material.untrusted_key)):
        conf = broker.client_config(None, "SSL", **{"ssl.certificate.location": str(cert),
                                                    "ssl.key.location": str(key)})
        errors = _errors_until(conf)
        assert errors and errors[0].code() in (KafkaError._SSL, KafkaError._TRANSPORT), errors
    # a plaintext SASL client on the TLS port gets nowhere
    conf = broker.client_config("alice", "SASL_PLAINTEXT", **{"bootstrap.servers": broker.secure_bootstrap["SASL_SSL"]})
    errors = _errors_until(conf)
    assert errors, "a plaintext client on the TLS port was not refused"
    # and a good client is unaffected
    assert Producer(broker.client_config("admin", "SASL_SSL")).list_topics(timeout=10).brokers


# ------------------------------------------------------------------------------------------------
# native share groups (Kafka 4.4) with ACLs


def _alice_may_read(broker: KafkaBroker, prefix: str) -> tuple[str, str, list[bytes], list[Any]]:
    """A new topic with 5 records (``<prefix>0``...) and a share group starting at the earliest
    record, alice granted READ on both (and DESCRIBE on the topic): (topic, group, values, grants)."""
    topic, group = _unique(f"{prefix}-share-t"), _unique(f"{prefix}-share-g")
    broker.create_topic(topic)
    set_earliest(broker.admin(), group)
    values = [f"{prefix}{i}".encode() for i in range(5)]
    assert _produce({"bootstrap.servers": broker.bootstrap}, topic, values) == [None] * 5
    granted = broker.grant("alice", "topic", topic, "READ", "DESCRIBE")
    granted += broker.grant("alice", "group", group, "READ")
    return topic, group, values, granted


@pytest.mark.parametrize("protocol", ["SASL_PLAINTEXT", "SASL_SSL"])
def test_native_share_consumer_with_acls(kafka44_secure: KafkaBroker, protocol):
    broker = kafka44_secure
    topic, group, values, granted = _alice_may_read(broker, "s")
    try:
        got, errors = share_poll(broker.client_config("alice", protocol), topic, group, want=len(values), timeout=30)
        assert sorted(got) == values
        assert errors == []
    finally:
        broker.revoke(granted)
    bob = broker.client_config("bob", protocol)
    try:
        # bob, with no ACLs at all, reads nothing and is told why (FindCoordinator is refused first)
        got, errors = share_poll(bob, topic, _unique("bob-share"), want=0, timeout=15)
        assert got == []
        assert errors[:1] == [KafkaError.GROUP_AUTHORIZATION_FAILED], errors
        # READ on his group, nothing on the topic: the heartbeat is refused the topic
        bob_group = _unique("bob-share")
        set_earliest(broker.admin(), bob_group)
        broker.grant("bob", "group", bob_group, "READ")
        got, errors = share_poll(bob, topic, bob_group, want=0, timeout=15)
        assert got == []
        assert errors[:1] == [KafkaError.TOPIC_AUTHORIZATION_FAILED], errors
        # and DESCRIBE on the topic (he is assigned the partition) but no READ: ShareFetch refuses it
        broker.grant("bob", "topic", topic, "DESCRIBE")
        got, errors = share_poll(bob, topic, bob_group, want=0, timeout=15)
        assert got == []
        assert errors[:1] == [KafkaError.TOPIC_AUTHORIZATION_FAILED], errors
    finally:
        broker.revoke(user="bob")


def test_native_share_authorization_error_codes(kafka44_secure: KafkaBroker):
    """The wire answers of native share groups to what the ACLs refuse: kshare's reference."""
    broker = kafka44_secure
    address = broker.secure_bootstrap["SASL_PLAINTEXT"]
    topic = _unique("ref-t")
    broker.create_topic(topic)
    assert _produce({"bootstrap.servers": broker.bootstrap}, topic, [b"r0", b"r1"]) == [None, None]
    with RawClient(broker.bootstrap) as setup:  # the anonymous super user
        tid = setup.topic_id(topic)
        # a fresh Kafka creates the group coordinator's topic on the first FindCoordinator: have it
        # ready, so that every answer below is about authorization
        warm = _unique("ref-warm")
        setup.find_coordinator(warm)
        _, _, r = setup.join(warm, topic)
        assert r.error_code == NONE and r.assignment.topic_partitions, r
    observed: dict[str, tuple[int, int | None]] = {}
    try:
        with RawClient(address, "bob", "wrong") as c:
            observed["sasl_wrong_password"] = (c.sasl_error, None)

        # bob: topic READ+DESCRIBE, nothing on the group
        g1 = _unique("ref-g1")
        bob_topic = broker.grant("bob", "topic", topic, "READ", "DESCRIBE")
        with RawClient(address, "bob", broker.users["bob"]) as c:
            assert c.sasl_error == 0
            _, _, r = c.join(g1, topic)
            observed["heartbeat_without_group_read"] = (r.error_code, None)
            f = c.share_fetch(g1, str(uuid.uuid4()), 0, tid)
            observed["fetch_without_group_read"] = (f.error_code, (_partition_errors(f) or [None])[0])
        broker.revoke(bob_topic)

        # carol: READ on her groups, nothing on the topic
        g2 = _unique("ref-g2")
        broker.grant("carol", "group", "ref-g", "READ", pattern="PREFIXED")
        with RawClient(address, "carol", broker.users["carol"]) as c:
            _, _, r = c.join(g2, topic)
            observed["heartbeat_without_topic_acl"] = (r.error_code, None)

        # carol: DESCRIBE on the topic (joins and is assigned the partition) but no READ
        broker.grant("carol", "topic", topic, "DESCRIBE")
        g3 = _unique("ref-g3")
        with RawClient(address, "carol", broker.users["carol"]) as c:
            member, _epoch, r = c.join(g3, topic)
            observed["heartbeat_with_topic_describe_only"] = (r.error_code, None)
            assert r.assignment is not None and r.assignment.topic_partitions, r
            f = c.share_fetch(g3, member, 0, tid)
            observed["fetch_without_topic_read"] = (f.error_code, (_partition_errors(f) or [None])[0])
            assert all(not p.acquired_records for t in f.responses for p in t.partitions)
            a = c.share_ack(g3, member, 1, tid)
            observed["ack_without_topic_read"] = (a.error_code, (_partition_errors(a) or [None])[0])
            d = c.request(77, 1, "ShareGroupDescribeRequest", group_ids=[g3], include_authorized_operations=False)
            observed["describe_with_group_read"] = (NONE, d.groups[0].error_code)
            x = c.request(42, 2, "DeleteGroupsRequest", groups_names=[g3])
            observed["delete_without_group_delete"] = (NONE, x.results[0].error_code)
        with RawClient(address, "bob", broker.users["bob"]) as c:
            d = c.request(77, 1, "ShareGroupDescribeRequest", group_ids=[g3], include_authorized_operations=False)
            observed["describe_without_group_describe"] = (NONE, d.groups[0].error_code)
    finally:
        broker.revoke(user="bob")
        broker.revoke(user="carol")
    print("native Kafka 4.4 share-group authorization answers:", observed)
    assert observed == NATIVE_SHARE_AUTH_ERRORS


@pytest.mark.parametrize("protocol", ["SASL_SSL", "SSL"])
def test_native_java_share_consumer_with_acls(kafka44_secure: KafkaBroker, protocol):
    """Apache Kafka's Java KafkaShareConsumer (tests/java driver) reads as alice over TLS with
    ``java_client_config`` (SCRAM over SASL_SSL; the client certificate on SSL)."""
    from tests.harness.java import JavaShareConsumer, java_share_driver

    broker = kafka44_secure
    topic, group, values, granted = _alice_may_read(broker, "j")
    conf = broker.java_client_config("alice", protocol, "SCRAM-SHA-512")
    java = JavaShareConsumer(java_share_driver(), conf.pop("bootstrap.servers"), group, topic,
                             max_records=len(values), timeout_ms=30_000, configs=conf).start()
    try:
        rc = java.wait(60)
    finally:
        java.kill()
        broker.revoke(granted)
    assert rc == 0, java.diagnostics()
    assert sorted(java.values()) == values, java.diagnostics()
