"""Issue 47 items 4 and 5 on the shipped policy: every signal may be missing, and a level
that turns traffic away does not leave on evidence measured on admitted traffic alone.

Rules under test (``pipeline.core.policy``, "Unknown signals"): an entry on an unknown
signal never fires; an exit condition never observed false for its whole window (its
``for`` and at least ``min_dwell``: each evaluation held it or lacked its signal) holds
when measured now and is waived when unknown now; the level leaves on the exits that are
measured and the reason names what it lacked; with no exit measured, or without the
pre-admission one (``load.demand_ratio``) at a level that turns traffic away, the level
leaves only once held for its ``max_duration``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from pipeline.core.policy import Evaluation, PolicyEngine
from pipeline.spec.policy import DEFAULT_POLICY_PATH, load_policy_file
from tests.policy_fixtures import TICK, M

SHIPPED = load_policy_file(DEFAULT_POLICY_PATH)  # L1: min_dwell 2m, exits for 2m, max 15m
HALF = SHIPPED.dynamics.half_open.duration_ms  # the shipped half-open phase
EPISODE_END = 4 * M  # the overload is measured until then (L2 needs 5m), gone after

OVERLOAD: dict[str, Any] = {
    "load.burning": True,
    "load.caused": True,
    "load.demand_ratio": 3.0,
    "queue.depth_ratio": 2.0,
    "gpu_memory_fraction": 0.5,
}
GONE: dict[str, Any] = {
    "load.burning": False,
    "load.caused": False,
    "load.demand_ratio": 0.3,
    "queue.depth_ratio": 0.0,
    "gpu_memory_fraction": 0.5,
}

Signals = Callable[[int], dict[str, Any]]


def _until(end_ms: int, after: dict[str, Any]) -> Signals:
    """The episode; then ``after`` until ``end_ms``, and the signals of a gone cause."""

    def at(t: int) -> dict[str, Any]:
        if t < EPISODE_END:
            return dict(OVERLOAD)
        return {**GONE, **after} if t < end_ms else dict(GONE)

    return at


def _episode(after: dict[str, Any] | None = None, during: dict[str, Any] | None = None) -> Signals:
    def at(t: int) -> dict[str, Any]:
        if t < EPISODE_END:
            return {**OVERLOAD, **(during or {})}
        return {**GONE, **(after or {})}

    return at


def _flicker(signal: str, known: dict[str, Any] | None = None) -> Signals:
    """After the episode, ``signal`` is unknown at every other evaluation (``known``: the
    other signals then, over the episode's end)."""
    base = _episode(known)

    def at(t: int) -> dict[str, Any]:
        out = base(t)
        if t >= EPISODE_END and (t // TICK) % 2:
            out[signal] = None
        return out

    return at


def _run(signals: Signals, until_ms: int = 30 * M) -> list[Evaluation]:
    engine = PolicyEngine(SHIPPED)
    return [engine.evaluate("m", t, signals(t)) for t in range(0, until_ms, TICK)]


def _changes(ds: list[Evaluation]) -> list[tuple[int, int, str]]:
    return [(d.now_ms, d.level, d.phase) for d in ds if d.changed]


NO_STATS = {"queue.depth_ratio": None}  # engines without our stats plugin
ALL_EXITS = {"load.burning": None, "load.caused": None, "load.demand_ratio": None}
ALL_EXITS |= NO_STATS
L1_BACK = [(0, 1, "degraded"), (6 * M, 1, "half_open"), (6 * M + HALF, 0, "normal")]
AT_MAX = [(0, 1, "degraded"), (15 * M, 1, "half_open"), (15 * M + HALF, 0, "normal")]

# (id, signals, want transitions, a text the leaving reason must hold)
CASES = [
    # every exit measured: exit for 2m after the episode, half-open, normal
    ("all-known", _episode(), L1_BACK, "queue.depth_ratio < 0.5"),
    # no engine.stats at all (before: "L1 held, waiting for exit: queue.depth_ratio
    # unknown" to the end of the hour); the same times as with every signal
    (
        "depth-never-known",
        _episode(NO_STATS, NO_STATS),
        L1_BACK,
        "queue.depth_ratio unknown since 0",
    ),
    # the stats stop as the queue goes: unknown for 2m (its for, and min_dwell) -> waived
    (
        "depth-gone-with-queue",
        _episode(NO_STATS),
        L1_BACK,
        f"queue.depth_ratio unknown since {EPISODE_END}",
    ),
    # unknown at every other evaluation, the queue short whenever measured: never observed
    # false for 2m, so it holds (before: held to max_duration, as if flickering evidence
    # were less than none)
    (
        "depth-flickers-short",
        _flicker("queue.depth_ratio"),
        L1_BACK,
        f"queue.depth_ratio unknown at times since {EPISODE_END}",
    ),
    # unknown at every other evaluation, the queue long whenever measured: never held
    # before max_duration; at max_duration an exit unknown right then is waived (15m is a
    # known tick, 15m10s the next unknown)
    (
        "depth-flickers-long",
        _flicker("queue.depth_ratio", {"queue.depth_ratio": 2.0}),
        [(0, 1, "degraded"), (15 * M + TICK, 1, "half_open"), (15 * M + TICK + HALF, 0, "normal")],
        "queue.depth_ratio unknown since",
    ),
    # gateway only: the burn's cause unknown for a minute after the episode (a fast burn,
    # demand no longer over what is served), then false: the minute counts (before: the
    # 2m clock restarted at the first false)
    (
        "burning-unknown-then-false",
        _until(EPISODE_END + M, {"load.burning": None, "load.caused": None}),
        L1_BACK,
        f"load.burning unknown at times since {EPISODE_END}",
    ),
    # the demand unknown for 8m, then measured under 0.9: it must hold for its 2m on
    # measured demand (one sample after a gap does not end what its absence held)
    (
        "demand-unknown-then-known",
        _until(12 * M, {"load.demand_ratio": None}),
        [(0, 1, "degraded"), (14 * M, 1, "half_open"), (14 * M + HALF, 0, "normal")],
        "load.demand_ratio < 0.9 for 2m",
    ),
    # the pre-admission exit unknown at a level that turns traffic away: the queue and
    # the burn of admitted traffic alone do not end it before max_duration
    ("demand-unknown", _episode({"load.demand_ratio": None}), AT_MAX, "held past max_duration"),
    # no exit measured at all: held to max_duration, then half-open (its probe cannot
    # relapse on unknown signals), then normal
    ("all-exits-unknown", _episode(ALL_EXITS), AT_MAX, "no exit measured"),
    # an entry on an unknown signal never fires
    ("entry-unknown", _episode(during={"load.burning": None, "load.caused": None}), [], None),
    # demand before admission still over capacity, the admitted queue short and the
    # admitted burn gone: held (item 4), whatever max_duration says
    ("demand-over-admitted-calm", _episode({"load.demand_ratio": 3.0}), [(0, 1, "degraded")], None),
    ("demand-just-over", _episode({"load.demand_ratio": 0.9}), [(0, 1, "degraded")], None),
    ("demand-under", _episode({"load.demand_ratio": 0.89}), L1_BACK, "load.demand_ratio < 0.9"),
]


@pytest.mark.parametrize(
    ("signals", "want", "text"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_unknown_signals_and_pre_admission_exit(
    signals: Signals, want: list[tuple[int, int, str]], text: str | None
) -> None:
    ds = _run(signals)
    assert _changes(ds) == want
    if text is not None:
        leave = next(d for d in ds if d.changed and d.phase == "half_open")
        assert text in leave.reason, leave.reason


def test_held_reason_names_what_is_unknown_and_not_waited_for() -> None:
    ds = _run(_episode({"load.demand_ratio": None}))
    held = next(d for d in ds if d.now_ms == 13 * M)
    assert (held.level, held.phase) == (1, "degraded")
    assert "exit not measured (load.demand_ratio unknown)" in held.reason
    assert "not waited for: load.demand_ratio unknown since 240000" in held.reason
    assert "blind load.demand_ratio" in [h.key for h in held.holds]


def test_unknown_in_half_open_is_no_relapse_but_the_entry_is() -> None:
    def relapse(burning: bool | None) -> Signals:
        base = _episode()

        def at(t: int) -> dict[str, Any]:
            out = base(t)
            if 7 * M <= t < 7 * M + TICK:
                out["load.burning"] = out["load.caused"] = burning
            return out

        return at

    assert _changes(_run(relapse(None))) == L1_BACK
    assert _changes(_run(relapse(True)))[:3] == [*L1_BACK[:2], (7 * M, 1, "degraded")]
