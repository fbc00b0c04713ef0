"""The ``kshare`` command."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import signal
import sys
import time

import click

# The proxy's server, the share-group engine, the embedded broker and the bench are imported inside
# the commands that run them, so that ``kshare groups``, ``consume``, ``produce`` and ``--help`` start
# without loading them.
from . import __version__
from .addresses import parse_hostports
from .proxy.config import ProxyConfig


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


class RetriedCoordinatorLookup(logging.Filter):
    """aiokafka logs a group coordinator lookup that failed with a retriable error at ERROR ("Group
    Coordinator Request failed: [Error 15] GroupCoordinatorNotAvailableError": a cluster creating
    its __consumer_offsets, a coordinator moving) and then retries it. For kshare's instance group
    that is a wait, which kshare reports itself when it lasts ("joining instance group ...; retrying"):
    shown at INFO, so not at all unless aiokafka's INFO lines are."""

    RETRIED = ("GroupCoordinatorNotAvailableError", "NotCoordinatorForGroupError", "GroupLoadInProgressError",
               "CoordinatorNotAvailableError", "NotCoordinatorError", "CoordinatorLoadInProgressError")

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR or not str(record.msg).startswith("Group Coordinator Request failed"):
            return True
        if not any(name in record.getMessage() for name in self.RETRIED):
            return True
        record.levelno, record.levelname = logging.INFO, "INFO"
        return logging.getLogger(record.name).isEnabledFor(logging.INFO)


def setup_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # the clients kshare runs (state topic, instance group) report every join and coordinator
    # lookup at INFO: an operator needs their warnings only, unless debugging
    logging.getLogger("aiokafka").setLevel(logging.WARNING if level.upper() != "DEBUG" else logging.NOTSET)
    coordinator = logging.getLogger("aiokafka.consumer.group_coordinator")
    if not any(isinstance(f, RetriedCoordinatorLookup) for f in coordinator.filters):
        coordinator.addFilter(RetriedCoordinatorLookup())


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kshare")
def main() -> None:
    """kshare: share groups (KIP-932) for every Kafka cluster.

    Start the proxy with `kshare proxy`, then point any share consumer at it.
    """


def _option(*decls: str, env: str, **kwargs: object):
    """An option that can also be set by the environment variable KSHARE_<env>."""
    return click.option(*decls, envvar=f"KSHARE_{env}", show_envvar=True, **kwargs)


@main.command()
@_option("--upstream", env="UPSTREAM", metavar="HOST:PORT[,HOST:PORT]",
         help="Bootstrap servers of the Kafka cluster to front. Without it kshare starts an embedded broker "
              "(--embedded), for trying kshare.")
@_option("--embedded", env="EMBEDDED", default="auto", show_default=True,
         type=click.Choice(["auto", "kafka", "tansu"], case_sensitive=False),
         help="The broker started when no --upstream is given: kafka (a single-node Apache Kafka, needs Java 17+; "
              "fetched once from Maven Central), tansu (in memory, deviates from Kafka) or auto (kafka when Java "
              "17+ is found, else tansu).")
@_option("--data-dir", env="DATA_DIR", default=None, metavar="DIR", type=click.Path(file_okay=False),
         help="Where the embedded Apache Kafka keeps its topics, records and share state between runs, and its "
              "log (default: $XDG_DATA_HOME/kshare, i.e. ~/.local/share/kshare).")
@_option("--listen-host", env="LISTEN_HOST", default="127.0.0.1", show_default=True,
         help="Address the listeners bind to (0.0.0.0 to be reachable from other hosts).")
@_option("--port", "bootstrap_port", env="PORT", default=9192, show_default=True, type=click.IntRange(0, 65535),
         help="Port of the bootstrap listener.")
@_option("--broker-port-base", env="BROKER_PORT_BASE", type=click.IntRange(0, 65535), default=None,
         help="Broker N is served on BASE+N (default: --port + 1). 0 lets the OS choose.")
@_option("--advertised-host", env="ADVERTISED_HOST", default=None,
         help="Host name clients are told to connect to (default: the listen host).")
@_option("--max-frame-bytes", env="MAX_FRAME_BYTES", default=100 * 1024 * 1024, show_default=True,
         type=click.IntRange(1024), help="Requests larger than this close the connection, as socket.request.max.bytes does.")
@_option("--state-topic", env="STATE_TOPIC", default="__kshare_share_group_state", show_default=True,
         help="Topic of the fronted cluster that holds the durable share-group state.")
@_option("--state-topic-partitions", env="STATE_TOPIC_PARTITIONS", default=10, show_default=True,
         type=click.IntRange(1), help="Partitions of the state topic when kshare creates it.")
@_option("--state-topic-replication-factor", env="STATE_TOPIC_REPLICATION_FACTOR", default=None,
         type=click.IntRange(1), help="Replication factor of the state topic when kshare creates it "
                                      "(default: min(3, brokers)).")
@_option("--state-write-timeout", env="STATE_WRITE_TIMEOUT", default=30.0, show_default=True,
         type=click.FloatRange(5.0), metavar="SECONDS",
         help="How long a state write may take. A write that meets a leader move of the state topic (a broker "
              "restarting or failing) is sent again to the new leader for up to two thirds of it, its "
              "acknowledgements answered once it is written; past it the write fails and what it covered is "
              "delivered again.")
@_option("--drain-timeout", env="DRAIN_TIMEOUT", default=10.0, show_default=True, type=click.FloatRange(0.0),
         metavar="SECONDS",
         help="On SIGTERM, first hand no more records out and wait up to this long for the share consumers to "
              "acknowledge what they hold (written before the proxy stops), so a restart redelivers nothing; "
              "what is still held then is released. In an instance group it also bounds a rebalance's hand-over of "
              "share-partitions (docs/design/scale-out.md). 0: stop at once, no hand-over.")
@_option("--group-limit", "group_limits", env="GROUP_LIMIT", multiple=True, metavar="NAME=VALUE",
         help="A broker-level share group bound, e.g. group.share.max.size=500 (repeatable; in the "
              "environment, space-separated).")
@_option("--record-cache-mb", env="RECORD_CACHE_MB", default=256, show_default=True, type=click.IntRange(1),
         help="Memory for record batches cached for share fetches, shared by the partitions in use (an idle "
              "partition's share is released after a minute).")
@_option("--instance-group", env="INSTANCE_GROUP", default=None, metavar="NAME",
         help="Run as one of several proxies serving as one: proxies started with the same name, cluster and state "
              "topic split the share-partitions through a consumer group on the cluster and take over from each other "
              "(docs/design/scale-out.md). --advertised-host must then be reachable by clients and by the other proxies.")
@_option("--instance-session-timeout-ms", env="INSTANCE_SESSION_TIMEOUT_MS", default=10_000, show_default=True,
         type=click.IntRange(1000), help="How long the others wait for a proxy of the instance group that stopped "
                                        "answering before they take its share-partitions over.")
@_option("--instance-leadership", env="INSTANCE_LEADERSHIP", default="topic", show_default=True,
         type=click.Choice(["state-partition", "topic"], case_sensitive=False),
         help="How the instance group splits share-partition leadership: per topic (each proxy leads "
              "partitions/proxies of every topic, the state following its leader; docs/design/scale-out.md), or by "
              "state-topic partition (what earlier versions do). Every proxy of the group must say topic for it to apply.")
@_option("--tls-cert", env="TLS_CERT", default=None, metavar="PEM",
         help="Serve TLS on every client listener with this certificate (chain); reloaded on SIGHUP and when the "
              "file changes.")
@_option("--tls-key", env="TLS_KEY", default=None, metavar="PEM", help="The private key of --tls-cert.")
@_option("--tls-client-ca", env="TLS_CLIENT_CA", default=None, metavar="PEM",
         help="Require client certificates signed by this CA (mutual TLS).")
@_option("--upstream-security-protocol", env="UPSTREAM_SECURITY_PROTOCOL", default="PLAINTEXT", show_default=True,
         type=click.Choice(["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"], case_sensitive=False),
         help="How the proxy connects to the cluster (TLS for every connection; SASL for kshare's own: state topic, "
              "fetches, admin; clients authenticate themselves through the proxy).")
@_option("--upstream-sasl-mechanism", env="UPSTREAM_SASL_MECHANISM", default=None,
         type=click.Choice(["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"], case_sensitive=False),
         help="kshare's own SASL mechanism (with SASL_PLAINTEXT or SASL_SSL).")
@_option("--upstream-sasl-username", env="UPSTREAM_SASL_USERNAME", default=None, help="kshare's own SASL user.")
@_option("--upstream-sasl-password-file", env="UPSTREAM_SASL_PASSWORD_FILE", default=None, metavar="FILE",
         help="File holding kshare's SASL password (or set KSHARE_UPSTREAM_SASL_PASSWORD).")
@_option("--upstream-oauth-token-file", env="UPSTREAM_OAUTH_TOKEN_FILE", default=None, metavar="FILE",
         help="OAUTHBEARER: file holding the token, read at every authentication (rotate it in place).")
@_option("--upstream-tls-ca", env="UPSTREAM_TLS_CA", default=None, metavar="PEM",
         help="CA to verify the brokers with (default: the system's).")
@_option("--upstream-tls-cert", env="UPSTREAM_TLS_CERT", default=None, metavar="PEM",
         help="kshare's own client certificate, for brokers that require one.")
@_option("--upstream-tls-key", env="UPSTREAM_TLS_KEY", default=None, metavar="PEM", help="The key of --upstream-tls-cert.")
@_option("--no-share-groups", env="NO_SHARE_GROUPS", is_flag=True, help="Be a plain pass-through proxy.")
@_option("--metrics-port", env="METRICS_PORT", type=click.IntRange(0, 65535), default=None,
         help="Serve /metrics (Prometheus), /ready and /live over HTTP on this port (default: off).")
@_option("--metrics-host", env="METRICS_HOST", default=None,
         help="Address the metrics port binds to (default: --listen-host).")
@_option("--log-level", env="LOG_LEVEL", default="info", show_default=True,
         type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False))
@_option("--log-format", env="LOG_FORMAT", default="text", show_default=True,
         type=click.Choice(["text", "json"], case_sensitive=False))
def proxy(upstream: str | None, embedded: str, data_dir: str | None, listen_host: str, bootstrap_port: int, broker_port_base: int | None,
          advertised_host: str | None, max_frame_bytes: int, state_topic: str, state_topic_partitions: int,
          state_topic_replication_factor: int | None, state_write_timeout: float, drain_timeout: float,
          group_limits: tuple[str, ...],
          record_cache_mb: int, instance_group: str | None, instance_session_timeout_ms: int, instance_leadership: str, tls_cert: str | None, tls_key: str | None,
          tls_client_ca: str | None, upstream_security_protocol: str, upstream_sasl_mechanism: str | None,
          upstream_sasl_username: str | None, upstream_sasl_password_file: str | None,
          upstream_oauth_token_file: str | None, upstream_tls_ca: str | None, upstream_tls_cert: str | None,
          upstream_tls_key: str | None, no_share_groups: bool,
          metrics_port: int | None, metrics_host: str | None, log_level: str, log_format: str) -> None:
    """Run the proxy in front of a Kafka cluster, serving share groups.

    Clients bootstrap from --listen-host:--port. SIGTERM or SIGINT stops it cleanly (queued state
    writes finish first). Reference: docs/reference/proxy.md.
    """
    from .share.config import ConfigError, limits_from

    setup_logging(log_level, log_format)
    try:
        limits = limits_from(dict(item.split("=", 1) for item in group_limits if "=" in item))
        if any("=" not in item for item in group_limits):
            raise ConfigError("--group-limit takes NAME=VALUE")
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--group-limit") from None
    tls, security = _security_options(tls_cert, tls_key, tls_client_ca, upstream_security_protocol,
                                      upstream_sasl_mechanism, upstream_sasl_username, upstream_sasl_password_file,
                                      upstream_oauth_token_file, upstream_tls_ca, upstream_tls_cert, upstream_tls_key)
    if instance_group and not upstream:
        raise click.BadParameter("an instance group needs a cluster the proxies share: give --upstream",
                                 param_hint="--instance-group")
    if instance_group and no_share_groups:
        raise click.BadParameter("an instance group splits share groups: it cannot be used with --no-share-groups",
                                 param_hint="--instance-group")
    broker = None
    if upstream:
        ctx = click.get_current_context()
        for name in ("embedded", "data_dir"):
            if ctx.get_parameter_source(name) in (click.core.ParameterSource.COMMANDLINE,
                                                  click.core.ParameterSource.ENVIRONMENT):
                raise click.BadParameter("it picks the broker started when no --upstream is given: "
                                         "give one or the other", param_hint=f"--{name.replace('_', '-')}")
        try:
            servers = parse_hostports(upstream)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--upstream") from None
    else:
        from pathlib import Path

        from .embedded import EmbeddedError, start_embedded

        try:
            broker = start_embedded(embedded.lower(), Path(data_dir) if data_dir else None)
        except EmbeddedError as exc:
            raise click.ClickException(str(exc)) from None
        except KeyboardInterrupt:
            raise click.exceptions.Exit(130) from None
        servers = parse_hostports(broker.bootstrap)
    config = ProxyConfig(upstream=servers, listen_host=listen_host, bootstrap_port=bootstrap_port,
                         broker_port_base=broker_port_base, advertised_host=advertised_host,
                         max_frame_bytes=max_frame_bytes, state_topic=state_topic,
                         state_topic_partitions=state_topic_partitions,
                         state_topic_replication_factor=state_topic_replication_factor,
                         state_write_timeout_s=state_write_timeout, drain_timeout_s=drain_timeout,
                         group_limits=limits,
                         record_cache_bytes=record_cache_mb << 20, instance_group=instance_group or None,
                         instance_session_timeout_ms=instance_session_timeout_ms,
                         instance_leadership=instance_leadership.lower(), tls=tls,
                         upstream_security=security)
    try:
        run_proxy(config, share_groups=not no_share_groups, metrics_port=metrics_port,
                  metrics_host=metrics_host or listen_host)
    except OSError as exc:
        raise click.ClickException(f"cannot start the proxy: {exc}") from None
    finally:
        if broker is not None:
            broker.stop()


def _security_options(tls_cert, tls_key, tls_client_ca, protocol, mechanism, username, password_file,
                      token_file, up_ca, up_cert, up_key):
    """The TLS and SASL options, checked together: a clear error for every inconsistent set."""
    import os
    import ssl

    from .proxy.tls import ListenerTLS, TLSFiles, upstream_context
    from .security import ClientSecurity

    tls = None
    if tls_cert or tls_key or tls_client_ca:
        if not (tls_cert and tls_key):
            raise click.BadParameter("TLS on the listeners needs both --tls-cert and --tls-key", param_hint="--tls-cert")
        tls = TLSFiles(tls_cert, tls_key, tls_client_ca)
        try:
            ListenerTLS(tls)  # load once now: a wrong file is reported before anything starts
        except (OSError, ssl.SSLError, ValueError) as exc:
            raise click.BadParameter(f"cannot load the certificate: {exc}", param_hint="--tls-cert") from None
    protocol = protocol.upper()
    sasl = protocol.startswith("SASL_")
    if sasl and not mechanism:
        raise click.BadParameter(f"{protocol} needs --upstream-sasl-mechanism", param_hint="--upstream-security-protocol")
    if mechanism and not sasl:
        raise click.BadParameter(f"a SASL mechanism needs --upstream-security-protocol SASL_PLAINTEXT or SASL_SSL "
                                 f"(not {protocol})", param_hint="--upstream-sasl-mechanism")
    password = os.environ.get("KSHARE_UPSTREAM_SASL_PASSWORD")
    if password_file:
        try:
            with open(password_file) as f:
                password = f.read().rstrip("\n")
        except OSError as exc:
            raise click.BadParameter(str(exc), param_hint="--upstream-sasl-password-file") from None
    mechanism = mechanism.upper() if mechanism else None
    if mechanism == "OAUTHBEARER":
        if not token_file:
            raise click.BadParameter("OAUTHBEARER needs --upstream-oauth-token-file", param_hint="--upstream-sasl-mechanism")
    elif mechanism and (not username or password is None):
        raise click.BadParameter(f"{mechanism} needs --upstream-sasl-username and a password "
                                 "(--upstream-sasl-password-file or KSHARE_UPSTREAM_SASL_PASSWORD)",
                                 param_hint="--upstream-sasl-mechanism")
    context = None
    if protocol in ("SSL", "SASL_SSL"):
        try:
            context = upstream_context(up_ca, up_cert, up_key)
        except (OSError, ssl.SSLError, ValueError) as exc:
            raise click.BadParameter(f"cannot load the upstream TLS files: {exc}", param_hint="--upstream-tls-ca") from None
    elif up_ca or up_cert:
        raise click.BadParameter(f"--upstream-tls-* need --upstream-security-protocol SSL or SASL_SSL (not {protocol})",
                                 param_hint="--upstream-tls-ca")
    return tls, ClientSecurity(ssl=context, sasl_mechanism=mechanism, username=username, password=password,
                               oauth_token_file=token_file)


def run_proxy(config: ProxyConfig, *, share_groups: bool = True, metrics_port: int | None = None,
              metrics_host: str | None = None) -> None:
    import uvloop

    from .app import KShare

    async def serve() -> None:
        app = KShare(config, share_groups=share_groups, metrics_port=metrics_port,
                     metrics_host=metrics_host or config.listen_host)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        loop.add_signal_handler(signal.SIGHUP, app.reload_tls)  # new certificates for new connections
        await app.start()
        # What start-up built (modules, the codec's generated classes, clients) lives as long as the
        # process: out of the collector's sight, so that its full collections, which stop the
        # proxy, visit only what serving creates (a full collection visits every tracked object).
        gc.freeze()
        await stop.wait()
        logging.getLogger("kshare").info("signal received: shutting down")
        await app.stop()

    uvloop.run(serve())


@main.command()
@click.option("--metrics-address", default="127.0.0.1:9308", show_default=True, metavar="HOST:PORT",
              help="The proxy's metrics port (kshare proxy --metrics-port).")
@click.option("--timeout", default=60.0, show_default=True, type=click.FloatRange(0), metavar="SECONDS",
              help="Give up after this long.")
def ready(metrics_address: str, timeout: float) -> None:
    """Wait until a proxy is ready: it knows its cluster and has loaded the share state.

    Exits 0 once ready, 1 with the reason when the timeout runs out. For scripts and orchestrators
    (the same answer is on http://HOST:PORT/ready).
    """
    import urllib.error
    import urllib.request

    url = f"http://{metrics_address}/ready"
    deadline = time.monotonic() + timeout
    reason = "no answer yet"
    while True:
        try:
            with urllib.request.urlopen(url, timeout=max(0.5, min(5.0, deadline - time.monotonic()))) as resp:
                status = json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as exc:  # 503 while not ready: the body says why
            try:
                status = json.loads(exc.read() or b"{}")
            except ValueError:
                status = {"reason": f"HTTP {exc.code} from {url}"}
        except (OSError, ValueError) as exc:
            reason = f"cannot reach {url}: {getattr(exc, 'reason', exc)}"
            status = None
        if status is not None:
            if status.get("ready"):
                click.echo("ready")
                return
            reason = str(status.get("reason") or "not ready")
        if time.monotonic() >= deadline:
            raise click.ClickException(f"not ready after {timeout:g} s: {reason}")
        time.sleep(min(0.25, max(0.0, deadline - time.monotonic())))


class _BenchScenario(click.Choice):
    """A scenario's name, checked against the registry of :mod:`kshare.bench.scenarios`, imported only when a
    name is checked or listed (``--help``): it costs as much as the rest of the CLI's imports."""

    def __init__(self) -> None:
        super().__init__(())

    @property  # type: ignore[override]
    def choices(self) -> tuple[str, ...]:
        from .bench.scenarios import SCENARIOS

        return SCENARIOS

    @choices.setter
    def choices(self, _: object) -> None:
        pass  # click.Choice.__init__ sets it: the registry is the list


def _list_bench_scenarios(ctx: click.Context, _: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from .bench.scenarios import REGISTRY

    for name, s in REGISTRY.items():
        when = "no broker, " if s.broker_less else ""
        when += "only when named" if s.opt_in else "in a full run"
        click.echo(f"{name:<19} {s.title} ({when})")
    ctx.exit()


@main.command()
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Results folder (default: bench-results/<timestamp>).")
@click.option("--only", multiple=True, type=_BenchScenario(),
              help="Run only this scenario (repeatable; default: the scenarios of a full run, passthrough to "
                   "memory; the others run only when named, see --list).")
@click.option("--list", "list_scenarios", is_flag=True, expose_value=False, is_eager=True,
              callback=_list_bench_scenarios, help="List the scenarios and exit.")
@click.option("--quick", is_flag=True, help="Small sizes and one repeat: a smoke run of a few minutes.")
@click.option("--repeats", type=click.IntRange(1), default=None,
              help="Alternated repeats per configuration (default 3, 1 with --quick).")
@click.option("--upstream", default=None, metavar="HOST:PORT",
              help="Front this existing cluster instead of starting Apache Kafka 3.9 (no bare relay then).")
@click.option("--proxy-arg", "proxy_args", multiple=True, metavar="ARG",
              help="One more argument for the `kshare proxy` under test (repeatable), "
                   "e.g. --proxy-arg=--record-cache-mb --proxy-arg=128.")
@click.option("--no-plots", is_flag=True, help="Skip the PNG plots (no matplotlib needed).")
@click.option("-v", "--verbose", is_flag=True, help="Log what the bench does (broker starts, failures) to stderr.")
def bench(out_dir: str | None, only: tuple[str, ...], quick: bool, repeats: int | None, upstream: str | None,
          proxy_args: tuple[str, ...], no_plots: bool, verbose: bool) -> None:
    """Measure kshare against a bare relay, direct clients and native Kafka 4.4 share groups.

    Starts Apache Kafka 3.9 (fronted), Apache Kafka 4.4 with share groups (the reference), `kshare proxy`
    as its own process and a bare relay; runs the scenarios with a warm-up and alternated repeats and
    writes results.json, results.md (with the target ratios, met or not) and PNG plots into the results
    folder. A full run takes about 25 minutes; needs Java 17+ (and Maven the first time, to fetch
    Kafka) and `pip install 'kshare[bench]'`. `--only embedded` (25 minutes of its own) measures
    `kshare proxy` with no --upstream on its embedded broker against native Kafka 4.4 instead, and its
    time to ready; `--only spark` (about 25 minutes, needs pyspark) the kshare PySpark source against
    Spark's own Kafka source; `--only failover` (about 7 minutes) share consumers through a rolling
    restart and a crash of three brokers, kshare on Kafka 3.9 beside native Kafka 4.4. The
    micro-benchmarks (`--only codec`, `engine`, `record_keys`, `state_replay`; seconds each) need no
    broker: kshare's own units against a baseline in the same run. `--list` names every scenario,
    with the figures for the docs that run only when named (durability, state_store, key_order,
    balance, security, scale_out, scale_out_failover). Reference:
    docs/benchmarks/README.md.
    """
    from pathlib import Path

    from .bench.runner import BenchError, Options, run

    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s")
    if verbose:
        logging.getLogger("kshare.bench.clients").setLevel(logging.WARNING)
    out = Path(out_dir) if out_dir else Path("bench-results") / time.strftime("%Y%m%d-%H%M%S")
    options = Options(out=out, only=list(only), quick=quick, repeats=repeats, upstream=upstream,
                      proxy_args=list(proxy_args), plots=not no_plots)
    try:
        results = run(options)
    except BenchError as exc:
        raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:
        if (out / "results.md").exists():
            click.echo(out / "results.md")
        raise click.ClickException(f"interrupted; what ran so far is in {out}") from None
    # where the results are, on stdout (progress and notes go to stderr): for scripts and for
    # `less $(kshare bench ...)`; also when a scenario failed, since the others' results are there
    click.echo(out / "results.md")
    if results.get("errors"):
        raise click.ClickException(f"{len(results['errors'])} scenario(s) failed: {', '.join(results['errors'])} "
                                   f"(see {out / 'results.md'})")


__import__("kshare.tools", fromlist=["register_commands"]).register_commands(main)  # groups, consume, produce


if __name__ == "__main__":
    main()
