"""Share sessions (sans-I/O): the partitions a member fetches from one listener, with epochs.

A share session is keyed by (group, member, node): a client keeps one session per broker it
fetches from, and through the proxy each upstream broker is one listener. Epoch 0 opens (or
replaces) a session, -1 closes it, any other value must be the next epoch in sequence.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from .errors import ErrorCode

INITIAL_EPOCH = 0
FINAL_EPOCH = -1

SessionKey = tuple[str, str, int]  # group id, member id, node id
TopicPartition = tuple[bytes, int]  # topic id, partition


@dataclass(slots=True)
class ShareSession:
    key: SessionKey
    next_epoch: int = 1
    # insertion-ordered; the order is rotated per fetch so no partition starves
    partitions: dict[TopicPartition, None] = field(default_factory=dict)
    # partitions whose last answer was an error must be mentioned again even without data
    needs_update: set[TopicPartition] = field(default_factory=set)
    rotation: int = 0
    # the client connection the session was last used on (opaque here): when it closes, the
    # session ends, as on Kafka, where a share session lives and dies with its connection
    owner: object = None

    def add(self, partitions: Iterable[TopicPartition]) -> None:
        for tp in partitions:
            self.partitions.setdefault(tp, None)

    def forget(self, partitions: Iterable[TopicPartition]) -> None:
        for tp in partitions:
            self.partitions.pop(tp, None)
            self.needs_update.discard(tp)

    def rotated(self) -> list[TopicPartition]:
        """Session partitions, starting one further along on every call."""
        parts = list(self.partitions)
        if not parts:
            return parts
        k = self.rotation % len(parts)
        self.rotation += 1
        return parts[k:] + parts[:k]


@dataclass(slots=True)
class SessionResult:
    error_code: int
    session: ShareSession | None = None
    closed: ShareSession | None = None  # a session that ended: release what its member holds


class ShareSessionCache:
    """All open share sessions, bounded (``group.share.max.share.sessions``)."""

    def __init__(self, max_sessions: int = 2000) -> None:
        self.max_sessions = max_sessions
        self.sessions: OrderedDict[SessionKey, ShareSession] = OrderedDict()
        self.by_owner: dict[object, set[SessionKey]] = {}
        self.by_member: dict[tuple[str, str], set[SessionKey]] = {}  # (group, member) -> its sessions' keys

    def __len__(self) -> int:
        return len(self.sessions)

    def open(self, key: SessionKey, epoch: int, add: Iterable[TopicPartition], forget: Iterable[TopicPartition],
             *, fetch: bool = True, owner: object = None) -> SessionResult:
        """Validate a ShareFetch (``fetch``) or ShareAcknowledge's session epoch and apply its changes.

        ``owner``: the connection the request came on; the session is bound to it.
        """
        if epoch == INITIAL_EPOCH:
            if not fetch:  # ShareAcknowledge cannot open a session
                return SessionResult(ErrorCode.INVALID_SHARE_SESSION_EPOCH)
            replaced = self._pop(key)
            if len(self.sessions) >= self.max_sessions:
                if replaced is not None:
                    self._put(replaced)
                return SessionResult(ErrorCode.SHARE_SESSION_LIMIT_REACHED)
            # A replaced session's records stay acquired: the member may still acknowledge them.
            session = ShareSession(key, owner=owner)
            session.add(add)
            self._put(session)
            return SessionResult(ErrorCode.NONE, session)
        session = self.sessions.get(key)
        if session is None:
            return SessionResult(ErrorCode.SHARE_SESSION_NOT_FOUND)
        if epoch == FINAL_EPOCH:
            self._pop(key)
            return SessionResult(ErrorCode.NONE, session, closed=session)
        if epoch != session.next_epoch:
            return SessionResult(ErrorCode.INVALID_SHARE_SESSION_EPOCH)
        session.next_epoch = epoch + 1 if epoch < 0x7FFFFFFF else 1
        session.add(add)
        session.forget(forget)
        if owner is not None and owner is not session.owner:
            self._pop(key)
            session.owner = owner
            self._put(session)
        self.sessions.move_to_end(key)
        return SessionResult(ErrorCode.NONE, session)

    def close_member(self, group_id: str, member_id: str) -> list[ShareSession]:
        """Drop every session of a member (it left the group or was removed)."""
        gone = list(self.by_member.get((group_id, member_id), ()))
        return [s for s in map(self._pop, gone) if s is not None]

    def partitions_of(self, group_id: str, member_id: str) -> set[TopicPartition]:
        """The share-partitions in the member's open sessions (one per listener it fetches from)."""
        out: set[TopicPartition] = set()
        for key in self.by_member.get((group_id, member_id), ()):
            out.update(self.sessions[key].partitions)
        return out

    def close_owner(self, owner: object) -> list[ShareSession]:
        """Drop the sessions bound to a connection that closed."""
        return [s for s in map(self._pop, list(self.by_owner.get(owner, ()))) if s is not None]

    def _put(self, session: ShareSession) -> None:
        self.sessions[session.key] = session
        self.by_member.setdefault(session.key[:2], set()).add(session.key)
        if session.owner is not None:
            self.by_owner.setdefault(session.owner, set()).add(session.key)

    def _pop(self, key: SessionKey) -> ShareSession | None:
        session = self.sessions.pop(key, None)
        if session is not None:
            member = self.by_member.get(key[:2])
            if member is not None:
                member.discard(key)
                if not member:
                    del self.by_member[key[:2]]
        if session is not None and session.owner is not None:
            keys = self.by_owner.get(session.owner)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self.by_owner[session.owner]
        return session
