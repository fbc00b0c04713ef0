"""The state-copy exchange between proxies of an instance group, coalesced (kshare.share.copy_exchange).

The batching core (:class:`Coalescer`) against a model: any interleaving of concurrent calls for
several peers, groups and epochs gets exactly its own answer, from a batch sent after the call
that holds its item; batches never mix keys and never exceed their bound; a failed send fails
exactly the callers of its batch. Then the exchange over the wire codec: each caller gets its
own partition's error code and copy (with its state epoch) from peers answering many
share-partitions per request with the real answering side (``InstanceGroupMember.answer_copies``
and ``drop_copies``, over stub stores), in ceil(n / bound) requests per peer.
"""

from __future__ import annotations

import asyncio
import math
import random
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kshare.protocol import messages
from kshare.protocol.codes import ApiKey
from kshare.share import instance_service
from kshare.share.copy_exchange import Coalescer as CoalescerCls
from kshare.share.copy_exchange import CopyExchange, MissingAnswer
from kshare.share.errors import ErrorCode
from kshare.share.instance_service import InstanceGroupMember
from kshare.share.ownership import Candidate, GroupOwnership, Instance, assign
from kshare.share.states import ShareSnapshot, StateBatch
from kshare.share.store import SharePartitionKey

# -- the coalescing core against a model ----------------------------------------------------------


class SendFailed(Exception):
    pass


ask_st = st.tuples(
    st.integers(0, 2),  # peer
    st.integers(0, 1),  # group
    st.integers(1, 2),  # epoch
    st.integers(0, 5),  # partition
    st.integers(0, 3),  # loop turns before the call
    st.booleans(),  # the caller is cancelled one turn after its call
)
# per send, in the order they start: fail, leave one item out of the answer, turns before answering
send_st = st.tuples(st.booleans(), st.booleans(), st.integers(0, 3))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    asks=st.lists(ask_st, min_size=1, max_size=40),
    sends=st.lists(send_st, max_size=40),
    max_items=st.integers(1, 5),
    linger=st.sampled_from([0.0, 0.001]),
)
def test_every_caller_gets_its_own_answer_from_one_batch_of_its_key(asks, sends, max_items, linger) -> None:
    clock = iter(range(10**9))  # orders calls and sends
    batches: list[dict[str, Any]] = []

    flushed: list[int] = []  # when each batch went out (sends start in that order)

    class Coalescer(CoalescerCls):
        def _flush(self, batch: Any) -> None:
            if self._open.get(batch.key) is batch:
                flushed.append(next(clock))
            super()._flush(batch)

    async def send(target: Any, key: Any, items: dict) -> dict:
        number = len(batches)
        fail, omit, turns = sends[number] if number < len(sends) else (False, False, 0)
        batch = {"key": key, "target": target, "items": dict(items), "at": flushed[number], "failed": fail}
        batches.append(batch)
        # never mixed: every item is of the batch's peer, group and epoch; bounded; a dict (once each)
        assert all(item[:3] == key for item in items) and target == key[0]
        assert 1 <= len(items) <= max_items
        for _ in range(turns):
            await asyncio.sleep(0)
        if fail:
            raise SendFailed(number)
        answers = {item: (item, number) for item in items}
        if omit:
            dropped = min(items)
            batch["omitted"] = dropped
            del answers[dropped]
        return answers

    async def run() -> list[tuple]:
        co = Coalescer(send, max_items=max_items, linger_s=linger)

        async def caller(peer, group, epoch, partition, turns, cancel) -> tuple:
            for _ in range(turns):
                await asyncio.sleep(0)
            item = (peer, group, epoch, partition)
            at = next(clock)
            fut = co.call(item[:3], peer, item, None)
            if cancel:
                await asyncio.sleep(0)
                fut.cancel()
            try:
                return item, at, "ok", await fut
            except asyncio.CancelledError:
                return item, at, "cancelled", None
            except SendFailed as exc:
                return item, at, "failed", exc.args[0]
            except MissingAnswer:
                return item, at, "missing", None

        out = await asyncio.wait_for(asyncio.gather(*(caller(*a) for a in asks)), 10)
        while not co.idle():  # what only cancelled callers asked still goes out
            await asyncio.sleep(0.001)
        return out

    outcomes = asyncio.run(run())
    assert len(outcomes) == len(asks)  # every caller answered, none hangs
    for item, at, how, got in outcomes:
        if how == "cancelled":
            continue
        if how == "ok":
            answered, number = got
            assert answered == item  # its own item's answer
            batch = batches[number]
            assert not batch["failed"] and item in batch["items"] and batch.get("omitted") != item
        elif how == "failed":
            batch = batches[got]
            assert batch["failed"] and item in batch["items"]
        else:  # missing: the only item left out of an answer
            candidates = [b for b in batches if b.get("omitted") == item and b["at"] > at]
            assert candidates, (item, batches)
            continue
        assert batch["at"] > at  # sent after the call (a batch cannot answer a later one)
        # and it is the first batch of its key sent after the call: the one the call joined
        first = next(b for b in batches if b["key"] == item[:3] and b["at"] > at)
        assert first is batch
    # (so a failed send fails exactly its callers: each caller's outcome is that of the one batch
    # it joined.) Nothing is sent that nobody asked
    assert sum(len(b["items"]) for b in batches) <= len(asks) and len(flushed) == len(batches)


def test_a_full_batch_goes_at_once_and_the_rest_waits_for_the_linger() -> None:
    sent: list[list] = []

    async def send(target: Any, key: Any, items: dict) -> dict:
        sent.append(sorted(items))
        return {i: i for i in items}

    async def run() -> None:
        co: CoalescerCls = CoalescerCls(send, max_items=3, linger_s=0.05)
        futs = [co.call("k", "peer", i, None) for i in range(7)]
        await asyncio.sleep(0.01)
        assert sent == [[0, 1, 2], [3, 4, 5]] and co.pending() == 1  # 6 wait for nothing
        assert await asyncio.gather(*futs) == list(range(7))
        assert sent[2] == [6]
        # an item asked twice in one batch goes once; both callers get its answer
        a, b = co.call("k", "peer", 9, None), co.call("k", "peer", 9, None)
        assert await asyncio.gather(a, b) == [9, 9] and sent[3] == [9]

    asyncio.run(run())


def test_a_cancelled_caller_does_not_cancel_the_request_of_the_others() -> None:
    async def run() -> None:
        gate = asyncio.Event()
        calls = []

        async def send(target: Any, key: Any, items: dict) -> dict:
            calls.append(sorted(items))
            await gate.wait()
            return {i: -i for i in items}

        co: CoalescerCls = CoalescerCls(send, linger_s=0)
        first = asyncio.ensure_future(co.call("k", "p", 1, None))
        second = co.call("k", "p", 2, None)
        await asyncio.sleep(0.01)
        first.cancel()  # e.g. its caller's wait_for ran out
        gate.set()
        assert await second == -2 and calls == [[1, 2]]

    asyncio.run(run())


# -- the exchange over the wire, with the real answering side --------------------------------------


def _cand(member: str, topics: dict[bytes, int]) -> Candidate:
    return Candidate(
        Instance(member, f"{member}.example", 9192, {1: 9193}),
        [],
        0,
        {},
        {t.hex(): n for t, n in topics.items()},
    )


class _Allow:
    async def group(self, conn: Any, op: Any, group_id: str) -> bool:
        return True

    def cached(self, conn: Any, op: Any, kind: str, name: str) -> bool:
        return True


class _Store:
    """What answer_copies/drop_copies read of a TopicStateStore: copies, where they are, flushes."""

    def __init__(self, copies: dict[SharePartitionKey, tuple[int, ShareSnapshot]], where: dict) -> None:
        self.copies, self.where = copies, where
        self.frozen: set[SharePartitionKey] = set()
        self.flushes = 0
        self.deleted: list[SharePartitionKey] = []

    async def flush(self) -> None:
        self.flushes += 1
        await asyncio.sleep(0.001)  # a produce round

    def share_partition(self, key: SharePartitionKey) -> ShareSnapshot | None:
        return self.copies[key][1] if key in self.copies else None

    def state_epoch(self, key: SharePartitionKey) -> int | None:
        return self.copies[key][0] if key in self.copies else None

    def partition_of(self, key: SharePartitionKey) -> int:
        return self.where.get(key, 0)

    async def delete_share_partitions(self, keys: list[SharePartitionKey]) -> None:
        for k in keys:
            self.deleted.append(k)
            self.copies.pop(k, None)


class _Proxy(InstanceGroupMember):
    """One proxy of the group as answer_copies and drop_copies see it."""

    def __init__(self, me: str, m: Any, store: _Store) -> None:
        self.ownership = GroupOwnership(me, len(m.owners))
        self.ownership.map = m
        self.ownership.claimed = frozenset(m.partitions_of(me))
        self.authz = _Allow()
        self.upstream = SimpleNamespace(by_id={})
        self._ownership_lock = asyncio.Lock()
        self.store = store
        self.partitions: dict[SharePartitionKey, Any] = {}
        self._handover_tasks: dict[SharePartitionKey, asyncio.Task] = {}


def _wire(api_key: int, body: Any, response: bool = False) -> Any:
    """``body`` encoded and decoded again, as the peer (or the asker) reads it."""
    if response:
        frame = messages.encode_response(api_key, 0, 7, body)
        return messages.decode_response(api_key, 0, memoryview(frame)[4:])
    frame = messages.encode_request(api_key, 0, 7, "kshare-peer", body)
    return messages.decode_request(memoryview(frame)[4:])[1]


def test_many_share_partitions_asked_together_each_get_their_own_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Proxy a leads by topic and confirms every share-partition it leads of two groups over two
    topics (40 and 900 partitions) at once: b and c answer with the real answer_copies, over the
    wire codec. Each confirmation gets its own partition's answer: the copy and state epoch held
    in a claimed state partition, none for a copy in a partition not claimed or a share-partition
    the peer leads, COORDINATOR_LOAD_IN_PROGRESS for one still being handed over there (the
    others of its request answered all the same); a share-partition the peer served has its
    writes settled and leaves it. Requests: ceil(n / 200) per peer, group and epoch; one flush
    per request at the peer. Then the drops: one request per peer and group, the highest state
    epoch asked per share-partition, and only older copies go."""
    monkeypatch.setattr(instance_service, "HANDOVER_ANSWER_WAIT_S", 0.3)
    rng = random.Random(7)
    small, big = b"\x01" * 16, b"\x02" * 16
    sizes = {small: 40, big: 900}
    m = assign({k: _cand(k, sizes) for k in "abc"}, 6, by_topic=True)
    m = msgspec.structs.replace(m, epoch=5)
    groups = ["g1", "g2"]
    led_by_a = [
        SharePartitionKey(g, t, p)
        for g in groups
        for t, n in sizes.items()
        for p in range(n)
        if m.owner_of_topic_partition(t, p).id == "a"
    ]
    assert len(led_by_a) > 2 * 200  # more than one request's worth per group
    expected: dict[tuple[str, SharePartitionKey], tuple[int, Any]] = {}
    peers: dict[str, _Proxy] = {}
    stuck, served = {}, {}
    for name in "bc":
        mine = m.partitions_of(name)
        others = [p for p in range(6) if p not in mine]
        copies, where = {}, {}
        proxy = peers[name] = _Proxy(name, m, _Store(copies, where))
        for key in led_by_a:
            kind = rng.choice(["none", "claimed", "claimed", "unclaimed", "serving", "stuck", "handed"])
            if kind == "none":
                expected[name, key] = (0, None)
                continue
            epoch = rng.randrange(0, 9)
            snap = ShareSnapshot(rng.randrange(0, 1000), (StateBatch(1000, 1000 + rng.randrange(5), 0, 1),))
            copies[key] = (epoch, snap)
            where[key] = rng.choice(others if kind == "unclaimed" else mine)
            expected[name, key] = (0, None) if kind == "unclaimed" else (0, (epoch, snap))
            if kind == "serving":  # served here before this map: a write of it is under way
                sp = SimpleNamespace(engine=object(), woken=0, pending_done=None)
                sp.wake = lambda sp=sp: setattr(sp, "woken", sp.woken + 1)
                proxy.partitions[key] = sp
                served[name, key] = sp
            elif kind == "stuck":
                stuck[name, key] = True
                expected[name, key] = (ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, None)
            elif kind == "handed":
                stuck[name, key] = False
    # a share-partition b leads (a should not ask it, but if it did): b answers none
    b_leads = next(
        SharePartitionKey("g1", big, p) for p in range(900) if m.owner_of_topic_partition(big, p).id == "b"
    )
    peers["b"].store.copies[b_leads] = (3, ShareSnapshot(5, ()))

    sent: list[tuple[str, int, Any]] = []
    # A "handed" hand-over ends when its peer is asked again (a request of share-partitions all asked
    # before): so it is under way at every first answer however slow the machine, and over at the re-ask
    asked_at: dict[str, set[tuple[str, bytes, int]]] = {n: set() for n in "bc"}
    reasked: dict[str, asyncio.Event] = {}

    async def request(peer: Instance, api_key: int, body: Any) -> Any:
        req = _wire(api_key, body)
        sent.append((peer.id, api_key, req))
        if api_key == ApiKey.READ_SHARE_GROUP_STATE:
            parts = {(req.group_id, t.topic_id, q.partition) for t in req.topics for q in t.partitions}
            if parts and parts <= asked_at[peer.id]:
                reasked[peer.id].set()
            asked_at[peer.id] |= parts
        proxy = peers[peer.id]
        answer = proxy.answer_copies if api_key == ApiKey.READ_SHARE_GROUP_STATE else proxy.drop_copies
        return _wire(api_key, await answer(None, req), response=True)

    async def run() -> None:
        loop = asyncio.get_running_loop()
        for sp in served.values():
            sp.pending_done = loop.create_future()
            loop.call_later(0.05, sp.pending_done.set_result, None)
        reasked.update({n: asyncio.Event() for n in "bc"})
        for (name, key), forever in stuck.items():  # a hand-over under way at the peer
            task = loop.create_task(asyncio.sleep(30) if forever else reasked[name].wait())
            handovers = peers[name]._handover_tasks
            handovers[key] = task
            if not forever:
                task.add_done_callback(lambda _t, h=handovers, k=key: h.pop(k, None))
        exchange = CopyExchange(request)
        targets = {n: m.instance(n) for n in "bc"}
        asked = [(n, k) for n in "bc" for k in led_by_a] + [("b", b_leads)]
        answers = await asyncio.gather(*(exchange.ask(targets[n], k, 5) for n, k in asked))
        for (n, k), got in zip(asked, answers, strict=True):
            assert got == expected.get((n, k), (0, None)), (n, k)
        # ceil(n / 200) requests per peer and group, and one more asking again what was being
        # handed over (answered "not yet" at once beside the others); all at epoch 5, one group
        # each, none over 200
        reads = [(p, r) for p, a, r in sent if a == ApiKey.READ_SHARE_GROUP_STATE]
        for n in "bc":
            for g in groups:
                n_keys = len({k for (q, k) in asked if q == n and k.group_id == g})
                again = [r for p, r in reads if p == n and r.group_id == g][math.ceil(n_keys / 200) :]
                handing = {k for (q, k) in stuck if q == n and k.group_id == g}
                assert 1 <= len(again) <= math.ceil(n_keys / 200) and handing  # one per answer at most
                assert {
                    SharePartitionKey(g, t.topic_id, q.partition)
                    for r in again
                    for t in r.topics
                    for q in t.partitions
                } == handing
        for _p, r in reads:
            parts = [(t.topic_id, q.partition) for t in r.topics for q in t.partitions]
            assert len(parts) == len(set(parts)) <= 200
            assert {q.leader_epoch for t in r.topics for q in t.partitions} == {5}
        assert exchange.requests["read"] == len(reads) and exchange.partitions["read"] == len(asked) + len(
            stuck
        )
        for n in "bc":
            proxy = peers[n]
            assert proxy.store.flushes <= sum(1 for p, _ in reads if p == n)
            frozen = {k for k in led_by_a if not stuck.get((n, k))}
            assert proxy.store.frozen == frozen  # nothing more of them written there
            for (q, k), sp in served.items():
                if q == n:
                    assert k not in proxy.partitions and sp.engine is None and sp.woken == 1
        for task in [t for p in peers.values() for t in p._handover_tasks.values()]:
            task.cancel()

        # drops: a asks twice for some (the higher state epoch is what counts)
        before = {n: dict(peers[n].store.copies) for n in "bc"}
        wanted = {(n, k): rng.randrange(0, 10) for n in "bc" for k in led_by_a if rng.random() < 0.4}
        twice = {nk: rng.randrange(0, 10) for nk in list(wanted)[::3]}
        sent.clear()
        codes = await asyncio.gather(
            *(exchange.drop(targets[n], k, 5, e) for (n, k), e in [*wanted.items(), *twice.items()])
        )
        assert set(codes) == {0}
        drops = [r for _p, a, r in sent if a == ApiKey.WRITE_SHARE_GROUP_STATE]
        assert len(drops) == sum(
            math.ceil(len({k for (q, k) in wanted if q == n and k.group_id == g}) / 200)
            for n in "bc"
            for g in groups
        )
        for n in "bc":
            top = {k: max(e, twice.get((n, k), -1)) for (q, k), e in wanted.items() if q == n}
            asked_epochs = {
                SharePartitionKey(r.group_id, t.topic_id, q.partition): q.state_epoch
                for p, a, r in sent
                if p == n
                for t in r.topics
                for q in t.partitions
            }
            assert asked_epochs == top
            gone = {k for k, (held, _) in before[n].items() if k in top and held < top[k]}
            assert set(peers[n].store.deleted) == gone

    asyncio.run(run())


def test_what_a_peer_is_handing_over_does_not_hold_back_the_others_of_its_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """b hands x and z over (its members' acknowledgements take 1 s) while a asks it for x, y and
    z together: y's answer comes at once; x and z, answered "not yet" beside it, are asked again
    with only what is being handed over, and that answer waits for the hand-over and carries their
    copies. w, whose hand-over outlasts HANDOVER_ANSWER_WAIT_S, is answered
    COORDINATOR_LOAD_IN_PROGRESS then."""
    monkeypatch.setattr(instance_service, "HANDOVER_ANSWER_WAIT_S", 2.0)
    tid = b"\x04" * 16
    m = msgspec.structs.replace(assign({k: _cand(k, {tid: 30}) for k in "ab"}, 4, by_topic=True), epoch=3)
    mine = [p for p in range(30) if m.owner_of_topic_partition(tid, p).id == "a"]
    x, y, z, w = (SharePartitionKey("g", tid, p) for p in mine[:4])
    snap = ShareSnapshot(7, (StateBatch(7, 9, 0, 1),))
    claimed = m.partitions_of("b")[0]
    b = _Proxy("b", m, _Store({k: (2, snap) for k in (x, y, z, w)}, dict.fromkeys((x, y, z, w), claimed)))
    sent: list[set[int]] = []

    async def request(peer: Instance, api_key: int, body: Any) -> Any:
        req = _wire(api_key, body)
        sent.append({q.partition for t in req.topics for q in t.partitions})
        return _wire(api_key, await b.answer_copies(None, req), response=True)

    async def run() -> None:
        loop = asyncio.get_running_loop()
        quick, slow = loop.create_task(asyncio.sleep(1.0)), loop.create_task(asyncio.sleep(30))
        b._handover_tasks.update({x: quick, z: quick, w: slow})  # one hand-over task per map change
        quick.add_done_callback(lambda _t: [b._handover_tasks.pop(k, None) for k in (x, z)])
        exchange = CopyExchange(request)
        peer = m.instance("b")
        started = loop.time()
        tasks = {k: loop.create_task(exchange.ask(peer, k, 3)) for k in (x, y, z)}
        assert await tasks[y] == (0, (2, snap))
        assert loop.time() - started < 0.8  # not held back by x and z
        assert await tasks[x] == await tasks[z] == (0, (2, snap))
        assert 0.95 < loop.time() - started < 1.9
        assert sent == [{x.partition, y.partition, z.partition}, {x.partition, z.partition}]
        started = loop.time()
        assert await exchange.ask(peer, w, 3) == (ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, None)
        assert 2.0 <= loop.time() - started < 3.5 and sent[2:] == [{w.partition}]
        slow.cancel()

    asyncio.run(run())


def test_a_failed_request_fails_exactly_the_callers_it_carried() -> None:
    """Three groups asked of two peers at once; the request of one (peer, group) fails: its callers
    get the error, every other caller its answer."""
    snap = ShareSnapshot(10, (StateBatch(10, 12, 0, 1),))

    async def request(peer: Instance, api_key: int, body: Any) -> Any:
        req = _wire(api_key, body)
        if (peer.id, req.group_id) == ("b", "g1"):
            raise ConnectionError("closed")
        R = messages.message_class("ReadShareGroupStateResponse")
        return R(
            results=[
                R.ReadStateResult(
                    topic_id=t.topic_id,
                    partitions=[
                        R.PartitionResult(
                            partition=q.partition,
                            state_epoch=q.partition % 3 - 1,
                            start_offset=10,
                            error_code=ErrorCode.FENCED_STATE_EPOCH if q.partition == 7 else 0,
                            state_batches=[
                                R.StateBatch(
                                    first_offset=10, last_offset=12, delivery_state=0, delivery_count=1
                                )
                            ],
                        )
                        for q in t.partitions
                    ],
                )
                for t in req.topics
            ]
        )

    async def run() -> None:
        exchange = CopyExchange(request)
        tid = b"\x03" * 16
        peers = {n: Instance(n, n, 1) for n in "bc"}
        asks = [(n, SharePartitionKey(g, tid, p)) for n in "bc" for g in ("g0", "g1", "g2") for p in range(9)]
        got = await asyncio.gather(*(exchange.ask(peers[n], k, 3) for n, k in asks), return_exceptions=True)
        for (n, k), answer in zip(asks, got, strict=True):
            if (n, k.group_id) == ("b", "g1"):
                assert isinstance(answer, ConnectionError)
            elif k.partition == 7:
                assert answer == (ErrorCode.FENCED_STATE_EPOCH, None)
            elif k.partition % 3 == 0:  # state epoch -1: no copy there
                assert answer == (0, None)
            else:
                assert answer == (0, (k.partition % 3 - 1, snap))
        assert exchange.requests["read"] == 6

    asyncio.run(run())
