"""What the fronted cluster does differently from Apache Kafka, found out when kshare connects.

kshare relies on a few behaviours of the cluster it fronts. Kafka-compatible brokers do not all
have them (the embedded Tansu broker lacks three), and a missing one must never turn into a quiet
stall or a wrong number. Each deviation found is logged once, in one WARNING line that says what
the cluster does and what kshare does about it, and shows on ``/metrics`` as
``kshare_upstream_deviation{check=...} 1``:

=======================  ===================================================  ==============================
check                    how it is found                                      what kshare does
=======================  ===================================================  ==============================
``end_offsets``          a batch of 3 records written to ``__kshare_probe``,  reads the last batch to correct
                         then ListOffsets LATEST                              every end offset it uses or
                                                                              answers (``latest``, lag,
                                                                              ListOffsets through the proxy,
                                                                              the state topic's replay)
``offset_commit_         an offset committed with metadata to the group       nothing in the proxy; the Spark
metadata``               ``__kshare_probe`` and read back                     source refuses such a cluster
``producer_ids``         InitProducerId as idempotent producers send it       state writes: acks=all without
                         (the state store's own check)                        idempotence
``delete_records``       DeleteRecords of nothing on the state topic          the state topic is not pruned
=======================  ===================================================  ==============================

The probe topic holds nothing for long: its records are deleted after each check (where
DeleteRecords works) and it keeps them one hour at most.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..addresses import parse_hostports
from ..clients.connection import KafkaConnection
from ..protocol import messages
from ..protocol.codes import ApiKey, ErrorCode
from ..security import ClientSecurity

log = logging.getLogger("kshare.upstream")

PROBE_TOPIC = "__kshare_probe"
PROBE_GROUP = "__kshare_probe"
_PROBE_METADATA = "kshare-probe"
_PROBE_RETENTION_MS = 3_600_000

CHECKS = ("end_offsets", "offset_commit_metadata", "producer_ids", "delete_records")


@dataclass
class UpstreamChecks:
    """The deviations found so far: check name -> what the cluster does (and kshare about it)."""

    deviations: dict[str, str] = field(default_factory=dict)
    end_offset_corrections: int = 0  # end offsets kshare corrected from the batches it read

    @property
    def short_end_offsets(self) -> bool:
        return "end_offsets" in self.deviations

    def found(self, check: str, what: str, remedy: str) -> None:
        """Record a deviation; the first time, one WARNING line."""
        assert check in CHECKS, check
        if check in self.deviations:
            return
        self.deviations[check] = what
        log.warning("the cluster %s: %s", what, remedy)


END_OFFSETS_REMEDY = ("kshare reads the last batch to correct the end offsets it uses and answers (share groups "
                      "starting at latest, lag, ListOffsets through the proxy)")


async def check_upstream(bootstrap: str, security: ClientSecurity, checks: UpstreamChecks,
                         timeout: float = 15.0) -> None:
    """Probe end offsets and offset-commit metadata through ``__kshare_probe`` (see the module's table).

    A cluster that will not let kshare create or write the probe topic (ACLs) is not probed: one
    INFO line says so (the record cache still takes a fetch's records past its high watermark as
    the end, whatever the cluster).
    """
    # aiokafka loads only when the cluster is probed (a proxy without share groups never needs it)
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic, RecordsToDelete
    from aiokafka.errors import KafkaError, TopicAlreadyExistsError
    from aiokafka.structs import OffsetAndMetadata

    conf = {"bootstrap_servers": bootstrap, "client_id": "kshare-probe", **security.aiokafka_kwargs()}
    admin = AIOKafkaAdminClient(request_timeout_ms=int(timeout * 1000), **conf)
    # acks=all: the answer comes once the high watermark includes the batch (with acks=1 a cluster
    # of several brokers answers end offsets short of it until its followers caught up)
    producer = AIOKafkaProducer(acks="all", enable_idempotence=False, linger_ms=0,
                                request_timeout_ms=int(timeout * 1000), **conf)
    consumer = AIOKafkaConsumer(group_id=PROBE_GROUP, enable_auto_commit=False,
                                request_timeout_ms=int(timeout * 1000), **conf)
    tp = TopicPartition(PROBE_TOPIC, 0)
    step = "connecting"
    # The clients retry through what a cluster just started answers (no leader yet, no group
    # coordinator yet), logging each retry at WARNING or ERROR: quiet while the probe runs (nothing
    # else of kshare's uses aiokafka before the share state loads). The probe reports what failed.
    aiokafka_log = logging.getLogger("aiokafka")
    level = aiokafka_log.level
    aiokafka_log.setLevel(logging.CRITICAL)
    try:
        async with asyncio.timeout(timeout * 2):
            await admin.start()
            step = f"creating the topic {PROBE_TOPIC}"
            brokers = len((await admin.describe_cluster())["brokers"])
            try:
                await admin.create_topics([NewTopic(PROBE_TOPIC, 1, min(3, max(1, brokers)),
                                                    topic_configs={"retention.ms": str(_PROBE_RETENTION_MS)})])
            except TopicAlreadyExistsError:
                pass
            step = f"writing to {PROBE_TOPIC}"
            await producer.start()
            batch = producer.create_batch()
            for i in range(3):
                batch.append(key=None, value=b"kshare probe %d" % i, timestamp=None)
            batch.close()
            sent = await producer.send_batch(batch, PROBE_TOPIC, partition=0)
            base = (await sent).offset
            step = "reading end offsets"
            await consumer.start()
            consumer.assign([tp])
            end = (await consumer.end_offsets([tp]))[tp]
            if end < base + 3:
                checks.found("end_offsets", f"answers end offset {end} after a batch of 3 records at offsets "
                                            f"{base}-{base + 2} (it should be {base + 3})", END_OFFSETS_REMEDY)
            step = "committing an offset with metadata"
            await consumer.commit({tp: OffsetAndMetadata(base, _PROBE_METADATA)})
            got = (await admin.list_consumer_group_offsets(PROBE_GROUP, partitions=[tp])).get(tp)
            if got is None or got.metadata != _PROBE_METADATA:
                seen = "nothing" if got is None else repr(got.metadata)
                checks.found("offset_commit_metadata",
                             f"drops offset-commit metadata (committed {_PROBE_METADATA!r}, read back {seen})",
                             "nothing kshare's proxy needs; the kshare Spark source refuses this cluster")
            try:  # the probe's records are not kept (a cluster without DeleteRecords: for an hour)
                await admin.delete_records({tp: RecordsToDelete(base + 3)}, timeout_ms=int(timeout * 1000))
            except (KafkaError, OSError) as exc:
                log.debug("deleting the probe's records from %s failed: %r", PROBE_TOPIC, exc)
    except (KafkaError, OSError, TimeoutError) as exc:
        log.info("could not check the cluster for known deviations (%s: %r); carrying on", step, exc)
    finally:
        for client in (consumer, producer, admin):
            with contextlib.suppress(Exception):  # closing after a failure
                await (client.stop() if hasattr(client, "stop") else client.close())
        aiokafka_log.setLevel(level)



async def cluster_refusals(bootstrap_servers: str | Sequence[str], topic: str,
                            security: ClientSecurity | None = None) -> tuple[str | None, str | None]:
    """What the cluster will not do for the state store: (idempotent producer ids, DeleteRecords).

    Each is None when the cluster does it (or cannot be asked), else why not, so that the store
    chooses its fallback before it starts instead of through failures logged later:

    * an idempotent producer's id, asked exactly as aiokafka's producer does (InitProducerId v0,
      no transactional id): Tansu answers v0-v2 with UNKNOWN_SERVER_ERROR;
    * DeleteRecords of nothing (below offset 0 of the state topic's partition 0): any answer,
      even an error for the partition, means it is served; Tansu lists it and closes the connection.
    """
    servers = bootstrap_servers if isinstance(bootstrap_servers, str) else ",".join(bootstrap_servers)
    for host, port in parse_hostports(servers):
        try:
            conn = await KafkaConnection.open(host, port, "kshare-state-probe", security=security)
        except (OSError, ConnectionError, TimeoutError):
            continue
        producer_ids = delete_records = None
        try:
            if ApiKey.INIT_PRODUCER_ID not in conn.versions:
                producer_ids = "does not support InitProducerId (idempotent producers)"
            else:
                request = messages.message_class("InitProducerIdRequest")(
                    transactional_id=None, transaction_timeout_ms=60000, producer_id=-1, producer_epoch=-1)
                resp = await asyncio.wait_for(conn.request(ApiKey.INIT_PRODUCER_ID, 0, request), 10)
                # only a refusal counts: a broker just started answers COORDINATOR_LOAD_IN_PROGRESS
                # or the like for a while, which the producer retries through
                if resp.error_code in (ErrorCode.UNKNOWN_SERVER_ERROR, ErrorCode.UNSUPPORTED_VERSION):
                    producer_ids = (f"refuses InitProducerId v0 (error code {resp.error_code}), which idempotent "
                                    "producers send")
            if ApiKey.DELETE_RECORDS not in conn.versions:
                delete_records = "does not support DeleteRecords"
            else:
                req = messages.message_class("DeleteRecordsRequest")
                body = req(timeout_ms=10000, topics=[req.DeleteRecordsTopic(
                    name=topic, partitions=[req.DeleteRecordsPartition(partition_index=0, offset=0)])])
                try:
                    await asyncio.wait_for(conn.request(ApiKey.DELETE_RECORDS, conn.best_version(ApiKey.DELETE_RECORDS), body), 10)
                except ConnectionError:
                    delete_records = "closes the connection on DeleteRecords"
        except (OSError, ConnectionError, TimeoutError):
            pass  # cannot tell: let the clients find out
        finally:
            await conn.close()
        return producer_ids, delete_records
    return None, None
