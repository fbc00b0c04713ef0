"""Tasks that several requests await at once, each through ``asyncio.shield``."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


def shared_task(coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
    """A task for requests to await through ``asyncio.shield``. If all of them are cancelled (their
    clients closed) before it fails, nobody retrieves its exception, and asyncio would log "Task
    exception was never retrieved" with a traceback for each (536 of them when the bench closed
    1,000 clients at once, all asking the cluster about a group). It is retrieved here; whoever
    still awaits the task gets the exception all the same."""
    task = asyncio.get_running_loop().create_task(coro)
    task.add_done_callback(retrieve_failure)
    return task


def retrieve_failure(task: asyncio.Future) -> None:
    """Mark a finished task's exception as retrieved (a task nobody may await)."""
    if not task.cancelled():
        task.exception()
