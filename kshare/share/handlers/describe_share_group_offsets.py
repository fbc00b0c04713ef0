"""DescribeShareGroupOffsets (API key 90): SPSO and lag per share-partition."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...protocol import messages
from ...protocol.codes import ApiKey
from .. import admin
from ..authorization import Operation
from ..errors import ErrorCode
from .common import NOT_COORDINATOR_MESSAGE, admin_loaded, coordinated_elsewhere, group_refusal, topic_refusal

if TYPE_CHECKING:
    from ...proxy.connection import ClientConnection
    from ..service import ShareGroupService

API_KEY = ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS
VERSIONS = (0, 1)

Response = messages.message_class("DescribeShareGroupOffsetsResponse")


async def handle(service: ShareGroupService, conn: ClientConnection, header: Any, req: Any) -> tuple[int, Any]:
    groups = []
    loaded = await admin_loaded(service)
    for g in req.groups:
        if not loaded:
            groups.append(Response.DescribeShareGroupOffsetsResponseGroup(
                group_id=g.group_id, error_code=ErrorCode.COORDINATOR_LOAD_IN_PROGRESS))
            continue
        if coordinated_elsewhere(service, g.group_id):
            groups.append(Response.DescribeShareGroupOffsetsResponseGroup(
                group_id=g.group_id, error_code=ErrorCode.NOT_COORDINATOR, error_message=NOT_COORDINATOR_MESSAGE))
            continue
        refusal = await group_refusal(service, conn, Operation.DESCRIBE, g.group_id)
        if refusal:
            groups.append(Response.DescribeShareGroupOffsetsResponseGroup(group_id=g.group_id, error_code=refusal))
            continue
        await service.upstream.refresh_metadata(max_age=5.0)
        if g.topics is None:  # every topic the group has state for
            wanted = [(t, None) for t in admin.group_topics(service, g.group_id).values()]
            missing = []
        else:
            wanted, missing = [], []
            for t in g.topics:
                info = await admin.lookup_topic(service, t.topic_name, t.partitions)
                (wanted.append((info, list(t.partitions))) if info else missing.append(t))
        topics = []
        for info, partitions in wanted:
            refusal = await topic_refusal(service, conn, Operation.DESCRIBE, info.name)
            if refusal:
                if g.topics is not None:  # asked by name: answered with the refusal; else left out
                    topics.append(Response.DescribeShareGroupOffsetsResponseTopic(
                        topic_name=info.name, topic_id=info.topic_id, partitions=[
                            Response.DescribeShareGroupOffsetsResponsePartition(
                                partition_index=p, start_offset=-1, leader_epoch=0, lag=-1, error_code=refusal)
                            for p in (partitions or range(info.partitions))]))
                continue
            offsets = await admin.partition_offsets(service, g.group_id, info, partitions)
            topics.append(Response.DescribeShareGroupOffsetsResponseTopic(
                topic_name=info.name, topic_id=info.topic_id, partitions=[
                    Response.DescribeShareGroupOffsetsResponsePartition(
                        partition_index=o.partition, start_offset=o.start_offset, leader_epoch=0, lag=o.lag,
                        error_code=o.error_code) for o in offsets]))
        for t in missing:
            topics.append(Response.DescribeShareGroupOffsetsResponseTopic(
                topic_name=t.topic_name, topic_id=bytes(16), partitions=[
                    Response.DescribeShareGroupOffsetsResponsePartition(
                        partition_index=p, start_offset=-1, leader_epoch=0, lag=-1,
                        error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                        error_message="This server does not host this topic-partition.") for p in t.partitions]))
        groups.append(Response.DescribeShareGroupOffsetsResponseGroup(group_id=g.group_id, topics=topics))
    return header.api_version, Response(groups=groups)
