"""kshare: share groups (KIP-932) for every Kafka cluster, as a wire-protocol proxy sidecar.

``from kshare import AIOShareConsumer``: an asyncio share consumer for kshare and for native Apache
Kafka 4.x share groups (docs/guide/aio-share-consumer.md). Imported on first use: ``import kshare`` stays light."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["AIOShareConsumer", "ShareConsumerRecord", "__version__"]

if TYPE_CHECKING:
    from .clients.share_consumer import AIOShareConsumer, ShareConsumerRecord


def __getattr__(name: str) -> Any:
    if name in ("AIOShareConsumer", "ShareConsumerRecord"):
        from .clients import share_consumer

        return getattr(share_consumer, name)
    raise AttributeError(f"module 'kshare' has no attribute {name!r}")
