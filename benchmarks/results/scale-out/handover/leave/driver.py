"""One-off: the scale_out hand-over part's runs, against a fresh Kafka 3.9 broker (issue 42 figures)."""
import json, os, sys, time
from dataclasses import asdict
sys.path.insert(0, "/work/main")
from tests.harness.brokers import KAFKA3_VERSION, KafkaBroker
from kshare.bench.scenarios.instance_group import Upstream
from kshare.bench.scenarios.scale_out_handover import handover_run

configs = [tuple(c.split(":")) for c in sys.argv[2:]] or [("sigterm-rolling-restart", "topic", "10")]
repeats = int(sys.argv[1])
b = KafkaBroker(KAFKA3_VERSION)
b.start()
out = []
try:
    k3 = Upstream(b.bootstrap, b.node_id, getattr(b, "pid", None), [])
    common = dict(records=40_000, rate=1000.0, partitions=12, consumers=4, session_ms=6000, state_partitions=10, work_ms=2.0)
    for i in range(repeats):
        for kind, mode, drain in configs:
            t0 = time.time()
            r = asdict(handover_run(k3, kind, mode, float(drain), **common))
            r["at"] = time.strftime("%H:%M:%S", time.gmtime(t0))
            out.append(r)
            print(json.dumps({k: r[k] for k in ("at", "kind", "leadership", "drain_timeout_s", "redelivered", "after_confirmation", "lost", "longest_partition_gap_s", "longest_total_gap_s", "load_before", "load_after")}), flush=True)
finally:
    b.close()
    json.dump(out, open(os.environ.get("HO_OUT", "/tmp/ho_out.json"), "w"))
