"""kshare's own Kafka clients, on its protocol layer (``kshare.protocol``):

* :mod:`~kshare.clients.connection`: :class:`KafkaConnection`, one pipelined connection to one
  broker (the proxy's and the share-group engine's own requests run on it);
* :mod:`~kshare.clients.cluster`: bootstrap, metadata and group coordinators over such connections;
* :mod:`~kshare.clients.admin` and :mod:`~kshare.clients.settings`: the share-group admin client of
  ``kshare groups`` and the Spark source, and the client properties they are configured with;
* :mod:`~kshare.clients.share_member`: the share-group member (the Spark source's workers run it);
* :class:`AIOShareConsumer`: an asyncio share consumer in aiokafka's style, for kshare and for
  native Apache Kafka 4.x share groups (docs/guide/aio-share-consumer.md).

Nothing here imports the proxy (``kshare.proxy``) or the share-group engine (``kshare.share``): the
layers point one way, protocol -> clients -> proxy -> share -> app (tests/unit/test_layers.py).
The consumer and its errors are imported on first use, so that the proxy, which needs only
:mod:`~kshare.clients.connection`, does not load aiokafka."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

_LAZY = {
    "AIOShareConsumer": "share_consumer",
    "AcknowledgeType": "share_consumer",
    "AcknowledgementOutcomes": "share_consumer",
    "ShareConsumerRecord": "share_consumer",
    "GroupMaxSizeReachedError": "errors",
    "InvalidRecordStateError": "errors",
    "KafkaError": "errors",
    "MemberError": "errors",
    "ShareSessionNotFoundError": "errors",
}

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


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kshare.clients' has no attribute {name!r}")
    return getattr(import_module(f".{module}", __name__), name)
