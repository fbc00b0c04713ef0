"""kshare's Python clients, on its own protocol layer (``kshare.protocol``, ``kshare.client``):

* :class:`AIOShareConsumer`: an asyncio share consumer in aiokafka's style, for kshare and for
  native Apache Kafka 4.x share groups (docs/aio-share-consumer.md);
* :class:`~kshare.clients.share_member.ShareMember`: the share-group member under it, which the
  Spark source's workers use too.

Nothing here imports the proxy (``kshare.proxy``) or the share-group engine (``kshare.share``)."""

from __future__ import annotations

from .errors import (
    GroupMaxSizeReachedError,
    InvalidRecordStateError,
    KafkaError,
    MemberError,
    ShareSessionNotFoundError,
)
from .share_consumer import (
    AcknowledgementOutcomes,
    AcknowledgeType,
    AIOShareConsumer,
    ShareConsumerRecord,
)

__all__ = [
    "AIOShareConsumer",
    "AcknowledgeType",
    "AcknowledgementOutcomes",
    "GroupMaxSizeReachedError",
    "InvalidRecordStateError",
    "KafkaError",
    "MemberError",
    "ShareConsumerRecord",
    "ShareSessionNotFoundError",
]
