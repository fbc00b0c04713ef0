"""The state topic's producer: pipelined Produce requests on the proxy's own connections.

Why not aiokafka's producer: it keeps one Produce request per broker in flight, so a state write
that comes while one is out waits for that round trip and then its own; with 16 members
acknowledging at once the writes queued 4-9 ms behind each other (docs/reference/state-format.md, Writing).
Here every batch goes out at once, on one connection per broker: Kafka handles a connection's
requests one at a time in order, so a partition's batches are appended in the order they were
sent, however many are in flight, and the idempotent producer's sequence numbers follow each
other without gaps.

Semantics the store relies on (kshare.share.state.topic_store): ``send`` gives a future that resolves
to the record's offset once the broker acknowledged it (acks=all) or fails; records sent in one
turn of the event loop go out together, one batch per partition.

Leader moves (a rolling restart, an election, a broker killed) are ridden through: a batch the
broker answered with an error that says it did not append it (NOT_LEADER_OR_FOLLOWER, a fenced or
unknown leader epoch, NOT_ENOUGH_REPLICAS), or, from an idempotent producer, one whose connection
was lost or whose answer timed out, is sent again as it was (same producer id and sequence
numbers) to the partition's new leader, once every earlier request to that partition has been
answered, and before anything queued for that partition since; for up to ``retry_timeout_s``.
Likewise what is queued for a partition whose requests in flight went to another node than the
one the metadata names now waits for their answers, to go behind those of them refused: a batch
reaching the new leader before an earlier one is refused for its sequence number, for good.
Any other failure fails the futures of that request: the store rolls back and renews the
producer (a new producer id, sequences from 0, so nothing after a failed batch can be appended
with a gap).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from ...clients.connection import KafkaConnection
from ...protocol import messages
from ...protocol.codes import ApiKey
from ...security import ClientSecurity
from ..errors import ErrorCode
from ..tasks import shared_task

log = logging.getLogger("kshare.share")

PRODUCE = ApiKey.PRODUCE.value  # plain ints: PRODUCE is asked for every batch of state records
METADATA = ApiKey.METADATA.value
LIST_OFFSETS = ApiKey.LIST_OFFSETS.value
INIT_PRODUCER_ID = ApiKey.INIT_PRODUCER_ID.value
# A batch (key and value bytes) up to this size, well within the default max.message.bytes (1 MB);
# a request up to MAX_REQUEST_BYTES.
MAX_BATCH_BYTES = 512 << 10
MAX_REQUEST_BYTES = 1 << 20

RETRY_FIRST_S = 0.05
RETRY_MAX_S = 1.0
_COORDINATOR_NOT_READY = frozenset(
    {ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.NOT_COORDINATOR})
_NOT_LEADER = {6, 74, 75}  # NOT_LEADER_OR_FOLLOWER, FENCED/UNKNOWN_LEADER_EPOCH: ask Metadata again
# errors with which the broker refused a batch before appending it: sending it again is safe
_NOT_APPENDED = _NOT_LEADER | {19}  # and NOT_ENOUGH_REPLICAS (checked before the append)


class RecordMetadata(NamedTuple):
    offset: int


class StateProduceError(Exception):
    def __init__(self, message: str, error_code: int = -1) -> None:
        super().__init__(message)
        self.error_code = error_code


class PipelinedProducer:
    """Writes to one topic's partitions with acks=all, idempotent when ``idempotent``."""

    def __init__(self, bootstrap_servers: Sequence[str], topic: str, *, idempotent: bool = True,
                 security: ClientSecurity | None = None, client_id: str = "kshare-state",
                 request_timeout_s: float = 30.0, retry_timeout_s: float = 20.0,
                 on_resend: Callable[[], None] | None = None, claims: bool = False) -> None:
        self.bootstrap_servers = list(bootstrap_servers)
        self.topic = topic
        self.idempotent = idempotent
        self.security = security
        self.client_id = client_id
        self.request_timeout_s = request_timeout_s
        self.producer_id = -1
        self.producer_epoch = -1
        # An instance group's store: no producer id of its own; each claimed partition is written
        # with the producer id and epoch of its claim (:meth:`assign`, kshare.share.state.fence)
        self.claims = claims
        self._ids: dict[int, tuple[int, int]] = {}
        self._sequence: dict[int, int] = {}
        self._leaders: dict[int, int] = {}  # partition -> node id
        self._brokers: dict[int, tuple[str, int]] = {}
        self._conns: dict[int, KafkaConnection] = {}
        self._connecting: dict[int, asyncio.Task] = {}
        self._pending: dict[int, list[tuple[bytes | None, bytes | None, asyncio.Future]]] = {}
        self._scheduled = False
        self._in_flight: set[asyncio.Future] = set()  # routing tasks and requests awaiting an answer
        self._routing = 0  # _send_all tasks not done: while any, batches queue behind them
        self._order = asyncio.Lock()
        self._stale_metadata = True
        self._closed = False
        # riding through leader moves: requests in flight per partition, the batches to send again
        # (sequence, bytes, records, first failure time) and what was queued meanwhile, per partition
        self.retry_timeout_s = retry_timeout_s
        self._in_flight_parts: dict[int, int] = {}
        self._in_flight_to: dict[int, int] = {}  # partition -> the node its requests in flight went to
        self._held_at: dict[int, float] = {}  # partition -> when it began holding with nothing refused yet
        self._resend: dict[int, list[tuple[int, bytes, list, float]]] = {}
        self._held: dict[int, list] = {}
        self._resending: asyncio.Task | None = None
        self._on_resend = on_resend  # called for each batch sent again (a metric)

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        conn = await self._bootstrap()
        try:
            # a state topic just created may have partitions without a leader for a moment
            deadline = time.monotonic() + self.request_timeout_s
            await self._refresh(conn)
            while not await self._leaders_answer() and time.monotonic() < deadline:
                await asyncio.sleep(RETRY_FIRST_S)
                await self._refresh(conn)
            if self.idempotent and not self.claims:
                Req = messages.message_class("InitProducerIdRequest")
                version = conn.best_version(INIT_PRODUCER_ID, hi=4)
                deadline = time.monotonic() + self.request_timeout_s
                delay = RETRY_FIRST_S
                while True:
                    resp = await asyncio.wait_for(conn.request(INIT_PRODUCER_ID, version, Req(
                        transactional_id=None, transaction_timeout_ms=60_000, producer_id=-1, producer_epoch=-1)),
                        self.request_timeout_s)
                    # a broker just started is still loading (or creating) its transaction state:
                    # ask again, as Kafka's own producer does, instead of giving up idempotence
                    if resp.error_code not in _COORDINATOR_NOT_READY or time.monotonic() + delay > deadline:
                        break
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, RETRY_MAX_S)
                if resp.error_code:
                    raise StateProduceError(f"InitProducerId refused: error code {resp.error_code}", resp.error_code)
                self.producer_id, self.producer_epoch = resp.producer_id, resp.producer_epoch
        finally:
            await conn.close()

    async def stop(self) -> None:
        """Send what is queued, wait for what is in flight, disconnect."""
        if self._pending:
            self._flush()
        deadline = time.monotonic() + self.request_timeout_s
        while self._in_flight and time.monotonic() < deadline:  # routing tasks add requests as they go
            await asyncio.wait(list(self._in_flight), timeout=max(0.0, deadline - time.monotonic()))
        self._closed = True
        for conn in self._conns.values():
            await conn.close()
        self._conns.clear()

    def assign(self, partition: int, producer_id: int, producer_epoch: int) -> None:
        """Write ``partition`` with this producer id and epoch from now on, sequences from 0 (a
        claim; nothing of the partition may be queued or in flight)."""
        self._ids[partition] = (producer_id, producer_epoch)
        self._sequence[partition] = 0

    def release(self, partition: int) -> None:
        """``partition`` is written no more under its claim."""
        self._ids.pop(partition, None)
        self._sequence.pop(partition, None)

    # -- sending --------------------------------------------------------------------------------
    async def send(self, topic: str, value: bytes | None = None, key: bytes | None = None, *,
                   partition: int) -> asyncio.Future:
        """Queue a record; the returned future gets its RecordMetadata (or the failure)."""
        return self.enqueue(topic, value, key, partition=partition)

    def enqueue(self, topic: str, value: bytes | None = None, key: bytes | None = None, *,
                partition: int) -> asyncio.Future:
        """``send`` without the coroutine: queue a record for this turn of the event loop's batch."""
        if self._closed:
            raise StateProduceError("the state producer is stopped")
        if topic != self.topic:
            raise ValueError(f"this producer writes to {self.topic}, not {topic}")
        size = len(key or b"") + len(value or b"")
        if size > MAX_REQUEST_BYTES:
            # refused here, before it takes a sequence number: the records after it still land
            raise StateProduceError(f"a state record of {size} bytes is larger than {MAX_REQUEST_BYTES}")
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._pending.setdefault(partition, []).append((key, value, fut))
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        return fut

    def flush(self) -> None:
        """Send what is queued now instead of at the end of this turn of the event loop (a caller
        that queued a whole round saves the loop a turn)."""
        if self._pending:
            self._flush()

    def _flush(self) -> None:
        """Everything queued: one batch per partition, one request per broker (or per
        MAX_BATCH_BYTES of them). Written at once when the leaders and their connections are
        known and no earlier batch is still finding its way; otherwise a task finds them first."""
        self._scheduled = False
        pending, self._pending = self._pending, {}
        if self._routing == 0:
            # After what is sent again, in order. Only while no routing task waits with earlier
            # records: those would otherwise be written after these (given later sequence numbers
            # under a new leader, they land after them) -- the task diverts them itself, in turn.
            for p in [p for p in pending if p in self._resend]:
                self._held.setdefault(p, []).extend(pending.pop(p))
            if not pending:
                return
            by_node = self._known_routes(pending)
            if by_node is not None:
                self._write(pending, by_node)
                return
        self._routing += 1
        task = asyncio.get_running_loop().create_task(self._send_all(pending))
        self._in_flight.add(task)
        task.add_done_callback(self._routed)

    def _routed(self, task: asyncio.Task) -> None:
        self._routing -= 1
        self._in_flight.discard(task)

    def _known_routes(self, pending: dict[int, list]) -> dict[int, list[int]] | None:
        """The partitions by leader, if every leader and its connection are at hand (else None)."""
        if self._stale_metadata:
            return None
        by_node: dict[int, list[int]] = {}
        for p in sorted(pending):
            node = self._leaders.get(p, -1)
            conn = self._conns.get(node)
            if conn is None or conn.closed:
                return None
            by_node.setdefault(node, []).append(p)
        return by_node

    async def _send_all(self, pending: dict[int, list]) -> None:
        # In the order of the calls (the lock is fair): find the leaders (which may wait for
        # Metadata or a connection), then give every batch its sequence numbers and write its
        # request without yielding, so a partition's batches reach its broker in sequence order.
        # (_flush writes without this task only while no such task exists.)
        async with self._order:
            # a partition with batches to send again since this was queued: behind them
            for p in [p for p in pending if p in self._resend]:
                self._held.setdefault(p, []).extend(pending.pop(p))
            if not pending:
                return
            # Until the request timeout, a cluster that cannot be reached (a broker restarting, a
            # leader being elected) is asked again: nothing was sent, nothing is lost by waiting.
            deadline = time.monotonic() + self.request_timeout_s
            delay = RETRY_FIRST_S
            while True:
                try:
                    by_node = await self._route(pending)
                    break
                except Exception as exc:  # noqa: BLE001 - retried, then reported to every caller
                    self._stale_metadata = True
                    if self._closed or time.monotonic() + delay > deadline:
                        _fail_all(pending.values(), StateProduceError(f"no leader for the state topic: {exc!r}"))
                        return
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, RETRY_MAX_S)
            self._write(pending, by_node)

    def _write(self, pending: dict[int, list], by_node: dict[int, list[int]]) -> None:
        """Give every batch its sequence numbers and write the requests (without yielding).

        A partition with batches to send again, or with requests in flight to another node than
        its leader now (the metadata changed since they went; they will be refused), is held
        instead, to go after them: written now, a batch would reach the new leader before the
        earlier ones and be refused for its sequence (OUT_OF_ORDER_SEQUENCE_NUMBER, which fails
        it and every batch after it)."""
        for node, parts in by_node.items():
            if any(p in self._resend or self._in_flight_to.get(p, node) != node for p in parts):
                parts = [p for p in parts if not self._hold(p, pending[p], node)]
                if not parts:
                    continue
            conn = self._conns[node]
            # Kafka takes one batch per partition per request: a partition with more than
            # MAX_BATCH_BYTES queued sends several requests, each with its next batch
            chunks = [_chunks(pending[p]) for p in parts]
            while any(chunks):
                batch: list[tuple[int, bytes, list]] = []
                size = 0
                for p, left in zip(parts, chunks, strict=True):
                    if left:
                        chunk = left.pop(0)
                        data = self._batch(p, chunk)
                        if batch and size + len(data) > MAX_REQUEST_BYTES:
                            self._produce(conn, batch)
                            batch, size = [], 0
                        batch.append((p, data, chunk))
                        size += len(data)
                if batch:
                    self._produce(conn, batch)

    def _hold(self, partition: int, recs: list, node: int) -> bool:
        """Hold ``recs`` behind what of ``partition`` is to be sent again or still in flight to
        another node than ``node``; False if nothing keeps it from being written now."""
        if partition not in self._resend:
            if self._in_flight_to.get(partition, node) == node:
                return False
            # sent again (behind whatever of the requests in flight is refused) once they are answered
            self._resend[partition] = []
            self._held_at.setdefault(partition, time.monotonic())
            self._ensure_resending()
        self._held.setdefault(partition, []).extend(recs)
        return True

    def _produce(self, conn: KafkaConnection, batch: list[tuple[int, bytes, list]]) -> None:
        """Write one Produce request; its answer settles the records' futures (a callback, not a
        task: one turn of the event loop fewer between the broker's answer and the callers)."""
        Req = messages.message_class("ProduceRequest")
        req = Req(transactional_id=None, acks=-1, timeout_ms=int(self.request_timeout_s * 1000), topic_data=[
            Req.TopicProduceData(name=self.topic, partition_data=[
                Req.PartitionProduceData(index=p, records=data) for p, data, _ in batch])])
        where = f"{conn.host}:{conn.port}"
        settled = False

        def settle(f: asyncio.Future) -> None:  # at the answer (on_answer), or when timed out
            nonlocal settled
            if not settled:
                settled = True
                self._settle(f, batch, where, timer)

        try:
            fut = conn.send(PRODUCE, conn.best_version(PRODUCE, hi=9), req, on_answer=settle)
        except Exception as exc:  # noqa: BLE001 - closed meanwhile
            self._stale_metadata = True
            _fail_all((recs for _, _, recs in batch), StateProduceError(f"state produce not sent: {exc!r}"))
            return
        node = self._node_of(conn)
        for p, _, _ in batch:
            self._in_flight_parts[p] = self._in_flight_parts.get(p, 0) + 1
            self._in_flight_to[p] = node
        timer = asyncio.get_running_loop().call_later(self.request_timeout_s, self._timed_out, fut)
        self._in_flight.add(fut)
        fut.add_done_callback(settle)

    @staticmethod
    def _timed_out(fut: asyncio.Future) -> None:
        if not fut.done():
            fut.cancel()  # settled as a failure by its callback (a late answer is dropped)

    def _settle(self, fut: asyncio.Future, batch: list, where: str, timer: asyncio.TimerHandle) -> None:
        timer.cancel()
        self._in_flight.discard(fut)
        for p, _, _ in batch:
            left = self._in_flight_parts.get(p, 0) - 1
            if left > 0:
                self._in_flight_parts[p] = left
            else:
                self._in_flight_parts.pop(p, None)
                self._in_flight_to.pop(p, None)
        if fut.cancelled() or fut.exception() is not None:
            # The connection failed (a broker killed) or the request timed out: the batches may or
            # may not have landed. With an idempotent producer they are sent again as they were:
            # a batch the new leader has already is a duplicate it acknowledges without appending
            # (Kafka remembers a producer's last five batches per partition; past those it answers
            # OUT_OF_ORDER_SEQUENCE_NUMBER, and the records fail as before).
            exc = fut.exception() if not fut.cancelled() else TimeoutError(f"no answer within {self.request_timeout_s} s")
            self._stale_metadata = True
            failed = [(p, data, recs) for p, data, recs in batch
                      if not (self.idempotent and self._send_again(p, data, recs, ErrorCode.NETWORK_EXCEPTION))]
            _fail_all((recs for _, _, recs in failed), StateProduceError(f"state produce to {where} failed: {exc!r}"))
            return
        resp = fut.result()
        answers = {pr.index: pr for t in resp.responses for pr in t.partition_responses}
        for p, data, recs in batch:
            pr = answers.get(p)
            if pr is None:
                _fail_all([recs], StateProduceError(f"no answer for partition {p}"))
            elif pr.error_code:
                if pr.error_code in _NOT_LEADER:
                    self._stale_metadata = True
                if pr.error_code in _NOT_APPENDED and self._send_again(p, data, recs, pr.error_code):
                    continue
                _fail_all([recs], StateProduceError(
                    f"partition {p}: error code {pr.error_code} {pr.error_message or ''}".strip(), pr.error_code))
            else:
                for i, (_, _, f) in enumerate(recs):
                    if not f.done():
                        f.set_result(RecordMetadata(pr.base_offset + i))

    # -- sending again after a leader move ----------------------------------------------------------
    def _send_again(self, partition: int, data: bytes, recs: list, code: int) -> bool:
        """Keep a batch the broker refused before appending it, to send again; False once its
        partition has been failing for longer than ``retry_timeout_s`` (then it fails)."""
        now = time.monotonic()
        queue = self._resend.setdefault(partition, [])
        first = min((t for *_, t in queue), default=now)
        if self._closed or now - first > self.retry_timeout_s:
            if not queue and partition not in self._held:
                del self._resend[partition]
            return False
        queue.append((_base_sequence(data), data, recs, first))
        self._ensure_resending()
        log.debug("state topic %s partition %d: batch refused with error code %d; sending it again to the "
                  "new leader", self.topic, partition, code)
        return True

    def _ensure_resending(self) -> None:
        if self._resending is None or self._resending.done():
            self._resending = asyncio.get_running_loop().create_task(self._resend_all())
            self._in_flight.add(self._resending)
            self._resending.add_done_callback(self._in_flight.discard)

    async def _resend_all(self) -> None:
        """Once every earlier request to them has been answered, send the refused batches again in
        sequence order, then what was held back behind them (their leaders are asked again first)."""
        delay = RETRY_FIRST_S
        while self._resend and not self._closed:
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)
            ready = [p for p in self._resend if not self._in_flight_parts.get(p)]
            if not ready:
                continue
            async with self._order:
                self._stale_metadata = True
                try:
                    by_node = await self._route({p: [] for p in ready})
                except Exception as exc:  # noqa: BLE001 - no leader yet: try again, within the limit
                    log.debug("state topic %s: no leader to send again to yet: %r", self.topic, exc)
                    self._expire(time.monotonic())
                    continue
                for node, parts in by_node.items():
                    conn = self._conns[node]
                    for p in parts:
                        self._held_at.pop(p, None)
                        for _, data, recs, _ in sorted(self._resend.pop(p, []), key=lambda b: b[0]):
                            if self._on_resend is not None:
                                self._on_resend()
                            self._produce(conn, [(p, data, recs)])
                    # what was queued behind them, for every node's partitions: a partition no
                    # longer waiting to send again is never held again, so what stayed held here
                    # would wait for its partition's next refused batch (the next leader move,
                    # seconds away or never), and every write of its share-partitions with it
                    held = {p: self._held.pop(p) for p in parts if p in self._held}
                    if held:
                        self._write(held, {node: sorted(held)})
            delay = RETRY_FIRST_S

    def _expire(self, now: float) -> None:
        """Fail what has waited for a leader longer than ``retry_timeout_s`` (held records too)."""
        for p in [p for p, q in self._resend.items()
                  if now - min((t for *_, t in q), default=self._held_at.get(p, now)) > self.retry_timeout_s]:
            self._held_at.pop(p, None)
            exc = StateProduceError(f"partition {p}: no leader took the batch within {self.retry_timeout_s:.0f} s")
            _fail_all([recs for _, _, recs, _ in self._resend.pop(p)], exc)
            _fail_all([self._held.pop(p, [])], exc)

    async def _route(self, pending: dict[int, list]) -> dict[int, list[int]]:
        if self._stale_metadata or any(p not in self._leaders for p in pending):
            conn = await self._bootstrap()
            try:
                await self._refresh(conn)
            finally:
                await conn.close()
        by_node: dict[int, list[int]] = {}
        for p in sorted(pending):
            node = self._leaders.get(p, -1)
            if node < 0:
                raise StateProduceError(f"partition {p} of {self.topic} has no leader")
            by_node.setdefault(node, []).append(p)
        for node in by_node:
            if node not in self._conns or self._conns[node].closed:
                await self._connect(node)
        return by_node

    def _batch(self, partition: int, recs: list) -> bytes:
        from aiokafka.record.default_records import DefaultRecordBatchBuilder

        seq = self._sequence.get(partition, 0) if self.idempotent else -1
        producer_id, producer_epoch = self._ids.get(partition, (self.producer_id, self.producer_epoch))
        builder = DefaultRecordBatchBuilder(
            magic=2, compression_type=0, is_transactional=0, producer_id=producer_id,
            producer_epoch=producer_epoch, base_sequence=seq, batch_size=1 << 30)
        now = int(time.time() * 1000)
        for i, (key, value, _) in enumerate(recs):
            builder.append(i, timestamp=now, key=key, value=value, headers=[])
        if self.idempotent:
            self._sequence[partition] = (seq + len(recs)) & 0x7FFFFFFF
        return bytes(builder.build())

    # -- cluster --------------------------------------------------------------------------------
    async def _bootstrap(self) -> KafkaConnection:
        last: Exception | None = None
        for server in self.bootstrap_servers:
            host, _, port = server.rpartition(":")
            try:
                return await KafkaConnection.open(host, int(port), f"{self.client_id}-meta",
                                                  timeout=self.request_timeout_s, security=self.security)
            except Exception as exc:  # noqa: BLE001 - try the next one
                last = exc
        raise StateProduceError(f"cannot reach the cluster at {','.join(self.bootstrap_servers)}: {last!r}")

    async def _refresh(self, conn: KafkaConnection) -> None:
        Req = messages.message_class("MetadataRequest")
        version = conn.best_version(METADATA, hi=12)
        topic = Req.MetadataRequestTopic(name=self.topic)
        if version >= 10:
            topic.topic_id = b"\x00" * 16
        resp = await asyncio.wait_for(conn.request(METADATA, version, Req(topics=[topic])), self.request_timeout_s)
        self._brokers = {b.node_id: (b.host, b.port) for b in resp.brokers}
        for t in resp.topics:
            if t.name == self.topic:
                for part in t.partitions:
                    self._leaders[part.partition_index] = part.leader_id if not part.error_code else -1
        self._stale_metadata = False

    async def _leaders_answer(self) -> bool:
        """Whether every partition's leader, as Metadata names it, answers as the leader (a broker
        named leader of a partition just created may still say NOT_LEADER_OR_FOLLOWER for a moment:
        the first writes would fail)."""
        if not self._leaders or any(leader < 0 for leader in self._leaders.values()):
            return False
        Req = messages.message_class("ListOffsetsRequest")
        for node in set(self._leaders.values()):
            parts = [p for p, n in self._leaders.items() if n == node]
            try:
                await self._connect(node)
                conn = self._conns[node]
                req = Req(replica_id=-1, isolation_level=0, topics=[Req.ListOffsetsTopic(name=self.topic, partitions=[
                    Req.ListOffsetsPartition(partition_index=p, timestamp=-1, current_leader_epoch=-1)
                    for p in parts])])
                resp = await asyncio.wait_for(conn.request(LIST_OFFSETS, conn.best_version(LIST_OFFSETS, lo=1, hi=7),
                                                           req), self.request_timeout_s)
            except (OSError, ConnectionError, TimeoutError, KeyError):  # KeyError: a leader Metadata did not list
                return False
            if any(p.error_code for t in resp.topics for p in t.partitions):
                return False
        return True

    def _node_of(self, conn: KafkaConnection) -> int:
        for node, c in self._conns.items():
            if c is conn:
                return node
        return -1

    async def _connect(self, node: int) -> None:
        task = self._connecting.get(node)
        if task is None:
            host, port = self._brokers[node]
            task = shared_task(KafkaConnection.open(host, port, self.client_id, timeout=self.request_timeout_s,
                                                    security=self.security))
            self._connecting[node] = task
        try:
            conn = await asyncio.shield(task)
        finally:
            self._connecting.pop(node, None)
        old = self._conns.get(node)
        if old is not None and old is not conn:
            await old.close()
        self._conns[node] = conn


def _base_sequence(batch: bytes) -> int:
    """The base sequence of a record batch (v2 header: offset 53)."""
    return int.from_bytes(batch[53:57], "big", signed=True)


def _chunks(recs: list) -> list[list]:
    """A partition's queued records in batches of at most MAX_BATCH_BYTES of keys and values."""
    out: list[list] = [[]]
    size = 0
    for rec in recs:
        n = len(rec[0] or b"") + len(rec[1] or b"") + 32
        if out[-1] and size + n > MAX_BATCH_BYTES:
            out.append([])
            size = 0
        out[-1].append(rec)
        size += n
    return out


def _fail_all(groups: Any, exc: Exception) -> None:
    for recs in groups:
        for _, _, fut in recs:
            if not fut.done():
                fut.set_exception(exc)
