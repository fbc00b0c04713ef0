"""The one list of what the proxy does to each API besides forwarding it untouched.

Every request is forwarded to the broker behind the listener it arrived on, as opaque bytes with
only its header read, unless it appears here:

* ``RESPONSE_FILTERS``: forwarded, but the response is decoded and rewritten (broker addresses,
  topic ids, advertised versions) or only read (the topics DeleteTopics deleted). ``from_version``
  skips versions that carry nothing to rewrite.
* served APIs: answered by the proxy itself; handlers register through ``Proxy.serve`` (the
  share-group APIs), and ApiVersions requests newer than the proxy knows get the
  UNSUPPORTED_VERSION fallback locally.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import rewrite

PRODUCE = 0
FETCH = 1
METADATA = 3
FIND_COORDINATOR = 10
DELETE_TOPICS = 20
API_VERSIONS = 18
DESCRIBE_CLUSTER = 60

# Fetch requests newer than this are sent to the broker as this version, and so are
# non-transactional Produce requests (see ClientConnection._start_frames).
FETCH_SERVED_AS = 15
PRODUCE_SERVED_AS = 9


@dataclass(frozen=True, slots=True)
class ResponseFilter:
    rewrite: Callable[..., Any]
    from_version: int = 0
    # Decode-and-check before paying for a re-encode (Fetch responses are large and rarely carry
    # anything to rewrite).
    applies: Callable[[Any], bool] | None = None
    # The rewrite needs the request too (given as a fourth argument). Such requests are decoded
    # before they are forwarded, in an instance group only (where the answer depends on them).
    reads_request: bool = False


RESPONSE_FILTERS: dict[int, ResponseFilter] = {
    METADATA: ResponseFilter(rewrite.rewrite_metadata),
    FIND_COORDINATOR: ResponseFilter(rewrite.rewrite_find_coordinator, reads_request=True),
    DESCRIBE_CLUSTER: ResponseFilter(rewrite.rewrite_describe_cluster),
    # Non-transactional Produce v10+ is asked as v9 (no NodeEndpoints); transactional ones keep
    # their version and have their NodeEndpoints rewritten.
    PRODUCE: ResponseFilter(rewrite.rewrite_node_endpoints, 10, rewrite.needs_node_endpoint_rewrite),
    # Fetch v16+ never reaches the broker (it is asked as v15), so its responses carry no
    # NodeEndpoints; the filter stays for a broker that sends them anyway.
    FETCH: ResponseFilter(rewrite.rewrite_node_endpoints, 16, rewrite.needs_node_endpoint_rewrite),
    API_VERSIONS: ResponseFilter(rewrite.rewrite_api_versions),
    # not rewritten: read for the topics deleted (the share layer forgets them at once)
    DELETE_TOPICS: ResponseFilter(rewrite.note_deleted_topics),
}


def reads_request(api_key: int) -> bool:
    f = RESPONSE_FILTERS.get(api_key)
    return f is not None and f.reads_request


def response_filter(api_key: int, version: int) -> ResponseFilter | None:
    f = RESPONSE_FILTERS.get(api_key)
    if f is None or version < f.from_version:
        return None
    return f
