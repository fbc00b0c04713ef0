"""One share-partition's durable writes, in order: queued changes go out together once the
previous write is acknowledged, each caller's future resolving when its change is durable.

A write that fails undoes nothing by itself: the engine has moved ahead of what is durable, so the
owner (``SharePartitionState``) drops its engine and rebuilds it from the state topic before
serving the share-partition again (``on_failure``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .store import NotOwned, SharePartitionKey, StateStore

if TYPE_CHECKING:
    from .states import ShareSnapshot, ShareUpdate
    from .stats import ShareStats

log = logging.getLogger("kshare.share")


class WriteFailed(Exception):
    """A durable write was not acknowledged by the cluster; the change it carried is undone."""


def gathering_writes(store: StateStore) -> contextlib.AbstractContextManager:
    """A block whose share-partition writes go to the cluster together (one Produce round when
    the store is idle) rather than the first alone: for requests touching several partitions."""
    gathering = getattr(store, "gathering", None)
    return gathering() if gathering is not None else contextlib.nullcontext()


def ignore_failure(fut: asyncio.Future) -> None:
    """A done-callback for a write nobody waits for: its failure is logged by the queue already."""
    if not fut.cancelled():
        fut.exception()


class WriteQueue:
    """The ordered durable writes of one share-partition."""

    __slots__ = ("key", "name", "store", "stats", "on_failure", "pending", "pending_done", "writing",
                 "writing_done", "gates", "failing")

    def __init__(self, key: SharePartitionKey, name: str, store: StateStore, stats: ShareStats,
                 on_failure: Callable[[], None]) -> None:
        self.key = key
        self.name = name  # "share-partition <group> <topic>-<partition>", for the log
        self.store = store
        self.stats = stats
        self.on_failure = on_failure
        # queued updates go out together once the previous write is acknowledged
        self.pending: list[ShareUpdate | ShareSnapshot] = []
        self.pending_done: asyncio.Future | None = None
        self.writing = False
        self.writing_done: asyncio.Future | None = None  # the write under way resolves it
        # what the next write waits for first: dead letters that must be on the DLQ topic before the
        # write archiving their records (a failed one fails the write, and nothing is archived)
        self.gates: list[asyncio.Future] = []
        self.failing = False  # the last write failed (logged once until one succeeds again)

    def put(self, change: ShareUpdate | ShareSnapshot | None) -> asyncio.Future:
        """Queue a durable write; the future resolves once the cluster acknowledged it (and every
        earlier write of this share-partition). Raises WriteFailed on failure. ``None``: a
        barrier, done once every write queued so far (the one under way included) is."""
        loop = asyncio.get_running_loop()
        if change is None:
            if self.pending_done is not None and not self.pending_done.done():
                return self.pending_done
            if self.writing_done is not None and not self.writing_done.done():
                return self.writing_done
            fut = loop.create_future()
            fut.set_result(None)
            return fut
        self.pending.append(change)
        if self.pending_done is None or self.pending_done.done():
            self.pending_done = loop.create_future()
        done = self.pending_done
        if not self.writing:
            self.writing = True
            first = None
            submit = getattr(self.store, "submit", None)
            if submit is not None and not self.gates:
                # Handed to the store now, so an idle store writes it before this caller goes on
                # (a turn of the event loop costs a queue wait when the proxy is busy); the
                # task below waits for it and writes whatever queues behind it.
                batch, self.pending, self.pending_done = self.pending, [], None
                self.writing_done = done
                started = time.perf_counter()
                try:
                    written = submit([(self.key, c) for c in batch])
                except Exception as exc:  # noqa: BLE001 - reported as a failed write, by the task
                    written = loop.create_future()
                    written.set_exception(exc)
                first = (done, written, started)
            loop.create_task(self._write_loop(first))
        return done

    def gate(self, fut: asyncio.Future) -> None:
        """The next write goes out only once ``fut`` is done, and fails if it fails."""
        self.gates.append(fut)

    async def _write_loop(self, first: tuple[asyncio.Future, asyncio.Future, float] | None) -> None:
        try:
            while self.pending or first is not None:
                written: asyncio.Future | None = None
                if first is not None:
                    (done, written, started), first = first, None
                    gates: list = []
                else:
                    batch, done = self.pending, self.pending_done
                    gates = self.gates
                    self.pending, self.pending_done, self.gates = [], None, []
                    started = time.perf_counter()
                assert done is not None
                self.writing_done = done
                try:
                    if gates:
                        await asyncio.gather(*gates)
                    if written is not None:
                        await written
                    else:
                        await self.store.write([(self.key, change) for change in batch])
                    self.stats.on_state_write(time.perf_counter() - started)
                except Exception as exc:  # noqa: BLE001
                    self._failed(exc, gates, done)
                    return
                if self.failing:
                    self.failing = False
                    log.info("durable writes for %s succeed again", self.key)
                if not done.done():
                    done.set_result(None)
        finally:
            self.writing = False

    def _failed(self, exc: Exception, gates: list, done: asyncio.Future) -> None:
        what = "dead letters" if any(g.done() and not g.cancelled() and g.exception() for g in gates) \
            else "durable write"
        if isinstance(exc, NotOwned):
            # an instance group moved it (the move is logged once per state partition)
            log.info("%s: its state write was refused (%s); what it carried (acknowledgements, "
                     "releases) was not answered as done, and the new leader serves it", self.name, exc)
        else:
            log.log(logging.DEBUG if self.failing else logging.ERROR,
                    "%s for %s failed: %r; rebuilding it from the state topic (further failures of "
                    "this share-partition are logged at DEBUG until a write succeeds)", what, self.name, exc)
        self.failing = True
        for fut in (done, self.pending_done):
            if fut is not None and not fut.done():
                fut.set_exception(WriteFailed(str(exc)))
                fut.exception()  # retrieved: waiters may be gone
        self.pending, self.pending_done, self.gates = [], None, []
        self.on_failure()
