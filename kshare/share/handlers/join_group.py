"""JoinGroup (API key 11): a classic consumer group may not take a share group's id.

Forwarded untouched unless the group id belongs to a share group, which gets
INCONSISTENT_GROUP_PROTOCOL as Apache Kafka answers (the reverse check lives in the
ShareGroupHeartbeat handler).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...protocol import messages
from ...protocol.codes import ApiKey
from ..errors import ErrorCode

if TYPE_CHECKING:
    from ...proxy.connection import ClientConnection
    from ..service import ShareGroupService

API_KEY = ApiKey.JOIN_GROUP
VERSIONS = (0, 9)

Response = messages.message_class("JoinGroupResponse")


def applies(service: ShareGroupService, header: Any, req: Any) -> bool:
    return service.share_group(req.group_id) is not None


async def handle(service: ShareGroupService, conn: ClientConnection, header: Any, req: Any) -> tuple[int, Any]:
    version = header.api_version
    return version, Response(error_code=ErrorCode.INCONSISTENT_GROUP_PROTOCOL, generation_id=-1,
                             protocol_name=None if version >= 7 else "", leader="", member_id=req.member_id)
