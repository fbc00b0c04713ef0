"""The state topic's creation and checks (admin requests, once at start)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from ...protocol.codes import ErrorCode
from .errors import StateStoreError

log = logging.getLogger("kshare.share.state_topic")  # the state store's one logger, named as documented

DEFAULT_TOPIC = "__share_group_state"
#: The name to use where Kafka itself owns ``__share_group_state`` (Apache Kafka 4.x clusters).
ALTERNATIVE_TOPIC = "__kshare_share_group_state"


async def ensure_topic(admin: Any, topic: str, partitions: int, *, replication_factor: int | None,
                       min_insync_replicas: int | None, timeout_s: float) -> tuple[bool, int]:
    """Create the topic if missing and check it: (True when this call created it, its partition
    count). An existing topic keeps its partition count (it must never change: the partition of a
    share-partition's records depends on it)."""
    from aiokafka.admin import NewTopic

    # list_topics, not a metadata request naming the topic: that would auto-create it
    # (auto.create.topics.enable) with the broker's default settings
    created = False
    if topic not in await admin.list_topics():
        cluster = await admin.describe_cluster()
        brokers = len(cluster.get("brokers", ())) or 1
        rf = replication_factor or min(3, brokers)
        min_isr = min_insync_replicas or (2 if rf >= 3 else 1)
        configs = {
            "cleanup.policy": "delete",
            "retention.ms": "-1",
            "retention.bytes": "-1",
            "min.insync.replicas": str(min_isr),
        }
        resp = await admin.create_topics(
            [NewTopic(topic, partitions, rf, topic_configs=configs)], timeout_ms=int(timeout_s * 1000)
        )
        for topic_error in resp.topic_errors:
            code, message = topic_error[1], topic_error[2] if len(topic_error) > 2 else None
            if code not in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS):  # already: someone else was faster
                raise StateStoreError(f"cannot create the state topic {topic}: error {code} {message or ''}")
        created = not any(t[1] == ErrorCode.TOPIC_ALREADY_EXISTS for t in resp.topic_errors)
        log.info(
            "created state topic %s: %d partitions, replication factor %d, min.insync.replicas %d",
            topic,
            partitions,
            rf,
            min_isr,
        )
    deadline = time.monotonic() + timeout_s
    while True:
        existing = await _describe_topic(admin, topic)
        if existing is not None and existing[0] == 0 and all(p[2] >= 0 for p in existing[1]):
            break
        if existing is not None and existing[0] == 17:  # INVALID_TOPIC_EXCEPTION
            raise StateStoreError(f"invalid state topic name {topic!r}")
        if time.monotonic() > deadline:
            raise StateStoreError(f"state topic {topic} has no leaders: {existing!r}")
        await asyncio.sleep(0.1)
    if existing[2]:
        # Kafka 4.x reserves __share_group_state for its own share coordinator: clients may
        # not produce to it (INVALID_TOPIC_EXCEPTION), and a broker with share groups enabled
        # would replay our records as its own.
        raise StateStoreError(
            f"{topic} is an internal topic of this cluster (Apache Kafka 4.x): clients "
            "cannot write to it; configure another state topic name, e.g. "
            f"{ALTERNATIVE_TOPIC!r}"
        )
    count = len(existing[1])
    if count != partitions:
        log.warning(
            "state topic %s has %d partitions (configured %d): using %d", topic, count, partitions, count
        )
    await _check_topic_configs(admin, topic)
    return created, count


async def _describe_topic(admin: Any, topic: str) -> tuple[int, list[tuple[int, int, int]], bool] | None:
    """(error code, [(error, partition, leader)], internal) of the topic, None if it does not exist."""
    for t in await admin.describe_topics([topic]):
        if t["topic"] != topic:
            continue
        if t["error_code"] == 3:  # UNKNOWN_TOPIC_OR_PARTITION
            return None
        parts = [(p["error_code"], p["partition"], p["leader"]) for p in t["partitions"]]
        return t["error_code"], parts, bool(t.get("is_internal"))
    return None


async def _check_topic_configs(admin: Any, topic: str) -> None:
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    try:
        responses = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    except Exception as exc:  # noqa: BLE001 - a check, not a requirement
        log.warning("could not read the configs of state topic %s: %r", topic, exc)
        return
    configs: dict[str, str] = {}
    for resp in responses:
        for resource in resp.resources:
            for entry in resource[4]:
                configs[entry[0]] = entry[1]
    policy = configs.get("cleanup.policy", "delete")
    if "compact" in policy:
        raise StateStoreError(
            f"state topic {topic} has cleanup.policy={policy}: compaction would drop "
            "ShareUpdate records replay needs; it must be cleanup.policy=delete"
        )
    if configs.get("retention.ms", "-1") != "-1":
        log.warning(
            "state topic %s has retention.ms=%s: idle share-partitions can lose their state; set retention.ms=-1",
            topic,
            configs.get("retention.ms"),
        )


__all__ = ["ALTERNATIVE_TOPIC", "DEFAULT_TOPIC", "ensure_topic"]
