"""A worker killed with SIGKILL mid-stream and restarted loses nothing and counts nothing twice."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from pipeline.adapters.kafka_admin import group_progress
from pipeline.adapters.store import open_store
from pipeline.cli import DEFAULT_TRACE
from pipeline.demo import kafka_sink
from producers.simulator.model import SimConfig, Simulator
from producers.simulator.trace import read_trace
from tests.integration.harness import WorkerProcess, make_settings
from tests.measurement_fixtures import START_NS

pytestmark = pytest.mark.integration

REQUESTS = 12_000


def test_sigkill_mid_stream_then_restart_is_exactly_once(kafka, tmp_path: Path) -> None:
    s = make_settings(
        kafka.bootstrap_servers, tmp_path, window_grace_ms=2000, flush_interval_ms=100
    )
    # No client aborts: every request joins, so no partial record can come out late.
    sim = Simulator(
        read_trace(DEFAULT_TRACE)[:REQUESTS],
        SimConfig(start_unix_ns=START_NS, seed=11, patience_median_ms=None),
    )
    sink = kafka_sink(s)
    events = 0
    for ev in sim.events():
        if ev.kind != "engine.stats":
            sink.emit(ev)
            events += 1
    sink.flush()
    assert sim.summary.requests == REQUESTS

    first = WorkerProcess(s, tmp_path / "worker-1.log")
    deadline = time.monotonic() + 120
    while True:  # kill once a real share of the input is committed
        assert first.alive(), first.log_tail()
        prog = group_progress(s, s.lifecycle_topic)
        if prog.committed >= 0.3 * prog.end:
            break
        assert time.monotonic() < deadline, f"no progress: {prog}"
        time.sleep(0.05)
    first.stop(sig=signal.SIGKILL)
    assert group_progress(s, s.lifecycle_topic).lag > 0, "killed too late to test anything"

    second = WorkerProcess(s, tmp_path / "worker-2.log")
    try:
        second.wait_caught_up(timeout_s=180)
    finally:
        second.stop()
    assert "window horizon" in second.log_tail(200_000)

    store = open_store(s)
    try:
        db = s.database
        n, uniq = store.query_rows(
            f"SELECT count(), uniqExact(request_id) FROM {db}.requests FINAL"
        )[0]
        assert (n, uniq) == (REQUESTS, REQUESTS)
        # Window totals: every request in exactly one emitted window...
        total, windows, distinct = store.query_rows(
            "SELECT sum(records), count(), uniqExact(partition, window_start) "
            f"FROM {db}.window_sketches WHERE boundary = '__slo__'"
        )[0]
        assert total == REQUESTS
        assert windows == distinct, "a window was written twice"
        # ...and the materialized views (fed per insert, never deduplicated later) agree.
        mv_total = store.query_rows(
            f"SELECT sum(records) FROM {db}.latency_1m "
            "WHERE model = '*' AND boundary = 'gateway_total_ms'"
        )[0][0]
        assert mv_total == REQUESTS
        slo_total = store.query_rows(
            f"SELECT sum(total) FROM {db}.slo_1m WHERE slo = 'tier1-gateway'"
        )[0][0]
        assert slo_total == REQUESTS
    finally:
        store.close()
