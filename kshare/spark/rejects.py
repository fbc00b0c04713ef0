"""``kshare.spark.reject``: poison records, named from the sink, are never delivered again.

Called inside ``foreachBatch`` before it returns, it adds the records' offsets to the share
group's rejects ledger (:mod:`kshare.spark.ledger`). Spark commits the stream reader's micro-batch
only after ``foreachBatch`` returned, so the ledger is written before the commit marker: the
workers holding the records read both, and REJECT what the ledger lists instead of ACCEPTing it.
"""

from __future__ import annotations

import asyncio
import logging
import operator
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from ..clients.admin import ShareGroupAdmin
from ..clients.settings import parse_bootstrap
from .commits import METADATA_DROPPED
from .ledger import (
    MAX_CHARS,
    TP,
    Entry,
    Ledger,
    LedgerFormatError,
    contains,
    encode,
    ledger_group,
    prune,
    to_ranges,
    union,
)
from .options import OptionError, Options, parse_client

log = logging.getLogger("kshare.spark")

COLUMNS = ("topic", "partition", "offset")
ATTEMPTS = 3  # read-merge-write rounds when another writer changes an entry under us


class RejectError(ValueError):
    """``kshare.spark.reject`` could not record the rejection (one line)."""


def reject(rows: Any, *, options: Mapping[str, Any] | None = None, bootstrap: str | None = None,
           group: str | None = None, **kafka_options: Any) -> int:
    """REJECT the records ``rows`` names once their micro-batch commits: they are archived (and go
    to the group's dead-letter topic, if one is configured), never delivered again.

    ``rows``: a DataFrame with ``topic``, ``partition`` and ``offset`` columns (only those are
    collected, on the driver) or an iterable of Rows, mappings or ``(topic, partition, offset)``
    tuples; rows of the micro-batch ``foreachBatch`` is processing. The cluster and share group:
    ``options`` (the dict given to the source) and/or ``bootstrap`` and ``group``;
    ``kafka_options`` are Kafka client properties (``_`` stands for ``.``). Returns the number of
    records rejected; raises :class:`RejectError` with one line when they cannot be recorded.

    ``reject(df)`` is an action: when ``df`` derives from the micro-batch and the sink runs another
    action, ``persist()`` first, or the source reads new records for it (docs/guide/spark.md)."""
    opts = _options(options, bootstrap, group, kafka_options)
    wanted = _offsets(rows)
    if not wanted:
        return 0
    with closing(Ledger(opts)) as ledger:
        starts: dict[TP, int] = {}
        for _ in range(ATTEMPTS):
            entries = _call("read", opts, ledger.read, wanted)
            if not starts and any(e.text for e in entries.values()):
                starts = _start_offsets(opts, list(wanted))  # prune what was settled since
            texts = {tp: _merged(tp, entries[tp], offsets, starts.get(tp, 0)) for tp, offsets in wanted.items()}
            _call("write", opts, ledger.write, {tp: Entry(entries[tp].version + 1, t) for tp, t in texts.items()})
            check = _call("read", opts, ledger.read, wanted)
            dropped = [tp for tp in wanted if check[tp].version == entries[tp].version + 1 and not check[tp].text]
            if dropped:  # our write landed (its version is there), without what it said
                t, p = dropped[0]
                raise RejectError("kshare.spark.reject: the cluster at " + opts.bootstrap + " " + METADATA_DROPPED.format(
                    what=f"the rejects ledger entry of {t}-{p} in group {ledger_group(opts.group)} read back empty"))
            lost = [tp for tp, offsets in wanted.items() if not _holds(check[tp], offsets, starts.get(tp, 0))]
            if not lost:
                n = sum(len(o) for o in wanted.values())
                log.info("kshare: rejected %d record(s) of group %s: %s", n, opts.group,
                         ", ".join(f"{t}-{p}" for t, p in sorted(wanted)))
                return n
            log.info("kshare: the rejects ledger of %s changed under this write (%s); merging again",
                     opts.group, lost)
    raise RejectError(f"kshare.spark.reject: the rejects ledger {ledger_group(opts.group)} kept changing "
                      f"under {ATTEMPTS} attempts (another query rejecting in the same share group?)")


def _options(options: Mapping[str, Any] | None, bootstrap: str | None, group: str | None,
             kafka_options: Mapping[str, Any]) -> Options:
    conf = {str(k).lower(): str(v) for k, v in (options or {}).items() if str(k).lower().startswith("kafka.")}
    for k, v in kafka_options.items():
        conf["kafka." + k.replace("_", ".").lower().removeprefix("kafka.")] = str(v)
    if bootstrap:
        conf["kafka.bootstrap.servers"] = bootstrap
    if group:
        conf["kafka.share.group.id"] = group
    for name, arg in (("kafka.bootstrap.servers", "bootstrap"), ("kafka.share.group.id", "group")):
        if not conf.get(name, "").strip():
            raise RejectError(f"kshare.spark.reject: no {arg} (pass {arg}=... or options={{'{name}': ...}})")
    try:
        return parse_client(conf)
    except OptionError as exc:
        raise RejectError(f"kshare.spark.reject: {exc}") from None


def _offsets(rows: Any) -> dict[TP, set[int]]:
    if hasattr(rows, "columns") and hasattr(rows, "select"):  # a Spark DataFrame
        missing = [c for c in COLUMNS if c not in rows.columns]
        if missing:
            raise RejectError(f"kshare.spark.reject: the rows have no {', '.join(missing)} column "
                              f"(they need topic, partition and offset, as the kshare source gives them)")
        rows = rows.select(*COLUMNS).collect()
    out: dict[TP, set[int]] = {}
    for row in rows:
        topic, partition, offset = _fields(row)
        out.setdefault((topic, partition), set()).add(offset)
    return out


def _fields(row: Any) -> tuple[str, int, int]:
    if hasattr(row, "asDict") and getattr(row, "__fields__", None):  # pyspark Row with names
        row = row.asDict()
    elif hasattr(row, "_asdict"):  # namedtuple
        row = row._asdict()
    if isinstance(row, Mapping):
        missing = [c for c in COLUMNS if c not in row]
        if missing:
            raise RejectError(f"kshare.spark.reject: a row has no {', '.join(missing)} "
                              f"(rows need topic, partition and offset)")
        values = tuple(row[c] for c in COLUMNS)
    elif isinstance(row, tuple | list) and len(row) == 3:
        values = tuple(row)
    else:
        raise RejectError(f"kshare.spark.reject: {type(row).__name__} is not a row with topic, partition and "
                          f"offset (a Row, a mapping or a (topic, partition, offset) tuple)")
    topic, partition, offset = values
    try:
        partition, offset = operator.index(partition), operator.index(offset)
    except TypeError:
        partition = offset = -1
    if not isinstance(topic, str) or not topic or partition < 0 or offset < 0:
        raise RejectError(f"kshare.spark.reject: ({topic!r}, {values[1]!r}, {values[2]!r}) is not a "
                          f"topic, partition and offset")
    return topic, partition, offset


def _merged(tp: TP, entry: Entry, offsets: set[int], start: int) -> str:
    try:
        old = entry.ranges
    except LedgerFormatError as exc:
        raise RejectError(f"kshare.spark.reject: not overwriting the ledger entry of {tp[0]}-{tp[1]}: {exc}") \
            from None
    pending = prune(union(old, to_ranges(offsets)), start)
    text = encode(pending)
    if len(text) > MAX_CHARS:
        raise RejectError(f"kshare.spark.reject: the {sum(z - a + 1 for a, z in pending)} pending rejected offsets "
                          f"of {tp[0]}-{tp[1]} need {len(text)} bytes in the rejects ledger, more than "
                          f"offset.metadata.max.bytes ({MAX_CHARS}): reject fewer records of that partition per "
                          f"micro-batch (send them to a quarantine output instead)")
    return text


def _holds(entry: Entry, offsets: set[int], start: int) -> bool:
    """Whether ``entry`` lists every offset of ``offsets`` not yet settled."""
    try:
        ranges = entry.ranges
    except LedgerFormatError:
        return False
    return all(contains(ranges, o) for o in offsets if o >= start)


def _call(what: str, opts: Options, call: Callable[..., Any], *args: Any) -> Any:
    try:
        return call(*args)
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        if isinstance(err, KafkaError) and err.code() == KafkaError.OFFSET_METADATA_TOO_LARGE:
            raise RejectError("kshare.spark.reject: the cluster refused a rejects ledger entry as too large: "
                              f"its offset.metadata.max.bytes is below {MAX_CHARS}") from None
        reason = err.str() if isinstance(err, KafkaError) else str(exc)
        raise RejectError(f"kshare.spark.reject: could not {what} the rejects ledger "
                          f"{ledger_group(opts.group)} at {opts.bootstrap}: {reason}") from None


def _start_offsets(opts: Options, tps: Iterable[TP]) -> dict[TP, int]:
    """Share-partition start offsets (DescribeShareGroupOffsets): every record below one is settled.
    Nothing when the group cannot be described (then nothing is pruned)."""
    topics: dict[str, list[int]] = {}
    for t, p in tps:
        topics.setdefault(t, []).append(p)

    async def describe() -> list[Any]:
        timeout = int(opts.kafka_option("request.timeout.ms", "10000") or 10000)
        async with ShareGroupAdmin(parse_bootstrap(opts.bootstrap), timeout_ms=timeout,
                                   client_id=opts.kafka_option("client.id", "kshare-spark") or "kshare-spark") as a:
            return await a.describe_offsets(opts.group, topics)

    try:
        with ThreadPoolExecutor(1) as pool:  # a loop of its own, whatever runs in this thread
            found = pool.submit(asyncio.run, describe()).result()
    except Exception as exc:  # pruning is an optimisation: never fail the rejection for it
        log.info("kshare: not pruning the rejects ledger of %s: %s", opts.group, exc)
        return {}
    return {(o.topic, o.partition): o.start_offset for o in found if o.start_offset is not None and not o.error}
