"""Whether a client may do what it asks of the share-group service, as the cluster decides.

kshare serves the share-group RPCs itself and reads records upstream as itself, so it must not
answer a client the cluster would refuse. It does not evaluate ACLs: it asks the cluster, as the
client. Each question is a request of the proxy's own sent on the client's upstream connection
(``ClientConnection.probe``), which the client authenticated (SASL) itself, so the cluster's
authorizer answers for the client's principal with the cluster's own rules (ACLs, super users,
``allow.everyone.if.no.acl.found``, a custom authorizer alike). Each request is one the broker
authorizes before doing anything else, and that changes nothing when it is allowed:

=================  =======================================================================
READ on a group     Heartbeat of member "" at generation -1 (GROUP_AUTHORIZATION_FAILED, or
                    an unknown member / not the coordinator)
DESCRIBE a group    DescribeGroups of the group
DELETE a group      DeleteGroups of the group (share groups never exist upstream as consumer
                    groups: kshare refuses a share group whose id a consumer group uses)
DESCRIBE_CONFIGS    DescribeConfigs of the GROUP resource, no keys
ALTER_CONFIGS       IncrementalAlterConfigs of the GROUP resource, nothing to change, validate only
READ on a topic     a sessionless Fetch of partition 0 at the largest offset (TOPIC_AUTHORIZATION_
                    FAILED, or out of range / not the leader: no record is read)
DESCRIBE a topic    Metadata of the topic, without auto-creation
=================  =======================================================================

Answers are cached per client connection for ``ttl_s`` seconds (30 by default): a revoked
permission takes effect within that time. Only the authorization error codes deny; any other
answer allows (the cluster said no more than that). A question nobody answers (the connection
closed, a timeout) raises :class:`AuthorizationUnknown`: the caller answers with a retriable
error, never with the records.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from enum import Enum
from typing import Any

from ..protocol import messages
from ..protocol.codes import ApiKey, ErrorCode
from .tasks import shared_task

PROBE_TIMEOUT_S = 10.0
DEFAULT_TTL_S = 30.0

_GROUP_RESOURCE = 32  # ConfigResource.Type.GROUP
_LAST_OFFSET = (1 << 63) - 1


class Operation(Enum):
    READ = "read"
    DESCRIBE = "describe"
    DELETE = "delete"
    DESCRIBE_CONFIGS = "describe-configs"
    ALTER_CONFIGS = "alter-configs"


class AuthorizationUnknown(Exception):
    """The cluster could not be asked; the request is answered with a retriable error."""


Key = tuple[Any, Operation, str, str]  # (client connection, operation, "group"/"topic", name)


class ShareAuthorizer:
    def __init__(self, ttl_s: float = DEFAULT_TTL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self._answers: dict[Key, tuple[float, bool]] = {}
        self._asking: dict[Key, asyncio.Future] = {}
        self.probes = 0  # questions sent to the cluster (for metrics and tests)
        self.denials = 0

    # -- the questions ------------------------------------------------------------------------------
    async def group(self, conn: Any, op: Operation, group_id: str) -> bool:
        return await self._allowed((conn, op, "group", group_id))

    async def topic(self, conn: Any, op: Operation, topic: str) -> bool:
        return await self._allowed((conn, op, "topic", topic))

    def cached(self, conn: Any, op: Operation, kind: str, name: str) -> bool | None:
        """The answer if known and fresh (the hot path asks this first, without awaiting)."""
        entry = self._answers.get((conn, op, kind, name))
        if entry is not None and entry[0] > self.clock():
            return entry[1]
        return None

    def forget(self, conn: Any) -> None:
        """A client connection closed: its answers go."""
        for key in [k for k in self._answers if k[0] is conn]:
            del self._answers[key]

    # -- asking -------------------------------------------------------------------------------------
    async def _allowed(self, key: Key) -> bool:
        entry = self._answers.get(key)
        if entry is not None and entry[0] > self.clock():
            return entry[1]
        fut = self._asking.get(key)
        if fut is None:
            fut = shared_task(self._ask(key))
            self._asking[key] = fut
            fut.add_done_callback(lambda _f, k=key: self._asking.pop(k, None))
        return await asyncio.shield(fut)

    async def _ask(self, key: Key) -> bool:
        conn, op, kind, name = key
        api_key, body = _question(op, kind, name)
        version = _version(conn, api_key)
        self.probes += 1
        try:
            resp = await asyncio.wait_for(conn.probe(api_key, version, body), PROBE_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - closed, timed out, undecodable: not known
            raise AuthorizationUnknown(f"asking the cluster whether {op.value} on {kind} {name!r} is allowed: "
                                       f"{exc or type(exc).__name__}") from exc
        allowed = _error_code(api_key, resp) not in (ErrorCode.TOPIC_AUTHORIZATION_FAILED, ErrorCode.GROUP_AUTHORIZATION_FAILED)
        if not allowed:
            self.denials += 1
        if not getattr(conn, "closed", False):
            self._answers[key] = (self.clock() + self.ttl_s, allowed)
        return allowed


def _version(conn: Any, api_key: int) -> int:
    """The newest version both kshare's codec and the cluster speak (Fetch: one with topic names)."""
    a = messages.api(api_key)
    hi = a.max_version if api_key != ApiKey.FETCH else 12
    theirs = (conn.proxy.upstream_versions or {}).get(api_key)
    if theirs is not None:
        hi = min(hi, theirs[1])
    return max(hi, a.min_version)


def _question(op: Operation, kind: str, name: str) -> tuple[int, Any]:
    if kind == "group":
        if op is Operation.READ:
            return ApiKey.HEARTBEAT, messages.message_class("HeartbeatRequest")(group_id=name, generation_id=-1, member_id="")
        if op is Operation.DESCRIBE:
            return ApiKey.DESCRIBE_GROUPS, messages.message_class("DescribeGroupsRequest")(groups=[name])
        if op is Operation.DESCRIBE_CONFIGS:
            describe = messages.message_class("DescribeConfigsRequest")
            return ApiKey.DESCRIBE_CONFIGS, describe(resources=[describe.DescribeConfigsResource(
                resource_type=_GROUP_RESOURCE, resource_name=name, configuration_keys=[])])
        if op is Operation.ALTER_CONFIGS:
            alter = messages.message_class("IncrementalAlterConfigsRequest")
            return ApiKey.INCREMENTAL_ALTER_CONFIGS, alter(validate_only=True, resources=[alter.AlterConfigsResource(
                resource_type=_GROUP_RESOURCE, resource_name=name, configs=[])])
        return ApiKey.DELETE_GROUPS, messages.message_class("DeleteGroupsRequest")(groups_names=[name])
    if op is Operation.READ:
        fetch = messages.message_class("FetchRequest")
        return ApiKey.FETCH, fetch(replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1, isolation_level=0,
                             session_id=0, session_epoch=-1, topics=[fetch.FetchTopic(topic=name, partitions=[
                                 fetch.FetchPartition(partition=0, fetch_offset=_LAST_OFFSET, partition_max_bytes=1,
                                                      log_start_offset=-1, current_leader_epoch=-1)])],
                             forgotten_topics_data=[], rack_id="")
    metadata = messages.message_class("MetadataRequest")
    return ApiKey.METADATA, metadata(topics=[metadata.MetadataRequestTopic(name=name)], allow_auto_topic_creation=False)


def _error_code(api_key: int, resp: Any) -> int:
    if api_key == ApiKey.HEARTBEAT:
        return resp.error_code
    if api_key == ApiKey.DESCRIBE_GROUPS:
        return resp.groups[0].error_code if resp.groups else 0
    if api_key == ApiKey.DELETE_GROUPS:
        return resp.results[0].error_code if resp.results else 0
    if api_key == ApiKey.DESCRIBE_CONFIGS:
        return resp.results[0].error_code if resp.results else 0
    if api_key == ApiKey.INCREMENTAL_ALTER_CONFIGS:
        return resp.responses[0].error_code if resp.responses else 0
    if api_key == ApiKey.FETCH:
        if getattr(resp, "error_code", 0) in (ErrorCode.TOPIC_AUTHORIZATION_FAILED,):
            return resp.error_code
        return next((p.error_code for t in resp.responses for p in t.partitions), 0)
    return resp.topics[0].error_code if resp.topics else 0
