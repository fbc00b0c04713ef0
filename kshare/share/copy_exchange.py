"""The state-copy exchange between proxies of an instance group leading by topic, coalesced.

Before a leader first serves a share-partition at a map epoch it asks every other proxy for the
copy it holds (ReadShareGroupState with the epoch as the leader epoch), and it tells the holders
of older copies to drop them (WriteShareGroupState with the epoch and no start offset):
``kshare.share.instance_service``, docs/design/scale-out.md "The state follows its leader".
Asked one share-partition at a time, a group starting on 480 partitions after a rebalance sent
480 requests to each proxy. Both requests carry one group and any number of topic-partitions, so
the questions for one peer, group and map epoch made within a short linger (the confirmations a
ShareFetch starts together, those of several members' fetches) go out as one request, of at
most ``MAX_PARTITIONS`` share-partitions (more make several), and each caller gets its own
partition's answer back. A peer still handing a share-partition over waits for that before it
answers (bounded), but not when others came with it in the request: it answers "not yet" for
that one at once, and it is asked again with only what is being handed over.

:class:`Coalescer` is the batching core (no I/O of its own: it calls the send function it is
given); :class:`CopyExchange` builds and reads the two requests over it.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from ..protocol import messages
from ..protocol.codes import ApiKey
from .errors import ErrorCode
from .ownership import Instance
from .states import ShareSnapshot, StateBatch
from .store import SharePartitionKey

# Share-partitions per request at most: an answer carries each one's state batches, and a peer
# answers a request's partitions under one lock, so a request stays well inside the asker's
# request timeout (kshare.share.peers.PEER_TIMEOUT_S).
MAX_PARTITIONS = 200
# How long the first question for a peer, group and epoch waits for others to join it: the
# confirmations one ShareFetch starts arrive within a loop turn, those of other members' fetches
# within a few milliseconds; a peer round trip costs more than this.
LINGER_S = 0.002
# the batch of share-partitions asked again because the peer is still handing them over
HANDING_OVER = "handing over"

T = TypeVar("T")  # whom a batch goes to
K = TypeVar("K", bound=Hashable)  # an item of a batch (a topic-partition)
V = TypeVar("V")  # what an item carries (merged when asked twice in one batch)
R = TypeVar("R")  # an item's answer


class MissingAnswer(Exception):
    """The answer to a batch named no result for an item of it."""


@dataclass
class Batch(Generic[T, K, V, R]):
    """The items asked of one batch key, to be sent together."""

    key: Hashable
    target: T
    values: dict[K, V] = field(default_factory=dict)
    waiters: dict[K, list[asyncio.Future[R]]] = field(default_factory=dict)
    timer: asyncio.Handle | None = None


class Coalescer(Generic[T, K, V, R]):
    """Calls for the same batch key made within ``linger_s`` of the first go out as one
    ``send(target, key, {item: value})``, which answers each item (a mapping item -> answer) or
    raises: then every caller of that batch gets its exception. An item asked twice in one batch
    is sent once (``merge`` combines its values) and both callers get its answer. A batch that
    reaches ``max_items`` items goes out at once; the next call starts a new one. A caller that is
    cancelled stops waiting; its item is still sent with the others."""

    def __init__(
        self,
        send: Callable[[T, Hashable, dict[K, V]], Awaitable[Mapping[K, R]]],
        *,
        max_items: int = MAX_PARTITIONS,
        linger_s: float = LINGER_S,
        merge: Callable[[V, V], V] = lambda old, new: old,
    ) -> None:
        if max_items < 1:
            raise ValueError("max_items must be at least 1")
        self._send, self.max_items, self.linger_s, self._merge = send, max_items, linger_s, merge
        self._open: dict[Hashable, Batch[T, K, V, R]] = {}  # batch key -> the batch still taking items
        self._sending: set[asyncio.Task] = set()
        self.batches = 0  # sent (or being sent)
        self.items = 0  # items they carried

    def call(self, key: Hashable, target: T, item: K, value: V) -> asyncio.Future[R]:
        """The future answer to ``item`` (with ``value``), sent with the other items of ``key``."""
        loop = asyncio.get_running_loop()
        batch = self._open.get(key)
        if batch is None:
            batch = self._open[key] = Batch(key, target)
            if self.linger_s > 0:
                batch.timer = loop.call_later(self.linger_s, self._flush, batch)
            else:
                batch.timer = loop.call_soon(self._flush, batch)
        fut: asyncio.Future[R] = loop.create_future()
        if item in batch.values:
            batch.values[item] = self._merge(batch.values[item], value)
        else:
            batch.values[item] = value
        batch.waiters.setdefault(item, []).append(fut)
        if len(batch.values) >= self.max_items:
            self._flush(batch)
        return fut

    def pending(self) -> int:
        """Items waiting for their batch to go out."""
        return sum(len(b.values) for b in self._open.values())

    def idle(self) -> bool:
        """Nothing waits to go out, nothing is being sent."""
        return not self._open and not self._sending

    def _flush(self, batch: Batch[T, K, V, R]) -> None:
        if self._open.get(batch.key) is not batch:
            return  # gone out already (full)
        del self._open[batch.key]
        if batch.timer is not None:
            batch.timer.cancel()
        self.batches += 1
        self.items += len(batch.values)
        task = asyncio.get_running_loop().create_task(self._run(batch))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _run(self, batch: Batch[T, K, V, R]) -> None:
        try:
            answers = await self._send(batch.target, batch.key, dict(batch.values))
        except BaseException as exc:  # every caller of the batch gets it (cancelled: they are too)
            for futs in batch.waiters.values():
                for fut in futs:
                    if not fut.done():
                        if isinstance(exc, asyncio.CancelledError):
                            fut.cancel()
                        else:
                            fut.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for item, futs in batch.waiters.items():
            for fut in futs:
                if fut.done():  # its caller stopped waiting
                    continue
                if item in answers:
                    fut.set_result(answers[item])
                else:
                    fut.set_exception(MissingAnswer(f"no answer for {item!r}"))


TopicPartition = tuple[bytes, int]
# (error code, (state epoch, state) of the copy a peer holds, or None)
CopyAnswer = tuple[int, tuple[int, ShareSnapshot] | None]
# the same, and whether to ask it again with only what is being handed over
ReadAnswer = tuple[int, tuple[int, ShareSnapshot] | None, bool]
Request = Callable[[Instance, int, Any], Awaitable[Any]]  # kshare.share.peers.PeerClient.request


class CopyExchange:
    """The exchange's requests to the other proxies, coalesced per peer, group and map epoch.

    ``requests``/``partitions`` count, by request (``read``, ``drop``), what was sent and how many
    share-partitions it carried (``kshare_instance_state_exchange_*``)."""

    def __init__(
        self, request: Request, *, max_partitions: int = MAX_PARTITIONS, linger_s: float = LINGER_S
    ) -> None:
        self._request = request
        self._reads: Coalescer[Instance, TopicPartition, None, ReadAnswer] = Coalescer(
            self._send_read, max_items=max_partitions, linger_s=linger_s
        )
        # a copy older than either state epoch goes: the higher one says as much as both
        self._drops: Coalescer[Instance, TopicPartition, int, int] = Coalescer(
            self._send_drop, max_items=max_partitions, linger_s=linger_s, merge=max
        )
        self.requests: Counter[str] = Counter()
        self.partitions: Counter[str] = Counter()

    @staticmethod
    def _key(peer: Instance, group_id: str, epoch: int) -> tuple[tuple[str, str, int], str, int]:
        return (peer.id, peer.host, peer.port), group_id, epoch

    async def ask(self, peer: Instance, key: SharePartitionKey, epoch: int) -> CopyAnswer:
        """(error code, (state epoch, state) of the copy ``peer`` holds of ``key``, or None), asked
        at map ``epoch``. Raises what the request raised."""
        batch, tp = self._key(peer, key.group_id, epoch), (key.topic_id, key.partition)
        code, copy, again = await self._reads.call(batch, peer, tp, None)
        if again:
            # The peer is still handing it over and answered at once, not to hold back the others of
            # the request: asked again (once) with only what is being handed over, which it waits for
            code, copy, _ = await self._reads.call((*batch, HANDING_OVER), peer, tp, None)
        return code, copy

    async def drop(self, peer: Instance, key: SharePartitionKey, epoch: int, state_epoch: int) -> int:
        """Tell ``peer`` that the leader at map ``epoch`` holds ``key`` at ``state_epoch``: a copy
        older there goes. Its error code; raises what the request raised."""
        return await self._drops.call(
            self._key(peer, key.group_id, epoch), peer, (key.topic_id, key.partition), state_epoch
        )

    async def _send_read(
        self, peer: Instance, batch_key: Hashable, items: dict[TopicPartition, None]
    ) -> dict[TopicPartition, ReadAnswer]:
        _, group_id, epoch = batch_key[:3]  # type: ignore[index]
        req = messages.message_class("ReadShareGroupStateRequest")
        body = req(
            group_id=group_id,
            topics=[
                req.ReadStateData(
                    topic_id=tid,
                    partitions=[req.PartitionData(partition=p, leader_epoch=epoch) for p in parts],
                )
                for tid, parts in _by_topic(items).items()
            ],
        )
        self.requests["read"] += 1
        self.partitions["read"] += len(items)
        resp = await self._request(peer, ApiKey.READ_SHARE_GROUP_STATE, body)
        out: dict[TopicPartition, CopyAnswer] = {}
        for result in resp.results:
            for part in result.partitions:
                tp = (result.topic_id, part.partition)
                if part.error_code:
                    out[tp] = part.error_code, None
                elif part.state_epoch < 0:
                    out[tp] = ErrorCode.NONE, None
                else:
                    out[tp] = (
                        ErrorCode.NONE,
                        (
                            part.state_epoch,
                            ShareSnapshot(
                                part.start_offset,
                                tuple(
                                    StateBatch(
                                        b.first_offset, b.last_offset, b.delivery_state, b.delivery_count
                                    )
                                    for b in part.state_batches
                                ),
                            ),
                        ),
                    )
        # Answered "not yet" (COORDINATOR_LOAD_IN_PROGRESS) beside answers: the peer did not wait
        # for its hand-over, so as not to hold the others back (InstanceGroupMember.answer_copies).
        # Answered so all alike, the peer waited for every one, or it is behind on the map epoch.
        loading = {tp for tp, (code, _) in out.items() if code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS}
        again = bool(loading) and len(loading) < len(out) and len(batch_key) == 3  # type: ignore[arg-type]
        return {tp: (code, copy, again and tp in loading) for tp, (code, copy) in out.items()}

    async def _send_drop(
        self, peer: Instance, batch_key: Hashable, items: dict[TopicPartition, int]
    ) -> dict[TopicPartition, int]:
        _, group_id, epoch = batch_key[:3]  # type: ignore[index]
        req = messages.message_class("WriteShareGroupStateRequest")
        body = req(
            group_id=group_id,
            topics=[
                req.WriteStateData(
                    topic_id=tid,
                    partitions=[
                        req.PartitionData(
                            partition=p,
                            state_epoch=items[(tid, p)],
                            leader_epoch=epoch,
                            start_offset=-1,
                            state_batches=[],
                        )
                        for p in parts
                    ],
                )
                for tid, parts in _by_topic(items).items()
            ],
        )
        self.requests["drop"] += 1
        self.partitions["drop"] += len(items)
        resp = await self._request(peer, ApiKey.WRITE_SHARE_GROUP_STATE, body)
        return {
            (result.topic_id, part.partition): part.error_code
            for result in resp.results
            for part in result.partitions
        }


def _by_topic(items: Mapping[TopicPartition, Any]) -> dict[bytes, list[int]]:
    out: dict[bytes, list[int]] = {}
    for tid, partition in items:
        out.setdefault(tid, []).append(partition)
    return out
