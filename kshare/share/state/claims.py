"""Claim records: how an instance group's owner of a state partition fences the previous one (sans-I/O).

The owner of state partition P writes it with the producer id and epoch the transaction coordinator
gave the transactional id ``<prefix><P>`` (InitProducerId, which bumps the epoch), as plain
idempotent batches. Its first write is a *claim record* carrying that producer id and epoch: once
the partition's leader has appended it, the leader refuses every batch of that producer id with an
older epoch (INVALID_PRODUCER_EPOCH), so every write of the previous owner that was accepted lies
below the claim record, and the new owner's replay reads up to it (docs/design/scale-out.md,
Fencing, has the argument and its limits).

Here: the claim record's encoding, the replay rule that keeps what an older owner wrote after a
claim out of the state even if the broker accepted it (the cases the broker's fencing does not
cover), and when an owner renews its claim.

Key: int16 record type 3, int32 state partition. Value: int16 version 0, int64 producer id, int16
producer epoch, int32 ownership epoch (the instance group's map epoch of the claim, the leader
epoch every state record of the claimer carries), int64 wall-clock time of the claim (ms).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Final

RECORD_CLAIM: Final = 3
CLAIM_VERSION: Final = 0
_KEY = struct.Struct(">hi")
_VALUE = struct.Struct(">hqhiq")
_CLAIM_PREFIX: Final = struct.pack(">h", RECORD_CLAIM)

DAY_MS: Final = 86_400_000


@dataclass(frozen=True, slots=True)
class Claim:
    partition: int
    producer_id: int
    producer_epoch: int
    ownership_epoch: int
    at_ms: int


def encode_claim(c: Claim) -> tuple[bytes, bytes]:
    """(key, value) of a claim record."""
    return (_KEY.pack(RECORD_CLAIM, c.partition),
            _VALUE.pack(CLAIM_VERSION, c.producer_id, c.producer_epoch, c.ownership_epoch, c.at_ms))


def is_claim(key: bytes | None) -> bool:
    return key is not None and key[:2] == _CLAIM_PREFIX


def decode_claim(key: bytes, value: bytes | None) -> Claim:
    """A claim record's content; ValueError for one that does not decode (or a later version)."""
    if len(key) != _KEY.size or value is None or len(value) < _VALUE.size:
        raise ValueError("bad claim record")
    _, partition = _KEY.unpack(key)
    version, pid, epoch, ownership_epoch, at_ms = _VALUE.unpack_from(value)
    if version != CLAIM_VERSION:
        raise ValueError(f"claim record of unknown version {version}")
    return Claim(partition, pid, epoch, ownership_epoch, at_ms)


@dataclass(slots=True)
class ClaimGuard:
    """The replay rule, per state partition, in log order: after a claim record, a ShareSnapshot or
    ShareUpdate whose leader (ownership) epoch is older than that claim's was written by a proxy
    that had lost the partition, and is not state.

    * The claim that counts is the **latest in log order**, whatever its epoch: a claim record the
      leader appended after another was written with the newer producer epoch (the leader refuses
      an older one), so its writer is the partition's owner as far as the broker is concerned. Its
      ownership epoch may be *lower* than the one before: the instance group's epochs start again
      at 1 after every proxy of it stopped (a full restart), and the records of that new life must
      not be taken for a zombie's.
    * Records of leader epoch 0 are written **without an instance group** (one proxy, no claims:
      ``LocalOwnership``), e.g. after an instance group was scaled down to a single proxy. They are
      state wherever they are: a proxy outside the group is never run beside it (deploy.md).
    * Records before the first claim record of a partition (an older kshare, or no instance group)
      are taken as they are."""

    # partition -> the latest claim record read there
    claims: dict[int, Claim] = field(default_factory=dict)
    ignored: int = 0  # records the rule kept out
    new_producer_ids: int = 0  # claims whose producer id differs from the claim before (see claim())

    def claim(self, c: Claim) -> bool:
        """Read a claim record of partition ``c.partition``: from now on it is the claim there.
        False when its producer id differs from the previous claim's: the transaction coordinator
        gave a new one (an expired transactional id, or the epoch exhausted), which the broker does
        not fence the old one with; this rule still keeps the old owner's later writes out."""
        before = self.claims.get(c.partition)
        self.claims[c.partition] = c
        if before is not None and before.producer_id != c.producer_id:
            self.new_producer_ids += 1
            return False
        return True

    def admits(self, partition: int, leader_epoch: int) -> bool:
        """Whether a share-partition record with this leader epoch, read after the claims so far, is state."""
        c = self.claims.get(partition)
        if c is None or leader_epoch >= c.ownership_epoch or leader_epoch == 0:
            return True
        self.ignored += 1
        return False


def renew_interval_ms(transactional_id_expiration_ms: int | None, producer_id_expiration_ms: int | None) -> int:
    """How often an owner renews its claims (InitProducerId again, a new claim record).

    The transaction coordinator forgets a transactional id it has not heard of for
    ``transactional.id.expiration.ms`` (default 7 days; plain idempotent batches do not reach it),
    and the next claimer would then get a new producer id, which does not fence the old one. A
    partition's leader forgets a producer id that wrote nothing for ``producer.id.expiration.ms``
    (default 1 day), and would then accept the old owner's batches of any epoch. Renewing at a
    quarter of the shorter one, and at least daily, keeps both alive with margin for a renewal
    that fails and is retried. Unknown configs count as Kafka's defaults."""
    txn = transactional_id_expiration_ms if transactional_id_expiration_ms and transactional_id_expiration_ms > 0 \
        else 7 * DAY_MS
    pid = producer_id_expiration_ms if producer_id_expiration_ms and producer_id_expiration_ms > 0 else DAY_MS
    return max(1_000, min(min(txn, pid) // 4, DAY_MS))


__all__ = ["CLAIM_VERSION", "RECORD_CLAIM", "Claim", "ClaimGuard", "decode_claim", "encode_claim", "is_claim",
           "renew_interval_ms"]
