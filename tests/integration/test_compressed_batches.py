"""Record batches compressed by a real producer (librdkafka: gzip, snappy, lz4, zstd) consumed
through kshare with confluent-kafka ShareConsumers, compared with Apache Kafka 4.4's native share
groups.

kshare hands a ShareFetch the upstream broker's record batches as they are: it never decompresses
or recompresses them to deliver them. It reads inside a batch only for key-ordered sharing
(``kshare.share.ordering=key``), where it decompresses the batch to learn its records' keys
(``kshare/share/record_keys.py``); a batch it cannot read goes out as keyless, whole. So:

* each codec, produced through kshare, is delivered through kshare exactly as native Kafka 4.4
  delivers the same records: the same (offset, key, value), each once, delivery count 1
  (librdkafka's own ``0171`` ``do_test_all_compression_codecs`` checks the same, see
  docs/reference/conformance.md);
* in a key-ordered group, a lone consumer of a single compressed batch of 20 keys gets the first
  record of each key, then, once those are accepted, the second: kshare read the keys out of the
  compressed batch.

The topics' log segments are checked to be small: the producer really compressed (librdkafka
sends a batch uncompressed when compressing does not make it smaller).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from confluent_kafka import AcknowledgeType, Producer

from tests.harness.brokers import KafkaBroker
from tests.harness.share import (
    Got,
    ShareProxyThread,
    poll_until,
    quiet_logger,
    records_of,
    share_consumer,
    share_group,
    subscribed,
)
from tests.harness.share import kshare39 as _kshare39

pytestmark = [pytest.mark.kafka, pytest.mark.kafka4]

kshare39 = _kshare39

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
RECORDS = 200
KEYS = 20
VALUE_PAD = b"x" * 250  # compresses well: a compressed batch is a few hundred bytes, not ~55 KB


def key_of(i: int) -> bytes:
    return b"k%02d" % (i % KEYS)


def value_of(i: int) -> bytes:
    return b"%04d-" % i + VALUE_PAD


def produce_compressed(bootstrap: str, topic: str, codec: str) -> None:
    """RECORDS keyed records to partition 0 of ``topic`` in one producer batch, compressed with ``codec``."""
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "compression.type": codec,
            "linger.ms": 200,
            "batch.num.messages": 10000,
            "acks": "all",
            "enable.idempotence": False,
            "logger": quiet_logger(),
        }
    )
    errors: list[object] = []
    for i in range(RECORDS):
        p.produce(
            topic,
            key=key_of(i),
            value=value_of(i),
            partition=0,
            on_delivery=lambda err, _m: errors.append(err) if err is not None else None,
        )
    assert p.flush(30) == 0
    assert not errors, errors


def log_bytes(broker: KafkaBroker, topic: str) -> int:
    return sum(f.stat().st_size for f in (broker.data_dir / f"{topic}-0").glob("*.log"))


@pytest.fixture(scope="module")
def topics(
    kshare39: ShareProxyThread, kafka39: KafkaBroker, kafka4: KafkaBroker
) -> Iterator[dict[str, dict]]:
    """For each codec, a 1-partition topic on Kafka 3.9 (produced through kshare) and one on Kafka
    4.4, each holding the same RECORDS records in one batch."""
    run = uuid.uuid4().hex[:8]
    out: dict[str, dict] = {"kshare": {}, "kafka4": {}}
    for codec in CODECS:
        for target, broker, bootstrap in (
            ("kshare", kafka39, kshare39.bootstrap),
            ("kafka4", kafka4, kafka4.bootstrap),
        ):
            topic = f"codec-{codec}-{run}"
            broker.create_topic(topic, 1)
            produce_compressed(bootstrap, topic, codec)
            size = log_bytes(broker, topic)
            if codec == "none":
                assert size > RECORDS * len(VALUE_PAD), (target, size)
            else:
                assert size < RECORDS * len(VALUE_PAD) // 10, (
                    f"{target}: {codec} batch not compressed ({size} bytes)"
                )
            out[target][codec] = topic
    yield out


def consume_all(bootstrap: str, topics: list[str]) -> list[Got]:
    """A new group (earliest), one implicit-mode consumer of every topic, until every record came."""
    group = f"codec-{uuid.uuid4().hex[:8]}"
    share_group(bootstrap, group)
    c = share_consumer(bootstrap, group)
    c.subscribe(topics)
    try:
        return poll_until(c, lambda out: len(out) >= RECORDS * len(topics), 60)
    finally:
        c.close()


def test_every_codec_is_delivered_as_native_kafka_delivers_it(kshare39, kafka4, topics) -> None:
    """Through kshare and on native Kafka 4.4, at the same time: every record of every codec,
    once, delivery count 1, key and value intact, the same on both."""
    with ThreadPoolExecutor(2) as pool:
        futs = {
            t: pool.submit(consume_all, bootstrap, [topics[t][c] for c in CODECS])
            for t, bootstrap in (("kshare", kshare39.bootstrap), ("kafka4", kafka4.bootstrap))
        }
        got = {t: f.result() for t, f in futs.items()}
    expected = [(i, key_of(i), value_of(i), 1) for i in range(RECORDS)]
    for target, records in got.items():
        for codec in CODECS:
            topic = topics[target][codec]
            seen = sorted((g.offset, g.key, g.value, g.delivery_count) for g in records if g.topic == topic)
            assert seen == expected, (
                f"{target} {codec}: {len(seen)} records, first differences "
                f"{[s for s, e in zip(seen, expected, strict=False) if s != e][:3]}"
            )


@pytest.mark.parametrize("codec", CODECS)
def test_key_ordering_reads_the_keys_of_a_compressed_batch(kshare39, topics, codec: str) -> None:
    """A key-ordered group with one consumer: of a single batch of 20 keys x 10 records, the
    first acquisition is the first record of each key (offsets 0-19: a key new to a member goes
    one record at a time); once they are accepted, the member that finished each key gets a run of
    twice that, the second and third record of each key (20-59; docs/design/ordering-and-backoff.md).
    Keys kshare could not read would let the whole batch out at once."""
    topic = topics["kshare"][codec]
    group = f"codec-key-{codec}-{uuid.uuid4().hex[:8]}"
    share_group(kshare39.bootstrap, group, **{"kshare.share.ordering": "key"})
    with subscribed(kshare39.bootstrap, group, topic, explicit=True) as c:
        for round_ in range(2):
            held: list = []
            for _ in range(60):
                held = records_of(c, 0.5)
                if held:
                    break
            offsets = sorted(m.offset() for m in held)
            first, last = (0, KEYS) if round_ == 0 else (KEYS, 3 * KEYS)
            assert offsets == list(range(first, last)), (
                f"{codec} round {round_}: {len(offsets)} records, offsets {offsets[:25]}"
            )
            assert all(m.key() == key_of(m.offset()) and m.value() == value_of(m.offset()) for m in held)
            for m in held:
                c.acknowledge(m, AcknowledgeType.ACCEPT)
            c.commit_sync(30)
