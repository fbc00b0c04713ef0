"""The message registry: which specs exist, per API key, and the framing helpers around them.

Everything here is derived from ``protocol_specs/``; nothing is written per message by hand.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from .codegen import DecodeError, SplicedFrame, VersionCodec, _uvarint, classes_for, codec_for
from .codes import ApiKey
from .spec import MessageSpec, load_spec, specs_dir, strip_comments

# a plain int: asked for every response header, where an enum member's lookup would cost ~0.1 us
_API_VERSIONS = ApiKey.API_VERSIONS.value


@dataclass(frozen=True, slots=True)
class Api:
    key: int
    name: str  # "Fetch"
    request: MessageSpec
    response: MessageSpec

    @property
    def min_version(self) -> int:
        return self.request.valid.lo

    @property
    def max_version(self) -> int:
        return self.request.valid.hi

    def request_header_version(self, version: int) -> int:
        # ControlledShutdown v0 is the only request with header v0; we never serve it.
        return 2 if version in self.request.flexible else 1

    def response_header_version(self, version: int) -> int:
        # ApiVersions responses always use header v0 so that a client can parse them before it
        # knows which versions the broker speaks.
        if self.key == _API_VERSIONS:
            return 0
        return 1 if version in self.response.flexible else 0


@cache
def apis(directory: Path | None = None) -> dict[int, Api]:
    """All APIs with both a request and a response spec, by API key."""
    directory = directory or specs_dir()
    by_key: dict[int, dict[str, str]] = {}
    for path in sorted(directory.glob("*.json")):
        doc = json.loads(strip_comments(path.read_text()))
        if doc.get("type") in ("request", "response"):
            by_key.setdefault(doc["apiKey"], {})[doc["type"]] = path.stem
    out = {}
    for key, names in by_key.items():
        if "request" in names and "response" in names:
            req = load_spec(names["request"], directory)
            resp = load_spec(names["response"], directory)
            out[key] = Api(key, req.name.removesuffix("Request"), req, resp)
    return out


def api(key: int) -> Api:
    return apis()[key]


def api_by_name(name: str) -> Api:
    for a in apis().values():
        if a.name == name:
            return a
    raise KeyError(name)


def request_codec(key: int, version: int) -> VersionCodec:
    return codec_for(api(key).request, version)


def response_codec(key: int, version: int) -> VersionCodec:
    return codec_for(api(key).response, version)


def request_header_codec(header_version: int) -> VersionCodec:
    return codec_for(load_spec("RequestHeader"), header_version)


def response_header_codec(header_version: int) -> VersionCodec:
    return codec_for(load_spec("ResponseHeader"), header_version)


def message_class(spec_name: str) -> type:
    """The class of a message (e.g. ``MetadataRequest``); nested struct classes are its attributes."""
    spec = load_spec(spec_name)
    return classes_for(spec)[spec.root.name]


# -- request framing ----------------------------------------------------------------------------------

_HEAD = struct.Struct(">hhi")
_I16 = struct.Struct(">h")


@dataclass(slots=True)
class RequestHeader:
    """The parts of a request header every API shares (the first fields of v1 and v2)."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body_offset: int  # where the request body starts in the frame (after any tagged fields)


def parse_request_header(frame: memoryview) -> RequestHeader:
    """Parse the request header of a frame (without its 4-byte size prefix).

    Only api key, version, correlation id and client id are read; for flexible request versions the
    header's tagged fields are skipped. Raises DecodeError on a malformed header.
    """
    try:
        api_key, api_version, correlation_id = _HEAD.unpack_from(frame, 0)
        (n,) = _I16.unpack_from(frame, 8)
    except struct.error:
        raise DecodeError("truncated request header") from None
    pos = 10
    if n < 0:
        client_id = None
    else:
        end = pos + n
        if end > len(frame):
            raise DecodeError("truncated client id")
        try:
            client_id = str(frame[pos:end], "utf-8")
        except UnicodeDecodeError:
            raise DecodeError("client id is not UTF-8") from None
        pos = end
    a = apis().get(api_key)
    # Kafka picks the header version from the flexible range alone, also for versions it does not
    # support: an ApiVersions v99 request must carry header v2 to get its UNSUPPORTED_VERSION answer.
    if a is not None and a.request_header_version(api_version) >= 2:
        pos = skip_tagged_fields(frame, pos)
    return RequestHeader(api_key, api_version, correlation_id, client_id, pos)


def skip_tagged_fields(buf: memoryview, pos: int) -> int:
    try:
        count, pos = _uvarint(buf, pos)
        for _ in range(count):
            _tag, pos = _uvarint(buf, pos)
            size, pos = _uvarint(buf, pos)
            pos += size
    except IndexError:
        raise DecodeError("truncated tagged fields") from None
    if pos > len(buf):
        raise DecodeError("truncated tagged fields")
    return pos


def decode_request(frame: memoryview) -> tuple[RequestHeader, Any]:
    """Header and body of a request frame whose API we know."""
    header = parse_request_header(frame)
    a = apis().get(header.api_key)
    if a is None:
        raise DecodeError(f"unknown api key {header.api_key}")
    body, _ = codec_for(a.request, header.api_version).decode(frame, header.body_offset)
    return header, body


def encode_request(
    api_key: int, version: int, correlation_id: int, client_id: str | None, body: Any
) -> bytearray:
    """A complete request frame, size prefix included."""
    a = api(api_key)
    out = bytearray(4)
    out += _HEAD.pack(api_key, version, correlation_id)
    if client_id is None:
        out += b"\xff\xff"
    else:
        cid = client_id.encode()
        out += _I16.pack(len(cid))
        out += cid
    if a.request_header_version(version) >= 2:
        out += b"\x00"
    codec_for(a.request, version).encode(body, out)
    struct.pack_into(">i", out, 0, len(out) - 4)
    return out


def _response_into(out: bytearray | SplicedFrame, api_key: int, version: int, correlation_id: int, body: Any) -> None:
    """Append a response's header and body to ``out``, which starts with the frame's 4-byte size slot."""
    a = api(api_key)
    out += struct.pack(">i", correlation_id)
    if a.response_header_version(version) >= 1:
        out += b"\x00"
    codec_for(a.response, version).encode(body, out)


def encode_response(api_key: int, version: int, correlation_id: int, body: Any) -> bytearray:
    """A complete response frame, size prefix included."""
    out = bytearray(4)
    _response_into(out, api_key, version, correlation_id, body)
    struct.pack_into(">i", out, 0, len(out) - 4)
    return out


def encode_response_pieces(api_key: int, version: int, correlation_id: int, body: Any) -> list:
    """A complete response frame as buffers to write in order: large record data is not copied
    (see codegen.SplicedFrame)."""
    out = SplicedFrame(4)
    _response_into(out, api_key, version, correlation_id, body)
    struct.pack_into(">i", out, 0, out.size() - 4)
    return out.pieces()


def response_body_offset(api_key: int, version: int, frame: memoryview) -> int:
    """Where the body starts in a response frame (without size prefix)."""
    if api(api_key).response_header_version(version) >= 1:
        return skip_tagged_fields(frame, 4)
    return 4


def decode_response(api_key: int, version: int, frame: memoryview) -> Any:
    pos = response_body_offset(api_key, version, frame)
    body, _ = codec_for(api(api_key).response, version).decode(frame, pos)
    return body
