"""Parsing acknowledgement batches (kshare.share.acknowledgements.parse_acknowledgements) against
a reference model that expands every batch offset by offset."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kshare.share.acknowledgements import parse_acknowledgements
from kshare.share.errors import ErrorCode
from kshare.share.states import ACK_TYPE_EVENTS, AcknowledgeType

VALID = set(ACK_TYPE_EVENTS)


def reference(batches, renew_enabled):
    """Offset -> acknowledge type, or the error of the first bad batch (then of overlapping ones)."""
    types_at: dict[int, int] = {}
    spans = []
    for first, last, types in batches:
        if first < 0 or first > last:
            return None, ErrorCode.INVALID_REQUEST
        codes = [types] if isinstance(types, int) else list(types)
        if len(codes) not in (1, last - first + 1) or any(c not in VALID for c in codes):
            return None, ErrorCode.INVALID_REQUEST
        if not renew_enabled and AcknowledgeType.RENEW in codes:
            return None, ErrorCode.INVALID_RECORD_STATE
        spans.append((first, last))
        for o in range(first, last + 1):
            types_at[o] = codes[0] if len(codes) == 1 else codes[o - first]
    spans.sort()
    if any(b[0] <= a[1] for a, b in zip(spans, spans[1:], strict=False)):
        return None, ErrorCode.INVALID_REQUEST
    return types_at, ErrorCode.NONE


ack_type = st.integers(-1, 6)


@st.composite
def batch(draw):
    first = draw(st.integers(-1, 40))
    last = first + draw(st.integers(-1, 12))
    n = max(1, last - first + 1)
    types = draw(st.one_of(ack_type, st.lists(st.sampled_from(sorted(VALID)), min_size=n, max_size=n),
                           st.lists(ack_type, min_size=1, max_size=n + 1)))
    return first, last, types


@given(st.lists(batch(), max_size=5), st.booleans())
def test_runs_cover_each_offset_with_its_type(batches, renew_enabled):
    plan, spans, error = parse_acknowledgements(batches, renew_enabled)
    expected, expected_error = reference(batches, renew_enabled)
    assert error == expected_error
    if error:
        assert plan == [] and spans == []
        return
    got = {o: t for first, last, t in plan for o in range(first, last + 1)}
    assert got == expected
    assert plan == sorted(plan) and spans == sorted(spans)
    assert all(a[1] < b[0] for a, b in zip(plan, plan[1:], strict=False))  # disjoint runs
