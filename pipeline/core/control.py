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

Load signals (is a burn load-caused? what can the engines serve?):

* ``queue.depth_ratio``: requests waiting in the model's engines over their batch
  (Σ num_waiting / Σ the largest num_running each engine reported); 1 = a whole
  batch is queued behind the running one ("queue depth > capacity");
* ``queue.wait_ms``: the queue a request joins now, in ms (Little's law: waiting
  / the model's engines' served rate over the last minute);
* ``load.queue_share``: of the bad requests of the queue-inclusive SLOs covering
  the model (last minute, final windows), the share of their time spent queued
  (the bad requests' Σ queue_ms / Σ their boundary's ms);
* ``slo.fast_burn``: such an SLO (any boundary) burns at least ``fast_burn`` times
  its budget rate over the last minute (at least ``fast_burn_min_requests``);
* ``load.burning`` (= ``load.caused``): the burn is load-caused, now: either a
  queue-inclusive SLO burns fast, most of its bad requests' time was queueing
  (``load.queue_share >= load_share``) and the model's own P99 queue time is over
  half the SLO's threshold; or a whole batch is queued (``queue.depth_ratio >= 1``)
  and the queue a request joins is over the tightest queue-inclusive threshold
  covering the model (every request now is bad on it, before any is counted).
  Gateway only (an SLO burns fast and the model's engines report nothing: no stats
  sample, nothing finished at an engine in the last minute): the queue's share cannot
  be measured, so the burn is load-caused only when the demand is at least
  ``GATEWAY_ONLY_DEMAND_RATIO`` times what the gateways have seen answered, at most
  ever or in the last minute (requests wait for engines that cannot keep up); otherwise
  it is *unknown* (None): no level that turns traffic away opens on it, and the burn
  is reported as a :class:`LoadNotice` naming what is missing.
* ``load.demand_ratio``: requests the model's gateways received per second, before
  admission (rejections included, a client's retries not: :func:`demand_count`),
  over what its engines have shown they serve: the measured capacity
  (:meth:`pipeline.core.admission.AdmissionControl.proven_rps`; not the admission
  rate, which grows while admission keeps the queue short whatever arrives); under 1 =
  the engines serve the demand.

A fast burn that is not load-caused is a *notice* (:class:`LoadNotice`): it is
alerted and explained, and a policy with ``dynamics.load_gate`` sheds nothing for it.

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

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from pipeline.contract.boundaries import BOUNDARIES
from pipeline.contract.summary import ModelWindow, StatsSample, WindowSummary
from pipeline.core.admission import (
    TTFT_SERVICE_BOUNDARIES,
    AdmissionConfig,
    AdmissionControl,
    ModelLoad,
    ttft_prediction,
)
from pipeline.core.budget import DEFAULT_BASE_MS, BudgetBook, BudgetEvent, BudgetStatus
from pipeline.core.load_cause import (
    SLOCoverage,
    attribute_burn,
    load_unknown,
    not_load_caused,
)
from pipeline.core.policy import Evaluation, PolicyEngine, bounded_reason
from pipeline.core.sketch import QuantileSketch
from pipeline.core.summary import ALL_MODELS
from pipeline.spec.burn_rules import BurnRules
from pipeline.spec.policy import ControlPolicy
from pipeline.spec.slo import SLOSpec

FIVE_MIN_MS: Final = 300_000
# The healthy queue: what the engines serve in this share of the queue cut-off.
HEALTHY_QUEUE_SHARE: Final = 0.1
# Gateway only (no engine events): a fast burn is load-caused when the demand is at least
# this many times what the gateways have seen answered (``load.demand_ratio``); below,
# whether it is load-caused is unknown. Well above the ~1 of normal load, where the
# capacity is the most ever served.
GATEWAY_ONLY_DEMAND_RATIO: Final = 1.5

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


def _burn_rate(counts: list[float], objective: float) -> float:
    """An SLO's burn rate from [total, bad, ...] counts."""
    total, bad = counts[0], counts[1]
    return (bad / total) / max(1e-9, 1 - objective) if total > 0 else 0.0


def demand_count(mw: ModelWindow) -> int:
    """What one window of a model counts as demand (``load.demand_ratio``'s numerator):
    every request its gateways received, those refused or cut off included -- demand
    *before* admission, which a level's own refusals cannot lower (an exit that read
    admitted traffic would see the shedding, not the load) -- counted once: a client's
    retries (``client_attempt > 0``, from the SDKs' own retry count) are left out, so a
    refusal does not count its request again each time it is retried. The one place the
    demand is counted."""
    return mw.records - mw.retries


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
    # Load attribution (see the module docstring).
    fast_burn: float = 14.4  # the workbook's page rate, here over the last minute
    fast_burn_min_requests: int = 20
    load_share: float = 0.5  # bad requests' queue share from which a burn is load-caused
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    gateway_instances: int = 1  # admit_rps is split equally among this many gateways

    @classmethod
    def for_windows(cls, size_ms: int, grace_ms: int, **kw: Any) -> ControllerConfig:
        """Budgets at the windows' resolution, read :func:`budget_lag_ms` behind."""
        base = size_ms if 60_000 % size_ms == 0 else DEFAULT_BASE_MS
        return cls(budget_lag_ms=budget_lag_ms(size_ms, grace_ms), budget_base_ms=base, **kw)

    def capacity(self, model: str) -> int:
        return self.queue_capacity_by_model.get(model, self.queue_capacity)


@dataclass(frozen=True, slots=True)
class LoadNotice:
    """An SLO burning fast on a model for reasons other than load: alerted, not shed."""

    now_ms: int
    model: str
    slo: str
    queue_share: float | None  # None: no bad request reached an engine
    text: str

    def to_json(self) -> dict[str, Any]:
        return {
            "now_ms": self.now_ms,
            "model": self.model,
            "slo": self.slo,
            "queue_share": self.queue_share,
            "text": self.text,
        }


@dataclass(frozen=True, slots=True)
class ControlStep:
    now_ms: int
    decisions: list[Evaluation]
    budgets: list[BudgetStatus]
    events: list[BudgetEvent]
    signals: dict[str, Signals]
    notices: list[LoadNotice] = field(default_factory=list)


class WindowEvidence:
    """What the controller keeps of the windows it was fed, per window start and partition:
    the latency sketches per model and boundary (final, or the latest snapshot), each
    model's demand (records, all outcomes) and what the gateways saw answered (outcome
    ok), and per SLO the load attribution sums. Pure bookkeeping; the signals read it."""

    def __init__(self) -> None:
        # start_ms -> partition -> model -> boundary -> sketch (final, or latest snapshot)
        self.latency: dict[int, dict[int, dict[str, dict[str, QuantileSketch]]]] = {}
        # start_ms -> partition -> model -> records (all outcomes: the demand)
        self.records: dict[int, dict[int, dict[str, int]]] = {}
        # start_ms -> partition -> model -> records answered (outcome ok)
        self.answered: dict[int, dict[int, dict[str, int]]] = {}
        # start_ms -> slo -> [total, bad, bad queue ms, bad boundary ms] (final + corrections)
        self.attrib: dict[int, dict[str, list[float]]] = {}

    def add(self, s: WindowSummary, by_model: dict[str, dict[str, QuantileSketch]]) -> None:
        self.latency.setdefault(s.start_ms, {})[s.partition] = by_model
        self.records.setdefault(s.start_ms, {})[s.partition] = {
            m: demand_count(mw) for m, mw in s.models.items()
        }
        self.answered.setdefault(s.start_ms, {})[s.partition] = {
            m: mw.answered for m, mw in s.models.items()
        }

    def attribute(self, s: WindowSummary) -> None:
        by_slo = self.attrib.setdefault(s.start_ms, {})
        for name, c in s.slos.items():
            acc = by_slo.setdefault(name, [0.0, 0.0, 0.0, 0.0])
            acc[0] += c.total
            acc[1] += c.total - c.good
            acc[2] += c.bad_queue_ms
            acc[3] += c.bad_ms

    def prune(self, keep_from_ms: int) -> None:
        for table in (self.latency, self.records, self.answered, self.attrib):
            for start in [s for s in table if s < keep_from_ms]:
                del table[start]

    def engine_finished(self, model: str, lo_ms: int, hi_ms: int) -> int:
        """Requests the model's engines reported finished (``engine.finished``: every
        request that reached one, answered or not) in the windows starting in [lo, hi)."""
        return sum(self._finished_by_window(model, lo_ms, hi_ms).values())

    def _finished_by_window(self, model: str, lo_ms: int, hi_ms: int) -> dict[tuple[int, int], int]:
        out: dict[tuple[int, int], int] = {}
        for start, by_part in self.latency.items():
            if lo_ms <= start < hi_ms:
                for part, by_model in by_part.items():
                    sk = by_model.get(model, {}).get("queue_ms")
                    if sk is not None:
                        out[(start, part)] = sk.count
        return out

    def served(self, model: str, lo_ms: int, hi_ms: int) -> int:
        """Requests the model's engines served in the windows starting in [lo, hi): per
        window and partition, those its engines reported finished, or, where more, those
        the gateways saw answered (outcome ok). Without ``engine.finished`` (engines
        without our plugin, vLLM's own /metrics only, gateway only) what is served is
        still measured, at the gateways: capacity, the demand ratio and the queue's wait
        do not go unknown for want of the engines' own events (issue 47)."""
        finished = self._finished_by_window(model, lo_ms, hi_ms)
        for start, by_part in self.answered.items():
            if lo_ms <= start < hi_ms:
                for part, by_model in by_part.items():
                    n = by_model.get(model, 0)
                    if n > finished.get((start, part), 0):
                        finished[(start, part)] = n
        return sum(finished.values())


def noted(d: Evaluation, lacking: str) -> Evaluation:
    """A decision that keeps or changes a level says what engine evidence it lacked
    (:func:`lacking_evidence`), so an operator reads which signals were measured."""
    if not lacking or not (d.level > 0 or d.changed):
        return d
    reason = bounded_reason(f"{d.reason} [{lacking}]")
    return dataclasses.replace(d, decision=d.decision.model_copy(update={"reason": reason}))


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
        self.coverage = SLOCoverage(spec)
        self.book = (
            BudgetBook(spec, burn_rules or BurnRules.empty(), base_ms=self.config.budget_base_ms)
            if spec is not None
            else None
        )
        self.windows = WindowEvidence()
        self._seen: dict[tuple[int, int] | tuple[int, int, str], None] = {}
        # Per engine host, its samples of the last stats window (in time order).
        # Stats arrive ahead of closed windows; signals at T use samples <= T only.
        self._stats: dict[str, list[StatsSample]] = {}
        self.models: set[str] = set()
        self.duplicates = 0
        self._batch: dict[str, int] = {}  # engine host -> largest num_running reported
        self._size_ms: int | None = None
        self.admission = AdmissionControl(self.config.admission)
        self._notices: dict[str, LoadNotice] = {}
        self._lacking: dict[str, str] = {}  # model -> the engine evidence it lacks, said

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
            self.windows.attribute(s)
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
        self.windows.add(s, by_model)
        self._size_ms = s.size_ms
        if s.final and self.book is not None:
            for name, c in s.slos.items():
                self.book.add_window(
                    name, s.start_ms, s.size_ms, c.total, c.good, objective=c.objective
                )
        if s.final:
            self.windows.attribute(s)
        return True

    def add_stats(self, s: StatsSample) -> None:
        self.models.add(s.model)
        if s.num_running > self._batch.get(s.host, 0):
            self._batch[s.host] = s.num_running
        xs = self._stats.setdefault(s.host, [])
        xs.append(s)
        if len(xs) > 1 and xs[-2].ts_ms > s.ts_ms:
            xs.sort(key=lambda x: x.ts_ms)

    # -- signals -----------------------------------------------------------------

    def _prune(self, now_ms: int) -> None:
        keep_from = now_ms - max(self.config.latency_window_ms, FIVE_MIN_MS) - 60_000
        self.windows.prune(keep_from)
        stats_from = now_ms - self.config.stats_window_ms
        for host, xs in self._stats.items():
            if xs and xs[0].ts_ms < stats_from:
                self._stats[host] = [x for x in xs if x.ts_ms >= stats_from]

    def signals(self, model: str, now_ms: int, budgets: list[BudgetStatus]) -> Signals:
        out: Signals = {}
        lo = now_ms - self.config.latency_window_ms
        merged: dict[str, QuantileSketch] = {}
        for start, by_part in self.windows.latency.items():
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
            if not self.coverage.covers(st.slo, model):
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
        self._load_signals(model, now_ms, merged, latest, out)
        return out

    def _load(self, model: str, now_ms: int, latest: list[StatsSample]) -> ModelLoad:
        """What the model's engines did in the last base window that is final in every
        path (``budget_lag_ms`` behind, like the budget signals: a live controller and a
        replay then compute the same rate), and what its engines report now."""
        size = self._size_ms or 10_000
        to_ms = now_ms - self.config.budget_lag_ms
        lo = to_ms - self.config.latency_window_ms
        demand = sum(
            by_model.get(model, 0)
            for start, by_part in self.windows.records.items()
            if lo <= start < to_ms
            for by_model in by_part.values()
        )
        minute_s = self.config.latency_window_ms / 1000
        return ModelLoad(
            served_rps=self.windows.served(model, to_ms - size, to_ms) / (size / 1000),
            waiting=sum(x.num_waiting for x in latest),
            batch=sum(self._batch.get(x.host, x.num_running) for x in latest),
            demand_rps=demand / minute_s,
            served_minute_rps=self.windows.served(model, lo, to_ms) / minute_s,
        )

    def _load_signals(
        self,
        model: str,
        now_ms: int,
        merged: Mapping[str, QuantileSketch],
        latest: list[StatsSample],
        out: Signals,
    ) -> None:
        cfg = self.config
        load = self._load(model, now_ms, latest)
        minute_s = cfg.latency_window_ms / 1000
        to_ms = now_ms - cfg.budget_lag_ms
        served_minute = self.windows.served(model, to_ms - cfg.latency_window_ms, to_ms) / minute_s
        depth = load.waiting / load.batch if load.batch > 0 else None
        wait_ms = 1000.0 * load.waiting / max(served_minute, 0.1) if latest else None
        out["queue.depth_ratio"] = depth
        out["queue.wait_ms"] = wait_ms
        cap = self.admission.proven_rps(model)
        out["load.demand_ratio"] = load.demand_rps / cap if cap else None
        # Attribution: final windows of the last minute, budget_lag behind (to_ms).
        sums: dict[str, list[float]] = {}
        for start, by_slo in self.windows.attrib.items():
            if to_ms - cfg.latency_window_ms <= start < to_ms:
                for name, acc in by_slo.items():
                    tot = sums.setdefault(name, [0.0, 0.0, 0.0, 0.0])
                    for i in range(4):
                        tot[i] += acc[i]
        p99_queue = out.get("p99.queue_ms")
        burn = attribute_burn(
            self.coverage.covering(model), sums,
            p99_queue_ms=float(p99_queue) if isinstance(p99_queue, float | int) else None,
            depth_ratio=depth, wait_ms=wait_ms, fast_burn=cfg.fast_burn,
            min_requests=cfg.fast_burn_min_requests, load_share=cfg.load_share,
        )  # fmt: skip
        out["load.queue_share"] = burn.queue_share
        out["slo.fast_burn"] = burn.fast
        out["load.burning"] = burn.caused
        out["load.caused"] = burn.caused
        engine_minute = self.windows.engine_finished(model, to_ms - cfg.latency_window_ms, to_ms)
        self._lacking[model] = lacking_evidence(
            stats=bool(latest), engine_finished=engine_minute > 0, served=served_minute > 0
        )
        # what the gateways have seen answered, at most: ever (the capacity) or now (a
        # capacity learnt an evaluation behind would make a model's first minute look
        # like an overload)
        answered_rps = max(cap or 0.0, served_minute)
        if (
            burn.fast
            and not latest
            and engine_minute == 0
            and answered_rps > 0
            and load.demand_rps >= GATEWAY_ONLY_DEMAND_RATIO * answered_rps
        ):
            # Gateway only, and the gateways receive far more than they have ever seen
            # answered: the burn is load-caused (requests wait for engines that cannot
            # keep up), measured on the gateways' own counts.
            out["load.burning"] = out["load.caused"] = True
        elif burn.fast and not latest and engine_minute == 0:
            # No engine evidence (no stats, nothing finished at an engine: gateway only)
            # and demand within reach of what is served: the queue's share of a burn
            # cannot be measured, so whether it is load-caused is unknown -- not false.
            # Nothing opens on it (an unknown entry never fires); the burn is alerted as a
            # notice that says what is missing.
            out["load.burning"] = out["load.caused"] = None
            worst = max(
                (slo for slo in self.coverage.covering(model) if slo.name in sums),
                key=lambda slo: _burn_rate(sums[slo.name], slo.objective),
                default=None,
            )
            if worst is not None:
                rate = _burn_rate(sums[worst.name], worst.objective)
                text = load_unknown(model, worst.name, rate, GATEWAY_ONLY_DEMAND_RATIO)
                self._notices[model] = LoadNotice(now_ms, model, worst.name, None, text)
        elif burn.fast and not burn.caused and burn.worst is not None:
            rate, name, share = burn.worst
            text = not_load_caused(model, name, rate, share)
            self._notices[model] = LoadNotice(now_ms, model, name, share or 0.0, text)

    def evaluate(self, now_ms: int) -> ControlStep:
        self._prune(now_ms)
        # Final windows only, the same in every path (see the module docstring).
        lag = self.config.budget_lag_ms
        budgets = self.book.evaluate(now_ms - lag) if self.book is not None else []
        events = [e for st in budgets for e in st.events]
        decisions = []
        signals: dict[str, Signals] = {}
        self._notices = {}
        for model in sorted(self.models):
            sig = self.signals(model, now_ms, budgets)
            signals[model] = sig
            d = self._admit(model, now_ms, self.policy.evaluate(model, now_ms, sig))
            decisions.append(noted(d, self._lacking.get(model, "")))
        # While a model's level turns traffic away, its burn counts the policy's own
        # refusals: a "not load-caused" notice is raised only for a model left alone.
        shedding = {d.scope for d in decisions if d.level > 0}
        notices = [self._notices[m] for m in sorted(self._notices) if m not in shedding]
        return ControlStep(now_ms, decisions, budgets, events, signals, notices)

    def queue_cutoff_ms(self, model: str, priority: int = 0) -> float | None:
        """See :meth:`SLOCoverage.queue_cutoff_ms`."""
        return self.coverage.queue_cutoff_ms(model, priority)

    def queue_cutoffs_ms(self, model: str) -> list[float | None] | None:
        """See :meth:`SLOCoverage.queue_cutoffs_ms`."""
        return self.coverage.queue_cutoffs_ms(model)

    def _admit(self, model: str, now_ms: int, d: Evaluation) -> Evaluation:
        """Capacity-aware admission: the rate a level with ``admission`` carries.

        Its inputs are read ``budget_lag_ms`` behind, as the budget signals: the windows
        and each engine's latest stats sample at or before ``now - lag``, which a live
        controller has received whatever the speed, as a replay has. So the same events
        give the same rate (and the same re-issues) at any speed and in replay; the
        level's entry still reads the newest samples."""
        at_ms = now_ms - self.config.budget_lag_ms
        latest: list[StatsSample] = []
        for xs in self._stats.values():
            seen = [x for x in xs if x.ts_ms <= at_ms and x.model == model]
            if seen:
                latest.append(seen[-1])
        load = self._load(model, now_ms, latest)
        cutoff = self.queue_cutoff_ms(model, 0)
        cap = self.admission.capacity_rps(model)
        if cutoff is not None and cap is not None:
            load = dataclasses.replace(
                load, healthy_queue=cap * HEALTHY_QUEUE_SHARE * cutoff / 1000.0
            )
        self.admission.observe(model, load)
        active = self.policy.admits(d.level, d.phase)
        step = self.admission.step(model, load, active=active)
        if step.rate_rps is None:
            return d
        update: dict[str, Any] = {
            "admit_rps": round(step.rate_rps, 3),
            "admit_gateways": self.config.gateway_instances,
        }
        if self.policy.cuts_queue(d.level, d.phase):
            update["queue_timeout_ms"] = self.queue_cutoffs_ms(model)
        lo = at_ms - self.config.latency_window_ms
        medians = latency_medians_ms(
            self.windows.latency, model, lo, at_ms, TTFT_SERVICE_BOUNDARIES
        )
        update.update(ttft_prediction(load, cap, medians))
        actions = d.actions.model_copy(update=update)
        decision = d.decision.model_copy(update={"actions": actions})
        return dataclasses.replace(d, decision=decision)


def lacking_evidence(*, stats: bool, engine_finished: bool, served: bool) -> str:
    """What a model's decisions lack, said ("" when nothing): no ``engine.stats`` sample
    in the last stats window (engines without our plugin, gateway only): the queue's
    depth and wait are unknown; requests answered at the gateways but none reported by
    an engine in the last minute (no plugin: vLLM's own /metrics, gateway only): what is
    served is counted at the gateways and the bad requests' queue share is unknown."""
    parts = []
    if not stats:
        parts.append("no engine.stats: queue.depth_ratio, queue.wait_ms unknown")
    if served and not engine_finished:
        parts.append("no engine.finished: served counted at the gateways, load.queue_share unknown")
    return "; ".join(parts)


def latency_medians_ms(
    latency: Mapping[int, Mapping[int, Mapping[str, Mapping[str, QuantileSketch]]]],
    model: str,
    lo_ms: int,
    hi_ms: int,
    boundaries: tuple[str, ...],
) -> dict[str, float]:
    """The median of each of ``boundaries`` for ``model`` over the windows starting in
    ``[lo_ms, hi_ms)`` (window start -> partition -> model -> boundary -> sketch), for
    those that have one."""
    medians: dict[str, float] = {}
    for b in boundaries:
        merged: QuantileSketch | None = None
        for start, by_part in latency.items():
            if lo_ms <= start < hi_ms:
                for by_model in by_part.values():
                    sk = by_model.get(model, {}).get(b)
                    if sk is None:
                        continue
                    if merged is None:
                        merged = sk.copy()
                    else:
                        merged.merge(sk)
        median = merged.quantile(0.5) if merged is not None else None
        if median is not None:
            medians[b] = median
    return medians


# --------------------------------------------------------------------------- #
# The decision clock: when to evaluate (one control path for worker and replay)
# --------------------------------------------------------------------------- #


def held_key(d: Evaluation) -> tuple[str, ...]:
    """What keeps a level, without the running values and times (``Hold.key``): the
    directive is re-issued when this changes, not every tick."""
    return tuple(h.key for h in d.holds)


RATE_STEP: Final = 0.1  # a directive is re-issued when admit_rps moves by this share


def _rate_moved(before: float | None, now: float | None) -> bool:
    if before is None or now is None:
        return before is not now
    return abs(now - before) > RATE_STEP * max(before, 1e-9)


# A directive is re-issued when its first-token prediction (ttft_queue_ms) moves by more
# than this share and at least TTFT_STEP_MS: gateways refuse as late on it (issue 52).
TTFT_STEP: Final = 0.25
TTFT_STEP_MS: Final = 100.0


def _ttft_moved(before: float | None, now: float | None) -> bool:
    if before is None or now is None:
        return before is not now
    return abs(now - before) > max(TTFT_STEP_MS, TTFT_STEP * before)


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
        self._rates: dict[str, float | None] = {}  # scope -> admit_rps last announced
        self._ttfts: dict[str, float | None] = {}  # scope -> ttft_queue_ms last announced

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
            rate = d.actions.admit_rps
            # the prediction is re-issued only where the gateways refuse on it
            ttft = d.actions.ttft_queue_ms if d.actions.deadline_margin is not None else None
            if d.changed or last is None or last[:2] != (d.level, d.phase):
                # a change (its reason says why); the next evaluation's key is absorbed
                self._announced[d.scope] = (d.level, d.phase, None, d.now_ms)
                self._rates[d.scope], self._ttfts[d.scope] = rate, ttft
                out.append(d)
            elif _rate_moved(self._rates.get(d.scope), rate) or _ttft_moved(
                self._ttfts.get(d.scope), ttft
            ):
                # capacity-aware admission: a new rate (or first-token prediction) is
                # issued at once (not held back)
                self._rates[d.scope], self._ttfts[d.scope] = rate, ttft
                out.append(d)
            elif last[2] is None:
                self._announced[d.scope] = (d.level, d.phase, key, last[3])
            elif key != last[2] and d.now_ms - last[3] >= self.HELD_EVERY_MS:
                self._announced[d.scope] = (d.level, d.phase, key, d.now_ms)
                out.append(d)
        return out


def build_control_loop(
    policy: ControlPolicy,
    spec: SLOSpec | None,
    burn_rules: BurnRules,
    *,
    size_ms: int,
    grace_ms: int,
    queue_capacity: int,
    gateway_instances: int,
    partitions: int = 1,
    decision_delay_ms: int = 0,
) -> ControlLoop:
    """The one assembly of the control loop, for the worker's controller, ``replay`` and
    the backtest: a :class:`Controller` with budgets at the resolution of windows of
    ``size_ms`` closed ``grace_ms`` late (:meth:`ControllerConfig.for_windows`), engine
    queues full at ``queue_capacity``, admission split among ``gateway_instances``
    gateways, and its :class:`DecisionClock` (live: ``partitions`` of the lifecycle topic,
    decisions ``decision_delay_ms`` after every partition's clock and never past the
    budgets' lag; a replay moves it by each closed window instead)."""
    config = ControllerConfig.for_windows(
        size_ms, grace_ms, queue_capacity=queue_capacity, gateway_instances=gateway_instances
    )
    clock = decision_clock(
        size_ms, grace_ms, partitions=partitions, decision_delay_ms=decision_delay_ms
    )
    return ControlLoop(Controller(policy, spec, burn_rules, config), clock)


def decision_clock(
    size_ms: int, grace_ms: int, *, partitions: int = 1, decision_delay_ms: int = 0
) -> DecisionClock:
    """The live controller's :class:`DecisionClock` for windows of ``size_ms`` closed
    ``grace_ms`` late (:func:`build_control_loop`'s; the demo's pacer follows the
    controller's decisions with one of its own)."""
    return DecisionClock(
        size_ms,
        partitions=partitions,
        decision_delay_ms=decision_delay_ms,
        final_lag_ms=budget_lag_ms(size_ms, grace_ms),
    )
