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
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
@click.option("--log-format", default="text", show_default=True, type=click.Choice(["text", "json"]))
def proxy(upstream: str | None, listen_host: str, bootstrap_port: int, broker_port_base: int | None,
          advertised_host: str | None, max_frame_bytes: int, log_level: str, log_format: str) -> None:
    """Run the proxy in front of a Kafka cluster."""
    setup_logging(log_level, log_format)
    log = logging.getLogger("kshare")
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
                         max_frame_bytes=max_frame_bytes)
    try:
        run_proxy(config)
    except OSError as exc:
        raise click.ClickException(f"cannot start the proxy: {exc}") from None
    finally:
        if embedded is not None:
            embedded.stop()


def run_proxy(config: ProxyConfig) -> None:
    import uvloop

    from .proxy.server import Proxy

    async def serve() -> None:
        proxy = Proxy(config)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await proxy.start()
        await stop.wait()
        logging.getLogger("kshare").info("signal received: shutting down")
        await proxy.stop()

    uvloop.run(serve())


if __name__ == "__main__":
    main()
