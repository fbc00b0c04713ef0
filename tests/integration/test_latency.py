"""A ShareFetch waiting in long poll is answered as soon as a record it may take reaches kshare.

Raw ShareFetch requests (``share.Raw``) through kshare in front of Apache Kafka 3.9 and
Tansu: a ShareFetch with a long MaxWaitMs waits on a caught-up partition, a record is produced,
and the answer must come with it right away, not when MaxWaitMs runs out, also when the record
comes after the proxy's own upstream long poll ran out empty, and also for a second fetch waiting
on the same partition after the first one gave up. The soak that measures the latency itself is
``benchmarks/bench_latency.py`` (docs/benchmarks/share.md).
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from kshare.share.partition_log import POLL_WAIT_MS
from tests.harness.share import Raw, ShareProxyThread, acquired, produce, share_group

WAIT_MS = 8000  # MaxWaitMs of the waiting fetches: an answer by the deadline would be far later
PROMPT_S = 1.5  # generous for a loaded machine; the deadline is 8 s


async def _wait_answer(raw: Raw, group: str, member: str, epoch: int, tid: bytes, max_wait_ms: int):
    return await raw.fetch(group, member, epoch, {tid: [0]}, max_wait_ms=max_wait_ms)


async def _caught_up(raw: Raw, group: str, member: str, tid: bytes) -> int:
    """Open the share session and take what is there; returns the next session epoch."""
    resp = await raw.fetch(group, member, 0, {tid: [0]}, max_wait_ms=0)
    assert resp.error_code == 0, resp
    return 1


def _scenario_record_wakes_a_waiting_fetch(bootstrap: str, topic: str, group: str, delay: float) -> None:
    async def main() -> None:
        raw = await Raw.open(bootstrap)
        try:
            tid = await raw.topic_id(topic)
            member, _ = await raw.join(group, topic)
            epoch = await _caught_up(raw, group, member, tid)
            started = time.monotonic()
            waiting = asyncio.create_task(_wait_answer(raw, group, member, epoch, tid, WAIT_MS))
            await asyncio.sleep(delay)
            assert not waiting.done(), "answered before any record came"
            await asyncio.to_thread(produce, bootstrap, topic, [b"wake-up"], partition=0)
            produced = time.monotonic()
            resp = await asyncio.wait_for(waiting, WAIT_MS / 1000 + 10)
            answered = time.monotonic()
            assert acquired(resp) == [(0, 0, 1)], resp
            assert answered - produced < PROMPT_S, (answered - produced, answered - started)
        finally:
            await raw.close()

    asyncio.run(main())


# after-polls-ran-out: later than the longest upstream poll kshare ever asked for (5 s before the
# fix, when a poll that ran out empty was not repeated for a fetch still waiting)
AFTER_POLLS_S = max(5.5, 2.5 * POLL_WAIT_MS / 1000)


@pytest.mark.parametrize("delay", [0.3, AFTER_POLLS_S], ids=["during-first-poll", "after-polls-ran-out"])
def test_a_record_wakes_a_waiting_share_fetch_on_kafka39(kafka39, kshare39, topic_name, delay):
    kafka39.create_topic(topic_name, partitions=1)
    group = f"latency-{uuid.uuid4().hex[:8]}"
    share_group(kshare39.bootstrap, group, **{"share.auto.offset.reset": "earliest"})
    _scenario_record_wakes_a_waiting_fetch(kshare39.bootstrap, topic_name, group, delay)


def test_a_record_wakes_a_waiting_share_fetch_on_tansu(tansu, topic_name):
    tansu.create_topic(topic_name, partitions=1)
    group = f"latency-{uuid.uuid4().hex[:8]}"
    with ShareProxyThread(tansu.bootstrap, start_timeout=30) as proxy:
        share_group(proxy.bootstrap, group, **{"share.auto.offset.reset": "earliest"})
        _scenario_record_wakes_a_waiting_fetch(proxy.bootstrap, topic_name, group, AFTER_POLLS_S)


def test_a_fetch_still_waiting_hears_of_records_after_another_gave_up(kafka39, kshare39, topic_name):
    """Two members wait on the one partition; the first gives up after 300 ms; a record produced
    after that wakes the second at once (each waiting fetch listens for new data on its own)."""
    kafka39.create_topic(topic_name, partitions=1)
    group = f"latency-{uuid.uuid4().hex[:8]}"
    bootstrap = kshare39.bootstrap
    share_group(bootstrap, group, **{"share.auto.offset.reset": "earliest"})

    async def main() -> None:
        a, b = await Raw.open(bootstrap, "a"), await Raw.open(bootstrap, "b")
        try:
            tid = await a.topic_id(topic_name)
            member_a, _ = await a.join(group, topic_name)
            member_b, _ = await b.join(group, topic_name)
            # both hold the partition (one partition, two members: both read it)
            ea = await _caught_up(a, group, member_a, tid)
            eb = await _caught_up(b, group, member_b, tid)
            short = asyncio.create_task(_wait_answer(a, group, member_a, ea, tid, 300))
            long = asyncio.create_task(_wait_answer(b, group, member_b, eb, tid, WAIT_MS))
            resp = await asyncio.wait_for(short, 10)
            assert acquired(resp) == []
            await asyncio.sleep(0.5)
            assert not long.done()
            await asyncio.to_thread(produce, bootstrap, topic_name, [b"late"], partition=0)
            produced = time.monotonic()
            resp = await asyncio.wait_for(long, WAIT_MS / 1000 + 10)
            assert acquired(resp) == [(0, 0, 1)], resp
            assert time.monotonic() - produced < PROMPT_S
        finally:
            await a.close()
            await b.close()

    asyncio.run(main())
