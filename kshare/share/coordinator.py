"""The share-group coordinator (sans-I/O): membership, epochs, assignments, session timeouts.

Plain Python with an injectable clock. The asyncio service calls ``heartbeat`` for every
ShareGroupHeartbeat, ``expire`` from a timer (``next_deadline``), and ``refresh_topics`` when the
cluster's topics change; it acts on what comes back (members gone -> release their records;
groups changed -> persist their record).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from .assignor import Assignment, assign
from .config import BrokerLimits, GroupConfig
from .errors import ErrorCode

LEAVE_EPOCH = -1
JOIN_EPOCH = 0
MAX_MEMBER_ID_LENGTH = 36  # Kafka accepts client-generated UUID strings


class GroupState(StrEnum):
    EMPTY = "Empty"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(slots=True)
class Member:
    member_id: str
    epoch: int
    subscribed: tuple[str, ...]
    rack_id: str | None
    client_id: str
    client_host: str
    deadline_ms: int
    assignment: Assignment = field(default_factory=dict)  # what the member was last told
    previous_epoch: int = -1  # the epoch before the last bump (accepted: its answer may have been lost)


@dataclass(slots=True)
class ShareGroup:
    group_id: str
    config: GroupConfig
    epoch: int = 0  # group epoch = assignment epoch (share groups assign at once)
    members: dict[str, Member] = field(default_factory=dict)
    target: dict[str, Assignment] = field(default_factory=dict)
    deleted: bool = False
    topics: dict[bytes, str] = field(default_factory=dict)  # topics the group has read, by id
    topic_partitions: dict[bytes, int] = field(default_factory=dict)  # partition count when first read
    # members assigned each (topic id, partition) by ``target``, rebuilt when the epoch moves
    _assigned: dict[tuple[bytes, int], tuple[str, ...]] = field(default_factory=dict)
    _assigned_epoch: int = -1

    def assigned_members(self, topic_id: bytes, partition: int) -> tuple[str, ...]:
        """Members the target assignment gives this partition to."""
        if self._assigned_epoch != self.epoch:
            index: dict[tuple[bytes, int], list[str]] = {}
            for member_id, assignment in self.target.items():
                for tid, parts in assignment.items():
                    for p in parts:
                        index.setdefault((tid, p), []).append(member_id)
            self._assigned = {k: tuple(v) for k, v in index.items()}
            self._assigned_epoch = self.epoch
        return self._assigned.get((topic_id, partition), ())

    @property
    def state(self) -> GroupState:
        if self.deleted:
            return GroupState.DEAD
        return GroupState.STABLE if self.members else GroupState.EMPTY

    def subscribed_topics(self) -> set[str]:
        return {t for m in self.members.values() for t in m.subscribed}


@dataclass(slots=True)
class HeartbeatResult:
    error_code: int = 0
    error_message: str | None = None
    member_id: str | None = None
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    assignment: Assignment | None = None  # None: unchanged since the member's epoch
    left: list[str] = field(default_factory=list)  # members whose acquired records must be released
    group_changed: bool = False  # the group's durable record (epoch) must be persisted


def _ms() -> int:
    return time.monotonic_ns() // 1_000_000


TopicView = Callable[[], Mapping[str, tuple[bytes, int]]]


class GroupCoordinator:
    """All share groups of this proxy."""

    def __init__(
        self,
        topics: TopicView,
        *,
        clock: Callable[[], int] = _ms,
        limits: BrokerLimits | None = None,
    ) -> None:
        self.topics = topics
        self.clock = clock
        self.limits = limits or BrokerLimits()
        self.groups: dict[str, ShareGroup] = {}

    # -- groups -----------------------------------------------------------------------------------
    def group(self, group_id: str) -> ShareGroup | None:
        g = self.groups.get(group_id)
        return None if g is None or g.deleted else g

    def ensure_group(self, group_id: str, *, epoch: int = 0, configs: dict[str, str] | None = None) -> ShareGroup:
        g = self.group(group_id)
        if g is None:
            g = ShareGroup(group_id, GroupConfig(dict(configs or {}), self.limits), epoch=epoch)
            self.groups[group_id] = g
        return g

    def delete_group(self, group_id: str) -> int:
        """Delete an empty group: NONE, GROUP_ID_NOT_FOUND or NON_EMPTY_GROUP."""
        g = self.group(group_id)
        if g is None:
            return ErrorCode.GROUP_ID_NOT_FOUND
        if g.members:
            return ErrorCode.NON_EMPTY_GROUP
        g.deleted = True
        del self.groups[group_id]
        return ErrorCode.NONE

    # -- heartbeat ----------------------------------------------------------------------------------
    def heartbeat(
        self,
        group_id: str,
        member_id: str,
        member_epoch: int,
        rack_id: str | None,
        subscribed: Sequence[str] | None,
        *,
        client_id: str = "",
        client_host: str = "",
    ) -> HeartbeatResult:
        if not group_id:
            return HeartbeatResult(ErrorCode.INVALID_REQUEST, "GroupId can't be empty.")
        if member_epoch == JOIN_EPOCH and not member_id:
            # v0 clients left it to the coordinator; v1 clients generate their own.
            member_id = str(uuid.uuid4())
        if not member_id or len(member_id) > MAX_MEMBER_ID_LENGTH:
            return HeartbeatResult(ErrorCode.INVALID_REQUEST, "MemberId must be a non-empty string of at most 36 characters.")
        if member_epoch < LEAVE_EPOCH:
            return HeartbeatResult(ErrorCode.INVALID_REQUEST, "MemberEpoch is invalid.")
        now = self.clock()
        if member_epoch == LEAVE_EPOCH:
            return self._leave(group_id, member_id)
        if member_epoch == JOIN_EPOCH:
            if not subscribed:
                return HeartbeatResult(ErrorCode.INVALID_REQUEST, "SubscribedTopicNames must be set in first request.")
            return self._join(group_id, member_id, rack_id, subscribed, client_id, client_host, now)
        g = self.group(group_id)
        m = g.members.get(member_id) if g is not None else None
        if g is None or m is None:
            return HeartbeatResult(ErrorCode.UNKNOWN_MEMBER_ID, f"Member {member_id} is not a member of group {group_id}.")
        if member_epoch != m.epoch and member_epoch != m.previous_epoch:
            # Like Kafka: the previous epoch is accepted, since the answer that moved the member
            # to the current one may have been lost (it gets the current epoch and assignment).
            return HeartbeatResult(
                ErrorCode.FENCED_MEMBER_EPOCH,
                f"The share group member has a different epoch ({member_epoch}) than the coordinator ({m.epoch}).",
            )
        m.deadline_ms = now + g.config.session_timeout_ms
        result = HeartbeatResult(member_id=member_id)
        if subscribed is not None and tuple(sorted(set(subscribed))) != m.subscribed:
            m.subscribed = tuple(sorted(set(subscribed)))
            self._rebalance(g)
            result.group_changed = True
        if rack_id is not None:
            m.rack_id = rack_id
        self._reconcile(g, m, member_epoch, result)
        return result

    def _join(self, group_id: str, member_id: str, rack_id: str | None, subscribed: Sequence[str],
              client_id: str, client_host: str, now: int) -> HeartbeatResult:
        g = self.ensure_group(group_id)
        existing = g.members.get(member_id)
        if existing is None and len(g.members) >= self.limits.max_group_size:
            return HeartbeatResult(
                ErrorCode.GROUP_MAX_SIZE_REACHED,
                f"The share group has reached its maximum capacity of {self.limits.max_group_size} members.",
            )
        result = HeartbeatResult(member_id=member_id, group_changed=True)
        if existing is not None:
            # A rejoin with epoch 0 (e.g. after a fence): the member starts over.
            result.left.append(member_id)
        g.members[member_id] = Member(
            member_id=member_id,
            epoch=0,
            subscribed=tuple(sorted(set(subscribed))),
            rack_id=rack_id,
            client_id=client_id,
            client_host=client_host,
            deadline_ms=now + g.config.session_timeout_ms,
        )
        self._rebalance(g)
        self._reconcile(g, g.members[member_id], JOIN_EPOCH, result)
        return result

    def _leave(self, group_id: str, member_id: str) -> HeartbeatResult:
        g = self.group(group_id)
        if g is None or member_id not in g.members:
            return HeartbeatResult(ErrorCode.UNKNOWN_MEMBER_ID, f"Member {member_id} is not a member of group {group_id}.")
        self._remove(g, member_id)
        return HeartbeatResult(member_id=member_id, member_epoch=LEAVE_EPOCH, left=[member_id], group_changed=True,
                               heartbeat_interval_ms=g.config.heartbeat_interval_ms)

    def _remove(self, g: ShareGroup, member_id: str) -> None:
        del g.members[member_id]
        self._rebalance(g)

    def _rebalance(self, g: ShareGroup) -> None:
        """Membership or topics changed: new group epoch and target assignment."""
        g.epoch += 1
        g.target = assign({m.member_id: m.subscribed for m in g.members.values()}, self.topics(), g.target)

    def _reconcile(self, g: ShareGroup, m: Member, sent_epoch: int, result: HeartbeatResult) -> None:
        """Bring the member to the group's epoch and target assignment at once (share groups have
        no revocation handshake); the assignment is sent whenever the member's epoch moves."""
        if m.epoch != g.epoch:
            m.assignment = g.target.get(m.member_id, {})
            m.previous_epoch = m.epoch
            m.epoch = g.epoch
        result.member_epoch = m.epoch
        result.heartbeat_interval_ms = g.config.heartbeat_interval_ms
        if sent_epoch != m.epoch:
            result.assignment = m.assignment

    # -- timers -------------------------------------------------------------------------------------
    def next_deadline(self) -> int | None:
        deadlines = [m.deadline_ms for g in self.groups.values() for m in g.members.values()]
        return min(deadlines) if deadlines else None

    def expire(self, now: int | None = None) -> list[tuple[str, str]]:
        """Remove members whose session timed out; returns (group id, member id) of each."""
        now = self.clock() if now is None else now
        gone = []
        for g in self.groups.values():
            for m in [m for m in g.members.values() if m.deadline_ms <= now]:
                self._remove(g, m.member_id)
                gone.append((g.group_id, m.member_id))
        return gone

    def refresh_topics(self) -> list[str]:
        """Recompute targets after topic changes; returns the groups whose target changed."""
        changed = []
        view = self.topics()
        for g in self.groups.values():
            if not g.members:
                continue
            target = assign({m.member_id: m.subscribed for m in g.members.values()}, view, g.target)
            if target != g.target:
                g.epoch += 1
                g.target = target
                changed.append(g.group_id)
        return changed
