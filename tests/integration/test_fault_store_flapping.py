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
from pathlib import Path

import pytest

from tests.integration.faults import (
    assert_exactly_once,
    consecutive_events,
    produce_batches,
    store_fault_settings,
)
from tests.integration.harness import WorkerProcess

pytestmark = [pytest.mark.integration, pytest.mark.long(90)]

FLAPS = 9  # outage 1.5 s, then 0.7 s of store, this many times


def test_a_store_failing_on_and_off_loses_nothing(kafka, tmp_path: Path) -> None:
    s, flag = store_fault_settings(
        kafka.bootstrap_servers, tmp_path, "outage", flush_interval_ms=200
    )
    before, during = consecutive_events(5_000, 40_000, seed=21)
    produce_batches(s, before)
    worker = WorkerProcess(s, tmp_path / "worker.log")
    try:
        worker.wait_caught_up(120)
        produce_batches(s, during)
        for _ in range(FLAPS):
            # the outage is a flag file the worker's store checks on each insert: the
            # durations are the fault's shape, not a wait for the worker
            flag.touch()
            time.sleep(1.5)
            flag.unlink()
            time.sleep(0.7)
        worker.wait_caught_up(180)
    finally:
        worker.stop()
    log = worker.log_path.read_text(errors="replace")
    assert log.count("lifecycle input paused") >= 2, "the store never failed twice"
    assert log.count("lifecycle input paused") == log.count("lifecycle input resumed")
    assert_exactly_once(s, {e.request_id for e in before} | {e.request_id for e in during})
