"""``kshare consume`` and ``kshare produce``: console clients for trying share groups, in the manner
of kafka-console-share-consumer.sh and kafka-console-producer.sh (confluent-kafka underneath)."""

from __future__ import annotations

import logging
import re
import signal
import sys
import time
from typing import Any

import click

ACK_TYPES = ("accept", "release", "reject")


def _properties(items: tuple[str, ...], option: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"'{item}' is not KEY=VALUE", param_hint=option)
        out[key.strip()] = value
    return out


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
        key = re.sub(r"\d+ms|\d+ms in state \w+|\(after [^)]*\)", "", text)
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


def missing_topics(config: dict[str, Any], topics: tuple[str, ...], timeout: float = 5.0) -> list[str]:
    """Which of ``topics`` the cluster does not have (empty if it cannot tell in time)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    admin_config = {k: v for k, v in config.items() if k not in ("group.id", "share.acknowledgement.mode")}
    try:
        known = AdminClient(admin_config).list_topics(timeout=timeout).topics
    except KafkaException:
        return []  # the consumer reports an unreachable cluster in its own words
    return [t for t in topics if t not in known]


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
def consume(bootstrap_server: str, group: str, topics: tuple[str, ...], ack: str | None, print_timestamp: bool,
            print_partition: bool, print_offset: bool, print_delivery_count: bool, print_key: bool,
            key_separator: str, max_messages: int | None, timeout_ms: int | None,
            properties: tuple[str, ...]) -> None:
    """Read records as a member of a share group and print their values, one per line."""
    ck = confluent_kafka()
    AcknowledgeType, KafkaException = ck.AcknowledgeType, ck.KafkaException

    ack_type = {"accept": AcknowledgeType.ACCEPT, "release": AcknowledgeType.RELEASE,
                "reject": AcknowledgeType.REJECT}
    # Explicit mode when asked for, and also with --max-messages: records of the last poll beyond
    # the limit are then released for other consumers instead of being accepted unseen.
    explicit = ack is not None or max_messages is not None
    config: dict[str, Any] = {"bootstrap.servers": bootstrap_server, "group.id": group,
                              "logger": _quiet_logger("consume")}
    if explicit:
        config["share.acknowledgement.mode"] = "explicit"
    config.update(_properties(properties, "--consumer-property"))
    try:
        consumer = ck.ShareConsumer(config)
        consumer.subscribe(list(topics))
    except (KafkaException, ValueError, TypeError) as exc:
        raise click.ClickException(f"cannot start the share consumer: {exc}") from None
    for topic in missing_topics(config, topics):
        click.echo(f"WARNING topic '{topic}' does not exist: waiting for it to be created (Ctrl-C to stop)",
                   err=True)

    stop = False

    def on_signal(signum: int, frame: Any) -> None:
        nonlocal stop
        stop = True

    previous = signal.signal(signal.SIGTERM, on_signal) if _main_thread() else None
    count = 0
    last_record = time.monotonic()
    failed: str | None = None
    try:
        while not stop:
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
    except KeyboardInterrupt:
        pass
    finally:
        try:
            consumer.commit_sync(10)
        except Exception:  # noqa: BLE001 - nothing pending, or the broker is gone: close() reports
            pass
        try:
            consumer.close()
        except KafkaException as exc:
            click.echo(f"WARN closing the share consumer: {exc}", err=True)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    click.echo(f"Processed a total of {count} messages", err=True)
    if failed:
        raise click.ClickException(failed)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


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

    config: dict[str, Any] = {"bootstrap.servers": bootstrap_server, "linger.ms": 5,
                              "logger": _quiet_logger("produce")}
    config.update(_properties(properties, "--producer-property"))
    try:
        producer = Producer(config)
    except (KafkaException, ValueError, TypeError) as exc:
        raise click.ClickException(f"cannot start the producer: {exc}") from None
    errors: list[str] = []
    sent = 0

    def report(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    try:
        for lineno, raw in enumerate(sys.stdin, 1):
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
    finally:
        remaining = producer.flush(30)
    if remaining:
        errors.append(f"{remaining} records not delivered within 30 s")
    if errors:
        raise click.ClickException(f"{len(errors)} of {sent} records failed: {errors[0]}")
