"""ShareGroupDescribe (API key 77): members, assignments, epochs and state of share groups."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...protocol import messages
from ...protocol.codes import ApiKey
from ..authorization import Operation
from ..errors import ErrorCode
from .common import NOT_COORDINATOR_MESSAGE, admin_loaded, coordinated_elsewhere, group_refusal

if TYPE_CHECKING:
    from ...proxy.connection import ClientConnection
    from ..service import ShareGroupService

API_KEY = ApiKey.SHARE_GROUP_DESCRIBE
VERSIONS = (0, 1)
ASSIGNOR = "simple"

Response = messages.message_class("ShareGroupDescribeResponse")


def _assignment(service: ShareGroupService, assignment: dict[bytes, list[int]]) -> Any:
    topics = []
    for topic_id, parts in sorted(assignment.items()):
        info = service.upstream.by_id.get(topic_id)
        topics.append(Response.TopicPartitions(topic_id=topic_id, topic_name=info.name if info else "",
                                               partitions=sorted(parts)))
    return Response.Assignment(topic_partitions=topics)


async def handle(service: ShareGroupService, conn: ClientConnection, header: Any, req: Any) -> tuple[int, Any]:
    groups = []
    loaded = await admin_loaded(service)
    for group_id in req.group_ids:
        group = service.share_group(group_id) if loaded else None
        if not loaded:
            groups.append(Response.DescribedGroup(group_id=group_id, error_code=ErrorCode.COORDINATOR_LOAD_IN_PROGRESS))
            continue
        if coordinated_elsewhere(service, group_id):
            groups.append(Response.DescribedGroup(group_id=group_id, error_code=ErrorCode.NOT_COORDINATOR,
                                                  error_message=NOT_COORDINATOR_MESSAGE))
            continue
        refusal = await group_refusal(service, conn, Operation.DESCRIBE, group_id)
        if refusal:
            groups.append(Response.DescribedGroup(group_id=group_id, error_code=refusal))
            continue
        if group is None:
            groups.append(Response.DescribedGroup(group_id=group_id, error_code=ErrorCode.GROUP_ID_NOT_FOUND,
                                                  error_message=f"Group {group_id} not found."))
            continue
        members = [
            Response.Member(member_id=m.member_id, rack_id=m.rack_id, member_epoch=m.epoch, client_id=m.client_id,
                            client_host=f"/{m.client_host}", subscribed_topic_names=list(m.subscribed),
                            assignment=_assignment(service, m.assignment))
            for m in group.members.values()
        ]
        groups.append(Response.DescribedGroup(
            group_id=group_id, group_state=group.state.value, group_epoch=group.epoch, assignment_epoch=group.epoch,
            assignor_name=ASSIGNOR, members=members))
    return header.api_version, Response(groups=groups)
