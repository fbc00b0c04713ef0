"""A ShareFetch answer written ahead of its acknowledgements' durable writes (share_fetch.answer_ahead).

The part written early is the answer as it will be if the pending writes succeed. Whatever they
do (an acknowledgement's error code, records dropped when an acquisition's write fails), the
final answer either begins with it, or is refused (the connection closes): the client never
reads a corrupt frame. A property over random answers.
"""

from __future__ import annotations

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
def test_what_goes_ahead_begins_the_final_answer_or_is_refused(entries, outcome, version):
    out, waiting, acquiring = _builder(entries)
    got = answer_ahead(out, waiting, version, 7, 30_000)
    large = [(t, p) for t, parts in out.topics.items() for p, d in parts.items() if len(d.records) >= SPLICE_MIN]
    assert (got is not None) == bool(large)  # only large records are worth sending early
    if got is None:
        return
    ahead, (ahead_body, encoded_rest) = got
    assert ahead_body is out.ahead
    predicted = messages.encode_response_pieces(API_KEY, version, 7, out.build(30_000))
    # what each pending write does: nothing (it succeeds), or it fails: an acknowledgement's error
    # code; a failed acquisition's write drops its records
    changed, dropped = set(), False
    for t, p in sorted(waiting):
        if not outcome.draw(st.booleans()):
            continue
        code = outcome.draw(st.sampled_from([15, 42]))
        if (t, p) in acquiring and out.partition(t, p).records:
            out.drop_records(t, p, code)
            dropped = True
        out.partition(t, p).acknowledge_error_code = code
        changed.add((t, p))
    final = messages.encode_response_pieces(API_KEY, version, 7, out.build(30_000))
    body = messages.decode_response(API_KEY, version, memoryview(_flat(final))[4:])
    seen = [(t.topic_id, p.partition_index) for t in body.responses for p in t.partitions]
    assert sorted(seen) == sorted((t, p) for t, parts in out.topics.items() for p in parts)
    # waiting partitions come after the others of their topic
    for t in body.responses:
        flags = [(t.topic_id, p.partition_index) in waiting for p in t.partitions]
        assert flags == sorted(flags)
    rest = _rest_after(ahead, final)
    if rest is not None:  # the client gets exactly the final answer
        assert _flat(ahead) + _flat(rest) == _flat(final)
    else:  # refused (the connection closes): only because a write failed
        assert changed
    if not changed:
        assert rest is not None and _flat(ahead) + _flat(rest) == _flat(predicted)
        # the handler then returns the body that went ahead, and the rest encoded with it is sent
        assert _flat(ahead) + _flat(encoded_rest) == _flat(final)
    # a failed write that changed only partitions after the last large records costs nothing
    last_large = max(i for i, tp in enumerate(seen) if tp in large)
    if changed and not dropped and all(seen.index(tp) > last_large for tp in changed):
        assert rest is not None
    assert sum(len(x) for x in ahead) >= SPLICE_MIN


def test_nothing_goes_ahead_without_large_records():
    out, waiting, _ = _builder([((TOPICS[0], 0), SPLICE_MIN - 1, 1), ((TOPICS[1], 0), 100, 0)])
    assert answer_ahead(out, waiting, 1, 1, 30_000) is None


def test_waiting_partitions_go_last_and_ahead_ends_at_the_last_large_records():
    out, waiting, _ = _builder([((TOPICS[0], 0), 0, 1), ((TOPICS[0], 1), 2 * SPLICE_MIN, 0),
                                ((TOPICS[1], 0), 2 * SPLICE_MIN, 0)])
    got = answer_ahead(out, waiting, 1, 1, 30_000)
    assert got is not None
    ahead = got[0]
    assert ahead[-1] is out.partition(TOPICS[0], 1).records
    assert any(piece is out.partition(TOPICS[1], 0).records for piece in ahead)
    # the acknowledged partition's error code is not in it: its write may fail at no cost
    out.partition(TOPICS[0], 0).acknowledge_error_code = 15
    final = messages.encode_response_pieces(API_KEY, 1, 1, out.build(30_000))
    assert _rest_after(ahead, final) is not None


def test_one_partition_acknowledged_and_fetched_sends_its_records_ahead():
    """One consumer on one partition acknowledges and fetches the same partition each time: its
    records go ahead with the acknowledgement's code as it will be if the write succeeds."""
    out, waiting, _ = _builder([((TOPICS[0], 0), 3 * SPLICE_MIN, 1)])
    got = answer_ahead(out, waiting, 1, 1, 30_000)
    assert got is not None
    ahead, (_, encoded_rest) = got
    assert ahead[-1] is out.partition(TOPICS[0], 0).records
    final = messages.encode_response_pieces(API_KEY, 1, 1, out.build(30_000))
    assert _flat(ahead) + _flat(_rest_after(ahead, final)) == _flat(final) == _flat(ahead) + _flat(encoded_rest)
    out.partition(TOPICS[0], 0).acknowledge_error_code = 15  # the write failed
    assert _rest_after(ahead, messages.encode_response_pieces(API_KEY, 1, 1, out.build(30_000))) is None
