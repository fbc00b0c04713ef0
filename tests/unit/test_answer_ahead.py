"""A ShareFetch answer written ahead of its acknowledgements' durable writes (share_fetch.answer_ahead).

The part written early must be the beginning of the final answer whatever the pending writes
do to their partitions (an acknowledgement error code, records dropped when an acquisition's
write fails), or the client would read a corrupt frame: a property over random answers.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kshare.protocol import messages
from kshare.protocol.codegen import SPLICE_MIN
from kshare.proxy.connection import _rest_after
from kshare.share.handlers.share_fetch import API_KEY, Response, ResponseBuilder, answer_ahead

TOPICS = [bytes([i]) * 16 for i in range(1, 4)]
record_sizes = st.sampled_from([0, 0, 100, SPLICE_MIN - 1, SPLICE_MIN, 3 * SPLICE_MIN])
partition = st.tuples(st.sampled_from(TOPICS), st.integers(0, 5))
# (where, records size, what it waits for: 0 nothing, 1 its acknowledgements' write, 2 an acquisition's)
entry = st.tuples(partition, record_sizes, st.sampled_from([0, 0, 1, 2]))


def _builder(entries: list) -> tuple[ResponseBuilder, set[tuple[bytes, int]], set[tuple[bytes, int]]]:
    out = ResponseBuilder()
    waiting, acquiring = set(), set()
    for (t, p), size, waits in entries:
        d = out.partition(t, p)
        if size:
            d.records = bytes([p + 1]) * size
            d.acquired_records = [Response.AcquiredRecords(first_offset=0, last_offset=size - 1, delivery_count=1)]
        if waits:
            waiting.add((t, p))
        if waits == 2:
            acquiring.add((t, p))
    return out, waiting, acquiring


def _flat(pieces: list) -> bytes:
    return b"".join(bytes(x) for x in pieces)


@settings(max_examples=300, deadline=None)
@given(entries=st.lists(entry, min_size=1, max_size=12), outcome=st.data(), version=st.sampled_from([1, 2]))
def test_what_goes_ahead_begins_the_final_answer_whatever_the_writes_do(entries, outcome, version):
    out, waiting, acquiring = _builder(entries)
    ahead = answer_ahead(out, waiting, acquiring, version, 7, 30_000)
    # reference: something goes ahead iff large records come before the first waiting partition
    # and no partition whose acquisition waits has records (a failed write drops them)
    before = []
    for t, parts in out.ordered():
        stop = [p for p in parts if (t, p) in waiting]
        before += [d for p, d in parts.items() if (t, p) not in waiting]
        if stop:
            break
    droppable = any(out.partition(t, p).records for t, p in acquiring)
    assert (ahead is not None) == (not droppable and any(len(d.records) >= SPLICE_MIN for d in before))
    # what each pending write does: an acknowledgement's error code; a failed acquisition's
    # write drops its records
    for t, p in sorted(waiting):
        code = outcome.draw(st.sampled_from([0, 0, 15, 42]))
        if (t, p) in acquiring and code:
            out.drop_records(t, p, code)
        if (t, p) not in acquiring or outcome.draw(st.booleans()):
            out.partition(t, p).acknowledge_error_code = outcome.draw(st.sampled_from([0, 15, 42]))
    final = messages.encode_response_pieces(API_KEY, version, 7, out.build(30_000))
    if ahead is None:
        return
    rest = _rest_after(ahead, final)
    assert _flat(ahead) + _flat(rest) == _flat(final)
    assert sum(len(x) for x in ahead) >= SPLICE_MIN  # it carries records worth sending early
    # the frame decodes to every partition, the waiting ones after the others of their topic
    body = messages.decode_response(API_KEY, version, memoryview(_flat(final))[4:])
    seen = [(t.topic_id, p.partition_index) for t in body.responses for p in t.partitions]
    assert sorted(seen) == sorted((t, p) for t, parts in out.topics.items() for p in parts)
    first_waiting = min((i for i, tp in enumerate(seen) if tp in waiting), default=len(seen))
    assert len(_flat(ahead)) <= len(_flat(messages.encode_response_pieces(
        API_KEY, version, 7, _prefix_response(body, first_waiting))))


def _prefix_response(body, n: int):
    """The answer cut after its first ``n`` partitions (to bound how far ahead may reach)."""
    topics, left = [], n
    for t in body.responses:
        if left <= 0:
            break
        parts = t.partitions[:left]
        left -= len(parts)
        topics.append(Response.ShareFetchableTopicResponse(topic_id=t.topic_id, partitions=parts))
    return Response(acquisition_lock_timeout_ms=body.acquisition_lock_timeout_ms, responses=topics)


def test_nothing_goes_ahead_when_a_pending_write_could_add_a_partition():
    out, _, _ = _builder([((TOPICS[0], 0), 3 * SPLICE_MIN, 0)])
    # an acquisition write for a partition not in the answer: if it failed, drop_records adds it
    assert answer_ahead(out, {(TOPICS[1], 0)}, {(TOPICS[1], 0)}, 1, 1, 30_000) is None


def test_records_behind_the_waiting_partition_wait_too():
    # topics without a waiting partition go first, then the one whose waiting partition goes last
    # within it: ready records before that partition go ahead ...
    out, waiting, acquiring = _builder([((TOPICS[0], 0), 0, 1), ((TOPICS[0], 1), 2 * SPLICE_MIN, 0),
                                        ((TOPICS[1], 0), 2 * SPLICE_MIN, 0)])
    ahead = answer_ahead(out, waiting, acquiring, 1, 1, 30_000)
    assert ahead is not None and ahead[-1] is out.partition(TOPICS[0], 1).records
    assert any(piece is out.partition(TOPICS[1], 0).records for piece in ahead)
    # ... but not those of a second such topic: they follow the first one's waiting partition
    out, waiting, acquiring = _builder([((TOPICS[0], 0), 0, 1), ((TOPICS[0], 1), 2 * SPLICE_MIN, 0),
                                        ((TOPICS[1], 0), 0, 1), ((TOPICS[1], 1), 2 * SPLICE_MIN, 0)])
    ahead = answer_ahead(out, waiting, acquiring, 1, 1, 30_000)
    assert ahead is not None and ahead[-1] is out.partition(TOPICS[0], 1).records
    assert all(piece is not out.partition(TOPICS[1], 1).records for piece in ahead)
    # a waiting partition's own records wait with its error code
    out, waiting, acquiring = _builder([((TOPICS[0], 0), 2 * SPLICE_MIN, 1)])
    assert answer_ahead(out, waiting, acquiring, 1, 1, 30_000) is None


def test_a_final_answer_that_differs_before_the_split_is_refused():
    out, waiting, acquiring = _builder([((TOPICS[0], 0), 0, 1), ((TOPICS[1], 0), 2 * SPLICE_MIN, 0)])
    ahead = answer_ahead(out, waiting, acquiring, 1, 1, 30_000)
    assert ahead is not None
    out.partition(TOPICS[1], 0).acknowledge_error_code = 42  # not a waiting partition: must not change
    final = messages.encode_response_pieces(API_KEY, 1, 1, out.build(30_000))
    with pytest.raises(ValueError, match="does not begin"):
        _rest_after(ahead, final)
