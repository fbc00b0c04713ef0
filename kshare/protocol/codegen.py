"""Generate encoders and decoders from message specs.

For every (message, version) pair this module writes Python source for one ``decode`` and one
``encode`` function per struct, compiles it once and caches it. The generated code works on a
``memoryview`` and a position, reads runs of fixed-width fields with a single ``unpack_from``,
returns ``records`` fields as zero-copy ``memoryview`` slices and keeps unknown tagged fields as
raw bytes so a decode/encode round trip preserves them. Every struct of a message becomes one
``msgspec.Struct`` class holding the union of its fields over all versions.
"""

from __future__ import annotations

import struct
from typing import Any

import msgspec

from .spec import FieldSpec, MessageSpec, StructSpec, Versions


class DecodeError(ValueError):
    """The bytes do not form a valid message of the requested version."""


# -- runtime helpers referenced by generated code -------------------------------------------------


def _uvarint(buf: memoryview, pos: int) -> tuple[int, int]:
    b = buf[pos]
    pos += 1
    if b < 0x80:
        return b, pos
    result = b & 0x7F
    shift = 7
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 28:
            raise DecodeError("varint too long")


_ONE_BYTE = [bytes([i]) for i in range(128)]


def _w_uvarint(value: int) -> bytes:
    if value < 0x80:
        return _ONE_BYTE[value]
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _short(buf: memoryview, end: int) -> None:
    if end > len(buf):
        raise DecodeError("truncated")


_FIXED = {
    "bool": ("?", 1),
    "int8": ("b", 1),
    "int16": ("h", 2),
    "uint16": ("H", 2),
    "int32": ("i", 4),
    "uint32": ("I", 4),
    "int64": ("q", 8),
    "float64": ("d", 8),
    "uuid": ("16s", 16),
}

# Arrays of fixed-width primitives (replica lists, partition ids, acknowledge types) are read and
# written with one precompiled Struct per element count; longer ones format their own.
_SMALL_ARRAY = 32
_ARRAYS = {
    fmt: tuple(struct.Struct(f">{n}{fmt}") for n in range(_SMALL_ARRAY)) for fmt, _ in _FIXED.values() if fmt != "16s"
}

_PY_TYPES = {
    "bool": bool,
    "int8": int,
    "int16": int,
    "uint16": int,
    "int32": int,
    "uint32": int,
    "int64": int,
    "float64": float,
    "string": str,
    "bytes": bytes,
    "records": Any,
    "uuid": bytes,
}


# -- classes -----------------------------------------------------------------------------------------


def _has_flexible(spec: MessageSpec) -> bool:
    return not spec.flexible.empty


def build_classes(spec: MessageSpec) -> dict[str, type]:
    """One msgspec Struct class per struct of the message (root included), fields in spec order."""
    classes: dict[str, type] = {}
    flexible = _has_flexible(spec)

    def build(s: StructSpec) -> type:
        if s.name in classes:
            return classes[s.name]
        fields = []
        for f in s.fields:
            if f.struct is not None:
                sub = build(f.struct)
                if f.is_array:
                    fields.append((f.attr, Any, msgspec.field(default_factory=list) if f.default == () else None))
                else:
                    fields.append((f.attr, Any, None if not f.nullable.empty else msgspec.field(default_factory=sub)))
            elif f.is_array:
                fields.append((f.attr, Any, msgspec.field(default_factory=list) if f.default == () else None))
            else:
                fields.append((f.attr, Any, f.default))
        if flexible:
            fields.append(("unknown_tags", Any, None))
        cls = msgspec.defstruct(s.name, fields, module=f"kshare.protocol.messages.{spec.name}")
        classes[s.name] = cls
        return cls

    for s in spec.structs.values():
        build(s)
    build(spec.root)
    root = classes[spec.root.name]
    for name, cls in classes.items():
        if cls is not root:
            setattr(root, name, cls)
    return classes


# -- source generation -------------------------------------------------------------------------------


class _Gen:
    def __init__(self, spec: MessageSpec, version: int) -> None:
        self.spec = spec
        self.version = version
        self.lines: list[str] = []
        self.consts: dict[str, object] = {}
        self.done: set[str] = set()
        self.tmp = 0

    # helpers -------------------------------------------------------------------------------------
    def var(self, prefix: str = "t") -> str:
        self.tmp += 1
        return f"{prefix}{self.tmp}"

    def const(self, value: object, prefix: str = "C") -> str:
        name = f"{prefix}{len(self.consts)}"
        self.consts[name] = value
        return name

    def packer(self, fmt: str) -> str:
        return self.const(struct.Struct(">" + fmt), "S")

    def uvarint(self, target: str, ind: str, out: list[str]) -> None:
        """Read an unsigned varint into ``target``: lengths and counts are almost always below 128,
        so the one-byte case is inline and only longer varints call ``_uvarint``."""
        out.append(f"{ind}{target} = buf[pos]")
        out.append(f"{ind}if {target} < 0x80:")
        out.append(f"{ind}    pos += 1")
        out.append(f"{ind}else:")
        out.append(f"{ind}    {target}, pos = _uvarint(buf, pos)")

    def dec_length(self, n: str, flex: bool, width: int, ind: str, out: list[str]) -> None:
        """Read a length or count into ``n``: in flexible versions a compact one (an unsigned varint,
        one more than the value, so that 0 is null), else a signed int of ``width`` bytes (-1: null)."""
        if flex:
            self.uvarint(n, ind, out)
            out.append(f"{ind}{n} -= 1")
        else:
            out.append(f"{ind}{n}, = _I{width * 8}.unpack_from(buf, pos)")
            out.append(f"{ind}pos += {width}")

    def flexible(self, f: FieldSpec | None = None) -> bool:
        if f is not None and f.flexible is not None:
            return self.version in f.flexible
        return self.version in self.spec.flexible

    def present(self, s: StructSpec) -> tuple[list[FieldSpec], list[FieldSpec]]:
        """Fields of ``s`` in this version: (regular, tagged sorted by tag)."""
        regular, tagged = [], []
        for f in s.fields:
            if self.version in f.tagged and self.flexible():
                tagged.append(f)
            elif self.version in f.versions:
                regular.append(f)
        tagged.sort(key=lambda f: f.tag)
        return regular, tagged

    # decoding ------------------------------------------------------------------------------------
    def dec_value(self, f: FieldSpec, target: str, ind: str, out: list[str]) -> None:
        """Lines reading one (possibly array) field value at ``pos`` into ``target``."""
        nullable = self.version in f.nullable
        flex = self.flexible(f)
        if f.is_array:
            n = self.var("n")
            self.dec_length(n, flex, 4, ind, out)
            out.append(f"{ind}if {n} < 0:")
            if nullable:
                out.append(f"{ind}    {target} = None")
            else:
                out.append(f"{ind}    raise DecodeError('null array {f.name}')")
            out.append(f"{ind}else:")
            ind2 = ind + "    "
            out.append(f"{ind2}if {n} > len(buf) - pos:")
            out.append(f"{ind2}    raise DecodeError('array {f.name} longer than frame')")
            if f.type in _FIXED and f.type != "uuid":
                fmt, size = _FIXED[f.type]
                table = self.const(_ARRAYS[fmt], "A")
                out.append(f"{ind2}if {n} < {_SMALL_ARRAY}:")
                out.append(f"{ind2}    {target} = list({table}[{n}].unpack_from(buf, pos))")
                out.append(f"{ind2}else:")
                out.append(f"{ind2}    {target} = list(_unpack('>%d{fmt}' % {n}, buf, pos))")
                out.append(f"{ind2}pos += {n} * {size}")
            else:
                item = self.var("it")
                out.append(f"{ind2}{target} = []")
                out.append(f"{ind2}for _ in range({n}):")
                self.dec_single(f, item, ind2 + "    ", out, nullable=False)
                out.append(f"{ind2}    {target}.append({item})")
        else:
            self.dec_single(f, target, ind, out, nullable=nullable)

    def dec_single(self, f: FieldSpec, target: str, ind: str, out: list[str], nullable: bool) -> None:
        flex = self.flexible(f)
        t = f.type
        if f.struct is not None:
            if nullable:
                out.append(f"{ind}if buf[pos] == 255:")
                out.append(f"{ind}    pos += 1")
                out.append(f"{ind}    {target} = None")
                out.append(f"{ind}else:")
                out.append(f"{ind}    {target}, pos = d_{t}(buf, pos + 1)")
            else:
                out.append(f"{ind}{target}, pos = d_{t}(buf, pos)")
            return
        if t in _FIXED:
            fmt, size = _FIXED[t]
            p = self.packer(fmt)
            out.append(f"{ind}{target}, = {p}.unpack_from(buf, pos)")
            out.append(f"{ind}pos += {size}")
            return
        n = self.var("n")
        self.dec_length(n, flex, 2 if t == "string" else 4, ind, out)  # string; bytes, records
        out.append(f"{ind}if {n} < 0:")
        if nullable or t == "records":
            out.append(f"{ind}    {target} = None")
        else:
            out.append(f"{ind}    raise DecodeError('null {f.name}')")
        out.append(f"{ind}else:")
        out.append(f"{ind}    end = pos + {n}")
        out.append(f"{ind}    if end > len(buf):")
        out.append(f"{ind}        raise DecodeError('truncated {f.name}')")
        if t == "string":
            out.append(f"{ind}    {target} = str(buf[pos:end], 'utf-8')")
        elif t == "bytes":
            out.append(f"{ind}    {target} = bytes(buf[pos:end])")
        else:
            out.append(f"{ind}    {target} = buf[pos:end]")
        out.append(f"{ind}    pos = end")

    def default_expr(self, f: FieldSpec) -> str:
        if f.is_array:
            return "None" if f.default is None else "[]"
        if f.struct is not None:
            return "None" if not f.nullable.empty else f"K_{f.type}()"
        if isinstance(f.default, (int, float, bool)) or f.default is None:
            return repr(f.default)
        return self.const(f.default)

    def gen_decoder(self, s: StructSpec) -> None:
        regular, tagged = self.present(s)
        out = self.lines
        out.append(f"def d_{s.name}(buf, pos):")
        values = {}
        run: list[FieldSpec] = []

        def flush_run() -> None:
            if not run:
                return
            fmt = "".join(_FIXED[f.type][0] for f in run)
            size = sum(_FIXED[f.type][1] for f in run)
            names = [f"v_{f.attr}" for f in run]
            p = self.packer(fmt)
            out.append(f"    {', '.join(names)}, = {p}.unpack_from(buf, pos)")
            out.append(f"    pos += {size}")
            run.clear()

        for f in regular:
            values[f.attr] = f"v_{f.attr}"
            if f.type in _FIXED and not f.is_array and f.struct is None:
                run.append(f)
                continue
            flush_run()
            self.dec_value(f, f"v_{f.attr}", "    ", out)
        flush_run()
        flexible = self.flexible()
        if flexible:
            for f in tagged:
                values[f.attr] = f"v_{f.attr}"
                out.append(f"    v_{f.attr} = {self.default_expr(f)}")
            out.append("    unknown = None")
            # no tagged fields (the common case) is a single zero byte
            out.append("    if buf[pos] == 0:")
            out.append("        pos += 1")
            out.append("    else:")
            out.append("        ntags, pos = _uvarint(buf, pos)")
            out.append("        for _ in range(ntags):")
            out.append("            tag, pos = _uvarint(buf, pos)")
            out.append("            size, pos = _uvarint(buf, pos)")
            out.append("            tend = pos + size")
            out.append("            if tend > len(buf):")
            out.append("                raise DecodeError('truncated tagged field')")
            # A known tag's value must fill exactly its declared size: a shorter or longer value
            # means the field is not what the size says (and re-encoding would change the bytes).
            # ``tend``, not ``end``: string and bytes decoders use ``end`` for their own bounds.
            kw = "if"
            for f in tagged:
                out.append(f"            {kw} tag == {f.tag}:")
                self.dec_value(f, f"v_{f.attr}", "                ", out)
                out.append("                if pos != tend:")
                out.append(f"                    raise DecodeError('tagged field {f.name} does not fill its size')")
                kw = "elif"
            if tagged:
                out.append("            else:")
                out.append("                if unknown is None:")
                out.append("                    unknown = {}")
                out.append("                unknown[tag] = bytes(buf[pos:tend])")
            else:
                out.append("            if unknown is None:")
                out.append("                unknown = {}")
                out.append("            unknown[tag] = bytes(buf[pos:tend])")
            out.append("            pos = tend")
        args = []
        for f in s.fields:
            args.append(values.get(f.attr) or self.default_expr(f))
        if _has_flexible(self.spec):
            args.append("unknown" if flexible else "None")
        out.append(f"    return K_{s.name}({', '.join(args)}), pos")
        out.append("")

    # encoding ------------------------------------------------------------------------------------
    def enc_value(self, f: FieldSpec, expr: str, ind: str, out: list[str], buf: str = "out") -> None:
        nullable = self.version in f.nullable
        flex = self.flexible(f)
        if f.is_array:
            v = self.var("a")
            out.append(f"{ind}{v} = {expr}")
            out.append(f"{ind}if {v} is None:")
            if not nullable:
                out.append(f"{ind}    raise ValueError('{f.name} is not nullable in version {self.version}')")
            else:
                null = "b'\\x00'" if flex else "b'\\xff\\xff\\xff\\xff'"
                out.append(f"{ind}    {buf} += {null}")
            out.append(f"{ind}else:")
            ind2 = ind + "    "
            if flex:
                out.append(f"{ind2}{buf} += _w_uvarint(len({v}) + 1)")
            else:
                out.append(f"{ind2}{buf} += _I32.pack(len({v}))")
            if f.type in _FIXED and f.type != "uuid":
                fmt = _FIXED[f.type][0]
                table = self.const(_ARRAYS[fmt], "A")
                out.append(f"{ind2}if len({v}) < {_SMALL_ARRAY}:")
                out.append(f"{ind2}    {buf} += {table}[len({v})].pack(*{v})")
                out.append(f"{ind2}else:")
                out.append(f"{ind2}    {buf} += _pack('>%d{fmt}' % len({v}), *{v})")
            else:
                item = self.var("it")
                out.append(f"{ind2}for {item} in {v}:")
                self.enc_single(f, item, ind2 + "    ", out, buf, nullable=False)
        else:
            self.enc_single(f, expr, ind, out, buf, nullable=nullable)

    def enc_single(self, f: FieldSpec, expr: str, ind: str, out: list[str], buf: str, nullable: bool) -> None:
        flex = self.flexible(f)
        t = f.type
        if f.struct is not None:
            if nullable:
                v = self.var("s")
                out.append(f"{ind}{v} = {expr}")
                out.append(f"{ind}if {v} is None:")
                out.append(f"{ind}    {buf} += b'\\xff'")
                out.append(f"{ind}else:")
                out.append(f"{ind}    {buf} += b'\\x01'")
                out.append(f"{ind}    e_{t}({v}, {buf})")
            else:
                out.append(f"{ind}e_{t}({expr}, {buf})")
            return
        if t in _FIXED:
            p = self.packer(_FIXED[t][0])
            out.append(f"{ind}{buf} += {p}.pack({expr})")
            return
        v = self.var("v")
        out.append(f"{ind}{v} = {expr}")
        out.append(f"{ind}if {v} is None:")
        if not (nullable or t == "records"):
            out.append(f"{ind}    raise ValueError('{f.name} is not nullable in version {self.version}')")
        elif flex:
            out.append(f"{ind}    {buf} += b'\\x00'")
        elif t == "string":
            out.append(f"{ind}    {buf} += b'\\xff\\xff'")
        else:
            out.append(f"{ind}    {buf} += b'\\xff\\xff\\xff\\xff'")
        out.append(f"{ind}else:")
        if t == "string":
            out.append(f"{ind}    {v} = {v}.encode('utf-8')")
        if flex:
            out.append(f"{ind}    {buf} += _w_uvarint(len({v}) + 1)")
        elif t == "string":
            out.append(f"{ind}    {buf} += _I16.pack(len({v}))")
        else:
            out.append(f"{ind}    {buf} += _I32.pack(len({v}))")
        if t == "records":
            # large record data is not copied into the frame: see SplicedFrame
            out.append(f"{ind}    if {buf}.__class__ is _Spliced and len({v}) >= {SPLICE_MIN}:")
            out.append(f"{ind}        {buf}.splice({v})")
            out.append(f"{ind}    else:")
            out.append(f"{ind}        {buf} += {v}")
        else:
            out.append(f"{ind}    {buf} += {v}")

    def gen_encoder(self, s: StructSpec) -> None:
        regular, tagged = self.present(s)
        out = self.lines
        out.append(f"def e_{s.name}(o, out):")
        run: list[FieldSpec] = []

        def flush_run() -> None:
            if not run:
                return
            fmt = "".join(_FIXED[f.type][0] for f in run)
            p = self.packer(fmt)
            out.append(f"    out += {p}.pack({', '.join('o.' + f.attr for f in run)})")
            run.clear()

        for f in regular:
            if f.type in _FIXED and not f.is_array and f.struct is None:
                run.append(f)
                continue
            flush_run()
            self.enc_value(f, f"o.{f.attr}", "    ", out)
        flush_run()
        if self.flexible():
            if not tagged:
                out.append("    if o.unknown_tags:")
                out.append("        _w_tags([], o.unknown_tags, out)")
                out.append("    else:")
                out.append("        out += b'\\x00'")
            else:
                out.append("    tags = []")
                for f in tagged:
                    d = self.default_expr(f)
                    cond = f"o.{f.attr} != {d}" if d not in ("None", "[]") else (
                        f"o.{f.attr} is not None" if d == "None" else f"o.{f.attr}"
                    )
                    if f.struct is not None and not f.is_array and d != "None":
                        cond = f"o.{f.attr} is not None and o.{f.attr} != {d}"
                    out.append(f"    if {cond}:")
                    out.append("        tb = bytearray()")
                    self.enc_value(f, f"o.{f.attr}", "        ", out, buf="tb")
                    out.append(f"        tags.append(({f.tag}, tb))")
                out.append("    _w_tags(tags, o.unknown_tags, out)")
        out.append("    return out")
        out.append("")

    def generate(self) -> str:
        order: list[StructSpec] = []
        seen: set[str] = set()

        def visit(s: StructSpec) -> None:
            if s.name in seen:
                return
            seen.add(s.name)
            for f in s.fields:
                if f.struct is not None:
                    visit(f.struct)
            order.append(s)

        visit(self.spec.root)
        for s in order:
            self.gen_decoder(s)
            self.gen_encoder(s)
        return "\n".join(self.lines)


# Record data at least this large is spliced into a SplicedFrame rather than copied.
SPLICE_MIN = 4096


class SplicedFrame(bytearray):
    """An encoding buffer that leaves large ``records`` fields out: each is remembered with its
    position, and ``pieces()`` gives the frame as buffers to write one after the other (with a
    writev), so the record data fetched from the cluster is never copied into a response."""

    __slots__ = ("spliced", "spliced_bytes")

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.spliced: list[tuple[int, Any]] = []
        self.spliced_bytes = 0

    def splice(self, data: Any) -> None:
        self.spliced.append((len(self), data))
        self.spliced_bytes += len(data)

    def size(self) -> int:
        return len(self) + self.spliced_bytes

    def pieces(self) -> list:
        if not self.spliced:
            return [self]
        view = memoryview(self)
        out: list = []
        at = 0
        for pos, data in self.spliced:
            if pos > at:
                out.append(view[at:pos])
            out.append(data)
            at = pos
        if at < len(self):
            out.append(view[at:])
        return out


def _w_tags(tags: list, unknown: dict | None, out: bytearray) -> None:
    if unknown:
        tags = sorted([*tags, *unknown.items()], key=lambda t: t[0])
    out += _w_uvarint(len(tags))
    for tag, data in tags:
        out += _w_uvarint(tag)
        out += _w_uvarint(len(data))
        out += data


_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


class VersionCodec:
    """The compiled encoder/decoder of one message at one version."""

    __slots__ = ("spec", "version", "cls", "_decode", "_encode", "source")

    def __init__(self, spec: MessageSpec, version: int, classes: dict[str, type]) -> None:
        if version not in spec.valid:
            raise KeyError(f"{spec.name} has no version {version} (valid {spec.valid})")
        gen = _Gen(spec, version)
        source = gen.generate()
        ns: dict[str, object] = {
            "DecodeError": DecodeError,
            "_uvarint": _uvarint,
            "_w_uvarint": _w_uvarint,
            "_w_tags": _w_tags,
            "_Spliced": SplicedFrame,
            "_I16": _I16,
            "_I32": _I32,
            "_unpack": struct.unpack_from,
            "_pack": struct.pack,
        }
        ns.update(gen.consts)
        for name, cls in classes.items():
            ns[f"K_{name}"] = cls
        exec(compile(source, f"<kshare codec {spec.name} v{version}>", "exec"), ns)
        self.spec = spec
        self.version = version
        self.cls = classes[spec.root.name]
        self._decode = ns[f"d_{spec.root.name}"]
        self._encode = ns[f"e_{spec.root.name}"]
        self.source = source

    def decode(self, buf: bytes | bytearray | memoryview, pos: int = 0) -> tuple[Any, int]:
        """Decode at ``pos``; returns (message, position after it). Raises DecodeError on bad input."""
        if not isinstance(buf, memoryview):
            buf = memoryview(buf)
        try:
            return self._decode(buf, pos)
        except DecodeError:
            raise
        except (struct.error, IndexError, UnicodeDecodeError, OverflowError, MemoryError) as exc:
            raise DecodeError(f"{self.spec.name} v{self.version}: {exc}") from None

    def encode(self, message: Any, out: bytearray | None = None) -> bytearray:
        if out is None:
            out = bytearray()
        return self._encode(message, out)


_CLASSES: dict[str, dict[str, type]] = {}
_CODECS: dict[tuple[str, int], VersionCodec] = {}


def classes_for(spec: MessageSpec) -> dict[str, type]:
    classes = _CLASSES.get(spec.name)
    if classes is None:
        classes = _CLASSES[spec.name] = build_classes(spec)
    return classes


def codec_for(spec: MessageSpec, version: int) -> VersionCodec:
    key = (spec.name, version)
    codec = _CODECS.get(key)
    if codec is None:
        codec = _CODECS[key] = VersionCodec(spec, version, classes_for(spec))
    return codec


__all__ = ["DecodeError", "VersionCodec", "codec_for", "classes_for", "Versions"]
