"""Decisions are a function of the events, not of the processing speed: the same
simulated events give the same directives at the same event times whether the
worker sees them live at 1x, at 60x, as fast as possible, or `replay` reads the
tee file.

Here 60x, as fast as possible and `replay`; 1x runs the trace's own length, so it
gets its own short case in its own module (test_decision_speed_1x.py), which xdist
runs beside this one. Open loop: with the gateways applying directives, *when* a
directive reaches them is wall time, and so is the traffic that follows.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.app.demo import DEMO_JOIN_TIMEOUT_MS, DEMO_WINDOW_GRACE_MS
from pipeline.app.replay import replay_file
from pipeline.core.join import JoinConfig
from pipeline.core.windows import WindowConfig
from pipeline.settings import DEFAULT_POLICY, DEFAULT_SLO_SPEC
from pipeline.spec.policy import load_policy_file
from pipeline.spec.slo import load_spec_file
from tests.integration.decisions import demo_directives

pytestmark = [pytest.mark.integration, pytest.mark.long(65)]


def test_same_directives_at_60x_and_at_max_speed_and_in_replay(kafka, tmp_path: Path) -> None:
    tee = tmp_path / "events.jsonl"
    at_60x = demo_directives(kafka, tmp_path, "x60", 60.0, tee)
    at_max = demo_directives(kafka, tmp_path, "max", None)
    replayed = replay_file(
        tee,
        JoinConfig(timeout_ms=DEMO_JOIN_TIMEOUT_MS),
        spec=load_spec_file(DEFAULT_SLO_SPEC),
        window_config=WindowConfig(grace_ms=DEMO_WINDOW_GRACE_MS),
        policy=load_policy_file(DEFAULT_POLICY),
    )
    assert replayed.control is not None
    from_replay = [(d.scope, d.level, d.phase, d.now_ms) for d in replayed.control.decisions]
    # Compared: every directive from the first degradation to 2 minutes before the input
    # ends. Known gaps (reported, not hidden): the controller's first evaluation depends
    # on when it starts reading summaries, and in the last minute of input the worker
    # decides on windows its quiet partitions close by wall time (issue 11).
    end_ms = max(t for *_, t in from_replay) if from_replay else 0
    first_ms = min((t for _, lv, _, t in from_replay if lv > 0), default=0)

    def core(xs: list) -> list:
        return [x for x in xs if first_ms <= x[3] <= end_ms - 120_000]

    assert core(from_replay), "the overload raised no level: nothing to compare"
    assert core(at_60x) == core(at_max), f"\n60x: {at_60x}\nmax: {at_max}"
    # Burn-driven entries too: the budget signals at T read only windows final in both
    # paths (pipeline.core.control.budget_lag_ms), so a burn alert comes at the same T.
    assert core(at_60x) == core(from_replay), f"\nlive: {at_60x}\nreplay: {from_replay}"
