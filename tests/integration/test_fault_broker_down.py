"""Issue 12, items 7 and 8 with the broker down: a worker started before the broker waits for
it with backoff (SIGTERM stops one that waits within seconds), then works; SIGTERM stops a
worker whose broker went away within seconds, committing nothing. (Split from
test_fault_stop_start.py, so that xdist can run the two modules side by side.)"""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from pipeline.settings import Settings
from tests.integration.faults import (
    STOP_WITHIN_S,
    assert_exactly_once,
    committed_offsets,
    lifecycle_events,
    log_has,
    produce_batches,
    sigterm_exit_s,
    wait_for,
)
from tests.integration.harness import WorkerProcess, make_settings

pytestmark = [pytest.mark.integration, pytest.mark.private_broker, pytest.mark.long(125)]


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
        wait_for(lambda: log_has(stopped, "unreachable"), "the second worker's wait", 30)
        took = sigterm_exit_s(stopped)  # SIGTERM while waiting for the broker
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
    assert log_has(waiting, "Kafka broker reachable after")
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
            took = sigterm_exit_s(w)  # the broker is gone (stop() returned once it exited)
        finally:
            kafka.local.start()
    finally:
        w.stop(signal.SIGKILL)  # no-op once it exited
    print(f"SIGTERM with the broker down: exit after {took:.2f}s")
    assert took < STOP_WITHIN_S, took
    assert committed_offsets(s) == committed
