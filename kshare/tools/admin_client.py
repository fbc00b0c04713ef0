"""Moved to :mod:`kshare.clients.admin` and :mod:`kshare.clients.settings` (the clients layer); this
module keeps the old import path working for the tests and ``examples/spark_pipeline.py``."""

from __future__ import annotations

from ..clients.admin import (  # noqa: F401 - re-exported
    EARLIEST,
    GROUP_STATES,
    LATEST,
    AdminError,
    GroupDescription,
    GroupListing,
    GroupNotEmpty,
    GroupNotFound,
    MemberDescription,
    Node,
    PartitionOffset,
    ShareGroupAdmin,
    TopicMeta,
    Unreachable,
    error_name,
    probe,
)
from ..clients.settings import (  # noqa: F401 - re-exported
    ClientSettings,
    client_security,
    load_command_config,
    parse_bootstrap,
    parse_properties,
)
