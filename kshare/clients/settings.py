"""Client settings from the properties a user gives kshare's tools and the Spark source: a
``--command-config`` file (Java ``.properties``, as Kafka's own tools read), librdkafka-style TLS and
SASL properties as a :class:`~kshare.security.ClientSecurity`, and ``--bootstrap-server`` lists.
Mistakes raise :class:`~kshare.clients.admin.AdminError` saying what is wrong, in one line."""

from __future__ import annotations

import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..addresses import parse_hostports
from ..security import ClientSecurity
from .admin import AdminError

SUPPORTED_PROPERTIES = ("client.id", "security.protocol", "request.timeout.ms", "default.api.timeout.ms",
                        "sasl.mechanism", "sasl.username", "sasl.password", "sasl.jaas.config",
                        "ssl.ca.location", "ssl.certificate.location", "ssl.key.location",
                        "ssl.endpoint.identification.algorithm", "bootstrap.servers")
PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")


@dataclass(slots=True)
class ClientSettings:
    client_id: str = "kshare-groups"
    request_timeout_ms: int | None = None
    default_api_timeout_ms: int | None = None
    security: ClientSecurity | None = None


def parse_properties(text: str) -> dict[str, str]:
    """Java ``.properties`` lines: ``key=value``, ``key: value`` or ``key value``; ``#``/``!`` comments."""
    props: dict[str, str] = {}
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line[0] in "#!"):
            continue
        if line.endswith("\\") and not line.endswith("\\\\"):
            pending += line[:-1]
            continue
        line, pending = pending + line, ""
        for i, ch in enumerate(line):
            if ch in "=:" or ch.isspace():
                key, rest = line[:i], line[i + 1:].lstrip()
                if ch.isspace() and rest[:1] in ("=", ":"):
                    rest = rest[1:].lstrip()
                break
        else:
            key, rest = line, ""
        props[key.strip()] = rest
    return props


def load_command_config(path: str | Path) -> ClientSettings:
    """The settings of a ``--command-config`` file; unsupported properties raise :class:`AdminError`."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise AdminError(f"cannot read --command-config {path}: {exc.strerror or exc}") from None
    props = parse_properties(text)
    settings = ClientSettings()
    unknown = sorted(k for k in props if k not in SUPPORTED_PROPERTIES)
    if unknown:
        raise AdminError(f"--command-config {path}: unsupported propert{'ies' if len(unknown) > 1 else 'y'} "
                         f"{', '.join(unknown)} (supported: {', '.join(SUPPORTED_PROPERTIES[:-1])})")
    settings.security = _security(f"--command-config {path}", props)
    if "client.id" in props:
        settings.client_id = props["client.id"]
    for key, attr in (("request.timeout.ms", "request_timeout_ms"),
                      ("default.api.timeout.ms", "default_api_timeout_ms")):
        if key in props:
            try:
                setattr(settings, attr, int(props[key]))
            except ValueError:
                raise AdminError(f"--command-config {path}: {key} must be an integer") from None
    return settings


def client_security(props: Mapping[str, str], where: str = "client properties") -> ClientSecurity | None:
    """TLS and SASL from librdkafka-style properties (``sasl.username``/``sasl.password``,
    ``ssl.ca.location``) or Java's ``sasl.jaas.config``; None for PLAINTEXT. Raises AdminError
    saying what is wrong."""
    return _security(where, props)


def _security(where: str, props: Mapping[str, str]) -> ClientSecurity | None:
    protocol = props.get("security.protocol", "PLAINTEXT").strip().upper()
    if protocol not in PROTOCOLS:
        raise AdminError(f"{where}: security.protocol={protocol} is not one of {', '.join(PROTOCOLS)}")
    if protocol == "PLAINTEXT":
        return None
    context = None
    if protocol in ("SSL", "SASL_SSL"):
        try:
            context = ssl.create_default_context(cafile=props.get("ssl.ca.location") or None)
            if props.get("ssl.endpoint.identification.algorithm", "https").strip().lower() in ("", "none"):
                context.check_hostname = False
            if props.get("ssl.certificate.location"):
                context.load_cert_chain(props["ssl.certificate.location"], props.get("ssl.key.location") or None)
        except (OSError, ssl.SSLError) as exc:
            raise AdminError(f"{where}: cannot load the TLS files: {exc}") from None
    mechanism = None
    username = props.get("sasl.username")
    password = props.get("sasl.password")
    if protocol.startswith("SASL_"):
        mechanism = props.get("sasl.mechanism", "PLAIN").strip().upper()
        if mechanism not in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
            raise AdminError(f"{where}: sasl.mechanism={mechanism} is not supported "
                             f"(PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)")
        jaas = props.get("sasl.jaas.config", "")
        username = username or next(iter(re.findall(r'username="([^"]*)"', jaas)), None)
        password = password or next(iter(re.findall(r'password="([^"]*)"', jaas)), None)
        if not username or password is None:
            raise AdminError(f"{where}: {mechanism} needs sasl.username and sasl.password "
                             f"(or sasl.jaas.config)")
    return ClientSecurity(ssl=context, sasl_mechanism=mechanism, username=username, password=password)


def parse_bootstrap(value: str) -> list[tuple[str, int]]:
    """``--bootstrap-server`` (or ``kafka.bootstrap.servers``): ``"h1:9092,h2:9092"`` as (host, port) pairs."""
    return parse_hostports(value, not_hostport=lambda item: AdminError(f"--bootstrap-server: '{item}' is not HOST:PORT"),
                           nothing=lambda: AdminError("--bootstrap-server is empty"))
