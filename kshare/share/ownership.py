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

A map decided by topic (``by_topic``, the group's protocol ``kshare-ownership-v2``) also names the
leader of each topic-partition (:mod:`kshare.share.leadership`: balanced per topic, sticky), and
a topic-partition's share state lives in a state partition its leader owns: it is moved there
when leadership moves (``kshare.share.instance_service``, docs/design/scale-out.md). State
partitions still carry the fencing, the group records and the groups' coordination.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import msgspec

from ..proxy.virtual import MAX_SLOTS, ClusterView, Peer
from .handovers_elsewhere import HandoversElsewhere
from .leadership import assign_leaders, fallback_leader
from .state.codec import partition_for_group, state_partition_of
from .store import SharePartitionKey

TopicPartition = tuple[bytes, int]  # (topic id, partition)


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
    """The leader's decision: each state partition's owner, as an index into ``instances``, and,
    when ``by_topic``, each listed topic's leaders (the others: :func:`fallback_leader` over the
    instances that own a state partition)."""

    epoch: int
    instances: list[Instance]
    owners: list[int]  # state partition -> index into instances, -1 if nobody
    by_topic: bool = False
    leaders: dict[str, list[int]] = {}  # topic id (hex) -> index into instances per partition
    # topic id (hex) -> per partition, the index of the proxy that named itself its leader when the
    # map was decided and now hands it over to another (-1: it did not move), listed only for the
    # topics with a move: every proxy names that one until it is done (kshare.share.handovers_elsewhere)
    moved_from: dict[str, list[int]] = {}

    def leader_index(self, topic_id: bytes, partition: int) -> int:
        """Index into ``instances`` of the topic-partition's leader, -1 if nobody (by topic only)."""
        row = self.leaders.get(topic_id.hex())
        if row is not None and 0 <= partition < len(row):
            return row[partition]
        eligible = self.eligible()
        return eligible[fallback_leader(topic_id, partition, len(eligible))] if eligible else -1

    def eligible(self) -> list[int]:
        """The instances that may lead topic-partitions: those owning a state partition (to keep
        the state of what they lead in)."""
        owning = set(self.owners)
        return [i for i in range(len(self.instances)) if i in owning]

    def home(self, topic_id: bytes, partition: int, index: int) -> int | None:
        """The state partition of instance ``index`` where a topic-partition it leads keeps its state
        when it has none there yet: one of its state partitions, picked by the topic-partition's hash."""
        mine = [p for p, i in enumerate(self.owners) if i == index]
        return mine[state_partition_of(topic_id, partition, len(mine))] if mine else None

    def owner(self, state_partition: int) -> Instance | None:
        i = self.owners[state_partition] if 0 <= state_partition < len(self.owners) else -1
        return self.instances[i] if i >= 0 else None

    def partitions_of(self, instance_id: str) -> list[int]:
        return [p for p, i in enumerate(self.owners) if i >= 0 and self.instances[i].id == instance_id]

    def instance(self, instance_id: str) -> Instance | None:
        return next((i for i in self.instances if i.id == instance_id), None)

    def owner_of_topic_partition(self, topic_id: bytes, partition: int) -> Instance | None:
        if self.by_topic:
            i = self.leader_index(topic_id, partition)
            return self.instances[i] if i >= 0 else None
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
    held: dict[str, list[int]] = {}  # topic id (hex) -> partitions whose share state it holds
    topics: dict[str, int] = {}  # topic id (hex) -> partition count, of the topics share groups read
    # topic id (hex) -> partitions it names itself the leader of: those its map makes it lead
    # (``led``) and those it is still handing over to another proxy (``handing``)
    led: dict[str, list[int]] = {}
    handing: dict[str, list[int]] = {}

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


def assign(candidates: dict[str, Candidate], partitions: int, *, by_topic: bool = False) -> OwnershipMap:
    """Balanced and sticky: every proxy owns ``partitions // n`` or one more state partitions;
    a partition stays with its previous owner while that owner is under its quota (so a proxy
    joining or leaving moves only the partitions it must); slots stay as they were unless two
    proxies claim the same one. ``candidates`` are keyed by group member id (it orders ties).

    ``by_topic``: the topics the candidates report are given leaders too (:func:`topic_leaders`)."""
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
    # keep: newest epoch's claims first, so a stale claim loses to a fresh one; by topic, a proxy
    # over its quota keeps first the state partitions holding the most of what it leads (each one
    # it gives up takes that state's leadership or home with it, :func:`keep_first`)
    for m in sorted(members, key=lambda m: (-candidates[m].epoch, m)):
        q = quotas[m]
        load = _led_state(candidates[m]) if by_topic else {}
        for p in sorted(prior[m], key=lambda p: (-load.get(p, 0), p)):
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
    if not by_topic:
        return OwnershipMap(epoch, instances, owners)
    leaders = topic_leaders(candidates, members, owners)
    return OwnershipMap(epoch, instances, owners, True, leaders, moved_from(candidates, members, leaders))


def topic_leaders(candidates: dict[str, Candidate], members: list[str], owners: list[int]) -> dict[str, list[int]]:
    """Leaders of every topic a candidate reports, among the members owning a state partition:
    balanced per topic, and sticky to where the share state is (what each candidate holds, the
    newest map's claim winning a clash), so leadership moves, and state with it, only as it must."""
    owning = set(owners)
    eligible = [m for i, m in enumerate(members) if i in owning]
    topics: dict[bytes, int] = {}
    previous: dict[bytes, dict[int, str]] = {}
    for m in sorted(members, key=lambda m: (candidates[m].epoch, m)):  # the newest claim last: it wins
        c = candidates[m]
        for hex_id, count in c.topics.items():
            tid = bytes.fromhex(hex_id)
            topics[tid] = max(topics.get(tid, 0), count)
        for hex_id, parts in c.held.items():
            row = previous.setdefault(bytes.fromhex(hex_id), {})
            for p in parts:
                row[p] = m
    index = {m: i for i, m in enumerate(members)}
    decided = assign_leaders(topics, eligible, previous, keep_first(candidates, members, owners, previous))
    return {tid.hex(): [index[m] for m in row] for tid, row in decided.items()}


def _led_state(candidate: Candidate) -> dict[int, int]:
    """State partition -> how many of the topic-partitions the candidate led have their state
    there (their home in its last map, as :meth:`OwnershipMap.home`)."""
    mine = sorted(candidate.owned)
    out: dict[int, int] = {}
    if mine:
        for hex_id, parts in candidate.led.items():
            topic_id = bytes.fromhex(hex_id)
            for p in parts:
                home = mine[state_partition_of(topic_id, p, len(mine))]
                out[home] = out.get(home, 0) + 1
    return out


def keep_first(candidates: dict[str, Candidate], members: list[str], owners: list[int],
               previous: dict[bytes, dict[int, str]]) -> dict[bytes, dict[str, set[int]]]:
    """topic id -> member -> the partitions it led whose state is in a state partition it gives up
    now: those it keeps leading first when it must give some leadership up. Then one share-partition
    loses either its state partition (re-homed) or its leader (handed over), not both, which
    neither can do without delivering again what members hold (docs/design/scale-out.md)."""
    index = {m: i for i, m in enumerate(members)}
    out: dict[bytes, dict[str, set[int]]] = {}
    for topic_id, row in previous.items():
        for p, m in row.items():
            mine = sorted(candidates[m].owned)
            if not mine:
                continue
            home = mine[state_partition_of(topic_id, p, len(mine))]  # as OwnershipMap.home, in its last map
            if not 0 <= home < len(owners) or owners[home] != index[m]:
                out.setdefault(topic_id, {}).setdefault(m, set()).add(p)
    return out


def moved_from(candidates: dict[str, Candidate], members: list[str],
               leaders: dict[str, list[int]]) -> dict[str, list[int]]:
    """Per topic with a move, the member each partition is handed over from (index into
    ``members``; -1: none): the one still handing it over, if another is to lead it now, else the
    one that led it, if another leads it now (the newest map's claim winning a clash). A client told
    another leader than the one it acquired records from drops its acknowledgements of them, so
    every proxy names that one until it is done."""
    index = {m: i for i, m in enumerate(members)}
    handing: dict[tuple[str, int], int] = {}
    led: dict[tuple[str, int], int] = {}
    for m in sorted(members, key=lambda m: (candidates[m].epoch, m)):  # the newest claim last: it wins
        c = candidates[m]
        for named, into in ((c.led, led), (c.handing, handing)):
            for hex_id, parts in named.items():
                for p in parts:
                    into[(hex_id, p)] = index[m]
    out: dict[str, list[int]] = {}
    for hex_id, row in leaders.items():
        moves = [-1] * len(row)
        for p, leader in enumerate(row):
            for was in (handing.get((hex_id, p), -1), led.get((hex_id, p), -1)):
                if was >= 0:
                    moves[p] = was if was != leader else -1
                    break
        if any(i >= 0 for i in moves):
            out[hex_id] = moves
    return out


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
    nothing is served before its state is replayed), while clients are routed by the latest map.

    By topic (``map.by_topic``) it serves a topic-partition the map makes it lead once it has
    claimed its state partitions of the map; each share-partition is served once its state was
    *confirmed* at this map's epoch (``confirmed``: every other proxy answered whether it holds a
    newer copy, see ``instance_service``)."""

    def __init__(self, me: str, partitions: int) -> None:
        self.me = me  # this proxy's instance id
        self.partitions = partitions  # of the state topic
        self.map: OwnershipMap | None = None
        self.claimed: frozenset[int] = frozenset()
        self.confirmed: dict[SharePartitionKey, int] = {}  # by topic: share-partition -> map epoch confirmed at
        # by topic: share-partitions this proxy led under the map before and is handing over (their
        # engines hand nothing out; their members' acknowledgements are still taken and written)
        self.releasing: set[SharePartitionKey] = set()
        self._releasing_tps: dict[TopicPartition, int] = {}  # topic-partition -> keys releasing
        # by topic: the state partitions of the map being applied that are still being claimed
        self.gaining: frozenset[int] = frozenset()
        # leaving on SIGTERM (kshare.share.leaving): nothing is served here any more, and clients are
        # routed by the map the others split ownership by without this proxy, once it is known
        self.successors: OwnershipMap | None = None
        # by topic: topic-partitions another proxy is still handing over, named there meanwhile
        self.elsewhere = HandoversElsewhere()

    def install(self, decision: OwnershipMap, timeout_s: float) -> int:
        """Route by ``decision`` from now on (with what it moves named at the proxies it moves
        from until they are done, ``timeout_s`` at most): how many are named so."""
        self.map = decision
        return self.elsewhere.apply(decision, self.me, timeout_s)

    def naming(self, topics: Mapping[str, int]) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
        """By topic: (the partitions the map makes this proxy lead, of the topics it lists and of
        ``topics``, topic id (hex) -> partition count, which it may lead by the fallback; those it
        is still handing over), by topic id (hex), as it reports them at join (``Candidate.led``,
        ``Candidate.handing``)."""
        led: dict[str, list[int]] = {}
        handing: dict[str, list[int]] = {}
        m, me = self.map, self.my_index()
        if m is None or not m.by_topic or me < 0:
            return led, handing
        counts = {hex_id: len(row) for hex_id, row in m.leaders.items()}
        for hex_id, n in topics.items():
            counts.setdefault(hex_id, n)
        for hex_id, n in counts.items():
            topic_id = bytes.fromhex(hex_id)
            mine = [p for p in range(n) if m.leader_index(topic_id, p) == me]
            if mine:
                led[hex_id] = mine
        for topic_id, partition in sorted(self._releasing_tps):
            handing.setdefault(topic_id.hex(), []).append(partition)
        return led, handing

    def leave(self) -> None:
        """Serve nothing from now on (every share request is refused with the error that sends its
        client elsewhere); Metadata names this proxy's partitions' leaders as before until
        :attr:`successors` is set."""
        self.claimed = frozenset()
        self.gaining = frozenset()
        self.releasing.clear()
        self._releasing_tps.clear()

    def start_releasing(self, keys: Iterable[SharePartitionKey]) -> None:
        for key in keys:
            if key not in self.releasing:
                self.releasing.add(key)
                tp = (key.topic_id, key.partition)
                self._releasing_tps[tp] = self._releasing_tps.get(tp, 0) + 1

    def stop_releasing(self, keys: Iterable[SharePartitionKey]) -> None:
        for key in keys:
            if key in self.releasing:
                self.releasing.discard(key)
                tp = (key.topic_id, key.partition)
                left = self._releasing_tps[tp] - 1
                if left:
                    self._releasing_tps[tp] = left
                else:
                    del self._releasing_tps[tp]

    @property
    def epoch(self) -> int:
        return self.map.epoch if self.map is not None else 0

    @property
    def by_topic(self) -> bool:
        return self.map is not None and self.map.by_topic

    def my_index(self) -> int:
        m = self.map
        return next((i for i, inst in enumerate(m.instances) if inst.id == self.me), -1) if m is not None else -1

    def leads(self, topic_id: bytes, partition: int) -> bool:
        """By topic: the map makes this proxy the topic-partition's leader."""
        m = self.map
        return m is not None and m.leader_index(topic_id, partition) == self.my_index() >= 0

    def owns(self, key: SharePartitionKey) -> bool:
        """Whether this proxy may load (initialise, confirm) the share-partition: it leads it and has
        claimed the state partition new state of it goes to. A share-partition being handed over is
        served only by the engine it has."""
        return self._leads_here(key.topic_id, key.partition, loading=True)

    def owns_partition(self, topic_id: bytes, partition: int) -> bool:
        """Whether requests for the topic-partition are served here: it is led here, or a share-partition
        of it is being handed over (its acknowledgements are taken). By topic, also while the state
        partition new state of it would go to is still being claimed: the share-partitions loaded
        here keep their state where it is, and go on taking acknowledgements meanwhile (a group's
        share-partition not loaded here is refused when it would load, by ``owns``)."""
        if self._releasing_tps and (topic_id, partition) in self._releasing_tps:
            return True
        return self._leads_here(topic_id, partition, loading=False)

    def _leads_here(self, topic_id: bytes, partition: int, *, loading: bool) -> bool:
        if not self.by_topic:
            return state_partition_of(topic_id, partition, self.partitions) in self.claimed
        m = self.map
        assert m is not None
        if not self.leads(topic_id, partition):
            return False
        home = m.home(topic_id, partition, self.my_index())
        return home in self.claimed or (not loading and home in self.gaining)

    def state_partition(self, key: SharePartitionKey) -> int:
        """The state partition for a share-partition the store has no entry for: by topic, this
        proxy's home for its topic-partition, else where it hashes."""
        if self.by_topic and self.map is not None:
            where = self.map.home(key.topic_id, key.partition, self.my_index())
            if where is not None:
                return where
        return state_partition_of(key.topic_id, key.partition, self.partitions)

    def owns_group(self, group_id: str) -> bool:
        return partition_for_group(group_id, self.partitions) in self.claimed

    def owner_of_group(self, group_id: str) -> Instance | None:
        return self.map.owner_of_group(group_id) if self.map is not None else None

    def owner_of_partition(self, topic_id: bytes, partition: int) -> Instance | None:
        return self.map.owner_of_topic_partition(topic_id, partition) if self.map is not None else None

    def view(self) -> ClusterView | None:
        """What the proxy shows clients: every proxy's listeners, each owner by slot. Leaving, once the
        others' map is known, their owners (with this proxy's listeners still listed: its clients'
        connections stay open until they moved)."""
        if self.successors is not None and self.map is not None:
            return _leaving_view(self.map, self.successors, self.me)
        decision = self.map
        mine = decision.instance(self.me) if decision is not None else None
        if decision is None or mine is None:
            return None
        peers = _peers(decision.instances)
        releasing = self._releasing_tps
        elsewhere = self.elsewhere

        def partition_owner(topic_id: bytes, partition: int) -> int | None:
            # what this proxy is handing over it still leads, as far as its own Metadata says: the
            # members' acknowledgements of what they hold come here until it is done; what another
            # proxy hands over, that one leads until it is done (kshare.share.handovers_elsewhere)
            if releasing and (topic_id, partition) in releasing:
                return mine.slot
            if elsewhere:
                slot = elsewhere.slot(topic_id, partition)
                if slot is not None and slot in peers:
                    return slot
            return _slot_of(decision.owner_of_topic_partition(topic_id, partition))

        return ClusterView(
            me=mine.slot, peers=peers, epoch=decision.epoch,
            partition_owner=partition_owner,
            group_owner=lambda group_id: _slot_of(decision.owner_of_group(group_id)))


def _leaving_view(before: OwnershipMap, successors: OwnershipMap, me: str) -> ClusterView | None:
    """A leaving proxy's view: the owners of the others' map, every proxy of it, and this proxy's
    own listeners under its slot of the map before."""
    mine = before.instance(me)
    if mine is None:
        return None
    peers = _peers([*successors.instances, mine])
    return ClusterView(
        me=mine.slot, peers=peers, epoch=successors.epoch,
        partition_owner=lambda topic_id, partition: _slot_of(successors.owner_of_topic_partition(topic_id, partition)),
        group_owner=lambda group_id: _slot_of(successors.owner_of_group(group_id)))


def _peers(instances: Iterable[Instance]) -> dict[int, Peer]:
    """Every proxy's listeners by slot (the first instance of a slot wins)."""
    out: dict[int, Peer] = {}
    for i in instances:
        out.setdefault(i.slot, Peer(i.slot, i.host, dict(i.broker_ports), i.broker_port_base))
    return out


def _slot_of(owner: Instance | None) -> int | None:
    return owner.slot if owner is not None else None
