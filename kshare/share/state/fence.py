"""Writes to one owned state partition, fenced by the broker at claim time.

In an instance group a state partition moves between proxies. The proxy that takes it over must
know that the previous owner (paused, cut off, or simply slow to learn the news) can no longer
write there. Every owner of partition P gets its producer id and epoch from the transactional id
``<prefix><P>``: InitProducerId on the transaction coordinator bumps the epoch (aborting any open
transaction of that id, e.g. one left by a kshare version that wrote transactions). The new owner
then writes a *claim record* (:mod:`.claims`) to P with that producer id and epoch, sequence 0,
acks=all: once the partition's leader has appended it, the leader refuses every batch of that
producer id with an older epoch (INVALID_PRODUCER_EPOCH). So every batch the previous owner got
acknowledged lies below the claim record, and the new owner replays P up to it (and past it: to
the end offset read after it) before it serves.

The owner's writes are then plain idempotent batches of that producer id and epoch through the
store's pipelined producer (:mod:`.pipelined_producer`), many rounds in flight, no transaction.
A batch refused with a fencing error means another proxy claimed P since: the partition is
fenced. The owner renews its claim (InitProducerId again, naming its producer id and epoch, and a
new claim record) after a failed batch (its sequence numbers are broken) and periodically, so the
coordinator never expires the transactional id and the leader never forgets the producer id
(docs/design/scale-out.md, Fencing).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field

from ...clients.connection import KafkaConnection
from ...protocol import messages
from ...protocol.codes import ApiKey
from ...security import ClientSecurity
from ..errors import ErrorCode
from .claims import Claim, encode_claim
from .pipelined_producer import PipelinedProducer, StateProduceError

log = logging.getLogger("kshare.share")

FIND_COORDINATOR = ApiKey.FIND_COORDINATOR.value
INIT_PRODUCER_ID = ApiKey.INIT_PRODUCER_ID.value


class Fenced(Exception):
    """Another proxy owns this state partition now; nothing of the write was committed."""


# -- claims ------------------------------------------------------------------------------------

FENCING_CODES = frozenset({ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.PRODUCER_FENCED})
# the coordinator is moving, loading, or aborting the previous owner's transaction: ask again
_RETRY_CODES = frozenset({ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.COORDINATOR_NOT_AVAILABLE,
                          ErrorCode.NOT_COORDINATOR, ErrorCode.CONCURRENT_TRANSACTIONS})
TRANSACTION_TIMEOUT_MS = 60_000  # no transaction is ever opened with it; the coordinator wants one


def is_fencing(exc: BaseException | None) -> bool:
    """A state write refused because another proxy claimed its partition."""
    return getattr(exc, "error_code", None) in FENCING_CODES


async def init_producer_id(bootstrap: Sequence[str], transactional_id: str, *, timeout_s: float,
                           security: ClientSecurity | None = None, client_id: str = "kshare-state",
                           expected: tuple[int, int] | None = None) -> tuple[int, int]:
    """InitProducerId for ``transactional_id`` at its transaction coordinator: (producer id, epoch).

    Without ``expected``: a claim, which bumps the epoch whoever held it. With ``expected`` (this
    owner's producer id and epoch): a renewal, which the coordinator grants only if nobody claimed
    since (KIP-360); otherwise it answers PRODUCER_FENCED and this raises :class:`Fenced`."""
    deadline = time.monotonic() + timeout_s
    delay = 0.05
    last = "no answer"
    while True:
        try:
            code, pid, epoch = await asyncio.wait_for(
                _init_once(bootstrap, transactional_id, timeout_s, security, client_id, expected),
                max(0.1, deadline - time.monotonic()))
        except (OSError, ConnectionError, TimeoutError, StateProduceError) as exc:
            code, pid, epoch, last = -1, -1, -1, repr(exc)
        if code == 0:
            return pid, epoch
        if code in FENCING_CODES:
            raise Fenced(f"InitProducerId for {transactional_id}: another proxy claimed it (error code {code})")
        if code not in _RETRY_CODES and code != -1:
            raise StateProduceError(f"InitProducerId for {transactional_id} refused: error code {code}", code)
        if code != -1:
            last = f"error code {code}"
        if time.monotonic() + delay > deadline:
            raise StateProduceError(f"InitProducerId for {transactional_id}: {last}", code)
        await asyncio.sleep(delay)
        delay = min(delay * 2, 1.0)


async def _init_once(bootstrap: Sequence[str], transactional_id: str, timeout_s: float,
                     security: ClientSecurity | None, client_id: str,
                     expected: tuple[int, int] | None) -> tuple[int, int, int]:
    conn = await _any(bootstrap, timeout_s, security, client_id)
    try:
        Find = messages.message_class("FindCoordinatorRequest")
        resp = await conn.request(FIND_COORDINATOR, conn.best_version(FIND_COORDINATOR, lo=1, hi=3),
                                  Find(key=transactional_id, key_type=1))
        if resp.error_code:
            return resp.error_code, -1, -1
        host, port = resp.host, resp.port
    finally:
        await conn.close()
    conn = await KafkaConnection.open(host, port, client_id, timeout=timeout_s, security=security)
    try:
        Req = messages.message_class("InitProducerIdRequest")
        pid, epoch = expected if expected is not None else (-1, -1)
        version = conn.best_version(INIT_PRODUCER_ID, lo=0, hi=4)
        if version < 3 and expected is not None:
            # before KIP-360 (Kafka 2.5) a renewal would be a claim, which would fence a new owner
            raise StateProduceError("the cluster cannot renew a claim without fencing its new owner "
                                    "(InitProducerId v3, Kafka 2.5, needed)")
        resp = await conn.request(INIT_PRODUCER_ID, version, Req(
            transactional_id=transactional_id, transaction_timeout_ms=TRANSACTION_TIMEOUT_MS,
            producer_id=pid, producer_epoch=epoch))
        return resp.error_code, resp.producer_id, resp.producer_epoch
    finally:
        await conn.close()


async def _any(bootstrap: Sequence[str], timeout_s: float, security: ClientSecurity | None,
               client_id: str) -> KafkaConnection:
    last: Exception | None = None
    for server in bootstrap:
        host, _, port = server.rpartition(":")
        try:
            return await KafkaConnection.open(host, int(port), client_id, timeout=timeout_s, security=security)
        except Exception as exc:  # noqa: BLE001 - try the next one
            last = exc
    raise StateProduceError(f"cannot reach the cluster at {','.join(bootstrap)}: {last!r}")


@dataclass(eq=False)
class PartitionClaim:
    """This proxy's claim of one state-topic partition: the producer id and epoch it writes it
    with (through ``producer``, shared by the store's claims) and whether another proxy fenced it."""

    bootstrap: list[str]
    topic: str
    partition: int
    transactional_id: str
    producer: PipelinedProducer
    _: KW_ONLY
    ownership_epoch: int = 0
    timeout_s: float = 30.0
    security: ClientSecurity | None = None
    client_id: str = "kshare-state"
    clock: Callable[[], float] = time.monotonic
    fenced: bool = field(default=False, init=False)
    needs_renewal: bool = field(default=False, init=False)  # a batch failed: its sequence is broken
    producer_id: int = field(default=-1, init=False)
    producer_epoch: int = field(default=-1, init=False)
    claim_offset: int = field(default=-1, init=False)  # where the latest claim record landed
    claimed_at: float = field(default=0.0, init=False)  # the clock at the latest claim or renewal

    async def start(self) -> None:
        """Take the partition over: once this returns, the previous owner's writes are refused."""
        await self._claim(None)

    async def renew(self) -> None:
        """Claim again with this owner's producer id and epoch (nothing of this partition may be in
        flight): :class:`Fenced` if another proxy claimed it meanwhile."""
        await self._claim((self.producer_id, self.producer_epoch) if self.producer_id >= 0 else None)

    async def _claim(self, expected: tuple[int, int] | None) -> None:
        if self.fenced:
            raise Fenced(f"state partition {self.partition} is no longer owned here")
        try:
            pid, epoch = await init_producer_id(self.bootstrap, self.transactional_id, timeout_s=self.timeout_s,
                                                security=self.security, client_id=self.client_id, expected=expected)
        except Fenced:
            self.fenced = True
            raise
        if expected is not None and pid != expected[0]:
            # the coordinator rotated the producer id (the epoch exhausted, or the transactional id
            # expired): the leader does not fence the old producer id with the new one. The claim
            # record still keeps the old owner's later writes out of the replay (claims.ClaimGuard).
            log.warning("state partition %d: the transaction coordinator gave a new producer id (%d, was %d) to %s; "
                        "writes of an earlier owner with the old one are kept out of the state by the claim record",
                        self.partition, pid, expected[0], self.transactional_id)
        self.producer.assign(self.partition, pid, epoch)
        self.producer_id, self.producer_epoch = pid, epoch
        key, value = encode_claim(Claim(self.partition, pid, epoch, self.ownership_epoch, int(time.time() * 1000)))
        fut = self.producer.enqueue(self.topic, value=value, key=key, partition=self.partition)
        self.producer.flush()
        try:
            meta = await asyncio.wait_for(fut, self.timeout_s)
        except Exception as exc:
            self.needs_renewal = True  # the sequence may be broken: claim again before writing
            if is_fencing(exc):
                self.fenced = True
                raise Fenced(f"state partition {self.partition}: claimed by another proxy meanwhile") from exc
            raise
        self.claim_offset = meta.offset
        self.claimed_at = self.clock()
        self.needs_renewal = False

    def write_failed(self, exc: BaseException | None) -> bool:
        """A batch of this partition failed with ``exc``: True when it was fenced (now marked),
        else the claim must be renewed before the next write (the sequence may be broken)."""
        if is_fencing(exc):
            if not self.fenced:
                self.fenced = True
                # the store's owner says so to the operator, once per partition
                log.debug("state partition %d: another proxy took it over (%s); this proxy no longer "
                          "writes it", self.partition, exc)
            return True
        self.needs_renewal = True
        return False

    def renewal_due(self, interval_s: float) -> bool:
        return not self.fenced and (self.needs_renewal or self.clock() - self.claimed_at >= interval_s)

    async def stop(self) -> None:
        """Nothing to close: the producer is the store's."""
        self.producer.release(self.partition)
