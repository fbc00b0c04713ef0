"""The share member of a Python worker process, kept between Spark tasks.

Spark reuses its Python worker processes (``spark.python.worker.reuse``), so a member made here
outlives the task that made it: it keeps its connection, its group membership and its share
sessions, and with them the records its tasks read, locked until the driver's commit of their
micro-batch reaches it through the commit channel (or they are released). A background event
loop thread heartbeats, watches the commit marker while records are held, and renews their locks.

A worker process that ends leaves the share group (:func:`leave_all`). Spark ends its Python
workers with SIGHUP (pyspark's daemon, when it ends: the executor stopped, was removed by dynamic
allocation, or died) or ``os._exit`` (the daemon's code in the worker, after the worker's socket
closed: idle workers reaped, a failed task), neither of which runs ``atexit``; so the process that
makes a member wraps ``os._exit`` and handles SIGHUP and SIGTERM, to settle what the commit marker
already decides and send the member's leave heartbeat (a few seconds at most) before it goes.
Without that the member would stay in the group until its session timeout (its records are
released when its connection closes either way). A worker killed outright (SIGKILL: a task
interrupted) only closes its connections.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import signal
import sys
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from ..clients.settings import client_security, parse_bootstrap
from ..clients.share_member import ACCEPT, RELEASE, RENEW, Acquired, Record, ShareMember
from .commits import CommitChannel, Marker, RetryNotices
from .ledger import Entry, Ledger, LedgerFormatError, within
from .options import Options

log = logging.getLogger("kshare.spark")

WATCH_INTERVAL_S = 0.1  # how often a member holding records looks at the commit marker
JOIN_TIMEOUT_S = 30.0
LEAVE_TIMEOUT_S = 3.0  # how long a worker process that ends waits for its members to leave


@dataclass(frozen=True, slots=True)
class Tag:
    """Which task read a holding: micro-batch ``batch`` of run ``run`` of stream ``stream``, the
    task's input partition ``index`` and Spark's attempt number."""

    stream: str
    run: int
    batch: int
    index: int
    attempt: int = 0


@dataclass(slots=True)
class Holding:
    tag: Tag
    acquired: list[Acquired]
    since: float = field(default_factory=time.monotonic)
    lock_s: float = 0.0


class MemberHost:
    """A :class:`ShareMember` on an event loop thread of its own, called from task threads."""

    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.pid = os.getpid()  # a forked child has no event loop thread: it must not use this host
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="kshare-share-member", daemon=True)
        self._thread.start()
        timeout = int(opts.kafka_option("request.timeout.ms", "30000") or 30000)
        self.member = ShareMember(parse_bootstrap(opts.bootstrap), opts.group, list(opts.topics),
                                  client_id=opts.kafka_option("client.id", "kshare-spark") or "kshare-spark",
                                  rack=opts.kafka_option("client.rack"), timeout_ms=timeout,
                                  security=client_security(dict(opts.kafka)))
        self.holdings: list[Holding] = []
        self._channels: dict[str, CommitChannel] = {}
        self._notices: dict[str, RetryNotices] = {}
        self._ledger: Ledger | None = None
        self._warned: set[str] = set()
        self._deciding: asyncio.Lock | None = None  # one marker decision at a time (watch or read)
        self.call(self.member.start())
        self._watcher = asyncio.run_coroutine_threadsafe(self._watch(), self.loop)

    def call(self, coro: Any, timeout: float | None = None) -> Any:
        fut: Future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(timeout)

    # -- reading ----------------------------------------------------------------------------------
    def read(self, tag: Tag, max_records: int, max_wait_ms: int, more_ms: int = 20) -> tuple[list[Record], Holding]:
        """Acquire up to ``max_records`` within about ``max_wait_ms``; after the first records,
        fetch again (waiting up to ``more_ms`` each time) until the group has nothing more. The
        records stay held under ``tag`` until :meth:`settle` or the commit marker decides."""
        return self.call(self._read(tag, max_records, max_wait_ms, more_ms))

    async def _read(self, tag: Tag, max_records: int, max_wait_ms: int,
                    more_ms: int) -> tuple[list[Record], Holding]:
        if tag.attempt > 0:  # an earlier attempt of this task failed: what it read was never used
            await asyncio.get_running_loop().run_in_executor(
                None, self._retries(tag.stream).add, tag.run, tag.batch, tag.index, tag.attempt)
            await self._settle([h for h in self.holdings if _same_task(h.tag, tag)], RELEASE)
        start = time.monotonic()
        log.debug("kshare: timeline: %s read starts", tag)
        if any(h.tag.stream == tag.stream and (h.tag.run, h.tag.batch) < (tag.run, tag.batch) for h in self.holdings):
            # Micro-batch b starts after Spark committed b - 1: settle what this member holds of
            # committed batches before asking for more (the watch may not have seen the marker
            # yet), so those locks count neither against the partition nor this member's share.
            try:
                await self._decide({tag.stream})
            except Exception as exc:  # the watch retries; the read must not fail for this
                log.warning("kshare: commit check before reading failed (%r)", exc)
            log.debug("kshare: timeline: %s settled committed holdings at %.0f ms", tag,
                      (time.monotonic() - start) * 1000)
        await self.member.wait_assigned(JOIN_TIMEOUT_S if not self.holdings else max_wait_ms / 1000.0)
        records: list[Record] = []
        holding = Holding(tag, [])
        wait_ms = max_wait_ms
        while len(records) < max_records:
            got, acquired = await self.member.fetch(max_records - len(records), wait_ms)
            log.debug("kshare: timeline: %s fetch (wait %d ms) got %d record(s) at %.0f ms", tag, wait_ms,
                      len(got), (time.monotonic() - start) * 1000)
            records += got
            holding.acquired += acquired
            if not acquired:
                break
            for a in acquired:
                holding.lock_s = max(holding.lock_s, a.lock_deadline - time.monotonic())
            wait_ms = more_ms  # after the first answer take only what is there now
        if holding.acquired:
            self.holdings.append(holding)
        log.info("kshare: %s read %d record(s) in %.0f ms", tag, len(records), (time.monotonic() - start) * 1000)
        return records, holding

    def settle(self, holding: Holding, ack_type: int) -> None:
        """ACCEPT or RELEASE ``holding`` now (batch reads, failed tasks)."""
        self.call(self._settle([holding], ack_type))

    async def _settle(self, holdings: list[Holding], ack_type: int) -> None:
        for h in holdings:
            if h in self.holdings:
                self.holdings.remove(h)
        acquired = [a for h in holdings for a in h.acquired]
        if not acquired:
            return
        errors = await self.member.acknowledge(acquired, ack_type)
        if errors:
            verb = {ACCEPT: "accept", RELEASE: "release"}.get(ack_type, str(ack_type))
            log.warning("kshare: could not %s %d record(s) of %s: %s (they are redelivered when their "
                        "locks expire)", verb, sum(a.count for a in acquired),
                        ", ".join(sorted({f"batch {h.tag.batch}" for h in holdings})), "; ".join(errors[:3]))

    # -- the background watch -----------------------------------------------------------------------
    async def _watch(self) -> None:
        while not self.member.closed:
            await asyncio.sleep(WATCH_INTERVAL_S)
            if not self.holdings:
                continue
            try:
                await self._decide()
                await self._renew()
            except Exception as exc:  # keep watching: a passing outage must not orphan the records
                log.warning("kshare: commit watch failed (%r); retrying", exc)
                await asyncio.sleep(1.0)

    async def _decide(self, streams: set[str] | None = None) -> None:
        """Read the markers of the streams held (or ``streams``) and settle what they decide."""
        if self._deciding is None:
            self._deciding = asyncio.Lock()
        async with self._deciding:
            loop = asyncio.get_running_loop()
            markers: dict[str, Marker | None] = {}
            for stream in streams or {h.tag.stream for h in self.holdings}:
                markers[stream] = await loop.run_in_executor(None, self._channel(stream).read)
            log.debug("kshare: markers %s; holding %s", markers, [h.tag for h in self.holdings])
            await self._apply(markers)

    def _channel(self, stream: str) -> CommitChannel:
        ch = self._channels.get(stream)
        if ch is None:
            ch = self._channels[stream] = CommitChannel(self.opts, stream)
        return ch

    def _retries(self, stream: str) -> RetryNotices:
        ch = self._notices.get(stream)
        if ch is None:
            ch = self._notices[stream] = RetryNotices(self.opts, stream)
        return ch

    async def _apply(self, markers: dict[str, Marker | None]) -> None:
        accept: list[Holding] = []
        release: list[Holding] = []
        for h in list(self.holdings):
            marker = markers.get(h.tag.stream)
            decision = marker.decides(h.tag.run, h.tag.batch) if marker is not None else None
            if decision == "accept":
                accept.append(h)
            elif decision == "release":
                release.append(h)
            elif time.monotonic() - h.since > self.opts.commit_timeout_ms / 1000.0:
                log.warning("kshare: micro-batch %d was not committed within commitTimeoutMs=%d; releasing "
                            "its %d record(s) for redelivery", h.tag.batch, self.opts.commit_timeout_ms,
                            sum(a.count for a in h.acquired))
                release.append(h)
        if accept:  # what a failed attempt read is released, even in its (surviving) worker
            loop = asyncio.get_running_loop()
            tps = {(a.topic, a.partition) for h in accept for a in h.acquired}
            tasks = sorted({(h.tag.stream, h.tag.index) for h in accept})
            *all_notices, ledger = await asyncio.gather(  # the rejects ledger too: kshare.spark.reject
                *(loop.run_in_executor(None, self._retries(s).notices, i) for s, i in tasks),
                loop.run_in_executor(None, self._rejects_ledger().read, tps))
            retried = dict(zip(tasks, all_notices, strict=True))
            failed = [h for h in accept if any((run, batch) == (h.tag.run, h.tag.batch) and attempt > h.tag.attempt
                                               for run, batch, attempt in retried[(h.tag.stream, h.tag.index)])]
            accept = [h for h in accept if h not in failed]
            release += failed
            self._mark_rejected(accept, ledger)
        if accept or release:
            log.info("kshare: marker %s: accept %s, release %s", markers, [h.tag for h in accept],
                     [h.tag for h in release])
        if accept:
            log.debug("kshare: timeline: marker seen, accepting %s (held %s ms)", [h.tag.batch for h in accept],
                      [round((time.monotonic() - h.since) * 1000) for h in accept])
            await self._settle(accept, ACCEPT)
            log.debug("kshare: timeline: accepted %s", [h.tag.batch for h in accept])
        if release:
            await self._settle(release, RELEASE)

    def _rejects_ledger(self) -> Ledger:
        if self._ledger is None:
            self._ledger = Ledger(self.opts)
        return self._ledger

    def _mark_rejected(self, accept: list[Holding], entries: dict[tuple[str, int], Entry]) -> None:
        """Held offsets the rejects ledger lists get REJECT in the coming ACCEPT (kshare.spark.reject)."""
        ranges: dict[tuple[str, int], list[tuple[int, int]]] = {}
        for tp, entry in entries.items():
            try:
                ranges[tp] = entry.ranges
            except LedgerFormatError as exc:
                if "ledger-format" not in self._warned:
                    self._warned.add("ledger-format")
                    log.warning("kshare: ignoring the rejects ledger of %s-%d: %s", tp[0], tp[1], exc)
        rejected = 0
        for h in accept:
            for a in h.acquired:
                listed = ranges.get((a.topic, a.partition))
                if listed:
                    a.rejects = {o for lo, hi in a.ranges for o in within(listed, lo, hi)} - a.gaps
                    rejected += len(a.rejects)
        if rejected:
            log.info("kshare: rejecting %d record(s) the sink rejected", rejected)

    async def _renew(self) -> None:
        """Renew the locks of held records at half their lock time (ShareAcknowledge v2 RENEW)."""
        now = time.monotonic()
        due = [a for h in self.holdings for a in h.acquired
               if h.lock_s > 0 and a.lock_deadline - now < h.lock_s / 2]
        if not due or not self.member.renew_supported:
            if due and "renew" not in self._warned:
                self._warned.add("renew")
                log.warning("kshare: the cluster does not renew record locks (ShareAcknowledge v2 RENEW); "
                            "records held past share.record.lock.duration.ms are redelivered")
            return
        errors = await self.member.acknowledge(due, RENEW)
        if errors and "renew-failed" not in self._warned:
            self._warned.add("renew-failed")
            log.warning("kshare: renewing record locks failed (%s): is share.renew.acknowledge.enable false? "
                        "Records held past their lock are redelivered", "; ".join(errors[:3]))
            for a in due:  # do not ask again for these
                a.lock_deadline = float("inf")

    def leave(self, timeout: float = LEAVE_TIMEOUT_S) -> None:
        """This process ends: settle what the commit marker decides, then leave the group (the
        broker releases whatever is still held). Bounded by ``timeout``; never raises."""
        if self.member.closed or self.pid != os.getpid() or not self._thread.is_alive():
            return
        try:
            self.call(asyncio.wait_for(self._leave(timeout * 0.5), timeout), timeout + 0.5)
        except BaseException as exc:  # noqa: BLE001 - the process is ending whatever happens here
            log.warning("kshare: share member %s did not leave group %s cleanly (%r)", self.member.member_id,
                        self.opts.group, exc)

    async def _leave(self, decide_s: float) -> None:
        self._watcher.cancel()
        if self.holdings:
            try:
                await asyncio.wait_for(self._decide(), decide_s)
            except Exception as exc:  # noqa: BLE001 - what is left is released by the leave
                log.warning("kshare: commit check before leaving failed (%r)", exc)
        held = sum(a.count for h in self.holdings for a in h.acquired)
        await self.member.close()
        log.info("kshare: share member %s left group %s (%d record(s) still held released)", self.member.member_id,
                 self.opts.group, held)

    def close(self) -> None:
        self._watcher.cancel()
        try:
            self.call(self.member.close(), timeout=10)
        finally:
            for ch in [*self._channels.values(), *self._notices.values(), *filter(None, [self._ledger])]:
                ch.close()
            self.loop.call_soon_threadsafe(self.loop.stop)


def _same_task(a: Tag, b: Tag) -> bool:
    return (a.stream, a.run, a.batch, a.index) == (b.stream, b.run, b.batch, b.index) and a.attempt < b.attempt


_hosts: dict[tuple, MemberHost] = {}
_hosts_lock = threading.Lock()


def member_host(opts: Options) -> MemberHost:
    """This process's member for ``opts`` (made on first use; a closed one is replaced)."""
    with _hosts_lock:
        host = _hosts.get(opts.member_key)
        if host is None or host.member.closed:
            host = _hosts[opts.member_key] = MemberHost(opts)
    _leave_on_exit()
    return host


def leave_all(timeout: float = LEAVE_TIMEOUT_S) -> None:
    """Every member of this process leaves its group (the process is ending: once)."""
    global _leaving
    if _leaving == os.getpid():
        return
    _leaving = os.getpid()
    hosts = [h for h in list(_hosts.values()) if h.pid == os.getpid()]  # no lock: a signal handler calls it
    _hosts.clear()
    for host in hosts:
        host.leave(timeout)


_real_exit = os._exit
_hooked_pid: int | None = None
_leaving: int | None = None  # the pid whose members are leaving (the process is on its way out)


def _exit(code: int) -> None:
    """``os._exit`` of a process with members: they leave first (pyspark's daemon ends its workers so)."""
    try:
        leave_all()
    finally:
        _real_exit(code)


def _on_signal(signum: int, _frame: Any) -> None:
    """SIGHUP (pyspark's daemon ending: the executor stopped, was removed or died) or SIGTERM: leave,
    then die of the signal as before."""
    if _leaving == os.getpid():
        return  # the process is already leaving (os._exit or an earlier signal): let it finish, it exits then
    try:
        leave_all()
    finally:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        _real_exit(128 + signum)


def _leave_on_exit() -> None:
    """Install the exit hooks, once per process: ``atexit``, ``os._exit``, and handlers for SIGHUP
    and SIGTERM that pyspark's daemon keeps (it resets both to their defaults at the start of every
    task, which would leave an idle worker without them)."""
    global _hooked_pid
    if _hooked_pid == os.getpid():
        return
    _hooked_pid = os.getpid()
    atexit.register(leave_all)  # a worker that ends normally (pyspark.worker without the daemon)
    os._exit = _exit
    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may set handlers; Spark runs tasks there
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name.endswith("daemon") and getattr(main, "signal", None) is signal:
        main.signal = _DaemonSignal()  # type: ignore[union-attr]  # this forked worker's copy only
    for signum in _EXIT_SIGNALS:
        if signal.getsignal(signum) == signal.SIG_DFL:
            signal.signal(signum, _on_signal)


_EXIT_SIGNALS = (signal.SIGHUP, signal.SIGTERM)


class _DaemonSignal:
    """The ``signal`` module as pyspark's daemon code sees it in a worker it forked, except that
    setting SIGHUP or SIGTERM back to SIG_DFL (at the start of every task) keeps kshare's handler,
    which leaves the group and then dies of the signal as the default would."""

    def __getattr__(self, name: str) -> Any:
        return getattr(signal, name)

    def signal(self, signum: int, handler: Any) -> Any:
        if signum in _EXIT_SIGNALS and handler == signal.SIG_DFL and _hooked_pid == os.getpid():
            handler = _on_signal
        return signal.signal(signum, handler)


def _forget_after_fork() -> None:
    global _hosts_lock
    _hosts.clear()  # the child has none of the parent's event loop threads
    _hosts_lock = threading.Lock()  # another thread may have held it at the fork


os.register_at_fork(after_in_child=_forget_after_fork)

