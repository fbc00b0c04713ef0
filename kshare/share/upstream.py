"""The proxy's own view of and connections to the fronted cluster, for serving share groups.

Share fetches are served from ordinary Fetch requests the proxy sends to each partition's
leader on its own connections (one pipelined connection per broker), and SPSOs are initialised
with ListOffsets. Topic metadata (ids, partition counts, leaders) is refreshed periodically and
whenever a request meets a leadership error.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from ..clients.connection import ConnectionClosed, KafkaConnection
from ..protocol import messages
from ..protocol.codes import ApiKey
from ..proxy.rewrite import ZERO_UUID, synthetic_topic_id
from ..security import ClientSecurity
from .errors import ErrorCode
from .records import split_batches
from .tasks import shared_task
from .upstream_checks import UpstreamChecks

log = logging.getLogger("kshare.share")

EARLIEST, LATEST = -2, -1

# Fetch errors after which the leader may have moved
_STALE_METADATA = {ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.FENCED_LEADER_EPOCH,
                   ErrorCode.UNKNOWN_LEADER_EPOCH, ErrorCode.UNKNOWN_TOPIC_ID, ErrorCode.INCONSISTENT_TOPIC_ID}
# Errors of kshare's own reads that a cluster answers while a leader moves or a broker restarts:
# a share fetch gets no records from that partition this time (the next one reads from the new
# leader), never the error: it is kshare's business, not the client's (librdkafka fails a poll on
# NETWORK_EXCEPTION), and Kafka's own share-partition leader never answers a ShareFetch with it.
TRANSIENT = frozenset({ErrorCode.LEADER_NOT_AVAILABLE, ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.REQUEST_TIMED_OUT,
                       ErrorCode.NETWORK_EXCEPTION, ErrorCode.NOT_ENOUGH_REPLICAS, ErrorCode.KAFKA_STORAGE_ERROR,
                       ErrorCode.FENCED_LEADER_EPOCH, ErrorCode.UNKNOWN_LEADER_EPOCH})
OFFSET_OUT_OF_RANGE = ErrorCode.OFFSET_OUT_OF_RANGE  # under this name for handlers.share_fetch


@dataclass(slots=True)
class TopicInfo:
    name: str
    topic_id: bytes
    leaders: list[int]  # partition -> leader node id (-1 unknown)
    has_real_id: bool = True  # False: synthesized for a cluster without topic ids

    @property
    def partitions(self) -> int:
        return len(self.leaders)


@dataclass(slots=True)
class FetchResult:
    error_code: int
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    aborted: list[tuple[int, int]] = field(default_factory=list)  # (producer id, first offset)
    records: memoryview | None = None


class UpstreamCluster:
    """Metadata and per-broker connections to the real cluster."""

    def __init__(self, bootstrap: list[tuple[str, int]], client_id: str = "kshare-share",
                 security: ClientSecurity | None = None) -> None:
        self.bootstrap = bootstrap
        self.client_id = client_id
        self.security = security or ClientSecurity()
        self.brokers: dict[int, tuple[str, int]] = {}
        self.topics: dict[str, TopicInfo] = {}
        self.by_id: dict[bytes, TopicInfo] = {}
        # (node id, lane) -> connection. Lane "" carries short requests; a long-polling Fetch gets a
        # lane of its own, since a broker answers one connection's requests strictly in order.
        self._conns: dict[tuple[int, str], KafkaConnection] = {}
        self._connecting: dict[tuple[int, str], asyncio.Task] = {}
        self._meta_lock = asyncio.Lock()
        self._bootstrap_conn: KafkaConnection | None = None
        self.metadata_at = 0.0
        # ids of topics known deleted (forget_topics): a metadata answer a broker gives before it
        # has applied the deletion does not bring them back (a topic created again has a new id)
        self._deleted_ids: set[bytes] = set()
        self.checks = UpstreamChecks()  # what this cluster does differently from Kafka (upstream_checks)

    @property
    def bootstrap_string(self) -> str:
        return ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self.bootstrap)

    # -- connections ----------------------------------------------------------------------------------
    async def connection(self, node_id: int, lane: str = "") -> KafkaConnection:
        key = (node_id, lane)
        conn = self._conns.get(key)
        if conn is not None and not conn.closed:
            return conn
        task = self._connecting.get(key)
        if task is None:
            if node_id not in self.brokers:
                await self.refresh_metadata()
            if node_id not in self.brokers:
                raise ConnectionClosed(f"broker {node_id} is not in the cluster metadata")
            host, port = self.brokers[node_id]
            task = shared_task(KafkaConnection.open(host, port, self.client_id, security=self.security))
            self._connecting[key] = task
        try:
            conn = await asyncio.shield(task)
        finally:
            if self._connecting.get(key) is task and task.done():
                del self._connecting[key]
        self._conns[key] = conn
        return conn

    async def any_connection(self) -> KafkaConnection:
        for node_id in list(self.brokers):
            try:
                return await self.connection(node_id)
            except (OSError, ConnectionError, TimeoutError):
                continue
        last: Exception | None = None
        if self._bootstrap_conn is not None and not self._bootstrap_conn.closed:
            return self._bootstrap_conn
        for host, port in self.bootstrap:
            try:
                self._bootstrap_conn = await KafkaConnection.open(host, port, self.client_id, security=self.security)
                return self._bootstrap_conn
            except (OSError, ConnectionError, TimeoutError) as exc:
                last = exc
        raise ConnectionClosed(f"no broker of the cluster is reachable: {last!r}")

    async def close(self) -> None:
        for conn in self._conns.values():
            await conn.close()
        self._conns.clear()
        if self._bootstrap_conn is not None:
            await self._bootstrap_conn.close()

    # -- metadata -------------------------------------------------------------------------------------
    async def refresh_metadata(self, max_age: float = 0.0) -> None:
        if max_age and time.monotonic() - self.metadata_at < max_age:
            return
        async with self._meta_lock:
            if max_age and time.monotonic() - self.metadata_at < max_age:
                return
            conn = await self.any_connection()
            version = conn.best_version(ApiKey.METADATA)
            req = messages.message_class("MetadataRequest")(topics=None if version >= 1 else [],
                                                           allow_auto_topic_creation=False)
            resp = await conn.request(ApiKey.METADATA, version, req)
            self.brokers = {b.node_id: (b.host, b.port) for b in resp.brokers}
            topics: dict[str, TopicInfo] = {}
            for t in resp.topics:
                if t.error_code != 0 or not t.name:
                    continue
                real = version >= 10 and t.topic_id != ZERO_UUID
                topic_id = t.topic_id if real else synthetic_topic_id(t.name)
                if real and topic_id in self._deleted_ids:
                    continue
                leaders = [-1] * len(t.partitions)
                for p in t.partitions:
                    if 0 <= p.partition_index < len(leaders):
                        leaders[p.partition_index] = p.leader_id
                topics[t.name] = TopicInfo(t.name, topic_id, leaders, real)
            self.topics = topics
            self.by_id = {t.topic_id: t for t in topics.values()}
            self.metadata_at = time.monotonic()
            for key in [k for k in self._conns if k[0] not in self.brokers]:
                await self._conns.pop(key).close()

    def forget_topics(self, deleted: list[tuple[str | None, bytes | None]]) -> list[TopicInfo]:
        """Topics deleted (name, topic id; either may be None), as a DeleteTopics answer said:
        gone from the metadata at once. Returns the topics forgotten."""
        gone = []
        for name, topic_id in deleted:
            info = self.by_id.get(topic_id) if topic_id is not None else self.topics.get(name or "")
            if info is None:
                continue
            gone.append(info)
            self.topics.pop(info.name, None)
            self.by_id.pop(info.topic_id, None)
            if info.has_real_id:
                if len(self._deleted_ids) >= 100_000:
                    self._deleted_ids.clear()  # bounded; ids of deletions long applied everywhere
                self._deleted_ids.add(info.topic_id)
        return gone

    def topic_view(self) -> dict[str, tuple[bytes, int]]:
        return {name: (t.topic_id, t.partitions) for name, t in self.topics.items()}

    async def leader(self, topic: TopicInfo, partition: int) -> int:
        if not self.metadata_at:  # a leader moved or a broker went away: ask before going on
            await self.refresh_metadata(max_age=0.5)
        topic = self.topics.get(topic.name, topic)  # callers keep the TopicInfo of an older refresh
        leader = topic.leaders[partition] if partition < topic.partitions else -1
        if leader < 0:
            await self.refresh_metadata(max_age=0.5)
            fresh = self.topics.get(topic.name)
            leader = fresh.leaders[partition] if fresh and partition < fresh.partitions else -1
        return leader

    # -- data -----------------------------------------------------------------------------------------
    async def fetch(self, topic: TopicInfo, partition: int, offset: int, *, max_bytes: int = 1 << 20,
                    max_wait_ms: int = 0, read_committed: bool = False, lane: str = "") -> FetchResult:
        """One partition from its leader (error codes as Kafka returns them)."""
        try:
            leader = await self.leader(topic, partition)
            if leader < 0:
                return FetchResult(ErrorCode.LEADER_NOT_AVAILABLE)
            conn = await self.connection(leader, lane)
            # v4+ for isolation and the LSO; v13+ names topics by id (some brokers, e.g. Tansu, only
            # find topics that way); v16+ would only add NodeEndpoints.
            version = conn.best_version(ApiKey.FETCH, lo=4, hi=15)
            if version >= 13 and not topic.has_real_id:
                version = 12
            cls = messages.message_class("FetchRequest")
            part = cls.FetchPartition(partition=partition, fetch_offset=offset, partition_max_bytes=max_bytes,
                                      log_start_offset=-1, current_leader_epoch=-1, last_fetched_epoch=-1)
            fetch_topic = (cls.FetchTopic(topic_id=topic.topic_id, partitions=[part]) if version >= 13
                           else cls.FetchTopic(topic=topic.name, partitions=[part]))
            # at least 1 ms: Tansu answers a Fetch with MaxWaitMs 0 with no partitions at all
            req = cls(replica_id=-1, max_wait_ms=max(max_wait_ms, 1), min_bytes=1, max_bytes=max_bytes,
                      isolation_level=1 if read_committed else 0, session_id=0, session_epoch=-1,
                      topics=[fetch_topic], rack_id="")
            resp = await conn.request(ApiKey.FETCH, version, req)
        except (OSError, ConnectionError, TimeoutError) as exc:
            log.debug("fetch %s-%d from the cluster failed: %r", topic.name, partition, exc)
            self.metadata_at = 0.0  # the broker may be gone: its partitions' new leaders are asked for
            return FetchResult(ErrorCode.NETWORK_EXCEPTION)
        if resp.error_code:
            return FetchResult(resp.error_code)
        for t in resp.responses:
            for p in t.partitions:
                if p.partition_index != partition:
                    continue
                if p.error_code in _STALE_METADATA:
                    self.metadata_at = 0.0
                aborted = [(a.producer_id, a.first_offset) for a in (p.aborted_transactions or ())]
                return FetchResult(p.error_code, p.high_watermark, p.last_stable_offset, p.log_start_offset,
                                   aborted, p.records)
        return FetchResult(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)

    async def list_offset(self, topic: TopicInfo, partition: int, timestamp: int) -> tuple[int, int]:
        """(error code, offset) for EARLIEST, LATEST or a timestamp (first offset at or after it)."""
        try:
            leader = await self.leader(topic, partition)
            if leader < 0:
                return ErrorCode.LEADER_NOT_AVAILABLE, -1
            conn = await self.connection(leader)
            version = conn.best_version(ApiKey.LIST_OFFSETS, lo=1, hi=7)
            cls = messages.message_class("ListOffsetsRequest")
            req = cls(replica_id=-1, isolation_level=0, topics=[cls.ListOffsetsTopic(
                name=topic.name, partitions=[cls.ListOffsetsPartition(partition_index=partition, timestamp=timestamp,
                                                                       current_leader_epoch=-1)])])
            resp = await conn.request(ApiKey.LIST_OFFSETS, version, req)
        except (OSError, ConnectionError, TimeoutError) as exc:
            log.debug("list offsets %s-%d failed: %r", topic.name, partition, exc)
            self.metadata_at = 0.0
            return ErrorCode.NETWORK_EXCEPTION, -1
        for t in resp.topics:
            for p in t.partitions:
                if p.partition_index == partition:
                    if p.error_code in _STALE_METADATA:
                        self.metadata_at = 0.0
                    if timestamp == LATEST and not p.error_code and self.checks.short_end_offsets:
                        return p.error_code, await self.end_from_batches(topic, partition, p.offset)
                    return p.error_code, p.offset
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1

    async def end_from_batches(self, topic: TopicInfo, partition: int, reported: int, steps: int = 8) -> int:
        """The partition's end offset, on a cluster that answers one short of its last batch's records
        (``checks.short_end_offsets``): the end of the batches found from ``reported - 1`` on.

        Tansu answers the last batch's base offset + 1; reading from there returns that batch whole,
        and its last offset + 1 is the end. A Fetch that fails leaves the cluster's answer as it was.
        """
        end = reported
        for _ in range(steps):
            if end <= 0:
                break
            # a wait, not 0: Tansu answers empty when it has not found the data within MaxWaitMs (the
            # record at end - 1 exists, so Kafka answers at once)
            res = await self.fetch(topic, partition, end - 1, max_bytes=64 << 10, max_wait_ms=500)
            batches = split_batches(res.records) if not res.error_code and res.records is not None else []
            if not batches or batches[-1].last_offset + 1 <= end:
                break
            end = batches[-1].last_offset + 1
        if end != reported:
            self.checks.end_offset_corrections += 1
        return end
