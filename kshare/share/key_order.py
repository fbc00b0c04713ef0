"""Key-ordered sharing (``kshare.share.ordering=key``, docs/design/ordering-and-backoff.md): the records
of one key go to one member at a time, in offset order, and the keys are spread over the members.

``KeyOrder`` is the share-partition engine's key bookkeeping, kept apart from the window it walks
(``kshare.share.partition.SharePartition`` inherits it): which key each unfinished learnt record
has, each key's queue of unfinished records, how many records of each key are acquired and by
whom, who finished each key last (affinity), and the key-ordered acquisition of one fetched batch.

A key is *free* when none of its records is acquired. An acquisition may take a free key's *run*:
its head (first unfinished record) and the next unfinished records of the key after it, in offset
order, up to a bound, all for the one member; nobody gets another record of the key until every
record of the run is finished or given back (as SQS FIFO hands several messages of one message
group to one ReceiveMessage). Records waiting for their key stay Available, marked by their range's
deadline (``WAITS_FOR_KEY``): no state transition of their own (``kshare.share.states.TRANSITIONS``
holds them all).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Protocol

from kshare.share.ranges import StateRange, index_of, isolate, merge_between
from kshare.share.states import TERMINAL_STATES, RecordState

if TYPE_CHECKING:
    from kshare.share.partition import FetchedBatch

_AVAILABLE = RecordState.AVAILABLE
_ACQUIRED = RecordState.ACQUIRED

# An Available record of a key-ordered group whose key has an earlier record not yet finished, or a
# record acquired: it is not acquired (nor fetched for) until its key's turn comes (unless it is in
# the run an acquisition takes of its key). Kept in the range's deadline, as a redelivery backoff
# that ends when its key's turn comes, not at a time.
WAITS_FOR_KEY = 1 << 62
_NO_KEY = -1  # record_keys.NULL_KEY: a record without a key
# ``key_read_end`` looks at the head of every key: with more keys than this it does not (free heads
# are dense then, so the walk it would spare stops early anyway)
_KEYS_LOOKED_AT = 256
_UNBOUNDED = 1 << 62


class RecordKeys(Protocol):
    """The records of one fetched batch for key-ordered groups (``record_keys.KeyedBatch``):
    ``offsets`` ascending, ``keys[i]`` the identity of the key of the record at ``offsets[i]``
    (equal keys, equal identities; -1 for a record without a key)."""

    offsets: Sequence[int]
    keys: Sequence[int]


def add_piece(pieces: list[list[int]], first: int, last: int, count: int) -> None:
    """Add first..last (delivered ``count`` times) to the acquired pieces, merged with the last one."""
    if pieces:
        p = pieces[-1]
        if p[1] + 1 == first and p[2] == count:
            p[1] = last
            return
    pieces.append([first, last, count])


def run_length(max_records: int | None, max_keys: int | None, free_keys: int) -> int:
    """How many records of one key an acquisition takes at most (the key's run): the records it may
    take spread over the keys it may take (``max_keys``, or every free key without a budget), at
    least one. None for ``max_records``: not known, no bound."""
    if max_records is None:
        return _UNBOUNDED
    keys = max_keys if max_keys is not None and max_keys > 0 else free_keys
    return max(1, max_records // max(1, keys))


class KeyOrder:
    """The key bookkeeping of a share-partition engine. Uses the engine's window (``_ranges``,
    ``_spso``, ``_speo``, ``_limit``, ``_now``, ``_available_from``, ``max_record_locks``) and
    its primitives (``_acquire_span``, ``_append``, ``_touch``); ``_apply`` tells it of every
    record entering or leaving Acquired (``_count_out``), ``_finish`` lets it wake the keys freed
    (``_wake_keys``)."""

    _ranges: list[StateRange]
    _spso: int
    _speo: int
    _limit: int
    _now: int
    _clock: Callable[[], int]
    _locks: list[tuple[int, int, int]]
    _available_from: int
    max_record_locks: int

    def _init_keys(self, start_offset: int) -> None:
        # Key-ordered sharing (docs/design/ordering-and-backoff.md). Keys are learnt from fetched batches
        # (``acquire``'s record_keys) for every offset below _keyed_to; at and past it they are not
        # known yet and nothing is acquired there. _key_of: key of each unfinished offset learnt
        # (keyless ones left out); _key_queue: per key its learnt offsets, ascending, where entries
        # no longer in _key_of are finished and dropped when they reach the front. The front is
        # the key's head: a run of the key starts there.
        self._key_ordered = False
        self._keyed_to = start_offset
        self._key_of: dict[int, int] = {}
        self._key_queue: dict[int, deque[int]] = {}
        # Records acquired per key (keys with none are free), the member holding each such key
        # (the first to: after ordering was turned on at run time two may), and per member the
        # keys it holds (its key budget counts them)
        self._key_out: dict[int, int] = {}
        self._key_holder: dict[int, str] = {}
        self._keys_held: dict[str, int] = {}
        # keys freed or finished during the operation under way: their head may go (``_wake_keys``,
        # at the operation's end: waking splits ranges, which the walks under way must not see)
        self._to_wake: set[int] = set()
        self._keys_left = 0  # keys the acquire under way may still start a run of
        # per member the records its last acquire asked for (``key_read_end`` sizes its runs by it
        # when not told)
        self._asked: dict[str, int] = {}
        self._run_len = 1  # records of one key it takes at most
        # per key with records learnt, the length of the last run an acquire took of it: the member
        # that finished it (affinity) gets twice as many next time, up to the bound (``_run_length``)
        self._run_of: dict[int, int] = {}
        # The runs of the acquire under way: per key the offsets it takes next, in order, and every
        # such offset (to find the ones set aside as waiting, which its walk does not visit else)
        self._run_next: dict[int, deque[int]] = {}
        self._run_offsets: list[int] = []
        # Affinity: the member that finished each key's last record (by acknowledging it), and per
        # member those keys. An acquire of that member under a key budget takes them first.
        self._finisher: dict[int, str] = {}
        self._finished_by: dict[str, set[int]] = {}
        # the runs of the keys the acquire under way takes first (its member's), by head
        self._preferred: dict[int, list[int]] = {}
        self._must_reach = -1  # the last offset of a run the acquire under way has planned
        # the last offset learnt without a key (or in a batch whose keys were not read): what an
        # acquire may take that needs no key budget lies at or before it (``key_read_end``)
        self._last_keyless = -1

    def _forget_keys(self, keyed_to: int) -> None:
        """Forget every key learnt: they are learnt again from ``keyed_to`` on."""
        self._key_of.clear()
        self._key_queue.clear()
        self._key_out.clear()
        self._key_holder.clear()
        self._keys_held.clear()
        self._to_wake.clear()
        self._run_of.clear()
        self._forget_finishers()
        self._keyed_to = keyed_to
        self._last_keyless = -1

    @property
    def key_ordered(self) -> bool:
        """``kshare.share.ordering=key``: records of one key go to one member at a time, in offset order."""
        return self._key_ordered

    @key_ordered.setter
    def key_ordered(self, value: bool) -> None:
        if value == self._key_ordered:
            return
        self._key_ordered = value
        # Turned on: keys are learnt again from the SPSO (records acquired before stay acquired).
        # Turned off: records waiting for their key are plain Available.
        self._forget_keys(self._spso)
        if not value:
            for r in self._ranges:
                if r.state == _AVAILABLE and r.deadline == WAITS_FOR_KEY:
                    r.deadline = 0
            self._available_from = self._spso
            merge_between(self._ranges, 0, len(self._ranges))

    @property
    def keys_known_to(self) -> int:
        """Key-ordered groups: the keys of the records from here on are not known yet, so the
        batches of a fetch ending before it need no keys read (``acquire``'s record_keys)."""
        return max(self._keyed_to, self._spso)

    def ordered_key_count(self) -> int:
        """Keys with an unfinished record learnt (key-ordered groups; 0 otherwise)."""
        return len(self._key_queue)

    def keys_held(self, member_id: str) -> int:
        """Keys ``member_id`` holds records of (key-ordered groups)."""
        return self._keys_held.get(member_id, 0)

    def key_budget(self, member_id: str, members: Collection[str]) -> int:
        """How many keys ``member_id`` may take now (``acquire``'s max_keys), ``members`` sharing the
        partition (``member_id`` among them or not).

        One member at a time holds records of a key, so the keys with records waiting or out are
        divided among the members: each gets keys // members of them, and keys % members of the
        members one more -- a member may hold that one more while fewer others than that hold more
        than the base. Less the keys it holds. (A plain ceil(keys / members) each lets the first
        members to ask take every key: 20 keys and 8 members, seven take 3, 3, 3, 3, 3, 3, 2 and
        the eighth none, for good, as each finished key goes back to its finisher.)"""
        n = max(1, len(members) + (member_id not in members))
        base, extra = divmod(len(self._key_queue), n)
        held = self._keys_held
        above = sum(1 for m in members if m != member_id and held.get(m, 0) > base)
        return max(0, base + (above < extra) - held.get(member_id, 0))

    def _begin_keyed_acquire(
        self,
        member_id: str,
        fetched_batches: Sequence[FetchedBatch],
        record_keys: Sequence[RecordKeys | None] | None,
        fetch_offset: int | None,
        max_keys: int | None,
        max_records: int,
    ) -> None:
        """Set up an acquire of a key-ordered engine: learn the batches' keys, wake the keys freed
        by the lock expiries just processed, the key budget, the run length and the member's
        preferred runs (affinity)."""
        if record_keys is not None:
            self.learn_keys(fetched_batches, record_keys, fetch_offset)
        self._wake_keys()
        self._keys_left = _UNBOUNDED if max_keys is None else max_keys
        self._asked[member_id] = max_records
        self._run_len = run_length(max_records, max_keys, len(self._key_queue) - len(self._key_out))
        self._run_next = {}
        self._run_offsets = []
        self._preferred = {}
        self._must_reach = -1
        if max_keys is not None and max_keys < len(self._key_queue) and fetched_batches:
            # (a budget for every key takes every free head: nothing to prefer)
            self._choose_preferred(member_id, max_keys, fetched_batches[-1][1])
            self._keys_left -= len(self._preferred)

    def key_read_end(
        self, member_id: str, max_keys: int, log_end: int | None, max_records: int | None = None
    ) -> int | None:
        """Key-ordered groups: the last offset an acquire of ``member_id`` under ``max_keys`` (and
        ``max_records``: the length of its runs; when not given, what the member's last acquire
        asked for, a member asking for more then getting shorter runs this time) may take (or
        archive) anything at now, so the fetch need not read past it (-1: nothing at all); None
        when that is not known. ``log_end``: the partition's high watermark, if known.

        In the steady state every key is out but the ones the asking member just finished, so its
        acquire takes back its own keys' next runs and then walks the rest of the window (up to
        ``max_record_locks`` offsets: every batch read from the cache and decided on) for nothing
        more. ``_acquire_keyed`` takes the member's preferred runs (affinity) and the runs of the
        first free heads of other keys within its budget, and stops at the next free head past
        them all; with no such head it goes on to the end, taking only what needs no budget
        (records without a key, heads at the delivery limit, archived), and keys past
        ``keys_known_to`` are not known, nor are the records of a run past them. The property tests
        check that an acquire reading up to here takes what one reading on does."""
        queues = self._key_queue
        if not self._key_ordered or len(queues) > _KEYS_LOOKED_AT:
            return None
        now, limit = self._clock(), self._limit
        if self._locks and self._locks[0][0] <= now:
            return None  # locks run out first, freeing keys (``acquire`` expires them)
        if self._to_wake:
            return None  # (only inside an operation)
        speo = self._speo
        ranges = self._ranges
        # (a budget for every key prefers none: ``_begin_keyed_acquire``)
        mine = self._finished_by.get(member_id, ()) if max_keys < len(queues) else ()
        preferred: list[int] = []
        others: list[int] = []
        end = -1  # what it takes that needs no budget
        out = self._key_out
        for k in queues:
            if k in out:
                continue  # held: none of its records goes
            h = self._head(k)
            if h is None:
                continue
            if h < speo:
                r = ranges[index_of(ranges, h)]
                if r.state != _AVAILABLE or r.deadline > now:
                    continue  # in its backoff
                if r.count >= limit:
                    end = max(end, h)  # archived where the walk meets it
                    continue
            (preferred if k in mine else others).append(h)
        preferred.sort()
        others += preferred[max_keys:]  # beyond its budget its own keys are like any other's
        preferred = preferred[:max_keys]
        others.sort()
        left = max_keys - len(preferred)
        # the runs it takes: of the preferred heads and the first other free heads (the budget left)
        known = log_end is not None and max(self._keyed_to, self._spso) >= log_end
        if max_records is None:
            max_records = self._asked.get(member_id)
        length = run_length(max_records, max_keys, len(queues) - len(out))
        reach = -1
        key_of = self._key_of
        finisher = self._finisher
        for h in (*preferred, *others[:left]):
            k = key_of[h]
            if finisher.get(k) != member_id:
                reach = max(reach, h)  # a key changing hands: one record
                continue
            run, cut = self._plan_run(k, h, self._run_length(k, length), now)
            if not cut and not known:
                return None  # its run may go on into records whose keys are not known yet
            reach = max(reach, run[-1])
        # the walk stops at the next free head at or past the end of every run it takes, everything
        # before it known
        for h in others[left:]:
            if h >= reach:
                return h - 1
        if not known:
            return None  # it would go on into records whose keys are not known yet
        if self._last_keyless >= self._spso:
            end = max(end, self._last_keyless)
        return max(end, reach)

    def _run_length(self, key: int, bound: int) -> int:
        """How many records the member that finished ``key``'s last run (affinity) takes of it
        now: twice as many as that run, up to ``bound`` (its records spread over its keys). Any
        other start of a run takes one record: a key taken by another member than the one that
        finished its last record, or whose last run went back unfinished (lock expiry, member gone,
        released). So a member asking alone before the others joined takes one record of each
        key, not whole keys (which it would keep until it had processed them all while the others
        joined and found nothing), keys change hands with short runs, and a key that stays with its
        member soon goes in runs as long as the bound."""
        return min(bound, 2 * self._run_of.get(key, 1))

    def _plan_run(self, key: int, head: int, length: int, now: int) -> tuple[list[int], bool]:
        """The run of ``key`` from its free head ``head``: the head and the key's next unfinished
        learnt records, up to ``length`` in all, in offset order, stopping before the first that
        may not be acquired now (in its backoff, or at the delivery limit: it is archived when it
        is its key's head). Returns (its offsets, whether something cut it: the length or such a
        record; else the records learnt ran out first)."""
        run = [head]
        if length <= 1:
            return run, True
        key_of = self._key_of
        ranges = self._ranges
        speo, limit = self._speo, self._limit
        for o in self._key_queue[key]:
            if o <= head or o not in key_of:
                continue
            if o < speo:
                r = ranges[index_of(ranges, o)]
                if (
                    r.state != _AVAILABLE
                    or (r.deadline > now and r.deadline != WAITS_FOR_KEY)
                    or r.count >= limit
                ):
                    return run, True
            run.append(o)
            if len(run) >= length:
                return run, True
        return run, False

    def _forget_member_keys(self, member_id: str) -> None:
        """The member left: the keys it finished last are nobody's any more."""
        self._asked.pop(member_id, None)
        for k in self._finished_by.pop(member_id, ()):
            self._finisher.pop(k, None)

    def learn_keys(
        self,
        fetched_batches: Sequence[FetchedBatch],
        record_keys: Sequence[RecordKeys | None],
        fetch_offset: int | None,
    ) -> None:
        """Key-ordered groups: learn the keys of fetched records (``acquire`` does it with its
        record_keys; call it first to size ``max_keys`` on the keys known).

        Keys are learnt from ``keys_known_to`` on, while the batches run on from it without a
        gap of unknown offsets (gaps after fetch_offset are offsets missing upstream)."""
        cursor = max(self._keyed_to, self._spso)
        known = fetch_offset is not None and fetch_offset <= cursor
        key_of = self._key_of
        queues = self._key_queue
        ranges = self._ranges
        speo = self._speo
        i = index_of(ranges, cursor) if cursor < speo else len(ranges)
        for batch, keys in zip(fetched_batches, record_keys, strict=True):
            last = batch[1]
            if last < cursor:
                continue
            if batch[0] > cursor and not known:
                break
            known = True
            if keys is None:
                self._last_keyless = last
            else:
                offsets = keys.offsets
                ids = keys.keys
                j0 = bisect_left(offsets, cursor)
                if len(offsets) - j0 < last - max(cursor, batch[0]) + 1:
                    self._last_keyless = last  # offsets without a record (compacted) are taken as keyless
                for j in range(j0, len(offsets)):
                    k = ids[j]
                    if k == _NO_KEY:
                        # (not below the batch's last offset, set above when compacted offsets are in it)
                        self._last_keyless = max(self._last_keyless, offsets[j])
                    else:
                        o = offsets[j]
                        if o < speo:  # in the window (relearning after a restart): finished ones not
                            while ranges[i].last < o:
                                i += 1
                            r = ranges[i]
                            if r.state in TERMINAL_STATES:
                                continue
                            if r.state == _ACQUIRED:  # (acquired before ordering was turned on)
                                self._held_key(k, r.member)
                        key_of[o] = k
                        q = queues.get(k)
                        if q is None:
                            queues[k] = deque((o,))
                        else:
                            q.append(o)
            cursor = last + 1
        self._keyed_to = cursor

    def _held_key(self, key: int, member: str | None) -> None:
        n = self._key_out.get(key, 0)
        self._key_out[key] = n + 1
        if n == 0 and member is not None:
            self._key_holder[key] = member
            self._keys_held[member] = self._keys_held.get(member, 0) + 1

    def _count_out(self, first: int, last: int, member: str | None, acquired: bool) -> None:
        """Records first..last entered (``acquired``) or left Acquired, held by ``member``: count
        them per key; a key none of whose records is acquired any more is free (woken at the end
        of the operation)."""
        top = min(last, self._keyed_to - 1)
        if top < first or not self._key_of:
            return
        key_of = self._key_of
        out = self._key_out
        for o in range(first, top + 1):
            k = key_of.get(o)
            if k is None:
                continue
            if acquired:
                self._held_key(k, member)
                continue
            n = out.get(k, 0) - 1
            if n > 0:
                out[k] = n
                continue
            out.pop(k, None)
            holder = self._key_holder.pop(k, None)
            if holder is not None:
                left = self._keys_held[holder] - 1
                if left:
                    self._keys_held[holder] = left
                else:
                    del self._keys_held[holder]
            self._to_wake.add(k)

    def _is_head(self, offset: int, key: int) -> bool:
        """True when ``offset`` (unfinished, key ``key``) is the first unfinished record of its key."""
        q = self._key_queue[key]
        key_of = self._key_of
        while q[0] != offset and q[0] not in key_of:
            q.popleft()
        return q[0] == offset

    def _acquire_keyed(
        self,
        lo: int,
        hi: int,
        member_id: str,
        deadline: int,
        cap: int | None,
        pieces: list[list[int]],
    ) -> tuple[int, bool]:
        """Key-ordered acquisition of the offsets lo..hi of one batch; returns (offsets
        acquired, whether to stop: cap, key budget, window full or keys not known).

        First every acquirable offset is decided in offset order (take / wait for its key),
        then the decisions are applied run by run. A free key's head taken starts the key's run
        (``_plan_run``): its next records are taken where the walk meets them, in order (those set
        aside as waiting included), while each is the one expected next.
        """
        top = min(hi, max(self._keyed_to, self._spso) - 1)  # keys past it are not known yet
        runs: list[list[int]] = []  # [first, last, take?]
        key_of = self._key_of
        key_out = self._key_out
        limit = self._limit
        taken = 0
        preferred = self._preferred
        run_next = self._run_next
        now = self._now

        def decide(o: int, at_limit: bool) -> bool | None:
            nonlocal taken
            k = key_of.get(o)
            starts = None  # the run this record starts (a free key's head)
            nxt = None if k is None else run_next.get(k)
            if k is None:
                take = True
            elif nxt is not None and nxt[0] == o:
                take = True  # the next record of a run taken here
            else:
                if nxt is not None:
                    del run_next[k]  # its run's next record was not met: the run ends here
                if not self._is_head(o, k) or k in key_out:
                    take = False
                elif at_limit:  # archived rather than acquired: uses no budget
                    take = True
                elif o in preferred:  # (budget set aside for it)
                    take = True
                    starts = preferred[o]
                elif self._keys_left <= 0:
                    if o < self._must_reach:
                        return False  # left Available; runs taken here go on further
                    return None
                else:
                    take = True
                    if self._finisher.get(k) == member_id:  # (a budget for every key prefers none)
                        starts = self._plan_run(k, o, self._run_length(k, self._run_len), now)[0]
                    else:
                        starts = [o]  # a key changing hands: one record (``_run_length``)
            if take and not at_limit:
                if cap is not None and taken >= cap:
                    return None
                taken += 1
            if starts is not None:
                if o not in preferred:
                    self._keys_left -= 1
                self._drop_finisher(k)  # its next records go out: nothing left to keep
                self._run_of[k] = len(starts)
                if len(starts) > 1:
                    run_next[k] = deque(starts[1:])
                    for p in starts[1:]:
                        insort(self._run_offsets, p)
                    if starts[-1] > self._must_reach:
                        self._must_reach = starts[-1]
            elif nxt is not None and take:
                nxt.popleft()
                if not nxt:
                    del run_next[k]
            if runs and runs[-1][2] == take and runs[-1][1] == o - 1:
                runs[-1][1] = o
            else:
                runs.append([o, o, take])
            return take

        speo = self._speo
        ranges = self._ranges
        planned = self._run_offsets
        halt = False
        w = min(top, speo - 1)
        if lo <= w:  # offsets already in the window: the Available ones
            i = index_of(ranges, lo)
            while i < len(ranges) and not halt:
                r = ranges[i]
                if r.first > w:
                    break
                if r.state == _AVAILABLE:
                    at_limit = r.count >= limit
                    if r.deadline <= now:  # not waiting (backoff, key)
                        for o in range(max(r.first, lo), min(r.last, w) + 1):
                            if decide(o, at_limit) is None:
                                halt = True
                                break
                    elif r.deadline == WAITS_FOR_KEY and run_next:  # the records of runs set aside
                        j = bisect_left(planned, max(r.first, lo))
                        b = min(r.last, w)
                        while j < len(planned) and planned[j] <= b:
                            if decide(planned[j], at_limit) is None:
                                halt = True
                                break
                            j += 1
                i += 1
        if not halt and max(lo, speo) <= top:  # new offsets, while the window has room
            if self.max_record_locks - (speo - self._spso) <= 0:
                halt = True
            else:
                for o in range(max(lo, speo), top + 1):
                    if decide(o, False) is None:
                        halt = True
                        break
        got = 0
        for first, last, take in runs:
            if first < speo:
                end = min(last, speo - 1)
                if take:
                    self._unwait(first, end)
                    got += self._acquire_span(first, end, member_id, deadline, None, pieces)[0]
                else:
                    self._set_waiting(first, end)
                if last < speo:
                    continue
                first = speo
            if first > self._speo:  # unknown offsets before (no fetch_offset given): fetch again later
                self._append(StateRange(self._speo, first - 1, _AVAILABLE, 0))
            if take:
                self._append(StateRange(first, last, _ACQUIRED, 1, member_id, deadline))
                self._count_out(first, last, member_id, True)
                add_piece(pieces, first, last, 1)
                got += last - first + 1
            else:
                for a, b, waits in self._waiting_runs(first, last):
                    self._append(StateRange(a, b, _AVAILABLE, 0, None, WAITS_FOR_KEY if waits else 0))
        return got, halt or top < hi

    def _waiting_runs(self, first: int, last: int) -> list[tuple[int, int, bool]]:
        """first..last decided 'wait for the key' split by whether that still holds: a record
        archived on the way (at the delivery limit) makes the next one of its key the head, which
        waits only while its key is held."""
        key_of = self._key_of
        out_ = self._key_out
        out: list[tuple[int, int, bool]] = []
        for o in range(first, last + 1):
            k = key_of.get(o)
            waits = k is not None and (k in out_ or not self._is_head(o, k))
            if out and out[-1][2] == waits:
                out[-1] = (out[-1][0], o, waits)
            else:
                out.append((o, o, waits))
        return out

    def _set_waiting(self, first: int, last: int) -> None:
        """Mark the Available offsets of first..last (in the window) as waiting for their key."""
        ranges = self._ranges
        for a, b, waits in self._waiting_runs(first, last):
            if not waits:
                continue
            i = index_of(ranges, a)
            while i < len(ranges):
                r = ranges[i]
                if r.first > b:
                    break
                if r.state == _AVAILABLE and r.deadline != WAITS_FOR_KEY:
                    i = isolate(ranges, i, max(r.first, a), min(r.last, b))
                    r = ranges[i]
                    r.deadline = WAITS_FOR_KEY
                    self._touch(r.first, r.last)
                i += 1

    def _unwait(self, first: int, last: int) -> None:
        """The records of first..last set aside as waiting for their key are plain Available (a
        run taking them)."""
        ranges = self._ranges
        i = index_of(ranges, first)
        while i < len(ranges):
            r = ranges[i]
            if r.first > last:
                break
            if r.state == _AVAILABLE and r.deadline == WAITS_FOR_KEY:
                i = isolate(ranges, i, max(r.first, first), min(r.last, last))
                r = ranges[i]
                r.deadline = 0
                self._touch(r.first, r.last)
            i += 1

    def _finish_keys(self, first: int, last: int, member: str | None = None) -> None:
        """Records first..last are finished: the next record of each of their keys may go (at the
        end of the operation). ``member``: who finished them (acknowledged them while holding
        them), or None."""
        top = min(last, self._keyed_to - 1)
        if top < first or not self._key_of:
            return
        key_of = self._key_of
        keys = set()
        for o in range(first, top + 1):
            k = key_of.pop(o, None)
            if k is not None:
                keys.add(k)
        for k in keys:
            if member is not None:
                self._set_finisher(k, member)
        self._to_wake |= keys

    def _wake_keys(self) -> None:
        """The keys finished or freed by the operation under way: their heads may go."""
        if self._to_wake:
            for k in self._to_wake:
                self._next_of_key(k)
            self._to_wake.clear()

    def _set_finisher(self, key: int, member: str) -> None:
        old = self._finisher.get(key)
        if old == member:
            return
        if old is not None:
            self._drop_finished(old, key)
        self._finisher[key] = member
        mine = self._finished_by.get(member)
        if mine is None:
            self._finished_by[member] = {key}
        else:
            mine.add(key)

    def _drop_finisher(self, key: int) -> None:
        member = self._finisher.pop(key, None)
        if member is not None:
            self._drop_finished(member, key)

    def _drop_finished(self, member: str, key: int) -> None:
        mine = self._finished_by.get(member)
        if mine is not None:
            mine.discard(key)
            if not mine:
                del self._finished_by[member]

    def _forget_finishers(self) -> None:
        self._finisher.clear()
        self._finished_by.clear()

    def _head(self, key: int) -> int | None:
        """The first unfinished learnt record of ``key`` (finished ones dropped from the front)."""
        q = self._key_queue.get(key)
        if not q:
            return None
        key_of = self._key_of
        while q and q[0] not in key_of:
            q.popleft()
        return q[0] if q else None

    def _choose_preferred(self, member_id: str, budget: int, up_to: int) -> None:
        """The free heads, up to ``budget`` of them (first in offset order) and up to offset
        ``up_to``, of the keys ``member_id`` finished last that may be acquired now, with their runs:
        ``_acquire_keyed`` takes these first, so a consumer asking again with its acknowledgements
        gets the next records of each key it just finished (within its budget) instead of another
        member, and the keys stay spread as they were."""
        mine = self._finished_by.get(member_id)
        if not mine or budget <= 0:
            return
        ranges = self._ranges
        spso, speo, now = self._spso, self._speo, self._now
        heads = []
        for k in mine:
            if k in self._key_out:
                continue
            h = self._head(k)
            if h is None or not spso <= h < speo or h > up_to:
                continue
            r = ranges[index_of(ranges, h)]
            if r.state == _AVAILABLE and r.deadline <= now and r.count < self._limit:
                heads.append(h)
        if len(heads) > budget:
            heads.sort()
            del heads[budget:]
        key_of = self._key_of
        for h in heads:
            k = key_of[h]
            run = self._plan_run(k, h, self._run_length(k, self._run_len), now)[0]
            self._preferred[h] = run
            if run[-1] > self._must_reach:
                self._must_reach = run[-1]

    def _next_of_key(self, key: int) -> None:
        """Drop the key's finished records from its front; its new head stops waiting, unless a
        record of the key is still acquired."""
        q = self._key_queue.get(key)
        if q is None:
            return
        key_of = self._key_of
        while q and q[0] not in key_of:
            q.popleft()
        if not q:
            del self._key_queue[key]
            self._run_of.pop(key, None)
            self._drop_finisher(key)
            return
        if key in self._key_out:
            return
        h = q[0]
        if self._spso <= h < self._speo:
            ranges = self._ranges
            i = index_of(ranges, h)
            r = ranges[i]
            if r.state == _AVAILABLE and r.deadline == WAITS_FOR_KEY:
                i = isolate(ranges, i, h, h)
                ranges[i].deadline = 0
                self._touch(h, h)
                if h < self._available_from:
                    self._available_from = h
