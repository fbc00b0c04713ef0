"""``AIOShareConsumer``: an asyncio share consumer (KIP-932 share groups) in aiokafka's style, for
kshare and for native Apache Kafka 4.x share groups.

    async with AIOShareConsumer("orders", bootstrap_servers="localhost:9092", group_id="workers") as consumer:
        async for record in consumer:
            await handle(record)          # implicit mode: accepted at the next fetch

Built on :class:`kshare.clients.share_member.ShareMember` (the member the Spark source's workers
use): ShareGroupHeartbeat, ShareFetch in record-limit mode (never more than ``max_records``
acquired), ShareAcknowledge, on kshare's own protocol layer. See docs/aio-share-consumer.md.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from aiokafka.errors import ConsumerStoppedError, IllegalStateError, KafkaError
from aiokafka.structs import ConsumerRecord, TopicPartition

from ..security import MECHANISMS, ClientSecurity
from .cluster import parse_servers
from .errors import error_for
from .share_member import (
    ACCEPT,
    GAP,
    REJECT,
    RELEASE,
    RENEW,
    Ack,
    Acquired,
    Outcomes,
    ShareMember,
    ack_batches,
    batches,
)

log = logging.getLogger("kshare.aio_share_consumer")

KT = TypeVar("KT")
VT = TypeVar("VT")

AcknowledgeType = Literal["accept", "release", "reject", "renew"]
ACK_TYPES: dict[str, int] = {"accept": ACCEPT, "release": RELEASE, "reject": REJECT, "renew": RENEW}
AcknowledgementOutcomes = dict[TopicPartition, KafkaError | None]
"""Per partition: None when every acknowledgement was taken, else the error (e.g.
``InvalidRecordStateError``: a record's lock had run out)."""


@dataclass
class ShareConsumerRecord(ConsumerRecord[KT, VT], Generic[KT, VT]):
    """aiokafka's ``ConsumerRecord`` (topic, partition, offset, timestamp, timestamp_type, key, value,
    checksum (None), serialized_key_size, serialized_value_size, headers) plus how many times the
    share group has delivered it, this delivery included."""

    delivery_count: int = 1


@dataclass(slots=True, eq=False)
class _Held:
    """One acquisition whose acknowledgements are not all sent yet."""

    acquired: Acquired
    undelivered: set[int] | None = None  # offsets still in the iterator's buffer
    acks: dict[int, int] = field(default_factory=dict)  # offset -> type, acknowledged, not yet sent
    sent: set[int] = field(default_factory=set)  # offsets whose acknowledgement went out (gaps too)

    def holds(self, offset: int) -> bool:
        return any(a <= offset <= z for a, z in self.acquired.ranges)


class AIOShareConsumer:
    """A member of share group ``group_id`` reading ``topics``.

    ``acknowledgement_mode``: ``"implicit"`` (the records a ``getmany`` returned, or the iterator
    handed out, are accepted at the next ``getmany``, ``commit`` or ``stop``, as Kafka's
    ``KafkaShareConsumer`` does; :meth:`acknowledge` may still release or reject some) or
    ``"explicit"`` (each record is acknowledged with :meth:`acknowledge`; unlike Kafka's and
    librdkafka's consumers the next ``getmany`` does not wait for that: records stay acquired
    until acknowledged or their lock runs out). Acknowledgements go out on the next ShareFetch to
    the same broker, or at :meth:`commit`, which returns their outcome per partition.

    Security options as aiokafka's: ``security_protocol`` (PLAINTEXT, SSL, SASL_PLAINTEXT,
    SASL_SSL), ``ssl_context`` (a default context for SSL without one), ``sasl_mechanism`` (PLAIN,
    SCRAM-SHA-256, SCRAM-SHA-512), ``sasl_plain_username`` / ``sasl_plain_password``.
    """

    def __init__(
        self,
        *topics: str,
        bootstrap_servers: str | Iterable[str] = "localhost:9092",
        group_id: str,
        client_id: str = "kshare-aio-share-consumer",
        acknowledgement_mode: Literal["implicit", "explicit"] = "implicit",
        max_poll_records: int = 500,
        fetch_max_wait_ms: int = 500,
        request_timeout_ms: int = 30000,
        client_rack: str | None = None,
        key_deserializer: Callable[[bytes | None], Any] | None = None,
        value_deserializer: Callable[[bytes | None], Any] | None = None,
        acknowledgement_callback: Callable[[AcknowledgementOutcomes], Any] | None = None,
        security_protocol: str = "PLAINTEXT",
        ssl_context: ssl.SSLContext | None = None,
        sasl_mechanism: str = "PLAIN",
        sasl_plain_username: str | None = None,
        sasl_plain_password: str | None = None,
    ) -> None:
        if not group_id:
            raise ValueError("group_id is required: a share consumer is a member of a share group")
        if acknowledgement_mode not in ("implicit", "explicit"):
            raise ValueError(f"acknowledgement_mode must be 'implicit' or 'explicit', not {acknowledgement_mode!r}")
        if max_poll_records < 1:
            raise ValueError("max_poll_records must be at least 1")
        self._servers = parse_servers(bootstrap_servers)
        self._group = group_id
        self._client_id = client_id
        self._explicit = acknowledgement_mode == "explicit"
        self._max_poll_records = max_poll_records
        self._fetch_max_wait_ms = fetch_max_wait_ms
        self._timeout_ms = request_timeout_ms
        self._rack = client_rack
        self._key_deserializer = key_deserializer
        self._value_deserializer = value_deserializer
        self._callback = acknowledgement_callback
        self._security = _security(security_protocol, ssl_context, sasl_mechanism, sasl_plain_username,
                                   sasl_plain_password)
        self._topics: list[str] = list(dict.fromkeys(topics))
        self._member: ShareMember | None = None
        self._held: list[_Held] = []
        self._index: dict[tuple[str, int], list[_Held]] = {}
        self._renews: list[tuple[_Held, int]] = []
        self._buffer: deque[ShareConsumerRecord] = deque()
        self._buffered: dict[tuple[str, int], _Held] = {}  # the iterator's batch: partition -> its acquisition
        self._tps: dict[tuple[str, int], TopicPartition] = {}
        self._membership: asyncio.Task | None = None
        self._started = False
        self._closed = False

    # -- life cycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        """Connect, check the subscribed topics (an unknown one raises
        ``UnknownTopicOrPartitionError``) and join the group if subscribed. Errors as aiokafka's."""
        if self._started:
            return
        if self._closed:
            raise ConsumerStoppedError()
        self._member = ShareMember(self._servers, self._group, self._topics, client_id=self._client_id,
                                   rack=self._rack, timeout_ms=self._timeout_ms, security=self._security,
                                   decoder=self._decode)
        try:
            if self._topics:
                await self._member.start()
            else:
                await self._member.cluster.connect()
                self._member._connected = True
        except BaseException:
            await self._member.close()
            raise
        self._started = True

    async def stop(self) -> None:
        """Acknowledge what is due (implicit mode: the records handed out are accepted), leave the
        group (the broker releases whatever is still acquired) and close the connections."""
        if self._closed:
            return
        self._closed = True
        member = self._member
        if member is None:
            return
        try:
            if self._membership is not None:
                try:
                    await self._membership
                except Exception:  # noqa: BLE001 - stopping anyway
                    pass
            if self._started and not member.closed:
                acks = self._collect()
                renews = self._collect_renews()
                outcomes: Outcomes = {}
                if renews:
                    outcomes.update(await member.send_acks(renews, renew=True))
                if acks:
                    outcomes.update(await member.send_acks(acks))
                await self._report(outcomes)
        finally:
            self._buffer.clear()
            await member.close()

    async def __aenter__(self) -> AIOShareConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- subscription -----------------------------------------------------------------------------
    def subscribe(self, topics: Iterable[str] = ()) -> None:
        """Subscribe to ``topics`` (replacing the subscription). Takes effect at once in the
        background; an unknown topic raises at the next ``getmany``."""
        if isinstance(topics, str):
            topics = [topics]
        topics = list(dict.fromkeys(topics))
        if not topics:
            raise ValueError("subscribe() needs at least one topic (unsubscribe() leaves the group)")
        self._topics = topics
        if self._started and not self._closed:
            self._after_membership(self._resubscribe(topics))

    def unsubscribe(self) -> None:
        """Leave the group (implicit mode: the records handed out are accepted first; the broker
        releases whatever else is acquired). ``subscribe`` joins again, as a new member."""
        self._topics = []
        if self._started and not self._closed:
            self._after_membership(self._leave())

    def subscription(self) -> frozenset[str]:
        return frozenset(self._topics)

    def assignment(self) -> frozenset[TopicPartition]:
        """The partitions the group assigned to this member (by the last heartbeat)."""
        m = self._member
        if m is None:
            return frozenset()
        return frozenset(self._tp(m.names.get(tid, "?"), p) for tid, p in m.assignment)

    @property
    def member_id(self) -> str | None:
        return self._member.member_id if self._member is not None else None

    def _after_membership(self, coro: Any) -> None:
        previous = self._membership

        async def run() -> None:
            if previous is not None:
                try:
                    await previous
                except Exception:  # noqa: BLE001 - reported by whoever awaited it first
                    pass
            await coro

        self._membership = asyncio.get_running_loop().create_task(run())

    async def _resubscribe(self, topics: list[str]) -> None:
        assert self._member is not None
        await self._member.subscribe(topics)

    async def _leave(self) -> None:
        m = self._member
        assert m is not None
        acks = self._collect()
        self._buffer.clear()
        self._buffered.clear()
        if acks:
            await self._report(await m.send_acks(acks))
        self._held.clear()
        self._index.clear()
        self._renews.clear()
        await m.leave()

    async def _settle_membership(self) -> None:
        task = self._membership
        if task is not None:
            self._membership = None
            await task  # raises what subscribe / unsubscribe met

    def _ready(self) -> ShareMember:
        if self._closed:
            raise ConsumerStoppedError()
        if not self._started or self._member is None:
            raise IllegalStateError("the consumer is not started: await consumer.start() first")
        if self._member.failure is not None:
            raise self._member.failure
        return self._member

    # -- reading ----------------------------------------------------------------------------------
    async def getmany(self, *partitions: TopicPartition, timeout_ms: int = 0,
                      max_records: int | None = None) -> dict[TopicPartition, list[ShareConsumerRecord]]:
        """Records acquired for this member, per partition: up to ``max_records`` (default
        ``max_poll_records``), waiting up to ``timeout_ms`` for the first. In implicit mode the
        records of the previous call are accepted first (on the same request)."""
        if partitions:
            raise TypeError("a share consumer reads the partitions the group assigns: getmany() takes none")
        member = self._ready()
        await self._settle_membership()
        limit = max_records or self._max_poll_records
        if self._buffer:  # records the iterator fetched and did not hand out yet
            return self._from_buffer(limit)
        records = await self._fetch(limit, timeout_ms, member)
        out: dict[TopicPartition, list[ShareConsumerRecord]] = {}
        for r in records:
            tp = self._tp(r.topic, r.partition)
            lst = out.get(tp)
            if lst is None:
                out[tp] = [r]
            else:
                lst.append(r)
        return out

    async def getone(self) -> ShareConsumerRecord:
        """The next record (waiting as long as it takes); records are fetched up to
        ``max_poll_records`` at a time and handed out one by one."""
        member = self._ready()
        await self._settle_membership()
        while not self._buffer:
            records = await self._fetch(self._max_poll_records, self._fetch_max_wait_ms, member)
            if records:
                self._buffer.extend(records)
                self._buffered = {}
                for r in records:
                    key = (r.topic, r.partition)
                    if key not in self._buffered:
                        h = self._held_for(r.topic, r.partition, r.offset)
                        if h is not None:
                            h.undelivered = set()
                            self._buffered[key] = h
                    h = self._buffered.get(key)
                    if h is not None and h.undelivered is not None:
                        h.undelivered.add(r.offset)
            member = self._ready()
        r = self._buffer.popleft()
        h = self._buffered.get((r.topic, r.partition))
        if h is not None and h.undelivered:
            h.undelivered.discard(r.offset)
        return r

    def __aiter__(self) -> AsyncIterator[ShareConsumerRecord]:
        return self

    async def __anext__(self) -> ShareConsumerRecord:
        try:
            return await self.getone()
        except ConsumerStoppedError:
            raise StopAsyncIteration from None

    def _from_buffer(self, limit: int) -> dict[TopicPartition, list[ShareConsumerRecord]]:
        out: dict[TopicPartition, list[ShareConsumerRecord]] = {}
        while self._buffer and limit > 0:
            r = self._buffer.popleft()
            h = self._buffered.get((r.topic, r.partition))
            if h is not None and h.undelivered:
                h.undelivered.discard(r.offset)
            out.setdefault(self._tp(r.topic, r.partition), []).append(r)
            limit -= 1
        return out

    async def _fetch(self, limit: int, timeout_ms: int, member: ShareMember) -> list[ShareConsumerRecord]:
        deadline = time.monotonic() + max(0, timeout_ms) / 1000.0
        acks = self._collect()
        renews = self._collect_renews()
        if renews:
            await self._report(await member.send_acks(renews, renew=True))
        while True:
            remaining = deadline - time.monotonic()
            wait_ms = int(max(0.0, min(remaining, self._fetch_max_wait_ms / 1000.0)) * 1000)
            if not member.assignment:
                if acks:  # no partition to fetch (yet, or any more): acknowledge on their own
                    await self._report(await member.send_acks(acks))
                    acks = []
                if remaining <= 0 or not await member.wait_assigned(wait_ms / 1000.0):
                    if time.monotonic() >= deadline:
                        return []
                    continue
                continue
            records, acquired, outcomes = await member.poll(limit, wait_ms, acks)
            acks = []
            if outcomes:
                await self._report(outcomes)
            if acquired:
                self._hold(acquired)
            if member.failure is not None:
                raise member.failure
            if records or time.monotonic() >= deadline:
                return records

    # -- acknowledgements -------------------------------------------------------------------------
    def acknowledge(self, record: Any, type: AcknowledgeType = "accept") -> None:  # noqa: A002 - Kafka's word
        """Acknowledge ``record`` (a record this consumer returned): ``"accept"`` (processed),
        ``"release"`` (deliver again, to any member), ``"reject"`` (never deliver again) or
        ``"renew"`` (extend its lock; where the cluster allows it: Kafka 4.2+ ShareAcknowledge v2
        with ``share.renew.acknowledge.enable``, and kshare). Sent with the next ``getmany`` or
        ``commit``. Raises ``IllegalStateError`` for a record not held (already acknowledged,
        or not from this consumer)."""
        try:
            ack_type = ACK_TYPES[type]
        except KeyError:
            raise ValueError(f"acknowledgement type must be one of {', '.join(ACK_TYPES)}, not {type!r}") from None
        if self._closed:
            raise ConsumerStoppedError()
        topic, partition, offset = record.topic, record.partition, record.offset
        h = self._held_for(topic, partition, offset)
        if h is None or offset in h.sent or offset in h.acquired.gaps:
            raise IllegalStateError(f"{topic}-{partition} offset {offset} is not held by this consumer "
                                    "(acknowledged already, or its session was lost)")
        if ack_type == RENEW:
            if offset in h.acks:
                raise IllegalStateError(f"{topic}-{partition} offset {offset} is acknowledged already")
            self._renews.append((h, offset))
            return
        if offset in h.acks:
            raise IllegalStateError(f"{topic}-{partition} offset {offset} is acknowledged already")
        h.acks[offset] = ack_type

    async def commit(self) -> AcknowledgementOutcomes:
        """Send the acknowledgements due now (implicit mode: the records handed out so far are
        accepted) in ShareAcknowledge requests; their outcome per partition."""
        member = self._ready()
        await self._settle_membership()
        outcomes: Outcomes = {}
        renews = self._collect_renews()
        if renews:
            outcomes.update(await member.send_acks(renews, renew=True))
        acks = self._collect()
        if acks:
            for key, code in (await member.send_acks(acks)).items():
                if not outcomes.get(key):
                    outcomes[key] = code
        return await self._report(outcomes)

    def set_acknowledgement_callback(self, callback: Callable[[AcknowledgementOutcomes], Any] | None) -> None:
        """``callback(outcomes)`` after every answer to acknowledgements (those that rode on a
        ShareFetch too); may be a coroutine function."""
        self._callback = callback

    def _hold(self, acquired: list[Acquired]) -> None:
        for a in acquired:
            h = _Held(a)
            self._held.append(h)
            self._index.setdefault((a.topic, a.partition), []).append(h)

    def _held_for(self, topic: str, partition: int, offset: int) -> _Held | None:
        for h in self._index.get((topic, partition), ()):
            if h.holds(offset):
                return h
        return None

    def _collect(self) -> list[Ack]:
        """The acknowledgements due now; forgets the acquisitions all of whose offsets are sent
        (or whose session is lost: the broker released them)."""
        out: list[Ack] = []
        keep: list[_Held] = []
        member = self._member
        implicit = not self._explicit
        for h in self._held:
            a = h.acquired
            if implicit and not h.acks and not h.sent and not h.undelivered:
                out.append(Ack(a, a.batches(ACCEPT)))  # the common case: the whole acquisition
                continue
            types: dict[int, int] = {}
            if implicit:
                skip = h.sent | (h.undelivered or set())
                for lo, hi in a.ranges:
                    for o in range(lo, hi + 1):
                        if o not in skip:
                            types[o] = ACCEPT
            for o in a.gaps:
                if o not in h.sent:
                    types[o] = GAP
            if h.acks:
                types.update(h.acks)
                h.acks = {}
            if types:
                out.append(Ack(a, ack_batches(types)))
                h.sent.update(types)
            if len(h.sent) < a.count and (member is None or member.live(a)):
                keep.append(h)
        if len(keep) != len(self._held):
            self._held = keep
            self._index = {}
            for h in keep:
                self._index.setdefault((h.acquired.topic, h.acquired.partition), []).append(h)
        return out

    def _collect_renews(self) -> list[Ack]:
        if not self._renews:
            return []
        by: dict[int, tuple[_Held, dict[int, int]]] = {}
        for h, o in self._renews:
            if o not in h.sent and o not in h.acks:
                by.setdefault(id(h), (h, {}))[1][o] = RENEW
        self._renews = []
        return [Ack(h.acquired, ack_batches(types)) for h, types in by.values()]

    async def _report(self, outcomes: Outcomes) -> AcknowledgementOutcomes:
        out: AcknowledgementOutcomes = {
            self._tp(t, p): (error_for(code, f"acknowledgement of {t}-{p} in group {self._group}") if code else None)
            for (t, p), code in outcomes.items()}
        if out and self._callback is not None:
            try:
                result = self._callback(out)
                if inspect.isawaitable(result):
                    await result
            except Exception:  # noqa: BLE001 - a callback's failure is the application's
                log.exception("acknowledgement callback failed")
        return out

    # -- records ----------------------------------------------------------------------------------
    def _tp(self, topic: str, partition: int) -> TopicPartition:
        key = (topic, partition)
        tp = self._tps.get(key)
        if tp is None:
            tp = self._tps[key] = TopicPartition(topic, partition)
        return tp

    def _decode(self, topic: str, partition: int, raw: Any,
                counts: list[tuple[int, int, int]]) -> list[ShareConsumerRecord]:
        """The records at the acquired offsets, with their delivery counts."""
        if not raw:
            return []
        out: list[ShareConsumerRecord] = []
        rec = ShareConsumerRecord
        lo, hi = counts[0][0], counts[-1][1]
        for batch in batches(raw):
            tt = getattr(batch, "timestamp_type", 0) or 0
            delta = getattr(batch, "last_offset_delta", None)
            base = batch.base_offset if delta is not None else None
            count = None
            if base is not None:
                for a, z, c in counts:
                    if a <= base and base + delta <= z:
                        count = c  # the whole batch within one acquired range
                        break
            if count is not None:
                out += [rec(topic, partition, r.offset, r.timestamp, tt, k := r.key, v := r.value, None,
                            -1 if k is None else len(k), -1 if v is None else len(v), r.headers, count)
                        for r in batch]
                continue
            for r in batch:
                o = r.offset
                if o < lo or o > hi:
                    continue
                c = next((c for a, z, c in counts if a <= o <= z), None)
                if c is None:
                    continue
                k, v = r.key, r.value
                out.append(rec(topic, partition, o, r.timestamp, tt, k, v, None, -1 if k is None else len(k),
                               -1 if v is None else len(v), r.headers, c))
        kd, vd = self._key_deserializer, self._value_deserializer
        if kd is not None or vd is not None:
            for r in out:
                if kd is not None:
                    r.key = kd(r.key)
                if vd is not None:
                    r.value = vd(r.value)
        return out


def _security(protocol: str, context: ssl.SSLContext | None, mechanism: str, username: str | None,
              password: str | None) -> ClientSecurity | None:
    protocol = protocol.upper()
    if protocol not in ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"):
        raise ValueError(f"security_protocol must be PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL, not {protocol!r}")
    tls = None
    if protocol in ("SSL", "SASL_SSL"):
        tls = context if context is not None else ssl.create_default_context()
    if not protocol.startswith("SASL_"):
        return ClientSecurity(ssl=tls) if tls is not None else None
    mechanism = mechanism.upper()
    if mechanism not in MECHANISMS or mechanism == "OAUTHBEARER":
        raise ValueError(f"sasl_mechanism must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512, not {mechanism!r}")
    if username is None or password is None:
        raise ValueError(f"SASL {mechanism} needs sasl_plain_username and sasl_plain_password")
    return ClientSecurity(ssl=tls, sasl_mechanism=mechanism, username=username, password=password)
