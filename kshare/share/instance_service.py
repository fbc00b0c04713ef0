"""The service's side of an instance group (several proxies as one service; docs/design/scale-out.md).

Mixed into :class:`kshare.share.service.ShareGroupService`: joining the group, applying each new
ownership map (give up what moved away, claim, i.e. fence and replay, what moved here), stopping
at once when another proxy fenced this one, and the configs of groups coordinated elsewhere.

Leading by topic (a ``kshare-ownership-v2`` map), a share-partition's state follows its leader: before
a leader first serves a share-partition at a map epoch it asks every other proxy, at that same
epoch, for the copy it holds (ReadShareGroupState with that epoch as the leader epoch), keeps the
newest by state epoch (its own included), writes it into its own state partition with the next
state epoch if it came from elsewhere, and tells the holders to drop theirs (WriteShareGroupState
with that epoch, no start offset): :meth:`InstanceGroupMember.confirm_state`, answered by
:meth:`InstanceGroupMember.answer_copies` and :meth:`InstanceGroupMember.drop_copies`.

A rebalance moves nothing members hold, bounded by ``--drain-timeout``: a share-partition whose
leadership moves away is *handed over* (it hands nothing out, takes its members' acknowledgements
until they hold nothing, then leaves; the new leader's question waits for that), and one whose state
partition moves away while this proxy goes on leading it is *re-homed* (its writes wait behind a gate
while its state is taken over from the partition's new owner into a partition kept here; its engine,
with what members hold, stays): :meth:`InstanceGroupMember._hand_over`, :meth:`InstanceGroupMember._rehome`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..protocol import messages
from ..protocol.codes import ApiKey
from .copy_exchange import CopyExchange
from .drain import until_released
from .errors import ErrorCode
from .handovers_elsewhere import HandoverWatch
from .ownership import GroupOwnership, Instance, OwnershipMap, plan_claims
from .state.errors import StateNotOwned
from .states import ShareSnapshot
from .store import SharePartitionKey
from .tasks import shared_task

if TYPE_CHECKING:
    from ..proxy.connection import ClientConnection
    from .coordinator import ShareGroup
    from .partition import SharePartition
    from .partition_state import SharePartitionState
    from .service import ShareGroupService

log = logging.getLogger("kshare.share")

# a share-partition whose state moves: its state, its write under way, the state partition's new owner
Rehome = tuple["SharePartitionState", "asyncio.Future | None", "Instance | None"]

EPOCH_WAIT_S = 10.0  # how long a proxy asked at a map epoch it has not applied yet waits for it
# how long a proxy asked for a copy it is still handing over waits before answering "not yet" (less
# than the asker's request timeout, kshare.share.peers.PEER_TIMEOUT_S)
HANDOVER_ANSWER_WAIT_S = 7.0
# how long a share-partition's acknowledgements may wait while its state moves to a state partition its
# leader keeps (the clients waiting for their answers poll nothing else meanwhile); then it is served
# again from its state instead (what members hold is delivered again)
REHOME_WAIT_S = 3.0
# how long a share-partition's first fetch under a new map waits for this proxy's claims of that map
CLAIMS_WAIT_S = 5.0


class InstanceGroupMember:
    """What a ShareGroupService does as one proxy of an instance group."""

    def is_me(self: ShareGroupService, instance: Instance) -> bool:
        return self.instances is not None and instance.id == self.instances.me.id

    def me(self: ShareGroupService) -> Instance:
        """This proxy as the others of its instance group reach it."""
        assert self.proxy is not None and self.instances is not None
        cfg = self.proxy.config
        base = 0 if cfg.broker_port_base == 0 else (cfg.bootstrap_port + 1 if cfg.broker_port_base is None
                                                      else cfg.broker_port_base)
        return Instance(self.instances.me.id, cfg.advertised, self.proxy.bootstrap_port or cfg.bootstrap_port,
                        dict(self.proxy.brokers.ports), self.instances.me.slot, base)

    async def _join_instances(self: ShareGroupService) -> None:
        """Join the instance group once the proxy's listeners are known; returns with the first
        ownership map applied (this proxy's partitions claimed and replayed)."""
        assert self.instances is not None and self.proxy is not None
        delay = 1.0
        while True:
            try:
                await self.proxy.wait_ready(timeout=60)
                self.instances.me = self.me()
                self.instances.report = self.report_held
                if getattr(self, "_initialise_plain", None) is None:  # once: engines from confirmed state
                    self._initialise_plain = self.partition_context.initialise
                    self.partition_context.initialise = self._initialise_confirmed
                await self.instances.start()
                return
            except Exception as exc:  # noqa: BLE001 - keep trying: the cluster may be starting
                self.load_error = f"joining instance group {self.instances.group_id}: {exc or type(exc).__name__}"
                log.warning("%s; retrying in %.0f s", self.load_error, delay)
                await self.instances.stop()
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10)

    async def apply_ownership(self: ShareGroupService, decision: OwnershipMap, gained: list[int], lost: list[int]) -> None:
        """A new ownership map: give up what moved away, then claim (fence and replay) what moved
        here. Clients are routed by the new map at once; this proxy serves a state partition only
        while its store has it claimed."""
        async with self._ownership_lock:
            await self._apply_ownership(decision)

    async def _apply_ownership(self: ShareGroupService, decision: OwnershipMap) -> None:
        ownership = self.ownership
        assert isinstance(ownership, GroupOwnership)
        previous = ownership.map
        plan = plan_claims(ownership.map, decision, ownership.me, ownership.claimed)
        if plan.again:
            log.warning("instance group: missed ownership epoch(s) %d..%d; claiming state partition(s) %s again, "
                        "since another proxy may have written them meanwhile", ownership.epoch + 1,
                        decision.epoch - 1, ",".join(map(str, plan.again)))
            await self._give_up(plan.again)
        if ownership.install(decision, self.handover_timeout_s()):
            self._handover_watch().kick()
        # Before anything is awaited: while these are claimed (replayed), a share-partition led here
        # may have its state in one of them, so none is initialised meanwhile (confirm_state waits)
        ownership.gaining = frozenset(plan.gained)
        try:
            ownership.partitions = len(decision.owners)
            memory = getattr(self.store, "memory", None)
            if memory is not None:  # where share-partitions new to the store go (set before claiming)
                memory.home = ownership.state_partition if decision.by_topic else None
            # before anything is awaited: no write of these goes to a state partition given up from now on
            rehome = {} if plan.again else self._gate_rehomes(previous, decision, plan.lost)
            if decision.by_topic or (previous is not None and previous.by_topic):
                # first: nothing is served from before this map that may have moved meanwhile
                await self._reconfirm(previous, decision)
            gained, lost = plan.gained, plan.lost
            self.store.leader_epoch = decision.epoch  # the ownership epoch is written with the state
            if lost:
                await self._give_up(lost)
            if gained:
                started = time.monotonic()
                ownership.gaining = frozenset(gained)  # what is served here already goes on meanwhile
                try:
                    # a fenced writer of a partition given back is replaced (the new one fences nobody but it)
                    await self.store.release([p for p in gained if p in self.store.claimed()])
                    await self.store.claim(gained)
                finally:
                    ownership.gaining = frozenset()
                # what was claimed now, with what stays: never what the store still holds fenced
                ownership.claimed = ownership.claimed | frozenset(gained)
                adopted = 0
                for record in self.store.groups().values():
                    if record.group_id not in self.coordinator.groups or not self.coordinator.groups[record.group_id].members:
                        self._adopt_group(record)
                        adopted += 1
                replayed = sum(1 for k in self.store.share_partitions() if self.store.partition_of(k) in set(gained))
                log.info("instance group: took over state partition(s) %s in %.2f s (%d share-partition(s), %d group(s))",
                         ",".join(map(str, gained)), time.monotonic() - started, replayed, adopted)
        finally:
            ownership.gaining = frozenset()  # (also when a step above failed)
        if self.proxy is not None:
            self.proxy.view = ownership.view()
        if rehome:
            task = asyncio.get_running_loop().create_task(self._rehome(rehome, decision.epoch))
            self._releases.add(task)
            task.add_done_callback(self._releases.discard)

    async def _reconfirm(self: ShareGroupService, previous: OwnershipMap | None, decision: OwnershipMap) -> None:
        """Leading by topic, a new map: what this proxy served under the map just before and still
        leads stays confirmed; every other share-partition leaves memory (its writes settle) and is
        confirmed again before it is served (another proxy may have led it meanwhile)."""
        ownership = self.ownership
        assert isinstance(ownership, GroupOwnership)
        follows = previous is not None and previous.by_topic and decision.epoch == previous.epoch + 1
        before = next((i for i, inst in enumerate(previous.instances) if inst.id == ownership.me), -1) \
            if previous is not None else -1
        kept = {}
        if follows and decision.by_topic:
            assert previous is not None
            for key, epoch in ownership.confirmed.items():
                if epoch == previous.epoch and previous.leader_index(key.topic_id, key.partition) == before >= 0 \
                        and ownership.leads(key.topic_id, key.partition):
                    kept[key] = decision.epoch
        # What this proxy served under the map just before (or was handing over) and another proxy
        # leads now is handed over: no more records go out, the members' acknowledgements of what
        # they hold still arrive and are written, then it leaves memory and the new leader, whose
        # confirmation waits for that, takes the state over (docs/design/scale-out.md, "Hand-over").
        # Only where this proxy keeps the state partition: one that moves is claimed by its new owner
        # at once, which fences every write of it from here.
        moving = set()
        if decision.by_topic and self.handover_timeout_s() > 0:
            served = {key for key, epoch in ownership.confirmed.items() if follows and epoch == previous.epoch} \
                | ownership.releasing
            keeps = ownership.claimed & set(decision.partitions_of(ownership.me))
            for key in served:
                sp = self.partitions.get(key)
                if key not in kept and sp is not None and sp.ready and not ownership.leads(key.topic_id, key.partition) \
                        and self.store.partition_of(key) in keeps:
                    moving.add(key)
        ownership.stop_releasing([k for k in ownership.releasing if k not in moving])
        ownership.confirmed = kept
        states = [sp for key, sp in self.partitions.items() if key not in kept and key not in moving]
        if moving:
            self._hand_over(moving, decision.epoch)
        if self.proxy is not None:
            # Clients are routed by the new map from now on (naming this proxy for what it hands
            # over), not once the claims below are done: until every proxy shows one map, a client
            # told one leader by one proxy and another by the next drops its acknowledgements of
            # what it holds ("leader changed since records were acquired").
            self.proxy.view = ownership.view()
        await self._take_out_of_service(states)
        if states or moving:
            log.info("instance group: ownership epoch %d: %d share-partition(s) to confirm again before serving, "
                     "%d handed over to their new leaders", decision.epoch, len(states), len(moving))

    # -- handing share-partitions over without redelivering what members hold ----------------------

    def handover_timeout_s(self: ShareGroupService) -> float:
        """How long a hand-over waits for the members' acknowledgements (``--drain-timeout``)."""
        cfg = getattr(self.proxy, "config", None)
        return float(getattr(cfg, "drain_timeout_s", 10.0))

    def _hand_over(self: ShareGroupService, keys: set[SharePartitionKey], epoch: int) -> None:
        ownership = self.ownership
        assert isinstance(ownership, GroupOwnership)
        ownership.start_releasing(keys)
        for key in keys:
            engine = self.partitions[key].engine
            if engine is not None:
                engine.paused = True
        task = asyncio.get_running_loop().create_task(self._handing_over(keys, epoch))
        handovers = self._handovers()
        for key in keys:
            handovers[key] = task
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    def _handovers(self: ShareGroupService) -> dict[SharePartitionKey, asyncio.Task]:
        """share-partition -> the hand-over task it is part of (while it runs)."""
        handovers = getattr(self, "_handover_tasks", None)
        if handovers is None:
            handovers = self._handover_tasks = {}
        return handovers

    def _held(self: ShareGroupService, keys: set[SharePartitionKey]) -> int:
        held = 0
        for key in keys:
            sp = self.partitions.get(key)
            engine = sp.engine if sp is not None else None
            if engine is not None and key in self.ownership.releasing:
                held += engine.acquired_count()
        return held

    async def _handing_over(self: ShareGroupService, keys: set[SharePartitionKey], epoch: int) -> None:
        """Wait (up to the hand-over timeout) until the members hold nothing of ``keys``, then take
        them out of service (their queued writes land first): the new leader's confirmation reads
        the copy from then on."""
        ownership = self.ownership
        assert isinstance(ownership, GroupOwnership)
        started = time.monotonic()
        first = held = self._held(keys)
        try:
            held = await until_released(lambda: self._held(keys), started + self.handover_timeout_s())
        finally:
            handovers = self._handovers()
            task = asyncio.current_task()
            mine = [k for k in keys if handovers.get(k) is task]
            for key in mine:
                del handovers[key]
            # a newer map may have taken some over already (handing them over again, or leading
            # them here again): only what is still this hand-over's goes
            still = [k for k in mine if k in ownership.releasing]
            ownership.stop_releasing(still)
            await self._take_out_of_service([self.partitions[k] for k in still if k in self.partitions])
        if still:
            log.log(logging.WARNING if held else logging.INFO,
                    "instance group: handed %d share-partition(s) over (ownership epoch %d) in %.2f s; %d record(s) "
                    "were held by members, %d still held at the end are delivered again (--drain-timeout %.0f s)",
                    len(still), epoch, time.monotonic() - started, first, held, self.handover_timeout_s())

    # -- keeping a share-partition whose state partition moves away ---------------------------------

    def _rehoming(self: ShareGroupService) -> dict[SharePartitionKey, asyncio.Future]:
        """share-partition -> the gate holding its writes while its state moves (while it does)."""
        gates = getattr(self, "_rehome_gates", None)
        if gates is None:
            gates = self._rehome_gates = {}
        return gates

    def _gate_rehomes(self: ShareGroupService, previous: OwnershipMap | None, decision: OwnershipMap,
                      lost: Sequence[int]) -> dict[SharePartitionKey, Rehome]:
        """Leading by topic, a state partition moving to another proxy takes the state of share-partitions
        this proxy goes on leading with it; its new owner fences this proxy's writes there as soon as it
        claims it. So their writes wait behind a gate from now on (their engines keep serving: what members
        hold stays theirs), and :meth:`_rehome` takes the state over into a partition this proxy keeps, as
        a new leader would, before it opens the gate. Returns each one's state, its write under way and the
        state partition's new owner."""
        if not lost or previous is None or not previous.by_topic or not decision.by_topic \
                or decision.epoch != previous.epoch + 1 or self.handover_timeout_s() <= 0:
            return {}
        ownership = self.ownership
        assert isinstance(ownership, GroupOwnership)
        me_before = next((i for i, inst in enumerate(previous.instances) if inst.id == ownership.me), -1)
        gone, gates = set(lost), self._rehoming()
        out = {}
        loop = asyncio.get_running_loop()
        for key, sp in self.partitions.items():
            if sp.ready and ownership.confirmed.get(key) == previous.epoch and key not in ownership.releasing \
                    and previous.leader_index(key.topic_id, key.partition) == me_before >= 0 \
                    and ownership.leads(key.topic_id, key.partition) and self.store.partition_of(key) in gone:
                under_way = sp.writes.writing_done
                gate = gates[key] = loop.create_future()
                sp.writes.gate(gate)
                out[key] = (sp, under_way if under_way is not None and not under_way.done() else None,
                            decision.owner(self.store.partition_of(key)))
        return out

    async def _rehome(self: ShareGroupService, items: dict[SharePartitionKey, Rehome], epoch: int) -> None:
        started = time.monotonic()
        done = await asyncio.gather(*(self._rehome_one(key, sp, under_way, holder, epoch)
                                      for key, (sp, under_way, holder) in items.items()))
        kept = sum(done)
        log.log(logging.INFO if kept == len(done) else logging.WARNING,
                "instance group: ownership epoch %d: the state of %d share-partition(s) led here moved to a state "
                "partition kept here in %.2f s, their members keeping what they hold%s", epoch, kept,
                time.monotonic() - started, f"; {len(done) - kept} could not and start again from their state"
                if kept < len(done) else "")

    async def _rehome_one(self: ShareGroupService, key: SharePartitionKey, sp: SharePartitionState,
                          under_way: asyncio.Future | None, holder: Instance | None, epoch: int) -> bool:
        """Let the write under way land (or fail: the engine is rebuilt then), take the state over from
        ``holder``, the new owner of the state partition it was in (this proxy led it and wrote it there
        until now: no other copy is newer), into a partition kept here, then open the gate: the writes
        queued meanwhile follow it. Bounded by REHOME_WAIT_S: acknowledgements wait behind the gate,
        and a client waiting for the answer to one polls nothing else meanwhile."""
        gate = self._rehoming().get(key)
        engine = sp.engine
        ownership = self.ownership
        ok = False

        def current() -> bool:
            return sp.ready and sp.engine is engine and self.partitions.get(key) is sp and ownership.epoch == epoch

        try:
            if under_way is not None:
                with contextlib.suppress(Exception):  # a failed write breaks the engine: seen below
                    await asyncio.shield(under_way)
            deadline = time.monotonic() + min(self.handover_timeout_s(), REHOME_WAIT_S)
            while holder is not None and current() and time.monotonic() < deadline:
                try:
                    code, copy = await asyncio.wait_for(self._ask_copy(holder, key, epoch),
                                                        max(0.1, deadline - time.monotonic()))
                except Exception:  # noqa: BLE001 - not answering (yet): asked again until the deadline
                    await asyncio.sleep(0.1)
                    continue
                if code == ErrorCode.REBALANCE_IN_PROGRESS:
                    break  # a newer map: it is confirmed as any other share-partition
                if code:
                    await asyncio.sleep(0.1)
                    continue
                if copy is None or not current() or self.store.state_epoch(key) is not None:
                    break
                try:
                    await self.store.adopt(key, copy[1], copy[0] + 1)
                except Exception as exc:  # noqa: BLE001 - served again from its state
                    log.info("instance group: moving the state of %s failed: %r", key, exc)
                    break
                assert isinstance(ownership, GroupOwnership)
                ownership.confirmed[key] = epoch
                getattr(self.store, "frozen", set()).discard(key)
                task = asyncio.get_running_loop().create_task(self._drop_copies_at([holder], key, epoch, copy[0] + 1))
                self._releases.add(task)
                task.add_done_callback(self._releases.discard)
                ok = current()
                break
        finally:
            self._rehoming().pop(key, None)
            if gate is not None and not gate.done():
                if ok:
                    gate.set_result(None)
                else:
                    gate.set_exception(StateNotOwned(f"the state of {key} could not be moved"))
                    gate.exception()
        if not ok and self.partitions.get(key) is sp:
            await self._take_out_of_service([sp])  # served again from its state, confirmed as any other
        return ok

    async def _handed_over(self: ShareGroupService, keys: Sequence[SharePartitionKey], timeout: float) -> bool:
        """Wait (bounded) for the hand-overs of ``keys`` under way here; whether none is left."""
        handovers = self._handovers()
        waiting = {handovers[k] for k in keys if k in handovers}
        if waiting:
            await asyncio.wait(waiting, timeout=timeout)
        return not any(k in handovers for k in keys)

    # -- leading by topic: the state follows its leader ------------------------------------------

    def report_held(self: ShareGroupService) -> dict[str, Any]:
        """What this proxy tells the instance group at join (``Candidate``'s fields): the
        topic-partitions whose state its claimed state partitions hold, the partition counts of the
        topics share groups read, and the partitions it names itself the leader of (led, handing)."""
        claimed = set(getattr(self.store, "claimed", list)())
        held: dict[bytes, set[int]] = {}
        for key in self.store.share_partitions():
            if self.store.partition_of(key) in claimed:
                held.setdefault(key.topic_id, set()).add(key.partition)
        topic_ids = set(held)
        for group in self.coordinator.groups.values():
            topic_ids.update(group.topic_partitions)
        counts = {}
        for tid in topic_ids:
            info = self.upstream.by_id.get(tid)
            if info is not None:
                counts[tid.hex()] = info.partitions
        led, handing = self.ownership.naming(counts) if isinstance(self.ownership, GroupOwnership) else ({}, {})
        return {"held": {tid.hex(): sorted(ps) for tid, ps in held.items()}, "topics": counts,
                "led": led, "handing": handing}

    async def _initialise_confirmed(self: ShareGroupService, sp: SharePartitionState
                                    ) -> tuple[int, SharePartition | None]:
        """The share-partition's engine from durable state, once that state is confirmed here."""
        code = await self.confirm_state(sp.key)
        if code:
            return code, None
        return await self._initialise_plain(sp)

    async def confirm_state(self: ShareGroupService, key: SharePartitionKey) -> int:
        """Leading by topic: make sure this proxy holds the newest copy of the share-partition's
        state before it serves it (a no-op otherwise, or when confirmed at this epoch already)."""
        ownership = self.ownership
        if not isinstance(ownership, GroupOwnership) or not ownership.by_topic or self.peers is None:
            return ErrorCode.NONE
        decision = ownership.map
        assert decision is not None
        epoch = decision.epoch
        if ownership.confirmed.get(key) == epoch:
            return ErrorCode.NONE
        if not ownership.owns(key):
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        if not await self._claims_settled(decision):
            # The state partitions this map gives this proxy are still being claimed: the copy of
            # this share-partition may be in one of them, not replayed yet. Initialising it now
            # (no copy anywhere) would start it over from its start offset: what was
            # acknowledged would be delivered again.
            self._put_off(key, epoch, "claims", "this proxy's claims of its state partitions are not settled")
            return ErrorCode.COORDINATOR_NOT_AVAILABLE  # retriable: the fetch tries again
        others = [i for i in decision.instances if i.id != ownership.me]
        answers = await asyncio.gather(*(self._ask_copy(peer, key, epoch) for peer in others),
                                       return_exceptions=True)
        copies: list[tuple[int, ShareSnapshot, Instance]] = []
        for peer, answer in zip(others, answers, strict=True):
            if isinstance(answer, BaseException) or answer[0]:
                log.debug("instance group: %s:%d did not answer for %s at epoch %d (%r); asked again at the "
                          "next fetch", peer.host, peer.port, key, epoch, answer)
                self._put_off(key, epoch, "peer", f"{peer.host}:{peer.port} did not answer for its copy ({answer!r})")
                return ErrorCode.COORDINATOR_NOT_AVAILABLE  # retriable: the fetch tries again
            if answer[1] is not None:
                copies.append((*answer[1], peer))
        if ownership.map is not decision or not ownership.owns(key):
            return ErrorCode.NOT_LEADER_OR_FOLLOWER  # the map changed meanwhile
        mine = self.store.state_epoch(key)  # None: no copy here
        newest = max(copies, key=lambda c: c[0], default=None)
        if newest is not None and (mine is None or newest[0] > mine):
            await self.store.adopt(key, newest[1], newest[0] + 1)
            log.info("instance group: took over the state of %s from %s:%d (state epoch %d)", key,
                     newest[2].host, newest[2].port, newest[0])
        ownership.confirmed[key] = epoch
        getattr(self.store, "frozen", set()).discard(key)  # handed over before, led here again
        held = self.store.state_epoch(key)
        if copies and held is not None:
            task = asyncio.get_running_loop().create_task(self._drop_copies_at(
                [peer for _, _, peer in copies], key, epoch, held))
            self._releases.add(task)
            task.add_done_callback(self._releases.discard)
        return ErrorCode.NONE

    async def _claims_settled(self: ShareGroupService, decision: OwnershipMap) -> bool:
        """Wait (bounded) until the claims of ``decision`` here are done; whether they are (and the
        map is still ``decision``)."""
        ownership = self.ownership
        assert isinstance(ownership, GroupOwnership)
        deadline = time.monotonic() + CLAIMS_WAIT_S
        while ownership.gaining and ownership.map is decision and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return not ownership.gaining and ownership.map is decision

    def _exchange(self: ShareGroupService) -> CopyExchange:
        """The exchange's requests to the other proxies: the questions for one peer, group and map
        epoch made together go out as one request (kshare.share.copy_exchange)."""
        exchange = getattr(self, "copy_exchange", None)
        if exchange is None:
            assert self.peers is not None
            exchange = self.copy_exchange = CopyExchange(self.peers.request)
        return exchange

    def _handover_watch(self: ShareGroupService) -> HandoverWatch:
        """Asks the proxies named for what they hand over whether they are done
        (kshare.share.handovers_elsewhere)."""
        watch = getattr(self, "handover_watch", None)
        if watch is None:
            ownership = self.ownership
            assert isinstance(ownership, GroupOwnership) and self.peers is not None
            upstream = self.upstream

            def topic_name(topic_id: bytes) -> str | None:
                info = upstream.by_id.get(topic_id)  # (replaced on every refresh)
                return info.name if info is not None else None

            watch = self.handover_watch = HandoverWatch(ownership.elsewhere, self.peers.request, topic_name)
        return watch

    def _put_off(self: ShareGroupService, key: SharePartitionKey, epoch: int, reason: str, why: str) -> None:
        """Count a confirmation put off (``reason``: claims, peer) and say once per share-partition and
        ownership epoch that it is not served yet, and why: its fetches leave it out meanwhile, without
        a partition error (clients know none for a wait)."""
        self.confirmations_put_off[reason] += 1
        said = self.unconfirmed_said
        if (key, epoch) in said:
            return
        if len(said) > 10_000:
            said.clear()
        said.add((key, epoch))
        info = self.upstream.by_id.get(key.topic_id)
        log.info("instance group: share-partition %s %s-%d not served yet at ownership epoch %d: %s; its fetches "
                 "try again", key.group_id, info.name if info is not None else key.topic_id.hex(), key.partition,
                 epoch, why)

    async def _ask_copy(self: ShareGroupService, peer: Instance, key: SharePartitionKey, epoch: int
                        ) -> tuple[int, tuple[int, ShareSnapshot] | None]:
        """(error code, (state epoch, state) of the copy ``peer`` holds, or None)."""
        return await self._exchange().ask(peer, key, epoch)

    async def _drop_copies_at(self: ShareGroupService, peers: list[Instance], key: SharePartitionKey, epoch: int,
                              state_epoch: int) -> None:
        answers = await asyncio.gather(*(self._exchange().drop(peer, key, epoch, state_epoch) for peer in peers),
                                       return_exceptions=True)
        for peer, answer in zip(peers, answers, strict=True):
            if isinstance(answer, Exception):  # the copy is older: the next confirmation drops it
                log.debug("instance group: telling %s:%d to drop its copy of %s failed: %r", peer.host, peer.port,
                          key, answer)

    async def _at_epoch(self: ShareGroupService, epoch: int) -> int:
        """Wait (bounded) until this proxy has applied map ``epoch``: NONE at it, else why not."""
        ownership = self.ownership
        if not isinstance(ownership, GroupOwnership):
            return ErrorCode.NOT_COORDINATOR
        deadline = time.monotonic() + EPOCH_WAIT_S
        while ownership.epoch < epoch and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if ownership.epoch > epoch:
            return ErrorCode.REBALANCE_IN_PROGRESS  # the asker starts over with its newer map
        if ownership.epoch < epoch:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        return ErrorCode.NONE

    async def answer_copies(self: ShareGroupService, conn: ClientConnection, req: Any) -> Any:
        """ReadShareGroupState with a leader epoch, from the leader of a map epoch: the copies of the
        state this proxy holds, answered at that epoch once its state partitions are claimed, and
        no longer served here (state epoch -1: none here)."""
        from .authorization import Operation
        from .handlers.common import group_refusal, topic_refusals

        R = messages.message_class("ReadShareGroupStateResponse")
        epoch = max((p.leader_epoch for t in req.topics for p in t.partitions), default=0)
        refused = await group_refusal(self, conn, Operation.DESCRIBE, req.group_id)
        topics_refused = {} if refused else await topic_refusals(self, conn, Operation.DESCRIBE,
                                                                 [t.topic_id for t in req.topics])
        code = refused or await self._at_epoch(epoch)
        keys = [SharePartitionKey(req.group_id, t.topic_id, p.partition) for t in req.topics for p in t.partitions]
        handovers = self._handovers()
        busy = set() if code else {k for k in keys if k in handovers}
        # What this proxy is handing over is answered once its members' acknowledgements are in
        # (bounded: the asker's request must not time out; its client asks again). Asked with
        # others, it is answered "not yet" at once, not to hold them back: the asker asks it again
        # with only what is being handed over (kshare.share.copy_exchange).
        if busy and busy == set(keys):
            await self._handed_over(keys, HANDOVER_ANSWER_WAIT_S)
            busy = {k for k in keys if k in handovers}
        results = []
        async with self._ownership_lock:  # the map's claims applied
            ownership = self.ownership
            if not code and ownership.epoch != epoch:
                code = ErrorCode.REBALANCE_IN_PROGRESS
            copies = await self._copies_of(R, [] if code else [
                k for k in keys if k not in busy and not topics_refused.get(k.topic_id, 0)])
            for t in req.topics:
                parts = []
                for p in t.partitions:
                    copy = copies.get(SharePartitionKey(req.group_id, t.topic_id, p.partition))
                    err = code or topics_refused.get(t.topic_id, 0) or ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
                    parts.append(copy if copy is not None else R.PartitionResult(
                        partition=p.partition, error_code=err, state_epoch=-1, start_offset=-1))
                results.append(R.ReadStateResult(topic_id=t.topic_id, partitions=parts))
        return R(results=results)

    async def _copies_of(self: ShareGroupService, R: Any, keys: list[SharePartitionKey]) -> dict[SharePartitionKey, Any]:
        ownership = self.ownership
        assert isinstance(ownership, GroupOwnership)
        out, held, settling = {}, [], []
        for key in dict.fromkeys(keys):
            if ownership.leads(key.topic_id, key.partition):
                # the asker and this proxy cannot both lead it at one epoch
                out[key] = R.PartitionResult(partition=key.partition, state_epoch=-1, start_offset=-1)
                continue
            # From now on nothing more of it is written here (a request that passed the ownership check
            # before this map may still be acknowledging: it fails), and what was written is settled
            # before the copy is read: whatever this proxy acknowledged is in the copy it hands over.
            getattr(self.store, "frozen", set()).add(key)
            held.append(key)
            sp = self.partitions.pop(key, None)
            if sp is not None:  # served here before this map: its writes settle first
                settling.append(sp)
        # all at once: a request of many share-partitions settles them within one bound and one
        # flush (one at a time, their waits and produce rounds added up against the asker's timeout)
        pending = [sp.pending_done for sp in settling if sp.pending_done is not None and not sp.pending_done.done()]
        if pending:
            await asyncio.wait(pending, timeout=10)
        for sp in settling:
            sp.engine = None
            sp.wake()
        if held:
            await self.store.flush()
        for key in held:
            snapshot = self.store.share_partition(key)
            if snapshot is None or self.store.partition_of(key) not in ownership.claimed:
                out[key] = R.PartitionResult(partition=key.partition, state_epoch=-1, start_offset=-1)
                continue
            out[key] = R.PartitionResult(
                partition=key.partition, state_epoch=self.store.state_epoch(key) or 0,
                start_offset=snapshot.start_offset,
                state_batches=[R.StateBatch(first_offset=b.first_offset, last_offset=b.last_offset,
                                            delivery_state=b.delivery_state, delivery_count=b.delivery_count)
                               for b in snapshot.state_batches])
        return out

    async def drop_copies(self: ShareGroupService, conn: ClientConnection, req: Any) -> Any:
        """WriteShareGroupState with a leader epoch and no start offset, from the leader of a map
        epoch: it holds the state at that state epoch now; copies held here that are older go."""
        from .authorization import Operation
        from .handlers.common import group_refusal, topic_refusals

        R = messages.message_class("WriteShareGroupStateResponse")
        ownership = self.ownership
        refused = await group_refusal(self, conn, Operation.READ, req.group_id)
        topics_refused = {} if refused else await topic_refusals(self, conn, Operation.READ,
                                                                 [t.topic_id for t in req.topics])
        doomed, results = [], []
        for t in req.topics:
            parts = []
            for p in t.partitions:
                key = SharePartitionKey(req.group_id, t.topic_id, p.partition)
                err = refused or topics_refused.get(t.topic_id, 0)
                if not err and isinstance(ownership, GroupOwnership) and not ownership.leads(t.topic_id, p.partition) \
                        and key not in self.partitions:
                    held = self.store.state_epoch(key)
                    if held is not None and held < p.state_epoch:
                        doomed.append(key)
                parts.append(R.PartitionResult(partition=p.partition, error_code=err))
            results.append(R.WriteStateResult(topic_id=t.topic_id, partitions=parts))
        if doomed:
            try:
                await self.store.delete_share_partitions(doomed)
            except Exception as exc:  # noqa: BLE001 - still older: the next confirmation drops it
                log.debug("instance group: dropping copies %s failed: %r", doomed, exc)
        return R(results=results)

    async def _give_up(self: ShareGroupService, partitions: Sequence[int]) -> None:
        """Stop serving these state partitions: their writes in flight finish, their share-partitions
        leave memory (waiting fetches return; what was acquired comes back from the new owner), and
        their groups' members go (they find the new coordinator)."""
        ownership = self.ownership
        assert isinstance(ownership, GroupOwnership)
        gone = set(partitions)
        ownership.claimed = frozenset(p for p in ownership.claimed if p not in gone)
        # a hand-over of state written there ends now: its writes would be fenced by the new owner
        ownership.stop_releasing([k for k in ownership.releasing if self.store.partition_of(k) in gone])
        rehoming = self._rehoming()
        states = [sp for key, sp in self.partitions.items()
                  if self.store.partition_of(key) in gone and key not in rehoming]
        # leading by topic: a share-partition whose state goes with these is confirmed again (from
        # the partition's next owner) before it is served here again (one still led here keeps its
        # engine meanwhile: _rehome)
        for key in [k for k in ownership.confirmed if self.store.partition_of(k) in gone]:
            del ownership.confirmed[key]
        await self._take_out_of_service(states)
        for group in self.coordinator.groups.values():
            if not ownership.owns_group(group.group_id) and group.members:
                group.members.clear()
                group.target.clear()
        await self.store.release(list(gone))
        log.info("instance group: gave up state partition(s) %s (%d share-partition(s))",
                 ",".join(map(str, sorted(gone))), len(states))

    async def _take_out_of_service(self: ShareGroupService, states: list[SharePartitionState]) -> None:
        """Stop serving these share-partitions here: their queued writes land first (up to 10 s),
        then their engines go and their waiting fetches are woken (they answer without them)."""
        gates = self._rehoming()
        for sp in states:  # writes held while its state moved: they fail (its engine is rebuilt)
            gate = gates.pop(sp.key, None)
            if gate is not None and not gate.done():
                gate.set_exception(StateNotOwned(f"{sp.key} left this proxy while its state moved"))
                gate.exception()
        pending = [sp.pending_done for sp in states if sp.pending_done is not None and not sp.pending_done.done()]
        if pending:
            await asyncio.wait(pending, timeout=10)
        for sp in states:
            self.partitions.pop(sp.key, None)
            sp.engine = None
            sp.wake()

    def fenced(self: ShareGroupService, partition: int) -> None:
        """Another proxy took this state partition over (this one was paused or cut off): stop
        serving it at once; the group protocol tells this proxy the new map when it rejoins."""
        ownership = self.ownership
        if not isinstance(ownership, GroupOwnership) or partition not in ownership.claimed:
            return
        log.warning("instance group: state partition %d was taken over by another proxy (this one was fenced); "
                    "no longer serving it", partition)
        ownership.claimed = ownership.claimed - {partition}  # served no more from now on
        if self.instances is not None:  # not ours at the next join either
            self.instances.owned = [p for p in self.instances.owned if p != partition]
        task = asyncio.get_running_loop().create_task(self._drop_fenced(partition))
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def _drop_fenced(self: ShareGroupService, partition: int) -> None:
        async with self._ownership_lock:
            ownership = self.ownership
            assert isinstance(ownership, GroupOwnership)
            # unless claimed again meanwhile (a new writer, which nobody fenced)
            if partition not in ownership.claimed and partition in self.store.fenced_partitions():
                await self._give_up([partition])

    async def group_configs_from_owner(self: ShareGroupService, group: ShareGroup, max_age: float = 5.0) -> bool:
        """A share-partition leader that does not coordinate the group asks the group's coordinator
        for its configs (at most every ``max_age`` seconds); they apply to the live engines.
        Whether the group's configs are known (they may be older than ``max_age`` if asking failed)."""
        if self.owns_group(group.group_id) or self.peers is None:
            return True
        asking = self._asking_configs.get(group.group_id)
        if asking is not None:  # asked already: everyone waits for that answer
            await asyncio.shield(asking)
            return group.group_id in self._remote_configs
        if time.monotonic() - self._remote_configs.get(group.group_id, -1e9) < max_age:
            return True
        task = shared_task(self._ask_group_configs(group))
        self._asking_configs[group.group_id] = task
        await asyncio.shield(task)
        return group.group_id in self._remote_configs

    async def _ask_group_configs(self: ShareGroupService, group: ShareGroup) -> None:
        try:
            await self._ask_group_configs_once(group)
        finally:
            self._asking_configs.pop(group.group_id, None)

    async def _ask_group_configs_once(self: ShareGroupService, group: ShareGroup) -> None:
        assert self.peers is not None
        now = time.monotonic()
        owner = self.ownership.owner_of_group(group.group_id)
        if owner is None or self.is_me(owner):  # this proxy, still claiming it: not known yet
            return
        req = messages.message_class("DescribeConfigsRequest")
        body = req(resources=[req.DescribeConfigsResource(resource_type=32, resource_name=group.group_id,
                                                          configuration_keys=None)])
        try:
            resp = await self.peers.request(owner, ApiKey.DESCRIBE_CONFIGS, body)
        except Exception as exc:  # noqa: BLE001 - keep the configs known; ask again later
            log.debug("asking %s:%d for the configs of group %s failed: %r", owner.host, owner.port,
                      group.group_id, exc)
            return
        for result in resp.results:
            if result.error_code == 0 and result.resource_name == group.group_id:
                self._remote_configs[group.group_id] = now
                overrides = {c.name: c.value for c in result.configs if c.config_source == 8 and c.value is not None}
                if overrides != group.config.overrides:
                    group.config.overrides = overrides
                    self.apply_config(group)

    async def _refresh_remote_configs(self: ShareGroupService) -> None:
        """Keep the configs of groups coordinated elsewhere current while this proxy serves them."""
        while True:
            await asyncio.sleep(2.0)
            groups = {key.group_id for key in self.partitions}
            for group_id in groups:
                group = self.coordinator.group(group_id)
                if group is not None and not self.owns_group(group_id):
                    await self.group_configs_from_owner(group)
