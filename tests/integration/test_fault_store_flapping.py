"""A store that fails on and off (issue 37, "nothing lost at the edges"): the input is
paused and resumed many times in a few seconds while a backlog streams in, and every
request still lands exactly once.

Before the fix the pause went through Faust's set of active partitions: Faust drops the
records of a partition it no longer counts active from a fetch it is handing over, after
the Kafka client moved its position past them, so messages were skipped and a later
commit covered them (5,276 of 45,000 requests lost), or the input stalled for good
(committed 484 of 678 messages, minutes after the store came back). The pause is now the
Kafka client's own (``LifecycleInput.pause``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.ceilings import ceiling
from tests.integration.faults import (
    assert_exactly_once,
    consecutive_events,
    produce_batches,
    store_fault_settings,
)
from tests.integration.harness import WorkerProcess

pytestmark = [pytest.mark.integration, pytest.mark.long(90)]

FLAPS = 9  # outage 1.5 s, then 0.7 s of store, this many times


def _wait_log(path: Path, ok: Callable[[int, int], bool], what: str) -> None:
    """Until ``ok(pauses, resumes)`` holds for the worker's log (ceiling 120 s)."""
    deadline = time.monotonic() + ceiling(120)
    while True:
        log = path.read_text(errors="replace")
        if ok(log.count("lifecycle input paused"), log.count("lifecycle input resumed")):
            return
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_a_store_failing_on_and_off_loses_nothing(kafka, tmp_path: Path) -> None:
    s, flag = store_fault_settings(
        kafka.bootstrap_servers, tmp_path, "outage", flush_interval_ms=200
    )
    before, during = consecutive_events(5_000, 40_000, seed=21)
    produce_batches(s, before)
    worker = WorkerProcess(s, tmp_path / "worker.log")
    try:
        worker.wait_caught_up(120)
        # Each outage gets its own share of the traffic, produced as it starts, so the
        # worker has rows to write while the store is down however busy the machine is.
        # The first two outages start once the worker is writing again and last until it
        # has seen the store fail (a pause in its log); the others are 1.5 s. The flag
        # file is what the store checks on each insert.
        size = -(-len(during) // FLAPS)
        for i in range(FLAPS):
            if i < 2:
                _wait_log(worker.log_path, lambda p, r: p == r, "the worker to resume")
            flag.touch()
            produce_batches(s, during[i * size : (i + 1) * size])
            time.sleep(1.5)
            if i < 2:
                _wait_log(worker.log_path, lambda p, r, i=i: p > i, f"outage {i + 1} to pause")
            flag.unlink()
            time.sleep(0.7)
        worker.wait_caught_up(180)
    finally:
        worker.stop()
    log = worker.log_path.read_text(errors="replace")
    assert log.count("lifecycle input paused") >= 2, "the store never failed twice"
    assert log.count("lifecycle input paused") == log.count("lifecycle input resumed")
    assert_exactly_once(s, {e.request_id for e in before} | {e.request_id for e in during})
