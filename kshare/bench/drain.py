"""How evenly a share group's members share the work: the drain ratio with real ShareConsumers.

``M`` confluent-kafka ShareConsumers (threads; the 5 ms of "work" per record is a sleep, which
releases the GIL) join a group on a ``P``-partition topic; once every member is in the group,
``records`` records are produced round-robin over the partitions. The ratio is the ideal drain
time (records x work / members, adjusted for members joining and leaving on the way) over the
time from the first record produced to the last one processed: 1.0 when no member ever idles
while work waits. Run by ``kshare bench --only balance`` (:mod:`kshare.bench.scenarios.balance`) and
by the tests (tests/integration/test_share_differential.py, test_fair_acquisition.py), against kshare
and native Apache Kafka 4.4 alike.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from dataclasses import dataclass, field

from confluent_kafka import Producer, ShareConsumer

from ..clients.admin import AdminError, ShareGroupAdmin
from ..clients.settings import parse_bootstrap


@dataclass
class DrainResult:
    members: int
    partitions: int
    records: int
    ratio: float  # ideal drain time / actual
    seconds: float
    ideal: float
    per_member: list[int] = field(default_factory=list)  # records processed by each member, as joined
    redelivered: int = 0  # deliveries of an offset already processed (at-least-once redeliveries)
    missing: int = 0  # records never processed (0 unless the run timed out)


class _Member(threading.Thread):
    def __init__(self, bootstrap: str, group: str, topic: str, work_s: float, max_poll: int,
                 seen: dict[tuple[int, int], int], lock: threading.Lock) -> None:
        super().__init__(daemon=True, name=f"drain-{group}")
        self.consumer = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group,
                                       "max.poll.records": max_poll, "log_level": 3,
                                       "error_cb": lambda *_: None})
        self.consumer.subscribe([topic])
        self.work_s, self.seen, self.lock = work_s, seen, lock
        self.processed = 0
        self.last_done = 0.0
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                for m in self.consumer.poll(0.1):
                    if m.error() is not None:
                        continue
                    time.sleep(self.work_s)
                    key = (m.partition(), m.offset())
                    with self.lock:
                        self.seen[key] = self.seen.get(key, 0) + 1
                    self.processed += 1
                    self.last_done = time.monotonic()
        finally:
            self.consumer.close()  # implicit mode: what was processed is accepted, the rest released


def members_in_group(bootstrap: str, group: str) -> int:
    async def count() -> int:
        try:
            async with ShareGroupAdmin(parse_bootstrap(bootstrap), timeout_ms=10000) as admin:
                described = await admin.describe_group(group)
                return sum(1 for m in described.members if m.assignment)
        except AdminError:
            return 0

    return asyncio.run(count())


def drain(bootstrap: str, producer_bootstrap: str, topic: str, group: str, *, partitions: int, members: int,
          work_ms: float = 5.0, per_member: int = 300, max_poll: int = 10,
          joins: tuple[float, ...] = (), leaves: tuple[float, ...] = (), timeout: float = 120.0) -> DrainResult:
    """Drain ``members * per_member`` records; the topic must exist with ``partitions`` partitions
    and the group be configured to start at the earliest offset. ``joins`` / ``leaves``: at these
    fractions of the ideal drain time one member more joins / one of the first members leaves."""
    work_s = work_ms / 1000
    records = members * per_member
    seen: dict[tuple[int, int], int] = {}
    lock = threading.Lock()
    group_members = [_Member(bootstrap, group, topic, work_s, max_poll, seen, lock) for _ in range(members)]
    for m in group_members:
        m.start()
    deadline = time.monotonic() + 60
    while members_in_group(bootstrap, group) < members:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{members} members did not all join {group} within 60 s")
        time.sleep(0.2)

    # small producer batches: share fetches acquire whole batches (MaxRecords is a soft limit in
    # Kafka's batch-optimized mode), so one big batch would go to whoever fetches first
    producer = Producer({"bootstrap.servers": producer_bootstrap, "linger.ms": 5, "batch.num.messages": max_poll,
                         "log_level": 3})
    started = time.monotonic()
    for i in range(records):
        while True:
            try:
                producer.produce(topic, f"r-{i}".encode(), partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.01)
    assert producer.flush(60) == 0

    ideal_alone = records * work_s / members
    events = sorted([(f * ideal_alone, +1) for f in joins] + [(f * ideal_alone, -1) for f in leaves])
    pending = list(events)
    left: list[_Member] = []
    end = started + timeout
    while time.monotonic() < end:
        with lock:
            if len(seen) >= records:
                break
        now = time.monotonic() - started
        while pending and pending[0][0] <= now:
            _, change = pending.pop(0)
            if change > 0:
                joiner = _Member(bootstrap, group, topic, work_s, max_poll, seen, lock)
                joiner.start()
                group_members.append(joiner)
            else:
                leaver = next(m for m in group_members if m not in left)
                leaver.stop.set()
                left.append(leaver)
        time.sleep(0.01)
    for m in group_members:
        m.stop.set()
    for m in group_members:
        m.join(30)
    with lock:
        done = len(seen)
        redelivered = sum(n - 1 for n in seen.values())
    last = max(m.last_done for m in group_members)
    seconds = last - started
    return DrainResult(members, partitions, records, _ideal(records * work_s, members, events) / seconds, seconds,
                       _ideal(records * work_s, members, events), [m.processed for m in group_members],
                       redelivered, records - done)


def _ideal(work: float, members: int, events: list[tuple[float, int]]) -> float:
    """When ``work`` seconds of processing finish with ``members`` changing at ``events``."""
    t, n = 0.0, members
    for at, change in events:
        if n > 0 and work <= (at - t) * n:
            break
        work -= (at - t) * n
        t, n = at, n + change
    return t + work / n


def names(prefix: str) -> tuple[str, str]:
    tag = uuid.uuid4().hex[:10]
    return f"{prefix}-{tag}", f"{prefix}-share-{tag}"
