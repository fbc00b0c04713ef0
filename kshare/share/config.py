"""Share group configs: defaults, bounds, validation (DescribeConfigs / IncrementalAlterConfigs on GROUP).

Names and defaults follow Apache Kafka 4.4 (reference.md section 2). Bounds are the broker-level
``group.share.*`` limits, which a proxy operator sets (``BrokerLimits``, a setting of the proxy in
:mod:`kshare.proxy.config`; ``limits_from`` reads them from ``--group-limit NAME=VALUE``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from ..proxy.config import BrokerLimits


class ConfigError(ValueError):
    """An invalid config name or value (INVALID_CONFIG, 40)."""


# Apache Kafka's broker config name for each limit (``--group-limit NAME=VALUE`` on the command line).
LIMIT_NAMES: dict[str, str] = {
    "group.share.min.record.lock.duration.ms": "min_record_lock_duration_ms",
    "group.share.max.record.lock.duration.ms": "max_record_lock_duration_ms",
    "group.share.min.session.timeout.ms": "min_session_timeout_ms",
    "group.share.max.session.timeout.ms": "max_session_timeout_ms",
    "group.share.min.heartbeat.interval.ms": "min_heartbeat_interval_ms",
    "group.share.max.heartbeat.interval.ms": "max_heartbeat_interval_ms",
    "group.share.min.delivery.count.limit": "min_delivery_count_limit",
    "group.share.max.delivery.count.limit": "max_delivery_count_limit",
    "group.share.max.partition.max.record.locks": "max_record_locks_cap",
    "group.share.max.size": "max_group_size",
    "group.share.max.share.sessions": "max_share_sessions",
}


def limits_from(pairs: dict[str, str]) -> BrokerLimits:
    """BrokerLimits with the given ``group.share.*`` overrides (ConfigError on unknown names)."""
    values = {}
    for name, value in pairs.items():
        attr = LIMIT_NAMES.get(name)
        if attr is None:
            raise ConfigError(f"unknown broker-level share group limit {name!r} (known: {', '.join(LIMIT_NAMES)})")
        try:
            values[attr] = int(value)
        except ValueError:
            raise ConfigError(f"{name} must be an integer") from None
    return BrokerLimits(**values)


_DURATION = re.compile(r"^P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?$")


def parse_duration_ms(text: str) -> int:
    """ISO-8601 duration (``PnDTnHnMn.nS``) as used by ``by_duration:``, in milliseconds."""
    m = _DURATION.match(text)
    if not m or text in ("P", "PT"):
        raise ConfigError(f"not an ISO-8601 duration: {text!r}")
    days, hours, minutes, seconds = m.groups()
    total = int(days or 0) * 86_400_000 + int(hours or 0) * 3_600_000 + int(minutes or 0) * 60_000
    return total + int(float(seconds or 0) * 1000)


def _validate_reset(value: str) -> str:
    if value in ("earliest", "latest"):
        return value
    if value.startswith("by_duration:"):
        ms = parse_duration_ms(value.removeprefix("by_duration:"))
        if ms < 0:
            raise ConfigError("by_duration must not be negative")
        return value
    raise ConfigError("share.auto.offset.reset must be earliest, latest or by_duration:<ISO-8601 duration>")


@dataclass(frozen=True, slots=True)
class ConfigDef:
    name: str
    type: str  # "int", "string", "boolean" (DescribeConfigs config types 3, 2, 1)
    default: str
    validate: Callable[[str, BrokerLimits], object]
    doc: str


def _int_in(lo_attr: str | int, hi_attr: str | int) -> Callable[[str, BrokerLimits], int]:
    def check(value: str, limits: BrokerLimits) -> int:
        try:
            v = int(value)
        except ValueError:
            raise ConfigError(f"not an integer: {value!r}") from None
        lo = getattr(limits, lo_attr) if isinstance(lo_attr, str) else lo_attr
        hi = getattr(limits, hi_attr) if isinstance(hi_attr, str) else hi_attr
        if not lo <= v <= hi:
            raise ConfigError(f"must be between {lo} and {hi}")
        return v

    return check


def _bool(value: str, limits: BrokerLimits) -> bool:
    if value.lower() not in ("true", "false"):
        raise ConfigError("must be true or false")
    return value.lower() == "true"


def _one_of(*choices: str) -> Callable[[str, BrokerLimits], str]:
    def check(value: str, limits: BrokerLimits) -> str:
        if value not in choices:
            raise ConfigError(f"must be one of {', '.join(choices)}")
        return value

    return check


def _topic_name(value: str, limits: BrokerLimits) -> str:
    if value and not re.fullmatch(r"[A-Za-z0-9._-]{1,249}", value):
        raise ConfigError("not a valid topic name")
    return value


CONFIG_DEFS: dict[str, ConfigDef] = {
    d.name: d
    for d in (
        ConfigDef("share.auto.offset.reset", "string", "latest", lambda v, _: _validate_reset(v),
                  "Where a share-partition starts when it has no state: earliest, latest, by_duration:<ISO-8601>"),
        ConfigDef("share.isolation.level", "string", "read_uncommitted",
                  _one_of("read_uncommitted", "read_committed"), "Whether records of open/aborted transactions are delivered"),
        ConfigDef("share.record.lock.duration.ms", "int", "30000",
                  _int_in("min_record_lock_duration_ms", "max_record_lock_duration_ms"), "Acquisition lock duration"),
        ConfigDef("share.session.timeout.ms", "int", "45000",
                  _int_in("min_session_timeout_ms", "max_session_timeout_ms"), "Member session timeout"),
        ConfigDef("share.heartbeat.interval.ms", "int", "5000",
                  _int_in("min_heartbeat_interval_ms", "max_heartbeat_interval_ms"), "Heartbeat interval told to members"),
        ConfigDef("share.assignment.interval.ms", "int", "1000", _int_in(0, 15_000),
                  "How often assignments are recomputed for topic changes"),
        ConfigDef("share.delivery.count.limit", "int", "5",
                  _int_in("min_delivery_count_limit", "max_delivery_count_limit"), "Deliveries before a record is archived"),
        ConfigDef("share.partition.max.record.locks", "int", "2000", _int_in(100, "max_record_locks_cap"),
                  "In-flight records per share-partition"),
        ConfigDef("share.renew.acknowledge.enable", "boolean", "true", _bool, "Whether Renew acknowledgements are allowed"),
        ConfigDef("errors.deadletterqueue.topic.name", "string", "", _topic_name,
                  "Topic archived records are copied to (empty: none)"),
        ConfigDef("errors.deadletterqueue.copy.record.enable", "boolean", "false", _bool,
                  "Copy the key and value of dead-lettered records, not only context headers"),
        # kshare's own (docs/design/ordering-and-backoff.md): off by default, behaviour as Apache Kafka's
        ConfigDef("kshare.share.redelivery.backoff.ms", "int", "0", _int_in(0, 3_600_000),
                  "kshare: a released or timed-out record is delivered again only after this long, doubled "
                  "for every delivery after the first (0: at once, as Apache Kafka)"),
        ConfigDef("kshare.share.redelivery.backoff.max.ms", "int", "60000", _int_in(0, 86_400_000),
                  "kshare: the longest redelivery backoff, however many deliveries"),
        ConfigDef("kshare.share.ordering", "string", "none", _one_of("none", "key"),
                  "kshare: key: records of one key go to one consumer at a time, in offset order "
                  "(none: no order, as Apache Kafka)"),
    )
}


@dataclass(slots=True)
class GroupConfig:
    """The effective configs of one share group: dynamic overrides over the defaults."""

    overrides: dict[str, str] = field(default_factory=dict)
    limits: BrokerLimits = field(default_factory=BrokerLimits)

    def get(self, name: str) -> str:
        return self.overrides.get(name, CONFIG_DEFS[name].default)

    def int(self, name: str) -> int:
        return int(self.get(name))

    def bool(self, name: str) -> bool:
        return self.get(name).lower() == "true"

    @property
    def record_lock_duration_ms(self) -> int:
        return self.int("share.record.lock.duration.ms")

    @property
    def session_timeout_ms(self) -> int:
        return self.int("share.session.timeout.ms")

    @property
    def heartbeat_interval_ms(self) -> int:
        return self.int("share.heartbeat.interval.ms")

    @property
    def delivery_count_limit(self) -> int:
        return self.int("share.delivery.count.limit")

    @property
    def max_record_locks(self) -> int:
        return self.int("share.partition.max.record.locks")

    @property
    def renew_enabled(self) -> bool:
        return self.bool("share.renew.acknowledge.enable")

    @property
    def redelivery_backoff_ms(self) -> int:
        return self.int("kshare.share.redelivery.backoff.ms")

    @property
    def redelivery_backoff_max_ms(self) -> int:
        return self.int("kshare.share.redelivery.backoff.max.ms")

    @property
    def key_ordered(self) -> bool:
        return self.get("kshare.share.ordering") == "key"

    @property
    def read_committed(self) -> bool:
        return self.get("share.isolation.level") == "read_committed"

    @property
    def auto_offset_reset(self) -> str:
        return self.get("share.auto.offset.reset")

    @property
    def dlq_topic(self) -> str:
        return self.get("errors.deadletterqueue.topic.name")

    @property
    def dlq_copy_record(self) -> bool:
        return self.bool("errors.deadletterqueue.copy.record.enable")


def validate(name: str, value: str | None, limits: BrokerLimits) -> None:
    """Raise ConfigError unless ``name=value`` may be set on a share group (None: delete)."""
    d = CONFIG_DEFS.get(name)
    if d is None:
        raise ConfigError(f"unknown group config {name!r}")
    if value is not None:
        try:
            d.validate(value, limits)
        except ConfigError as exc:
            raise ConfigError(f"invalid value {value!r} for {name}: {exc}") from None
