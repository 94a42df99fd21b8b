"""Control driven by unmodified vLLM's /metrics alone (issue 51): the simulated overload of
test_missing_signals_replay (the first 6000 requests of the shared trace, arrivals x4 from
minute 2 to 7), with NO plugin: no ``engine.finished``, and each engine's scheduler state
reaching the pipeline only as the text an unmodified vLLM serves on /metrics (its metric
names, types and labels), parsed by :mod:`producers.vllm_metrics` into ``engine.stats``.
The gateway events are the other input. The controller enters a level during the episode
and is back at L0 within 5 minutes after the queue is gone: without engine.finished, what
the engines serve is counted at the gateways (requests answered), so the demand ratio the
exit reads is measured. Before (issue 47), it was unknown and the level left only at its
max_duration: L1 at 130 s, L0 at 1120 s, the queue gone at 420 s."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import Any

import pytest

from pipeline.app.replay import _ControlRun
from pipeline.contract.events import EngineStats, Event
from pipeline.core.control import Controller, ControllerConfig, ControlLoop, DecisionClock
from pipeline.core.windows import WindowConfig
from pipeline.spec.burn_rules import load_burn_rules_file
from pipeline.spec.policy import DEFAULT_POLICY_PATH, load_policy_file
from pipeline.spec.slo import SLOSpec
from producers.vllm_metrics import ScrapeStats, parse_exposition
from tests.overload_replay import EPISODE_S, entered_and_left, replay_overload

pytestmark = pytest.mark.long(30)


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


def _control(spec: SLOSpec, wc: WindowConfig, gateway_instances: int) -> _ControlRun:
    controller = Controller(
        load_policy_file(DEFAULT_POLICY_PATH),
        spec,
        load_burn_rules_file(),
        ControllerConfig.for_windows(wc.size_ms, wc.grace_ms, gateway_instances=gateway_instances),
    )
    return _ControlRun(ControlLoop(controller, DecisionClock(wc.size_ms)), wc.relative_accuracy)


@cache
def _run() -> Run:
    scrapers: dict[str, ScrapeStats] = {}
    run = Run([])

    def fed(ev: Event) -> Event | None:
        if ev.kind == "engine.finished":
            return None  # no plugin
        if ev.kind != "engine.stats":
            return ev
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
        return scraped

    replayed = replay_overload("vllm-metrics", _control, fed)
    run.transitions = replayed.control.transitions
    run.queue_gone_s = replayed.queue_gone_s
    return run


def test_scraped_stats_carry_the_engines_state() -> None:
    run = _run()
    assert run.scraped > 1000
    assert run.scraped_events == run.plugin_events


def test_vllm_metrics_alone_enter_a_level_and_leave_it() -> None:
    run = _run()
    assert run.queue_gone_s
    for scope, gone_s in run.queue_gone_s.items():
        line, entered_t, last_t = entered_and_left(run.transitions, scope)
        assert last_t - gone_s <= 300, (scope, gone_s, line)  # back at L0 within 5 min
        # no half-open or L0 inside the episode once entered
        assert not [t for t, lv, ph in line if entered_t < t < EPISODE_S[1] and ph != "degraded"]
    left = [t for t in run.transitions if t["phase"] == "half_open"]
    assert left
    for t in left:
        # the exit read the demand (measured at the gateways) and the scraped queue...
        assert "load.demand_ratio < 0.9 for 2m" in t["reason"], t["reason"]
        assert "queue.depth_ratio < 0.5 for 2m" in t["reason"], t["reason"]
        # ...and says what it lacked
        assert "[no engine.finished: served counted at the gateways" in t["reason"], t["reason"]
