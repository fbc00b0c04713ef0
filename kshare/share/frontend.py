"""The proxy as the share-group engine sees it: the small interface ``share`` owns and talks through.

The engine serves its APIs on a proxy (``kshare.proxy.server.Proxy`` satisfies this protocol as it
is), learns of closed connections and deleted topics from it, and, in an instance group, tells it
the virtual cluster to show clients. It reaches nothing else of the proxy, so the proxy can change
inside without the engine noticing, and tests can stand in for it with a small fake.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from ..proxy.config import ProxyConfig
from ..proxy.connection import ClientConnection
from ..proxy.virtual import ClusterView

Handler = Callable[[ClientConnection, Any, Any], Any]
"""Answers one request: (connection, request header, request body) -> response body."""


class Listeners(Protocol):
    @property
    def ports(self) -> Mapping[int, int]:
        """The port of the listener standing for each upstream broker, by node id."""


class Frontend(Protocol):
    config: ProxyConfig
    brokers: Listeners
    bootstrap_port: int | None  # None until the bootstrap listener is open
    upstream_versions: dict[int, tuple[int, int]] | None  # what the cluster speaks; None until known
    # In an instance group: the virtual cluster clients are shown, set by the engine on every
    # ownership change (None: this proxy on its own shows the cluster as it is).
    view: ClusterView | None
    # called with each client connection that closed (the engine ends its share sessions)
    disconnect_listeners: list[Callable[[ClientConnection], None]]
    # called with the (name, topic id) pairs a DeleteTopics answer says were deleted
    topic_deletion_listeners: list[Callable[[list[tuple[str | None, bytes | None]]], None]]
    # called with {topic: partition count} seen in CreateTopics, CreatePartitions or Metadata
    # answers to clients (-1: more partitions than known)
    topic_change_listeners: list[Callable[[dict[str, int]], None]]

    def serve(self, api_key: int, min_version: int, max_version: int, handler: Handler,
              applies: Callable[[Any, Any], bool] | None = None) -> None:
        """Answer ``api_key`` in the proxy (with ``applies``: only the requests it accepts)."""

    async def wait_ready(self, timeout: float = 30.0) -> None:
        """Return once the upstream cluster answered (TimeoutError after ``timeout`` seconds)."""
