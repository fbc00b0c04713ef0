"""AlterShareGroupOffsets (API key 91): move SPSOs of an empty share group (reset)."""

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

API_KEY = ApiKey.ALTER_SHARE_GROUP_OFFSETS
VERSIONS = (0, 0)

Response = messages.message_class("AlterShareGroupOffsetsResponse")


async def handle(service: ShareGroupService, conn: ClientConnection, header: Any, req: Any) -> tuple[int, Any]:
    version = header.api_version
    refusal, message = await empty_group_refusal(service, conn, Operation.READ, req.group_id, must_exist=False)
    if refusal:
        return version, Response(error_code=refusal, error_message=message)
    responses = []
    for t in req.topics:
        info = await admin.lookup_topic(service, t.topic_name, [p.partition_index for p in t.partitions])
        parts = []
        for p in t.partitions:
            if info is None:
                code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif refusal := await topic_refusal(service, conn, Operation.READ, info.name):
                code = refusal
            else:
                code = await admin.reset_offset(service, req.group_id, info, p.partition_index, p.start_offset)
            parts.append(Response.AlterShareGroupOffsetsResponsePartition(partition_index=p.partition_index,
                                                                          error_code=code))
        responses.append(Response.AlterShareGroupOffsetsResponseTopic(
            topic_name=t.topic_name, topic_id=info.topic_id if info else bytes(16), partitions=parts))
    return version, Response(responses=responses)
