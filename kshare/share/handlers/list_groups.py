"""ListGroups (API key 16): the cluster's groups, plus the share groups this proxy coordinates.

Clients ask every broker and take the union, so share groups are listed by one listener only
(the lowest broker id) to appear exactly once. In an instance group each proxy lists the share
groups it coordinates, and one proxy (the lowest slot) the cluster's groups. The v4 state filter and the v5 type filter apply.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...protocol import messages
from ...protocol.codes import ApiKey
from ..authorization import Operation
from .common import admin_loaded, group_refusal

if TYPE_CHECKING:
    from ...proxy.connection import ClientConnection
    from ..service import ShareGroupService

API_KEY = ApiKey.LIST_GROUPS
VERSIONS = (0, 5)
SHARE = "share"

Response = messages.message_class("ListGroupsResponse")


def applies(service: ShareGroupService, header: Any, req: Any) -> bool:
    return True


async def handle(service: ShareGroupService, conn: ClientConnection, header: Any, req: Any) -> tuple[int, Any]:
    version = header.api_version
    # Share groups are known once the state is loaded: wait for it (bounded) so that a proxy just
    # started does not list the cluster's groups alone; past the wait, list those.
    await admin_loaded(service)
    types = {t.lower() for t in req.types_filter} if version >= 5 else set()
    states = {s.lower() for s in req.states_filter} if version >= 4 else set()
    groups: list[Any] = []
    error = 0
    view = service.proxy.view if service.proxy is not None else None
    # in an instance group every proxy is asked: the cluster's own groups come from one of them
    lists_cluster_groups = view is None or view.me == min(view.peers, default=view.me)
    if lists_cluster_groups and (not types or types - {SHARE}):
        upstream_req = type(req)(states_filter=list(req.states_filter),
                                 types_filter=[t for t in req.types_filter if t.lower() != SHARE])
        # on the client's own connection: the cluster lists what the client may describe
        resp = await conn.probe(API_KEY, version, upstream_req)
        error, groups = resp.error_code, list(resp.groups)
    lists_share_groups = conn.node_id is None or conn.node_id == min(service.upstream.brokers, default=conn.node_id)
    if lists_share_groups and (not types or SHARE in types):
        for group in service.coordinator.groups.values():
            if not service.owns_group(group.group_id):
                continue
            if await group_refusal(service, conn, Operation.DESCRIBE, group.group_id):
                continue  # as Kafka: a group the client may not describe is not listed
            state = group.state.value
            if states and state.lower() not in states:
                continue
            groups.append(Response.ListedGroup(group_id=group.group_id, protocol_type=SHARE, group_state=state,
                                               group_type=SHARE))
    return version, Response(error_code=error, groups=groups)
