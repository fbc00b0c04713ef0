"""The ``kshare`` command."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
import time

import click

from . import __version__
from .proxy.config import ProxyConfig, parse_hostports


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for log collectors."""

    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc)


def setup_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


@click.group()
@click.version_option(__version__, prog_name="kshare")
def main() -> None:
    """kshare: share groups (KIP-932) for every Kafka cluster."""


@main.command()
@click.option("--upstream", metavar="HOST:PORT[,HOST:PORT]",
              help="Bootstrap servers of the Kafka cluster to front. Without it an embedded Tansu broker is started.")
@click.option("--listen-host", default="127.0.0.1", show_default=True, help="Address the listeners bind to.")
@click.option("--port", "bootstrap_port", default=9192, show_default=True, type=int,
              help="Port of the bootstrap listener.")
@click.option("--broker-port-base", type=int, default=None,
              help="Broker N is served on BASE+N (default: --port + 1). 0 lets the OS choose.")
@click.option("--advertised-host", default=None,
              help="Host name clients are told to connect to (default: the listen host).")
@click.option("--max-frame-bytes", default=100 * 1024 * 1024, show_default=True, type=int,
              help="Requests larger than this close the connection, as socket.request.max.bytes does.")
@click.option("--state-topic", default="__kshare_share_group_state", show_default=True,
              help="Topic of the fronted cluster that holds the durable share-group state.")
@click.option("--state-topic-partitions", default=10, show_default=True, type=int,
              help="Partitions of the state topic when kshare creates it.")
@click.option("--state-topic-replication-factor", default=None, type=int,
              help="Replication factor of the state topic when kshare creates it (default: min(3, brokers)).")
@click.option("--group-limit", "group_limits", multiple=True, metavar="NAME=VALUE",
              help="A broker-level share group bound, e.g. group.share.max.size=500 (repeatable).")
@click.option("--no-share-groups", is_flag=True, help="Be a plain pass-through proxy.")
@click.option("--metrics-port", type=int, default=None,
              help="Serve Prometheus metrics on http://HOST:PORT/metrics (HOST: --listen-host).")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
@click.option("--log-format", default="text", show_default=True, type=click.Choice(["text", "json"]))
def proxy(upstream: str | None, listen_host: str, bootstrap_port: int, broker_port_base: int | None,
          advertised_host: str | None, max_frame_bytes: int, state_topic: str, state_topic_partitions: int,
          state_topic_replication_factor: int | None, group_limits: tuple[str, ...], no_share_groups: bool,
          metrics_port: int | None, log_level: str, log_format: str) -> None:
    """Run the proxy in front of a Kafka cluster, serving share groups."""
    from .share.config import ConfigError, limits_from

    setup_logging(log_level, log_format)
    log = logging.getLogger("kshare")
    try:
        limits = limits_from(dict(item.split("=", 1) for item in group_limits if "=" in item))
        if any("=" not in item for item in group_limits):
            raise ConfigError("--group-limit takes NAME=VALUE")
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--group-limit") from None
    embedded = None
    if upstream:
        try:
            servers = parse_hostports(upstream)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--upstream") from None
    else:
        from .embedded import EmbeddedTansu

        try:
            embedded = EmbeddedTansu().start()
        except RuntimeError as exc:
            raise click.ClickException(str(exc)) from None
        log.info("no --upstream given: started the embedded Tansu broker (in-memory) at %s", embedded.bootstrap)
        servers = parse_hostports(embedded.bootstrap)
    config = ProxyConfig(upstream=servers, listen_host=listen_host, bootstrap_port=bootstrap_port,
                         broker_port_base=broker_port_base, advertised_host=advertised_host,
                         max_frame_bytes=max_frame_bytes, state_topic=state_topic,
                         state_topic_partitions=state_topic_partitions,
                         state_topic_replication_factor=state_topic_replication_factor, group_limits=limits)
    try:
        run_proxy(config, share_groups=not no_share_groups, metrics_port=metrics_port)
    except OSError as exc:
        raise click.ClickException(f"cannot start the proxy: {exc}") from None
    finally:
        if embedded is not None:
            embedded.stop()


def run_proxy(config: ProxyConfig, *, share_groups: bool = True, metrics_port: int | None = None) -> None:
    import uvloop

    from .app import KShare

    async def serve() -> None:
        app = KShare(config, share_groups=share_groups, metrics_port=metrics_port, metrics_host=config.listen_host)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await app.start()
        await stop.wait()
        logging.getLogger("kshare").info("signal received: shutting down")
        await app.stop()

    uvloop.run(serve())


__import__("kshare.tools", fromlist=["register_commands"]).register_commands(main)  # groups, consume, produce


if __name__ == "__main__":
    main()
