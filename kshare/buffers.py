"""Receive buffers for large response frames, used again once nothing refers to them.

Why: a 1 MB Fetch response read into a new ``bytearray`` pays for the zero-fill, and, whenever
malloc takes the memory fresh from the kernel, a page fault per 4 KiB page. Measured in the proxy
(one share consumer, 500,000 x 1 KiB records, a 256 MB record cache): runs whose Fetch responses
landed in fresh pages took 65,000-136,000 page faults and 0.58-0.89 s of proxy CPU, against ~0
faults and 0.40 s once malloc reused its memory; about 2 us a fault here, so 0.5 ms of event-loop
time per MB in the middle of a share fetch. When malloc reuses memory and when it gives it back
(to the kernel, to be faulted in again) depends on what else was allocated in between, so the
proxy keeps its large buffers itself.

A buffer is handed out as a ``memoryview`` of it; the record cache and the writes to clients keep
slices of that view, and every slice refers to the buffer (through the view's managed buffer).
So a buffer whose only reference is this pool's list is free: nothing can read it any more, and
it can be filled again. That test is the reference count, cheap enough for one scan per frame of
a megabyte (the list is short: about the record cache's budget in frames).
"""

from __future__ import annotations

import sys

# New buffers are rounded up to this, so frames of about the same size (Fetch responses up to
# fetch_bytes, a batch more or less) fit each other's buffers.
GRANULE = 64 << 10
_getrefcount = sys.getrefcount


def _refs_when_free() -> int:
    """The reference count ``take`` sees for a buffer nothing else refers to (list slot, loop
    variable, enumerate's tuple, call argument), measured in the same loop rather than assumed."""
    bufs = [bytearray(1)]
    for _i, buf in enumerate(bufs):
        return _getrefcount(buf)
    raise AssertionError


_FREE_REFS = _refs_when_free()


class FrameBuffers:
    """``take(size)``: a writable ``memoryview`` of ``size`` bytes, backed by a buffer used again
    once the last view of it is gone. Keeps at most ``max_free_bytes`` of unused buffers (the rest
    go back to malloc) and tracks at most ``max_tracked`` buffers (beyond that, frames get plain
    new buffers)."""

    def __init__(self, max_free_bytes: int = 16 << 20, max_tracked: int = 1024) -> None:
        self.max_free_bytes = max_free_bytes
        self.max_tracked = max_tracked
        self._bufs: list[bytearray] = []
        self.reused = 0  # takes served from a free buffer (for tests and benchmarks)
        self.allocated = 0

    def take(self, size: int) -> memoryview:
        fit = -1
        fit_len = 0
        limit = size + (size >> 3) + GRANULE  # a buffer much larger than the frame is left for larger ones
        free_bytes = 0
        drop: list[int] = []
        for i, buf in enumerate(self._bufs):  # the loop of _refs_when_free
            if _getrefcount(buf) != _FREE_REFS:
                continue
            n = len(buf)
            if size <= n <= limit and (fit < 0 or n < fit_len):
                if fit >= 0:
                    free_bytes += fit_len
                fit, fit_len = i, n
                continue
            free_bytes += n
            if free_bytes > self.max_free_bytes:
                drop.append(i)
        if fit >= 0:
            buf = self._bufs[fit]
            self.reused += 1
        else:
            buf = bytearray(-(-size // GRANULE) * GRANULE)
            self.allocated += 1
            if len(self._bufs) - len(drop) < self.max_tracked:
                self._bufs.append(buf)
        if drop:
            for i in reversed(drop):
                del self._bufs[i]
        return memoryview(buf)[:size]

    @property
    def tracked_bytes(self) -> int:
        return sum(len(b) for b in self._bufs)

    def free_bytes(self) -> int:
        total = 0
        for _i, buf in enumerate(self._bufs):  # the loop of _refs_when_free
            if _getrefcount(buf) == _FREE_REFS:
                total += len(buf)
        return total
