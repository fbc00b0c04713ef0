"""Who owns a share-partition, and which proxy of an instance group serves what.

One proxy owns everything (``LocalOwnership``). Several proxies started with the same instance
group split the state topic's partitions between them through a consumer group on the fronted
cluster (``kshare.share.instance_group`` is the shell; this module is its sans-I/O core):

* the unit of ownership is a **state-topic partition**. A data topic-partition belongs to the state
  partition :func:`state_partition_of` maps it to, so every share group's state of one
  topic-partition is in one state partition, and the proxy owning that state partition is the
  topic-partition's leader in the metadata clients see (the share-partition leader of KIP-932);
* a share group's coordination (heartbeats, assignment, admin) belongs to the owner of the state
  partition holding its group record (``partition_for_group``);
* the group's leader computes an :class:`OwnershipMap` (:func:`assign`: balanced, sticky, each
  proxy keeping a stable ``slot``) and ships the whole map to every member inside their
  assignments, so each proxy can route clients to the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import msgspec

from ..proxy.virtual import MAX_SLOTS, ClusterView, Peer
from .state.codec import partition_for_group, state_partition_of
from .store import SharePartitionKey


class Ownership(Protocol):
    def owns(self, key: SharePartitionKey) -> bool:
        """True if this proxy serves (and writes the durable state of) ``key``."""

    @property
    def epoch(self) -> int:
        """The ownership epoch written as the leader epoch of state records."""

    def owns_partition(self, topic_id: bytes, partition: int) -> bool:
        """True if this proxy is the share-partition leader of the topic-partition."""

    def owns_group(self, group_id: str) -> bool:
        """True if this proxy coordinates the share group."""

    def owner_of_group(self, group_id: str) -> Instance | None:
        """The proxy coordinating the group (None: unknown, or this proxy alone)."""

    def owner_of_partition(self, topic_id: bytes, partition: int) -> Instance | None:
        """The proxy leading the topic-partition's share-partitions (None: unknown, or this proxy alone)."""


class LocalOwnership:
    """This process owns every share-partition."""

    epoch = 0
    map = None

    def owns(self, key: SharePartitionKey) -> bool:
        return True

    def owns_partition(self, topic_id: bytes, partition: int) -> bool:
        return True

    def owns_group(self, group_id: str) -> bool:
        return True

    def owner_of_group(self, group_id: str) -> Instance | None:
        return None

    def owner_of_partition(self, topic_id: bytes, partition: int) -> Instance | None:
        return None


class Instance(msgspec.Struct, frozen=True):
    """One proxy of an instance group, as the others need to know it."""

    id: str  # made by the proxy at start, unique per process
    host: str  # advertised host
    port: int  # bootstrap listener
    broker_ports: dict[int, int] = {}  # upstream broker id -> this proxy's listener port
    slot: int = -1
    broker_port_base: int = 0  # > 0: brokers that appear later are served on base + broker id


class OwnershipMap(msgspec.Struct, frozen=True):
    """The leader's decision: each state partition's owner, as an index into ``instances``."""

    epoch: int
    instances: list[Instance]
    owners: list[int]  # state partition -> index into instances, -1 if nobody

    def owner(self, state_partition: int) -> Instance | None:
        i = self.owners[state_partition] if 0 <= state_partition < len(self.owners) else -1
        return self.instances[i] if i >= 0 else None

    def partitions_of(self, instance_id: str) -> list[int]:
        return [p for p, i in enumerate(self.owners) if i >= 0 and self.instances[i].id == instance_id]

    def instance(self, instance_id: str) -> Instance | None:
        return next((i for i in self.instances if i.id == instance_id), None)

    def owner_of_topic_partition(self, topic_id: bytes, partition: int) -> Instance | None:
        return self.owner(state_partition_of(topic_id, partition, len(self.owners)))

    def owner_of_group(self, group_id: str) -> Instance | None:
        return self.owner(partition_for_group(group_id, len(self.owners)))

    def encode(self) -> bytes:
        return msgspec.json.encode(self)

    @staticmethod
    def decode(data: bytes) -> OwnershipMap:
        return msgspec.json.decode(data, type=OwnershipMap)


class Candidate(msgspec.Struct, frozen=True):
    """What a proxy tells the group when it joins: who it is and what it had."""

    instance: Instance
    owned: list[int] = []  # state partitions it owned in the last map it knew
    epoch: int = 0  # that map's epoch

    def encode(self) -> bytes:
        return msgspec.json.encode(self)

    @staticmethod
    def decode(data: bytes) -> Candidate:
        return msgspec.json.decode(data, type=Candidate)


@dataclass
class _Quota:
    member_id: str
    want: int
    have: list[int] = field(default_factory=list)


def assign(candidates: dict[str, Candidate], partitions: int) -> OwnershipMap:
    """Balanced and sticky: every proxy owns ``partitions // n`` or one more state partitions;
    a partition stays with its previous owner while that owner is under its quota (so a proxy
    joining or leaving moves only the partitions it must); slots stay as they were unless two
    proxies claim the same one. ``candidates`` are keyed by group member id (it orders ties)."""
    members = sorted(candidates)  # deterministic: member ids
    n = len(members)
    epoch = max((c.epoch for c in candidates.values()), default=0) + 1
    if n == 0:
        return OwnershipMap(epoch, [], [-1] * partitions)
    # slots: keep each claimed slot once (the member with the smallest id wins a clash)
    used: set[int] = set()
    slots: dict[str, int] = {}
    for m in members:
        s = candidates[m].instance.slot
        if 0 <= s < MAX_SLOTS and s not in used:
            slots[m] = s
            used.add(s)
    free = (s for s in range(MAX_SLOTS) if s not in used)
    for m in members:
        if m not in slots:
            slots[m] = next(free)
    # quotas: the first ``partitions % n`` members (by how much they own already) get one more
    base, extra = divmod(partitions, n)
    prior = {m: sorted({p for p in candidates[m].owned if 0 <= p < partitions}) for m in members}
    order = sorted(members, key=lambda m: (-len(prior[m]), m))
    quotas = {m: _Quota(m, base + (1 if i < extra else 0)) for i, m in enumerate(order)}
    owners = [-1] * partitions
    index = {m: i for i, m in enumerate(members)}
    # keep: newest epoch's claims first, so a stale claim loses to a fresh one
    for m in sorted(members, key=lambda m: (-candidates[m].epoch, m)):
        q = quotas[m]
        for p in prior[m]:
            if owners[p] == -1 and len(q.have) < q.want:
                owners[p] = index[m]
                q.have.append(p)
    # give out the rest to whoever is under quota
    spare = [p for p in range(partitions) if owners[p] == -1]
    for m in members:
        q = quotas[m]
        while len(q.have) < q.want and spare:
            p = spare.pop(0)
            owners[p] = index[m]
            q.have.append(p)
    instances = [msgspec.structs.replace(candidates[m].instance, slot=slots[m]) for m in members]
    return OwnershipMap(epoch, instances, owners)


@dataclass(frozen=True)
class ClaimPlan:
    """What a proxy does with a new map: give up ``again`` (it missed a map, so what it holds may be
    stale) and ``lost``, then claim ``gained``, which includes ``again``."""

    again: list[int]
    lost: list[int]
    gained: list[int]


def plan_claims(previous: OwnershipMap | None, decision: OwnershipMap, me: str,
                claimed: frozenset[int]) -> ClaimPlan:
    """Against what this proxy has claimed, not against the previous map: a partition fenced away
    meanwhile and now given back is claimed again. Epochs go up by one per map (:func:`assign`),
    so a gap means this proxy missed a map (paused or cut off past its session): what it still
    holds may have been another proxy's meanwhile, and that proxy's fence shows only at our
    writer's next write. All of it is claimed again: a new writer fences whoever wrote last, and
    the replay reads what they wrote."""
    mine = set(decision.partitions_of(me))
    again = sorted(mine & claimed) if previous is not None and decision.epoch > previous.epoch + 1 else []
    held = claimed - set(again)
    return ClaimPlan(again, sorted(held - mine), sorted(mine - held))


class GroupOwnership:
    """This proxy's share of an instance group: what it serves is what its store has claimed (so
    nothing is served before its state is replayed), while clients are routed by the latest map."""

    def __init__(self, me: str, partitions: int) -> None:
        self.me = me  # this proxy's instance id
        self.partitions = partitions  # of the state topic
        self.map: OwnershipMap | None = None
        self.claimed: frozenset[int] = frozenset()

    @property
    def epoch(self) -> int:
        return self.map.epoch if self.map is not None else 0

    def owns(self, key: SharePartitionKey) -> bool:
        return self.owns_partition(key.topic_id, key.partition)

    def owns_partition(self, topic_id: bytes, partition: int) -> bool:
        return state_partition_of(topic_id, partition, self.partitions) in self.claimed

    def owns_group(self, group_id: str) -> bool:
        return partition_for_group(group_id, self.partitions) in self.claimed

    def owner_of_group(self, group_id: str) -> Instance | None:
        return self.map.owner_of_group(group_id) if self.map is not None else None

    def owner_of_partition(self, topic_id: bytes, partition: int) -> Instance | None:
        return self.map.owner_of_topic_partition(topic_id, partition) if self.map is not None else None

    def view(self) -> ClusterView | None:
        """What the proxy shows clients: every proxy's listeners, each owner by slot."""
        decision = self.map
        mine = decision.instance(self.me) if decision is not None else None
        if decision is None or mine is None:
            return None
        peers = {i.slot: Peer(i.slot, i.host, dict(i.broker_ports), i.broker_port_base) for i in decision.instances}
        n = len(decision.owners)

        def slot_of(state_partition: int) -> int | None:
            owner = decision.owner(state_partition)
            return owner.slot if owner is not None else None

        return ClusterView(
            me=mine.slot, peers=peers, epoch=decision.epoch,
            partition_owner=lambda topic_id, partition: slot_of(state_partition_of(topic_id, partition, n)),
            group_owner=lambda group_id: slot_of(partition_for_group(group_id, n)))
