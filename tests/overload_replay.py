"""The simulated overload that the control tests replay (issues 47 and 51): the first 6000
requests of the shared trace (~18 min), arrivals x4 from minute 2 to 7, run through the
backtest's processor and a control loop whose directives the simulated gateways apply at
once; and when each model's engine queue is *gone*: at the end of the episode or at the
last ``engine.stats`` sample with half a batch waiting after it, whichever is later."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from pipeline.app.backtest import BACKTEST_JOIN, BACKTEST_WINDOW, Batch, in_batches
from pipeline.app.replay import _ControlRun
from pipeline.cli import BACKTEST_START_UNIX_NS, DEFAULT_TRACE
from pipeline.contract.events import Event
from pipeline.core.processor import StreamProcessor
from pipeline.core.slo_windows import WindowSLOCounts
from pipeline.core.windows import WindowConfig
from pipeline.settings import DEFAULT_SLO_SPEC
from pipeline.spec.slo import SLOSpec, load_spec_file
from producers.simulator.gate import GatewayGate, directive_of
from producers.simulator.model import OverloadEpisode, SimConfig, Simulator
from producers.simulator.trace import read_trace

LIMIT = 6000
EPISODE_S = (120.0, 420.0)
START_MS = BACKTEST_START_UNIX_NS // 1_000_000


def at_s(ts_unix_ns: int) -> float:
    """Seconds since the replay's start."""
    return (ts_unix_ns // 1_000_000 - START_MS) / 1000


def timeline(transitions: Iterable[dict[str, Any]], scope: str) -> list[tuple[float, int, str]]:
    """``scope``'s transitions as ``(seconds since the start, level, phase)``."""
    return [
        (at_s(t["ts_unix_ns"]), t["level"], t["phase"]) for t in transitions if t["scope"] == scope
    ]


def entered_and_left(
    transitions: Iterable[dict[str, Any]], scope: str
) -> tuple[list[tuple[float, int, str]], float, float]:
    """``scope``'s timeline, when it first entered a level during the episode and when it
    last changed; it must have entered one and ended at L0."""
    line = timeline(transitions, scope)
    entered = [t for t, lv, _ in line if lv >= 1 and EPISODE_S[0] <= t < EPISODE_S[1]]
    assert entered, (scope, line)
    last_t, last_level, _ = line[-1]
    assert last_level == 0, (scope, line)
    return line, entered[0], last_t


def back_at_l0_s(transitions: Iterable[dict[str, Any]], scope: str) -> float:
    """When ``scope`` was last back at L0 for good (0.0: it never left L0); it must end
    at L0."""
    line = timeline(transitions, scope)
    if not line:
        return 0.0
    last_t, last_level, _ = line[-1]
    assert last_level == 0, (scope, line)
    return last_t


@dataclass
class Replayed:
    control: _ControlRun
    queue_gone_s: dict[str, float]


def replay_overload(
    name: str,
    build_control: Callable[[SLOSpec, WindowConfig, int], _ControlRun],
    fed: Callable[[Event], Event | None],
) -> Replayed:
    """The overload replayed into the control loop ``build_control(spec, window,
    gateway_instances)`` makes; each simulated event reaches the pipeline as ``fed(event)``
    (``None``: never reaches it; the queue is measured on the simulator's own events)."""
    spec = load_spec_file(DEFAULT_SLO_SPEC)
    config = SimConfig(
        start_unix_ns=BACKTEST_START_UNIX_NS, seed=1, overload=OverloadEpisode(*EPISODE_S, 4.0)
    )
    wc = BACKTEST_WINDOW
    gate = GatewayGate()
    sim = Simulator(read_trace(DEFAULT_TRACE)[:LIMIT], config, gate)
    proc = StreamProcessor(
        name, BACKTEST_JOIN, window_config=wc, slo_factory=lambda: WindowSLOCounts(spec)
    )
    control = build_control(spec, wc, len(config.gateway_hosts))

    def step(batch: Batch | None) -> None:
        n = len(control.decisions)
        control.feed(proc.drain() if batch is None else proc.process(batch, wall_ms=None))
        for d in control.decisions[n:]:
            gate.set(d.scope, directive_of(d.level, d.phase, d.actions, d.scope))
            if d.actions.queue_timeout_ms is not None:
                sim.apply_queue_cutoff(d.scope, d.actions.queue_timeout_ms, d.actions.retry_after_s)

    waiting: dict[str, dict[str, tuple[int, int]]] = {}
    deep_s: dict[str, float] = {}

    def events() -> Iterator[tuple[int, Event]]:
        for offset, ev in enumerate(sim.events()):
            if ev.kind == "engine.stats":
                waiting.setdefault(ev.model, {})[ev.host] = (ev.num_waiting, ev.num_running)
                w = sum(x[0] for x in waiting[ev.model].values())
                running = sum(x[1] for x in waiting[ev.model].values())
                t_s = at_s(ev.ts_unix_ns)
                if t_s >= EPISODE_S[0] and running > 0 and w >= 0.5 * running:
                    deep_s[ev.model] = t_s
            out = fed(ev)
            if out is not None:
                yield offset, out

    for batch in in_batches(events()):
        step(batch)
    step(None)
    gone = {m: max(EPISODE_S[1], deep_s.get(m, 0.0)) for m in waiting}
    return Replayed(control, gone)
