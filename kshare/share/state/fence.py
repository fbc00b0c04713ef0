"""Writes to one owned state partition, fenced by the broker.

In an instance group a state partition moves between proxies. The proxy that takes it over must
know that the previous owner (paused, cut off, or simply slow to learn the news) can no longer
write there. Kafka already provides exactly that: a transactional producer. Every owner of
partition P writes through the transactional id ``<prefix><P>``; starting a producer with that id
(InitProducerId) bumps its epoch on the broker's transaction coordinator, which then refuses the
old producer's writes and commits (ProducerFenced) and aborts its open transaction. So the new
owner starts its producer *before* it replays the partition (read_committed): what it reads is
everything the old owner committed, and the old owner cannot add to it any more.

Each write is one transaction (begin, the records, commit): it is durable and visible to a
read_committed replay only once committed, which is when the caller's write returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from ...proxy.loop_reports import demote_reports

log = logging.getLogger("kshare.share")


class Fenced(Exception):
    """Another proxy owns this state partition now; nothing of the write was committed."""


def expect_fencing(loop: asyncio.AbstractEventLoop) -> None:
    """Keep an expected fencing out of the error log.

    When another proxy fences this one, aiokafka's sender fails its pending transaction requests
    with ProducerFenced in tasks of its own that nobody awaits any more; asyncio then reports each
    as "Future exception was never retrieved" at ERROR with a traceback. The fencing itself is
    handled and logged once per partition (``PartitionWriter.write``, the service): those reports
    go to DEBUG, everything else to the loop's previous handler.
    """
    from aiokafka.errors import ProducerFenced

    def after_fencing(context: dict[str, Any]) -> str | None:
        return "after a fencing" if isinstance(context.get("exception"), ProducerFenced) else None

    demote_reports(loop, "fencing", after_fencing, log)


class _SenderStopped(logging.Filter):
    """aiokafka's sender logs an answer it does not expect at ERROR with a traceback, then stops
    (the producer's pending and later sends fail). Seen when ownership of a state partition moves
    back and forth between proxies: the producer of the proxy losing it may get an unknown error
    instead of ProducerFenced. The writes that fail are logged by kshare itself (the store, the
    service); this says once, in one line, what stopped."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == "Unexpected error in sender routine" and record.exc_info:
            exc = record.exc_info[1]
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.msg = ("a transactional state producer stopped on an answer it did not expect from the "
                          "cluster (%r); the state writes it carried fail (logged where they fail)")
            record.args = (exc,)
            record.exc_info = record.exc_text = None
        return True


_SENDER_FILTER = _SenderStopped()


def quiet_sender_stops() -> None:
    """Install the filter above on aiokafka's sender logger (once)."""
    sender_log = logging.getLogger("aiokafka.producer.sender")
    if _SENDER_FILTER not in sender_log.filters:
        sender_log.addFilter(_SENDER_FILTER)


@dataclass(eq=False)
class PartitionWriter:
    """Writes one state-topic partition through its own transactional producer (``transactional_id``)."""

    bootstrap: list[str]
    topic: str
    partition: int
    transactional_id: str
    _: KW_ONLY
    write_timeout_s: float = 30.0
    transaction_timeout_ms: int = 60_000
    producer_config: dict[str, Any] | None = None  # extra AIOKafkaProducer settings
    fenced: bool = field(default=False, init=False)
    _producer: Any = field(default=None, init=False, repr=False)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False, repr=False)  # one transaction at a time

    async def start(self) -> None:
        """Take the partition over: from now on the previous owner's writes are refused."""
        from aiokafka import AIOKafkaProducer

        quiet_sender_stops()
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            client_id=f"kshare-state-{self.partition}",
            transactional_id=self.transactional_id,
            transaction_timeout_ms=self.transaction_timeout_ms,
            enable_idempotence=True,
            acks="all",
            linger_ms=0,
            max_batch_size=512 * 1024,
            max_request_size=1024 * 1024,
            request_timeout_ms=int(self.write_timeout_s * 1000),
            **(self.producer_config or {}),
        )
        try:
            await self._producer.start()  # InitProducerId: fences the previous owner
        except BaseException:
            with contextlib.suppress(Exception):
                await self._producer.stop()
            self._producer = None
            raise

    async def write(self, records: list[tuple[bytes, bytes | None]]) -> list[int]:
        """Append (key, value) records in one transaction; their offsets once committed.

        Raises :class:`Fenced` when another owner took the partition over (nothing was committed),
        and other exceptions when the write failed otherwise (it was aborted, or its outcome is
        unknown if the commit itself timed out: a read_committed replay then decides).
        """
        from aiokafka.errors import ProducerFenced

        if self.fenced or self._producer is None:
            raise Fenced(f"state partition {self.partition} is no longer owned here")
        producer = self._producer
        async with self._lock:
            try:
                async with asyncio.timeout(self.write_timeout_s):
                    await producer.begin_transaction()
                    try:
                        sends = [await producer.send(self.topic, value=v, key=k, partition=self.partition)
                                 for k, v in records]
                        # every outcome retrieved (a fenced batch fails all its records)
                        results = await asyncio.gather(*sends, return_exceptions=True)
                        failed = next((r for r in results if isinstance(r, BaseException)), None)
                        if failed is not None:
                            raise failed
                        await producer.commit_transaction()
                    except ProducerFenced:
                        raise
                    except BaseException:
                        with contextlib.suppress(Exception):
                            await producer.abort_transaction()
                        raise
            except ProducerFenced as exc:
                self.fenced = True
                expect_fencing(asyncio.get_running_loop())  # aiokafka's leftovers of this fencing
                # the store's owner says so to the operator, once per partition
                log.debug("state partition %d: another proxy took it over (%s); this proxy no longer "
                          "writes it", self.partition, exc)
                raise Fenced(str(exc)) from exc
        return [r.offset for r in results]

    async def stop(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            with contextlib.suppress(Exception):
                await producer.stop()
