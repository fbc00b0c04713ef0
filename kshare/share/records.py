"""Record batch headers, read straight from fetched bytes; record bodies are never decoded.

A Fetch response's ``records`` is a run of record batches (format v2, magic 2). For share groups
the proxy needs, per batch: its offsets, whether it is a control batch or transactional, and its
producer id. Each comes from the fixed 61-byte batch header; the batch itself stays a slice of
the fetched buffer and is handed to consumers as is.
"""

from __future__ import annotations

import logging
import struct
from typing import NamedTuple

log = logging.getLogger("kshare.share")

_HEADER = struct.Struct(">qiibIhiqqqhii")  # v2 batch header, 61 bytes
HEADER_SIZE = _HEADER.size
_LEGACY = struct.Struct(">qi")  # magic 0/1 message set entry: offset, size
_MAGIC_AT = 16

TRANSACTIONAL = 0x10
CONTROL = 0x20


class Batch(NamedTuple):
    base_offset: int
    last_offset: int
    is_control: bool
    is_transactional: bool
    producer_id: int
    record_count: int
    start: int  # position of the batch in the buffer it was read from
    end: int
    max_timestamp: int


def split_batches(buf: memoryview) -> list[Batch]:
    """The complete batches at the start of ``buf`` (a trailing partial batch, which a Fetch may
    return when it hits its byte limit, is left out)."""
    out: list[Batch] = []
    pos, n = 0, len(buf)
    unpack = _HEADER.unpack_from
    while n - pos >= 12:
        base, length = _LEGACY.unpack_from(buf, pos)
        end = pos + 12 + length
        if length < 0 or end > n:
            break
        if n - pos >= 17 and buf[pos + _MAGIC_AT] >= 2:
            if length + 12 < HEADER_SIZE:
                log.warning("record batch at offset %d is too short (%d bytes); skipping the rest", base, length)
                break
            (base, _len, _epoch, _magic, _crc, attributes, last_delta, _ts0, max_ts, producer_id, _pe, _seq,
             count) = unpack(buf, pos)
            out.append(Batch(base, base + last_delta, bool(attributes & CONTROL), bool(attributes & TRANSACTIONAL),
                             producer_id, count, pos, end, max_ts))
        else:
            # Message format v0/v1 (written by pre-0.11 producers): one entry per offset as far as we
            # can tell without decompressing; the client sees the entry as it was stored.
            out.append(Batch(base, base, False, False, -1, 1, pos, end, -1))
        pos = end
    return out
