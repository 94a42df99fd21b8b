"""Issue 12, item 7 on the real broker: SIGTERM stops the worker within seconds while busy,
idle and during a store outage, committing nothing it has not written. The states with the
broker down (waiting for it at start, stopped under a running worker) and item 8 (a worker
started before the broker waits with backoff, then works) are in test_fault_broker_down.py:
two modules, so that xdist can run them side by side."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from confluent_kafka import KafkaException

from pipeline.adapters.kafka_admin import group_progress
from pipeline.settings import Settings
from tests.integration.faults import (
    STOP_WITHIN_S,
    assert_exactly_once,
    committed_offsets,
    consecutive_events,
    log_has,
    produce_batches,
    sigterm_exit_s,
    store_fault_settings,
    wait_for,
)
from tests.integration.harness import WorkerProcess, running_caught_up

pytestmark = [pytest.mark.integration, pytest.mark.long(140)]


@contextmanager
def _stopped_by_sigterm(
    s: Settings, log_path: Path, took: dict[str, float], state: str
) -> Iterator[WorkerProcess]:
    """A worker for the ``with`` body, then SIGTERM; ``took[state]``: seconds to exit."""
    worker = WorkerProcess(s, log_path)
    try:
        yield worker
    finally:
        took[state] = sigterm_exit_s(worker)


def _committed(s: Settings) -> dict[int, int]:
    """Committed offsets; none while the group coordinator is still loading (fresh broker)."""
    try:
        return committed_offsets(s)
    except KafkaException:
        return {}


def test_sigterm_stops_the_worker_within_seconds_in_every_state(kafka, tmp_path: Path) -> None:
    s, flag = store_fault_settings(kafka.bootstrap_servers, tmp_path, "outage")
    a, b, c = consecutive_events(30_000, 5_000, 5_000, seed=81)
    produce_batches(s, a)
    took: dict[str, float] = {}

    # Busy: stopped while catching up on a backlog.
    with _stopped_by_sigterm(s, tmp_path / "busy.log", took, "busy") as w:
        wait_for(lambda: any(_committed(s).values()), "a first commit", 120, 0.05)
        lag_at_stop = group_progress(s, s.lifecycle_topic).lag
    assert w.proc.returncode == 0, w.log_tail()

    # Idle: caught up, nothing to do.
    with _stopped_by_sigterm(s, tmp_path / "idle.log", took, "idle") as w:
        w.wait_caught_up(timeout_s=180)
    assert w.proc.returncode == 0, w.log_tail()

    # Store outage: every write retried with backoff, the input paused.
    with _stopped_by_sigterm(s, tmp_path / "outage.log", took, "store outage") as w:
        w.wait_caught_up(timeout_s=60)
        produce_batches(s, b)
        w.wait_caught_up(timeout_s=60)
        flag.touch()
        produce_batches(s, c)
        wait_for(lambda: log_has(w, "lifecycle input paused"), "the pause", 30)
        committed = committed_offsets(s)
        # Into the retry loop's longer delays (0.2 + 0.4 + ... + 3.2 s).
        wait_for(lambda: log_has(w, "; retry 6 in "), "the 6th retry", 30)
    log_text = w.log_path.read_text(errors="replace")
    assert committed_offsets(s) == committed, "committed past what was written"
    assert "Traceback" not in log_text, log_text[-3000:]

    # The store back: a new worker writes everything, once.
    flag.unlink()
    with running_caught_up(s, tmp_path / "after.log", timeout_s=180):
        pass
    print(f"SIGTERM -> exit: {took} (lag at the busy stop: {lag_at_stop} messages)")
    assert all(t < STOP_WITHIN_S for t in took.values()), took
    assert_exactly_once(s, {ev.request_id for ev in a + b + c})
