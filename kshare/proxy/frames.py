"""Request frames out of a client's byte stream (no I/O).

A Kafka frame is a 4-byte big-endian size, then that many bytes; a request's begin with its API
key, version and correlation id (``HEAD``: 12 bytes with the size). ``RequestFramer`` takes the
bytes a client sends, cut wherever the reads cut them, and hands each frame on as its sink
decides from the head (``sink.begin``):

* ``FORWARD``: the frame's bytes go to ``sink.forward`` as they arrive; a frame spread over
  several reads is never gathered, and consecutive whole frames go together, as one slice of the
  read. ``sink.forwarded()`` is called when a frame that spanned reads has ended;
* ``COLLECT``: the whole frame (without its size) goes to ``sink.collected`` once complete
  (frames before it go to ``forward`` first);
* ``WAIT``: too little of the frame to decide: asked again when more has come;
* a string: the frame is refused for that reason (``sink.refuse``), after the frames before it
  went on; the framer stops: nothing after it is looked at.

The framer itself refuses what no request can be, as Kafka does: a negative size, a size over
``max_frame_bytes`` and a frame too short for a request header.

Slices passed to ``forward`` are views of the bytes being fed, valid during the call only (the
proxy's read buffer is reused by the next read): the sink writes or copies them at once. Only
bytes that cannot be decided yet (a head cut between reads) are copied, into ``held``.
"""

from __future__ import annotations

import struct
from typing import Protocol

from ..protocol.codegen import DecodeError, _uvarint

FORWARD, COLLECT, WAIT = 0, 1, 2
MIN_REQUEST_SIZE = 10  # api key, version, correlation id, client id length: Kafka's request header

SIZE = struct.Struct(">i")
HEAD = struct.Struct(">ihhi")  # size, api key, api version, correlation id
_I16 = struct.Struct(">h")

Buffer = bytearray | memoryview


class FrameSink(Protocol):
    def begin(self, buf: Buffer, pos: int, size: int, api_key: int, version: int, corr: int) -> int | str:
        """What to do with the frame at ``buf[pos:]`` (size prefix included; ``buf`` may hold only
        its head, and is writable: the sink may rewrite the head in place before it is forwarded)."""
        ...

    def forward(self, data: bytes | memoryview) -> None: ...

    def forwarded(self) -> None: ...

    def collected(self, frame: bytes) -> None: ...

    def refuse(self, reason: str) -> None: ...


class RequestFramer:
    """Splits a client's byte stream into request frames; see the module's doc."""

    __slots__ = ("max_frame_bytes", "held", "forward_left", "_collect_left", "_chunks", "stopped",
                 "_begin", "_forward", "_forwarded", "_collected", "_refuse")

    def __init__(self, sink: FrameSink, max_frame_bytes: int) -> None:
        self.max_frame_bytes = max_frame_bytes
        self.held = bytearray()  # bytes of a frame not yet decided (a head cut between reads)
        self.forward_left = 0  # bytes of the current forwarded frame still to come
        self._collect_left = 0  # bytes of the current collected frame still to come
        self._chunks: list[bytes] = []
        self.stopped = False
        # bound once: they run for every frame
        self._begin = sink.begin
        self._forward = sink.forward
        self._forwarded = sink.forwarded
        self._collected = sink.collected
        self._refuse = sink.refuse

    @property
    def in_frame(self) -> bool:
        """Whether a frame is partly through (the stream is not at a frame boundary)."""
        return bool(self.forward_left or self._collect_left)

    def stop(self) -> None:
        """Look at nothing more; what is held is dropped."""
        self.stopped = True
        self.held.clear()
        self._chunks = []

    def hold(self, data: Buffer) -> None:
        """Keep ``data`` (copied) to be split later, by ``resume``."""
        self.held += data

    def resume(self) -> None:
        """Split what was held."""
        if self.held and not self.stopped:
            self._frames(None)

    def feed(self, view: memoryview) -> None:
        """Split the next bytes of the stream."""
        i, n = 0, len(view)
        while i < n and not self.stopped:
            if self.forward_left:
                take = min(self.forward_left, n - i)
                self._forward(view[i : i + take] if take < n else view)
                self.forward_left -= take
                i += take
                if not self.forward_left:
                    self._forwarded()
                continue
            if self._collect_left:
                take = min(self._collect_left, n - i)
                self._chunks.append(bytes(view[i : i + take]))
                self._collect_left -= take
                i += take
                if not self._collect_left:
                    frame, self._chunks = b"".join(self._chunks), []
                    self._collected(frame)
                continue
            # at a frame boundary: the frames are read where they are, in this read (and pass on
            # as slices of it); only a head cut between reads is gathered in ``held`` first
            if self.held:
                self.held += view[i:]
                self._frames(None)
            else:
                self._frames(view[i:] if i else view)
            return

    def _frames(self, read: memoryview | None) -> None:
        """Decide on each frame whose head is in ``held``, or in ``read`` (the rest of one read;
        what is left of it undecided is kept in ``held``)."""
        buf: Buffer = self.held if read is None else read
        pos = 0  # the frame being looked at; everything before it is dealt with
        run = 0  # start of the whole frames to forward not yet handed to ``forward``
        bad: str | None = None  # why the frame at ``pos`` is refused (the ones before it go first)
        limit = self.max_frame_bytes
        begin = self._begin
        try:
            while not self.stopped and len(buf) - pos >= 4:
                (size,) = SIZE.unpack_from(buf, pos)
                if size < 0:
                    bad = f"invalid frame size {size}"
                    return
                if size > limit:
                    bad = f"frame of {size} bytes exceeds the limit of {limit}"
                    return
                end = pos + 4 + size
                if size < MIN_REQUEST_SIZE:
                    if len(buf) >= end:
                        bad = f"frame of {size} bytes is too short for a request header"
                    return
                if len(buf) - pos < 12:
                    return
                _, api_key, version, corr = HEAD.unpack_from(buf, pos)
                verdict = begin(buf, pos, size, api_key, version, corr)
                if verdict == FORWARD:
                    if len(buf) >= end:
                        pos = end  # complete: forwarded with the frames around it, in one piece
                        continue
                    self.forward_left = end - len(buf)
                    pos = len(buf)
                    return
                if verdict == COLLECT:
                    if run < pos:  # what came before goes first
                        self._forward(buf[run:pos] if read is not None else bytes(buf[run:pos]))
                    if len(buf) >= end:
                        frame = bytes(buf[pos + 4 : end])
                        run = pos = end
                        self._collected(frame)
                    else:
                        self._chunks = [bytes(buf[pos + 4 :])]
                        self._collect_left = end - len(buf)
                        run = pos = len(buf)
                    continue
                if verdict != WAIT:
                    bad = verdict  # type: ignore[assignment]
                return
        finally:
            if read is not None:
                if run < pos:
                    self._forward(buf[run:pos])  # no copy: a slice of the read
                if pos < len(buf) and not self.stopped and bad is None:  # (a refused stream keeps none)
                    self.held += buf[pos:]
            else:
                if run < pos:
                    self._forward(bytes(buf[run:pos]))
                del buf[:pos]
            if bad is not None:
                self.stop()
                self._refuse(bad)

    def missing(self) -> int:
        """How many bytes the frame being received still lacks (0 at a frame boundary)."""
        if self.forward_left or self._collect_left:
            return self.forward_left + self._collect_left
        buf, pos = self.held, 0  # whole frames wait here until the sink is ready for them
        while len(buf) - pos >= 4:
            (size,) = SIZE.unpack_from(buf, pos)
            if not 0 <= size <= self.max_frame_bytes:
                return 0  # refused as soon as it is looked at
            pos += 4 + size
        return pos - len(buf) if pos > len(buf) else (4 - (len(buf) - pos)) % 4


def produce_header(frame: Buffer | bytes, version: int, start: int, end: int) -> tuple[int, bool] | None:
    """(``acks``, whether it is transactional) of the Produce request at ``frame[start:end]``
    (size prefix included). Returns None when ``frame`` holds too little of it to tell, or the
    request ends before ``acks``.

    Read by hand rather than with the codec: it runs for every Produce request.
    """
    try:
        (n,) = _I16.unpack_from(frame, start + 12)  # client id
        pos = start + 14 + max(n, 0)
        if version >= 9:  # flexible: the header's tagged fields, then a compact transactional id
            count, pos = _uvarint(frame, pos)
            for _ in range(count):
                _, pos = _uvarint(frame, pos)
                size, pos = _uvarint(frame, pos)
                pos += size
            n, pos = _uvarint(frame, pos)
            transactional = n > 0
            pos += max(n - 1, 0)
        elif version >= 3:
            (n,) = _I16.unpack_from(frame, pos)
            transactional = n >= 0
            pos += 2 + max(n, 0)
        else:
            transactional = False
        if pos + 2 > min(end, len(frame)):
            return None
        (acks,) = _I16.unpack_from(frame, pos)
        return acks, transactional
    except (DecodeError, struct.error, IndexError):
        return None
