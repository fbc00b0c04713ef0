"""The ``state_replay`` scenario of ``kshare bench`` (no broker): the state store's own CPU cost of
recovery, the state-topic records encoded and replayed in this process (no topic, no network: the
``state_store`` and ``durability`` scenarios read a real one).

``share_partitions`` share-partitions, each with ``inflight`` in-flight records in the worst shape (every
record its own state range: Available with delivery counts 1-4 alternating with Acknowledged/Archived, a
40 KB ShareSnapshot for 2,000 records), then ``updates`` ShareUpdate records per share-partition, each
changing 10 single-record ranges -- the topic content of the ``state_store`` scenario's recovery. Measured,
CPU time (``time.process_time``), best of ``repeats``:

* encode: the records' keys and values with :mod:`kshare.share.state.codec` (what the store serializes);
* replay: :class:`kshare.share.state.replay.RecordReplay` applying them in log order to a fresh in-memory
  state (decode + apply, what ``TopicStateStore.start()`` does after reading the topic), against decoding
  alone (``decode_record``) in the same run: the apply's share.

The state replayed is checked against the records' content (every share-partition, every range).
"""

from __future__ import annotations

import gc
import random
import time
import uuid
from typing import TYPE_CHECKING, Any

from ...share.state.codec import (
    RECORD_SNAPSHOT,
    RECORD_UPDATE,
    decode_record,
    encode_share_key,
    encode_snapshot_value,
    encode_update_value,
)
from ...share.state.memory import InMemoryState, WriteStats
from ...share.state.replay import LoadStats, RecordReplay
from ...share.states import ShareUpdate, StateBatch
from ...share.store import SharePartitionKey
from ..format import fmt_num, fmt_ratio, table
from .common import results, scenario
from .state_store import worst_case_snapshot

if TYPE_CHECKING:
    from ..runner import Env, Progress

PARTITIONS = 10  # of the state topic the records would go to
SIZES = (
    {"share_partitions": 1000, "inflight": 2000, "updates": 100},
    {"share_partitions": 50, "inflight": 2000, "updates": 10},
)


def records(share_partitions: int, inflight: int, updates: int, seed: int = 3) -> tuple[list, list]:
    """(snapshots, updates): the share-partitions' records as (partition, key, snapshot or update)."""
    rng = random.Random(seed)
    topic_id = uuid.UUID(int=rng.getrandbits(128)).bytes
    keys = [SharePartitionKey(f"bench-group-{i % 10}", topic_id, i) for i in range(share_partitions)]
    snaps = [(i % PARTITIONS, k, worst_case_snapshot(1000, inflight)) for i, k in enumerate(keys)]
    ups = []
    for _ in range(updates):
        for i, k in enumerate(keys):
            offs = sorted(rng.sample(range(1000, 1000 + inflight), 10))
            ups.append((i % PARTITIONS, k, ShareUpdate(-1, tuple(StateBatch(o, o, 0, 5 + rng.randrange(3))
                                                                  for o in offs))))
    return snaps, ups


def encode(snaps: list, ups: list) -> list[tuple[int, bytes, bytes]]:
    """(partition, key, value) of every record, snapshots first, as they would be on the topic."""
    out = [(p, encode_share_key(RECORD_SNAPSHOT, k), encode_snapshot_value(0, 0, 0, s)) for p, k, s in snaps]
    out += [(p, encode_share_key(RECORD_UPDATE, k), encode_update_value(0, 0, u)) for p, k, u in ups]
    return out


def replay(encoded: list[tuple[int, bytes, bytes]]) -> tuple[InMemoryState, LoadStats]:
    memory = InMemoryState(PARTITIONS, WriteStats())
    stats = LoadStats()
    apply = RecordReplay(memory, stats, "bench").apply
    for offset, (p, key, value) in enumerate(encoded):
        apply(p, offset, key, value)
    return memory, stats


def decode_only(encoded: list[tuple[int, bytes, bytes]]) -> None:
    for _, key, value in encoded:
        decode_record(key, value)


def best_cpu(fn: Any, repeats: int) -> tuple[float, Any]:
    best, result = float("inf"), None
    for _ in range(repeats):
        gc.collect()
        t0 = time.process_time()
        result = fn()
        best = min(best, time.process_time() - t0)
    return best, result


def run(env: Env | None, progress: Progress, *, share_partitions: int, inflight: int, updates: int,
        repeats: int = 3) -> dict[str, Any]:
    progress.begin("state_replay", 2 * 3)
    snaps, ups = records(share_partitions, inflight, updates)
    rows = []
    for content, recs in (("worst-case snapshots only", (snaps, [])),
                          (f"worst-case snapshots + {updates} updates each", (snaps, ups))):
        encode_s, encoded = best_cpu(lambda recs=recs: encode(*recs), repeats)
        progress.step(f"{content}: encoded in {encode_s:.2f} s CPU")
        decode_s, _ = best_cpu(lambda encoded=encoded: decode_only(encoded), repeats)
        progress.step(f"{content}: decoded in {decode_s:.2f} s CPU")
        replay_s, (memory, stats) = best_cpu(lambda encoded=encoded: replay(encoded), repeats)
        progress.step(f"{content}: replayed in {replay_s:.2f} s CPU")
        expected = {k: s for _, k, s in snaps}
        if stats.skipped or len(memory.entries) != share_partitions:
            raise RuntimeError(f"{content}: {stats.skipped} record(s) skipped, {len(memory.entries)} share-partitions")
        if not ups and any(memory.entries[k].state != s for k, s in expected.items()):
            raise RuntimeError(f"{content}: a replayed snapshot differs from the one written")
        n = len(encoded)
        rows.append({"content": content, "records": n, "mb": sum(len(k) + len(v) for _, k, v in encoded) / 1e6,
                     "ranges": sum(len(e.state.state_batches) for e in memory.entries.values()),
                     "encode_s": encode_s, "decode_s": decode_s, "replay_s": replay_s,
                     "replay_vs_decode": replay_s / decode_s if decode_s else float("nan"),
                     "replay_us_per_record": replay_s / n * 1e6})
    progress.end()
    return results(
        {"share_partitions": share_partitions, "inflight": inflight, "updates": updates, "repeats": repeats},
        rows,
    )


def section(res: dict[str, Any]) -> list[str]:
    cfg = res.get("config", {})
    out = [f"{fmt_num(cfg.get('share_partitions'))} share-partitions, {fmt_num(cfg.get('inflight'))} in-flight "
           "records each, every record its own state range (the worst case), encoded and replayed in memory; CPU "
           f"seconds, best of {cfg.get('repeats')}. *replay / decode*: decode + apply over decoding alone.", ""]
    out += table(
        ["records", "state records", "MB (key + value)", "state ranges rebuilt", "encode s", "decode s",
         "replay s", "replay / decode", "replay us/record"],
        [[r["content"], fmt_num(r["records"]), fmt_num(r["mb"], 1), fmt_num(r["ranges"]), fmt_num(r["encode_s"], 2),
          fmt_num(r["decode_s"], 2), fmt_num(r["replay_s"], 2), fmt_ratio(r["replay_vs_decode"]),
          fmt_num(r["replay_us_per_record"], 1)] for r in res.get("rows", [])],
    )
    return out + [""]


SCENARIO = scenario(
    __name__, "The state store's recovery in memory: state records encoded, decoded and replayed",
    needs=frozenset(), opt_in=True, max_repeats=3,
)
