"""Assemble a running kshare: the proxy, the share-group service behind it, metrics and readiness."""

from __future__ import annotations

import asyncio
import logging

from .proxy.config import ProxyConfig
from .proxy.server import Proxy

# The share-group engine (and aiokafka under it) and the instance group are imported only by a
# KShare that runs them: a proxy started without share groups loads neither.
log = logging.getLogger("kshare")


def peer_security(config: ProxyConfig):
    """How one proxy of an instance group reaches another: through its client listener (TLS if the
    listeners have it, trusting ``--tls-client-ca`` or the system CAs and the certificates of this
    proxy's own chain, presenting this proxy's own certificate where client certificates are
    required: ``kshare.proxy.tls.peer_context``) and, through it, authenticated to the cluster with
    kshare's own SASL credentials."""
    import dataclasses

    from .proxy.tls import peer_context

    up = config.upstream_security
    tls = None
    if config.tls is not None:
        tls = peer_context(config.tls.cert, config.tls.key, config.tls.client_ca)
    return dataclasses.replace(up, ssl=tls)


class KShare:
    """The proxy and (unless disabled) the share-group service, started and stopped together.

    Metrics and readiness are collectors wired in here; the layers below only keep counts.
    """

    def __init__(self, config: ProxyConfig, *, share_groups: bool = True, store=None,
                 metrics_port: int | None = None, metrics_host: str = "0.0.0.0") -> None:
        from .metrics import Metrics, MetricsServer

        self.config = config
        self.proxy = Proxy(config)
        self.service = None
        if share_groups:
            from .share.service import ShareGroupService
            from .share.upstream import UpstreamCluster

            bootstrap = [f"{h}:{p}" for h, p in config.upstream]
            name = config.instance_group
            if store is None:
                from .share.state.topic_store import TopicStateStore

                store = TopicStateStore(
                    bootstrap,
                    topic=config.state_topic,
                    partitions=config.state_topic_partitions,
                    replication_factor=config.state_topic_replication_factor,
                    write_timeout_s=config.state_write_timeout_s,
                    # an instance group's proxy writes only the state partitions it owns, each
                    # through a transactional producer that fences the previous owner
                    transactional_prefix=f"kshare-state.{name}.{config.state_topic}." if name else None,
                    security=config.upstream_security,
                )
            ownership = None
            if name:
                import uuid

                from .share.ownership import GroupOwnership, Instance

                me = Instance(str(uuid.uuid4()), config.advertised, config.bootstrap_port)
                ownership = GroupOwnership(me.id, config.state_topic_partitions)
            upstream = UpstreamCluster(list(config.upstream), security=config.upstream_security)
            self.service = ShareGroupService(self.proxy, store, upstream,
                                             limits=config.group_limits, ownership=ownership,
                                             record_cache_bytes=config.record_cache_bytes)
            if name:
                from .share.instance_group import InstanceGroup, heartbeat_ms
                from .share.peers import PeerClient

                self.service.instances = InstanceGroup(
                    bootstrap, name, config.state_topic, me, self.service.apply_ownership,
                    session_timeout_ms=config.instance_session_timeout_ms,
                    # short: the others learn of a rebalance (a proxy leaving or joining) at their next heartbeat
                    heartbeat_interval_ms=heartbeat_ms(config.instance_session_timeout_ms),
                    client_config=config.upstream_security.aiokafka_kwargs(),
                    by_topic=config.instance_leadership == "topic")
                security = peer_security(config)
                self.service.peers = PeerClient(security=security)
                if self.proxy.tls is not None and security.ssl is not None and config.tls is not None:
                    from .proxy.tls import refresh_peer_context

                    files, peer_ssl = config.tls, security.ssl
                    self.proxy.tls.reloaded.append(lambda: refresh_peer_context(peer_ssl, files.cert, files.key))
                store.on_fenced = self.service.fenced
            self.service.register(self.proxy)
        self.metrics = Metrics(self.proxy, self.service)
        self.metrics_server = None
        if metrics_port is not None:
            self.metrics_server = MetricsServer(self.metrics, metrics_host, metrics_port)

    @property
    def ready(self) -> bool:
        return bool(self.metrics.readiness.status()["ready"])

    async def start(self) -> None:
        if self.metrics_server is not None:
            await self.metrics_server.start()
        await self.proxy.start()
        if self.service is not None:
            await self.service.start()

    async def wait_ready(self, timeout: float = 60.0) -> None:
        await self.proxy.wait_ready(timeout)
        if self.service is not None:
            await self.service.wait_loaded(timeout)

    def reload_tls(self) -> None:
        self.proxy.reload_tls()

    async def stop(self) -> None:
        if self.metrics_server is not None:
            await self.metrics_server.stop()
        if self.service is not None:
            # the share consumers acknowledge what they hold while their connections stay open
            held = await self.service.drain(self.config.drain_timeout_s)
            if not held:
                # an instance group's proxy moves its clients to the others before it closes their
                # connections (records still held are released at the close, written before it leaves)
                await self.service.leave_instance_group()
        await self.proxy.stop()
        if self.service is not None:
            # the closed connections' connection_lost callbacks run on the next loop turn: their
            # share sessions end and release what their members held, before the service stops
            await asyncio.sleep(0)
            await self.service.stop()
