"""The kshare source's options, checked once on the driver with one-line errors."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from ..clients.admin import AdminError
from ..clients.settings import client_security, parse_bootstrap

REQUIRED = ("kafka.bootstrap.servers", "kafka.share.group.id", "subscribe")
# kafka.* options the share member itself honours; the rest go to the commit channel's client
MEMBER_KAFKA = {"client.id", "client.rack", "request.timeout.ms"}


class OptionError(ValueError):
    """A missing or malformed option of the kshare source."""


SPECULATION_REFUSED = ("kshare source: spark.speculation=true is not supported (a losing speculative attempt's "
                       "records would be accepted with the batch); set it to false")
NO_REUSE_REFUSED = ("kshare source: spark.python.worker.reuse=false is not supported (a Python worker that ends with "
                    "its task releases the records it read before their micro-batch commits: each would be "
                    "redelivered until archived); set it to true")


@dataclass(frozen=True, slots=True)
class Options:
    bootstrap: str
    group: str
    topics: tuple[str, ...]
    parallelism: int
    max_records: int = 500
    max_wait_ms: int = 1000
    commit_timeout_ms: int = 600_000
    kafka: tuple[tuple[str, str], ...] = ()  # every other kafka.* option, without the prefix

    def kafka_option(self, name: str, default: str | None = None) -> str | None:
        return dict(self.kafka).get(name, default)

    @property
    def member_key(self) -> tuple:
        """What makes two readers share one member in a worker process."""
        return (self.bootstrap, self.group, self.topics, self.kafka)


def _int(opts: Mapping[str, str], name: str, default: int, lo: int) -> int:
    raw = opts.get(name)
    if raw is None:
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise OptionError(f"kshare option {name} must be an integer, not {raw!r}") from None
    if value < lo:
        raise OptionError(f"kshare option {name} must be at least {lo}, not {value}")
    return value


def parse(opts: Mapping[str, str], default_parallelism: int | None = None) -> Options:
    """Options from the reader's option map (keys compared case-insensitively, as Spark does)."""
    lower = {str(k).lower(): str(v) for k, v in opts.items()}
    for name in REQUIRED:
        if not lower.get(name, "").strip():
            raise OptionError(f"kshare source: option '{name}' is required (missing or empty)")
    topics = tuple(t.strip() for t in lower["subscribe"].split(",") if t.strip())
    if not topics:
        raise OptionError("kshare source: option 'subscribe' names no topic")
    fallback = default_parallelism or os.cpu_count() or 1
    return Options(
        **_client(lower),
        topics=topics,
        parallelism=_int(lower, "parallelism", fallback, 1),
        max_records=_int(lower, "maxrecordspertask", 500, 1),
        max_wait_ms=_int(lower, "maxwaitms", 1000, 0),
        commit_timeout_ms=_int(lower, "committimeoutms", 600_000, 1000),
    )


def parse_client(opts: Mapping[str, str]) -> Options:
    """Only the bootstrap servers, the share group and the ``kafka.*`` options (no topics): what
    ``kshare.spark.reject`` needs. The caller checks that the first two are there."""
    return Options(**_client({str(k).lower(): str(v) for k, v in opts.items()}), topics=(), parallelism=1)


def _client(lower: Mapping[str, str]) -> dict:
    try:
        parse_bootstrap(lower["kafka.bootstrap.servers"])
    except AdminError as exc:
        raise OptionError(f"kshare option kafka.bootstrap.servers: {exc}".replace("--bootstrap-server: ", "")) \
            from None
    kafka = tuple(sorted((k[len("kafka."):], v) for k, v in lower.items()
                         if k.startswith("kafka.") and k not in REQUIRED))
    try:  # checked here, on the driver: the executors build the same from the same strings
        client_security(dict(kafka), "kshare source: kafka.* options")
    except AdminError as exc:
        raise OptionError(str(exc)) from None
    return {"bootstrap": lower["kafka.bootstrap.servers"].strip(), "group": lower["kafka.share.group.id"].strip(),
            "kafka": kafka}
