"""The bytes of the share-group state topic records (docs/reference/state-format.md)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kshare.share.state import codec as sc
from kshare.share.states import ShareSnapshot, ShareUpdate, StateBatch
from kshare.share.store import GroupRecord, SharePartitionKey

TOPIC_ID = bytes(range(16))
KEY = SharePartitionKey("my-share-group", TOPIC_ID, 7)

keys = st.builds(
    SharePartitionKey,
    st.text(max_size=40),
    st.binary(min_size=16, max_size=16),
    st.integers(0, 2**31 - 1),
)
batches = st.lists(
    st.tuples(
        st.integers(0, 2**62),
        st.integers(0, 2**20),
        st.sampled_from([0, 2, 4]),
        st.integers(0, 0x7FFF),
    ).map(lambda t: StateBatch(t[0], t[0] + t[1], t[2], t[3])),
    max_size=30,
).map(tuple)


# -- exact bytes ----------------------------------------------------------------------------------


def test_snapshot_key_bytes() -> None:
    key = sc.encode_share_key(sc.RECORD_SNAPSHOT, SharePartitionKey("g1", TOPIC_ID, 3))
    assert key == b"\x00\x00" + b"\x00\x02g1" + TOPIC_ID + b"\x00\x00\x00\x03"


def test_update_key_differs_only_in_the_type() -> None:
    snap = sc.encode_share_key(sc.RECORD_SNAPSHOT, KEY)
    upd = sc.encode_share_key(sc.RECORD_UPDATE, KEY)
    assert upd[:2] == b"\x00\x01" and upd[2:] == snap[2:]


def test_group_key_bytes() -> None:
    assert sc.encode_group_key("g1") == b"\x00\x02\x00\x02g1"


def test_group_value_bytes() -> None:
    value = sc.encode_group_value(
        GroupRecord("g1", 4, {"share.auto.offset.reset": "earliest"}, {TOPIC_ID: "t"}, {TOPIC_ID: 3})
    )
    expected = (
        b"\x00\x00"  # value version 0
        + struct.pack(">i", 4)  # group epoch
        + b"\x02"  # 1 config
        + b"\x18share.auto.offset.reset"
        + b"\x09earliest"
        + b"\x00"  # compact strings, tags
        + b"\x02"
        + TOPIC_ID
        + b"\x02t"
        + b"\x00"  # 1 topic: id, name
        + b"\x02"
        + TOPIC_ID
        + struct.pack(">i", 3)
        + b"\x00"  # 1 partition count
        + b"\x00"
    )
    assert value == expected


def test_snapshot_value_bytes() -> None:
    value = sc.encode_snapshot_value(2, 5, 0, ShareSnapshot(560, (StateBatch(560, 560, 0, 1),)))
    expected = (
        b"\x00\x00"  # value version 0
        + struct.pack(">HiiQ", 2, 5, 0, 560)  # snapshot epoch, state epoch, leader epoch, start offset
        + b"\x02"  # compact array: 1 batch
        + struct.pack(">qqbh", 560, 560, 0, 1)
        + b"\x00"  # batch tagged fields
        + b"\x00"  # value tagged fields
    )
    assert value == expected
    assert len(value) == sc.snapshot_value_size(1)


def test_update_value_bytes() -> None:
    value = sc.encode_update_value(1, 0, ShareUpdate(-1, (StateBatch(110, 110, 0, 1),)))
    expected = (
        b"\x00\x00"
        + struct.pack(">Hiq", 1, 0, -1)
        + b"\x02"
        + struct.pack(">qqbh", 110, 110, 0, 1)
        + b"\x00"
        + b"\x00"
    )
    assert value == expected
    assert len(value) == sc.update_value_size(1)


@pytest.mark.parametrize("n", [0, 1, 5, 126, 127, 128, 2000, 20000])
def test_sizes(n: int) -> None:
    bs = tuple(StateBatch(i * 2, i * 2, 0, 1) for i in range(n))
    assert len(sc.encode_snapshot_value(0, 0, 0, ShareSnapshot(0, bs))) == sc.snapshot_value_size(n)
    assert len(sc.encode_update_value(0, 0, ShareUpdate(-1, bs))) == sc.update_value_size(n)


# -- round trips ----------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(keys, st.integers(0, 2**16 - 1), st.integers(-(2**31), 2**31 - 1), st.integers(-1, 2**62), batches)
def test_snapshot_round_trip(key, epoch, state_epoch, start, bs) -> None:
    rec = sc.decode_record(
        sc.encode_share_key(sc.RECORD_SNAPSHOT, key),
        sc.encode_snapshot_value(epoch, state_epoch, 3, ShareSnapshot(start, bs)),
    )
    assert rec == sc.SnapshotRecord(key, epoch, state_epoch, 3, ShareSnapshot(start, bs))


@settings(max_examples=200, deadline=None)
@given(keys, st.integers(0, 2**16 - 1), st.integers(-1, 2**62), batches)
def test_update_round_trip(key, epoch, start, bs) -> None:
    rec = sc.decode_record(
        sc.encode_share_key(sc.RECORD_UPDATE, key), sc.encode_update_value(epoch, 0, ShareUpdate(start, bs))
    )
    assert rec == sc.UpdateRecord(key, epoch, 0, ShareUpdate(start, bs))


def test_snapshot_epoch_wraps() -> None:
    rec = sc.decode_record(
        sc.encode_share_key(sc.RECORD_SNAPSHOT, KEY),
        sc.encode_snapshot_value(65537, 0, 0, ShareSnapshot(0, ())),
    )
    assert rec.snapshot_epoch == 1


@settings(max_examples=100, deadline=None)
@given(
    st.text(max_size=30),
    st.integers(-(2**31), 2**31 - 1),
    st.dictionaries(st.text(max_size=20), st.text(max_size=20), max_size=5),
    st.dictionaries(st.binary(min_size=16, max_size=16), st.text(max_size=20), max_size=5),
    st.dictionaries(st.binary(min_size=16, max_size=16), st.integers(0, 2**31 - 1), max_size=5),
)
def test_group_round_trip(group, epoch, configs, topics, topic_partitions) -> None:
    record = GroupRecord(group, epoch, configs, topics, topic_partitions)
    rec = sc.decode_record(sc.encode_group_key(group), sc.encode_group_value(record))
    assert rec == sc.GroupValueRecord(record)


def test_tombstones() -> None:
    assert sc.decode_record(sc.encode_share_key(sc.RECORD_SNAPSHOT, KEY), None) == sc.ShareTombstone(KEY)
    assert sc.decode_record(sc.encode_share_key(sc.RECORD_UPDATE, KEY), None) == sc.ShareTombstone(KEY)
    assert sc.decode_record(sc.encode_group_key("g"), None) == sc.GroupTombstone("g")


# -- what replay skips ----------------------------------------------------------------------------

GOOD_KEY = sc.encode_share_key(sc.RECORD_SNAPSHOT, KEY)
GOOD_VALUE = sc.encode_snapshot_value(0, 0, 0, ShareSnapshot(5, (StateBatch(5, 9, 0, 1),)))


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        (None, GOOD_VALUE, "without a key"),
        (b"", GOOD_VALUE, "too short"),
        (b"\x00", GOOD_VALUE, "too short"),
        (b"\x00\x07" + GOOD_KEY[2:], GOOD_VALUE, "unknown record type"),
        (b"\xff\xff" + GOOD_KEY[2:], GOOD_VALUE, "unknown record type"),
        (GOOD_KEY[:-1], GOOD_VALUE, "bad ShareSnapshot key"),
        (GOOD_KEY + b"x", GOOD_VALUE, "trailing bytes"),
        (b"\x00\x00\x7f\xffab", GOOD_VALUE, "bad ShareSnapshot key"),
        (GOOD_KEY, b"", "too short"),
        (GOOD_KEY, b"\x00\x01" + GOOD_VALUE[2:], "unknown ShareSnapshot value version 1"),
        (GOOD_KEY, GOOD_VALUE[:-3], "bad ShareSnapshot value"),
        (GOOD_KEY, GOOD_VALUE + b"\x00", "trailing bytes"),
        (GOOD_KEY, b"not a state record at all", "ShareSnapshot"),
        (
            GOOD_KEY,
            sc.encode_snapshot_value(0, 0, 0, ShareSnapshot(5, (StateBatch(9, 5, 0, 1),))),
            "bad state",
        ),
        (
            GOOD_KEY,
            sc.encode_snapshot_value(0, 0, 0, ShareSnapshot(5, (StateBatch(5, 9, 1, 1),))),
            "delivery",
        ),
        (b"\x00\x00\x00\x02\xc3\x28" + TOPIC_ID + b"\x00\x00\x00\x00", GOOD_VALUE, "bad ShareSnapshot key"),
    ],
)
def test_damaged_records_raise(key, value, message) -> None:
    with pytest.raises(sc.StateRecordError, match=message):
        sc.decode_record(key, value)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64), st.one_of(st.none(), st.binary(max_size=64)))
def test_garbage_raises_only_state_record_error(key, value) -> None:
    try:
        sc.decode_record(key, value)
    except sc.StateRecordError:
        pass


# -- partitioning ---------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=100))
def test_murmur2_matches_kafka_clients(data: bytes) -> None:
    from aiokafka.partitioner import murmur2 as aiokafka_murmur2

    assert sc.murmur2(data) & 0xFFFFFFFF == aiokafka_murmur2(data) & 0xFFFFFFFF


def test_murmur2_known_values() -> None:
    # values from the Java client's partitioner tests
    assert sc.murmur2(b"21") == -973932308
    assert sc.murmur2(b"foobar") == -790332482
    assert sc.murmur2(b"a-little-bit-long-string") == -985981536
    assert sc.murmur2(b"a-little-bit-longer-string") == -1486304829
    assert sc.murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8") == -58897971
    assert sc.murmur2(b"abc") == 479470107


@settings(max_examples=100, deadline=None)
@given(keys, st.integers(1, 64))
def test_every_record_of_a_share_partition_in_one_partition(key, n) -> None:
    p = sc.partition_for(key, n)
    assert 0 <= p < n
    assert sc.partition_for(SharePartitionKey(key.group_id, bytes(key.topic_id), key.partition), n) == p


@settings(max_examples=100, deadline=None)
@given(keys, st.text(max_size=20), st.integers(1, 64))
def test_every_group_of_a_topic_partition_in_one_partition(key, other_group, n) -> None:
    """What lets an instance group own a topic-partition's share state by owning one partition."""
    other = SharePartitionKey(other_group, key.topic_id, key.partition)
    assert sc.partition_for(other, n) == sc.partition_for(key, n) == sc.state_partition_of(key.topic_id, key.partition, n)


def test_keys_spread_over_partitions() -> None:
    hits = {sc.partition_for(SharePartitionKey(f"g{i % 7}", TOPIC_ID, i), 10) for i in range(200)}
    assert hits == set(range(10))


# -- the store's in-place replay step equals states.apply_update -------------------------------------

from kshare.share.state.memory import apply_update_in_place  # noqa: E402
from kshare.share.states import apply_update, normalize, replay  # noqa: E402

spans = st.lists(
    st.tuples(st.integers(0, 5), st.integers(0, 6), st.sampled_from([0, 2, 4]), st.integers(0, 3)),
    max_size=25,
)


def build_state(start: int, parts: list[tuple[int, int, int, int]]) -> ShareSnapshot:
    """A normalized state: contiguous-ish ranges from ``start`` with gaps."""
    out = []
    cursor = max(start, 0)
    for gap, length, state, count in parts:
        first = cursor + gap
        out.append(StateBatch(first, first + length, state, count))
        cursor = first + length + 1
    return normalize(ShareSnapshot(start, tuple(out)))


update_batches = st.lists(
    st.tuples(st.integers(0, 120), st.integers(0, 12), st.sampled_from([0, 2, 4]), st.integers(0, 3)).map(
        lambda t: StateBatch(t[0], t[0] + t[1], t[2], t[3])
    ),
    max_size=6,
)
updates = st.builds(
    ShareUpdate, st.one_of(st.just(-1), st.just(-1), st.integers(0, 140)), update_batches.map(tuple)
)


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.just(-1), st.integers(0, 40)), spans, st.lists(updates, max_size=12))
def test_in_place_replay_equals_apply_update(start, parts, chain) -> None:
    snapshot = build_state(start, parts)
    s, batches = snapshot.start_offset, list(snapshot.state_batches)
    expected = snapshot
    for u in chain:
        expected = apply_update(expected, u)
        s = apply_update_in_place(s, batches, u)
        assert ShareSnapshot(s, tuple(batches)) == expected
    assert ShareSnapshot(s, tuple(batches)) == replay(snapshot, chain)


def test_in_place_replay_rejects_bad_batches() -> None:
    with pytest.raises(ValueError):
        apply_update_in_place(0, [], ShareUpdate(-1, (StateBatch(5, 4, 0, 1),)))


# -- the fast decoding path and the normalized check --------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.integers(-1, 200), spans)
def test_is_normalized(start, parts) -> None:
    raw = build_state(max(start, 0), parts)  # sorted, may be unmerged after re-splitting below
    split = tuple(
        piece
        for b in raw.state_batches
        for piece in (
            (b,)
            if b.first_offset == b.last_offset
            else (b._replace(last_offset=b.first_offset), b._replace(first_offset=b.first_offset + 1))
        )
    )
    for candidate in (ShareSnapshot(start, raw.state_batches), ShareSnapshot(start, split)):
        assert sc.is_normalized(candidate) == (normalize(candidate) == candidate)


@settings(max_examples=200, deadline=None)
@given(keys, st.integers(0, 2**16 - 1), st.integers(-1, 2**62), batches)
def test_fast_and_spec_codec_decode_agree(key, epoch, start, bs) -> None:
    """A value with tagged fields takes the spec codec; without, the fast path: same result."""
    codec = sc._value_codec(sc.RECORD_SNAPSHOT)
    cls = codec.cls
    msg = cls(
        snapshot_epoch=epoch,
        state_epoch=1,
        leader_epoch=2,
        start_offset=start,
        state_batches=[
            cls.StateBatch(
                first_offset=b[0],
                last_offset=b[1],
                delivery_state=b[2],
                delivery_count=b[3],
                unknown_tags={9: b"x"},
            )
            for b in bs
        ],
        unknown_tags={7: b"future"},
    )
    tagged = b"\x00\x00" + bytes(codec.encode(msg))
    plain = sc.encode_snapshot_value(epoch, 1, 2, ShareSnapshot(start, bs))
    k = sc.encode_share_key(sc.RECORD_SNAPSHOT, key)
    assert sc._fast_value(sc._SNAPSHOT_HEAD, memoryview(plain)) is not None
    assert sc._fast_value(sc._SNAPSHOT_HEAD, memoryview(tagged)) is None
    assert (
        sc.decode_record(k, tagged)
        == sc.decode_record(k, plain)
        == sc.SnapshotRecord(key, epoch, 1, 2, ShareSnapshot(start, bs))
    )
