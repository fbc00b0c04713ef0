"""The errors of kshare's clients: aiokafka's error classes (``aiokafka.errors``), one per Kafka error
code, with the share-group codes aiokafka does not know yet added here in the same style.

A share consumer's failures are raised as these, so ``except aiokafka.errors.KafkaError`` catches them
all and each says Kafka's name for the error (``exc.message``, e.g. ``GROUP_MAX_SIZE_REACHED``) and its
code (``exc.errno``)."""

from __future__ import annotations

from aiokafka import errors as _aio
from aiokafka.errors import BrokerResponseError, KafkaError

from ..protocol.codes import ErrorCode

__all__ = [
    "BrokerResponseError",
    "FencedMemberEpochError",
    "FencedStateEpochError",
    "GroupMaxSizeReachedError",
    "InvalidRecordStateError",
    "InvalidShareSessionEpochError",
    "KafkaError",
    "MemberError",
    "ShareSessionLimitReachedError",
    "ShareSessionNotFoundError",
    "StaleMemberEpochError",
    "UnknownTopicIdError",
    "error_for",
    "error_name",
]


class MemberError(KafkaError):
    """A share-group call failed in a way the member cannot recover from by itself, without a Kafka
    error code of its own (the coded failures are :class:`BrokerResponseError` subclasses)."""


class _ShareGroupError(BrokerResponseError):
    """An error aiokafka does not know yet, in aiokafka's style: ``errno`` and ``message`` (Kafka's
    name) both come from the one :class:`ErrorCode` the subclass names, ``class X(_ShareGroupError,
    code=ErrorCode.Y)``."""

    def __init_subclass__(cls, code: ErrorCode | None = None, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if code is not None:
            cls.errno = code.value
            cls.message = code.name


class GroupMaxSizeReachedError(_ShareGroupError, code=ErrorCode.GROUP_MAX_SIZE_REACHED):
    description = "The group has reached its maximum size (group.share.max.size for a share group)."


class UnknownTopicIdError(_ShareGroupError, code=ErrorCode.UNKNOWN_TOPIC_ID):
    description = "This server does not host this topic ID."
    invalid_metadata = True


class FencedMemberEpochError(_ShareGroupError, code=ErrorCode.FENCED_MEMBER_EPOCH):
    description = "The member epoch is fenced by the group coordinator: the member must rejoin."


class StaleMemberEpochError(_ShareGroupError, code=ErrorCode.STALE_MEMBER_EPOCH):
    description = "The member epoch is stale."


class InvalidRecordStateError(_ShareGroupError, code=ErrorCode.INVALID_RECORD_STATE):
    description = ("The record state is invalid: the acknowledgement of a delivery was rejected (the "
                   "record's lock ran out, or another member holds it now).")


class ShareSessionNotFoundError(_ShareGroupError, code=ErrorCode.SHARE_SESSION_NOT_FOUND):
    description = "The share session was not found: the records it acquired were released."
    retriable = True


class InvalidShareSessionEpochError(_ShareGroupError, code=ErrorCode.INVALID_SHARE_SESSION_EPOCH):
    description = "The share session epoch is invalid."
    retriable = True


class FencedStateEpochError(_ShareGroupError, code=ErrorCode.FENCED_STATE_EPOCH):
    description = "The share coordinator rejected the request because the share-group state epoch did not match."


class ShareSessionLimitReachedError(_ShareGroupError, code=ErrorCode.SHARE_SESSION_LIMIT_REACHED):
    description = "The limit of share sessions on the broker (group.share.max.share.sessions) has been reached."
    retriable = True


_OURS: dict[int, type[BrokerResponseError]] = {cls.errno: cls for cls in _ShareGroupError.__subclasses__()}


def error_class(code: int) -> type[BrokerResponseError]:
    """The error class of Kafka error ``code`` (aiokafka's ``UnknownError`` for a code neither knows)."""
    return _OURS.get(code) or _aio.kafka_errors.get(code, _aio.UnknownError)


def error_name(code: int) -> str:
    """Apache Kafka's name for error ``code``: ``UNKNOWN_TOPIC_OR_PARTITION``, ``NONE`` for 0,
    ``error 999`` for a code it does not know."""
    try:
        return ErrorCode(code).name
    except ValueError:
        return f"error {code}"


def error_for(code: int, context: str = "", message: str | None = None) -> BrokerResponseError:
    """An exception for Kafka error ``code``: ``error_for(81, "ShareGroupHeartbeat for group g")`` is a
    :class:`GroupMaxSizeReachedError` whose text reads ``GROUP_MAX_SIZE_REACHED: ShareGroupHeartbeat
    for group g (<the broker's message>)``."""
    cls = error_class(code)
    text = error_name(code) + (f": {context}" if context else "") + (f" ({message})" if message else "")
    exc = cls(text)
    if cls is _aio.UnknownError and code != -1:
        exc.errno = code  # a code neither table knows: keep it
    return exc
