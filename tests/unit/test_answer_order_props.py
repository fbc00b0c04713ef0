"""A client connection's answers in request order (``kshare.proxy.answers.AnswerOrder``), against
the reference model "written in the order asked, each as soon as every one before it is".

Requests are forwarded (the broker answers them in order; an answer streams through when it is the
next one owed, else it is kept until it is) or served by the proxy (its handlers finish in any
order). The interleavings are drawn by hypothesis.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kshare.proxy.answers import AnswerOrder, Slot


class Connection:
    """The ordering part of ``ClientConnection`` and ``UpstreamConnection``, writes recorded."""

    def __init__(self) -> None:
        self.order = AnswerOrder()
        self.written: list[int] = []
        self.streams = 0

    def flush(self) -> None:
        while (slot := self.order.next_ready()) is not None:
            self.written.append(slot.corr)

    def served(self, slot: Slot) -> None:  # a handler returned
        slot.data = b"answer"
        self.flush()

    def broker_answered(self, slot: Slot) -> None:
        if self.order.is_next(slot):  # streams through: written at once, taken off at its end
            self.streams += 1
            self.written.append(slot.corr)
            assert self.order.popleft() is slot
            self.flush()
        else:
            slot.data = b"answer"
            self.flush()


@given(st.data())
def test_answers_are_written_in_request_order_whatever_finishes_first(data) -> None:
    kinds = data.draw(st.lists(st.sampled_from(["forwarded", "served"]), max_size=30))
    conn = Connection()
    slots = [Slot(0, 0, corr) for corr in range(len(kinds))]
    for slot in slots:
        conn.order.append(slot)
    forwarded = [s for s, k in zip(slots, kinds, strict=True) if k == "forwarded"]  # the broker keeps order
    served = [s for s, k in zip(slots, kinds, strict=True) if k == "served"]
    while forwarded or served:
        choices = (["broker"] if forwarded else []) + list(range(len(served)))
        pick = data.draw(st.sampled_from(choices))
        if pick == "broker":
            done = forwarded.pop(0)
            conn.broker_answered(done)
        else:
            done = served.pop(pick)
            conn.served(done)
        # each answer goes as soon as every one before it has: nothing ready is left waiting
        assert not conn.order or conn.order[0].data is None
        finished = {s.corr for s in slots} - {s.corr for s in forwarded + served}
        assert conn.written == [c for c in range(len(slots)) if all(d in finished for d in range(c + 1))]
    assert conn.written == list(range(len(slots)))
    assert not conn.order


def test_only_the_next_answer_owed_may_stream() -> None:
    order = AnswerOrder()
    first, second = Slot(1, 0, 0), Slot(1, 0, 1)
    order.extend([first, second])
    assert order.is_next(first) and not order.is_next(second)
    second.data = b"x"
    assert order.next_ready() is None  # the first is still owed
    first.data = b"y"
    assert order.next_ready() is first and order.next_ready() is second and order.next_ready() is None
    assert not order.is_next(first)
