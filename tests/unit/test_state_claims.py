"""Claim records and the replay rule that keeps a fenced owner's writes out of the state
(kshare.share.state.claims, kshare.share.state.replay), against a reference model of owners, a
partition leader and its producer-epoch fencing (ProducerAppendInfo.checkProducerEpoch), including
the cases the broker's fencing does not cover (a forgotten or rotated producer id)."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from kshare.share.state.claims import (
    DAY_MS,
    Claim,
    ClaimGuard,
    decode_claim,
    encode_claim,
    is_claim,
    renew_interval_ms,
)
from kshare.share.state.codec import RECORD_SNAPSHOT, encode_share_key, encode_snapshot_value
from kshare.share.state.memory import InMemoryState, WriteStats
from kshare.share.state.replay import LoadStats, RecordReplay
from kshare.share.states import ShareSnapshot
from kshare.share.store import SharePartitionKey

KEY = SharePartitionKey("g", b"\x01" * 16, 0)


@given(st.integers(0, 2**31 - 1), st.integers(0, 2**63 - 1), st.integers(0, 2**15 - 1), st.integers(0, 2**31 - 1),
       st.integers(0, 2**63 - 1))
def test_claim_record_round_trip(partition, pid, epoch, ownership_epoch, at_ms):
    c = Claim(partition, pid, epoch, ownership_epoch, at_ms)
    key, value = encode_claim(c)
    assert is_claim(key)
    assert decode_claim(key, value) == c
    assert not is_claim(encode_share_key(RECORD_SNAPSHOT, KEY))


def test_renew_interval():
    assert renew_interval_ms(None, None) == DAY_MS // 4  # Kafka's defaults: 7 days, 1 day
    assert renew_interval_ms(7 * DAY_MS, 3 * DAY_MS) == DAY_MS * 3 // 4
    assert renew_interval_ms(30 * DAY_MS, 30 * DAY_MS) == DAY_MS  # at least daily
    assert renew_interval_ms(60_000, DAY_MS) == 15_000
    assert renew_interval_ms(100, 100) == 1_000  # bounded below


@dataclass
class Owner:
    ownership_epoch: int  # of its claim
    write_epoch: int  # the map epoch its records carry (>= its claim's, < the next claim's)
    producer_id: int
    producer_epoch: int


@st.composite
def histories(draw):
    """Events on one partition: claims by new owners, map epochs advancing for the current owner,
    writes by any owner so far (past owners are zombies), the broker forgetting the producer id
    (producer.id.expiration.ms) or the coordinator rotating it (expired transactional id, exhausted
    epoch), a full restart of the instance group (every proxy stopped: no zombie survives it, and
    the ownership epochs start again at 1), and one proxy without an instance group taking over
    after every proxy of the group stopped (its records carry leader epoch 0, and no claim)."""
    return draw(st.lists(st.one_of(
        st.just(("claim",)), st.just(("advance",)), st.just(("forget",)), st.just(("rotate",)),
        st.just(("restart",)), st.just(("single",)),
        st.tuples(st.just("write"), st.integers(0, 50))), max_size=60))


@settings(max_examples=600)
@given(histories())
def test_replay_keeps_what_the_owner_of_the_time_wrote(events):
    """Reference: a write is state iff its writer was the partition's latest claimer (or the single
    proxy that followed the group) when the leader appended it. Whatever the leader accepted (with
    fencing, and without it where it forgot the producer id or the coordinator gave a new one), the
    replay of the log gives that state."""
    log: list[tuple[bytes, bytes]] = []
    owners: list[Owner] = []
    pid, pepoch, epoch = 1000, 0, 0
    leader_epochs: dict[int, int] = {}  # the leader's producer state: producer id -> last epoch seen
    truth: ShareSnapshot | None = None
    n = 0
    for ev in events:
        if ev[0] == "claim":
            if owners and not owners[-1].ownership_epoch:
                owners = []  # the single proxy stopped before the group started (deploy.md)
            epoch = (owners[-1].write_epoch if owners else epoch) + 1
            pepoch += 1
            owners.append(Owner(epoch, epoch, pid, pepoch))
            log.append(encode_claim(Claim(0, pid, pepoch, epoch, 0)))
            leader_epochs[pid] = max(leader_epochs.get(pid, -1), pepoch)
        elif ev[0] == "advance" and owners and owners[-1].ownership_epoch:
            owners[-1].write_epoch += 1
        elif ev[0] == "forget":
            leader_epochs.clear()
        elif ev[0] == "rotate":
            pid, pepoch = pid + 1, -1
        elif ev[0] == "restart":
            owners, epoch = [], 0  # every proxy stopped; the next map is epoch 1 again
        elif ev[0] == "single":
            # one proxy without an instance group (its own idempotent producer id, leader epoch 0)
            owners, epoch = [Owner(0, 0, 10**9 + len(log), 0)], 0
        elif ev[0] == "write" and owners:
            w = owners[ev[1] % len(owners)]
            if w.producer_epoch < leader_epochs.get(w.producer_id, -1):
                continue  # INVALID_PRODUCER_EPOCH: not appended
            leader_epochs[w.producer_id] = w.producer_epoch
            n += 1
            snap = ShareSnapshot(n, ())
            log.append((encode_share_key(RECORD_SNAPSHOT, KEY), encode_snapshot_value(0, 0, w.write_epoch, snap)))
            if w is owners[-1]:
                truth = snap
    memory = InMemoryState(1, WriteStats())
    replay = RecordReplay(memory, LoadStats(), "t")
    for offset, (key, value) in enumerate(log):
        replay.apply(0, offset, key, value)
    got = memory.entries.get(KEY)
    assert (got.state if got is not None else None) == truth
    assert replay.stats.skipped == 0


def test_guard_counts_new_producer_ids_and_follows_the_latest_claim():
    g = ClaimGuard()
    assert g.claim(Claim(0, 7, 1, 5, 0))
    assert not g.claim(Claim(0, 8, 0, 6, 0))  # a new producer id: said once
    assert g.new_producer_ids == 1
    assert not g.admits(0, 5) and g.admits(0, 6) and g.admits(1, 3)
    # the group restarted whole: its epochs start again, and the latest claim in the log counts
    assert g.claim(Claim(0, 8, 1, 1, 0))
    assert g.claims[0].ownership_epoch == 1
    assert g.admits(0, 1) and g.admits(0, 2)
    assert g.admits(0, 0)  # a single proxy without an instance group
