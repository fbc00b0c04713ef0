"""What every scenario of ``kshare bench`` shares: its description (:class:`Scenario`, built by
:func:`scenario`) and the shape of its results (:func:`results`), the alternated order of configurations,
medians, percentiles and the targets' check, and the loops of its clients (a round-robin produce, a
consumer's records until stopped, a member doing fixed work per record)."""

from __future__ import annotations

import contextlib
import math
import statistics
import sys
import threading
import time
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

FULL_BATCHES_LINGER_MS = 1000  # a producer whose batches are cut by size alone (the share scenarios)
MEMORY_OVERHEAD_MB = 200  # RSS may exceed the idle proxy's by the record-cache budget plus this
DEFAULT_CACHE_MB = 256  # kshare proxy --record-cache-mb's default

# what a scenario needs started (Scenario.needs): the fronted cluster (Apache Kafka 3.9 started by the
# bench unless --upstream), the Apache Kafka 3.9 release itself (clusters of a scenario's own), native
# Apache Kafka 4.4 with share groups, pyspark
UPSTREAM, KAFKA3, KAFKA4, PYSPARK = "upstream", "kafka3", "kafka4", "pyspark"
BROKERS = frozenset({UPSTREAM, KAFKA3, KAFKA4})


@dataclass(frozen=True)
class Scenario:
    """One scenario: how it runs, at which sizes, and how its results read.

    ``run(env, progress, **sizes)`` returns a JSON-able dict: ``config`` (what was run), ``rows`` (medians,
    one dict per table row), ``samples`` (every measured run) and ``targets`` (:func:`target`, each met or
    not); ``section(results)`` is its part of results.md (a table of its rows if None), ``plot(plt,
    results)`` its figure (none if None)."""

    name: str
    title: str
    run: Callable[..., dict[str, Any]]
    sizes: tuple[dict[str, Any], dict[str, Any]]  # (full run, --quick)
    section: Callable[[dict[str, Any]], list[str]] | None = None
    plot: Callable[[Any, dict[str, Any]], Any] | None = None
    needs: frozenset[str] = frozenset({UPSTREAM})
    opt_in: bool = False  # runs only when named (--only)
    repeats: bool = True  # takes --repeats (False: one long run or one load)
    default_repeats: int | None = None  # in a full run, instead of 3
    max_repeats: int | None = None  # never more than this (long runs that alternate anyway)
    uses_earlier: bool = False  # run() also gets ``earlier``: the results of the scenarios run before it

    @property
    def broker_less(self) -> bool:
        return not (self.needs & BROKERS)


def alternate(configs: list[str], repeat: int) -> list[str]:
    """The order of ``configs`` in round ``repeat``: forwards, backwards, forwards..."""
    return list(configs) if repeat % 2 == 0 else list(reversed(configs))


def median(xs: list[float]) -> float:
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    return statistics.median(xs) if xs else float("nan")


def target(name: str, value: float, threshold: float, op: str, unit: str = "") -> dict[str, Any]:
    met = (value >= threshold if op == ">=" else value <= threshold) if not math.isnan(value) else False
    return {"name": name, "value": value, "threshold": threshold, "op": op, "unit": unit, "met": bool(met)}


def per_round(a_secs: list[float], b_secs: list[float]) -> float:
    """The median over rounds of b's time / a's time (a's rate / b's rate) for runs of one round
    taken side by side: beside the ratio of the medians, a figure a slow spell of the machine
    that fell on a few runs of one configuration moves less."""
    return median([b / a for a, b in zip(a_secs, b_secs, strict=False) if a and b])


def pct(sorted_xs: list[float] | array, q: float) -> float:
    if not sorted_xs:
        return float("nan")
    return sorted_xs[min(len(sorted_xs) - 1, max(0, math.ceil(q * len(sorted_xs)) - 1))]


def cache_budget_mb(proxy_args: list[str], default: int) -> int:
    """The record-cache budget ``kshare proxy`` runs with, from the arguments the bench passes it."""
    for i, a in enumerate(proxy_args):
        if a == "--record-cache-mb" and i + 1 < len(proxy_args):
            return int(proxy_args[i + 1])
        if a.startswith("--record-cache-mb="):
            return int(a.split("=", 1)[1])
    return default


def scenario(module: str, title: str, **options: Any) -> Scenario:
    """The :class:`Scenario` of the scenario module named ``module`` (its ``__name__``), from the names every
    scenario module defines: ``run``, ``SIZES``, ``section`` and, when it draws one, ``plot``; ``options`` are
    the other fields (``needs``, ``opt_in``, repeats). Called last in the module, so all of them exist."""
    m = sys.modules[module]
    return Scenario(name=module.rpartition(".")[2], title=title, run=m.run, sizes=m.SIZES,
                    section=getattr(m, "section", None), plot=getattr(m, "plot", None), **options)


def results(config: dict[str, Any], rows: list[dict[str, Any]], *, samples: list[Any] | None = None,
            targets: list[dict[str, Any]] | None = None, **parts: Any) -> dict[str, Any]:
    """What a scenario's ``run`` returns: ``config`` (what was run), ``rows`` (its main table), the further
    ``parts`` its section reads, ``samples`` (every measured run) and ``targets`` (:func:`target`)."""
    return {"config": config, "rows": rows, **parts, "samples": samples or [], "targets": targets or []}


def produce_round_robin(producer: Any, topic: str, n: int, partitions: int,
                        value: bytes | Callable[[int], bytes]) -> None:
    """Hand ``n`` records to a confluent-kafka ``producer``, record ``i`` (``value``, or ``value(i)``) to
    partition ``i % partitions``; a full queue is served (its delivery reports) and the record offered again.
    The caller flushes."""
    for i in range(n):
        v = value(i) if callable(value) else value
        while True:
            try:
                producer.produce(topic, v, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.05)


def polled(consumer: Any, stop: threading.Event, timeout: float = 0.1) -> Iterator[Any]:
    """The records a confluent-kafka consumer polls (errors left out) until ``stop`` is set: the loop of the
    scenarios' working members."""
    while not stop.is_set():
        for m in consumer.poll(timeout):
            if m.error() is None:
                yield m


def work_member(consumer: Any, start: threading.Event, stop: threading.Event, work_s: float,
                times: list[float]) -> None:
    """A subscribed consumer doing ``work_s`` of work per record from ``start`` until ``stop``: when each
    record's work ended in ``times``. Closes the consumer."""
    start.wait()
    try:
        for _ in polled(consumer, stop):
            time.sleep(work_s)
            times.append(time.monotonic())
    finally:
        with contextlib.suppress(Exception):
            consumer.close()
