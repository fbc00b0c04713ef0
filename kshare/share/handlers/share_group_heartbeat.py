"""ShareGroupHeartbeat (API key 76): join, stay in, and leave a share group; assignments ride along."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...protocol import messages
from ...protocol.codes import ApiKey
from ..authorization import Operation
from ..errors import ErrorCode
from .common import NOT_COORDINATOR_MESSAGE, coordinated_elsewhere, group_refusal, topic_refusal

if TYPE_CHECKING:
    from ...proxy.connection import ClientConnection
    from ..service import ShareGroupService

API_KEY = ApiKey.SHARE_GROUP_HEARTBEAT
VERSIONS = (1, 1)

Response = messages.message_class("ShareGroupHeartbeatResponse")
_REFUSALS = {ErrorCode.GROUP_AUTHORIZATION_FAILED: "Not authorized to read the group.",
             ErrorCode.TOPIC_AUTHORIZATION_FAILED: "Not authorized to describe a subscribed topic."}


async def handle(service: ShareGroupService, conn: ClientConnection, header: Any, req: Any) -> tuple[int, Any]:
    version = header.api_version
    if not service.loaded:
        return version, Response(error_code=ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                                 error_message="The share group state is still loading.")
    group_id = req.group_id
    if group_id and coordinated_elsewhere(service, group_id):
        return version, Response(error_code=ErrorCode.NOT_COORDINATOR, error_message=NOT_COORDINATOR_MESSAGE)
    if group_id:
        refusal = await group_refusal(service, conn, Operation.READ, group_id)
        if refusal:
            return version, Response(error_code=refusal, error_message=_REFUSALS.get(refusal))
        for name in req.subscribed_topic_names or ():
            refusal = await topic_refusal(service, conn, Operation.DESCRIBE, name)
            if refusal:
                return version, Response(error_code=refusal, error_message=_REFUSALS.get(refusal))
    if group_id and req.member_epoch == 0 and service.coordinator.group(group_id) is None:
        if await service.classic_group_exists(group_id):
            return version, Response(
                error_code=ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                error_message=f"Group {group_id} is not a share group: a consumer group uses this id.")
    if req.subscribed_topic_names and any(t not in service.upstream.topics for t in req.subscribed_topic_names):
        await service.upstream.refresh_metadata(max_age=1.0)  # a topic created just now
    result = service.coordinator.heartbeat(
        group_id, req.member_id, req.member_epoch, req.rack_id, req.subscribed_topic_names,
        client_id=header.client_id or "", client_host=conn.peer.rsplit(":", 1)[0])
    for member_id in result.left:
        if member_id == req.member_id and req.member_epoch == -1 and _has_session(service, group_id, member_id):
            # A member leaving on its own closes its share sessions right after, and librdkafka sends
            # that close (with the last acknowledgements) together with this leave. Releasing now
            # would fail those acknowledgements (INVALID_RECORD_STATE); the session close releases
            # what is left, as on a Kafka broker, and an abandoned session's locks time out.
            continue
        await service.member_gone(group_id, member_id)
    group = service.coordinator.group(group_id)
    if group is not None and service.instances is not None and _learn_topics(service, group):
        result.group_changed = True
    if result.group_changed and group is not None:
        service.persist_group(group)
    if result.error_code:
        return version, Response(error_code=result.error_code, error_message=result.error_message)
    assignment = None
    if result.assignment is not None:
        assignment = Response.Assignment(topic_partitions=[
            Response.TopicPartitions(topic_id=topic_id, partitions=sorted(parts))
            for topic_id, parts in sorted(result.assignment.items())
        ])
    return version, Response(
        member_id=result.member_id,
        member_epoch=result.member_epoch,
        heartbeat_interval_ms=result.heartbeat_interval_ms,
        assignment=assignment,
    )


def _learn_topics(service: ShareGroupService, group: Any) -> bool:
    """In an instance group the share-partitions are initialised by other proxies: the group's own
    record must name the topics its members read (for admin answers once the group is empty)."""
    changed = False
    for name in group.subscribed_topics():
        info = service.upstream.topics.get(name)
        if info is not None and info.topic_id not in group.topics:
            group.topics[info.topic_id] = name
            group.topic_partitions.setdefault(info.topic_id, info.partitions)
            changed = True
    return changed


def _has_session(service: ShareGroupService, group_id: str, member_id: str) -> bool:
    return any(k[0] == group_id and k[1] == member_id for k in service.sessions.sessions)
