"""Naming the proxy that still hands a topic-partition over as its leader, at every proxy.

A proxy that loses a share-partition's leadership hands it over (``InstanceGroupMember._hand_over``):
it hands nothing out, takes its members' acknowledgements of what they hold, then leaves, and until
then its own Metadata names it the leader. librdkafka drops the acknowledgements of records whose
partition's leader changed, in the metadata it holds, since it acquired them ("leader changed since
records were acquired"), and a client refreshes its metadata at whichever proxy it picks: one that
named the new leader at once made it drop what it held, which came again after ``--drain-timeout``.

So the ownership map lists, per partition that moves, the proxy it moves from
(``OwnershipMap.moved_from``), and every proxy names that one until it says it is done: until the
proxy's own Metadata names another leader, asked every :data:`ASK_EVERY_S` by :class:`HandoverWatch`,
and at most the hand-over's timeout (plus :data:`MARGIN_S`: the maps are applied at about the same
time, not at once). A proxy that cannot be reached hands nothing over and is named no longer.

:class:`HandoversElsewhere` is the sans-I/O core (an injectable clock); :class:`HandoverWatch` asks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..protocol import messages
from ..protocol.codes import ApiKey
from ..proxy.virtual import split_node

if TYPE_CHECKING:  # ownership keeps one of these (GroupOwnership.elsewhere)
    from .ownership import Instance, OwnershipMap, TopicPartition

log = logging.getLogger("kshare.share")

ASK_EVERY_S = 0.1  # how often a proxy handing something over is asked whether it is done
MARGIN_S = 2.0  # beyond the hand-over's timeout: the proxies apply a map at about the same time


@dataclass(frozen=True)
class Pending:
    """A topic-partition named at the proxy handing it over until it is done."""

    instance: Instance  # the proxy handing it over
    since: float
    deadline: float


class HandoversElsewhere:
    """What this proxy names at the proxies handing topic-partitions over (sans-I/O).

    ``named`` counts, by how each ended, the topic-partitions named so (``kshare_instance_handovers_named_total``)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._pending: dict[TopicPartition, Pending] = {}
        self.epoch = 0  # of the map the entries come from
        self.ended: dict[str, int] = {"done": 0, "timed_out": 0, "unreachable": 0, "superseded": 0}

    def apply(self, decision: OwnershipMap, me: str, timeout_s: float) -> int:
        """A new map: name, for every partition it moves, the proxy it moves from (other than this
        one, which names itself while it hands over) until that one is done, at most ``timeout_s``
        plus the margin. What the map before listed is replaced. Returns how many are named so."""
        now = self.clock()
        before = self._pending
        self._pending = {}
        self.epoch = decision.epoch
        if timeout_s > 0 and decision.by_topic:
            deadline = now + timeout_s + MARGIN_S
            for hex_id, row in decision.moved_from.items():
                topic_id = bytes.fromhex(hex_id)
                for partition, index in enumerate(row):
                    if not 0 <= index < len(decision.instances) or decision.instances[index].id == me:
                        continue
                    tp = (topic_id, partition)
                    was = before.get(tp)
                    since = was.since if was is not None and was.instance.id == decision.instances[index].id else now
                    self._pending[tp] = Pending(decision.instances[index], since, deadline)
        self.ended["superseded"] += sum(1 for tp in before if tp not in self._pending)
        return len(self._pending)

    def slot(self, topic_id: bytes, partition: int) -> int | None:
        """The slot of the proxy to name as the topic-partition's leader while it hands it over (None:
        as the map says)."""
        if not self._pending:
            return None
        entry = self._pending.get((topic_id, partition))
        if entry is None:
            return None
        if entry.deadline <= self.clock():
            self.expire()
            return None
        return entry.instance.slot

    def expire(self) -> list[tuple[TopicPartition, Pending]]:
        """Drop what is past its deadline; returns it."""
        now = self.clock()
        gone = [(tp, e) for tp, e in self._pending.items() if e.deadline <= now]
        for tp, _ in gone:
            del self._pending[tp]
        self.ended["timed_out"] += len(gone)
        return gone

    def to_ask(self) -> dict[str, tuple[Instance, list[TopicPartition]]]:
        """Instance id -> (the proxy, what it is named for): whom to ask whether it is done."""
        self.expire()
        out: dict[str, tuple[Instance, list[TopicPartition]]] = {}
        for tp, e in self._pending.items():
            out.setdefault(e.instance.id, (e.instance, []))[1].append(tp)
        return out

    def answered(self, instance_id: str, asked: Iterable[TopicPartition],
                 still: Iterable[TopicPartition]) -> list[tuple[TopicPartition, float]]:
        """The proxy ``instance_id`` was asked about ``asked`` and names itself the leader of
        ``still``: the rest of ``asked`` it is done with. Returns those, with how long each was named."""
        keep, now = set(still), self.clock()
        done = []
        for tp in asked:
            e = self._pending.get(tp)
            if e is not None and e.instance.id == instance_id and tp not in keep:
                del self._pending[tp]
                done.append((tp, now - e.since))
        self.ended["done"] += len(done)
        return done

    def unreachable(self, instance_id: str) -> int:
        """The proxy could not be asked: it hands nothing over that a client could reach it for."""
        gone = [tp for tp, e in self._pending.items() if e.instance.id == instance_id]
        for tp in gone:
            del self._pending[tp]
        self.ended["unreachable"] += len(gone)
        return len(gone)

    def __len__(self) -> int:
        return len(self._pending)


Request = Callable[["Instance", int, Any], Awaitable[Any]]  # kshare.share.peers.PeerClient.request


class HandoverWatch:
    """Asks the proxies named for what they hand over whether they are done, while any is
    (one task; :meth:`kick` after every map)."""

    def __init__(self, names: HandoversElsewhere, request: Request,
                 topic_name: Callable[[bytes], str | None]) -> None:
        self.names = names
        self._request = request
        self._topic_name = topic_name
        self._task: asyncio.Task | None = None
        self._told_unreachable: set[tuple[str, int]] = set()

    def kick(self) -> None:
        if self.names and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self._run(), name="kshare-handovers-elsewhere")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        started = time.monotonic()
        epoch, first = self.names.epoch, len(self.names)
        log.info("instance group: ownership epoch %d: %d topic-partition(s) named at the proxies handing them "
                 "over until they are done", epoch, first)
        while True:
            asking = self.names.to_ask()
            if not asking:
                break
            await asyncio.gather(*(self._ask(peer, tps) for peer, tps in asking.values()))
            if self.names:
                await asyncio.sleep(ASK_EVERY_S)
        ended = self.names.ended
        log.info("instance group: every hand-over named elsewhere is over in %.2f s (since start: %d done, "
                 "%d past the hand-over timeout, %d unreachable, %d superseded by a newer map)",
                 time.monotonic() - started, ended["done"], ended["timed_out"], ended["unreachable"],
                 ended["superseded"])

    async def _ask(self, peer: Instance, tps: list[TopicPartition]) -> None:
        names = {tid: self._topic_name(tid) for tid, _ in tps}
        if any(n is None for n in names.values()):  # a topic unknown here: nothing to ask by
            unknown = [tp for tp in tps if names[tp[0]] is None]
            self.names.answered(peer.id, unknown, ())
            tps = [tp for tp in tps if names[tp[0]] is not None]
            if not tps:
                return
        req = messages.message_class("MetadataRequest")
        body = req(topics=[req.MetadataRequestTopic(name=n) for n in sorted({n for n in names.values() if n})],
                   allow_auto_topic_creation=False)
        try:
            resp = await self._request(peer, ApiKey.METADATA, body)
        except Exception as exc:  # noqa: BLE001 - refused, closed or timed out (PEER_TIMEOUT_S): it serves nothing
            key = (peer.id, self.names.epoch)
            if key not in self._told_unreachable:
                self._told_unreachable.add(key)
                log.warning("instance group: cannot ask %s:%d whether it has handed over %d topic-partition(s) "
                            "(%s); naming their new leaders", peer.host, peer.port, len(tps), exc or type(exc).__name__)
            self.names.unreachable(peer.id)
            return
        by_name = {n: tid for tid, n in names.items()}
        still = set()
        for topic in resp.topics:
            tid = by_name.get(topic.name)
            if tid is None or topic.error_code:
                continue
            for p in topic.partitions:
                if p.leader_id >= 0 and split_node(p.leader_id)[0] == peer.slot:
                    still.add((tid, p.partition_index))
        for (tid, partition), named_s in self.names.answered(peer.id, tps, still):
            log.debug("instance group: %s:%d handed %s-%d over; named there for %.2f s", peer.host, peer.port,
                      names[tid], partition, named_s)


__all__ = ["ASK_EVERY_S", "MARGIN_S", "HandoverWatch", "HandoversElsewhere", "Pending"]
