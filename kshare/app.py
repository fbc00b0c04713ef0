"""Assemble a running kshare: the proxy plus the share-group service behind it."""

from __future__ import annotations

import logging

from .proxy.config import ProxyConfig
from .proxy.server import Proxy

log = logging.getLogger("kshare")


class KShare:
    """The proxy and (unless disabled) the share-group service, started and stopped together."""

    def __init__(self, config: ProxyConfig, *, share_groups: bool = True, store=None) -> None:
        self.config = config
        self.proxy = Proxy(config)
        self.service = None
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

    async def start(self) -> None:
        await self.proxy.start()
        if self.service is not None:
            await self.service.start()

    async def wait_ready(self, timeout: float = 60.0) -> None:
        await self.proxy.wait_ready(timeout)
        if self.service is not None:
            await self.service.wait_loaded(timeout)

    async def stop(self) -> None:
        await self.proxy.stop()
        if self.service is not None:
            await self.service.stop()
