"""Operator tools: ``kshare groups`` (share-group administration, like kafka-share-groups.sh) and
``kshare consume`` / ``kshare produce`` (console clients).  See docs/reference/cli.md."""

from __future__ import annotations

import click


def register_commands(main: click.Group) -> None:
    """Add the tool commands to the ``kshare`` command group."""
    from .console import consume, produce
    from .groups import groups

    main.add_command(groups)
    main.add_command(consume)
    main.add_command(produce)
