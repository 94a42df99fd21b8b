"""Issue 49: the broker down at the worker's first ledger publish. The worker writes its
first windows with the broker stopped: it waits for the broker to publish their ledger
(it exited before: the ledger topic's partitions were read once, not retried), SIGTERM
stops it while it waits, and once the broker is back it publishes, commits and loses
nothing. The ordering is made by events, not sleeps: a store outage holds the first
write until the broker is stopped."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from pipeline.contract.events import Event
from pipeline.settings import Settings
from tests.integration.faults import (
    STOP_WITHIN_S,
    assert_exactly_once,
    lifecycle_events,
    log_has,
    produce_batches,
    sigterm_exit_s,
    store_fault_settings,
    wait_for,
)
from tests.integration.harness import WorkerProcess, read_all

pytestmark = [pytest.mark.integration, pytest.mark.private_broker, pytest.mark.long(150)]

WAITING = "partitions not known"  # the ledger publisher's line while the broker is down
RETRY = re.compile(r"Kafka broker \S+ unreachable .*: waiting, retry (\d+) in")


def _at_the_first_ledger_publish(  # type: ignore[no-untyped-def]
    kafka, s: Settings, flag: Path, log_path: Path, events: list[Event]
) -> WorkerProcess:
    """A worker whose first write is held by a store outage until the broker is stopped,
    then let go: it stores its first records and windows, and publishes their ledger with
    the broker down. Returned once it has waited through three retries. (The outage
    starts once the worker has migrated its store, and ``events`` are produced then.)"""
    w = WorkerProcess(s, log_path)
    try:
        wait_for(lambda: log_has(w, "worker started:"), "the worker's start", 60)
        flag.touch()
        produce_batches(s, events)
        wait_for(lambda: log_has(w, "lifecycle input paused"), "the first write held", 60)
        kafka.local.stop()
        flag.unlink()
        wait_for(lambda: log_has(w, WAITING), "the ledger waiting for the broker", 60)
        wait_for(
            lambda: len(RETRY.findall(w.log_path.read_text(errors="replace"))) >= 3,
            "three retries",
            60,
        )
    except BaseException:
        w.stop(signal.SIGKILL)
        raise
    assert w.alive(), w.log_tail()
    return w


def _start(kafka) -> None:  # type: ignore[no-untyped-def]
    if not kafka.local.is_running():
        kafka.local.start()


def test_the_first_ledger_publish_waits_for_the_broker(kafka, tmp_path: Path) -> None:
    if not kafka.can_restart:
        pytest.skip("needs the local broker (stopped and started by the test)")
    runs = {}
    for run in ("sigterm", "back"):  # each with its own topics, group and store
        (tmp_path / run).mkdir()
        runs[run] = store_fault_settings(kafka.bootstrap_servers, tmp_path / run, "outage")

    # SIGTERM while the ledger waits for the broker: the worker exits within seconds.
    s, flag = runs["sigterm"]
    try:
        first = _at_the_first_ledger_publish(
            kafka, s, flag, tmp_path / "sigterm.log", lifecycle_events(500, seed=91)
        )
        took = sigterm_exit_s(first)
    finally:
        flag.unlink(missing_ok=True)
        _start(kafka)
    assert first.proc.returncode == 0, first.log_tail()
    assert took < STOP_WITHIN_S, took

    # The broker back while it waits: the ledger is published, everything committed.
    s, flag = runs["back"]
    events = lifecycle_events(2_000, seed=92)
    try:
        w = _at_the_first_ledger_publish(kafka, s, flag, tmp_path / "worker.log", events)
    finally:
        flag.unlink(missing_ok=True)
        _start(kafka)
    try:
        w.wait_caught_up(timeout_s=120)
        assert log_has(w, "Kafka broker reachable after"), w.log_tail()
    finally:
        rc = w.stop()
    assert rc == 0, w.log_tail()
    print(f"SIGTERM while the ledger waited for the broker: exit after {took:.2f}s")
    assert read_all(s, s.ledger_topic), "no ledger entry published"
    assert_exactly_once(s, {ev.request_id for ev in events})
