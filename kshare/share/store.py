"""Where durable share state lives: the interface the share-group service writes through.

The service never touches storage directly. It hands the ``StateStore`` the ShareUpdate /
ShareSnapshot content the engine emitted and awaits the write: an acknowledgement is answered
only once that await returns, i.e. once the cluster has acknowledged the write. All durable state
is on the cluster (the ``__share_group_state`` topic); nothing is kept on local disk, so any proxy
instance can take over a share-partition.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from .states import ShareSnapshot, ShareUpdate


@dataclass(frozen=True, slots=True, order=True)
class SharePartitionKey:
    """A share-partition: one topic-partition as seen by one share group."""

    group_id: str
    topic_id: bytes  # 16 bytes
    partition: int


@dataclass(slots=True)
class GroupRecord:
    """What must survive a restart about a share group besides its partitions' state."""

    group_id: str
    group_epoch: int = 0  # the assignment epoch must never move backwards
    configs: dict[str, str] = field(default_factory=dict)  # dynamic group configs (share.*, errors.*)
    # topic id -> topic name for the share-partitions the group has state for (for describe/lag)
    topics: dict[bytes, str] = field(default_factory=dict)
    # topic id -> the topic's partition count when the group started reading it: partitions added
    # later start at their beginning instead of share.auto.offset.reset
    topic_partitions: dict[bytes, int] = field(default_factory=dict)


StateWrite = tuple[SharePartitionKey, ShareUpdate | ShareSnapshot]


class StoreWriteError(Exception):
    """A store's write the cluster did not acknowledge (it may or may not have landed); the
    state store's own write errors derive from it."""


class NotOwned(Exception):
    """Raised by a store's write for state this proxy does not (or no longer) own: an instance
    group moved it to another proxy (which fenced this one). Nothing was written."""


class StateStore(Protocol):
    async def start(self) -> None:
        """Connect, create the state topic if missing, and replay it (the durable state is then loaded)."""

    def share_partitions(self) -> dict[SharePartitionKey, ShareSnapshot]:
        """The replayed durable state of every share-partition (latest snapshot + later updates)."""

    def groups(self) -> dict[str, GroupRecord]:
        """The replayed group records."""

    async def write(self, writes: Sequence[StateWrite]) -> None:
        """Make these writes durable; returns once the cluster acknowledged them (acks=all).

        Concurrent callers are batched together into one produce where possible. A snapshot
        replaces the share-partition's state; an update is a delta over it.
        """

    async def write_group(self, record: GroupRecord) -> None:
        """Persist a group record (durable on return)."""

    async def delete_group(self, group_id: str, keys: Sequence[SharePartitionKey]) -> None:
        """Forget a group and the given share-partitions for good (replay no longer sees them)."""

    async def delete_share_partitions(self, keys: Sequence[SharePartitionKey]) -> None:
        """Forget these share-partitions (DeleteShareGroupOffsets); replay no longer sees them."""

    async def close(self) -> None:
        """Flush pending writes and disconnect."""
