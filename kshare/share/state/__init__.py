"""The state store: durable share-partition state on a topic of the fronted cluster.

The KIP-932 design (seed 001, ``docs/reference/state-format.md``): a ``delete``-policy topic with
unlimited retention holds ShareSnapshot records (the whole durable state of a share-partition) and
ShareUpdate records (deltas over the latest snapshot), keyed by (group, topic id, partition) so
that every record of a share-partition is in one partition, in write order.
:class:`~kshare.share.state.topic_store.TopicStateStore` (in :mod:`.topic_store`, an asyncio
shell over the parts below)

* **writes** through idempotent ``acks=all`` producers (:mod:`.producers`,
  :mod:`.pipelined_producer`). Callers append to a queue and await a future; the flusher sends
  everything pending that may go as one produce round and resolves the futures once every record
  of the round is acknowledged, so concurrent writes from many share-partitions and groups cost
  one round. Rounds overlap: a write arriving while a round is in flight is handed to the
  producer at once unless a round in flight touches the same share-partition or group, in which
  case it waits for that round to be settled (acknowledged, or failed and rolled back) and is
  then encoded on its result (:mod:`.rounds`, sans-I/O). So each share-partition's records are
  encoded, sent and settled strictly one round after the other, each round keeps its own undo,
  and a failed round can never have a later round of the same share-partition built on its
  unacknowledged state;
* **compacts** (:mod:`.memory`): it applies every write it makes to an in-memory copy of the
  durable state, counts updates and bytes per share-partition since its last snapshot and, past a
  threshold, writes a ShareSnapshot instead of the update. It also writes a snapshot whenever the
  snapshot is hardly bigger than the update (e.g. the SPSO moved and nothing is in flight), which
  is the common case and lets pruning follow the head of the log;
* **prunes** (:mod:`.prune`) with DeleteRecords every state-topic partition below the oldest
  record replay still needs: the latest acknowledged snapshot of every live share-partition and
  the latest group record of every group in that partition. Idle share-partitions whose snapshot
  lags far behind the end of their partition are re-snapshotted first so they do not pin the log
  forever;
* **recovers** (:mod:`.replay`) at start by reading every partition from its log start to the end
  offsets read at start and replaying: latest snapshot + later updates with the same snapshot
  epoch, group records, tombstones. Records it cannot decode are skipped, one logged error each.

An instance group's store (several proxies as one service) writes only the partitions it claimed,
each with the producer id and epoch of its claim, which fenced the previous owner (:mod:`.fence`,
:mod:`.claims`, :mod:`.claimed`). The record format is
:mod:`.codec`; the topic's creation and checks :mod:`.topic_admin`.

Failure semantics: a write returns only after the cluster acknowledged every record of the call
(``acks=all``), whatever other rounds are in flight. It raises ``StateWriteError``
(:mod:`.errors`) when that did not happen within ``write_timeout_s`` (the records may still land
later, in order). A write the cluster acknowledges within the window succeeds even across a broker
restart. After a failed write the in-memory state (and the caller's engine) is ahead of the topic,
so the next write of that share-partition is a full snapshot, which makes the topic whole again;
it is encoded only once the failed round was rolled back.

The submodules are imported one by one (nothing here): the record codec is needed without the
store's clients.
"""
