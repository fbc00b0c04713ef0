"""What the share-partition engine (``kshare.share.partition``) takes and gives: the fetched
batches it is shown, and the results of its calls. Re-exported by ``kshare.share.partition``."""

from __future__ import annotations

from typing import NamedTuple

from kshare.share.states import RecordState, ShareSnapshot, ShareUpdate


class FetchedBatch(NamedTuple):
    """What the engine needs to know about one upstream record batch (never its records)."""

    base_offset: int
    last_offset: int
    is_control: bool = False
    is_transactional: bool = False
    producer_id: int = -1


class AcquiredRange(NamedTuple):
    """Offsets handed to a member, as in ShareFetch's AcquiredRecords."""

    first_offset: int
    last_offset: int
    delivery_count: int


class AcquireResult(NamedTuple):
    records: list[AcquiredRange]  # in offset order, adjacent ranges with equal counts merged
    count: int  # offsets acquired (intra-batch compaction gaps included, as Kafka counts)
    update: ShareUpdate | None  # durable change to write before answering, if any


class AcknowledgeResult(NamedTuple):
    error_code: int  # ErrorCode.NONE, INVALID_REQUEST or INVALID_RECORD_STATE
    update: ShareUpdate | None


class ResetResult(NamedTuple):
    error_code: int  # ErrorCode.NONE or NON_EMPTY_GROUP
    snapshot: ShareSnapshot | None  # on success: write as a new snapshot (replaces all state)
    update: ShareUpdate | None  # on refusal: lock expiries processed on the way, if any


class InFlightRange(NamedTuple):
    """Introspection view of one state range (for tests, metrics and describe calls)."""

    first_offset: int
    last_offset: int
    state: RecordState
    delivery_count: int
    member_id: str | None
    deadline_ms: int | None
    available_at_ms: int | None = None  # Available, in its redelivery backoff until then
    waits_for_key: bool = False  # Available, behind an unfinished earlier record of its key
