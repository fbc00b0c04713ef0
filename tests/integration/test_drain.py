"""A proxy stopped with SIGTERM first lets its share consumers acknowledge what they hold.

Two confluent ``ShareConsumer``s (implicit acknowledgement, 50 records a poll, 10 ms of work a
record: each holds up to half a second of work at any time) drain a topic through a ``kshare
proxy`` process, which gets SIGTERM half-way and is started again on the same ports and state
topic. With ``--drain-timeout`` the proxy hands nothing out after the signal, the consumers' next
polls carry their acknowledgements, which are written before the proxy stops: no record is
delivered twice. With ``--drain-timeout 0`` (the stop kshare had before) what the consumers held
is released when their connections close and delivered again: the same test shows redeliveries,
so it can tell the two apart. Nothing is lost either way.
"""

from __future__ import annotations

import logging
import signal
import time
import uuid
from collections import Counter

import pytest

from tests.harness.brokers import KafkaBroker
from tests.harness.ledgers import produce_fast
from tests.harness.proxies import KShareProcess
from tests.harness.share import ConsumerLoop, share_group, stop_all, wait_until

log = logging.getLogger("kshare.tests.drain")

RECORDS = 3000
PARTITIONS = 2


def _restart_under_load(kafka39: KafkaBroker, topic: str, drain_s: float) -> tuple[Counter, str]:
    kafka39.create_topic(topic, PARTITIONS)
    produce_fast(kafka39.bootstrap, topic, RECORDS, PARTITIONS)
    kshare = KShareProcess(kafka39, f"__kshare_drain_{uuid.uuid4().hex[:8]}", "--drain-timeout", str(drain_s))
    kshare.start()
    group = f"drain-{uuid.uuid4().hex[:8]}"
    loops: list[ConsumerLoop] = []
    try:
        share_group(kshare.bootstrap, group)
        loops = [ConsumerLoop(f"c{i}", kshare.bootstrap, group, topic, process_s=0.01,
                              **{"max.poll.records": 50}).start() for i in range(2)]
        wait_until(lambda: sum(len(lp.received) for lp in loops) >= RECORDS // 4, 60, "a quarter of the records")
        kshare.current.send_signal(signal.SIGTERM)
        assert kshare.current.wait(60) == 0
        kshare.start()
        expected = {str(i).encode() for i in range(RECORDS)}
        wait_until(lambda: expected <= {g.value for lp in loops for g in lp.received}, 120, "every record")
        time.sleep(1.0)  # nothing else may come
    finally:
        stop_all(loops)
        kshare.stop()
    assert not kshare.tracebacks(), kshare.digest()
    return Counter(g.value for lp in loops for g in lp.received), kshare.output(0)


@pytest.mark.timeout(300)
def test_sigterm_drains_what_consumers_hold_before_stopping(kafka39: KafkaBroker, topic_name: str) -> None:
    counts, first = _restart_under_load(kafka39, topic_name, 10.0)
    assert len(counts) == RECORDS
    twice = sorted(v for v, n in counts.items() if n > 1)
    assert twice == [], f"{len(twice)} records delivered more than once, e.g. {twice[:5]}"
    assert "drained in" in first, first[-3000:]
    log.info("%s", "".join(line for line in first.splitlines(keepends=True) if "drain" in line))


@pytest.mark.timeout(300)
def test_without_a_drain_what_consumers_held_comes_again(kafka39: KafkaBroker, topic_name: str) -> None:
    counts, _ = _restart_under_load(kafka39, topic_name, 0.0)
    assert len(counts) == RECORDS  # nothing lost
    again = sum(1 for n in counts.values() if n > 1)
    log.info("without a drain: %d of %d records delivered more than once", again, RECORDS)
    assert again, "no redelivery without a drain: the test cannot tell"
