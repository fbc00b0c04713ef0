"""The records an :class:`kshare.AIOShareConsumer` hands out, and their decoding from a ShareFetch
answer's record batches (aiokafka's C record decoder, with each record's delivery count)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import islice
from typing import Any, Generic, NamedTuple, TypeVar

from .share_member import batches

KT = TypeVar("KT")
VT = TypeVar("VT")


class ShareConsumerRecord(NamedTuple, Generic[KT, VT]):
    """A record, with aiokafka's ``ConsumerRecord``'s fields (topic, partition, offset, timestamp,
    timestamp_type, key, value, checksum (None), serialized_key_size, serialized_value_size,
    headers) plus how many times the share group has delivered it, this delivery included. A
    named tuple: made at C speed, read like aiokafka's record."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: int
    key: KT | None
    value: VT | None
    checksum: int | None
    serialized_key_size: int
    serialized_value_size: int
    headers: Sequence[tuple[str, bytes]]
    delivery_count: int = 1


_new = tuple.__new__


def decode_records(topic: str, partition: int, raw: Any,
                   counts: list[tuple[int, int, int]]) -> list[ShareConsumerRecord]:
    """The records at the acquired offsets of a ShareFetch partition's record batches (``counts``:
    the acquired ranges with their delivery counts, ascending), each with its delivery count."""
    out: list[ShareConsumerRecord] = []
    rec, new = ShareConsumerRecord, _new
    n = len(counts)
    j = 0  # counts before j end before the batch at hand (both ascend)
    for batch in batches(raw):
        tt = getattr(batch, "timestamp_type", 0) or 0
        delta = getattr(batch, "last_offset_delta", None)
        if delta is None:  # a legacy message set: walked by offset
            out += _walk(batch, counts, topic, partition, tt)
            continue
        base = batch.base_offset
        last = base + delta
        while j < n and counts[j][1] < base:
            j += 1
        k = j
        spans = []  # the acquired ranges within the batch, clipped to it
        while k < n and counts[k][0] <= last:
            a, z, c = counts[k]
            a, z = (a if a > base else base), (z if z < last else last)
            if spans and spans[-1][1] + 1 == a and spans[-1][2] == c:
                a = spans.pop()[0]  # one acquisition the broker split in ranges (BatchSize)
            spans.append((a, z, c))
            if z > last:
                break
            k += 1
        if not spans:
            continue  # none of it acquired (its records are not even decoded)
        if len(spans) == 1 and spans[0][0] == base and spans[0][1] == last:
            c = spans[0][2]  # every offset of the batch acquired, with one delivery count
            out += [new(rec, (topic, partition, r.offset, r.timestamp, tt, k_ := r.key, v := r.value, None,
                              -1 if k_ is None else len(k_), -1 if v is None else len(v), r.headers or (), c))
                    for r in batch]
            continue
        # Taken in part: the records up to the last acquired one are decoded (at C speed), none
        # after it, and the acquired ones picked by their index, with no Python work for those
        # skipped; a compacted batch (offsets missing inside it) is walked by offset instead.
        # (the batch is read once: its __iter__ starts reading over, so the rest comes from its __next__)
        it = iter(iter(batch).__next__, None)
        recs = list(islice(it, spans[-1][1] - base + 1))
        if not recs or recs[-1].offset != base + len(recs) - 1:
            recs += it
            out += _walk(recs, spans, topic, partition, tt)
            continue
        for a, z, c in spans:
            out += [new(rec, (topic, partition, r.offset, r.timestamp, tt, k_ := r.key, v := r.value, None,
                              -1 if k_ is None else len(k_), -1 if v is None else len(v), r.headers or (), c))
                    for r in recs[a - base:z - base + 1]]
    return out


def _walk(records: Iterable[Any], counts: Sequence[tuple[int, int, int]], topic: str, partition: int,
          tt: int) -> list[ShareConsumerRecord]:
    """The records at acquired offsets (``counts``: ranges with their delivery counts, ascending),
    walking the records and the ranges side by side (offsets ascend)."""
    out: list[ShareConsumerRecord] = []
    rec, new = ShareConsumerRecord, _new
    n, j = len(counts), 0
    for r in records:
        o = r.offset
        while j < n and counts[j][1] < o:
            j += 1
        if j == n:
            break
        a, _, c = counts[j]
        if o < a:
            continue
        k, v = r.key, r.value
        out.append(new(rec, (topic, partition, o, r.timestamp, tt, k, v, None, -1 if k is None else len(k),
                             -1 if v is None else len(v), r.headers or (), c)))
    return out
