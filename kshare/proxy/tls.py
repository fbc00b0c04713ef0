"""TLS on the proxy's client listeners, and to the upstream cluster.

Client side: one server context for every listener (bootstrap and per-broker), from
``--tls-cert``/``--tls-key`` (PEM), requiring client certificates signed by ``--tls-client-ca``
when given (mutual TLS). :meth:`ListenerTLS.reload` loads the files again into the same context,
so new connections get the new certificate while open ones keep theirs; the proxy calls it on
SIGHUP and when the files change (checked every ``WATCH_INTERVAL_S``). A certificate that fails
to load is logged and the previous one stays. An instance group's connections to the other
proxies (:func:`peer_context`) follow the reload (:func:`refresh_peer_context`).

Upstream side: a client context for the proxy's connections to the brokers (``--upstream-tls``,
``--upstream-tls-ca``, and a certificate of kshare's own for brokers that require one).
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass

from .loop_reports import demote_reports

log = logging.getLogger("kshare.proxy")

WATCH_INTERVAL_S = 5.0


@dataclass(frozen=True)
class TLSFiles:
    cert: str
    key: str
    client_ca: str | None = None  # require client certificates signed by this CA (mutual TLS)


class ListenerTLS:
    def __init__(self, files: TLSFiles) -> None:
        self.files = files
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._load()  # a bad file at start-up is an error the caller reports
        self._stamp = self._mtimes()
        self._watch: asyncio.Task | None = None
        # called after every reload that loaded (e.g. the instance group's peer context, which
        # trusts this certificate's chain: ``refresh_peer_context``)
        self.reloaded: list[Callable[[], None]] = []

    def _load(self) -> None:
        self.context.load_cert_chain(self.files.cert, self.files.key)
        if self.files.client_ca:
            self.context.load_verify_locations(self.files.client_ca)
            self.context.verify_mode = ssl.CERT_REQUIRED

    def _mtimes(self) -> tuple[float, ...]:
        out = []
        for path in (self.files.cert, self.files.key, self.files.client_ca):
            try:
                out.append(os.stat(path).st_mtime if path else 0.0)
            except OSError:
                out.append(-1.0)
        return tuple(out)

    def reload(self, why: str = "SIGHUP") -> bool:
        """Load the certificate, key and client CA again; whether they loaded."""
        try:
            self._load()
        except (OSError, ssl.SSLError, ValueError) as exc:
            log.error("TLS: reloading %s (%s) failed: %s; the previous certificate stays in use",
                      self.files.cert, why, exc)
            return False
        self._stamp = self._mtimes()
        log.info("TLS: certificate %s reloaded (%s); new connections use it", self.files.cert, why)
        for hook in self.reloaded:
            try:
                hook()
            except (OSError, ssl.SSLError, ValueError) as exc:
                log.error("TLS: after reloading %s (%s): %s", self.files.cert, why, exc)
        return True

    def watch(self) -> None:
        """Reload when the files change (e.g. a Kubernetes secret or cert-manager renewal)."""
        if self._watch is None:
            self._watch = asyncio.get_running_loop().create_task(self._watch_loop())

    async def _watch_loop(self) -> None:
        while True:
            await asyncio.sleep(WATCH_INTERVAL_S)
            stamp = self._mtimes()
            if stamp != self._stamp:
                if not self.reload("files changed"):
                    self._stamp = stamp  # tried this version: wait for the next change

    def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None


def quiet_hang_ups(loop: asyncio.AbstractEventLoop) -> None:
    """A TLS peer that hangs up while a handshake is still in flight (a load balancer's health
    check, a port scan, a client closing at once, and with it the proxy's TLS connection to the
    broker) makes uvloop report "Fatal error on SSL protocol" with a traceback at ERROR (its SSL
    protocol writes to the transport it is closing). Nothing was lost and nobody is to blame:
    those reports go to DEBUG, everything else to the loop's previous handler."""
    demote_reports(loop, "TLS hang-ups", _hang_up, log)


def _hang_up(context: dict) -> str | None:
    if str(context.get("message", "")).startswith("Fatal error on SSL") and isinstance(
            context.get("exception"), (RuntimeError, ConnectionError, ssl.SSLError, OSError)):
        return "a TLS peer hung up"
    return None


def upstream_context(ca: str | None = None, cert: str | None = None, key: str | None = None,
                     check_hostname: bool = True) -> ssl.SSLContext:
    """A client context for connections to the brokers (system CAs unless ``ca`` is given)."""
    ctx = ssl.create_default_context(cafile=ca)
    ctx.check_hostname = check_hostname
    if cert:
        ctx.load_cert_chain(cert, key)
    return ctx


def peer_context(cert: str, key: str, client_ca: str | None = None) -> ssl.SSLContext:
    """A client context for one proxy of an instance group reaching another's TLS listener: it
    presents this proxy's certificate (where client certificates are required) and trusts
    ``client_ca`` (``--tls-client-ca``) or else the system CAs, and in any case the certificates
    of this proxy's own chain (``cert``): the proxies of one group serve certificates of one issuer
    (often one certificate), so each trusts what vouches for its own, however private the CA. Any
    certificate of the chain is an anchor (partial chains), the host name is still checked."""
    ctx = upstream_context(client_ca, cert, key)
    ctx.load_verify_locations(cafile=cert)
    ctx.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    return ctx


def refresh_peer_context(ctx: ssl.SSLContext, cert: str, key: str) -> None:
    """The listeners' certificate was reloaded (SIGHUP, or its files changed): new connections to
    the other proxies present the new one and trust its chain too. What was trusted stays trusted
    (peers not reloaded yet still serve certificates of the old chain during a rotation)."""
    ctx.load_cert_chain(cert, key)
    ctx.load_verify_locations(cafile=cert)
    log.info("TLS: connections to the instance group's other proxies present %s and trust its chain", cert)
