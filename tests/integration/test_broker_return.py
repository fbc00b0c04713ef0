"""A client connection of a restarted broker's listener goes back to that broker once it answers.

Slow (~30 s: a 2-broker Kafka 3.9 cluster, one broker restarted, shared by the module). While broker N is down, a client
connection to the proxy's listener for N is served through another broker (a stand-in, which answers
what it does not lead as Kafka does: NOT_LEADER_OR_FOLLOWER). When N is back it must move back to N,
whether or not the proxy saw N leave the cluster's metadata: a restart of a few seconds need not show
in any Metadata answer a client happens to ask for. Before, it moved back only then, and a producer
kept getting NOT_LEADER_OR_FOLLOWER for the partitions N led again, from the stand-in, until something
closed its connection: up to 28 s of stall in ``kshare bench --only failover`` (issue 40), and
for good when nothing did.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient

from kshare.clients.connection import KafkaConnection
from kshare.protocol import messages
from kshare.protocol.codes import ApiKey, ErrorCode
from tests.harness.cluster import KafkaCluster
from tests.harness.proxies import ProxyThread

PRODUCE = ApiKey.PRODUCE
NONE, NOT_LEADER_OR_FOLLOWER = ErrorCode.NONE, ErrorCode.NOT_LEADER_OR_FOLLOWER


def _one_record_batch() -> bytes:
    from kafka.record.memory_records import MemoryRecordsBuilder

    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 16)
    builder.append(int(time.time() * 1000), b"k", b"v", [])
    builder.close()
    return bytes(builder.buffer())


def _wait_leader(bootstrap: str, topic: str, leader: int, timeout: float = 60.0) -> None:
    """Until the cluster itself (not through the proxy: no Metadata may pass it) names ``leader``."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + timeout
    while True:
        try:
            md = admin.list_topics(topic=topic, timeout=5)
            if md.topics[topic].partitions[0].leader == leader:
                return
        except Exception:  # noqa: BLE001 - a node still starting
            pass
        assert time.monotonic() < deadline, f"partition 0 of {topic} not led by node {leader} after {timeout} s"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def cluster2() -> Iterator[KafkaCluster]:
    with KafkaCluster() as cluster:
        yield cluster


@contextlib.contextmanager
def _black_hole(host: str, port: int) -> Iterator[None]:
    """``host:port`` as a host that is down shows it: connection attempts are neither accepted nor
    refused (a listener whose accept queue is full drops them), until the block ends."""
    hole = socket.socket()
    hole.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    hole.bind((host, port))
    hole.listen(0)
    fillers = []
    try:
        for _ in range(2):  # fill the accept queue: later attempts get no answer
            c = socket.socket()
            c.setblocking(False)
            c.connect_ex((host, port))
            fillers.append(c)
        time.sleep(0.2)
        yield
    finally:
        for c in fillers:
            c.close()
        hole.close()


def test_a_new_connection_does_not_wait_for_a_broker_that_does_not_answer(cluster2: KafkaCluster) -> None:
    """A client connecting to the proxy's listener for a broker whose host is down (connection
    attempts dropped, not refused) is served through another broker after 3 s, not after the whole
    upstream connect timeout (10 s)."""
    with ProxyThread(cluster2.controller.bootstrap) as proxy:
        ports = proxy.call(lambda: dict(proxy.proxy.brokers.ports))
        listener2 = (proxy.config.advertised, ports[2])
        host, port = cluster2.broker.host, cluster2.broker.port
        cluster2.broker.stop()
        try:
            with _black_hole(host, port):
                t0 = time.monotonic()
                conn = asyncio.run_coroutine_threadsafe(
                    KafkaConnection.open(*listener2, client_id="kshare-black-hole-test", timeout=20), proxy.loop
                ).result(30)
                waited = time.monotonic() - t0
                asyncio.run_coroutine_threadsafe(conn.close(), proxy.loop).result(10)
                assert proxy.call(lambda: set(proxy.proxy.brokers.gone)) == {2}
        finally:
            cluster2.broker.start()
    assert waited < 6.0, f"the client waited {waited:.1f} s for its connection (3 s expected, 10 s before)"


def test_a_connection_served_through_another_broker_moves_back_when_its_broker_returns(
        cluster2: KafkaCluster, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kshare.proxy")
    topic = f"broker-return-{uuid.uuid4().hex[:8]}"
    Produce = messages.message_class("ProduceRequest")

    def produce() -> object:
        partition = Produce.PartitionProduceData(index=0, records=_one_record_batch())
        return Produce(transactional_id=None, acks=1, timeout_ms=5000,
                       topic_data=[Produce.TopicProduceData(name=topic, partition_data=[partition])])

    cluster = cluster2
    with ProxyThread(cluster.controller.bootstrap) as proxy:
        cluster.create_topic(topic, [[2]])  # partition 0 on node 2 only
        ports = proxy.call(lambda: dict(proxy.proxy.brokers.ports))
        listener2 = (proxy.config.advertised, ports[2])
        cluster.broker.stop()  # SIGTERM: node 2's port is closed

        async def connect() -> KafkaConnection:
            # node 2 refuses: the proxy serves this connection through node 1
            return await KafkaConnection.open(*listener2, client_id="kshare-broker-return-test")

        conn = asyncio.run_coroutine_threadsafe(connect(), proxy.loop).result(30)
        try:
            version = min(conn.versions[PRODUCE][1], 9)
            stand_in = asyncio.run_coroutine_threadsafe(conn.request(PRODUCE, version, produce()), proxy.loop).result(30)
            assert stand_in.responses[0].partition_responses[0].error_code == NOT_LEADER_OR_FOLLOWER
            # kshare_brokers_gone, kshare_client_connections_standing_in
            assert proxy.call(lambda: (set(proxy.proxy.brokers.gone), len(proxy.proxy.brokers.standing_in.get(2, ())))) \
                == ({2}, 1)

            cluster.broker.start()
            _wait_leader(cluster.bootstrap, topic, 2)
            t_back = time.monotonic()
            errors = []
            while True:  # as a producer retries: the same connection, a short backoff
                answer = asyncio.run_coroutine_threadsafe(conn.request(PRODUCE, version, produce()),
                                                          proxy.loop).result(30)
                errors.append(answer.responses[0].partition_responses[0].error_code)
                if errors[-1] == NONE or time.monotonic() - t_back > 15:
                    break
                time.sleep(0.2)
            gone_after = proxy.call(lambda: set(proxy.proxy.brokers.gone))
        finally:
            asyncio.run_coroutine_threadsafe(conn.close(), proxy.loop).result(10)
    assert errors[-1] == NONE, f"still {errors[-1]} 15 s after node 2 led partition 0 again ({len(errors)} tries)"
    assert gone_after == set(), gone_after
    # an operator sees the broker go and come back: one WARNING each, however the proxy noticed
    told = [r.getMessage() for r in caplog.records
            if r.name == "kshare.proxy" and r.levelno == logging.WARNING and r.getMessage().startswith("broker 2 ")]
    assert len(told) == 2, told
    assert "did not accept a connection" in told[0] or "left the cluster metadata" in told[0], told
    assert "answers again" in told[1] or "is back in the cluster metadata" in told[1], told
