"""Real Kafka-compatible brokers for tests, benchmarks and CI scripts: :mod:`kshare.bench.brokers`.

The code lives in the package (``kshare bench`` starts the same brokers from an installed kshare);
this module re-exports it under the names the tests, benchmarks and ``.ci/run`` use, and gives
secure brokers their throwaway certificates from :mod:`tests.tls`.
``python -m tests.brokers fetch 3.9.2 4.4.0`` resolves Apache Kafka releases into the cache.
"""

from __future__ import annotations

import sys
from pathlib import Path

from kshare.bench import brokers as _brokers
from kshare.bench.brokers import (  # noqa: F401 - re-exported
    DEFAULT_JVM_OPTS,
    DEFAULT_USERS,
    KAFKA_3,
    KAFKA_4,
    SASL_MECHANISMS,
    SECURE_PROTOCOLS,
    BrokerError,
    KafkaBroker,
    TansuBroker,
    _admin,
    _die_with_parent,
    _java,
    _port_open,
    _Process,
    _start_timeout,
    cache_root,
    ensure_kafka,
    free_port,
    set_tls_factory,
    tansu_bin,
)

__all__ = [
    "KAFKA_3",
    "KAFKA_4",
    "DEFAULT_USERS",
    "SASL_MECHANISMS",
    "SECURE_PROTOCOLS",
    "BrokerError",
    "KafkaBroker",
    "TansuBroker",
    "cache_root",
    "ensure_kafka",
    "free_port",
]


def _make_tls(directory: Path):
    from tests.tls import make_tls

    return make_tls(directory)


if _brokers._tls_factory is None:
    set_tls_factory(_make_tls)


if __name__ == "__main__":
    sys.exit(_brokers._main(prog="python -m tests.brokers"))
