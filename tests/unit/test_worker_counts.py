"""``WorkerCounts.count``: each of the processor's cumulative counts adds to its counter,
under its label, what it grew by since the last call (and nothing when it did not grow)."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest

from pipeline.adapters.worker_counts import WorkerCounts

COUNTERS = ("join_timeouts", "join_conflicts", "join_duplicates", "lateness")


class _Recorded:
    def __init__(self) -> None:
        self.added: Counter[tuple[str, str]] = Counter()

    def add(self, amount: int, labels: dict[str, str]) -> None:
        ((key, name),) = labels.items()
        self.added[(key, name)] += amount


NAMES = (
    "gateway_only", "engine_only", "conflicts", "conflicts_corrected", "duplicates",
    "duplicate_ids_changed", "corrected", "retracted", "quarantined", "replayed", "beyond_memory",
)  # fmt: skip


def _processor(**counts: int) -> Any:
    """The processor's cumulative counts (0 for those not named), one object standing for
    its join's, its windows' and its own counters."""
    c = SimpleNamespace(**{k: counts.get(k, 0) for k in NAMES})
    return SimpleNamespace(join_counters=lambda: c, window_counters=lambda: c, counters=c)


# (case, counts at the first call, at the second, what the second call adds)
CASES = [
    ("timeouts",
     {"gateway_only": 2, "engine_only": 1}, {"gateway_only": 5, "engine_only": 1},
     {"join_timeouts": {("side", "gateway_only"): 3}}),
    ("conflicts",
     {"conflicts": 3, "conflicts_corrected": 1}, {"conflicts": 6, "conflicts_corrected": 2},
     {"join_conflicts": {("when", "before_record"): 2, ("when", "after_record"): 1}}),
    ("duplicates",
     {"duplicates": 2, "duplicate_ids_changed": 1}, {"duplicates": 5, "duplicate_ids_changed": 1},
     {"join_duplicates": {("content", "same"): 3}}),
    ("lateness",
     {"corrected": 1, "replayed": 4},
     {"corrected": 2, "retracted": 1, "quarantined": 3, "replayed": 4, "beyond_memory": 7},
     {"lateness": {("kind", "corrected"): 1, ("kind", "retracted"): 1, ("kind", "quarantined"): 3,
                   ("kind", "counted_before"): 7}}),
    ("nothing grew",
     {"gateway_only": 2, "duplicates": 1}, {"gateway_only": 2, "duplicates": 1},
     {}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("first", "second", "want"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_count_adds_what_grew_since_the_last_call(
    first: dict[str, int], second: dict[str, int], want: dict[str, dict[tuple[str, str], int]]
) -> None:
    telemetry = SimpleNamespace(**{name: _Recorded() for name in COUNTERS})
    counts = WorkerCounts(_processor(**first), telemetry)
    counts.count()
    for name in COUNTERS:
        getattr(telemetry, name).added.clear()
    counts.processor = _processor(**second)
    counts.count()
    got = {name: dict(getattr(telemetry, name).added) for name in COUNTERS}
    assert {k: v for k, v in got.items() if v} == want


def test_the_first_call_adds_every_count() -> None:
    telemetry = SimpleNamespace(**{name: _Recorded() for name in COUNTERS})
    WorkerCounts(_processor(engine_only=4, conflicts=2, replayed=1), telemetry).count()
    assert telemetry.join_timeouts.added == {("side", "engine_only"): 4}
    assert telemetry.join_conflicts.added == {("when", "before_record"): 2}
    assert telemetry.lateness.added == {("kind", "replayed"): 1}
