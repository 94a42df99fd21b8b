"""The ``kafka`` session fixture: a real local broker (or an external cluster) for tests.

Import it into a conftest (``from tests.kafka_fixture import kafka``). By default it starts
:class:`tools.dev.kafka_local.LocalKafka` in a temporary directory (fetching the jars
into ``.cache/kafka`` on first use) and stops it when the session ends. With
``TAILGUARD_TEST_BOOTSTRAP=host:port`` it uses that cluster instead; tests that need
``restart()`` are then skipped.

Under pytest-xdist each worker process has its own session, so its own broker (free ports,
its own directory under the worker's temporary directory). A watchdog process outlives the
test process only to SIGKILL the broker when that process ends without stopping it
(SIGKILL, SIGTERM, a crash): no broker is left behind by an interrupted run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # not re-exported in its stubs
    AdminClient,
    NewTopic,
)

from tools.dev.kafka_local import LocalKafka, repo_root

ENV_EXTERNAL_BOOTSTRAP = "TAILGUARD_TEST_BOOTSTRAP"
# The tests' brokers JIT-compile with C1 only: C2's compiler threads are what a broker spends
# most of its first CPU seconds on, on a machine where four brokers share 2 cores with the
# tests. Measured here (load 17-20), start to ready: 16.7-20.8 s and 3.6-4.4 CPU s with the
# JVM's default, 10.2-13.1 s and 2.2-2.5 CPU s with C1 only; a restart 14.0-16.1 s against
# 8.7-10.5 s. A test broker moves megabytes, not gigabytes: C2's peak speed buys nothing.
# The demo and the benchmarks keep the JVM's default (tools/dev/kafka_local.py).
TEST_JVM_OPTS = ("-XX:TieredStopAtLevel=1",)


class KafkaUnderTest:
    """What the ``kafka`` fixture yields."""

    def __init__(self, bootstrap_servers: str, local: LocalKafka | None) -> None:
        self._bootstrap_servers = bootstrap_servers
        self.local = local  # None for an external cluster

    @property
    def bootstrap_servers(self) -> str:
        return self._bootstrap_servers

    @property
    def can_restart(self) -> bool:
        return self.local is not None

    def _require_local(self) -> LocalKafka:
        if self.local is None:
            pytest.skip(f"broker restart is unsupported with {ENV_EXTERNAL_BOOTSTRAP} set")
        return self.local

    def restart(self, *, hard: bool = False, while_down: Callable[[], None] | None = None) -> float:
        """Stop (SIGTERM; SIGKILL when ``hard``) and start again on the same port and data.

        ``while_down`` runs once the broker has stopped, before it starts again (a test
        makes its clients act during the outage there). Returns the seconds from the start
        of the restart until the broker serves requests. Skips the calling test when the
        cluster is external.
        """
        local = self._require_local()
        t0 = time.monotonic()
        if hard:
            local.kill()
        else:
            local.stop()
        if while_down is not None:
            while_down()
        local.start()
        return time.monotonic() - t0

    def __repr__(self) -> str:
        kind = "local" if self.local is not None else "external"
        return f"KafkaUnderTest({self.bootstrap_servers!r}, {kind})"


# Reads its stdin until EOF, which comes when the test process exits however it ends (the
# pipe's other end is the test process's alone), then kills the broker recorded in the run
# dir if it still runs (LocalKafka checks that the PID is a kafka.Kafka on that config).
_WATCHDOG = """
import sys
from tools.dev.kafka_local import LocalKafka
sys.stdin.buffer.read()
LocalKafka(sys.argv[1]).kill()
"""


def broker_watchdog(run_dir: Path) -> subprocess.Popen[bytes]:
    """Start the watchdog for the broker run from ``run_dir`` (see the module docstring).

    Its own session: a Ctrl-C at the terminal reaches the test process, not the watchdog.
    """
    return subprocess.Popen(
        [sys.executable, "-c", _WATCHDOG, str(run_dir)],
        cwd=repo_root(),
        stdin=subprocess.PIPE,
        start_new_session=True,
    )


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaUnderTest]:
    """A Kafka cluster for the whole test session (see the module docstring)."""
    external = os.environ.get(ENV_EXTERNAL_BOOTSTRAP, "").strip()
    if external:
        yield KafkaUnderTest(external, None)
        return
    broker = LocalKafka(tmp_path_factory.mktemp("kafka"), jvm_opts=TEST_JVM_OPTS)
    watchdog = broker_watchdog(broker.run_dir)
    try:
        broker.start()
        yield KafkaUnderTest(broker.bootstrap_servers, broker)
    finally:
        broker.stop()
        assert watchdog.stdin is not None
        watchdog.stdin.close()  # EOF: the broker is stopped, the watchdog finds none
        watchdog.wait(timeout=60)


def create_topic(
    bootstrap: str,
    name: str,
    partitions: int,
    *,
    replication_factor: int = 1,
    config: Mapping[str, str] | None = None,
    exist_ok: bool = False,
    timeout: float = 30.0,
) -> None:
    """Create ``name`` and wait until every partition has a leader (ready to produce)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = NewTopic(
        name,
        num_partitions=partitions,
        replication_factor=replication_factor,
        config=dict(config or {}),
    )
    futures = admin.create_topics([topic], operation_timeout=timeout, request_timeout=timeout)
    try:
        futures[name].result(timeout=timeout)
    except KafkaException as exc:
        if not (exist_ok and exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS):
            raise

    deadline = time.monotonic() + timeout
    while True:
        md = admin.list_topics(topic=name, timeout=max(0.5, deadline - time.monotonic()))
        meta = md.topics.get(name)
        if (
            meta is not None
            and meta.error is None
            and len(meta.partitions) == partitions
            and all(p.leader >= 0 for p in meta.partitions.values())
        ):
            return
        if time.monotonic() >= deadline:
            raise TimeoutError(f"topic {name!r} has no leaders after {timeout:.0f}s: {meta}")
        time.sleep(0.1)
