"""``kshare consume`` and ``kshare produce``: console clients for trying share groups, in the manner
of kafka-console-share-consumer.sh and kafka-console-producer.sh (confluent-kafka underneath)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import signal
import sys
import threading
import time
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from typing import Any

import click

from ..clients.admin import AdminError, GroupNotFound, ShareGroupAdmin, probe
from ..clients.settings import client_security, parse_bootstrap

ACK_TYPES = ("accept", "release", "reject")
# How long the commands try to reach a server before they give up: kshare groups' default --timeout
REACH_TIMEOUT_S = 5.0
DELIVERY_TIMEOUT_S = 30.0
# librdkafka's errors about reaching servers (confluent_kafka.KafkaError codes): the commands weigh them
_ALL_BROKERS_DOWN, _RESOLVE, _TRANSPORT = -187, -193, -195


def _properties(items: tuple[str, ...], option: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"'{item}' is not KEY=VALUE", param_hint=option)
        out[key.strip()] = value
    return out


def _message_key(text: str) -> str:
    """A librdkafka message without what changes between its repetitions (durations, states)."""
    return re.sub(r"\d+ms|\d+ms in state \w+|\(after [^)]*\)|, \d+ identical error\(s\) suppressed", "", text)


class _OncePerMessage(logging.Filter):
    """librdkafka repeats a failure on every reconnect (every few ms while a server is down): show each once."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        # librdkafka warns on every start that its share consumer is a preview: not news to the user
        if "Preview" in text:
            return False
        # a failure of a connection (FAIL) comes again through error_cb, where _Connectivity weighs it
        if text.startswith("FAIL "):
            return False
        key = _message_key(text)
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


def _quiet_logger(name: str) -> logging.Logger:
    """librdkafka's log lines go through Python logging (warnings and errors reach stderr, each once)."""
    log = logging.getLogger(f"kshare.tools.{name}")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
        handler.addFilter(_OncePerMessage())
        log.addHandler(handler)
        log.setLevel(logging.WARNING)
        log.propagate = False
    return log


class _Signals:
    """Ctrl-C (SIGINT) and SIGTERM while a command runs librdkafka.

    librdkafka runs the Python callbacks (logger, error_cb, on_delivery) inside ``poll()`` and
    ``flush()``; a KeyboardInterrupt raised in one of them is lost there, and the call then fails
    with "SystemError: <method 'poll'> returned NULL without setting an exception". So a signal
    only sets :attr:`signum`, which the commands check between waits of at most half a second; only
    inside :meth:`raising` (plain Python waits: standard input, the reachability probe) it raises
    KeyboardInterrupt at once.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self.count = 0
        self._raising = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _Signals:
        # a handler can only be set from the main thread (not so under some test runners: the
        # commands then run as before, without one)
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)

    def _handle(self, signum: int, frame: Any) -> None:
        self.signum = self.signum or signum
        self.count += 1
        if self._raising:
            raise KeyboardInterrupt

    @property
    def stopped(self) -> bool:
        return self.signum is not None

    @contextmanager
    def raising(self) -> Iterator[None]:
        """A block where a signal raises KeyboardInterrupt (no librdkafka call may run in it)."""
        if self.stopped:
            raise KeyboardInterrupt
        self._raising = True
        try:
            yield
        finally:
            self._raising = False

    def exit_code(self) -> int:
        """128 + the signal, as a shell reports a command a signal stopped (130 for Ctrl-C)."""
        return 128 + (self.signum or signal.SIGINT)


def _probe(config: dict[str, Any], option: str, signals: _Signals) -> None:
    """``kshare groups``' check of the servers, before librdkafka gets them: a ClickException in the
    same words where librdkafka would wait for its timeouts in silence (nothing listening, a kshare
    proxy without its cluster, a TLS listener given a plaintext client)."""
    try:
        servers = parse_bootstrap(str(config.get("bootstrap.servers", "")))
    except AdminError:
        return  # not HOST:PORT (librdkafka defaults the port): librdkafka judges it
    protocol = str(config.get("security.protocol", "PLAINTEXT")).strip().upper()
    secure = "SASL_SSL" if protocol.startswith("SASL") else "SSL"
    hint = (f"add {option} security.protocol={secure} (and {option} ssl.ca.location=CA.pem unless a CA the "
            "system trusts signed its certificate)")
    if signals.stopped:
        raise KeyboardInterrupt
    try:
        finished = asyncio.run(_until_signalled(
            probe(servers, REACH_TIMEOUT_S, plaintext=protocol in ("PLAINTEXT", "SASL_PLAINTEXT"),
                  tls_hint=hint, client_id="kshare-console"), signals))
    except AdminError as exc:
        raise click.ClickException(str(exc)) from None
    if not finished:
        raise KeyboardInterrupt


async def _until_signalled(work: Coroutine[Any, Any, None], signals: _Signals) -> bool:
    """Runs ``work`` until it ends (True) or a signal arrives (False, ``work`` cancelled and awaited).

    The signal is polled, not raised into the loop: a KeyboardInterrupt raised while asyncio.run is
    still setting up leaves the task never started ("Task was destroyed but it is pending")."""
    task = asyncio.ensure_future(work)
    while not task.done():
        await asyncio.wait({task}, timeout=0.05)
        if signals.stopped and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return False
    task.result()
    return True


class _Connectivity:
    """librdkafka's ``error_cb``: what it says about reaching the servers, weighed by the command.

    librdkafka retries a server that went away for ever and repeats the failure every few hundred
    ms. When it says that all brokers are down, the command asks (:func:`_probe`) whether a bootstrap
    server is there again within REACH_TIMEOUT_S, and stops with one line if none is. A failure to
    reach one broker of several is shown once, if it lasted REACH_TIMEOUT_S; other errors at once.
    """

    def __init__(self, log: logging.Logger, config: dict[str, Any], option: str, signals: _Signals) -> None:
        self.log = log
        self.config = config
        self.option = option
        self.signals = signals
        self.all_down = False
        self.held: dict[str, tuple[float, str]] = {}  # connection failures not shown yet, first seen

    def on_error(self, err: Any) -> None:
        """Runs inside poll() / flush(): notes only."""
        code = err.code()
        if code == _ALL_BROKERS_DOWN:
            self.all_down = True
        elif code in (_TRANSPORT, _RESOLVE):
            self.held.setdefault(_message_key(err.str()), (time.monotonic(), err.str()))
        else:
            self.log.error("%s", err.str())

    def check(self) -> str | None:
        """Between polls: the reason to stop if the servers are gone, else None (held failures that
        lasted are shown)."""
        if self.all_down:
            self.all_down = False
            try:
                _probe(self.config, self.option, self.signals)
            except click.ClickException as exc:
                return f"lost the connection to the cluster: {exc.message}"
        now = time.monotonic()
        for key, (since, text) in list(self.held.items()):
            if now - since >= REACH_TIMEOUT_S:
                del self.held[key]
                self.log.error("%s", text)
        return None


def confluent_kafka() -> Any:
    """confluent-kafka with its ShareConsumer, or a one-line error saying how to install it."""
    try:
        import confluent_kafka as ck
    except ImportError:
        ck = None
    if ck is None or not hasattr(ck, "ShareConsumer"):
        raise click.ClickException("this command needs confluent-kafka 2.16.1 or newer (its ShareConsumer): "
                                   "pip install 'confluent-kafka>=2.16.1'")
    return ck


def missing_topics(config: dict[str, Any], topics: tuple[str, ...], timeout: float = 5.0,
                   group: str | None = None) -> tuple[list[str], str | None]:
    """Which of ``topics`` the cluster does not have (none if it cannot tell in time), and the
    ``share.auto.offset.reset`` of ``group`` (None if not asked or unknown)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

    admin_config = {k: v for k, v in config.items() if k not in ("group.id", "share.acknowledgement.mode", "error_cb")}
    client = AdminClient(admin_config)
    try:
        known = client.list_topics(timeout=timeout).topics
    except KafkaException:
        return [], None  # the consumer reports an unreachable cluster in its own words
    missing = [t for t in topics if t not in known]
    reset = None
    if missing and group is not None:
        try:
            for fut in client.describe_configs([ConfigResource(ResourceType.GROUP, group)],
                                               request_timeout=timeout).values():
                entry = fut.result(timeout).get("share.auto.offset.reset")
                reset = entry.value if entry is not None else None
        except Exception:  # noqa: BLE001 - a cluster without group configs: the note says "unless ..."
            reset = None
    return missing, reset


def _from_beginning(config: dict[str, Any], group: str, topics: tuple[str, ...], signals: _Signals) -> str:
    """--from-beginning: ``share.auto.offset.reset=earliest`` for ``group`` if it has no start offsets
    yet (a group that has read goes on from its offsets: changing its config would not move them).
    Returns the note to show."""
    async def run() -> str:
        servers = parse_bootstrap(str(config["bootstrap.servers"]))
        security = client_security({k: str(v) for k, v in config.items()}, "--consumer-property")
        async with ShareGroupAdmin(servers, client_id="kshare-console", timeout_ms=30_000,
                                   security=security) as admin:
            try:
                started = [o for o in await admin.describe_offsets(group) if o.start_offset is not None]
            except GroupNotFound:
                started = []
            if started:
                bootstrap = config["bootstrap.servers"]
                return (f"NOTE --from-beginning: share group '{group}' has start offsets already (it read before) "
                        f"and goes on from them; to start over, with no consumer of it running: kshare groups "
                        f"--bootstrap-server {bootstrap} --reset-offsets --group {group} "
                        f"{' '.join(f'--topic {t}' for t in topics)} --to-earliest --execute")
            await admin.set_configs(group, {"share.auto.offset.reset": "earliest"})
            return (f"NOTE share group '{group}' starts at 'earliest' now (share.auto.offset.reset=earliest, kept "
                    "for the group): it reads partitions from their beginning")

    with signals.raising():
        try:
            return asyncio.run(run())
        except AdminError as exc:
            raise click.ClickException(f"--from-beginning: {exc}") from None


def _latest_note(group: str, topic: str, reset: str | None, bootstrap: str) -> str | None:
    """What a share group starting at ``latest`` means for a topic created later."""
    if reset is not None and reset != "latest":
        return None
    setting = "share.auto.offset.reset" if reset is not None else "share.auto.offset.reset, unless set otherwise"
    return (f"NOTE share group '{group}' starts at 'latest' ({setting}): records written to '{topic}' before the "
            "group first reads a partition are not delivered. To read them too, start with --from-beginning (sets the "
            "group config share.auto.offset.reset=earliest), or once the records are there, with no consumer "
            f"running: kshare groups --bootstrap-server {bootstrap} --reset-offsets --group {group} --topic {topic} "
            "--to-earliest --execute")


def _text(data: bytes | str | None) -> str:
    if data is None:
        return "null"
    if isinstance(data, str):
        return data
    return data.decode("utf-8", "replace")


def format_record(msg: Any, *, print_timestamp: bool = False, print_partition: bool = False,
                  print_offset: bool = False, print_delivery_count: bool = False, print_key: bool = False,
                  key_separator: str = "\t") -> str:
    """One record as kafka-console-share-consumer.sh's default formatter prints it."""
    parts = []
    if print_timestamp:
        kind, ts = msg.timestamp()
        label = {1: "CreateTime", 2: "LogAppendTime"}.get(kind, "NoTimestampType")
        parts.append(f"{label}:{ts}" if kind in (1, 2) else label)
    if print_partition:
        parts.append(f"Partition:{msg.partition()}")
    if print_offset:
        parts.append(f"Offset:{msg.offset()}")
    if print_delivery_count:
        parts.append(f"DeliveryCount:{msg.delivery_count() or 0}")
    line = "\t".join(parts) + ("\t" if parts else "")
    if print_key:
        line += _text(msg.key()) + key_separator
    return line + _text(msg.value())


@click.command("consume", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--bootstrap-server", required=True, metavar="HOST:PORT[,HOST:PORT]", help="REQUIRED: the server(s).")
@click.option("--group", default="console-share-consumer", show_default=True, help="The share group to join.")
@click.option("--topic", "topics", required=True, multiple=True, help="REQUIRED: topic to consume (repeatable).")
@click.option("--from-beginning", is_flag=True,
              help="For a group that has not read yet: set its config share.auto.offset.reset=earliest (kept), "
                   "so that it reads records written before it joined. A group with start offsets goes on from "
                   "them (kshare groups --reset-offsets moves them).")
@click.option("--ack", type=click.Choice(ACK_TYPES), default=None,
              help="Acknowledge every record explicitly with this type (explicit mode). Without it records "
                   "are accepted implicitly, as the console share consumer does.")
@click.option("--print-timestamp", is_flag=True, help="Print the record timestamp.")
@click.option("--print-partition", is_flag=True, help="Print the partition.")
@click.option("--print-offset", is_flag=True, help="Print the offset.")
@click.option("--print-delivery-count", is_flag=True, help="Print the delivery count.")
@click.option("--print-key", is_flag=True, help="Print the key.")
@click.option("--key-separator", default="\t", show_default="TAB", help="Printed between key and value.")
@click.option("--max-messages", type=click.IntRange(min=1), default=None,
              help="Exit after this many records (the rest of the last poll is released, not lost).")
@click.option("--timeout-ms", type=click.IntRange(min=1), default=None,
              help="Exit when no record arrived for this long.")
@click.option("--consumer-property", "properties", multiple=True, metavar="KEY=VALUE",
              help="A librdkafka consumer setting (repeatable), e.g. client.id=me.")
def consume(bootstrap_server: str, group: str, topics: tuple[str, ...], from_beginning: bool, ack: str | None,
            print_timestamp: bool, print_partition: bool, print_offset: bool, print_delivery_count: bool,
            print_key: bool, key_separator: str, max_messages: int | None, timeout_ms: int | None,
            properties: tuple[str, ...]) -> None:
    """Read records as a member of a share group and print their values, one per line."""
    ck = confluent_kafka()
    AcknowledgeType, KafkaException = ck.AcknowledgeType, ck.KafkaException

    ack_type = {"accept": AcknowledgeType.ACCEPT, "release": AcknowledgeType.RELEASE,
                "reject": AcknowledgeType.REJECT}
    # Explicit mode when asked for, and also with --max-messages: records of the last poll beyond
    # the limit are then released for other consumers instead of being accepted unseen.
    explicit = ack is not None or max_messages is not None
    log = _quiet_logger("consume")
    config: dict[str, Any] = {"bootstrap.servers": bootstrap_server, "group.id": group, "logger": log}
    if explicit:
        config["share.acknowledgement.mode"] = "explicit"
    config.update(_properties(properties, "--consumer-property"))

    with _Signals() as signals:
        try:
            _probe(config, "--consumer-property", signals)
            if from_beginning:
                click.echo(_from_beginning(config, group, topics, signals), err=True)
        except KeyboardInterrupt:
            sys.exit(signals.exit_code())  # nothing started yet: nothing to report
        watch = _Connectivity(log, config, "--consumer-property", signals)
        try:
            consumer = ck.ShareConsumer({**config, "error_cb": watch.on_error})
            consumer.subscribe(list(topics))
        except (KafkaException, ValueError, TypeError) as exc:
            raise click.ClickException(f"cannot start the share consumer: {exc}") from None

        count = 0
        failed: str | None = None
        gone = False
        try:
            missing, reset = missing_topics(config, topics, group=group)
            for topic in missing:
                click.echo(f"WARNING topic '{topic}' does not exist: waiting for it to be created (Ctrl-C to stop)",
                           err=True)
                note = _latest_note(group, topic, reset, str(config["bootstrap.servers"]))
                if note:
                    click.echo(note, err=True)
            last_record = time.monotonic()
            while not signals.stopped:
                if max_messages is not None and count >= max_messages:
                    break
                if timeout_ms is not None and (time.monotonic() - last_record) * 1000 >= timeout_ms:
                    break
                wait = 0.5 if timeout_ms is None else min(0.5, timeout_ms / 1000)
                try:
                    msgs = consumer.poll(wait)
                except KafkaException as exc:
                    failed = f"poll failed: {exc}"
                    break
                for m in msgs:
                    err = m.error()
                    if err is not None:
                        if err.code() != -191:  # _PARTITION_EOF is informational
                            click.echo(f"WARN {err}", err=True)
                        continue
                    last_record = time.monotonic()
                    if max_messages is not None and count >= max_messages:
                        consumer.acknowledge(m, AcknowledgeType.RELEASE)
                        continue
                    click.echo(format_record(m, print_timestamp=print_timestamp, print_partition=print_partition,
                                             print_offset=print_offset, print_delivery_count=print_delivery_count,
                                             print_key=print_key, key_separator=key_separator))
                    count += 1
                    if explicit:
                        consumer.acknowledge(m, ack_type[ack or "accept"])
                if explicit and msgs:
                    consumer.commit_async()
                failed = watch.check()
                if failed:
                    break
        except KeyboardInterrupt:
            # only the probe of watch.check() raises it: librdkafka had just said all brokers are down
            gone = True
        finally:
            if not (failed or gone):  # with the servers gone there is nobody to commit to
                try:
                    consumer.commit_sync(10)
                except Exception:  # noqa: BLE001 - nothing pending, or the broker is gone: close() reports
                    pass
            try:
                consumer.close()
            except KafkaException as exc:
                if not failed:
                    click.echo(f"WARN closing the share consumer: {exc}", err=True)
        click.echo(f"Processed a total of {count} messages", err=True)
        if failed:
            raise click.ClickException(failed)
        if signals.stopped:
            sys.exit(signals.exit_code())


@click.command("produce", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--bootstrap-server", required=True, metavar="HOST:PORT[,HOST:PORT]", help="REQUIRED: the server(s).")
@click.option("--topic", required=True, help="REQUIRED: the topic to produce to.")
@click.option("--key-separator", default=None, metavar="SEP",
              help="Split each line at the first SEP into key and value (lines without it are an error).")
@click.option("--partition", type=int, default=None, help="Produce to this partition (default: the partitioner).")
@click.option("--producer-property", "properties", multiple=True, metavar="KEY=VALUE",
              help="A librdkafka producer setting (repeatable), e.g. acks=1.")
def produce(bootstrap_server: str, topic: str, key_separator: str | None, partition: int | None,
            properties: tuple[str, ...]) -> None:
    """Send each line of standard input as one record."""
    ck = confluent_kafka()
    KafkaException, Producer = ck.KafkaException, ck.Producer

    log = _quiet_logger("produce")
    config: dict[str, Any] = {"bootstrap.servers": bootstrap_server, "linger.ms": 5, "logger": log}
    config.update(_properties(properties, "--producer-property"))

    with _Signals() as signals:
        try:
            _probe(config, "--producer-property", signals)
        except KeyboardInterrupt:
            sys.exit(signals.exit_code())
        watch = _Connectivity(log, config, "--producer-property", signals)
        try:
            producer = Producer({**config, "error_cb": watch.on_error})
        except (KafkaException, ValueError, TypeError) as exc:
            raise click.ClickException(f"cannot start the producer: {exc}") from None
        errors: list[str] = []
        delivered = 0
        sent = 0

        def report(err: Any, msg: Any) -> None:
            nonlocal delivered
            if err is None:
                delivered += 1
            else:
                errors.append(str(err))

        bad_input: click.ClickException | None = None
        try:
            lineno = 0
            while not signals.stopped:
                with signals.raising():  # Ctrl-C while waiting for a line stops at once
                    raw = sys.stdin.readline()
                if not raw:
                    break
                lineno += 1
                line = raw.rstrip("\r\n")
                key: str | None = None
                value = line
                if key_separator is not None:
                    if key_separator not in line:
                        raise click.ClickException(f"line {lineno} has no key separator {key_separator!r}")
                    key, value = line.split(key_separator, 1)
                kwargs: dict[str, Any] = {"value": value.encode(), "on_delivery": report}
                if key is not None:
                    kwargs["key"] = key.encode()
                if partition is not None:
                    kwargs["partition"] = partition
                while True:
                    try:
                        producer.produce(topic, **kwargs)
                        break
                    except BufferError:
                        producer.poll(0.1)
                    except KafkaException as exc:
                        raise click.ClickException(f"cannot produce line {lineno}: {exc}") from None
                sent += 1
                producer.poll(0)
        except KeyboardInterrupt:
            pass
        except click.ClickException as exc:  # a bad line: reported once the lines before it are delivered
            bad_input = exc
        # What was handed over is still delivered, also after a Ctrl-C that ended the input; a
        # (further) signal during this wait stops waiting.
        signals_before = signals.count
        lost: str | None = None
        deadline = time.monotonic() + DELIVERY_TIMEOUT_S
        try:
            while producer.flush(0.2) and signals.count == signals_before and time.monotonic() < deadline:
                lost = watch.check()
                if lost:
                    break
        except KeyboardInterrupt:
            pass  # in the probe of watch.check()
        remaining = len(producer)
        if remaining:
            producer.purge()  # nothing is sent after the answer below
        if signals.stopped:
            click.echo(f"interrupted: {delivered} records delivered, {sent - delivered} not", err=True)
            sys.exit(signals.exit_code())
        if bad_input is not None:
            raise bad_input
        if lost:
            raise click.ClickException(f"{remaining} of {sent} records not delivered: {lost}")
        if remaining:
            errors.append(f"{remaining} records not delivered within {DELIVERY_TIMEOUT_S:.0f} s")
        if errors:
            raise click.ClickException(f"{len(errors)} of {sent} records failed: {errors[0]}")
