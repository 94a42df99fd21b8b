"""Control driven by unmodified vLLM's /metrics alone (issue 51): the simulated overload of
test_missing_signals_replay (the first 6000 requests of the shared trace, arrivals x4 from
minute 2 to 7), with NO plugin: no ``engine.finished``, and each engine's scheduler state
reaching the pipeline only as the text an unmodified vLLM serves on /metrics (its metric
names, types and labels), parsed by :mod:`producers.vllm_metrics` into ``engine.stats``.
The gateway events are the other input. The controller enters a level during the episode
and is back at L0 after it (at the level's max_duration: without engine.finished, what the
engines serve is unknown; the plugin's events would end it 2 minutes after the queue)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import Any

import pytest

from pipeline.app.backtest import BACKTEST_JOIN, BACKTEST_WINDOW, BATCH_EVENTS
from pipeline.app.replay import _ControlRun
from pipeline.cli import BACKTEST_START_UNIX_NS, DEFAULT_TRACE
from pipeline.contract.codec import encode_event
from pipeline.contract.events import EngineStats
from pipeline.core.control import Controller, ControllerConfig, ControlLoop, DecisionClock
from pipeline.core.processor import StreamProcessor
from pipeline.core.slo_windows import WindowSLOCounts
from pipeline.settings import DEFAULT_SLO_SPEC
from pipeline.spec.burn_rules import load_burn_rules_file
from pipeline.spec.policy import DEFAULT_POLICY_PATH, load_policy_file
from pipeline.spec.slo import load_spec_file
from producers.simulator.gate import GatewayGate, directive_of
from producers.simulator.model import OverloadEpisode, SimConfig, Simulator
from producers.simulator.trace import read_trace
from producers.vllm_metrics import ScrapeStats, parse_exposition

pytestmark = pytest.mark.long(30)

LIMIT = 6000
EPISODE_S = (120.0, 420.0)
START_MS = BACKTEST_START_UNIX_NS // 1_000_000


def vllm_metrics_text(ev: EngineStats, preemptions: int) -> str:
    """What an unmodified vLLM (V1 engine, one engine) serves on /metrics for the
    scheduler state ``ev`` carries (names, HELP, types and labels as vLLM writes them)."""
    labels = f'{{engine="0",model_name="{ev.model}"}}'
    return (
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        f"vllm:num_requests_running{labels} {float(ev.num_running)}\n"
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        f"vllm:num_requests_waiting{labels} {float(ev.num_waiting)}\n"
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        f"vllm:kv_cache_usage_perc{labels} {ev.kv_cache_usage}\n"
        "# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.\n"
        "# TYPE vllm:num_preemptions_total counter\n"
        f"vllm:num_preemptions_total{labels} {float(preemptions)}\n"
    )


@dataclass
class Run:
    transitions: list[dict[str, Any]]
    scraped: int = 0
    plugin_events: list[tuple[str, int, int, int]] = field(default_factory=list)
    scraped_events: list[tuple[str, int, int, int]] = field(default_factory=list)
    queue_gone_s: dict[str, float] = field(default_factory=dict)


@cache
def _run() -> Run:
    spec = load_spec_file(DEFAULT_SLO_SPEC)
    config = SimConfig(
        start_unix_ns=BACKTEST_START_UNIX_NS, seed=1, overload=OverloadEpisode(*EPISODE_S, 4.0)
    )
    wc = BACKTEST_WINDOW
    gate = GatewayGate()
    sim = Simulator(read_trace(DEFAULT_TRACE)[:LIMIT], config, gate)
    proc = StreamProcessor(
        "vllm-metrics", BACKTEST_JOIN, window_config=wc,
        slo_factory=lambda: WindowSLOCounts(spec),
    )  # fmt: skip
    controller = Controller(
        load_policy_file(DEFAULT_POLICY_PATH),
        spec,
        load_burn_rules_file(),
        ControllerConfig.for_windows(
            wc.size_ms, wc.grace_ms, gateway_instances=len(config.gateway_hosts)
        ),
    )
    control = _ControlRun(ControlLoop(controller, DecisionClock(wc.size_ms)), wc.relative_accuracy)
    scrapers: dict[str, ScrapeStats] = {}
    run = Run(control.transitions)
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
        if ev.kind == "engine.finished":
            continue  # no plugin
        if ev.kind == "engine.stats":
            waiting.setdefault(ev.model, {})[ev.host] = (ev.num_waiting, ev.num_running)
            w = sum(x[0] for x in waiting[ev.model].values())
            running = sum(x[1] for x in waiting[ev.model].values())
            at_s = (ev.ts_unix_ns // 1_000_000 - START_MS) / 1000
            if at_s >= EPISODE_S[0] and running > 0 and w >= 0.5 * running:
                deep_s[ev.model] = at_s
            # the engine's state reaches us only as its /metrics text, scraped
            conv = scrapers.setdefault(ev.host, ScrapeStats(ev.host))
            (scraped,) = conv.events(
                parse_exposition(vllm_metrics_text(ev, run.scraped)), ev.ts_unix_ns
            )
            run.scraped += 1
            run.plugin_events.append((ev.host, ev.num_running, ev.num_waiting, ev.ts_unix_ns))
            run.scraped_events.append(
                (scraped.host, scraped.num_running, scraped.num_waiting, scraped.ts_unix_ns)
            )
            ev = scraped  # noqa: PLW2901
        batch.append((0, offset, encode_event(ev)))
        if len(batch) >= BATCH_EVENTS:
            step()
            batch = []
    if batch:
        step()
    step(final=True)
    run.queue_gone_s = {m: max(EPISODE_S[1], deep_s.get(m, 0.0)) for m in waiting}
    return run


def _timeline(transitions: list[dict[str, Any]], scope: str) -> list[tuple[float, int, str]]:
    return [
        ((t["ts_unix_ns"] // 1_000_000 - START_MS) / 1000, t["level"], t["phase"])
        for t in transitions
        if t["scope"] == scope
    ]


def test_scraped_stats_carry_the_engines_state() -> None:
    run = _run()
    assert run.scraped > 1000
    assert run.scraped_events == run.plugin_events


def test_vllm_metrics_alone_enter_a_level_and_leave_it() -> None:
    run = _run()
    assert run.queue_gone_s
    for scope, gone_s in run.queue_gone_s.items():
        line = _timeline(run.transitions, scope)
        entered = [t for t, lv, _ in line if lv >= 1 and EPISODE_S[0] <= t < EPISODE_S[1]]
        assert entered, (scope, line)
        last_t, last_level, _ = line[-1]
        assert last_level == 0, (scope, line)
        # The queue signals come back to normal with the engines' queues, but without
        # engine.finished what the engines serve is unknown (load.demand_ratio): the level
        # is left at its max_duration (15 min), then half-open (90 s), not 2 min after.
        assert last_t - entered[0] <= 15 * 60 + 90 + 10, (scope, gone_s, line)
        assert last_t > gone_s
    left = [t for t in run.transitions if t["phase"] == "half_open"]
    assert left
    assert all("load.demand_ratio unknown" in t["reason"] for t in left)
    assert all("queue.depth_ratio < 0.5 for 2m" in t["reason"] for t in left)
