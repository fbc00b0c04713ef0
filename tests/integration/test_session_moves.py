"""A member's share sessions on two listeners of the proxy (issue 40's broker roll): a client whose
partition moved to another broker opens a session with the new leader and closes the one with the
old leader, which on a Kafka cluster no longer holds anything of that partition. Through kshare one
share-partition serves every listener: closing the old session (or losing its connection) must not
take back what the member acquired through the new one. Raw ShareFetch / ShareAcknowledge through
the real proxy in front of Apache Kafka 3.9; the two listeners are the bootstrap listener and the
broker's own."""

from __future__ import annotations

import asyncio
import uuid

from kshare.protocol import messages
from kshare.share.sessions import FINAL_EPOCH
from tests.harness import share
from tests.harness.share import Raw, acquired, partitions, produce, share_group

kshare39 = share.kshare39
ACCEPT = 1


async def _broker_listener(raw: Raw) -> str:
    Req = messages.message_class("MetadataRequest")
    md = await raw.conn.request(share.METADATA, 12, Req(topics=[], allow_auto_topic_creation=False))
    broker = md.brokers[0]
    return f"{broker.host}:{broker.port}"


def _sessions_moved(kafka39, kshare39, close_old) -> None:
    topic = group = f"session-moves-{uuid.uuid4().hex[:8]}"
    kafka39.create_topic(topic, 1)
    share_group(kshare39.bootstrap, group)

    async def main() -> None:
        old = await Raw.open(kshare39.bootstrap, "old-leader")
        new = await Raw.open(await _broker_listener(old), "new-leader")
        try:
            tid = await old.topic_id(topic)
            member, _ = await old.join(group, topic)
            opened = await old.fetch(group, member, 0, {tid: [0]})  # the session with the old leader
            assert opened.error_code == 0 and acquired(opened) == [], opened
            await asyncio.to_thread(produce, kshare39.bootstrap, topic, [b"r%d" % i for i in range(10)], partition=0,
                                    per_batch=10)
            got = await new.fetch(group, member, 0, {tid: [0]}, max_wait_ms=5000)  # the new leader's
            assert got.error_code == 0 and acquired(got) == [(0, 9, 1)], got
            await close_old(old, group, member, tid)
            # the member acknowledges through the new leader what it acquired there
            acked = await new.ack(group, member, 1, {(tid, 0): [(0, 9, [ACCEPT])]})
            assert acked.error_code == 0, acked
            assert partitions(acked)[(tid, 0)].error_code == 0, acked
        finally:
            await new.close()
            await old.close()

    asyncio.run(main())
    # accepted: a newcomer gets nothing
    assert share.newcomer_gets(kshare39.bootstrap, group, topic, 3) == []


def test_closing_the_old_leaders_session_keeps_what_the_new_one_acquired(kafka39, kshare39) -> None:
    async def close(old: Raw, group: str, member: str, tid: bytes) -> None:
        closed = await old.fetch(group, member, FINAL_EPOCH, {tid: [0]})
        assert closed.error_code == 0, closed

    _sessions_moved(kafka39, kshare39, close)


def test_the_old_leaders_connection_closing_keeps_what_the_new_one_acquired(kafka39, kshare39) -> None:
    async def close(old: Raw, group: str, member: str, tid: bytes) -> None:
        await old.close()
        await asyncio.sleep(0.5)  # the proxy sees the connection close and releases what it must

    _sessions_moved(kafka39, kshare39, close)
