"""Property tests: key-ordered sharing in the engine (``kshare.share.ordering=key``).

A hypothesis state machine drives one key-ordered ``SharePartition`` with random acquisitions
by three members from a random upstream log (records with a few keys, keyless records, control
batches, offsets missing upstream), acknowledgements of every type, lock timeouts, member
releases, key budgets and crash/restarts. After every step it checks the guarantees from the
record keys of the log (never from the engine's own bookkeeping):

* no two members ever hold records of one key;
* an acquisition takes records of a key only when none of its records is held (the key is free),
  and then the key's first unfinished records, in offset order, with none skipped (its *run*):
  each record handed out only after every earlier record of its key is finished or in the same
  member's run; a run is at most the member's records spread over its keys
  (max_records // max_keys), and one record unless the member finished the key's last record;
* a record held has no earlier unfinished record of its key held by another member, nor waiting
  (only one its own member released out of its run, which is its choice);
* a record set aside as waiting for its key has an earlier unfinished record of that key, or a
  record of its key is held (no record waits for nothing, which would strand it);
* an acquire under a key budget takes records of at most that many keys, and first the runs of
  the free keys its member finished last (affinity), against a reference model of who finished
  which key; and reading only up to ``key_read_end`` it takes the same;
* (apart) the members' budgets (``key_budget``) divide the keys evenly and leave no member without;
* the durable writes replay to the engine's snapshot;

and at the end that draining with one member finishes every record (nothing is lost or stuck).
"""

from __future__ import annotations

import copy
import os
from array import array
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from kshare.share.partition import FetchedBatch, SharePartition
from kshare.share.states import AcknowledgeType, RecordState, ShareSnapshot, ShareUpdate, replay
from tests.harness.properties import stateful_settings

MEMBERS = ("a", "b", "c")
NO_KEY = -1


@dataclass
class Keys:
    offsets: array
    keys: array


class Log:
    """Batches of the upstream log with the key of every record."""

    def __init__(self, batches: list[tuple[FetchedBatch, Keys]]) -> None:
        self.batches = batches
        self.key_of = {o: k for _, keys in batches for o, k in zip(keys.offsets, keys.keys, strict=True)
                       if k != NO_KEY}
        self.end = batches[-1][0].last_offset + 1 if batches else 0

    def __repr__(self) -> str:
        return "Log(" + ", ".join(
            f"{b.base_offset}-{b.last_offset}" + ("C" if b.is_control else str(dict(zip(k.offsets, k.keys, strict=True))))
            for b, k in self.batches) + ")"

    def fetch(self, offset: int, count: int) -> tuple[list[FetchedBatch], list[Keys]]:
        got = [(b, k) for b, k in self.batches if b.last_offset >= offset][:count]
        return [b for b, _ in got], [k for _, k in got]


@st.composite
def logs(draw: st.DrawFn) -> Log:
    batches: list[tuple[FetchedBatch, Keys]] = []
    offset = 0
    for _ in range(draw(st.integers(1, 14))):
        offset += draw(st.sampled_from([0, 0, 0, 0, 1, 2]))  # offsets missing upstream (compacted)
        if draw(st.integers(0, 9)) == 0:
            batches.append((FetchedBatch(offset, offset, is_control=True), Keys(array("q"), array("q"))))
            offset += 1
            continue
        n = draw(st.integers(1, 5))
        keys = [draw(st.sampled_from([NO_KEY, 1, 2, 2, 3, 3, 4])) for _ in range(n)]
        # a compacted batch keeps its offset span but not every record
        present = [i for i in range(n) if i in (0, n - 1) or draw(st.integers(0, 5))]
        batches.append((FetchedBatch(offset, offset + n - 1),
                        Keys(array("q", [offset + i for i in present]), array("q", [keys[i] for i in present]))))
        offset += n
    return Log(batches)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000

    def __call__(self) -> int:
        return self.now


class KeyOrderMachine(RuleBasedStateMachine):
    @initialize(log=logs(), limit=st.integers(2, 4), locks=st.integers(3, 30),
                backoff=st.sampled_from([0, 0, 50]))
    def setup(self, log: Log, limit: int, locks: int, backoff: int) -> None:
        self.log = log
        self.clock = Clock()
        self.config = dict(clock=self.clock, delivery_count_limit=limit, max_record_locks=locks,
                           record_lock_duration_ms=100, redelivery_backoff_ms=backoff,
                           redelivery_backoff_max_ms=200, key_ordered=True)
        self.sp = SharePartition(0, **self.config)
        self.snapshot = ShareSnapshot(0, ())
        self.updates: list[ShareUpdate] = []
        # reference model of affinity: key -> the member whose acknowledgement finished its last
        # finished record, until its next record is acquired, while the key has a learnt
        # unfinished record
        self.finisher: dict[int, str] = {}

    def _record(self, update: ShareUpdate | None) -> None:
        if update is not None:
            self.updates.append(update)

    def _acquired_by(self, member: str) -> list[int]:
        return [o for r in self.sp.in_flight() if r.state == RecordState.ACQUIRED and r.member_id == member
                for o in range(r.first_offset, r.last_offset + 1)]

    def _state_of(self) -> dict[int, object]:
        return {o: r for r in self.sp.in_flight() for o in range(r.first_offset, r.last_offset + 1)}

    def _head(self, key: int, states: dict[int, object]) -> int | None:
        """The first unfinished record of ``key`` by the log and the record states."""
        for o in sorted(o for o, k in self.log.key_of.items() if k == key):
            r = states.get(o)
            if o >= self.sp.end_offset or (r is not None and r.state in (RecordState.AVAILABLE,
                                                                          RecordState.ACQUIRED)):
                return o
        return None

    def _forget_keys_without_work(self) -> None:
        """A key with no learnt unfinished record keeps no affinity (the engine drops it then)."""
        states = self._state_of()
        known = self.sp.keys_known_to
        for k in list(self.finisher):
            h = self._head(k, states)
            if h is None or h >= known:
                del self.finisher[k]

    def _holders(self) -> dict[int, set[str]]:
        """Per key, the members holding records of it."""
        out: dict[int, set[str]] = {}
        for r in self.sp.in_flight():
            if r.state == RecordState.ACQUIRED:
                for o in range(r.first_offset, r.last_offset + 1):
                    k = self.log.key_of.get(o)
                    if k is not None:
                        out.setdefault(k, set()).add(r.member_id)
        return out

    def _unfinished_of(self, key: int, states: dict[int, object]) -> list[int]:
        """The unfinished records of ``key`` by the log and the record states, ascending."""
        return [o for o in sorted(o for o, k in self.log.key_of.items() if k == key)
                if o >= self.sp.end_offset or (o in states and states[o].state in (RecordState.AVAILABLE,
                                                                                    RecordState.ACQUIRED))]

    @rule(member=st.sampled_from(MEMBERS), batches=st.integers(1, 6), max_records=st.sampled_from([1, 2, 5, 12, 40]),
          record_limit=st.booleans(), max_keys=st.sampled_from([None, 0, 1, 2]))
    def acquire(self, member: str, batches: int, max_records: int, record_limit: bool, max_keys: int | None) -> None:
        # (acquire expires the locks due first: done here, so that the states seen before are its own)
        self._record(self.sp.expire_locks())
        self._forget_keys_without_work()
        offset = self.sp.next_fetch_offset()
        fetched, keys = self.log.fetch(offset, batches)
        states = self._state_of()
        held_before = self._holders()
        end_before = self.sp.end_offset
        unfinished_before = {k: self._unfinished_of(k, states) for k in set(self.log.key_of.values())}
        # the heads of the free keys the member finished that it may acquire now, per the model
        mine = []
        for k, m in self.finisher.items():
            h = self._head(k, states) if m == member and k not in held_before else None
            r = states.get(h) if h is not None else None
            if (r is not None and r.state == RecordState.AVAILABLE and not r.waits_for_key
                    and (r.available_at_ms is None or r.available_at_ms <= self.clock.now)
                    and r.delivery_count < self.config["delivery_count_limit"]
                    and fetched and offset <= h <= fetched[-1].last_offset):
                mine.append(h)
        # what a fetch reading only up to key_read_end (the keys known now) would take
        end = (self.sp.key_read_end(member, max_keys, self.log.end, max_records)
               if max_keys is not None else None)
        cut = None
        if end is not None:
            twin = copy.deepcopy(self.sp)
            twin._clock = self.clock
            upto = [i for i, b in enumerate(fetched) if b.base_offset <= end]
            if upto:
                n = upto[-1] + 1
                r = twin.acquire(member, fetched[:n], max_records, int(record_limit), fetch_offset=offset,
                                 record_keys=keys[:n], max_keys=max_keys)
                cut = [o for a in r.records for o in range(a.first_offset, a.last_offset + 1)]
            else:
                cut = []
        result = self.sp.acquire(member, fetched, max_records, int(record_limit), fetch_offset=offset,
                                 record_keys=keys, max_keys=max_keys)
        self._record(result.update)
        got = [o for a in result.records for o in range(a.first_offset, a.last_offset + 1)]
        if cut is not None:
            assert cut == got, f"reading up to key_read_end {end} took {cut}, reading all {got}"
        by_key: dict[int, list[int]] = {}
        for o in got:
            k = self.log.key_of.get(o)
            if k is not None:
                by_key.setdefault(k, []).append(o)
        after = self._state_of()
        for k, run in by_key.items():
            assert k not in held_before, f"{member} got {run} of key {k}, held by {held_before[k]}"
            # the key's first unfinished records, in order, none skipped (a head archived here at
            # the delivery limit is finished)
            first = [o for o in unfinished_before[k]
                     if not (o < self.sp.start_offset or (o < end_before and o in after
                                                          and after[o].state == RecordState.ARCHIVED))]
            assert run == first[:len(run)], f"{member} got {run} of key {k}, whose first unfinished are {first}"
            # a run longer than one only for the member that finished the key's last record (affinity)
            assert len(run) == 1 or self.finisher.get(k) == member, (member, k, run, self.finisher.get(k))
        if max_keys is not None:
            assert len(by_key) <= max_keys, f"{member} got records of {len(by_key)} keys, budget {max_keys}"
            if max_keys > 0:
                bound = max(1, max_records // max_keys)
                assert all(len(run) <= bound for run in by_key.values()), (by_key, bound)
            span = sum(b.last_offset - b.base_offset + 1 for b in fetched)
            if max_records >= span:  # the record budget cannot stop it first
                first = sorted(mine)[:max_keys]
                assert set(first) <= set(got), f"{member} did not get the heads {first} of its keys: {got}"
        if record_limit:
            assert len(got) <= max_records
        for k in by_key:  # a key's next records went out: nothing is kept for anyone
            self.finisher.pop(k, None)
        self._forget_keys_without_work()

    def _a_holder(self, data: st.DataObject) -> str | None:
        """A member holding records, if any (acknowledging members that hold nothing explores nothing)."""
        holders = [m for m in MEMBERS if self._acquired_by(m)]
        return data.draw(st.sampled_from(holders)) if holders else None

    @rule(data=st.data())
    def acknowledge(self, data: st.DataObject) -> None:
        member = self._a_holder(data)
        if member is None:
            return
        held = self._acquired_by(member)
        chosen = sorted(data.draw(st.sets(st.sampled_from(held), min_size=1)))
        kinds = st.sampled_from([AcknowledgeType.ACCEPT, AcknowledgeType.ACCEPT, AcknowledgeType.RELEASE,
                                 AcknowledgeType.REJECT])
        acks = [(o, data.draw(kinds)) for o in chosen]  # (one type per record: a run's may differ)
        self._acknowledge(member, acks)

    @rule(data=st.data(), batches=st.integers(1, 6), max_records=st.sampled_from([2, 5, 12, 40]),
          record_limit=st.booleans(), max_keys=st.sampled_from([None, 1, 2]))
    def fetch_with_acknowledgements(self, data: st.DataObject, batches: int, max_records: int, record_limit: bool,
                                    max_keys: int | None) -> None:
        """A consumer's ShareFetch carrying the acknowledgements of what it holds (mostly ACCEPT):
        the keys it finishes go on with it (affinity), in runs growing each time."""
        member = self._a_holder(data)
        if member is None:
            return
        kinds = st.sampled_from([AcknowledgeType.ACCEPT] * 5 + [AcknowledgeType.RELEASE, AcknowledgeType.REJECT])
        self._acknowledge(member, [(o, data.draw(kinds)) for o in self._acquired_by(member)])
        self.acquire(member, batches, max_records, record_limit, max_keys)

    @rule(data=st.data())
    def release_out_of_run(self, data: st.DataObject) -> None:
        """The consumer's own choice: RELEASE a record of its run and ACCEPT some later ones, the
        rest of the run still held (the released record must wait until the run is done)."""
        member = self._a_holder(data)
        if member is None:
            return
        runs: dict[int, list[int]] = {}
        for o in self._acquired_by(member):
            k = self.log.key_of.get(o)
            if k is not None:
                runs.setdefault(k, []).append(o)
        runs = {k: r for k, r in runs.items() if len(r) >= 2}
        if not runs:
            return
        run = runs[data.draw(st.sampled_from(sorted(runs)))]
        i = data.draw(st.integers(0, len(run) - 2))
        later = sorted(data.draw(st.sets(st.sampled_from(run[i + 1:]), max_size=len(run) - i - 2)))
        self._acknowledge(member, [(run[i], AcknowledgeType.RELEASE), *((o, AcknowledgeType.ACCEPT) for o in later)])

    def _acknowledge(self, member: str, acks: list[tuple[int, AcknowledgeType]]) -> None:
        chosen = [o for o, _ in acks]
        result = self.sp.acknowledge(member, [(o, o, int(ack)) for o, ack in acks])
        assert result.error_code == 0
        self._record(result.update)
        states = self._state_of()
        for o in chosen:
            k = self.log.key_of.get(o)
            r = states.get(o)
            if k is not None and (o < self.sp.start_offset or r.state in (RecordState.ACKNOWLEDGED,
                                                                          RecordState.ARCHIVED)):
                self.finisher[k] = member
        self._forget_keys_without_work()

    @rule(ms=st.sampled_from([10, 60, 101, 250]))
    def tick(self, ms: int) -> None:
        self.clock.now += ms
        self._record(self.sp.expire_locks())
        self._forget_keys_without_work()

    @rule(member=st.sampled_from(MEMBERS))
    def release_member(self, member: str) -> None:
        self._record(self.sp.release_member(member))
        self.finisher = {k: m for k, m in self.finisher.items() if m != member}
        self._forget_keys_without_work()

    @rule()
    def restart(self) -> None:
        self.snapshot = self.sp.snapshot()
        self.updates = []
        self.sp = SharePartition.from_snapshot(self.snapshot, **self.config)
        self.finisher = {}

    # ---------------------------------------------------------------- guarantees

    def _unfinished(self) -> set[int]:
        return {o for r in self.sp.in_flight() if r.state in (RecordState.AVAILABLE, RecordState.ACQUIRED)
                for o in range(r.first_offset, r.last_offset + 1)}

    @invariant()
    def one_member_per_key_in_order(self) -> None:
        states = self._state_of()
        for k, members in self._holders().items():
            assert len(members) == 1, f"key {k} held by {sorted(members)}"
            m = next(iter(members))
            held = [o for o in self._unfinished_of(k, states) if states.get(o) is not None
                    and states[o].state == RecordState.ACQUIRED]
            for o in self._unfinished_of(k, states):
                if o > held[-1]:
                    break
                r = states.get(o)
                # earlier than a record held: held by the same member (its run), or released by it
                # out of its run (Available, not waiting: it goes when the run is done)
                assert r is not None and (r.state == RecordState.ACQUIRED and r.member_id == m
                                          or r.state == RecordState.AVAILABLE), (
                    f"offset {o} of key {k} is {r} while {m} holds {held}")

    @invariant()
    def nothing_waits_for_nothing(self) -> None:
        unfinished = self._unfinished()
        holders = self._holders()
        for r in self.sp.in_flight():
            if not r.waits_for_key:
                continue
            for o in range(r.first_offset, r.last_offset + 1):
                k = self.log.key_of.get(o)
                assert k is not None, f"keyless offset {o} set aside for a key"
                assert k in holders or any(p < o and self.log.key_of.get(p) == k for p in unfinished), (
                    f"offset {o} waits although no earlier record of key {k} is unfinished, nor one held")

    @invariant()
    def durable_writes_replay_to_the_snapshot(self) -> None:
        assert replay(self.snapshot, self.updates) == replay(self.sp.snapshot(), ())

    def teardown(self) -> None:
        if not hasattr(self, "sp"):
            return
        # Drain with one member accepting everything: every record ends finished.
        for _ in range(4 * (self.log.end + 10)):
            if self.sp.start_offset >= self.log.end:
                break
            self.clock.now += 1_000  # past every lock and backoff
            self.sp.expire_locks()
            offset = self.sp.next_fetch_offset()
            fetched, keys = self.log.fetch(offset, 3)
            result = self.sp.acquire("z", fetched, 50, fetch_offset=offset, record_keys=keys)
            if result.records:
                self.sp.acknowledge("z", [(a.first_offset, a.last_offset, int(AcknowledgeType.ACCEPT))
                                          for a in result.records])
        assert self.sp.start_offset >= self.log.end, f"stuck: {self.sp!r}"


KeyOrderMachine.TestCase.settings = stateful_settings(examples=150, steps=40)
TestKeyOrder = KeyOrderMachine.TestCase


def test_turning_ordering_off_frees_the_records_waiting_for_their_key_and_on_relearns():
    keys = Keys(array("q", [0, 1, 2, 3]), array("q", [7, 7, 8, 7]))
    batch = [FetchedBatch(0, 3)]
    sp = SharePartition(0, key_ordered=True)
    # 2 records over the 2 free keys: runs of one record each
    got = sp.acquire("a", batch, 2, fetch_offset=0, record_keys=[keys])
    assert [(r.first_offset, r.last_offset) for r in got.records] == [(0, 0), (2, 2)]
    assert [o for r in sp.in_flight() if r.waits_for_key for o in range(r.first_offset, r.last_offset + 1)] == [1, 3]
    assert not sp.has_available()
    sp.key_ordered = False
    assert not any(r.waits_for_key for r in sp.in_flight())
    got = sp.acquire("b", batch, 10, fetch_offset=sp.next_fetch_offset())
    assert [(r.first_offset, r.last_offset) for r in got.records] == [(1, 1), (3, 3)]
    # on again: keys are relearnt from the SPSO; records of key 7 already out stay out, and nothing
    # more of a key goes while one of its records is out
    sp.acknowledge("b", [(1, 1, int(AcknowledgeType.RELEASE)), (3, 3, int(AcknowledgeType.RELEASE))])
    sp.key_ordered = True
    assert sp.next_fetch_offset() == 0  # to read the keys again
    got = sp.acquire("c", batch, 10, fetch_offset=0, record_keys=[keys])
    assert got.records == []  # 1 and 3 wait for 0 (key 7, still acquired by a)
    sp.acknowledge("a", [(0, 0, int(AcknowledgeType.ACCEPT))])
    got = sp.acquire("c", batch, 10, fetch_offset=sp.next_fetch_offset(), record_keys=[keys])
    assert [(r.first_offset, r.last_offset) for r in got.records] == [(1, 1)]  # (a key changing hands: one)


def _taken(result) -> list[int]:
    return [o for r in result.records for o in range(r.first_offset, r.last_offset + 1)]


def test_the_keys_a_member_finished_stay_with_it_within_its_budget():
    """Affinity: a member asking again gets the next records of the keys it just finished before
    any other free key (so those keys go on at once and stay spread as they were), within its key
    budget; a member that left (release_member) has no keys kept for it. (Runs of one record here:
    as many records as keys.)"""
    keys = Keys(array("q", range(12)), array("q", [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4]))
    batch = [FetchedBatch(0, 11)]
    sp = SharePartition(0, key_ordered=True)
    assert _taken(sp.acquire("a", batch, 2, fetch_offset=0, record_keys=[keys], max_keys=2)) == [0, 1]
    assert _taken(sp.acquire("b", batch, 2, fetch_offset=sp.next_fetch_offset(), max_keys=2)) == [2, 3]
    sp.acknowledge("a", [(0, 1, int(AcknowledgeType.ACCEPT))])
    sp.acknowledge("b", [(2, 3, int(AcknowledgeType.ACCEPT))])
    # b asks first: the first free heads are 4 and 5 (keys 1, 2: a's), but b finished keys 3 and 4
    assert _taken(sp.acquire("b", batch, 2, fetch_offset=sp.next_fetch_offset(), max_keys=2)) == [6, 7]
    assert _taken(sp.acquire("a", batch, 2, fetch_offset=sp.next_fetch_offset(), max_keys=2)) == [4, 5]
    # within the budget: one key of the two b finished, the first by offset
    sp.acknowledge("b", [(6, 7, int(AcknowledgeType.ACCEPT))])
    sp.acknowledge("a", [(4, 5, int(AcknowledgeType.ACCEPT))])
    assert _taken(sp.acquire("b", batch, 1, fetch_offset=sp.next_fetch_offset(), max_keys=1)) == [10]
    # free now: 8 and 9 (keys 1, 2: a's), 11 (key 4: b's). b leaves (10 goes back) and comes back:
    # nothing is kept for it, it gets the first free head
    sp.release_member("b")
    assert _taken(sp.acquire("b", batch, 1, fetch_offset=sp.next_fetch_offset(), max_keys=1)) == [8]
    # without a budget a member takes every free head, in offset order (3 records over the 3 free
    # keys: runs of one)
    assert _taken(sp.acquire("c", batch, 3, fetch_offset=sp.next_fetch_offset())) == [9, 10, 11]


@given(n_keys=st.integers(1, 12), n_members=st.integers(1, 5), run=st.integers(1, 3),
       steps=st.lists(st.tuples(st.integers(0, 4), st.floats(0, 1)), min_size=1, max_size=25))
@settings(max_examples=int(os.environ.get("KSHARE_PROPERTY_EXAMPLES", "150")), deadline=None)
def test_key_budgets_divide_the_keys_evenly_and_leave_no_member_without(n_keys: int, n_members: int, run: int,
                                                                        steps: list[tuple[int, float]]) -> None:
    """Members taking ``key_budget`` keys each (runs of up to ``run`` records of a key), in any
    order, acknowledging any part of what they hold between their fetches: with K keys and M
    members, none holds more than K // M + 1, and at most K % M of them more than K // M (the plain
    ceil(K / M) each let the first members take every key, 20 keys on 8 members leaving one with
    none); and a member asking gets exactly its budget when that many keys are free (every key has
    records enough to stay in play, so the number of keys does not change)."""
    members = [f"m{i}" for i in range(n_members)]
    per_key = 3 * 25 + 1  # > the records of a key the steps can finish
    n = n_keys * per_key
    keys = Keys(array("q", range(n)), array("q", [o % n_keys for o in range(n)]))
    batch = [FetchedBatch(0, n - 1)]
    sp = SharePartition(0, key_ordered=True, max_record_locks=n)
    sp.learn_keys(batch, [keys], 0)
    base, extra = divmod(n_keys, n_members)

    def keys_of(m: str) -> set[int]:
        return {o % n_keys for o in _acquired(sp, m)}

    for who, part in steps:
        member = members[who % n_members]
        held = _acquired(sp, member)
        done = held[:round(part * len(held))]
        if done:
            sp.acknowledge(member, [(o, o, int(AcknowledgeType.ACCEPT)) for o in done])
        assert sp.ordered_key_count() == n_keys
        budget = sp.key_budget(member, members)
        before = len(keys_of(member))
        assert sp.keys_held(member) == before
        free = n_keys - sum(len(keys_of(m)) for m in members)
        sp.acquire(member, batch, run * max(1, budget), fetch_offset=sp.next_fetch_offset(), max_keys=budget)
        holding = {m: len(keys_of(m)) for m in members}
        assert holding[member] == before + min(budget, free), (budget, free, holding)
        assert max(holding.values()) <= base + (extra > 0), holding
        assert sum(1 for h in holding.values() if h > base) <= extra, holding
        if before < base:
            assert holding[member] >= min(base, before + free)
        assert len(_acquired(sp, member)) <= run * holding[member]


def _acquired(sp: SharePartition, member: str) -> list[int]:
    return [o for r in sp.in_flight() if r.state == RecordState.ACQUIRED and r.member_id == member
            for o in range(r.first_offset, r.last_offset + 1)]


def test_a_free_key_goes_as_a_run_to_one_member_and_nobody_else_gets_it_until_the_run_is_done():
    """A free key's head and its next records go to one member in one acquisition (its run), in
    offset order; while any record of the run is held nobody else gets a record of the key. A key
    changing hands goes one record first; the member that finished a key's last run gets the next
    one twice as long (affinity), up to the records it may take spread over the keys it may take. A
    lock that runs out gives the whole run back, taken again from its head, in order."""
    keys = Keys(array("q", range(16)), array("q", [1, 2] * 8))  # key 1: the even offsets, key 2: the odd
    batch = [FetchedBatch(0, 15)]
    clock = Clock()
    sp = SharePartition(0, key_ordered=True, clock=clock, record_lock_duration_ms=100)
    assert _taken(sp.acquire("a", batch, 4, fetch_offset=0, record_keys=[keys], max_keys=2)) == [0, 1]
    assert sp.keys_held("a") == 2
    assert _taken(sp.acquire("b", batch, 4, fetch_offset=sp.next_fetch_offset(), max_keys=2)) == []
    sp.acknowledge("a", [(0, 1, int(AcknowledgeType.ACCEPT))])
    assert _taken(sp.acquire("a", batch, 8, fetch_offset=sp.next_fetch_offset(), max_keys=2)) == [2, 3, 4, 5]
    assert _taken(sp.acquire("b", batch, 4, fetch_offset=sp.next_fetch_offset(), max_keys=2)) == []
    sp.acknowledge("a", [(2, 5, int(AcknowledgeType.ACCEPT))])
    # a budget of one key: its first key's next run, twice as long, the bound (8 records) allowing
    assert _taken(sp.acquire("a", batch, 8, fetch_offset=sp.next_fetch_offset(), max_keys=1)) == [6, 8, 10, 12]
    clock.now += 60
    assert _taken(sp.acquire("b", batch, 8, fetch_offset=sp.next_fetch_offset(), max_keys=1)) == [7]
    # a's locks run out: its run goes back whole; the key goes again from its head, one record first
    clock.now += 41
    sp.expire_locks()  # (the lock timer)
    assert sp.acquired_count("a") == 0
    assert _taken(sp.acquire("c", batch, 8, fetch_offset=sp.next_fetch_offset(), max_keys=1)) == [6]
    sp.acknowledge("c", [(6, 6, int(AcknowledgeType.ACCEPT))])
    assert _taken(sp.acquire("c", batch, 8, fetch_offset=sp.next_fetch_offset(), max_keys=1)) == [8, 10]
    assert _taken(sp.acquire("a", batch, 8, fetch_offset=sp.next_fetch_offset(), max_keys=1)) == []


def test_a_record_released_out_of_its_run_waits_until_the_rest_of_the_run_is_done():
    """The one way a key's records can be processed out of order is the consumer's own choice: it
    RELEASEs record k of its run and ACCEPTs k+1. Even then nobody gets k while records of the
    run after it are still held; once the run is done k goes again (before the key's later
    records). The same when the rest of the run goes back (its member left)."""
    keys = Keys(array("q", range(12)), array("q", [1] * 12))
    batch = [FetchedBatch(0, 11)]
    sp = SharePartition(0, key_ordered=True)
    assert _taken(sp.acquire("a", batch, 8, fetch_offset=0, record_keys=[keys], max_keys=1)) == [0]
    sp.acknowledge("a", [(0, 0, int(AcknowledgeType.ACCEPT))])
    assert _taken(sp.acquire("a", batch, 8, fetch_offset=sp.next_fetch_offset(), max_keys=1)) == [1, 2]
    sp.acknowledge("a", [(1, 2, int(AcknowledgeType.ACCEPT))])
    assert _taken(sp.acquire("a", batch, 8, fetch_offset=sp.next_fetch_offset(), max_keys=1)) == [3, 4, 5, 6]
    sp.acknowledge("a", [(3, 3, int(AcknowledgeType.RELEASE)), (4, 4, int(AcknowledgeType.ACCEPT))])
    # 3 is Available again, but 5 and 6 are still held: 3 waits
    assert _taken(sp.acquire("b", batch, 8, fetch_offset=sp.next_fetch_offset(), max_keys=1)) == []
    assert [o for r in sp.in_flight() if r.waits_for_key for o in range(r.first_offset, r.last_offset + 1)] == [
        3, 7, 8, 9, 10, 11]
    assert not sp.has_available()
    sp.acknowledge("a", [(5, 6, int(AcknowledgeType.ACCEPT))])
    assert sp.has_available()
    assert _taken(sp.acquire("b", batch, 8, fetch_offset=sp.next_fetch_offset(), max_keys=1)) == [3]
    sp.acknowledge("b", [(3, 3, int(AcknowledgeType.ACCEPT))])
    assert _taken(sp.acquire("b", batch, 8, fetch_offset=sp.next_fetch_offset(), max_keys=1)) == [7, 8]
    sp.acknowledge("b", [(7, 7, int(AcknowledgeType.RELEASE))])
    assert _taken(sp.acquire("c", batch, 8, fetch_offset=sp.next_fetch_offset(), max_keys=1)) == []
    sp.release_member("b")
    assert _taken(sp.acquire("c", batch, 8, fetch_offset=sp.next_fetch_offset(), max_keys=1)) == [7]


def test_a_run_stops_before_a_record_still_in_its_redelivery_backoff():
    """A run is the key's next unfinished records with none skipped: it ends before the first one
    that may not go yet (here one released later, still in its redelivery backoff), and the records
    after it wait too."""
    keys = Keys(array("q", range(8)), array("q", [1] * 8))
    batch = [FetchedBatch(0, 7)]
    clock = Clock()
    sp = SharePartition(0, key_ordered=True, clock=clock, redelivery_backoff_ms=1000, redelivery_backoff_max_ms=1000)
    assert _taken(sp.acquire("a", batch, 8, fetch_offset=0, record_keys=[keys], max_keys=1)) == [0]
    sp.acknowledge("a", [(0, 0, int(AcknowledgeType.ACCEPT))])
    assert _taken(sp.acquire("a", batch, 8, fetch_offset=sp.next_fetch_offset(), max_keys=1)) == [1, 2]
    sp.acknowledge("a", [(1, 2, int(AcknowledgeType.ACCEPT))])
    assert _taken(sp.acquire("a", batch, 8, fetch_offset=sp.next_fetch_offset(), max_keys=1)) == [3, 4, 5, 6]
    sp.acknowledge("a", [(3, 3, int(AcknowledgeType.RELEASE))])  # back after 1 s
    clock.now += 500
    sp.acknowledge("a", [(4, 4, int(AcknowledgeType.RELEASE)), (5, 6, int(AcknowledgeType.ACCEPT))])  # 4: after 1.5 s
    clock.now += 600
    sp.expire_locks()  # (the timer: 3's backoff is over, 4's is not)
    assert _taken(sp.acquire("a", batch, 8, fetch_offset=sp.next_fetch_offset(), max_keys=1)) == [3]
    assert [o for r in sp.in_flight() if r.waits_for_key for o in range(r.first_offset, r.last_offset + 1)] == [7]
    sp.acknowledge("a", [(3, 3, int(AcknowledgeType.ACCEPT))])
    clock.now += 500
    sp.expire_locks()
    assert _taken(sp.acquire("a", batch, 8, fetch_offset=sp.next_fetch_offset(), max_keys=1)) == [4, 7]
