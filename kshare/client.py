"""Moved to :mod:`kshare.clients.connection` (the clients layer); this module keeps the old import
path, which tests, benchmarks and users' scripts use, working."""

from __future__ import annotations

from .clients.connection import ConnectionClosed, KafkaConnection, ProxyUpstreamUnavailable

__all__ = ["ConnectionClosed", "KafkaConnection", "ProxyUpstreamUnavailable"]
