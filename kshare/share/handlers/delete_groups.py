"""DeleteGroups (API key 42): share groups are deleted here (empty ones only), others by the cluster."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...protocol import messages
from ...protocol.codes import ApiKey
from .. import admin
from ..authorization import Operation
from ..errors import ErrorCode
from .common import admin_loaded, coordinated_elsewhere, group_refusal

if TYPE_CHECKING:
    from ...proxy.connection import ClientConnection
    from ..service import ShareGroupService

API_KEY = ApiKey.DELETE_GROUPS
VERSIONS = (0, 2)

Response = messages.message_class("DeleteGroupsResponse")


def applies(service: ShareGroupService, header: Any, req: Any) -> bool:
    # While the share state loads nobody can tell a share group from another: wait for the load
    # (bounded), then answer a retriable COORDINATOR_LOAD_IN_PROGRESS rather than let the cluster
    # say a share group does not exist.
    return not service.loaded or any(service.share_group(g) is not None or coordinated_elsewhere(service, g)
                                     for g in req.groups_names)


async def handle(service: ShareGroupService, conn: ClientConnection, header: Any, req: Any) -> tuple[int, Any]:
    version = header.api_version
    if not await admin_loaded(service):
        return version, Response(results=[Response.DeletableGroupResult(
            group_id=g, error_code=ErrorCode.COORDINATOR_LOAD_IN_PROGRESS) for g in req.groups_names])
    ours = [g for g in req.groups_names if service.share_group(g) is not None]
    # in an instance group a group belongs to one proxy, which clients find with FindCoordinator
    elsewhere = [g for g in req.groups_names if coordinated_elsewhere(service, g)]
    others = [g for g in req.groups_names if g not in ours and g not in elsewhere]
    results: dict[str, Any] = {g: Response.DeletableGroupResult(group_id=g, error_code=ErrorCode.NOT_COORDINATOR)
                               for g in elsewhere}
    if others:
        # the cluster's groups: asked on the client's own connection, so its ACLs decide
        resp = await conn.probe(API_KEY, version, type(req)(groups_names=others))
        results.update({r.group_id: r for r in resp.results})
    for group_id in ours:
        code = await group_refusal(service, conn, Operation.DELETE, group_id)
        if not code:
            code = await admin.delete_group(service, group_id)
        results[group_id] = Response.DeletableGroupResult(group_id=group_id, error_code=code)
    return version, Response(results=[results[g] for g in req.groups_names if g in results])
