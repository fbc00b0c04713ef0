"""The proxy's request frame splitter (``kshare.proxy.frames.RequestFramer``) against a reference
model: a pipeline of frames, cut anywhere, gives the same frames and the same decisions as the
frames one by one; a bad size stops the stream with the reason the proxy logs.

The bytes are fed as views of one buffer that is overwritten after each feed, as the proxy's
shared read buffer is: a framer that kept a view past its call would hand on changed bytes.
"""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from kshare.proxy.frames import COLLECT, FORWARD, WAIT, RequestFramer

LIMIT = 400  # max_frame_bytes in these tests
FORWARDED, COLLECTED, WAITED, REFUSED = 1, 78, 0, 9999  # what the sink does with each API key


class Sink:
    """Records what the framer hands on; decides by API key (WAITED: wait until the frame is whole)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, bytes | str]] = []
        self.heads: list[tuple[int, int, int]] = []  # the frames decided, in order
        self.forwarded_at: list[int] = []  # bytes forwarded when ``forwarded()`` was called
        self.total = 0
        self.pending: list = []

    def begin(self, buf, pos, size, api_key, version, corr):
        if api_key == WAITED and len(buf) < pos + 4 + size:
            return WAIT
        self.heads.append((api_key, version, corr))
        if api_key == COLLECTED:
            return COLLECT
        if api_key == REFUSED:
            return "refused by the sink"
        return FORWARD

    def forward(self, data) -> None:
        # kept as given until the end of the read, as the proxy gathers its writes: a view of the
        # read is valid until then, anything else must not change meanwhile
        self.pending.append(data)
        self.total += len(data)

    def end_of_read(self) -> None:
        data = b"".join(bytes(d) for d in self.pending)
        self.pending = []
        if not data:
            return
        if self.events and self.events[-1][0] == "forward":
            self.events[-1] = ("forward", self.events[-1][1] + data)  # type: ignore[operator]
        else:
            self.events.append(("forward", data))

    def forwarded(self) -> None:
        self.forwarded_at.append(self.total)

    def collected(self, frame: bytes) -> None:
        self.end_of_read()
        self.events.append(("collected", frame))

    def refuse(self, reason: str) -> None:
        self.end_of_read()
        self.events.append(("refused", reason))


def frame(api_key: int, version: int, corr: int, rest: bytes) -> bytes:
    body = struct.pack(">hhi", api_key, version, corr) + rest
    return struct.pack(">i", len(body)) + body


good_frames = st.builds(
    frame,
    st.sampled_from([FORWARDED, FORWARDED, COLLECTED, WAITED]),
    st.integers(0, 17),
    st.integers(-(2**31), 2**31 - 1),
    st.binary(min_size=2, max_size=LIMIT - 8),  # a client id length at least: a request's smallest header
)


@st.composite
def bad_frames(draw) -> tuple[bytes, str]:
    """A frame no request can be, and the reason the proxy gives for it."""
    kind = draw(st.sampled_from(["negative", "oversized", "short", "sink"]))
    if kind == "negative":
        size = draw(st.integers(-(2**31), -1))
        return struct.pack(">i", size), f"invalid frame size {size}"
    if kind == "oversized":
        size = draw(st.integers(LIMIT + 1, 2**31 - 1))
        return struct.pack(">i", size), f"frame of {size} bytes exceeds the limit of {LIMIT}"
    if kind == "short":
        size = draw(st.integers(0, 9))
        return struct.pack(">i", size) + draw(st.binary(min_size=size, max_size=size)), (
            f"frame of {size} bytes is too short for a request header")
    return frame(REFUSED, 0, 1, draw(st.binary(min_size=2, max_size=50))), "refused by the sink"


def expected(frames: list[bytes], refusal: str | None) -> list[tuple[str, bytes | str]]:
    """The reference model: whole frames one by one, consecutive forwarded ones as one piece."""
    events: list[tuple[str, bytes | str]] = []
    for f in frames:
        if struct.unpack_from(">h", f, 4)[0] == COLLECTED:
            events.append(("collected", f[4:]))
        elif events and events[-1][0] == "forward":
            events[-1] = ("forward", events[-1][1] + f)  # type: ignore[operator]
        else:
            events.append(("forward", f))
    if refusal is not None:
        events.append(("refused", refusal))
    return events


def cut(data: bytes, points: list[int]) -> list[bytes]:
    bounds = sorted({p % (len(data) + 1) for p in points} | {0, len(data)})
    return [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def feed_all(framer: RequestFramer, sink: Sink, pieces: list[bytes], held: int = 0) -> None:
    """Feed ``pieces`` through one reused buffer (the first ``held`` of them held, then resumed)."""
    reads = bytearray(max((len(p) for p in pieces), default=0))
    for n, piece in enumerate(pieces):
        reads[: len(piece)] = piece
        if n < held:
            framer.hold(memoryview(reads)[: len(piece)])
        else:
            if n == held:
                framer.resume()
                sink.end_of_read()
            framer.feed(memoryview(reads)[: len(piece)])
            sink.end_of_read()
        reads[:] = b"\xa5" * len(reads)  # the next read overwrites the buffer
    if held >= len(pieces):
        framer.resume()
        sink.end_of_read()


def heads(frames: list[bytes]) -> list[tuple[int, int, int]]:
    return [struct.unpack_from(">hhi", f, 4) for f in frames]


@settings(max_examples=300)
@given(frames=st.lists(good_frames, max_size=12), points=st.lists(st.integers(0, 10_000), max_size=20),
       held=st.integers(0, 3))
def test_any_cut_gives_the_same_frames(frames: list[bytes], points: list[int], held: int) -> None:
    data = b"".join(frames)
    sink = Sink()
    framer = RequestFramer(sink, LIMIT)
    feed_all(framer, sink, cut(data, points), held)
    assert sink.events == expected(frames, None)
    assert sink.heads == heads(frames)  # each decided once, in order
    assert not framer.in_frame and not framer.held and framer.missing() == 0
    # a frame that spanned reads ended at a frame boundary (where the proxy writes its own requests)
    ends = set()
    total = 0
    for f in frames:
        if struct.unpack_from(">h", f, 4)[0] != COLLECTED:
            total += len(f)
            ends.add(total)
    assert set(sink.forwarded_at) <= ends


@settings(max_examples=300)
@given(before=st.lists(good_frames, max_size=6), bad=bad_frames(), after=st.lists(good_frames, max_size=3),
       points=st.lists(st.integers(0, 10_000), max_size=12))
def test_a_bad_frame_stops_the_stream_after_the_frames_before_it(
        before: list[bytes], bad: tuple[bytes, str], after: list[bytes], points: list[int]) -> None:
    bad_frame, reason = bad
    data = b"".join(before) + bad_frame + b"".join(after)
    sink = Sink()
    framer = RequestFramer(sink, LIMIT)
    pieces = cut(data, points)
    feed_all(framer, sink, pieces)
    assert sink.events == expected(before, reason)
    assert [h for h in sink.heads if h[0] != REFUSED] == heads(before)  # nothing after it was looked at
    assert framer.stopped and not framer.held
    framer.feed(memoryview(b"".join(after) or b"\0"))  # nothing more is looked at
    assert sink.events[-1] == ("refused", reason)


@given(frames=st.lists(good_frames, min_size=1, max_size=5), data=st.data())
def test_missing_counts_the_bytes_to_the_end_of_the_frame(frames: list[bytes], data) -> None:
    """What the proxy logs when a client hangs up inside a frame."""
    stream = b"".join(frames)
    at = data.draw(st.integers(0, len(stream)))
    framer = RequestFramer(Sink(), LIMIT)
    framer.feed(memoryview(stream[:at]))
    start = 0
    for f in frames:
        if start <= at < start + len(f):
            into = at - start
            want = 0 if into == 0 else (4 - into if into < 4 else len(f) - into)
            break
        start += len(f)
    else:
        want = 0
    assert framer.missing() == want


def test_forwarded_frames_are_slices_of_the_read_not_copies() -> None:
    """The hot path: whole frames in one read go on as one view of it."""
    data = frame(FORWARDED, 15, 1, b"x" * 40) + frame(FORWARDED, 15, 2, b"y" * 40)
    got: list = []
    sink = Sink()
    sink.forward = got.append  # type: ignore[method-assign]
    RequestFramer(sink, LIMIT).feed(memoryview(bytearray(data)))
    assert len(got) == 1 and isinstance(got[0], memoryview) and bytes(got[0]) == data


def test_the_sink_may_rewrite_the_head_in_place() -> None:
    """A request downgrade rewrites the version in the read before it is forwarded."""
    class Downgrading(Sink):
        def begin(self, buf, pos, size, api_key, version, corr):
            struct.pack_into(">h", buf, pos + 6, 15)
            return super().begin(buf, pos, size, api_key, version, corr)

    sink = Downgrading()
    framer = RequestFramer(sink, LIMIT)
    whole = frame(FORWARDED, 17, 1, b"abc")
    framer.feed(memoryview(bytearray(whole[:7])))  # the head cut: held, then rewritten there
    framer.feed(memoryview(bytearray(whole[7:])))
    sink.end_of_read()
    assert sink.events == [("forward", frame(FORWARDED, 15, 1, b"abc"))]


@settings(max_examples=300)
@given(garbage=st.lists(st.one_of(good_frames, bad_frames().map(lambda b: b[0]), st.binary(max_size=30)), max_size=8),
       points=st.lists(st.integers(0, 10_000), max_size=12))
def test_any_bytes_cut_anywhere_are_split_as_they_are_whole(garbage: list[bytes], points: list[int]) -> None:
    """Whatever a client sends (frames, bad sizes, garbage), where the reads cut it changes nothing."""
    data = b"".join(garbage)
    whole, pieces = Sink(), Sink()
    feed_all(RequestFramer(whole, LIMIT), whole, [data])
    feed_all(RequestFramer(pieces, LIMIT), pieces, cut(data, points))
    assert pieces.events == whole.events and pieces.heads == whole.heads
