"""How one proxy of an instance group checks another's TLS listener (``kshare.proxy.tls.peer_context``):
it trusts the certificates of its own ``--tls-cert`` chain, so proxies serving certificates of one
private CA (or one certificate) reach each other with no CA configured; a certificate of another CA
is still refused, and so is a host name the certificate does not name."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest

from kshare.proxy.tls import peer_context, upstream_context
from tests.harness.tls import TlsMaterial, _san, _sign


async def _handshake(client: ssl.SSLContext, cert: Path, key: Path, host: str = "127.0.0.1") -> None:
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert, key)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port, ssl=client), 10)
        writer.close()
    finally:
        server.close()
        await server.wait_closed()


def handshake(client: ssl.SSLContext, cert: Path, key: Path, host: str = "127.0.0.1") -> None:
    asyncio.run(_handshake(client, cert, key, host))


def _server_cert(tls: TlsMaterial, d: Path, name: str, hosts: tuple[str, ...]) -> tuple[Path, Path]:
    return _sign(d, name, f"kshare-{name}", (tls.ca_cert, tls.ca_key),
                 extensions=f"subjectAltName={_san(hosts)}\nextendedKeyUsage=serverAuth")


@pytest.fixture(scope="module")
def second_server(tls_material: TlsMaterial, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Another proxy's certificate: a new key, signed by the same CA, for 127.0.0.1."""
    return _server_cert(tls_material, tmp_path_factory.mktemp("peer-tls"), "peer", ("127.0.0.1", "localhost"))


def test_proxies_sharing_one_certificate_trust_each_other(tls_material: TlsMaterial) -> None:
    """Each proxy serves the same certificate (no CA in the file): it is its own anchor."""
    handshake(peer_context(str(tls_material.server_cert), str(tls_material.server_key)),
              tls_material.server_cert, tls_material.server_key)


def test_proxies_with_certificates_of_one_private_ca_trust_each_other(
        tls_material: TlsMaterial, second_server: tuple[Path, Path]) -> None:
    handshake(peer_context(str(tls_material.server_chain), str(tls_material.server_key)), *second_server)
    # without the chain's certificates as anchors (the system CAs only) the same handshake fails
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(upstream_context(None, str(tls_material.server_chain), str(tls_material.server_key)), *second_server)


def test_a_certificate_of_another_ca_or_for_another_host_is_refused(
        tls_material: TlsMaterial, tmp_path_factory: pytest.TempPathFactory) -> None:
    ctx = peer_context(str(tls_material.server_chain), str(tls_material.server_key))
    with pytest.raises(ssl.SSLCertVerificationError, match="unable to get local issuer"):
        handshake(ctx, tls_material.untrusted_cert, tls_material.untrusted_key)
    elsewhere = _server_cert(tls_material, tmp_path_factory.mktemp("peer-tls-host"), "elsewhere",
                             ("elsewhere.example",))
    with pytest.raises(ssl.SSLCertVerificationError, match="IP address mismatch"):
        handshake(ctx, *elsewhere)


def test_a_reloaded_certificate_of_another_issuer_is_trusted_by_new_peer_connections(
        tls_material: TlsMaterial, tmp_path: Path) -> None:
    """The listeners' certificate is rotated to another CA's (SIGHUP, or its files changed): the
    proxy's connections to the other proxies of its instance group, made after the reload, present
    the new certificate and trust its chain, as the other proxies, rotated too, serve it; the old
    chain stays trusted for those not rotated yet. Through the proxy as it is built (``KShare``)."""
    import shutil

    from kshare.app import KShare
    from kshare.proxy.config import ProxyConfig
    from kshare.proxy.tls import TLSFiles

    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(tls_material.server_chain, cert)
    shutil.copy(tls_material.server_key, key)
    app = KShare(ProxyConfig(upstream=[("127.0.0.1", 9)], instance_group="rotation", tls=TLSFiles(str(cert), str(key))))
    peers = app.service.peers.security.ssl
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(peers, tls_material.untrusted_cert, tls_material.untrusted_key)  # another CA: refused
    shutil.copy(tls_material.untrusted_cert, cert)
    shutil.copy(tls_material.untrusted_key, key)
    assert app.proxy.tls.reload("test")
    handshake(peers, tls_material.untrusted_cert, tls_material.untrusted_key)
    handshake(peers, tls_material.server_cert, tls_material.server_key)  # not rotated yet: still trusted
