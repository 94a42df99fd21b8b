"""A worker killed with SIGKILL after >= 200,000 events and restarted loses nothing and
counts nothing twice."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from pipeline.adapters.kafka_admin import group_progress
from tests.ceilings import ceiling
from tests.integration.faults import (
    assert_exactly_once,
    committed_offsets,
    group_consumer,
    lifecycle_events,
    produce_batches,
)
from tests.integration.harness import WorkerProcess, make_settings

pytestmark = [pytest.mark.integration, pytest.mark.long(90)]

REQUESTS = 100_000  # 300,000 lifecycle events
KILL_AFTER_EVENTS = 200_000


def test_sigkill_after_200k_events_then_restart_is_exactly_once(kafka, tmp_path: Path) -> None:
    # The default buffer flushes on the timer (test_crash_full_buffer.py: a small one,
    # flushed by the batch that fills it while the next batches are processed).
    sigkill_then_restart(kafka, tmp_path, flush_max_rows=20_000)


def sigkill_then_restart(kafka, tmp_path: Path, *, flush_max_rows: int) -> None:
    """SIGKILL a worker once >= 200,000 events are committed, restart it, and check that
    the store holds every request exactly once."""
    # Small processing batches (50 messages = 10,000 events), so that commits advance in
    # small steps and the kill lands mid-stream, with >= 200,000 events behind it.
    s = make_settings(
        kafka.bootstrap_servers,
        tmp_path,
        window_grace_ms=2000,
        flush_interval_ms=100,
        take_max_messages=50,
        flush_max_rows=flush_max_rows,
    )
    t0 = time.monotonic()
    events = lifecycle_events(REQUESTS, seed=11)
    pre = produce_batches(s, events)
    assert pre.events == 3 * REQUESTS
    t_loaded = time.monotonic()

    first = WorkerProcess(s, tmp_path / "worker-1.log")
    deadline = time.monotonic() + ceiling(240)
    group = group_consumer(s)  # one client for the whole loop, not one per question
    try:
        while True:  # kill once >= 200,000 events are committed (so at least as many processed)
            assert first.alive(), first.log_tail()
            committed = committed_offsets(s, group)
            done = sum(pre.events_below(p, 0, o) for p, o in committed.items())
            if done >= KILL_AFTER_EVENTS:
                break
            assert time.monotonic() < deadline, f"no progress: {done} events committed"
            time.sleep(0.05)
    finally:
        group.close()
    first.stop(sig=signal.SIGKILL)
    t_killed = time.monotonic()
    assert group_progress(s, s.lifecycle_topic).lag > 0, "killed too late to test anything"

    second = WorkerProcess(s, tmp_path / "worker-2.log")
    try:
        second.wait_caught_up(timeout_s=240)
    finally:
        second.stop()
    assert "resuming at offset" in second.log_tail(200_000)
    print(
        f"preload {t_loaded - t0:.1f}s ({pre.messages} messages, {pre.events} events); "
        f"killed after {done} committed events at {t_killed - t_loaded:.1f}s; "
        f"restart caught up in {time.monotonic() - t_killed:.1f}s"
    )
    assert_exactly_once(s, {ev.request_id for ev in events})
