"""Leaving an instance group on SIGTERM without cutting clients off (issue 42).

A proxy that closed its client connections as it left would leave its clients with a broker that
is down and a Metadata answer (from the other proxies, which have not rebalanced yet) that still
names it: librdkafka then waits for its next refresh of unavailable topics, about a second, before
it looks again. So once the drain has let the share consumers acknowledge what they held
(kshare.share.drain), a proxy of an instance group leaves like a Kafka broker that stops leading
a partition:

1. it refuses every share request from then on with the error that sends a client elsewhere
   (NOT_LEADER_OR_FOLLOWER for ShareFetch and ShareAcknowledge, NOT_COORDINATOR for the group
   APIs), lets its queued state writes finish, and leaves the group (LeaveGroup);
2. it reads the map the others split ownership by without it (DescribeGroups: every member's
   assignment carries the whole map) and names their leaders in its own Metadata answers, so a
   client that refreshes its metadata here after a refusal goes straight to the new leader;
3. it keeps its connections open until its clients have moved: no share request reached it for
   ``QUIET_S``, or ``LINGER_MAX_S`` after it showed the new map. Only then does it close them.

The rule of step 3 is :class:`Leaving` (no I/O, an injectable clock); :func:`leave` is its shell.
A drain that ended with records still held skips all this (those records are released when the
connections close, and written, before the proxy leaves; see ``App.stop``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..protocol.codes import ApiKey

if TYPE_CHECKING:
    from .service import ShareGroupService

log = logging.getLogger("kshare.share")

SUCCESSORS_WAIT_S = 5.0  # how long a leaving proxy waits for the others' map (then it closes at once)
QUIET_S = 0.5  # clients have moved once no share request reached the leaving proxy for this long
LINGER_MAX_S = 3.0  # and at the latest this long after it showed them the new map
WRITES_WAIT_S = 5.0  # queued state writes finish before it leaves (as at a stop)

# the requests of share consumers: while they still come, a client has not moved yet
SHARE_REQUESTS = frozenset({ApiKey.SHARE_FETCH, ApiKey.SHARE_ACKNOWLEDGE, ApiKey.SHARE_GROUP_HEARTBEAT})


class Leaving:
    """When a leaving proxy's clients have moved: the time of the last share request it refused."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.started = clock()
        self.last_request: float | None = None
        self.requests = 0  # share requests refused while leaving

    def request(self) -> None:
        self.last_request = self.clock()
        self.requests += 1

    def moved(self, shown: float) -> bool:
        """Whether the clients have moved, the new map having been shown since ``shown``."""
        now = self.clock()
        last = shown if self.last_request is None else max(self.last_request, shown)
        return now - last >= QUIET_S or now - shown >= LINGER_MAX_S


async def leave(service: ShareGroupService, *, poll_s: float = 0.05) -> None:
    """Leave the instance group and route the clients to the others before their connections close."""
    instances = service.instances
    assert instances is not None and service.proxy is not None
    leaving = Leaving()
    service.leaving = leaving
    ownership = service.ownership
    ownership.leave()  # type: ignore[attr-defined]  # a GroupOwnership in an instance group
    pending = [s.pending_done for s in service.partitions.values() if s.pending_done is not None]
    if pending:
        await asyncio.wait(pending, timeout=WRITES_WAIT_S)
    await instances.stop()  # LeaveGroup: the others rebalance at once
    successors = await instances.successor_map(SUCCESSORS_WAIT_S)
    if successors is None:
        log.info(
            "left the instance group: no map of the others seen (none left, or none within %.0f s); closing client "
            "connections",
            SUCCESSORS_WAIT_S,
        )
        return
    ownership.successors = successors  # type: ignore[attr-defined]
    service.proxy.view = ownership.view()
    shown = leaving.clock()
    while not leaving.moved(shown):
        await asyncio.sleep(poll_s)
    log.info(
        "left the instance group: the others took over at ownership epoch %d %.2f s after the leave; "
        "clients were shown their new leaders and %d share request(s) refused here over %.2f s, then "
        "their connections closed",
        successors.epoch,
        shown - leaving.started,
        leaving.requests,
        leaving.clock() - shown,
    )
