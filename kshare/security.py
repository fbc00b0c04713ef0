"""How kshare's own connections to the cluster authenticate: TLS and SASL (PLAIN, SCRAM-SHA-256/512,
OAUTHBEARER with a token file or a token provider).

One :class:`ClientSecurity` serves both kinds of clients kshare runs: its own pipelined
``KafkaConnection`` (SaslHandshake + SaslAuthenticate, below) and aiokafka's producers, consumers
and admin client (``aiokafka_kwargs``). Clients of the proxy authenticate themselves: their SASL
frames pass through the proxy to the broker untouched.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import inspect
import os
import secrets
import ssl
from dataclasses import dataclass
from typing import Any

from .protocol import messages
from .protocol.codes import ApiKey

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")


class AuthenticationFailed(ConnectionError):
    """The cluster refused kshare's credentials (or the mechanism)."""


@dataclass(frozen=True)
class ClientSecurity:
    ssl: ssl.SSLContext | None = None
    sasl_mechanism: str | None = None  # one of MECHANISMS
    username: str | None = None
    password: str | None = None
    oauth_token_file: str | None = None  # OAUTHBEARER: read at every authentication (tokens rotate)
    # OAUTHBEARER: an object with a ``token()`` coroutine (aiokafka's ``AbstractTokenProvider``), asked at
    # every authentication, and optionally ``extensions()`` (SASL extensions, RFC 7628)
    oauth_token_provider: Any = None

    @property
    def protocol(self) -> str:
        """Kafka's security.protocol name."""
        if self.sasl_mechanism:
            return "SASL_SSL" if self.ssl else "SASL_PLAINTEXT"
        return "SSL" if self.ssl else "PLAINTEXT"

    def aiokafka_kwargs(self) -> dict[str, Any]:
        out: dict[str, Any] = {"security_protocol": self.protocol}
        if self.ssl is not None:
            out["ssl_context"] = self.ssl
        if self.sasl_mechanism:
            out["sasl_mechanism"] = self.sasl_mechanism
            if self.sasl_mechanism == "OAUTHBEARER":
                out["sasl_oauth_token_provider"] = (self.oauth_token_provider if self.oauth_token_provider is not None
                                                    else _aiokafka_token_provider(self.oauth_token_file or ""))
            else:
                out["sasl_plain_username"] = self.username
                out["sasl_plain_password"] = self.password
        return out

    # -- SASL on kshare's own connection ----------------------------------------------------------
    async def authenticate(self, conn: Any) -> None:
        """Run the SASL exchange on a fresh ``KafkaConnection`` (after ApiVersions)."""
        if not self.sasl_mechanism:
            return
        mech = self.sasl_mechanism
        hs = await conn.request(ApiKey.SASL_HANDSHAKE, conn.best_version(ApiKey.SASL_HANDSHAKE, hi=1),
                                messages.message_class("SaslHandshakeRequest")(mechanism=mech))
        if hs.error_code:
            raise AuthenticationFailed(f"the cluster does not enable SASL mechanism {mech} "
                                       f"(it enables {', '.join(hs.mechanisms) or 'none'})")
        version = conn.best_version(ApiKey.SASL_AUTHENTICATE, hi=2)

        async def step(data: bytes) -> bytes:
            resp = await conn.request(ApiKey.SASL_AUTHENTICATE, version, messages.message_class("SaslAuthenticateRequest")(auth_bytes=data))
            if resp.error_code:
                raise AuthenticationFailed(f"SASL {mech} authentication as {self.username or 'the token'} failed: "
                                           f"{resp.error_message or resp.error_code}")
            return bytes(resp.auth_bytes or b"")

        if mech == "PLAIN":
            await step(b"\0" + (self.username or "").encode() + b"\0" + (self.password or "").encode())
        elif mech.startswith("SCRAM-"):
            scram = Scram(mech, self.username or "", self.password or "")
            server_first = await step(scram.client_first())
            server_final = await step(scram.client_final(server_first))
            scram.verify(server_final)
        elif mech == "OAUTHBEARER":
            challenge = await step(oauthbearer_first_message(*await self._oauth_token()))
            if challenge:
                # RFC 7628 3.2.2: a refused token is answered with an error (JSON) instead of success; the
                # client sends a lone %x01 and the server then fails the exchange with its reason
                detail = challenge.decode(errors="replace")
                try:
                    await step(b"\x01")
                except AuthenticationFailed as exc:
                    raise AuthenticationFailed(f"{exc} ({detail})") from None
                raise AuthenticationFailed(f"SASL OAUTHBEARER authentication failed: {detail}")
        else:
            raise AuthenticationFailed(f"unsupported SASL mechanism {mech}")

    async def _oauth_token(self) -> tuple[str, dict[str, str]]:
        """The token and SASL extensions for one OAUTHBEARER authentication: the provider's (its
        ``token()`` awaited now: a provider refreshes an expiring token itself), else the token file's."""
        provider = self.oauth_token_provider
        if provider is None:
            return _TokenFile(self.oauth_token_file or "").read(), {}
        token = provider.token()
        if inspect.isawaitable(token):
            token = await token
        extensions = provider.extensions() if hasattr(provider, "extensions") else {}
        if inspect.isawaitable(extensions):
            extensions = await extensions
        return str(token), dict(extensions or {})


def oauthbearer_first_message(token: str, extensions: dict[str, str] | None = None) -> bytes:
    """The OAUTHBEARER client's initial response (RFC 7628 3.1, as Kafka reads it): the GS2 header
    ``n,,``, then ``auth=Bearer <token>`` and each SASL extension as ``key=value``, each followed
    by %x01, and a final %x01. Keys are ALPHA only and ``auth`` is reserved (RFC 7628 3.1); values
    are printable ASCII, space, tab, CR and LF."""
    parts = [f"auth=Bearer {token}"]
    for key, value in (extensions or {}).items():
        if not key.isascii() or not key.isalpha() or key == "auth":
            raise ValueError(f"SASL extension name {key!r} must be ASCII letters only, and not 'auth'")
        if any(not (0x20 <= ord(ch) <= 0x7E or ch in "\t\r\n") for ch in value):
            raise ValueError(f"SASL extension {key} has a character RFC 7628 does not allow")
        parts.append(f"{key}={value}")
    return ("n,,\x01" + "".join(p + "\x01" for p in parts) + "\x01").encode()


class Scram:
    """The client side of SCRAM (RFC 5802, RFC 7677) as Kafka uses it (no channel binding)."""

    def __init__(self, mechanism: str, username: str, password: str, nonce: str | None = None) -> None:
        self.hash = hashlib.sha256 if mechanism == "SCRAM-SHA-256" else hashlib.sha512
        self.hash_name = "sha256" if mechanism == "SCRAM-SHA-256" else "sha512"
        self.username = username.replace("=", "=3D").replace(",", "=2C")
        self.password = password.encode()
        self.nonce = nonce or base64.b64encode(secrets.token_bytes(18)).decode()
        self._client_first_bare = f"n={self.username},r={self.nonce}"
        self._server_signature = b""

    def client_first(self) -> bytes:
        return f"n,,{self._client_first_bare}".encode()

    def client_final(self, server_first: bytes) -> bytes:
        text = server_first.decode()
        fields = dict(item.split("=", 1) for item in text.split(","))
        nonce, salt, iterations = fields["r"], base64.b64decode(fields["s"]), int(fields["i"])
        if not nonce.startswith(self.nonce):
            raise AuthenticationFailed("SCRAM: the server's nonce does not extend ours")
        salted = hashlib.pbkdf2_hmac(self.hash_name, self.password, salt, iterations)
        client_key = hmac.new(salted, b"Client Key", self.hash).digest()
        stored_key = self.hash(client_key).digest()
        without_proof = f"c=biws,r={nonce}"
        auth_message = f"{self._client_first_bare},{text},{without_proof}".encode()
        signature = hmac.new(stored_key, auth_message, self.hash).digest()
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        server_key = hmac.new(salted, b"Server Key", self.hash).digest()
        self._server_signature = hmac.new(server_key, auth_message, self.hash).digest()
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify(self, server_final: bytes) -> None:
        fields = dict(item.split("=", 1) for item in server_final.decode().split(","))
        if "e" in fields:
            raise AuthenticationFailed(f"SCRAM: the server refused: {fields['e']}")
        if not hmac.compare_digest(base64.b64decode(fields.get("v", "")), self._server_signature):
            raise AuthenticationFailed("SCRAM: the server's signature is wrong (not the cluster we meant?)")


class _TokenFile:
    """An OAUTHBEARER token read from a file at each use (an operator's job rotates the file)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def read(self) -> str:
        with open(os.path.expanduser(self.path)) as f:
            return f.read().strip()


def _aiokafka_token_provider(path: str) -> Any:
    from aiokafka.abc import AbstractTokenProvider

    class TokenFileProvider(AbstractTokenProvider):
        async def token(self) -> str:
            return _TokenFile(path).read()

    return TokenFileProvider()
