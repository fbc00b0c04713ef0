"""What share consumers did, kept as plain counts by the share layer.

Exporters (the Prometheus collectors that ``app.py`` wires in) read these at scrape time; the
share layer itself knows nothing about metrics. Updating a count is one dict operation per
request and topic-partition, never per record.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

ACK_TYPE_NAMES = {0: "gap", 1: "accept", 2: "release", 3: "reject", 4: "renew"}

# why what a member held went back to the queue without its acknowledgement (kshare_share_member_releases)
CONNECTION_CLOSED = "connection_closed"  # the client's connection to the proxy closed
SESSION_CLOSED = "session_closed"  # the member closed its share session (a final ShareFetch / ShareAcknowledge)
MEMBER_LEFT = "member_left"  # it left the group (a leave heartbeat) or was fenced
MEMBER_EXPIRED = "member_expired"  # it missed its heartbeat session timeout
RELEASE_REASONS = (CONNECTION_CLOSED, SESSION_CLOSED, MEMBER_LEFT, MEMBER_EXPIRED)


def _ignore(seconds: float) -> None:
    pass


class ShareStats:
    def __init__(self) -> None:
        self.deliveries: Counter[tuple[str, str]] = Counter()  # (group, topic) -> records handed out
        self.acks: Counter[tuple[str, str, str]] = Counter()  # (group, topic, type name) -> records
        self.archived: Counter[tuple[str, str]] = Counter()  # (group, topic) -> records archived after delivery
        self.lock_timeouts: Counter[tuple[str, str]] = Counter()  # (group, topic) -> locks that ran out
        # (group, topic, reason) -> records released because the member holding them went (RELEASE_REASONS)
        self.member_releases: Counter[tuple[str, str, str]] = Counter()
        # (group, topic, error name) -> records whose acknowledgement was answered with that error
        self.ack_errors: Counter[tuple[str, str, str]] = Counter()
        # called with the seconds each durable state write took (a histogram, wired in by app.py)
        self.on_state_write: Callable[[float], None] = _ignore
