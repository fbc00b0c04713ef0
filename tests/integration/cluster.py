"""A two-node Apache Kafka KRaft cluster for tests that need more than one broker.

Node 1 is broker + controller (the single-voter quorum), node 2 is a broker only; both are
:class:`tests.brokers.KafkaBroker` processes (same fetch, formatting, logging and process handling),
formatted with one cluster id. ``tests/brokers.py`` only runs single-node clusters, hence this.
"""

from __future__ import annotations

import time

from tests.brokers import KAFKA_3, BrokerError, KafkaBroker

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


# Three JVMs on a 2-core machine: small heaps, the C1 compiler only, serial GC (reference.md §10).
_THREE_NODE_JVM_OPTS = (
    "-Xms192m",
    "-Xmx448m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
    "-Djava.net.preferIPv4Stack=true",
)


class ThreeNodeCluster:
    """Three combined broker + controller KRaft nodes (a 3-voter quorum), as production clusters
    run: replication factor 3 and ``min.insync.replicas`` 2 for topics and internal topics.

    ``restart(node_id)`` is a rolling restart's step (SIGTERM: a controlled shutdown, leaders move
    first), ``restart(node_id, hard=True)`` a crash (SIGKILL). Node directories and ports stay.
    """

    def __init__(self, version: str = KAFKA_3, *, auto_create_topics: bool = True) -> None:
        self.version = version
        nodes = [KafkaBroker(version, node_id=i, auto_create_topics=auto_create_topics,
                             jvm_opts=_THREE_NODE_JVM_OPTS) for i in (1, 2, 3)]
        voters = ",".join(f"{n.node_id}@{n.host}:{n.controller_port}" for n in nodes)
        for n in nodes:
            n.cluster_id = nodes[0].cluster_id
            n.extra_config.update({
                "controller.quorum.voters": voters,
                "default.replication.factor": 3,
                "min.insync.replicas": 2,
                "offsets.topic.replication.factor": 3,
                "transaction.state.log.replication.factor": 3,
                "transaction.state.log.min.isr": 2,
                # a restarted node takes its leaderships back (the preferred leader), as by default
                "leader.imbalance.check.interval.seconds": 10,
            })
        self.nodes = {n.node_id: n for n in nodes}

    @property
    def bootstrap(self) -> str:
        return ",".join(n.bootstrap for n in self.nodes.values())

    def admin(self):
        return self.nodes[1].admin() if self.nodes[1].running else next(
            n.admin() for n in self.nodes.values() if n.running)

    def _start_all(self, nodes: list[KafkaBroker]) -> None:
        """Start nodes at once: each waits for a quorum the others make."""
        import threading

        errors: list[BaseException] = []

        def start(node: KafkaBroker) -> None:
            try:
                node.start()
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=start, args=(n,)) for n in nodes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]

    def start(self, timeout: float = 120.0) -> ThreeNodeCluster:
        t0 = time.monotonic()
        try:
            self._start_all(list(self.nodes.values()))
            self.wait_brokers(set(self.nodes), timeout)
        except BaseException:
            self.close()
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def wait_brokers(self, expected: set[int], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if set(self.admin().list_topics(timeout=5).brokers) == expected:
                    return
            except Exception:  # noqa: BLE001 - a node still starting
                pass
            if time.monotonic() > deadline:
                raise BrokerError(f"the cluster's brokers are not {sorted(expected)} after {timeout:.0f} s")
            time.sleep(0.2)

    def restart(self, node_id: int, *, hard: bool = False, down_s: float = 0.0) -> None:
        """Stop node ``node_id`` (SIGTERM, or SIGKILL with ``hard``), wait ``down_s``, start it again."""
        node = self.nodes[node_id]
        node.kill() if hard else node.stop(timeout=60)
        if down_s:
            time.sleep(down_s)
        node.start()
        self.wait_brokers(set(self.nodes))

    def close(self) -> None:
        for n in self.nodes.values():
            n.close()

    def __enter__(self) -> ThreeNodeCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
