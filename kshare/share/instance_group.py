"""The instance group's shell: a consumer group on the fronted cluster that splits ownership.

Every proxy of the group joins the consumer group ``kshare-instances.<name>`` subscribed to the
state topic. The group's leader (whichever proxy Kafka's group coordinator picks) runs
:func:`ownership.assign` over what each proxy said at join (its advertised endpoints, what it owned
before, its slot, the share state it holds and the topics share groups read) and ships the whole
:class:`OwnershipMap` inside every member's assignment, so every proxy knows every other's
partitions and listeners. Kafka's group protocol does the rest: session timeouts, generations,
rebalances when a proxy comes or goes.

Two protocols: ``kshare-ownership-v2`` decides leadership by topic, ``kshare-ownership-v1`` by
state partition (what proxies before v2 speak). A proxy made with ``by_topic`` offers v2 first;
Kafka's coordinator picks one every member offers, so a group with a proxy of an older kshare (a
rolling upgrade) stays on v1 until it is gone (``kshare proxy --instance-leadership topic``;
docs/design/scale-out.md, "Balanced leadership").

This module only learns maps and reports changes (``on_change(map, gained, lost)``); what owning a
state partition means (replaying it, fencing the previous owner with a transactional producer,
routing clients) is the caller's. Between rebalances a proxy keeps serving what it owned: when a
partition moves, the new owner fences the old one's writes through the broker before it serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from .ownership import Candidate, Instance, OwnershipMap, assign

log = logging.getLogger("kshare.share")

GROUP_PREFIX = "kshare-instances."
PROTOCOL = "kshare-ownership-v1"  # leadership by state partition
PROTOCOL_BY_TOPIC = "kshare-ownership-v2"  # leadership by topic-partition

HEARTBEAT_MAX_MS = 500


def heartbeat_ms(session_timeout_ms: int) -> int:
    """The instance group's heartbeat interval: a fifth of the session, at most 500 ms, since the
    other proxies learn of a rebalance (one leaving on SIGTERM, one joining) only at their next
    heartbeat, and until then their Metadata answers route clients by the old map."""
    return min(HEARTBEAT_MAX_MS, max(100, session_timeout_ms // 5))


ChangeCallback = Callable[[OwnershipMap, list[int], list[int]], Awaitable[None] | None]
# what this proxy reports at join: Candidate's ``held``, ``topics``, ``led`` and ``handing``, by name
Report = Callable[[], Mapping[str, Any]]


class InstanceGroup:
    """One proxy's membership. ``start`` returns once the first map is known."""

    def __init__(self, bootstrap: list[str], name: str, state_topic: str, me: Instance,
                 on_change: ChangeCallback, *, session_timeout_ms: int = 10_000,
                 heartbeat_interval_ms: int = 1_000, client_config: Mapping[str, Any] | None = None,
                 by_topic: bool = False, report: Report | None = None) -> None:
        self.bootstrap = bootstrap
        self.by_topic = by_topic  # offer v2 (and v1 after it)
        self.report = report
        self.group_id = GROUP_PREFIX + name
        self.state_topic = state_topic
        self.me = me
        self.on_change = on_change
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.client_config = dict(client_config or {})
        self.map: OwnershipMap | None = None
        self.owned: list[int] = []
        self._consumer: Any = None
        self._poller: asyncio.Task | None = None
        self._first = asyncio.Event()
        self._changes: asyncio.Queue[OwnershipMap] = asyncio.Queue()
        self._applier: asyncio.Task | None = None

    def _assignor(self, by_topic: bool = False) -> type:
        """aiokafka's assignors are classes with class methods: one of our own per membership and protocol."""
        # aiokafka (here and in start) loads only in a proxy of an instance group
        from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
        from aiokafka.coordinator.protocol import (
            ConsumerProtocolMemberAssignment,
            ConsumerProtocolMemberMetadata,
        )

        group = self

        class OwnershipAssignor(AbstractPartitionAssignor):
            name = PROTOCOL_BY_TOPIC if by_topic else PROTOCOL
            version = 0

            @classmethod
            def metadata(cls, topics: Iterable[str]) -> Any:
                prev = group.map
                report: Mapping[str, Any] = {}
                if group.report is not None:
                    try:
                        report = group.report()
                    except Exception:  # noqa: BLE001 - join without it: leadership is then less sticky
                        log.exception("instance group %s: cannot report the state held here", group.group_id)
                cand = Candidate(group.me, list(group.owned), prev.epoch if prev else 0, **report)
                return ConsumerProtocolMemberMetadata(cls.version, list(topics), cand.encode())

            @classmethod
            def assign(cls, cluster: Any, members: Mapping[str, Any]) -> dict[str, Any]:
                partitions = cluster.partitions_for_topic(group.state_topic) or set()
                cands = {}
                for member_id, meta in members.items():
                    try:
                        c = Candidate.decode(meta.user_data)
                    except Exception:  # noqa: BLE001 - a member of another version: it gets nothing
                        log.warning("instance group %s: member %s sent metadata this proxy cannot read; "
                                    "it owns nothing", group.group_id, member_id)
                        continue
                    cands[member_id] = c
                decision = assign(cands, len(partitions), by_topic=by_topic)
                data = decision.encode()
                out = {}
                for member_id in members:
                    c = cands.get(member_id)
                    mine = decision.partitions_of(c.instance.id) if c is not None else []
                    out[member_id] = ConsumerProtocolMemberAssignment(
                        cls.version, [(group.state_topic, mine)] if mine else [], data)
                led = [sum(row.count(i) for row in decision.leaders.values()) for i in range(len(decision.instances))]
                log.info("instance group %s: ownership epoch %d over %d proxies (%s): %s", group.group_id,
                         decision.epoch, len(decision.instances), cls.name,
                         ", ".join(f"{i.host}:{i.port}={len(decision.partitions_of(i.id))}"
                                   + (f" leading {led[n]}" if by_topic else "")
                                   for n, i in enumerate(decision.instances)))
                return out

            @classmethod
            def on_assignment(cls, assignment: Any) -> None:
                try:
                    decision = OwnershipMap.decode(assignment.user_data)
                except Exception as exc:  # noqa: BLE001
                    log.error("instance group %s: unreadable ownership map (%r); keeping the last one",
                              group.group_id, exc)
                    return
                group._changes.put_nowait(decision)

        return OwnershipAssignor

    async def start(self, timeout: float = 60.0) -> None:
        from aiokafka import AIOKafkaConsumer

        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=self.group_id,
            client_id=f"kshare-instance-{self.me.host}:{self.me.port}",
            enable_auto_commit=False,
            partition_assignment_strategy=((self._assignor(True), self._assignor()) if self.by_topic
                                           else (self._assignor(),)),
            session_timeout_ms=self.session_timeout_ms,
            heartbeat_interval_ms=self.heartbeat_interval_ms,
            # it never consumes: the membership is the point (polled only to stay in the group)
            max_poll_interval_ms=0x7FFFFFFF,
            rebalance_timeout_ms=max(self.session_timeout_ms, 10_000),
            **self.client_config,
        )
        await self._consumer.start()
        self._consumer.subscribe([self.state_topic])
        self._applier = asyncio.create_task(self._apply_loop(), name="kshare-instance-map")
        self._poller = asyncio.create_task(self._poll_loop(), name="kshare-instance-poll")
        await asyncio.wait_for(self._first.wait(), timeout)

    async def _poll_loop(self) -> None:
        """aiokafka joins, syncs and rejoins from its poll calls; partitions stay paused."""
        consumer = self._consumer
        while True:
            try:
                assigned = consumer.assignment()
                if assigned:
                    consumer.pause(*assigned)
                await consumer.getmany(timeout_ms=500)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the consumer recovers by itself; say it once
                log.warning("instance group %s: %r", self.group_id, exc)
                await asyncio.sleep(1.0)

    async def _apply_loop(self) -> None:
        while True:
            decision = await self._changes.get()
            mine = decision.partitions_of(self.me.id)
            gained = sorted(set(mine) - set(self.owned))
            lost = sorted(set(self.owned) - set(mine))
            self.map, self.owned = decision, mine
            me = decision.instance(self.me.id)
            if me is not None:
                self.me = me  # with the slot the leader gave it
            try:
                result = self.on_change(decision, gained, lost)
                if asyncio.iscoroutine(result):
                    await result
            except Exception:  # noqa: BLE001 - the caller's failure must not stop membership
                log.exception("instance group %s: applying ownership epoch %d failed", self.group_id,
                              decision.epoch)
            self._first.set()

    async def successor_map(self, timeout: float, *, poll_s: float = 0.05) -> OwnershipMap | None:
        """After :meth:`stop`: the map the other proxies split ownership by without this one, read from
        the group's members' assignments (DescribeGroups; every member's carries the whole map) once
        the group is stable again without it; None when the group is empty (nobody takes over) or
        after ``timeout``. Used by a proxy leaving on SIGTERM to route its clients to their new
        leaders before it closes their connections."""
        from aiokafka.admin import AIOKafkaAdminClient
        from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment

        deadline = asyncio.get_running_loop().time() + timeout
        before = self.map.epoch if self.map is not None else 0
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=max(1000, int(timeout * 1000)),
                                    **self.client_config)
        try:
            await asyncio.wait_for(admin.start(), timeout)
            while True:
                found = await self._described_map(admin, ConsumerProtocolMemberAssignment, before)
                if found is not False:
                    return found
                if asyncio.get_running_loop().time() + poll_s > deadline:
                    return None
                await asyncio.sleep(poll_s)
        except Exception as exc:  # noqa: BLE001 - a timeout or a refusal: clients find their leaders anyway
            log.info("instance group %s: the others' new map not read (%r); clients find it through them",
                     self.group_id, exc)
            return None
        finally:
            with contextlib.suppress(Exception):
                await admin.close()

    async def _described_map(self, admin: Any, assignment_cls: Any, before: int) -> OwnershipMap | None | bool:
        """One DescribeGroups: the new map, None (nobody left to take over), or False (not yet)."""
        for response in await admin.describe_consumer_groups([self.group_id]):
            for group in response.groups:
                error_code, state, members = group[0], group[2], group[5]
                if error_code:
                    return False
                if state in ("Empty", "Dead"):
                    return None
                if state != "Stable":
                    return False
                for member in members:
                    raw = member[-1]  # member_assignment, the last field in every version
                    if not raw:
                        continue
                    decision = OwnershipMap.decode(assignment_cls.decode(raw).user_data)
                    if decision.epoch > before and decision.instance(self.me.id) is None:
                        return decision
        return False

    async def stop(self) -> None:
        """Leave the group at once (the others take over without waiting for a session timeout)."""
        for task in (self._poller, self._applier):
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        if self._consumer is not None:
            with contextlib.suppress(Exception):
                await self._consumer.stop()  # LeaveGroup
            self._consumer = None
