"""``AIOShareConsumer``: an asyncio share consumer (KIP-932 share groups) in aiokafka's style, for
kshare and for native Apache Kafka 4.x share groups.

    async with AIOShareConsumer("orders", bootstrap_servers="localhost:9092", group_id="workers") as consumer:
        async for record in consumer:
            await handle(record)          # implicit mode: accepted at the next fetch

Built on :class:`kshare.clients.share_member.ShareMember` (the member the Spark source's workers
use): ShareGroupHeartbeat, ShareFetch in record-limit mode (never more than ``max_records``
acquired), ShareAcknowledge, on kshare's own protocol layer. See docs/guide/aio-share-consumer.md.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import logging
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from aiokafka.errors import ConsumerStoppedError, IllegalStateError, KafkaError
from aiokafka.structs import TopicPartition

from ..security import MECHANISMS, ClientSecurity
from .cluster import parse_servers
from .errors import error_for
from .share_member import (
    ACCEPT,
    BATCH_OPTIMIZED,
    GAP,
    RECORD_LIMIT,
    REJECT,
    RELEASE,
    RENEW,
    Ack,
    Acquired,
    Outcomes,
    ShareMember,
    Undecoded,
    ack_batch,
    ack_batches,
    gaps_of,
)
from .share_records import ShareConsumerRecord, _new, decode_records

log = logging.getLogger("kshare.aio_share_consumer")


AcknowledgeType = Literal["accept", "release", "reject", "renew"]
ACK_TYPES: dict[str, int] = {"accept": ACCEPT, "release": RELEASE, "reject": REJECT, "renew": RENEW}
AcknowledgementOutcomes = dict[TopicPartition, KafkaError | None]
"""Per partition: None when every acknowledgement was taken, else the error (e.g.
``InvalidRecordStateError``: a record's lock had run out)."""




ACK_LINGER_S = 0.5  # acknowledgements due wait at most this long for a ShareFetch to ride on


@dataclass(slots=True, eq=False)
class _Held:
    """One acquisition whose acknowledgements are not all sent yet."""

    acquired: Acquired
    end: int  # its last offset
    delivered_to: int  # offsets below it were handed out (gaps among them passed)
    acked_to: int  # implicit mode: offsets below it are acknowledged
    acks: dict[int, int] = field(default_factory=dict)  # offset -> type, acknowledged, not yet sent
    sent: set[int] = field(default_factory=set)  # explicit mode: offsets whose acknowledgement went out
    decoded: bool = False  # its records decoded (its gaps known)
    gaps_sent: bool = False

    def holds(self, offset: int) -> bool:
        return any(a <= offset <= z for a, z in self.acquired.ranges)


@dataclass(slots=True, eq=False)
class _Chunk:
    """The records of one acquisition not handed out yet."""

    held: _Held
    records: list[Any] | Undecoded
    next: int = 0


def _implicit_batches(a: Acquired, lo: int, hi: int, overrides: dict[int, int]) -> list[Any]:
    """ACCEPT for the acquired offsets in [lo, hi), GAP for the gaps, ``overrides`` where given."""
    out = []
    gaps = a.gaps
    for x, z in a.ranges:
        s, e = max(x, lo), min(z, hi - 1)
        if s > e:
            continue
        special = [o for o in gaps if s <= o <= e] if gaps else []
        if overrides:
            special += [o for o in overrides if s <= o <= e]
        if not special:
            out.append(ack_batch(s, e, [ACCEPT]))
            continue
        types = [ACCEPT] * (e - s + 1)
        for o in gaps:
            if s <= o <= e:
                types[o - s] = GAP
        for o, t in overrides.items():
            if s <= o <= e:
                types[o - s] = t
        out.append(ack_batch(s, e, types))
    return out


class AIOShareConsumer:
    """A member of share group ``group_id`` reading ``topics``.

    ``acknowledgement_mode``: ``"implicit"`` (the records a ``getmany`` returned, or the iterator
    handed out, are accepted at the next ``getmany``, ``commit`` or ``stop``, as Kafka's
    ``KafkaShareConsumer`` does; :meth:`acknowledge` may still release or reject some) or
    ``"explicit"`` (each record is acknowledged with :meth:`acknowledge`; unlike Kafka's and
    librdkafka's consumers the next ``getmany`` does not wait for that: records stay acquired
    until acknowledged or their lock runs out). Acknowledgements go out on the next ShareFetch to
    the same broker, or at :meth:`commit`, which returns their outcome per partition.

    ``share_acquire_mode``: ``"batch_optimized"`` (whole record batches are acquired, which may be
    more records than ``max_poll_records``: they are handed out ``max_poll_records`` at a time, and
    the next batches are fetched while they are when that takes three calls or more) or
    ``"record_limit"`` (never more records acquired than ``max_poll_records`` per fetch, and nothing
    fetched ahead: a slow consumer holds no lock it does not need), as Kafka's
    ``share.acquire.mode``.

    Security options as aiokafka's: ``security_protocol`` (PLAINTEXT, SSL, SASL_PLAINTEXT,
    SASL_SSL), ``ssl_context`` (a default context for SSL without one), ``sasl_mechanism`` (PLAIN,
    SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER), ``sasl_plain_username`` / ``sasl_plain_password``,
    ``sasl_oauth_token_provider`` (OAUTHBEARER: an object whose ``token()`` coroutine returns the
    token, as aiokafka's ``AbstractTokenProvider``; awaited at every authentication, that is on every
    new connection; its ``extensions()``, if any, are sent as SASL extensions).
    """

    def __init__(
        self,
        *topics: str,
        bootstrap_servers: str | Iterable[str] = "localhost:9092",
        group_id: str,
        client_id: str = "kshare-aio-share-consumer",
        acknowledgement_mode: Literal["implicit", "explicit"] = "implicit",
        max_poll_records: int = 500,
        share_acquire_mode: Literal["batch_optimized", "record_limit"] = "batch_optimized",
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
        sasl_oauth_token_provider: Any = None,
    ) -> None:
        if not group_id:
            raise ValueError("group_id is required: a share consumer is a member of a share group")
        if acknowledgement_mode not in ("implicit", "explicit"):
            raise ValueError(f"acknowledgement_mode must be 'implicit' or 'explicit', not {acknowledgement_mode!r}")
        if max_poll_records < 1:
            raise ValueError("max_poll_records must be at least 1")
        if share_acquire_mode not in ("batch_optimized", "record_limit"):
            raise ValueError(f"share_acquire_mode must be 'batch_optimized' or 'record_limit', not {share_acquire_mode!r}")
        self._ahead = share_acquire_mode == "batch_optimized"  # whole batches, fetched ahead
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
                                   sasl_plain_password, sasl_oauth_token_provider)
        self._topics: list[str] = list(dict.fromkeys(topics))
        self._member: ShareMember | None = None
        self._held: list[_Held] = []
        self._index: dict[tuple[str, int], list[_Held]] = {}
        self._renews: list[tuple[_Held, int]] = []
        self._chunks: deque[_Chunk] = deque()  # records fetched, not handed out yet
        self._unsent: list[Ack] = []  # acknowledgements due, waiting for a request to ride on
        self._unsent_since = 0.0
        self._last_due = 0.0
        self._ack_task: asyncio.Task | None = None
        self._prefetch: asyncio.Task | None = None  # a fetch under way (its records not taken in yet)
        self._taken = 0  # records not handed out when the last fetch's were taken in (theirs included)
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
                                   decoder=Undecoded, acquire_mode=BATCH_OPTIMIZED if self._ahead else RECORD_LIMIT)
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
                await self._drop_prefetch()
                await self._send_due(member)
        finally:
            self._chunks.clear()
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
        await self._drop_prefetch()
        self._chunks.clear()  # not handed out: the leave releases them
        await self._send_due(m)
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
        records handed out before are accepted now (on the next ShareFetch, or within
        ``ACK_LINGER_S`` in a ShareAcknowledge of their own while fetched records remain)."""
        if partitions:
            raise TypeError("a share consumer reads the partitions the group assigns: getmany() takes none")
        member = self._ready()
        await self._settle_membership()
        limit = max_records or self._max_poll_records
        self._due()
        if not self._chunks:
            await self._fetch(limit, timeout_ms, member)
        out = self._hand_out(limit)
        self._linger()
        return out

    async def _drop_prefetch(self) -> None:
        """Wait for the fetch under way (its acknowledgements' outcomes reported); its records are
        not handed out (the leave releases them)."""
        task, self._prefetch = self._prefetch, None
        if task is None:
            return
        try:
            _, outcomes = await task
            await self._report(outcomes)
        except Exception as exc:  # noqa: BLE001 - leaving anyway
            log.debug("the fetch under way failed: %r", exc)

    async def getone(self) -> ShareConsumerRecord:
        """The next record (waiting as long as it takes); records are fetched up to
        ``max_poll_records`` at a time and handed out one by one."""
        member = self._ready()
        if self._membership is not None:
            await self._settle_membership()
        if not self._chunks:
            self._due()
            while not self._chunks:
                await self._fetch(self._max_poll_records, self._fetch_max_wait_ms, member, ahead=True)
                member = self._ready()
            self._last_due = time.monotonic()
        elif (now := time.monotonic()) - self._last_due >= ACK_LINGER_S:
            self._last_due = now
            self._due()
            self._linger()
        ch = self._chunks[0]
        if isinstance(ch.records, Undecoded):
            self._materialize(ch)
            if not ch.records:
                self._chunks.popleft()
                return await self.getone()
        r = ch.records[ch.next]
        ch.next += 1
        h = ch.held
        if ch.next == len(ch.records):
            h.delivered_to = h.end + 1
            self._chunks.popleft()
        else:
            h.delivered_to = r.offset + 1
        return r

    def __aiter__(self) -> AsyncIterator[ShareConsumerRecord]:
        return self

    async def __anext__(self) -> ShareConsumerRecord:
        try:
            return await self.getone()
        except ConsumerStoppedError:
            raise StopAsyncIteration from None

    def _hand_out(self, limit: int) -> dict[TopicPartition, list[ShareConsumerRecord]]:
        out: dict[TopicPartition, list[ShareConsumerRecord]] = {}
        chunks = self._chunks
        while chunks and limit > 0:
            ch = chunks[0]
            if isinstance(ch.records, Undecoded):
                self._materialize(ch)
                if not ch.records:
                    chunks.popleft()
                    continue
            recs, i = ch.records, ch.next
            j = min(len(recs), i + limit)
            part = recs if i == 0 and j == len(recs) else recs[i:j]
            h = ch.held
            tp = self._tp(h.acquired.topic, h.acquired.partition)
            lst = out.get(tp)
            if lst is None:
                out[tp] = part
            else:
                lst.extend(part)
            limit -= j - i
            if j == len(recs):
                h.delivered_to = h.end + 1
                chunks.popleft()
            else:
                ch.next = j
                h.delivered_to = recs[j - 1].offset + 1
        return out

    def _left(self) -> int:
        """How many records fetched are not handed out yet (their acquired offsets, for those not
        decoded yet)."""
        return sum(len(ch.records) - ch.next if not isinstance(ch.records, Undecoded) else ch.held.acquired.count
                   for ch in self._chunks)

    def _materialize(self, ch: _Chunk) -> None:
        """Decode a chunk's records (when they are first wanted); its gaps are known then."""
        u = ch.records
        assert isinstance(u, Undecoded)
        h = ch.held
        recs = self._decode(u.topic, u.partition, u.raw, u.counts)
        h.acquired.gaps = gaps_of(h.acquired.ranges, recs)
        h.decoded = True
        ch.records = recs
        if not recs:
            h.delivered_to = h.end + 1  # gaps only

    async def _fetch(self, limit: int, timeout_ms: int, member: ShareMember, ahead: bool = False) -> None:
        """Take in the records of the fetch under way, or fetch (the acknowledgements due riding
        along), until records came or ``timeout_ms`` passed. In batch-optimized mode the next fetch
        starts before the records are handed out when that takes three calls or more (or with
        ``ahead``: the iterator's records, handed out one by one). Records that take one or two
        calls are not fetched ahead: their acknowledgements ride on the next fetch, as librdkafka's
        do. A fetch ahead would hold a second fetch's locks and carry no acknowledgement, and a
        partition whose records are all locked (``group.share.partition.max.record.locks``)
        answers the fetches of the members sharing it only when their wait runs out: 100 members
        on 16 partitions read 2 million records in 20 to 30 s so, in 3 to 5 s without."""
        deadline = time.monotonic() + max(0, timeout_ms) / 1000.0
        while True:
            task = self._prefetch
            if task is None:
                task = self._prefetch = self._start_fetch(member, limit, deadline)
                await _sent()
            remaining = deadline - time.monotonic()
            if not task.done():
                await asyncio.wait({task}, timeout=max(0.0, remaining))
                if not task.done():
                    return  # still under way: the next call takes it
            self._prefetch = None
            pairs, outcomes = task.result()
            if outcomes:
                await self._report(outcomes)
            self._take_in(pairs)
            if member.failure is not None:
                raise member.failure
            if self._chunks:
                if self._ahead and (ahead or self._taken > 2 * limit):
                    self._prefetch = self._start_fetch(member, limit, None)
                    await _sent()
                return
            if time.monotonic() >= deadline:
                return

    def _start_fetch(self, member: ShareMember, limit: int, deadline: float | None) -> asyncio.Task:
        """A fetch carrying the acknowledgements due (and renewals first), waiting at most
        ``fetch_max_wait_ms`` (and not past ``deadline``) for records."""
        self._due()
        acks, self._unsent = self._unsent, []
        renews = self._collect_renews()
        wait_s = self._fetch_max_wait_ms / 1000.0
        if deadline is not None:
            wait_s = max(0.0, min(wait_s, deadline - time.monotonic()))
        return asyncio.get_running_loop().create_task(self._fetch_once(member, limit, wait_s, acks, renews))

    async def _fetch_once(self, member: ShareMember, limit: int, wait_s: float, acks: list[Ack],
                          renews: list[Ack]) -> tuple[list[tuple[Acquired, Any]], Outcomes]:
        await self._flush_background()
        outcomes: Outcomes = {}
        if renews:
            outcomes.update(await member.send_acks(renews, renew=True))
        if not member.assignment:
            if acks:  # no partition to fetch (yet, or any more): acknowledge on their own
                for key, code in (await member.send_acks(acks)).items():
                    if not outcomes.get(key):
                        outcomes[key] = code
            await member.wait_assigned(wait_s)
            return [], outcomes
        pairs, more = await member.poll_grouped(limit, int(wait_s * 1000), acks)
        for key, code in more.items():
            if not outcomes.get(key):
                outcomes[key] = code
        return pairs, outcomes

    # -- acknowledgements -------------------------------------------------------------------------
    def acknowledge(self, record: Any, type: AcknowledgeType = "accept") -> None:  # noqa: A002 - Kafka's word
        """Acknowledge ``record`` (a record this consumer handed out): ``"accept"`` (processed),
        ``"release"`` (deliver again, to any member), ``"reject"`` (never deliver again) or
        ``"renew"`` (extend its lock, where the cluster allows it: Kafka 4.2+ ShareAcknowledge v2,
        and kshare). Sent with the next ``getmany`` or ``commit``. In implicit mode this overrides
        the implicit ACCEPT of a record not yet accepted. Raises ``IllegalStateError`` for a record
        not held (acknowledged already, or not from this consumer)."""
        try:
            ack_type = ACK_TYPES[type]
        except KeyError:
            raise ValueError(f"acknowledgement type must be one of {', '.join(ACK_TYPES)}, not {type!r}") from None
        if self._closed:
            raise ConsumerStoppedError()
        topic, partition, offset = record.topic, record.partition, record.offset
        h = self._held_for(topic, partition, offset)
        if h is None or offset in h.acquired.gaps or offset >= h.delivered_to:
            raise IllegalStateError(f"{topic}-{partition} offset {offset} is not held by this consumer "
                                    "(acknowledged already, or its session was lost)")
        if offset in h.acks or offset in h.sent or (not self._explicit and offset < h.acked_to):
            raise IllegalStateError(f"{topic}-{partition} offset {offset} is acknowledged already")
        if ack_type == RENEW:
            self._renews.append((h, offset))
        else:
            h.acks[offset] = ack_type

    async def commit(self) -> AcknowledgementOutcomes:
        """Send the acknowledgements due now (implicit mode: the records handed out so far are
        accepted) in ShareAcknowledge requests; their outcome per partition."""
        member = self._ready()
        await self._settle_membership()
        return await self._send_due(member)

    def set_acknowledgement_callback(self, callback: Callable[[AcknowledgementOutcomes], Any] | None) -> None:
        """``callback(outcomes)`` after every answer to acknowledgements (those that rode on a
        ShareFetch too); may be a coroutine function."""
        self._callback = callback

    async def _send_due(self, member: ShareMember) -> AcknowledgementOutcomes:
        await self._flush_background()
        self._due()
        acks, self._unsent = self._unsent, []
        outcomes: Outcomes = {}
        renews = self._collect_renews()
        if renews:
            outcomes.update(await member.send_acks(renews, renew=True))
        if acks:
            for key, code in (await member.send_acks(acks)).items():
                if not outcomes.get(key):
                    outcomes[key] = code
        return await self._report(outcomes)

    def _due(self) -> None:
        """Move the acknowledgements due now to the ones waiting to be sent."""
        acks = self._collect()
        if acks:
            if not self._unsent:
                self._unsent_since = time.monotonic()
            self._unsent += acks

    def _linger(self) -> None:
        """Acknowledgements due for ``ACK_LINGER_S`` with no ShareFetch to ride on go on their own."""
        if (self._unsent and (self._ack_task is None or self._ack_task.done())
                and time.monotonic() - self._unsent_since >= ACK_LINGER_S and self._member is not None):
            acks, self._unsent = self._unsent, []
            self._ack_task = asyncio.get_running_loop().create_task(self._send_in_background(self._member, acks))

    async def _send_in_background(self, member: ShareMember, acks: list[Ack]) -> None:
        try:
            await self._report(await member.send_acks(acks))
        except Exception as exc:  # noqa: BLE001 - the outcome is lost, the records come back
            log.warning("acknowledging %d batch(es) failed: %r", len(acks), exc)

    async def _flush_background(self) -> None:
        task, self._ack_task = self._ack_task, None
        if task is not None:
            await task

    def _take_in(self, pairs: list[tuple[Acquired, Any]]) -> None:
        self._taken = self._left() + sum(a.count for a, _ in pairs)
        for a, recs in pairs:
            first = a.ranges[0][0]
            h = _Held(a, a.ranges[-1][1], first, first)
            self._held.append(h)
            self._index.setdefault((a.topic, a.partition), []).append(h)
            if isinstance(recs, Undecoded) or recs:
                self._chunks.append(_Chunk(h, recs))
                h.decoded = not isinstance(recs, Undecoded)
            else:
                h.delivered_to = h.end + 1  # gaps only
                h.decoded = True

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
        explicit = self._explicit
        for h in self._held:
            a = h.acquired
            if not explicit:
                if h.delivered_to > h.acked_to:
                    out.append(Ack(a, _implicit_batches(a, h.acked_to, h.delivered_to, h.acks)))
                    h.acked_to = h.delivered_to
                    if h.acks:
                        h.acks = {}
                done = h.acked_to > h.end
            else:
                types: dict[int, int] = {}
                if not h.gaps_sent and h.decoded:
                    if a.gaps:
                        types = dict.fromkeys(a.gaps, GAP)
                    h.gaps_sent = True
                if h.acks:
                    types.update(h.acks)
                    h.acks = {}
                if types:
                    out.append(Ack(a, ack_batches(types)))
                    h.sent.update(types)
                done = len(h.sent) >= a.count
            if not done and (member is None or member.live(a)):
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
            if o not in h.sent and o not in h.acks and (self._explicit or o >= h.acked_to):
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
        """The records at the acquired offsets, with their delivery counts (the garbage collector
        paused meanwhile: thousands of new tuples would start it again and again, for nothing)."""
        if not raw:
            return []
        if gc.isenabled():
            gc.disable()
            try:
                return self._decode_records(topic, partition, raw, counts)
            finally:
                gc.enable()
        return self._decode_records(topic, partition, raw, counts)

    def _decode_records(self, topic: str, partition: int, raw: Any,
                        counts: list[tuple[int, int, int]]) -> list[ShareConsumerRecord]:
        out = decode_records(topic, partition, raw, counts)
        kd, vd = self._key_deserializer, self._value_deserializer
        if kd is not None or vd is not None:
            new, rec = _new, ShareConsumerRecord
            out = [new(rec, (*r[:5], r[5] if kd is None else kd(r[5]), r[6] if vd is None else vd(r[6]), *r[7:]))
                   for r in out]
        return out


async def _sent() -> None:
    """Let a fetch just started write its request (a task per broker when there are several)
    before the records at hand are decoded and handed out: the broker works on the next records
    meanwhile."""
    await asyncio.sleep(0)
    await asyncio.sleep(0)


def _security(protocol: str, context: ssl.SSLContext | None, mechanism: str, username: str | None,
              password: str | None, token_provider: Any = None) -> ClientSecurity | None:
    protocol = protocol.upper()
    if protocol not in ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"):
        raise ValueError(f"security_protocol must be PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL, not {protocol!r}")
    tls = None
    if protocol in ("SSL", "SASL_SSL"):
        tls = context if context is not None else ssl.create_default_context()
    if not protocol.startswith("SASL_"):
        return ClientSecurity(ssl=tls) if tls is not None else None
    mechanism = mechanism.upper()
    if mechanism not in MECHANISMS:
        raise ValueError(f"sasl_mechanism must be PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER, not {mechanism!r}")
    if mechanism == "OAUTHBEARER":
        if not callable(getattr(token_provider, "token", None)):
            raise ValueError("SASL OAUTHBEARER needs sasl_oauth_token_provider: an object with an async token() "
                             "method (aiokafka.abc.AbstractTokenProvider)")
        return ClientSecurity(ssl=tls, sasl_mechanism=mechanism, oauth_token_provider=token_provider)
    if username is None or password is None:
        raise ValueError(f"SASL {mechanism} needs sasl_plain_username and sasl_plain_password")
    return ClientSecurity(ssl=tls, sasl_mechanism=mechanism, username=username, password=password)
