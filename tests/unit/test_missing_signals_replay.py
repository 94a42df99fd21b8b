"""Issue 47 item 5 through the backtest core: the same simulated overload (the first 6000
requests of the shared trace, ~18 min, arrivals x4 from minute 2 to 7) fed to the
controller with (a) gateway events only, (b) gateway + ``engine.finished`` (no
``engine.stats``: engines without our plugin), (c) every event. The directives are
applied by the simulated gateways, as in ``tailguard backtest``.

The queue is measured on the simulator's own ``engine.stats`` (generated in every case,
fed to the pipeline only in (c)): it is *gone* at the end of the episode or at the last
sample with half a batch waiting after it, whichever is later.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import pytest

from pipeline.app.backtest import BACKTEST_JOIN, BACKTEST_WINDOW, BATCH_EVENTS
from pipeline.app.replay import _ControlRun
from pipeline.cli import BACKTEST_START_UNIX_NS, DEFAULT_TRACE
from pipeline.contract.codec import encode_event
from pipeline.core.processor import StreamProcessor
from pipeline.core.slo_windows import WindowSLOCounts
from pipeline.settings import DEFAULT_SLO_SPEC
from pipeline.spec.policy import DEFAULT_POLICY_PATH, load_policy_file
from pipeline.spec.slo import load_spec_file
from producers.simulator.gate import GatewayGate, directive_of
from producers.simulator.model import OverloadEpisode, SimConfig, Simulator
from producers.simulator.trace import read_trace

pytestmark = pytest.mark.long(30)

LIMIT = 6000
EPISODE_S = (120.0, 420.0)
GATEWAY_ONLY = frozenset({"engine.stats", "engine.finished"})
NO_STATS = frozenset({"engine.stats"})
EVERYTHING: frozenset[str] = frozenset()
START_MS = BACKTEST_START_UNIX_NS // 1_000_000


@dataclass
class Run:
    transitions: list[dict[str, Any]]
    notices: list[dict[str, Any]]
    queue_gone_s: dict[str, float] = field(default_factory=dict)


@cache
def _run(dropped: frozenset[str]) -> Run:
    """The tailguard loop over the short trace, with the event kinds ``dropped`` never
    reaching the pipeline (they still happen in the simulator)."""
    spec = load_spec_file(DEFAULT_SLO_SPEC)
    config = SimConfig(
        start_unix_ns=BACKTEST_START_UNIX_NS, seed=1, overload=OverloadEpisode(*EPISODE_S, 4.0)
    )
    wc = BACKTEST_WINDOW
    gate = GatewayGate()
    sim = Simulator(read_trace(DEFAULT_TRACE)[:LIMIT], config, gate)
    proc = StreamProcessor(
        "missing", BACKTEST_JOIN, window_config=wc, slo_factory=lambda: WindowSLOCounts(spec)
    )
    control = _ControlRun.build(  # the backtest's control loop (the worker's assembly)
        load_policy_file(DEFAULT_POLICY_PATH),
        spec,
        None,
        wc,
        queue_capacity=64,
        gateway_instances=len(config.gateway_hosts),
    )
    batch: list[tuple[int, int, bytes]] = []

    def step(final: bool = False) -> None:
        n = len(control.decisions)
        control.feed(proc.drain() if final else proc.process(batch, wall_ms=None))
        for d in control.decisions[n:]:
            gate.set(d.scope, directive_of(d.level, d.phase, d.actions, d.scope))
            if d.actions.queue_timeout_ms is not None:
                sim.apply_queue_cutoff(d.scope, d.actions.queue_timeout_ms, d.actions.retry_after_s)

    waiting: dict[str, dict[str, tuple[int, int]]] = {}
    deep_s: dict[str, float] = {}
    for offset, ev in enumerate(sim.events()):
        if ev.kind == "engine.stats":
            waiting.setdefault(ev.model, {})[ev.host] = (ev.num_waiting, ev.num_running)
            w = sum(x[0] for x in waiting[ev.model].values())
            running = sum(x[1] for x in waiting[ev.model].values())
            at_s = (ev.ts_unix_ns // 1_000_000 - START_MS) / 1000
            if at_s >= EPISODE_S[0] and running > 0 and w >= 0.5 * running:
                deep_s[ev.model] = at_s
        if ev.kind in dropped:
            continue
        batch.append((0, offset, encode_event(ev)))
        if len(batch) >= BATCH_EVENTS:
            step()
            batch = []
    if batch:
        step()
    step(final=True)
    gone = {m: max(EPISODE_S[1], deep_s.get(m, 0.0)) for m in waiting}
    return Run(control.transitions, control.notices, gone)


def _at_s(t: dict[str, Any]) -> float:
    return (t["ts_unix_ns"] // 1_000_000 - START_MS) / 1000


def _timeline(transitions: Iterable[dict[str, Any]], scope: str) -> list[tuple[float, int, str]]:
    return [(_at_s(t), t["level"], t["phase"]) for t in transitions if t["scope"] == scope]


CASES = [NO_STATS, EVERYTHING]
IDS = ["no-engine-stats", "all-events"]


@pytest.mark.parametrize("dropped", CASES, ids=IDS)
def test_enters_during_the_episode_and_is_back_at_l0_after_the_queue(
    dropped: frozenset[str],
) -> None:
    """Before issue 47 the stats-less run held L1, then L2, to the end of the run:
    "waiting for exit: queue.depth_ratio unknown"."""
    run = _run(dropped)
    for scope, gone_s in run.queue_gone_s.items():
        line = _timeline(run.transitions, scope)
        entered = [t for t, lv, _ in line if lv >= 1 and EPISODE_S[0] <= t < EPISODE_S[1]]
        assert entered, (scope, line)
        last_t, last_level, _ = line[-1]
        assert last_level == 0, (scope, line)
        assert last_t - gone_s <= 600, (scope, gone_s, line)  # the matrix's 10 minutes
        # no half-open or L0 inside the episode once entered (item 4)
        assert not [t for t, lv, ph in line if entered[0] < t < EPISODE_S[1] and ph != "degraded"]


def test_stats_less_reason_names_the_missing_signal() -> None:
    left = [t for t in _run(NO_STATS).transitions if t["phase"] == "half_open"]
    assert left
    for t in left:
        assert "queue.depth_ratio unknown since" in t["reason"], t["reason"]


@pytest.mark.parametrize("dropped", CASES, ids=IDS)
def test_back_at_l0_within_5_minutes_after_the_queue(dropped: frozenset[str]) -> None:
    run = _run(dropped)
    for scope, gone_s in run.queue_gone_s.items():
        last_t, last_level, _ = _timeline(run.transitions, scope)[-1]
        assert last_level == 0
        assert last_t - gone_s <= 300, (scope, gone_s, last_t)


def test_gateway_only_is_alerted_not_silent() -> None:
    """Gateway events only: no queue time, no engine stats, so whether a burn is
    load-caused cannot be told. No level opens (an unknown entry never fires); each
    model's burn during the episode is reported as a notice naming what is missing."""
    run = _run(GATEWAY_ONLY)
    assert [t for t in run.transitions if t["level"] > 0] == []
    noticed = {
        n["model"]
        for n in run.notices
        if EPISODE_S[0] <= (n["now_ms"] - START_MS) / 1000 < EPISODE_S[1]
        and "load-caused unknown: no engine events" in n["text"]
    }
    assert noticed == set(run.queue_gone_s)
