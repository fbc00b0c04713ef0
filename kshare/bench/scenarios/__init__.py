"""The scenarios of ``kshare bench``, one module each, and their registry.

Every module defines ``SCENARIO``, a :class:`~kshare.bench.scenarios.common.Scenario`: its ``run(env,
progress, **sizes)`` takes the :class:`~kshare.bench.runner.Env` (brokers, relay and proxy, started on
first use), the sizes of this run and a progress reporter, and returns a JSON-able dict: ``config`` (what
was run), ``rows`` (medians, one dict per table row), ``samples`` (every measured run) and ``targets``
(the target ratios, each met or not); its ``section`` and ``plot`` turn that into its part of
``results.md`` and its PNG.

Every scenario alternates its configurations over the repeats (A B C, C B A, A B C, ...) after an
untimed warm-up, so that a machine whose load changes during the run biases none of them, and
reports medians. The micro-benchmarks (``codec``, ``engine``, ``record_keys``, ``state_replay``) need
no broker: they time kshare's pure units in this process, against a baseline in the same run where
there is one.

A new scenario: a module here with its ``SCENARIO``, and its name in ``_MODULES`` (the order of a
full run and of ``kshare bench --list``). Modules that are not scenarios: :mod:`.common` (what they all
share), :mod:`.failover_analysis` (the failover scenario's pure analysis), :mod:`.instance_group` (the
scale-out scenarios' proxies), :mod:`.scale_out_handover` (the hand-over part of ``scale_out``).
"""

from __future__ import annotations

import importlib

from .common import Scenario, alternate, median, pct, per_round, target

# the order of a full run: cpu reads the passthrough and share scenarios' results when they ran before it
_MODULES = (
    "passthrough",
    "share",
    "scaling",
    "latency",
    "ack",
    "cpu",
    "memory",
    "embedded",
    "spark",
    "failover",
    "aioconsumer",
    "aio100",
    # figures for the docs, only when named
    "durability",
    "state_store",
    "key_order",
    "balance",
    "security",
    "scale_out",
    "scale_out_failover",
    # micro-benchmarks: no broker, only when named
    "codec",
    "engine",
    "record_keys",
    "state_replay",
)

REGISTRY: dict[str, Scenario] = {
    name: importlib.import_module(f"{__name__}.{name}").SCENARIO for name in _MODULES
}
SCENARIOS = tuple(REGISTRY)
# run only when named (--only)
OPT_IN = tuple(name for name, s in REGISTRY.items() if s.opt_in)

__all__ = ["OPT_IN", "REGISTRY", "SCENARIOS", "Scenario", "alternate", "median", "pct", "per_round", "target"]
