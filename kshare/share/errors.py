"""The Kafka error codes of the share-group code paths: :class:`kshare.protocol.codes.ErrorCode`,
generated from ``protocol_specs/errors/ErrorCodes.json``, under the name the ``share`` modules import.

The engine returns these members (they compare equal to ints), so the protocol layer puts them on
the wire without translation.
"""

from __future__ import annotations

from ..protocol.codes import ErrorCode

__all__ = ["ErrorCode"]
