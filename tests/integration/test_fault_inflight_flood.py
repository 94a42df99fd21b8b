"""Issue 12 item 9 on the real broker: a flood of ``gateway.received`` without partners does
not pin the committed offsets (the worker catches up: committed = end of every partition
while the requests are still in flight), and after a SIGKILL the in-flight requests are
restored from the store, so partners arriving then still join with their received."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import pytest

from pipeline.adapters.store import open_store
from pipeline.contract.events import Event
from tests.factories import T0_NS, completed, finished, received
from tests.integration.faults import produce_batches
from tests.integration.harness import WorkerProcess, make_settings, run_until_caught_up

pytestmark = [pytest.mark.integration, pytest.mark.long(45)]

LONE = 20_000
PARTNERED = 200


def test_lone_received_events_do_not_pin_the_commit_and_survive_a_crash(
    kafka, tmp_path: Path
) -> None:
    s = make_settings(kafka.bootstrap_servers, tmp_path)
    # Event times of today: the raw events table keeps TAILGUARD_RAW_EVENTS_TTL_DAYS.
    now_ms = (time.time_ns() - T0_NS) / 1e6
    lone: list[Event] = [received(f"lone-{i}", now_ms + i * 0.05, priority=3) for i in range(LONE)]
    complete: list[Event] = []
    for i in range(500):  # ordinary traffic among them
        t = now_ms + LONE * 0.05 + i
        complete += [
            received(f"ok-{i}", t),
            completed(f"ok-{i}", t + 100),
            finished(f"ok-{i}", t + 98),
        ]
    produce_batches(s, lone + complete)
    worker = WorkerProcess(s, tmp_path / "first.log")
    try:
        # Caught up = committed at the end of every partition, with 20,000 requests in flight.
        worker.wait_caught_up(timeout_s=120)
    finally:
        worker.stop(signal.SIGKILL)  # a crash: nothing flushed at exit

    partners: list[Event] = []
    for i in range(PARTNERED):
        t = now_ms + LONE * 0.05 + 600 + i
        partners += [completed(f"lone-{i}", t + 100), finished(f"lone-{i}", t + 98)]
    produce_batches(s, partners)
    log_text = run_until_caught_up(s, tmp_path / "second.log")
    restored = sum(
        int(line.split(": ")[-1].split()[0])
        for line in log_text.splitlines()
        if "in-flight requests restored from the store" in line
    )
    print(f"{LONE} lone received events: committed to the end; {restored} restored after SIGKILL")
    assert restored >= LONE  # every lone received (the partnered ones included)

    store = open_store(s)
    try:
        rows = store.query_rows(
            f"SELECT request_id, source, priority, tenant FROM {s.database}.requests FINAL "
            "WHERE startsWith(request_id, 'lone-')"
        )
    finally:
        store.close()
    assert len(rows) == PARTNERED
    assert {(src, prio, tenant) for _, src, prio, tenant in rows} == {("joined", 3, "t1")}


def test_pending_joins_are_bounded_per_worker(kafka, tmp_path: Path) -> None:
    limit = 5_000
    s = make_settings(kafka.bootstrap_servers, tmp_path, max_pending=limit)
    now_ms = (time.time_ns() - T0_NS) / 1e6
    produce_batches(s, [received(f"lone-{i}", now_ms + i * 0.05) for i in range(LONE)])
    log_text = run_until_caught_up(s, tmp_path / "worker.log")
    pending = [int(m) for m in re.findall(r" pending=(\d+) ", log_text)]
    print(
        f"{LONE} lone received events over {s.topic_partitions} partitions, limit {limit}: "
        f"pending at the status lines {pending}"
    )
    assert pending, log_text[-3000:]
    assert max(pending) <= limit
    assert pending[-1] == limit  # the final status line, at the stop
