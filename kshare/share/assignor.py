"""The server-side share-group assignor: balance work, not partitions.

Share groups have no fencing: an assignment only tells a member where to fetch, and several members
may fetch from one partition. So the aim is not one owner per partition but that every member can
take work wherever work is waiting, and that no partition is served by less capacity than another:

* Each member gets ``r = min(P, max(ceil(P / M), min(MAX_SHARED, MAX_SHARERS * P // M)))`` of the
  ``P`` partitions of every topic it subscribes to (``M`` subscribers). Up to ``MAX_SHARED``
  partitions that is all of them: 3 members on 2 partitions all fetch from both, where one
  partition per member would leave one partition a single member and the other two; 16 members on
  1 share it. Beyond that each member gets at least ``MAX_SHARED`` (or its ``ceil(P / M)`` share of
  coverage) -- but fewer where that would put more than ``MAX_SHARERS`` members on a partition
  (many more members than partitions: 100 on 16 get 2 each, 12 or 13 to a partition, not 8 each
  and 50 to a partition). A partition lends ``share.partition.max.record.locks`` (2,000) records at
  a time, and fair acquisition divides them among its members: 50 members got 40 records each, a
  slice of a producer batch of hundreds that every one of them was sent whole and decoded, and
  the members' fetches waited on partitions whose budget was all lent in slices (measured with
  ``kshare bench --only aio100``, docs/benchmarks/aioconsumer.md: 100 consumers with 8 partitions
  each cost the proxy 3 to 4 times the CPU per record they cost it with 2 each, and themselves
  about twice).
* Sharer counts per partition differ by at most one, and each member's partitions form a run
  around the partition ring starting at ``i * P / M`` for member ``i``, so neighbouring runs
  overlap and capacity flows to wherever the backlog is, not only within islands.
* ``r`` depends on ``M`` only while ``ceil(P / M)`` exceeds ``MAX_SHARED`` or ``M`` exceeds
  ``MAX_SHARERS * P / MAX_SHARED``, and then moves by one: members joining or leaving change
  little. Assignments are also sticky: what a member had is kept where the new balance allows it
  (as Apache Kafka's SimpleAssignor keeps earlier assignments), so a join or leave moves only the
  partitions needed to rebalance.

Deterministic (members ordered by id): every proxy computes the same answer from the same input.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

Assignment = dict[bytes, list[int]]  # topic id -> partitions

# Every member fetches from at least this many partitions of a topic (all of them if fewer): enough
# overlap for capacity to flow, while keeping each member's fetches small when partitions are many.
MAX_SHARED = 8
# ... unless that puts more members than this on a partition: each member's fair part of the
# partition's lock budget (2,000 records by default) stays at 125 records or more. (8, one partition
# each for 100 members on 16, cut the CPU per record by another fifth, but leaves islands: members
# of a partition whose backlog is larger get no help: up to 12% over the ideal drain time in the
# model of tests/unit/test_assignor.py, where 16 keeps every mix within 10%.)
MAX_SHARERS = 16
# A sticky assignment is kept only if its drain time stays within this factor of the ideal.
SLACK = 1.05


def partitions_per_member(members: int, partitions: int) -> int:
    """How many partitions of a topic each of its ``members`` subscribers is assigned."""
    if members <= 0 or partitions <= 0:
        return 0
    return min(partitions, max(-(-partitions // members),
                               min(MAX_SHARED, MAX_SHARERS * partitions // members)))


def assign(
    subscriptions: Mapping[str, Sequence[str]],
    topics: Mapping[str, tuple[bytes, int]],
    previous: Mapping[str, Assignment] | None = None,
) -> dict[str, Assignment]:
    """Target assignment of every member.

    ``subscriptions``: member id -> subscribed topic names. ``topics``: topic name -> (topic id,
    partition count) for the topics that exist; subscribed topics missing from it are skipped.
    ``previous``: the current assignment, kept where the balance allows.
    """
    previous = previous or {}
    result: dict[str, Assignment] = {m: {} for m in subscriptions}
    subscribers: dict[str, list[str]] = {}
    for member in sorted(subscriptions):
        for name in dict.fromkeys(subscriptions[member]):
            if name in topics:
                subscribers.setdefault(name, []).append(member)
    for name in sorted(subscribers):
        topic_id, partitions = topics[name]
        if partitions <= 0:
            continue
        members = subscribers[name]
        held = {m: [p for p in previous.get(m, {}).get(topic_id, ()) if 0 <= p < partitions] for m in members}
        for m, ps in _assign_topic(members, partitions, held).items():
            result[m][topic_id] = ps
    return result


def _assign_topic(members: list[str], partitions: int, held: dict[str, list[int]]) -> dict[str, list[int]]:
    r = partitions_per_member(len(members), partitions)
    ring = _ring(members, partitions, r)
    if not any(held.values()):
        return ring
    base, extra = divmod(len(members) * r, partitions)
    # Sharers per partition: ``base``, or one more for ``extra`` of them: those shared most now,
    # then those the ring would share more (spread out, so capacity can flow between runs).
    before = [0] * partitions
    in_ring = [0] * partitions
    for ps in held.values():
        for p in ps:
            before[p] += 1
    for ps in ring.values():
        for p in ps:
            in_ring[p] += 1
    quota = [base] * partitions
    for p in sorted(range(partitions), key=lambda p: (-before[p], -in_ring[p], p))[:extra]:
        quota[p] += 1
    count = [0] * partitions
    out: dict[str, list[int]] = {}
    for m in members:  # keep what each member had, as far as the new balance allows
        keep = []
        for p in dict.fromkeys(held.get(m, ())):
            if len(keep) < r and count[p] < quota[p]:
                keep.append(p)
                count[p] += 1
        out[m] = keep
    for i, m in enumerate(members):  # top up, preferring the partitions after the member's ring start
        mine = set(out[m])
        start = i * partitions // len(members)
        while len(out[m]) < r:
            free = [p for p in range(partitions) if p not in mine and count[p] < quota[p]]
            if free:
                p = min(free, key=lambda p: (count[p] - quota[p], (p - start) % partitions))
                count[p] += 1
            else:  # the room left is on partitions m has: swap through a member that lacks one
                swapped = _swap(out, m, mine, [q for q in range(partitions) if count[q] < quota[q]])
                if swapped is None:
                    return ring  # the kept choices boxed us in: start over
                p, q = swapped
                count[q] += 1
            out[m].append(p)
            mine.add(p)
    sticky = {m: sorted(ps) for m, ps in out.items()}
    # Kept choices can leave a member alone on a run of partitions nobody else can help with;
    # then rebalancing from scratch (the ring) is worth the moves.
    return sticky if drain_slack(sticky, partitions) <= SLACK else ring


def drain_slack(assignment: Mapping[str, Sequence[int]], partitions: int) -> float:
    """How much longer than ideal a backlog spread evenly over the partitions takes to drain when
    every member works at the same rate on any partition it is assigned (1.0: ideal).

    The bottleneck of that model is a max-flow question: can every partition's work reach members
    whose time is capped at ``SLACK`` times the ideal? Answered for the cap, not searched: the
    result is 1.0 when it can and ``inf`` when it cannot (enough to choose an assignment).
    """
    members = [m for m, ps in assignment.items() if ps]
    if not members:
        return float("inf")
    # work units: each partition has len(members) units, so ideal per member is `partitions`
    cap = int(partitions * SLACK)
    need = partitions * len(members)
    return 1.0 if _max_flow(assignment, members, partitions, len(members), cap) >= need else float("inf")


def _max_flow(assignment: Mapping[str, Sequence[int]], members: list[str], partitions: int,
              supply: int, cap: int) -> int:
    """Max flow source -> partition (``supply`` each) -> assigned member -> sink (``cap`` each),
    by augmenting along shortest paths (Dinic); the graph has P + M nodes and one edge per
    assigned (member, partition), so a rebalance costs milliseconds."""
    n = 2 + partitions + len(members)
    source, sink = 0, n - 1
    graph: list[list[list[int]]] = [[] for _ in range(n)]  # edge: [to, capacity, index of reverse]

    def edge(a: int, b: int, c: int) -> None:
        graph[a].append([b, c, len(graph[b])])
        graph[b].append([a, 0, len(graph[a]) - 1])

    for p in range(partitions):
        edge(source, 1 + p, supply)
    for i, m in enumerate(members):
        node = 1 + partitions + i
        for p in assignment[m]:
            edge(1 + p, node, supply)
        edge(node, sink, cap)
    flow = 0
    while True:
        level = [-1] * n
        level[source] = 0
        queue = [source]
        for u in queue:
            for v, c, _ in graph[u]:
                if c > 0 and level[v] < 0:
                    level[v] = level[u] + 1
                    queue.append(v)
        if level[sink] < 0:
            return flow
        cursor = [0] * n
        while f := _augment(graph, level, cursor, source, sink, 1 << 60):
            flow += f


def _augment(graph: list[list[list[int]]], level: list[int], cursor: list[int], u: int, sink: int, f: int) -> int:
    """Push up to ``f`` along one path of increasing level from ``u`` (Dinic's blocking flow)."""
    if u == sink:
        return f
    edges = graph[u]
    while cursor[u] < len(edges):
        e = edges[cursor[u]]
        v, c, rev = e
        if c > 0 and level[v] == level[u] + 1:
            got = _augment(graph, level, cursor, v, sink, min(f, c))
            if got:
                e[1] -= got
                graph[v][rev][1] += got
                return got
        cursor[u] += 1
    return 0


def _swap(out: dict[str, list[int]], m: str, mine: set[int], open_: list[int]) -> tuple[int, int] | None:
    """Some member ``o`` gives ``m`` a partition ``s`` that ``m`` lacks and takes a partition ``q``
    with room that ``o`` lacks instead: ``m`` gains one, ``o`` keeps its count, ``q`` fills by one
    and ``s`` keeps its sharers. Returns ``(s, q)`` (``o`` is updated here), or None."""
    for o, theirs in out.items():
        if o == m:
            continue
        held = set(theirs)
        q = next((q for q in open_ if q not in held), None)
        if q is None:
            continue
        s = next((s for s in theirs if s not in mine), None)
        if s is None:
            continue
        theirs[theirs.index(s)] = q
        return s, q
    return None


def _ring(members: list[str], partitions: int, r: int) -> dict[str, list[int]]:
    """Member ``i`` takes ``r`` partitions around the ring from ``i * P / M``: with the starts
    evenly spaced, sharer counts differ by at most one, and neighbours' runs overlap so that
    capacity flows around the whole ring (starts at ``i * r`` could align runs into islands)."""
    n = len(members)
    return {m: sorted({(i * partitions // n + j) % partitions for j in range(r)}) for i, m in enumerate(members)}
