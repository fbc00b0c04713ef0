"""The state-topic tests' shared parts: running a coroutine on uvloop, a ShareUpdate from tuples,
and a fresh :class:`TopicStateStore` that replays the topic (to compare with what a store holds)."""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import Any, TypeVar

import uvloop

from kshare.share.state.topic_store import TopicStateStore
from kshare.share.states import ShareSnapshot, ShareUpdate, StateBatch
from kshare.share.store import SharePartitionKey

T = TypeVar("T")


def run(coro: Awaitable[T]) -> T:
    return uvloop.run(coro)  # type: ignore[arg-type]


def update(start: int, *batches: tuple[int, int, int, int]) -> ShareUpdate:
    """A ShareUpdate from a start offset (-1: unchanged) and (first, last, state, count) tuples."""
    return ShareUpdate(start, tuple(StateBatch(*b) for b in batches))


async def replayed(bootstrap: str, topic: str, **kwargs: Any) -> TopicStateStore:
    """A NEW store instance that replayed the topic (closed again: only its loaded state is used)."""
    store = TopicStateStore(bootstrap, topic=topic, prune_interval_s=3600, **kwargs)
    await store.start()
    await store.close()
    return store


async def assert_replays_to(
    bootstrap: str, topic: str, expected: Mapping[SharePartitionKey, ShareSnapshot]
) -> None:
    """A replay of the topic gives exactly ``expected``, and skips no record."""
    fresh = await replayed(bootstrap, topic)
    assert fresh.share_partitions() == expected
    assert fresh.load_stats.skipped == 0
