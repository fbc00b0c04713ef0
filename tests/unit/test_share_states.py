"""The record-state machine of kshare.share.states: its transition table."""

from __future__ import annotations

from kshare.share.states import TRANSITIONS, Event, RecordState


def test_transition_table_is_the_only_source_of_truth() -> None:
    # Terminal states have no way out; Available only leaves by acquisition or skipping.
    assert not [key for key in TRANSITIONS if key[0] in (RecordState.ACKNOWLEDGED, RecordState.ARCHIVED)]
    assert {e for s, e in TRANSITIONS if s == RecordState.AVAILABLE} == {Event.ACQUIRE, Event.SKIP}
    assert TRANSITIONS[(RecordState.ACQUIRED, Event.RELEASE)].at_limit == RecordState.ARCHIVED
    assert TRANSITIONS[(RecordState.ACQUIRED, Event.REJECT)].target == RecordState.ARCHIVED
