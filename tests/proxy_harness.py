"""Shim: the tests' proxy launchers are :mod:`tests.harness.proxies` (this path stays for the benchmark scripts)."""

from tests.harness.proxies import LoopThread, ProxyProcess, ProxyThread  # noqa: F401 - re-exported
