"""Options of the kshare Spark source and the commit marker's decisions (no Spark, no broker)."""

from __future__ import annotations

import pytest

from kshare.spark.commits import Marker
from kshare.spark.options import OptionError, parse

BASE = {"kafka.bootstrap.servers": "127.0.0.1:9192", "kafka.share.group.id": "g", "subscribe": "a, b"}


def test_defaults_and_passthrough():
    o = parse({**BASE, "kafka.client.id": "me", "maxRecordsPerTask": "7"}, default_parallelism=3)
    assert (o.topics, o.parallelism, o.max_records, o.max_wait_ms) == (("a", "b"), 3, 7, 1000)
    assert o.kafka_option("client.id") == "me"


@pytest.mark.parametrize("name", ["kafka.bootstrap.servers", "kafka.share.group.id", "subscribe"])
def test_missing_required_option(name):
    opts = dict(BASE)
    del opts[name]
    with pytest.raises(OptionError, match=f"^kshare source: option '{name}' is required"):
        parse(opts)


@pytest.mark.parametrize(("opts", "message"), [
    ({"parallelism": "x"}, "parallelism must be an integer"),
    ({"parallelism": "0"}, "parallelism must be at least 1"),
    ({"kafka.bootstrap.servers": "nohost"}, "not HOST:PORT"),
    ({"kafka.security.protocol": "SASL_SSL"}, "PLAIN needs sasl.username and sasl.password"),
    ({"kafka.security.protocol": "TLS"}, "security.protocol=TLS is not one of"),
])
def test_bad_options(opts, message):
    with pytest.raises(OptionError, match=message) as err:
        parse({**BASE, **opts})
    assert "\n" not in str(err.value)


def test_marker_decisions():
    m = Marker(run=10, base=4, committed=7)
    assert m.decides(10, 7) == "accept" and m.decides(10, 8) is None
    assert m.decides(9, 4) == "accept" and m.decides(9, 5) == "release"  # an earlier run's leftovers
    assert m.decides(11, 1) is None  # a newer run than the marker knows
