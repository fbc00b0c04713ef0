"""The old import path of :mod:`kshare.share.state.fence` (an instance group's fenced partition writer), for code not moved yet."""

from .state.fence import (
    Fenced,
    PartitionWriter,
    expect_fencing,
    quiet_sender_stops,
)

__all__ = [
    "Fenced",
    "PartitionWriter",
    "expect_fencing",
    "quiet_sender_stops",
]
