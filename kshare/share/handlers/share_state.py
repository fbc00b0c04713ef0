"""ReadShareGroupState (84), WriteShareGroupState (85), DeleteShareGroupState (86).

Kafka's group coordinator asks its share coordinators with these; in an instance group the proxy
coordinating a share group asks the proxies leading its share-partitions (``kshare.share.admin``).
Each proxy answers for the share-partitions it leads, NOT_COORDINATOR for the others. With a leader
epoch (> 0) they are the exchange of an instance group leading by topic instead: a leader asking
for the copies of a share-partition's state others hold, and telling them to drop older ones
(``kshare.share.instance_service``).

Kafka reserves these to brokers (CLUSTER_ACTION). Here any client can send them, so each is
authorized as the admin RPC it serves, asked of the cluster as the caller (normally kshare's own
principal on a peer proxy): reading state needs DESCRIBE on the group and the topic (as
DescribeShareGroupOffsets), writing it READ on both (as AlterShareGroupOffsets), deleting it
DELETE on the group and READ on the topic (as DeleteShareGroupOffsets).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ...protocol import messages
from ...protocol.codes import ApiKey
from .. import admin
from ..authorization import Operation
from ..errors import ErrorCode
from ..states import ShareSnapshot
from ..store import SharePartitionKey
from .common import group_refusal, topic_refusals

if TYPE_CHECKING:
    from ...proxy.connection import ClientConnection
    from ..service import ShareGroupService

NOT_LEADER = "This proxy does not lead the share-partition."
LOADING = "The share group state is still loading."


Refusal = Callable[[bytes, int], tuple[int, str | None]]


async def _refusals(service: ShareGroupService, conn: ClientConnection, req: Any, group_op: Operation,
                    topic_op: Operation, *, gone_topics: bool = False) -> Refusal:
    """Why a partition of the request is not answered (0: it is): the caller may not (asked of the
    cluster), the state is loading, this proxy does not lead it, or the topic is unknown (unless
    ``gone_topics``: the state of a deleted topic may still be deleted)."""
    group_refused = await group_refusal(service, conn, group_op, req.group_id)
    topics_refused = {} if group_refused else await topic_refusals(service, conn, topic_op,
                                                                    [t.topic_id for t in req.topics])

    def refusal(topic_id: bytes, partition: int) -> tuple[int, str | None]:
        if group_refused or topic_id in topics_refused:
            return group_refused or topics_refused[topic_id], None
        if not service.loaded:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, LOADING
        if not service.owns_partition(topic_id, partition):
            return ErrorCode.NOT_COORDINATOR, NOT_LEADER
        if topic_id not in service.upstream.by_id and not gone_topics:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "Unknown topic id."
        return ErrorCode.NONE, None

    return refusal


async def _each_partition(req: Any, refusal: Refusal,
                          answer: Callable[[bytes, Any, int, str | None], Awaitable[Any]],
                          topic_result: Callable[..., Any]) -> list[Any]:
    """Each topic's result, of each partition's ``answer`` (given why it is refused, if it is)."""
    results = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            code, message = refusal(t.topic_id, p.partition)
            parts.append(await answer(t.topic_id, p, code, message))
        results.append(topic_result(topic_id=t.topic_id, partitions=parts))
    return results


class ReadShareGroupState:
    API_KEY = ApiKey.READ_SHARE_GROUP_STATE
    VERSIONS = (0, 0)
    Response = messages.message_class("ReadShareGroupStateResponse")

    @classmethod
    async def handle(cls, service: ShareGroupService, conn: ClientConnection, header: Any, req: Any) -> tuple[int, Any]:
        if any(p.leader_epoch > 0 for t in req.topics for p in t.partitions):
            # a leader by topic asking for the copies this proxy holds (kshare.share.instance_service)
            return header.api_version, await service.answer_copies(conn, req)
        R = cls.Response
        refusal = await _refusals(service, conn, req, Operation.DESCRIBE, Operation.DESCRIBE)

        async def answer(topic_id: bytes, p: Any, code: int, message: str | None) -> Any:
            if code:
                return R.PartitionResult(partition=p.partition, error_code=code, error_message=message,
                                         start_offset=-1)
            key = SharePartitionKey(req.group_id, topic_id, p.partition)
            code = await service.confirm_state(key)  # leading by topic: the newest copy here first
            if code:
                return R.PartitionResult(partition=p.partition, error_code=code, start_offset=-1)
            snapshot = admin.durable_state(service, key) or ShareSnapshot(-1, ())
            return R.PartitionResult(
                partition=p.partition, state_epoch=service.store.state_epoch(key) or 0,
                start_offset=snapshot.start_offset, state_batches=[
                    R.StateBatch(first_offset=b.first_offset, last_offset=b.last_offset,
                                 delivery_state=b.delivery_state, delivery_count=b.delivery_count)
                    for b in snapshot.state_batches])

        return header.api_version, R(results=await _each_partition(req, refusal, answer, R.ReadStateResult))


class WriteShareGroupState:
    """Only what the group's coordinator writes elsewhere: an SPSO reset (no state batches)."""

    API_KEY = ApiKey.WRITE_SHARE_GROUP_STATE
    VERSIONS = (0, 0)
    Response = messages.message_class("WriteShareGroupStateResponse")

    @classmethod
    async def handle(cls, service: ShareGroupService, conn: ClientConnection, header: Any, req: Any) -> tuple[int, Any]:
        if any(p.leader_epoch > 0 and p.start_offset < 0 for t in req.topics for p in t.partitions):
            # a leader by topic telling the holders of older copies to drop them (instance_service)
            return header.api_version, await service.drop_copies(conn, req)
        R = cls.Response
        refusal = await _refusals(service, conn, req, Operation.READ, Operation.READ)

        async def answer(topic_id: bytes, p: Any, code: int, message: str | None) -> Any:
            if not code and (p.state_batches or p.start_offset < 0):
                code, message = ErrorCode.INVALID_REQUEST, "Only a start offset without state batches is written."
            if not code:
                topic = service.upstream.by_id[topic_id]
                try:
                    code = await admin.reset_partition(service, req.group_id, topic, p.partition, p.start_offset)
                except Exception:  # noqa: BLE001 - the write failed: the coordinator reports it
                    code, message = ErrorCode.COORDINATOR_NOT_AVAILABLE, "The state write failed."
            return R.PartitionResult(partition=p.partition, error_code=code, error_message=message)

        return header.api_version, R(results=await _each_partition(req, refusal, answer, R.WriteStateResult))


class DeleteShareGroupState:
    API_KEY = ApiKey.DELETE_SHARE_GROUP_STATE
    VERSIONS = (0, 0)
    Response = messages.message_class("DeleteShareGroupStateResponse")

    @classmethod
    async def handle(cls, service: ShareGroupService, conn: ClientConnection, header: Any, req: Any) -> tuple[int, Any]:
        R = cls.Response
        refusal = await _refusals(service, conn, req, Operation.DELETE, Operation.READ, gone_topics=True)
        results = []
        for t in req.topics:
            parts, keys = [], []
            for p in t.partitions:
                code, message = refusal(t.topic_id, p.partition)
                if not code:
                    keys.append(SharePartitionKey(req.group_id, t.topic_id, p.partition))
                parts.append(R.PartitionResult(partition=p.partition, error_code=code, error_message=message))
            if keys:
                try:
                    await admin.delete_partitions(service, keys)
                except Exception:  # noqa: BLE001
                    for part in parts:
                        if part.error_code == 0:
                            part.error_code = ErrorCode.COORDINATOR_NOT_AVAILABLE
            results.append(R.DeleteStateResult(topic_id=t.topic_id, partitions=parts))
        return header.api_version, R(results=results)
