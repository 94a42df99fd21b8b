"""The one control path: DecisionClock + ControlLoop serve both the controller shell
(per-partition progress) and replay (closed windows)."""

from __future__ import annotations

import itertools

from pipeline.core.control import DecisionClock, held_key
from pipeline.core.policy import PolicyEngine
from pipeline.spec.policy import EXAMPLE_POLICY_PATH, load_policy_file

SIZE = 10_000


def test_replay_clock_evaluates_every_window_end_once() -> None:
    c = DecisionClock(SIZE)
    assert c.due() == []
    c.window(20_000, SIZE)
    c.closed(30_000)
    assert c.due() == [30_000]
    c.window(30_000, SIZE)
    c.closed(60_000)  # a gap: every step is evaluated ("for" clocks need them)
    assert c.due() == [40_000, 50_000, 60_000]
    assert c.due() == []


def test_partition_clock_waits_for_every_partition() -> None:
    c = DecisionClock(SIZE, partitions=2, decision_delay_ms=2_000)
    c.window(0, SIZE)
    c.progress(0, 40_000, None)
    assert c.due() == []  # partition 1 has not reported
    c.progress(1, 20_000, None)
    assert c.due() == [10_000, 20_000]
    c.progress(0, 40_000, 55_000)
    c.progress(1, 20_000, 43_000)  # clocks: min 43 s - 2 s delay -> 41 s -> 40 s
    assert c.due() == [30_000, 40_000]


def test_due_times_do_not_depend_on_how_progress_is_batched() -> None:
    """The same progress reports, delivered in any interleaving of the partitions,
    give the same evaluation times (wall time only decides when)."""
    reports = [(p, 10_000 * k, 10_000 * k + 3_000) for k in range(1, 30) for p in range(3)]
    want: list[int] | None = None
    for perm in itertools.islice(itertools.permutations(range(3)), 6):
        c = DecisionClock(SIZE, partitions=3, decision_delay_ms=1_000)
        c.window(0, SIZE)
        got: list[int] = []
        order = sorted(reports, key=lambda r: (r[1], perm.index(r[0])))
        for i, (p, h, clk) in enumerate(order):
            c.progress(p, h, clk)
            if i % 5 == 0:
                got += c.due()
        got += c.due()
        assert got == sorted(set(got))
        want = want or got
        assert got == want


def test_held_key_drops_running_values_and_times() -> None:
    engine = PolicyEngine(load_policy_file(EXAMPLE_POLICY_PATH))
    p99 = "p99.gateway_total_ms"
    base = {p99: 412.0}
    for t in range(0, 9 * 60_000, SIZE):
        d = engine.evaluate("m", t, base)
    a = held_key(d)
    d2 = engine.evaluate("m", 9 * 60_000, {p99: 500.0})
    assert held_key(d2) == a == (f"entry {p99} > 300", f"{p99} >= 250")
    cooling = engine.evaluate("m", 9 * 60_000 + SIZE, {p99: 200.0})
    assert held_key(cooling) == (f"{p99} < 250",)


def test_announce_changes_and_what_holds_a_level_at_most_once_a_minute() -> None:
    from pipeline.core.control import Controller, ControlLoop, ControlStep

    policy = load_policy_file(EXAMPLE_POLICY_PATH)
    loop = ControlLoop(Controller(policy), DecisionClock(SIZE))
    engine = PolicyEngine(policy)
    p99 = "p99.gateway_total_ms"
    announced = []
    for t in range(0, 30 * 60_000, SIZE):
        v = (
            412.0
            if t < 10 * 60_000
            else (260.0 if t % 20_000 else 240.0)
            if t < 12 * 60_000
            else 200.0
        )
        d = engine.evaluate("m", t, {p99: v})
        for a in loop.announce(ControlStep(t, [d], [], [], {})):
            announced.append((a.now_ms // 1000, a.level, a.phase, a.changed))
    assert announced[0] == (0, 0, "normal", False)  # a scope never announced
    changes = [a[:3] for a in announced if a[3]]
    assert changes == [(300, 1, "degraded"), (1020, 1, "half_open"), (1320, 0, "normal")]
    held = [a[0] for a in announced[1:] if not a[3]]
    # "entry holds" -> "waiting for exit" at 10 min; the exit flapping from 10 to 12 min
    # (every 10 s) is announced at most once a minute, not every tick
    assert held == [600, 670, 730]


def test_budget_lag_is_the_grace_in_whole_windows() -> None:
    from pipeline.core.control import budget_lag_ms

    assert [budget_lag_ms(SIZE, g) for g in (0, 1, 5_000, 10_000, 10_001, 30_000)] == [
        0, 10_000, 10_000, 10_000, 20_000, 30_000,
    ]  # fmt: skip


def test_clock_runs_ahead_of_the_final_windows_by_the_budget_lag_at_most() -> None:
    """A window held open (a pending join) holds decisions back: the budget signals at T
    need every window ending at or before T - lag final, in every path."""
    c = DecisionClock(SIZE, partitions=2, decision_delay_ms=100, final_lag_ms=10_000)
    c.window(0, SIZE)
    c.progress(0, 30_000, 70_000)
    c.progress(1, 20_000, 70_000)  # partition 1's finals stop at 20 s (a window held open)
    assert c.due() == [10_000, 20_000, 30_000]  # not 60 s: 20 s of finals + 10 s of lag
    c.progress(1, 60_000, 70_000)
    assert c.due() == [40_000]  # partition 0's finals reach 30 s
    c.progress(0, 60_000, 70_000)
    assert c.due() == [50_000, 60_000]  # min clock 70 s - 0.1 s -> 60 s
    unbounded = DecisionClock(SIZE, partitions=1, decision_delay_ms=100)
    unbounded.window(0, SIZE)
    unbounded.progress(0, 20_000, 70_000)
    assert unbounded.due()[-1] == 60_000
