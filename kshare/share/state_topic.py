"""The old import path of :class:`kshare.share.state.topic_store.TopicStateStore` and its names, for
code not moved yet (the state store is the package :mod:`kshare.share.state`)."""

from .state.errors import StateNotOwned, StateStoreError, StateWriteError
from .state.memory import WriteStats, apply_update_in_place
from .state.replay import LoadStats
from .state.topic_admin import ALTERNATIVE_TOPIC, DEFAULT_TOPIC
from .state.topic_store import TopicStateStore

__all__ = [
    "ALTERNATIVE_TOPIC",
    "DEFAULT_TOPIC",
    "LoadStats",
    "StateNotOwned",
    "StateStoreError",
    "StateWriteError",
    "TopicStateStore",
    "WriteStats",
    "apply_update_in_place",
]
