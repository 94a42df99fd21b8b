"""The ``kafka`` fixture: a real local broker (or an external cluster) for tests.

Import it into a conftest (``from tests.kafka_fixture import kafka``). By default it starts
:class:`tools.dev.kafka_local.LocalKafka` in a temporary directory (fetching the jars
into ``.cache/kafka`` on first use) and stops it when the session ends. With
``TAILGUARD_TEST_BOOTSTRAP=host:port`` it uses that cluster instead; tests that need
``restart()`` are then skipped.

Under pytest-xdist the controller process starts one broker for all its workers
(:class:`SharedBroker`, from the conftest's hooks): every test names its own topics and
consumer groups (a run id in each name), as it must on an external cluster. A module that
stops, restarts or kills its broker is marked ``private_broker`` and gets a broker of its own
for the module (its own directory, free ports). Without xdist (``-n 0``) one broker serves
the session and restarts happen on it, as before. A watchdog process outlives the process
that started a broker only to SIGKILL the broker when that process ends without stopping it
(SIGKILL, SIGTERM, a crash): no broker is left behind by an interrupted run.

Why shared: each xdist worker ran its own broker until issue 38 item 9; four idle brokers
beside the tests cost ~2 CPU s each to start and ~1.5-2 % of a core each while the suite
ran (measured here: 2.1 CPU s to ready, then 0.5-0.8 CPU s per 30 s idle), on 2 cores.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # not re-exported in its stubs
    AdminClient,
    NewTopic,
)

from tests.ceilings import ceiling
from tools.dev.kafka_local import LocalKafka, free_port, repo_root

ENV_EXTERNAL_BOOTSTRAP = "TAILGUARD_TEST_BOOTSTRAP"
# The xdist controller hands its workers the shared broker's directory under this key
SHARED_BROKER_KEY = "tailguard_shared_broker_dir"
PRIVATE_BROKER_MARK = (
    "private_broker: the module stops, restarts or kills its broker: under xdist it gets a "
    "broker of its own instead of the shared one"
)
SHARED_READY_TIMEOUT_S = 180.0  # the shared broker starts beside collection, on a busy machine
# The tests' brokers JIT-compile with C1 only: C2's compiler threads are what a broker spends
# most of its first CPU seconds on, on a machine where four brokers share 2 cores with the
# tests. Measured here (load 17-20), start to ready: 16.7-20.8 s and 3.6-4.4 CPU s with the
# JVM's default, 10.2-13.1 s and 2.2-2.5 CPU s with C1 only; a restart 14.0-16.1 s against
# 8.7-10.5 s. A test broker moves megabytes, not gigabytes: C2's peak speed buys nothing.
# The demo and the benchmarks keep the JVM's default (tools/dev/kafka_local.py).
TEST_JVM_OPTS = ("-XX:TieredStopAtLevel=1",)


class KafkaUnderTest:
    """What the ``kafka`` fixture yields."""

    def __init__(
        self, bootstrap_servers: str, local: LocalKafka | None, *, shared: bool = False
    ) -> None:
        self._bootstrap_servers = bootstrap_servers
        self._local = local  # None for an external cluster and for the shared broker
        self.shared = shared

    @property
    def bootstrap_servers(self) -> str:
        return self._bootstrap_servers

    @property
    def local(self) -> LocalKafka | None:
        """The broker to stop and start; None for an external cluster."""
        self._refuse_shared()
        return self._local

    @property
    def can_restart(self) -> bool:
        self._refuse_shared()
        return self._local is not None

    def _refuse_shared(self) -> None:
        # A failure, not a skip: a test that restarts the broker must not pass unnoticed.
        if self.shared:
            raise RuntimeError(
                "the broker is shared by the xdist workers: mark the module "
                "`pytest.mark.private_broker` to stop, restart or kill a broker of its own"
            )

    def _require_local(self) -> LocalKafka:
        local = self.local
        if local is None:
            pytest.skip(f"broker restart is unsupported with {ENV_EXTERNAL_BOOTSTRAP} set")
        return local

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
        kind = "shared" if self.shared else "external" if self._local is None else "local"
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


@contextmanager
def _own_broker(run_dir: Path) -> Iterator[KafkaUnderTest]:
    """A broker of this process's own, from ``run_dir``, for the ``with`` body."""
    broker = LocalKafka(run_dir, jvm_opts=TEST_JVM_OPTS)
    watchdog = broker_watchdog(broker.run_dir)
    try:
        broker.start()
        yield KafkaUnderTest(broker.bootstrap_servers, broker)
    finally:
        broker.stop()
        assert watchdog.stdin is not None
        watchdog.stdin.close()  # EOF: the broker is stopped, the watchdog finds none
        watchdog.wait(timeout=60)


class SharedBroker:
    """The xdist controller's broker for all its workers (see the module docstring).

    Started in a thread, so that the workers start and collect meanwhile; its port is
    chosen first, so the workers know the address at once. ``ready``/``failed`` files in
    its directory tell the workers when they may use it (:func:`await_shared_broker`).
    """

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="tailguard-test-kafka-"))
        self.broker = LocalKafka(self.dir / "kafka", port=free_port(), jvm_opts=TEST_JVM_OPTS)
        self._watchdog = broker_watchdog(self.broker.run_dir)
        self._thread = threading.Thread(target=self._start, name="shared-kafka", daemon=True)
        self._thread.start()

    def _start(self) -> None:
        try:
            self.broker.start()
        except BaseException as exc:
            (self.dir / "failed").write_text(f"{type(exc).__name__}: {exc}")
            raise
        (self.dir / "ready").write_text(self.broker.bootstrap_servers)

    def stop(self) -> None:
        self._thread.join()
        try:
            self.broker.stop()
        finally:
            assert self._watchdog.stdin is not None
            self._watchdog.stdin.close()
            self._watchdog.wait(timeout=60)
            shutil.rmtree(self.dir, ignore_errors=True)


def await_shared_broker(run_dir: Path, timeout_s: float = SHARED_READY_TIMEOUT_S) -> str:
    """The shared broker's address once it serves requests (an xdist worker's wait)."""
    deadline = time.monotonic() + ceiling(timeout_s)
    while True:
        if (run_dir / "ready").exists():
            return (run_dir / "ready").read_text()
        if (run_dir / "failed").exists():
            why = (run_dir / "failed").read_text()
            raise RuntimeError(f"the shared test broker failed to start: {why}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the shared test broker was not ready within {timeout_s:.0f}s")
        time.sleep(0.1)


@pytest.fixture(scope="session")
def _session_kafka(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KafkaUnderTest]:
    """The session's cluster: external, the xdist controller's shared broker, or (serially)
    a broker of the session's own."""
    external = os.environ.get(ENV_EXTERNAL_BOOTSTRAP, "").strip()
    if external:
        yield KafkaUnderTest(external, None)
        return
    shared = getattr(request.config, "workerinput", {}).get(SHARED_BROKER_KEY)
    if shared:
        yield KafkaUnderTest(await_shared_broker(Path(shared)), None, shared=True)
        return
    with _own_broker(tmp_path_factory.mktemp("kafka")) as own:
        yield own


@pytest.fixture(scope="module")
def kafka(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KafkaUnderTest]:
    """A Kafka cluster for the module (see the module docstring): the session's, or a broker
    of the module's own when the module is marked ``private_broker`` and the session's is
    shared."""
    external = os.environ.get(ENV_EXTERNAL_BOOTSTRAP, "").strip()
    shared = getattr(request.config, "workerinput", {}).get(SHARED_BROKER_KEY)
    if shared and not external and request.node.get_closest_marker("private_broker"):
        with _own_broker(tmp_path_factory.mktemp("kafka")) as own:
            yield own
        return
    yield request.getfixturevalue("_session_kafka")


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
