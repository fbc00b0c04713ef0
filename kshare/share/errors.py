"""Kafka error codes used by the share-group code paths.

The engine returns plain ints (these members compare equal to ints) so the
protocol layer can put them on the wire without translation.
"""

from __future__ import annotations

from enum import IntEnum


class ErrorCode(IntEnum):
    """Kafka protocol error codes met on the share-group paths (see reference.md section 1)."""

    UNKNOWN_SERVER_ERROR = -1
    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    UNKNOWN_TOPIC_OR_PARTITION = 3
    LEADER_NOT_AVAILABLE = 5
    NOT_LEADER_OR_FOLLOWER = 6
    REQUEST_TIMED_OUT = 7
    NETWORK_EXCEPTION = 13
    COORDINATOR_LOAD_IN_PROGRESS = 14
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    INCONSISTENT_GROUP_PROTOCOL = 23
    TOPIC_AUTHORIZATION_FAILED = 29
    GROUP_AUTHORIZATION_FAILED = 30
    UNKNOWN_MEMBER_ID = 25
    UNSUPPORTED_VERSION = 35
    INVALID_CONFIG = 40
    INVALID_REQUEST = 42
    NON_EMPTY_GROUP = 68
    GROUP_ID_NOT_FOUND = 69
    GROUP_MAX_SIZE_REACHED = 81
    UNKNOWN_TOPIC_ID = 100
    FENCED_MEMBER_EPOCH = 110
    INVALID_RECORD_STATE = 121
    SHARE_SESSION_NOT_FOUND = 122
    INVALID_SHARE_SESSION_EPOCH = 123
    FENCED_STATE_EPOCH = 124
    SHARE_SESSION_LIMIT_REACHED = 133
