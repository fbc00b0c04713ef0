"""Replay at start: the state topic read from its log start to the end offsets found at start.

The share coordinator's replay (``docs/reference/state-format.md``): per share-partition the latest
ShareSnapshot plus the later ShareUpdates with the same snapshot epoch; the latest group record
per group; tombstones remove. Records that cannot be decoded, or updates without their snapshot,
are skipped, one ERROR line each. An instance group's claim records (:mod:`.claims`) are not
state: after one, a ShareSnapshot or ShareUpdate with an older leader (ownership) epoch was written
by a proxy that had lost the partition and is ignored. :class:`RecordReplay` applies one record
(pure); :func:`load` reads the topic with a consumer and feeds it.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..states import normalize
from ..store import SharePartitionKey
from .claims import ClaimGuard, decode_claim, is_claim
from .codec import (
    GroupTombstone,
    GroupValueRecord,
    ShareTombstone,
    SnapshotRecord,
    StateRecordError,
    UpdateRecord,
    decode_record,
    is_normalized,
)
from .memory import GroupEntry, InMemoryState, ShareEntry

log = logging.getLogger("kshare.share.state_topic")  # the state store's one logger, named as documented


@dataclass(slots=True)
class LoadStats:
    """What the state store found on the topic when it loaded it."""

    seconds: float = 0.0
    records: int = 0
    bytes: int = 0
    skipped: int = 0
    snapshots: int = 0
    updates: int = 0
    tombstones: int = 0
    group_records: int = 0
    share_partitions: int = 0
    groups: int = 0
    claims: int = 0  # an instance group's claim records
    fenced_out: int = 0  # records of an owner that had lost the partition, after a newer claim


class RecordReplay:
    """Applies state-topic records, in log order per partition, to an in-memory state."""

    def __init__(self, memory: InMemoryState, stats: LoadStats, topic: str) -> None:
        self.memory = memory
        self.stats = stats
        self.topic = topic  # for the log lines
        self.guard = ClaimGuard()
        # A share-partition has live records in one partition, but for a move between proxies
        # leading by topic cut short (docs/design/scale-out.md): then the copy with the highest
        # state epoch is the state (memory.entries) and the others wait here, (key, partition) ->
        # copy, in case it is deleted.
        self._others: dict[tuple[SharePartitionKey, int], ShareEntry] = {}

    def _snapshot(self, key: SharePartitionKey, partition: int, e: ShareEntry) -> None:
        entries = self.memory.entries
        held = entries.get(key)
        if held is None or held.partition == partition:
            entries[key] = e
            if self._others:
                self._promote(key)
        elif e.state_epoch > held.state_epoch:
            self._others[(key, held.partition)] = held
            entries[key] = e
        else:
            self._others[(key, partition)] = e

    def _tombstone(self, key: SharePartitionKey, partition: int) -> None:
        entries = self.memory.entries
        held = entries.get(key)
        if held is not None and held.partition == partition:
            del entries[key]
            if self._others:
                self._promote(key)
        elif self._others:
            self._others.pop((key, partition), None)

    def _promote(self, key: SharePartitionKey) -> None:
        """The copy of ``key`` with the highest state epoch becomes the state, the rest wait."""
        copies = [e for (k, _), e in self._others.items() if k == key]
        if not copies:
            return
        held = self.memory.entries.get(key)
        best = max([*copies, *([held] if held is not None else [])], key=lambda c: (c.state_epoch, -c.partition))
        for c in copies:
            del self._others[(key, c.partition)]
        if held is not None and held is not best:
            self._others[(key, held.partition)] = held
        for c in copies:
            if c is not best:
                self._others[(key, c.partition)] = c
        self.memory.entries[key] = best

    def skip(self, partition: int, offset: int, reason: object) -> None:
        self.stats.skipped += 1
        log.error("state topic %s partition %d offset %d: record skipped: %s", self.topic, partition, offset, reason)

    def apply(self, partition: int, offset: int, key: bytes | None, value: bytes | None) -> None:
        """Apply one record (the share coordinator's replay)."""
        stats = self.stats
        memory = self.memory
        if is_claim(key):
            self._claim(partition, offset, key, value)  # type: ignore[arg-type]
            return
        try:
            rec = decode_record(key, value)
        except StateRecordError as exc:
            self.skip(partition, offset, exc)
            return
        if self.guard.claims and isinstance(rec, SnapshotRecord | UpdateRecord) and not self.guard.admits(
                partition, rec.leader_epoch):
            self._fenced_out(partition, offset, rec.leader_epoch)
            return
        if isinstance(rec, SnapshotRecord):
            stats.snapshots += 1
            snap = rec.snapshot if is_normalized(rec.snapshot) else normalize(rec.snapshot)
            e = ShareEntry(snap, partition, rec.snapshot_epoch, rec.state_epoch, rec.leader_epoch)
            e.snapshot_offset = offset
            self._snapshot(rec.key, partition, e)
        elif isinstance(rec, UpdateRecord):
            stats.updates += 1
            e = memory.entries.get(rec.key)
            if e is not None and e.partition != partition:
                e = self._others.get((rec.key, partition))  # of a copy left over (see __init__)
            if e is None:
                self.skip(partition, offset, f"ShareUpdate for {rec.key} without a ShareSnapshot before it")
                return
            if rec.snapshot_epoch != e.snapshot_epoch % 65536:
                self.skip(
                    partition,
                    offset,
                    f"ShareUpdate for {rec.key} with snapshot epoch {rec.snapshot_epoch}, "
                    f"latest snapshot has {e.snapshot_epoch}",
                )
                return
            try:
                e.apply(rec.update)
            except ValueError as exc:
                self.skip(partition, offset, exc)
                return
            e.updates += 1
            e.update_bytes += len(value or b"")
        elif isinstance(rec, GroupValueRecord):
            stats.group_records += 1
            g = GroupEntry(rec.record, partition)
            g.offset = offset
            memory.groups[rec.record.group_id] = g
        elif isinstance(rec, ShareTombstone):
            stats.tombstones += 1
            self._tombstone(rec.key, partition)
        elif isinstance(rec, GroupTombstone):
            stats.tombstones += 1
            memory.groups.pop(rec.group_id, None)

    def _claim(self, partition: int, offset: int, key: bytes, value: bytes | None) -> None:
        try:
            claim = decode_claim(key, value)
        except ValueError as exc:
            self.skip(partition, offset, exc)
            return
        self.stats.claims += 1
        if not self.guard.claim(claim):
            log.warning("state topic %s partition %d offset %d: claimed with a new producer id (%d); the claim "
                        "record keeps an earlier owner's later writes out of the state", self.topic, partition,
                        offset, claim.producer_id)

    def _fenced_out(self, partition: int, offset: int, leader_epoch: int) -> None:
        """Only where the broker's fencing did not hold (docs/design/scale-out.md, Fencing)."""
        self.stats.fenced_out += 1
        log.warning("state topic %s partition %d offset %d: record of ownership epoch %d after a claim of epoch %d "
                    "ignored (written by a proxy that had lost the partition)", self.topic, partition, offset,
                    leader_epoch, self.guard.claims[partition].ownership_epoch)


async def load(
    memory: InMemoryState,
    *,
    bootstrap_servers: list[str],
    topic: str,
    client_id: str,
    request_timeout_s: float,
    consumer_config: dict[str, Any],
    short_end_offsets: bool = False,
    empty: bool = False,
    partitions: Sequence[int] | None = None,
) -> LoadStats:
    """Replay the topic into ``memory`` (replacing what it held), or, for an instance group, the
    claimed ``partitions``: their committed records only, added to what it holds.

    ``empty``: the topic was just created, there is nothing to read. ``short_end_offsets``: the
    cluster's end offsets may fall inside a partition's last batch (upstream_checks), whose rest
    is read too.
    """
    from aiokafka import AIOKafkaConsumer, TopicPartition

    t0 = time.monotonic()
    stats = LoadStats()
    if partitions is None:
        memory.clear()
    if empty:  # just created: nothing to replay
        for p in range(memory.partitions):
            memory.log_start[p] = memory.log_end[p] = 0
        log.info("state topic %s is new: nothing to load", topic)
        return stats
    conf: dict[str, Any] = {
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "max_partition_fetch_bytes": 8 * 1024 * 1024,
        "fetch_max_bytes": 64 * 1024 * 1024,
        "request_timeout_ms": max(40_000, int(request_timeout_s * 1000)),
    }
    if partitions is not None:
        # transactional writes: what an aborted (fenced) transaction left is not state
        conf["isolation_level"] = "read_committed"
    conf.update(consumer_config)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap_servers, group_id=None, client_id=f"{client_id}-load",
                                **conf)
    await consumer.start()
    replay = RecordReplay(memory, stats, topic)
    # Replay allocates millions of small tuples that all stay alive: the cyclic collector
    # would walk them again and again (about a third of the load's CPU time). Off meanwhile.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        tps = [TopicPartition(topic, p) for p in (range(memory.partitions) if partitions is None else partitions)]
        consumer.assign(tps)
        begin = await consumer.beginning_offsets(tps)
        end = await consumer.end_offsets(tps)
        for tp in tps:
            memory.log_start[tp.partition] = begin[tp]
            memory.log_end[tp.partition] = end[tp]
        remaining = {tp for tp in tps if end[tp] > begin[tp]}
        for tp in tps:
            if tp in remaining:
                consumer.seek(tp, begin[tp])
            else:
                consumer.pause(tp)
        while remaining:
            batch = await consumer.getmany(*remaining, timeout_ms=500, max_records=100_000)
            for tp, records in batch.items():
                p = tp.partition
                for r in records:
                    if r.offset >= end[tp]:
                        if not short_end_offsets:
                            break
                        # the cluster's end offset falls inside its last batch (upstream_checks):
                        # the rest of that batch was there all along
                        end[tp] = memory.log_end[p] = r.offset + 1
                    stats.records += 1
                    stats.bytes += (r.serialized_key_size if r.serialized_key_size > 0 else 0) + (
                        r.serialized_value_size if r.serialized_value_size > 0 else 0
                    )
                    replay.apply(p, r.offset, r.key, r.value)
            for tp in list(remaining):
                if await consumer.position(tp) >= end[tp]:
                    remaining.discard(tp)
                    consumer.pause(tp)
    finally:
        if gc_was_enabled:
            gc.enable()
        await consumer.stop()
    stats.share_partitions = len(memory.entries)
    stats.groups = len(memory.groups)
    stats.seconds = time.monotonic() - t0
    log.info(
        "state topic %s%s loaded in %.2f s: %d share-partitions, %d groups from %d records (%d bytes), %d skipped",
        topic,
        "" if partitions is None else f" partitions {list(partitions)}",
        stats.seconds,
        stats.share_partitions,
        stats.groups,
        stats.records,
        stats.bytes,
        stats.skipped,
    )
    return stats


__all__ = ["LoadStats", "RecordReplay", "load"]
