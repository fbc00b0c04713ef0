"""kshare.share.record_keys: record keys out of real record batches, and nothing but BadBatch on bad ones.

Batches come from aiokafka's DefaultRecordBatchBuilder (a real producer-side encoder). To be sure
every codec is exercised (the builder sends a batch uncompressed when compression does not pay),
the property test builds the batch uncompressed, then compresses the records section itself with
each codec and framing (aiokafka's encoders: gzip, xerial-framed snappy as the Java producer writes
it, lz4 frames, zstd; plus raw snappy as librdkafka writes it, xerial with many small blocks, and
two concatenated xerial streams) and fixes length, attributes and CRC. aiokafka's own decoder must
read the result back to the generated records (so the test batches are valid), and batch_keys must
give the same offsets and ``key_hash(key)``/None per record.
"""

from __future__ import annotations

import struct
import sys
import zlib

import pytest
from aiokafka.codec import gzip_encode, lz4_encode, snappy_encode, zstd_encode
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from aiokafka.record.legacy_records import LegacyRecordBatchBuilder
from aiokafka.record.util import calc_crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kshare.share import record_keys
from kshare.share.record_keys import NULL_KEY, BadBatch, CodecUnavailable, KeyedBatch, batch_keys, key_hash
from kshare.share.records import HEADER_SIZE, split_batches

NONE, GZIP, SNAPPY, LZ4, ZSTD = range(5)
T0 = 1_700_000_000_000


def _xerial_small_blocks(data: bytes) -> bytes:
    return snappy_encode(data, xerial_compatible=True, xerial_blocksize=64)


def _xerial_twice(data: bytes) -> bytes:
    half = len(data) // 2
    return snappy_encode(data[:half]) + snappy_encode(data[half:])


# name -> (codec, encoder of the records section)
ENCODINGS = {
    "none": (NONE, None),
    "gzip": (GZIP, gzip_encode),
    "gzip-2-members": (GZIP, lambda d: gzip_encode(d[: len(d) // 3]) + gzip_encode(d[len(d) // 3:])),
    "snappy-xerial": (SNAPPY, snappy_encode),
    "snappy-xerial-64B-blocks": (SNAPPY, _xerial_small_blocks),
    "snappy-xerial-concatenated": (SNAPPY, _xerial_twice),
    "snappy-raw": (SNAPPY, lambda d: snappy_encode(d, xerial_compatible=False)),
    "lz4": (LZ4, lz4_encode),
    "zstd": (ZSTD, zstd_encode),
}

Record = tuple[int, int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]


def build(records: list[Record], base_offset: int = 0, encoding: str = "none", transactional: bool = False,
          attributes_or: int = 0) -> bytes:
    """One v2 batch of ``records`` (offset delta, timestamp, key, value, headers), compressed as
    ``encoding`` says."""
    builder = DefaultRecordBatchBuilder(2, NONE, int(transactional), 7 if transactional else -1, 0, 0, 1 << 30)
    for delta, timestamp, key, value, headers in records:
        assert builder.append(delta, timestamp, key, value, headers) is not None
    batch = bytearray(builder.build())
    codec, encode = ENCODINGS[encoding]
    if encode is not None:
        batch[HEADER_SIZE:] = encode(bytes(batch[HEADER_SIZE:]))
    attributes = struct.unpack_from(">h", batch, 21)[0] | codec | attributes_or
    struct.pack_into(">h", batch, 21, attributes)
    return _seal(batch, base_offset)


def _seal(batch: bytearray, base_offset: int | None = None) -> bytes:
    """Fix base offset (if given), length and CRC after an edit."""
    if base_offset is not None:
        struct.pack_into(">q", batch, 0, base_offset)
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    if len(batch) >= 21:
        struct.pack_into(">I", batch, 17, calc_crc32c(bytes(batch[21:])))
    return bytes(batch)


def reference(buf: bytes) -> list[tuple[int, bytes | None]]:
    """(offset, key) per record, as aiokafka's decoder reads the batch."""
    batch = DefaultRecordBatch(bytes(buf))
    assert batch.validate_crc()
    return [(r.offset, r.key) for r in batch]


# ---------------------------------------------------------------- strategies

small = st.binary(max_size=40)
repeated = st.builds(lambda n, b: b * n, st.integers(1, 20_000), st.binary(min_size=1, max_size=4))  # compressible
sized = st.one_of(small, st.binary(min_size=100, max_size=3000), repeated)
keys = st.one_of(st.none(), st.sampled_from([b"", b"a", b"order-1", b"order-2", b"\x00" * 16]), small,
                 st.binary(min_size=200, max_size=20_000))
values = st.one_of(st.none(), sized)
headers = st.lists(st.tuples(st.text(max_size=10), st.one_of(st.none(), small)), max_size=3)


@st.composite
def batches(draw: st.DrawFn) -> list[Record]:
    n = draw(st.integers(1, 40))
    gaps = draw(st.lists(st.integers(1, 3) | st.integers(4, 100_000), min_size=n, max_size=n))
    out: list[Record] = []
    delta = draw(st.integers(0, 5))
    for i in range(n):
        timestamp = T0 + draw(st.integers(-(2**40), 2**40) | st.integers(-2, 300))
        out.append((delta, timestamp, draw(keys), draw(values), draw(headers)))
        delta += gaps[i]
    return out


base_offsets = st.integers(0, 2**62) | st.integers(0, 1000)
PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                         HealthCheck.data_too_large])


# ---------------------------------------------------------------- against the reference


@PROPS
@given(records=batches(), base_offset=base_offsets, encoding=st.sampled_from(sorted(ENCODINGS)))
def test_keys_match_the_reference_decoder(records: list[Record], base_offset: int, encoding: str) -> None:
    buf = build(records, base_offset, encoding)
    ref = reference(build(records, base_offset))
    assert [(o - base_offset, k) for o, k in ref] == [(r[0], r[2]) for r in records]
    if encoding != "snappy-xerial-concatenated":  # (which aiokafka's decoder does not read)
        assert reference(buf) == ref  # a valid batch
    for view in (buf, memoryview(buf), bytearray(buf)):
        got = batch_keys(view)
        assert got.base_offset == base_offset
        assert list(got.offsets) == [o for o, _ in ref]
        assert list(got) == [(o, None if k is None else key_hash(k)) for o, k in ref]
    for offset, key in ref:
        assert got.key_of(offset) == (None if key is None else key_hash(key))
    # equal keys <-> one entry in by_key (identities of different keys may collide, so only one way)
    by_key: dict[bytes, list[int]] = {}
    for offset, key in ref:
        if key is not None:
            by_key.setdefault(key, []).append(offset)
    for key, offsets in by_key.items():
        assert set(offsets) <= set(got.offsets_of(key_hash(key)))
    assert sorted(o for os_ in got.by_key().values() for o in os_) == sorted(o for o, k in ref if k is not None)
    assert got.has_keys() == bool(by_key)


@pytest.mark.parametrize("codec", [NONE, GZIP, SNAPPY, LZ4, ZSTD])
def test_batches_compressed_by_the_builder(codec: int) -> None:
    """The builder's own compression (what aiokafka producers send), over compressible records."""
    builder = DefaultRecordBatchBuilder(2, codec, 0, -1, -1, -1, 1 << 20)
    expected = []
    for i in range(2000):
        key = None if i % 10 == 0 else b"customer-%d" % (i % 37)
        assert builder.append(i, T0 + i, key, b'{"amount": %d, "currency": "EUR"}' % i * 4, [("h", b"v")])
        expected.append((100 + i, None if key is None else key_hash(key)))
    buf = bytearray(builder.build())
    assert buf[22] & 0x07 == codec
    if codec == SNAPPY:
        assert buf[HEADER_SIZE:HEADER_SIZE + 8] == b"\x82SNAPPY\x00"  # aiokafka writes xerial, as Java does
    got = batch_keys(_seal(buf, 100))
    assert list(got) == expected
    assert got.offsets_of(key_hash(b"customer-1")) == [100 + i for i in range(2000) if i % 37 == 1 and i % 10]


def test_split_batches_slices_feed_batch_keys() -> None:
    one = build([(0, T0, b"a", b"x", []), (1, T0, None, b"y", [])], 10, "lz4")
    two = build([(0, T0, b"b", None, []), (2, T0, b"a", b"z", [])], 12, "zstd")
    view = memoryview(one + two + two[:30])  # and a partial batch at the end, as Fetch may return
    got = [batch_keys(view[b.start:b.end]) for b in split_batches(view)]
    assert [list(k) for k in got] == [[(10, key_hash(b"a")), (11, None)], [(12, key_hash(b"b")), (14, key_hash(b"a"))]]


# ---------------------------------------------------------------- KeyedBatch


def test_key_of_and_offsets_of_with_gaps() -> None:
    records: list[Record] = [(d, T0, k, b"v", []) for d, k in
                             [(0, b"a"), (3, b"b"), (4, None), (9, b"a"), (10, b"c"), (200, b"a")]]
    got = batch_keys(build(records, 1000))
    a, b, c = key_hash(b"a"), key_hash(b"b"), key_hash(b"c")
    assert list(got.offsets) == [1000, 1003, 1004, 1009, 1010, 1200]
    assert list(got.keys) == [a, b, NULL_KEY, a, c, a]
    assert [got.key_of(o) for o in (999, 1000, 1001, 1003, 1004, 1009, 1010, 1011, 1200, 1201)] == [
        None, a, None, b, None, a, c, None, a, None]
    assert got.offsets_of(a) == [1000, 1009, 1200]
    assert got.offsets_of(key_hash(b"zzz")) == []
    assert got.by_key() == {a: [1000, 1009, 1200], b: [1003], c: [1010]}
    assert len(got) == 6 and got.has_keys() and "records=6" in repr(got)


def test_key_hash_is_stable_and_null_is_distinct_from_empty() -> None:
    assert key_hash(b"") == 0 != NULL_KEY
    assert key_hash(b"order-1") == zlib.crc32(b"order-1") | (7 << 32) == 33_834_631_151  # same in every process
    assert key_hash(memoryview(b"xorder-1")[1:]) == key_hash(bytearray(b"order-1"))
    got = batch_keys(build([(0, T0, b"", b"v", []), (1, T0, None, b"v", [])]))
    assert list(got) == [(0, 0), (1, None)] and got.has_keys()
    assert not batch_keys(build([(0, T0, None, b"v", [])])).has_keys()


def test_control_and_legacy_batches_are_keyless() -> None:
    control = build([(0, T0, b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x05", [])], 50, transactional=True,
                    attributes_or=0x20)
    got = batch_keys(control)
    assert isinstance(got, KeyedBatch) and len(got) == 0 and got.key_of(50) is None and got.by_key() == {}
    for magic in (0, 1):
        for codec in (NONE, GZIP):
            legacy = LegacyRecordBatchBuilder(magic, codec, 1 << 20)
            for i in range(3):
                legacy.append(i, T0, b"k%d" % i, b"v" * 100)
            buf = bytes(legacy.build())
            entries = split_batches(memoryview(buf))
            assert len(entries) == (1 if codec else 3)
            for entry in entries:
                got = batch_keys(buf[entry.start:entry.end])
                assert len(got) == 0 and got.key_of(entry.base_offset) is None


# ---------------------------------------------------------------- bad input


def _raises(buf: bytes | bytearray, match: str) -> None:
    with pytest.raises(BadBatch, match=match):
        batch_keys(buf)


@pytest.mark.parametrize("encoding", ["none", "gzip", "snappy-xerial", "snappy-raw", "lz4", "zstd"])
def test_record_count_mismatch(encoding: str) -> None:
    buf = bytearray(build([(i, T0, b"k", b"v" * 50, []) for i in range(5)], 0, encoding))
    for count in (4, 6, 10**6, -1):
        struct.pack_into(">i", buf, 57, count)
        _raises(_seal(buf), "record count|bytes after|cut off|does not fit")


def test_specific_bad_batches() -> None:
    good = build([(0, T0, b"key", b"value", [])])
    _raises(good[:-1], "says")  # the length field no longer matches
    _raises(good + b"\x00", "says")  # two batches, or trailing bytes
    _raises(good[:10], "too few")
    _raises(b"", "too few")
    edited = bytearray(good)
    edited[16] = 3
    _raises(edited, "magic 3")
    for codec in (5, 6, 7):
        edited = bytearray(good)
        edited[22] |= codec
        _raises(_seal(edited), f"codec {codec}")
    short = bytearray(good[:40])
    _raises(_seal(short), "less than a v2 header")
    # a varint that never ends: a record length of ten continuation bytes
    _raises(_seal(bytearray(good[:HEADER_SIZE]) + b"\xff" * 10 + b"\x01"), "varint longer than 5|bad length|count")
    # a key longer than its record
    body = bytes([0x00, 0x00, 0x00, 0x40]) + b"k" * 3 + b"\x00\x00"
    _raises(_seal(bytearray(good[:HEADER_SIZE]) + bytes([len(body) * 2]) + body), "overruns the record")
    # offset deltas out of order, and past the header's last offset delta
    twice = bytearray(build([(0, T0, b"a", b"v", []), (1, T0, b"b", b"v", [])]))
    struct.pack_into(">i", twice, 23, 0)
    _raises(_seal(twice), "offset delta 1")
    for encoding in ("gzip", "snappy-raw", "lz4", "zstd"):
        compressed = bytearray(build([(0, T0, b"k", b"v" * 100, [])], 0, encoding))
        _raises(_seal(compressed[:-3]), "decompression failed|overruns|cut off|record count|does not fit|bytes after")
    _raises(_seal(bytearray(build([(0, T0, b"k", b"v", [])], 0, "snappy-xerial"))[:HEADER_SIZE + 12]),
            "header cut off")


def test_codec_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    buf = build([(0, T0, b"k", b"v" * 100, [])], 0, "zstd")
    monkeypatch.setattr(record_keys, "_cramjam", None)
    monkeypatch.setitem(sys.modules, "cramjam", None)  # import cramjam raises ImportError
    with pytest.raises(CodecUnavailable, match="zstd-compressed"):
        batch_keys(buf)
    assert list(batch_keys(build([(0, T0, b"k", b"v", [])]))) == [(0, key_hash(b"k"))]  # uncompressed: fine


def _only_bad_batch(buf: bytes | bytearray) -> None:
    try:
        got = batch_keys(buf)
    except BadBatch:
        return
    assert isinstance(got, KeyedBatch)
    assert all(a < b for a, b in zip(got.offsets, got.offsets[1:], strict=False))


corrupt_settings = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                                    HealthCheck.data_too_large])
small_batches = st.lists(st.tuples(st.one_of(st.none(), small), st.one_of(st.none(), small), headers),
                         min_size=1, max_size=8)


@corrupt_settings
@given(records=small_batches, encoding=st.sampled_from(sorted(ENCODINGS)), data=st.data())
def test_truncated_batches_raise_bad_batch(records: list, encoding: str, data: st.DataObject) -> None:
    buf = build([(i, T0 + i, k, v, h) for i, (k, v, h) in enumerate(records)], 5, encoding)
    cut = data.draw(st.integers(0, len(buf) - 1))
    with pytest.raises(BadBatch):
        batch_keys(buf[:cut])
    if cut >= 12:
        _only_bad_batch(_seal(bytearray(buf[:cut])))  # length fixed: the inside is cut


@corrupt_settings
@given(records=small_batches, encoding=st.sampled_from(sorted(ENCODINGS)), data=st.data())
def test_flipped_bytes_raise_only_bad_batch(records: list, encoding: str, data: st.DataObject) -> None:
    buf = bytearray(build([(i, T0 + i, k, v, h) for i, (k, v, h) in enumerate(records)], 5, encoding))
    flips = data.draw(st.lists(st.tuples(st.integers(0, len(buf) - 1), st.integers(1, 255)), min_size=1, max_size=4))
    for at, xor in flips:
        buf[at] ^= xor
    _only_bad_batch(buf)
    if data.draw(st.booleans()):
        _only_bad_batch(_seal(buf))


@corrupt_settings
@given(codec=st.integers(0, 7), count=st.integers(-5, 50) | st.integers(-(2**31), 2**31 - 1), body=st.binary(max_size=300),
       control=st.booleans())
def test_random_records_sections_raise_only_bad_batch(codec: int, count: int, body: bytes, control: bool) -> None:
    header = bytearray(build([(0, T0, b"k", b"v", [])])[:HEADER_SIZE])
    struct.pack_into(">h", header, 21, codec | (0x20 if control else 0))
    struct.pack_into(">i", header, 57, count)
    struct.pack_into(">i", header, 23, 2**31 - 1)
    _only_bad_batch(_seal(header + body))
    if codec == SNAPPY:
        _only_bad_batch(_seal(header + b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01" + body))


def test_share_fetch_delivers_a_batch_whose_keys_cannot_be_read_as_keyless_and_warns_once(caplog):
    """ShareFetch of a key-ordered group: a corrupt batch (here: a zstd frame that is not one) gives
    no keys (its records go out unordered, nothing is lost) and one warning per share-partition;
    batches the engine already knows the keys of are not read again."""
    from types import SimpleNamespace

    from kshare.share.handlers.share_fetch import _record_keys

    good = build([(0, 0, b"k", b"v", []), (1, 0, b"k", b"w", [])], base_offset=10)
    bad = bytearray(build([(0, 0, b"k", b"v", [])], base_offset=12))
    struct.pack_into(">h", bad, 21, struct.unpack_from(">h", bad, 21)[0] | ZSTD)
    bad = _seal(bad)
    batches = [(b, memoryview(good if b.base_offset == 10 else bad)) for b in
               split_batches(memoryview(good)) + split_batches(memoryview(bad))]
    sp = SimpleNamespace(keys_warned=False, key=SimpleNamespace(group_id="g", partition=0),
                         topic=SimpleNamespace(name="t"))
    with caplog.at_level("WARNING", logger="kshare.share"):
        keys = _record_keys(batches, 0, sp)
        again = _record_keys(batches, 0, sp)
    assert list(keys[0].offsets) == [10, 11] and keys[1] is None and again[1] is None
    assert [r.getMessage() for r in caplog.records].count(caplog.records[0].getMessage()) == 1
    assert "cannot read the keys of the batch at offset 12" in caplog.records[0].getMessage()
    assert _record_keys(batches, 12, sp)[0] is None  # known already: not read
