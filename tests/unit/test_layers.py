"""Imports in ``kshare/`` point one way: protocol -> clients -> proxy -> share -> the applications.

Every module of ``kshare/`` is read with ``ast`` (not imported), every import in it is found — at
the top, inside functions, under ``if TYPE_CHECKING:`` alike, since each is a dependency — and
mapped to its layer. An import from a lower layer to a higher one fails, and so does a cycle
between packages (two packages importing each other, directly or round a loop), whichever layer
they are in. The failure names the module, the line and the import.

A new top-level module or package of ``kshare/`` must be given a layer in ``LAYERS``.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[2] / "kshare"

# Lowest first. A unit is a top-level package or module of kshare (``kshare.share`` with all of
# its subpackages, ``kshare.cli``); ``kshare`` itself is its ``__init__``.
LAYERS: dict[str, tuple[str, ...]] = {
    # the codec, the specs' generated names, and helpers that need nothing of kshare
    "protocol": ("kshare.protocol", "kshare.addresses"),
    # kshare's own Kafka clients, and how they authenticate
    "client": ("kshare.clients", "kshare.security"),
    # the wire-protocol proxy
    "proxy": ("kshare.proxy",),
    # the share-group engine, served on the proxy
    "share": ("kshare.share",),
    # what puts it all together or runs on it
    "app": ("kshare", "kshare.__main__", "kshare.app", "kshare.cli", "kshare.metrics", "kshare.spark",
            "kshare.tools", "kshare.bench", "kshare.embedded"),
}
RANK = {layer: i for i, layer in enumerate(LAYERS)}
LAYER_OF_UNIT = {unit: layer for layer, units in LAYERS.items() for unit in units}


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, e.g. kshare.proxy.config
    path: str  # its file, relative to the repository
    line: int
    target: str  # the imported module, e.g. kshare.share.config

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.module} imports {self.target}"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, root: Path) -> list[Import]:
    """Every import of a kshare module in the file, wherever it stands."""
    module = module_name(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    rel = str(path.relative_to(root.parent))
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [Import(module, rel, node.lineno, a.name) for a in node.names if a.name.split(".")[0] == root.name]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != root.name:
                continue
            for alias in node.names:  # ``from kshare import proxy`` imports the package kshare.proxy
                sub = f"{source}.{alias.name}"
                is_module = (root.parent / sub.replace(".", "/")).is_dir() or (
                    root.parent / (sub.replace(".", "/") + ".py")).is_file()
                found.append(Import(module, rel, node.lineno, sub if is_module else source))
    return found


def unit_of(module: str) -> str:
    """``kshare.share.state.replay`` -> ``kshare.share``; ``kshare`` -> ``kshare``."""
    return ".".join(module.split(".")[:2])


def all_imports(root: Path) -> list[Import]:
    return [imp for path in sorted(root.rglob("*.py")) for imp in imports_of(path, root)]


def upward_imports(imports: list[Import], layer_of_unit: dict[str, str]) -> list[str]:
    bad = []
    for imp in imports:
        mine, theirs = layer_of_unit[unit_of(imp.module)], layer_of_unit[unit_of(imp.target)]
        if RANK[theirs] > RANK[mine]:
            bad.append(f"{imp} ({mine} -> {theirs}: a lower layer imports a higher one)")
    return bad


def package_cycles(imports: list[Import]) -> list[str]:
    """Each cycle between units, with one import per step of it."""
    edges: dict[str, dict[str, Import]] = defaultdict(dict)
    for imp in imports:
        a, b = unit_of(imp.module), unit_of(imp.target)
        if a != b:
            edges[a].setdefault(b, imp)
    # Tarjan's strongly connected components
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    out = []
    for component in components:
        steps = [str(edges[a][b]) for a in component for b in component if b in edges[a]]
        out.append(f"cycle between {', '.join(component)}:\n    " + "\n    ".join(steps))
    return out


# -- kshare itself ---------------------------------------------------------------------------------


def test_every_unit_of_kshare_has_a_layer() -> None:
    units = {unit_of(module_name(p, PACKAGE_ROOT)) for p in PACKAGE_ROOT.rglob("*.py")}
    missing = sorted(units - set(LAYER_OF_UNIT))
    assert not missing, f"give these a layer in tests/unit/test_layers.py LAYERS: {missing}"


def test_no_import_points_upward() -> None:
    bad = upward_imports(all_imports(PACKAGE_ROOT), LAYER_OF_UNIT)
    assert not bad, "imports against the layers protocol -> client -> proxy -> share -> app:\n" + "\n".join(bad)


def test_no_cycle_between_packages() -> None:
    cycles = package_cycles(all_imports(PACKAGE_ROOT))
    assert not cycles, "\n".join(cycles)


# -- the checker finds what it looks for ------------------------------------------------------------


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    """A package ``kshare`` of ``files`` (path: text); a folder without an ``__init__.py`` in
    ``files`` gets an empty one."""
    root = tmp_path / "kshare"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for folder in [root, *(p for p in root.rglob("*") if p.is_dir())]:
        (folder / "__init__.py").touch()
    return root


def test_checker_finds_upward_imports_anywhere_in_a_module(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "proxy/config.py": "from ..share.config import Limits\n",
        "proxy/server.py": "def f():\n    from kshare.share import service\n",
        "proxy/typing_only.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import kshare.share.service\n",
        "share/config.py": "from ..proxy import server\nfrom kshare.protocol import codes\n",
        "share/service.py": "",
        "protocol/codes.py": "",
    })
    bad = upward_imports(all_imports(root), LAYER_OF_UNIT)
    assert [b.split(" (")[0] for b in bad] == [
        "kshare/proxy/config.py:1: kshare.proxy.config imports kshare.share.config",
        "kshare/proxy/server.py:2: kshare.proxy.server imports kshare.share.service",
        "kshare/proxy/typing_only.py:3: kshare.proxy.typing_only imports kshare.share.service",
    ]
    assert all("(proxy -> share" in b for b in bad)


def test_checker_finds_cycles_between_packages_of_one_layer(tmp_path: Path) -> None:
    # spark -> tools -> bench -> spark, one import inside a function; the cli (app layer) only looks on
    root = _tree(tmp_path, {"spark/__init__.py": "from ..tools import groups\n",
                            "tools/groups.py": "def f():\n    from ..bench import runner\n",
                            "bench/runner.py": "import kshare.spark\n", "cli.py": "from kshare import tools\n"})
    cycles = package_cycles(all_imports(root))
    assert len(cycles) == 1
    assert cycles[0].startswith("cycle between kshare.bench, kshare.spark, kshare.tools:")
    assert "kshare/tools/groups.py:2: kshare.tools.groups imports kshare.bench.runner" in cycles[0]
    assert not upward_imports(all_imports(root), LAYER_OF_UNIT)


@pytest.mark.parametrize("source, target", [
    ("from . import app", "kshare.app"),
    ("from . import __version__", "kshare"),
    ("from .proxy.config import ProxyConfig", "kshare.proxy.config"),
    ("from kshare.share import service", "kshare.share.service"),
])
def test_imports_resolve_to_modules(tmp_path: Path, source: str, target: str) -> None:
    root = _tree(tmp_path, {"app.py": "", "cli.py": source + "\n", "proxy/config.py": "",
                            "share/service.py": ""})
    assert [i.target for i in imports_of(root / "cli.py", root)] == [target]
