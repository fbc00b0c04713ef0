"""A pytest plugin that breaks the instance group's fencing, to show the zombie tests catch it.

Never loaded by default. ``KSHARE_TEST_FENCING_DISABLED=skip-claim`` (a claim is InitProducerId
only, no claim record: the leader learns the new epoch only at the new owner's first write) or
``=fresh-pid`` (each claim gets a producer id of its own, without the transactional id: nobody
is fenced), then::

    KSHARE_TEST_FENCING_DISABLED=skip-claim .venv/bin/pytest -p tests.harness.fencing_disabled \\
        tests/integration/test_instance_group.py -k "fences or zombie_with"

Every test selected there must fail (docs/design/scale-out.md, Fencing).
"""

from __future__ import annotations

import os

from kshare.protocol import messages
from kshare.protocol.codes import ApiKey
from kshare.share.state import fence
from kshare.share.state.pipelined_producer import PipelinedProducer

MODE = os.environ.get("KSHARE_TEST_FENCING_DISABLED", "")
_init_producer_id = fence.init_producer_id


async def _fresh_producer_id(bootstrap, transactional_id, *, timeout_s, security=None, client_id="kshare-state",
                             expected=None) -> tuple[int, int]:
    conn = await PipelinedProducer(bootstrap, "-", request_timeout_s=timeout_s, security=security)._bootstrap()
    try:
        Req = messages.message_class("InitProducerIdRequest")
        api = ApiKey.INIT_PRODUCER_ID.value
        resp = await conn.request(api, conn.best_version(api, hi=4), Req(
            transactional_id=None, transaction_timeout_ms=60_000, producer_id=-1, producer_epoch=-1))
        return resp.producer_id, resp.producer_epoch
    finally:
        await conn.close()


async def _claim_without_record(self: fence.PartitionClaim, expected: tuple[int, int] | None) -> None:
    pid, epoch = await _init_producer_id(self.bootstrap, self.transactional_id, timeout_s=self.timeout_s,
                                         security=self.security, client_id=self.client_id, expected=expected)
    self.producer.assign(self.partition, pid, epoch)
    self.producer_id, self.producer_epoch = pid, epoch
    self.claimed_at = self.clock()
    self.needs_renewal = False


if MODE == "skip-claim":
    fence.PartitionClaim._claim = _claim_without_record  # type: ignore[method-assign]
elif MODE == "fresh-pid":
    fence.init_producer_id = _fresh_producer_id  # type: ignore[assignment]
elif MODE:
    raise ValueError(f"KSHARE_TEST_FENCING_DISABLED={MODE}: skip-claim or fresh-pid")
