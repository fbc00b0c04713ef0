"""Shim: the tests' TLS material is :mod:`tests.harness.tls` (this path stays for the benchmark scripts)."""

from tests.harness.tls import *  # noqa: F403 - re-exported
from tests.harness.tls import DEFAULT_HOSTS, TlsError, TlsMaterial, make_tls  # noqa: F401 - re-exported
