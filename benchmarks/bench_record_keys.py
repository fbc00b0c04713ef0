"""CPU cost of reading record keys out of fetched batches (kshare.share.record_keys), run by hand.

    /tmp/ci1/.venv/bin/python benchmarks/bench_record_keys.py [--seconds 0.5] [--repeats 3] [--batches 4]

For each codec (none, gzip, snappy, lz4, zstd) and value size (100 B and 1 KiB; 16-byte keys, a
few headers-free records of ~1 MB uncompressed per batch, built by aiokafka's
DefaultRecordBatchBuilder with the compression a producer would use), it times ``batch_keys`` over
``--batches`` batches with ``time.process_time`` (CPU seconds; the minimum of ``--repeats`` runs of
about ``--seconds`` each) and prints a markdown table:

* ms/MB and MB/s per MB of batch bytes as fetched (compressed), and per MB of records (uncompressed);
* decompression's share: cramjam's decompress alone over the same batches;
* µs per record;
* the ratio to ``split_batches`` over the same bytes (what reading batch headers costs today).

A second table is the per-key cost of the hash candidates for a 16-byte key.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import time
import timeit
import zlib
from collections.abc import Callable
from pathlib import Path

import cramjam
from aiokafka.record.default_records import DefaultRecordBatchBuilder

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kshare.share.record_keys import batch_keys  # noqa: E402
from kshare.share.records import HEADER_SIZE, split_batches  # noqa: E402

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
BATCH_BYTES = 1 << 20
WORDS = [b"order", b"customer", b"amount", b"status", b"shipped", b"pending", b"eur", b"usd", b"item", b"sku"]


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
            raise SystemExit(f"the builder did not compress with codec {codec}")
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
    def snappy(payload: memoryview) -> object:  # xerial framing, as aiokafka (and Java) write it
        pos, blocks = 16, []
        while pos < len(payload):
            size = int.from_bytes(payload[pos:pos + 4], "big")
            blocks.append(cramjam.snappy.decompress_raw(payload[pos + 4:pos + 4 + size]))
            pos += 4 + size
        return blocks

    return {1: cramjam.gzip.decompress, 2: snappy, 3: cramjam.lz4.decompress, 4: cramjam.zstd.decompress}[codec]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=0.5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batches", type=int, default=4)
    args = parser.parse_args()

    print(f"Python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs, "
          f"cramjam {cramjam.__version__}; {args.batches} batches of ~1 MB of records each; CPU time "
          f"(process_time), best of {args.repeats}\n")
    print("| codec | value | records/batch | batch MB (fetched) | ms/MB fetched | MB/s fetched "
          "| ms/MB records | MB/s records | decompress share | µs/record | × split_batches |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for value_size in (100, 1024):
        for name, codec in CODECS.items():
            data, records, raw = build_batches(codec, value_size, args.batches)
            view = memoryview(data)
            spans = [(b.start, b.end) for b in split_batches(view)]
            assert len(spans) == args.batches

            def keys(view: memoryview = view, spans: list[tuple[int, int]] = spans) -> None:
                for start, end in spans:
                    batch_keys(view[start:end])

            def headers(view: memoryview = view) -> None:
                split_batches(view)

            t_keys = cpu_time(keys, args.seconds, args.repeats)
            t_split = cpu_time(headers, args.seconds / 5, args.repeats)
            decompress_share = "-"
            if codec:
                dec = decompressor(codec)

                def inflate(view: memoryview = view, spans: list[tuple[int, int]] = spans,
                            dec: Callable[[memoryview], object] = dec) -> None:
                    for start, end in spans:
                        dec(view[start + HEADER_SIZE:end])

                decompress_share = f"{cpu_time(inflate, args.seconds, args.repeats) / t_keys:.0%}"
            mb, raw_mb = len(data) / 1e6, raw / 1e6
            print(f"| {name} | {value_size} B | {records // args.batches} | {mb / args.batches:.2f} "
                  f"| {t_keys * 1e3 / mb:.2f} | {mb / t_keys:.0f} | {t_keys * 1e3 / raw_mb:.2f} "
                  f"| {raw_mb / t_keys:.0f} | {decompress_share} | {t_keys * 1e6 / records:.2f} "
                  f"| {t_keys / t_split:,.0f} |")
            sys.stdout.flush()

    print("\nKey identity candidates, one 16-byte key sliced out of a buffer (ns per key, best of 3):\n")
    print("| hash | ns/key |")
    print("|---|---:|")
    env = {"data": os.urandom(64), "p": 7, "crc": zlib.crc32, "adler": zlib.adler32,
           "blake2b": __import__("hashlib").blake2b, "from_bytes": int.from_bytes}
    for label, stmt in [
        ("slice only: `data[p:p+16]`", "data[p:p + 16]"),
        ("crc32, length above bit 32 (chosen)", "crc(data[p:p + 16]) | (16 << 32)"),
        ("crc32 << 31 xor adler32", "k = data[p:p + 16]; (crc(k) << 31) ^ adler(k)"),
        ("blake2b, 8-byte digest", "from_bytes(blake2b(data[p:p + 16], digest_size=8).digest(), 'big')"),
        ("hash() (salted per process: unusable)", "hash(data[p:p + 16])"),
    ]:
        n = 300_000
        best = min(timeit.repeat(stmt, globals=env, number=n, repeat=3)) / n
        print(f"| {label} | {best * 1e9:.0f} |")


if __name__ == "__main__":
    main()
