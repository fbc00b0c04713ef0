"""SASL/OAUTHBEARER's client message (RFC 7628) and ``AIOShareConsumer``'s OAUTHBEARER options; the
exchange with a broker is tests/integration/test_aio_share_oauthbearer.py."""

from __future__ import annotations

import asyncio
import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kshare import AIOShareConsumer
from kshare.security import ClientSecurity, oauthbearer_first_message

TOKEN = st.text(alphabet=string.ascii_letters + string.digits + "-._~+/=", min_size=1, max_size=80)
KEYS = st.text(alphabet=string.ascii_letters, min_size=1, max_size=12).filter(lambda k: k != "auth")
VALUES = st.text(alphabet="".join(chr(c) for c in range(0x20, 0x7F)) + "\t\r\n", max_size=30)


def parse(message: bytes) -> tuple[str, dict[str, str]]:
    """The reference reading of RFC 7628's client-resp: gs2-header kvsep *kvpair kvsep."""
    text = message.decode()
    header, sep, rest = text.partition("\x01")
    assert header == "n,," and sep and rest.endswith("\x01\x01")
    pairs = dict(kv.split("=", 1) for kv in rest[:-2].split("\x01"))
    auth = pairs.pop("auth")
    assert auth.startswith("Bearer ")
    return auth[len("Bearer ") :], pairs


@given(TOKEN, st.dictionaries(KEYS, VALUES, max_size=4))
def test_first_message_reads_back(token: str, extensions: dict[str, str]) -> None:
    assert parse(oauthbearer_first_message(token, extensions)) == (token, extensions)


def test_first_message_without_extensions_is_kafkas() -> None:
    assert oauthbearer_first_message("a.b.") == b"n,,\x01auth=Bearer a.b.\x01\x01"


@pytest.mark.parametrize("ext", [{"auth": "x"}, {"a1": "x"}, {"": "x"}, {"k": "\x01"}, {"k": "é"}])
def test_bad_extensions_refused(ext: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        oauthbearer_first_message("t", ext)


class Provider:
    def __init__(self) -> None:
        self.calls = 0

    async def token(self) -> str:
        self.calls += 1
        return f"token-{self.calls}"

    def extensions(self) -> dict[str, str]:
        return {"tenant": "blue"}


def test_provider_asked_at_each_authentication() -> None:
    p = Provider()
    s = ClientSecurity(sasl_mechanism="OAUTHBEARER", oauth_token_provider=p)
    assert asyncio.run(s._oauth_token()) == ("token-1", {"tenant": "blue"})
    assert asyncio.run(s._oauth_token()) == ("token-2", {"tenant": "blue"})
    assert s.aiokafka_kwargs()["sasl_oauth_token_provider"] is p


def test_consumer_options() -> None:
    with pytest.raises(ValueError, match="sasl_oauth_token_provider"):
        AIOShareConsumer("t", group_id="g", security_protocol="SASL_SSL", sasl_mechanism="OAUTHBEARER")
    p = Provider()
    c = AIOShareConsumer(
        "t",
        group_id="g",
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="oauthbearer",
        sasl_oauth_token_provider=p,
    )
    assert c._security is not None
    assert (c._security.protocol, c._security.sasl_mechanism, c._security.oauth_token_provider) == (
        "SASL_PLAINTEXT",
        "OAUTHBEARER",
        p,
    )
