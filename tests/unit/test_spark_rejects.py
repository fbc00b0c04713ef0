"""The rejects ledger's encoding and ``kshare.spark.reject``'s checks (no Spark, no broker)."""

from __future__ import annotations

import base64
import random
from collections import namedtuple
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kshare.spark import RejectError, reject
from kshare.spark.ledger import (
    MAX_CHARS,
    Entry,
    LedgerFormatError,
    contains,
    decode,
    encode,
    prune,
    to_ranges,
    union,
    within,
)
from kshare.spark.rejects import _merged, _offsets

offset_sets = st.sets(st.integers(0, 1 << 40), max_size=300) | st.sets(st.integers(0, 2000), max_size=600)


def _flat(ranges: list[tuple[int, int]]) -> set[int]:
    return {o for a, z in ranges for o in range(a, z + 1)}


def _canonical(ranges: list[tuple[int, int]]) -> bool:
    return all(a <= z for a, z in ranges) and all(z + 1 < a2 for (_, z), (a2, _) in pairwise(ranges))


@settings(max_examples=300)
@given(offset_sets)
def test_round_trip(offsets):
    ranges = to_ranges(offsets)
    assert _canonical(ranges) and sum(z - a + 1 for a, z in ranges) == len(offsets)
    text = encode(ranges)
    assert text.isascii() and text.isprintable() and text.startswith("ks1")
    assert decode(text) == ranges
    assert all(contains(ranges, o) for o in offsets)
    # a few hundred offsets always fit one ledger entry, however far apart
    assert len(text) <= MAX_CHARS


@given(offset_sets, offset_sets, st.integers(0, 2100))
def test_merge_and_prune(a, b, start):
    merged = union(to_ranges(a), to_ranges(b))
    assert _canonical(merged) and merged == to_ranges(a | b)
    pruned = prune(merged, start)
    assert _canonical(pruned) and pruned == to_ranges(o for o in a | b if o >= start)
    assert decode(encode(pruned)) == pruned


@given(st.sets(st.integers(0, 3000), max_size=400), st.integers(0, 3000), st.integers(0, 200))
def test_within_and_contains(offsets, lo, width):
    ranges = to_ranges(offsets)
    hi = lo + width
    assert list(within(ranges, lo, hi)) == sorted(o for o in offsets if lo <= o <= hi)
    assert [o for o in range(lo, hi + 1) if contains(ranges, o)] == sorted(o for o in offsets if lo <= o <= hi)


def test_long_runs_are_compact():
    assert len(encode(to_ranges(range(10**9, 10**9 + 100_000)))) < 20
    every_other = to_ranges(range(0, 20_000, 2))  # 10,000 ranges: zlib takes the repetition
    assert len(encode(every_other)) < MAX_CHARS and decode(encode(every_other)) == every_other


@pytest.mark.parametrize("text", ["", None])
def test_no_entry_is_empty(text):
    assert decode(text) == [] and Entry(0, text).ranges == []


@pytest.mark.parametrize("text", ["ks2r:", "hello", "ks1r:..,,", "ks1z:0000",
                                  "ks1r:" + base64.b85encode(b"\x05\x80").decode()])  # a cut varint
def test_unreadable_entries_are_refused(text):
    with pytest.raises(LedgerFormatError):
        decode(text)


def test_the_size_limit_is_a_one_line_error():
    offsets = set(random.Random(7).sample(range(10**9), 3000))  # no pattern for zlib to find
    with pytest.raises(RejectError) as err:
        _merged(("jobs", 3), Entry(1, None), offsets, 0)
    message = str(err.value)
    assert "\n" not in message and "jobs-3" in message and "3000 pending" in message, message
    # what was settled (below the start offset) no longer counts
    assert decode(_merged(("jobs", 3), Entry(1, None), offsets, max(offsets))) == [(max(offsets), max(offsets))]
    old = encode(to_ranges(range(0, 10)))
    assert decode(_merged(("jobs", 3), Entry(4, old), {20, 21}, 5)) == [(5, 9), (20, 21)]


def test_rows_of_every_shape():
    Rec = namedtuple("Rec", "topic partition offset value")
    rows = [("t", 0, 5), {"topic": "t", "partition": 0, "offset": 6, "value": b""}, Rec("u", 1, 7, b"")]
    assert _offsets(rows) == {("t", 0): {5, 6}, ("u", 1): {7}}


@pytest.mark.parametrize(("rows", "message"), [
    ([{"topic": "t", "partition": 0}], "a row has no offset"),
    ([("t", 0)], "is not a row with topic, partition and offset"),
    ([("t", -1, 0)], "is not a topic, partition and offset"),
    ([("t", 0, "5")], "is not a topic, partition and offset"),
])
def test_bad_rows(rows, message):
    with pytest.raises(RejectError, match=message) as err:
        reject(rows, bootstrap="127.0.0.1:1", group="g")
    assert "\n" not in str(err.value)


def test_a_dataframe_without_an_offset_column():
    class Frame:  # what reject() looks at of a Spark DataFrame
        columns = ["topic", "partition", "value"]

        def select(self, *cols):
            raise AssertionError("nothing is collected")

    with pytest.raises(RejectError, match="the rows have no offset column"):
        reject(Frame(), bootstrap="127.0.0.1:1", group="g")


def test_the_cluster_and_group_are_required():
    with pytest.raises(RejectError, match="no group"):
        reject([("t", 0, 1)], options={"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t"})
    with pytest.raises(RejectError, match="no bootstrap"):
        reject([("t", 0, 1)], group="g")
    with pytest.raises(RejectError, match="not HOST:PORT"):
        reject([("t", 0, 1)], bootstrap="nohost", group="g")
    assert reject([], bootstrap="127.0.0.1:1", group="g") == 0  # nothing to reject: no call at all
