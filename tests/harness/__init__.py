"""The tests' harness: what the test modules share (no test module imports another).

The launcher, clients and brokers the bench runs too live in the package (:mod:`kshare.bench.procs`:
``Child`` and ``ProxyProcess``; :mod:`kshare.bench.clients`; :mod:`kshare.bench.ledgers`;
:mod:`kshare.bench.brokers`; :mod:`kshare.bench.three_nodes`); this package adds the test-only parts:

``brokers``         the brokers of :mod:`kshare.bench.brokers` plus ``SecureKafkaBroker`` (SASL/TLS
                    listeners, users, ACLs) and ``TansuBroker``; ``python -m tests.harness.brokers fetch``
``tls``             a throwaway CA and certificates for the secure brokers and the proxy's TLS
``proxies``         the real proxy in a thread (``ProxyThread``) or as ``kshare proxy`` child processes
                    (``ProxyProcess``; ``KShareProcess``: killed and started again on the same ports)
``cli``             ``kshare`` as a user runs it from a shell (``run_kshare``, ``KshareProxy``)
``share``           share groups: the proxy with share groups in a thread (fixture ``kshare39``), producing,
                    confluent share consumers, raw ShareGroupHeartbeat/ShareFetch/ShareAcknowledge clients
``java``            Apache Kafka's Java KafkaShareConsumer (tests/java driver)
``state``           the state-topic tests: ``run`` (uvloop), ``update``, a replaying store (``replayed``)
``ledgers``         around the ledgers of :mod:`kshare.bench.ledgers`: producing, end offsets, SPSOs, crashes
``scale_out``       three proxies as one service (an instance group), for the scale-out tests
``security``        kshare in front of a secured broker, and what native Kafka answers without ACLs
``bad_input``       raw frames and connections, well-behaved traffic beside them, the proxy's log checks
``clients``         the client libraries the pass-through tests drive (confluent-kafka, kafka-python, ...)
``properties``      the hypothesis settings of the stateful property tests (``stateful_settings``)
``codec_messages``  random protocol messages drawn from the specs (hypothesis)
``drain``           a share group draining a topic (:mod:`kshare.bench.drain`)
``cluster``         multi-node Apache Kafka clusters
``spark_cluster``   one Spark cluster for the test session (fixture ``spark_cluster``)
"""
