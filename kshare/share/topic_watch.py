"""Which topics the share layer must look up again now, rather than at its next metadata refresh.

The share layer refreshes the cluster metadata every few seconds (``ShareGroupService._refresh_topics``).
A topic created or grown through the proxy (CreateTopics, CreatePartitions), or a client's Metadata
answer showing more partitions than the share layer knows, says the cluster has changed already:
the groups reading those topics should get the new partitions at their members' next heartbeat, as
on a broker, whose group coordinator sees the change in its metadata image at once.

A broker answers CreatePartitions once its controller has committed the change; the broker the
share layer asks may learn of it a little later, so one refresh may not show it yet. A topic stays
wanted until a refresh shows the count it was seen with (or, with -1, more than was known), or for
``patience_s``: a change that was only validated (``validate_only``) or undone stops costing
refreshes then. Sans-I/O: the caller passes the time and what its metadata knows.
"""

from __future__ import annotations

from collections.abc import Callable


class TopicWatch:
    def __init__(self, patience_s: float = 5.0) -> None:
        self.patience_s = patience_s
        # topic -> (partitions wanted, until when); at least that many partitions are expected
        self._wanted: dict[str, tuple[int, float]] = {}

    def seen(self, counts: dict[str, int], known: Callable[[str], int], now: float) -> bool:
        """The cluster was seen with these partition counts (-1: more than ``known`` says).

        ``known(topic)`` is how many partitions the share layer knows (0: the topic is unknown).
        Returns True when a topic is newly wanted (the caller refreshes now)."""
        added = False
        for topic, count in counts.items():
            have = known(topic)
            want = have + 1 if count < 0 else count
            if want <= have:
                continue
            old = self._wanted.get(topic)
            if old is None or old[0] < want:
                self._wanted[topic] = (want, now + self.patience_s)
                added = True
        return added

    def refreshed(self, known: Callable[[str], int], now: float) -> None:
        """A metadata refresh ended: forget the topics it shows as wanted, and those waited for too long."""
        self._wanted = {t: (want, until) for t, (want, until) in self._wanted.items()
                        if known(t) < want and now < until}

    def __bool__(self) -> bool:
        return bool(self._wanted)

    def __contains__(self, topic: str) -> bool:
        return topic in self._wanted
