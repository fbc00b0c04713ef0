"""The ``embedded`` scenario of ``kshare bench``: kshare on its embedded broker (no ``--upstream``): latency over time beside native Kafka 4.4,
and the time from the start of ``kshare proxy`` to ready, the first time (jars fetched) and later."""

from __future__ import annotations

import contextlib
import re
import shlex
import shutil
import threading
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..format import COLORS, fmt_num, line_axis, log_label, table
from ..procs import ProxyProcess
from .common import KAFKA4, median, scenario, target
from .latency import latency_cells, timed_run

if TYPE_CHECKING:
    from ..runner import Env, Progress

EMBEDDED_WINDOW_P50_MS = 3.0  # kshare on its embedded broker: every 10 s window's median
EMBEDDED_P99_MS = 25.0  # kshare on its embedded broker: p99 over the run

# 10 minutes measured after a warm-up, at a laptop's rate, for each of kshare and native 4.4 (a full run
# about 25 minutes: the two runs, the jars' download and four proxy starts)
SIZES = (
    {"rate": 1000.0, "seconds": 600.0, "warmup_s": 30.0, "linger_ms": 0},
    {"rate": 1000.0, "seconds": 60.0, "warmup_s": 10.0, "linger_ms": 0},
)


def _files_bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


def _embedded_proxy(env: Env, cache: Path, data: Path, timeout: float) -> tuple[ProxyProcess, dict[str, Any]]:
    """``kshare proxy --embedded kafka --data-dir DATA`` (no ``--upstream``) with ``KSHARE_CACHE=CACHE``,
    started; with the seconds from the start of the process to the first 200 of ``/ready`` on its
    metrics port (polled every 20 ms) and what its log says of the broker it started."""
    proxy = ProxyProcess(
        None,
        ["--embedded", "kafka", "--data-dir", str(data), *env.proxy_args],
        name="kshare-embedded",
        log_path=env.options.out / "kshare-embedded.log",
        env={"KSHARE_CACHE": str(cache)},
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: no HTTP proxy
    url = f"http://127.0.0.1:{proxy.metrics_port}/ready"
    ready_at: list[float] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            with contextlib.suppress(OSError):  # refused (not listening yet) or 503 (an HTTPError)
                with opener.open(url, timeout=5) as answer:
                    if answer.status == 200:
                        ready_at.append(time.monotonic())
                        return
            done.wait(0.02)

    poller = threading.Thread(target=poll, name="ready-poll", daemon=True)
    t0 = time.monotonic()
    poller.start()
    try:
        proxy.start(timeout)  # returns at the log line "share state loaded"
        logged = time.monotonic() - t0
        poller.join(60)
    except BaseException:
        proxy.stop()
        raise
    finally:
        done.set()
    if not ready_at:
        proxy.stop()
        raise RuntimeError(f"/ready of the embedded kshare proxy did not answer 200 within 60 s of its log "
                           f"saying the share state is loaded:\n{''.join(proxy.output[-30:])}")
    text = "".join(proxy.output)
    started = re.search(r"started the embedded (.+?) at (\S+) in ([\d.]+) s", text)
    fetched = re.search(r"fetching Apache Kafka \S+ for the embedded broker: (\d+) jars, (\d+) MB", text)
    return proxy, {
        "ready_s": ready_at[0] - t0,
        "logged_ready_s": logged,
        "broker": started[1] if started else None,
        "broker_bootstrap": started[2] if started else None,
        "broker_start_s": float(started[3]) if started else float("nan"),
        "fetched_jars": int(fetched[1]) if fetched else 0,
        "fetched_mb": float(fetched[2]) if fetched else 0.0,
    }


def run(env: Env, progress: Progress, *, rate: float, seconds: float, warmup_s: float,
        window_s: float = 10.0, restarts: int = 3, size: int = 100, linger_ms: int = 5,
        start_timeout: float = 900.0) -> dict[str, Any]:
    """``kshare proxy`` with no ``--upstream`` (``--embedded kafka``, a fresh ``--data-dir`` and an empty
    ``KSHARE_CACHE`` in the results folder): its time to ready, the first time (the jars fetched) and
    after ``restarts`` restarts; then end-to-end latency at ``rate`` for ``warmup_s + seconds``
    through it (the last restart's proxy), and the same on native Kafka 4.4 share groups, one after
    the other; every ``window_s`` of the measured ``seconds`` gets its p50 and p99."""
    # absolute: the embedded broker runs in its data dir, where a relative --data-dir would not be found
    root = env.options.out.resolve() / "embedded"
    cache, data = root / "cache", root / "data"
    for d in (cache, data):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    progress.begin("embedded", 1 + restarts + 2)
    starts: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []
    notes: list[str] = []
    proxy: ProxyProcess | None = None
    command = ""
    total_s = warmup_s + seconds

    def done(s: dict[str, Any]) -> None:
        samples.append(s)
        progress.step(
            f"{s['system']}: p50 {s['p50_ms']:.2f} p99 {s['p99_ms']:.2f} ms, window p50 up to "
            f"{max((w['p50_ms'] for w in s['windows'] if not w['warmup']), default=float('nan')):.2f} ms, "
            f"{s['received']:,}/{s['sent']:,} received"
        )

    try:
        for i in range(1 + restarts):
            if proxy is not None:
                proxy.stop()
                notes += proxy.notes()
                proxy = None
            proxy, st = _embedded_proxy(env, cache, data, start_timeout)
            if i == 0:
                command = "KSHARE_CACHE=" + shlex.join([str(cache), "kshare", *proxy.cmd[3:]])
                st["cache_mb"] = round(_files_bytes(cache) / 1e6, 1)
            st["run"] = "first (empty cache, empty data dir)" if i == 0 else f"restart {i}"
            starts.append(st)
            progress.step(
                f"{st['run']}: ready in {st['ready_s']:.2f} s (embedded broker up in {st['broker_start_s']:.1f} s"
                + (f", {st['fetched_jars']} jars, {st['fetched_mb']:.0f} MB fetched)" if st["fetched_jars"] else ")")
            )
        assert proxy is not None
        env.started["kshare-embedded"] = (
            f"kshare proxy (no --upstream) at {proxy.bootstrap} on the embedded "
            f"{starts[-1]['broker']} at {starts[-1]['broker_bootstrap']} (data in {data}, pid {proxy.pid})"
        )
        # topics are made and deleted on the embedded broker itself, as the latency scenario does on 3.9
        admin = starts[-1]["broker_bootstrap"] or proxy.bootstrap
        done(timed_run("kshare", proxy.bootstrap, admin, rate, total_s, size, warmup_s, window_s, linger_ms))
        if not proxy.running:
            raise RuntimeError("the embedded kshare proxy exited:\n" + "".join(proxy.output[-30:]))
    finally:
        if proxy is not None:
            proxy.stop()
            notes += proxy.notes()
    k4 = env.kafka4()
    done(timed_run("native", k4, k4, rate, total_s, size, warmup_s, window_s, linger_ms))
    progress.end()
    rows = []
    for s in samples:
        measured = [w for w in s["windows"] if not w["warmup"]]
        rows.append(
            {
                "system": s["system"],
                **{k: s[k] for k in ("p50_ms", "p99_ms", "p999_ms", "max_ms", "sent", "received", "duplicates",
                                     "measured", "producer_lag_max_ms")},
                "window_p50_min_ms": min((w["p50_ms"] for w in measured), default=float("nan")),
                "window_p50_max_ms": max((w["p50_ms"] for w in measured), default=float("nan")),
                "window_p99_min_ms": min((w["p99_ms"] for w in measured), default=float("nan")),
                "window_p99_max_ms": max((w["p99_ms"] for w in measured), default=float("nan")),
                "windows": s["windows"],
            }
        )
    later = [st["ready_s"] for st in starts[1:]]
    kshare = rows[0]
    return {
        "config": {
            "rate": rate,
            "seconds": seconds,
            "warmup_s": warmup_s,
            "window_s": window_s,
            "value_size": size,
            "linger_ms": linger_ms,
            "restarts": restarts,
            "command": command,
        },
        "rows": rows,
        "starts": starts,
        "ready": {
            "first_s": starts[0]["ready_s"],
            "later_s": later,
            "later_median_s": median(later),
        },
        "samples": [{k: v for k, v in s.items() if k not in ("quantiles_ms", "tail_ms", "windows")} for s in samples],
        "proxy_log_notes": notes[-20:],
        "targets": [
            target(
                f"kshare on its embedded broker at {rate:,.0f} records/s: every {window_s:g} s window's "
                "median (the highest)",
                kshare["window_p50_max_ms"],
                EMBEDDED_WINDOW_P50_MS,
                "<=",
                "ms",
            ),
            target(
                f"kshare on its embedded broker at {rate:,.0f} records/s: p99 over {seconds:g} s",
                kshare["p99_ms"],
                EMBEDDED_P99_MS,
                "<=",
                "ms",
            ),
        ],
    }


# -- results.md and the plot ----------------------------------------------------------------------


def section(res: dict[str, Any]) -> list[str]:
    cfg = res.get("config", {})
    rate, window = cfg.get("rate", 0), cfg.get("window_s", 10)
    names = {"kshare": "kshare, embedded Apache Kafka 3.9", "native": "native Kafka 4.4 share groups"}
    out = [
        f"One producer at {fmt_num(rate)} records/s ({cfg.get('value_size', 100)} B, linger.ms "
        f"{cfg.get('linger_ms', 5)}, acks=all) and "
        f"one confluent-kafka `ShareConsumer`, each its own process, for {fmt_num(cfg.get('warmup_s'))} s of "
        f"warm-up (left out of every figure, for both) and {fmt_num(cfg.get('seconds'))} s measured, first "
        "through `kshare proxy` with no `--upstream` (its embedded broker, the last proxy started below), "
        "then directly on native Apache Kafka 4.4 share groups; latency = time `poll()` returned the record "
        f"- time it was handed to `produce()` (one clock). Windows: {window:g} s of send time each."
        + (
            " With linger.ms 0 each record goes out in a Produce request of its own, as a latency-minded "
            "producer sends it; librdkafka's default (5) would add up to 5 ms of waiting in the producer "
            "to both systems."
            if cfg.get("linger_ms") == 0
            else ""
        ),
        "",
    ]

    def spread(r: dict[str, Any], q: str) -> str:  # the lowest and highest window's p50 or p99
        return f"{fmt_num(r.get(f'window_{q}_min_ms'), 2)} - {fmt_num(r.get(f'window_{q}_max_ms'), 2)}"

    rows = [latency_cells(r, names, spread(r, "p50"), spread(r, "p99")) for r in res.get("rows", [])]
    out += table(
        ["system", "p50 ms", "p99 ms", "p99.9 ms", "max ms", f"{window:g} s medians ms", f"{window:g} s p99s ms",
         "received / sent", "duplicates"],
        rows,
    )
    out.append("")
    ready = res.get("ready", {})
    starts = res.get("starts", [])
    if starts:
        out += [
            f"Time to ready: from starting `{cfg.get('command', 'kshare proxy')}` to the first 200 of `/ready` on "
            "its metrics port; the first start with an empty `KSHARE_CACHE` (the jars fetched from Maven "
            "Central) and an empty `--data-dir`, then restarts with the same cache and data dir "
            f"(**first {fmt_num(ready.get('first_s'), 1)} s, later {fmt_num(ready.get('later_median_s'), 1)} s median**).",
            "",
        ]
        out += table(
            ["start", "ready s", "embedded broker up s", "fetched"],
            [
                [
                    st.get("run", "?"),
                    fmt_num(st.get("ready_s"), 2),
                    fmt_num(st.get("broker_start_s"), 1),
                    f"{st['fetched_jars']} jars, {fmt_num(st.get('fetched_mb'))} MB" if st.get("fetched_jars") else "-",
                ]
                for st in starts
            ],
            "lrrl",
        )
        out.append("")
    by = {r["system"]: {w["start_s"]: w for w in r.get("windows", []) if not w.get("warmup")} for r in res.get("rows", [])}
    systems = list(by)
    if systems:
        head = ["window (s after the warm-up)"]
        for name in systems:
            head += [f"{name} p50 ms", f"{name} p99 ms", f"{name} records"]
        lines = []
        for start in sorted({t for ws in by.values() for t in ws}):
            row = [f"{start:g}-{start + window:g}"]
            for name in systems:
                w = by[name].get(start)
                row += [fmt_num(w["p50_ms"], 2), fmt_num(w["p99_ms"], 2), fmt_num(w["received"])] if w else ["-"] * 3
            lines.append(row)
        out += table(head, lines) + [""]
    notes = res.get("proxy_log_notes")
    if notes:
        out += ["The embedded kshare proxy's log lines worth a look:", "", "```", *notes, "```", ""]
    return out


def plot(plt: Any, res: dict[str, Any]) -> Any:
    from matplotlib import ticker

    cfg = res.get("config", {})
    window = cfg.get("window_s", 10)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4), gridspec_kw={"width_ratios": [2, 2, 1]})
    for ax, key, title, limit, what in (
        (axes[0], "p50_ms", f"median of each {window:g} s", 3.0, "every window's median"),
        (axes[1], "p99_ms", f"p99 of each {window:g} s", 25.0, "the p99 over the run"),
    ):
        for r in res["rows"]:
            ws = r.get("windows") or []
            ax.plot([w["start_s"] + window / 2 for w in ws], [w[key] for w in ws], marker=".",
                    color=COLORS.get(r["system"]), label=r["system"])
        ax.axhline(limit, color="tab:red", ls=":", lw=1, label=f"kshare's target: {what} <= {limit:g} ms")
        ax.axvspan(-cfg.get("warmup_s", 0), 0, color="gray", alpha=0.15, label="warm-up (left out)")
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(log_label))
        ax.yaxis.set_minor_formatter(ticker.FuncFormatter(log_label))
        ax.tick_params(axis="y", which="minor", labelsize=7)
        line_axis(ax, "seconds of send time after the warm-up", "end-to-end latency (ms)",
                  f"{title} at {cfg.get('rate', 0):,.0f} records/s")
    starts = res.get("starts") or []
    axes[2].bar(range(len(starts)), [st.get("ready_s") or 0 for st in starts],
                color=["tab:orange"] + [COLORS["kshare"]] * (len(starts) - 1))
    axes[2].set_xticks(range(len(starts)))
    axes[2].set_xticklabels(["first\n(download)" if i == 0 else f"restart\n{i}" for i in range(len(starts))],
                            fontsize=8)
    axes[2].set_ylabel("seconds to /ready 200")
    axes[2].set_title("kshare proxy, no --upstream: time to ready", fontsize=9)
    axes[2].grid(True, axis="y", alpha=0.3)
    return fig


SCENARIO = scenario(
    __name__,
    'kshare on its embedded broker (no --upstream) vs native Kafka 4.4: latency over time, time to ready',
    needs=frozenset({KAFKA4}),
    opt_in=True,  # 25 minutes of its own
    repeats=False,
)
