"""The record cache has one budget for every partition, and idle partitions give theirs back;
the answers on their way to clients hold at most half that budget besides it.

A proxy with a 2 MiB record cache share-consumes 8 partitions holding 1.6 MiB each (12.8 MiB in
all): the cache never holds much more than its budget, every record arrives, and a minute (here:
one second) after the last fetch the partitions' caches are gone.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from kshare.protocol import messages
from kshare.share import service as service_module
from kshare.share.partition_log import MIN_FETCH_BYTES
from tests.harness.brokers import KafkaBroker
from tests.harness.share import (
    ACCEPT,
    Raw,
    ShareProxyThread,
    ack_request,
    fetch_request,
    partitions,
    produce,
    records_of,
    share_consumer,
    share_group,
)

PARTITIONS = 8
PER_PARTITION = 1600  # records of 1 KiB
BUDGET = 2 << 20


def test_one_budget_for_every_partition_and_idle_ones_release_it(kafka39: KafkaBroker, monkeypatch) -> None:
    monkeypatch.setattr(service_module, "LOG_IDLE_S", 1.0)
    topic, group = f"cache-{uuid.uuid4().hex[:8]}", f"cache-g-{uuid.uuid4().hex[:8]}"
    kafka39.create_topic(topic, PARTITIONS)
    with ShareProxyThread(kafka39.bootstrap, record_cache_bytes=BUDGET) as proxy:
        share_group(proxy.bootstrap, group)
        for p in range(PARTITIONS):
            produce(proxy.bootstrap, topic, [f"{p}-{i:05d}".encode().ljust(1024, b".") for i in range(PER_PARTITION)],
                    partition=p, per_batch=100)
        peak = [0]
        stop = threading.Event()

        def watch() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], proxy.service.record_cache_size())
                time.sleep(0.005)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        seen: set[bytes] = set()
        c = share_consumer(proxy.bootstrap, group)
        c.subscribe([topic])
        deadline = time.monotonic() + 120
        try:
            while len(seen) < PARTITIONS * PER_PARTITION and time.monotonic() < deadline:
                seen.update(m.value()[:7] for m in records_of(c, 0.5))
        finally:
            c.close()
            stop.set()
            watcher.join()
        assert len(seen) == PARTITIONS * PER_PARTITION, "every record arrives"
        # each partition's share is 256 KiB; what a Fetch just brought (at most max(64 KiB, share))
        # is never evicted at once, so a partition may briefly hold up to 64 KiB over a small share
        slack = PARTITIONS * MIN_FETCH_BYTES
        assert peak[0] <= BUDGET + slack, f"the cache held {peak[0]} bytes with a budget of {BUDGET}"
        # idle partitions give their share back
        deadline = time.monotonic() + 10
        while proxy.service.logs and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not proxy.service.logs and proxy.service.record_cache_size() == 0


SLOW_PARTITIONS = 8
SLOW_BATCHES = 4  # per partition, of 100 records of 1 KiB


async def _slow_reader(proxy: ShareProxyThread) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection whose reader is slow: small socket buffers at both ends (the proxy's set from
    inside, as a congested path would make them), so what the proxy writes stays in its transport."""
    host, _, port = proxy.bootstrap.rpartition(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    reader, writer = await asyncio.open_connection(sock=sock, limit=4096)
    host_, port_ = sock.getsockname()[:2]
    name = f"{host_}:{port_}"

    def shrink() -> bool:
        for conn in proxy.app.proxy.connections:
            if conn.peer == name and conn.transport is not None:
                conn.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
                return True
        return False

    deadline = time.monotonic() + 10
    while not proxy.call(shrink):
        assert time.monotonic() < deadline, "the proxy never saw the connection"
        await asyncio.sleep(0.05)
    return reader, writer


def _big_fetch(group: str, member: str, epoch: int, tid: bytes, max_wait_ms: int = 0) -> Any:
    """A ShareFetch of every partition that allows 64 MiB and 100,000 records."""
    req = fetch_request(group, member, epoch, {tid: list(range(SLOW_PARTITIONS))} if epoch == 0 else None,
                        max_wait_ms=max_wait_ms)
    req.max_bytes, req.max_records, req.batch_size = 64 << 20, 100_000, 100_000
    return req


def _fetch_frame(group: str, member: str, epoch: int, tid: bytes, corr: int) -> bytes:
    return bytes(messages.encode_request(78, 1, corr, "slow", _big_fetch(group, member, epoch, tid)))


async def _fetch(raw: Raw, group: str, member: str, epoch: int, tid: bytes, max_wait_ms: int = 0) -> Any:
    return await raw.conn.request(78, 1, _big_fetch(group, member, epoch, tid, max_wait_ms))


async def _answer(reader: asyncio.StreamReader, size: int | None = None) -> Any:
    if size is None:
        size = struct.unpack(">i", await reader.readexactly(4))[0]
    return messages.decode_response(78, 1, memoryview(await reader.readexactly(size)))


def _acks(resp: Any) -> dict:
    return {k: [(a.first_offset, a.last_offset, [ACCEPT])] for k, p in partitions(resp).items()
            for a in p.acquired_records}


def _records(resp: Any) -> dict[tuple[bytes, int], int]:
    return {k: sum(a.last_offset - a.first_offset + 1 for a in p.acquired_records)
            for k, p in partitions(resp).items() if p.acquired_records}


def _bytes(resp: Any) -> int:
    return sum(len(p.records or b"") for p in partitions(resp).values())


def test_answers_held_for_slow_readers_stay_within_their_share_of_the_budget(kafka39: KafkaBroker) -> None:
    """An answer's records stay in the proxy until the client's socket takes them, so members
    that read slowly (or fetch at once by the hundred) hold record data beyond the cache. Those
    answers may hold half the record budget; past it, an answer that has records takes no more.

    Budget 2 MiB, so the answers' share is 1 MiB. A slow reader's answer (every partition asked,
    64 MiB allowed) stops at that share and stays held while unread; meanwhile a second member
    gets records from one partition only (it still makes progress); once the slow reader has read
    its answer, answers are full again; a slow reader that disconnects without reading releases
    what it held. What may be redelivered: only the disconnected reader's records; nothing is
    lost: every record is accepted exactly once by the two members that stay."""
    budget = 2 << 20
    topic, group = f"answers-{uuid.uuid4().hex[:8]}", f"answers-g-{uuid.uuid4().hex[:8]}"
    kafka39.create_topic(topic, SLOW_PARTITIONS)
    per_partition = SLOW_BATCHES * 100
    total = SLOW_PARTITIONS * per_partition
    with ShareProxyThread(kafka39.bootstrap, record_cache_bytes=budget) as proxy:
        share_group(proxy.bootstrap, group)
        for p in range(SLOW_PARTITIONS):
            produce(proxy.bootstrap, topic, [f"{p}-{i:04d}".encode().ljust(1024, b".") for i in range(per_partition)],
                    partition=p, per_batch=100)
        pool = proxy.service.cache_pool
        share = budget // 2

        def held() -> int:
            return proxy.call(lambda: pool.answer_bytes)

        async def wait_held(check: Callable[[int], bool], what: str) -> int:
            deadline = time.monotonic() + 20
            while not check(n := held()):
                assert time.monotonic() < deadline, f"{what}: answers hold {n} bytes"
                await asyncio.sleep(0.05)
            return n

        async def run() -> dict[str, Any]:
            raw = await Raw.open(proxy.bootstrap, "answers")
            accepted: list[tuple[int, int]] = []  # (partition, records) per acknowledged range
            try:
                tid = await raw.topic_id(topic)
                slow, _ = await raw.join(group, topic)
                other, _ = await raw.join(group, topic)
                # Every share-partition initialised first: a new group's first ShareFetch answers
                # with the share-partitions ready, as Kafka's does (the others initialise for the
                # next one). A session opened by a ShareFetch that allows no bytes, then closed.
                warm = _big_fetch(group, other, 0, tid)
                warm.max_bytes = 0
                await raw.conn.request(78, 1, warm)
                await raw.conn.request(78, 1, fetch_request(group, other, -1, None))
                deadline = time.monotonic() + 20
                while proxy.call(lambda: sum(1 for k, sp in proxy.service.partitions.items()
                                             if k.group_id == group and sp.engine is not None)) < SLOW_PARTITIONS:
                    assert time.monotonic() < deadline, "share-partitions not initialised"
                    await asyncio.sleep(0.05)
                reader, writer = await _slow_reader(proxy)
                writer.write(_fetch_frame(group, slow, 0, tid, 1))
                # its answer is written (its first bytes arrive) and most of it waits in the proxy
                size = struct.unpack(">i", await reader.readexactly(4))[0]
                slow_held = await wait_held(lambda n: n > 0, "the slow reader's answer")
                # another member's answer meanwhile: the records of one partition
                r = await _fetch(raw, group, other, 0, tid)
                squeezed = _records(r)
                r = await raw.ack(group, other, 1, _acks(r))
                assert all(p.error_code == 0 for p in partitions(r).values()), r
                accepted += [(k[1], n) for k, n in squeezed.items()]
                # the slow reader reads its answer and accepts it: the share is free again
                first = await _answer(reader, size)
                # released once the proxy's transport has sent it all, though the client says nothing
                read_back = await wait_held(lambda n: n == 0, "after the slow reader read its answer")
                writer.write(bytes(messages.encode_request(79, 1, 2, "slow", ack_request(group, slow, 1, _acks(first)))))
                r = await _answer_of(reader, 79)
                assert all(p.error_code == 0 for t in r.responses for p in t.partitions), r
                accepted += [(k[1], n) for k, n in _records(first).items()]
                after_read = await wait_held(lambda n: n == 0, "after the slow reader acknowledged")
                # full answers again: the other member now gets records from several partitions
                r = await _fetch(raw, group, other, 2, tid)
                again = _records(r)
                epoch = 3
                r2 = await raw.ack(group, other, epoch, _acks(r))
                assert all(p.error_code == 0 for p in partitions(r2).values()), r2
                accepted += [(k[1], n) for k, n in again.items()]
                # the rest, by the other member
                epoch += 1
                deadline = time.monotonic() + 60
                while sum(n for _, n in accepted) < total:
                    assert time.monotonic() < deadline, accepted
                    r = await _fetch(raw, group, other, epoch, tid, max_wait_ms=200)
                    epoch += 1
                    if _records(r):
                        await raw.ack(group, other, epoch, _acks(r))
                        epoch += 1
                        accepted += [(k[1], n) for k, n in _records(r).items()]
                # a slow reader that goes away without reading releases what its answer held
                produce(proxy.bootstrap, topic, [b"late".ljust(1024, b".")] * 400, partition=0, per_batch=100)
                writer.close()
                reader, writer = await _slow_reader(proxy)
                gone, _ = await raw.join(group, topic)
                writer.write(_fetch_frame(group, gone, 0, tid, 1))
                await reader.readexactly(4)
                gone_held = await wait_held(lambda n: n > 0, "the second slow reader's answer")
                writer.close()
                after_close = await wait_held(lambda n: n == 0, "after the slow reader went away")
                return {"slow_held": slow_held, "slow_bytes": _bytes(first), "squeezed": squeezed,
                        "again": again, "after_read": after_read, "read_back": read_back, "accepted": accepted, "gone_held": gone_held,
                        "after_close": after_close}
            finally:
                await raw.close()

        out = asyncio.run(run())
    # the slow reader's answer stopped at the answers' share, plus the read that crossed it (at
    # most one partition's records here), though it allowed 64 MiB and 3.3 MB were there
    assert share <= out["slow_bytes"] <= share + per_partition * 1100, out["slow_bytes"]
    assert out["slow_held"] == out["slow_bytes"]
    assert len(out["squeezed"]) == 1, out["squeezed"]  # one partition: the share was taken
    assert len(out["again"]) > 1, out["again"]  # several: it was given back
    assert out["read_back"] == out["after_read"] == out["after_close"] == 0 and out["gone_held"] > 0
    by_partition: dict[int, int] = {}
    for p, n in out["accepted"]:
        by_partition[p] = by_partition.get(p, 0) + n
    assert by_partition == dict.fromkeys(range(SLOW_PARTITIONS), per_partition), by_partition


async def _answer_of(reader: asyncio.StreamReader, api_key: int) -> Any:
    size = struct.unpack(">i", await reader.readexactly(4))[0]
    return messages.decode_response(api_key, 1, memoryview(await reader.readexactly(size)))
