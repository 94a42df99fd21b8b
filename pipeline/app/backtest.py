"""``tailguard backtest``: would this policy have saved the SLOs, and at what cost,
beside doing nothing and beside an established adaptive limiter?

One trace runs through the serving simulator once per *loop*, with the same seed:

* ``open``: the pipeline measures and the policy decides, nobody applies it (no control);
* ``static``: the static levels shipped before capacity-aware admission
  (``specs/policy-static-levels.yaml``: shed whole priorities, a constant rate limit,
  no load gate), applied by the simulated gateways;
* ``aimd``: no directive at all; each gateway runs an AIMD concurrency limit per model
  (Netflix concurrency-limits' ``AIMDLimit``; :class:`producers.simulator.baselines.AIMDGate`);
* ``tailguard``: the policy under test (by default the shipped one: load-gated,
  capacity-aware admission by priority), applied by the simulated gateways
  (:class:`producers.simulator.gate.GatewayGate`).

Clients retry a 429 with exponential backoff (at most 3 times) in every loop. The
engines schedule FCFS unless ``--scheduling priority`` (vLLM's
``--scheduling-policy priority``); the output says which.

Every loop uses the same core as the worker and ``replay`` (join, windows, SLO counts,
the controller and its decision clock), in event time, in process. A decision made at
event time T (its evidence: the windows up to T) reaches the simulated gateways at the
first arrival at or after T + ``loop_delay_ms`` (``--loop-delay``; default
:data:`DEFAULT_LOOP_DELAY_MS`, the live loop's P99 measured by ``./tg bench``), and
never before the in-process loop made it (after the windows up to T closed: the window
grace and a batch of events). Live, a directive travels engine -> Kafka -> worker ->
window close -> summary -> controller -> control topic -> gateway; the delay stands for
that trip. ``--loop-delay 0``: as soon as the loop decided. The loop that decides is the
same either way; only when the gates get it changes. ``RUN["loop_delay"]``: the delays
the gates saw (:class:`producers.loop_delay.LoopDelay`: arrival time - T, event time).

``RUN = {"loop", "requests", "retries", "slos": {name: {"total", "good", "compliance",
"budget_consumed"}}, "goodput_rps", "shed", "time_at_level_s", "control", "by_priority":
{p: {"requests", "ok", "rejected", "slos", "episode_slos", "episode_attempts",
"episode_turned_away", "goodput_rps"}}, "episode":
{..., "first_action_s", "back_at_l0_s", "levels_before", "goodput_rps"}, "notices",
"logical": {"all", "by_priority", "episode", "episode_by_priority"}}``. A request is
*good* (goodput) when it was served (``ok``) and every SLO that counts it calls it good.

Every count above is per attempt (a retry is a request). ``logical`` counts what users
saw: each logical request once, by its final attempt's outcome and the latency the client
saw from its first attempt, with the requests never served -- the rule of
:mod:`pipeline.core.logical`, over the run's joined records (the simulated gateways
record each retry's ``client_attempt`` and ``logical_request_id``), as ``tailguard
report`` applies it to the store.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Final

from pipeline.app.figures import figure, percent
from pipeline.app.replay import ReplayResult, _ControlRun
from pipeline.contract.codec import encode_event
from pipeline.contract.events import Event
from pipeline.core.join import JoinConfig
from pipeline.core.logical import LogicalRequest, logical_requests
from pipeline.core.logical import counts as logical_counts
from pipeline.core.processor import StreamProcessor
from pipeline.core.record import RequestRecord
from pipeline.core.slo import SLOEvaluator, SLOMatcher
from pipeline.core.slo_windows import WindowSLOCounts
from pipeline.core.windows import WindowConfig
from pipeline.spec.burn_rules import BurnRules
from pipeline.spec.policy import ControlPolicy
from pipeline.spec.slo import SLO, SLOSpec
from producers.simulator.gate import GatewayGate, directive_of, nonstream_budget_ms
from producers.simulator.model import OverloadEpisode, SimConfig, Simulator
from producers.simulator.trace import TraceRequest

BACKTEST_WINDOW = WindowConfig(grace_ms=5_000)
BACKTEST_JOIN = JoinConfig(timeout_ms=5_000)
BATCH_EVENTS = 100  # events per processing step (a few seconds of simulated time)
Batch = list[tuple[int, int, bytes]]  # the processor's input: (partition, offset, message)
EPISODE_BOUNDARIES = ("gateway_ttfb_ms", "ttft_engine_ms", "queue_ms", "gateway_total_ms")
# The live loop's delay, evidence (the end of the window a decision read) to the
# directive in force at a gateway, in event time: the P99 in real time (1x: a deployment's
# delay) of the bench section "Control loop delay, live (the demo's closed loop)" in
# bench/RESULTS.md (`./tg bench --only loop_delay`): 5.58 s over 44 decisions (P50
# 3.58 s), measured 2026-12-06 05:35-05:44 UTC on the shared 2-core machine (load
# average 4-9; again 2026-12-06 21:31 UTC: P50 3.45 s, P99 5.91 s over 47). The demo's
# time-compressed runs are slower in event time, up to its pacer's bound (30 s:
# pipeline.app.demo._Pacer; the same bench: 20x P50 21.4 s / P99 26.5 s, 60x P50 20.9 s
# / P99 29.5 s; wider on a busy machine, where the pacer widens its bound): a backtest of
# a demo run takes that run's own P99 (its --json "loop_delay"), as
# tools.dev.demo_vs_backtest is run (bench/CONTROL-HISTORY.md).
DEFAULT_LOOP_DELAY_MS: Final = 5_600


LOOPS: Final = ("open", "static", "aimd", "tailguard")
LOOP_TITLES: Final = {
    "open": "no control",
    "static": "static levels",
    "aimd": "AIMD limiter",
    "tailguard": "tailguard",
}


@dataclass(frozen=True, slots=True)
class Backtest:
    runs: dict[str, dict[str, Any]]  # loop name -> RUN, in LOOPS order
    scheduling: str = "fcfs"

    @property
    def open_loop(self) -> dict[str, Any] | None:
        return self.runs.get("open")

    @property
    def closed_loop(self) -> dict[str, Any] | None:
        return self.runs.get("tailguard")

    def to_json(self) -> dict[str, Any]:
        """``{"scheduling", "loops", "runs": {loop: RUN}}``, plus ``open_loop`` and
        ``closed_loop`` (the ``open`` and ``tailguard`` runs) when they ran."""
        doc: dict[str, Any] = {
            "scheduling": self.scheduling,
            "loops": list(self.runs),
            "runs": self.runs,
        }
        if self.open_loop is not None:
            doc["open_loop"] = self.open_loop
        if self.closed_loop is not None:
            doc["closed_loop"] = self.closed_loop
        return doc


def run_backtest(
    trace: Sequence[TraceRequest],
    config: SimConfig,
    spec: SLOSpec,
    policy: ControlPolicy,
    burn_rules: BurnRules | None = None,
    *,
    static_policy: ControlPolicy | None = None,
    loops: Sequence[str] = LOOPS,
    window_s: tuple[float, float] | None = None,
    loop_delay_ms: int = DEFAULT_LOOP_DELAY_MS,
) -> Backtest:
    """Each of ``loops`` over the same trace and seed (see the module docstring).

    ``window_s``: (start, end) trace offsets measured as the episode when the config
    has no overload episode (one already in the trace, e.g. ``make_trace --shape
    burst``'s); ignored when it has one. ``loop_delay_ms``: a directive reaches the
    gates this long after its evidence (module docstring)."""
    runs: dict[str, dict[str, Any]] = {}
    for loop in loops:
        if loop == "static":
            if static_policy is None:
                from pipeline.shipped import STATIC_POLICY
                from pipeline.spec.policy import load_policy_file

                static_policy = load_policy_file(STATIC_POLICY)
            runs[loop] = run_loop(
                trace,
                config,
                spec,
                static_policy,
                burn_rules,
                loop=loop,
                window_s=window_s,
                loop_delay_ms=loop_delay_ms,
            )
        else:
            runs[loop] = run_loop(
                trace,
                config,
                spec,
                policy,
                burn_rules,
                loop=loop,
                window_s=window_s,
                loop_delay_ms=loop_delay_ms,
            )
    return Backtest(runs, scheduling=getattr(config, "scheduling", "fcfs"))


def run_loop(
    trace: Sequence[TraceRequest],
    config: SimConfig,
    spec: SLOSpec,
    policy: ControlPolicy,
    burn_rules: BurnRules | None = None,
    *,
    loop: str = "tailguard",
    queue_capacity: int = 64,
    window_s: tuple[float, float] | None = None,
    loop_delay_ms: int = DEFAULT_LOOP_DELAY_MS,
) -> dict[str, Any]:
    if loop not in LOOPS:
        raise ValueError(f"unknown loop {loop!r} (one of {', '.join(LOOPS)})")
    if loop_delay_ms < 0:
        raise ValueError(f"loop_delay_ms must be >= 0, got {loop_delay_ms}")
    wc = BACKTEST_WINDOW
    gate: GatewayGate | None
    if loop in ("static", "tailguard"):
        gate = GatewayGate(nonstream_budget_ms=nonstream_budget_ms(spec))
    elif loop == "aimd":
        from producers.simulator.baselines import AIMDGate

        gate = AIMDGate()
    else:
        gate = None
    applies = loop in ("static", "tailguard")
    sim = Simulator(trace, config, gate)
    proc = StreamProcessor(
        "backtest",
        BACKTEST_JOIN,
        window_config=wc,
        slo_factory=lambda: WindowSLOCounts(spec),
    )
    result = ReplayResult(spec, wc.relative_accuracy, queue_capacity=queue_capacity)
    control = _ControlRun.build(
        policy,
        spec,
        burn_rules,
        wc,
        queue_capacity=queue_capacity,
        gateway_instances=len(config.gateway_hosts),
    )
    result.control = control

    def step(batch: Batch | None) -> None:
        n_before = len(control.decisions)
        out = proc.drain() if batch is None else proc.process(batch, wall_ms=None)
        result._take(out)
        control.feed(out)
        if applies and gate is not None:
            # in force from the first arrival at or after evidence + delay (the simulator
            # applies it there, the queue cut-off to what was forwarded before included)
            for d in control.decisions[n_before:]:
                directive = directive_of(d.level, d.phase, d.actions, d.scope, d.now_ms)
                gate.deliver(d.scope, directive, d.now_ms + loop_delay_ms)

    for batch in in_batches(enumerate(sim.events())):
        step(batch)
    step(None)  # the last windows, drained
    ep = config.overload
    if ep is None and window_s is not None:
        # measured as an episode, nothing replicated: the trace has its own
        ep = OverloadEpisode(window_s[0], window_s[1], factor=1.0, shape="step")
    doc = _run_json(
        result, control, gate if applies or loop == "aimd" else None, sim, config, spec, ep
    )
    doc["loop"] = loop
    if applies and gate is not None:
        doc["loop_delay"] = {"set_ms": loop_delay_ms, **gate.loop_delay.summary()}
    return doc


def in_batches(events: Iterable[tuple[int, Event]]) -> Iterator[Batch]:
    """``(offset, event)`` pairs as the processor's input, encoded, :data:`BATCH_EVENTS`
    to a batch (the last one shorter)."""
    batch: Batch = []
    for offset, ev in events:
        batch.append((0, offset, encode_event(ev)))
        if len(batch) >= BATCH_EVENTS:
            yield batch
            batch = []
    if batch:
        yield batch


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
    ep: OverloadEpisode | None,
) -> dict[str, Any]:
    summary = result.summary()
    slos: dict[str, Any] = {}
    objectives = {s.name: s.objective for s in spec.slos}
    for name, v in summary.get("slos", {}).items():
        allowed = (1 - objectives.get(name, 0.99)) * v["total"]
        bad = v["total"] - v["good"]
        slos[name] = {**v, "budget_consumed": (bad / allowed) if allowed > 0 else None}
    records = list(result.records.values())
    matchers = [SLOMatcher(x) for x in spec.slos]
    start_ns = config.start_unix_ns
    span_s = _span_s(records, start_ns)
    in_ep = (
        (lambda r: ep.start_offset_s <= (r.ts_unix_ns - start_ns) / 1e9 < ep.end_offset_s)
        if ep is not None
        else None
    )
    by_priority: dict[str, Any] = {}
    for prio in range(4):
        rs = [r for r in records if r.priority == prio]
        doc = _slo_doc(spec, rs)
        by_priority[str(prio)] = {
            "requests": len(rs),
            "ok": sum(1 for r in rs if r.outcome == "ok"),
            "rejected": sum(1 for r in rs if r.outcome == "rejected"),
            "slos": {n: v["compliance"] for n, v in doc.items()},
            "goodput_rps": _goodput(rs, matchers) / span_s if span_s else None,
        }
        if in_ep is not None:
            ers = [r for r in rs if in_ep(r)]
            by_priority[str(prio)]["episode_slos"] = {
                n: v["compliance"] for n, v in _slo_doc(spec, ers).items()
            }
            # attempts turned away by the gateways (429) or cut off in the queue (503):
            # the strict-tier check compares these shares between priorities
            by_priority[str(prio)]["episode_attempts"] = len(ers)
            by_priority[str(prio)]["episode_turned_away"] = sum(
                1 for r in ers if r.outcome == "rejected" or r.http_status == 503
            )
    last = control.last
    logical = logical_requests(records)
    out: dict[str, Any] = {
        "loop": "closed" if gate is not None else "open",
        "start_unix_ns": config.start_unix_ns,  # trace offset 0
        "requests": summary["requests"],
        "outcomes": summary["outcomes"],
        "retries": sim.retries,
        "queue_cutoffs": sim.cutoffs,
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
        "goodput_rps": _goodput(records, matchers) / span_s if span_s else None,
        "levels_raised": sum(1 for t in control.transitions if t["level"] >= 1),
        "notices": control.notices,
        "logical": _logical_doc(spec, logical, in_ep),
    }
    out.update(_admission_doc(records, gate, config, spec, span_s=span_s, in_ep=in_ep))
    if ep is not None:
        ep_rs = [r for r in records if in_ep is not None and in_ep(r)]
        ep_s = ep.end_offset_s - ep.start_offset_s
        out["episode"] = {
            "start_s": ep.start_offset_s,
            "end_s": ep.end_offset_s,
            "factor": ep.factor,
            "shape": getattr(ep, "shape", "step") if ep.factor > 1 else "in trace",
            "slos": {n: v["compliance"] for n, v in _slo_doc(spec, ep_rs).items()},
            "goodput_rps": _goodput(ep_rs, matchers) / ep_s,
            **_episode_control(control.transitions, start_ns, ep.start_offset_s, ep.end_offset_s),
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


def _admission_doc(
    records: list[RequestRecord],
    gate: GatewayGate | None,
    config: SimConfig,
    spec: SLOSpec,
    *,
    span_s: float,
    in_ep: Any,
) -> dict[str, Any]:
    """Issue 52's figures, present only when the run has them: ``own_slo`` (requests
    carrying their own first-token SLO: counted against it), ``ttft_prediction`` (the
    gates' P50/P90 of predicted - actual first-token time on admitted requests) and
    ``by_tenant`` (with a tenant flood: each tenant's requests, turned away and SLOs over
    the run and, at the flood's priority, during the flood)."""
    out: dict[str, Any] = {}
    own = [r for r in records if r.slo_ttft_ms is not None]
    if own:
        out["own_slo"] = {"run": _own_slo(own, span_s)}
        if in_ep is not None and config.overload is not None:
            ep_s = config.overload.end_offset_s - config.overload.start_offset_s
            out["own_slo"]["episode"] = _own_slo([r for r in own if in_ep(r)], ep_s)
    errors = gate.prediction_error() if gate is not None else {"n": 0}
    if errors["n"]:
        out["ttft_prediction"] = errors
    if config.tenant_floods:
        flood = config.tenant_floods[0]
        lo = config.start_unix_ns + int(flood.start_offset_s * 1e9)
        hi = config.start_unix_ns + int(flood.end_offset_s * 1e9)
        by_tenant: dict[str, Any] = {}
        for tenant in sorted({r.tenant or "" for r in records}):
            rs = [r for r in records if (r.tenant or "") == tenant]
            during = [r for r in rs if r.priority == flood.priority and lo <= r.ts_unix_ns < hi]
            by_tenant[tenant] = {
                "requests": len(rs),
                "turned_away": sum(1 for r in rs if r.outcome == "rejected"),
                "slos": {n: v["compliance"] for n, v in _slo_doc(spec, rs).items()},
                "flood_requests": len(during),
                "flood_turned_away": sum(1 for r in during if r.outcome == "rejected"),
                "flood_turned_away_by": dict(
                    Counter(str(r.control_verdict) for r in during if r.outcome == "rejected")
                ),
                "flood_slos": {n: v["compliance"] for n, v in _slo_doc(spec, during).items()},
            }
        out["by_tenant"] = by_tenant
    return out


def _own_slo(records: list[RequestRecord], span_s: float | None) -> dict[str, Any]:
    """Attempts carrying their own first-token SLO, each judged against it by the SLO
    spec's one rule (:class:`pipeline.core.slo.SLOMatcher`: the first byte at the
    gateway, a client abort judged by the time it waited, an error bad): ``good``,
    ``admitted`` (not turned away at the gateway: served, given up on, or cut off in the
    queue), ``late_admitted`` (admitted and bad), ``refused_as_late`` (``deadline``:
    refused, or in shadow would have been)."""
    matchers = {
        v: SLOMatcher(
            SLO(name="own-ttft", boundary="gateway_ttfb_ms", threshold_ms=v, objective=0.99)
        )
        for v in {r.slo_ttft_ms for r in records if r.slo_ttft_ms is not None}
    }
    verdicts = [
        (r, matchers[r.slo_ttft_ms].classify(r)) for r in records if r.slo_ttft_ms is not None
    ]
    good = sum(1 for _r, v in verdicts if v == "good")
    admitted_bad = sum(1 for r, v in verdicts if v == "bad" and not _turned_away(r))
    turned_away = sum(1 for r in records if _turned_away(r))
    admitted = len(records) - turned_away
    return {
        "requests": len(records),
        "admitted": admitted,
        "good": good,
        "late_admitted": admitted_bad,
        "late_share": admitted_bad / admitted if admitted else None,
        "refused_as_late": sum(1 for r in records if r.control_verdict == "deadline"),
        "goodput_rps": good / span_s if span_s else None,
    }


def _turned_away(r: RequestRecord) -> bool:
    """Refused at the gateway (a queue cut-off is admitted, then cut)."""
    return r.outcome == "rejected" and r.control_verdict != "queue_timeout"


def _logical_doc(spec: SLOSpec, logical: list[LogicalRequest], in_ep: Any) -> dict[str, Any]:
    """Per logical request (pipeline/core/logical.py, the report's rule): ``{"all":
    COUNTS, "by_priority": {p: COUNTS}, "episode": COUNTS, "episode_by_priority": {p:
    COUNTS}}`` (COUNTS: :func:`pipeline.core.logical.counts`; a logical request is in the
    episode when its first attempt started in it, as attempts are placed)."""

    def split(lrs: list[LogicalRequest]) -> dict[str, Any]:
        return {
            str(p): logical_counts(spec, [x for x in lrs if x.record.priority == p])
            for p in range(4)
        }

    out: dict[str, Any] = {"all": logical_counts(spec, logical), "by_priority": split(logical)}
    if in_ep is not None:
        ep = [x for x in logical if in_ep(x.record)]
        out["episode"] = logical_counts(spec, ep)
        out["episode_by_priority"] = split(ep)
    return out


def _slo_doc(spec: SLOSpec, records: list[RequestRecord]) -> dict[str, Any]:
    ev = SLOEvaluator(spec)
    for r in records:
        ev.add(r)
    slos: dict[str, Any] = ev.to_json()["slos"]
    return slos


def _goodput(records: list[RequestRecord], matchers: list[SLOMatcher]) -> int:
    """Requests served (``ok``) that every SLO counting them calls good."""
    return sum(
        1 for r in records if r.outcome == "ok" and all(m.classify(r) != "bad" for m in matchers)
    )


def _span_s(records: list[RequestRecord], start_ns: int) -> float:
    if not records:
        return 0.0
    return max(1.0, (max(r.ts_unix_ns for r in records) - start_ns) / 1e9)


def _episode_control(
    transitions: list[dict[str, Any]], start_ns: int, ep_start_s: float, ep_end_s: float
) -> dict[str, Any]:
    """When control acted around the episode: the first level raised after it started,
    the time every scope was back at L0 after it ended, levels raised before it."""
    first: float | None = None
    before = 0
    levels: dict[str, int] = {}
    back: float | None = None
    for t in sorted(transitions, key=lambda x: x["ts_unix_ns"]):
        at_s = (t["ts_unix_ns"] - start_ns) / 1e9
        if t["level"] >= 1 and at_s < ep_start_s:
            before += 1
        if t["level"] >= 1 and at_s >= ep_start_s and first is None:
            first = at_s - ep_start_s
        levels[t["scope"]] = t["level"]
        if at_s >= ep_start_s:
            back = (at_s - ep_end_s) if max(levels.values()) == 0 else None
    if back is not None:
        back = max(0.0, back)
    elif not any(levels.values()):
        back = 0.0
    return {"first_action_s": first, "back_at_l0_s": back, "levels_before": before}


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


_pct = partial(percent, spec=".2f", unit=" %")
_ms = partial(figure, spec=",.0f", unit=" ms")
_s = partial(figure, spec=",.0f", unit=" s")
_rps = partial(figure, spec=".2f", unit="/s")


def _logical_pct(counts: dict[str, Any], slo: str) -> str:
    return _pct(counts["slos"][slo]["compliance"])


def render_text(bt: Backtest) -> str:
    """Every loop side by side (plain text, for a terminal or a README)."""
    runs = list(bt.runs.values())
    titles = [LOOP_TITLES.get(r["loop"], r["loop"]) for r in runs]
    first = runs[0]
    rows: list[tuple[str, ...]] = []

    def row(label: str, f: Any) -> None:
        rows.append((label, *(f(r) for r in runs)))

    def head(label: str) -> None:
        rows.append((label, *("" for _ in runs)))

    row("requests (retries included)", lambda r: f"{r['requests']:,}")
    row("client retries after 429", lambda r: f"{r['retries']:,}")
    row("goodput (served within every SLO)", lambda r: _rps(r.get("goodput_rps")))
    head("SLO compliance over the run (budget consumed)")
    for name in first["slos"]:

        def cell(r: dict[str, Any], name: str = name) -> str:
            v = r["slos"].get(name, {})
            used = v.get("budget_consumed")
            return f"{_pct(v.get('compliance'))} ({'-' if used is None else f'{used:.1f}x'})"

        row(f"  {name}", cell)
    head("per logical request (a request and its retries once, as the client saw it)")
    row("  logical requests", lambda r: f"{r['logical']['all']['requests']:,}")
    row("  never served (final attempt refused/failed)",
        lambda r: f"{r['logical']['all']['never_served']:,}")  # fmt: skip
    row("  retried: latency from the first attempt",
        lambda r: f"{r['logical']['all']['latency']['from_first']:,}")  # fmt: skip
    row("  retried: final attempt's own latency (gateways differ)",
        lambda r: f"{r['logical']['all']['latency']['final_only']:,}")  # fmt: skip
    for name in first["slos"]:
        row(f"  {name}", lambda r, n=name: _logical_pct(r["logical"]["all"], n))
    for prio in ("0", "1", "2", "3"):
        head(f"priority {prio} compliance over the run")
        for name in first["slos"]:
            if any(r["by_priority"][prio]["slos"].get(name) is not None for r in runs):
                row(f"  {name}", lambda r, n=name, p=prio: _pct(r["by_priority"][p]["slos"].get(n)))
    row("turned away (429), all priorities", lambda r: f"{sum(r['shed'].values()):,}")
    for prio in ("0", "1", "2", "3"):
        row(f"  priority {prio}", lambda r, p=prio: f"{r['shed'].get(p, 0):,}")
    head("time at level (max over models)")
    for lv in ("0", "1", "2", "3"):
        row(f"  L{lv}", lambda r, lv=lv: f"{r['time_at_level_s'][lv] / 60:.1f} min")
    if "episode" in first:
        ep = first["episode"]
        head(
            f"episode {ep['start_s']:g}-{ep['end_s']:g} s, x{ep['factor']:g} "
            f"({ep.get('shape', 'step')})"
        )
        row("  goodput during it", lambda r: _rps(r["episode"].get("goodput_rps")))
        for name in first["slos"]:
            row(f"  {name} during it", lambda r, n=name: _pct(r["episode"]["slos"].get(n)))
            row(
                f"  {name} during it, priority 0",
                lambda r, n=name: _pct(r["by_priority"]["0"].get("episode_slos", {}).get(n)),
            )
        row("  first action after its start", lambda r: _s(r["episode"].get("first_action_s")))
        row("  every scope at L0 after its end", lambda r: _s(r["episode"].get("back_at_l0_s")))
        row("  logical requests started in it",
            lambda r: f"{r['logical']['episode']['requests']:,}")  # fmt: skip
        row("  of them never served", lambda r: f"{r['logical']['episode']['never_served']:,}")
        for name in first["slos"]:
            row(f"  {name} during it, per logical request",
                lambda r, n=name: _logical_pct(r["logical"]["episode"], n))  # fmt: skip
            for prio in ("0", "1", "2", "3"):
                row(f"    priority {prio}",
                    lambda r, n=name, p=prio: _logical_pct(
                        r["logical"]["episode_by_priority"][p], n))  # fmt: skip
        row("  levels raised before it", lambda r: str(r["episode"].get("levels_before", 0)))
        head("P99 during the episode")
        for b in EPISODE_BOUNDARIES:
            row(f"  {b}", lambda r, b=b: _ms(r["episode"]["during"][f"p99.{b}"]))
        head("P99 in the 15 min after it")
        for b in EPISODE_BOUNDARIES:
            row(f"  {b}", lambda r, b=b: _ms(r["episode"]["after_15m"][f"p99.{b}"]))
    widths = [max(len(x[i]) for x in [("", *titles), *rows]) for i in range(len(runs) + 1)]
    delays = [r["loop_delay"] for r in runs if "loop_delay" in r and r["loop"] == "tailguard"]
    lines = [
        f"engines schedule {bt.scheduling.upper()}; clients retry a 429 at most 3 times",
        "  ".join(
            [f"{'':<{widths[0]}}", *(f"{t:>{w}}" for t, w in zip(titles, widths[1:], strict=True))]
        ),
    ]
    for x in rows:
        cells = [f"{x[0]:<{widths[0]}}"]
        cells += [f"{c:>{w}}" for c, w in zip(x[1:], widths[1:], strict=True)]
        lines.append("  ".join(cells).rstrip())
    for ld in delays:
        lines.append(
            f"\ndirectives reach the gates {ld['set_ms']:,} ms after their evidence at the "
            f"earliest (--loop-delay); as applied (tailguard, event time): P50 "
            f"{_ms(ld['p50_ms'])}, P99 {_ms(ld['p99_ms'])} over {ld['decisions']} decisions"
        )
    for run in runs:
        if run["loop"] == "aimd":
            continue
        title = LOOP_TITLES.get(run["loop"], run["loop"])
        how = "decided, not applied" if run["loop"] == "open" else "applied"
        lines.append(f"\ncontrol, {title} ({how}):")
        for t in run["control"]:
            lines.append(
                f"  t={(t['ts_unix_ns'] - run['start_unix_ns']) / 1e9:5.0f} s  {t['scope']:<12} "
                f"L{t['level']} "
                f"{t['phase']:<9} {t['reason'][:110]}"
            )
        for n in run.get("notices", [])[:10]:
            lines.append(
                f"  t={(n['now_ms'] * 1_000_000 - run['start_unix_ns']) / 1e9:5.0f} s  "
                f"notice: {n['text'][:140]}"
            )
    return "\n".join(lines)
