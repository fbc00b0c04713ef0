"""Shim: the tests' brokers are :mod:`tests.harness.brokers`; this path stays for the scripts and docs
that run ``python -m tests.brokers fetch 3.9.2 4.4.0`` or import ``tests.brokers``."""

from __future__ import annotations

import sys

from tests.harness.brokers import *  # noqa: F403 - re-exported
from tests.harness.brokers import (  # noqa: F401 - re-exported (private names too)
    DEFAULT_JVM_OPTS,
    DEFAULT_USERS,
    SASL_MECHANISMS,
    SECURE_PROTOCOLS,
    KafkaBroker,
    SecureKafkaBroker,
    TansuBroker,
    _admin,
    _java,
    _main,
    _Process,
    _start_timeout,
    cache_root,
    ensure_kafka,
    free_port,
    tansu_bin,
)

if __name__ == "__main__":
    sys.exit(_main(prog="python -m tests.brokers"))
