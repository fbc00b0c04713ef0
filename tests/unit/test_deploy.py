"""deploy/ (container, Kubernetes, systemd) names only what `kshare proxy` has, and is well formed.

Every `--flag` given to a kshare command and every KSHARE_* variable in deploy/ and
docs/guide/deploy.md must be a parameter (option or environment variable) of that click command. The
Kubernetes manifests must be YAML documents of the expected kinds whose cross-references hold
(selectors, the headless Service, the ConfigMap, probes on the metrics port, broker ports), and
must run three proxies as one instance group: three replicas, KSHARE_INSTANCE_GROUP for all of
them, a PodDisruptionBudget allowing one proxy down, and a grace period covering the hand-over.
"""

from __future__ import annotations

import json
import re
import shlex
from collections import Counter
from pathlib import Path

import click
import pytest

from kshare.cli import main

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DOCS = ROOT / "docs" / "guide" / "deploy.md"
K8S = DEPLOY / "kubernetes"
STRIMZI_EXAMPLE = K8S / "strimzi-example" / "kafka.yaml"

ENV_RE = re.compile(r"\bKSHARE_[A-Z0-9_]*[A-Z0-9]\b")
# `kshare SUBCOMMAND`, also as JSON array items ("kshare", "proxy")
INVOCATION_RE = re.compile(r"""\bkshare["',\s]+([a-z]+)\b""")
FLAG_RE = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*|-[a-zA-Z])(?![\w-])")
COMMAND_END_RE = re.compile(r"&&|\|\||[|;]|\s#")


# -- what the CLI has ------------------------------------------------------------------------------

def command_params(name: str) -> tuple[set[str], set[str]]:
    """The option names and environment variables of `kshare NAME`."""
    cmd = main.commands[name]
    opts, envvars = {"-h", "--help"}, set()  # the help option comes from main's context_settings
    for p in cmd.params:
        opts.update(p.opts)
        opts.update(p.secondary_opts)
        if isinstance(p.envvar, str):
            envvars.add(p.envvar)
        elif p.envvar:
            envvars.update(p.envvar)
    return opts, envvars


def test_the_proxy_command_is_introspectable():
    proxy = main.commands["proxy"]
    assert isinstance(proxy, click.Command)
    opts, envvars = command_params("proxy")
    assert {"--upstream", "--listen-host", "--port", "--metrics-port"} <= opts
    assert {"KSHARE_UPSTREAM", "KSHARE_LISTEN_HOST", "KSHARE_PORT", "KSHARE_METRICS_PORT"} <= envvars


# -- what deploy/ uses ------------------------------------------------------------------------------

def scanned_files() -> list[Path]:
    files = sorted(p for p in DEPLOY.rglob("*") if p.is_file())
    files.append(DOCS)
    return files


def logical_lines(text: str) -> list[str]:
    """Lines with backslash continuations joined (shell, Dockerfile)."""
    out, pending = [], ""
    for line in text.splitlines():
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        out.append(pending + line)
        pending = ""
    if pending:
        out.append(pending)
    return out


def invocations(text: str) -> list[tuple[str, list[str]]]:
    """(subcommand, flags) of every `kshare SUBCOMMAND ...` in the text."""
    found = []
    for line in logical_lines(text):
        for m in INVOCATION_RE.finditer(line):
            if m.group(1) not in main.commands:
                continue
            rest = line[m.end():]
            end = COMMAND_END_RE.search(rest)
            if end:
                rest = rest[:end.start()]
            found.append((m.group(1), FLAG_RE.findall(rest)))
    return found


def container_args() -> list[tuple[str, list[str]]]:
    """Flags in the Kubernetes containers' args (the image's entrypoint is `kshare proxy`)."""
    found = []
    for _, doc in manifests():
        if doc.get("kind") != "StatefulSet":
            continue
        for c in doc["spec"]["template"]["spec"]["containers"]:
            command = " ".join(shlex.quote(str(a)) for a in c.get("command") or [])
            args = [str(a) for a in c.get("args") or []]
            if command:
                found += invocations(command + " " + " ".join(shlex.quote(a) for a in args))
            else:
                found.append(("proxy", [a.split("=", 1)[0] for a in args if a.startswith("-")]))
    return found


def used_names() -> tuple[list[tuple[str, str, str]], list[tuple[str, str]]]:
    """([(file, subcommand, flag)], [(file, KSHARE_VARIABLE)]) over deploy/ and docs/guide/deploy.md."""
    flags, envs = [], []
    for path in scanned_files():
        text = path.read_text()
        rel = str(path.relative_to(ROOT))
        for sub, fl in invocations(text):
            flags += [(rel, sub, f) for f in fl]
        envs += [(rel, v) for v in ENV_RE.findall(text)]
    flags += [("deploy/kubernetes (container args)", sub, f) for sub, fl in container_args() for f in fl]
    return flags, envs


def test_deploy_names_only_options_kshare_proxy_has():
    """Every flag and KSHARE_* variable in deploy/ and docs/guide/deploy.md exists in the CLI."""
    flags, envs = used_names()
    unknown = []
    for rel, sub, flag in flags:
        if flag not in command_params(sub)[0]:
            unknown.append(f"{rel}: kshare {sub} {flag}")
    proxy_envvars = command_params("proxy")[1]
    for rel, var in envs:
        if var not in proxy_envvars:
            unknown.append(f"{rel}: {var}")
    assert not unknown, "not parameters of the kshare command:\n" + "\n".join(sorted(set(unknown)))


def test_the_scan_finds_what_deploy_uses():
    """Guards the test above against scanning nothing."""
    flags, envs = used_names()
    env_files = {rel for rel, _ in envs}
    assert {"deploy/Dockerfile", "deploy/kubernetes/configmap.yaml", "deploy/kubernetes/statefulset.yaml",
            "deploy/systemd/kshare.env", "docs/guide/deploy.md"} <= env_files
    assert {var for _, var in envs} >= {"KSHARE_UPSTREAM", "KSHARE_STATE_TOPIC", "KSHARE_ADVERTISED_HOST",
                                       "KSHARE_LISTEN_HOST", "KSHARE_PORT", "KSHARE_BROKER_PORT_BASE",
                                       "KSHARE_METRICS_PORT"}
    assert invocations("ExecStart=/opt/kshare/bin/kshare proxy --port 1 \\\n  --log-format json && x --y") == [
        ("proxy", ["--port", "--log-format"])]
    assert invocations('CMD ["kshare", "ready", "--timeout", "0"]') == [("ready", ["--timeout"])]
    assert ("docs/guide/deploy.md", "proxy", "--listen-host") in flags


# -- Dockerfile -----------------------------------------------------------------------------------

def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of deploy/Dockerfile, continuations joined, comments dropped."""
    lines = [ln for ln in (DEPLOY / "Dockerfile").read_text().splitlines() if not ln.lstrip().startswith("#")]
    out = []
    for line in logical_lines("\n".join(lines)):
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile():
    instructions = dockerfile()
    by = {}
    for word, rest in instructions:
        by.setdefault(word, []).append(rest)
    args = dict(a.split("=", 1) for a in by["ARG"] if "=" in a)
    bases = [args.get(f[2:-1], f) if f.startswith("${") else f for f in (x.split()[0] for x in by["FROM"])]
    assert all(re.fullmatch(r"python:3\.1[12]-slim", b) for b in bases), bases
    assert json.loads(by["ENTRYPOINT"][-1]) == ["kshare", "proxy"]
    user = by["USER"][-1].split(":")[0]
    assert user not in ("root", "0")
    installs = [r for r in by["RUN"] if "pip install" in r]
    assert installs and not any("[" in r or "pyspark" in r or "calfkit" in r for r in installs), installs
    env = dict(re.findall(r"(KSHARE_[A-Z_]+)=(\S+)", " ".join(by["ENV"])))
    exposed = set()
    for item in " ".join(by["EXPOSE"]).split():
        lo, _, hi = item.split("/")[0].partition("-")
        exposed.update(range(int(lo), int(hi or lo) + 1))
    assert env["KSHARE_LISTEN_HOST"] == "0.0.0.0"
    for port in (env["KSHARE_PORT"], env["KSHARE_BROKER_PORT_BASE"], env["KSHARE_METRICS_PORT"]):
        assert int(port) in exposed
    (health,) = by["HEALTHCHECK"]
    assert "/live" in health or ("kshare" in health and "ready" in health)


def test_dockerignore_keeps_what_the_build_copies():
    patterns = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()
                if ln.strip() and not ln.startswith("#")]
    kept = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    for word, rest in dockerfile():
        if word == "COPY" and not rest.startswith("--from"):
            for src in rest.split()[:-1]:
                assert src.rstrip("/") in kept, src


# -- systemd --------------------------------------------------------------------------------------

def unit() -> dict[str, dict[str, list[str]]]:
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for n, line in enumerate((DEPLOY / "systemd" / "kshare.service").read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            assert line.endswith("]"), n
            current = sections.setdefault(line[1:-1], {})
            continue
        key, sep, value = line.partition("=")
        assert sep and current is not None and re.fullmatch(r"[A-Za-z]+", key), f"line {n}: {line}"
        current.setdefault(key, []).append(value)
    return sections


def test_systemd_unit():
    u = unit()
    service = {k: v[-1] for k, v in u["Service"].items()}
    assert service["EnvironmentFile"] == "/etc/kshare/kshare.env"
    assert service["Restart"] == "on-failure"
    assert service["KillSignal"] == "SIGTERM"
    assert int(service["TimeoutStopSec"]) >= 40  # a clean stop can take about 35 s (docs/reference/proxy.md)
    assert service["User"] not in ("", "root", "0")
    assert service["NoNewPrivileges"] == "yes"
    assert service["ProtectSystem"] == "strict"
    assert re.search(r"(^|/)kshare proxy\b", service["ExecStart"]), service["ExecStart"]
    assert u["Install"]["WantedBy"] == ["multi-user.target"]


def test_systemd_env_example():
    proxy_envvars = command_params("proxy")[1]
    keys = []
    for n, line in enumerate((DEPLOY / "systemd" / "kshare.env").read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep and re.fullmatch(r"KSHARE_[A-Z0-9_]+", key), f"line {n}: {line}"
        if value.startswith('"'):
            assert value.endswith('"') and len(value) > 1, f"line {n}: unbalanced quotes"
        else:
            assert " " not in value, f"line {n}: quote values with spaces"
        keys.append(key)
    assert len(keys) == len(set(keys))
    assert {"KSHARE_UPSTREAM", "KSHARE_ADVERTISED_HOST", "KSHARE_LISTEN_HOST", "KSHARE_METRICS_PORT"} <= set(keys)
    assert set(keys) <= proxy_envvars


# -- YAML -----------------------------------------------------------------------------------------

def load_yaml_documents(text: str) -> list:
    try:
        import yaml
    except ImportError:
        return MiniYaml(text).documents()
    return list(yaml.safe_load_all(text))


class MiniYaml:
    """The block-style YAML subset of the manifests, for when PyYAML is not installed.

    Block mappings and sequences, plain and quoted scalars (typed as YAML 1.1 does: ints, floats,
    booleans, null), empty flow collections, comments, `---`. Anything else (anchors, tags, block
    scalars, non-empty flow collections, tabs) is an error rather than a wrong reading.
    """

    BOOLS = {"true": True, "false": False, "yes": True, "no": False, "on": True, "off": False}
    NUMBER = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")

    def __init__(self, text: str) -> None:
        self.docs: list[list[tuple[int, str, int]]] = [[]]
        for n, raw in enumerate(text.splitlines(), 1):
            if "\t" in raw[: len(raw) - len(raw.lstrip())]:
                raise ValueError(f"line {n}: tab in indentation")
            content = self._strip_comment(raw).rstrip()
            if not content.strip():
                continue
            if content == "---":
                self.docs.append([])
                continue
            self.docs[-1].append((len(content) - len(content.lstrip()), content.strip(), n))

    @staticmethod
    def _strip_comment(line: str) -> str:
        quote = None
        for i, ch in enumerate(line):
            if quote:
                if ch == quote:
                    quote = None
            elif ch in "'\"" and (i == 0 or line[i - 1] in " :-[{,"):
                quote = ch
            elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
                return line[:i]
        return line

    def documents(self) -> list:
        out = []
        for lines in self.docs:
            if not lines:
                continue
            self.lines, self.i = list(lines), 0
            value = self._block(self.lines[0][0])
            if self.i != len(self.lines):
                raise ValueError(f"line {self.lines[self.i][2]}: unexpected indentation")
            out.append(value)
        return out

    def _block(self, indent: int):
        if self.lines[self.i][1] == "-" or self.lines[self.i][1].startswith("- "):
            return self._sequence(indent)
        return self._mapping(indent)

    def _sequence(self, indent: int) -> list:
        items = []
        while self.i < len(self.lines):
            ind, content, n = self.lines[self.i]
            if ind != indent or not (content == "-" or content.startswith("- ")):
                if ind > indent:
                    raise ValueError(f"line {n}: unexpected indentation")
                break
            rest = content[1:].lstrip()
            if not rest:
                self.i += 1
                items.append(self._nested(indent))
            elif self._split_key(rest) is not None:
                # "- key: value": a mapping whose keys line up after the dash
                self.lines[self.i] = (indent + len(content) - len(rest), rest, n)
                items.append(self._mapping(self.lines[self.i][0]))
            else:
                self.i += 1
                items.append(self._scalar(rest, n))
        return items

    def _mapping(self, indent: int) -> dict:
        out: dict = {}
        while self.i < len(self.lines):
            ind, content, n = self.lines[self.i]
            if ind < indent:
                break
            if ind > indent:
                raise ValueError(f"line {n}: unexpected indentation")
            kv = self._split_key(content)
            if kv is None:
                if content == "-" or content.startswith("- "):
                    break
                raise ValueError(f"line {n}: expected KEY: VALUE, got {content!r}")
            key, value = kv
            if key in out:
                raise ValueError(f"line {n}: duplicate key {key!r}")
            self.i += 1
            if value:
                out[key] = self._scalar(value, n)
            elif self.i < len(self.lines) and self.lines[self.i][0] == indent and (
                    self.lines[self.i][1] == "-" or self.lines[self.i][1].startswith("- ")):
                out[key] = self._sequence(indent)  # "key:" then "- item" at the key's indentation
            else:
                out[key] = self._nested(indent)
        return out

    def _nested(self, indent: int):
        if self.i < len(self.lines) and self.lines[self.i][0] > indent:
            return self._block(self.lines[self.i][0])
        return None

    def _split_key(self, content: str) -> tuple[str, str] | None:
        if content[0] in "'\"":
            end = content.find(content[0], 1)
            if end < 0 or not content[end + 1:].startswith(":"):
                return None
            key, rest = content[1:end], content[end + 2:]
            if rest and not rest.startswith(" "):
                return None
            return key, rest.strip()
        m = re.match(r"([^\s:#][^:]*?):(?:\s+(.*))?$", content)
        if m is None or content.startswith(("- ", "[", "{")):
            return None
        return m.group(1), (m.group(2) or "").strip()

    def _scalar(self, text: str, n: int):
        if text[0] == '"':
            if len(text) < 2 or not text.endswith('"'):
                raise ValueError(f"line {n}: unterminated string")
            return json.loads(text)
        if text[0] == "'":
            if len(text) < 2 or not text.endswith("'"):
                raise ValueError(f"line {n}: unterminated string")
            return text[1:-1].replace("''", "'")
        if text == "{}":
            return {}
        if text == "[]":
            return []
        if text[0] in "&*!|>[{@`%":
            raise ValueError(f"line {n}: unsupported YAML: {text!r}")
        low = text.lower()
        if low in self.BOOLS:
            return self.BOOLS[low]
        if low in ("null", "~"):
            return None
        if self.NUMBER.fullmatch(text):
            return float(text) if any(c in text for c in ".eE") else int(text)
        return text


def test_mini_yaml_reads_the_subset():
    text = """
# comment
a: 1
b: "9192"   # trailing comment
c:
  - x
  - k: v
    l:
      - 2
  -
    m: 'it''s'
d:
- e
f: {}
g: host:9092
h: true
i: 3.9-IV0
---
kind: Two
"""
    assert MiniYaml(text).documents() == [
        {"a": 1, "b": "9192", "c": ["x", {"k": "v", "l": [2]}, {"m": "it's"}], "d": ["e"], "f": {},
         "g": "host:9092", "h": True, "i": "3.9-IV0"},
        {"kind": "Two"},
    ]
    for bad in ("a: 1\n  b: 2\n", "a: &x 1\n", "a: [1, 2]\n", "a: 1\na: 2\n", "a: |\n  x\n"):
        with pytest.raises(ValueError):
            MiniYaml(bad).documents()


# -- Kubernetes -----------------------------------------------------------------------------------

def manifests() -> list[tuple[str, dict]]:
    out = []
    for path in sorted(K8S.glob("*.yaml")):
        for doc in load_yaml_documents(path.read_text()):
            if doc is not None:
                out.append((path.name, doc))
    return out


def by_kind() -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for _, doc in manifests():
        out.setdefault(doc["kind"], []).append(doc)
    return out


def test_manifests_are_yaml_documents_of_the_expected_kinds():
    docs = manifests()
    for name, doc in docs:
        assert isinstance(doc, dict), name
        assert doc.get("apiVersion") and doc.get("kind") and doc["metadata"].get("name"), name
    kinds = Counter(doc["kind"] for _, doc in docs)
    assert kinds["StatefulSet"] == 1
    assert kinds["Service"] == 2
    assert kinds["PodDisruptionBudget"] == 1
    assert kinds["ConfigMap"] == 1


def test_manifests_fit_together():
    k = by_kind()
    (sts,), (cm,), (pdb,) = k["StatefulSet"], k["ConfigMap"], k["PodDisruptionBudget"]
    data = cm["data"]
    assert all(isinstance(v, str) for v in data.values()), "ConfigMap values must be strings"
    assert data["KSHARE_LISTEN_HOST"] == "0.0.0.0"
    assert data["KSHARE_STATE_TOPIC"]
    spec = sts["spec"]
    pod_labels = spec["template"]["metadata"]["labels"]

    def selects(selector: dict) -> bool:
        return bool(selector) and all(pod_labels.get(key) == v for key, v in selector.items())

    assert spec["replicas"] == 3  # one instance group: test_three_proxies_form_one_instance_group
    assert selects(spec["selector"]["matchLabels"])
    assert selects(pdb["spec"]["selector"]["matchLabels"]) and pdb["spec"]["maxUnavailable"] == 1
    headless = [s for s in k["Service"] if s["spec"].get("clusterIP") == "None"]
    regular = [s for s in k["Service"] if s["spec"].get("clusterIP") != "None"]
    assert len(headless) == 1 and len(regular) == 1
    assert spec["serviceName"] == headless[0]["metadata"]["name"]
    for svc in k["Service"]:
        assert selects(svc["spec"]["selector"])
    # peers and clients must resolve a proxy that is restarting or joining the group
    assert headless[0]["spec"]["publishNotReadyAddresses"] is True
    # bootstrap connections spread over the ready proxies, none pinned to one
    assert regular[0]["spec"].get("sessionAffinity", "None") == "None"
    assert not regular[0]["spec"].get("publishNotReadyAddresses", False)
    assert [p["port"] for p in regular[0]["spec"]["ports"]] == [int(data["KSHARE_PORT"])]

    pod = spec["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] >= 40  # a clean stop can take about 35 s
    (term,) = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname" and selects(term["labelSelector"]["matchLabels"])
    (c,) = pod["containers"]
    assert [e["configMapRef"]["name"] for e in c["envFrom"]] == [cm["metadata"]["name"]]
    env = {e["name"]: e for e in c["env"]}
    names = [e["name"] for e in c["env"]]
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    advertised = env["KSHARE_ADVERTISED_HOST"]["value"]
    assert advertised.startswith(f"$(POD_NAME).{headless[0]['metadata']['name']}.")
    for ref in re.findall(r"\$\((\w+)\)", advertised):  # $(VAR) expands only variables defined earlier
        assert names.index(ref) < names.index("KSHARE_ADVERTISED_HOST")

    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["bootstrap"] == int(data["KSHARE_PORT"])
    base = int(data["KSHARE_BROKER_PORT_BASE"])
    brokers = {name: port for name, port in ports.items() if name.startswith("broker-")}
    assert brokers and all(port == base + int(name.split("-")[1]) for name, port in brokers.items())
    service_ports = {p["name"]: (p["port"], p["targetPort"]) for p in headless[0]["spec"]["ports"]}
    for name, port in ports.items():
        assert service_ports[name] == (port, name)


# A clean stop: queued state writes get at most 5 s, then the proxy leaves the instance group (the
# hand-over), then closing the state store is bounded by its 30 s write timeout (docs/guide/deploy.md,
# Stopping). The grace period must cover all of it, so that SIGKILL never turns a rolling restart
# into a crash (a take-over only after the session timeout).
CLEAN_STOP_S = 5 + 30


def test_three_proxies_form_one_instance_group():
    k = by_kind()
    (sts,), (cm,), (pdb,) = k["StatefulSet"], k["ConfigMap"], k["PodDisruptionBudget"]
    spec, data = sts["spec"], cm["data"]
    assert spec["replicas"] == 3
    _, proxy_envvars = command_params("proxy")
    assert {"KSHARE_INSTANCE_GROUP", "KSHARE_INSTANCE_SESSION_TIMEOUT_MS"} <= proxy_envvars
    # the same group for every pod: from the shared ConfigMap, not overridden per container
    assert re.fullmatch(r"[A-Za-z0-9._-]+", data.get("KSHARE_INSTANCE_GROUP", "")), data
    (c,) = spec["template"]["spec"]["containers"]
    assert not {"KSHARE_INSTANCE_GROUP", "KSHARE_STATE_TOPIC", "KSHARE_UPSTREAM"} & {e["name"] for e in c["env"]}
    assert not any(str(a).startswith(("--instance-group", "--state-topic", "--upstream")) for a in c.get("args") or [])
    session_ms = int(data.get("KSHARE_INSTANCE_SESSION_TIMEOUT_MS", "10000"))
    assert 6000 <= session_ms <= 1_800_000  # the brokers' default group.{min,max}.session.timeout.ms

    # voluntary disruptions: at most one proxy down, and never a budget that blocks every drain
    pdb_spec = pdb["spec"]
    assert pdb_spec.get("maxUnavailable") == 1 and "minAvailable" not in pdb_spec
    # rolling updates: one pod at a time, the next only after the replacement stayed ready
    strategy = spec["updateStrategy"]
    assert strategy["type"] == "RollingUpdate"
    assert (strategy.get("rollingUpdate") or {}).get("maxUnavailable", 1) == 1
    assert spec.get("minReadySeconds", 0) >= 5

    # SIGTERM hands over at once, after the in-flight state writes; SIGKILL must not come first
    grace = spec["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > CLEAN_STOP_S
    assert grace >= 30


def test_systemd_env_shows_an_instance_group():
    """kshare.env ships one host, with the group settings to uncomment for several."""
    text = (DEPLOY / "systemd" / "kshare.env").read_text()
    commented = re.findall(r"^#\s*(KSHARE_INSTANCE_[A-Z_]+)=(\S+)$", text, re.MULTILINE)
    assert {k for k, _ in commented} == {"KSHARE_INSTANCE_GROUP", "KSHARE_INSTANCE_SESSION_TIMEOUT_MS"}
    assert {k for k, _ in commented} <= command_params("proxy")[1]
    (cm,) = by_kind()["ConfigMap"]
    assert dict(commented)["KSHARE_INSTANCE_SESSION_TIMEOUT_MS"] == cm["data"]["KSHARE_INSTANCE_SESSION_TIMEOUT_MS"]
    assert (DEPLOY / "systemd" / "kshare.service").read_text().count("KSHARE_INSTANCE_GROUP") >= 1


def test_probes_point_at_the_metrics_port():
    k = by_kind()
    metrics_port = int(k["ConfigMap"][0]["data"]["KSHARE_METRICS_PORT"])
    (c,) = k["StatefulSet"][0]["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    for probe, path in (("readinessProbe", "/ready"), ("livenessProbe", "/live")):
        get = c[probe]["httpGet"]
        assert get["path"] == path
        assert ports.get(get["port"], get["port"]) == metrics_port, probe


def test_strimzi_example_matches_the_configured_upstream():
    docs = load_yaml_documents(STRIMZI_EXAMPLE.read_text())
    assert sorted(d["kind"] for d in docs) == ["Kafka", "KafkaNodePool"]
    (kafka,) = [d for d in docs if d["kind"] == "Kafka"]
    (plain,) = [lst for lst in kafka["spec"]["kafka"]["listeners"] if lst["tls"] is False]
    name, ns = kafka["metadata"]["name"], kafka["metadata"]["namespace"]
    upstream = by_kind()["ConfigMap"][0]["data"]["KSHARE_UPSTREAM"]
    assert upstream == f"{name}-kafka-bootstrap.{ns}.svc:{plain['port']}"
    assert "EXAMPLE" in STRIMZI_EXAMPLE.read_text().splitlines()[0]
