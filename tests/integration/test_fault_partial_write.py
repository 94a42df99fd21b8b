"""Writes of windows that fail after window_sketches took their rows (a view's target
rejects them, injected in the engine), in a live worker: retried through the failures, or
the worker killed right after one; either way every rollup ends equal to its source and
every request is counted once."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from pipeline.adapters.store import open_store
from pipeline.contract.events import Event
from pipeline.settings import Settings
from tests.integration.faults import (
    assert_exactly_once,
    lifecycle_events,
    produce_batches,
    store_fault_settings,
    wait_for,
)
from tests.integration.harness import (
    WorkerProcess,
    run_until_caught_up,
)
from tools.dev.fault_checks import rollup_drift

pytestmark = [pytest.mark.integration, pytest.mark.long(90)]

_REPAIRED = re.compile(r"rollups checked at start-up: buckets repaired: ([^\n]*)")


def _assert_no_drift(settings: object) -> None:
    store = open_store(settings)  # type: ignore[arg-type]
    try:
        assert rollup_drift(store) == {}
    finally:
        store.close()


def _failing_writes(
    kafka: Any, tmp_path: Path, fails: str, *, seed: int
) -> tuple[Settings, Path, list[Event], WorkerProcess]:
    """A worker started on 3,000 requests' events, its store's writes of windows failing
    as the flag file's lines ``fails`` say: its settings, the flag file, the events."""
    s, flag = store_fault_settings(kafka.bootstrap_servers, tmp_path, "partial")
    flag.write_text(fails)
    events = lifecycle_events(3_000, seed=seed, prefix=f"s{seed}-")
    produce_batches(s, events)
    return s, flag, events, WorkerProcess(s, tmp_path / "worker.log")


def test_a_worker_killed_between_the_base_table_and_a_view(kafka, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """SIGKILLed right after its first write of windows landed in window_sketches and failed
    in latency_1h: the next worker resumes past those windows (their close horizon is read
    from window_sketches) and never writes them again; its start-up check sets the rollups
    right. Before the check they stayed short for good."""
    s, flag, events, worker = _failing_writes(kafka, tmp_path, "latency_1h\nkill\n", seed=31)
    try:
        worker.proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        worker.stop()
        raise AssertionError(f"the worker was not killed:\n{worker.log_tail()}") from None
    worker.stop()
    assert worker.proc.returncode == -9, worker.log_tail()
    assert "injected partial write into window_sketches" in worker.log_tail(20_000)
    flag.unlink()

    log_text = run_until_caught_up(s, tmp_path / "next.log")
    _assert_no_drift(s)
    assert_exactly_once(s, {ev.request_id for ev in events})
    m = _REPAIRED.search(log_text)
    assert m is not None, log_text[-4000:]
    assert "latency_1h" in m.group(1), m.group(1)


def test_a_worker_retrying_partial_writes(kafka, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Writes of windows fail in latency_1m and slo_1h (after window_sketches and
    slo_windows took their rows) until the flag goes, then work again: each is retried
    with its token until it lands, the rollups of its hours compared after, and nothing is
    counted twice or missed."""
    s, flag, events, worker = _failing_writes(kafka, tmp_path, "latency_1m\nslo_1h\n", seed=33)
    try:
        wait_for(
            lambda: "ClickHouse write of" in worker.log_tail(200_000), "a failed window write", 60
        )
        flag.unlink()
        worker.wait_caught_up(timeout_s=90)
    finally:
        assert worker.stop() == 0, worker.log_tail()
    log_text = worker.log_path.read_text(errors="replace")
    assert re.search(r"write of \d+ windows failed \d+ times before it landed", log_text), log_text[
        -4000:
    ]
    assert_exactly_once(s, {ev.request_id for ev in events})
    _assert_no_drift(s)
