"""The controller: window summaries + engine stats -> signals -> budgets and policy decisions.

Pure: fed :class:`~pipeline.contract.summary.WindowSummary` and
:class:`~pipeline.contract.summary.StatsSample` values, evaluated at an event time
passed in. One controller sees every partition's windows (the worker that
owns the single-partition summaries topic runs it; ``replay`` runs it in
process).

Signals per scope (a model), the names the policy refers to:

* ``p99.<boundary>``: P99 over the last ``latency_window_ms`` (1 min) of
  closed windows, merged across partitions (the sketch, not an average of P99s);
* ``compliance_5m.<slo>``: good / total over the last 5 min;
* ``burn.page`` / ``burn.ticket``: a burn-rate rule of that severity fires for
  an SLO that covers the model (no model filter, or the model listed);
* ``budget_exhausted``: such an SLO has no budget left (flagged, never a
  reason to degrade);
* ``kv_cache_hit_rate``: mean prefix-cache hit rate of the model's engines;
* ``queue_saturation``: max over the model's engines of num_waiting / capacity;
* ``gpu_memory_fraction``: max over the model's engines;
* ``queue_compute_ratio``: Σ inference_ms / Σ gateway_total_ms (below 0.3:
  queueing dominates).

Budgets are tracked per SLO for all traffic (scope ``*``); SLO filters decide
which models an SLO's alerts apply to.

**Which windows a decision reads.** Latency signals at ``T`` read the windows
ending at or before ``T`` (live: the snapshots of ended windows, so the worker
need not wait for the grace period). The error-budget signals (``burn.*``,
``budget_exhausted``, ``compliance_5m.*``) at ``T`` read only the windows ending
at or before ``T - budget_lag_ms`` (:func:`budget_lag_ms`: the grace period
rounded up to whole windows), which are final in every path: a live controller
deciding at ``T`` has seen every partition's clock pass ``T``, so each of those
windows has closed and its final summary arrived; a replay or backtest closes
them before ``T``'s own window. Budgets count final windows only, so without
the lag a live controller, whose last window is still a snapshot, and a replay,
whose last window is final, would compute burn from different counts, and a
burn alert would reach them at different event times.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from pipeline.contract.boundaries import BOUNDARIES
from pipeline.contract.summary import StatsSample, WindowSummary
from pipeline.core.budget import DEFAULT_BASE_MS, BudgetBook, BudgetEvent, BudgetStatus
from pipeline.core.policy import Evaluation, PolicyEngine
from pipeline.core.sketch import QuantileSketch
from pipeline.core.summary import ALL_MODELS
from pipeline.spec.burn_rules import BurnRules
from pipeline.spec.policy import ControlPolicy
from pipeline.spec.slo import SLOSpec

FIVE_MIN_MS: Final = 300_000

Signals = dict[str, float | bool | None]


# Within a gap in the data, only its last 2 hours are evaluated window by window, so
# that the cost of a gap does not grow with its size (every level's timers are shorter).
MAX_IDLE_EVALUATION_MS: Final = 2 * 3_600_000


def budget_lag_ms(size_ms: int, grace_ms: int) -> int:
    """How far behind the decision time the error-budget signals read: the window
    grace rounded up to whole windows (every window ending at or before
    ``T - lag`` is closed once the event-time clock reached ``T``)."""
    return -(-max(grace_ms, 0) // size_ms) * size_ms


def skip_gap(next_eval_ms: int, target_ms: int, size_ms: int) -> int:
    """Where evaluation resumes before ``target_ms``: ``next_eval_ms``, or (across a
    longer gap) the same grid point ``MAX_IDLE_EVALUATION_MS`` before the target."""
    if target_ms - next_eval_ms <= MAX_IDLE_EVALUATION_MS:
        return next_eval_ms
    skip_to = target_ms - MAX_IDLE_EVALUATION_MS
    return skip_to - (skip_to - next_eval_ms) % size_ms


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    latency_window_ms: int = 60_000
    stats_window_ms: int = 60_000
    queue_capacity: int = 64  # num_waiting at which an engine's queue counts as full
    queue_capacity_by_model: Mapping[str, int] = field(default_factory=dict)
    max_windows: int = 100_000  # bound on remembered (partition, window) ids
    # Budget signals at T read the windows ending at or before T - this (budget_lag_ms).
    budget_lag_ms: int = 0
    # The budgets' finest resolution (the window size: a range ending at T - lag then
    # ends there, not at the end of a coarser bucket holding windows not final yet).
    budget_base_ms: int = DEFAULT_BASE_MS

    @classmethod
    def for_windows(cls, size_ms: int, grace_ms: int, **kw: Any) -> ControllerConfig:
        """Budgets at the windows' resolution, read :func:`budget_lag_ms` behind."""
        base = size_ms if 60_000 % size_ms == 0 else DEFAULT_BASE_MS
        return cls(budget_lag_ms=budget_lag_ms(size_ms, grace_ms), budget_base_ms=base, **kw)

    def capacity(self, model: str) -> int:
        return self.queue_capacity_by_model.get(model, self.queue_capacity)


@dataclass(frozen=True, slots=True)
class ControlStep:
    now_ms: int
    decisions: list[Evaluation]
    budgets: list[BudgetStatus]
    events: list[BudgetEvent]
    signals: dict[str, Signals]


class Controller:
    def __init__(
        self,
        policy: ControlPolicy,
        spec: SLOSpec | None = None,
        burn_rules: BurnRules | None = None,
        config: ControllerConfig | None = None,
    ) -> None:
        """``burn_rules``: the parsed alert rules (None: none; callers read the shipped
        ``specs/burn-rules.yaml`` with ``pipeline.spec.burn_rules.load_burn_rules_file``)."""
        self.config = config or ControllerConfig()
        self.policy = PolicyEngine(policy)
        self.spec = spec
        self.book = (
            BudgetBook(spec, burn_rules or BurnRules.empty(), base_ms=self.config.budget_base_ms)
            if spec is not None
            else None
        )
        # start_ms -> partition -> model -> boundary -> sketch (final, or latest snapshot)
        self._latency: dict[int, dict[int, dict[str, dict[str, QuantileSketch]]]] = {}
        self._seen: dict[tuple[int, int] | tuple[int, int, str], None] = {}
        # Per engine host, its samples of the last stats window (in time order).
        # Stats arrive ahead of closed windows; signals at T use samples <= T only.
        self._stats: dict[str, list[StatsSample]] = {}
        self.models: set[str] = set()
        self.duplicates = 0

    # -- input ------------------------------------------------------------------

    def mark_seen(self, partition: int, start_ms: int) -> None:
        """A window already counted (e.g. loaded from storage): ignore its summary."""
        self._seen[(partition, start_ms)] = None

    def add_window(self, s: WindowSummary) -> bool:
        """Add one partition's window; returns False when it is ignored.

        A final summary is counted once (a repeat, from at-least-once delivery, is
        ignored) and supersedes the provisional snapshots of its window; a provisional
        one replaces the previous snapshot of that window and feeds latency signals
        only (budgets count final windows).
        """
        if s.correction_id is not None:
            # A correction: SLO counts only, added to the budgets once.
            cid = (s.partition, s.start_ms, s.correction_id)
            if cid in self._seen:
                self.duplicates += 1
                return False
            self._seen[cid] = None
            if self.book is not None:
                for name, c in s.slos.items():
                    self.book.add_window(
                        name, s.start_ms, s.size_ms, c.total, c.good,
                        objective=c.objective, delta=True,
                    )  # fmt: skip
            return True
        wid = (s.partition, s.start_ms)
        if wid in self._seen:
            if s.final:
                self.duplicates += 1
            return False
        if s.final:
            self._seen[wid] = None
            if len(self._seen) > self.config.max_windows:
                del self._seen[next(iter(self._seen))]
        by_model: dict[str, dict[str, QuantileSketch]] = {}
        for model, mw in s.models.items():
            if model != ALL_MODELS:
                self.models.add(model)
            by_model[model] = {
                b: QuantileSketch.from_columns(c, delta=True) for b, c in mw.boundaries.items()
            }
        self._latency.setdefault(s.start_ms, {})[s.partition] = by_model
        if s.final and self.book is not None:
            for name, c in s.slos.items():
                self.book.add_window(
                    name, s.start_ms, s.size_ms, c.total, c.good, objective=c.objective
                )
        return True

    def add_stats(self, s: StatsSample) -> None:
        self.models.add(s.model)
        xs = self._stats.setdefault(s.host, [])
        xs.append(s)
        if len(xs) > 1 and xs[-2].ts_ms > s.ts_ms:
            xs.sort(key=lambda x: x.ts_ms)

    # -- signals -----------------------------------------------------------------

    def _prune(self, now_ms: int) -> None:
        keep_from = now_ms - max(self.config.latency_window_ms, FIVE_MIN_MS) - 60_000
        for start in [s for s in self._latency if s < keep_from]:
            del self._latency[start]
        stats_from = now_ms - self.config.stats_window_ms
        for host, xs in self._stats.items():
            if xs and xs[0].ts_ms < stats_from:
                self._stats[host] = [x for x in xs if x.ts_ms >= stats_from]

    def _covers(self, slo_name: str, model: str) -> bool:
        if self.spec is None:
            return False
        for slo in self.spec.slos:
            if slo.name == slo_name:
                models = slo.filter.model if slo.filter is not None else None
                return models is None or model in models
        return True  # a blended tier covers everything

    def signals(self, model: str, now_ms: int, budgets: list[BudgetStatus]) -> Signals:
        out: Signals = {}
        lo = now_ms - self.config.latency_window_ms
        merged: dict[str, QuantileSketch] = {}
        for start, by_part in self._latency.items():
            if not lo <= start < now_ms:
                continue
            for by_model in by_part.values():
                for b, sk in by_model.get(model, {}).items():
                    if b in merged:
                        merged[b].merge(sk)
                    else:
                        merged[b] = sk.copy()
        for b in BOUNDARIES:
            sk_b = merged.get(b)
            out[f"p99.{b}"] = sk_b.quantile(0.99) if sk_b is not None else None
        inf, tot = merged.get("inference_ms"), merged.get("gateway_total_ms")
        out["queue_compute_ratio"] = inf.sum / tot.sum if inf and tot and tot.sum > 0 else None

        page = ticket = exhausted = False
        for st in budgets:
            if not self._covers(st.slo, model):
                continue
            page = page or any(a.severity == "page" for a in st.alerts)
            ticket = ticket or any(a.severity == "ticket" for a in st.alerts)
            exhausted = exhausted or (
                st.remaining_fraction is not None and st.remaining_fraction <= 0
            )
            if self.book is not None:
                to_ms = now_ms - self.config.budget_lag_ms
                c = self.book.tracker(st.slo, st.scope).counts(to_ms - FIVE_MIN_MS, to_ms)
                out[f"compliance_5m.{st.slo}"] = 1 - c.bad / c.total if c.total else None
        out["burn.page"] = page
        out["burn.ticket"] = ticket
        out["budget_exhausted"] = exhausted

        lo_stats = now_ms - self.config.stats_window_ms
        window: list[StatsSample] = []
        latest: list[StatsSample] = []  # each engine's newest sample at or before now
        for xs in self._stats.values():
            seen = [x for x in xs if lo_stats <= x.ts_ms <= now_ms and x.model == model]
            if seen:
                window.extend(seen)
                latest.append(seen[-1])
        cap = self.config.capacity(model)
        out["queue_saturation"] = max((x.num_waiting / cap for x in latest), default=None)
        gpu = [x.gpu_memory_used_fraction for x in latest if x.gpu_memory_used_fraction is not None]
        out["gpu_memory_fraction"] = max(gpu, default=None)
        hits = [x.prefix_cache_hit_rate for x in window if x.prefix_cache_hit_rate is not None]
        out["kv_cache_hit_rate"] = sum(hits) / len(hits) if hits else None
        return out

    def evaluate(self, now_ms: int) -> ControlStep:
        self._prune(now_ms)
        # Final windows only, the same in every path (see the module docstring).
        lag = self.config.budget_lag_ms
        budgets = self.book.evaluate(now_ms - lag) if self.book is not None else []
        events = [e for st in budgets for e in st.events]
        decisions = []
        signals: dict[str, Signals] = {}
        for model in sorted(self.models):
            sig = self.signals(model, now_ms, budgets)
            signals[model] = sig
            decisions.append(self.policy.evaluate(model, now_ms, sig))
        return ControlStep(now_ms, decisions, budgets, events, signals)


# --------------------------------------------------------------------------- #
# The decision clock: when to evaluate (one control path for worker and replay)
# --------------------------------------------------------------------------- #


def held_key(d: Evaluation) -> tuple[str, ...]:
    """What keeps a level, without the running times: ``"x 200 < 250 (3m of 5m)"`` ->
    ``"x < 250"`` -- the directive is re-issued when this changes, not every tick."""
    out = []
    for h in d.held_because:
        head = h.split(" (", 1)[0]
        prefix = "entry " if head.startswith("entry ") else ""
        parts = head.removeprefix(prefix).split(" ")
        # "<signal> <value> <op> <threshold>" -> "<signal> <op> <threshold>"
        kept = [parts[0], *parts[2:]] if len(parts) == 4 else parts
        out.append(prefix + " ".join(kept))
    return tuple(out)


@dataclass
class DecisionClock:
    """Evaluation times in event time: one per base window end, from the first window
    summarized on, up to what every partition has reported.

    The controller shell feeds it each partition's close horizon and provisional
    clock (:meth:`progress`); a replay, which sees every partition's windows in
    one ordered stream, moves it by each closed window's end (:meth:`closed`).
    Either way the same events give the same evaluation times whatever the
    processing speed: wall time decides only how soon a decision is published.
    """

    size_ms: int
    partitions: int = 1
    decision_delay_ms: int = 0
    # Live: how far the decisions may run ahead of every partition's final windows
    # (the controller's ``budget_lag_ms``): the budget signals at T need the final
    # summaries of the windows ending at or before T - this. None: no bound.
    final_lag_ms: int | None = None
    next_eval_ms: int | None = None
    first_end_ms: int | None = None
    horizons: dict[int, int] = field(default_factory=dict)
    clocks: dict[int, int] = field(default_factory=dict)
    _closed_ms: int | None = None

    def window(self, start_ms: int, size_ms: int) -> None:
        """A window (final or provisional) was summarized."""
        end = start_ms + size_ms
        if self.first_end_ms is None or end < self.first_end_ms:
            self.first_end_ms = end

    def progress(self, partition: int, horizon_ms: int, clock_ms: int | None) -> None:
        self.horizons[partition] = max(self.horizons.get(partition, 0), horizon_ms)
        if clock_ms is not None:
            self.clocks[partition] = max(self.clocks.get(partition, 0), clock_ms)

    def closed(self, end_ms: int) -> None:
        """Replay: every window up to ``end_ms`` is final, for every partition."""
        self._closed_ms = end_ms if self._closed_ms is None else max(self._closed_ms, end_ms)

    def target_ms(self) -> int | None:
        """The latest evaluation time every partition has data for, or None."""
        if self._closed_ms is not None:
            return self._closed_ms
        if not self.horizons or len(self.horizons) < self.partitions:
            return None
        horizon = min(self.horizons.values())
        target = horizon
        if len(self.clocks) >= self.partitions:
            # Snapshots of ended windows: decide a short delay after every partition's
            # clock passed the boundary, without waiting for the grace period -- but
            # never past what the budget signals need as final windows (a window held
            # open by a pending join holds the decision back instead).
            ahead = min(self.clocks.values()) - self.decision_delay_ms
            if self.final_lag_ms is not None:
                ahead = min(ahead, horizon + self.final_lag_ms)
            target = max(target, ahead)
        return target - target % self.size_ms

    def due(self) -> list[int]:
        """Evaluation times now due, in order (each returned once)."""
        target = self.target_ms()
        if target is None:
            return []
        if self.next_eval_ms is None:
            if self.first_end_ms is None:
                return []
            # From the first window on: "for" clocks need every step.
            self.next_eval_ms = self.first_end_ms
        # Across a long gap only its last hours are evaluated (the cost of a gap is bounded).
        self.next_eval_ms = skip_gap(self.next_eval_ms, target, self.size_ms)
        out = []
        while self.next_eval_ms <= target:
            out.append(self.next_eval_ms)
            self.next_eval_ms += self.size_ms
        return out


class ControlLoop:
    """Controller + decision clock + what to announce: the one control path.

    :meth:`step` evaluates every due time and returns the steps; :meth:`announce`
    picks the decisions to issue: a change of level/phase, a scope never issued,
    or a change of what holds the level (``held_key``), so the audit and the
    serving side see why a level is held without a directive every tick.
    """

    HELD_EVERY_MS: Final = 60_000  # at most one "held because" update per scope per minute

    def __init__(self, controller: Controller, clock: DecisionClock) -> None:
        self.controller = controller
        self.clock = clock
        # scope -> (level, phase, held key or None right after a change, event time)
        self._announced: dict[str, tuple[int, str, tuple[str, ...] | None, int]] = {}

    def add(self, s: WindowSummary | StatsSample) -> None:
        if isinstance(s, StatsSample):
            self.controller.add_stats(s)
        else:
            self.controller.add_window(s)
            if s.correction_id is None:  # a correction: budgets only, no evaluation
                self.clock.window(s.start_ms, s.size_ms)

    def step(self) -> list[ControlStep]:
        return [self.controller.evaluate(t) for t in self.clock.due()]

    def announce(self, step: ControlStep) -> list[Evaluation]:
        out = []
        for d in step.decisions:
            last = self._announced.get(d.scope)
            key = held_key(d)
            if d.changed or last is None or last[:2] != (d.level, d.phase):
                # a change (its reason says why); the next evaluation's key is absorbed
                self._announced[d.scope] = (d.level, d.phase, None, d.now_ms)
                out.append(d)
            elif last[2] is None:
                self._announced[d.scope] = (d.level, d.phase, key, last[3])
            elif key != last[2] and d.now_ms - last[3] >= self.HELD_EVERY_MS:
                self._announced[d.scope] = (d.level, d.phase, key, d.now_ms)
                out.append(d)
        return out
