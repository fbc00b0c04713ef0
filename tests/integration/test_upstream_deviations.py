"""No silent wrong answers on a cluster that deviates from Kafka: the embedded Tansu broker.

Tansu answers a partition's end offset as its last batch's base offset + 1, so after one batch of
3 records it says 1, not 3 (``test_tansu_still_answers_short``, which fails the day Tansu is fixed
and this workaround can go). Through kshare, every end offset a user meets is right: a share
group starting at ``latest`` gets only what is produced after it joined, ListOffsets LATEST through
the proxy (what ``kshare groups --reset-offsets --to-latest`` and lag are computed from) answers the
real end. Each deviation found is one WARNING line and ``kshare_upstream_deviation{check} 1``; on
Apache Kafka there is none.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.harness.brokers import KafkaBroker, TansuBroker
from tests.harness.share import ShareProxyThread, poll_until, quiet_logger, share_group, subscribed

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]


def one_batch(bootstrap: str, topic: str, values: list[bytes]) -> None:
    """``values`` in a single record batch on partition 0."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 500, "batch.num.messages": len(values),
                  "logger": quiet_logger()})
    for v in values:
        p.produce(topic, value=v, partition=0)
    assert p.flush(30) == 0


def watermarks(bootstrap: str, topic: str) -> tuple[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"wm-{uuid.uuid4().hex[:6]}",
                  "logger": quiet_logger()})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)
    finally:
        c.close()


@pytest.fixture(scope="module")
def on_tansu(tansu: TansuBroker):
    with ShareProxyThread(tansu.bootstrap) as proxy:
        yield proxy


def new_topic(broker, name: str | None = None) -> str:
    topic = name or f"dev-{uuid.uuid4().hex[:8]}"
    broker.create_topic(topic, partitions=1)
    return topic


def test_tansu_still_answers_short(tansu: TansuBroker) -> None:
    topic = new_topic(tansu)
    one_batch(tansu.bootstrap, topic, [b"a", b"b", b"c"])
    assert watermarks(tansu.bootstrap, topic) == (0, 1), "Tansu was fixed: the end-offset workaround can go"


def test_found_once_with_a_metric(on_tansu: ShareProxyThread) -> None:
    checks = on_tansu.service.upstream.checks
    assert {"end_offsets", "offset_commit_metadata", "producer_ids", "delete_records"} <= set(checks.deviations)
    families = {m.name: m for m in on_tansu.app.metrics.registry.collect()}
    gauge = {s.labels["check"]: s.value for s in families["kshare_upstream_deviation"].samples}
    assert gauge == {"end_offsets": 1, "offset_commit_metadata": 1, "producer_ids": 1, "delete_records": 1}


def test_latest_through_the_proxy_is_the_real_end(tansu: TansuBroker, on_tansu: ShareProxyThread) -> None:
    topic = new_topic(tansu)
    one_batch(tansu.bootstrap, topic, [b"a", b"b", b"c"])
    before = on_tansu.service.upstream.checks.end_offset_corrections
    assert watermarks(on_tansu.bootstrap, topic) == (0, 3)
    assert on_tansu.service.upstream.checks.end_offset_corrections > before
    # kshare groups plans --to-latest from the same answer
    proc = subprocess.run([sys.executable, "-m", "kshare", "groups", "--bootstrap-server", on_tansu.bootstrap,
                           "--reset-offsets", "--to-latest", "--group", f"g-{topic}", "--topic", topic,
                           "--dry-run"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    row = next(line.split() for line in proc.stdout.splitlines() if line.startswith(f"g-{topic}"))
    assert row[2:] == ["0", "-", "3"], proc.stdout


def test_a_group_starting_at_latest_skips_the_old_batch(tansu: TansuBroker, on_tansu: ShareProxyThread) -> None:
    topic = new_topic(tansu)
    one_batch(tansu.bootstrap, topic, [b"old-1", b"old-2", b"old-3"])
    group = f"g-{topic}"
    service = on_tansu.service

    def start_offset() -> int | None:
        sp = next((sp for key, sp in list(service.partitions.items())
                   if key.group_id == group and sp.engine is not None), None)
        return None if sp is None else sp.engine.start_offset

    with subscribed(on_tansu.bootstrap, group, topic) as consumer:
        # the share-partition is initialised at latest when the member first fetches it
        assert poll_until(consumer, lambda out: start_offset() is not None, 30.0) == []
        assert start_offset() == 3
        one_batch(tansu.bootstrap, topic, [b"new-1", b"new-2"])
        got = poll_until(consumer, lambda out: len(out) >= 2, 30.0)
        poll_until(consumer, lambda out: False, 1.0)  # anything more would show up here
    assert [g.value for g in got] == [b"new-1", b"new-2"]


def test_no_deviation_on_apache_kafka(kafka39: KafkaBroker) -> None:
    with ShareProxyThread(kafka39.bootstrap) as proxy:
        checks = proxy.service.upstream.checks
        assert checks.deviations == {}
        topic = new_topic(kafka39)
        one_batch(kafka39.bootstrap, topic, [b"a", b"b", b"c"])
        assert watermarks(proxy.bootstrap, topic) == (0, 3)
        assert checks.end_offset_corrections == 0


def test_the_state_is_replayed_whole_on_tansu(tansu: TansuBroker) -> None:
    """A proxy restarted on a Tansu cluster: what was acknowledged stays so (the store-level test
    below makes the state topic end in a batch of several records)."""
    state_topic = f"__kshare_state_dev_{uuid.uuid4().hex[:8]}"
    topic = f"dev-{uuid.uuid4().hex[:8]}"
    tansu.create_topic(topic, partitions=4)
    group = f"g-{topic}"
    values = [b"r%d" % i for i in range(20)]
    p = Producer({"bootstrap.servers": tansu.bootstrap, "linger.ms": 200, "logger": quiet_logger()})
    for i, v in enumerate(values):
        p.produce(topic, value=v, partition=i % 4)
    assert p.flush(30) == 0
    # one state partition: the writes of the four share-partitions go out together, several records
    # in a batch, which the cluster's end offset then falls inside
    config = {"state_topic": state_topic, "state_topic_partitions": 1}
    with ShareProxyThread(tansu.bootstrap, **config) as proxy:
        share_group(proxy.bootstrap, group)
        with subscribed(proxy.bootstrap, group, topic) as consumer:
            got = poll_until(consumer, lambda out: len(out) >= 20, 60.0)
            assert sorted(g.value for g in got) == sorted(values)
            poll_until(consumer, lambda out: False, 2.0)  # acknowledges the last poll (implicit mode)
        before = {k: v.start_offset for k, v in proxy.service.store.share_partitions().items() if k.group_id == group}
    assert sorted(before.values()) == [5, 5, 5, 5], before
    with ShareProxyThread(tansu.bootstrap, **config) as proxy:
        after = {k: v.start_offset for k, v in proxy.service.store.share_partitions().items() if k.group_id == group}
        assert after == before
        with subscribed(proxy.bootstrap, group, topic) as consumer:
            assert poll_until(consumer, lambda out: False, 3.0) == []


def test_the_state_store_replays_a_last_batch_of_several_records(tansu: TansuBroker) -> None:
    """The state store alone: one round writes four share-partitions' snapshots in one batch, the
    last of the topic; a new store replays all four, although Tansu's end offset stops after the first."""
    import uvloop

    from kshare.security import ClientSecurity
    from kshare.share.state.topic_store import TopicStateStore
    from kshare.share.states import ShareSnapshot
    from kshare.share.store import SharePartitionKey
    from kshare.share.upstream_checks import UpstreamChecks, check_upstream

    topic = f"__kshare_state_dev_{uuid.uuid4().hex[:8]}"
    keys = [SharePartitionKey("g", bytes(range(16)), p) for p in range(4)]
    written = {k: ShareSnapshot(10 + i, ()) for i, k in enumerate(keys)}

    async def go() -> dict:
        checks = UpstreamChecks()
        await check_upstream(tansu.bootstrap, ClientSecurity(), checks)
        assert checks.short_end_offsets
        store = TopicStateStore(tansu.bootstrap, topic=topic, partitions=1, prune_interval_s=3600)
        store.checks = checks
        await store.start()
        await store.write(list(written.items()))
        await store.close()
        again = TopicStateStore(tansu.bootstrap, topic=topic, partitions=1, prune_interval_s=3600)
        again.checks = checks
        await again.start()
        await again.close()
        return again.share_partitions()

    replayed = uvloop.run(go())
    assert {k: s.start_offset for k, s in replayed.items()} == {k: s.start_offset for k, s in written.items()}
