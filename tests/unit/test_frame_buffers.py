"""Property tests: ``FrameBuffers`` fills a buffer again only when nothing can read it any more.

A hypothesis state machine takes frames of random sizes, writes a pattern of its own into each,
keeps random slices of them (as the record cache and client writes do), slices those slices, and
drops them in random order. After every step each live slice must still read its pattern (a
buffer reused while a slice of it lived would overwrite it); after every take the pool keeps no
more unused bytes than its cap. A plain reuse test shows that buffers do come back.
"""

from __future__ import annotations

import gc

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from kshare.buffers import GRANULE, FrameBuffers

SIZES = st.integers(min_value=1, max_value=3 * GRANULE)


class FrameBufferMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.pool = FrameBuffers(max_free_bytes=4 * GRANULE, max_tracked=8)
        self.live: list[tuple[memoryview, int]] = []  # (a slice, the byte its frame was filled with)
        self.n = 0

    @rule(size=SIZES, keep=st.integers(min_value=0, max_value=3), data=st.data())
    def take(self, size: int, keep: int, data: st.DataObject) -> None:
        frame = self.pool.take(size)
        assert len(frame) == size and not frame.readonly
        # unused buffers beyond the cap went back to malloc (one kept fit may stay over it)
        assert self.pool.free_bytes() <= self.pool.max_free_bytes + 4 * GRANULE
        assert len(self.pool._bufs) <= self.pool.max_tracked
        self.n = (self.n + 1) % 251
        frame[:] = bytes([self.n]) * size
        for _ in range(keep):
            a = data.draw(st.integers(min_value=0, max_value=size - 1))
            b = data.draw(st.integers(min_value=a + 1, max_value=size))
            self.live.append((frame[a:b], self.n))
        del frame  # only the kept slices refer to the buffer now

    @rule(data=st.data())
    def reslice(self, data: st.DataObject) -> None:
        if not self.live:
            return
        i = data.draw(st.integers(min_value=0, max_value=len(self.live) - 1))
        view, fill = self.live[i]
        a = data.draw(st.integers(min_value=0, max_value=len(view) - 1))
        self.live[i] = (view[a:], fill)  # the wider slice goes, a narrower one of it stays

    @rule(data=st.data())
    def drop(self, data: st.DataObject) -> None:
        if not self.live:
            return
        i = data.draw(st.integers(min_value=0, max_value=len(self.live) - 1))
        del self.live[i]

    @invariant()
    def live_slices_keep_their_bytes(self) -> None:
        for view, fill in self.live:
            assert view.tobytes() == bytes([fill]) * len(view)


TestFrameBuffers = FrameBufferMachine.TestCase
TestFrameBuffers.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)


def test_a_buffer_nothing_refers_to_is_used_again() -> None:
    pool = FrameBuffers()
    first = pool.take(1_000_000)
    first[:3] = b"abc"
    kept = first[1:2]  # a slice keeps the buffer
    del first
    second = pool.take(1_000_000)
    assert pool.reused == 0 and pool.allocated == 2
    assert kept.tobytes() == b"b"
    del kept, second
    gc.collect()
    pool.take(999_000)
    pool.take(1_040_000)
    assert pool.reused == 2 and pool.allocated == 2


def test_a_much_larger_buffer_is_left_for_larger_frames() -> None:
    pool = FrameBuffers()
    del_me = pool.take(4 << 20)
    del del_me
    pool.take(100_000)  # a 4 MB buffer for a 100 kB frame would pin 40x its size
    assert pool.reused == 0
    pool.take(4 << 20)
    assert pool.reused == 1
