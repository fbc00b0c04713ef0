"""Settings of one proxy instance."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

from ..security import ClientSecurity
from .tls import TLSFiles


@dataclass(frozen=True, slots=True)
class BrokerLimits:
    """Broker-level bounds on group configs (``group.share.*``), Apache Kafka 4.4's defaults.

    Settings of the proxy as a broker; the share-group engine checks group configs against them
    (``kshare.share.config``, which also reads them from ``--group-limit NAME=VALUE``)."""

    min_record_lock_duration_ms: int = 15_000
    max_record_lock_duration_ms: int = 60_000
    min_session_timeout_ms: int = 45_000
    max_session_timeout_ms: int = 60_000
    min_heartbeat_interval_ms: int = 5_000
    max_heartbeat_interval_ms: int = 15_000
    min_delivery_count_limit: int = 2
    max_delivery_count_limit: int = 10
    max_record_locks_cap: int = 4_000
    max_group_size: int = 200  # group.share.max.size
    max_share_sessions: int = 2000  # group.share.max.share.sessions


@dataclass
class ProxyConfig:
    upstream: list[tuple[str, int]]
    listen_host: str = "127.0.0.1"
    bootstrap_port: int = 9192
    # Broker N listens on broker_port_base + N, so a restarted proxy hands out the same addresses.
    # None: bootstrap_port + 1. 0: the OS picks a port per broker (tests).
    broker_port_base: int | None = None
    advertised_host: str | None = None
    max_frame_bytes: int = 100 * 1024 * 1024  # Kafka's socket.request.max.bytes default
    upstream_connect_timeout: float = 10.0
    # Durable share state. Not "__share_group_state": Kafka 3.9 reserves that name as an internal
    # topic (produce fails with INVALID_TOPIC_EXCEPTION) and Kafka 4.x's own share coordinator uses it.
    state_topic: str = "__kshare_share_group_state"
    state_topic_partitions: int = 10
    state_topic_replication_factor: int | None = None  # None: min(3, brokers)
    # bounds every state write, leader moves ridden through included (sent again for 2/3 of it)
    state_write_timeout_s: float = 30.0
    # on SIGTERM: how long share consumers may take to acknowledge what they hold (0: not at all)
    drain_timeout_s: float = 10.0
    group_limits: BrokerLimits = field(default_factory=BrokerLimits)
    record_cache_bytes: int = 256 << 20  # raw batches cached for share fetches, all partitions together
    # Several proxies as one service: those started with the same name (and cluster and state
    # topic) split the share-partitions through a consumer group (docs/design/scale-out.md).
    instance_group: str | None = None
    instance_session_timeout_ms: int = 10_000
    instance_leadership: str = "topic"  # or "state-partition" (docs/design/scale-out.md)
    # TLS on the client listeners (None: plaintext), and how kshare's own connections (and the
    # relay's, for TLS) reach the cluster (docs/guide/security.md)
    tls: TLSFiles | None = None
    upstream_security: ClientSecurity = field(default_factory=ClientSecurity)

    @property
    def advertised(self) -> str:
        if self.advertised_host:
            return self.advertised_host
        if self.listen_host in ("0.0.0.0", "::", ""):
            return socket.getfqdn()
        return self.listen_host

    def broker_port(self, node_id: int) -> int:
        if self.broker_port_base == 0:
            return 0
        base = self.bootstrap_port + 1 if self.broker_port_base is None else self.broker_port_base
        port = base + node_id
        if not 0 < port < 65536:
            raise ValueError(
                f"broker {node_id} maps to port {port}; choose --broker-port-base so base + node id is a valid port"
            )
        return port
