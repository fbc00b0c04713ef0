"""Tasks several requests await through ``asyncio.shield`` (``kshare.share.tasks.shared_task``):
when every request awaiting one is cancelled (its client closed) and the task then fails, asyncio
must not log "Task exception was never retrieved" with a traceback; a request still awaiting it
gets the failure."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from typing import Any

import pytest

from kshare.share.authorization import AuthorizationUnknown, Operation, ShareAuthorizer
from kshare.share.tasks import shared_task


class _ClosingConnection:
    """A client connection whose upstream connection closes while the cluster is being asked."""

    closed = False

    class proxy:  # noqa: N801 - the attribute the authorizer reads
        upstream_versions: dict = {}

    def __init__(self) -> None:
        self.gate = asyncio.Event()

    async def probe(self, api_key: int, version: int, body: Any) -> Any:
        await self.gate.wait()
        raise ConnectionError("the upstream connection closed")


async def _settle(reported: list) -> None:
    for _ in range(5):
        await asyncio.sleep(0)
    gc.collect()  # a task's unretrieved exception is reported when the task is collected
    await asyncio.sleep(0)


def _report_into(reported: list) -> None:
    asyncio.get_running_loop().set_exception_handler(lambda _loop, context: reported.append(context["message"]))


@pytest.mark.parametrize("others_waiting", [0, 1])
def test_a_question_whose_askers_are_gone_fails_quietly(others_waiting: int) -> None:
    async def main() -> tuple[list, list]:
        reported: list = []
        _report_into(reported)
        conn = _ClosingConnection()
        auth = ShareAuthorizer()
        gone = asyncio.create_task(auth.group(conn, Operation.READ, "g"))
        staying = [asyncio.create_task(auth.group(conn, Operation.READ, "g")) for _ in range(others_waiting)]
        await asyncio.sleep(0)
        gone.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await gone
        conn.gate.set()
        outcomes = []
        for t in staying:
            try:
                outcomes.append(await t)
            except AuthorizationUnknown as exc:
                outcomes.append(type(exc))
        del gone, staying
        await _settle(reported)
        return reported, outcomes

    reported, outcomes = asyncio.run(main())
    assert reported == []
    assert outcomes == [AuthorizationUnknown] * others_waiting  # still told: the request gets a retriable error


def test_a_plain_task_would_be_reported_and_a_shared_one_is_not() -> None:
    """The check above can fail: the same failure in a plain task is reported."""
    async def fail() -> None:
        raise ConnectionError("closed")

    async def main(make) -> list:
        reported: list = []
        _report_into(reported)
        task = make(fail())
        await asyncio.sleep(0)
        del task
        await _settle(reported)
        return reported

    assert asyncio.run(main(lambda c: asyncio.get_running_loop().create_task(c))) == [
        "Task exception was never retrieved"]
    assert asyncio.run(main(shared_task)) == []
