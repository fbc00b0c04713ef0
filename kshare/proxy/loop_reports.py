"""Reports of the event loop (``loop.call_exception_handler``) that are expected, sent to DEBUG.

Used where a library reports at ERROR, with a traceback, what kshare expects and handles itself:
a TLS peer hanging up mid-handshake (:func:`kshare.proxy.tls.quiet_hang_ups`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any


def demote_reports(loop: asyncio.AbstractEventLoop, kind: str, explain: Callable[[dict[str, Any]], str | None],
                   log: logging.Logger) -> None:
    """Log the loop's exception reports ``explain`` explains (it returns why they are expected) at
    DEBUG on ``log``; pass every other one to the loop's previous handler. Nothing is installed when
    the loop's handler already is one of this ``kind``."""
    previous = loop.get_exception_handler()
    if getattr(previous, "demotes", None) == kind:
        return

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        why = explain(context)
        if why is not None:
            log.debug("%s: %r (%s)", context.get("message"), context.get("exception"), why)
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    handler.demotes = kind  # type: ignore[attr-defined]
    loop.set_exception_handler(handler)
