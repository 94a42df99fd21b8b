"""Issue 37 item 5: one dead letter per source position across restarts.

A worker dead-letters poison messages and is SIGKILLed before it commits their offsets;
the next worker re-reads them from the committed offset. Before, each re-read sent a
second letter (a fault trial: 838 letters for 602 positions). Now the worker reads the
DLQ back when it takes a partition (from the time its last commit recorded) and sends no
letter for a position that has one: the DLQ ends with exactly one letter per position,
each keyed by it.
"""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

import pytest

from pipeline.settings import Settings
from tests.integration.faults import (
    committed_offsets,
    dead_letters,
    lifecycle_events,
    produce_batches,
    send_all,
    wait_for,
)
from tests.integration.harness import WorkerProcess, make_settings, read_all, run_until_caught_up

pytestmark = [pytest.mark.integration, pytest.mark.long(50)]

POISON_PER_ROUND = 40


def _poison(s: Settings, round_: int) -> set[tuple[int, int]]:
    """``POISON_PER_ROUND`` messages that are not JSON, over the partitions; their
    (partition, offset)."""
    send_all(s, [(s.lifecycle_topic, i % s.topic_partitions, f"not json {round_}-{i}".encode())
                 for i in range(POISON_PER_ROUND)])  # fmt: skip
    return {
        (m.partition(), m.offset())
        for m in read_all(s, s.lifecycle_topic)
        if (m.value() or b"").startswith(f"not json {round_}-".encode())
    }


def _letters(s: Settings) -> list[tuple[int, int]]:
    out = []
    for d in dead_letters(s):
        pos = (int(d["tailguard.source.partition"]), int(d["tailguard.source.offset"]))
        assert d["key"] == f"{s.lifecycle_topic}/{pos[0]}/{pos[1]}"
        out.append(pos)
    return out


def test_a_restart_before_the_commit_sends_no_second_dead_letter(kafka, tmp_path: Path) -> None:
    s = make_settings(kafka.bootstrap_servers, tmp_path, topic_partitions=2)
    # Round 1: dead-lettered and committed (the commit records from when to read the DLQ).
    produce_batches(s, lifecycle_events(200, seed=51, prefix="a-"))
    first = _poison(s, 1)
    run_until_caught_up(s, tmp_path / "w1.log")
    assert sorted(_letters(s)) == sorted(first)
    committed = committed_offsets(s)

    # Round 2: a worker that never flushes (no commit) dead-letters them, then is killed.
    second = _poison(s, 2)
    slow = s.model_copy(update={"flush_interval_ms": 3_600_000})
    w2 = WorkerProcess(slow, tmp_path / "w2.log")
    try:
        wait_for(lambda: len(_letters(s)) >= len(first) + len(second), "round 2's letters", 90, 0.5)
    finally:
        w2.stop(signal.SIGKILL)
    assert committed_offsets(s) == committed, "the killed worker committed"

    # Round 3: the next worker re-reads round 2 from the committed offset.
    log = run_until_caught_up(s, tmp_path / "w3.log")
    letters = _letters(s)
    counts = Counter(letters)
    print(
        f"DLQ after the restart: {len(letters)} letters for {len(counts)} positions "
        f"({len(first) + len(second)} poisoned)"
    )
    assert set(counts) == first | second
    assert max(counts.values()) == 1, [pos for pos, n in counts.items() if n > 1][:5]
    assert "already dead-lettered" in log
