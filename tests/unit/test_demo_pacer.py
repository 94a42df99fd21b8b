"""The closed loop's pacer bounds the pipeline's lag in *simulated* time: at a check it
waits for what was sent ``max_lag_s`` of simulated time earlier to be committed by the
worker and for the summaries published by then to be taken by the controller; between
checks, and for newer data, it does not wait. Scripted offsets, no broker."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from pipeline.adapters.kafka_admin import GroupProgress
from pipeline.app.demo import _Pacer

S = 1_000_000_000  # ns per simulated second


class _Alive:
    def poll(self) -> None:
        return None


class _Scripted(_Pacer):
    """Each look at the offsets takes the next scripted (lifecycle, summaries) pair."""

    def __init__(self, looks: list[tuple[tuple[int, int], tuple[int, int]]], **kw: Any) -> None:
        settings = SimpleNamespace(control_enabled=True)
        super().__init__(settings, _Alive(), every_s=0.0, poll_s=0.0, **kw)  # type: ignore[arg-type]
        self._looks: Iterator[tuple[tuple[int, int], tuple[int, int]]] = iter(looks)
        self.looked = 0

    def _progress(self) -> tuple[GroupProgress, GroupProgress | None]:
        (lc, le), (sc, se) = next(self._looks)
        self.looked += 1
        return GroupProgress(lc, le), GroupProgress(sc, se)


def test_no_wait_while_nothing_is_older_than_the_bound() -> None:
    # (committed, end) of lifecycle, then of summaries; nothing committed at all
    pacer = _Scripted([((0, 10), (0, 3)), ((0, 20), (0, 5))], max_lag_s=60)
    pacer(0)
    pacer(59 * S)
    assert pacer.looked == 2  # one look per check: nothing was due


@pytest.mark.parametrize(
    ("looks_until_free", "looks"),
    [
        # lifecycle committed first, then the controller takes the summaries
        (4, [((10, 30), (0, 8)), ((25, 30), (3, 8)), ((25, 30), (5, 8))]),
        # the summaries taken first, the worker commits later
        (3, [((9, 30), (5, 8)), ((10, 30), (5, 8))]),
        # already there at the check
        (2, [((10, 30), (5, 8))]),
    ],
)
def test_a_check_waits_for_what_was_sent_a_bound_ago(
    looks_until_free: int, looks: list[tuple[tuple[int, int], tuple[int, int]]]
) -> None:
    # at t=0 the topics ended at lifecycle 10, summaries 5: due at t >= 60 s
    pacer = _Scripted([((0, 10), (0, 5)), *looks], max_lag_s=60)
    pacer(0)
    pacer(61 * S)
    assert pacer.looked == looks_until_free


def test_the_newest_due_mark_is_the_one_waited_for() -> None:
    looks = [
        ((0, 10), (0, 2)),  # t=0
        ((0, 20), (0, 4)),  # t=30
        ((20, 40), (4, 6)),  # t=95: due marks t=0 and t=30; t=30's ends (20, 4) are met
    ]
    pacer = _Scripted(looks, max_lag_s=60)
    pacer(0)
    pacer(30 * S)
    pacer(95 * S)
    assert pacer.looked == 3  # no further look: met at the check itself


def test_a_worker_that_exits_ends_the_wait() -> None:
    class _Exited:
        def poll(self) -> int:
            return 1

    pacer = _Scripted([((0, 10), (0, 5)), ((0, 10), (0, 5))], max_lag_s=60)
    pacer.worker = _Exited()  # type: ignore[assignment]
    pacer(0)
    pacer(61 * S)  # never committed: returns because the worker is gone
    assert pacer.looked == 2
