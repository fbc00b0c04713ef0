"""kshare's own authentication to the cluster (SCRAM, PLAIN) and the security options of `kshare proxy`."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from kshare.cli import main
from kshare.security import AuthenticationFailed, ClientSecurity, Scram


def test_scram_sha_256_matches_rfc_7677() -> None:
    # RFC 7677 section 3: user "user", password "pencil"
    scram = Scram("SCRAM-SHA-256", "user", "pencil", nonce="rOprNGfwEbeRWgbNEkqO")
    assert scram.client_first() == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    server_first = b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    assert scram.client_final(server_first) == (
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    scram.verify(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
    with pytest.raises(AuthenticationFailed, match="signature"):
        scram.verify(b"v=AAAATRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")


def test_scram_refuses_a_server_that_does_not_extend_the_nonce() -> None:
    scram = Scram("SCRAM-SHA-512", "alice", "secret", nonce="abc")
    with pytest.raises(AuthenticationFailed, match="nonce"):
        scram.client_final(b"r=xyz123,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
    with pytest.raises(AuthenticationFailed, match="refused"):
        scram.verify(b"e=invalid-proof")


def test_scram_escapes_user_names() -> None:
    assert Scram("SCRAM-SHA-256", "a=b,c", "p", nonce="n").client_first() == b"n,,n=a=3Db=2Cc,r=n"


def test_security_protocol_names_and_aiokafka_settings() -> None:
    assert ClientSecurity().protocol == "PLAINTEXT"
    s = ClientSecurity(sasl_mechanism="SCRAM-SHA-512", username="kshare", password="pw")
    assert s.protocol == "SASL_PLAINTEXT"
    assert s.aiokafka_kwargs() == {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-512",
                                   "sasl_plain_username": "kshare", "sasl_plain_password": "pw"}


@pytest.mark.parametrize(("args", "message"), [
    (["--tls-cert", "/nonexistent.pem"], "needs both --tls-cert and --tls-key"),
    (["--tls-cert", "/nonexistent.pem", "--tls-key", "/nonexistent.key"], "cannot load the certificate"),
    (["--upstream-security-protocol", "SASL_SSL"], "needs --upstream-sasl-mechanism"),
    (["--upstream-sasl-mechanism", "PLAIN"], "needs --upstream-security-protocol SASL_PLAINTEXT or SASL_SSL"),
    (["--upstream-security-protocol", "SASL_PLAINTEXT", "--upstream-sasl-mechanism", "SCRAM-SHA-256"],
     "needs --upstream-sasl-username and a password"),
    (["--upstream-security-protocol", "SASL_PLAINTEXT", "--upstream-sasl-mechanism", "OAUTHBEARER"],
     "needs --upstream-oauth-token-file"),
    (["--upstream-tls-ca", "/ca.pem"], "need --upstream-security-protocol SSL or SASL_SSL"),
    (["--upstream-security-protocol", "SSL", "--upstream-tls-ca", "/nonexistent-ca.pem"],
     "cannot load the upstream TLS files"),
])
def test_inconsistent_security_options_are_refused_clearly(args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["proxy", "--upstream", "127.0.0.1:1", *args],
                                env={"KSHARE_UPSTREAM_SASL_PASSWORD": ""} if "OAUTHBEARER" in args else {})
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output
