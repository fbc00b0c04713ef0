"""kshare.AIOShareConsumer without a cluster: records decoded from batches of every codec with their
delivery counts, acknowledgement batches, what is acknowledged when (implicit and explicit mode),
errors named as Kafka names them, the security options, and the import direction (the clients
layer imports neither the proxy nor the share-group engine)."""

from __future__ import annotations

import asyncio
import struct
import subprocess
import sys

import pytest
from aiokafka.errors import (
    ConsumerStoppedError,
    IllegalStateError,
    TopicAuthorizationFailedError,
    UnknownTopicOrPartitionError,
)
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.structs import ConsumerRecord
from hypothesis import given
from hypothesis import strategies as st

from kshare import AIOShareConsumer, ShareConsumerRecord
from kshare.clients.errors import GroupMaxSizeReachedError, InvalidRecordStateError, error_for, error_name
from kshare.clients.share_consumer import _Held
from kshare.clients.share_member import ACCEPT, GAP, REJECT, RELEASE, Acquired, ack_batch, ack_batches, merged

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def batch(base: int, n: int, codec: int, *, key: bool = True) -> bytes:
    b = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=0, producer_id=-1,
                                  producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for i in range(n):
        b.append(i, timestamp=1000 + i, key=f"k{i}".encode() if key else None, value=b"v" * (i + 1),
                 headers=[("h", f"{i}".encode())])
    data = bytearray(b.build())
    struct.pack_into(">q", data, 0, base)  # the base offset
    return bytes(data)


def consumer(**kw) -> AIOShareConsumer:
    return AIOShareConsumer("t", bootstrap_servers="127.0.0.1:1", group_id="g", **kw)


@pytest.mark.parametrize("codec", CODECS)
def test_records_of_every_codec_with_their_delivery_counts(codec: str) -> None:
    raw = batch(10, 5, CODECS[codec]) + batch(15, 3, CODECS[codec], key=False)
    c = consumer()
    # offsets 10-11 acquired a second time, 12-16 the first; 17 not acquired (another member's)
    out = c._decode("t", 2, raw, [(10, 11, 2), (12, 16, 1)])
    assert [(r.offset, r.delivery_count) for r in out] == [(10, 2), (11, 2), (12, 1), (13, 1), (14, 1), (15, 1),
                                                           (16, 1)]
    r = out[1]
    assert isinstance(r, ShareConsumerRecord) and list(r._fields[:11]) == list(ConsumerRecord.__dataclass_fields__)
    assert (r.topic, r.partition, r.timestamp, r.timestamp_type, r.key, r.value, r.checksum) == (
        "t", 2, 1001, 0, b"k1", b"vv", None)
    assert (r.serialized_key_size, r.serialized_value_size, list(r.headers)) == (2, 2, [("h", b"1")])
    assert out[-1].key is None and out[-1].serialized_key_size == -1
    # one range over whole batches: the fast path
    whole = c._decode("t", 0, raw, [(10, 17, 3)])
    assert [r.offset for r in whole] == list(range(10, 18)) and {r.delivery_count for r in whole} == {3}
    # one acquisition split into several ranges (kshare splits by BatchSize), and a hole (another member's)
    split = c._decode("t", 0, raw, [(10, 12, 1), (13, 17, 1)])
    assert [r.offset for r in split] == list(range(10, 18))
    holed = c._decode("t", 0, raw, [(10, 11, 1), (13, 17, 1)])
    assert [r.offset for r in holed] == [10, 11, 13, 14, 15, 16, 17]


def compacted_batch(base: int, deltas: list[int], codec: int) -> bytes:
    """A batch whose records sit at ``base`` + ``deltas`` (ascending; offsets missing in between, as
    compaction leaves them)."""
    b = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=0, producer_id=-1,
                                  producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for d in deltas:
        b.append(d, timestamp=1000 + d, key=None, value=f"v{base + d}".encode(), headers=[])
    data = bytearray(b.build())
    struct.pack_into(">q", data, 0, base)
    return bytes(data)


@given(st.lists(st.tuples(st.integers(1, 40), st.sets(st.integers(0, 39))), min_size=1, max_size=6),
       st.lists(st.tuples(st.integers(0, 60), st.integers(1, 60), st.integers(1, 5)), max_size=8),
       st.sampled_from([0, 1]))
def test_records_taken_in_part_against_a_model(layout, picks, codec) -> None:
    """Batches of up to 40 offsets, some compacted (records missing), and acquired ranges over them
    with their delivery counts (whole batches, parts, several per batch, none): the records are
    those present at acquired offsets, in order, each with its range's count."""
    raw, present, base = b"", [], 0
    for size, missing in layout:
        deltas = [d for d in range(size) if d not in missing or d == size - 1]  # a batch keeps its last
        raw += compacted_batch(base, deltas, codec)
        present += [base + d for d in deltas]
        base += size
    ranges, at = [], 0
    for gap, length, count in picks:
        a = at + gap
        if a >= base:
            break
        z = min(base - 1, a + length - 1)
        ranges.append((a, z, count))
        at = z + 1
    want = [(o, next(c for a, z, c in ranges if a <= o <= z)) for o in present
            if any(a <= o <= z for a, z, _ in ranges)]
    out = consumer()._decode("t", 0, raw, ranges)
    assert [(r.offset, r.delivery_count) for r in out] == want
    assert all(r.value == f"v{r.offset}".encode() for r in out)


def test_deserializers() -> None:
    c = consumer(key_deserializer=lambda k: k.decode() if k else None, value_deserializer=len)
    out = c._decode("t", 0, batch(0, 3, 0), [(0, 2, 1)])
    assert [(r.key, r.value) for r in out] == [("k0", 1), ("k1", 2), ("k2", 3)]


def test_ack_batches() -> None:
    def plain(bs):
        return [(b.first_offset, b.last_offset, list(b.acknowledge_types)) for b in bs]

    assert plain(ack_batches({5: ACCEPT, 3: ACCEPT, 4: ACCEPT})) == [(3, 5, [ACCEPT])]
    assert plain(ack_batches({1: ACCEPT, 2: RELEASE, 4: REJECT})) == [(1, 2, [ACCEPT, RELEASE]), (4, 4, [REJECT])]
    assert plain(ack_batches({})) == []


def acquired(ranges, gaps=()) -> Acquired:
    return Acquired(1, 0, b"\1" * 16, "t", 0, list(ranges), set(gaps))


def sent(acks) -> dict[int, int]:
    """{offset: type} of acknowledgements."""
    out = {}
    for k in acks:
        for b in k.batches:
            types = list(b.acknowledge_types)
            for i, o in enumerate(range(b.first_offset, b.last_offset + 1)):
                out[o] = types[0] if len(types) == 1 else types[i]
    return out


def rec(o: int) -> ShareConsumerRecord:
    return ShareConsumerRecord("t", 0, o, 0, 0, None, None, None, -1, -1, [], 1)


def test_implicit_mode_accepts_what_was_handed_out() -> None:
    c = consumer()
    c._take_in([(acquired([(0, 4)], gaps={2}), [rec(0), rec(1), rec(3), rec(4)])])
    assert c._collect() == []  # nothing handed out yet
    out = c._hand_out(10)
    assert [r.offset for rs in out.values() for r in rs] == [0, 1, 3, 4]
    assert sent(c._collect()) == {0: ACCEPT, 1: ACCEPT, 2: GAP, 3: ACCEPT, 4: ACCEPT}
    assert c._held == [] and c._collect() == []
    # handed out in two parts, a release among the first; gaps at the end go with the last record
    c._take_in([(acquired([(10, 16)], gaps={15, 16}), [rec(o) for o in range(10, 15)])])
    assert [r.offset for rs in c._hand_out(3).values() for r in rs] == [10, 11, 12]
    c.acknowledge(rec(11), "release")
    with pytest.raises(IllegalStateError):
        c.acknowledge(rec(13))  # not handed out yet
    assert sent(c._collect()) == {10: ACCEPT, 11: RELEASE, 12: ACCEPT}
    with pytest.raises(IllegalStateError):
        c.acknowledge(rec(12), "reject")  # accepted already
    assert [r.offset for rs in c._hand_out(3).values() for r in rs] == [13, 14]
    assert sent(c._collect()) == {13: ACCEPT, 14: ACCEPT, 15: GAP, 16: GAP} and c._held == []


def test_explicit_mode_sends_what_was_acknowledged() -> None:
    c = consumer(acknowledgement_mode="explicit")
    c._take_in([(acquired([(0, 3)], gaps={1}), [rec(0), rec(2), rec(3)])])
    c._hand_out(10)
    c.acknowledge(rec(0), "reject")
    assert sent(c._collect()) == {0: REJECT, 1: GAP}
    assert len(c._held) == 1  # 2 and 3 still held
    with pytest.raises(IllegalStateError):
        c.acknowledge(rec(0))  # sent already
    with pytest.raises(IllegalStateError):
        c.acknowledge(rec(99))  # never acquired
    with pytest.raises(ValueError):
        c.acknowledge(rec(2), "maybe")
    c.acknowledge(rec(2), "renew")
    renews = c._collect_renews()
    assert [(b.first_offset, list(b.acknowledge_types)) for k in renews for b in k.batches] == [(2, [4])]
    c.acknowledge(rec(2))
    c.acknowledge(rec(3), "release")
    assert sent(c._collect()) == {2: ACCEPT, 3: RELEASE} and c._held == []


def test_acknowledgement_batches_in_offset_order_and_joined() -> None:
    bs = merged([ack_batch(5, 9, [ACCEPT]), ack_batch(0, 4, [ACCEPT]), ack_batch(10, 10, [RELEASE]),
                 ack_batch(11, 12, [RELEASE])])
    assert [(b.first_offset, b.last_offset, list(b.acknowledge_types)) for b in bs] == [
        (0, 9, [ACCEPT]), (10, 12, [RELEASE])]


def test_held_lookup() -> None:
    h = _Held(acquired([(0, 3), (7, 9)]), 9, 0, 0)
    assert h.holds(8) and not h.holds(5)


def test_errors_carry_kafkas_names() -> None:
    e = error_for(81, "ShareGroupHeartbeat for group g", "The share group has reached its maximum capacity")
    assert isinstance(e, GroupMaxSizeReachedError) and e.errno == 81 and e.message == "GROUP_MAX_SIZE_REACHED"
    assert "GROUP_MAX_SIZE_REACHED: ShareGroupHeartbeat for group g" in str(e)
    assert isinstance(error_for(3), UnknownTopicOrPartitionError)
    assert isinstance(error_for(29), TopicAuthorizationFailedError)
    assert isinstance(error_for(121), InvalidRecordStateError)
    assert error_for(9999).errno == 9999
    assert error_name(122) == "SHARE_SESSION_NOT_FOUND" and error_name(0) == "NONE"


def test_options_checked() -> None:
    with pytest.raises(ValueError, match="group_id"):
        AIOShareConsumer("t", group_id="")
    with pytest.raises(ValueError, match="acknowledgement_mode"):
        consumer(acknowledgement_mode="auto")
    with pytest.raises(ValueError, match="sasl_plain_username"):
        consumer(security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-512")
    with pytest.raises(ValueError, match="security_protocol"):
        consumer(security_protocol="KERBEROS")
    c = consumer(security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-256", sasl_plain_username="u",
                 sasl_plain_password="p")
    assert c._security is not None and c._security.protocol == "SASL_SSL"
    assert consumer()._security is None


def test_not_started_and_stopped() -> None:
    async def run() -> None:
        c = consumer()
        with pytest.raises(IllegalStateError):
            await c.getmany()
        await c.stop()
        with pytest.raises(ConsumerStoppedError):
            await c.getmany()

    asyncio.run(run())


def test_the_clients_layer_imports_neither_proxy_nor_engine() -> None:
    code = ("import sys, kshare; from kshare import AIOShareConsumer; import kshare.clients.share_member; "
            "bad = sorted(m for m in sys.modules if m.startswith(('kshare.proxy', 'kshare.share', 'kshare.app'))); "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
