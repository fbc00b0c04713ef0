"""The server-side share-group assignor.

Share groups have no fencing: an assignment only tells a member where to fetch. The aim is that
every member gets useful work and every partition is fetched by someone:

* more partitions than subscribers: each partition goes to exactly one subscriber, spread so the
  number of partitions per member differs by at most one (across all topics);
* more subscribers than partitions: every subscriber gets one partition and the subscribers are
  spread evenly over the partitions, so each partition is shared by about k/n members.

This is the balancing of Apache Kafka's SimpleAssignor (reference.md section 5), computed from
scratch and deterministically (members ordered by id), so every proxy computes the same answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

Assignment = dict[bytes, list[int]]  # topic id -> partitions


def assign(
    subscriptions: Mapping[str, Sequence[str]],
    topics: Mapping[str, tuple[bytes, int]],
) -> dict[str, Assignment]:
    """Target assignment of every member.

    ``subscriptions``: member id -> subscribed topic names. ``topics``: topic name -> (topic id,
    partition count) for the topics that exist; subscribed topics missing from it are skipped.
    """
    result: dict[str, Assignment] = {m: {} for m in subscriptions}
    load = dict.fromkeys(subscriptions, 0)
    subscribers: dict[str, list[str]] = {}
    for member in sorted(subscriptions):
        for name in subscriptions[member]:
            if name in topics:
                subscribers.setdefault(name, []).append(member)
    for name in sorted(subscribers):
        topic_id, partitions = topics[name]
        members = subscribers[name]
        if partitions <= 0:
            continue
        if len(members) <= partitions:
            for p in range(partitions):
                m = min(members, key=lambda x: (load[x], x))
                result[m].setdefault(topic_id, []).append(p)
                load[m] += 1
        else:
            sharers = [0] * partitions
            for m in members:
                p = min(range(partitions), key=lambda i: (sharers[i], i))
                sharers[p] += 1
                result[m].setdefault(topic_id, []).append(p)
                load[m] += 1
    return result
