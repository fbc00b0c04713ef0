"""Assemble a running kshare: the proxy plus the share-group service behind it."""

from __future__ import annotations

import logging

from .proxy.config import ProxyConfig
from .proxy.server import Proxy

log = logging.getLogger("kshare")


class KShare:
    """The proxy and (unless disabled) the share-group service, started and stopped together."""

    def __init__(self, config: ProxyConfig, *, share_groups: bool = True, store=None,
                 metrics_port: int | None = None, metrics_host: str = "0.0.0.0") -> None:
        from .metrics import METRICS, MetricsServer, proxy_gauges, share_gauges

        self.config = config
        self.proxy = Proxy(config)
        self.service = None
        self.metrics = None
        METRICS.gauge_sources = [lambda: proxy_gauges(self.proxy)]
        if share_groups:
            from .share.service import ShareGroupService
            from .share.upstream import UpstreamCluster

            if store is None:
                from .share.state_topic import TopicStateStore

                store = TopicStateStore(
                    [f"{h}:{p}" for h, p in config.upstream],
                    topic=config.state_topic,
                    partitions=config.state_topic_partitions,
                    replication_factor=config.state_topic_replication_factor,
                )
            self.service = ShareGroupService(self.proxy, store, UpstreamCluster(list(config.upstream)),
                                             limits=config.group_limits)
            self.service.register(self.proxy)
            METRICS.gauge_sources.append(lambda: share_gauges(self.service))
        if metrics_port is not None:
            self.metrics = MetricsServer(METRICS, metrics_host, metrics_port)

    async def start(self) -> None:
        if self.metrics is not None:
            await self.metrics.start()
        await self.proxy.start()
        if self.service is not None:
            await self.service.start()

    async def wait_ready(self, timeout: float = 60.0) -> None:
        await self.proxy.wait_ready(timeout)
        if self.service is not None:
            await self.service.wait_loaded(timeout)

    async def stop(self) -> None:
        if self.metrics is not None:
            await self.metrics.stop()
        await self.proxy.stop()
        if self.service is not None:
            await self.service.stop()
