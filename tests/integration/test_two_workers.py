"""Two workers share the partitions of one consumer group; one is killed, the other takes over."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from pipeline.adapters.kafka_admin import group_progress
from pipeline.adapters.store import open_store
from pipeline.app.demo import kafka_sink
from pipeline.cli import DEFAULT_TRACE
from producers.simulator.model import SimConfig, Simulator
from producers.simulator.trace import read_trace
from tests.ceilings import ceiling
from tests.integration.harness import WorkerProcess, make_settings
from tests.measurement_fixtures import START_NS

pytestmark = [pytest.mark.integration, pytest.mark.long(55)]
REQUESTS = 6000


def test_a_killed_workers_partitions_move_and_nothing_is_lost(kafka, tmp_path: Path) -> None:
    # One embedded store per process (chDB): each worker writes its own; rows are keyed by
    # request, so the union of both stores must hold every request exactly once.
    s1 = make_settings(kafka.bootstrap_servers, tmp_path / "w1", flush_interval_ms=100)
    s2 = s1.model_copy(update={"store_dir": tmp_path / "w2" / "store"})
    sim = Simulator(
        read_trace(DEFAULT_TRACE)[:REQUESTS],
        SimConfig(start_unix_ns=START_NS, seed=4, patience_median_ms=None),
    )
    a = WorkerProcess(s1, tmp_path / "a.log")
    b = WorkerProcess(s2, tmp_path / "b.log")
    try:
        sink = kafka_sink(s1)
        for ev in sim.events():
            if ev.kind != "engine.stats":
                sink.emit(ev)
        sink.flush()
        deadline = time.monotonic() + ceiling(60)
        while time.monotonic() < deadline:  # both hold partitions once both logged a horizon
            if "resuming at offset" in a.log_tail(100_000) and "resuming at offset" in b.log_tail(
                100_000
            ):
                break
            time.sleep(0.2)
        assert "resuming at offset" in b.log_tail(100_000), "the second worker got no partition"
        a.stop(sig=signal.SIGKILL)
        b.wait_caught_up(timeout_s=120)
        assert group_progress(s1, s1.lifecycle_topic).lag == 0
    finally:
        a.stop()
        b.stop()
    ids: dict[str, int] = {}
    for st in (s1, s2):
        store = open_store(st)
        try:
            for (rid,) in store.query_rows(f"SELECT request_id FROM {st.database}.requests FINAL"):
                ids[rid] = ids.get(rid, 0) + 1
        finally:
            store.close()
    assert len(ids) == REQUESTS, "a request was lost"
