"""The one table of what the proxy does to each API besides forwarding it untouched.

Every request is forwarded to the broker behind the listener it arrived on, as opaque bytes with
only its header read, unless its API key is in ``INTERCEPTIONS``. An entry says, for its API:

* ``downgrade``: the request is asked of the broker at a lower version (its header rewritten in
  place, nothing else), so that the response streams back undecoded;
* ``served``: kshare answers it itself (all of its requests, or with ``some`` only those the
  handler's ``applies`` accepts, the rest forwarded). The handlers register through
  ``Proxy.serve``, which refuses an API not declared here; the share layer registers its own
  (the proxy does not import it), and ``by`` names the handler;
* ``response``: forwarded, but the response is decoded and rewritten (broker addresses, topic
  ids, advertised versions) or only read (``only_reads``: the topics DeleteTopics deleted,
  CreateTopics created, CreatePartitions grew; the client gets the broker's bytes). ``from_version``
  skips versions that carry nothing to rewrite.

Forwarded untouched but read: every request's header (API key, version, correlation id), a
Produce request's ``acks`` (acks=0 gets no response) and the SASL APIs (a connection
authenticated upstream cannot be moved to another broker).

Outside the table, as Kafka does: a frame no request can be (``frames.RequestFramer``) or a version
neither the cluster nor, for an API in this table, the proxy's codec supports
(``Proxy.check_forwardable``) closes the connection; while the cluster cannot be reached, a
client's ApiVersions is answered BROKER_NOT_AVAILABLE (``ClientConnection._answer_unreachable``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..protocol import messages
from ..protocol.codes import ApiKey
from . import rewrite

# The table's API keys as plain ints: the frame path compares a request's key with them, where an
# enum member's lookup would cost ~0.1 us per request (kshare.protocol.codes).
PRODUCE = ApiKey.PRODUCE.value
FETCH = ApiKey.FETCH.value
LIST_OFFSETS = ApiKey.LIST_OFFSETS.value
METADATA = ApiKey.METADATA.value
FIND_COORDINATOR = ApiKey.FIND_COORDINATOR.value
JOIN_GROUP = ApiKey.JOIN_GROUP.value
LIST_GROUPS = ApiKey.LIST_GROUPS.value
SASL_HANDSHAKE = ApiKey.SASL_HANDSHAKE.value
API_VERSIONS = ApiKey.API_VERSIONS.value
CREATE_TOPICS = ApiKey.CREATE_TOPICS.value
DELETE_TOPICS = ApiKey.DELETE_TOPICS.value
DESCRIBE_CONFIGS = ApiKey.DESCRIBE_CONFIGS.value
SASL_AUTHENTICATE = ApiKey.SASL_AUTHENTICATE.value
DELETE_GROUPS = ApiKey.DELETE_GROUPS.value
INCREMENTAL_ALTER_CONFIGS = ApiKey.INCREMENTAL_ALTER_CONFIGS.value
CREATE_PARTITIONS = ApiKey.CREATE_PARTITIONS.value
DESCRIBE_CLUSTER = ApiKey.DESCRIBE_CLUSTER.value
SHARE_GROUP_HEARTBEAT = ApiKey.SHARE_GROUP_HEARTBEAT.value
SHARE_GROUP_DESCRIBE = ApiKey.SHARE_GROUP_DESCRIBE.value
SHARE_FETCH = ApiKey.SHARE_FETCH.value
SHARE_ACKNOWLEDGE = ApiKey.SHARE_ACKNOWLEDGE.value
READ_SHARE_GROUP_STATE = ApiKey.READ_SHARE_GROUP_STATE.value
WRITE_SHARE_GROUP_STATE = ApiKey.WRITE_SHARE_GROUP_STATE.value
DELETE_SHARE_GROUP_STATE = ApiKey.DELETE_SHARE_GROUP_STATE.value
DESCRIBE_SHARE_GROUP_OFFSETS = ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS.value
ALTER_SHARE_GROUP_OFFSETS = ApiKey.ALTER_SHARE_GROUP_OFFSETS.value
DELETE_SHARE_GROUP_OFFSETS = ApiKey.DELETE_SHARE_GROUP_OFFSETS.value


@dataclass(frozen=True, slots=True)
class Downgrade:
    """Requests newer than ``version`` are sent to the broker as ``version``."""

    version: int
    keep_transactional: bool = False  # transactional requests keep their version


@dataclass(frozen=True, slots=True)
class Served:
    """Answered by kshare instead of the cluster."""

    by: str  # the handler (module or class) that answers; tests check it is the one registered
    some: bool = False  # only the requests the handler's ``applies`` accepts; the rest are forwarded
    newer_than_codec: bool = False  # only versions newer than the proxy's codec knows


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
    # The rewrite only reads the answer (e.g. the topics DeleteTopics deleted): the client gets
    # the broker's own bytes, not a re-encoding of what the codec's spec of the message covers.
    only_reads: bool = False


@dataclass(frozen=True, slots=True)
class Interception:
    downgrade: Downgrade | None = None
    served: Served | None = None
    response: ResponseFilter | None = None


_SHARE = "kshare.share.handlers."

INTERCEPTIONS: dict[int, Interception] = {
    PRODUCE: Interception(
        # Non-transactional Produce v10+ differs from v9 only by the leader hints of KIP-951 in the
        # response (and, for transactions alone, by KIP-890's error and implicit
        # AddPartitionsToTxn: those keep their version). Asked as v9, the broker's answer is also a
        # valid v10+ answer without them and streams through undecoded; the client learns a new
        # leader from NOT_LEADER_OR_FOLLOWER and a Metadata refresh. Transactional ones have their
        # NodeEndpoints rewritten.
        downgrade=Downgrade(9, keep_transactional=True),
        response=ResponseFilter(rewrite.rewrite_node_endpoints, 10, rewrite.needs_node_endpoint_rewrite),
    ),
    FETCH: Interception(
        # Fetch v16+ responses differ from v15 only by the new leaders' NodeEndpoints. Asking the
        # broker for v15 gives a body that is also a valid v16+ answer without them, so the
        # response streams through untouched (no buffering or decoding on the consume hot path)
        # and never carries a broker address. Kafka fills CurrentLeader as well only for v16+
        # (KafkaApis: versionId >= 16), so after a leader change the client learns the new leader
        # from NOT_LEADER_OR_FOLLOWER and a Metadata refresh, as before KIP-951
        # (tests/integration/test_passthrough.py::test_node_endpoints_point_at_proxy).
        downgrade=Downgrade(15),
        # never applies while the downgrade holds: kept for a broker that sends them anyway
        response=ResponseFilter(rewrite.rewrite_node_endpoints, 16, rewrite.needs_node_endpoint_rewrite),
    ),
    LIST_OFFSETS: Interception(served=Served(_SHARE + "list_offsets", some=True)),
    METADATA: Interception(response=ResponseFilter(rewrite.rewrite_metadata)),
    FIND_COORDINATOR: Interception(response=ResponseFilter(rewrite.rewrite_find_coordinator, reads_request=True)),
    JOIN_GROUP: Interception(served=Served(_SHARE + "join_group", some=True)),
    LIST_GROUPS: Interception(served=Served(_SHARE + "list_groups", some=True)),
    API_VERSIONS: Interception(
        # a client newer than the proxy's codec gets UNSUPPORTED_VERSION in v0, as from Kafka
        served=Served("kshare.proxy.server.Proxy.api_versions_fallback", newer_than_codec=True),
        response=ResponseFilter(rewrite.rewrite_api_versions),
    ),
    # not rewritten: read for the topics deleted (the share layer forgets them at once) and the
    # topics created or grown (it looks for their partitions at once, not at its next refresh)
    DELETE_TOPICS: Interception(response=ResponseFilter(rewrite.note_deleted_topics, only_reads=True)),
    CREATE_TOPICS: Interception(response=ResponseFilter(rewrite.note_created_topics, only_reads=True)),
    CREATE_PARTITIONS: Interception(response=ResponseFilter(rewrite.note_created_partitions, only_reads=True)),
    DESCRIBE_CONFIGS: Interception(served=Served(_SHARE + "group_configs.DescribeConfigs", some=True)),
    DELETE_GROUPS: Interception(served=Served(_SHARE + "delete_groups", some=True)),
    INCREMENTAL_ALTER_CONFIGS: Interception(
        served=Served(_SHARE + "group_configs.IncrementalAlterConfigs", some=True)),
    DESCRIBE_CLUSTER: Interception(response=ResponseFilter(rewrite.rewrite_describe_cluster)),
    SHARE_GROUP_HEARTBEAT: Interception(served=Served(_SHARE + "share_group_heartbeat")),
    SHARE_GROUP_DESCRIBE: Interception(served=Served(_SHARE + "share_group_describe")),
    SHARE_FETCH: Interception(served=Served(_SHARE + "share_fetch")),
    SHARE_ACKNOWLEDGE: Interception(served=Served(_SHARE + "share_acknowledge")),
    READ_SHARE_GROUP_STATE: Interception(served=Served(_SHARE + "share_state.ReadShareGroupState")),
    WRITE_SHARE_GROUP_STATE: Interception(served=Served(_SHARE + "share_state.WriteShareGroupState")),
    DELETE_SHARE_GROUP_STATE: Interception(served=Served(_SHARE + "share_state.DeleteShareGroupState")),
    DESCRIBE_SHARE_GROUP_OFFSETS: Interception(served=Served(_SHARE + "describe_share_group_offsets")),
    ALTER_SHARE_GROUP_OFFSETS: Interception(served=Served(_SHARE + "alter_share_group_offsets")),
    DELETE_SHARE_GROUP_OFFSETS: Interception(served=Served(_SHARE + "delete_share_group_offsets")),
}

# The table's columns, for the per-frame lookups of the connection code.
DOWNGRADES: dict[int, Downgrade] = {k: i.downgrade for k, i in INTERCEPTIONS.items() if i.downgrade is not None}
SERVED: dict[int, Served] = {k: i.served for k, i in INTERCEPTIONS.items() if i.served is not None}
RESPONSE_FILTERS: dict[int, ResponseFilter] = {
    k: i.response for k, i in INTERCEPTIONS.items() if i.response is not None}
_READS_REQUEST = frozenset(k for k, f in RESPONSE_FILTERS.items() if f.reads_request)

# The versions Fetch and non-transactional Produce requests are sent to the broker as.
FETCH_SERVED_AS = DOWNGRADES[FETCH].version
PRODUCE_SERVED_AS = DOWNGRADES[PRODUCE].version


def reads_request(api_key: int) -> bool:
    return api_key in _READS_REQUEST


def response_filter(api_key: int, version: int) -> ResponseFilter | None:
    f = RESPONSE_FILTERS.get(api_key)
    if f is None or version < f.from_version:
        return None
    return f


def api_name(key: int) -> str:
    """An API's name for log lines and reasons ("Fetch"), or "API <key>" for one the codec lacks."""
    a = messages.apis().get(key)
    return a.name if a else f"API {key}"
