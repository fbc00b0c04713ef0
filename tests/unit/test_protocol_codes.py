"""``kshare.protocol.codes`` (ApiKey, ErrorCode) is generated from ``protocol_specs/`` and matches it."""

from __future__ import annotations

import json

import kafka.errors

from kshare.protocol import gen_codes, messages
from kshare.protocol.codes import ApiKey, ErrorCode
from kshare.protocol.spec import specs_dir


def test_codes_module_is_the_generators_output() -> None:
    assert gen_codes.OUTPUT.read_text() == gen_codes.render(), (
        "kshare/protocol/codes.py is stale: run python -m kshare.protocol.gen_codes")


def test_every_api_with_specs_has_its_key_and_name() -> None:
    apis = messages.apis()
    assert {int(k) for k in ApiKey} == set(apis)
    for key in ApiKey:
        assert key.name.replace("_", "") == apis[key].name.upper()


def test_error_codes_are_unique_and_complete_from_the_spec_file() -> None:
    doc = json.loads((specs_dir() / "errors" / "ErrorCodes.json").read_text())
    codes = [e["code"] for e in doc["errors"]]
    names = [e["name"] for e in doc["errors"]]
    assert len(set(codes)) == len(codes) and len(set(names)) == len(names)
    assert {e.value: e.name for e in ErrorCode} == dict(zip(codes, names, strict=True))
    assert set(range(-1, max(codes) + 1)) == set(codes)  # Kafka's codes have no holes


def test_error_names_agree_with_kafka_python_where_apache_did_not_rename() -> None:
    renamed = {-1: "UNKNOWN", 0: "NO_ERROR", 6: "NOT_LEADER_FOR_PARTITION", 10: "MESSAGE_SIZE_TOO_LARGE"}
    theirs = {c.errno: c.message for c in vars(kafka.errors).values()
              if isinstance(c, type) and issubclass(c, kafka.errors.BrokerResponseError) and c.errno is not None}
    assert theirs, "kafka-python's error table is gone"
    for code, name in theirs.items():
        assert ErrorCode(code).name == name or renamed.get(code) == name, code


def test_members_are_ints_on_the_wire() -> None:
    body = messages.message_class("ApiVersionsResponse")(error_code=ErrorCode.UNSUPPORTED_VERSION, api_keys=[])
    frame = messages.encode_response(ApiKey.API_VERSIONS, 0, 7, body)
    decoded = messages.decode_response(ApiKey.API_VERSIONS, 0, memoryview(frame)[4:])
    assert decoded.error_code == 35 and type(decoded.error_code) is int
    assert {ApiKey.FETCH: "x"}[1] == "x" and f"{ErrorCode.NOT_COORDINATOR}" == "16"
