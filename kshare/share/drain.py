"""Draining before a stop: the share consumers acknowledge what they hold before kshare goes.

On SIGTERM a proxy that closed its client connections at once would release every record its
share consumers held, acquired and being worked on, and all of them would be delivered again
(through the restarted proxy, or the proxy of an instance group taking its share-partitions over).
So first, for up to ``--drain-timeout``: every share-partition stops handing records out
(``SharePartition.paused``: a ShareFetch still applies the acknowledgements it carries and
answers with no records), ShareAcknowledge is served as always, and each acknowledgement is
written to the state topic before it is answered, until no record is held any more. Then the
proxy stops as before; what is still held at the deadline is released (and redelivered).

Clients notice nothing but empty fetches for the drain's length: they keep their connections and
share sessions until the proxy closes them.

A proxy of an instance group hands share-partitions over the same way when a rebalance gives their
leadership to another proxy (``InstanceGroupMember._handing_over``), bounded by the same timeout.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Protocol

log = logging.getLogger("kshare.share")


class _Engine(Protocol):
    paused: bool

    def acquired_count(self, member_id: str | None = None) -> int: ...


class _Partition(Protocol):
    engine: _Engine | None


def pause_all(partitions: Iterable[_Partition]) -> int:
    """Pause every loaded share-partition; returns the records they hold."""
    held = 0
    for sp in partitions:
        engine = sp.engine
        if engine is not None:
            engine.paused = True
            held += engine.acquired_count()
    return held


async def until_released(held: Callable[[], int], deadline: float, *, poll_s: float = 0.05,
                         clock: Callable[[], float] = time.monotonic) -> int:
    """Poll ``held()`` (the records members hold) until it is 0 or ``deadline`` (of ``clock``)
    passed; returns the last count. Used by the drain and by an instance group's hand-over of
    share-partitions another proxy leads now (kshare.share.instance_service)."""
    count = held()
    while count and clock() < deadline:
        await asyncio.sleep(poll_s)
        count = held()
    return count


async def drain(partitions: dict, timeout_s: float, *, poll_s: float = 0.05,
                clock=time.monotonic) -> int:
    """Pause handing out records and wait, up to ``timeout_s``, until no record is held.
    ``partitions``: the service's share-partitions (engines created meanwhile are paused at the
    next poll). Returns the records still held at the end (0: drained)."""
    started = clock()
    held = pause_all(list(partitions.values()))
    if held == 0 or timeout_s <= 0:
        return held
    log.info("draining before stopping: %d record(s) held by share consumers; waiting up to %.0f s for their "
             "acknowledgements (--drain-timeout)", held, timeout_s)
    held = await until_released(lambda: pause_all(list(partitions.values())), started + timeout_s,
                                poll_s=poll_s, clock=clock)
    if held:
        log.warning("drain timeout (%.0f s): %d record(s) still held by share consumers are released and will be "
                    "delivered again", timeout_s, held)
    else:
        log.info("drained in %.2f s: every record handed out was acknowledged or released", clock() - started)
    return held
