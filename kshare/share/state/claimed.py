"""An instance group's state partitions in the store: claimed, renewed, released (see :mod:`.fence`).

Mixed into :class:`~kshare.share.state.topic_store.TopicStateStore` (its one job: which partitions
the store may write, and the claims that fence their previous owners); the store's round path asks
:meth:`ClaimedPartitions._writable` for each record and renews due claims in an exclusive round.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .claims import renew_interval_ms
from .codec import partition_for
from .errors import StateNotOwned, StateStoreError, StateWriteError
from .fence import Fenced, PartitionClaim
from .memory import REFRESH_SHARE

if TYPE_CHECKING:
    from .topic_store import TopicStateStore

log = logging.getLogger("kshare.share.state_topic")  # the state store's one logger, named as documented


class ClaimedPartitions:
    """The instance-group part of the state store."""

    async def claim(self: TopicStateStore, partitions: Sequence[int]) -> None:
        """Take these state partitions over: first each one is claimed (InitProducerId for its
        transactional id, then a claim record with that producer id and epoch), which makes the
        broker refuse the previous owner's writes, then it is replayed up to past its claim
        record. Writes of their share-partitions and groups are accepted from then on."""
        new = sorted(p for p in set(partitions) if p not in self._writers)
        if not new:
            return
        assert self.transactional_prefix is not None, "claim() is for an instance group's store"
        claims = {p: PartitionClaim(self.bootstrap_servers, self.topic, p, f"{self.transactional_prefix}{p}",
                                    self._producers.for_partition(p), ownership_epoch=self.leader_epoch,
                                    timeout_s=self.write_timeout_s, security=self.security,
                                    client_id=self.client_id)
                  for p in new}
        try:
            await asyncio.gather(*(c.start() for c in claims.values()))
            await self._load(partitions=new)
        except BaseException:
            await asyncio.gather(*(c.stop() for c in claims.values()), return_exceptions=True)
            raise
        for key, e in self.memory.entries.items():
            # (leading by topic, the state is wherever its leader put it: memory.home is set)
            if e.partition in claims and self.memory.home is None and partition_for(key, self.partitions) != e.partition:
                log.error("state topic %s: %s is in partition %d, the instance group looks for it in %d "
                          "(written by an older kshare): it will be served without that state",
                          self.topic, key, e.partition, partition_for(key, self.partitions))
        self._writers.update(claims)

    async def release(self: TopicStateStore, partitions: Sequence[int]) -> None:
        """Give these state partitions up: no more writes to them (the rounds in flight finish
        first) and their share-partitions and groups leave memory."""
        gone = {p for p in partitions if p in self._writers}
        if not gone:
            return
        claims = [self._writers.pop(p) for p in gone]  # later rounds: not owned
        # the rounds in flight now may carry their records: settled first (not under the round
        # lock, which an exclusive round among them needs)
        in_flight = list(self.rounds.in_flight)
        deadline = time.monotonic() + self.write_timeout_s
        while any(r in self.rounds.in_flight for r in in_flight) and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        async with self._round_lock:  # a renewal under way finishes
            pass
        self.memory.forget_partitions(gone)
        await asyncio.gather(*(c.stop() for c in claims), return_exceptions=True)

    async def _renewal_interval(self: TopicStateStore) -> float:
        """The claim renewal interval from the brokers' transactional.id.expiration.ms and
        producer.id.expiration.ms (claims.renew_interval_ms; Kafka's defaults if not readable)."""
        from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

        names = ("transactional.id.expiration.ms", "producer.id.expiration.ms")
        found: dict[str, int] = {}
        try:
            cluster = await self._admin.describe_cluster()
            node = str(cluster["brokers"][0]["node_id"])
            answers = await self._admin.describe_configs([ConfigResource(ConfigResourceType.BROKER, node)])
            for resp in answers:
                for res in resp.resources:
                    for entry in res[4]:
                        if entry[0] in names and entry[1] is not None:
                            found[entry[0]] = int(entry[1])
        except Exception as exc:  # noqa: BLE001 - Kafka's defaults then
            log.debug("state topic %s: cannot read the brokers' expiration configs (%r); renewing claims as "
                      "for Kafka's defaults", self.topic, exc)
        return renew_interval_ms(found.get(names[0]), found.get(names[1])) / 1000

    async def _renew_loop(self: TopicStateStore) -> None:
        """Claims due for renewal are renewed in an exclusive round: a flush starts one when no
        write does."""
        while not self._closing:
            await asyncio.sleep(max(0.05, min(1.0, self.claim_renewal_s / 4)))  # a cheap check
            if any(c.renewal_due(self.claim_renewal_s) for c in self._writers.values()) and not self._closing:
                with contextlib.suppress(StateStoreError):
                    self._enqueue([]).add_done_callback(retrieve)

    async def _renew_claims(self: TopicStateStore) -> None:
        """Renew every claim that is due (in an exclusive round: nothing of theirs in flight)."""
        due = [c for c in self._writers.values() if c.renewal_due(self.claim_renewal_s)]
        if not due:
            return

        async def renew(c: PartitionClaim) -> None:
            try:
                await c.renew()
            except Fenced:
                if self.on_fenced is not None and self._writers.get(c.partition) is c:
                    self.on_fenced(c.partition)
            except Exception as exc:  # noqa: BLE001 - the next exclusive round tries again
                log.warning("state topic %s partition %d: cannot renew this proxy's claim yet: %r", self.topic,
                            c.partition, exc)

        await asyncio.gather(*(renew(c) for c in due))

    def _writable_ops(self: TopicStateStore, ops: list[tuple]) -> list[tuple]:
        """The refresh operations (prune.refresh_ops) of partitions this store may write now."""
        memory = self.memory
        out = []
        for op in ops:
            entry = memory.entries.get(op[1]) if op[0] == REFRESH_SHARE else memory.groups.get(op[1])
            if entry is not None and self._writable(entry.partition) is None:
                out.append(op)
        return out

    def _writable(self: TopicStateStore, partition: int) -> Exception | None:
        """Why an instance group's store may not write this partition now (None: it may)."""
        c = self._writers.get(partition)
        if c is None:
            return StateNotOwned(f"state partition {partition} is not owned by this proxy")
        if c.fenced:
            return StateNotOwned(f"state partition {partition} was taken over by another proxy")
        if c.needs_renewal:
            return StateWriteError(f"state partition {partition}: this proxy's claim is being renewed")
        return None


def retrieve(fut: asyncio.Future) -> None:
    """Retrieve a future's outcome (so that asyncio does not report it as never retrieved)."""
    if not fut.cancelled():
        fut.exception()


__all__ = ["ClaimedPartitions", "retrieve"]
