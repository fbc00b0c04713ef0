"""The ``record_keys`` scenario of ``kshare bench`` (no broker): the CPU cost of reading record keys out
of fetched batches (:func:`kshare.share.record_keys.batch_keys`, what key-ordered share groups do).

For each codec (none, gzip, snappy, lz4, zstd) and value size (100 B and 1 KiB; 16-byte keys, headers-free
records of ~1 MB uncompressed per batch, built by aiokafka's ``DefaultRecordBatchBuilder`` with the
compression a producer would use), ``batch_keys`` over ``batches`` batches, timed with
``time.process_time`` (CPU seconds; the minimum of ``repeats`` loops of about ``seconds`` each):
ms/MB and MB/s per MB of batch bytes as fetched (compressed) and per MB of records (uncompressed); the
share of cramjam's decompression alone over the same batches; us per record; and the ratio to
``split_batches`` over the same bytes (what reading the batch headers costs), in the same run.

A second table is the per-key cost of the key-identity hash candidates for a 16-byte key, the chosen
one (crc32 with the length above bit 32) against the others.

(Was ``benchmarks/bench_record_keys.py``.)
"""

from __future__ import annotations

import hashlib
import os
import random
import time
import timeit
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...share.record_keys import batch_keys
from ...share.records import HEADER_SIZE, split_batches
from ..format import fmt_num, fmt_size, table
from .common import results, scenario

if TYPE_CHECKING:
    from ..runner import Env, Progress

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
BATCH_BYTES = 1 << 20
WORDS = [b"order", b"customer", b"amount", b"status", b"shipped", b"pending", b"eur", b"usd", b"item", b"sku"]
HASHES = [
    ("slice only: `data[p:p+16]`", "data[p:p + 16]"),
    ("crc32, length above bit 32 (chosen)", "crc(data[p:p + 16]) | (16 << 32)"),
    ("crc32 << 31 xor adler32", "k = data[p:p + 16]; (crc(k) << 31) ^ adler(k)"),
    ("blake2b, 8-byte digest", "from_bytes(blake2b(data[p:p + 16], digest_size=8).digest(), 'big')"),
    ("hash() (salted per process: unusable)", "hash(data[p:p + 16])"),
]
SIZES = (
    {"seconds": 0.5, "batches": 4, "value_sizes": [100, 1024], "hash_keys": 300_000},
    {"seconds": 0.05, "batches": 1, "value_sizes": [100, 1024], "hash_keys": 30_000},
)


def make_value(rng: random.Random, size: int) -> bytes:
    """JSON-ish text with random numbers: compresses about as well as real payloads (2-4x)."""
    parts: list[bytes] = []
    n = 0
    while n < size:
        part = b'"%s":%d,' % (rng.choice(WORDS), rng.randrange(10**9))
        parts.append(part)
        n += len(part)
    return b"".join(parts)[:size]


def build_batches(codec: int, value_size: int, batches: int, seed: int = 1) -> tuple[bytes, int, int]:
    """``batches`` batches of ~1 MB of records each, concatenated; and the record and uncompressed
    byte counts."""
    from aiokafka.record.default_records import DefaultRecordBatchBuilder

    rng = random.Random(seed)
    keys = [rng.randbytes(16) for _ in range(5000)]
    out = bytearray()
    records = raw = 0
    offset = 0
    for _ in range(batches):
        builder = DefaultRecordBatchBuilder(2, codec, 0, -1, -1, -1, BATCH_BYTES)
        delta = 0
        while True:
            value = make_value(rng, value_size)
            if builder.append(delta, 1_700_000_000_000 + delta, rng.choice(keys), value, []) is None:
                break
            delta += 1
        raw += builder.size() - HEADER_SIZE
        batch = bytearray(builder.build())
        if codec and batch[22] & 0x07 != codec:
            raise RuntimeError(f"the builder did not compress with codec {codec}")
        batch[0:8] = offset.to_bytes(8, "big")
        offset += delta
        records += delta
        out += batch
    return bytes(out), records, raw


def cpu_time(fn: Callable[[], object], seconds: float, repeats: int) -> float:
    """CPU seconds of one call: the minimum over ``repeats`` runs of a loop of about ``seconds``."""
    fn()
    start = time.process_time()
    fn()
    once = max(time.process_time() - start, 1e-6)
    loops = max(1, int(seconds / once))
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        for _ in range(loops):
            fn()
        best = min(best, (time.process_time() - start) / loops)
    return best


def decompressor(codec: int) -> Callable[[memoryview], object]:
    import cramjam

    def snappy(payload: memoryview) -> object:  # xerial framing, as aiokafka (and Java) write it
        pos, blocks = 16, []
        while pos < len(payload):
            size = int.from_bytes(payload[pos:pos + 4], "big")
            blocks.append(cramjam.snappy.decompress_raw(payload[pos + 4:pos + 4 + size]))
            pos += 4 + size
        return blocks

    return {1: cramjam.gzip.decompress, 2: snappy, 3: cramjam.lz4.decompress, 4: cramjam.zstd.decompress}[codec]


def measure(codec_name: str, value_size: int, batches: int, seconds: float, repeats: int) -> dict[str, Any]:
    codec = CODECS[codec_name]
    data, records, raw = build_batches(codec, value_size, batches)
    view = memoryview(data)
    spans = [(b.start, b.end) for b in split_batches(view)]
    if len(spans) != batches:
        raise RuntimeError(f"{len(spans)} batches read back, {batches} built")

    def keys() -> None:
        for start, end in spans:
            batch_keys(view[start:end])

    def headers() -> None:
        split_batches(view)

    t_keys = cpu_time(keys, seconds, repeats)
    t_split = cpu_time(headers, seconds / 5, repeats)
    decompress_share = None
    if codec:
        dec = decompressor(codec)

        def inflate() -> None:
            for start, end in spans:
                dec(view[start + HEADER_SIZE:end])

        decompress_share = cpu_time(inflate, seconds, repeats) / t_keys
    mb, raw_mb = len(data) / 1e6, raw / 1e6
    return {
        "codec": codec_name,
        "value_size": value_size,
        "records_per_batch": records // batches,
        "batch_mb": mb / batches,
        "ms_per_mb_fetched": t_keys * 1e3 / mb,
        "mb_per_s_fetched": mb / t_keys,
        "ms_per_mb_records": t_keys * 1e3 / raw_mb,
        "mb_per_s_records": raw_mb / t_keys,
        "decompress_share": decompress_share,
        "us_per_record": t_keys * 1e6 / records,
        "vs_split_batches": t_keys / t_split,
    }


def hash_costs(keys: int) -> list[dict[str, Any]]:
    """ns per key of each hash candidate, best of 3 loops of ``keys`` keys."""
    env = {"data": os.urandom(64), "p": 7, "crc": zlib.crc32, "adler": zlib.adler32,
           "blake2b": hashlib.blake2b, "from_bytes": int.from_bytes}
    return [{"hash": label, "ns_per_key": min(timeit.repeat(stmt, globals=env, number=keys, repeat=3)) / keys * 1e9}
            for label, stmt in HASHES]


def run(env: Env | None, progress: Progress, *, seconds: float, batches: int, value_sizes: list[int],
        hash_keys: int, repeats: int = 3) -> dict[str, Any]:
    progress.begin("record_keys", len(value_sizes) * len(CODECS) + 1)
    rows = []
    for value_size in value_sizes:
        for name in CODECS:
            row = measure(name, value_size, batches, seconds, repeats)
            rows.append(row)
            progress.step(f"{name} {fmt_size(value_size)}: {row['us_per_record']:.2f} us/record")
    hashes = hash_costs(hash_keys)
    progress.step("hash candidates")
    progress.end()
    return results(
        {"seconds": seconds, "batches": batches, "repeats": repeats, "batch_bytes": BATCH_BYTES},
        rows,
        hashes=hashes,
    )


def section(res: dict[str, Any]) -> list[str]:
    cfg = res.get("config", {})
    out = [
        f"`batch_keys` over {cfg.get('batches', '?')} batch(es) of ~1 MB of records each; CPU time "
        f"(process_time), best of {cfg.get('repeats', '?')}. \"x split_batches\": the same bytes' batch headers "
        "read alone.",
        "",
    ]
    out += table(
        ["codec", "value", "records/batch", "batch MB (fetched)", "ms/MB fetched", "MB/s fetched", "ms/MB records",
         "MB/s records", "decompress share", "us/record", "x split_batches"],
        [[r["codec"], fmt_size(r["value_size"]), fmt_num(r["records_per_batch"]), fmt_num(r["batch_mb"], 2),
          fmt_num(r["ms_per_mb_fetched"], 2), fmt_num(r["mb_per_s_fetched"]), fmt_num(r["ms_per_mb_records"], 2),
          fmt_num(r["mb_per_s_records"]),
          "-" if r["decompress_share"] is None else f"{100 * r['decompress_share']:.0f}%",
          fmt_num(r["us_per_record"], 2), fmt_num(r["vs_split_batches"])] for r in res.get("rows", [])],
        "ll" + "r" * 9,
    )
    out += ["", "Key identity candidates, one 16-byte key sliced out of a buffer:", ""]
    out += table(["hash", "ns/key"], [[h["hash"], fmt_num(h["ns_per_key"])] for h in res.get("hashes", [])])
    return out + [""]


SCENARIO = scenario(
    __name__, "Record keys read out of fetched batches, per codec",
    needs=frozenset(), opt_in=True, max_repeats=3,
)
