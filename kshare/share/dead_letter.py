"""Dead-letter queue (Apache Kafka 4.4's ``errors.deadletterqueue.*`` group configs, KIP-1191).

When a record is archived because a consumer rejected it or it ran out of delivery attempts, a
record is produced to the group's DLQ topic before the archive is made durable. It carries
context headers named as Apache Kafka 4.4 names them; with
``errors.deadletterqueue.copy.record.enable`` also the original key and value (as in Kafka, not
the original headers). This is the only place kshare decodes record bodies, and only for dead-lettered
records.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .states import RecordState, ShareUpdate

log = logging.getLogger("kshare.share")

HEADER_PREFIX = "__dlq.errors."
# As Apache Kafka 4.4 writes them (checked against it in tests/integration/test_share_differential.py)
REASON_REJECTED = "Offset rejected by client."
REASON_DELIVERY_LIMIT = "Offset delivery count exceeded the threshold."


@dataclass(slots=True)
class DeadLetter:
    offset: int
    delivery_count: int
    reason: str
    key: bytes | None = None
    value: bytes | None = None
    headers: list[tuple[str, bytes]] | None = None


def archived_offsets(update: ShareUpdate) -> list[tuple[int, int, int]]:
    """(first, last, delivery count) of records this update archives after at least one delivery.

    Only what the update still carries: records the SPSO moved past are not in it. The engine's
    ``SharePartition.archived`` lists every record an operation archived.
    """
    return [(b.first_offset, b.last_offset, b.delivery_count) for b in update.state_batches
            if b.delivery_state == RecordState.ARCHIVED and b.delivery_count > 0]


def acked_ranges(batches: Iterable, ack_type: int) -> list[tuple[int, int]]:
    """Offsets an acknowledgement request gave type ``ack_type``, as (first, last) runs."""
    out = []
    for b in batches:
        types = list(b.acknowledge_types)
        if len(types) == 1:
            if types[0] == ack_type:
                out.append((b.first_offset, b.last_offset))
            continue
        for i, t in enumerate(types):
            if t == ack_type:
                out.append((b.first_offset + i, b.first_offset + i))
    return out


def rejected_ranges(batches: Iterable) -> list[tuple[int, int]]:
    """Offsets an acknowledgement request rejected (type 3), as (first, last) runs."""
    return acked_ranges(batches, 3)


def letters(archived: Iterable[tuple[int, int, int]], rejected: Sequence[tuple[int, int]],
            gaps: Sequence[tuple[int, int]] = ()) -> list[DeadLetter]:
    """One dead letter per archived offset ((first, last, delivery count) runs), except offsets
    acknowledged as gaps (no record there)."""
    out = []
    for first, last, count in archived:
        for offset in range(first, last + 1):  # archived runs are few and short: per record is fine here
            if any(a <= offset <= z for a, z in gaps):
                continue
            reason = REASON_REJECTED if any(a <= offset <= z for a, z in rejected) else REASON_DELIVERY_LIMIT
            out.append(DeadLetter(offset, count, reason))
    return out


def fill_from_batches(items: list[DeadLetter], raw_batches: Iterable[memoryview]) -> None:
    """Copy key, value and headers of the original records (decoding only these batches)."""
    from kafka.record.default_records import DefaultRecordBatch

    wanted = {d.offset: d for d in items}
    for raw in raw_batches:
        try:
            for record in DefaultRecordBatch(bytes(raw)):
                d = wanted.get(record.offset)
                if d is not None:
                    d.key, d.value = record.key, record.value
                    d.headers = [(k, v) for k, v in record.headers]
        except Exception as exc:  # noqa: BLE001 - a batch we cannot decode loses only the copy
            log.warning("cannot decode a record batch for the dead-letter copy: %r", exc)


def context_headers(group_id: str, topic: str, partition: int, d: DeadLetter) -> list[tuple[str, bytes]]:
    return [
        (HEADER_PREFIX + "group", group_id.encode()),
        (HEADER_PREFIX + "topic", topic.encode()),
        (HEADER_PREFIX + "partition", str(partition).encode()),
        (HEADER_PREFIX + "offset", str(d.offset).encode()),
        (HEADER_PREFIX + "delivery.count", str(d.delivery_count).encode()),
        (HEADER_PREFIX + "message", d.reason.encode()),
    ]
