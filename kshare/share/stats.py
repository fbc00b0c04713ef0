"""What share consumers did, kept as plain counts by the share layer.

Exporters (the Prometheus collectors that ``app.py`` wires in) read these at scrape time; the
share layer itself knows nothing about metrics. Updating a count is one dict operation per
request and topic-partition, never per record.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

ACK_TYPE_NAMES = {0: "gap", 1: "accept", 2: "release", 3: "reject", 4: "renew"}


def _ignore(seconds: float) -> None:
    pass


class ShareStats:
    def __init__(self) -> None:
        self.deliveries: Counter[tuple[str, str]] = Counter()  # (group, topic) -> records handed out
        self.acks: Counter[tuple[str, str, str]] = Counter()  # (group, topic, type name) -> records
        self.archived: Counter[tuple[str, str]] = Counter()  # (group, topic) -> records archived after delivery
        self.lock_timeouts: Counter[tuple[str, str]] = Counter()  # (group, topic) -> locks that ran out
        # called with the seconds each durable state write took (a histogram, wired in by app.py)
        self.on_state_write: Callable[[float], None] = _ignore
