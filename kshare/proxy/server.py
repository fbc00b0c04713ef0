"""The proxy: listeners, the broker map, and the table of locally served APIs."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from ..clients.connection import KafkaConnection
from ..protocol import messages
from ..protocol.codes import ErrorCode
from . import filters
from .config import ProxyConfig
from .connection import ClientConnection
from .read_buffer import ReadBuffer
from .tls import ListenerTLS, quiet_hang_ups
from .virtual import ClusterView

log = logging.getLogger("kshare.proxy")

# ApiVersions v0 is the lingua franca for the UNSUPPORTED_VERSION answer.
UNSUPPORTED_VERSION = ErrorCode.UNSUPPORTED_VERSION.value

# While client connections find the cluster unreachable, the proxy itself asks the bootstrap
# servers (connection, ApiVersions, Metadata) after this many seconds, then backs off to the cap.
REPROBE_FIRST_DELAY = 0.5
REPROBE_MAX_DELAY = 2.0
# While a broker's listener has client connections served through another broker (it refused
# them), the proxy asks the broker itself (connection, ApiVersions) after this many seconds, then
# backs off to the cap; the first answer moves those connections back to it.
HOME_PROBE_FIRST_DELAY = 0.25
HOME_PROBE_MAX_DELAY = 1.0


def _ignore(api_key: int, seconds: float) -> None:
    pass


class ProxyStats:
    """Plain counts of what clients asked; exporters read them (the proxy knows nothing of metrics)."""

    def __init__(self) -> None:
        self.requests: Counter[int] = Counter()
        self.rejected = 0
        # called with (api key, seconds from request header to response written); app.py wires a histogram
        self.answered: Callable[[int, float], None] = _ignore

    def count(self, api_key: int) -> None:
        self.requests[api_key] += 1


class TopicRegistry:
    """Topic name <-> topic id, as learned from Metadata (ids synthesized for pre-2.8 clusters)."""

    def __init__(self) -> None:
        self.by_name: dict[str, bytes] = {}
        self.by_id: dict[bytes, str] = {}

    def learn(self, name: str, topic_id: bytes) -> None:
        old = self.by_name.get(name)
        if old != topic_id:
            if old is not None:
                self.by_id.pop(old, None)
            self.by_name[name] = topic_id
            self.by_id[topic_id] = name


class BrokerMap:
    """Which upstream broker each proxy listener stands for.

    Broker ``node_id`` is served on ``config.broker_port(node_id)``; listeners are opened the first
    time a broker is seen in a response (before the client can learn its address) and closed when
    it disappears from the cluster's metadata, so the proxy follows brokers coming and going.
    """

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy
        self.upstream: dict[int, tuple[str, int]] = {}
        self.listeners: dict[int, asyncio.Server] = {}
        self.ports: dict[int, int] = {}
        # brokers that left the cluster's metadata (restarting, failed): their listeners stay open
        # and their clients are served through the other brokers until they return
        self.away: set[int] = set()
        # Client connections of broker N's listener served through another broker because N refused
        # them (a restart: its port closed for a few seconds). The cluster's metadata may name N all
        # along (a broker restarting faster than its session times out is never fenced), so its
        # return cannot wait for ``expose``: while any is here, N itself is asked until it answers,
        # then they move back to it. Otherwise they would stay on the stand-in, which answers
        # NOT_LEADER_OR_FOLLOWER (naming N) to every Produce for what N leads again, until something
        # closed the connection: a producer's stall of tens of seconds (issue 40).
        self.standing_in: dict[int, set[ClientConnection]] = {}
        self._homing: dict[int, asyncio.Task] = {}
        # brokers an operator was told are gone (one WARNING when a broker goes, however it is
        # noticed -- a refused connection or the metadata -- and one when it is back)
        self._told_gone: set[int] = set()
        self._lock = asyncio.Lock()

    def upstream_candidates(self, node_id: int | None) -> list[tuple[str, int]]:
        if node_id is not None:
            # its broker, or while it is away (or refuses: restarting before the metadata says so)
            # another, which answers what it does not lead as Kafka does
            return self.reattach_candidates(node_id) if node_id in self.upstream else []
        return list(self.proxy.config.upstream) + [a for a in self.upstream.values() if a not in self.proxy.config.upstream]

    def reattach_candidates(self, node_id: int | None) -> list[tuple[str, int]]:
        """Where a client connection whose upstream closed goes next: its broker first, unless it is
        away, then any other. Another broker answers what it does not lead as Kafka does
        (NOT_LEADER_OR_FOLLOWER, NOT_COORDINATOR), and the client learns the new leaders from Metadata."""
        own = self.upstream.get(node_id) if node_id is not None else None
        others = [a for n, a in self.upstream.items() if n != node_id and not self.unreachable(n)]
        others += [a for a in self.proxy.config.upstream if a not in others and a != own]
        if own is None:
            return others
        # a broker known to refuse comes last: a client does not wait out its connect timeout (a
        # host that is down drops the connection attempt) when another broker answers at once
        return others + [own] if self.unreachable(node_id) else [own, *others]

    def unreachable(self, node_id: int | None) -> bool:
        """Whether broker ``node_id`` left the metadata or refused a connection not yet answered again."""
        if node_id in self.away:
            return True
        task = self._homing.get(node_id) if node_id is not None else None
        return task is not None and not task.done()

    def attached(self, conn: ClientConnection) -> None:
        """``conn`` (a client connection of a broker's listener) has a new upstream connection: to
        its own broker, or to a stand-in, in which case it moves back once its broker answers."""
        node = conn.node_id
        own = self.upstream.get(node) if node is not None else None
        if node is None or own is None:
            return
        if conn.upstream_addr == own:
            self.detached(conn)
            return
        self.standing_in.setdefault(node, set()).add(conn)
        task = self._homing.get(node)
        if task is None or task.done():
            self._went(node, "refused or did not accept a connection (restarting or failed)")
            self._homing[node] = asyncio.get_running_loop().create_task(self._await_home(node))

    @property
    def gone(self) -> frozenset[int]:
        """Brokers told gone (one WARNING) and not yet back: a restart, a crash, a broker removed."""
        return frozenset(self._told_gone)

    def _went(self, node_id: int, how: str) -> None:
        if node_id not in self._told_gone:
            self._told_gone.add(node_id)
            log.warning("broker %d %s: its clients are served through the other brokers until it is back",
                        node_id, how)

    def _back(self, node_id: int, how: str) -> None:
        if node_id in self._told_gone:
            self._told_gone.discard(node_id)
            log.warning("broker %d %s", node_id, how)
        else:
            log.info("broker %d %s", node_id, how)

    def detached(self, conn: ClientConnection) -> None:
        """``conn`` closed, or is back on its own broker."""
        if conn.node_id is not None:
            waiting = self.standing_in.get(conn.node_id)
            if waiting is not None:
                waiting.discard(conn)

    async def _await_home(self, node_id: int) -> None:
        """Ask broker ``node_id`` until it answers, then move its listener's connections back to it."""
        delay = HOME_PROBE_FIRST_DELAY
        timeout = min(self.proxy.config.upstream_connect_timeout, 2.0)
        while self.standing_in.get(node_id):
            await asyncio.sleep(delay)
            delay = min(delay * 2, HOME_PROBE_MAX_DELAY)
            addr = self.upstream.get(node_id)
            if addr is None or node_id in self.away:
                continue  # out of the metadata: ``expose`` moves them back when it is named again
            try:
                # an answer, not just a connection: a restarting Kafka accepts connections (its port
                # is bound early) before it reads requests
                await asyncio.wait_for(self.proxy.ask_versions(*addr), timeout)
            except Exception as exc:  # noqa: BLE001 - any failure is "not yet"; the probe must not die
                log.debug("broker %d at %s:%d does not answer yet: %s", node_id, *addr, describe_error(exc))
                continue
            waiting = self.standing_in.pop(node_id, set())
            self._back(node_id, f"answers again: {len(waiting)} client connection(s) of its listener move back to it")
            for conn in waiting:
                conn.rehome()
            return

    async def expose(self, node_id: int, host: str, port: int) -> tuple[str, int]:
        """Record broker ``node_id`` at ``host:port`` upstream; return the address clients should use."""
        if node_id in self.away:
            self.away.discard(node_id)
            self._back(node_id, f"is back in the cluster metadata at {host}:{port}")
            for conn in list(self.proxy.connections):
                if conn.node_id == node_id and conn.upstream_addr != (host, port):
                    conn.rehome()
        if self.upstream.get(node_id) != (host, port):
            if node_id in self.upstream:
                log.info("broker %d moved from %s:%d to %s:%d", node_id, *self.upstream[node_id], host, port)
            self.upstream[node_id] = (host, port)
        if node_id not in self.listeners:
            async with self._lock:
                if node_id not in self.listeners:
                    await self._listen(node_id)
        return self.proxy.config.advertised, self.ports[node_id]

    async def _listen(self, node_id: int) -> None:
        loop = asyncio.get_running_loop()
        cfg = self.proxy.config
        server = await loop.create_server(
            lambda: ClientConnection(self.proxy, node_id), cfg.listen_host, cfg.broker_port(node_id), reuse_address=True,
            ssl=self.proxy.tls.context if self.proxy.tls else None,
        )
        self.listeners[node_id] = server
        self.ports[node_id] = server.sockets[0].getsockname()[1]
        up = self.upstream[node_id]
        log.info("broker %d: listening on %s:%d for upstream %s:%d", node_id, cfg.listen_host, self.ports[node_id], *up)

    async def forget_missing(self, live: set[int]) -> None:
        for node_id in [n for n in self.listeners if n not in live and n not in self.away]:
            # a rolling restart or a failure: the listener stays (its clients keep their connections
            # and share sessions, served through the other brokers); a broker removed for good is
            # simply never named again, and its listener costs nothing
            self.away.add(node_id)
            self._went(node_id, "left the cluster metadata (restarting or failed)")

    async def close(self) -> None:
        for task in self._homing.values():
            task.cancel()
        for server in self.listeners.values():
            server.close()
        self.listeners.clear()


Handler = Callable[[ClientConnection, Any, Any], Any]


class Proxy:
    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.brokers = BrokerMap(self)
        self.topics = TopicRegistry()
        self.stats = ProxyStats()
        self.connections: set[ClientConnection] = set()
        self.reads = ReadBuffer()  # what every connection reads into
        self.bootstrap_server: asyncio.Server | None = None
        self.bootstrap_port: int | None = None
        # APIs served by the proxy itself: key -> (min, max, handler, applies)
        self._served: dict[int, tuple[int, int, Handler, Callable[[Any, Any], bool] | None]] = {}
        # What the cluster speaks, learned at start-up; None until known (then nothing is refused).
        self.upstream_versions: dict[int, tuple[int, int]] | None = None
        # Versions of rewritten APIs are capped at what the codec knows.
        self.version_caps: dict[int, tuple[int, int]] = {
            key: (messages.api(key).min_version, messages.api(key).max_version) for key in filters.RESPONSE_FILTERS
        }
        self._probe_task: asyncio.Task | None = None
        # called with each client connection that closed (the share layer ends its share sessions)
        self.disconnect_listeners: list[Callable[[ClientConnection], None]] = []
        # called with the (name, topic id) pairs a DeleteTopics answer says were deleted
        self.topic_deletion_listeners: list[Callable[[list[tuple[str | None, bytes | None]]], None]] = []
        # called with {topic: partition count} the cluster was seen to have (-1: more than known)
        # in a CreateTopics, CreatePartitions or Metadata answer on its way to a client
        self.topic_change_listeners: list[Callable[[dict[str, int]], None]] = []
        # why the cluster could not be reached, while it cannot (for readiness and for clients)
        self.upstream_error: str | None = None
        # set while client connections cannot reach the cluster (since when, why): readiness
        # reports it until a client connection gets through again or the re-probe task
        # (_reprobe_upstream) gets an answer from a bootstrap server, whichever comes first
        self.upstream_down: tuple[float, str] | None = None
        self._reprobe_task: asyncio.Task | None = None
        self._unreachable_warned_at = -60.0
        self._unreachable_since_warning = 0
        self._down_logged = False  # this outage's WARNING was logged: log its end too
        # In an instance group: the virtual cluster clients are shown (set by the share layer on
        # every ownership change; None for a proxy on its own). See virtual.py.
        self.view: ClusterView | None = None
        # TLS on every client listener (reloaded on SIGHUP and when its files change)
        self.tls = ListenerTLS(config.tls) if config.tls is not None else None

    # -- served APIs -----------------------------------------------------------------------------
    def serve(self, api_key: int, min_version: int, max_version: int, handler: Handler,
              applies: Callable[[Any, Any], bool] | None = None) -> None:
        """Answer ``api_key`` in the proxy.

        Without ``applies`` the proxy owns the API and advertises these versions in ApiVersions.
        With it, only requests for which ``applies(header, body)`` is true are answered here (e.g.
        DescribeConfigs of a share group); the rest are forwarded, and the cluster's versions are
        advertised, capped at ``max_version``.

        Only an API ``filters.INTERCEPTIONS`` declares served (with ``some`` exactly when
        ``applies`` is given) may be registered: that table is the one list of what the proxy
        does not simply forward.
        """
        declared = filters.SERVED.get(api_key)
        if declared is None or declared.newer_than_codec:
            raise ValueError(f"{filters.api_name(api_key)} is not declared served in kshare.proxy.filters.INTERCEPTIONS")
        if declared.some != (applies is not None):
            how = "for the requests an applies() accepts" if declared.some else "whole, without applies()"
            raise ValueError(f"{filters.api_name(api_key)} is declared served {how} in kshare.proxy.filters.INTERCEPTIONS")
        self._served[api_key] = (min_version, max_version, handler, applies)
        if applies is not None:
            self.version_caps[api_key] = (min_version, max_version)

    def served_versions(self) -> dict[int, tuple[int, int]]:
        return {k: (lo, hi) for k, (lo, hi, _, applies) in self._served.items() if applies is None}

    def handler_for(self, api_key: int, version: int) -> Handler | None:
        entry = self._served.get(api_key)
        if entry is not None and entry[0] <= version <= entry[1]:
            return entry[2]
        if api_key == filters.API_VERSIONS and version > messages.api(api_key).max_version:
            return self.api_versions_fallback
        return None

    def serves(self, api_key: int, header: Any, body: Any) -> bool:
        """Whether a decoded request is answered here (False: forward it after all)."""
        entry = self._served.get(api_key)
        return entry is None or entry[3] is None or entry[3](header, body)

    def api_versions_fallback(self, conn: ClientConnection, header: Any, body: Any) -> tuple[int, Any]:
        """A client newer than us: answer in v0 with UNSUPPORTED_VERSION and our range, as Kafka does."""
        a = messages.api(filters.API_VERSIONS)
        cls = messages.message_class("ApiVersionsResponse")
        entry = cls.ApiVersion(api_key=a.key, min_version=a.min_version, max_version=a.max_version)
        return 0, cls(error_code=UNSUPPORTED_VERSION, api_keys=[entry])

    def check_forwardable(self, api_key: int, version: int) -> str | None:
        """None if a request may be forwarded, else why not (the connection is then closed)."""
        known = self.upstream_versions
        cap = self.version_caps.get(api_key)
        if cap is not None and not cap[0] <= version <= cap[1] and api_key != filters.API_VERSIONS:
            return f"{filters.api_name(api_key)} v{version} is outside the supported range {cap[0]}-{cap[1]}"
        if known is None or api_key == filters.API_VERSIONS:
            return None
        rng = known.get(api_key)
        if rng is None:
            if api_key in messages.apis():
                return f"{filters.api_name(api_key)} (API key {api_key}) is not supported by the upstream cluster"
            return f"unknown API key {api_key}"
        if not rng[0] <= version <= rng[1]:
            return f"{filters.api_name(api_key)} v{version} is outside the supported range {rng[0]}-{rng[1]}"
        return None

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        cfg = self.config
        if self.tls is not None or cfg.upstream_security.ssl is not None:
            quiet_hang_ups(loop)
        if self.tls is not None:
            self.tls.watch()
        self.bootstrap_server = await loop.create_server(
            lambda: ClientConnection(self, None), cfg.listen_host, cfg.bootstrap_port, reuse_address=True,
            ssl=self.tls.context if self.tls else None,
        )
        self.bootstrap_port = self.bootstrap_server.sockets[0].getsockname()[1]
        log.info(
            "bootstrap listener on %s:%d (%s, advertised as %s) for upstream %s (%s)",
            cfg.listen_host,
            self.bootstrap_port,
            "TLS" + (", client certificates required" if cfg.tls and cfg.tls.client_ca else "") if self.tls else "plaintext",
            cfg.advertised,
            ",".join(f"{h}:{p}" for h, p in cfg.upstream),
            cfg.upstream_security.protocol,
        )
        self._probe_task = loop.create_task(self._probe_upstream())

    def client_closed(self, conn: ClientConnection) -> None:
        self.connections.discard(conn)
        self.brokers.detached(conn)
        for listener in self.disconnect_listeners:
            try:
                listener(conn)
            except Exception:  # noqa: BLE001 - one listener's failure must not keep the others from running
                log.exception("disconnect listener failed for client %s", conn.peer)

    def upstream_reached(self, how: str = "a client connection got through") -> None:
        """The cluster answers again (a client connection reached its broker, or the re-probe did)."""
        if self.upstream_down is None:
            return
        level = logging.WARNING if self._down_logged else logging.DEBUG
        log.log(level, "upstream cluster reachable again after %.0f s (%s)", time.monotonic() - self.upstream_down[0], how)
        self.upstream_down = None

    def upstream_unreachable(self, what: str, exc: BaseException | None) -> None:
        """A client connection found its broker unreachable.

        The first failure marks the cluster down and starts the re-probe. Logging: one WARNING when
        it goes down and one when it is back; failures in between are counted and summed up at most
        once a minute. Outages that come and go faster (e.g. one broker down while the bootstrap
        servers answer) share that once-a-minute WARNING instead of logging each time.
        """
        why = describe_error(exc) if exc else "no address"
        now = time.monotonic()
        if self.upstream_down is None:
            self.upstream_down = (now, f"{what}: {why}")
            self._down_logged = False
            if self._reprobe_task is None or self._reprobe_task.done():
                self._reprobe_task = asyncio.get_running_loop().create_task(self._reprobe_upstream())
        self._unreachable_since_warning += 1
        if now - self._unreachable_warned_at < 60:
            log.debug("%s: %s", what, why)
            return
        n = self._unreachable_since_warning
        also = f"; {n} client connection(s) failed so in the last minute" if n > 1 else ""
        log.warning("%s: %s; answering BROKER_NOT_AVAILABLE and closing; not ready until the cluster answers "
                    "again (probing %s)%s", what, why, self._bootstrap_servers(), also)
        self._unreachable_warned_at, self._unreachable_since_warning = now, 0
        self._down_logged = True

    def _bootstrap_servers(self) -> str:
        return ",".join(f"{h}:{p}" for h, p in self.config.upstream)

    async def _reprobe_upstream(self) -> None:
        """While the cluster is marked down, ask the bootstrap servers until one answers.

        Readiness must not wait for a client connection to get through: a proxy that is not ready
        gets no clients (a Kubernetes Service drops it), so it would never become ready again.
        Each attempt opens a connection (ApiVersions) to each bootstrap server in turn and asks for
        Metadata; the first answer marks the cluster reached. Attempts are logged at DEBUG only.
        """
        delay = REPROBE_FIRST_DELAY
        while self.upstream_down is not None:
            await asyncio.sleep(delay)
            delay = min(delay * 2, REPROBE_MAX_DELAY)
            for host, port in self.config.upstream:
                if self.upstream_down is None:
                    return
                try:
                    await asyncio.wait_for(self._ask(host, port), self.config.upstream_connect_timeout)
                except Exception as exc:  # noqa: BLE001 - any failure is "not yet"; the probe must not die
                    log.debug("re-probe of the upstream cluster at %s:%d: %s", host, port, describe_error(exc))
                    continue
                self.upstream_reached(f"{host}:{port} answered the proxy's probe")
                return

    async def ask_versions(self, host: str, port: int) -> None:
        """Connect (ApiVersions answered) and close; raises if the broker does not answer."""
        conn = await KafkaConnection.open(host, port, timeout=self.config.upstream_connect_timeout,
                                          security=self.config.upstream_security)
        await conn.close()

    async def _ask(self, host: str, port: int) -> None:
        """Connect (ApiVersions) and ask for Metadata of no topic; raises if the broker does not answer."""
        conn = await KafkaConnection.open(host, port, timeout=self.config.upstream_connect_timeout,
                                          security=self.config.upstream_security)
        try:
            req = messages.message_class("MetadataRequest")(topics=[])
            meta = await conn.request(filters.METADATA, conn.best_version(filters.METADATA), req)
            if not meta.brokers:
                raise ConnectionError(f"{host}:{port} answered Metadata without brokers")
        finally:
            await conn.close()

    async def wait_ready(self, timeout: float = 30.0) -> None:
        """Until the cluster's brokers and versions are known."""
        assert self._probe_task is not None
        await asyncio.wait_for(asyncio.shield(self._probe_task), timeout)

    async def _probe_upstream(self) -> None:
        """Learn the cluster's API versions and brokers; retry until the cluster answers."""
        delay = 0.2
        failing_since: float | None = None
        warned_at = 0.0
        while True:
            for host, port in self.config.upstream:
                conn = None
                try:
                    conn = await KafkaConnection.open(host, port, timeout=self.config.upstream_connect_timeout,
                                                      security=self.config.upstream_security)
                    self.upstream_versions = dict(conn.versions)
                    version = conn.best_version(filters.METADATA)
                    # no topics: only the brokers are wanted (v0 reads an empty list as "all")
                    req = messages.message_class("MetadataRequest")(topics=[])
                    meta = await conn.request(filters.METADATA, version, req)
                    for b in meta.brokers:
                        await self.brokers.expose(b.node_id, b.host, b.port)
                    log.info("upstream cluster has %d broker(s): %s", len(meta.brokers),
                             ", ".join(f"{b.node_id}={b.host}:{b.port}" for b in meta.brokers))
                    if failing_since is not None:
                        log.warning("upstream cluster reachable again after %.0f s", time.monotonic() - failing_since)
                    self.upstream_error = None
                    return
                except (TimeoutError, OSError, ConnectionError) as exc:
                    self.upstream_error = f"{host}:{port}: {describe_error(exc)}"
                    now = time.monotonic()
                    if failing_since is None:
                        failing_since = now
                    # once at once, then once a minute: an operator needs to know, not to be flooded
                    if now - warned_at >= 60:
                        warned_at = now
                        since = f" (for {now - failing_since:.0f} s)" if now > failing_since + 1 else ""
                        log.warning("cannot reach the upstream cluster%s: %s; retrying", since, self.upstream_error)
                finally:
                    if conn is not None:
                        await conn.close()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    def reload_tls(self) -> None:
        """SIGHUP: load the listeners' certificate and key again (new connections use them)."""
        if self.tls is not None:
            self.tls.reload()

    async def stop(self) -> None:
        if self.tls is not None:
            self.tls.stop()
        for task in (self._probe_task, self._reprobe_task):
            if task is not None:
                task.cancel()
        if self.bootstrap_server is not None:
            self.bootstrap_server.close()
        await self.brokers.close()
        for conn in list(self.connections):
            conn.close()
        log.info("proxy stopped")


def describe_error(exc: BaseException) -> str:
    """An OS or timeout error as an operator reads it: "connection refused", not a repr."""
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc) or type(exc).__name__

