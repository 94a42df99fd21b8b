"""``tailguard backtest``: would this policy have saved the SLO, and at what cost?

One trace runs through the serving simulator twice with the same seed:

* **open loop**: the pipeline measures and the policy decides, but nobody
  applies the directives (what happens today without tailguard's control);
* **closed loop**: the simulated gateways apply every directive as it is
  issued (:class:`producers.simulator.gate.GatewayGate`: shed per priority with
  429 + Retry-After, context caps, new-session rejection, token-bucket rate
  limits, fallback model, half-open admission), and clients retry rejected
  requests with exponential backoff (at most 3 times).

Both runs use the same core as the worker and ``replay`` (join, windows, SLO
counts, the controller and its decision clock), in event time, in process:
a decision made at event time T reaches the gateways as soon as the
simulator's clock is past it, i.e. after the windows up to T closed (the
window grace), as it would through the control topic.

``RUN = {"requests", "slos": {name: {"total", "good", "compliance",
"budget_consumed"}}, "shed": {priority: count}, "capped": {priority: count},
"time_at_level_s": {level: s}, "control": [{"ts_unix_ns", "scope", "level",
"phase", "reason"}], "by_priority": {...}, "episode": {...}}``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.contract.codec import encode_event
from pipeline.core.control import (
    Controller,
    ControllerConfig,
    ControlLoop,
    DecisionClock,
)
from pipeline.core.join import JoinConfig
from pipeline.core.processor import StreamProcessor
from pipeline.core.record import RequestRecord
from pipeline.core.slo import SLOEvaluator
from pipeline.core.slo_windows import WindowSLOCounts
from pipeline.core.windows import WindowConfig
from pipeline.replay import ReplayResult, _ControlRun
from pipeline.spec.burn_rules import BurnRules, load_burn_rules_file
from pipeline.spec.policy import ControlPolicy
from pipeline.spec.slo import SLOSpec
from producers.simulator.gate import GateActions, GatewayGate
from producers.simulator.model import SimConfig, Simulator
from producers.simulator.trace import TraceRequest

BACKTEST_WINDOW = WindowConfig(grace_ms=5_000)
BACKTEST_JOIN = JoinConfig(timeout_ms=5_000)
BATCH_EVENTS = 100  # events per processing step (a few seconds of simulated time)
EPISODE_BOUNDARIES = ("gateway_ttfb_ms", "ttft_engine_ms", "queue_ms", "gateway_total_ms")


@dataclass(frozen=True, slots=True)
class Backtest:
    open_loop: dict[str, Any]
    closed_loop: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"open_loop": self.open_loop, "closed_loop": self.closed_loop}


def run_backtest(
    trace: Sequence[TraceRequest],
    config: SimConfig,
    spec: SLOSpec,
    policy: ControlPolicy,
    burn_rules: BurnRules | None = None,
) -> Backtest:
    return Backtest(
        open_loop=run_loop(trace, config, spec, policy, burn_rules, closed=False),
        closed_loop=run_loop(trace, config, spec, policy, burn_rules, closed=True),
    )


def run_loop(
    trace: Sequence[TraceRequest],
    config: SimConfig,
    spec: SLOSpec,
    policy: ControlPolicy,
    burn_rules: BurnRules | None = None,
    *,
    closed: bool,
    queue_capacity: int = 64,
) -> dict[str, Any]:
    wc = BACKTEST_WINDOW
    gate = GatewayGate() if closed else None
    sim = Simulator(trace, config, gate)
    proc = StreamProcessor(
        "backtest",
        BACKTEST_JOIN,
        window_config=wc,
        slo_factory=lambda: WindowSLOCounts(spec),
    )
    result = ReplayResult(spec, wc.relative_accuracy, queue_capacity=queue_capacity)
    controller = Controller(
        policy,
        spec,
        burn_rules or load_burn_rules_file(),
        ControllerConfig.for_windows(wc.size_ms, wc.grace_ms, queue_capacity=queue_capacity),
    )
    control = _ControlRun(ControlLoop(controller, DecisionClock(wc.size_ms)), wc.relative_accuracy)
    result.control = control
    batch: list[tuple[int, int, bytes]] = []

    def step(final: bool = False) -> None:
        n_before = len(control.decisions)
        out = proc.drain() if final else proc.process(batch, wall_ms=None)
        result._take(out)
        control.feed(out)
        if gate is not None:
            for d in control.decisions[n_before:]:
                gate.set(d.scope, GateActions.of(d.level, d.phase, d.actions))

    for offset, ev in enumerate(sim.events()):
        batch.append((0, offset, encode_event(ev)))
        if len(batch) >= BATCH_EVENTS:
            step()
            batch = []
    if batch:
        step()
    step(final=True)
    return _run_json(result, control, gate, sim, config, spec)


def _p99(values: list[float]) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(int(0.99 * len(s)), len(s) - 1)]


def _time_at_level(control: _ControlRun, end_ms: int | None) -> dict[str, float]:
    """Seconds during which the highest level over all scopes was 0, 1, 2, 3."""
    out = {str(lv): 0.0 for lv in range(4)}
    if end_ms is None or control.loop.clock.first_end_ms is None:
        return out
    t0 = control.loop.clock.first_end_ms
    levels: dict[str, int] = {}
    t_prev = t0
    for tr in sorted(control.transitions, key=lambda x: x["ts_unix_ns"]):
        t = tr["ts_unix_ns"] // 1_000_000
        out[str(max(levels.values(), default=0))] += (t - t_prev) / 1000.0
        levels[tr["scope"]] = tr["level"]
        t_prev = t
    out[str(max(levels.values(), default=0))] += max(0, end_ms - t_prev) / 1000.0
    return out


def _run_json(  # noqa: PLR0917
    result: ReplayResult,
    control: _ControlRun,
    gate: GatewayGate | None,
    sim: Simulator,
    config: SimConfig,
    spec: SLOSpec,
) -> dict[str, Any]:
    summary = result.summary()
    slos: dict[str, Any] = {}
    objectives = {s.name: s.objective for s in spec.slos}
    for name, v in summary.get("slos", {}).items():
        allowed = (1 - objectives.get(name, 0.99)) * v["total"]
        bad = v["total"] - v["good"]
        slos[name] = {**v, "budget_consumed": (bad / allowed) if allowed > 0 else None}
    records = list(result.records.values())
    by_priority: dict[str, Any] = {}
    for prio in range(4):
        rs = [r for r in records if r.priority == prio]
        ev = SLOEvaluator(spec)
        for r in rs:
            ev.add(r)
        doc = ev.to_json()["slos"]
        by_priority[str(prio)] = {
            "requests": len(rs),
            "ok": sum(1 for r in rs if r.outcome == "ok"),
            "rejected": sum(1 for r in rs if r.outcome == "rejected"),
            "slos": {n: v["compliance"] for n, v in doc.items()},
        }
    last = control.last
    out: dict[str, Any] = {
        "loop": "closed" if gate is not None else "open",
        "start_unix_ns": config.start_unix_ns,  # trace offset 0
        "requests": summary["requests"],
        "outcomes": summary["outcomes"],
        "retries": sim.retries,
        "slos": slos,
        "shed": {str(k): v for k, v in (gate.shed_by_priority() if gate else {}).items()},
        "shed_by_reason": (
            {f"{p}:{why}": n for (p, why), n in sorted(gate.rejected.items())} if gate else {}
        ),
        "capped": {str(k): v for k, v in sorted(gate.capped.items())} if gate else {},
        "half_open_admitted": gate.half_open_admitted if gate else 0,
        "time_at_level_s": _time_at_level(control, last.now_ms if last else None),
        "control": control.transitions,
        "by_priority": by_priority,
    }
    ep = config.overload
    if ep is not None:
        start_ns = config.start_unix_ns
        out["episode"] = {
            "start_s": ep.start_offset_s,
            "end_s": ep.end_offset_s,
            "factor": ep.factor,
            "during": _p99s(records, start_ns, ep.start_offset_s, ep.end_offset_s),
            "after_15m": _p99s(records, start_ns, ep.end_offset_s, ep.end_offset_s + 900),
            "priority_0_during": _p99s(
                [r for r in records if r.priority == 0],
                start_ns,
                ep.start_offset_s,
                ep.end_offset_s,
            ),
        }
    return out


def _p99s(records: list[RequestRecord], start_ns: int, lo_s: float, hi_s: float) -> dict[str, Any]:
    lo, hi = start_ns + int(lo_s * 1e9), start_ns + int(hi_s * 1e9)
    rs = [r for r in records if lo <= r.ts_unix_ns < hi and r.outcome == "ok"]
    out: dict[str, Any] = {"requests_ok": len(rs)}
    for b in EPISODE_BOUNDARIES:
        vals = [
            v
            for r in rs
            if (v := r.boundary(b)) is not None and (b != "gateway_ttfb_ms" or r.stream)
        ]
        out[f"p99.{b}"] = _p99(vals)
    return out


# --------------------------------------------------------------------------- #
# Text rendering (side by side)
# --------------------------------------------------------------------------- #


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f} %"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f} ms"


def render_text(bt: Backtest) -> str:
    """The open and the closed loop side by side (plain text, for a terminal or a README)."""
    o, c = bt.open_loop, bt.closed_loop
    rows: list[tuple[str, str, str]] = [
        ("requests (retries included)", f"{o['requests']:,}", f"{c['requests']:,}"),
        ("client retries after 429", f"{o['retries']:,}", f"{c['retries']:,}"),
    ]
    rows.append(("SLO compliance (budget consumed)", "", ""))
    for name in o["slos"]:
        a, b = o["slos"][name], c["slos"].get(name, {})

        def cell(v: dict[str, Any]) -> str:
            used = v.get("budget_consumed")
            return f"{_pct(v.get('compliance'))} ({'-' if used is None else f'{used:.1f}x'})"

        rows.append((f"  {name}", cell(a), cell(b)))
    rows.append(("priority 0 compliance", "", ""))
    for name in o["slos"]:
        a0 = o["by_priority"]["0"]["slos"].get(name)
        b0 = c["by_priority"]["0"]["slos"].get(name)
        if a0 is not None or b0 is not None:
            rows.append((f"  {name}", _pct(a0), _pct(b0)))
    rows.append(("time at level (max over models)", "", ""))
    for lv in ("0", "1", "2", "3"):
        rows.append(
            (
                f"  L{lv}",
                f"{o['time_at_level_s'][lv] / 60:.1f} min",
                f"{c['time_at_level_s'][lv] / 60:.1f} min",
            )
        )
    rows.append(("rejected (429) per priority", "", ""))
    for p in ("0", "1", "2", "3"):
        rows.append((f"  priority {p}", str(o["shed"].get(p, 0)), str(c["shed"].get(p, 0))))
    rows.append(("context capped per priority", "", ""))
    for p in ("0", "1", "2", "3"):
        rows.append((f"  priority {p}", str(o["capped"].get(p, 0)), str(c["capped"].get(p, 0))))
    if "episode" in o:
        ep = o["episode"]
        rows.append(
            (
                f"P99 during the episode {ep['start_s']:g}-{ep['end_s']:g} s x{ep['factor']:g}",
                "",
                "",
            )
        )
        for b in EPISODE_BOUNDARIES:
            rows.append(
                (f"  {b}", _ms(ep["during"][f"p99.{b}"]), _ms(c["episode"]["during"][f"p99.{b}"]))
            )
        rows.append(("P99 in the 15 min after it", "", ""))
        for b in EPISODE_BOUNDARIES:
            rows.append(
                (
                    f"  {b}",
                    _ms(ep["after_15m"][f"p99.{b}"]),
                    _ms(c["episode"]["after_15m"][f"p99.{b}"]),
                )
            )
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in [*rows, ("", "open loop", "")])
    lines = [f"{'':<{w0}}  {'open loop':>{w1}}  closed loop"]
    lines += [f"{a:<{w0}}  {b:>{w1}}  {cc}" for a, b, cc in rows]
    for title, run in (("open loop", o), ("closed loop", c)):
        lines.append(f"\ncontrol, {title} ({'applied' if run is c else 'decided, not applied'}):")
        for t in run["control"]:
            lines.append(
                f"  t={(t['ts_unix_ns'] - run['start_unix_ns']) / 1e9:5.0f} s  {t['scope']:<12} "
                f"L{t['level']} "
                f"{t['phase']:<9} {t['reason'][:110]}"
            )
    return "\n".join(lines)
