"""What the crash-recovery, scale-out and broker-roll tests do around their ledgers: produce fast,
read end offsets and SPSOs, crash the proxy once more. The consumers that record every delivery
and every confirmed acknowledgement (a ledger), the checks on a ledger and what "confirmed" means
are :mod:`kshare.bench.ledgers`'.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from confluent_kafka import Producer, TopicPartition

from kshare.clients.admin import ShareGroupAdmin
from kshare.clients.connection import KafkaConnection
from tests.harness.share import quiet_logger, topic_id

log = logging.getLogger("kshare.tests.ledgers")

MAX_POLL = 100  # max.poll.records, which librdkafka also sends as ShareFetch MaxRecords
BATCH_RECORDS = 50  # records per producer batch (batch.num.messages)
# per crash and consumer: the batch the application holds plus one fetched in the background
INFLIGHT_LIMIT = 2 * (MAX_POLL + BATCH_RECORDS - 1)
GROUP_CONFIGS = {"share.heartbeat.interval.ms": 500, "share.session.timeout.ms": 10000}


def produce_fast(bootstrap: str, topic: str, n: int, partitions: int, *, start: int = 0) -> None:
    """``n`` records ``b"<i>"`` round-robin over the partitions, in producer batches of at most
    BATCH_RECORDS records."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.num.messages": BATCH_RECORDS,
                  "acks": "all", "enable.idempotence": True, "logger": quiet_logger()})
    errors: list[Any] = []

    def report(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(err)

    for i in range(start, start + n):
        while True:
            try:
                p.produce(topic, str(i).encode(), partition=i % partitions, on_delivery=report)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(60) == 0
    assert not errors, errors[:5]


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "watermarks", "logger": quiet_logger()})
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)}
    finally:
        c.close()


def describe_offsets(bootstrap: str, group: str, timeout_ms: int = 20000) -> dict[int, int | None]:
    """partition -> SPSO (None: none yet) of the group's only topic, by DescribeShareGroupOffsets."""

    async def run() -> dict[int, int | None]:
        host, _, port = bootstrap.rpartition(":")
        async with ShareGroupAdmin([(host, int(port))], timeout_ms=timeout_ms) as admin:
            return {o.partition: o.start_offset for o in await admin.describe_offsets(group)}

    return asyncio.run(run())


def offsets_after_one_more_crash(kshare: Any, group: str) -> dict[int, int | None]:
    """SIGKILL ``kshare`` (a :class:`~tests.harness.proxies.KShareProcess`) once more, start it again
    and read the group's SPSOs (what survives a crash); kshare is stopped afterwards."""
    try:
        kshare.kill()
        kshare.start()
        return describe_offsets(kshare.bootstrap, group)
    finally:
        kshare.stop()


def spso_reached(bootstrap: str, group: str, ends: dict[int, int]) -> bool:
    try:
        spso = describe_offsets(bootstrap, group, timeout_ms=5000)
    except Exception as exc:  # noqa: BLE001 - the proxy may be restarting
        log.info("describe offsets: %r", exc)
        return False
    return all(spso.get(p) == end for p, end in ends.items())


async def topic_id_direct(bootstrap: str, topic: str) -> bytes:
    host, _, port = bootstrap.rpartition(":")
    conn = await KafkaConnection.open(host, int(port))
    try:
        return await topic_id(conn, topic)
    finally:
        await conn.close()

