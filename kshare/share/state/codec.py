"""Bytes of the records on the share-group state topic (see ``docs/reference/state-format.md``).

Every record's key starts with an int16 *record type* (Kafka calls it the key version, and
Apache Kafka's ``__share_group_state`` uses the same convention: 0 ShareSnapshot, 1 ShareUpdate),
followed by the key struct of that type. A value starts with an int16 *value version* followed by
the value struct. kshare adds record type 2 (share group record). A null value is a tombstone: it
deletes what its key names.

The structs come from the spec files ``protocol_specs/Share*Key.json`` / ``Share*Value.json`` /
``ShareGroupRecord*.json`` through the spec-driven codec. Everything here is pure: no I/O.
"""

from __future__ import annotations

import operator
import struct
from dataclasses import dataclass
from itertools import repeat
from typing import Final

from kshare.protocol.codegen import DecodeError, codec_for
from kshare.protocol.spec import load_spec

from ..states import ShareSnapshot, ShareUpdate, StateBatch
from ..store import GroupRecord, SharePartitionKey

RECORD_SNAPSHOT: Final = 0
RECORD_UPDATE: Final = 1
RECORD_GROUP: Final = 2
RECORD_TYPES: Final = {
    RECORD_SNAPSHOT: "ShareSnapshot",
    RECORD_UPDATE: "ShareUpdate",
    RECORD_GROUP: "ShareGroupRecord",
}

#: The value version written by this code, per record type (the only one it reads).
VALUE_VERSION: Final = 0

#: Delivery states a state batch may carry (Acquired is never persisted).
DURABLE_STATES: Final = frozenset((0, 2, 4))
_TERMINAL: Final = frozenset((2, 4))

SNAPSHOT_EPOCH_MODULUS: Final = 1 << 16  # the snapshot epoch is a uint16; it wraps

_I16 = struct.Struct(">h")

_KEY_SPECS = {
    RECORD_SNAPSHOT: "ShareSnapshotKey",
    RECORD_UPDATE: "ShareUpdateKey",
    RECORD_GROUP: "ShareGroupRecordKey",
}
_VALUE_SPECS = {
    RECORD_SNAPSHOT: "ShareSnapshotValue",
    RECORD_UPDATE: "ShareUpdateValue",
    RECORD_GROUP: "ShareGroupRecordValue",
}


class StateRecordError(ValueError):
    """The bytes are not a state record this code understands (damaged, foreign or a newer version)."""


def _key_codec(record_type: int):
    return codec_for(load_spec(_KEY_SPECS[record_type]), record_type)


def _value_codec(record_type: int):
    return codec_for(load_spec(_VALUE_SPECS[record_type]), VALUE_VERSION)


# -- decoded records ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SnapshotRecord:
    key: SharePartitionKey
    snapshot_epoch: int
    state_epoch: int
    leader_epoch: int
    snapshot: ShareSnapshot


@dataclass(frozen=True, slots=True)
class UpdateRecord:
    key: SharePartitionKey
    snapshot_epoch: int
    leader_epoch: int
    update: ShareUpdate


@dataclass(frozen=True, slots=True)
class GroupValueRecord:
    record: GroupRecord


@dataclass(frozen=True, slots=True)
class ShareTombstone:
    """Null value under a ShareSnapshot/ShareUpdate key: forget the share-partition."""

    key: SharePartitionKey


@dataclass(frozen=True, slots=True)
class GroupTombstone:
    """Null value under a group record key: forget the group record."""

    group_id: str


StateRecord = SnapshotRecord | UpdateRecord | GroupValueRecord | ShareTombstone | GroupTombstone


# -- keys -----------------------------------------------------------------------------------------


def encode_share_key(record_type: int, key: SharePartitionKey) -> bytes:
    """Key of a ShareSnapshot (type 0) or ShareUpdate (type 1) record for ``key``."""
    if record_type not in (RECORD_SNAPSHOT, RECORD_UPDATE):
        raise ValueError(f"not a share-partition record type: {record_type}")
    if len(key.topic_id) != 16:
        raise ValueError(f"topic id must be 16 bytes, got {len(key.topic_id)}")
    codec = _key_codec(record_type)
    out = bytearray(_I16.pack(record_type))
    codec.encode(codec.cls(group_id=key.group_id, topic_id=bytes(key.topic_id), partition=key.partition), out)
    return bytes(out)


def encode_group_key(group_id: str) -> bytes:
    codec = _key_codec(RECORD_GROUP)
    out = bytearray(_I16.pack(RECORD_GROUP))
    codec.encode(codec.cls(group_id=group_id), out)
    return bytes(out)


def decode_key(data: bytes | memoryview) -> tuple[int, SharePartitionKey | str]:
    """(record type, share-partition key or group id); raises StateRecordError."""
    if data is None:
        raise StateRecordError("record without a key")
    buf = memoryview(data)
    if len(buf) < 2:
        raise StateRecordError(f"key of {len(buf)} bytes is too short")
    (record_type,) = _I16.unpack_from(buf, 0)
    if record_type not in _KEY_SPECS:
        raise StateRecordError(f"unknown record type (key version) {record_type}")
    try:
        msg, end = _key_codec(record_type).decode(buf, 2)
    except DecodeError as exc:
        raise StateRecordError(f"bad {RECORD_TYPES[record_type]} key: {exc}") from None
    if end != len(buf):
        raise StateRecordError(f"{len(buf) - end} trailing bytes after the {RECORD_TYPES[record_type]} key")
    if record_type == RECORD_GROUP:
        return record_type, msg.group_id
    return record_type, SharePartitionKey(msg.group_id, bytes(msg.topic_id), msg.partition)


# -- values ---------------------------------------------------------------------------------------


def _batch_structs(cls, batches) -> list:
    make = cls.StateBatch
    return [
        make(first_offset=b[0], last_offset=b[1], delivery_state=b[2], delivery_count=b[3]) for b in batches
    ]


def encode_snapshot_value(
    snapshot_epoch: int, state_epoch: int, leader_epoch: int, snapshot: ShareSnapshot
) -> bytes:
    codec = _value_codec(RECORD_SNAPSHOT)
    cls = codec.cls
    msg = cls(
        snapshot_epoch=snapshot_epoch % SNAPSHOT_EPOCH_MODULUS,
        state_epoch=state_epoch,
        leader_epoch=leader_epoch,
        start_offset=snapshot.start_offset,
        state_batches=_batch_structs(cls, snapshot.state_batches),
    )
    out = bytearray(_I16.pack(VALUE_VERSION))
    return bytes(codec.encode(msg, out))


def encode_update_value(snapshot_epoch: int, leader_epoch: int, update: ShareUpdate) -> bytes:
    codec = _value_codec(RECORD_UPDATE)
    cls = codec.cls
    msg = cls(
        snapshot_epoch=snapshot_epoch % SNAPSHOT_EPOCH_MODULUS,
        leader_epoch=leader_epoch,
        start_offset=update.start_offset,
        state_batches=_batch_structs(cls, update.state_batches),
    )
    out = bytearray(_I16.pack(VALUE_VERSION))
    return bytes(codec.encode(msg, out))


def encode_group_value(record: GroupRecord) -> bytes:
    codec = _value_codec(RECORD_GROUP)
    cls = codec.cls
    msg = cls(
        group_epoch=record.group_epoch,
        configs=[cls.GroupConfig(name=k, value=v) for k, v in sorted(record.configs.items())],
        topics=[cls.GroupTopic(topic_id=bytes(t), topic_name=n) for t, n in sorted(record.topics.items())],
        topic_partition_counts=[
            cls.GroupTopicPartitionCount(topic_id=bytes(t), partition_count=n)
            for t, n in sorted(record.topic_partitions.items())
        ],
    )
    out = bytearray(_I16.pack(VALUE_VERSION))
    return bytes(codec.encode(msg, out))


def _value(record_type: int, data: bytes | memoryview):
    buf = memoryview(data)
    name = RECORD_TYPES[record_type]
    if len(buf) < 2:
        raise StateRecordError(f"{name} value of {len(buf)} bytes is too short")
    (version,) = _I16.unpack_from(buf, 0)
    if version != VALUE_VERSION:
        raise StateRecordError(f"unknown {name} value version {version}")
    try:
        msg, end = _value_codec(record_type).decode(buf, 2)
    except DecodeError as exc:
        raise StateRecordError(f"bad {name} value: {exc}") from None
    if end != len(buf):
        raise StateRecordError(f"{len(buf) - end} trailing bytes after the {name} value")
    return msg


def _batches(msg, name: str) -> tuple[StateBatch, ...]:
    out = []
    for b in msg.state_batches:
        if b.first_offset > b.last_offset or b.first_offset < 0:
            raise StateRecordError(f"{name}: bad state batch {b.first_offset}-{b.last_offset}")
        if b.delivery_state not in DURABLE_STATES or b.delivery_count < 0:
            raise StateRecordError(
                f"{name}: bad delivery state {b.delivery_state} / count {b.delivery_count} "
                f"in state batch {b.first_offset}-{b.last_offset}"
            )
        out.append(StateBatch(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count))
    return tuple(out)


# The common case decoded with struct.iter_unpack instead of one object per state batch: no tagged
# fields anywhere (every batch ends in a zero tag count, and so does the value). Anything else, and
# anything that fails a check, goes through the spec codec, which also words the error.
_SNAPSHOT_HEAD = struct.Struct(">hHiiq")  # value version, snapshot epoch, state epoch, leader epoch, start
_UPDATE_HEAD = struct.Struct(">hHiq")  # value version, snapshot epoch, leader epoch, start offset
_BATCH = struct.Struct(">qqbhx")  # first, last, delivery state, delivery count, (empty) tagged fields
_tuple_new = tuple.__new__  # tuple.__new__(StateBatch, row) is what StateBatch._make does, in C


def _fast_value(head: struct.Struct, buf: memoryview) -> tuple[tuple, tuple[StateBatch, ...]] | None:
    pos = head.size
    if len(buf) < pos + 2:
        return None
    fields = head.unpack_from(buf, 0)
    if fields[0] != VALUE_VERSION:
        return None
    n1 = buf[pos]
    pos += 1
    if n1 >= 0x80:  # a longer varint
        shift = 7
        n1 &= 0x7F
        while True:
            if pos >= len(buf) or shift > 28:
                return None
            b = buf[pos]
            pos += 1
            n1 |= (b & 0x7F) << shift
            if b < 0x80:
                break
            shift += 7
    if n1 == 0:
        return None
    n = n1 - 1
    end = pos + _BATCH.size * n
    if end + 1 != len(buf) or buf[end] != 0:
        return None
    if not n:
        return fields, ()
    if bytes(buf[pos + 19 : end : 20]) != bytes(n):
        return None
    rows = list(_BATCH.iter_unpack(buf[pos:end]))
    firsts, lasts, states, counts = zip(*rows, strict=True)
    if min(firsts) < 0 or min(counts) < 0 or not DURABLE_STATES.issuperset(states):
        return None
    if not all(map(operator.le, firsts, lasts)):
        return None
    return fields, tuple(map(_tuple_new, repeat(StateBatch), rows))


def decode_record(key: bytes | memoryview | None, value: bytes | memoryview | None) -> StateRecord:
    """Decode one state-topic record; raises StateRecordError for anything it does not understand."""
    record_type, k = decode_key(key)  # type: ignore[arg-type]
    if value is None:
        if record_type == RECORD_GROUP:
            return GroupTombstone(k)  # type: ignore[arg-type]
        return ShareTombstone(k)  # type: ignore[arg-type]
    if record_type == RECORD_SNAPSHOT:
        fast = _fast_value(_SNAPSHOT_HEAD, memoryview(value))
        if fast is not None:
            (_, epoch, state_epoch, leader_epoch, start), batches = fast
            return SnapshotRecord(k, epoch, state_epoch, leader_epoch, ShareSnapshot(start, batches))  # type: ignore[arg-type]
    elif record_type == RECORD_UPDATE:
        fast = _fast_value(_UPDATE_HEAD, memoryview(value))
        if fast is not None:
            (_, epoch, leader_epoch, start), batches = fast
            return UpdateRecord(k, epoch, leader_epoch, ShareUpdate(start, batches))  # type: ignore[arg-type]
    msg = _value(record_type, value)
    if record_type == RECORD_SNAPSHOT:
        snap = ShareSnapshot(msg.start_offset, _batches(msg, "ShareSnapshot"))
        return SnapshotRecord(k, msg.snapshot_epoch, msg.state_epoch, msg.leader_epoch, snap)  # type: ignore[arg-type]
    if record_type == RECORD_UPDATE:
        upd = ShareUpdate(msg.start_offset, _batches(msg, "ShareUpdate"))
        return UpdateRecord(k, msg.snapshot_epoch, msg.leader_epoch, upd)  # type: ignore[arg-type]
    rec = GroupRecord(
        group_id=k,  # type: ignore[arg-type]
        group_epoch=msg.group_epoch,
        configs={c.name: c.value for c in msg.configs},
        topics={bytes(t.topic_id): t.topic_name for t in msg.topics},
        topic_partitions={bytes(t.topic_id): t.partition_count for t in msg.topic_partition_counts},
    )
    return GroupValueRecord(rec)


# -- sizes (to choose between a snapshot and an update without encoding both) --------------------


def _uvarint_size(n: int) -> int:
    size = 1
    while n >= 0x80:
        n >>= 7
        size += 1
    return size


def snapshot_value_size(batches: int) -> int:
    """Exact size of a ShareSnapshot value (no tagged fields) with ``batches`` state batches."""
    return 2 + 2 + 4 + 4 + 8 + _uvarint_size(batches + 1) + 20 * batches + 1


def update_value_size(batches: int) -> int:
    """Exact size of a ShareUpdate value (no tagged fields) with ``batches`` state batches."""
    return 2 + 2 + 4 + 8 + _uvarint_size(batches + 1) + 20 * batches + 1


# -- partitioning ---------------------------------------------------------------------------------


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (the Java client's default partitioner hash), as a signed int32."""
    length = len(data)
    seed = 0x9747B28C
    m = 0x5BD1E995
    r = 24
    h = (seed ^ length) & 0xFFFFFFFF
    n4 = length // 4
    for i in range(n4):
        k = int.from_bytes(data[i * 4 : i * 4 + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    rest = length & 3
    tail = n4 * 4
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def is_normalized(snapshot: ShareSnapshot) -> bool:
    """True when :func:`states.normalize` would return ``snapshot`` unchanged (cheap check)."""
    b = snapshot.state_batches
    if not b:
        return True
    start = snapshot.start_offset
    first = b[0]
    if start >= 0 and (
        first.first_offset < start or (first.first_offset == start and first.delivery_state in _TERMINAL)
    ):
        return False
    if len(b) == 1:
        return True
    firsts, lasts, states, counts = zip(*b, strict=True)
    if not all(map(operator.lt, lasts[:-1], firsts[1:])):  # sorted, no overlap
        return False
    # no two touching neighbours with the same state and count (merge_batches would join them)
    ends = zip(map(operator.add, lasts[:-1], repeat(1)), states[:-1], counts[:-1], strict=True)
    starts = zip(firsts[1:], states[1:], counts[1:], strict=True)
    return not any(map(operator.eq, ends, starts))


def partition_of_key_bytes(key: bytes, partitions: int) -> int:
    """State-topic partition of a record: murmur2 of the key after its 2-byte type, positive, mod N.

    ShareSnapshot and ShareUpdate keys of one share-partition differ only in the type, so every
    record of a share-partition lands in the same partition, in write order.
    """
    return (murmur2(key[2:]) & 0x7FFFFFFF) % partitions


def state_partition_of(topic_id: bytes, partition: int, partitions: int) -> int:
    """The state partition of every share group's state of this topic-partition (docs/reference/state-format.md)."""
    return (murmur2(topic_id + struct.pack(">i", partition)) & 0x7FFFFFFF) % partitions


def partition_for(key: SharePartitionKey, partitions: int) -> int:
    return state_partition_of(key.topic_id, key.partition, partitions)


def partition_for_group(group_id: str, partitions: int) -> int:
    return partition_of_key_bytes(encode_group_key(group_id), partitions)


__all__ = [
    "RECORD_GROUP",
    "RECORD_SNAPSHOT",
    "RECORD_UPDATE",
    "GroupTombstone",
    "GroupValueRecord",
    "ShareTombstone",
    "SnapshotRecord",
    "StateRecord",
    "StateRecordError",
    "UpdateRecord",
    "decode_key",
    "decode_record",
    "encode_group_key",
    "encode_group_value",
    "encode_share_key",
    "encode_snapshot_value",
    "encode_update_value",
    "murmur2",
    "partition_for",
    "state_partition_of",
    "partition_for_group",
    "snapshot_value_size",
    "update_value_size",
]
