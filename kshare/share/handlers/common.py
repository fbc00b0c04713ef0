"""What ShareFetch and ShareAcknowledge share: session keys and applying acknowledgements."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..authorization import AuthorizationUnknown, Operation
from ..errors import ErrorCode
from ..partition import AcquiredRange
from ..stats import ACK_TYPE_NAMES
from ..write_queue import gathering_writes

if TYPE_CHECKING:
    from ...proxy.connection import ClientConnection
    from ..partition_state import SharePartitionState
    from ..service import ShareGroupService

MAX_MEMBER_ID_LENGTH = 36
# How long an admin request that arrives while the share state loads waits for it before it is
# answered COORDINATOR_LOAD_IN_PROGRESS: under the clients' request timeouts (30 s and more), since
# some admin clients (confluent-kafka's IncrementalAlterConfigs) do not retry that error.
ADMIN_LOAD_WAIT_S = 20.0


NOT_COORDINATOR_MESSAGE = "This proxy is not the coordinator of the group."


async def group_refusal(service: ShareGroupService, conn: ClientConnection, op: Operation, group_id: str) -> int:
    """GROUP_AUTHORIZATION_FAILED if the cluster would refuse the client ``op`` on the group, a
    retriable error if it could not be asked, else NONE (kshare.share.authorization)."""
    try:
        allowed = await service.authz.group(conn, op, group_id)
    except AuthorizationUnknown:
        return ErrorCode.COORDINATOR_NOT_AVAILABLE
    return ErrorCode.NONE if allowed else ErrorCode.GROUP_AUTHORIZATION_FAILED


async def topic_refusal(service: ShareGroupService, conn: ClientConnection, op: Operation, topic: str) -> int:
    """TOPIC_AUTHORIZATION_FAILED if the cluster would refuse the client ``op`` on the topic (a
    cached answer costs no await), a retriable error if it could not be asked, else NONE."""
    allowed = service.authz.cached(conn, op, "topic", topic)
    if allowed is None:
        try:
            allowed = await service.authz.topic(conn, op, topic)
        except AuthorizationUnknown:
            return ErrorCode.REQUEST_TIMED_OUT
    return ErrorCode.NONE if allowed else ErrorCode.TOPIC_AUTHORIZATION_FAILED


async def topic_refusals(service: ShareGroupService, conn: ClientConnection, op: Operation,
                         topic_ids: Iterable[bytes]) -> dict[bytes, int]:
    """Topic id -> refusal code, for the topics (known by id) the client may not ``op``."""
    out = {}
    for topic_id in set(topic_ids):
        info = service.upstream.by_id.get(topic_id)
        if info is not None:
            code = await topic_refusal(service, conn, op, info.name)
            if code:
                out[topic_id] = code
    return out


def coordinated_elsewhere(service: ShareGroupService, group_id: str) -> bool:
    """In an instance group: the group belongs to another proxy (the client finds it again)."""
    return not service.owns_group(group_id)


async def admin_loaded(service: ShareGroupService) -> bool:
    """Wait (bounded) for the share state; whether it is loaded."""
    return await service.until_loaded(ADMIN_LOAD_WAIT_S)


async def group_admin_refusal(service: ShareGroupService, conn: ClientConnection, op: Operation,
                              group_id: str) -> tuple[int, str | None]:
    """Why an admin request on one share group is not answered here (NONE: it is), with its
    message: the state is still loading, another proxy coordinates the group, or the client may
    not ``op`` on it."""
    if not await admin_loaded(service):
        return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, None
    if coordinated_elsewhere(service, group_id):
        return ErrorCode.NOT_COORDINATOR, NOT_COORDINATOR_MESSAGE
    return await group_refusal(service, conn, op, group_id), None


async def empty_group_refusal(service: ShareGroupService, conn: ClientConnection, op: Operation, group_id: str,
                              *, must_exist: bool) -> tuple[int, str | None]:
    """Why a change to an empty share group's offsets is refused (NONE: it is not), with its
    message: as :func:`group_admin_refusal`, or the group has members, or (``must_exist``) there is
    no such group."""
    refusal, message = await group_admin_refusal(service, conn, op, group_id)
    if refusal:
        return refusal, message
    group = service.share_group(group_id)
    if group is None:
        if must_exist:
            return ErrorCode.GROUP_ID_NOT_FOUND, f"Group {group_id} not found."
    elif group.members:
        return ErrorCode.NON_EMPTY_GROUP, "The group is not empty."
    return ErrorCode.NONE, None


def session_key(group_id: str, member_id: str, conn: ClientConnection) -> tuple[str, str, int]:
    """Sessions are per broker; through the proxy a broker is the listener the client used."""
    return (group_id, member_id, -1 if conn.node_id is None else conn.node_id)


@dataclass(slots=True)
class AckOutcome:
    topic_id: bytes
    partition: int
    error_code: int
    write: asyncio.Future | None = None
    records: int = 0  # offsets its acknowledgement batches cover (counted if it fails)


class Resolved(dict):
    """(topic id, partition) -> the share-partition, for one request: each resolved once
    (``resolve``), then worked on directly, whatever step of the request (acknowledge, acquire,
    wait) reaches it."""

    __slots__ = ("service", "group_id")

    def __init__(self, service: ShareGroupService, group_id: str) -> None:
        super().__init__()
        self.service = service
        self.group_id = group_id

    def resolve(self, topic: Any, partition: int) -> SharePartitionState:
        tp = (topic.topic_id, partition)
        sp = self.get(tp)
        if sp is None or sp.dropped:
            sp = self[tp] = self.service.share_partition(self.group_id, topic, partition)
        return sp


async def apply_acknowledgements(
    service: ShareGroupService,
    resolved: Resolved,
    member_id: str,
    acks: Iterable[tuple[bytes, int, Sequence[Any]]],
    *,
    renew_allowed: bool,
    refused: dict[bytes, int] | None = None,
) -> list[AckOutcome]:
    """Apply each partition's acknowledgement batches atomically; durable writes are queued, not awaited.
    ``refused``: topic id -> the error of topics the client may not read (nothing is applied there)."""
    outcomes = []
    group_id = resolved.group_id
    with gathering_writes(service.store):  # one Produce round for all of them, not the first alone
        for topic_id, partition, batches in acks:
            if refused and topic_id in refused:
                outcomes.append(AckOutcome(topic_id, partition, refused[topic_id]))
                continue
            topic = service.upstream.by_id.get(topic_id)
            if topic is None:
                outcomes.append(AckOutcome(topic_id, partition, ErrorCode.UNKNOWN_TOPIC_ID))
                continue
            if not renew_allowed and any(4 in b.acknowledge_types for b in batches):
                outcomes.append(AckOutcome(topic_id, partition, ErrorCode.INVALID_REQUEST))
                continue
            if not service.owns_partition(topic_id, partition):
                outcomes.append(AckOutcome(topic_id, partition, ErrorCode.NOT_LEADER_OR_FOLLOWER))
                continue
            sp = resolved.resolve(topic, partition)
            err, engine = await sp.load()
            if err or engine is None:
                outcomes.append(AckOutcome(topic_id, partition, err or ErrorCode.COORDINATOR_NOT_AVAILABLE))
                continue
            code, write = sp.acknowledge(engine, member_id, batches)
            if code == ErrorCode.NONE:
                _count_acks(service, group_id, topic.name, batches)
            outcomes.append(AckOutcome(topic_id, partition, code, write))
    covered = {(topic_id, partition): _offsets(batches) for topic_id, partition, batches in acks}
    for o in outcomes:
        o.records = covered.get((o.topic_id, o.partition), 0)
    return outcomes


def _offsets(batches: Sequence[Any]) -> int:
    return sum(b.last_offset - b.first_offset + 1 for b in batches)


def count_failed_acks(service: ShareGroupService, group_id: str, failed: Iterable[tuple[bytes, int, int]]) -> None:
    """(topic id, records, error code) of acknowledgements that did not happen: counted in
    ``kshare_share_acknowledgement_errors_total``, since a client that drops a failed acknowledgement
    (librdkafka does) only shows it as a lock that runs out and a redelivery, a lock duration later."""
    for topic_id, records, code in failed:
        if code and records:
            topic = service.upstream.by_id.get(topic_id)
            name = topic.name if topic is not None else topic_id.hex()
            service.stats.ack_errors[(group_id, name, ErrorCode(code).name)] += records


def count_dropped_acks(service: ShareGroupService, group_id: str, topics: Sequence[Any], code: int) -> None:
    """The acknowledgements a request carried, not applied because the request as a whole failed
    (``code``: its share session, say)."""
    count_failed_acks(service, group_id, ((t.topic_id, _offsets(p.acknowledgement_batches), code)
                                          for t in topics for p in t.partitions))


def _count_acks(service: ShareGroupService, group_id: str, topic: str, batches: Sequence[Any]) -> None:
    counts: dict[int, int] = {}
    for b in batches:
        types = b.acknowledge_types
        if len(types) == 1:
            counts[types[0]] = counts.get(types[0], 0) + b.last_offset - b.first_offset + 1
        else:
            for t in set(types):
                counts[t] = counts.get(t, 0) + types.count(t)
    for t, n in counts.items():
        service.stats.acks[(group_id, topic, ACK_TYPE_NAMES.get(t, str(t)))] += n


async def await_writes(outcomes: list[AckOutcome], service: ShareGroupService,
                       group_id: str) -> list[tuple[AckOutcome, int]]:
    """Each outcome with its final error code, once its durable write is acknowledged; the ones
    that failed are counted (:func:`count_failed_acks`)."""
    done = []
    for o in outcomes:
        code = o.error_code
        if o.write is not None:
            try:
                await o.write
            except Exception:  # noqa: BLE001 - WriteFailed: the acknowledgement did not happen
                code = ErrorCode.COORDINATOR_NOT_AVAILABLE
        done.append((o, code))
    count_failed_acks(service, group_id, ((o.topic_id, o.records, code) for o, code in done))
    return done


def split_ranges(ranges: Sequence[AcquiredRange], batch_size: int) -> list[tuple[int, int, int]]:
    """AcquiredRecords entries of at most ``batch_size`` offsets (ShareFetch BatchSize)."""
    if batch_size <= 0:
        return [(r.first_offset, r.last_offset, r.delivery_count) for r in ranges]
    out = []
    for r in ranges:
        first = r.first_offset
        while first <= r.last_offset:
            last = min(first + batch_size - 1, r.last_offset)
            out.append((first, last, r.delivery_count))
            first = last + 1
    return out
