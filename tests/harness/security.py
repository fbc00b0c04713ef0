"""Secured clusters for the security tests: what Apache Kafka 4.4 answers to principals that lack an
ACL, kshare in front of a secure broker as a child process, and librdkafka share consumers that
report the error codes they met."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException, ShareConsumer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from kshare.protocol.codes import ErrorCode
from tests.harness.brokers import KafkaBroker
from tests.harness.proxies import ProxyProcess
from tests.harness.share import NONE, wait_until
from tests.harness.tls import TlsMaterial

TOPIC_AUTHORIZATION_FAILED = ErrorCode.TOPIC_AUTHORIZATION_FAILED
GROUP_AUTHORIZATION_FAILED = ErrorCode.GROUP_AUTHORIZATION_FAILED
SASL_AUTHENTICATION_FAILED = ErrorCode.SASL_AUTHENTICATION_FAILED

# What Apache Kafka 4.4.0 answers (observed on the wire, ShareGroupHeartbeat v1, ShareFetch v1,
# ShareAcknowledge v1, SaslAuthenticate v2), by scenario -> (top-level error, partition error or None).
NATIVE_SHARE_AUTH_ERRORS: dict[str, tuple[int, int | None]] = {
    # ShareGroupHeartbeat of a new member; READ+DESCRIBE on the topic, nothing on the group
    "heartbeat_without_group_read": (GROUP_AUTHORIZATION_FAILED, None),
    # ShareGroupHeartbeat of a new member; READ on the group, nothing on the subscribed topic
    "heartbeat_without_topic_acl": (TOPIC_AUTHORIZATION_FAILED, None),
    # ShareGroupHeartbeat; READ on the group, only DESCRIBE on the topic (joins, gets the partition)
    "heartbeat_with_topic_describe_only": (NONE, None),
    # ShareFetch of an assigned partition by that member (group READ, topic DESCRIBE but no READ)
    "fetch_without_topic_read": (NONE, TOPIC_AUTHORIZATION_FAILED),
    # ShareFetch by a principal without READ on the group (READ+DESCRIBE on the topic)
    "fetch_without_group_read": (GROUP_AUTHORIZATION_FAILED, None),
    # ShareAcknowledge of that partition by the member without topic READ
    "ack_without_topic_read": (NONE, TOPIC_AUTHORIZATION_FAILED),
    # ShareGroupDescribe v1 of an existing share group, by a principal without DESCRIBE on it
    # (group-level error) / with READ on it (READ implies DESCRIBE)
    "describe_without_group_describe": (NONE, GROUP_AUTHORIZATION_FAILED),
    "describe_with_group_read": (NONE, NONE),
    # DeleteGroups v2 of that (non-empty) share group without DELETE on it (per-group error)
    "delete_without_group_delete": (NONE, GROUP_AUTHORIZATION_FAILED),
    # SaslAuthenticate (PLAIN) with a wrong password
    "sasl_wrong_password": (SASL_AUTHENTICATION_FAILED, None),
}

# what the proxy's own user needs: ALL on its state topic, READ (implies DESCRIBE) on the topics it serves
KSHARE_STATE_TOPIC_OPS = ("ALL",)
KSHARE_TOPIC_OPS = ("READ",)  # READ implies DESCRIBE


def kshare_args(broker: KafkaBroker, tls: TlsMaterial, *, cert: Path, key: Path, password_file: Path,
                 state_topic: str, client_ca: Path | None = None) -> list[str]:
    args = [
        "--upstream", broker.secure_bootstrap["SASL_SSL"],
        "--upstream-security-protocol", "SASL_SSL",
        "--upstream-sasl-mechanism", "SCRAM-SHA-512",
        "--upstream-sasl-username", "kshare",
        "--upstream-sasl-password-file", str(password_file),
        "--upstream-tls-ca", str(tls.ca_cert),
        "--tls-cert", str(cert), "--tls-key", str(key),
        "--state-topic", state_topic, "--state-topic-partitions", "1",
    ]
    if client_ca is not None:
        args += ["--tls-client-ca", str(client_ca)]
    return args


def start_kshare(args: list[str]) -> ProxyProcess:
    """Start ``kshare proxy`` and wait until its share state is loaded (kshare's ACLs suffice)."""
    proxy = ProxyProcess(*args).start()
    try:
        wait_until(lambda: any("share state loaded" in line for line in proxy.output), 30,
                   "kshare to load its share state as user kshare")
    except AssertionError:
        proxy.stop()
        raise AssertionError("kshare did not load its state:\n" + "".join(proxy.output[-40:])) from None
    return proxy


def set_earliest(admin: AdminClient | dict[str, Any], group: str) -> None:
    """share.auto.offset.reset=earliest for ``group`` (a share group starts at the end by default),
    through ``admin`` (or an AdminClient of the client settings ``admin``): IncrementalAlterConfigs."""
    if isinstance(admin, dict):
        admin = AdminClient(admin)
    entry = ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)
    for fut in admin.incremental_alter_configs(
            [ConfigResource(ResourceType.GROUP, group, incremental_configs=[entry])]).values():
        fut.result(30)


def share_poll(conf: dict[str, Any], topic: str, group: str, *, want: int, timeout: float):
    """(values, error codes) of a librdkafka ShareConsumer: until ``want`` records, or (want=0) the
    first error, or the timeout."""
    errors: list[int] = []
    consumer = ShareConsumer({**conf, "group.id": group, "error_cb": lambda e: errors.append(e.code())})
    consumer.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                msgs = consumer.poll(0.5)
            except KafkaException as exc:
                errors.append(exc.args[0].code())
                msgs = []
            for m in msgs:
                if m.error() is not None:
                    if m.error().code() != KafkaError._PARTITION_EOF:
                        errors.append(m.error().code())
                else:
                    got.append(m.value())
            if (want and len(got) >= want) or (not want and errors):
                break
    finally:
        consumer.close()
    return got, errors


def start_secure_kshare(broker: KafkaBroker, tls: TlsMaterial, workdir: Path, prefix: str, *, cert: Path,
                        key: Path) -> tuple[ProxyProcess, list[Any], Path]:
    """kshare as the user ``kshare`` (its password in a file of ``workdir``) in front of ``broker``'s
    SASL_SSL listener, serving TLS with ``cert``: granted what it needs on its state topic
    (``__kshare_state_<prefix>``) and on the topics starting with ``prefix``, started and loaded.
    (proxy, the grants to revoke, the password file)."""
    password_file = workdir / "kshare-password"
    password_file.write_text(broker.users["kshare"])
    password_file.chmod(0o600)
    state_topic = f"__kshare_state_{prefix}"
    granted = broker.grant("kshare", "topic", state_topic, *KSHARE_STATE_TOPIC_OPS)
    granted += broker.grant("kshare", "topic", prefix, *KSHARE_TOPIC_OPS, pattern="PREFIXED")
    proxy = start_kshare(kshare_args(broker, tls, cert=cert, key=key, password_file=password_file,
                                     state_topic=state_topic))
    return proxy, granted, password_file
