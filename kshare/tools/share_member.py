"""The share-group member moved to :mod:`kshare.clients.share_member` (the clients layer, under
``kshare.AIOShareConsumer``); this module keeps the old import path working."""

from __future__ import annotations

from ..clients.share_member import (  # noqa: F401 - re-exported
    ACCEPT,
    GAP,
    REJECT,
    RELEASE,
    RENEW,
    Ack,
    Acquired,
    MemberError,
    Outcomes,
    Record,
    ShareMember,
    ack_batches,
    decode,
)

__all__ = ["ACCEPT", "GAP", "REJECT", "RELEASE", "RENEW", "Ack", "Acquired", "MemberError", "Outcomes", "Record",
           "ShareMember", "ack_batches", "decode"]
