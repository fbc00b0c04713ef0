"""A KIP-932 share-group member on kshare's own protocol layer (no librdkafka).

Why not confluent-kafka's ``ShareConsumer``: in explicit mode it refuses ``poll()`` while the
records of the previous poll are unacknowledged, and the Spark source must hold the records of
micro-batch N (until Spark commits N) while it already reads N+1. This member keeps what it
acquired as :class:`Acquired` handles the caller acknowledges (ACCEPT / RELEASE / REJECT) or
renews (ShareAcknowledge v2 RENEW) whenever it likes, on the share session that acquired them.

It speaks only the wire protocol (ShareGroupHeartbeat v1 to the group coordinator, ShareFetch and
ShareAcknowledge to each partition's leader), so it works against kshare and against a native
Apache Kafka 4.x cluster with share groups. TLS and SASL (PLAIN, SCRAM) through ``security``.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiokafka.record.memory_records import MemoryRecords

from ..protocol import messages
from ..security import ClientSecurity
from .admin_client import AdminError, Node, ShareGroupAdmin, error_name

log = logging.getLogger("kshare.share_member")

HEARTBEAT, SHARE_FETCH, SHARE_ACK = 76, 78, 79
GAP, ACCEPT, RELEASE, REJECT, RENEW = 0, 1, 2, 3, 4
RECORD_LIMIT = 1  # ShareFetch v2 ShareAcquireMode: never more records than MaxRecords
LEAVE_EPOCH = -1

UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH = 25, 110
SHARE_SESSION_NOT_FOUND, INVALID_SHARE_SESSION_EPOCH = 122, 123
_REJOIN = {UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH}
_SESSION_LOST = {SHARE_SESSION_NOT_FOUND, INVALID_SHARE_SESSION_EPOCH}

_Heartbeat = messages.message_class("ShareGroupHeartbeatRequest")
_Fetch = messages.message_class("ShareFetchRequest")
_Ack = messages.message_class("ShareAcknowledgeRequest")


class MemberError(Exception):
    """A share-group call failed in a way the member cannot recover from by itself."""


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


@dataclass(slots=True)
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
        for a, z in self.ranges:
            special = ack_type != RENEW and any(a <= o <= z for o in self.gaps | self.rejects)
            types = ([GAP if o in self.gaps else REJECT if o in self.rejects else ack_type for o in range(a, z + 1)]
                     if special else [ack_type])
            out.append(_Ack.AcknowledgementBatch(first_offset=a, last_offset=z, acknowledge_types=types))
        return out


@dataclass(slots=True)
class _Session:
    node: Node
    generation: int = 0
    epoch: int = 0
    partitions: set[tuple[bytes, int]] = field(default_factory=set)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class ShareMember:
    """One member of ``group`` subscribed to ``topics``. Use ``start`` / ``fetch`` /
    ``acknowledge`` / ``renew`` / ``close`` from one event loop."""

    def __init__(self, bootstrap: list[tuple[str, int]], group: str, topics: list[str], *,
                 client_id: str = "kshare-member", rack: str | None = None, timeout_ms: int = 30000,
                 security: ClientSecurity | None = None) -> None:
        self.group = group
        self.topics = topics
        self.rack = rack
        self.cluster = ShareGroupAdmin(bootstrap, client_id=client_id, timeout_ms=timeout_ms, security=security)
        self.member_id = str(uuid.uuid4())
        self.epoch = 0
        self.assignment: set[tuple[bytes, int]] = set()
        self.names: dict[bytes, str] = {}
        self.renew_supported = True
        self._interval = 1.0
        self._assigned = asyncio.Event()
        self._sessions: dict[int, _Session] = {}
        self._hb_task: asyncio.Task | None = None
        self.closed = False

    # -- membership -------------------------------------------------------------------------------
    async def start(self) -> None:
        await self.cluster.connect()
        found = await self.cluster.refresh_metadata(self.topics)
        missing = [t for t in self.topics if t not in found]
        if missing:
            raise MemberError(f"topic(s) {', '.join(missing)} do not exist")
        self.names = {m.topic_id: m.name for m in found.values()}
        await self._heartbeat(self.topics)
        self._hb_task = asyncio.get_running_loop().create_task(self._heartbeats())

    async def _heartbeat(self, topics: list[str] | None) -> None:
        node = await self.cluster.coordinator(self.group)
        conn = await self.cluster._connection(node)
        resp = await self.cluster._request(conn, HEARTBEAT, 1, _Heartbeat(
            group_id=self.group, member_id=self.member_id, member_epoch=self.epoch, rack_id=self.rack,
            subscribed_topic_names=topics))
        if resp.error_code in _REJOIN:  # the group forgot us (e.g. a long pause): join again
            log.warning("share member %s of %s rejoins after %s", self.member_id, self.group,
                        error_name(resp.error_code))
            self.epoch, self.assignment = 0, set()
            self._assigned.clear()
            return
        if resp.error_code:
            raise MemberError(f"ShareGroupHeartbeat for group {self.group} failed: {error_name(resp.error_code)}"
                              + (f" ({resp.error_message})" if resp.error_message else ""))
        self.epoch = resp.member_epoch
        self._interval = max(0.1, resp.heartbeat_interval_ms / 1000.0)
        if resp.assignment is not None:
            self.assignment = {(tp.topic_id, p) for tp in resp.assignment.topic_partitions for p in tp.partitions}
            if self.assignment:
                self._assigned.set()
            else:
                self._assigned.clear()

    async def _heartbeats(self) -> None:
        while not self.closed:
            # Kafka assigns on a later heartbeat than the join: ask often until assigned
            await asyncio.sleep(self._interval if self._assigned.is_set() else min(self._interval, 0.2))
            try:
                await self._heartbeat(self.topics if self.epoch == 0 else None)
            except (AdminError, MemberError, OSError, ConnectionError) as exc:
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

    # -- fetch ------------------------------------------------------------------------------------
    async def fetch(self, max_records: int, max_wait_ms: int) -> tuple[list[Record], list[Acquired]]:
        """Acquire up to ``max_records`` records (waiting up to ``max_wait_ms`` for the first)."""
        by_node = await self._leaders()
        if not by_node:
            await asyncio.sleep(max_wait_ms / 1000.0)
            return [], []
        share = max(1, max_records // len(by_node))
        results = await asyncio.gather(*(self._fetch_node(n, parts, share, max_wait_ms)
                                         for n, parts in by_node.items()))
        records = [r for rs, _ in results for r in rs]
        acquired = [a for _, acq in results for a in acq]
        return records, acquired

    async def _fetch_node(self, node_id: int, parts: list[tuple[bytes, int]], max_records: int,
                          max_wait_ms: int) -> tuple[list[Record], list[Acquired]]:
        s = self._session(node_id)
        async with s.lock:
            conn = await self.cluster._connection(s.node)
            version = conn.best_version(SHARE_FETCH, lo=1, hi=2)
            want = set(parts)
            add, forget = sorted(want - s.partitions), sorted(s.partitions - want)
            topics: dict[bytes, list[int]] = {}
            for tid, p in add:
                topics.setdefault(tid, []).append(p)
            forgotten: dict[bytes, list[int]] = {}
            for tid, p in forget:
                forgotten.setdefault(tid, []).append(p)
            req = _Fetch(group_id=self.group, member_id=self.member_id, share_session_epoch=s.epoch,
                         max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=16 << 20, max_records=max_records,
                         batch_size=max_records, share_acquire_mode=RECORD_LIMIT,
                         topics=[_Fetch.FetchTopic(topic_id=t, partitions=[
                             _Fetch.FetchPartition(partition_index=p, acknowledgement_batches=[]) for p in ps])
                             for t, ps in topics.items()],
                         forgotten_topics_data=[_Fetch.ForgottenTopic(topic_id=t, partitions=ps)
                                                for t, ps in forgotten.items()])
            timeout = self.cluster.timeout + max_wait_ms / 1000.0
            try:
                resp = await asyncio.wait_for(conn.request(SHARE_FETCH, version, req), timeout)
            except (TimeoutError, OSError, ConnectionError) as exc:
                self._lost(s)  # a dropped connection ends the session on the broker too
                log.warning("ShareFetch to %s:%d failed (%r); the session starts again", s.node.host,
                            s.node.port, exc)
                return [], []
            if resp.error_code in _SESSION_LOST:
                self._lost(s)
                return [], []
            if resp.error_code:
                raise MemberError(f"ShareFetch for group {self.group} failed: {error_name(resp.error_code)}"
                                  + (f" ({resp.error_message})" if resp.error_message else ""))
            s.epoch += 1
            s.partitions = want
            lock_deadline = time.monotonic() + resp.acquisition_lock_timeout_ms / 1000.0
            records: list[Record] = []
            acquired: list[Acquired] = []
            for t in resp.responses:
                topic = self.names.get(t.topic_id, "")
                for p in t.partitions:
                    if p.error_code:
                        log.warning("ShareFetch %s-%d: %s", topic, p.partition_index, error_name(p.error_code))
                        if p.error_code in (6, 100):  # NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_ID
                            await self.cluster.refresh_metadata(self.topics)
                        continue
                    if not p.acquired_records:
                        continue
                    ranges = [(a.first_offset, a.last_offset) for a in p.acquired_records]
                    counts = [(a.first_offset, a.last_offset, a.delivery_count) for a in p.acquired_records]
                    got = _decode(topic, p.partition_index, p.records, counts)
                    present = {r.offset for r in got}
                    gaps = {o for a, z in ranges for o in range(a, z + 1) if o not in present}
                    records.extend(got)
                    acquired.append(Acquired(node_id, s.generation, t.topic_id, topic, p.partition_index, ranges,
                                             gaps, lock_deadline=lock_deadline))
            return records, acquired

    # -- acknowledgements ---------------------------------------------------------------------------
    async def acknowledge(self, acquired: list[Acquired], ack_type: int) -> list[str]:
        """ACCEPT / RELEASE / REJECT (or RENEW) ``acquired`` on the sessions that acquired them;
        returns the errors met, as ``topic-partition: ERROR`` strings."""
        errors: list[str] = []
        by_node: dict[int, list[Acquired]] = {}
        for a in acquired:
            by_node.setdefault(a.node, []).append(a)
        for node_id, items in by_node.items():
            s = self._session(node_id)
            async with s.lock:
                live = [a for a in items if a.session == s.generation and s.epoch > 0]
                errors += [f"{a.topic}-{a.partition}: session lost" for a in items if a not in live]
                if not live:
                    continue
                errors += await self._ack_node(s, live, ack_type)
        return errors

    async def _ack_node(self, s: _Session, items: list[Acquired], ack_type: int) -> list[str]:
        conn = await self.cluster._connection(s.node)
        version = conn.best_version(SHARE_ACK, lo=1, hi=2)
        if ack_type == RENEW and version < 2:
            self.renew_supported = False
            return ["RENEW needs ShareAcknowledge v2"]
        parts: dict[tuple[bytes, int], list[Any]] = {}
        for a in items:
            parts.setdefault((a.topic_id, a.partition), []).extend(a.batches(ack_type))
        topics: dict[bytes, list[Any]] = {}
        for (tid, p), batches in parts.items():
            topics.setdefault(tid, []).append(_Ack.AcknowledgePartition(partition_index=p,
                                                                        acknowledgement_batches=batches))
        req = _Ack(group_id=self.group, member_id=self.member_id, share_session_epoch=s.epoch,
                   is_renew_ack=ack_type == RENEW,
                   topics=[_Ack.AcknowledgeTopic(topic_id=t, partitions=ps) for t, ps in topics.items()])
        try:
            resp = await asyncio.wait_for(conn.request(SHARE_ACK, version, req), self.cluster.timeout)
        except (TimeoutError, OSError, ConnectionError) as exc:
            self._lost(s)
            return [f"ShareAcknowledge to {s.node.host}:{s.node.port} failed: {exc!r}"]
        if resp.error_code in _SESSION_LOST:
            self._lost(s)
            return [f"ShareAcknowledge: {error_name(resp.error_code)}"]
        s.epoch += 1
        if resp.error_code:
            return [f"ShareAcknowledge: {error_name(resp.error_code)}"]
        if ack_type == RENEW and getattr(resp, "acquisition_lock_timeout_ms", 0):
            deadline = time.monotonic() + resp.acquisition_lock_timeout_ms / 1000.0
            for a in items:
                a.lock_deadline = deadline
        names = {a.topic_id: a.topic for a in items}
        return [f"{names.get(t.topic_id, '?')}-{p.partition_index}: {error_name(p.error_code)}"
                for t in resp.responses for p in t.partitions if p.error_code]

    async def close(self) -> None:
        """Leave the group; the broker releases whatever is still acquired."""
        if self.closed:
            return
        self.closed = True
        if self._hb_task is not None:
            self._hb_task.cancel()
        try:
            if self.epoch > 0:
                self.epoch = LEAVE_EPOCH
                await self._heartbeat(None)
        except (AdminError, MemberError, OSError, ConnectionError):
            pass
        await self.cluster.close()


def _decode(topic: str, partition: int, raw: Any, counts: list[tuple[int, int, int]]) -> list[Record]:
    """The records at acquired offsets of a ShareFetch partition's record batches (aiokafka's
    decoder: v2 batches with gzip, snappy, lz4 and zstd through cramjam, CRC checked)."""
    if not raw:
        return []
    out: list[Record] = []
    lo, hi = counts[0][0], counts[-1][1]
    mr = MemoryRecords(bytes(raw))
    while mr.has_next():
        batch = mr.next_batch()
        if batch is None:
            break
        if getattr(batch, "is_control_batch", False):
            continue
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
