"""Fetched messages never handed over (``pipeline.core.stall``): when a partition is read
again, and when not."""

from __future__ import annotations

import pytest

from pipeline.core.stall import PartitionView, StallWatch

AFTER = 10_000
V = PartitionView

# Per case: a sequence of checks (now ms, {partition: view}, busy) and what the last one
# says to read again from.
CASES: dict[str, tuple[list[tuple[int, dict[int, PartitionView], bool]], dict[int, int]]] = {
    "ahead, idle, for the whole period: read again from the expected offset": (
        [(0, {0: V(120, 100)}, False), (AFTER, {0: V(120, 100)}, False)],
        {0: 100},
    ),
    "ahead for less than the period: nothing yet": (
        [(0, {0: V(120, 100)}, False), (AFTER - 1, {0: V(120, 100)}, False)],
        {},
    ),
    "caught up (position = expected): nothing": (
        [(0, {0: V(100, 100)}, False), (AFTER * 3, {0: V(100, 100)}, False)],
        {},
    ),
    "position unknown (awaiting a reset): nothing": (
        [(0, {0: V(None, 100)}, False), (AFTER * 3, {0: V(None, 100)}, False)],
        {},
    ),
    "the expected offset moved (messages handed over meanwhile): the period starts again": (
        [(0, {0: V(120, 100)}, False), (AFTER, {0: V(120, 110)}, False)],
        {},
    ),
    "moved, then stood for a whole period": (
        [
            (0, {0: V(120, 100)}, False),
            (AFTER, {0: V(120, 110)}, False),
            (2 * AFTER, {0: V(120, 110)}, False),
        ],
        {0: 110},
    ),
    "busy at a check (a batch in progress, the store down): the period starts again": (
        [
            (0, {0: V(120, 100)}, False),
            (AFTER // 2, {0: V(120, 100)}, True),
            (AFTER, {0: V(120, 100)}, False),
        ],
        {},
    ),
    "busy now: nothing, however long": (
        [(0, {0: V(120, 100)}, False), (AFTER * 5, {0: V(120, 100)}, True)],
        {},
    ),
    "paused by the consumer: not judged": (
        [(0, {0: V(120, 100, paused=True)}, False), (AFTER, {0: V(120, 100, paused=True)}, False)],
        {},
    ),
    "only the partition that stood": (
        [
            (0, {0: V(120, 100), 1: V(50, 40)}, False),
            (AFTER, {0: V(120, 100), 1: V(50, 45)}, False),
        ],
        {0: 100},
    ),
    "a partition revoked between checks is forgotten": (
        [(0, {0: V(120, 100)}, False), (1, {}, False), (AFTER, {0: V(120, 100)}, False)],
        {},
    ),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_a_partition_is_read_again_only_when_its_position_stood_past_while_idle(case: str) -> None:
    checks, want = CASES[case]
    watch = StallWatch(AFTER)
    got: dict[int, int] = {}
    for now_ms, views, busy in checks:
        got = watch.observe(now_ms, views, busy)
    assert got == want


def test_each_stall_is_reported_once_and_watched_again() -> None:
    watch = StallWatch(AFTER)
    ahead = {0: V(120, 100)}
    assert watch.observe(0, ahead, False) == {}
    assert watch.observe(AFTER, ahead, False) == {0: 100}
    assert watch.observe(AFTER + 1, ahead, False) == {}  # the seek is under way
    assert watch.observe(2 * AFTER + 1, ahead, False) == {0: 100}  # it did not help: again


def test_a_period_of_zero_is_refused() -> None:
    with pytest.raises(ValueError, match="after_ms"):
        StallWatch(0)
