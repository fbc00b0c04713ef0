"""Which proxy of an instance group leads which topic-partition: balanced per topic, sticky (sans-I/O).

Today a topic-partition's leader is the owner of the state partition its share state hashes to
(:mod:`kshare.share.ownership`), so a topic's few partitions land unevenly on the proxies: on three
proxies and ten state partitions, 57 % of 4-partition topics are not split 2/1/1 and 94 % of
12-partition topics are not split 4/4/4 (docs/design/scale-out.md, "Balanced leadership"). No
assignment of state partitions to proxies can fix that for every topic while moving only what it
must on a join or a leave (the argument is in the same section), so leadership is decided per
topic-partition, here:

* **balanced per topic**: of a topic's ``k`` partitions, each of ``n`` proxies leads ``k // n`` or
  one more, whatever ``k`` and ``n``; the ``k % n`` proxies that lead one more are those leading
  the fewest partitions over all topics so far, so the totals stay within one of each other too
  when nothing was assigned before;
* **sticky**: a partition keeps its previous leader while that leader is within its quota, and the
  proxies that already lead the most get the larger quotas, so a change of membership moves the
  fewest partitions any balanced assignment can (the property tests check it against a brute-force
  model): a proxy leaving moves only its partitions, a proxy joining takes only its quota;
* **deterministic**: a function of the members, the topics and what each member led, not of the
  order they are given in, so any proxy elected leader of the group decides the same.

A topic the decision does not list (a share group started reading it since the last rebalance)
is led by :func:`fallback_leader`: the topic's partitions dealt round the members from a start
hashed from the topic id, which is balanced per topic too, and the first decision that lists the
topic keeps it (the proxies report what they lead).

This module decides; it does not move state. How a leader that does not own the state partition
of a topic-partition reads and writes its share state with the fencing kept exact is in the design
note: that path is not built yet, and until it is the proxies lead by state partition.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Set

from .state.codec import murmur2


def topic_start(topic_id: bytes) -> int:
    """Where a topic's partitions start round the members: spreads the topics' first partitions."""
    return murmur2(topic_id) & 0x7FFFFFFF


def fallback_leader(topic_id: bytes, partition: int, members: int) -> int:
    """The leader (index into the decision's members) of a topic-partition the decision has no
    entry for: partitions dealt round the members, starting at the topic's hashed start."""
    if members <= 0:
        raise ValueError("no members")
    return (topic_start(topic_id) + partition) % members


def moves(before: Mapping[int, str], after: Sequence[str]) -> int:
    """Partitions whose leader changed although their previous leader is still a member."""
    members = set(after)
    return sum(1 for p, m in before.items() if m in members and p < len(after) and after[p] != m)


def assign_topic(
    partitions: int,
    members: Sequence[str],
    previous: Mapping[int, str],
    *,
    start: int = 0,
    totals: Mapping[str, int] | None = None,
    keep_first: Mapping[str, Set[int]] | None = None,
) -> list[str]:
    """The leader of each of a topic's ``partitions``, among ``members`` (sorted member ids).

    ``previous``: partition -> the member that led it (entries naming a non-member or a partition
    beyond ``partitions`` are ignored). ``start``: the topic's :func:`topic_start`. ``totals``:
    what each member leads of the topics decided before this one (ties for the larger quotas go
    to the members leading least). ``keep_first``: member -> partitions it keeps before the others
    it led when it must give some up (as many move either way)."""
    n = len(members)
    if n == 0:
        raise ValueError("no members")
    base, extra = divmod(partitions, n)
    rotation = {m: (i - start) % n for i, m in enumerate(members)}  # the fallback's order, from start
    held: dict[str, list[int]] = {m: [] for m in members}
    for p in sorted(previous):
        m = previous[p]
        if m in held and 0 <= p < partitions:
            held[m].append(p)
    totals = totals or {}
    # the larger quotas go first to those that hold more than the smaller one (what they keep),
    # then to those leading least overall, then in the fallback's order
    order = sorted(members, key=lambda m: (-min(len(held[m]), base + 1), totals.get(m, 0), rotation[m]))
    quota = {m: base + (1 if i < extra else 0) for i, m in enumerate(order)}
    leaders: list[str | None] = [None] * partitions
    count = dict.fromkeys(members, 0)
    first = keep_first or {}
    for m in members:
        preferred = first.get(m, ())
        # what it led, up to its quota: those it should keep first, then the lowest partitions
        for p in sorted(held[m], key=lambda p: (p not in preferred, p))[: quota[m]]:
            leaders[p] = m
            count[m] += 1
    # the rest: to the fallback's choice when it has room (a topic nobody led is dealt exactly
    # as the fallback deals it), else to the first member with room in quota order
    by_rotation = sorted(members, key=rotation.__getitem__)
    leftover = []
    for p in range(partitions):
        if leaders[p] is None:
            m = by_rotation[(p % n)]
            if count[m] < quota[m]:
                leaders[p] = m
                count[m] += 1
            else:
                leftover.append(p)
    room = (m for m in order for _ in range(quota[m] - count[m]))
    for p in leftover:
        m = next(room)
        leaders[p] = m
        count[m] += 1
    return leaders  # type: ignore[return-value]  # every partition has a leader now


def assign_leaders(
    topics: Mapping[bytes, int], members: Iterable[str], previous: Mapping[bytes, Mapping[int, str]],
    keep_first: Mapping[bytes, Mapping[str, Set[int]]] | None = None,
) -> dict[bytes, list[str]]:
    """The leader of every partition of every topic in ``topics`` (topic id -> partition count).

    ``previous``: topic id -> partition -> the member that led it (as the members report it).
    ``keep_first``: topic id -> member -> partitions it keeps first (:func:`assign_topic`).
    Topics are decided in topic-id order, each balanced and sticky (:func:`assign_topic`)."""
    ordered = sorted(set(members))
    if not ordered:
        return {}
    totals = dict.fromkeys(ordered, 0)
    out: dict[bytes, list[str]] = {}
    for topic_id in sorted(topics):
        leaders = assign_topic(
            topics[topic_id], ordered, previous.get(topic_id, {}), start=topic_start(topic_id), totals=totals,
            keep_first=(keep_first or {}).get(topic_id),
        )
        for m in leaders:
            totals[m] += 1
        out[topic_id] = leaders
    return out


__all__ = ["assign_leaders", "assign_topic", "fallback_leader", "moves", "topic_start"]
