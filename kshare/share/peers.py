"""Requests one proxy of an instance group makes to another, over the Kafka protocol.

A share-partition leader asks its group's coordinator (another proxy) for the group's configs, a
group's coordinator asks the share-partition leaders for the state it describes or resets, and a
proxy forwards a group's config changes to the group's coordinator: the same requests a client
would send, to the bootstrap listener of the proxy that owns the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from ..clients.connection import KafkaConnection
from ..security import ClientSecurity
from .ownership import Instance

log = logging.getLogger("kshare.share")

PEER_TIMEOUT_S = 10.0


class PeerClient:
    """One pipelined connection per peer proxy, opened on first use and reopened after a failure."""

    def __init__(self, client_id: str = "kshare-peer", security: ClientSecurity | None = None) -> None:
        """``security``: how to reach the other proxies' listeners (their TLS) and authenticate
        through them to the cluster (kshare's own SASL credentials pass through as a client's do)."""
        self.client_id = client_id
        self.security = security
        self._conns: dict[tuple[str, int], KafkaConnection] = {}
        self._opening: dict[tuple[str, int], asyncio.Lock] = {}

    async def _connection(self, peer: Instance) -> KafkaConnection:
        addr = (peer.host, peer.port)
        conn = self._conns.get(addr)
        if conn is not None and not conn.closed:
            return conn
        lock = self._opening.setdefault(addr, asyncio.Lock())
        async with lock:
            conn = self._conns.get(addr)
            if conn is None or conn.closed:
                conn = await KafkaConnection.open(peer.host, peer.port, self.client_id, timeout=PEER_TIMEOUT_S,
                                                  security=self.security)
                self._conns[addr] = conn
            return conn

    async def request(self, peer: Instance, api_key: int, body: Any, *, hi: int | None = None) -> Any:
        """Send ``body`` to ``peer`` in the newest version both know (at most ``hi``)."""
        conn = await self._connection(peer)
        try:
            version = conn.best_version(api_key, hi=hi)
            return await asyncio.wait_for(conn.request(api_key, version, body), PEER_TIMEOUT_S)
        except BaseException:
            self._conns.pop((peer.host, peer.port), None)
            with contextlib.suppress(Exception):
                await conn.close()
            raise

    async def close(self) -> None:
        conns, self._conns = list(self._conns.values()), {}
        for conn in conns:
            with contextlib.suppress(Exception):
                await conn.close()
