"""aiokafka's sender stopping on an unexpected answer: one WARNING line, no traceback
(kshare.share.state.fence.quiet_sender_stops)."""

from __future__ import annotations

import logging

from aiokafka.errors import UnknownError

from kshare.share.state.fence import quiet_sender_stops


def test_a_stopped_sender_is_one_warning_line(caplog) -> None:
    quiet_sender_stops()
    quiet_sender_stops()  # once only
    sender_log = logging.getLogger("aiokafka.producer.sender")
    assert len(sender_log.filters) == 1
    with caplog.at_level(logging.DEBUG, logger="aiokafka.producer.sender"):
        try:
            raise UnknownError()
        except UnknownError:
            sender_log.exception("Unexpected error in sender routine")
        sender_log.error("something else: %s", "kept")
    stopped, other = caplog.records
    assert stopped.levelno == logging.WARNING and stopped.exc_info is None
    assert "transactional state producer stopped" in stopped.getMessage() and "UnknownError" in stopped.getMessage()
    assert "Traceback" not in caplog.text
    assert other.levelno == logging.ERROR and other.getMessage() == "something else: kept"
