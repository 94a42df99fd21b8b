"""A real single-node Apache Kafka (KRaft) broker on 127.0.0.1, for ``tailguard demo``
(and the tests, the benchmarks and ``./tg``, through ``tools/dev/kafka_local.py``).

Kafka's jars are fetched once from Maven Central with ``mvn`` into a cache folder
(:func:`default_cache_dir`: ``<checkout>/.cache/kafka``, or ``~/.cache/tailguard/kafka``
for an installed package, or ``$TAILGUARD_KAFKA_CACHE``); the broker runs from them with
``java`` (17+). Nothing else is needed on the machine: no Kafka distribution, no Docker,
no internet besides Maven. Not for production: one node, no replication, no security.

Library use::

    with LocalKafka(run_dir) as kafka:          # port=0 picks a free port
        use(kafka.bootstrap_servers)            # "127.0.0.1:<port>"
        kafka.restart()                         # same port, same data

* :mod:`.fetch`: the jars and ``java``
* :mod:`.config`: the files the broker runs from (``server.properties``, ``log4j2.xml``,
  the formatted KRaft storage)
* :mod:`.broker`: :class:`LocalKafka`, started, waited on, stopped by PID
"""

from __future__ import annotations

from pipeline.adapters.local_kafka.broker import (
    DEFAULT_HEAP,
    DEFAULT_READY_TIMEOUT_S,
    DEFAULT_STOP_TIMEOUT_S,
    LocalKafka,
    free_port,
    start_kafka,
    stop_kafka,
)
from pipeline.adapters.local_kafka.config import HOST
from pipeline.adapters.local_kafka.fetch import (
    KAFKA_VERSION,
    KafkaLocalError,
    default_cache_dir,
    ensure_kafka_jars,
)

__all__ = [
    "DEFAULT_HEAP",
    "DEFAULT_READY_TIMEOUT_S",
    "DEFAULT_STOP_TIMEOUT_S",
    "HOST",
    "KAFKA_VERSION",
    "KafkaLocalError",
    "LocalKafka",
    "default_cache_dir",
    "ensure_kafka_jars",
    "free_port",
    "start_kafka",
    "stop_kafka",
]
