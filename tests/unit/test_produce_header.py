"""The proxy's hand-written reader of a Produce request's ``acks`` and transactional id, against
the codec (it runs for every Produce request, so it does not use the codec itself)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kshare.protocol import messages
from kshare.proxy.connection import produce_header

Produce = messages.message_class("ProduceRequest")


@given(
    version=st.integers(min_value=0, max_value=12),
    acks=st.sampled_from([-1, 0, 1]),
    txn=st.one_of(st.none(), st.text(max_size=300)),
    client_id=st.one_of(st.none(), st.text(max_size=300)),
    topics=st.integers(min_value=0, max_value=3),
)
def test_reads_what_the_codec_wrote(version: int, acks: int, txn: str | None, client_id: str | None,
                                    topics: int) -> None:
    if version < 3:
        txn = None
    body = Produce(transactional_id=txn, acks=acks, timeout_ms=1000, topic_data=[
        Produce.TopicProduceData(name=f"t{i}", partition_data=[Produce.PartitionProduceData(index=0, records=b"x")])
        for i in range(topics)])
    frame = bytes(messages.encode_request(0, version, 7, client_id, body))
    assert produce_header(frame, version, 0, len(frame)) == (acks, txn is not None)
    # behind other frames in the buffer
    before = b"\1" * 37
    assert produce_header(before + frame, version, len(before), len(before) + len(frame)) == (acks, txn is not None)
    # any shorter prefix says "too short" or already the right answer, never a wrong one
    for cut in range(len(frame)):
        got = produce_header(frame[:cut], version, 0, len(frame))
        assert got is None or got == (acks, txn is not None)
    # a frame that ends before its acks is not read past its end
    header_end = messages.parse_request_header(memoryview(frame)[4:]).body_offset + 4
    assert produce_header(frame + b"\0" * 64, version, 0, header_end) is None
