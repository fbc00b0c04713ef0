"""Shim: :mod:`tests.harness.drain` (this path stays for ``benchmarks/bench_share.py``)."""

from tests.harness.drain import *  # noqa: F403 - re-exported
