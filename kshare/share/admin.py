"""Share-group administration on top of the service: offsets, lag, resets, deletions.

Used by the admin RPC handlers (ShareGroupDescribe, DescribeShareGroupOffsets,
AlterShareGroupOffsets, DeleteShareGroupOffsets, DeleteGroups) and by the metrics endpoint.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import ErrorCode
from .states import RecordState, ShareSnapshot
from .store import SharePartitionKey
from .upstream import LATEST, TopicInfo

if TYPE_CHECKING:
    from .service import ShareGroupService

_TERMINAL = (RecordState.ACKNOWLEDGED, RecordState.ARCHIVED)


@dataclass(slots=True)
class PartitionOffsets:
    partition: int
    start_offset: int  # SPSO, -1 when the group has no state for the partition yet
    lag: int  # records not yet delivery-complete, -1 when unknown
    error_code: int = 0


def _durable(service: ShareGroupService, key: SharePartitionKey) -> ShareSnapshot | None:
    sp = service.partitions.get(key)
    if sp is not None and sp.engine is not None:
        return sp.engine.snapshot()
    return service.store.share_partitions().get(key)


def settled_above_start(snapshot: ShareSnapshot, end: int) -> int:
    """Records at or above the SPSO (and below ``end``) that are already Acknowledged or Archived."""
    done = 0
    for b in snapshot.state_batches:
        if b.delivery_state in _TERMINAL and b.last_offset >= snapshot.start_offset:
            first = max(b.first_offset, snapshot.start_offset)
            last = min(b.last_offset, end - 1)
            if last >= first:
                done += last - first + 1
    return done


async def partition_offsets(service: ShareGroupService, group_id: str, topic: TopicInfo,
                            partitions: list[int] | None) -> list[PartitionOffsets]:
    """SPSO and lag of each partition: lag = high watermark - SPSO - settled records in between."""
    out = []
    for p in range(topic.partitions) if partitions is None else partitions:
        if not 0 <= p < topic.partitions:
            out.append(PartitionOffsets(p, -1, -1, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
            continue
        snapshot = _durable(service, SharePartitionKey(group_id, topic.topic_id, p))
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
    sp = service.partition_state(group_id, topic, partition)
    if sp.engine is not None:
        result = sp.engine.reset_start_offset(offset)
        if result.error_code:
            return result.error_code
        await service.persist(sp, result.snapshot)
    else:
        await service.store.write([(sp.key, ShareSnapshot(offset, ()))])
    await service.persist_group_now(group)
    return ErrorCode.NONE


async def delete_topic_offsets(service: ShareGroupService, group_id: str, topic: TopicInfo) -> int:
    """Forget the group's state for a topic (empty groups only): it starts over from the reset policy."""
    group = service.share_group(group_id)
    if group is None:
        return ErrorCode.GROUP_ID_NOT_FOUND
    if group.members:
        return ErrorCode.NON_EMPTY_GROUP
    keys = [k for k in set(service.store.share_partitions()) | set(service.partitions)
            if k.group_id == group_id and k.topic_id == topic.topic_id]
    await service.store.delete_share_partitions(keys)
    for k in keys:
        service.partitions.pop(k, None)
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
    keys = [k for k in set(service.store.share_partitions()) | set(service.partitions) if k.group_id == group_id]
    await service.store.delete_group(group_id, keys)
    for k in keys:
        service.partitions.pop(k, None)
    return service.coordinator.delete_group(group_id)
