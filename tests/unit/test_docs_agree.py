"""The docs say what the code does, and keep saying it.

* docs/reference/proxy.md's option tables list every option of `kshare proxy` and `kshare ready`,
  each with its environment variable (and its default and choices where the command has them),
  and no option the commands do not have;
* its table of what the proxy does to each API has one row per entry of
  `kshare.proxy.filters.INTERCEPTIONS`, saying the downgrade, the handler and whether a response
  rewrite is there exactly where the table of the code does;
* every metric `/metrics` exports is in docs/reference/metrics.md's metrics table under the name it
  is exported as (counters with `_total`), and every `kshare_...` metric name the docs mention is
  exported;
* no doc or deploy file says that TLS, SASL or several proxies are not supported;
* the index, docs/README.md, links every doc, and every relative link in the docs and the README
  leads to a file that exists (and, with an anchor, to a heading of it).

The exported metrics are read from the registry the proxy builds (`kshare.metrics.Metrics`), fed
with stand-ins for the proxy and the share service, so a new metric is seen without a broker.
"""

from __future__ import annotations

import re
from pathlib import Path
from unittest.mock import MagicMock

import click
import pytest

from kshare import metrics as metrics_module
from kshare.cli import main
from kshare.protocol import messages
from kshare.proxy import filters

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PROXY_MD = DOCS / "reference" / "proxy.md"
METRICS_MD = DOCS / "reference" / "metrics.md"
INDEX_MD = DOCS / "README.md"

HELP_OPTIONS = tuple(main.context_settings["help_option_names"])  # every command has them


# -- markdown ---------------------------------------------------------------------------------------

def section(text: str, heading: str) -> str:
    """The text under the level-2 heading `heading`, up to the next level-2 heading."""
    lines = text.splitlines()
    start = lines.index(heading)  # ValueError: the heading is gone
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return "\n".join(lines[start + 1:end])


def table_rows(text: str) -> list[list[str]]:
    """The cells of every markdown table row (header separators left out)."""
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("|") or re.fullmatch(r"[|\s:-]+", line):
            continue
        rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line.strip("|"))])
    return rows


def option_rows(text: str) -> dict[str, list[str]]:
    """option name -> the cells of its row, for the rows whose first cell names options."""
    out: dict[str, list[str]] = {}
    for cells in table_rows(text):
        if not cells[0].startswith("`-"):
            continue
        for name in re.findall(r"`(--?[A-Za-z][\w-]*)", cells[0]):
            assert name not in out, f"{name} has two rows"
            out[name] = cells
    return out


# -- options ----------------------------------------------------------------------------------------

COMMANDS = {  # command -> its section of docs/reference/proxy.md, and whether the table has an environment column
    "proxy": ("## `kshare proxy`", True),
    "ready": ("## `kshare ready`", False),
}


def options(command: click.Command) -> list[click.Option]:
    return [p for p in command.params if isinstance(p, click.Option)]


def documented(name: str) -> dict[str, list[str]]:
    heading, _ = COMMANDS[name]
    return option_rows(section(PROXY_MD.read_text(), heading))


def shown_default(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_option_has_a_row(name):
    command = main.commands[name]
    rows = documented(name)
    _, has_env = COMMANDS[name]
    missing = []
    for opt in options(command):
        longs = [o for o in (*opt.opts, *opt.secondary_opts) if o.startswith("--")]
        for long_name in longs:
            cells = rows.get(long_name)
            if cells is None:
                missing.append(f"{long_name}: no row")
                continue
            if opt.envvar:
                envvars = [opt.envvar] if isinstance(opt.envvar, str) else list(opt.envvar)
                for env in envvars:
                    if not has_env or f"`{env}`" not in cells[1]:
                        missing.append(f"{long_name}: its environment variable `{env}` is not in its row")
            if opt.show_default and not opt.is_flag and not opt.multiple and opt.default is not None:
                default = shown_default(opt.default)
                default_cell = cells[2 if has_env else 1]
                if f"`{default}`" not in default_cell and default not in default_cell.split():
                    missing.append(f"{long_name}: its default {default} is not in its row")
            if isinstance(opt.type, click.Choice):
                row = " | ".join(cells)
                missing += [f"{long_name}: choice {c} is not in its row" for c in opt.type.choices
                            if f"`{c}`" not in row]
    for help_name in HELP_OPTIONS:
        if help_name not in rows:
            missing.append(f"{help_name}: no row")
    assert not missing, f"docs/reference/proxy.md, kshare {name}:\n" + "\n".join(missing)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_no_row_for_an_option_the_command_lacks(name):
    command = main.commands[name]
    known = set(HELP_OPTIONS)
    for opt in options(command):
        known.update(opt.opts)
        known.update(opt.secondary_opts)
    stale = sorted(set(documented(name)) - known)
    assert not stale, f"docs/reference/proxy.md lists options kshare {name} does not have: {stale}"


def test_every_proxy_environment_variable_is_in_the_reference():
    text = PROXY_MD.read_text()
    missing = [p.envvar for p in options(main.commands["proxy"]) if p.envvar and p.envvar not in text]
    assert not missing


def test_the_option_tables_are_found():
    """Guards the tests above against reading an empty table."""
    rows = documented("proxy")
    assert {"--upstream", "--port", "--tls-cert", "--upstream-security-protocol", "--help"} <= set(rows)
    assert rows["--port"][1] == "`KSHARE_PORT`"
    assert {"--metrics-address", "--timeout"} <= set(documented("ready"))
    assert option_rows("| `--a X` | `E` |\n| --- | --- |\n| `-h`, `--help` | |\n| `x.y` | 1 |") == {
        "--a": ["`--a X`", "`E`"], "-h": ["`-h`, `--help`", ""], "--help": ["`-h`, `--help`", ""]}


# -- interceptions ----------------------------------------------------------------------------------

INTERCEPTIONS_HEADING = "## What the proxy does to each API"


def interception_rows() -> dict[int, list[str]]:
    """API key -> the cells (request, served, response) of its row in docs/reference/proxy.md."""
    out: dict[int, list[str]] = {}
    for cells in table_rows(section(PROXY_MD.read_text(), INTERCEPTIONS_HEADING)):
        match = re.fullmatch(r"(\w+) \((\d+)\)", cells[0])
        if match is None:
            continue  # the header
        key = int(match.group(2))
        assert key not in out, f"API key {key} has two rows"
        assert messages.apis()[key].name == match.group(1), f"API key {key} is not {match.group(1)}"
        out[key] = cells[1:]
    return out


def test_the_interception_table_is_the_codes():
    rows = interception_rows()
    assert len(rows) > 10  # the table was found
    wrong = [f"{filters.api_name(k)}: no row" for k in sorted(set(filters.INTERCEPTIONS) - set(rows))]
    wrong += [f"{filters.api_name(k)}: a row, but not in INTERCEPTIONS" for k in sorted(set(rows) - set(filters.INTERCEPTIONS))]
    for key, entry in filters.INTERCEPTIONS.items():
        if key not in rows:
            continue
        request, served, response = rows[key]
        name = filters.api_name(key)
        if (entry.downgrade is None) != (not request):
            wrong.append(f"{name}: the request column should {'be empty' if entry.downgrade is None else 'say the downgrade'}")
        elif entry.downgrade is not None and f"as v{entry.downgrade.version}" not in request:
            wrong.append(f"{name}: the downgrade is to v{entry.downgrade.version}")
        if (entry.served is None) != (not served):
            wrong.append(f"{name}: the served column should {'be empty' if entry.served is None else 'name the handler'}")
        elif entry.served is not None:
            handler = entry.served.by.removeprefix("kshare.share.handlers.").removeprefix("kshare.proxy.server.")
            if f"`{handler}`" not in served:
                wrong.append(f"{name}: served by `{handler}`")
            if entry.served.some != served.startswith("some"):
                wrong.append(f"{name}: {'only some requests are' if entry.served.some else 'every request is'} served")
        if (entry.response is None) != (not response):
            wrong.append(f"{name}: the response column should {'be empty' if entry.response is None else 'say the rewrite'}")
    assert not wrong, "docs/reference/proxy.md's interception table and kshare.proxy.filters.INTERCEPTIONS differ:\n" + \
        "\n".join(wrong)


# -- metrics ----------------------------------------------------------------------------------------

HISTOGRAM_SAMPLES = ("_bucket", "_sum", "_count")
# a metric name in text: not a part of a longer name, a path or a topic (__kshare_share_group_state)
METRIC_IN_TEXT = re.compile(r"(?<![\w./-])((?:kshare|process|python)_[a-z0-9_]*[a-z0-9])(?![\w-])")


def exported() -> dict[str, str]:
    """name -> type of every metric family on /metrics, named as the exposition names it."""
    registry = metrics_module.Metrics(MagicMock(name="proxy"), MagicMock(name="share_service"))
    text = registry.render().decode()
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE))


def sample_names(families: dict[str, str]) -> set[str]:
    """What a query may name: the families and, for histograms, their series."""
    names = set(families)
    for name, kind in families.items():
        if kind == "histogram":
            names.update(name + s for s in HISTOGRAM_SAMPLES)
    return names


def doc_files() -> list[Path]:
    return sorted(DOCS.rglob("*.md")) + [ROOT / "README.md"] + sorted(p for p in (ROOT / "deploy").rglob("*")
                                                                      if p.is_file())


def test_the_metrics_are_read_from_the_proxy_registry():
    """The stand-ins reach every family metrics.py defines (none hides behind a branch not taken)."""
    families = exported()
    assert families["kshare_requests_total"] == "counter"
    assert families["kshare_request_seconds"] == "histogram"
    source = Path(metrics_module.__file__).read_text()
    literals = set(re.findall(r"""["'](kshare_[a-z0-9_]*)""", source))
    assert len(literals) > 10
    bases = {name.removesuffix("_total") if kind == "counter" else name for name, kind in families.items()}
    unreached = sorted(lit for lit in literals if not any(b.startswith(lit) for b in bases))
    assert not unreached, f"names in kshare/metrics.py not on the rendered /metrics: {unreached}"


def test_every_exported_metric_is_in_the_reference():
    table = section(METRICS_MD.read_text(), "## Metrics")
    listed = set(METRIC_IN_TEXT.findall(table))
    missing = sorted(name for name in exported() if name not in listed)
    assert not missing, f"exported on /metrics but not in docs/reference/metrics.md's Metrics section: {missing}"


def test_every_metric_the_docs_name_is_exported():
    names = sample_names(exported())
    wrong = []
    for path in doc_files():
        for name in METRIC_IN_TEXT.findall(path.read_text()):
            if name.startswith("kshare_") and name not in names:
                wrong.append(f"{path.relative_to(ROOT)}: {name}")
    assert not wrong, "metric names not on /metrics (counters end in _total):\n" + "\n".join(sorted(set(wrong)))


def test_metric_names_in_text():
    found = METRIC_IN_TEXT.findall("`kshare_ready` rate(kshare_state_write_seconds_bucket[5m]) __kshare_share_group_state "
                                   "/tmp/kshare_x kshare-state.kshare.__kshare_share_group_state process_open_fds.")
    assert found == ["kshare_ready", "kshare_state_write_seconds_bucket", "process_open_fds"]


# -- features said to be missing --------------------------------------------------------------------

FEATURE = r"(?:\bTLS\b|\bSSL\b|\bSASL\b|\bmTLS\b|\bseveral (?:kshare )?(?:instances|proxies|processes)\b|" \
          r"\bmore than one (?:kshare )?(?:instance|proxy|process)\b|\binstance groups?\b)"
MISSING = r"(?:\bnot (?:yet )?(?:supported|implemented|available)\b|\bno support\b|\bcannot do\b|" \
          r"\bis not possible\b|\bno option for\b|\bnot (?:\w+ ){0,2}yet\b)"
# within one sentence, table cell or comment line (YAML and shell comments joined up)
FORBIDDEN = [
    re.compile(FEATURE + r"[^.|]*" + MISSING, re.IGNORECASE),
    re.compile(MISSING + r"[^.|]*" + FEATURE, re.IGNORECASE),
    re.compile(r"\bno (?:TLS|SASL)(?: or (?:TLS|SASL))? (?:towards|to|on|for)\b", re.IGNORECASE),
    re.compile(r"\bmust be (?:a )?PLAINTEXT\b", re.IGNORECASE),
    re.compile(r"\bprocess owns (?:all|everything)\b", re.IGNORECASE),
    re.compile(r"\bonly one kshare (?:instance|process|proxy) may\b", re.IGNORECASE),
]
PRONOUN = re.compile(r"\s*(?:this|that|it|these|they|neither)\b", re.IGNORECASE)
# a heading announcing what is missing, and a bullet under it naming one of those features
MISSING_HEADING = re.compile(r"^#+ .*\b(?:not supported|not implemented|not yet|missing|unsupported)\b", re.IGNORECASE)
FEATURE_BULLET = re.compile(r"^\s*[*-]\s+(?:\*\*)?(?:TLS|SSL|SASL|mTLS|mutual TLS|several|multiple|more than one)\b",
                            re.IGNORECASE)


def sentences(text: str) -> list[str]:
    """Sentences, with lines joined and comment markers (`#` of YAML, shell, env files) dropped."""
    joined = re.sub(r"\s*\n\s*(?:#+(?!#)\s*)?", " ", text)
    return [s for s in re.split(r"(?<=[.!?])\s+|\s\|\s|\*\s", joined) if s.strip()]


def claims_missing(text: str) -> list[str]:
    units = sentences(text)
    found = [s.strip() for s in units if any(p.search(s) for p in FORBIDDEN)]
    # "TLS on the listeners. This is not implemented yet."
    found += [f"{prev.strip()} {s.strip()}" for prev, s in zip(units, units[1:], strict=False)
              if PRONOUN.match(s) and re.search(MISSING, s, re.IGNORECASE) and re.search(FEATURE, prev, re.IGNORECASE)]
    heading = None
    for line in text.splitlines():
        if line.startswith("#") and line.lstrip("#").startswith(" "):
            heading = line if MISSING_HEADING.match(line) else None
        elif heading and FEATURE_BULLET.match(line):
            found.append(f"{heading.strip()}: {line.strip()}")
    return found


def test_no_doc_says_tls_sasl_or_several_proxies_are_missing():
    found = []
    for path in doc_files():
        found += [f"{path.relative_to(ROOT)}: {claim[:160]}" for claim in claims_missing(path.read_text())]
    assert not found, "TLS, SASL and instance groups exist (docs/guide/security.md, docs/design/scale-out.md):\n" + "\n".join(found)


@pytest.mark.parametrize("text", [
    "* TLS or SASL on the proxy's listeners; clients connect with PLAINTEXT. This is not implemented yet.",
    "## Not supported yet\n\n* TLS or SASL on kshare's own connections to the cluster.\n",
    "## Not supported yet\n\n* Several kshare instances on one state topic.\n",
    "# The cluster to front: a PLAINTEXT listener (TLS and SASL to the cluster are not implemented).",
    "  # The bootstrap Service, on a PLAINTEXT listener (TLS and SASL to the\n  # cluster are not implemented).",
    "| `KSHARE_UPSTREAM` | x | Must be a PLAINTEXT listener without authentication |",
    "* **No TLS or SASL towards the cluster.** There is no option for certificates.",
    "(kshare cannot do TLS or SASL towards the cluster yet)",
    "today the\n  process owns all.",
    "Running several proxies on one state topic is not supported.",
])
def test_the_phrases_are_caught(text):
    assert claims_missing(text)


@pytest.mark.parametrize("text", [
    "## Not yet\n\n* OAUTHBEARER is not tested against a broker.\n* A client certificate presented to kshare "
    "cannot be forwarded: clusters that authorize by TLS identity need their clients to use SASL.\n",
    "Anything else is refused with `Error: unsupported property`, and an incomplete set (SASL without "
    "credentials) says what is missing.",
    "| speculative execution | **not supported**: keep `spark.speculation=false` |",
    "* Several proxies on one state topic must form one instance group.",
])
def test_true_limits_pass(text):
    assert not claims_missing(text)


# -- links ------------------------------------------------------------------------------------------

FENCE = re.compile(r"^\s*(```|~~~)")
# an inline link or image: [text](target) or ![alt](target); the target has no spaces
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)\)")


def prose(text: str) -> str:
    """The text outside fenced code blocks (a link in a code sample is not one)."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return "\n".join(out)


def relative_links(path: Path) -> list[tuple[str, str]]:
    """(file part, anchor) of every link in `path` that is not to another site."""
    links = []
    for target in INLINE_LINK.findall(prose(path.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        links.append((file, anchor))
    return links


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors GitHub makes for the headings of a markdown file (repeats get -1, -2, ...)."""
    seen: dict[str, int] = {}
    for line in prose(path.read_text()).splitlines():
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            base = slug(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            if count:
                seen[f"{base}-{count}"] = 1
    return set(seen)


def markdown_files() -> list[Path]:
    return sorted(DOCS.rglob("*.md")) + [ROOT / "README.md"]


def test_the_index_links_every_doc():
    linked = {(INDEX_MD.parent / file).resolve() for file, _ in relative_links(INDEX_MD) if file}
    missing = [str(p.relative_to(ROOT)) for p in sorted(DOCS.rglob("*.md")) if p != INDEX_MD and p.resolve() not in linked]
    assert not missing, "docs/README.md does not link:\n" + "\n".join(missing)
    assert "docs/README.md" in {f for f, _ in relative_links(ROOT / "README.md")}, "README.md does not link the index"


def test_every_relative_link_leads_somewhere():
    broken = []
    for path in markdown_files():
        for file, anchor in relative_links(path):
            target = (path.parent / file).resolve() if file else path
            where = f"{path.relative_to(ROOT)}: {file}{'#' + anchor if anchor else ''}"
            if not target.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and target.suffix == ".md" and anchor not in anchors(target):
                broken.append(f"{where} (no such heading)")
    assert not broken, "links that lead nowhere:\n" + "\n".join(broken)


def test_links_and_anchors_are_read_as_github_does(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# Title\n\n## Group limits (`--group-limit`)\n\n## Fair acquisition (`fairness.FairShare`)\n\n"
                    "## Figures\n\n### Figures\n\n[a](x.md#y) ![b](../i.png) [c](https://e.org/x) [d](#title)\n"
                    "[`kshare ready`](proxy.md#kshare-ready)\n```\n[e](in-code.md)\n```\n")
    assert anchors(page) == {"title", "group-limits---group-limit", "fair-acquisition-fairnessfairshare",
                             "figures", "figures-1"}
    assert relative_links(page) == [("x.md", "y"), ("../i.png", ""), ("", "title"), ("proxy.md", "kshare-ready")]
