"""The ``balance`` scenario of ``kshare bench`` (run only when named): how evenly a share group's members
share the work, kshare (on Kafka 3.9) beside native Kafka 4.4 share groups, alternated, medians of the
repeats. The measure is the drain ratio (:mod:`kshare.bench.drain`): the ideal drain time over the actual
one, 1.0 when no member ever idles while work waits.

* Balance: for each ``mixes`` entry (members, partitions), the members (threads) join a group on a fresh
  topic, then members x ``per_member`` records are produced round-robin in producer batches of
  ``max_poll`` records (share fetches take whole batches); each record takes ``work_ms``. Once steady, and
  once with one member joining at 30 % and one leaving at 60 % of the ideal time.
* Fairness (``fairness_cases``, many consumers: issue 17): members, partitions, records and work per record,
  with the clients' default ``max.poll.records`` (500) and a small one (10) as the control; also how many
  consumers got records.

(Was ``benchmarks/bench_share.py``'s balance and fairness parts; its throughput and scaling parts are the
``share`` and ``scaling`` scenarios.)
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from .. import clients
from ..drain import DrainResult, drain
from ..format import fmt_num, fmt_ratio, table
from .common import KAFKA4, UPSTREAM, alternate, median, results, scenario

if TYPE_CHECKING:
    from ..runner import Env, Progress

SYSTEMS = ("kshare", "native")
SIZES = (
    {"mixes": [(3, 2), (5, 4), (7, 3), (16, 1), (4, 4), (2, 8)], "per_member": 1000, "work_ms": 5.0, "max_poll": 10,
     "fairness_cases": [(24, 1, 6000, 5.0), (64, 4, 25600, 5.0), (100, 2, 20000, 2.0)], "fairness_max_polls": [500, 10]},
    {"mixes": [(3, 2), (16, 1)], "per_member": 200, "work_ms": 5.0, "max_poll": 10,
     "fairness_cases": [(24, 1, 2400, 5.0)], "fairness_max_polls": [500, 10]},
)


def _drains(env: Env, progress: Progress, repeats: int, partitions: int, what: str,
            **drain_args: Any) -> dict[str, list[DrainResult]]:
    """``repeats`` drains on each system (a fresh topic and group each), the order alternated per round."""
    systems = {"kshare": (env.proxy().bootstrap, env.upstream()), "native": (env.kafka4(), env.kafka4())}
    got: dict[str, list[DrainResult]] = {s: [] for s in SYSTEMS}
    for r in range(repeats):
        for name in alternate(list(SYSTEMS), r):
            bootstrap, admin = systems[name]
            tag = uuid.uuid4().hex[:10]
            topic, group = f"bench-balance-{tag}", f"bench-balance-share-{tag}"
            clients.create_topic(admin, topic, partitions)
            try:
                clients.share_group(bootstrap, group)
                res = drain(bootstrap, admin, topic, group, partitions=partitions, **drain_args)
            finally:
                clients.delete_topic(admin, topic)
            got[name].append(res)
            progress.step(f"{what}, {name}: {res.ratio:.2f} of ideal")
    return got


def run(env: Env, progress: Progress, *, mixes: list[tuple[int, int]], per_member: int, work_ms: float,
        max_poll: int, fairness_cases: list[tuple[int, int, int, float]], fairness_max_polls: list[int],
        repeats: int) -> dict[str, Any]:
    progress.begin("balance", len(SYSTEMS) * repeats * (2 * len(mixes) + len(fairness_cases) * len(fairness_max_polls)))
    rows = []
    for churn in (False, True):
        for members, partitions in mixes:
            got = _drains(env, progress, repeats, partitions, f"{members} on {partitions}{', churn' if churn else ''}",
                          members=members, work_ms=work_ms, per_member=per_member, max_poll=max_poll,
                          joins=(0.3,) if churn else (), leaves=(0.6,) if churn else ())
            med = {s: median([x.ratio for x in got[s]]) for s in SYSTEMS}
            rows.append({"members": members, "partitions": partitions, "churn": churn, "kshare": med["kshare"],
                         "native": med["native"], "kshare_vs_native": med["kshare"] / med["native"]})
    fairness = []
    for members, partitions, records, case_work_ms in fairness_cases:
        for mpr in fairness_max_polls:
            got = _drains(env, progress, repeats, partitions, f"fairness {members} on {partitions}, max.poll {mpr}",
                          members=members, work_ms=case_work_ms, per_member=max(1, records // members), max_poll=mpr,
                          timeout=300)
            fairness.append({"members": members, "partitions": partitions, "records": records, "work_ms": case_work_ms,
                             "max_poll": mpr, **{s: median([x.ratio for x in got[s]]) for s in SYSTEMS},
                             **{f"{s}_busy": min(sum(1 for n in x.per_member if n) for x in got[s]) for s in SYSTEMS}})
    progress.end()
    return results(
        {"per_member": per_member, "work_ms": work_ms, "max_poll": max_poll, "repeats": repeats},
        rows,
        fairness=fairness,
    )


def section(res: dict[str, Any]) -> list[str]:
    cfg = res.get("config", {})
    out = [f"Drain ratio, ideal / actual (1.0: no member idles while work waits), median of {cfg.get('repeats')} "
           f"alternated repeat(s); {fmt_num(cfg.get('per_member'))} records per member, {cfg.get('work_ms')} ms of "
           f"work each, max.poll.records {cfg.get('max_poll')}. Churn: one member joins at 30 % and one leaves at "
           "60 % of the ideal time.", ""]
    out += table(
        ["members on partitions", "", "kshare (Kafka 3.9)", "native Kafka 4.4", "kshare / native"],
        [[f"{r['members']} on {r['partitions']}", "churn" if r["churn"] else "steady", fmt_ratio(r["kshare"]),
          fmt_ratio(r["native"]), fmt_ratio(r["kshare_vs_native"])] for r in res.get("rows", [])],
        "llrrr",
    )
    if res.get("fairness"):
        out += ["", "Fairness, many consumers (busy: consumers that got records, fewest of the runs):", ""]
        out += table(
            ["members on partitions, records, work", "max.poll.records", "native", "kshare"],
            [[f"{r['members']} on {r['partitions']}, {r['records']:,}, {r['work_ms']:g} ms", str(r["max_poll"]),
              f"{fmt_ratio(r['native'])} ({r['native_busy']}/{r['members']} busy)",
              f"{fmt_ratio(r['kshare'])} ({r['kshare_busy']}/{r['members']} busy)"] for r in res["fairness"]],
            "lrrr",
        )
    return out + [""]


SCENARIO = scenario(
    __name__, "Balance: the drain ratio of share groups' members, kshare vs native Kafka 4.4",
    needs=frozenset({UPSTREAM, KAFKA4}),
    opt_in=True,  # about 15 minutes with 100-consumer fairness cases
)
