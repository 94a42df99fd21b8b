"""Decisions at 1x: the same directives at the same event times live at 1x as in `replay` of
the tee file (see test_decision_speed.py, the same claim at 60x and as fast as possible).

1x runs the trace's own length, so it gets its own short case: 2.7 minutes of trace with
2-second windows and a policy whose conditions hold for seconds, not minutes (burn-driven
and latency-driven entries, half-open, back to L0). Its own module, so that xdist runs it
beside the others.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.app.demo import DEMO_JOIN_TIMEOUT_MS
from pipeline.app.replay import replay_file
from pipeline.core.join import JoinConfig
from pipeline.core.windows import WindowConfig
from pipeline.settings import DEFAULT_SLO_SPEC
from pipeline.spec.policy import load_policy
from pipeline.spec.slo import load_spec_file
from producers.simulator.model import OverloadEpisode, SimConfig
from tests.integration.decisions import START_NS, demo_directives

pytestmark = [pytest.mark.integration, pytest.mark.long(185)]


# 1x: the trace's first 640 arrivals (~160 s) with arrivals x4 from 10 s to 40 s.
CONFIG_1X = SimConfig(start_unix_ns=START_NS, seed=3, overload=OverloadEpisode(10, 40, 4.0))
WINDOW_1X = WindowConfig(size_ms=2_000, grace_ms=1_000)
POLICY_1X = """
apiVersion: tailguard/v1
kind: ControlPolicy
levels:
  - level: 1
    enter:
      - {signal: p99.queue_ms, op: ">", value: 3000, for: 10s}
      - {signal: burn.page, is: true}
    exit: [{signal: p99.queue_ms, op: "<", value: 1000, for: 10s}]
    max_duration: 1h
    notify_customer: true
    actions: {shed_priorities_at_or_above: 3}
  - level: 2
    enter: [{signal: queue_saturation, op: ">", value: 50, for: 5m}]
    exit: [{signal: queue_saturation, op: "<", value: 40, for: 5m}]
    max_duration: 1h
    notify_customer: true
  - level: 3
    enter: [{signal: gpu_memory_fraction, op: ">", value: 0.999, for: 1m}]
    exit: [{signal: gpu_memory_fraction, op: "<", value: 0.99, for: 1m}]
    max_duration: 1h
    notify_customer: false
dynamics:
  min_dwell: 20s
  step_down: one
  half_open: {duration: 20s, admit_fraction: 0.25}
"""


def test_same_directives_live_at_1x_and_in_replay(kafka, tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY_1X)
    tee = tmp_path / "events.jsonl"
    live = demo_directives(
        kafka, tmp_path, "x1", 1.0, tee, sim_config=CONFIG_1X, limit=640, policy_file=policy,
        window_size_ms=WINDOW_1X.size_ms, window_grace_ms=WINDOW_1X.grace_ms,
    )  # fmt: skip
    replayed = replay_file(
        tee,
        JoinConfig(timeout_ms=DEMO_JOIN_TIMEOUT_MS),
        spec=load_spec_file(DEFAULT_SLO_SPEC),
        window_config=WINDOW_1X,
        policy=load_policy(POLICY_1X),
    )
    assert replayed.control is not None
    assert replayed.control.last is not None
    from_replay = [(d.scope, d.level, d.phase, d.now_ms) for d in replayed.control.decisions]
    # From the first degradation to 10 s before the input ends (the worker closes its
    # last windows by wall time once the input stops).
    end_ms = replayed.control.last.now_ms - 10_000
    first_ms = min((t for _, lv, _, t in from_replay if lv > 0), default=0)

    def core(xs: list) -> list:
        return [x for x in xs if first_ms <= x[3] <= end_ms]

    got = core(from_replay)
    assert {(lv, ph) for _, lv, ph, _ in got} >= {(1, "degraded"), (1, "half_open"), (0, "normal")}
    assert any("burn.page" in d.reason for d in replayed.control.decisions if d.level > 0)
    assert core(live) == got, f"\nlive 1x: {live}\nreplay: {from_replay}"
