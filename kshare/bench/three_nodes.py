"""Three Apache Kafka KRaft nodes as one cluster, stopped, killed and restarted one at a time:
``kshare bench --only failover`` and ``tests/integration/test_broker_roll.py``."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from .brokers import KAFKA_3, BrokerError, KafkaBroker, _admin

# Three JVMs on a 2-core machine: small heaps, the C1 compiler only, serial GC (reference.md §10).
THREE_NODE_JVM_OPTS = (
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

    ``share_groups=True`` (Kafka 4.x) formats every node with share groups and gives the share
    coordinator's state topic replication factor 3 and ``min.isr`` 2 too. ``config`` adds to (or
    overrides) every node's server.properties.

    ``restart(node_id)`` is a rolling restart's step (SIGTERM: a controlled shutdown, leaders move
    first), ``restart(node_id, hard=True)`` a crash (SIGKILL); ``stop_node`` / ``start_node`` are
    the two halves. Node directories and ports stay. Used by ``kshare bench --only failover`` and
    ``tests/integration/test_broker_roll.py``.
    """

    def __init__(
        self,
        version: str = KAFKA_3,
        *,
        share_groups: bool = False,
        auto_create_topics: bool = True,
        config: Mapping[str, object] | None = None,
        jvm_opts: Iterable[str] = THREE_NODE_JVM_OPTS,
    ) -> None:
        self.version = version
        self.share_groups = share_groups
        nodes = [
            KafkaBroker(version, node_id=i, share_groups=share_groups, auto_create_topics=auto_create_topics,
                        jvm_opts=jvm_opts)
            for i in (1, 2, 3)
        ]
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
            if share_groups:
                n.extra_config.update({
                    "share.coordinator.state.topic.replication.factor": 3,
                    "share.coordinator.state.topic.min.isr": 2,
                })
            n.extra_config.update(config or {})
        self.nodes = {n.node_id: n for n in nodes}
        self.start_seconds: float | None = None

    @property
    def bootstrap(self) -> str:
        return ",".join(n.bootstrap for n in self.nodes.values())

    def admin(self, **conf: Any):
        """An AdminClient bootstrapped from the running nodes (any of them answers for the cluster)."""
        running = [n.bootstrap for n in self.nodes.values() if n.running] or [self.bootstrap]
        return _admin(",".join(running), **conf)

    def _start_all(self, nodes: list[KafkaBroker]) -> None:
        """Start nodes at once: each waits for a quorum the others make."""
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

    def leaders(self, topic: str) -> dict[int, int]:
        """Partition -> leader's node id (-1: none) of ``topic``, as the cluster's metadata says now."""
        md = self.admin().list_topics(topic=topic, timeout=10).topics.get(topic)
        return {} if md is None else {p: pm.leader for p, pm in md.partitions.items()}

    def under_replicated(self) -> list[str]:
        """``topic-partition`` of every partition whose in-sync replicas are fewer than its replicas."""
        md = self.admin().list_topics(timeout=10)
        return [f"{t}-{p}" for t, tm in md.topics.items() for p, pm in tm.partitions.items()
                if len(pm.isrs) < len(pm.replicas)]

    def wait_in_sync(self, timeout: float = 120.0) -> bool:
        """Until every partition of every topic has all its replicas in sync (what a rolling restart
        waits for before the next broker); False if not within ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(Exception):
                if not self.under_replicated():
                    return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)

    def wait_preferred_leaders(self, topics: Iterable[str] | None = None, timeout: float = 60.0) -> bool:
        """Until every partition of ``topics`` (None: of every topic) is led by its preferred (first)
        replica again, as ``auto.leader.rebalance.enable`` brings it back; False if not within ``timeout``."""
        wanted = None if topics is None else list(topics)
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(Exception):
                md = self.admin().list_topics(timeout=10)
                names = list(md.topics) if wanted is None else wanted
                if all(
                    t in md.topics and md.topics[t].partitions
                    and all(pm.replicas and pm.leader == pm.replicas[0] for pm in md.topics[t].partitions.values())
                    for t in names
                ):
                    return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)

    def stop_node(self, node_id: int, *, hard: bool = False, timeout: float = 60.0) -> None:
        """SIGTERM node ``node_id`` and wait for it to exit (a controlled shutdown), or SIGKILL it."""
        node = self.nodes[node_id]
        node.kill() if hard else node.stop(timeout=timeout)

    def start_node(self, node_id: int, timeout: float = 60.0) -> None:
        """Start node ``node_id`` again and wait until the cluster's metadata has every broker."""
        self.nodes[node_id].start()
        self.wait_brokers(set(self.nodes), timeout)

    def restart(self, node_id: int, *, hard: bool = False, down_s: float = 0.0) -> None:
        """Stop node ``node_id`` (SIGTERM, or SIGKILL with ``hard``), wait ``down_s``, start it again."""
        self.stop_node(node_id, hard=hard)
        if down_s:
            time.sleep(down_s)
        self.start_node(node_id)

    def close(self) -> None:
        """Stop the nodes at once (one after the other, the last would wait for a quorum that is gone)."""
        threads = [threading.Thread(target=n.close) for n in self.nodes.values()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def __enter__(self) -> ThreeNodeCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

