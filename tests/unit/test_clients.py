"""kshare.clients without a broker: server lists, client properties, and the Metadata and
FindCoordinator answers as the admin client and the share member's cluster read them (responses
encoded and decoded by the codec, as they come off the wire)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kshare.addresses import host_port
from kshare.clients.admin import AdminError
from kshare.clients.cluster import (
    Node,
    coordinator_answer,
    coordinator_request,
    metadata_answer,
    metadata_request,
    parse_servers,
)
from kshare.clients.errors import error_for, error_name
from kshare.clients.settings import client_security, load_command_config, parse_bootstrap, parse_properties
from kshare.protocol import messages
from kshare.protocol.codes import ApiKey, ErrorCode

hostnames = st.from_regex(r"[a-z][a-z0-9-]{0,20}(\.[a-z][a-z0-9-]{0,10}){0,3}", fullmatch=True)
ipv6 = st.ip_addresses(v=6).map(str)
ports = st.integers(0, 65535)


# -- server lists ---------------------------------------------------------------------------------


@given(st.lists(st.tuples(st.one_of(hostnames, ipv6), ports), min_size=1, max_size=5))
def test_server_lists_read_back(servers: list[tuple[str, int]]) -> None:
    text = ", ".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in servers)
    assert parse_bootstrap(text) == servers
    assert parse_servers(text) == servers
    assert parse_servers([f"{h}:{p}" if ":" not in h else f"[{h}]:{p}" for h, p in servers]) == servers
    assert parse_servers(servers) == servers


@pytest.mark.parametrize("item", ["host", "host:", ":9092", "host:port", "host:-1"])
def test_not_host_port(item: str) -> None:
    assert host_port(item) is None
    with pytest.raises(AdminError, match=f"--bootstrap-server: '{item}' is not HOST:PORT"):
        parse_bootstrap(f"ok:1,{item}")
    with pytest.raises(ValueError, match="is not HOST:PORT"):
        parse_servers(item)


def test_empty_server_lists() -> None:
    with pytest.raises(AdminError, match="--bootstrap-server is empty"):
        parse_bootstrap(" , ")
    with pytest.raises(ValueError, match="no bootstrap server given"):
        parse_servers("")


# -- client properties ----------------------------------------------------------------------------

keys = st.from_regex(r"[a-z][a-z0-9.]{0,30}", fullmatch=True)
# (a value led by "=" or ":" after a blank separator is that separator, as in Java)
values = st.from_regex(r"([A-Za-z0-9_./-][A-Za-z0-9_./=:-]{0,30})?", fullmatch=True)


@given(st.dictionaries(keys, values, max_size=8), st.sampled_from(["=", ": ", " ", " = "]))
def test_properties_read_back(props: dict[str, str], separator: str) -> None:
    lines = ["# a comment", "! another", ""]
    for k, v in props.items():
        lines += [f"{k}{separator}{v}", "   "]
    assert parse_properties("\n".join(lines)) == props


def test_properties_continuation_lines() -> None:
    assert parse_properties("sasl.jaas.config=a \\\n   b\nx=1") == {"sasl.jaas.config": "a b", "x": "1"}


def test_command_config(tmp_path) -> None:
    path = tmp_path / "client.properties"
    path.write_text("client.id=me\nrequest.timeout.ms=1500\n")
    settings = load_command_config(path)
    assert (settings.client_id, settings.request_timeout_ms, settings.security) == ("me", 1500, None)
    path.write_text("request.timeout.ms=soon\n")
    with pytest.raises(AdminError, match="request.timeout.ms must be an integer"):
        load_command_config(path)
    path.write_text("linger.ms=5\nacks=all\n")
    with pytest.raises(AdminError, match="unsupported properties acks, linger.ms"):
        load_command_config(path)
    with pytest.raises(AdminError, match="cannot read --command-config"):
        load_command_config(tmp_path / "missing.properties")


def test_client_security_from_properties() -> None:
    assert client_security({}) is None
    sec = client_security({"security.protocol": "sasl_plaintext", "sasl.mechanism": "SCRAM-SHA-512",
                           "sasl.jaas.config": 'org.Scram required username="u" password="p";'})
    assert sec is not None and (sec.sasl_mechanism, sec.username, sec.password, sec.ssl) == ("SCRAM-SHA-512", "u", "p",
                                                                                             None)
    with pytest.raises(AdminError, match="security.protocol=TLS is not one of"):
        client_security({"security.protocol": "TLS"})
    with pytest.raises(AdminError, match="sasl.mechanism=GSSAPI is not supported"):
        client_security({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "GSSAPI"})
    with pytest.raises(AdminError, match="PLAIN needs sasl.username and sasl.password"):
        client_security({"security.protocol": "SASL_PLAINTEXT"})


# -- errors -----------------------------------------------------------------------------------------


def test_error_names_are_apaches() -> None:
    assert error_name(0) == "NONE" and error_name(-1) == "UNKNOWN_SERVER_ERROR"
    assert error_name(6) == "NOT_LEADER_OR_FOLLOWER" and error_name(133) == "SHARE_SESSION_LIMIT_REACHED"
    assert error_name(9999) == "error 9999"
    exc = error_for(ErrorCode.GROUP_MAX_SIZE_REACHED, "ShareGroupHeartbeat for group g", "full")
    assert (exc.errno, str(exc)) == (81, "[Error 81] GroupMaxSizeReachedError: GROUP_MAX_SIZE_REACHED: "
                                         "ShareGroupHeartbeat for group g (full)")


# -- Metadata and FindCoordinator, through the codec ------------------------------------------------


def _wire(api_key: int, version: int, body: object) -> object:
    frame = messages.encode_response(api_key, version, 1, body)
    return messages.decode_response(api_key, version, memoryview(frame)[4:])


@pytest.mark.parametrize("version", [1, 9, 10, 12])
def test_metadata_answer(version: int) -> None:
    R = messages.message_class("MetadataResponse")
    topic_id = bytes(range(16))
    body = R(brokers=[R.MetadataResponseBroker(node_id=1, host="b1", port=9092),
                      R.MetadataResponseBroker(node_id=2, host="b2", port=9093)],
             topics=[R.MetadataResponseTopic(error_code=0, name="t", topic_id=topic_id, partitions=[
                         R.MetadataResponsePartition(partition_index=1, leader_id=2),
                         R.MetadataResponsePartition(partition_index=0, leader_id=1)]),
                     R.MetadataResponseTopic(error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, name="gone")])
    answer = metadata_answer(_wire(ApiKey.METADATA, version, body), version)
    assert answer.brokers == {1: Node(1, "b1", 9092), 2: Node(2, "b2", 9093)}
    assert list(answer.topics) == ["t"] and answer.topics["t"].leaders == {1: 2, 0: 1}
    assert answer.topics["t"].partitions == [0, 1]
    assert answer.topics["t"].topic_id == (topic_id if version >= 10 else bytes(16))
    assert answer.errors == {"gone": (3, None)}


def test_metadata_request_for_all_topics_some_or_brokers_only() -> None:
    assert metadata_request(None).topics is None
    assert metadata_request([]).topics == []
    assert [t.name for t in metadata_request(["a", "b"]).topics] == ["a", "b"]


@pytest.mark.parametrize("version", [0, 3, 4, 6])
def test_coordinator_request_and_answer(version: int) -> None:
    request = coordinator_request(version, "g")
    R = messages.message_class("FindCoordinatorResponse")
    if version >= 4:
        assert request.coordinator_keys == ["g"]
        body = R(coordinators=[R.Coordinator(key="g", node_id=3, host="h", port=1, error_code=16, error_message="moved")])
    else:
        assert request.key == "g"
        body = R(error_code=16, error_message="moved", node_id=3, host="h", port=1)
    code, node, message = coordinator_answer(_wire(ApiKey.FIND_COORDINATOR, version, body), version)
    assert (code, node) == (ErrorCode.NOT_COORDINATOR, Node(3, "h", 1))
    assert (message or None) == ("moved" if version >= 1 else None)  # v0 has no message
