"""Share consumers that record every delivery and every confirmed acknowledgement (a ledger), and the
verdict of a ledger against the durable state: for the failover scenarios of ``kshare bench`` and
the crash-recovery, scale-out and broker-roll tests.

What "confirmed" means: a consumer in explicit mode acknowledges every record it polled (ACCEPT)
and calls ``commit_sync()``; a record counts as confirmed once librdkafka reported its
acknowledgement as successful (``commit_sync()`` returned ``None`` for its partition, or the
acknowledgement commit callback listed its offset with no error). A confirmed record must never
be delivered again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import AcknowledgeType, KafkaException, ShareConsumer

_log = logging.getLogger("kshare.bench.ledgers")


@dataclass(frozen=True, slots=True)
class Delivery:
    consumer: int
    partition: int
    offset: int
    delivery_count: int
    at: float


@dataclass
class Ledger:
    """Shared by the consumers: every delivery, and when each record was first confirmed."""

    deliveries: list[Delivery] = field(default_factory=list)
    confirmed: dict[tuple[int, int], float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    failed_acks: int = 0  # offsets whose acknowledgement librdkafka reported as failed
    commit_errors: Counter = field(default_factory=Counter)
    poll_errors: Counter = field(default_factory=Counter)
    refused: int = 0  # acknowledge() refused (record no longer in flight on the client)
    sync_only: int = 0  # confirmed by commit_sync() but not (yet) by the callback

    def confirm(self, partition: int, offsets: Any, at: float) -> None:
        with self.lock:
            for o in offsets:
                self.confirmed.setdefault((partition, o), at)

    def confirmed_count(self) -> int:
        return len(self.confirmed)


class Throttle:
    """Records/s per consumer once set (None: as fast as it goes), shared by the consumers of a run."""

    def __init__(self) -> None:
        self.rate: float | None = None
        self.since = 0.0

    def set(self, rate: float | None) -> None:
        self.since = time.monotonic()
        self.rate = rate


class AckingConsumer:
    """A ShareConsumer in explicit mode in its own thread: poll, record, ACCEPT all, commit_sync.

    ``throttle``: hold the consumer to the throttle's rate once set. ``commit_callback``: also count a record
    confirmed when the acknowledgement commit callback lists it (False: ``commit_sync()``'s answer alone).
    ``work_s``: time spent on each record before it is acknowledged (it holds what it polled for the
    batch's length, as an application does). ``config``: further ShareConsumer settings (e.g. a quiet
    ``error_cb``)."""

    def __init__(self, index: int, bootstrap: str, group: str, topic: str, ledger: Ledger, *,
                 max_poll: int = 100, throttle: Throttle | None = None, commit_callback: bool = True,
                 poll_s: float = 0.5, error_pause_s: float = 0.1, work_s: float = 0.0,
                 config: dict[str, Any] | None = None) -> None:
        self.index = index
        self.work_s = work_s
        self.ledger = ledger
        self.throttle = throttle
        self.poll_s, self.error_pause_s = poll_s, error_pause_s
        self.consumer = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group, "logger": _log,
                                       "share.acknowledgement.mode": "explicit", "max.poll.records": max_poll,
                                       "socket.timeout.ms": 10000, **(config or {})})
        if commit_callback:
            self.consumer.set_acknowledgement_commit_callback(self._on_commit)
        self.consumer.subscribe([topic])
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"acking-{index}", daemon=True)
        self.callback_confirmed: set[tuple[int, int]] = set()
        self.count_since = 0  # records acknowledged since the throttle was last set

    def start(self) -> AckingConsumer:
        self.thread.start()
        return self

    def _on_commit(self, offsets: dict, exc: Any) -> None:
        now = time.monotonic()
        if exc is None:
            for tp, offs in offsets.items():
                self.ledger.confirm(tp.partition, offs, now)
                self.callback_confirmed.update((tp.partition, o) for o in offs)
        else:
            with self.ledger.lock:
                self.ledger.failed_acks += sum(len(o) for o in offsets.values())
                self.ledger.commit_errors[error_name(exc)] += 1

    def _ahead(self, since: float | None) -> tuple[float | None, float]:
        """(the throttle's ``since`` last seen, seconds this consumer is ahead of the throttle's rate)."""
        th = self.throttle
        if th is None or th.rate is None:
            return since, 0.0
        if since != th.since:
            since, self.count_since = th.since, 0
        return since, since + self.count_since / th.rate - time.monotonic()

    def _run(self) -> None:
        c, ledger = self.consumer, self.ledger
        since = None
        try:
            while not self._stop.is_set():
                since, ahead = self._ahead(since)
                if ahead > 0:
                    time.sleep(min(ahead, 0.5))
                    continue
                try:
                    msgs = c.poll(self.poll_s)
                except KafkaException as exc:
                    with ledger.lock:
                        ledger.poll_errors[error_name(exc)] += 1
                    time.sleep(self.error_pause_s)
                    continue
                now = time.monotonic()
                got: dict[int, list[int]] = defaultdict(list)
                for m in msgs:
                    err = m.error()
                    if err is not None:
                        with ledger.lock:
                            ledger.poll_errors[err.name()] += 1
                        continue
                    with ledger.lock:
                        ledger.deliveries.append(Delivery(self.index, m.partition(), m.offset(),
                                                          m.delivery_count() or 0, now))
                    if self.work_s:
                        time.sleep(self.work_s)
                        now = time.monotonic()
                    try:
                        c.acknowledge(m, AcknowledgeType.ACCEPT)
                    except Exception:  # noqa: BLE001 - e.g. no longer in flight after a session reset
                        with ledger.lock:
                            ledger.refused += 1
                        continue
                    got[m.partition()].append(m.offset())
                self.count_since += sum(len(v) for v in got.values())
                if not got:
                    continue
                try:
                    results = c.commit_sync(15)
                except KafkaException as exc:
                    with ledger.lock:
                        ledger.commit_errors[error_name(exc)] += 1
                    continue
                done = time.monotonic()
                for tp, err in (results or {}).items():
                    if err is None and tp.partition in got:
                        offs = got[tp.partition]
                        with ledger.lock:
                            ledger.sync_only += sum(1 for o in offs if (tp.partition, o) not in self.callback_confirmed)
                        ledger.confirm(tp.partition, offs, done)
                    elif err is not None:
                        with ledger.lock:
                            ledger.commit_errors[error_name(err)] += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            _log.exception("consumer %d failed", self.index)
            self.errors.append(exc)

    def ask_to_stop(self) -> None:
        """Let the thread finish its round (stopping many consumers at once: this on each, then close)."""
        self._stop.set()

    def close(self, timeout: float = 60) -> None:
        self.thread.join(timeout)
        try:
            self.consumer.close()
        except Exception as exc:  # noqa: BLE001
            _log.info("closing consumer %d: %r", self.index, exc)

    def stop(self) -> None:
        self.ask_to_stop()
        self.close()


def error_name(exc: Any) -> str:
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else exc
    name = getattr(err, "name", None)
    return name() if callable(name) else type(exc).__name__


@dataclass
class Verdict:
    """What the ledger shows against the final durable state."""

    records: int
    deliveries: int
    distinct: int
    redelivered_records: int
    redeliveries: int
    after_confirmation: list[tuple[Delivery, float]]
    never_confirmed: int
    max_deliveries: int
    per_crash: list[int]

    def summary(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "after_confirmation"} | {
            "after_confirmation": len(self.after_confirmation)}


def judge(ledger: Ledger, ends: dict[int, int], crash_times: list[float]) -> Verdict:
    by_record: dict[tuple[int, int], list[Delivery]] = defaultdict(list)
    for d in sorted(ledger.deliveries, key=lambda d: d.at):
        by_record[(d.partition, d.offset)].append(d)
    after: list[tuple[Delivery, float]] = []
    per_crash = [0] * (len(crash_times) + 1)
    redeliveries = 0
    for rec, ds in by_record.items():
        confirmed_at = ledger.confirmed.get(rec)
        if confirmed_at is not None:
            after += [(d, confirmed_at) for d in ds if d.at > confirmed_at]
        for d in ds[1:]:
            redeliveries += 1
            # the latest crash before this redelivery (index 0: none, which must not happen)
            per_crash[sum(1 for t in crash_times if t < d.at)] += 1
    total = sum(ends.values())
    return Verdict(
        records=total,
        deliveries=len(ledger.deliveries),
        distinct=len(by_record),
        redelivered_records=sum(1 for ds in by_record.values() if len(ds) > 1),
        redeliveries=redeliveries,
        after_confirmation=after,
        never_confirmed=sum(1 for rec in by_record if rec not in ledger.confirmed),
        max_deliveries=max((len(ds) for ds in by_record.values()), default=0),
        per_crash=per_crash,
    )
