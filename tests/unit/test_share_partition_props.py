"""Property tests: the range engine against a naive per-offset reference model.

The model keeps one dict entry per offset and applies the rules record by record,
written from the specification (docs/design/engine.md), not from the engine's code. A
hypothesis state machine drives both with random acquisitions from a random upstream
log (gaps, control batches, committed and aborted transactions), acknowledgements
(valid and invalid), clock ticks, member releases, limit changes, SPSO resets and
crash/restarts, and after every step requires identical observable state, identical
durable writes, and that replaying the writes gives the engine's snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from kshare.share.partition import AcquiredRange, FetchedBatch, SharePartition
from kshare.share.states import ShareSnapshot, ShareUpdate, StateBatch, replay
from tests.harness.properties import stateful_settings

AVAILABLE, ACQUIRED, ACKED, ARCHIVED = 0, 1, 2, 4
TERMINAL = (ACKED, ARCHIVED)
MEMBERS = ("a", "b", "c")
# Operations of the state machine, repeated to weight how often each is drawn.
OPS = (
    ["acquire"] * 10
    + ["acknowledge_owned"] * 10
    + ["acknowledge_random"] * 2
    + ["tick"] * 5
    + ["release_member", "change_limit", "toggle_renew", "reset", "skip_to_log_start", "restart", "restart"]
)


# ---------------------------------------------------------------- the reference model


@dataclass
class Rec:
    state: int
    count: int
    member: str | None = None
    deadline: int | None = None
    available_at: int | None = None  # Available, in its redelivery backoff until then


def durable(rec: Rec) -> tuple[int, int] | None:
    """What the durable state holds for a record (Acquired: its state before acquisition)."""
    if rec.state == ACQUIRED:
        return (AVAILABLE, rec.count - 1) if rec.count > 1 else None
    return (rec.state, rec.count) if rec.count > 0 else None


def batches_of(points: dict[int, tuple[int, int]]) -> tuple[StateBatch, ...]:
    out: list[StateBatch] = []
    for o in sorted(points):
        s, c = points[o]
        if (
            out
            and out[-1].last_offset + 1 == o
            and (out[-1].delivery_state, out[-1].delivery_count) == (s, c)
        ):
            out[-1] = out[-1]._replace(last_offset=o)
        else:
            out.append(StateBatch(o, o, s, c))
    return tuple(out)


def runs(points: list[tuple[int, int]]) -> list[AcquiredRange]:
    out: list[AcquiredRange] = []
    for o, c in points:
        if out and out[-1].last_offset + 1 == o and out[-1].delivery_count == c:
            out[-1] = out[-1]._replace(last_offset=o)
        else:
            out.append(AcquiredRange(o, o, c))
    return out


@dataclass
class Model:
    spso: int
    limit: int
    max_locks: int
    lock_ms: int
    renew: bool = False
    now: int = 0
    backoff: int = 0  # kshare.share.redelivery.backoff.ms
    backoff_max: int = 0
    speo: int = -1
    recs: dict[int, Rec] = field(default_factory=dict)
    archived: list[tuple[int, int]] = field(default_factory=list)  # (offset, count) this operation

    def __post_init__(self) -> None:
        self.speo = self.spso

    # -- helpers

    def _archive(self, o: int) -> None:
        """A delivered record ends its life here (not a skip of something gone upstream)."""
        self.recs[o].state = ARCHIVED
        self.recs[o].available_at = None
        self.archived.append((o, self.recs[o].count))

    def delay(self, count: int) -> int:
        """The backoff after a release or a lock timeout: doubled per delivery, capped."""
        if not self.backoff:
            return 0
        return min(max(self.backoff, self.backoff_max), self.backoff * 2 ** max(0, count - 1))

    def _release(self, o: int, backoff: bool = False) -> None:
        r = self.recs[o]
        if r.count >= self.limit:
            self._archive(o)
        else:
            r.state = AVAILABLE
            d = self.delay(r.count) if backoff else 0
            r.available_at = self.now + d if d else None
        r.member = r.deadline = None

    def _expire(self) -> None:
        for r in self.recs.values():
            if r.available_at is not None and r.available_at <= self.now:
                r.available_at = None
        for o, r in self.recs.items():
            if r.state == ACQUIRED and r.deadline <= self.now:  # type: ignore[operator]
                self._release(o, backoff=True)

    def _waiting(self, r: Rec) -> bool:
        return r.available_at is not None and r.available_at > self.now

    def _begin(self) -> tuple[int, dict[int, tuple[int, int] | None]]:
        self.archived = []
        return self.spso, {o: durable(r) for o, r in self.recs.items()}

    def _finish(self, old: int, before: dict[int, tuple[int, int] | None]) -> ShareUpdate | None:
        changed: dict[int, tuple[int, int]] = {}
        for o, r in self.recs.items():
            now = durable(r)
            if now != before.get(o):
                assert now is not None
                changed[o] = now
        while self.spso < self.speo and self.recs[self.spso].state in TERMINAL:
            del self.recs[self.spso]
            self.spso += 1
        if not changed and self.spso == old:
            return None
        if self.spso == old:
            return ShareUpdate(-1, batches_of(changed))
        covered = all(o in changed for o in range(old, self.spso))
        remains = any(durable(r) is not None for r in self.recs.values())
        if covered and remains:
            return ShareUpdate(-1, batches_of(changed))
        return ShareUpdate(self.spso, batches_of({o: v for o, v in changed.items() if o >= self.spso}))

    def _put_new(self, o: int, rec: Rec) -> None:
        while self.speo < o:  # a hole before new data: never delivered, fetch it again
            self.recs[self.speo] = Rec(AVAILABLE, 0)
            self.speo += 1
        assert o == self.speo
        self.recs[o] = rec
        self.speo += 1

    def _skip(self, lo: int, hi: int) -> None:
        for o in range(lo, hi + 1):
            if o < self.speo:
                if self.recs[o].state == AVAILABLE:
                    self.recs[o].state = ARCHIVED
                    self.recs[o].available_at = None
            else:
                self._put_new(o, Rec(ARCHIVED, 0))

    # -- operations

    def acquire(self, member, batches, max_records, record_limit, fetch_offset, lso, aborted, lock_ms):
        old, before = self._begin()
        self._expire()
        got: list[tuple[int, int]] = []
        if max_records > 0 and batches:
            deadline = self.now + (self.lock_ms if lock_ms is None else lock_ms)
            budget = max_records
            pending = sorted(aborted or [], key=lambda t: t[1])
            pids: set[int] = set()
            expected = fetch_offset
            for b in batches:
                if lso is not None and b.base_offset >= lso:
                    break
                while pending and pending[0][1] <= b.last_offset:
                    pids.add(pending.pop(0)[0])
                skip = b.is_control or (b.is_transactional and b.producer_id in pids)
                if b.is_control:
                    pids.discard(b.producer_id)
                if expected is not None and b.base_offset > expected:
                    self._skip(max(expected, self.spso), b.base_offset - 1)
                lo = b.base_offset if expected is None else max(b.base_offset, expected)
                lo = max(lo, self.spso)
                hi = b.last_offset if lso is None else min(b.last_offset, lso - 1)
                expected = b.last_offset + 1 if expected is None else max(expected, b.last_offset + 1)
                if skip and lo <= hi:  # aborted or control records in range: archived, never acquired
                    self._skip(lo, hi)
                if skip or lo > hi:
                    continue
                if budget <= 0:
                    break
                cut = False
                for o in range(lo, min(hi, self.speo - 1) + 1):
                    r = self.recs[o]
                    if r.state != AVAILABLE or self._waiting(r):
                        continue
                    if r.count >= self.limit:
                        self._archive(o)
                        continue
                    if record_limit and budget <= 0:
                        cut = True
                        break
                    r.state, r.count, r.member, r.deadline = ACQUIRED, r.count + 1, member, deadline
                    got.append((o, r.count))
                    budget -= 1
                if cut:
                    break
                if hi >= self.speo:
                    start = max(lo, self.speo)
                    room = self.max_locks - (self.speo - self.spso)
                    if room <= 0 or (record_limit and budget <= 0):
                        break
                    end = min(hi, start + min(budget, room) - 1) if record_limit else hi
                    for o in range(start, end + 1):
                        self._put_new(o, Rec(ACQUIRED, 1, member, deadline))
                        got.append((o, 1))
                        budget -= 1
                    if end < hi:
                        break
                if lso is not None and b.last_offset >= lso:
                    break
        update = self._finish(old, before)
        return runs(got), len(got), update

    def acknowledge(self, member, batches):
        old, before = self._begin()
        self._expire()
        error, plan = self._validate(member, batches)
        if error == 0:
            for o, t in plan:
                r = self.recs[o]
                if t == 1:
                    r.state = ACKED
                elif t == 2:
                    self._release(o, backoff=True)
                elif t in (0, 3):
                    self._archive(o)
                elif t == 4:
                    r.deadline = self.now + self.lock_ms
                if r.state != ACQUIRED:
                    r.member = r.deadline = None
        return error, self._finish(old, before)

    def _validate(self, member, batches):
        plan = []
        spans = []
        for first, last, types in batches:
            if first < 0 or first > last:
                return 42, []
            types = [types] if isinstance(types, int) else list(types)
            if len(types) not in (1, last - first + 1):
                return 42, []
            if any(t not in (0, 1, 2, 3, 4) for t in types):
                return 42, []
            if not self.renew and 4 in types:
                return 121, []
            for o in range(first, last + 1):
                plan.append((o, types[0] if len(types) == 1 else types[o - first]))
            spans.append((first, last))
        spans.sort()
        if any(spans[k][0] <= spans[k - 1][1] for k in range(1, len(spans))):
            return 42, []
        for first, last in spans:
            if self.spso < self.speo and first >= self.spso and last >= self.speo:
                return 42, []  # past the last offset in flight
            for o in range(first, last + 1):
                r = self.recs.get(o) if self.spso <= o < self.speo else None
                if r is None or r.state != ACQUIRED or r.member != member:
                    return 121, []
        return 0, plan

    def release_member(self, member):
        old, before = self._begin()
        self._expire()
        for o, r in self.recs.items():
            if r.state == ACQUIRED and r.member == member:
                self._release(o)
        return self._finish(old, before)

    def expire_locks(self):
        old, before = self._begin()
        self._expire()
        return self._finish(old, before)

    def skip_to_log_start(self, offset):
        old, before = self._begin()
        self._expire()
        if offset > self.spso:
            self._skip(self.spso, offset - 1)
        return self._finish(old, before)

    def reset(self, offset):
        old, before = self._begin()
        self._expire()
        if any(r.state == ACQUIRED for r in self.recs.values()):
            return 68, None, self._finish(old, before)
        self.recs.clear()
        self.spso = self.speo = offset
        return 0, ShareSnapshot(offset, ()), None

    # -- queries

    def snapshot(self) -> ShareSnapshot:
        points = {o: v for o, r in self.recs.items() if (v := durable(r)) is not None}
        return ShareSnapshot(self.spso, batches_of(points))

    def next_fetch_offset(self) -> int:
        for o in range(self.spso, self.speo):
            if self.recs[o].state == AVAILABLE and not self._waiting(self.recs[o]):
                return o
        return self.speo

    def next_deadline(self) -> int | None:
        deadlines = [r.deadline for r in self.recs.values() if r.state == ACQUIRED]
        deadlines += [r.available_at for r in self.recs.values() if r.available_at is not None]
        return min(deadlines) if deadlines else None  # type: ignore[type-var]

    def restarted(self) -> Model:
        """What a restart from the durable state looks like: locks gone, counts as last written."""
        m = Model(self.spso, self.limit, self.max_locks, self.lock_ms, self.renew, self.now, backoff=self.backoff,
                  backoff_max=self.backoff_max)
        durable_offsets = [o for o, r in self.recs.items() if durable(r) is not None]
        end = max(durable_offsets) + 1 if durable_offsets else self.spso
        for o in range(self.spso, end):
            v = durable(self.recs[o])
            m.recs[o] = Rec(AVAILABLE, 0) if v is None else Rec(v[0], v[1])
            if m.recs[o].state == AVAILABLE and m.recs[o].count and m.delay(m.recs[o].count):
                # a backoff is not stored: it starts again at the restart
                m.recs[o].available_at = self.now + m.delay(m.recs[o].count)
        m.speo = end
        return m


# ---------------------------------------------------------------- the upstream log


@dataclass
class Log:
    batches: list[FetchedBatch]
    aborted: list[tuple[int, int]]
    lso: int
    end: int

    def fetch(self, offset: int, count: int) -> list[FetchedBatch]:
        out = [b for b in self.batches if b.last_offset >= offset]
        return out[:count]


@st.composite
def logs(draw: st.DrawFn, start: int) -> Log:
    offset = start
    batches: list[FetchedBatch] = []
    aborted: list[tuple[int, int]] = []
    open_txn: dict[int, int] = {}
    for _ in range(draw(st.integers(1, 30))):
        offset += draw(st.sampled_from([0, 0, 0, 0, 1, 2]))  # compaction gaps
        kind = draw(st.sampled_from(["data", "txn", "txn", "end", "end"]))
        pid = draw(st.integers(1, 2))
        size = draw(st.integers(1, 8))
        if kind == "data":
            batches.append(FetchedBatch(offset, offset + size - 1))
        elif kind == "txn":
            open_txn.setdefault(pid, offset)
            batches.append(FetchedBatch(offset, offset + size - 1, False, True, pid))
        elif pid in open_txn:
            size = 1
            if draw(st.booleans()):
                aborted.append((pid, open_txn[pid]))
            del open_txn[pid]
            batches.append(FetchedBatch(offset, offset, True, True, pid))
        else:
            continue
        offset += size
    lso = min(open_txn.values()) if open_txn else offset
    return Log(batches, aborted, lso, offset)


# ---------------------------------------------------------------- the state machine


class Clock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def archived_offsets(sp: SharePartition) -> list[tuple[int, int]]:
    return sorted((o, count) for first, last, count in sp.archived for o in range(first, last + 1))


def expand(sp: SharePartition) -> dict[int, Rec]:
    out: dict[int, Rec] = {}
    for r in sp.in_flight():
        for o in range(r.first_offset, r.last_offset + 1):
            out[o] = Rec(int(r.state), r.delivery_count, r.member_id, r.deadline_ms, r.available_at_ms)
    return out


class EngineVersusModel(RuleBasedStateMachine):
    @initialize(
        data=st.data(),
        start=st.integers(0, 5),
        limit=st.integers(2, 5),
        max_locks=st.sampled_from([8, 20, 2000]),
        read_committed=st.booleans(),
        backoff=st.sampled_from([0, 0, 100, 400]),
        backoff_max=st.sampled_from([0, 1_000, 100_000]),
    )
    def setup(
        self, data: st.DataObject, start: int, limit: int, max_locks: int, read_committed: bool, backoff: int,
        backoff_max: int,
    ) -> None:
        self.log = data.draw(logs(start))
        self.read_committed = read_committed
        self.clock = Clock()
        config = dict(delivery_count_limit=limit, max_record_locks=max_locks, record_lock_duration_ms=1_000,
                      redelivery_backoff_ms=backoff, redelivery_backoff_max_ms=backoff_max)
        self.config = config
        self.sp = SharePartition(start, clock=self.clock, **config)
        self.model = Model(start, limit, max_locks, 1_000, backoff=backoff, backoff_max=backoff_max)
        self.base = self.sp.snapshot()
        self.writes: list[ShareUpdate] = []

    def _record(self, update: ShareUpdate | None) -> None:
        if update is not None:
            self.writes.append(update)

    @rule(op=st.sampled_from(OPS), data=st.data())
    def step(self, op: str, data: st.DataObject) -> None:
        getattr(self, "do_" + op)(data)

    def do_acquire(self, data: st.DataObject) -> None:
        member = data.draw(st.sampled_from(MEMBERS))
        max_records = data.draw(st.integers(0, 12))
        record_limit = data.draw(st.booleans())
        nbatches = data.draw(st.integers(1, 8))
        where = data.draw(st.sampled_from(["next", "next", "next", "end", "start", "unknown"]))
        lock_ms = data.draw(st.sampled_from([None, None, 300]))
        nxt = self.sp.next_fetch_offset()
        offset = {"next": nxt, "end": self.sp.end_offset, "start": self.sp.start_offset, "unknown": nxt}[
            where
        ]
        batches = self.log.fetch(offset, nbatches)
        fetch_offset = None if where == "unknown" else offset
        lso = self.log.lso if self.read_committed else None
        aborted = self.log.aborted if self.read_committed else None
        got = self.sp.acquire(
            member,
            batches,
            max_records,
            1 if record_limit else 0,
            fetch_offset=fetch_offset,
            lso=lso,
            aborted_transactions=aborted,
            lock_duration_ms=lock_ms,
        )
        want = self.model.acquire(
            member, batches, max_records, record_limit, fetch_offset, lso, aborted, lock_ms
        )
        assert (got.records, got.count, got.update) == want
        assert archived_offsets(self.sp) == sorted(self.model.archived)
        self._record(got.update)

    def do_acknowledge_owned(self, data: st.DataObject) -> None:
        """Acknowledge some of what a member holds, with random types (mostly valid)."""
        holders = sorted({r.member for r in self.model.recs.values() if r.state == ACQUIRED})
        if not holders:
            return
        member = data.draw(st.sampled_from(holders))
        owned = [o for o, r in sorted(self.model.recs.items()) if r.state == ACQUIRED and r.member == member]
        chosen = sorted(set(data.draw(st.lists(st.sampled_from(owned), min_size=1, max_size=8))))
        if data.draw(st.booleans()):
            chosen = owned  # everything the member holds, as an implicit acknowledgement does
        batches = []
        k = 0
        type_choice = st.sampled_from([1, 1, 1, 1, 2, 2, 3, 0, 4])
        while k < len(chosen):
            j = k
            while j + 1 < len(chosen) and chosen[j + 1] == chosen[j] + 1:
                j += 1
            first, last = chosen[k], chosen[j]
            if data.draw(st.booleans()):
                types: int | list[int] = data.draw(type_choice)
            else:
                types = data.draw(st.lists(type_choice, min_size=last - first + 1, max_size=last - first + 1))
            batches.append((first, last, types))
            k = j + 1
        self._ack(member, batches)

    def do_acknowledge_random(self, data: st.DataObject) -> None:
        """Arbitrary acknowledgements near the window: mostly refused, never half-applied."""
        member = data.draw(st.sampled_from(MEMBERS))
        spans = data.draw(
            st.lists(
                st.tuples(
                    st.integers(-3, 12), st.integers(0, 4), st.sampled_from([0, 1, 2, 3, 4, 7, [1], [2, 1]])
                ),
                min_size=1,
                max_size=3,
            )
        )
        batches = [(self.model.spso + a, self.model.spso + a + n, t) for a, n, t in spans]
        self._ack(member, batches)

    def _ack(self, member, batches) -> None:
        got = self.sp.acknowledge(member, batches)
        want = self.model.acknowledge(member, batches)
        assert (got.error_code, got.update) == want
        assert archived_offsets(self.sp) == sorted(self.model.archived)
        self._record(got.update)

    def do_tick(self, data: st.DataObject) -> None:
        self.clock.now += data.draw(st.sampled_from([0, 1, 150, 299, 300, 700, 999, 1_000, 1_500, 5_000]))
        self.model.now = self.clock.now
        if data.draw(st.booleans()):
            got = self.sp.expire_locks()
            assert got == self.model.expire_locks()
            assert archived_offsets(self.sp) == sorted(self.model.archived)
            self._record(got)

    def do_release_member(self, data: st.DataObject) -> None:
        member = data.draw(st.sampled_from(MEMBERS))
        got = self.sp.release_member(member)
        assert got == self.model.release_member(member)
        assert archived_offsets(self.sp) == sorted(self.model.archived)
        self._record(got)

    def do_change_limit(self, data: st.DataObject) -> None:
        self.sp.delivery_count_limit = self.model.limit = data.draw(st.integers(1, 6))

    def do_toggle_renew(self, data: st.DataObject) -> None:
        self.sp.renew_enabled = self.model.renew = not self.model.renew

    def do_reset(self, data: st.DataObject) -> None:
        offset = max(0, self.model.spso + data.draw(st.integers(-3, 6)))
        got = self.sp.reset_start_offset(offset)
        want = self.model.reset(offset)
        assert tuple(got) == want
        if got.snapshot is not None:
            self.base, self.writes = got.snapshot, []
        self._record(got.update)

    def do_skip_to_log_start(self, data: st.DataObject) -> None:
        offset = max(0, self.model.spso + data.draw(st.integers(-2, 12)))
        got = self.sp.skip_to_log_start(offset)
        assert got == self.model.skip_to_log_start(offset)
        self._record(got)

    def do_restart(self, data: st.DataObject) -> None:
        durable_state = replay(self.base, self.writes)
        self.sp = SharePartition.from_snapshot(self.base, self.writes, clock=self.clock, **self.config)
        self.sp.delivery_count_limit = self.model.limit
        self.sp.renew_enabled = self.model.renew
        self.model = self.model.restarted()
        self.base, self.writes = durable_state, []

    @invariant()
    def same_state(self) -> None:
        if not hasattr(self, "sp"):
            return
        sp, model = self.sp, self.model
        assert (sp.start_offset, sp.end_offset) == (model.spso, model.speo)
        assert expand(sp) == model.recs
        assert sp.next_fetch_offset() == model.next_fetch_offset()
        assert sp.next_deadline() == model.next_deadline()
        assert sp.snapshot() == model.snapshot()
        held: dict[str, int] = {}
        for o in range(model.spso, model.speo):
            r = model.recs[o]
            if r.state == ACQUIRED and r.member is not None:
                held[r.member] = held.get(r.member, 0) + 1
        for member in {*MEMBERS, "nobody"}:
            assert sp.acquired_count(member) == held.get(member, 0), member
        assert sp.acquired_count() == sum(held.values())

    @invariant()
    def writes_replay_to_the_snapshot(self) -> None:
        if hasattr(self, "sp"):
            assert replay(self.base, self.writes) == self.sp.snapshot()

    @invariant()
    def ranges_are_canonical(self) -> None:
        if not hasattr(self, "sp"):
            return
        ranges = self.sp.in_flight()
        cursor = self.sp.start_offset
        for k, r in enumerate(ranges):
            assert r.first_offset == cursor and r.last_offset >= r.first_offset
            cursor = r.last_offset + 1
            if k:
                p = ranges[k - 1]
                assert (p.state, p.delivery_count, p.member_id, p.deadline_ms, p.available_at_ms) != (
                    r.state,
                    r.delivery_count,
                    r.member_id,
                    r.deadline_ms,
                    r.available_at_ms,
                )
        assert cursor == self.sp.end_offset
        if ranges:
            assert ranges[0].state not in TERMINAL


EngineVersusModel.TestCase.settings = stateful_settings(examples=60, steps=30)
TestEngineVersusModel = EngineVersusModel.TestCase
