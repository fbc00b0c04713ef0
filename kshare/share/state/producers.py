"""The state store's producers and their lifecycle: started, renewed after a failed batch, stopped."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence

from ...security import ClientSecurity
from .errors import StateWriteError
from .pipelined_producer import PipelinedProducer

log = logging.getLogger("kshare.share.state_topic")  # the state store's one logger, named as documented


class StateProducers:
    """``count`` pipelined producers, idempotent where the cluster grants producer ids; state-topic
    partition ``p`` always goes through producer ``p % count`` (so each partition's records keep
    their order, as with one).

    An idempotent producer one of whose batches failed must be replaced (:meth:`renew`). A batch
    gets its sequence number when it is sent, and may fail without reaching the broker (a
    connection lost, a partition without leader during a broker restart). The broker never sees
    that sequence number, so every later batch of the partition would fail with
    OutOfOrderSequenceNumber, forever. A new producer (new producer id) starts from sequence 0. The
    old one first delivers or fails what it still holds, so nothing it sent can land behind a
    record of the new one.
    """

    def __init__(self, bootstrap_servers: Sequence[str], topic: str, *, count: int = 1,
                 security: ClientSecurity | None = None, client_id: str = "kshare-state",
                 timeout_s: float = 30.0, on_resend: Callable[[], None] | None = None) -> None:
        self.bootstrap_servers = list(bootstrap_servers)
        self.topic = topic
        self.count = max(1, count)
        self.security = security
        self.client_id = client_id
        self.timeout_s = timeout_s
        self.on_resend = on_resend
        self.producers: list[PipelinedProducer] = []
        self.idempotent = False
        self.needs_renewal = False  # a batch of the idempotent producer failed
        self._retiring: asyncio.Task[None] | None = None  # the replaced producers, delivering what they hold
        self.renew_failures = 0

    @property
    def renewing(self) -> bool:
        """The producers are to be replaced, or the replaced ones are still delivering: the next
        round must run alone (it replaces them first)."""
        return self.needs_renewal or self._retiring is not None

    def for_partition(self, partition: int) -> PipelinedProducer:
        return self.producers[partition % len(self.producers)]

    async def start(self, *, idempotent: bool, partitions: int, claims: bool = False) -> None:
        """``claims``: an instance group's producers, which write each partition with the producer
        id and epoch of its claim (kshare.share.state.fence) instead of one of their own."""
        old, self.producers = self.producers, []
        await stop_all(old)
        # Pipelined: every round's records go out at once, in order per partition (see
        # pipelined_producer.py); what is sent again after a leader move goes before anything
        # queued behind it, so order holds without idempotence too.
        producers = [
            PipelinedProducer(self.bootstrap_servers, self.topic, idempotent=idempotent, security=self.security,
                              client_id=self.client_id, request_timeout_s=self.timeout_s,
                              retry_timeout_s=self.timeout_s * 2 / 3, on_resend=self.on_resend, claims=claims)
            for _ in range(min(self.count, partitions))
        ]
        self.idempotent = idempotent
        try:
            # an idempotent producer gets its producer id here
            await asyncio.gather(*(p.start() for p in producers))
        except BaseException:
            await stop_all(producers)
            raise
        self.producers = producers

    async def renew(self, partitions: int) -> None:
        """Replace the idempotent producers (see the class doc); StateWriteError when the replaced
        ones still hold undelivered records after the timeout."""
        if self._retiring is None:
            old, self.producers = self.producers, []
            if old:
                self._retiring = asyncio.create_task(stop_all(old))
        if self._retiring is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._retiring), self.timeout_s)
            except TimeoutError:
                raise StateWriteError("the replaced state producer still holds undelivered records") from None
            except Exception:  # noqa: BLE001 - it stopped either way
                pass
            self._retiring = None
        await self.start(idempotent=True, partitions=partitions)
        self.needs_renewal = False
        self.renew_failures = 0
        log.warning("state topic %s: a state write failed in the producer; replaced the idempotent producer",
                    self.topic)

    def send_failed(self) -> None:
        """A record was not written: an idempotent producer's sequence is broken."""
        if self.idempotent:
            self.needs_renewal = True

    def late_outcome(self, fut: asyncio.Future) -> None:
        """Outcome of a send that was still pending when its round gave up on it."""
        if not fut.cancelled() and fut.exception() is not None:
            self.send_failed()

    async def stop(self) -> None:
        producers, self.producers = self.producers, []
        if self._retiring is not None:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(self._retiring, self.timeout_s)
            self._retiring = None
        await stop_all(producers)


async def stop_all(producers: list[PipelinedProducer]) -> None:
    """Stop producers (each delivers or fails what it holds first)."""
    await asyncio.gather(*(p.stop() for p in producers), return_exceptions=True)


__all__ = ["StateProducers", "stop_all"]
