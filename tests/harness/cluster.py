"""Multi-node Apache Kafka KRaft clusters for tests that need more than one broker.

Node 1 is broker + controller (the single-voter quorum), node 2 is a broker only; both are
:class:`kshare.bench.brokers.KafkaBroker` processes (same fetch, formatting, logging and process handling),
formatted with one cluster id. :class:`ThreeNodeCluster` (three broker + controller nodes, replication
factor 3) is :class:`kshare.bench.three_nodes.ThreeNodeCluster`, re-exported here.
"""

from __future__ import annotations

import time

# the three-node cluster lives in the package (``kshare bench --only failover`` runs it too)
from kshare.bench.brokers import KAFKA_3, BrokerError, KafkaBroker
from kshare.bench.three_nodes import THREE_NODE_JVM_OPTS, ThreeNodeCluster  # noqa: F401 - re-exported

# Two JVMs on a 2-core machine: keep each small.
_JVM_OPTS = (
    "-Xms128m",
    "-Xmx384m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
    "-Djava.net.preferIPv4Stack=true",
)


class KafkaCluster:
    """Node 1 = broker + controller, node 2 = broker, sharing one KRaft quorum (node 1)."""

    def __init__(self, version: str = KAFKA_3, *, auto_create_topics: bool = False) -> None:
        self.version = version
        self.controller = KafkaBroker(
            version, node_id=1, auto_create_topics=auto_create_topics, jvm_opts=_JVM_OPTS
        )
        voters = f"1@{self.controller.host}:{self.controller.controller_port}"
        self.broker = KafkaBroker(
            version,
            node_id=2,
            auto_create_topics=auto_create_topics,
            jvm_opts=_JVM_OPTS,
            config={
                "process.roles": "broker",
                "controller.quorum.voters": voters,
            },
        )
        b = self.broker  # no CONTROLLER listener on a broker-only node
        b.extra_config["listeners"] = f"PLAINTEXT://{b.host}:{b.port}"
        b.cluster_id = self.controller.cluster_id
        self.nodes = {1: self.controller, 2: self.broker}

    @property
    def bootstrap(self) -> str:
        return ",".join(n.bootstrap for n in self.nodes.values())

    def start(self, timeout: float = 90.0) -> KafkaCluster:
        t0 = time.monotonic()
        try:
            self.controller.start()
            self.broker.start()  # its readiness probe waits until node 2 is in the metadata
            admin = self.controller.admin()
            deadline = t0 + timeout
            while set(admin.list_topics(timeout=5).brokers) != {1, 2}:
                if time.monotonic() > deadline:
                    raise BrokerError(f"cluster not formed after {timeout:.0f} s")
                time.sleep(0.1)
        except BaseException:
            self.close()
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def create_topic(self, name: str, assignment: list[list[int]], timeout: float = 30.0) -> str:
        """Create ``name`` with explicit replicas per partition and wait until every leader is known
        to both brokers."""
        from confluent_kafka.admin import NewTopic

        admin = self.controller.admin()
        fut = admin.create_topics(
            [NewTopic(name, num_partitions=len(assignment), replica_assignment=assignment)],
            operation_timeout=timeout,
            request_timeout=timeout,
        )[name]
        fut.result(timeout)
        deadline = time.monotonic() + timeout
        for node in self.nodes.values():
            node_admin = node.admin()
            while True:
                md = node_admin.list_topics(topic=name, timeout=5).topics.get(name)
                if (
                    md is not None
                    and md.error is None
                    and len(md.partitions) == len(assignment)
                    and all(p.leader == assignment[i][0] for i, p in md.partitions.items())
                ):
                    break
                if time.monotonic() > deadline:
                    raise BrokerError(f"topic {name} not ready on node {node.node_id}: {md!r}")
                time.sleep(0.1)
        return name

    def close(self) -> None:
        # broker first: a broker without its controller waits for it on shutdown
        self.broker.close()
        self.controller.close()

    def __enter__(self) -> KafkaCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
