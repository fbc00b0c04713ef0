"""Producing dead letters to a group's DLQ topic (the I/O; ``dead_letter`` decides what they are).

One idempotent producer for the whole service, created on first use. With
``errors.deadletterqueue.copy.record.enable`` the archived records are read back from the
share-partition's cached log to copy their key and value.
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import TYPE_CHECKING

from . import dead_letter

if TYPE_CHECKING:
    from .coordinator import ShareGroup
    from .partition_log import PartitionLogs
    from .upstream import TopicInfo, UpstreamCluster

log = logging.getLogger("kshare.share")


class DeadLetterWriter:
    def __init__(self, upstream: UpstreamCluster, logs: PartitionLogs) -> None:
        self.upstream = upstream
        self.logs = logs
        self._producer = None  # aiokafka producer, created on first use

    def send(self, group: ShareGroup, topic: TopicInfo, partition: int,
             items: list[dead_letter.DeadLetter]) -> asyncio.Task:
        """Produce the dead letters in the background: the task is done once all are on the DLQ topic."""
        return asyncio.get_running_loop().create_task(self._produce(group, topic, partition, items))

    async def _produce(self, group: ShareGroup, topic: TopicInfo, partition: int,
                       items: list[dead_letter.DeadLetter]) -> None:
        cfg = group.config
        if cfg.dlq_copy_record:
            plog = self.logs.get(topic, partition, cfg.read_committed)
            raw = []
            for offset in sorted({d.offset for d in items}):
                if any(b.base_offset <= offset <= b.last_offset for b, _ in raw):
                    continue
                read = await plog.read(offset, 1 << 20)
                raw.extend(read.batches[:1])
            dead_letter.fill_from_batches(items, [data for _, data in raw])
        producer = await self._dlq_producer()
        sends = []
        for d in items:
            # the copy carries key and value; the original headers are not copied (as Kafka 4.4)
            headers = dead_letter.context_headers(group.group_id, topic.name, partition, d)
            key = d.key if cfg.dlq_copy_record else None
            value = d.value if cfg.dlq_copy_record else None
            if key is None and value is None:
                # context headers only (or a copied record without key and value): aiokafka's send()
                # refuses such a record, a batch of our own carries it
                sends.append(await _send_null_record(producer, cfg.dlq_topic, headers))
            else:
                sends.append(await producer.send(cfg.dlq_topic, value=value, key=key, headers=headers))
        for fut in sends:
            await fut
        log.info("share group %s: %d record(s) of %s-%d dead-lettered to %s", group.group_id, len(items),
                 topic.name, partition, cfg.dlq_topic)

    async def _dlq_producer(self):
        if self._producer is None:
            from aiokafka import AIOKafkaProducer  # only groups with a DLQ topic need aiokafka's producer

            producer = AIOKafkaProducer(
                bootstrap_servers=[f"{h}:{p}" for h, p in self.upstream.bootstrap],
                acks="all", enable_idempotence=True, client_id="kshare-dlq", **self.upstream.security.aiokafka_kwargs())
            await producer.start()
            self._producer = producer
        return self._producer

    async def stop(self) -> None:
        if self._producer is not None:
            await self._producer.stop()


async def _send_null_record(producer, topic: str, headers: list[tuple[str, bytes]]) -> asyncio.Future:
    """Produce a record with null key and null value (only headers) to a random partition."""
    partitions = sorted(await producer.partitions_for(topic))
    batch = producer.create_batch()
    batch.append(key=None, value=None, timestamp=None, headers=headers)
    batch.close()
    return await producer.send_batch(batch, topic, partition=random.choice(partitions))
