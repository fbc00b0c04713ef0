"""ListOffsets (API key 2), answered here only on a cluster whose end offsets fall short of its records.

On such a cluster (``upstream.checks.short_end_offsets``: Tansu answers its last batch's base
offset + 1) a client asking for LATEST would plan from a wrong end: a consumer group reset to
latest re-reads old records, ``kshare groups --reset-offsets --to-latest`` plans too low, lag reads
low. The request goes to the cluster on the client's own connection (its ACLs decide, as without
kshare), and each LATEST answer is corrected from the batches kshare reads at that offset. On
Kafka itself this handler never applies: ListOffsets is forwarded untouched.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from ...protocol.codes import ApiKey
from ..upstream import LATEST

if TYPE_CHECKING:
    from ...proxy.connection import ClientConnection
    from ..service import ShareGroupService

API_KEY = ApiKey.LIST_OFFSETS
VERSIONS = (1, 10)  # v0 (offset arrays) is forwarded as it is


def applies(service: ShareGroupService, header: Any, req: Any) -> bool:
    return service.upstream.checks.short_end_offsets and any(
        p.timestamp == LATEST for t in req.topics for p in t.partitions)


async def handle(service: ShareGroupService, conn: ClientConnection, header: Any, req: Any) -> tuple[int, Any]:
    version = header.api_version
    resp = await conn.probe(API_KEY, version, req)
    latest = {(t.name, p.partition_index) for t in req.topics for p in t.partitions if p.timestamp == LATEST}
    if any(t.name not in service.upstream.topics for t in resp.topics):
        await service.upstream.refresh_metadata()  # a topic created a moment ago
    fixes = []
    for t in resp.topics:
        topic = service.upstream.topics.get(t.name)
        if topic is None:
            continue
        for p in t.partitions:
            if not p.error_code and p.offset >= 0 and (t.name, p.partition_index) in latest:
                fixes.append(_correct(service, topic, p))
    await asyncio.gather(*fixes)
    return version, resp


async def _correct(service: ShareGroupService, topic: Any, answer: Any) -> None:
    answer.offset = await service.upstream.end_from_batches(topic, answer.partition_index, answer.offset)
