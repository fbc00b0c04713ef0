"""``kshare.cli.setup_logging``: what an operator sees of the clients kshare runs (aiokafka)."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest
from aiokafka import errors

from kshare.cli import setup_logging


@pytest.fixture
def stderr() -> Iterator[io.StringIO]:
    """What ``setup_logging``'s handler writes (kshare's stderr), for ``setup`` below."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level, logging.getLogger("aiokafka").level
    yield io.StringIO()
    root.handlers[:], root.level = saved[0], saved[1]
    logging.getLogger("aiokafka").setLevel(saved[2])


def setup(level: str, out: io.StringIO) -> None:
    setup_logging(level, "text")
    logging.getLogger().handlers[0].setStream(out)  # type: ignore[attr-defined]


@pytest.mark.parametrize("err", [errors.GroupCoordinatorNotAvailableError(), errors.NotCoordinatorForGroupError(),
                                 errors.GroupLoadInProgressError()])
def test_a_retried_coordinator_lookup_is_no_error_line(stderr: io.StringIO, err: Exception) -> None:
    """aiokafka says ERROR for a coordinator lookup it retries: kshare shows it at INFO (so, at the
    default level, not at all), as aiokafka's logger is at WARNING."""
    setup("info", stderr)
    logging.getLogger("aiokafka.consumer.group_coordinator").error("Group Coordinator Request failed: %s", err)
    assert stderr.getvalue() == ""
    setup("debug", stderr)
    logging.getLogger("aiokafka.consumer.group_coordinator").error("Group Coordinator Request failed: %s", err)
    assert " INFO    aiokafka.consumer.group_coordinator: Group Coordinator Request failed" in stderr.getvalue()


def test_other_coordinator_failures_stay_errors(stderr: io.StringIO) -> None:
    setup("info", stderr)
    logging.getLogger("aiokafka.consumer.group_coordinator").error(
        "Group Coordinator Request failed: %s", errors.UnknownError())
    logging.getLogger("aiokafka.consumer.group_coordinator").error("Error sending JoinGroup: %s",
                                                                   errors.GroupCoordinatorNotAvailableError())
    lines = stderr.getvalue().splitlines()
    assert len(lines) == 2 and all(" ERROR " in line for line in lines), lines
