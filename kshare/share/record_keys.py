"""Record keys, read out of a fetched record batch; values and headers are skipped, never decoded.

For key-ordered sharing (no two records with the same key of one share-partition acquired at
once) the proxy needs, per record of a batch, its offset and an identity of its key. This module
reads exactly that from the raw bytes the proxy already holds (see :mod:`kshare.share.records`).

The format (record batch v2, magic 2)::

    baseOffset int64 | batchLength int32 | partitionLeaderEpoch int32 | magic int8 (= 2) | crc uint32
    | attributes int16 | lastOffsetDelta int32 | baseTimestamp int64 | maxTimestamp int64
    | producerId int64 | producerEpoch int16 | baseSequence int32 | recordCount int32   (61 bytes)
    | records...

``attributes`` bits 0-2 are the compression codec (0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd), bit 4
marks a transactional batch, bit 5 a control batch. With a codec, everything after the 61-byte
header is compressed as one stream:

* gzip: a gzip stream (several members are accepted, as Java's ``GZIPInputStream`` does);
* snappy: the Java producer (snappy-java's ``SnappyOutputStream``) writes the *xerial* framing, a
  16-byte header (``\\x82SNAPPY\\x00``, int32 version, int32 compatible version) and then blocks,
  each an int32 big-endian length and a raw snappy block (a repeated header between blocks, from
  concatenated streams, is skipped); librdkafka writes one *raw* snappy block. Both are read: a
  stream that does not start with the xerial magic is raw, as snappy-java's reader decides too.
  (The official snappy "framing format", ``\\xff\\x06\\x00\\x00sNaPpY``, is not used by Kafka and
  is not read.);
* lz4: the LZ4 *frame* format (KIP-57; magic 0/1 message sets had a broken header checksum, v2
  batches do not);
* zstd: zstd frames (content size in the frame header or not).

Decompression is cramjam's (an optional dependency of kshare, imported the first time a
compressed batch is read; without it such a batch raises :class:`CodecUnavailable`).

Each record, all integers zigzag varints (varlong: at most 10 bytes, varint: at most 5)::

    length varint | attributes int8 | timestampDelta varlong | offsetDelta varint
    | keyLength varint (-1: null key) | key | valueLength varint (-1: null) | value
    | headerCount varint | headers...

What is decoded: ``length``, ``offsetDelta``, ``keyLength`` and the key bytes, which are hashed
(:func:`key_hash`) straight from the buffer without making a Python object of them. What is not:
timestamps (stepped over), values and headers (skipped whole by the record ``length``), the batch
CRC (not verified: the broker checked it on produce and the consumer checks it again; a corrupted
key only gives a wrong identity, see below), producer ids and sequences (:mod:`.records` has them).

Key identity: ``key_hash(key) = crc32(key) | len(key) << 32``, a non-negative int, the same in every
process and every Python version (unlike ``hash(bytes)``, which is salted per process). CRC32 was
measured against blake2b (8-byte digest) and CRC32+Adler32 (``benchmarks/bench_record_keys.py``):
about 150 ns a 16-byte key, slicing included, against 260 and 620 ns. Equal keys always have equal identities; two
different keys may share one (for keys of one length, about one pair in 2**32), and a collision
only makes key-ordered sharing stricter than needed (two records wait for each other as if they
had one key), never hands out two records with the same key at once.

Batches without keys to read: control batches (transaction markers; their keys are control record
types, not user keys) and magic 0/1 message sets (pre-0.11 producers; their offsets are unknown
without decompressing the wrapper) give a :class:`KeyedBatch` with no records, whose
:meth:`KeyedBatch.key_of` is ``None`` for every offset: treated as keyless, no ordering constraint.

Bad input (a truncated batch, a bad varint, a decompression error, more or fewer records than the
header's count, offsets out of order) raises :class:`BadBatch` and nothing else; every loop is
bounded by the buffer's length. The decompressed size is not capped: a batch that inflates to
gigabytes (which the broker accepted, having decompressed it itself) takes that much memory here.
"""

from __future__ import annotations

import struct
import zlib
from array import array
from bisect import bisect_left
from collections.abc import Iterator
from typing import Any

from .records import CONTROL, HEADER_SIZE

__all__ = ["NULL_KEY", "BadBatch", "CodecUnavailable", "KeyedBatch", "batch_keys", "key_hash"]

NULL_KEY = -1  # in KeyedBatch.keys: a record with a null key (every real identity is >= 0)

_HEAD = struct.Struct(">qiib")  # baseOffset, batchLength, partitionLeaderEpoch, magic
_ATTRS = struct.Struct(">h")
_COUNT = struct.Struct(">i")
_ATTRS_AT = 21
_LAST_DELTA_AT = 23
_COUNT_AT = 57
_MIN_RECORD = 6  # attributes, timestampDelta, offsetDelta, keyLength, valueLength, headerCount: 1 byte each
_CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = 16
_BLOCK_LEN = struct.Struct(">i")
_MAX_OFFSET = 2**63 - 1

_crc32 = zlib.crc32


class BadBatch(ValueError):
    """The bytes are not a well-formed record batch (truncated, corrupted, not decompressible)."""


class CodecUnavailable(BadBatch):
    """A compressed batch and no cramjam to decompress it (it is an optional dependency)."""


def key_hash(key: bytes | bytearray | memoryview) -> int:
    """The identity of a (non-null) key: ``crc32(key) | len(key) << 32``; stable across processes."""
    return _crc32(key) | (len(key) << 32)


class KeyedBatch:
    """The records of one batch: ``offsets[i]`` (ascending) and ``keys[i]`` (:func:`key_hash`, or
    :data:`NULL_KEY`), two ``array('q')`` of one entry per record (16 bytes a record)."""

    __slots__ = ("base_offset", "offsets", "keys", "_by_key")

    def __init__(self, base_offset: int, offsets: array[int], keys: array[int]) -> None:
        self.base_offset = base_offset
        self.offsets = offsets
        self.keys = keys
        self._by_key: dict[int, list[int]] | None = None

    def __len__(self) -> int:
        return len(self.offsets)

    def __repr__(self) -> str:
        return f"KeyedBatch(base_offset={self.base_offset}, records={len(self.offsets)})"

    def __iter__(self) -> Iterator[tuple[int, int | None]]:
        """``(offset, key identity or None)`` per record."""
        for offset, key in zip(self.offsets, self.keys, strict=True):
            yield offset, (None if key == NULL_KEY else key)

    def _index(self, offset: int) -> int:
        offsets = self.offsets
        i = offset - self.base_offset  # a batch nobody compacted: offset deltas 0, 1, 2...
        if 0 <= i < len(offsets) and offsets[i] == offset:
            return i
        # with gaps (compaction) offsets[j] > base_offset + j: the record sits before index i
        lo = bisect_left(offsets, offset, 0, min(len(offsets), max(i, 0)))
        return lo if lo < len(offsets) and offsets[lo] == offset else -1

    def key_of(self, offset: int) -> int | None:
        """The key identity of the record at ``offset``; ``None`` for a null key, and for an offset
        without a record here (compacted away, outside the batch, a control or legacy batch)."""
        i = self._index(offset)
        if i < 0:
            return None
        key = self.keys[i]
        return None if key == NULL_KEY else key

    def has_keys(self) -> bool:
        """Whether any record has a non-null key."""
        return any(key != NULL_KEY for key in self.keys)

    def by_key(self) -> dict[int, list[int]]:
        """Key identity -> the offsets of its records, ascending; null keys left out. Built on the
        first call and kept (do not change it)."""
        by_key = self._by_key
        if by_key is None:
            by_key = {}
            for offset, key in zip(self.offsets, self.keys, strict=True):
                if key != NULL_KEY:
                    entry = by_key.get(key)
                    if entry is None:
                        by_key[key] = [offset]
                    else:
                        entry.append(offset)
            self._by_key = by_key
        return by_key

    def offsets_of(self, key: int) -> list[int]:
        """The offsets of the records of this batch whose key has identity ``key`` (a fresh list)."""
        return list(self.by_key().get(key, ()))


def batch_keys(buf: bytes | bytearray | memoryview) -> KeyedBatch:
    """The offsets and key identities of the records of ``buf``, exactly one complete batch (header
    included; e.g. ``view[b.start:b.end]`` for a :class:`kshare.share.records.Batch` ``b``).

    Raises :class:`BadBatch` if it is not one."""
    n = len(buf)
    if n < 17:
        raise BadBatch(f"{n} bytes are too few for a record batch")
    base_offset, length, _epoch, magic = _HEAD.unpack_from(buf, 0)
    if length < 0 or 12 + length != n:
        raise BadBatch(f"batch at offset {base_offset} says {length} + 12 bytes, the buffer has {n}")
    if magic in (0, 1):
        return KeyedBatch(base_offset, array("q"), array("q"))
    if magic != 2:
        raise BadBatch(f"batch at offset {base_offset} has unknown magic {magic}")
    if n < HEADER_SIZE:
        raise BadBatch(f"batch at offset {base_offset} has {n} bytes, less than a v2 header ({HEADER_SIZE})")
    (attributes,) = _ATTRS.unpack_from(buf, _ATTRS_AT)
    (count,) = _COUNT.unpack_from(buf, _COUNT_AT)
    if attributes & CONTROL:
        return KeyedBatch(base_offset, array("q"), array("q"))
    (last_delta,) = _COUNT.unpack_from(buf, _LAST_DELTA_AT)
    if base_offset < 0 or base_offset + last_delta > _MAX_OFFSET:
        raise BadBatch(f"batch at offset {base_offset} (last offset delta {last_delta}) has offsets out of range")
    codec = attributes & 0x07
    if codec == 0:
        # bytes index faster than a memoryview, and the copy is cheap next to the record loop
        data: Any = buf if isinstance(buf, bytes) else bytes(buf)
        start = HEADER_SIZE
    else:
        data = _decompress(codec, memoryview(buf)[HEADER_SIZE:], base_offset)
        start = 0
    return _scan(data, start, base_offset, count, last_delta)


def _scan(data: Any, pos: int, base_offset: int, count: int, last_delta: int) -> KeyedBatch:
    """Read ``count`` records from ``data[pos:]``, which they must fill exactly."""
    end = len(data)
    where = f"batch at offset {base_offset}"
    if count < 0 or count > (end - pos) // (_MIN_RECORD + 1):
        raise BadBatch(f"{where}: record count {count} does not fit in {end - pos} bytes of records")
    offsets = array("q")
    keys = array("q")
    add_offset = offsets.append
    add_key = keys.append
    crc32 = _crc32
    slow = _varint
    previous = -1
    i = 0
    try:
        for i in range(count):
            # record length (zigzag): 1 or 2 bytes for records up to 8 KiB
            b = data[pos]
            if b < 0x80:
                length = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                b2 = data[pos + 1]
                if b2 < 0x80:
                    v = (b & 0x7F) | (b2 << 7)
                    length = (v >> 1) ^ -(v & 1)
                    pos += 2
                else:
                    length, pos = slow(data, pos, 5)
            record_end = pos + length
            if length < _MIN_RECORD or record_end > end:
                raise BadBatch(f"{where}: record {i} has a bad length {length}")
            p = pos + 1  # attributes: unused
            # timestampDelta (varlong): stepped over
            if data[p] < 0x80:
                p += 1
            else:
                _ts, p = slow(data, p, 10)
            # offsetDelta
            b = data[p]
            if b < 0x80:
                delta = (b >> 1) ^ -(b & 1)
                p += 1
            else:
                delta, p = slow(data, p, 5)
            if delta <= previous or delta > last_delta:
                raise BadBatch(f"{where}: record {i} has offset delta {delta} after {previous}"
                               f" (last offset delta {last_delta})")
            previous = delta
            # keyLength, key
            b = data[p]
            if b < 0x80:
                key_len = (b >> 1) ^ -(b & 1)
                p += 1
            else:
                key_len, p = slow(data, p, 5)
            if key_len >= 0:
                if p + key_len > record_end:
                    raise BadBatch(f"{where}: record {i}'s key ({key_len} bytes) overruns the record")
                add_key(crc32(data[p:p + key_len]) | (key_len << 32))
            elif key_len == -1 and p <= record_end:
                add_key(NULL_KEY)
            else:
                raise BadBatch(f"{where}: record {i} has a bad key length {key_len}")
            add_offset(base_offset + delta)
            pos = record_end
    except IndexError:
        raise BadBatch(f"{where}: record {i} is cut off at byte {pos} of {end}") from None
    if pos != end:
        raise BadBatch(f"{where}: {end - pos} bytes after the {count} records the header counts")
    return KeyedBatch(base_offset, offsets, keys)


def _varint(data: Any, pos: int, most: int) -> tuple[int, int]:
    """The zigzag varint at ``data[pos]`` of at most ``most`` bytes, and the position after it.
    (IndexError at the buffer's end: the caller turns it into BadBatch.)"""
    result = 0
    shift = 0
    stop = pos + most
    while pos < stop:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
    raise BadBatch(f"a varint longer than {most} bytes at byte {pos - most}")


# ---------------------------------------------------------------- decompression

_cramjam: Any = None


def _codec_module() -> Any:
    global _cramjam
    if _cramjam is None:
        try:
            import cramjam
        except ImportError:
            return None
        _cramjam = cramjam
    return _cramjam


def _decompress(codec: int, payload: memoryview, base_offset: int) -> bytes:
    if codec > 4:
        raise BadBatch(f"batch at offset {base_offset} has unknown compression codec {codec}")
    name = _CODECS[codec]
    cramjam = _codec_module()
    if cramjam is None:
        raise CodecUnavailable(f"batch at offset {base_offset} is {name}-compressed; reading it needs cramjam")
    try:
        if codec == 1:
            out = cramjam.gzip.decompress(payload)
        elif codec == 2:
            out = _snappy(cramjam, payload)
        elif codec == 3:
            out = cramjam.lz4.decompress(payload)
        else:
            out = cramjam.zstd.decompress(payload)
        return bytes(out)
    except BadBatch as e:
        raise BadBatch(f"batch at offset {base_offset}: {e}") from None
    except Exception as e:  # cramjam.DecompressionError, and whatever else a corrupt stream brings up
        raise BadBatch(f"batch at offset {base_offset}: {name} decompression failed: {e}") from e


def _snappy(cramjam: Any, payload: memoryview) -> Any:
    if payload[:8] != _XERIAL_MAGIC:
        return cramjam.snappy.decompress_raw(payload)
    blocks = []
    pos, n = _XERIAL_HEADER, len(payload)
    raw = cramjam.snappy.decompress_raw
    while pos < n:
        if payload[pos:pos + 8] == _XERIAL_MAGIC:  # a second stream's header (concatenated streams)
            pos += _XERIAL_HEADER
            continue
        if n - pos < 4:
            raise BadBatch(f"xerial snappy block length cut off at byte {pos} of {n}")
        (size,) = _BLOCK_LEN.unpack_from(payload, pos)
        pos += 4
        if size < 0 or pos + size > n:
            raise BadBatch(f"xerial snappy block of {size} bytes at byte {pos} overruns the {n} bytes")
        blocks.append(raw(payload[pos:pos + size]))
        pos += size
    if pos > n:
        raise BadBatch("xerial snappy header cut off")
    return blocks[0] if len(blocks) == 1 else b"".join(blocks)
