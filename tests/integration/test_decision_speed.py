"""Decisions are a function of the events, not of the processing speed: the same
simulated events give the same directives at the same event times whether the
worker sees them live at 1x, at 60x, as fast as possible, or `replay` reads the
tee file.

1x runs the trace's own length, so it gets its own short case: 2.7 minutes of
trace with 2-second windows and a policy whose conditions hold for seconds, not
minutes (burn-driven and latency-driven entries, half-open, back to L0). Open
loop: with the gateways applying directives, *when* a directive reaches them is
wall time, and so is the traffic that follows.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from pipeline.app.demo import DEMO_JOIN_TIMEOUT_MS, DEMO_WINDOW_GRACE_MS, run_demo
from pipeline.app.replay import replay_file
from pipeline.cli import DEFAULT_TRACE
from pipeline.core.join import JoinConfig
from pipeline.core.windows import WindowConfig
from pipeline.settings import DEFAULT_POLICY, DEFAULT_SLO_SPEC
from pipeline.spec.policy import load_policy, load_policy_file
from pipeline.spec.slo import load_spec_file
from producers.simulator.model import OverloadEpisode, SimConfig

pytestmark = [pytest.mark.integration, pytest.mark.long(290)]

START_NS = 1_800_000_000_000_000_000
CONFIG = SimConfig(start_unix_ns=START_NS, seed=3, overload=OverloadEpisode(120, 300, 2.5))
LIMIT = 4000  # ~12 min of traffic


def _ms(event_time: str) -> int:
    t = datetime.fromisoformat(event_time)
    t = t if t.tzinfo is not None else t.replace(tzinfo=UTC)
    return round(t.timestamp() * 1000)


def _demo(
    kafka, tmp: Path, name: str, speedup: float | None, tee: Path | None = None, **short: Any
) -> list:
    report = tmp / f"{name}.json"
    rc = run_demo(
        trace=DEFAULT_TRACE,
        sim_config=short.pop("sim_config", CONFIG),
        speedup=speedup,
        partitions=2,
        workdir=tmp / name,
        bootstrap=kafka.bootstrap_servers,
        limit=short.pop("limit", LIMIT),
        tee_jsonl=tee,
        json_out=report,
        closed_loop=False,
        settings_overrides=short or None,
    )
    assert rc == 0
    control = orjson.loads(report.read_bytes())["control"]
    return [(c["scope"], c["level"], c["phase"], _ms(c["event_time"])) for c in control]


def test_same_directives_at_60x_and_at_max_speed_and_in_replay(kafka, tmp_path: Path) -> None:
    tee = tmp_path / "events.jsonl"
    at_60x = _demo(kafka, tmp_path, "x60", 60.0, tee)
    at_max = _demo(kafka, tmp_path, "max", None)
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
    live = _demo(
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
