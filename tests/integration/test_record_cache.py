"""The record cache has one budget for every partition, and idle partitions give theirs back.

A proxy with a 2 MiB record cache share-consumes 8 partitions holding 1.6 MiB each (12.8 MiB in
all): the cache never holds much more than its budget, every record arrives, and a minute (here:
one second) after the last fetch the partitions' caches are gone.
"""

from __future__ import annotations

import threading
import time
import uuid

from kshare.share import service as service_module
from kshare.share.partition_log import MIN_FETCH_BYTES
from tests.brokers import KafkaBroker
from tests.integration.share_helpers import (
    ShareProxyThread,
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
