"""What the state store raises."""

from __future__ import annotations

from ..store import NotOwned, StoreWriteError


class StateStoreError(Exception):
    """The state store cannot do what was asked (not started, closed, misconfigured topic)."""


class StateWriteError(StateStoreError, StoreWriteError):
    """A write was not acknowledged by the cluster; it may or may not be on the topic."""


class StateNotOwned(StateWriteError, NotOwned):
    """An instance group's store does not (or no longer) own the state partition: nothing was written."""


__all__ = ["StateNotOwned", "StateStoreError", "StateWriteError"]
