"""``kshare bench``: kshare against a bare relay, a direct client and native Kafka 4.4 share groups.

The command (:mod:`kshare.bench.runner`) starts what it needs -- Apache Kafka 3.9 as the fronted
cluster, Apache Kafka 4.4 with share groups as the reference, ``kshare proxy`` as its own process,
a bare byte relay (:mod:`kshare.bench.relay`) -- runs the scenarios of :mod:`kshare.bench.scenarios`
and writes ``results.json``, ``results.md`` and PNG plots (:mod:`kshare.bench.report`).
:mod:`kshare.bench.brokers` downloads and runs the brokers (the tests use it too).
"""
