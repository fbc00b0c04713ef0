"""``kshare.AIOShareConsumer`` with SASL/OAUTHBEARER (``sasl_oauth_token_provider``), against brokers
whose SASL_PLAINTEXT listener enables OAUTHBEARER with Kafka's default validator for it
(``OAuthBearerUnsecuredValidatorCallbackHandler``: unsigned JWS tokens, the principal is the ``sub``
claim, an expired token refused) and ``StandardAuthorizer`` without ``allow.everyone``:

* native Apache Kafka 4.4 (share groups), the consumer authenticating to the broker itself;
* kshare in front of Apache Kafka 3.9: the consumer's SASL exchange passes through kshare to the
  broker (kshare terminates no client SASL), and kshare authenticates its own connections with
  OAUTHBEARER too (``--upstream-oauth-token-file``), so kshare's own OAUTHBEARER meets a broker here.

On both: alice (READ on the topic and her group) reads every record once, the token provider being
asked for a token at each authentication; carol (READ on the topic, nothing on her group) gets
GROUP_AUTHORIZATION_FAILED (the token's subject is the principal the ACLs see); an expired token gets
SASL_AUTHENTICATION_FAILED. The two brokers are the module's own (the session's secure brokers
enable SCRAM and PLAIN only).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka.abc import AbstractTokenProvider

from kshare import AIOShareConsumer
from kshare.clients.errors import KafkaError
from tests.harness.brokers import KAFKA3_VERSION, KAFKA4_VERSION, SecureKafkaBroker
from tests.harness.security import KSHARE_STATE_TOPIC_OPS, KSHARE_TOPIC_OPS, set_earliest, start_kshare
from tests.harness.share import KAFKA4_TEST_LIMITS, produce, values

pytestmark = [pytest.mark.kafka, pytest.mark.kafka4]

KSHARE, KAFKA4 = "kshare", "kafka4"
PREFIX = f"aio-oauth-{uuid.uuid4().hex[:6]}"
LISTENER = "SASL_PLAINTEXT"
# OAUTHBEARER beside PLAIN (the harness's admin user administers ACLs with PLAIN); without a server
# callback handler of its own a listener validates unsecured JWS tokens
OAUTH_JAAS = 'org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required unsecuredLoginStringClaim_sub="admin";'
OAUTH_CONFIG = {
    "sasl.enabled.mechanisms": "PLAIN,OAUTHBEARER",
    f"listener.name.{LISTENER.lower()}.oauthbearer.sasl.jaas.config": OAUTH_JAAS,
}


def unsecured_jws(subject: str, lifetime_s: float = 3600.0) -> str:
    """An unsigned JWS (``alg: none``) for ``subject``, expiring in ``lifetime_s`` (negative: expired)."""

    def part(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    now = time.time()
    return f"{part({'alg': 'none'})}.{part({'sub': subject, 'iat': now - 60, 'exp': now + lifetime_s})}."


class Tokens(AbstractTokenProvider):
    """aiokafka's token provider interface: a fresh token for ``subject`` at each ``token()``."""

    def __init__(self, subject: str, lifetime_s: float = 3600.0) -> None:
        self.subject, self.lifetime_s, self.calls = subject, lifetime_s, 0

    async def token(self) -> str:
        self.calls += 1
        await asyncio.sleep(0)  # a real provider awaits its identity provider here
        return unsecured_jws(self.subject, self.lifetime_s)


@dataclasses.dataclass
class OAuthTarget:
    name: str
    bootstrap: str
    broker: SecureKafkaBroker

    def admin_conf(self) -> dict[str, Any]:
        return self.broker.client_config("admin", LISTENER, "PLAIN", **{"bootstrap.servers": self.bootstrap})

    def consumer(self, topic: str, group: str, tokens: Tokens) -> AIOShareConsumer:
        return AIOShareConsumer(
            topic,
            bootstrap_servers=self.bootstrap,
            group_id=group,
            fetch_max_wait_ms=200,
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="OAUTHBEARER",
            sasl_oauth_token_provider=tokens,
        )


def _broker(version: str, **kw: Any) -> SecureKafkaBroker:
    return SecureKafkaBroker(
        version,
        security_protocols=[LISTENER],
        sasl_mechanisms=["PLAIN"],
        config={**OAUTH_CONFIG, **kw.pop("config", {})},
        **kw,
    )


@pytest.fixture(scope="module")
def oauth_targets(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, OAuthTarget]]:
    d: Path = tmp_path_factory.mktemp("aio-oauth")
    with (
        _broker(KAFKA4_VERSION, share_groups=True, config=KAFKA4_TEST_LIMITS) as k4,
        _broker(KAFKA3_VERSION) as k3,
    ):
        token_file = d / "kshare-token"
        token_file.write_text(unsecured_jws("kshare", 24 * 3600))
        token_file.chmod(0o600)
        state_topic = f"__kshare_state_{PREFIX}"
        granted = k3.grant("kshare", "topic", state_topic, *KSHARE_STATE_TOPIC_OPS)
        granted += k3.grant("kshare", "topic", PREFIX, *KSHARE_TOPIC_OPS, pattern="PREFIXED")
        proxy = start_kshare(
            [
                "--upstream",
                k3.secure_bootstrap[LISTENER],
                "--upstream-security-protocol",
                LISTENER,
                "--upstream-sasl-mechanism",
                "OAUTHBEARER",
                "--upstream-oauth-token-file",
                str(token_file),
                "--state-topic",
                state_topic,
                "--state-topic-partitions",
                "1",
            ]
        )
        try:
            yield {
                KSHARE: OAuthTarget(KSHARE, proxy.bootstrap, k3),
                KAFKA4: OAuthTarget(KAFKA4, k4.secure_bootstrap[LISTENER], k4),
            }
        finally:
            proxy.stop()
            k3.revoke(granted)


def _error(exc: BaseException | None) -> tuple[str, int | None] | None:
    return None if exc is None else (type(exc).__name__, getattr(exc, "errno", None))


async def refusal(c: AIOShareConsumer, seconds: float) -> BaseException | None:
    """What ``c`` raises within ``seconds`` of starting (None: nothing, and no record either)."""
    try:
        await c.start()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if await c.getmany(timeout_ms=300):
                return None
        return None
    except KafkaError as exc:
        return exc
    finally:
        await c.stop()


async def oauth_scenario(t: OAuthTarget, topic: str, group: str) -> dict[str, Any]:
    b = t.broker
    b.create_topic(topic, 2)
    vals = values(topic, 20)
    await asyncio.to_thread(produce, b.bootstrap, topic, vals, partitions=2)
    groups = {who: f"{group}-{who}" for who in ("alice", "carol")}
    granted = b.grant("alice", "topic", topic, "READ") + b.grant("alice", "group", groups["alice"], "READ")
    granted += b.grant("carol", "topic", topic, "READ")  # and nothing on her group
    out: dict[str, Any] = {}
    try:
        for g in groups.values():
            await asyncio.to_thread(set_earliest, t.admin_conf(), g)
        tokens = Tokens("alice")
        got: list[Any] = []
        async with t.consumer(topic, groups["alice"], tokens) as alice:
            deadline = time.monotonic() + 60
            while len(got) < len(vals):
                assert time.monotonic() < deadline, f"{len(got)} of {len(vals)} records"
                got += [r for rs in (await alice.getmany(timeout_ms=500)).values() for r in rs]
        out["alice"] = sorted((r.value, r.delivery_count) for r in got) == sorted((v, 1) for v in vals)
        out["tokens_asked"] = tokens.calls >= 1
        out["carol"] = _error(await refusal(t.consumer(topic, groups["carol"], Tokens("carol")), 5))
        out["expired"] = _error(await refusal(t.consumer(topic, groups["alice"], Tokens("alice", -600)), 1))
    finally:
        b.revoke(granted)
    return out


def test_oauthbearer_reads_and_is_authorized_as_the_tokens_subject(oauth_targets):
    tag = uuid.uuid4().hex[:6]
    topic, group = f"{PREFIX}-t-{tag}", f"{PREFIX}-g-{tag}"

    def one(t: OAuthTarget) -> dict[str, Any]:
        return asyncio.run(oauth_scenario(t, f"{topic}-{t.name}", group))

    r = {name: one(t) for name, t in oauth_targets.items()}
    assert (
        r[KSHARE]
        == r[KAFKA4]
        == {
            "alice": True,
            "tokens_asked": True,
            "carol": ("GroupAuthorizationFailedError", 30),
            "expired": ("SaslAuthenticationFailed", 58),
        }
    )
