"""A small share-group admin client over the Kafka protocol, for ``kshare groups``.

It speaks only the wire protocol (FindCoordinator, Metadata, ListOffsets, ListGroups and the
share-group admin RPCs 77 / 90 / 91 / 92 / 42), so the same calls work against kshare and
against a native Apache Kafka 4.x cluster with share groups.  Built on :class:`KafkaConnection`.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..protocol import messages
from ..protocol.codes import ApiKey, ErrorCode
from ..security import ClientSecurity
from .cluster import (
    RETRIABLE_COORDINATOR,
    ClusterClient,
    Node,
    TopicMeta,
    metadata_answer,
    metadata_request,
)
from .connection import ConnectionClosed, KafkaConnection, ProxyUpstreamUnavailable
from .errors import error_name

GROUP_RESOURCE = 32  # ConfigResource.Type.GROUP
# DescribeConfigs ConfigSource values a group config can have
_CONFIG_SOURCES = {5: "default", 8: "dynamic", 4: "static broker", 1: "dynamic topic"}
EARLIEST, LATEST = -2, -1  # ListOffsets timestamps

_RETRIABLE_PARTITION = {ErrorCode.LEADER_NOT_AVAILABLE, ErrorCode.NOT_LEADER_OR_FOLLOWER,
                        ErrorCode.FENCED_LEADER_EPOCH, ErrorCode.UNKNOWN_LEADER_EPOCH}

GROUP_STATES = ("Empty", "Stable", "Dead", "Unknown")
"""States a share group can be in (as Kafka's GroupState for share groups)."""


# ------------------------------------------------------------------------------------------------
# errors


class AdminError(Exception):
    """A failure reported to the user as one line (``Error: <message>``)."""


class GroupNotFound(AdminError):
    def __init__(self, group: str, message: str | None = None) -> None:
        self.group = group
        if message and "not a share group" in message:
            text = f"group {group} is not a share group"
        else:
            text = f"group {group} does not exist"
        super().__init__(text)


class GroupNotEmpty(AdminError):
    def __init__(self, group: str, members: int | None = None) -> None:
        self.group = group
        self.members = members
        count = f" ({members} member{'s' if members != 1 else ''})" if members is not None else ""
        super().__init__(f"share group {group} is not empty{count}: stop its consumers first")


class Unreachable(AdminError):
    pass


# The wording of the failures to reach a server, shared by ``kshare groups`` and the console
# commands (kshare.tools.console), so that every tool says the same thing about the same server.


def unreachable_message(servers: list[tuple[str, int]], timeout: float, last: BaseException | None) -> str:
    """``cannot reach HOST:PORT within 5000 ms (connection refused)``."""
    hosts = ",".join(f"{h}:{p}" for h, p in servers)
    return f"cannot reach {hosts} within {int(timeout * 1000)} ms ({_reason(last)})"


def proxy_without_cluster_message(host: str, port: int) -> str:
    return (f"{host}:{port} is a kshare proxy that cannot reach its upstream Kafka cluster "
            "(it answers BROKER_NOT_AVAILABLE): check that the cluster is up and that the proxy's "
            "--upstream points at it; the proxy's log names the cause")


TLS_HINT_GROUPS = ("use --command-config FILE with security.protocol=SSL (and ssl.ca.location=CA.pem unless "
                   "a CA the system trusts signed its certificate)")


def tls_message(host: str, port: int, hint: str) -> str:
    """A plaintext client at a TLS listener: the server reads its first request as a broken TLS
    handshake and closes the connection (with a TLS alert, which the client reads as the length of
    a huge response frame, or without a word)."""
    return f"{host}:{port} speaks TLS (it closed the plaintext connection without answering): {hint}"


async def speaks_tls(host: str, port: int, timeout: float) -> bool:
    """Whether ``host:port`` completes a TLS handshake (its certificate not checked: only the
    protocol is asked). A server that sends a TLS alert speaks TLS too (mutual TLS without a client
    certificate, an old protocol version)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port, ssl=context), timeout)
    except ssl.SSLError as exc:
        return "ALERT" in (exc.reason or "").upper()
    except (OSError, TimeoutError):
        return False
    await _close(writer)
    return True


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    try:
        await asyncio.wait_for(writer.wait_closed(), 1.0)
    except (OSError, TimeoutError):  # ssl.SSLError included
        pass


def _raise_if_cancelled() -> None:
    """Python 3.11's ``asyncio.wait_for`` swallows a cancellation that arrives as its inner call
    ends (a refused connection ends at once): the cancelled task would go on to its deadline."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def probe(servers: list[tuple[str, int]], timeout: float, *, plaintext: bool, tls_hint: str,
                client_id: str = "kshare-probe", answer_wait: float = 2.0) -> None:
    """Fail fast, in ``kshare groups``' words, where a client library would wait for its own timeouts:
    raises :class:`Unreachable` when no server accepts a connection within ``timeout`` seconds
    (retrying, a server may be starting), when the server is a kshare proxy without its cluster all
    that time, and, for a ``plaintext`` client, when it answers as a TLS listener.

    A server that accepts but is slow to answer passes: its ApiVersions answer is awaited at most
    ``answer_wait`` seconds, the client library waits as long as it is configured to."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    upstream_down: tuple[str, int] | None = None
    while True:
        for host, port in servers:
            _raise_if_cancelled()
            remaining = max(0.1, deadline - time.monotonic())
            try:
                _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), remaining)
            except (OSError, TimeoutError) as exc:
                last = exc
                continue
            await _close(writer)
            if not plaintext:
                return  # TLS and SASL_SSL clients: their library reports a handshake that fails
            try:
                conn = await asyncio.wait_for(KafkaConnection.open(host, port, client_id, timeout=answer_wait),
                                              answer_wait)
            except ProxyUpstreamUnavailable:
                upstream_down = (host, port)  # it may be starting: asked again until the deadline
                continue
            except ConnectionClosed:
                if await speaks_tls(host, port, max(1.0, deadline - time.monotonic())):
                    raise Unreachable(tls_message(host, port, tls_hint)) from None
                return  # something else that closes connections: the library says what it sees
            except (OSError, ConnectionError, TimeoutError):
                return  # reachable; slow, or an answer the library will judge
            await conn.close()
            return
        if time.monotonic() >= deadline:
            break
        await asyncio.sleep(min(0.25, max(0.0, deadline - time.monotonic())))
    if upstream_down is not None:
        raise Unreachable(proxy_without_cluster_message(*upstream_down))
    raise Unreachable(unreachable_message(servers, timeout, last))


# ------------------------------------------------------------------------------------------------
# results


@dataclass(slots=True)
class GroupListing:
    group_id: str
    state: str
    group_type: str = "share"


@dataclass(slots=True)
class MemberDescription:
    member_id: str
    client_id: str
    host: str
    rack: str | None
    member_epoch: int
    subscribed: list[str]
    assignment: dict[str, list[int]]

    @property
    def partitions(self) -> int:
        return sum(len(p) for p in self.assignment.values())


@dataclass(slots=True)
class GroupDescription:
    group_id: str
    state: str
    group_epoch: int
    assignment_epoch: int
    assignor: str
    coordinator: Node
    members: list[MemberDescription] = field(default_factory=list)


@dataclass(slots=True)
class PartitionOffset:
    topic: str
    partition: int
    start_offset: int | None  # None: no start offset yet (-1 on the wire)
    leader_epoch: int | None
    lag: int | None
    error: str | None = None


# ------------------------------------------------------------------------------------------------
# the client


class ShareGroupAdmin(ClusterClient):
    """Admin calls for share groups.  ``timeout_ms`` bounds each call (including its retries)."""

    def __init__(self, bootstrap: list[tuple[str, int]], *, client_id: str = "kshare-groups",
                 timeout_ms: int = 30000, security: ClientSecurity | None = None) -> None:
        super().__init__(bootstrap, client_id=client_id, timeout_ms=timeout_ms, security=security)

    # -- connections ------------------------------------------------------------------------------
    async def connect(self) -> None:
        """Reach a bootstrap server (retrying until the timeout) and read the cluster metadata."""
        deadline = time.monotonic() + self.timeout
        last: BaseException | None = None
        asked_tls = False
        while True:
            for host, port in self.bootstrap:
                remaining = deadline - time.monotonic()
                try:
                    self._pool.bootstrap = await self._open(host, port, max(0.1, remaining))
                    await self.refresh_metadata()
                    return
                except ProxyUpstreamUnavailable:
                    raise Unreachable(proxy_without_cluster_message(host, port)) from None
                except (OSError, ConnectionError, TimeoutError) as exc:
                    last = exc
                    await self._pool.drop_bootstrap()
                    # closed without an answer: a TLS listener does that to a plaintext request (asked
                    # once, not on every retry; retrying would only repeat it until the timeout)
                    if (isinstance(exc, ConnectionClosed) and not asked_tls
                            and (self.security is None or self.security.ssl is None)):
                        asked_tls = True
                        if await speaks_tls(host, port, max(0.5, deadline - time.monotonic())):
                            raise Unreachable(tls_message(host, port, TLS_HINT_GROUPS)) from None
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
        raise Unreachable(unreachable_message(self.bootstrap, self.timeout, last))

    async def _request(self, conn: KafkaConnection, api_key: int, version: int, body: Any) -> Any:
        try:
            return await asyncio.wait_for(conn.request(api_key, version, body), self.timeout)
        except TimeoutError:
            name = messages.api(api_key).name
            raise AdminError(f"{name} to {conn.host}:{conn.port} timed out after "
                             f"{int(self.timeout * 1000)} ms") from None
        except (OSError, ConnectionError) as exc:
            raise AdminError(f"lost the connection to {conn.host}:{conn.port} ({_reason(exc)})") from None

    def _version(self, conn: KafkaConnection, api_key: int, hi: int | None = None) -> int:
        try:
            return conn.best_version(api_key, hi=hi)
        except ConnectionError:
            name = messages.api(api_key).name
            raise AdminError(f"{conn.host}:{conn.port} does not support {name} (API {api_key}): "
                             f"is it a Kafka 4.x broker with share groups, or kshare?") from None

    # -- metadata ---------------------------------------------------------------------------------
    async def refresh_metadata(self, topics: Iterable[str] | None = None) -> dict[str, TopicMeta]:
        conn = self._pool.bootstrap if self._pool.bootstrap is not None else await self._any()
        version = self._version(conn, ApiKey.METADATA, hi=12)
        names = None if topics is None else sorted(set(topics))
        resp = await self._request(conn, ApiKey.METADATA, version, metadata_request(names))
        answer = metadata_answer(resp, version)
        self.brokers = answer.brokers
        if names is None:
            self.topics = answer.topics
        else:
            self.topics.update(answer.topics)
        return answer.topics

    async def topic(self, name: str) -> TopicMeta | None:
        if name not in self.topics:
            await self.refresh_metadata([name])
        return self.topics.get(name)

    # -- coordinator ------------------------------------------------------------------------------
    async def coordinator(self, group: str, *, fresh: bool = False) -> Node:
        if not fresh and group in self._coordinators:
            return self._coordinators[group]
        return await self._find_coordinator(group)

    async def _send(self, conn: KafkaConnection, api_key: int, version: int, body: Any) -> Any:
        return await self._request(conn, api_key, version, body)

    def _coordinator_error(self, group: str, code: int, message: str | None) -> Exception:
        return AdminError(f"cannot find the coordinator of group {group}: {_error_text(code, message)}")

    async def _group_request(self, group: str, api_key: int, build: Callable[[int], Any],
                             error_of: Callable[[Any], int], hi: int | None = None) -> Any:
        """Send a group RPC to the group's coordinator; retry on coordinator moves and loading."""
        deadline = time.monotonic() + self.timeout
        fresh = False
        while True:
            node = await self.coordinator(group, fresh=fresh)
            try:
                conn = await self.connection(node)
            except (TimeoutError, OSError, ConnectionError) as exc:
                raise Unreachable(f"cannot reach the coordinator {node.host}:{node.port} of group {group} "
                                  f"({_reason(exc)})") from None
            version = self._version(conn, api_key, hi=hi)
            resp = await self._request(conn, api_key, version, build(version))
            code = error_of(resp)
            if code in RETRIABLE_COORDINATOR and time.monotonic() < deadline:
                fresh = code == ErrorCode.NOT_COORDINATOR or code == ErrorCode.COORDINATOR_NOT_AVAILABLE
                await asyncio.sleep(0.2)
                continue
            return resp

    # -- ListGroups -------------------------------------------------------------------------------
    async def list_groups(self, states: Iterable[str] = ()) -> list[GroupListing]:
        """Share groups of the cluster (every broker is asked; the union is returned, by id)."""
        await self.refresh_metadata([])
        wanted = {s.lower() for s in states}
        cls = messages.message_class("ListGroupsRequest")
        found: dict[str, GroupListing] = {}
        errors = []
        for node in list(self.brokers.values()):
            try:
                conn = await self.connection(node)
            except (TimeoutError, OSError, ConnectionError) as exc:
                errors.append(f"{node.host}:{node.port}: {_reason(exc)}")
                continue
            version = self._version(conn, ApiKey.LIST_GROUPS)
            req = cls(states_filter=[s for s in GROUP_STATES if s.lower() in wanted] if version >= 4 else [],
                      types_filter=["share"] if version >= 5 else [])
            resp = await self._request(conn, ApiKey.LIST_GROUPS, version, req)
            if resp.error_code:
                if resp.error_code in RETRIABLE_COORDINATOR:
                    continue
                errors.append(f"{node.host}:{node.port}: {error_name(resp.error_code)}")
                continue
            for g in resp.groups:
                gtype = getattr(g, "group_type", "") if version >= 5 else ""
                if (gtype or g.protocol_type).lower() != "share":
                    continue
                state = getattr(g, "group_state", "") if version >= 4 else ""
                if wanted and state.lower() not in wanted:
                    continue
                found[g.group_id] = GroupListing(g.group_id, state or "Unknown", "share")
        if errors and not found:
            raise AdminError("ListGroups failed: " + "; ".join(errors))
        return [found[k] for k in sorted(found)]

    # -- ShareGroupDescribe -----------------------------------------------------------------------
    async def describe_group(self, group: str) -> GroupDescription:
        """One share group; :class:`GroupNotFound` when there is none."""
        cls = messages.message_class("ShareGroupDescribeRequest")
        resp = await self._group_request(
            group, ApiKey.SHARE_GROUP_DESCRIBE, lambda v: cls(group_ids=[group], include_authorized_operations=False),
            lambda r: r.groups[0].error_code if r.groups else ErrorCode.NONE)
        if not resp.groups:
            raise AdminError(f"ShareGroupDescribe returned no answer for group {group}")
        g = resp.groups[0]
        _raise_group_error(group, g.error_code, g.error_message, "describe group")
        if g.group_state.lower() == "dead":
            raise GroupNotFound(group)
        members = []
        for m in g.members:
            assignment: dict[str, list[int]] = {}
            for tp in m.assignment.topic_partitions if m.assignment is not None else ():
                name = tp.topic_name or await self._topic_name(bytes(tp.topic_id))
                assignment.setdefault(name, []).extend(tp.partitions)
            members.append(MemberDescription(
                member_id=m.member_id, client_id=m.client_id, host=m.client_host, rack=m.rack_id,
                member_epoch=m.member_epoch, subscribed=sorted(m.subscribed_topic_names),
                assignment={t: sorted(p) for t, p in sorted(assignment.items())}))
        members.sort(key=lambda m: m.member_id)
        return GroupDescription(group_id=g.group_id, state=g.group_state, group_epoch=g.group_epoch,
                                assignment_epoch=g.assignment_epoch, assignor=g.assignor_name,
                                coordinator=self._coordinators[group], members=members)

    # -- DescribeConfigs (GROUP resource) ----------------------------------------------------------
    async def describe_configs(self, group: str) -> list[tuple[str, str | None, str]]:
        """The group's configs as (name, value, source: 'default' or 'dynamic'), by name."""
        cls = messages.message_class("DescribeConfigsRequest")
        conn = await self._any()
        version = self._version(conn, ApiKey.DESCRIBE_CONFIGS, hi=4)
        req = cls(resources=[cls.DescribeConfigsResource(resource_type=GROUP_RESOURCE, resource_name=group,
                                                         configuration_keys=None)])
        resp = await self._request(conn, ApiKey.DESCRIBE_CONFIGS, version, req)
        if not resp.results:
            raise AdminError(f"DescribeConfigs returned no answer for group {group}")
        r = resp.results[0]
        if r.error_code:
            raise AdminError(f"cannot describe the configs of group {group}: {_error_text(r.error_code, r.error_message)}")
        out = []
        for c in r.configs:
            source = _CONFIG_SOURCES.get(c.config_source, str(c.config_source)) if version >= 1 else (
                "default" if c.is_default else "dynamic")
            out.append((c.name, c.value, source))
        return sorted(out)

    # -- IncrementalAlterConfigs (GROUP resource) --------------------------------------------------
    async def set_configs(self, group: str, configs: Mapping[str, str]) -> None:
        """Set group configs (IncrementalAlterConfigs, operation SET), retried while the server is
        still loading its share state (a kshare proxy just started answers COORDINATOR_LOAD_IN_PROGRESS)."""
        cls = messages.message_class("IncrementalAlterConfigsRequest")
        req = cls(validate_only=False, resources=[cls.AlterConfigsResource(
            resource_type=GROUP_RESOURCE, resource_name=group,
            configs=[cls.AlterableConfig(name=k, config_operation=0, value=v) for k, v in configs.items()])])
        deadline = time.monotonic() + self.timeout
        while True:
            conn = await self._any()
            version = self._version(conn, ApiKey.INCREMENTAL_ALTER_CONFIGS, hi=1)
            resp = await self._request(conn, ApiKey.INCREMENTAL_ALTER_CONFIGS, version, req)
            r = resp.responses[0] if resp.responses else None
            code = r.error_code if r is not None else -1
            if code in RETRIABLE_COORDINATOR and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
                continue
            if code:
                message = r.error_message if r is not None else "no answer"
                raise AdminError(f"cannot set {', '.join(f'{k}={v}' for k, v in configs.items())} on group "
                                 f"{group}: {error_name(code)}" + (f" ({message})" if message else ""))
            return

    async def _topic_name(self, topic_id: bytes) -> str:
        for t in self.topics.values():
            if t.topic_id == topic_id:
                return t.name
        await self.refresh_metadata()
        for t in self.topics.values():
            if t.topic_id == topic_id:
                return t.name
        return topic_id.hex()

    # -- DescribeShareGroupOffsets ----------------------------------------------------------------
    async def describe_offsets(self, group: str,
                               topics: dict[str, list[int]] | None = None) -> list[PartitionOffset]:
        """SPSO, leader epoch and lag per share-partition (``topics`` None: all the group has)."""
        cls = messages.message_class("DescribeShareGroupOffsetsRequest")
        req_topics = None if topics is None else [
            cls.DescribeShareGroupOffsetsRequestTopic(topic_name=t, partitions=sorted(p))
            for t, p in sorted(topics.items())]

        def group_error(r: Any) -> int:
            return r.groups[0].error_code if r.groups else ErrorCode.NONE

        resp = await self._group_request(
            group, ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS,
            lambda v: cls(groups=[cls.DescribeShareGroupOffsetsRequestGroup(group_id=group, topics=req_topics)]),
            group_error)
        if not resp.groups:
            return []
        g = resp.groups[0]
        _raise_group_error(group, g.error_code, g.error_message, "describe the offsets of group")
        out = []
        for t in g.topics:
            for p in t.partitions:
                err = _error_text(p.error_code, p.error_message) if p.error_code else None
                start = p.start_offset if p.start_offset >= 0 else None
                lag = getattr(p, "lag", -1)
                out.append(PartitionOffset(
                    topic=t.topic_name, partition=p.partition_index, start_offset=start,
                    leader_epoch=p.leader_epoch if start is not None and p.leader_epoch >= 0 else None,
                    lag=lag if lag is not None and lag >= 0 else None, error=err))
        out.sort(key=lambda o: (o.topic, o.partition))
        return out

    # -- AlterShareGroupOffsets -------------------------------------------------------------------
    async def alter_offsets(self, group: str, offsets: dict[tuple[str, int], int]) -> dict[tuple[str, int], str | None]:
        """Set SPSOs of an empty share group; the error (None: done) per partition."""
        cls = messages.message_class("AlterShareGroupOffsetsRequest")
        by_topic: dict[str, list[tuple[int, int]]] = {}
        for (t, p), off in sorted(offsets.items()):
            by_topic.setdefault(t, []).append((p, off))
        req = cls(group_id=group, topics=[
            cls.AlterShareGroupOffsetsRequestTopic(topic_name=t, partitions=[
                cls.AlterShareGroupOffsetsRequestPartition(partition_index=p, start_offset=o) for p, o in parts])
            for t, parts in by_topic.items()])
        resp = await self._group_request(group, ApiKey.ALTER_SHARE_GROUP_OFFSETS, lambda v: req, lambda r: r.error_code)
        _raise_group_error(group, resp.error_code, resp.error_message, "reset the offsets of group")
        result: dict[tuple[str, int], str | None] = {tp: "no answer" for tp in offsets}
        for t in resp.responses:
            for p in t.partitions:
                if p.error_code == ErrorCode.NON_EMPTY_GROUP:
                    raise GroupNotEmpty(group)
                result[(t.topic_name, p.partition_index)] = (
                    _error_text(p.error_code, p.error_message) if p.error_code else None)
        return result

    # -- DeleteShareGroupOffsets ------------------------------------------------------------------
    async def delete_offsets(self, group: str, topics: list[str]) -> dict[str, str | None]:
        """Forget an empty share group's offsets for whole topics; the error (None: done) per topic."""
        cls = messages.message_class("DeleteShareGroupOffsetsRequest")
        req = cls(group_id=group, topics=[cls.DeleteShareGroupOffsetsRequestTopic(topic_name=t) for t in topics])
        resp = await self._group_request(group, ApiKey.DELETE_SHARE_GROUP_OFFSETS, lambda v: req, lambda r: r.error_code)
        _raise_group_error(group, resp.error_code, resp.error_message, "delete the offsets of group")
        result: dict[str, str | None] = {t: "no answer" for t in topics}
        for t in resp.responses:
            result[t.topic_name] = _error_text(t.error_code, t.error_message) if t.error_code else None
        return result

    # -- DeleteGroups -----------------------------------------------------------------------------
    async def delete_group(self, group: str) -> None:
        cls = messages.message_class("DeleteGroupsRequest")
        resp = await self._group_request(
            group, ApiKey.DELETE_GROUPS, lambda v: cls(groups_names=[group]),
            lambda r: r.results[0].error_code if r.results else ErrorCode.NONE)
        code = resp.results[0].error_code if resp.results else ErrorCode.NONE
        _raise_group_error(group, code, None, "delete group")

    # -- ListOffsets ------------------------------------------------------------------------------
    async def list_offsets(self, partitions: Iterable[tuple[str, int]], timestamp: int,
                           progress: Callable[[int], None] | None = None) -> dict[tuple[str, int], int]:
        """Offsets by ``timestamp`` (EARLIEST, LATEST or ms: the first offset at or after it, -1 if none),
        asked of each partition's leader (one request per leader, retried after leader moves)."""
        todo = sorted(set(partitions))
        out: dict[tuple[str, int], int] = {}
        deadline = time.monotonic() + self.timeout
        cls = messages.message_class("ListOffsetsRequest")
        while todo:
            by_leader: dict[int, list[tuple[str, int]]] = {}
            for t, p in todo:
                meta = self.topics.get(t)
                leader = meta.leaders.get(p, -1) if meta else -1
                by_leader.setdefault(leader, []).append((t, p))
            retry: list[tuple[str, int]] = list(by_leader.pop(-1, []))
            for leader, tps in by_leader.items():
                node = self.brokers.get(leader)
                if node is None:
                    retry.extend(tps)
                    continue
                conn = await self.connection(node)
                version = self._version(conn, ApiKey.LIST_OFFSETS, hi=7)
                if timestamp >= 0:
                    version = max(version, 1)
                topics: dict[str, list[int]] = {}
                for t, p in tps:
                    topics.setdefault(t, []).append(p)
                req = cls(replica_id=-1, isolation_level=0, topics=[
                    cls.ListOffsetsTopic(name=t, partitions=[
                        cls.ListOffsetsPartition(partition_index=p, timestamp=timestamp, current_leader_epoch=-1,
                                                 max_num_offsets=1) for p in ps])
                    for t, ps in topics.items()])
                resp = await self._request(conn, ApiKey.LIST_OFFSETS, version, req)
                done = 0
                for rt in resp.topics:
                    for rp in rt.partitions:
                        key = (rt.name, rp.partition_index)
                        if rp.error_code in _RETRIABLE_PARTITION:
                            retry.append(key)
                        elif rp.error_code:
                            raise AdminError(f"ListOffsets for {rt.name}-{rp.partition_index} failed: "
                                             f"{error_name(rp.error_code)}")
                        else:
                            off = rp.offset if version >= 1 else (rp.old_style_offsets or [-1])[0]
                            out[key] = off
                            done += 1
                if progress is not None and done:
                    progress(done)
            todo = sorted(set(retry) - set(out))
            if todo:
                if time.monotonic() >= deadline:
                    raise AdminError("no leader for " + ", ".join(f"{t}-{p}" for t, p in todo[:5])
                                     + (" ..." if len(todo) > 5 else ""))
                await asyncio.sleep(0.2)
                await self.refresh_metadata({t for t, _ in todo})
        return out


def _error_text(code: int, message: str | None) -> str:
    """Kafka's name for error ``code``, with the broker's message when it sent one."""
    return error_name(code) + (f" ({message})" if message else "")


def _raise_group_error(group: str, code: int, message: str | None, doing: str) -> None:
    """Raise what the group-level error ``code`` of an admin call means (nothing for 0): the group is
    not empty, or not found, or else ``doing`` (``"delete group"``) failed for that reason."""
    if code == ErrorCode.NON_EMPTY_GROUP:
        raise GroupNotEmpty(group)
    if code == ErrorCode.GROUP_ID_NOT_FOUND:
        raise GroupNotFound(group, message)
    if code:
        raise AdminError(f"cannot {doing} {group}: {_error_text(code, message)}")


def _reason(exc: BaseException | None) -> str:
    if exc is None:
        return "no server"
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return "timed out"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = str(exc)
    if ("IncompleteReadError" in text or isinstance(exc, asyncio.IncompleteReadError)
            or (isinstance(exc, ConnectionClosed) and text.endswith("lost: None"))):
        return "the server closed the connection without answering: is it a Kafka listener?"
    return text or type(exc).__name__
