"""Guards for ``protocol_specs/``.

1. Every spec is plain JSON in the expected shape, and every struct type it names is defined.
2. Every spec that Apache Kafka also ships (kafka-python 3 carries a copy of Apache's JSON files in
   ``kafka/protocol/schemas/resources``) describes the same wire format, version by version, on the
   versions both files cover: same fields in the same order, same types, nullability, tags,
   tagged/flexible versions, defaults and nested structs. This catches typos in hand-edited specs.

The comparison works on the effective layout of each version, so ``"0+"`` and ``"0-12"`` are
equal at version 12, and a field whose versions lie outside the common range is ignored.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

SPECS = Path(__file__).resolve().parents[2] / "protocol_specs"
SPEC_FILES = sorted(SPECS.glob("*.json"))

PRIMITIVES = frozenset(
    {
        "bool",
        "int8",
        "int16",
        "uint16",
        "int32",
        "uint32",
        "int64",
        "float64",
        "string",
        "bytes",
        "records",
        "uuid",
    }
)
TOP_KEYS = {"apiKey", "type", "name", "about", "validVersions", "flexibleVersions", "fields", "commonStructs"}
FIELD_KEYS = {
    "name",
    "type",
    "versions",
    "nullableVersions",
    "default",
    "taggedVersions",
    "tag",
    "flexibleVersions",
    "ignorable",
    "mapKey",
    "entityType",
    "zeroCopy",
    "fields",
}
VERSION_RE = re.compile(r"^(none|\d+|\d+-\d+|\d+\+)$")
INF = 1 << 30


# -- helpers ----------------------------------------------------------------------------------------


def parse_versions(text: str | None) -> tuple[int, int]:
    """Inclusive (lo, hi); the empty range is (1, 0)."""
    if text is None or text == "none":
        return (1, 0)
    if text.endswith("+"):
        return (int(text[:-1]), INF)
    if "-" in text:
        lo, hi = text.split("-")
        return (int(lo), int(hi))
    return (int(text), int(text))


def within(version: int, text: str | None) -> bool:
    lo, hi = parse_versions(text)
    return lo <= version <= hi


def strip_line_comments(text: str) -> str:
    """Drop the ``//`` comment lines of Apache's spec files (only lines that start with ``//``
    after leading whitespace, so a ``//`` inside a string value is never touched)."""
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("//"))


def element_type(type_text: str) -> str:
    return type_text[2:] if type_text.startswith("[]") else type_text


def struct_table(doc: dict) -> dict[str, list[dict]]:
    """Struct name -> its fields: the commonStructs plus every struct defined inline."""
    table: dict[str, list[dict]] = {c["name"]: c["fields"] for c in doc.get("commonStructs", [])}

    def walk(fields: list[dict]) -> None:
        for f in fields:
            if "fields" in f:
                table.setdefault(element_type(f["type"]), f["fields"])
                walk(f["fields"])

    walk(doc["fields"])
    for c in doc.get("commonStructs", []):
        walk(c["fields"])
    return table


def norm_default(value: object) -> str | None:
    if value is None:
        return None
    text = str(value).strip().lower()
    try:
        return str(int(text, 0))
    except ValueError:
        return text


def layout(fields: list[dict], version: int, structs: dict[str, list[dict]], seen: tuple = ()) -> list[dict]:
    """What a message looks like on the wire at ``version``: the fields present, in order."""
    out = []
    for f in fields:
        if not within(version, f.get("versions")):
            continue
        elem = element_type(f["type"])
        tagged = within(version, f.get("taggedVersions"))
        entry = {
            "name": f["name"],
            "type": f["type"],
            "nullable": within(version, f.get("nullableVersions")),
            "tagged": tagged,
            "tag": f.get("tag") if tagged else None,
            "flexible": within(version, f["flexibleVersions"]) if "flexibleVersions" in f else None,
            "default": norm_default(f.get("default")),
        }
        if elem not in PRIMITIVES and elem not in seen:
            entry["fields"] = layout(
                f.get("fields") or structs.get(elem, []), version, structs, seen + (elem,)
            )
        out.append(entry)
    return out


def diff_layouts(ours: list[dict], ref: list[dict], path: str, problems: list[str]) -> None:
    our_names = [f["name"] for f in ours]
    ref_names = [f["name"] for f in ref]
    if our_names != ref_names:
        problems.append(f"{path or '/'}: fields {our_names} != reference {ref_names}")
    ref_by_name = {f["name"]: f for f in ref}
    for f in ours:
        r = ref_by_name.get(f["name"])
        if r is None:
            continue
        where = f"{path}/{f['name']}"
        for key in ("type", "nullable", "tagged", "tag", "flexible", "default"):
            if f[key] != r[key]:
                problems.append(f"{where}: {key} {f[key]!r} != reference {r[key]!r}")
        if "fields" in f or "fields" in r:
            diff_layouts(f.get("fields", []), r.get("fields", []), where, problems)


def load_ours(path: Path) -> dict:
    with path.open() as fh:
        return json.load(fh)


def reference_dir() -> Path | None:
    """kafka-python's copy of Apache's specs, located without importing the package."""
    spec = importlib.util.find_spec("kafka")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        d = Path(location) / "protocol" / "schemas" / "resources"
        if d.is_dir():
            return d
    return None


REF_DIR = reference_dir()
REF_FILES = [p for p in SPEC_FILES if REF_DIR is not None and (REF_DIR / p.name).is_file()]


# -- shape of our files -----------------------------------------------------------------------------


def test_there_are_specs() -> None:
    assert len(SPEC_FILES) >= 40, SPEC_FILES


@pytest.mark.parametrize("path", SPEC_FILES, ids=lambda p: p.stem)
def test_spec_shape(path: Path) -> None:
    text = path.read_text()
    assert not any(line.lstrip().startswith("//") for line in text.splitlines()), "no // comments: plain JSON"
    doc = json.loads(text)

    assert set(doc) <= TOP_KEYS, f"unknown top-level keys {set(doc) - TOP_KEYS}"
    for key in ("type", "name", "validVersions", "flexibleVersions", "fields"):
        assert key in doc, f"missing {key}"
    assert doc["name"] == path.stem
    assert doc["type"] in ("request", "response", "header", "data")
    if doc["type"] in ("request", "response"):
        assert isinstance(doc.get("apiKey"), int)
        assert doc["name"].endswith(doc["type"].capitalize())
    for key in ("validVersions", "flexibleVersions"):
        assert VERSION_RE.match(doc[key]), f"{key} {doc[key]!r}"
    valid_lo, valid_hi = parse_versions(doc["validVersions"])
    assert valid_lo <= valid_hi and valid_hi < INF, "validVersions must be a closed, non-empty range"

    structs = struct_table(doc)
    defined: dict[str, int] = {}

    def check(fields: list[dict], where: str) -> None:
        names = [f.get("name") for f in fields]
        assert len(names) == len(set(names)), f"{where}: duplicate field names {names}"
        tags = [f["tag"] for f in fields if "tag" in f]
        assert len(tags) == len(set(tags)), f"{where}: duplicate tags {tags}"
        for f in fields:
            at = f"{where}/{f.get('name')}"
            assert set(f) <= FIELD_KEYS, f"{at}: unknown keys {set(f) - FIELD_KEYS}"
            for key in ("name", "type", "versions"):
                assert key in f, f"{at}: missing {key}"
            for key in ("versions", "nullableVersions", "taggedVersions", "flexibleVersions"):
                if key in f:
                    assert VERSION_RE.match(f[key]), f"{at}: {key} {f[key]!r}"
            if "taggedVersions" in f or "tag" in f:
                assert "taggedVersions" in f and isinstance(f.get("tag"), int), (
                    f"{at}: tag and taggedVersions go together"
                )
                t_lo, _ = parse_versions(f["taggedVersions"])
                f_lo, _ = parse_versions(doc["flexibleVersions"])
                assert t_lo >= f_lo, f"{at}: tagged before the message is flexible"
            elem = element_type(f["type"])
            if elem in PRIMITIVES:
                assert "fields" not in f, f"{at}: primitive type with nested fields"
                continue
            assert elem[:1].isupper(), f"{at}: unknown type {f['type']!r}"
            assert elem in structs, f"{at}: struct {elem!r} is defined neither inline nor in commonStructs"
            if "fields" in f:
                defined[elem] = defined.get(elem, 0) + 1
                check(f["fields"], at)

    check(doc["fields"], "")
    for c in doc.get("commonStructs", []):
        assert set(c) <= {"name", "versions", "fields"}, c.keys()
        defined[c["name"]] = defined.get(c["name"], 0) + 1
        check(c["fields"], "#" + c["name"])
    twice = [name for name, n in defined.items() if n > 1]
    assert not twice, f"structs defined more than once: {twice}"


@pytest.mark.parametrize("path", SPEC_FILES, ids=lambda p: p.stem)
def test_only_top_level_about(path: Path) -> None:
    """We write our own specs: a short top-level "about" at most, no per-field prose."""
    doc = load_ours(path)

    def walk(fields: list[dict]) -> None:
        for f in fields:
            assert "about" not in f, f"field {f['name']} carries an about"
            walk(f.get("fields", []))

    walk(doc["fields"])
    for c in doc.get("commonStructs", []):
        walk(c["fields"])


def test_requests_and_responses_pair_up() -> None:
    by_key: dict[int, dict[str, dict]] = {}
    for path in SPEC_FILES:
        doc = load_ours(path)
        if doc["type"] in ("request", "response"):
            assert doc["type"] not in by_key.get(doc["apiKey"], {}), (
                f"two {doc['type']}s for key {doc['apiKey']}"
            )
            by_key.setdefault(doc["apiKey"], {})[doc["type"]] = doc
    for key, pair in sorted(by_key.items()):
        assert set(pair) == {"request", "response"}, (
            f"api key {key} lacks a { ({'request', 'response'} - set(pair)) }"
        )
        req, resp = pair["request"], pair["response"]
        assert req["name"].removesuffix("Request") == resp["name"].removesuffix("Response")
        assert req["validVersions"] == resp["validVersions"], f"api key {key}: validVersions differ"
        assert req["flexibleVersions"] == resp["flexibleVersions"], f"api key {key}: flexibleVersions differ"


# -- field-by-field comparison with Apache Kafka's own specs -------------------------------------------


def test_reference_specs_found() -> None:
    if REF_DIR is None:
        pytest.skip("kafka-python 3 (with Apache's JSON specs) is not installed")
    assert len(REF_FILES) >= 30, f"only {len(REF_FILES)} of our specs found in {REF_DIR}"


@pytest.mark.skipif(REF_DIR is None, reason="kafka-python 3 (with Apache's JSON specs) is not installed")
@pytest.mark.parametrize("path", REF_FILES, ids=lambda p: p.stem)
def test_matches_reference(path: Path) -> None:
    assert REF_DIR is not None
    ours = load_ours(path)
    ref = json.loads(strip_line_comments((REF_DIR / path.name).read_text()))

    assert ours["name"] == ref["name"]
    assert ours["type"] == ref["type"]
    assert ours.get("apiKey") == ref.get("apiKey")
    o_lo, o_hi = parse_versions(ours["validVersions"])
    r_lo, r_hi = parse_versions(ref["validVersions"])
    lo, hi = max(o_lo, r_lo), min(o_hi, r_hi)
    assert lo <= hi, f"no common versions: ours {ours['validVersions']}, reference {ref['validVersions']}"

    our_structs, ref_structs = struct_table(ours), struct_table(ref)
    problems: list[str] = []
    for v in range(lo, hi + 1):
        if within(v, ours["flexibleVersions"]) != within(v, ref["flexibleVersions"]):
            problems.append(
                f"v{v}: flexible differs ({ours['flexibleVersions']} vs {ref['flexibleVersions']})"
            )
        diff_layouts(
            layout(ours["fields"], v, our_structs),
            layout(ref["fields"], v, ref_structs),
            f"v{v} ",
            problems,
        )
    assert not problems, "\n".join(problems[:40])


def test_layout_comparison_catches_a_typo() -> None:
    """The comparison itself must notice a changed type, a missing field and a moved tag."""
    base = {
        "fields": [
            {"name": "A", "type": "int32", "versions": "0+"},
            {
                "name": "B",
                "type": "[]S",
                "versions": "1+",
                "fields": [
                    {"name": "C", "type": "string", "versions": "1+", "nullableVersions": "2+"},
                ],
            },
            {"name": "T", "type": "int64", "versions": "3+", "taggedVersions": "3+", "tag": 0},
        ]
    }

    def problems_at(other: dict, version: int) -> list[str]:
        out: list[str] = []
        diff_layouts(
            layout(other["fields"], version, struct_table(other)),
            layout(base["fields"], version, struct_table(base)),
            "",
            out,
        )
        return out

    same = json.loads(json.dumps(base))
    same["fields"][0]["versions"] = "0-9"  # equal wherever both exist below v10
    assert problems_at(same, 3) == []

    typo = json.loads(json.dumps(base))
    typo["fields"][1]["fields"][0]["type"] = "bytes"
    assert problems_at(typo, 1) and problems_at(typo, 0) == []

    nullable = json.loads(json.dumps(base))
    nullable["fields"][1]["fields"][0]["nullableVersions"] = "1+"
    assert problems_at(nullable, 1) and problems_at(nullable, 2) == []

    missing = json.loads(json.dumps(base))
    del missing["fields"][0]
    assert problems_at(missing, 0)

    retagged = json.loads(json.dumps(base))
    retagged["fields"][2]["tag"] = 1
    assert problems_at(retagged, 3) and problems_at(retagged, 2) == []


def test_strip_line_comments_keeps_strings() -> None:
    text = '{\n  // a comment\n  "a": "http://x",\n    // indented comment\n  "b": 1\n}'
    assert json.loads(strip_line_comments(text)) == {"a": "http://x", "b": 1}
