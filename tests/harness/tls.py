"""Throwaway TLS material for tests: a CA, server and client certificates, an expired one.

:func:`make_tls` writes everything into a directory (a new temporary one by default) with the
``openssl`` command line tool (no Python dependency) and returns a :class:`TlsMaterial` of paths:

* ``ca_cert`` / ``ca_key``        the test CA (self-signed, EC P-256)
* ``server_cert`` / ``server_key``  signed by the CA; SAN ``IP:127.0.0.1, DNS:localhost``
  (``server_chain``: certificate + CA, for servers that want the whole chain in one file)
* ``client_cert`` / ``client_key``  signed by the CA, ``CN=alice``, extendedKeyUsage clientAuth
* ``expired_cert`` / ``expired_key``  signed by the CA, same SANs as the server, valid only in 2020
  (usable as a server or as a client certificate, refused by any verifier)
* ``other_ca_cert`` and ``untrusted_cert`` / ``untrusted_key``: a second CA and a server certificate it
  signed (valid and well-formed, but not trusted by anyone who trusts ``ca_cert``)
* ``server_p12`` and ``client_p12`` (password ``p12_password``): the server's and the client's key and
  chain as PKCS12 keystores, for Java (``ssl.keystore.type=PKCS12``); Java trusts ``ca_cert``
  directly through ``ssl.truststore.type=PEM``.

Keys are unencrypted PKCS#8 PEM.  No pytest imports: shared with benchmarks and .ci.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

__all__ = ["TlsMaterial", "make_tls", "TlsError"]

DEFAULT_HOSTS = ("127.0.0.1", "localhost")


class TlsError(RuntimeError):
    """openssl failed (or is missing)."""


@dataclass(frozen=True)
class TlsMaterial:
    dir: Path
    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    server_chain: Path
    client_cert: Path
    client_key: Path
    expired_cert: Path
    expired_key: Path
    other_ca_cert: Path
    untrusted_cert: Path
    untrusted_key: Path
    server_p12: Path
    client_p12: Path
    p12_password: str
    hosts: tuple[str, ...] = DEFAULT_HOSTS

    @property
    def ca_path(self) -> str:
        return str(self.ca_cert)

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def _openssl(*args: str | Path, cwd: Path) -> None:
    exe = shutil.which("openssl")
    if exe is None:
        raise TlsError("the openssl command line tool is not on PATH")
    proc = subprocess.run(
        [exe, *map(str, args)], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        timeout=60,
    )
    if proc.returncode != 0:
        raise TlsError(f"openssl {' '.join(map(str, args))} failed ({proc.returncode}):\n{proc.stdout}")


def _key(path: Path, cwd: Path) -> Path:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", path, cwd=cwd)
    path.chmod(0o600)
    return path


def _san(hosts: tuple[str, ...]) -> str:
    parts = []
    for h in hosts:
        is_ip = h.replace(".", "").isdigit() or ":" in h
        parts.append(f"IP:{h}" if is_ip else f"DNS:{h}")
    return ",".join(parts)


def _self_signed_ca(d: Path, name: str, cn: str) -> tuple[Path, Path]:
    key = _key(d / f"{name}.key", d)
    cert = d / f"{name}.pem"
    _openssl(
        "req", "-x509", "-new", "-key", key, "-sha256", "-days", "3650", "-subj", f"/O=kshare tests/CN={cn}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        "-addext", "subjectKeyIdentifier=hash",
        "-out", cert,
        cwd=d,
    )
    return cert, key


def _sign(
    d: Path, name: str, cn: str, ca: tuple[Path, Path], *, extensions: str,
    start: str | None = None, end: str | None = None,
) -> tuple[Path, Path]:
    """A certificate for a new key, signed by ``ca`` with ``openssl ca`` (which can back-date)."""
    key = _key(d / f"{name}.key", d)
    csr = d / f"{name}.csr"
    _openssl("req", "-new", "-key", key, "-subj", f"/O=kshare tests/CN={cn}", "-out", csr, cwd=d)
    db = d / f"ca-db-{name}"
    db.mkdir()
    (db / "index.txt").write_text("")
    conf = db / "ca.cnf"
    conf.write_text(
        textwrap.dedent(
            f"""\
            [ca]
            default_ca = test_ca
            [test_ca]
            database = {db}/index.txt
            new_certs_dir = {db}
            rand_serial = yes
            default_md = sha256
            default_days = 3650
            policy = anything
            copy_extensions = none
            unique_subject = no
            email_in_dn = no
            [anything]
            organizationName = optional
            commonName = supplied
            [ext]
            {extensions}
            """
        )
    )
    cert = d / f"{name}.pem"
    args: list[str | Path] = [
        "ca", "-batch", "-notext", "-config", conf, "-extensions", "ext",
        "-cert", ca[0], "-keyfile", ca[1], "-in", csr, "-out", cert,
    ]
    if start:
        args += ["-startdate", start]
    if end:
        args += ["-enddate", end]
    _openssl(*args, cwd=d)
    csr.unlink()
    shutil.rmtree(db)
    return cert, key


def make_tls(directory: Path | str | None = None, *, hosts: tuple[str, ...] = DEFAULT_HOSTS) -> TlsMaterial:
    """Create the CA, certificates and keystore described in the module docstring in ``directory``."""
    d = Path(directory) if directory is not None else Path(tempfile.mkdtemp(prefix="kshare-tls-"))
    d.mkdir(parents=True, exist_ok=True)
    ca = _self_signed_ca(d, "ca", "kshare test CA")
    san = _san(hosts)
    server_ext = (
        f"subjectAltName = {san}\n"
        "basicConstraints = critical,CA:FALSE\n"
        "keyUsage = critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage = serverAuth,clientAuth\n"
        "authorityKeyIdentifier = keyid"
    )
    client_ext = (
        "basicConstraints = critical,CA:FALSE\n"
        "keyUsage = critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage = clientAuth\n"
        "authorityKeyIdentifier = keyid"
    )
    server = _sign(d, "server", hosts[0], ca, extensions=server_ext)
    client = _sign(d, "client", "alice", ca, extensions=client_ext)
    expired = _sign(d, "expired", hosts[0], ca, extensions=server_ext,
                    start="20200101000000Z", end="20200201000000Z")
    other_ca = _self_signed_ca(d, "other-ca", "kshare untrusted test CA")
    untrusted = _sign(d, "untrusted", hosts[0], other_ca, extensions=server_ext)
    chain = d / "server-chain.pem"
    chain.write_text(server[0].read_text() + ca[0].read_text())
    password = "kshare-test"
    for name, (cert, key) in (("server", server), ("client", client)):
        _openssl(
            "pkcs12", "-export", "-in", cert, "-inkey", key, "-certfile", ca[0],
            "-name", name, "-out", d / f"{name}.p12", "-passout", f"pass:{password}",
            cwd=d,
        )
    return TlsMaterial(
        dir=d,
        ca_cert=ca[0],
        ca_key=ca[1],
        server_cert=server[0],
        server_key=server[1],
        server_chain=chain,
        client_cert=client[0],
        client_key=client[1],
        expired_cert=expired[0],
        expired_key=expired[1],
        other_ca_cert=other_ca[0],
        untrusted_cert=untrusted[0],
        untrusted_key=untrusted[1],
        server_p12=d / "server.p12",
        client_p12=d / "client.p12",
        p12_password=password,
        hosts=tuple(hosts),
    )


if __name__ == "__main__":  # python -m tests.harness.tls [DIR]: make the material and print the paths
    import sys

    m = make_tls(sys.argv[1] if len(sys.argv) > 1 else None)
    for field, value in vars(m).items():
        print(f"{field:15} {value}")
