"""Share-group administration on top of the service: offsets, lag, resets, deletions.

Used by the admin RPC handlers (ShareGroupDescribe, DescribeShareGroupOffsets,
AlterShareGroupOffsets, DeleteShareGroupOffsets, DeleteGroups) and by the metrics endpoint.

In an instance group the group's coordinator answers them, but the state of a share-partition
lives with its leader, which may be another proxy: that state is read, reset and deleted there
with ReadShareGroupState, WriteShareGroupState and DeleteShareGroupState (as Kafka's group
coordinator asks its share coordinators), one request per proxy.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..protocol import messages
from .errors import ErrorCode
from .states import TERMINAL_STATES, ShareSnapshot, StateBatch
from .store import SharePartitionKey
from .upstream import LATEST, TopicInfo

if TYPE_CHECKING:
    from .service import ShareGroupService


@dataclass(slots=True)
class PartitionOffsets:
    partition: int
    start_offset: int  # SPSO, -1 when the group has no state for the partition yet
    lag: int  # records not yet delivery-complete, -1 when unknown
    error_code: int = 0


def durable_state(service: ShareGroupService, key: SharePartitionKey) -> ShareSnapshot | None:
    """The share-partition's state: its engine's, else what the store holds (None: no state)."""
    sp = service.partitions.get(key)
    if sp is not None and sp.engine is not None:
        return sp.engine.snapshot()
    return service.store.share_partitions().get(key)


def settled_above_start(snapshot: ShareSnapshot, end: int) -> int:
    """Records at or above the SPSO (and below ``end``) that are already Acknowledged or Archived."""
    done = 0
    for b in snapshot.state_batches:
        if b.delivery_state in TERMINAL_STATES and b.last_offset >= snapshot.start_offset:
            first = max(b.first_offset, snapshot.start_offset)
            last = min(b.last_offset, end - 1)
            if last >= first:
                done += last - first + 1
    return done


_TOPIC_DATA = {84: "ReadStateData", 85: "WriteStateData", 86: "DeleteStateData"}


def _by_owner(service: ShareGroupService, topic: TopicInfo, partitions: Iterable[int]) -> dict[str, tuple[Any, list[int]]]:
    """The partitions another proxy leads, by that proxy (an instance group only)."""
    out: dict[str, tuple[Any, list[int]]] = {}
    for p in partitions:
        if not service.owns_partition(topic.topic_id, p):
            owner = service.ownership.owner_of_partition(topic.topic_id, p)
            key = owner.id if owner is not None else ""
            out.setdefault(key, (owner, []))[1].append(p)
    return out


async def _ask_leaders(service: ShareGroupService, api_key: int, group_id: str, topic: TopicInfo,
                       partitions: Iterable[int], partition_data: Any) -> dict[int, Any]:
    """Send the share-state request ``api_key`` for these partitions to the proxies leading them;
    partition -> its PartitionResult (an error code for those nobody answered)."""
    results: dict[int, Any] = {}
    request = messages.message_class(messages.api(api_key).request.name)
    response = messages.message_class(messages.api(api_key).response.name)
    topic_cls = getattr(request, _TOPIC_DATA[api_key])
    for owner, parts in _by_owner(service, topic, partitions).values():
        if owner is None or service.peers is None or service.is_me(owner):  # nobody, or moving here
            for p in parts:
                results[p] = response.PartitionResult(partition=p, error_code=ErrorCode.COORDINATOR_NOT_AVAILABLE)
            continue
        body = request(group_id=group_id, topics=[topic_cls(topic_id=topic.topic_id,
                                                            partitions=[partition_data(p) for p in parts])])
        try:
            resp = await service.peers.request(owner, api_key, body)
        except Exception:  # noqa: BLE001 - the leader may be moving: the admin client retries
            for p in parts:
                results[p] = response.PartitionResult(partition=p, error_code=ErrorCode.COORDINATOR_NOT_AVAILABLE)
            continue
        for r in resp.results:
            for pr in r.partitions:
                results[pr.partition] = pr
        for p in parts:
            results.setdefault(p, response.PartitionResult(partition=p, error_code=ErrorCode.COORDINATOR_NOT_AVAILABLE))
    return results


async def partition_offsets(service: ShareGroupService, group_id: str, topic: TopicInfo,
                            partitions: list[int] | None) -> list[PartitionOffsets]:
    """SPSO and lag of each partition: lag = high watermark - SPSO - settled records in between."""
    out = []
    wanted = list(range(topic.partitions) if partitions is None else partitions)
    read = messages.message_class("ReadShareGroupStateRequest")
    remote = await _ask_leaders(service, 84, group_id, topic, [p for p in wanted if 0 <= p < topic.partitions],
                                lambda p: read.PartitionData(partition=p, leader_epoch=-1))
    for p in wanted:
        if not 0 <= p < topic.partitions:
            out.append(PartitionOffsets(p, -1, -1, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
            continue
        if p in remote:
            r = remote[p]
            if r.error_code:
                out.append(PartitionOffsets(p, -1, -1, r.error_code))
                continue
            snapshot = ShareSnapshot(r.start_offset, tuple(StateBatch(b.first_offset, b.last_offset, b.delivery_state,
                                                                      b.delivery_count) for b in r.state_batches))
        else:
            key = SharePartitionKey(group_id, topic.topic_id, p)
            await service.confirm_state(key)  # leading by topic: the newest copy here first
            snapshot = durable_state(service, key)
        if snapshot is None or snapshot.start_offset < 0:
            out.append(PartitionOffsets(p, -1, -1))
            continue
        err, end = await service.upstream.list_offset(topic, p, LATEST)
        lag = -1 if err else max(0, end - snapshot.start_offset - settled_above_start(snapshot, end))
        out.append(PartitionOffsets(p, snapshot.start_offset, lag))
    return out


async def lookup_topic(service: ShareGroupService, name: str, partitions: Iterable[int] = ()) -> TopicInfo | None:
    """The topic as of recent metadata; refreshed at once when it (or one of ``partitions``) is not known yet,
    so a topic created a moment ago can be reset or described, as on a Kafka broker."""
    await service.upstream.refresh_metadata(max_age=5.0)
    info = service.upstream.topics.get(name)
    if info is None or any(p >= info.partitions for p in partitions):
        await service.upstream.refresh_metadata()
        info = service.upstream.topics.get(name)
    return info


def group_topics(service: ShareGroupService, group_id: str) -> dict[bytes, TopicInfo]:
    """Topics the group has state for (those still in the cluster), by id."""
    ids = {k.topic_id for k in service.store.share_partitions() if k.group_id == group_id}
    ids |= {k.topic_id for k in service.partitions if k.group_id == group_id}
    group = service.share_group(group_id)
    if group is not None:
        ids |= set(group.topics)
        ids |= {service.upstream.topics[name].topic_id for name in group.subscribed_topics()
                if name in service.upstream.topics}
    return {t: service.upstream.by_id[t] for t in ids if t in service.upstream.by_id}


async def reset_offset(service: ShareGroupService, group_id: str, topic: TopicInfo, partition: int,
                       offset: int) -> int:
    """Move a share-partition's SPSO (empty groups only); in-flight state is discarded."""
    group = service.share_group(group_id)
    if group is not None and group.members:
        return ErrorCode.NON_EMPTY_GROUP
    if not 0 <= partition < topic.partitions:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    if offset < 0:
        return ErrorCode.INVALID_REQUEST
    group = service.coordinator.ensure_group(group_id)
    group.topics.setdefault(topic.topic_id, topic.name)
    group.topic_partitions.setdefault(topic.topic_id, topic.partitions)
    if service.owns_partition(topic.topic_id, partition):
        code = await reset_partition(service, group_id, topic, partition, offset)
    else:
        write = messages.message_class("WriteShareGroupStateRequest")
        result = await _ask_leaders(service, 85, group_id, topic, [partition], lambda p: write.PartitionData(
            partition=p, state_epoch=0, leader_epoch=-1, start_offset=offset, state_batches=[]))
        code = result[partition].error_code
    if code:
        return code
    await service.persist_group_now(group)
    return ErrorCode.NONE


async def reset_partition(service: ShareGroupService, group_id: str, topic: TopicInfo, partition: int,
                          offset: int) -> int:
    """Move the SPSO of a share-partition this proxy leads (its in-flight state is discarded)."""
    sp = service.share_partition(group_id, topic, partition)
    if sp.engine is not None:
        result = sp.engine.reset_start_offset(offset)
        if result.error_code:
            return result.error_code
        await sp.persist(result.snapshot)
    else:
        code = await service.confirm_state(sp.key)  # leading by topic: the newest copy here first
        if code:
            return code
        await service.store.write([(sp.key, ShareSnapshot(offset, ()))])
    return ErrorCode.NONE


async def delete_partitions(service: ShareGroupService, keys: list[SharePartitionKey]) -> None:
    """Forget the state of share-partitions this proxy leads."""
    for key in keys:  # leading by topic: copies elsewhere dropped first, the newest one here
        await service.confirm_state(key)
    await service.store.delete_share_partitions(keys)
    service.drop_share_partitions(keys)


async def _delete_elsewhere(service: ShareGroupService, group_id: str, topics: Iterable[TopicInfo]) -> int:
    """Delete the group's state of these topics' partitions that other proxies lead."""
    delete = messages.message_class("DeleteShareGroupStateRequest")
    for topic in topics:
        results = await _ask_leaders(service, 86, group_id, topic, range(topic.partitions),
                                     lambda p: delete.PartitionData(partition=p))
        failed = [r.error_code for r in results.values() if r.error_code]
        if failed:
            return failed[0]
    return ErrorCode.NONE


async def delete_topic_offsets(service: ShareGroupService, group_id: str, topic: TopicInfo) -> int:
    """Forget the group's state for a topic (empty groups only): it starts over from the reset policy."""
    group = service.share_group(group_id)
    if group is None:
        return ErrorCode.GROUP_ID_NOT_FOUND
    if group.members:
        return ErrorCode.NON_EMPTY_GROUP
    code = await _delete_elsewhere(service, group_id, [topic])
    if code:
        return code
    keys = [k for k in set(service.store.share_partitions()) | set(service.partitions)
            if k.group_id == group_id and k.topic_id == topic.topic_id]
    await delete_partitions(service, keys)
    group.topics.pop(topic.topic_id, None)
    group.topic_partitions.pop(topic.topic_id, None)
    await service.persist_group_now(group)
    return ErrorCode.NONE


async def delete_group(service: ShareGroupService, group_id: str) -> int:
    group = service.share_group(group_id)
    if group is None:
        return ErrorCode.GROUP_ID_NOT_FOUND
    if group.members:
        return ErrorCode.NON_EMPTY_GROUP
    code = await _delete_elsewhere(service, group_id, group_topics(service, group_id).values())
    if code:
        return code
    keys = [k for k in set(service.store.share_partitions()) | set(service.partitions) if k.group_id == group_id]
    await service.store.delete_group(group_id, keys)
    service.drop_share_partitions(keys)
    return service.coordinator.delete_group(group_id)
