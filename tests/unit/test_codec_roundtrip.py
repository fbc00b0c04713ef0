"""Property tests of the generated codec, for every spec file and every valid version.

The strategies are built from the spec itself (``MessageSpec`` -> ``StructSpec`` -> ``FieldSpec``),
independently of the code generator: a field present in the version gets a random value of its
type (full integer range of the type, ``None`` where the version allows it, unicode strings, random
bytes and records, 16-byte uuids, 0-3 element arrays, nested structs); a tagged field is sometimes
left at its default (so it is omitted on the wire) and sometimes set; a struct of a flexible version
sometimes carries ``unknown_tags`` with tags the struct does not use; a field absent from the
version keeps the class default.

Every (message, version) is tested; the first version of each distinct wire layout of a message
gets 25 examples, later versions with the same layout (same fields, types, nullability, tags and
encodings) 5.

Properties, per (message, version):

* ``decode(encode(x)) == x``, the decoder consuming exactly the encoded bytes, also when the
  message sits between other bytes in the buffer (``pos`` and trailing data);
* ``encode(decode(b)) == b`` for ``b = encode(x)``;
* ``records`` fields come back as zero-copy ``memoryview`` slices of the input buffer;
* every proper prefix of a valid encoding raises ``DecodeError``. This is the strongest correct
  truncation property: the decoder is deterministic and reads the prefix exactly as it reads the
  whole encoding (both have the same bytes up to the cut), so if it succeeded it would have
  followed the same path and ended at ``len(b)``, beyond the prefix; every read is bounds
  checked, so it must fail, and it must fail with ``DecodeError``;
* arbitrary bytes, and valid encodings with a few bytes overwritten, either decode or raise
  ``DecodeError``, never another exception; when they decode, the decoder stays inside the buffer
  and the result is canonical: ``decode(encode(m)) == m``.
"""

from __future__ import annotations

import struct
from functools import cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kshare.protocol import messages
from kshare.protocol.codegen import DecodeError, classes_for, codec_for
from kshare.protocol.spec import MessageSpec, StructSpec, all_spec_names, load_spec
from tests.harness.codec_messages import is_flexible, layout, message

CASES = [
    (name, version)
    for name in all_spec_names()
    for version in range(load_spec(name).valid.lo, load_spec(name).valid.hi + 1)
]

SETTINGS = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

def _wire_layout(spec: MessageSpec, s: StructSpec, version: int) -> tuple:
    """What the bytes of ``s`` look like in ``version``. Versions of a message with the same layout
    (a version that only changed semantics, such as Fetch v13 -> v14) get the same encoder and
    decoder, so the first of them gets the full run and the others a short one."""
    flexible = is_flexible(spec, version)
    return (flexible,) + tuple(
        (
            f.attr,
            f.type,
            f.is_array,
            version in f.nullable,
            tagged,
            f.tag if tagged else None,
            flexible if f.flexible is None else version in f.flexible,
            None if f.struct is None else _wire_layout(spec, f.struct, version),
        )
        for f, tagged in layout(spec, s, version)
    )


def _split_cases() -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    first, repeated, seen = [], [], set()
    for name, version in CASES:
        spec = load_spec(name)
        key = (name, _wire_layout(spec, spec.root, version))
        (repeated if key in seen else first).append((name, version))
        seen.add(key)
    return first, repeated


def _records(spec: MessageSpec, s: StructSpec, obj: object):
    """Every non-null ``records`` value inside ``obj``."""
    for f in s.fields:
        v = getattr(obj, f.attr)
        if v is None:
            continue
        if f.struct is not None:
            for item in v if f.is_array else (v,):
                yield from _records(spec, f.struct, item)
        elif f.type == "records":
            yield v


# -- properties -----------------------------------------------------------------------------------------


CUTS = struct.Struct(">12H")  # up to 12 random cut points
MUTATIONS = struct.Struct(">B" + "HB" * 3)  # how many (1-3), then (position, new byte) pairs


@cache
def scenario(name: str, version: int) -> st.SearchStrategy:
    """A message plus the random choices the properties need, drawn as one strategy: fixed-size
    byte strings stand for the cut points and overwritten bytes (positions are taken modulo the
    encoding's length), one choice each instead of one per number."""
    return st.tuples(
        message(name, version),
        st.binary(max_size=8),  # bytes before the message in the buffer
        st.binary(max_size=8),  # bytes after it
        st.binary(min_size=CUTS.size, max_size=CUTS.size),
        st.binary(min_size=MUTATIONS.size, max_size=MUTATIONS.size),
        st.binary(max_size=64),  # garbage
    )


FIRST_LAYOUTS, REPEATED_LAYOUTS = _split_cases()


@pytest.mark.parametrize(("name", "version"), FIRST_LAYOUTS, ids=[f"{n}-v{v}" for n, v in FIRST_LAYOUTS])
@SETTINGS
@given(data=st.data())
def test_codec_properties(name: str, version: int, data: st.DataObject) -> None:
    check_properties(name, version, data)


@pytest.mark.parametrize(
    ("name", "version"), REPEATED_LAYOUTS, ids=[f"{n}-v{v}" for n, v in REPEATED_LAYOUTS]
)
@settings(SETTINGS, max_examples=5)
@given(data=st.data())
def test_codec_properties_repeated_layout(name: str, version: int, data: st.DataObject) -> None:
    """A version with the same wire layout as an earlier one of the same message: a short run."""
    check_properties(name, version, data)


def test_every_version_is_covered() -> None:
    assert sorted(FIRST_LAYOUTS + REPEATED_LAYOUTS) == sorted(CASES)
    assert ("FetchRequest", 17) in CASES and ("ShareFetchResponse", 2) in CASES


def check_properties(name: str, version: int, data: st.DataObject) -> None:
    spec = load_spec(name)
    codec = codec_for(spec, version)
    x, head, tail, cut_bytes, mutation_bytes, garbage = data.draw(scenario(name, version), label="case")

    # decode(encode(x)) == x, consuming exactly the encoding; encode(decode(b)) == b
    b = bytes(codec.encode(x))
    y, end = codec.decode(b)
    assert end == len(b)
    assert y == x
    assert codec.encode(y) == b

    # zero-copy records: slices of the buffer we passed in
    for rec in _records(spec, spec.root, y):
        assert isinstance(rec, memoryview)
        assert rec.obj is b

    # in the middle of a larger buffer, appending to an existing bytearray
    framed = codec.encode(x, bytearray(head)) + tail
    z, end = codec.decode(framed, len(head))
    assert end == len(head) + len(b)
    assert z == x

    # every proper prefix fails with DecodeError (see the module docstring): all of them for short
    # encodings, the first and last byte and random ones for longer encodings
    if len(b) <= 48:
        cuts = range(len(b))
    else:
        cuts = sorted({0, len(b) - 1} | {c % len(b) for c in CUTS.unpack(cut_bytes)})
    for k in cuts:
        try:
            codec.decode(b[:k])
        except DecodeError:
            continue
        pytest.fail(f"a {k}-byte prefix of a {len(b)}-byte encoding decoded")

    # a valid encoding with a few bytes overwritten gets deep into the decoder before going wrong
    if b:
        bad = bytearray(b)
        count, *pairs = MUTATIONS.unpack(mutation_bytes)
        for i in range(count % 3 + 1):
            bad[pairs[2 * i] % len(b)] = pairs[2 * i + 1]
        _decodes_or_decode_error(codec, bytes(bad))

    # random bytes (h11's rule: whatever a peer sends either parses or raises DecodeError)
    _decodes_or_decode_error(codec, garbage)


def _decodes_or_decode_error(codec, buf: bytes) -> None:
    try:
        m, end = codec.decode(buf)
    except DecodeError:
        return
    assert 0 <= end <= len(buf)
    again = bytes(codec.encode(m))
    m2, end2 = codec.decode(again)
    assert end2 == len(again)
    assert m2 == m


# -- examples the random sizes do not reach --------------------------------------------------------------


def test_multibyte_varint_lengths() -> None:
    """Compact arrays of 127+ elements and strings of 127+ bytes need 2-byte (and longer) varints."""
    spec = load_spec("MetadataRequest")
    cls = classes_for(spec)["MetadataRequest"]
    topic = classes_for(spec)["MetadataRequestTopic"]
    codec = codec_for(spec, 12)
    for n, length in ((126, 126), (127, 127), (128, 128), (300, 20000)):
        x = cls(topics=[topic(topic_id=bytes(16), name="é" * length) for _ in range(n)])
        b = bytes(codec.encode(x))
        y, end = codec.decode(b)
        assert (y, end) == (x, len(b))
    # the array count: 301 + 1 = 302 = 0xae 0x02
    x = cls(topics=[topic(name="t")] * 301)
    assert bytes(codec.encode(x))[:2] == b"\xae\x02"


def test_tagged_field_value_must_fill_its_size() -> None:
    """A known tagged field whose value is shorter or longer than its declared size is rejected."""
    spec = load_spec("ApiVersionsResponse")
    codec = codec_for(spec, 3)
    good = b"\x00\x00" + b"\x01" + b"\x00\x00\x00\x00" + b"\x01" + b"\x01\x08" + (5).to_bytes(8, "big")
    assert codec.decode(good)[0].finalized_features_epoch == 5
    for size in (7, 9):
        bad = b"\x00\x00\x01\x00\x00\x00\x00\x01\x01" + bytes([size]) + (5).to_bytes(8, "big") + b"\x00"
        with pytest.raises(DecodeError):
            codec.decode(bad)


def test_unknown_tags_survive_and_sort_with_known_ones() -> None:
    spec = load_spec("ApiVersionsResponse")
    cls = classes_for(spec)["ApiVersionsResponse"]
    codec = codec_for(spec, 3)
    x = cls(
        finalized_features_epoch=7,
        zk_migration_ready=True,
        unknown_tags={2000: b"abc", 4: b"", 0x7FFFFFFF: b"z"},
    )
    b = bytes(codec.encode(x))
    # tags in ascending order: 1 (known), 3 (known), 4 (unknown), 2000 (unknown), 2**31-1 (unknown)
    tail = b[2 + 1 + 4 :]
    assert tail[0] == 5
    assert tail[1:3] == b"\x01\x08"
    assert tail[11:14] == b"\x03\x01\x01"
    assert tail[14:16] == b"\x04\x00"
    assert tail[16:19] == b"\xd0\x0f\x03"
    assert codec.decode(b) == (x, len(b))


@pytest.mark.parametrize("version", [0, 12])
def test_fixed_width_arrays_of_any_length(version: int) -> None:
    """Arrays of fixed-width values use one precompiled Struct per small length, and format their
    own beyond: both sides of the boundary, in classic (int32 count) and compact encodings."""
    spec = load_spec("MetadataResponse")
    classes = classes_for(spec)
    codec = codec_for(spec, version)
    for n in (0, 1, 31, 32, 33, 1000):
        replicas = list(range(-(n // 2), n - n // 2))
        partition = classes["MetadataResponsePartition"](replica_nodes=replicas, isr_nodes=replicas[:1])
        x = classes["MetadataResponse"](
            topics=[classes["MetadataResponseTopic"](name="t", partitions=[partition])]
        )
        b = bytes(codec.encode(x))
        y, end = codec.decode(b)
        assert (y, end) == (x, len(b))
        assert y.topics[0].partitions[0].replica_nodes == replicas
        for k in {len(b) - 1, len(b) - 4 * n} - {len(b)}:
            with pytest.raises(DecodeError):
                codec.decode(b[:k])


# --------------------------------------------------------------------------------------------
# spliced responses: large record data is written as its own buffer, never copied


@given(sizes=st.lists(st.integers(min_value=0, max_value=3 * 4096), min_size=0, max_size=6),
       version=st.sampled_from([1, 2]), corr=st.integers(min_value=0, max_value=2**31 - 1))
def test_spliced_share_fetch_response_is_the_same_frame(sizes: list[int], version: int, corr: int) -> None:
    from kshare.protocol import codegen

    R = messages.message_class("ShareFetchResponse")
    records = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
    body = R(acquisition_lock_timeout_ms=30000, responses=[R.ShareFetchableTopicResponse(
        topic_id=b"\x07" * 16,
        partitions=[R.PartitionData(partition_index=i, records=memoryview(r),
                                    current_leader=R.LeaderIdAndEpoch(leader_id=-1, leader_epoch=-1),
                                    acquired_records=[R.AcquiredRecords(first_offset=0, last_offset=1, delivery_count=1)])
                    for i, r in enumerate(records)])])
    pieces = messages.encode_response_pieces(78, version, corr, body)
    assert b"".join(bytes(p) for p in pieces) == bytes(messages.encode_response(78, version, corr, body))
    big = [r for r in records if len(r) >= codegen.SPLICE_MIN]
    assert sum(1 for p in pieces if isinstance(p, memoryview) and p.obj in big) == len(big)  # not copied
