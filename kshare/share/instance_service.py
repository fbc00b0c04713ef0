"""The service's side of an instance group (several proxies as one service; docs/design/scale-out.md).

Mixed into :class:`kshare.share.service.ShareGroupService`: joining the group, applying each new
ownership map (give up what moved away, claim, i.e. fence and replay, what moved here), stopping
at once when another proxy fenced this one, and the configs of groups coordinated elsewhere.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..protocol import messages
from ..protocol.codes import ApiKey
from .ownership import GroupOwnership, Instance, OwnershipMap, plan_claims
from .tasks import shared_task

if TYPE_CHECKING:
    from .coordinator import ShareGroup
    from .service import ShareGroupService

log = logging.getLogger("kshare.share")


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
        plan = plan_claims(ownership.map, decision, ownership.me, ownership.claimed)
        if plan.again:
            log.warning("instance group: missed ownership epoch(s) %d..%d; claiming state partition(s) %s again, "
                        "since another proxy may have written them meanwhile", ownership.epoch + 1,
                        decision.epoch - 1, ",".join(map(str, plan.again)))
            await self._give_up(plan.again)
        ownership.map = decision
        ownership.partitions = len(decision.owners)
        gained, lost = plan.gained, plan.lost
        self.store.leader_epoch = decision.epoch  # the ownership epoch is written with the state
        if lost:
            await self._give_up(lost)
        if gained:
            started = time.monotonic()
            # a fenced writer of a partition given back is replaced (the new one fences nobody but it)
            await self.store.release([p for p in gained if p in self.store.claimed()])
            await self.store.claim(gained)
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
        if self.proxy is not None:
            self.proxy.view = ownership.view()

    async def _give_up(self: ShareGroupService, partitions: Sequence[int]) -> None:
        """Stop serving these state partitions: their writes in flight finish, their share-partitions
        leave memory (waiting fetches return; what was acquired comes back from the new owner), and
        their groups' members go (they find the new coordinator)."""
        ownership = self.ownership
        assert isinstance(ownership, GroupOwnership)
        gone = set(partitions)
        ownership.claimed = frozenset(p for p in ownership.claimed if p not in gone)
        states = [sp for key, sp in self.partitions.items() if self.store.partition_of(key) in gone]
        pending = [sp.pending_done for sp in states if sp.pending_done is not None and not sp.pending_done.done()]
        if pending:
            await asyncio.wait(pending, timeout=10)
        for sp in states:
            self.partitions.pop(sp.key, None)
            sp.engine = None
            sp.wake()
        for group in self.coordinator.groups.values():
            if not ownership.owns_group(group.group_id) and group.members:
                group.members.clear()
                group.target.clear()
        await self.store.release(list(gone))
        log.info("instance group: gave up state partition(s) %s (%d share-partition(s))",
                 ",".join(map(str, sorted(gone))), len(states))

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
