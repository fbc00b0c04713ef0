"""Every connection of a proxy reads into one shared buffer (``kshare.proxy.read_buffer.ReadBuffer``):
what a transport could not send at once must come out intact after the reads that follow it.

Every socket of the proxy here has a 4 KiB send buffer (as a congested path leaves it), so its
writes are cut short all the time and its transports keep what they could not send. Reads on other
connections then come between a cut-short write and the rest of it:

* on the way to the clients: consumers read Fetch responses while producers write, at once;
* on the way to the broker: two producers write while the broker is stopped (SIGSTOP), so what
  the proxy forwards for one waits while it reads the other's requests.

Records of 100 B to 24 KiB, with keys and headers. Every record is delivered (the broker checks
each batch's CRC: a batch changed on the way is refused with CORRUPT_MESSAGE, and the producer
reports it), and read back through the proxy and directly (consumers check CRCs too) equal to what
was sent, at the offset the producer was given. The proxy must have left buffers to transports
(else the test proves nothing).

How frames cut between reads are split, through a buffer overwritten after each read, is tested
without sockets in tests/unit/test_frames_props.py and tests/unit/test_client_connection.py; this
test is about what real transports keep.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import socket
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from confluent_kafka import Producer

from kshare.proxy.connection import ClientConnection
from kshare.proxy.upstream import UpstreamConnection
from tests.harness.brokers import KafkaBroker
from tests.harness.clients import confluent_consume, confluent_produce
from tests.harness.proxies import ProxyThread

SEND_BUFFER = 4096
WORKERS = 3
RECORDS = 600  # per worker: about 7 MB
# no retries: librdkafka retries a batch the broker refused as CORRUPT_MESSAGE, and would hide it
PRODUCER = {"batch.size": 1 << 20, "linger.ms": 20, "message.send.max.retries": 0}


def _small_send_buffer(cls: type) -> Callable[..., None]:
    made = cls.connection_made

    def connection_made(self, transport) -> None:
        transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
        made(self, transport)

    return connection_made


def _records(seed: int) -> list[tuple[bytes, bytes, list[tuple[str, bytes]]]]:
    rnd = random.Random(seed)
    return [
        (f"key-{i % 5}".encode(), f"{seed}-{i}-".encode() + rnd.randbytes(rnd.randrange(100, 24 << 10)),
         [("i", str(i).encode())])
        for i in range(RECORDS)
    ]


def _check(got, records, placed) -> None:
    read = {(r.partition, r.offset): r for r in got.records}
    assert len(read) == len(records), f"{len(read)} of {len(records)} records read back"
    for key, value, headers in records:
        rec = read.get(placed[value])
        assert rec is not None and rec.value == value and rec.key == key, (
            f"record {value[:12]!r} came back changed or not at all")
        assert rec.headers == tuple(headers)


def _produce(bootstrap: str, broker: KafkaBroker, seed: int) -> tuple[str, list, dict]:
    topic = f"readbuf-{uuid.uuid4().hex[:8]}"
    broker.create_topic(topic, 2)
    records = _records(seed)
    placed = confluent_produce(bootstrap, topic, records, **PRODUCER)
    assert len(placed) == len(records)
    return topic, records, placed


def _consume(bootstrap: str, topic: str, records: list, placed: dict) -> None:
    group = f"readbuf-g-{uuid.uuid4().hex[:8]}"
    _check(confluent_consume(bootstrap, topic, group, len(records), **{"check.crcs": True}), records, placed)


def test_responses_cut_short_come_out_intact(kafka39: KafkaBroker, monkeypatch) -> None:
    # records to read while the others are written, put there directly
    ready = _produce(kafka39.bootstrap, kafka39, 100)
    for cls in (ClientConnection, UpstreamConnection):
        monkeypatch.setattr(cls, "connection_made", _small_send_buffer(cls))
    with ProxyThread(kafka39.bootstrap) as proxy, ThreadPoolExecutor(2 * WORKERS) as pool:
        # Produce requests and Fetch responses cross the proxy at the same time
        reading = [pool.submit(_consume, proxy.bootstrap, *ready) for _ in range(WORKERS)]
        written = [pool.submit(_produce, proxy.bootstrap, kafka39, seed) for seed in range(WORKERS)]
        for done in reading:
            done.result()
        for done in written:  # each read back through the proxy, then directly
            topic, records, placed = done.result()
            _consume(proxy.bootstrap, topic, records, placed)
            _consume(kafka39.bootstrap, topic, records, placed)
        assert proxy.call(lambda: proxy.proxy.reads.replaced) > 0, "no write was ever cut short"


def test_requests_cut_short_come_out_intact(kafka39: KafkaBroker, monkeypatch) -> None:
    for cls in (ClientConnection, UpstreamConnection):
        monkeypatch.setattr(cls, "connection_made", _small_send_buffer(cls))
    with ProxyThread(kafka39.bootstrap) as proxy:
        sent, producers, placed, errors = {}, [], {}, []

        def report(err, msg) -> None:
            if err is not None:
                errors.append(err)
            else:
                placed[msg.value()] = (msg.partition(), msg.offset())

        for seed in range(2):  # connected, and the partitions' leaders known, before the broker stops
            topic = f"readbuf-{uuid.uuid4().hex[:8]}"
            kafka39.create_topic(topic, 2)
            producer = Producer({"bootstrap.servers": proxy.bootstrap, **PRODUCER,
                                 "logger": logging.getLogger("kshare.tests.read_buffer")})
            first = (None, f"first-{topic}".encode(), [])
            producer.produce(topic, first[1], on_delivery=report)
            assert producer.flush(30) == 0
            sent[topic] = [first, *_records(seed)]
            producers.append(producer)
        before = proxy.call(lambda: proxy.proxy.reads.replaced)
        os.killpg(kafka39.proc.pid, signal.SIGSTOP)
        try:
            for (topic, records), producer in zip(sent.items(), producers, strict=True):
                for key, value, headers in records[1:]:
                    producer.produce(topic, key=key, value=value, headers=headers, on_delivery=report)
                producer.poll(0)
            time.sleep(1.5)  # the proxy reads both producers' requests; the broker reads nothing
        finally:
            os.killpg(kafka39.proc.pid, signal.SIGCONT)
        for producer in producers:
            assert producer.flush(60) == 0
        assert errors == [], errors
        assert proxy.call(lambda: proxy.proxy.reads.replaced) > before, "no write to the broker was cut short"
        for topic, records in sent.items():
            _consume(proxy.bootstrap, topic, records, placed)
            _consume(kafka39.bootstrap, topic, records, placed)
