"""DeleteShareGroupOffsets (API key 92): forget an empty share group's state for some topics."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...protocol import messages
from ...protocol.codes import ApiKey
from .. import admin
from ..authorization import Operation
from ..errors import ErrorCode
from .common import empty_group_refusal, topic_refusal

if TYPE_CHECKING:
    from ...proxy.connection import ClientConnection
    from ..service import ShareGroupService

API_KEY = ApiKey.DELETE_SHARE_GROUP_OFFSETS
VERSIONS = (0, 0)

Response = messages.message_class("DeleteShareGroupOffsetsResponse")


async def handle(service: ShareGroupService, conn: ClientConnection, header: Any, req: Any) -> tuple[int, Any]:
    version = header.api_version
    refusal, message = await empty_group_refusal(service, conn, Operation.DELETE, req.group_id, must_exist=True)
    if refusal:
        return version, Response(error_code=refusal, error_message=message)
    responses = []
    for t in req.topics:
        info = await admin.lookup_topic(service, t.topic_name)
        if info is None:
            responses.append(Response.DeleteShareGroupOffsetsResponseTopic(
                topic_name=t.topic_name, topic_id=bytes(16), error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
            continue
        code = await topic_refusal(service, conn, Operation.READ, info.name)
        if not code:
            code = await admin.delete_topic_offsets(service, req.group_id, info)
        responses.append(Response.DeleteShareGroupOffsetsResponseTopic(
            topic_name=t.topic_name, topic_id=info.topic_id, error_code=code))
    return version, Response(responses=responses)
