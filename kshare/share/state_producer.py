"""The old import path of :mod:`kshare.share.state.pipelined_producer` (the state topic's pipelined producer), for code not moved yet."""

from .state.pipelined_producer import (
    INIT_PRODUCER_ID,
    LIST_OFFSETS,
    MAX_BATCH_BYTES,
    MAX_REQUEST_BYTES,
    METADATA,
    PRODUCE,
    RETRY_FIRST_S,
    RETRY_MAX_S,
    PipelinedProducer,
    RecordMetadata,
    StateProduceError,
)

__all__ = [
    "INIT_PRODUCER_ID",
    "LIST_OFFSETS",
    "MAX_BATCH_BYTES",
    "MAX_REQUEST_BYTES",
    "METADATA",
    "PRODUCE",
    "PipelinedProducer",
    "RETRY_FIRST_S",
    "RETRY_MAX_S",
    "RecordMetadata",
    "StateProduceError",
]
