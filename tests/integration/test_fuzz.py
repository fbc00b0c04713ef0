"""Fuzzing the proxy with malformed frames while good clients use it (issue 2, item 4).

At least ``KSHARE_FUZZ_FRAMES`` (10,000) frames, mostly valid requests from the codec mutated one
way each (bit flips, truncation, corrupted size prefixes and inner lengths, other api keys and
versions, appended bytes) plus plain garbage, are thrown at a ProxyThread in front of Apache
Kafka 3.9 by a few concurrent connections: many frames per connection while the proxy keeps it
open, a new connection when it (or the broker behind it, for frames that look valid enough to be
forwarded) closes it. Meanwhile a confluent-kafka producer and consumer and a Metadata loop work
through the same proxy.

Checked: the good clients see no error and read back every record they produced; each fuzz
connection's first (valid) request gets its own answer; requests pipelined ahead of a rejected
frame are answered before the close; the proxy logs at most one line per fuzz connection, one
WARNING per rejection, nothing at ERROR and nothing from asyncio (no exception in a callback, no
write to a closed transport); at the end no client connection or task is left behind, and a fresh
Metadata request succeeds.

The proxy's own frame handling is also fuzzed without a broker, by hypothesis (any bytes, cut
anywhere: tests/unit/test_frames_props.py, tests/unit/test_client_connection.py); this test adds
the broker's side and real clients.

The run is reproducible: ``KSHARE_FUZZ_SEED`` (default 932) seeds every choice (the timing of the
broker's answers still varies, so a failure may need the same seed a few times).

Where the connection is still at a frame boundary and a frame is one the proxy must refuse by itself
(a size out of bounds, an api key or version it can neither forward nor serve), the worker waits
for the close, and it must come: so those frames are all looked at, not lost behind an earlier
close. Other frames get a few milliseconds to draw a close before the next one follows.

Safety of the shared broker: frames name only a decoy topic and decoy groups; Metadata requests
name no topic at all and never allow auto-creation; the api keys a body is relabelled with exclude
everything that creates, deletes or alters anything; one mutation per frame. The test checks that
no topic appeared (and deletes any that did).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import random
import struct
import time
import uuid
from dataclasses import dataclass, field

import pytest

from kshare.clients.connection import KafkaConnection
from kshare.protocol import messages
from tests.harness.bad_input import (
    PROXY_LOGGER,
    GoodTraffic,
    MetadataLoop,
    hostport,
    unexpected_errors,
)
from tests.harness.proxies import ProxyThread

SEED = int(os.environ.get("KSHARE_FUZZ_SEED", "932"))
FRAMES = int(os.environ.get("KSHARE_FUZZ_FRAMES", "10000"))
WORKERS = 12
FIRST_REQUEST_CHECKS = 0.3  # the share of connections that start with a valid request and check its answer
MAX_FRAMES_PER_CONNECTION = 60
IDLE_WAIT = 0.005  # after each frame: how long to watch for a close before sending the next

pytestmark = pytest.mark.filterwarnings("ignore:.*is deprecated. Use files:DeprecationWarning")

# Keys a valid body may be relabelled with: nothing that creates, deletes or alters anything.
HARMLESS_KEYS = [0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 22, 29, 32, 35, 36, 60, 61, 65, 66, 75]
UNKNOWN_KEYS = [-32768, -1, 4, 5, 6, 7, 52, 62, 76, 9999, 32767]


# ------------------------------------------------------------------------------------------------
# the valid requests the mutations start from


def base_requests(
    decoy: str, decoy_id: bytes, upstream: dict[int, tuple[int, int]]
) -> list[tuple[int, int, object]]:
    """(api key, version, body) of well-formed requests, every version both codec and broker know."""
    from kafka.record.memory_records import MemoryRecordsBuilder

    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 16)
    for i in range(3):
        builder.append(timestamp=None, key=b"k%d" % i, value=b"fuzz-decoy-%d" % i, headers=[("h", b"v")])
    builder.close()
    records = bytes(builder.buffer())
    M = messages.message_class
    produce, fetch, offsets = M("ProduceRequest"), M("FetchRequest"), M("ListOffsetsRequest")
    metadata, configs = M("MetadataRequest"), M("DescribeConfigsRequest")
    bodies: dict[int, list[object]] = {
        0: [
            produce(
                transactional_id=None,
                acks=acks,
                timeout_ms=5000,
                topic_data=[
                    produce.TopicProduceData(
                        name=decoy, partition_data=[produce.PartitionProduceData(index=0, records=records)]
                    )
                ],
            )
            for acks in (-1, 1, 0)
        ],
        1: [
            fetch(
                replica_id=-1,
                max_wait_ms=50,
                min_bytes=1,
                max_bytes=65536,
                topics=[
                    fetch.FetchTopic(
                        topic=decoy,
                        topic_id=decoy_id,
                        partitions=[
                            fetch.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=4096)
                        ],
                    )
                ],
            )
        ],
        2: [
            offsets(
                replica_id=-1,
                topics=[
                    offsets.ListOffsetsTopic(
                        name=decoy, partitions=[offsets.ListOffsetsPartition(partition_index=0, timestamp=-1)]
                    )
                ],
            )
        ],
        # never naming a topic: a shortened name length makes Kafka read a name byte as
        # allow_auto_topic_creation (a first version of this test created a topic "fuz")
        3: [metadata(topics=topics, allow_auto_topic_creation=False) for topics in ([], None)],
        10: [M("FindCoordinatorRequest")(key="fuzz-decoy-group", coordinator_keys=["fuzz-decoy-group"])],
        15: [M("DescribeGroupsRequest")(groups=["fuzz-decoy-group"])],
        16: [M("ListGroupsRequest")()],
        18: [M("ApiVersionsRequest")(client_software_name="kshare-fuzz", client_software_version="1.0")],
        22: [M("InitProducerIdRequest")(transactional_id=None, transaction_timeout_ms=60000)],
        32: [configs(resources=[configs.DescribeConfigsResource(resource_type=2, resource_name=decoy)])],
        60: [M("DescribeClusterRequest")()],
    }
    out = []
    for key, variants in bodies.items():
        a = messages.api(key)
        lo, hi = upstream.get(key, (0, -1))
        lo = max(lo, a.min_version, 4 if key == 3 else 0, 3 if key == 0 else 0)  # Metadata < v4 auto-creates
        for version in range(lo, min(hi, a.max_version) + 1):
            for body in variants:
                out.append((key, version, body))
    return out


# ------------------------------------------------------------------------------------------------
# mutations


class Fuzzer:
    """Frames from a seeded ``random.Random``; ``next()`` -> (kind, frame bytes)."""

    def __init__(self, rng: random.Random, bases: list[tuple[int, int, object]]) -> None:
        self.rng = rng
        self.bases = bases
        # requests that get a response (not acks=0 Produce)
        self.answered = [b for b in bases if not (b[0] == 0 and b[2].acks == 0)]  # type: ignore[attr-defined]
        self._cache: dict[tuple[int, int, int], bytes] = {}

    def valid(self, corr: int | None = None, *, answered: bool = False) -> bytes:
        key, version, body = self.rng.choice(self.answered if answered else self.bases)
        return self.encode(key, version, body, self.rng.randrange(1 << 31) if corr is None else corr)

    def encode(self, key: int, version: int, body: object, corr: int) -> bytes:
        cache_key = (key, version, id(body))
        frame = self._cache.get(cache_key)
        if frame is None:
            frame = self._cache[cache_key] = bytes(messages.encode_request(key, version, 0, "fuzz", body))
        return frame[:8] + struct.pack(">i", corr) + frame[12:]

    def next(self) -> tuple[str, bytes]:
        rng = self.rng
        kind = rng.choices(
            ["bitflip", "truncate", "size", "inner-length", "relabel", "append", "garbage", "valid"],
            weights=[30, 12, 12, 10, 16, 6, 8, 6],
        )[0]
        frame = bytearray(self.valid())
        if kind == "bitflip":
            for _ in range(rng.choice((1, 1, 1, 2, 3))):
                i = rng.randrange(len(frame))
                frame[i] ^= 1 << rng.randrange(8)
        elif kind == "truncate":
            cut = rng.randrange(1, len(frame))
            if rng.random() < 0.5:  # size prefix says the whole frame: the rest is what comes next
                frame = frame[:cut]
            else:  # a consistent, shorter frame
                frame = frame[:cut] if cut < 4 else bytearray(struct.pack(">i", cut - 4)) + frame[4:cut]
        elif kind == "size":
            size = rng.choice(
                [
                    rng.randint(-(2**31), -1),
                    -1,
                    rng.randint(0, 11),
                    len(frame) - 4 + rng.randint(-8, 8),
                    rng.randint(100 * 1024 * 1024 + 1, 2**31 - 1),
                    rng.randint(0, 2**31 - 1),
                ]
            )
            struct.pack_into(">i", frame, 0, size)
        elif kind == "inner-length":
            # the client id length, or any 1-, 2- or 4-byte field after it, set to a chosen extreme
            if rng.random() < 0.4:
                struct.pack_into(">h", frame, 12, rng.choice([-32768, -2, 32767, rng.randint(0, 300)]))
            else:
                width = rng.choice((1, 2, 4))
                pos = rng.randrange(14, max(15, len(frame) - width))
                if pos + width <= len(frame):
                    extreme = {
                        1: [0, 0x7F, 0x80, 0xFF],
                        2: [0, 0x7FFF, 0x8000, 0xFFFF],
                        4: [0, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF],
                    }
                    frame[pos : pos + width] = rng.choice(extreme[width]).to_bytes(width, "big")
        elif kind == "relabel":
            if rng.random() < 0.5:
                key = rng.choice(HARMLESS_KEYS + UNKNOWN_KEYS)
                struct.pack_into(">h", frame, 4, key)
                if key == 3:  # a body read as Metadata v0-v3 would auto-create whatever it names
                    struct.pack_into(">h", frame, 6, max(4, struct.unpack_from(">h", frame, 6)[0]))
            else:
                version = rng.choice([-1, -32768, 32767, rng.randint(0, 20), rng.randint(-5, 40)])
                if struct.unpack_from(">h", frame, 4)[0] == 3:
                    version = version if version >= 4 or version < 0 else 4 + version
                struct.pack_into(">h", frame, 6, version)
        elif kind == "append":
            extra = rng.randbytes(rng.randint(1, 64))
            frame += extra
            struct.pack_into(">i", frame, 0, len(frame) - 4)
        elif kind == "garbage":
            body = bytearray(rng.randbytes(rng.randint(0, 200)))
            if len(body) >= 2 and struct.unpack_from(">h", body, 0)[0] in (3,):
                body[0] ^= 0x80  # never a Metadata request by chance (auto-creation)
            if rng.random() < 0.7:
                frame = bytearray(struct.pack(">i", len(body))) + body
            else:
                frame = body
        return kind, bytes(frame)


# ------------------------------------------------------------------------------------------------
# the connections


@dataclass
class FuzzStats:
    frames: int = 0
    malformed: int = 0  # frames other than the valid ones mixed in
    connections: int = 0
    closed_by_proxy: int = 0
    pipelined_checks: int = 0
    predicted_rejections: int = 0  # frames the proxy had to reject by itself (and did)
    rejections_pending_answers: int = 0  # ... and did, but still owed answers to earlier requests
    first_request_checks: int = 0
    kinds: collections.Counter = field(default_factory=collections.Counter)
    peers: collections.Counter = field(default_factory=collections.Counter)
    problems: list[str] = field(default_factory=list)


class FuzzConnection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.data = bytearray()
        self.eof = asyncio.Event()
        self.got_data = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        try:
            while chunk := await self.reader.read(65536):
                self.data += chunk
                self.got_data.set()
        except (ConnectionError, OSError):
            pass
        self.eof.set()

    def frames(self) -> list[bytes]:
        out, pos = [], 0
        while len(self.data) - pos >= 4:
            (size,) = struct.unpack_from(">i", self.data, pos)
            if len(self.data) - pos - 4 < size:
                break
            out.append(bytes(self.data[pos + 4 : pos + 4 + size]))
            pos += 4 + size
        return out

    async def wait_frames(self, n: int, timeout: float) -> list[bytes]:
        deadline = time.monotonic() + timeout
        while len(self.frames()) < n and not self.eof.is_set() and time.monotonic() < deadline:
            self.got_data.clear()
            try:
                await asyncio.wait_for(self.got_data.wait(), deadline - time.monotonic())
            except TimeoutError:
                break
        return self.frames()

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass
        self._task.cancel()


def must_reject(proxy, frame: bytes) -> bool:
    """Whether the proxy has to close the connection on ``frame`` by itself (the connection being at a
    frame boundary): a size it refuses, or an api key / version it can neither forward nor serve."""
    if len(frame) < 4:
        return False
    (size,) = struct.unpack_from(">i", frame, 0)
    if size < 0 or size > proxy.config.max_frame_bytes:
        return True
    if size != len(frame) - 4:
        return False
    if size < 10:
        return True
    key, version = struct.unpack_from(">hh", frame, 4)
    return proxy.handler_for(key, version) is None and proxy.check_forwardable(key, version) is not None


async def fuzz_worker(
    wid: int, proxy, logged_rejection, addresses: list[str], bases, budget: list[int], stats: FuzzStats
) -> None:
    rng = random.Random(f"{SEED}-{wid}")
    fuzzer = Fuzzer(rng, bases)
    while budget[0] > 0:
        host, port = hostport(rng.choice(addresses))
        reader, writer = await asyncio.open_connection(host, port)
        conn = FuzzConnection(reader, writer)
        sockname = writer.get_extra_info("sockname")
        peer = f"{sockname[0]}:{sockname[1]}"
        stats.connections += 1
        stats.peers[peer] += 1
        try:
            if rng.random() < FIRST_REQUEST_CHECKS:
                # a valid request first: its answer, and nobody else's, must come back
                corr = rng.randrange(1 << 31)
                writer.write(fuzzer.valid(corr, answered=True))
                frames = await conn.wait_frames(1, 30)
                stats.first_request_checks += 1
                if not frames:
                    stats.problems.append(f"worker {wid}: no answer to a valid first request ({peer})")
                    continue
                if struct.unpack_from(">i", frames[0])[0] != corr:
                    stats.problems.append(
                        f"worker {wid}: first answer has correlation id "
                        f"{struct.unpack_from('>i', frames[0])[0]}, sent {corr}"
                    )
                if rng.random() < 0.2:
                    await pipelined_then_rejected(rng, fuzzer, conn, stats, len(frames))
                    continue
            in_sync = True  # at a frame boundary: every frame so far was whole and self-consistent
            for _ in range(rng.randint(1, MAX_FRAMES_PER_CONNECTION)):
                if budget[0] <= 0 or conn.eof.is_set():
                    break
                kind, frame = fuzzer.next()
                stats.frames += 1
                stats.kinds[kind] += 1
                if kind != "valid":
                    budget[0] -= 1
                    stats.malformed += 1
                rejected = in_sync and must_reject(proxy, frame)
                in_sync = in_sync and len(frame) >= 4 and struct.unpack_from(">i", frame)[0] == len(frame) - 4
                try:
                    writer.write(frame)
                    await writer.drain()
                except (ConnectionError, OSError):
                    break
                try:
                    await asyncio.wait_for(conn.eof.wait(), 10 if rejected else IDLE_WAIT)
                except TimeoutError:
                    if rejected:
                        # still open: only while answers to earlier requests are owed (a long-polling
                        # Fetch, say), as with Kafka, which reads the next request only then
                        if not logged_rejection(peer):
                            stats.problems.append(f"worker {wid}: {kind} frame {frame[:24]!r} not rejected")
                        stats.rejections_pending_answers += 1
                        break
                stats.predicted_rejections += rejected
            if conn.eof.is_set():
                stats.closed_by_proxy += 1
        finally:
            await conn.close()


async def pipelined_then_rejected(
    rng, fuzzer: Fuzzer, conn: FuzzConnection, stats: FuzzStats, seen: int
) -> None:
    """Valid requests pipelined ahead of a frame the proxy itself rejects: every one is answered, in
    order, then the connection closes."""
    corrs = [rng.randrange(1 << 31) for _ in range(rng.randint(1, 6))]
    frames = [fuzzer.valid(c, answered=True) for c in corrs]
    expected = corrs
    bad = struct.pack(">ihhih", 10, 9999, 0, 1, -1)
    conn.writer.write(b"".join(frames) + bad)
    stats.frames += len(frames) + 1
    stats.malformed += 1
    stats.kinds["pipelined-then-rejected"] += 1
    await asyncio.wait_for(conn.eof.wait(), 30)
    got = [struct.unpack_from(">i", f)[0] for f in conn.frames()[seen:]]
    if got != expected:
        stats.problems.append(f"pipelined ahead of a rejected frame: sent {expected}, answered {got}")
    stats.pipelined_checks += 1
    stats.closed_by_proxy += 1


# ------------------------------------------------------------------------------------------------
# the test


def _topic_id(bootstrap: str, topic: str) -> bytes:
    async def get() -> bytes:
        host, port = hostport(bootstrap)
        conn = await KafkaConnection.open(host, port)
        try:
            cls = messages.message_class("MetadataRequest")
            resp = await conn.request(3, 12, cls(topics=[cls.MetadataRequestTopic(name=topic)]))
            return resp.topics[0].topic_id
        finally:
            await conn.close()

    return asyncio.run(get())


def _fresh_metadata(bootstrap: str) -> int:
    async def get() -> int:
        host, port = hostport(bootstrap)
        conn = await asyncio.wait_for(KafkaConnection.open(host, port), 10)
        try:
            cls = messages.message_class("MetadataRequest")
            resp = await asyncio.wait_for(conn.request(3, conn.best_version(3), cls(topics=[])), 10)
            return len(resp.brokers)
        finally:
            await conn.close()

    return asyncio.run(get())


def test_fuzz_proxy_with_malformed_frames(kafka39, caplog) -> None:
    caplog.set_level(logging.INFO, logger="kshare")
    run = uuid.uuid4().hex[:8]
    decoy = kafka39.create_topic(f"fuzz-decoy-{run}")
    good_topic = kafka39.create_topic(f"fuzz-good-{run}", partitions=3)
    decoy_id = _topic_id(kafka39.bootstrap, decoy)
    topics_before = set(kafka39.admin().list_topics(timeout=10).topics)
    t0 = time.monotonic()
    with ProxyThread(kafka39.bootstrap) as proxy:
        assert proxy.proxy is not None and proxy.proxy.upstream_versions is not None
        bases = base_requests(decoy, decoy_id, proxy.proxy.upstream_versions)
        assert len(bases) > 60
        node_listeners = [f"{proxy.config.advertised}:{port}" for port in proxy.proxy.brokers.ports.values()]
        addresses = [proxy.bootstrap, *node_listeners]
        stats = FuzzStats()
        with (
            GoodTraffic(proxy.bootstrap, good_topic, 3) as good,
            MetadataLoop(proxy.bootstrap, good_topic) as other,
        ):
            good.wait_flowing()
            t_fuzz = time.monotonic()

            def logged_rejection(peer: str) -> bool:
                return any(
                    r.levelno == logging.WARNING and r.getMessage().startswith(f"client {peer}:")
                    for r in list(caplog.records)
                )

            async def fuzz() -> None:
                budget = [FRAMES]
                workers = [
                    fuzz_worker(w, proxy.proxy, logged_rejection, addresses, bases, budget, stats)
                    for w in range(WORKERS)
                ]
                await asyncio.gather(*workers)

            asyncio.run(fuzz())
            fuzz_seconds = time.monotonic() - t_fuzz
            other.check(at_least=100)
            produced = good.finish()
        print(
            f"\nfuzz seed {SEED}: {stats.frames} frames ({stats.malformed} malformed) on {stats.connections} connections in {fuzz_seconds:.1f} s "
            f"({stats.closed_by_proxy} closed by the proxy, {proxy.proxy.stats.rejected} rejections, "
            f"{stats.predicted_rejections} + {stats.rejections_pending_answers} as predicted; "
            f"{stats.first_request_checks} first-request and {stats.pipelined_checks} pipelined checks); "
            f"good clients: {produced} records, "
            f"{other.count} Metadata answers; proxy saw {sum(proxy.proxy.stats.requests.values())} requests; "
            f"kinds {dict(stats.kinds)}; total {time.monotonic() - t0:.1f} s"
        )
        assert stats.problems == [], stats.problems[:20]
        assert stats.malformed >= FRAMES
        assert produced > 1000

        # healthy: a fresh client is served, nothing is left behind
        assert _fresh_metadata(proxy.bootstrap) == 1
        deadline = time.monotonic() + 15
        while proxy.call(lambda: len(proxy.proxy.connections)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert proxy.call(lambda: len(proxy.proxy.connections)) == 0, "client connections left open"
        tasks = proxy.call(lambda: [t for t in asyncio.all_tasks() if not t.done()])
        assert len(tasks) <= 2, tasks  # the proxy's main coroutine (and at most the upstream probe)
        assert proxy._thread is not None and proxy._thread.is_alive()

    # the shared broker: no topic created by a mutated request (removed again if there is one)
    created = set(kafka39.admin().list_topics(timeout=10).topics) - topics_before
    stray = created - {"__consumer_offsets", "__transaction_state"}
    for topic in stray:
        kafka39.delete_topic(topic)
    assert stray == set(), f"topics created by fuzzed requests: {stray}"

    # the logs: nothing unexpected, at most one line per fuzz connection, one WARNING per rejection
    assert unexpected_errors(caplog) == []
    records = [r for r in caplog.records if r.name == PROXY_LOGGER]
    per_peer: collections.Counter[str] = collections.Counter()
    for r in records:
        msg = r.getMessage()
        if msg.startswith("client "):
            per_peer[msg.split(" ", 2)[1].rstrip(":")] += 1
    too_many = {p: n for p, n in per_peer.items() if p in stats.peers and n > stats.peers[p]}
    examples = [
        r.getMessage() for r in records if any(f"client {p}:" in r.getMessage() for p in list(too_many)[:4])
    ]
    assert too_many == {}, f"{len(too_many)} connections with more than one line, e.g. {examples}"
    warnings = [r for r in records if r.levelno == logging.WARNING]
    assert len(warnings) == proxy.proxy.stats.rejected, [r.getMessage() for r in warnings[:5]]
