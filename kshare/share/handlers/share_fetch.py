"""ShareFetch (API key 78): acknowledge what came before, then acquire and return records.

Flow per request: validate, update the share session (epochs, partitions added/forgotten),
apply piggybacked acknowledgements, acquire from the session's partitions in rotated order
(whole upstream batches, raw bytes) until MaxRecords/MaxBytes, long-poll up to MaxWaitMs when
nothing could be acquired, and answer only once every state change it made is durable. A long poll
is several passes over the partitions; an error one pass met on a partition is cleared by a later
pass that reads it (never an error beside records: a client drops those records).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from ...protocol import messages
from ...protocol.codegen import SPLICE_MIN
from ...protocol.codes import ApiKey
from ..authorization import Operation
from ..errors import ErrorCode
from ..partition import FetchedBatch
from ..partition_state import wait_for_records
from ..record_keys import BadBatch, KeyedBatch, batch_keys
from ..records import Batch
from ..sessions import FINAL_EPOCH
from ..states import AcquireMode
from ..stats import CONNECTION_CLOSED, SESSION_CLOSED
from ..store import SharePartitionKey
from ..upstream import OFFSET_OUT_OF_RANGE, TRANSIENT
from .common import (
    MAX_MEMBER_ID_LENGTH,
    AckOutcome,
    Resolved,
    apply_acknowledgements,
    await_writes,
    count_dropped_acks,
    group_refusal,
    session_key,
    split_ranges,
    topic_refusals,
)

if TYPE_CHECKING:
    from ...proxy.connection import ClientConnection
    from ..coordinator import ShareGroup
    from ..partition import SharePartition
    from ..partition_log import PartitionLog
    from ..partition_state import SharePartitionState
    from ..service import ShareGroupService

API_KEY = ApiKey.SHARE_FETCH
VERSIONS = (1, 2)

Response = messages.message_class("ShareFetchResponse")
log = logging.getLogger("kshare.share")

# A share-partition this proxy leads but cannot serve yet (its state being claimed or confirmed in an
# instance group, its group's configs not known yet): the fetch leaves it out, as for an upstream
# broker restarting (TRANSIENT), and tries it again. Not a partition error: Apache Kafka's Java
# client throws IllegalStateException("Unexpected error code") for a ShareFetch partition error it
# does not know (ShareFetchCollector), and librdkafka hands it to the application as a consumer
# error (rd_kafka_share_fetch_reply_handle_partition_error), where it is only a wait.
NOT_READY_HERE = frozenset({ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                            ErrorCode.NOT_COORDINATOR, ErrorCode.REBALANCE_IN_PROGRESS})
_REFUSED_TO_KSHARE: set[str] = set()  # topics kshare's own principal may not read (warned once each)
DEFAULT_MAX_RECORDS = 500


def _error(version: int, code: int, message: str | None = None, lock_ms: int = 0) -> tuple[int, Any]:
    return version, Response(error_code=code, error_message=message, acquisition_lock_timeout_ms=lock_ms)


async def handle(service: ShareGroupService, conn: ClientConnection, header: Any, req: Any) -> tuple[int, Any]:
    out = ResponseBuilder()
    try:
        return await _handle(service, conn, header, req, out)
    finally:
        if out.record_bytes:  # the records it took stay counted until the client's socket took them
            release = partial(service.cache_pool.release_answer, out.record_bytes)
            if not conn.release_when_sent(release):
                release()


async def _handle(service: ShareGroupService, conn: ClientConnection, header: Any, req: Any,
                  out: ResponseBuilder) -> tuple[int, Any]:
    version = header.api_version
    if not service.loaded:
        return _error(version, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, "The share group state is still loading.")
    group_id, member_id = req.group_id, req.member_id
    if not group_id:
        return _error(version, ErrorCode.INVALID_REQUEST, "GroupId must be set.")
    if not member_id or len(member_id) > MAX_MEMBER_ID_LENGTH:
        return _error(version, ErrorCode.INVALID_REQUEST, "MemberId must be a non-empty string of at most 36 characters.")
    renew_only = version >= 2 and req.is_renew_ack
    if renew_only and (req.max_bytes or req.min_bytes or req.max_records or req.max_wait_ms):
        return _error(version, ErrorCode.INVALID_REQUEST, "A renew-only ShareFetch must not ask for records.")
    refusal = await group_refusal(service, conn, Operation.READ, group_id)
    if refusal:
        return _error(version, refusal, "Not authorized to read the group." if refusal == 30 else None)
    group = service.coordinator.ensure_group(group_id)
    cfg = group.config
    lock_ms = cfg.record_lock_duration_ms

    added = [(t.topic_id, p.partition_index) for t in req.topics for p in t.partitions]
    forgotten = [(t.topic_id, p) for t in req.forgotten_topics_data for p in t.partitions]
    opened = service.sessions.open(session_key(group_id, member_id, conn), req.share_session_epoch, added, forgotten,
                                   owner=conn)
    if opened.error_code:
        count_dropped_acks(service, group_id, req.topics, opened.error_code)
        return _error(version, opened.error_code, None, lock_ms)
    session = opened.session
    assert session is not None
    for topic_id, partition in forgotten:  # no longer fetched here: out of the partition's fair shares
        sp = service.partitions.get(SharePartitionKey(group_id, topic_id, partition))
        if sp is not None:
            sp.fair.leave(member_id)

    # topics the client may not read: no records, no acknowledgements (asked of the cluster, cached)
    out.refused = await topic_refusals(service, conn, Operation.READ,
                                       [t.topic_id for t in req.topics] + [t for t, _ in session.partitions])
    if not renew_only and req.share_session_epoch != FINAL_EPOCH:
        for topic_id, partition in added:  # new share-partitions get ready while this one is answered
            if topic_id not in out.refused:
                service.prime(group_id, topic_id, partition, cfg.read_committed)
    # each share-partition is looked up once, then worked on directly (acknowledge, acquire, wait)
    resolved = Resolved(service, group_id)
    acks = [(t.topic_id, p.partition_index, p.acknowledgement_batches)
            for t in req.topics for p in t.partitions if p.acknowledgement_batches]
    outcomes = await apply_acknowledgements(service, resolved, member_id, acks, renew_allowed=renew_only,
                                            refused=out.refused)
    for o in outcomes:
        out.partition(o.topic_id, o.partition).acknowledge_error_code = o.error_code

    if req.share_session_epoch == FINAL_EPOCH:
        # the session ends: what the member still holds on its partitions goes back to the queue
        await service.release_member(group_id, member_id, list(session.partitions), SESSION_CLOSED)
        await _settle_acks(service, group_id, outcomes, out)
        return version, out.build(lock_ms)

    later: list[tuple[PartitionLog, int]] | None = None
    dropped = False  # records left out of the answer after its beginning went ahead
    # MaxBytes 0 asks for no records: answered at once, with the acknowledgements above applied
    # (Apache Kafka 4.4, SharePartitionManager.processShareFetch: a ShareFetch with maxBytes 0 is
    # completed with an empty answer before any share-partition is looked at). Not "unlimited".
    if not renew_only and req.max_bytes != 0:
        max_records = req.max_records if req.max_records > 0 else DEFAULT_MAX_RECORDS
        mode = req.share_acquire_mode if version >= 2 else AcquireMode.BATCH_OPTIMIZED
        max_bytes = req.max_bytes if req.max_bytes > 0 else 0x7FFFFFFF  # (negative: no limit)
        batch_size = req.batch_size if req.batch_size > 0 and mode == AcquireMode.BATCH_OPTIMIZED else 0
        deadline = time.monotonic() + max(req.max_wait_ms, 0) / 1000
        writes: list[tuple[bytes, int, asyncio.Future]] = []
        # While this request waits for its acknowledgements' durable writes, the read-aheads its
        # reads want wait too: a Fetch response streaming in from the cluster (a megabyte) slows
        # the Produce round trip this answer waits for. They start as soon as the writes are done,
        # while the client works through the records (a Fetch's worth stays cached ahead).
        if any(o.write for o in outcomes):
            later = []
        while True:
            states = await _acquire_all(service, resolved, group, member_id, session, max_records, max_bytes, mode,
                                        batch_size, out, writes, later)
            left_ms = int((deadline - time.monotonic()) * 1000)
            if out.record_count or outcomes or out.errors or left_ms <= 0:
                break
            await wait_for_records(states, left_ms, cfg.read_committed)  # then one more pass, and stop at the deadline
        _send_ahead(conn, version, header.correlation_id, out, outcomes, writes, lock_ms)
        for topic_id, partition, fut in writes:
            try:
                await fut
            except Exception:  # noqa: BLE001 - WriteFailed: the records are not handed out
                # (logged by the store; they stay Available) with no partition error: clients know none
                # that says "ask again" here (NOT_READY_HERE)
                out.drop_records(topic_id, partition, ErrorCode.NONE)
                dropped = True
        if conn.closed and out.record_count:
            # the connection closed while this fetch waited: nobody will get these records
            await service.release_member(group_id, member_id, list(session.partitions), CONNECTION_CLOSED)
    acks_changed = await _settle_acks(service, group_id, outcomes, out)
    if later:
        # once this answer is written (the rest of this turn of the event loop): a Fetch request
        # written first would make the client wait for that syscall too
        asyncio.get_running_loop().call_soon(_fetch_ahead, later)
    if out.ahead is not None and not dropped and not acks_changed:
        # every write it waited for succeeded: the answer is the one whose beginning went ahead,
        # encoded then (ClientConnection.send_ahead)
        return version, out.ahead
    return version, out.build(lock_ms)


def _fetch_ahead(later: list[tuple[PartitionLog, int]]) -> None:
    for plog, offset in later:
        plog.fetch_ahead(offset)


def _send_ahead(conn: ClientConnection, version: int, corr: int, out: ResponseBuilder, outcomes: list[AckOutcome],
                writes: list, lock_ms: int) -> None:
    """Write the answer up to the end of its last large records before the writes it waits for
    are acknowledged, as it will be if they all succeed.

    The client cannot read the answer before it has the whole frame, and the frame's last bytes
    follow only once every write is durable, so an acknowledgement is still answered only then;
    but the megabyte of records crosses to the client during the Produce round trip instead of
    after it (1 KiB records, one consumer: ~1.1x the rate). Should a write fail, the answer
    changes (an acknowledgement's error code, or an acquisition's records dropped): if that lies
    in what went ahead, the connection closes instead (``ClientConnection._run_handler``), and
    the client's retry finds the records available again."""
    waiting = {(t, p) for t, p, _ in writes} | {(o.topic_id, o.partition) for o in outcomes if o.write is not None}
    if not waiting:
        return  # nothing to wait for: the whole answer goes at once
    ahead = answer_ahead(out, waiting, version, corr, lock_ms)
    if ahead is not None:
        conn.send_ahead(*ahead)


def answer_ahead(out: ResponseBuilder, waiting: set[tuple[bytes, int]], version: int, corr: int,
                 lock_ms: int) -> tuple[list, tuple[Any, list]] | None:
    """The beginning of the answer as it will be if ``waiting``'s writes succeed, up to the end of
    its last large records, with (that answer's body, the rest of its encoding); None if it has
    no large records (small records are copied into the frame: nothing worth sending early).
    The body is kept as ``out.ahead``: if every write succeeds, it is the answer.

    ``waiting``'s partitions go last in the answer: a failed write changes only those (their
    error codes; an acquisition's records, dropped), so one whose records are small, after the
    last large ones, changes nothing that went ahead."""
    out.last = waiting
    spliced = {id(d.records) for parts in out.topics.values() for d in parts.values() if len(d.records) >= SPLICE_MIN}
    if not spliced:
        return None
    body = out.build(lock_ms)
    pieces = messages.encode_response_pieces(API_KEY, version, corr, body)
    last = max((i for i, piece in enumerate(pieces) if id(piece) in spliced), default=-1)
    if last < 0:
        return None
    out.ahead = body
    return pieces[:last + 1], (body, pieces[last + 1:])


async def _settle_acks(service: ShareGroupService, group_id: str, outcomes: list[AckOutcome],
                       out: ResponseBuilder) -> bool:
    """Each acknowledgement's error code once its write is done; whether any code changed."""
    changed = False
    for o, code in await await_writes(outcomes, service, group_id):
        p = out.partition(o.topic_id, o.partition)
        if p.acknowledge_error_code != code:
            p.acknowledge_error_code = code
            changed = True
    return changed


async def _acquire_all(service: ShareGroupService, resolved: Resolved, group: ShareGroup, member_id: str,
                       session: Any, max_records: int, max_bytes: int, mode: int, batch_size: int,
                       out: ResponseBuilder, writes: list,
                       later: list[tuple[PartitionLog, int]] | None) -> list[SharePartitionState]:
    """One pass over the session's partitions; returns the share-partitions it looked at.
    ``later``: where the reads put their read-aheads (None: they start them at once)."""
    group_id = group.group_id
    cfg = group.config
    rc = cfg.read_committed
    states: list[SharePartitionState] = []
    pool = service.cache_pool
    deliveries = service.stats.deliveries
    order = session.rotated()
    loading: set[tuple[bytes, int]] | None = None  # not ready when this pass first waited for one
    for i, (topic_id, partition) in enumerate(order):
        if out.record_count >= max_records or out.record_bytes >= max_bytes:
            break
        if out.record_count and pool.answer_room() <= 0:
            break  # the answers on their way hold their share of the record budget: go with these
        topic = service.upstream.by_id.get(topic_id)
        if topic is None:
            await service.upstream.refresh_metadata(max_age=1.0)
            topic = service.upstream.by_id.get(topic_id)
        if topic is None:
            out.partition(topic_id, partition).error_code = ErrorCode.UNKNOWN_TOPIC_ID
            continue
        if not 0 <= partition < topic.partitions:
            out.partition(topic_id, partition).error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            continue
        if topic_id in out.refused:
            out.partition(topic_id, partition).error_code = out.refused[topic_id]
            out.errors += 1
            continue
        if not service.owns_partition(topic_id, partition):
            # another proxy of the instance group leads it now: the client asks Metadata again
            out.partition(topic_id, partition).error_code = ErrorCode.NOT_LEADER_OR_FOLLOWER
            out.errors += 1
            continue
        sp = resolved.resolve(topic, partition)
        # A share-partition still initialising is waited for only while the answer has no records,
        # and one that was not ready when this pass began waiting for another is left out once the
        # answer has records (ready by now or not); it goes on initialising for the next ShareFetch.
        # Apache Kafka 4.4 does the same: a DelayedShareFetch completes from the first of its
        # share-partitions to finish initialising (SharePartitionManager.processShareFetch triggers
        # it from each one's initialisation future), and DelayedShareFetch.acquirablePartitions
        # takes only the share-partitions ready by then. So a consumer of a new group on 2
        # partitions of 50 records each gets 50, then 50 (librdkafka 0179), as from Kafka.
        if not sp.ready:
            if out.record_count:
                sp.start_loading()
                continue
            if loading is None:
                loading = {tp for tp in order[i + 1:] if not _ready(service, resolved, tp)}
        elif out.record_count and loading is not None and (topic_id, partition) in loading:
            continue  # ready by now, but not when this pass began waiting for another
        err, engine = await sp.load()
        if err in TRANSIENT or err in NOT_READY_HERE:
            continue  # a broker restarting, or its state not ready here yet: the next pass or fetch tries again
        if err or engine is None:
            out.partition(topic_id, partition).error_code = err or ErrorCode.COORDINATOR_NOT_AVAILABLE
            continue
        states.append(sp)
        now = service.clock()
        held = engine.acquired_count(member_id)
        sp.fair.fetching(member_id, max_records, held, now)
        if not engine.can_acquire():
            continue
        # Fair acquisition: when the members here want more than the lock budget, or than the
        # records waiting (up to the last seen high watermark, not held by anyone), each gets its
        # share (exactly, splitting a batch where needed) instead of first come, first served.
        plog = sp.log(rc)
        available = None
        if plog.high_watermark >= 0:
            available = max(0, plog.high_watermark - engine.start_offset - engine.acquired_count())
        want = max_records - out.record_count
        acquire_mode = mode
        cap = sp.fair.cap(member_id, held, engine.max_record_locks, now, cfg.record_lock_duration_ms,
                          group.assigned_members(topic_id, partition), available, engine.acquired_count)
        whole = False  # batch-optimized and capped: whole batches where they cost little time (fairness)
        if cap is not None and cap < want:
            if cap == 0:
                continue  # it holds its share already; acknowledgements here wake this fetch
            whole = mode == AcquireMode.BATCH_OPTIMIZED and held == 0 and not engine.key_ordered
            want, acquire_mode = cap, AcquireMode.RECORD_LIMIT
        offset = engine.next_fetch_offset()
        # Offsets from SPEO + the records still wanted on cannot be acquired by this request:
        # leave those batches out (with small producer batches a cached segment holds thousands).
        # Not under read_committed, where skipped aborted records may stretch far past that.
        until = None if rc else engine.end_offset + max(want, 1)
        if until is not None and engine.key_ordered:
            # what its key budget lets it take may end well before the window does (every other key out)
            end = engine.key_read_end(member_id, _key_budget(sp, engine, member_id, now, cfg.record_lock_duration_ms,
                                                             group.assigned_members(topic_id, partition)),
                                      plog.high_watermark if plog.high_watermark >= 0 else None, want)
            if end is not None:
                if end < offset:
                    continue  # nothing for it now (acknowledgements here wake this fetch)
                until = min(until, end + 1)
        limit = min(max_bytes - out.record_bytes, plog.fetch_bytes)
        if out.record_count:  # (the first records of an answer may exceed the room: it makes progress)
            limit = min(limit, pool.answer_room())
        read = await plog.read(offset, max(1, limit), until, later)
        if read.error_code == OFFSET_OUT_OF_RANGE:
            sp.skip_to_log_start(read.log_start_offset)
            continue
        if read.error_code in TRANSIENT:
            continue  # kshare reads from the new leader next time (upstream.TRANSIENT)
        if read.error_code:
            if read.error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED and topic.name not in _REFUSED_TO_KSHARE:
                # the client may read it (asked above): kshare's own principal may not
                _REFUSED_TO_KSHARE.add(topic.name)
                log.warning("the cluster refuses kshare's own principal READ on topic %s, which share group %s "
                            "reads: grant it READ (docs/guide/security.md); its consumers get TOPIC_AUTHORIZATION_FAILED",
                            topic.name, group_id)
            out.partition(topic_id, partition).error_code = read.error_code
            continue
        earlier = out.topics.get(topic_id, {}).get(partition)
        if earlier is not None and earlier.error_code:
            # An earlier pass of this long poll met an error here that is cured now (a Fetch
            # answered NOT_LEADER_OR_FOLLOWER for a partition the broker had not loaded yet). Kept,
            # it would go out with the records acquired now, and a client drops the records of a
            # partition answered with an error: they would stay acquired, unseen, until their
            # locks ran out (30 s by default).
            earlier.error_code = ErrorCode.NONE
        if not read.batches or sp.engine is not engine or engine.paused:
            # paused while the read was awaited (a drain or a hand-over began): it must hand
            # nothing out from now on, or the drain that counted nothing held would be wrong
            continue
        fetched = [FetchedBatch(b.base_offset, b.last_offset, b.is_control, b.is_transactional, b.producer_id)
                   for b, _ in read.batches]
        if whole and sp.fair.whole_batches(member_id, read.fetch_offset, want, (b.last_offset for b in fetched)):
            acquire_mode = AcquireMode.BATCH_OPTIMIZED  # its cap rounded up to the end of a batch
        max_keys = None
        if engine.key_ordered:
            engine.learn_keys(fetched, _record_keys(read.batches, engine.keys_known_to, sp), read.fetch_offset)
            max_keys = _key_budget(sp, engine, member_id, now, cfg.record_lock_duration_ms,
                                   group.assigned_members(topic_id, partition))
        result = engine.acquire(member_id, fetched, want, acquire_mode,
                                fetch_offset=read.fetch_offset, lso=read.lso if rc else None,
                                aborted_transactions=read.aborted if rc else None,
                                lock_duration_ms=cfg.record_lock_duration_ms, max_keys=max_keys)
        if result.update is not None:
            # lock expiries processed on the way may archive records at the delivery count limit
            writes.append((topic_id, partition, sp.persist_archived(result.update, (), list(engine.archived))))
        if not result.records:
            continue
        if max_keys is not None:
            # A record may go out because the one before it of its key was just acknowledged: not
            # before that acknowledgement is durable, or a crash could deliver the two out of order.
            writes.append((topic_id, partition, sp.persist(None)))
        sp.fair.acquired(member_id, result.count, now)
        sp.watch_locks()
        chunks = []
        ranges = result.records
        k = 0
        for b, data in read.batches:
            while k < len(ranges) and ranges[k].last_offset < b.base_offset:
                k += 1
            if k < len(ranges) and ranges[k].first_offset <= b.last_offset:
                chunks.append(data)
        if len(chunks) == len(read.batches) and read.whole is not None:
            records = read.whole  # no copy: one slice of what the cluster sent
        else:
            records = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        p = out.partition(topic_id, partition)
        p.records = records
        p.acquired_records = [Response.AcquiredRecords(first_offset=a, last_offset=z, delivery_count=c)
                              for a, z, c in split_ranges(ranges, batch_size)]
        out.record_count += result.count
        out.record_bytes += len(records)
        pool.hold_answer(len(records))
        deliveries[(group_id, topic.name)] += result.count
    return states


def _key_budget(sp: SharePartitionState, engine: SharePartition, member_id: str, now: int, idle_ms: int,
                assigned: Sequence[str]) -> int:
    """Key-ordered groups: how many keys the member may take now. At most one record of a key is
    out at a time, so a member taking one record of every free key would leave the others idle,
    and each key would wait for that member's whole batch: each member gets its share of the keys
    with records waiting or out, less the keys it holds (``SharePartition.key_budget``). Members
    are those fair acquisition counts (fetching here, not quiet, or assigned and expected). Which
    keys: the engine gives the member the next records of the keys it just finished first
    (affinity, ``acquire``)."""
    return engine.key_budget(member_id, sp.fair.sharing(member_id, now, idle_ms, assigned, engine.acquired_count))


def _ready(service: ShareGroupService, resolved: Resolved, tp: tuple[bytes, int]) -> bool:
    sp = resolved.get(tp) or service.partitions.get(SharePartitionKey(resolved.group_id, *tp))
    return sp is not None and sp.ready


def _record_keys(batches: list[tuple[Batch, memoryview]], known_to: int,
                 sp: SharePartitionState) -> list[KeyedBatch | None]:
    """Keys of the fetched records a key-ordered engine does not know yet (None: nothing to read,
    or a batch whose keys cannot be read, whose records are then delivered as keyless)."""
    out: list[KeyedBatch | None] = []
    for b, data in batches:
        if b.last_offset < known_to or b.is_control:
            out.append(None)
            continue
        try:
            out.append(batch_keys(data))
        except BadBatch as exc:
            out.append(None)
            if not sp.keys_warned:
                sp.keys_warned = True
                log.warning("share group %s, %s-%d: cannot read the keys of the batch at offset %d (%s); its "
                            "records are delivered without key order", sp.key.group_id, sp.topic.name,
                            sp.key.partition, b.base_offset, exc)
    return out


class ResponseBuilder:
    def __init__(self) -> None:
        self.topics: dict[bytes, dict[int, Any]] = {}
        self.record_count = 0
        self.record_bytes = 0  # also what the answer holds of the record budget (CachePool.hold_answer)
        self.errors = 0  # partitions answered with an error that waiting does not cure
        self.refused: dict[bytes, int] = {}  # topic id -> authorization error, for this request
        self.last: set[tuple[bytes, int]] = set()  # partitions answered after all the others
        self.ahead: Any = None  # the body built when the answer's beginning went ahead (answer_ahead)

    def ordered(self) -> list[tuple[bytes, dict[int, Any]]]:
        """Topics and their partitions in the answer's order: those in ``last`` at the end."""
        if not self.last:
            return list(self.topics.items())
        last = self.last
        head, tail = [], []
        for t, parts in self.topics.items():
            late = [p for p in parts if (t, p) in last]
            if not late:
                head.append((t, parts))
            else:
                tail.append((t, {**{p: d for p, d in parts.items() if (t, p) not in last},
                                 **{p: parts[p] for p in late}}))
        return head + tail

    def partition(self, topic_id: bytes, partition: int) -> Any:
        parts = self.topics.setdefault(topic_id, {})
        p = parts.get(partition)
        if p is None:
            p = parts[partition] = Response.PartitionData(
                partition_index=partition, records=b"",
                current_leader=Response.LeaderIdAndEpoch(leader_id=-1, leader_epoch=-1))
        return p

    def drop_records(self, topic_id: bytes, partition: int, code: int) -> None:
        p = self.partition(topic_id, partition)
        p.records = b""
        p.acquired_records = []
        p.error_code = code

    def build(self, lock_ms: int) -> Any:
        return Response(
            acquisition_lock_timeout_ms=lock_ms,
            responses=[Response.ShareFetchableTopicResponse(topic_id=t, partitions=list(parts.values()))
                       for t, parts in self.ordered()],
        )
