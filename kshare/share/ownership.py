"""Who owns a share-partition.

Several kshare instances will later split share-partition ownership through the cluster's own
group protocol. Everything that decides "is this share-partition mine to serve" goes through this
one small interface; today a single proxy owns them all.
"""

from __future__ import annotations

from typing import Protocol

from .store import SharePartitionKey


class Ownership(Protocol):
    def owns(self, key: SharePartitionKey) -> bool:
        """True if this proxy serves (and writes the durable state of) ``key``."""

    @property
    def epoch(self) -> int:
        """The ownership epoch written as the leader epoch of state records."""


class LocalOwnership:
    """This process owns every share-partition."""

    epoch = 0

    def owns(self, key: SharePartitionKey) -> bool:
        return True
