"""Pruning the state topic: DeleteRecords below the oldest record replay still needs.

Per state-topic partition, replay needs the latest acknowledged snapshot of every live
share-partition and the latest group record of every group in it (and, while a round is in
flight, those of what the round changed). Everything below the lowest of them may go. A
share-partition or group whose latest snapshot / record lies far behind the end of its partition
(more than max(``refresh_after_records``, 4 x keys in the partition) offsets) is rewritten first,
so an idle key does not pin the log forever.

:func:`prune_points`, :func:`refresh_ops` and :class:`PruneSchedule` are pure; :func:`delete_below`
sends the DeleteRecords.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from .memory import REFRESH_GROUP, REFRESH_SHARE, InMemoryState

log = logging.getLogger("kshare.share.state_topic")  # the state store's one logger, named as documented


def prune_points(memory: InMemoryState, scope: Iterable[int], undos: Iterable[dict[Any, Any]] = ()) -> dict[int, int]:
    """Per partition of ``scope``: the lowest offset replay still needs (everything below may go).

    ``undos``: those of the rounds in flight: what they changed or deleted still counts until it
    is acknowledged.
    """
    low: dict[int, int] = {p: memory.log_end.get(p, 0) for p in scope}
    pins: list[tuple[int, int | None]] = [(e.partition, e.snapshot_offset) for e in memory.entries.values()]
    pins += [(g.partition, g.offset) for g in memory.groups.values()]
    for undo in undos:
        pins += memory.pins_of(undo)
    for partition, offset in pins:
        if offset is not None and partition in low and offset < low[partition]:
            low[partition] = offset
    return low


def refresh_ops(memory: InMemoryState, refresh_after_records: int) -> list[tuple]:
    """Writes that re-snapshot the share-partitions (and rewrite the group records) lagging far
    behind their partition's end, or left to resync by a failed write."""
    per_partition: dict[int, int] = defaultdict(int)
    for e in memory.entries.values():
        per_partition[e.partition] += 1
    ends = memory.log_end
    ops: list[tuple] = []
    for k, e in memory.entries.items():
        lag_limit = max(refresh_after_records, 4 * per_partition[e.partition])
        if e.resync or (e.snapshot_offset is not None and ends.get(e.partition, 0) - e.snapshot_offset > lag_limit):
            ops.append((REFRESH_SHARE, k))
    for g in memory.groups.values():
        lag_limit = max(refresh_after_records, 4 * per_partition[g.partition])
        if g.resync or (g.offset is not None and ends.get(g.partition, 0) - g.offset > lag_limit):
            ops.append((REFRESH_GROUP, g.record.group_id))
    return ops


class PruneSchedule:
    """When to prune: every ``interval_s``, and sooner (at most every ``min_interval_s``) once
    ``after_records`` records were written and some of them were snapshots or group records, or
    once a write failed (the pass rewrites what failed)."""

    def __init__(self, interval_s: float = 60.0, after_records: int = 10_000, min_interval_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self.after_records = after_records
        self.min_interval_s = min_interval_s
        self.clock = clock
        self.since = 0  # records written since the last pass
        self.last = 0.0  # the clock at the last pass

    def wrote(self, records: int, *, snapshots: bool, failed: bool) -> bool:
        """A round was settled; True when a pass should run before the interval is over."""
        self.since += records
        return failed or (snapshots and self.since >= self.after_records)

    def wait_s(self) -> float:
        """How long a pass asked for early waits, so that passes are ``min_interval_s`` apart."""
        return max(0.0, self.last + self.min_interval_s - self.clock())

    def passed(self) -> None:
        self.since = 0
        self.last = self.clock()


async def delete_below(admin: Any, topic: str, points: dict[int, int], log_start: dict[int, int],
                       timeout_s: float) -> dict[int, int] | None:
    """DeleteRecords below ``points`` where that moves a log start offset (as last known:
    ``log_start``). Returns the cluster's new log start offset of every partition it asked to
    move, or None when there was nothing to ask."""
    from aiokafka import TopicPartition
    from aiokafka.admin import RecordsToDelete

    todo = {
        TopicPartition(topic, p): RecordsToDelete(before_offset=off)
        for p, off in points.items()
        if off > log_start.get(p, 0)
    }
    if not todo:
        return None
    result = await admin.delete_records(todo, timeout_ms=int(timeout_s * 1000))
    moved: dict[int, int] = {}
    for tp, low in result.items():
        moved[tp.partition] = low
    log.debug("state topic %s pruned: %s", topic, moved)
    return moved


__all__ = ["PruneSchedule", "delete_below", "prune_points", "refresh_ops"]
