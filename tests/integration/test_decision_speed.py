"""Decisions are a function of the events, not of the processing speed: the same
simulated events give the same directives at the same event times whether the
worker sees them at 60x, as fast as possible, or `replay` reads the tee file.

(Live 1x is the 60x case stretched: it is not run here, it would take the trace's
own length. Open loop: with the gateways applying directives, *when* a directive
reaches them is wall time, and so is the traffic that follows.)
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest

from pipeline.cli import DEFAULT_TRACE
from pipeline.core.join import JoinConfig
from pipeline.core.policy import load_policy_file
from pipeline.core.slo import load_spec_file
from pipeline.core.windows import WindowConfig
from pipeline.demo import DEMO_JOIN_TIMEOUT_MS, DEMO_WINDOW_GRACE_MS, run_demo
from pipeline.replay import replay_file
from pipeline.settings import DEFAULT_POLICY, DEFAULT_SLO_SPEC
from producers.simulator.model import OverloadEpisode, SimConfig

pytestmark = pytest.mark.integration

START_NS = 1_800_000_000_000_000_000
CONFIG = SimConfig(start_unix_ns=START_NS, seed=3, overload=OverloadEpisode(120, 300, 2.5))
LIMIT = 4000  # ~12 min of traffic


def _ms(event_time: str) -> int:
    t = datetime.fromisoformat(event_time)
    t = t if t.tzinfo is not None else t.replace(tzinfo=UTC)
    return round(t.timestamp() * 1000)


def _demo(kafka, tmp: Path, name: str, speedup: float | None, tee: Path | None = None) -> list:
    report = tmp / f"{name}.json"
    rc = run_demo(
        trace=DEFAULT_TRACE,
        sim_config=CONFIG,
        speedup=speedup,
        partitions=2,
        workdir=tmp / name,
        bootstrap=kafka.bootstrap_servers,
        limit=LIMIT,
        tee_jsonl=tee,
        json_out=report,
        closed_loop=False,
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
