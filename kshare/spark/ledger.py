"""The rejects ledger: the offsets a sink rejected, for the workers that hold those records.

``kshare.spark.reject`` runs in the user's process (inside ``foreachBatch``), which cannot reach
the Python workers holding the records any more than the stream reader can, so it goes through
Kafka as the commit marker does: offset commits of a consumer group of its own per share group,
``kshare-spark.<share group>.rejects``, one entry per topic-partition. The committed offset
counts the writes; the metadata is the set of rejected offsets, encoded here. A worker about to
ACCEPT the records of a committed micro-batch reads the entries of the partitions it holds and
REJECTs what they list.

Encoding (``ks1`` + ``r`` raw or ``z`` zlib + ``:`` + base85): the offsets as sorted, disjoint
ranges, each as two unsigned LEB128 varints, the distance from the end of the previous range
(plus 2: ranges never touch) and the length minus one. Kafka limits the metadata to
``offset.metadata.max.bytes`` (4096 by default): :data:`MAX_CHARS`.
"""

from __future__ import annotations

import base64
import bisect
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from confluent_kafka import TopicPartition

from .commits import offsets_client, retried
from .options import Options

FORMAT = "ks1"
MAX_CHARS = 4096  # offset.metadata.max.bytes, Kafka's default
_INFLATE_LIMIT = 1 << 20

Ranges = list[tuple[int, int]]  # sorted, disjoint, non-adjacent, inclusive (first, last)
TP = tuple[str, int]


class LedgerFormatError(ValueError):
    """An entry this version cannot read (written by a newer kshare, or not by kshare)."""


def ledger_group(share_group: str) -> str:
    return f"kshare-spark.{share_group}.rejects"


def to_ranges(offsets: Iterable[int]) -> Ranges:
    out: Ranges = []
    for o in sorted(set(offsets)):
        if out and o == out[-1][1] + 1:
            out[-1] = (out[-1][0], o)
        else:
            out.append((o, o))
    return out


def union(a: Ranges, b: Ranges) -> Ranges:
    out: Ranges = []
    for lo, hi in sorted(a + b):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def prune(ranges: Ranges, start: int) -> Ranges:
    """Without the offsets below ``start`` (the share-partition start offset: settled records)."""
    return [(max(lo, start), hi) for lo, hi in ranges if hi >= start]


def contains(ranges: Ranges, offset: int) -> bool:
    i = bisect.bisect_right(ranges, (offset, float("inf"))) - 1
    return i >= 0 and ranges[i][0] <= offset <= ranges[i][1]


def within(ranges: Ranges, lo: int, hi: int) -> Iterator[int]:
    """The listed offsets in ``[lo, hi]``."""
    i = max(0, bisect.bisect_right(ranges, (lo, lo)) - 1)
    for a, z in ranges[i:]:
        if a > hi:
            break
        yield from range(max(a, lo), min(z, hi) + 1)


def encode(ranges: Ranges) -> str:
    raw = bytearray()
    nxt = 0
    for lo, hi in ranges:
        _varint(raw, lo - nxt)
        _varint(raw, hi - lo)
        nxt = hi + 2
    packed = zlib.compress(bytes(raw), 9)
    flag, payload = ("z", packed) if len(packed) < len(raw) else ("r", bytes(raw))
    return f"{FORMAT}{flag}:" + base64.b85encode(payload).decode("ascii")


def decode(text: str | None) -> Ranges:
    if not text:
        return []
    head, sep, body = text.partition(":")
    if not sep or head not in (FORMAT + "r", FORMAT + "z"):
        raise LedgerFormatError(f"unknown rejects ledger format {text[:8]!r}")
    try:
        data = base64.b85decode(body)
        if head.endswith("z"):
            inflate = zlib.decompressobj()
            data = inflate.decompress(data, _INFLATE_LIMIT)
            if inflate.unconsumed_tail:
                raise LedgerFormatError("rejects ledger entry inflates too far")
    except (ValueError, zlib.error) as exc:
        raise LedgerFormatError(f"corrupt rejects ledger entry ({exc})") from None
    out: Ranges = []
    nxt, pos = 0, 0
    while pos < len(data):
        gap, pos = _unvarint(data, pos)
        length, pos = _unvarint(data, pos)
        lo = nxt + gap
        out.append((lo, lo + length))
        nxt = lo + length + 2
    return out


def _varint(out: bytearray, n: int) -> None:
    if n < 0:
        raise ValueError(f"negative varint {n}")
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _unvarint(data: bytes, pos: int) -> tuple[int, int]:
    n = shift = 0
    while pos < len(data):
        b = data[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return n, pos
        shift += 7
    raise LedgerFormatError("truncated rejects ledger entry")


@dataclass(frozen=True, slots=True)
class Entry:
    version: int  # the committed offset: how many times the entry was written (0: never)
    text: str | None  # the metadata as stored

    @property
    def ranges(self) -> Ranges:
        return decode(self.text)


class Ledger:
    """Reads and writes the ledger entries of a share group (blocking calls, librdkafka)."""

    def __init__(self, opts: Options) -> None:
        self._consumer = offsets_client(opts, ledger_group(opts.group))

    def read(self, tps: Iterable[TP], timeout: float = 10.0) -> dict[TP, Entry]:
        want = [TopicPartition(t, p) for t, p in sorted(set(tps))]
        if not want:
            return {}
        got = retried(lambda: self._consumer.committed(want, timeout=timeout))
        return {(tp.topic, tp.partition): Entry(max(tp.offset, 0), tp.metadata or None) for tp in got}

    def write(self, entries: dict[TP, Entry]) -> None:
        tps = [TopicPartition(t, p, e.version, metadata=e.text or "") for (t, p), e in sorted(entries.items())]
        retried(lambda: self._consumer.commit(offsets=tps, asynchronous=False))

    def close(self) -> None:
        self._consumer.close()
