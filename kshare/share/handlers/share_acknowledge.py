"""ShareAcknowledge (API key 79): acknowledgements sent on their own, answered once durable."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...protocol import messages
from ...protocol.codes import ApiKey
from ..authorization import Operation
from ..errors import ErrorCode
from ..sessions import FINAL_EPOCH
from ..stats import SESSION_CLOSED
from .common import (
    MAX_MEMBER_ID_LENGTH,
    Resolved,
    apply_acknowledgements,
    await_writes,
    count_dropped_acks,
    group_refusal,
    session_key,
    topic_refusals,
)

if TYPE_CHECKING:
    from ...proxy.connection import ClientConnection
    from ..service import ShareGroupService

API_KEY = ApiKey.SHARE_ACKNOWLEDGE
VERSIONS = (1, 2)

Response = messages.message_class("ShareAcknowledgeResponse")


async def handle(service: ShareGroupService, conn: ClientConnection, header: Any, req: Any) -> tuple[int, Any]:
    version = header.api_version
    if not service.loaded:
        return version, Response(error_code=ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
    group_id, member_id = req.group_id, req.member_id
    if not group_id or not member_id or len(member_id) > MAX_MEMBER_ID_LENGTH:
        return version, Response(error_code=ErrorCode.INVALID_REQUEST,
                                 error_message="GroupId and MemberId (at most 36 characters) must be set.")
    refusal = await group_refusal(service, conn, Operation.READ, group_id)
    if refusal:
        return version, Response(error_code=refusal)
    group = service.coordinator.ensure_group(group_id)
    lock_ms = group.config.record_lock_duration_ms
    opened = service.sessions.open(session_key(group_id, member_id, conn), req.share_session_epoch, (), (),
                                   fetch=False, owner=conn)
    if opened.error_code:
        count_dropped_acks(service, group_id, req.topics, opened.error_code)
        return version, Response(error_code=opened.error_code, acquisition_lock_timeout_ms=lock_ms)
    acks = [(t.topic_id, p.partition_index, p.acknowledgement_batches) for t in req.topics for p in t.partitions]
    renew = version >= 2 and req.is_renew_ack
    refused = await topic_refusals(service, conn, Operation.READ, [t.topic_id for t in req.topics])
    outcomes = await apply_acknowledgements(service, Resolved(service, group_id), member_id, acks, renew_allowed=renew,
                                            refused=refused)
    if req.share_session_epoch == FINAL_EPOCH and opened.session is not None:
        await service.release_member(group_id, member_id, list(opened.session.partitions), SESSION_CLOSED)
    by_topic: dict[bytes, list[Any]] = {}
    for o, code in await await_writes(outcomes, service, group_id):
        by_topic.setdefault(o.topic_id, []).append(Response.PartitionData(
            partition_index=o.partition, error_code=code,
            current_leader=Response.LeaderIdAndEpoch(leader_id=-1, leader_epoch=-1)))
    return version, Response(
        acquisition_lock_timeout_ms=lock_ms,
        responses=[Response.ShareAcknowledgeTopicResponse(topic_id=t, partitions=parts) for t, parts in by_topic.items()],
    )
