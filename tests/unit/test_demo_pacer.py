"""The closed loop's pacer is a barrier in *simulated* time on the loop's whole trip: a
mark taken at simulated time T is through when (1) the controller's decision clock,
followed from the worker's ``Progress`` messages, passed T's window boundary, (2) the
controller took the summaries past that message and (3) the gateways' control client
read the control topic to its end as of (2). The simulator waits only while a mark
``max_lag_s`` old is not through; marks advance side by side. Scripted looks, no
broker."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from pipeline.adapters.kafka_admin import GroupProgress
from pipeline.app.demo import _Pacer
from pipeline.contract.summary import Progress

S = 1_000_000_000  # ns per simulated second
T0 = 1_800_000_000_000  # ms: a window boundary (10 s windows)


@dataclass
class Look:
    """What one look finds: Progress messages (partition, horizon_ms, clock_ms; the
    summaries offset after each counts up), the controller's committed summaries
    offset, the control topic's end and how far the client read it."""

    told: list[tuple[int, int, int | None]] = field(default_factory=list)
    summaries_committed: int = 0
    control_end: int = 0
    client_read: int = 0


class _Alive:
    def poll(self) -> None:
        return None


class _Scripted(_Pacer):
    """Each look (an advance) takes the next scripted :class:`Look`; the last repeats."""

    def __init__(self, looks: list[Look], partitions: int = 1, **kw: Any) -> None:
        settings = SimpleNamespace(
            control_enabled=True, window_size_ms=10_000, window_grace_ms=5_000,
            topic_partitions=partitions, control_decision_delay_ms=0,
            lifecycle_topic="lc", summaries_topic="sum", control_topic="ctl",
        )  # fmt: skip
        kw.setdefault("poll_s", 0.0)
        super().__init__(settings, _Alive(), object(), **kw)  # type: ignore[arg-type]
        self._looks: Iterator[Look] = iter(looks)
        self._last = looks[-1]
        self.now = Look()
        self.looked = 0
        self._offset = 0

    def _read_told(self) -> None:
        self.now = next(self._looks, self._last)
        self.looked += 1
        for partition, horizon, clock in self.now.told:
            self._offset += 1
            self.told(Progress(partition, horizon, clock), self._offset)
        self.now.told = []  # (a repeated last look tells nothing again)

    def _progress(self, topic: str) -> GroupProgress:
        if topic == "sum":
            return GroupProgress(self.now.summaries_committed, self._offset)
        assert topic == "ctl"
        return GroupProgress(0, self.now.control_end)

    def _client_read(self) -> int:
        return self.now.client_read


def test_no_wait_while_no_mark_is_older_than_the_bound() -> None:
    pacer = _Scripted([Look()], max_lag_s=25, every_s=5)
    for s in range(0, 25, 5):  # marks at 0..20 s, none through, none 25 s old
        pacer(T0 * 1_000_000 + s * S)
    assert pacer.looked == 5  # one look per check: nothing was due
    assert pacer.waited_s < 5


def test_checks_come_every_every_s_of_simulated_time() -> None:
    pacer = _Scripted([Look()], max_lag_s=25, every_s=5)
    for ms in range(0, 10_000, 100):  # 100 arrivals over 10 s
        pacer(T0 * 1_000_000 + ms * 1_000_000)
    assert pacer.looked == 2


@pytest.mark.parametrize(
    ("looks", "looks_until_free"),
    [
        # the clock passes T, the controller takes it, the client reads the directive
        ([Look(), Look(told=[(0, T0, T0)]), Look(summaries_committed=1, control_end=4),
          Look(summaries_committed=1, control_end=4, client_read=4)], 4),
        # all of it at the first look of the wait
        ([Look(), Look(told=[(0, T0, T0)], summaries_committed=1, control_end=2,
                       client_read=2)], 2),
        # provisional clocks alone do not move it: the horizon held back by a pending
        # join caps the decisions (final_lag: one window past the horizon)
        ([Look(), Look(told=[(0, T0 - 20_000, T0 + 30_000)], summaries_committed=9),
          Look(told=[(0, T0 - 10_000, T0 + 30_000)], summaries_committed=9, control_end=1,
               client_read=1)], 3),
    ],
)  # fmt: skip
def test_a_mark_waits_for_the_whole_trip(looks: list[Look], looks_until_free: int) -> None:
    pacer = _Scripted(looks, max_lag_s=25, every_s=5)
    pacer(T0 * 1_000_000)  # the mark: decisions at T0
    pacer(T0 * 1_000_000 + 25 * S)  # 25 s on: it must be through before going on
    assert pacer.looked == looks_until_free
    assert pacer.gave_up == 0


def test_every_partition_must_have_told() -> None:
    looks = [
        Look(),
        Look(told=[(0, T0, T0)], summaries_committed=1, control_end=1, client_read=1),
        Look(told=[(1, T0, T0)], summaries_committed=2, control_end=1, client_read=1),
    ]
    pacer = _Scripted(looks, partitions=2, max_lag_s=25, every_s=5)
    pacer(T0 * 1_000_000)
    pacer(T0 * 1_000_000 + 25 * S)
    assert pacer.looked == 3


def test_marks_advance_side_by_side() -> None:
    """One look can take several marks through: a slow trip holds the simulator once."""
    told = [(0, T0 + 10_000 * i, T0 + 10_000 * i) for i in range(6)]
    looks = [Look(), Look(), Look(), Look(), Look(), Look(), Look(),
             Look(told=told, summaries_committed=6, control_end=3, client_read=3)]  # fmt: skip
    pacer = _Scripted(looks, max_lag_s=25, every_s=5)
    for s in range(0, 30, 5):  # marks 0..25 s: at 25 s the one at 0 s is due
        pacer(T0 * 1_000_000 + s * S)
    assert pacer.looked == 8  # six checks, the wait's two looks: the last took all six
    assert not pacer._marks
    pacer(T0 * 1_000_000 + 30 * S)  # nothing due: one look, no wait
    assert pacer.looked == 9


def test_a_worker_that_exits_ends_the_wait() -> None:
    class _Exited:
        def poll(self) -> int:
            return 1

    pacer = _Scripted([Look()], max_lag_s=25, every_s=5)
    pacer.worker = _Exited()  # type: ignore[assignment]
    pacer(T0 * 1_000_000)
    pacer(T0 * 1_000_000 + 25 * S)  # never through: returns because the worker is gone
    assert pacer.looked == 2


def test_a_wait_past_the_ceiling_gives_up_and_says_so() -> None:
    pacer = _Scripted([Look()], max_lag_s=25, every_s=5, ceiling_s=0.0)
    pacer(T0 * 1_000_000)
    pacer(T0 * 1_000_000 + 25 * S)
    assert pacer.gave_up == 1
    assert not pacer._marks
    assert pacer.bound_ms == 30_000


def test_clocks_that_only_wall_time_moves_widen_the_bound_then_it_narrows() -> None:
    """Sparse traffic holds the clocks back in event time: a wait in which they do not
    move (the worker has nothing left to process) ends after ``settle_s`` and the bound
    widens to that mark's age (+ two checks); a trip within the base lag narrows it again."""
    behind = Look(told=[(0, T0 - 60_000, T0 - 60_000)])
    pacer = _Scripted([behind, Look()], max_lag_s=25, every_s=5, settle_s=0.05, poll_s=0.01)
    pacer(T0 * 1_000_000)
    pacer(T0 * 1_000_000 + 25 * S)  # the mark at T0 is due; nothing moves: widened
    assert (pacer.widened, pacer.gave_up) == (1, 0)
    assert pacer.max_lag_ns == 35 * S  # its age (25 s) + two checks
    assert pacer.bound_ms == 40_000
    pacer(T0 * 1_000_000 + 30 * S)  # within the widened lag: no wait
    assert pacer.widened == 1
    # the clocks catch up: every mark goes through, the newest within the base lag
    pacer._last = Look(told=[(0, T0 + 40_000, T0 + 40_000)], summaries_committed=9,
                       control_end=1, client_read=1)  # fmt: skip
    pacer(T0 * 1_000_000 + 35 * S)
    assert not pacer._marks
    assert pacer.max_lag_ns == 25 * S
    assert pacer.bound_ms == 40_000  # the widest used stays reported


def test_a_slow_controller_or_client_never_widens_the_bound() -> None:
    """Past the decision clock, only the controller's and the client's speed hold a mark:
    the wait goes on (to its ceiling) however still the clocks are."""
    met = Look(told=[(0, T0, T0)])  # the decision clock passed T0; nothing committed
    pacer = _Scripted([met, Look()], max_lag_s=25, every_s=5, settle_s=0.02, poll_s=0.01,
                      ceiling_s=0.2)  # fmt: skip
    pacer(T0 * 1_000_000)
    pacer(T0 * 1_000_000 + 25 * S)
    assert (pacer.widened, pacer.gave_up) == (0, 1)
    assert pacer.bound_ms == 30_000
