"""Issue 12, items 7 and 8 on the real broker: SIGTERM stops the worker within seconds in
every state (busy, idle, store outage, waiting for the broker) committing nothing it has not
written, and a worker started before the broker waits for it with backoff, then works."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from confluent_kafka import KafkaException

from pipeline.adapters.kafka_admin import group_progress
from pipeline.settings import Settings
from tests.integration.faults import (
    after,
    assert_exactly_once,
    committed_offsets,
    lifecycle_events,
    produce_batches,
    wait_for,
)
from tests.integration.harness import WorkerProcess, make_settings, running_caught_up

pytestmark = [pytest.mark.integration, pytest.mark.long(350)]

STOP_WITHIN_S = 10.0


def _sigterm(worker: WorkerProcess) -> float:
    """SIGTERM; seconds until the process exited (killed and failed after 60 s)."""
    t0 = time.monotonic()
    worker.proc.send_signal(signal.SIGTERM)
    try:
        worker.proc.wait(60)
    except subprocess.TimeoutExpired:
        worker.stop(signal.SIGKILL)
        pytest.fail(f"SIGTERM ignored for 60 s:\n{worker.log_tail()}")
    took = time.monotonic() - t0
    worker.stop()  # closes its log
    return took


@contextmanager
def _stopped_by_sigterm(
    s: Settings, log_path: Path, took: dict[str, float], state: str
) -> Iterator[WorkerProcess]:
    """A worker for the ``with`` body, then SIGTERM; ``took[state]``: seconds to exit."""
    worker = WorkerProcess(s, log_path)
    try:
        yield worker
    finally:
        took[state] = _sigterm(worker)


def _committed(s: Settings) -> dict[int, int]:
    """Committed offsets; none while the group coordinator is still loading (fresh broker)."""
    try:
        return committed_offsets(s)
    except KafkaException:
        return {}


def _log_has(worker: WorkerProcess, text: str) -> bool:
    return text in worker.log_path.read_text(errors="replace")


def test_sigterm_stops_the_worker_within_seconds_in_every_state(kafka, tmp_path: Path) -> None:
    flag = tmp_path / "store-outage"
    s = make_settings(kafka.bootstrap_servers, tmp_path, fault_store_outage_file=flag)
    a = lifecycle_events(30_000, seed=81, prefix="a-")
    b = lifecycle_events(5_000, seed=82, prefix="b-", start_ns=after(a))
    c = lifecycle_events(5_000, seed=83, prefix="c-", start_ns=after(b))
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
        wait_for(lambda: _log_has(w, "lifecycle input paused"), "the pause", 30)
        committed = committed_offsets(s)
        # Into the retry loop's longer delays (0.2 + 0.4 + ... + 3.2 s).
        wait_for(lambda: _log_has(w, "; retry 6 in "), "the 6th retry", 30)
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


def test_a_worker_started_before_the_broker_waits_and_retries(kafka, tmp_path: Path) -> None:
    if not kafka.can_restart:
        pytest.skip("needs the local broker (stopped and started by the test)")
    s: Settings = make_settings(kafka.bootstrap_servers, tmp_path)
    events = lifecycle_events(2_000, seed=84)
    produce_batches(s, events)
    retry = re.compile(r"Kafka broker \S+ unreachable .*: waiting, retry (\d+) in ([\d.]+)s")
    kafka.local.stop()
    waiting = WorkerProcess(s, tmp_path / "waiting.log")
    stopped = WorkerProcess(s, tmp_path / "stopped.log")
    try:
        wait_for(
            lambda: len(retry.findall(waiting.log_path.read_text(errors="replace"))) >= 4,
            "four retries",
            60,
        )
        assert waiting.alive(), waiting.log_tail()
        wait_for(lambda: _log_has(stopped, "unreachable"), "the second worker's wait", 30)
        took = _sigterm(stopped)  # SIGTERM while waiting for the broker
        assert stopped.proc.returncode == 0, stopped.log_tail()
        assert took < STOP_WITHIN_S, took
    except BaseException:
        waiting.stop(signal.SIGKILL)
        raise
    finally:
        stopped.stop(signal.SIGKILL)  # no-op when it exited
        kafka.local.start()
    try:
        waiting.wait_caught_up(timeout_s=120)
    finally:
        waiting.stop()
    delays = [float(d) for _, d in retry.findall(waiting.log_path.read_text(errors="replace"))]
    print(f"retry delays while the broker was down: {delays}; SIGTERM while waiting: {took:.2f}s")
    assert delays[:4] == [0.5, 1.0, 2.0, 4.0], delays
    assert _log_has(waiting, "Kafka broker reachable after")
    assert_exactly_once(s, {ev.request_id for ev in events})


def test_sigterm_while_the_broker_is_down(kafka, tmp_path: Path) -> None:
    if not kafka.can_restart:
        pytest.skip("needs the local broker (stopped and started by the test)")
    s: Settings = make_settings(kafka.bootstrap_servers, tmp_path)
    produce_batches(s, lifecycle_events(2_000, seed=85))
    w = WorkerProcess(s, tmp_path / "worker.log")
    try:
        w.wait_caught_up(timeout_s=120)
        committed = committed_offsets(s)
        kafka.local.stop()
        try:
            took = _sigterm(w)  # the broker is gone (stop() returned once it exited)
        finally:
            kafka.local.start()
    finally:
        w.stop(signal.SIGKILL)  # no-op once it exited
    print(f"SIGTERM with the broker down: exit after {took:.2f}s")
    assert took < STOP_WITHIN_S, took
    assert committed_offsets(s) == committed
