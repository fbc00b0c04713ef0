"""Random Kafka protocol messages for the codec property tests, drawn from the spec itself
(``MessageSpec`` -> ``StructSpec`` -> ``FieldSpec``), independently of the code generator:
:func:`message` is a hypothesis strategy of ``name`` at ``version``."""

from __future__ import annotations

import struct
from functools import cache

from hypothesis import strategies as st

from kshare.protocol.codegen import classes_for
from kshare.protocol.spec import FieldSpec, MessageSpec, StructSpec, load_spec

OMIT = object()  # "leave the class default": never passed to the constructor


def _blob(n: int) -> bytes:
    return bytes((i * 31 + n) & 0xFF for i in range(n))


# Strings and byte fields take a value byte from their struct's drawn bytes (see ``_Plan``): a
# quarter of the time it asks Hypothesis for a random value, otherwise it picks one of these, which
# sit on the edges of the length encodings (compact lengths are varint(n + 1): 126/127 bytes are
# the last one-byte lengths, 16382/16383 the last two-byte ones) and of UTF-8 (1-4 byte characters).
TEXT = st.text(max_size=12)
BYTES = st.binary(max_size=24)
STRINGS = [
    "",
    "a",
    "orders-0",
    "\x00",
    "é",
    "€uro",
    "😀",
    "a" * 126,
    "b" * 127,
    "c" * 128,
    "é" * 100,
    "kafka-😀" * 40,
    "d" * 16382,
    "e" * 16383,
]
BLOBS = [
    b"",
    b"\x00",
    b"\xff" * 3,
    bytes(range(256)),
    *(_blob(n) for n in (126, 127, 128, 16382, 16383, 20000)),
]


# Fixed-width values are unpacked from drawn bytes with exactly their wire format, so every value
# of the type's range (int8 .. int64, uint16, uint32) is reachable and nothing outside it is.
_FORMATS = {"bool": "B", "int8": "b", "int16": "h", "uint16": "H", "int32": "i", "uint32": "I", "int64": "q",
            "float64": "d", "uuid": "16s"}
FIXED = {t: (fmt, struct.calcsize(">" + fmt)) for t, fmt in _FORMATS.items()}  # type -> (format, size)


FIXED_ELEMENT = {
    t: (struct.Struct(">" + fmt), st.binary(min_size=size, max_size=size)) for t, (fmt, size) in FIXED.items()
}


def _fixed(t: str, raw: object) -> object:
    if t == "bool":
        return bool(raw & 1)
    if t == "float64" and raw != raw:  # NaN != NaN would break equality, not the codec
        return 0.0
    return raw


def is_flexible(spec: MessageSpec, version: int) -> bool:
    return version in spec.flexible


def layout(spec: MessageSpec, s: StructSpec, version: int) -> list[tuple[FieldSpec, bool]]:
    """(field, tagged?) for the fields of ``s`` present in ``version``, straight from the spec."""
    return [(f, is_flexible(spec, version) and version in f.tagged) for f in s.fields if version in f.versions]


class _Plan:
    """How to draw one struct of one version: a single fixed-size byte string supplies every
    fixed-width value, one control byte per nullable, tagged or array field (null? left at the
    default? how many elements?), one value byte per string, bytes or records field (which value,
    or a random one from Hypothesis) and one byte for ``unknown_tags``; array elements other than
    fixed-width ones and nested structs are drawn separately. Hypothesis makes a few choices per
    struct instead of several per field, which keeps 250 (message, version) cases fast, and still
    shrinks well: all-zero bytes mean zero values, nulls, tagged fields set, empty arrays."""

    def __init__(self, spec: MessageSpec, s: StructSpec, version: int) -> None:
        self.cls = classes_for(spec)[s.name]
        self.fields = layout(spec, s, version)
        self.version = version
        fmt = ">"
        for f, tagged in self.fields:
            if tagged or f.is_array or version in f.nullable:
                fmt += "B"
            if f.type in FIXED and not f.is_array:
                fmt += FIXED[f.type][0]
            elif f.struct is None and not f.is_array:
                fmt += "B"  # the value byte of a string, bytes or records field
        self.unknown = is_flexible(spec, version)
        if self.unknown:
            fmt += "B"
        self.packer = struct.Struct(fmt)
        self.blob = st.binary(min_size=self.packer.size, max_size=self.packer.size)
        used = {f.tag for f in s.fields if f.tag is not None}
        tag = st.one_of(st.integers(0, 40), st.integers(0, (1 << 31) - 1)).filter(lambda t: t not in used)
        # non-empty: an empty dict is not preserved (no unknown tags decode as None)
        self.unknown_tags = st.dictionaries(tag, BYTES, min_size=1, max_size=3)


_PLANS: dict[tuple[str, str, int], _Plan] = {}


def _plan(spec: MessageSpec, s: StructSpec, version: int) -> _Plan:
    key = (spec.name, s.name, version)
    if key not in _PLANS:
        _PLANS[key] = _Plan(spec, s, version)
    return _PLANS[key]


def _draw_element(draw, spec: MessageSpec, f: FieldSpec, version: int, unknown: bool) -> object:
    """One non-null value of a field's type that is not fixed-width (or an array element)."""
    if f.struct is not None:
        return _draw_struct(draw, spec, f.struct, version, unknown)
    if f.type == "string":
        return draw(TEXT)
    if f.type in ("bytes", "records"):
        return draw(BYTES)
    packer, blob = FIXED_ELEMENT[f.type]
    return _fixed(f.type, packer.unpack(draw(blob))[0])


def _draw_struct(draw, spec: MessageSpec, s: StructSpec, version: int, unknown: bool) -> object:
    plan = _plan(spec, s, version)
    raw = iter(plan.packer.unpack(draw(plan.blob)))
    kwargs = {}
    for f, tagged in plan.fields:
        control = next(raw) if tagged or f.is_array or version in f.nullable else 0
        scalar = next(raw) if f.struct is None and not f.is_array else None
        if tagged and control & 1:
            continue  # omitted: the class default, which the encoder leaves out
        if version in f.nullable and (control >> 1) & 3 == 0:
            value = None
        elif f.is_array:
            value = [_draw_element(draw, spec, f, version, unknown) for _ in range((control >> 3) & 3)]
        elif f.struct is not None:
            value = _draw_struct(draw, spec, f.struct, version, unknown)
        elif f.type in FIXED:
            value = _fixed(f.type, scalar)
        elif scalar < 64:
            value = _draw_element(draw, spec, f, version, unknown)
        else:
            table = STRINGS if f.type == "string" else BLOBS
            value = table[scalar % len(table)]
        kwargs[f.attr] = value
    if plan.unknown and next(raw) & 3 == 3 and unknown:
        kwargs["unknown_tags"] = draw(plan.unknown_tags)
    return plan.cls(**kwargs)


@cache
def message(name: str, version: int, unknown_tags: bool = True) -> st.SearchStrategy:
    """Random messages of ``name`` at ``version`` (with ``unknown_tags`` in some structs, or never)."""
    spec = load_spec(name)

    @st.composite
    def draw_message(draw):
        return _draw_struct(draw, spec, spec.root, version, unknown_tags)

    return draw_message()
