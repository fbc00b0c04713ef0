"""A KIP-932 share-group member on kshare's own protocol layer (no librdkafka): the one
implementation under :class:`kshare.AIOShareConsumer` and the Spark source's workers.

Why not confluent-kafka's ``ShareConsumer``: in explicit mode it refuses ``poll()`` while the
records of the previous poll are unacknowledged, and the Spark source must hold the records of
micro-batch N (until Spark commits N) while it already reads N+1. This member keeps what it
acquired as :class:`Acquired` handles the caller acknowledges (ACCEPT / RELEASE / REJECT) or
renews (ShareAcknowledge v2 RENEW) whenever it likes, on the share session that acquired them,
as a whole (:meth:`ShareMember.acknowledge`) or offset by offset (:class:`Ack`, sent on the next
ShareFetch to the same broker or in a ShareAcknowledge of their own).

It speaks only the wire protocol (ShareGroupHeartbeat v1 to the group coordinator, ShareFetch and
ShareAcknowledge to each partition's leader), so it works against kshare and against a native
Apache Kafka 4.x cluster with share groups. TLS and SASL (PLAIN, SCRAM) through ``security``.
Failures with a Kafka error code are raised as aiokafka's error classes (:mod:`kshare.clients.errors`).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiokafka.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError
from aiokafka.record.memory_records import MemoryRecords

from ..protocol import messages
from ..protocol.codes import ApiKey, ErrorCode
from ..security import ClientSecurity
from .cluster import RETRIABLE_COORDINATOR, Cluster, Node
from .errors import MemberError, error_for, error_name

log = logging.getLogger("kshare.share_member")

GAP, ACCEPT, RELEASE, REJECT, RENEW = 0, 1, 2, 3, 4
BATCH_OPTIMIZED, RECORD_LIMIT = 0, 1  # ShareFetch v2 ShareAcquireMode: whole batches / never more than MaxRecords
LEAVE_EPOCH = -1

_REJOIN = {ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_MEMBER_EPOCH}
_SESSION_LOST = {ErrorCode.SHARE_SESSION_NOT_FOUND, ErrorCode.INVALID_SHARE_SESSION_EPOCH}
# heartbeat and fetch errors a member cannot get past by itself: kept in ShareMember.failure
_FATAL = {ErrorCode.INVALID_GROUP_ID, ErrorCode.TOPIC_AUTHORIZATION_FAILED, ErrorCode.GROUP_AUTHORIZATION_FAILED,
          ErrorCode.UNSUPPORTED_VERSION, ErrorCode.INVALID_REQUEST, ErrorCode.GROUP_MAX_SIZE_REACHED,
          ErrorCode.UNSUPPORTED_ASSIGNOR}
# the codes this member puts into acknowledgement outcomes itself, as plain ints (as the broker's)
_SESSION_NOT_FOUND = ErrorCode.SHARE_SESSION_NOT_FOUND.value
_NETWORK_EXCEPTION = ErrorCode.NETWORK_EXCEPTION.value
_UNSUPPORTED_VERSION = ErrorCode.UNSUPPORTED_VERSION.value

_Heartbeat = messages.message_class("ShareGroupHeartbeatRequest")
_Fetch = messages.message_class("ShareFetchRequest")
_Ack = messages.message_class("ShareAcknowledgeRequest")

Outcomes = dict[tuple[str, int], int]
"""Acknowledgement outcomes: (topic, partition) -> Kafka error code (0: every acknowledgement taken)."""


@dataclass(slots=True)
class Record:
    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    delivery_count: int


@dataclass(slots=True, eq=False)
class Acquired:
    """Offsets one ShareFetch acquired on one partition; acknowledged as a whole later.

    ``gaps`` are acquired offsets without a record (control records, compacted or aborted ones):
    they are acknowledged as GAP whatever the type asked for. ``rejects`` get REJECT instead."""

    node: int
    session: int  # the session generation on that node: a lost session's records are gone
    topic_id: bytes
    topic: str
    partition: int
    ranges: list[tuple[int, int]]
    gaps: set[int] = field(default_factory=set)
    rejects: set[int] = field(default_factory=set)
    lock_deadline: float = 0.0  # time.monotonic() when the locks run out

    @property
    def count(self) -> int:
        return sum(z - a + 1 for a, z in self.ranges)

    def batches(self, ack_type: int) -> list[Any]:
        out = []
        special_offsets = self.gaps | self.rejects
        for a, z in self.ranges:
            special = ack_type != RENEW and any(a <= o <= z for o in special_offsets)
            types = ([GAP if o in self.gaps else REJECT if o in self.rejects else ack_type for o in range(a, z + 1)]
                     if special else [ack_type])
            out.append(_Ack.AcknowledgementBatch(first_offset=a, last_offset=z, acknowledge_types=types))
        return out


@dataclass(slots=True, eq=False)
class Ack:
    """Acknowledgements of some offsets of one acquisition: ``batches`` are AcknowledgementBatch
    messages (:func:`ack_batches` makes them from offsets and types)."""

    acquired: Acquired
    batches: list[Any]


def ack_batch(first: int, last: int, types: list[int]) -> Any:
    return _Ack.AcknowledgementBatch(first_offset=first, last_offset=last, acknowledge_types=types)


def merged(batches: Iterable[Any]) -> list[Any]:
    """Acknowledgement batches of one partition in offset order (as the protocol wants them), adjacent
    ones of one type joined."""
    out: list[Any] = []
    for b in sorted(batches, key=lambda b: b.first_offset):
        if out:
            last = out[-1]
            if (last.last_offset + 1 == b.first_offset and len(last.acknowledge_types) == 1
                    and list(b.acknowledge_types) == list(last.acknowledge_types)):
                out[-1] = _Ack.AcknowledgementBatch(first_offset=last.first_offset, last_offset=b.last_offset,
                                                    acknowledge_types=last.acknowledge_types)
                continue
        out.append(b)
    return out


def ack_batches(types: dict[int, int]) -> list[Any]:
    """AcknowledgementBatch messages for ``{offset: type}``: one batch per run of consecutive
    offsets, with one type for the run when all are the same and one per offset otherwise."""
    out = []
    offsets = sorted(types)
    i, n = 0, len(offsets)
    while i < n:
        j = i
        while j + 1 < n and offsets[j + 1] == offsets[j] + 1:
            j += 1
        run = [types[o] for o in offsets[i:j + 1]]
        if all(t == run[0] for t in run):
            run = run[:1]
        out.append(_Ack.AcknowledgementBatch(first_offset=offsets[i], last_offset=offsets[j], acknowledge_types=run))
        i = j + 1
    return out


@dataclass(slots=True)
class _Session:
    node: Node
    generation: int = 0
    epoch: int = 0
    partitions: set[tuple[bytes, int]] = field(default_factory=set)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


Decoder = Callable[[str, int, Any, list[tuple[int, int, int]]], list[Any]]


class ShareMember:
    """One member of ``group`` subscribed to ``topics``. Use ``start`` / ``fetch`` /
    ``acknowledge`` / ``renew`` / ``close`` from one event loop.

    ``decoder(topic, partition, raw_batches, [(first, last, delivery_count), ...])`` makes the
    records of the acquired offsets (each with an ``offset``); :func:`decode` makes :class:`Record`.
    ``acquire_mode``: RECORD_LIMIT (never more than the records asked for: the Spark source) or
    BATCH_OPTIMIZED (whole record batches, which may be more: the consumer buffers them).
    """

    def __init__(self, bootstrap: list[tuple[str, int]], group: str, topics: list[str], *,
                 client_id: str = "kshare-member", rack: str | None = None, timeout_ms: int = 30000,
                 security: ClientSecurity | None = None, decoder: Decoder | None = None,
                 acquire_mode: int = RECORD_LIMIT) -> None:
        self.group = group
        self.topics = list(topics)
        self.rack = rack
        self.cluster = Cluster(bootstrap, client_id=client_id, timeout_ms=timeout_ms, security=security)
        self.decoder: Decoder = decoder or decode
        self.acquire_mode = acquire_mode
        self.member_id = str(uuid.uuid4())
        self.epoch = 0
        self.assignment: set[tuple[bytes, int]] = set()
        self.names: dict[bytes, str] = {}
        self.renew_supported = True
        self.failure: KafkaError | None = None  # a fatal error met in the background (heartbeats, fetches)
        self._interval = 1.0
        self._assigned = asyncio.Event()
        self._wake = asyncio.Event()
        self._send_topics = True
        self._sessions: dict[int, _Session] = {}
        self._hb_task: asyncio.Task | None = None
        self._connected = False
        self.closed = False

    # -- membership -------------------------------------------------------------------------------
    async def start(self) -> None:
        """Connect, check the topics, join the group and heartbeat in the background."""
        if not self._connected:
            await self.cluster.connect()
            self._connected = True
        await self._check_topics(self.topics)
        deadline = time.monotonic() + self.cluster.timeout
        while True:  # a fresh cluster's coordinator may still be loading
            try:
                await self._heartbeat(self.topics)
                break
            except KafkaError as exc:
                if getattr(exc, "errno", None) not in RETRIABLE_COORDINATOR or time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(0.2)
        self._send_topics = False
        self._hb_task = asyncio.get_running_loop().create_task(self._heartbeats())

    async def _check_topics(self, topics: list[str]) -> None:
        """The topics' metadata; a topic the cluster does not have (or hides) raises its error."""
        if not topics:
            return
        found = await self.cluster.refresh_metadata(topics)
        missing = [t for t in topics if t not in found]
        if missing:
            code, message = self.cluster.topic_errors.get(missing[0], (3, None))
            raise error_for(code, f"topic(s) {', '.join(missing)} of group {self.group}", message)
        self.names.update({m.topic_id: m.name for m in found.values()})

    async def subscribe(self, topics: list[str]) -> None:
        """Change the subscription (sent on the next heartbeat, at once); joins again after :meth:`leave`."""
        await self._check_topics(topics)
        self.topics = list(topics)
        if self._hb_task is None or self._hb_task.done():
            await self.start()
            return
        self._send_topics = True
        self._wake.set()

    async def _heartbeat(self, topics: list[str] | None) -> None:
        node = await self.cluster.coordinator(self.group)
        try:
            conn = await self.cluster.connection(node)
            resp = await self.cluster.request(conn, ApiKey.SHARE_GROUP_HEARTBEAT, 1, _Heartbeat(
                group_id=self.group, member_id=self.member_id, member_epoch=self.epoch, rack_id=self.rack,
                subscribed_topic_names=topics))
        except (KafkaConnectionError, KafkaTimeoutError):
            self.cluster.forget_coordinator(self.group)
            raise
        if resp.error_code in _REJOIN:  # the group forgot us (e.g. a long pause): join again
            log.warning("share member %s of %s rejoins after %s", self.member_id, self.group,
                        error_name(resp.error_code))
            self.epoch, self.assignment = 0, set()
            self._assigned.clear()
            self._send_topics = True
            return
        if resp.error_code in RETRIABLE_COORDINATOR:
            self.cluster.forget_coordinator(self.group)
        if resp.error_code:
            raise error_for(resp.error_code, f"ShareGroupHeartbeat of member {self.member_id} of group {self.group}",
                            resp.error_message)
        if self.epoch != LEAVE_EPOCH:
            self.epoch = resp.member_epoch
        self._interval = max(0.1, resp.heartbeat_interval_ms / 1000.0)
        if resp.assignment is not None:
            self.assignment = {(tp.topic_id, p) for tp in resp.assignment.topic_partitions for p in tp.partitions}
            unknown = {tid for tid, _ in self.assignment if tid not in self.names}
            if unknown:  # a topic subscribed by name, assigned by id: its name from the metadata
                await self.cluster.refresh_metadata(self.topics)
                self.names.update({m.topic_id: m.name for m in self.cluster.topics.values()})
            if self.assignment:
                self._assigned.set()
            else:
                self._assigned.clear()

    async def _heartbeats(self) -> None:
        while not self.closed:
            # Kafka assigns on a later heartbeat than the join: ask often until assigned
            wait = self._interval if self._assigned.is_set() else min(self._interval, 0.2)
            try:
                await asyncio.wait_for(self._wake.wait(), wait)
            except TimeoutError:
                pass
            self._wake.clear()
            send = self._send_topics or self.epoch == 0
            topics = self.topics
            try:
                await self._heartbeat(topics if send else None)
                if send and self.topics is topics:  # not changed meanwhile
                    self._send_topics = False
            except (KafkaError, OSError, ConnectionError) as exc:
                if getattr(exc, "errno", None) in _FATAL:
                    self.failure = exc
                log.warning("share member %s of %s: heartbeat failed (%s); retrying", self.member_id,
                            self.group, exc)

    async def wait_assigned(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self._assigned.wait(), timeout)
            return True
        except TimeoutError:
            return False

    # -- sessions ---------------------------------------------------------------------------------
    async def _leaders(self) -> dict[int, list[tuple[bytes, int]]]:
        by_node: dict[int, list[tuple[bytes, int]]] = {}
        for tid, p in sorted(self.assignment):
            meta = self.cluster.topics.get(self.names.get(tid, ""))
            leader = meta.leaders.get(p, -1) if meta else -1
            if leader < 0 or leader not in self.cluster.brokers:
                await self.cluster.refresh_metadata(self.topics)
                meta = self.cluster.topics.get(self.names.get(tid, ""))
                leader = meta.leaders.get(p, -1) if meta else -1
            if leader >= 0:
                by_node.setdefault(leader, []).append((tid, p))
        return by_node

    def _session(self, node_id: int) -> _Session:
        s = self._sessions.get(node_id)
        if s is None:
            s = self._sessions[node_id] = _Session(self.cluster.brokers[node_id])
        return s

    def _lost(self, s: _Session) -> None:
        """The broker no longer knows the session: its acquired records were released there."""
        s.generation += 1
        s.epoch = 0
        s.partitions.clear()

    def live(self, a: Acquired) -> bool:
        """Whether ``a``'s records are still held on the session that acquired them."""
        s = self._sessions.get(a.node)
        return s is not None and s.generation == a.session and s.epoch > 0

    # -- fetch ------------------------------------------------------------------------------------
    async def fetch(self, max_records: int, max_wait_ms: int) -> tuple[list[Any], list[Acquired]]:
        """Acquire up to ``max_records`` records (waiting up to ``max_wait_ms`` for the first)."""
        records, acquired, _ = await self.poll(max_records, max_wait_ms)
        return records, acquired

    async def poll(self, max_records: int, max_wait_ms: int,
                   acks: Sequence[Ack] = ()) -> tuple[list[Any], list[Acquired], Outcomes]:
        """Send ``acks`` and acquire up to ``max_records`` records (waiting up to ``max_wait_ms`` for
        the first). Acknowledgements of partitions fetched from the same broker ride on its
        ShareFetch; the others go first, in a ShareAcknowledge of their own. Returns the records,
        their acquisitions and the acknowledgements' outcomes."""
        pairs, outcomes = await self.poll_grouped(max_records, max_wait_ms, acks)
        return [r for _, rs in pairs for r in rs], [a for a, _ in pairs], outcomes

    async def poll_grouped(self, max_records: int, max_wait_ms: int, acks: Sequence[Ack] = (),
                           ) -> tuple[list[tuple[Acquired, list[Any]]], Outcomes]:
        """:meth:`poll` with each acquisition's records beside it (in offset order)."""
        by_node = await self._leaders()
        ride: dict[int, list[Ack]] = {}
        alone: list[Ack] = []
        if acks:
            fetched = {(n, tp) for n, parts in by_node.items() for tp in parts}
            for ack in acks:
                a = ack.acquired
                if (a.node, (a.topic_id, a.partition)) in fetched:
                    ride.setdefault(a.node, []).append(ack)
                else:
                    alone.append(ack)
        outcomes: Outcomes = {}
        if alone:
            _merge(outcomes, await self.send_acks(alone))
        if not by_node:
            if ride:  # no partition to fetch any more (assignment gone meanwhile): acknowledge alone
                _merge(outcomes, await self.send_acks([a for acks_ in ride.values() for a in acks_]))
            await asyncio.sleep(max_wait_ms / 1000.0)
            return [], outcomes
        share = max(1, max_records // len(by_node))
        if len(by_node) == 1:  # no task of its own: the request is written before this first awaits
            [(n, parts)] = by_node.items()
            results = [await self._fetch_node(n, parts, share, max_wait_ms, ride.get(n, []))]
        else:
            results = await asyncio.gather(*(self._fetch_node(n, parts, share, max_wait_ms, ride.get(n, []))
                                             for n, parts in by_node.items()))
        pairs = [pair for got, _ in results for pair in got]
        for _, out in results:
            _merge(outcomes, out)
        return pairs, outcomes

    async def _fetch_node(self, node_id: int, parts: list[tuple[bytes, int]], max_records: int,
                          max_wait_ms: int, acks: list[Ack]) -> tuple[list[tuple[Acquired, list[Any]]], Outcomes]:
        s = self._session(node_id)
        outcomes: Outcomes = {}
        async with s.lock:
            stale = [k for k in acks if k.acquired.session != s.generation or s.epoch == 0]
            if stale:
                _merge(outcomes, {(k.acquired.topic, k.acquired.partition): _SESSION_NOT_FOUND for k in stale})
                acks = [k for k in acks if k not in stale]
            conn = await self.cluster.connection(s.node)
            version = conn.best_version(ApiKey.SHARE_FETCH, lo=1, hi=2)
            want = set(parts)
            add, forget = sorted(want - s.partitions), sorted(s.partitions - want)
            topics: dict[bytes, dict[int, list[Any]]] = {}
            for tid, p in add:
                topics.setdefault(tid, {})[p] = []
            acked: dict[tuple[bytes, int], str] = {}
            for k in acks:
                a = k.acquired
                topics.setdefault(a.topic_id, {}).setdefault(a.partition, []).extend(k.batches)
                acked[(a.topic_id, a.partition)] = a.topic
            if acks:
                for ps in topics.values():
                    for p, b in ps.items():
                        if len(b) > 1:
                            ps[p] = merged(b)
            forgotten: dict[bytes, list[int]] = {}
            for tid, p in forget:
                forgotten.setdefault(tid, []).append(p)
            req = _Fetch(group_id=self.group, member_id=self.member_id, share_session_epoch=s.epoch,
                         max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=16 << 20, max_records=max_records,
                         batch_size=max_records, share_acquire_mode=self.acquire_mode,
                         topics=[_Fetch.FetchTopic(topic_id=t, partitions=[
                             _Fetch.FetchPartition(partition_index=p, acknowledgement_batches=b)
                             for p, b in ps.items()]) for t, ps in topics.items()],
                         forgotten_topics_data=[_Fetch.ForgottenTopic(topic_id=t, partitions=ps)
                                                for t, ps in forgotten.items()])
            timeout = self.cluster.timeout + max_wait_ms / 1000.0
            try:
                resp = await asyncio.wait_for(conn.request(ApiKey.SHARE_FETCH, version, req), timeout)
            except (TimeoutError, OSError, ConnectionError) as exc:
                self._lost(s)  # a dropped connection ends the session on the broker too
                log.warning("ShareFetch to %s:%d failed (%r); the session starts again", s.node.host,
                            s.node.port, exc)
                _merge(outcomes, {(t, p): _NETWORK_EXCEPTION for (_, p), t in acked.items()})
                return [], outcomes
            if resp.error_code in _SESSION_LOST:
                self._lost(s)
                _merge(outcomes, {(t, p): resp.error_code for (_, p), t in acked.items()})
                return [], outcomes
            if resp.error_code:
                raise error_for(resp.error_code, f"ShareFetch for group {self.group}", resp.error_message)
            s.epoch += 1
            s.partitions = want
            lock_deadline = time.monotonic() + resp.acquisition_lock_timeout_ms / 1000.0
            pairs: list[tuple[Acquired, list[Any]]] = []
            for t in resp.responses:
                topic = self.names.get(t.topic_id, "")
                for p in t.partitions:
                    key = (t.topic_id, p.partition_index)
                    if key in acked:
                        _merge(outcomes, {(acked.pop(key), p.partition_index): p.acknowledge_error_code})
                    if p.error_code:
                        log.warning("ShareFetch %s-%d: %s", topic, p.partition_index, error_name(p.error_code))
                        if p.error_code in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.UNKNOWN_TOPIC_ID):
                            await self.cluster.refresh_metadata(self.topics)
                        elif p.error_code in _FATAL:
                            self.failure = error_for(p.error_code, f"ShareFetch {topic}-{p.partition_index}",
                                                     p.error_message)
                        continue
                    if not p.acquired_records:
                        continue
                    ranges = [(a.first_offset, a.last_offset) for a in p.acquired_records]
                    counts = [(a.first_offset, a.last_offset, a.delivery_count) for a in p.acquired_records]
                    got = self.decoder(topic, p.partition_index, p.records, counts)
                    a = Acquired(node_id, s.generation, t.topic_id, topic, p.partition_index, ranges,
                                 lock_deadline=lock_deadline)
                    if not isinstance(got, Undecoded):
                        a.gaps = gaps_of(ranges, got)
                    pairs.append((a, got))
            for (_, p), topic in acked.items():  # not in the answer: nothing to report
                _merge(outcomes, {(topic, p): 0})
            return pairs, outcomes

    # -- acknowledgements ---------------------------------------------------------------------------
    async def acknowledge(self, acquired: list[Acquired], ack_type: int) -> list[str]:
        """ACCEPT / RELEASE / REJECT (or RENEW) ``acquired`` on the sessions that acquired them;
        returns the errors met, as ``topic-partition: ERROR`` strings."""
        outcomes = await self.send_acks([Ack(a, a.batches(ack_type)) for a in acquired], renew=ack_type == RENEW)
        return [f"{t}-{p}: {error_name(code)}" + (" (session lost)" if code in _SESSION_LOST else "")
                for (t, p), code in outcomes.items() if code]

    async def send_acks(self, acks: Iterable[Ack], renew: bool = False) -> Outcomes:
        """Send ``acks`` in ShareAcknowledge requests (one per broker; RENEW ones with ``renew``);
        the outcome per partition."""
        outcomes: Outcomes = {}
        by_node: dict[int, list[Ack]] = {}
        for k in acks:
            by_node.setdefault(k.acquired.node, []).append(k)
        results = await asyncio.gather(*(self._ack_on(node_id, items, renew) for node_id, items in by_node.items()))
        for out in results:
            _merge(outcomes, out)
        return outcomes

    async def _ack_on(self, node_id: int, items: list[Ack], renew: bool) -> Outcomes:
        s = self._sessions.get(node_id)
        if s is None:
            return {(k.acquired.topic, k.acquired.partition): _SESSION_NOT_FOUND for k in items}
        outcomes: Outcomes = {}
        async with s.lock:
            live = [k for k in items if k.acquired.session == s.generation and s.epoch > 0]
            if len(live) < len(items):
                _merge(outcomes, {(k.acquired.topic, k.acquired.partition): _SESSION_NOT_FOUND
                                  for k in items if k not in live})
            if live:
                _merge(outcomes, await self._ack_node(s, live, renew))
        return outcomes

    async def _ack_node(self, s: _Session, items: list[Ack], renew: bool) -> Outcomes:
        keys = {(k.acquired.topic_id, k.acquired.partition): k.acquired.topic for k in items}

        def every(code: int) -> Outcomes:
            return {(t, p): code for (_, p), t in keys.items()}

        try:
            conn = await self.cluster.connection(s.node)
        except (KafkaError, OSError, ConnectionError):
            self._lost(s)
            return every(_NETWORK_EXCEPTION)
        version = conn.best_version(ApiKey.SHARE_ACKNOWLEDGE, lo=1, hi=2)
        if renew and version < 2:
            self.renew_supported = False
            return every(_UNSUPPORTED_VERSION)
        parts: dict[tuple[bytes, int], list[Any]] = {}
        for k in items:
            parts.setdefault((k.acquired.topic_id, k.acquired.partition), []).extend(k.batches)
        topics: dict[bytes, list[Any]] = {}
        for (tid, p), batches in parts.items():
            topics.setdefault(tid, []).append(_Ack.AcknowledgePartition(partition_index=p,
                                                                        acknowledgement_batches=merged(batches)))
        req = _Ack(group_id=self.group, member_id=self.member_id, share_session_epoch=s.epoch, is_renew_ack=renew,
                   topics=[_Ack.AcknowledgeTopic(topic_id=t, partitions=ps) for t, ps in topics.items()])
        try:
            resp = await asyncio.wait_for(conn.request(ApiKey.SHARE_ACKNOWLEDGE, version, req), self.cluster.timeout)
        except (TimeoutError, OSError, ConnectionError) as exc:
            self._lost(s)
            log.warning("ShareAcknowledge to %s:%d failed (%r)", s.node.host, s.node.port, exc)
            return every(_NETWORK_EXCEPTION)
        if resp.error_code in _SESSION_LOST:
            self._lost(s)
            return every(resp.error_code)
        s.epoch += 1
        if resp.error_code:
            return every(resp.error_code)
        if renew and getattr(resp, "acquisition_lock_timeout_ms", 0):
            deadline = time.monotonic() + resp.acquisition_lock_timeout_ms / 1000.0
            for k in items:
                k.acquired.lock_deadline = deadline
        out = every(0)
        for t in resp.responses:
            for p in t.partitions:
                topic = keys.get((t.topic_id, p.partition_index))
                if topic is not None:
                    out[(topic, p.partition_index)] = p.error_code
        return out

    # -- leaving ----------------------------------------------------------------------------------
    async def leave(self) -> None:
        """Leave the group (the broker releases whatever is still acquired) and stay connected:
        :meth:`subscribe` joins again, as a new member."""
        task, self._hb_task = self._hb_task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - it was retrying anyway
                pass
        await self._leave()
        self.epoch, self.assignment = 0, set()
        self._assigned.clear()
        for s in self._sessions.values():
            self._lost(s)
        self.member_id = str(uuid.uuid4())
        self._send_topics = True

    async def _leave(self) -> None:
        """Tell the coordinator the member leaves (best effort: on a failure it is dropped when its
        session times out)."""
        try:
            if self.epoch > 0:
                self.epoch = LEAVE_EPOCH
                await self._heartbeat(None)
        except (KafkaError, OSError, ConnectionError):
            pass

    async def close(self) -> None:
        """Leave the group; the broker releases whatever is still acquired."""
        if self.closed:
            return
        self.closed = True
        if self._hb_task is not None:
            self._hb_task.cancel()
        await self._leave()
        await self.cluster.close()


class Undecoded:
    """What a lazy decoder returns instead of records: the records of one acquisition, decoded when
    they are wanted (their acquisition's ``gaps`` are known then: :func:`gaps_of`)."""

    __slots__ = ("topic", "partition", "raw", "counts")

    def __init__(self, topic: str, partition: int, raw: Any, counts: list[tuple[int, int, int]]) -> None:
        self.topic, self.partition, self.raw, self.counts = topic, partition, raw, counts


def gaps_of(ranges: list[tuple[int, int]], records: list[Any]) -> set[int]:
    """The acquired offsets without a record (control records, aborted or compacted ones)."""
    if len(records) == sum(z - a + 1 for a, z in ranges):
        return set()
    present = {r.offset for r in records}
    return {o for a, z in ranges for o in range(a, z + 1) if o not in present}


def _merge(into: Outcomes, more: Outcomes) -> None:
    """Outcomes of one partition from several requests: the first error stands."""
    for key, code in more.items():
        if not into.get(key):
            into[key] = code


# -- decoding ----------------------------------------------------------------------------------------


def batches(raw: Any) -> Iterable[Any]:
    """The record batches of a ShareFetch partition's records (aiokafka's decoder: v2 batches with
    gzip, snappy, lz4 and zstd through cramjam; legacy message sets)."""
    if not raw:
        return
    mr = MemoryRecords(bytes(raw))
    while mr.has_next():
        batch = mr.next_batch()
        if batch is None:
            break
        if getattr(batch, "is_control_batch", False):
            continue
        yield batch


def decode(topic: str, partition: int, raw: Any, counts: list[tuple[int, int, int]]) -> list[Record]:
    """The records at acquired offsets of a ShareFetch partition's record batches."""
    if not raw:
        return []
    out: list[Record] = []
    lo, hi = counts[0][0], counts[-1][1]
    for batch in batches(raw):
        ts_type = getattr(batch, "timestamp_type", 0) or 0
        for r in batch:
            o = r.offset
            if o < lo or o > hi:
                continue
            count = next((c for a, z, c in counts if a <= o <= z), None)
            if count is None:
                continue
            out.append(Record(topic, partition, o, r.timestamp, ts_type, r.key, r.value,
                              [(k, v) for k, v in r.headers], count))
    return out


__all__ = ["ACCEPT", "BATCH_OPTIMIZED", "GAP", "RECORD_LIMIT", "REJECT", "RELEASE", "RENEW", "Ack", "Acquired",
           "MemberError", "Outcomes", "Record", "ShareMember", "Undecoded", "ack_batch", "ack_batches", "decode", "gaps_of",
           "merged"]
