"""Load Kafka-style JSON message specs (the format of Apache Kafka's ``common/message/*.json``).

A spec describes one message (a request, a response, a header or a data record) across all of its
versions. This module only parses the JSON into small immutable descriptions; ``codegen`` turns a
(spec, version) pair into encoder and decoder functions.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

INF = 1 << 30


@dataclass(frozen=True, slots=True)
class Versions:
    """An inclusive version range; ``none`` is the empty range (lo > hi)."""

    lo: int
    hi: int

    @classmethod
    def parse(cls, text: str | None) -> Versions:
        if text is None or text == "none":
            return cls(1, 0)
        text = text.strip()
        if text.endswith("+"):
            return cls(int(text[:-1]), INF)
        if "-" in text:
            lo, hi = text.split("-")
            return cls(int(lo), int(hi))
        v = int(text)
        return cls(v, v)

    def __contains__(self, version: int) -> bool:
        return self.lo <= version <= self.hi

    @property
    def empty(self) -> bool:
        return self.lo > self.hi

    def __str__(self) -> str:
        if self.empty:
            return "none"
        if self.hi == INF:
            return f"{self.lo}+"
        return f"{self.lo}" if self.lo == self.hi else f"{self.lo}-{self.hi}"


PRIMITIVES = frozenset(
    {"bool", "int8", "int16", "uint16", "int32", "uint32", "int64", "float64", "string", "bytes", "records", "uuid"}
)

_CAMEL_1 = re.compile(r"(.)([A-Z][a-z]+)")
_CAMEL_2 = re.compile(r"([a-z0-9])([A-Z])")


def snake_case(name: str) -> str:
    """``ThrottleTimeMs`` -> ``throttle_time_ms``; ``SPSO`` stays ``spso``."""
    return _CAMEL_2.sub(r"\1_\2", _CAMEL_1.sub(r"\1_\2", name)).lower()


@dataclass(frozen=True, slots=True)
class FieldSpec:
    name: str  # as in the spec (CamelCase)
    attr: str  # python attribute name (snake_case)
    type: str  # element type for arrays, e.g. "int32" or a struct name
    is_array: bool
    versions: Versions
    nullable: Versions
    tagged: Versions
    tag: int | None
    default: object
    flexible: Versions | None  # field-level override of the message's flexibleVersions
    struct: StructSpec | None  # for struct-typed fields

    @property
    def is_struct(self) -> bool:
        return self.struct is not None


@dataclass(frozen=True, slots=True)
class StructSpec:
    name: str
    fields: tuple[FieldSpec, ...]
    versions: Versions = field(default=Versions(0, INF))


@dataclass(frozen=True, slots=True)
class MessageSpec:
    name: str
    type: str  # request | response | header | data
    api_key: int | None
    valid: Versions
    flexible: Versions
    root: StructSpec
    structs: dict[str, StructSpec]


def _default_value(type_name: str, is_array: bool, raw: object, nullable: bool) -> object:
    """The value a field has in versions where it is absent, and when a tagged field is omitted."""
    if is_array:
        return None if raw == "null" else ()
    if raw is None:
        if type_name == "bool":
            return False
        if type_name in ("string",):
            return ""
        if type_name in ("bytes", "records"):
            return None if nullable and type_name == "records" else b""
        if type_name == "uuid":
            return bytes(16)
        if type_name == "float64":
            return 0.0
        if type_name in PRIMITIVES:
            return 0
        return None  # struct: built from its own defaults by the codegen
    if raw == "null":
        return None
    if type_name == "bool":
        return raw in (True, "true")
    if type_name == "string":
        return str(raw)
    if type_name == "float64":
        return float(raw)
    if type_name in ("int8", "int16", "uint16", "int32", "uint32", "int64"):
        text = str(raw)
        return int(text, 16) if text.lower().startswith(("0x", "-0x")) else int(text)
    if type_name == "uuid":
        return bytes(16)
    return raw


def _parse_fields(raw_fields: list[dict], structs: dict[str, StructSpec], common: dict[str, dict]) -> tuple:
    out = []
    for f in raw_fields:
        type_text: str = f["type"]
        is_array = type_text.startswith("[]")
        elem = type_text[2:] if is_array else type_text
        struct = None
        if elem not in PRIMITIVES:
            if "fields" in f:
                struct = StructSpec(elem, _parse_fields(f["fields"], structs, common), Versions.parse(f.get("versions")))
                structs[elem] = struct
            elif elem in structs:
                struct = structs[elem]
            elif elem in common:
                struct = StructSpec(elem, _parse_fields(common[elem]["fields"], structs, common))
                structs[elem] = struct
            else:
                raise ValueError(f"field {f['name']}: unknown struct type {elem}")
        nullable = Versions.parse(f.get("nullableVersions"))
        out.append(
            FieldSpec(
                name=f["name"],
                attr=snake_case(f["name"]),
                type=elem,
                is_array=is_array,
                versions=Versions.parse(f.get("versions")),
                nullable=nullable,
                tagged=Versions.parse(f.get("taggedVersions")),
                tag=f.get("tag"),
                default=_default_value(elem, is_array, f.get("default"), not nullable.empty),
                flexible=Versions.parse(f["flexibleVersions"]) if "flexibleVersions" in f else None,
                struct=struct,
            )
        )
    return tuple(out)


def strip_comments(text: str) -> str:
    """Kafka's own spec files carry ``//`` line comments; ours do not, but accept both."""
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("//"))


def parse_spec(doc: dict) -> MessageSpec:
    structs: dict[str, StructSpec] = {}
    common = {c["name"]: c for c in doc.get("commonStructs", [])}
    # common structs first, in order, so later ones may refer to earlier ones
    for name, c in common.items():
        if name not in structs:
            structs[name] = StructSpec(name, _parse_fields(c["fields"], structs, common), Versions.parse(c.get("versions")))
    root = StructSpec(doc["name"], _parse_fields(doc["fields"], structs, common))
    return MessageSpec(
        name=doc["name"],
        type=doc["type"],
        api_key=doc.get("apiKey"),
        valid=Versions.parse(doc["validVersions"]),
        flexible=Versions.parse(doc.get("flexibleVersions", "none")),
        root=root,
        structs=structs,
    )


def specs_dir() -> Path:
    """``protocol_specs/`` ships inside the wheel as ``kshare/protocol_specs``; in a checkout it is top-level."""
    override = os.environ.get("KSHARE_PROTOCOL_SPECS")
    if override:
        return Path(override)
    here = Path(__file__).resolve().parent.parent
    for candidate in (here / "protocol_specs", here.parent / "protocol_specs"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError("protocol_specs directory not found")


@cache
def load_spec(name: str, directory: Path | None = None) -> MessageSpec:
    path = (directory or specs_dir()) / f"{name}.json"
    return parse_spec(json.loads(strip_comments(path.read_text())))


def all_spec_names(directory: Path | None = None) -> list[str]:
    return sorted(p.stem for p in (directory or specs_dir()).glob("*.json"))
