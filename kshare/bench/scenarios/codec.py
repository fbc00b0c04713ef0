"""The ``codec`` scenario of ``kshare bench`` (no broker): kshare's generated codec against kafka-python
3's JSON-spec engine, in the same run.

Both engines read Kafka's JSON message specs and compile per-version Python functions; kafka-python 3
ships its own copy of Apache's specs and classes such as ``kafka.protocol.consumer.FetchResponse``
(``FetchResponse.decode(data, version=v)`` and ``message.encode()``). Messages:

* FetchRequest v12, 5 topics x 3 partitions;
* FetchResponse v13, 200 partitions (10 topics x 20), each with a real ~3.8 KiB v2 record batch
  (12 records of 300-byte values, built with kafka-python's MemoryRecordsBuilder);
* FetchResponse v16, the same plus a tagged CurrentLeader per partition and tagged NodeEndpoints
  (what a broker sends after a leader change);
* MetadataResponse v12, 3 brokers, 50 topics x 10 partitions (3 replicas, 3 ISR each);
* ShareFetchRequest v1, 5 topics x 3 partitions, each with 3 acknowledgement batches;
* ShareFetchResponse v1, 10 partitions, 16 KiB of records and 2 acquired ranges each
  (kafka-python 3 has no share-group APIs: kshare's only).

Every message is first encoded by kshare; kafka-python decodes those bytes and must re-encode them byte
for byte (checked) before anything is timed. Each operation runs in a ``time.perf_counter`` loop sized to
about ``seconds`` after a warm-up, ``repeats`` times, the engines alternated; the table shows the median
operations per second and kshare / kafka-python. "decode" is bytes -> message objects, "encode" is message
objects -> bytes. Then the decode time per partition of FetchResponse v16 (tagged CurrentLeader on every
partition) from 50 to 800 partitions: kafka-python copies the rest of the buffer into a BytesIO for every
struct that has tagged fields, so its time per partition grows with the message.

(Was ``benchmarks/bench_codec.py``.)
"""

from __future__ import annotations

import gc
import importlib
import random
import statistics
import time
import warnings
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from ...protocol.codegen import codec_for
from ...protocol.messages import message_class
from ...protocol.spec import load_spec
from ..format import fmt_num, table
from .common import results, scenario

if TYPE_CHECKING:
    from ..runner import Env, Progress

SIZES = (
    {"seconds": 0.2, "scaling_partitions_per_topic": [5, 10, 20, 40, 80]},
    {"seconds": 0.02, "scaling_partitions_per_topic": [5, 20]},
)

RNG = random.Random(932)


def uuid_bytes() -> bytes:
    return RNG.randbytes(16)


def record_batch(values: int, value_size: int, base_offset: int) -> bytes:
    """A real magic-v2 record batch, uncompressed."""
    from kafka.record.memory_records import MemoryRecordsBuilder

    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 24)
    for i in range(values):
        builder.append(
            timestamp=1_700_000_000_000 + i, key=b"key-%d" % i, value=RNG.randbytes(value_size), headers=[]
        )
    builder.close()
    batch = bytearray(builder.buffer())
    batch[0:8] = base_offset.to_bytes(8, "big")
    return bytes(batch)


# -- messages -------------------------------------------------------------------------------------


def fetch_request_v12():
    C = message_class("FetchRequest")
    return C(
        replica_id=-1,
        max_wait_ms=500,
        min_bytes=1,
        max_bytes=52_428_800,
        isolation_level=1,
        session_id=0,
        session_epoch=-1,
        topics=[
            C.FetchTopic(
                topic=f"orders-{t}",
                partitions=[
                    C.FetchPartition(
                        partition=p,
                        current_leader_epoch=7,
                        fetch_offset=1_000_000 + p,
                        last_fetched_epoch=6,
                        log_start_offset=-1,
                        partition_max_bytes=1_048_576,
                    )
                    for p in range(3)
                ],
            )
            for t in range(5)
        ],
        forgotten_topics_data=[],
        rack_id="",
    )


def fetch_response(version: int, *, leader_hints: bool, partitions_per_topic: int = 20):
    C = message_class("FetchResponse")
    batches = [record_batch(12, 300, 1_000 * i) for i in range(8)]  # ~3.8 KiB each, reused
    topics = []
    for t in range(10):
        parts = []
        for p in range(partitions_per_topic):
            part = C.PartitionData(
                partition_index=p,
                error_code=0,
                high_watermark=5_000_000 + p,
                last_stable_offset=5_000_000 + p,
                log_start_offset=0,
                aborted_transactions=[],
                preferred_read_replica=-1,
                records=batches[(t * partitions_per_topic + p) % len(batches)],
            )
            if leader_hints:
                part.current_leader = C.LeaderIdAndEpoch(leader_id=p % 3, leader_epoch=12)
            parts.append(part)
        topics.append(C.FetchableTopicResponse(topic=f"orders-{t}", topic_id=uuid_bytes(), partitions=parts))
    msg = C(throttle_time_ms=0, error_code=0, session_id=1234, responses=topics)
    if leader_hints:
        msg.node_endpoints = [
            C.NodeEndpoint(node_id=i, host=f"broker-{i}.kafka.svc", port=9092, rack=f"rack-{i}")
            for i in range(3)
        ]
    return msg


def metadata_response_v12():
    C = message_class("MetadataResponse")
    return C(
        throttle_time_ms=0,
        brokers=[
            C.MetadataResponseBroker(node_id=i, host=f"broker-{i}.kafka.svc", port=9092, rack=None)
            for i in range(3)
        ],
        cluster_id="q9bS7Q3kR2yXk1i1l8Xz0w",
        controller_id=0,
        topics=[
            C.MetadataResponseTopic(
                error_code=0,
                name=f"orders-{t}",
                topic_id=uuid_bytes(),
                is_internal=False,
                partitions=[
                    C.MetadataResponsePartition(
                        error_code=0,
                        partition_index=p,
                        leader_id=p % 3,
                        leader_epoch=12,
                        replica_nodes=[p % 3, (p + 1) % 3, (p + 2) % 3],
                        isr_nodes=[p % 3, (p + 1) % 3, (p + 2) % 3],
                        offline_replicas=[],
                    )
                    for p in range(10)
                ],
                topic_authorized_operations=-2147483648,
            )
            for t in range(50)
        ],
    )


def share_topics(topic: Any, partition: Any, topics: int, partitions: int,
                 fields: Callable[[int], dict[str, Any]]) -> list[Any]:
    """``topics`` topics of a share-group message (by id) with ``partitions`` partitions each, partition ``p``
    with ``fields(p)``."""
    return [topic(topic_id=uuid_bytes(), partitions=[partition(partition_index=p, **fields(p))
                                                     for p in range(partitions)])
            for _ in range(topics)]


def share_fetch_request_v1():
    C = message_class("ShareFetchRequest")
    return C(
        group_id="billing",
        member_id="kNqj0b3bQ6uXcV3m0h2b4g",
        share_session_epoch=3,
        max_wait_ms=500,
        min_bytes=1,
        max_bytes=52_428_800,
        max_records=500,
        batch_size=500,
        topics=share_topics(
            C.FetchTopic, C.FetchPartition, 5, 3,
            lambda p: {"acknowledgement_batches": [
                C.AcknowledgementBatch(first_offset=b * 500, last_offset=b * 500 + 499, acknowledge_types=[1])
                for b in range(3)
            ]},
        ),
        forgotten_topics_data=[],
    )


def share_fetch_response_v1():
    C = message_class("ShareFetchResponse")
    records = record_batch(52, 300, 0)[:16_384]  # 16 KiB of records per partition
    return C(
        throttle_time_ms=0,
        error_code=0,
        acquisition_lock_timeout_ms=30_000,
        responses=share_topics(
            C.ShareFetchableTopicResponse, C.PartitionData, 2, 5,
            lambda p: {"current_leader": C.LeaderIdAndEpoch(leader_id=p % 3, leader_epoch=12), "records": records,
                       "acquired_records": [
                           C.AcquiredRecords(first_offset=0, last_offset=29, delivery_count=1),
                           C.AcquiredRecords(first_offset=30, last_offset=51, delivery_count=2),
                       ]},
        ),
        node_endpoints=[C.NodeEndpoint(node_id=i, host=f"broker-{i}.kafka.svc", port=9092) for i in range(3)],
    )


# (label, spec name, version, builder, kafka-python class path or None)
CASES = [
    ("FetchRequest v12 (5x3 partitions)", "FetchRequest", 12, fetch_request_v12, "consumer.FetchRequest"),
    (
        "FetchResponse v13 (200 partitions, 3.8 KiB records each)",
        "FetchResponse",
        13,
        lambda: fetch_response(13, leader_hints=False),
        "consumer.FetchResponse",
    ),
    (
        "FetchResponse v16 (same + tagged CurrentLeader, NodeEndpoints)",
        "FetchResponse",
        16,
        lambda: fetch_response(16, leader_hints=True),
        "consumer.FetchResponse",
    ),
    (
        "MetadataResponse v12 (50 topics x 10 partitions)",
        "MetadataResponse",
        12,
        metadata_response_v12,
        "metadata.MetadataResponse",
    ),
    (
        "ShareFetchRequest v1 (5x3 partitions, 3 ack batches each)",
        "ShareFetchRequest",
        1,
        share_fetch_request_v1,
        None,
    ),
    (
        "ShareFetchResponse v1 (10 partitions, 16 KiB records each)",
        "ShareFetchResponse",
        1,
        share_fetch_response_v1,
        None,
    ),
]


# -- timing ---------------------------------------------------------------------------------------


def measure(fns: dict[str, Callable[[], object]], seconds: float, repeats: int) -> dict[str, float]:
    """Operations per second of each function: the median over ``repeats`` perf_counter loops sized
    to about ``seconds``, after a warm-up. The engines' loops alternate (A B A B ...) so that both
    see the same machine load."""
    loops = {}
    for name, fn in fns.items():
        for _ in range(3):  # warm-up
            fn()
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds / 4:
            fn()
            n += 1
        loops[name] = max(1, n * 4)
    results: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            gc.collect()
            count = loops[name]
            start = time.perf_counter()
            for _ in range(count):
                fn()
            results[name].append(count / (time.perf_counter() - start))
    return {name: statistics.median(r) for name, r in results.items()}


def kafka_python_class(path: str) -> type:
    module, name = path.rsplit(".", 1)
    return getattr(importlib.import_module(f"kafka.protocol.{module}"), name)


def scaling(per_topic_counts: list[int], seconds: float, repeats: int) -> list[dict[str, Any]]:
    """Decode time per partition of FetchResponse v16 with a tagged CurrentLeader on every partition, as
    the message grows (10 topics x ``per_topic`` partitions)."""
    from kafka.protocol.consumer import FetchResponse

    codec = codec_for(load_spec("FetchResponse"), 16)
    rows = []
    for per_topic in per_topic_counts:
        data = bytes(codec.encode(fetch_response(16, leader_hints=True, partitions_per_topic=per_topic)))
        if FetchResponse.decode(data, version=16).encode() != data:
            raise RuntimeError("kafka-python does not re-encode FetchResponse v16 byte for byte")
        r = measure(
            {"kshare": partial(codec.decode, data), "kafka_python": partial(FetchResponse.decode, data, version=16)},
            seconds,
            repeats,
        )
        n = 10 * per_topic
        rows.append({"partitions": n, "bytes": len(data), "kshare_us_per_partition": 1e6 / r["kshare"] / n,
                     "kafka_python_us_per_partition": 1e6 / r["kafka_python"] / n})
    return rows


def run(env: Env | None, progress: Progress, *, seconds: float, scaling_partitions_per_topic: list[int],
        repeats: int = 5) -> dict[str, Any]:
    import kafka
    import msgspec

    warnings.filterwarnings("ignore", category=DeprecationWarning, module="kafka")  # its importlib.resources use
    progress.begin("codec", len(CASES) + 1)
    rows = []
    for label, spec_name, version, build, kp_path in CASES:
        codec = codec_for(load_spec(spec_name), version)
        data = bytes(codec.encode(build()))
        decoded, end = codec.decode(data)
        if end != len(data) or bytes(codec.encode(decoded)) != data:
            raise RuntimeError(f"kshare does not re-encode {label} byte for byte")
        fns = {"kshare_dec": partial(codec.decode, data), "kshare_enc": partial(codec.encode, decoded)}
        if kp_path is not None:
            kp_cls = kafka_python_class(kp_path)
            kp_msg = kp_cls.decode(data, version=version)
            if kp_msg.encode() != data:
                raise RuntimeError(f"kafka-python does not re-encode {label} byte for byte")
            fns["kp_dec"] = partial(kp_cls.decode, data, version=version)
            fns["kp_enc"] = kp_msg.encode
        r = measure(fns, seconds, repeats)
        row = {"message": label, "bytes": len(data), "kshare_decode_per_s": r["kshare_dec"],
               "kafka_python_decode_per_s": r.get("kp_dec"), "kshare_encode_per_s": r["kshare_enc"],
               "kafka_python_encode_per_s": r.get("kp_enc")}
        row["decode_vs_kafka_python"] = r["kshare_dec"] / r["kp_dec"] if "kp_dec" in r else None
        row["encode_vs_kafka_python"] = r["kshare_enc"] / r["kp_enc"] if "kp_enc" in r else None
        rows.append(row)
        progress.step(f"{label}: decode {r['kshare_dec']:,.0f}/s")
    grows = scaling(scaling_partitions_per_topic, seconds, repeats)
    progress.step("FetchResponse v16 decode per partition")
    progress.end()
    return results(
        {"seconds": seconds, "repeats": repeats, "msgspec": msgspec.__version__,
         "kafka_python": kafka.__version__},
        rows,
        scaling=grows,
    )


def _ops(v: float | None) -> str:
    if v is None:
        return "n/a"
    return fmt_num(v) if v >= 100 else fmt_num(v, 1)


def section(res: dict[str, Any]) -> list[str]:
    cfg = res.get("config", {})
    out = [
        f"Operations per second, median of {cfg.get('repeats', '?')} loops of ~{cfg.get('seconds', '?')} s; "
        f"kafka-python {cfg.get('kafka_python', '?')}, msgspec {cfg.get('msgspec', '?')}.",
        "",
    ]
    out += table(
        ["message", "bytes", "decode/s kshare", "decode/s kafka-python", "x", "encode/s kshare",
         "encode/s kafka-python", "x"],
        [[r["message"], fmt_num(r["bytes"]), _ops(r["kshare_decode_per_s"]), _ops(r["kafka_python_decode_per_s"]),
          "" if r["decode_vs_kafka_python"] is None else fmt_num(r["decode_vs_kafka_python"], 1),
          _ops(r["kshare_encode_per_s"]), _ops(r["kafka_python_encode_per_s"]),
          "" if r["encode_vs_kafka_python"] is None else fmt_num(r["encode_vs_kafka_python"], 1)]
         for r in res.get("rows", [])],
    )
    out += ["", "FetchResponse v16 (tagged CurrentLeader on every partition), decode time per partition:", ""]
    out += table(
        ["partitions", "bytes", "kshare us/partition", "kafka-python us/partition"],
        [[fmt_num(r["partitions"]), fmt_num(r["bytes"]), fmt_num(r["kshare_us_per_partition"], 1),
          fmt_num(r["kafka_python_us_per_partition"], 1)] for r in res.get("scaling", [])],
        "rrrr",
    )
    return out + [""]


SCENARIO = scenario(
    __name__, "kshare's protocol codec vs kafka-python 3's: messages decoded and encoded per second",
    needs=frozenset(), opt_in=True, default_repeats=5,
)
