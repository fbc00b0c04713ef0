"""A client's view of a Kafka cluster on kshare's own protocol layer: bootstrap, metadata (with each
topic's error), group coordinators and one pipelined :class:`~kshare.clients.connection.KafkaConnection` per
broker, authenticated as :class:`~kshare.security.ClientSecurity` says.

The share member (:mod:`kshare.clients.share_member`) runs on it; it works the same against a
kshare proxy and a Kafka broker."""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Self

from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError

from ..addresses import parse_hostports
from ..protocol import messages
from ..protocol.codes import ApiKey, ErrorCode
from ..security import AuthenticationFailed, ClientSecurity
from .connection import KafkaConnection, ProxyUpstreamUnavailable
from .errors import error_for

log = logging.getLogger("kshare.clients")

RETRIABLE_COORDINATOR = {ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.COORDINATOR_NOT_AVAILABLE,
                         ErrorCode.NOT_COORDINATOR}


@dataclass(slots=True)
class Node:
    node_id: int
    host: str
    port: int


@dataclass(slots=True)
class TopicMeta:
    name: str
    topic_id: bytes
    leaders: dict[int, int]  # partition -> leader node id (-1 unknown)

    @property
    def partitions(self) -> list[int]:
        return sorted(self.leaders)


# The Metadata and FindCoordinator exchanges, shared by :class:`Cluster` and the admin client
# (:class:`kshare.clients.admin.ShareGroupAdmin`), which differ only in how they report failures.


def metadata_request(names: list[str] | None) -> Any:
    """A Metadata request for the topics ``names`` (all topics for None, brokers only for [])."""
    cls = messages.message_class("MetadataRequest")
    return cls(topics=None if names is None else [cls.MetadataRequestTopic(name=n) for n in names],
               allow_auto_topic_creation=False)


@dataclass(slots=True)
class MetadataAnswer:
    brokers: dict[int, Node]
    topics: dict[str, TopicMeta]  # the topics answered without an error
    errors: dict[str, tuple[int, str | None]]  # the others: error code and message


def metadata_answer(resp: Any, version: int) -> MetadataAnswer:
    answer = MetadataAnswer({b.node_id: Node(b.node_id, b.host, b.port) for b in resp.brokers}, {}, {})
    for t in resp.topics:
        if not t.name:
            continue
        if t.error_code:
            answer.errors[t.name] = (t.error_code, getattr(t, "error_message", None))
            continue
        answer.topics[t.name] = TopicMeta(t.name, bytes(t.topic_id) if version >= 10 else bytes(16),
                                          {p.partition_index: p.leader_id for p in t.partitions})
    return answer


def coordinator_request(version: int, group: str) -> Any:
    """FindCoordinator for one group: batched (``coordinator_keys``) from v4, single before."""
    cls = messages.message_class("FindCoordinatorRequest")
    if version >= 4:
        return cls(key_type=0, coordinator_keys=[group])
    return cls(key=group, key_type=0)


def coordinator_answer(resp: Any, version: int) -> tuple[int, Node, str | None]:
    """The error code, the coordinator and the error message of a FindCoordinator answer."""
    if version >= 4:
        c = resp.coordinators[0]
        return c.error_code, Node(c.node_id, c.host, c.port), c.error_message
    return resp.error_code, Node(resp.node_id, resp.host, resp.port), getattr(resp, "error_message", None)


def parse_servers(value: str | Iterable[str] | Iterable[tuple[str, int]]) -> list[tuple[str, int]]:
    """``"h1:9092,h2:9092"``, ``["h1:9092", ...]`` or ``[("h1", 9092), ...]`` as (host, port) pairs."""
    return parse_hostports(value, not_hostport=lambda item: ValueError(f"bootstrap server '{item}' is not HOST:PORT"),
                           nothing=lambda: ValueError("no bootstrap server given"))


class Connections:
    """A client's connections to one cluster: the bootstrap connection, and one per broker address,
    opened with ``open_connection(host, port, timeout)`` once (by one caller, while others wait)."""

    def __init__(self, open_connection: Callable[[str, int, float], Awaitable[KafkaConnection]]) -> None:
        self._open = open_connection
        self.bootstrap: KafkaConnection | None = None
        self._conns: dict[tuple[str, int], KafkaConnection] = {}
        self._opening: dict[tuple[str, int], asyncio.Future] = {}

    async def to(self, node: Node, timeout: float) -> KafkaConnection:
        """The connection to ``node``, opened within ``timeout`` if there is none."""
        key = (node.host, node.port)
        conn = self._conns.get(key)
        if conn is not None and not conn.closed:
            return conn
        pending = self._opening.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._opening[key] = fut
        try:
            conn = await self._open(node.host, node.port, timeout)
        except BaseException as exc:
            fut.set_exception(exc if isinstance(exc, Exception) else KafkaConnectionError(repr(exc)))
            fut.exception()  # retrieved: no "never retrieved" warning when nobody waited
            raise
        finally:
            self._opening.pop(key, None)
        self._conns[key] = conn
        fut.set_result(conn)
        return conn

    async def any(self, brokers: Iterable[Node], timeout: float,
                  connect: Callable[[], Awaitable[None]]) -> KafkaConnection:
        """The bootstrap connection while it is open, else one to the first of ``brokers`` that can
        be reached, else a new bootstrap connection (``connect``, which sets :attr:`bootstrap`)."""
        if self.bootstrap is not None and not self.bootstrap.closed:
            return self.bootstrap
        for node in list(brokers):
            try:
                return await self.to(node, timeout)
            except (TimeoutError, OSError, ConnectionError, KafkaConnectionError):
                continue
        await connect()
        assert self.bootstrap is not None
        return self.bootstrap

    async def drop_bootstrap(self) -> None:
        conn, self.bootstrap = self.bootstrap, None
        if conn is not None:
            await conn.close()

    async def close(self) -> None:
        for conn in list(self._conns.values()):
            await conn.close()
        self._conns.clear()
        await self.drop_bootstrap()


class ClusterClient:
    """What :class:`Cluster` and the share-group admin client (:mod:`kshare.clients.admin`) share:
    the bootstrap servers, the brokers and topics last read, known coordinators and one connection
    per broker. Each says itself how it reaches the bootstrap (``connect``) and what a failure is."""

    def __init__(self, bootstrap: list[tuple[str, int]], *, client_id: str, timeout_ms: int,
                 security: ClientSecurity | None) -> None:
        self.bootstrap = bootstrap
        self.client_id = client_id
        self.security = security
        self.timeout = timeout_ms / 1000.0  # bounds each request, and the bootstrap
        self.brokers: dict[int, Node] = {}
        self.topics: dict[str, TopicMeta] = {}
        self._coordinators: dict[str, Node] = {}
        self._pool = Connections(self._open)

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def connect(self) -> None:
        raise NotImplementedError

    async def _open(self, host: str, port: int, timeout: float) -> KafkaConnection:
        return await asyncio.wait_for(KafkaConnection.open(host, port, self.client_id, timeout=timeout,
                                                           security=self.security), timeout)

    async def close(self) -> None:
        await self._pool.close()

    async def connection(self, node: Node) -> KafkaConnection:
        """The connection to ``node`` (opened once, by one caller, while others wait for it)."""
        return await self._pool.to(node, self.timeout)

    async def _any(self) -> KafkaConnection:
        return await self._pool.any(self.brokers.values(), self.timeout, self.connect)

    # -- what each client says in its own words ----------------------------------------------------
    def _version(self, conn: KafkaConnection, api_key: int, hi: int | None = None) -> int:
        return conn.best_version(api_key, hi=hi)

    async def _send(self, conn: KafkaConnection, api_key: int, version: int, body: Any) -> Any:
        raise NotImplementedError

    def _coordinator_error(self, group: str, code: int, message: str | None) -> Exception:
        raise NotImplementedError

    async def _find_coordinator(self, group: str) -> Node:
        """FindCoordinator, asked again while the cluster says the coordinator is loading or moving."""
        deadline = time.monotonic() + self.timeout
        while True:
            conn = await self._any()
            version = self._version(conn, ApiKey.FIND_COORDINATOR)
            resp = await self._send(conn, ApiKey.FIND_COORDINATOR, version, coordinator_request(version, group))
            code, node, message = coordinator_answer(resp, version)
            if code == ErrorCode.NONE:
                self._coordinators[group] = node
                return node
            if code not in RETRIABLE_COORDINATOR or time.monotonic() >= deadline:
                raise self._coordinator_error(group, code, message)
            await asyncio.sleep(0.2)


class Cluster(ClusterClient):
    """Connections and metadata of one cluster. ``timeout_ms`` bounds each request, and the bootstrap
    (retried until then: a server may be starting)."""

    def __init__(self, bootstrap: list[tuple[str, int]], *, client_id: str = "kshare",
                 timeout_ms: int = 30000, security: ClientSecurity | None = None) -> None:
        super().__init__(bootstrap, client_id=client_id, timeout_ms=timeout_ms, security=security)
        self.topic_errors: dict[str, tuple[int, str | None]] = {}  # the last Metadata error of a topic asked for

    # -- connections ------------------------------------------------------------------------------
    async def _open(self, host: str, port: int, timeout: float) -> KafkaConnection:
        try:
            return await super()._open(host, port, timeout)
        except AuthenticationFailed as exc:
            raise error_for(ErrorCode.SASL_AUTHENTICATION_FAILED, f"{host}:{port}", str(exc)) from None
        except ssl.SSLError as exc:
            raise KafkaConnectionError(f"TLS handshake with {host}:{port} failed: {exc}") from None
        except ProxyUpstreamUnavailable as exc:
            raise KafkaConnectionError(str(exc)) from None

    async def connect(self) -> None:
        """Reach a bootstrap server (retrying until the timeout) and read the cluster's brokers."""
        deadline = time.monotonic() + self.timeout
        last: BaseException | None = None
        while True:
            for host, port in self.bootstrap:
                remaining = max(0.1, deadline - time.monotonic())
                try:
                    self._pool.bootstrap = await self._open(host, port, remaining)
                    await self.refresh_metadata([])
                    return
                except (OSError, TimeoutError, KafkaConnectionError, KafkaTimeoutError) as exc:
                    last = exc
                    await self._pool.drop_bootstrap()
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
        servers = ",".join(f"{h}:{p}" for h, p in self.bootstrap)
        raise KafkaConnectionError(f"cannot reach {servers} within {int(self.timeout * 1000)} ms ({last!r})")

    async def request(self, conn: KafkaConnection, api_key: int, version: int, body: Any,
                      timeout: float | None = None) -> Any:
        """One request; a timeout is a ``KafkaTimeoutError``, a lost connection a ``KafkaConnectionError``."""
        try:
            return await asyncio.wait_for(conn.request(api_key, version, body), timeout or self.timeout)
        except TimeoutError:
            raise KafkaTimeoutError(f"{messages.api(api_key).name} to {conn.host}:{conn.port} timed out after "
                                    f"{int((timeout or self.timeout) * 1000)} ms") from None
        except (OSError, ConnectionError) as exc:
            raise KafkaConnectionError(f"lost the connection to {conn.host}:{conn.port} ({exc})") from None

    # -- metadata ---------------------------------------------------------------------------------
    async def refresh_metadata(self, topics: Iterable[str] | None = None) -> dict[str, TopicMeta]:
        """Metadata of ``topics`` (all topics for None, brokers only for an empty list). Topics the
        cluster answers with an error are left out; their error is kept in ``topic_errors``."""
        conn = await self._any()
        version = conn.best_version(ApiKey.METADATA, hi=12)
        names = None if topics is None else sorted(set(topics))
        resp = await self.request(conn, ApiKey.METADATA, version, metadata_request(names))
        answer = metadata_answer(resp, version)
        self.brokers = answer.brokers
        for name, error in answer.errors.items():
            self.topic_errors[name] = error
            self.topics.pop(name, None)
        for name in answer.topics:
            self.topic_errors.pop(name, None)
        if names is None:
            self.topics = answer.topics
        else:
            self.topics.update(answer.topics)
        return answer.topics

    # -- coordinators -----------------------------------------------------------------------------
    def forget_coordinator(self, group: str) -> None:
        self._coordinators.pop(group, None)

    async def coordinator(self, group: str) -> Node:
        """The group's coordinator (asked again while the cluster says it is loading or moving)."""
        node = self._coordinators.get(group)
        return node if node is not None else await self._find_coordinator(group)

    async def _send(self, conn: KafkaConnection, api_key: int, version: int, body: Any) -> Any:
        return await self.request(conn, api_key, version, body)

    def _coordinator_error(self, group: str, code: int, message: str | None) -> Exception:
        return error_for(code, f"FindCoordinator for group {group}", message)
