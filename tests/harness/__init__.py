"""The tests' harness: what the test modules share (no test module imports another).

The bench's own launcher and clients live in the package (:mod:`kshare.bench.procs`,
:mod:`kshare.bench.clients`, :mod:`kshare.bench.brokers`); this package adds the test-only parts:

``brokers``        the brokers of :mod:`kshare.bench.brokers` plus ``SecureKafkaBroker`` (SASL/TLS
                   listeners, users, ACLs) and ``TansuBroker``; ``python -m tests.harness.brokers fetch``
``tls``            throwaway CA and certificates for the secure brokers and the proxy's TLS
``proxies``        the real proxy in a thread (``ProxyThread``) or as ``kshare proxy`` child processes
                   (``ProxyProcess``; ``KShareProcess``: fixed ports, killed and started again)
``share``          share-group helpers: the proxy with share groups in a thread, raw ShareFetch /
                   ShareAcknowledge clients, confluent share consumers, the Java share consumer driver
``clients``        the client libraries the pass-through tests drive (confluent-kafka, kafka-python, ...)
``ledgers``        consumers that record every delivery and confirmation, and the checks on them
``drain``          a share group draining a topic (members joining while it runs)
``cluster``        multi-node Apache Kafka clusters
``spark_cluster``  one Spark cluster for the test session
"""
