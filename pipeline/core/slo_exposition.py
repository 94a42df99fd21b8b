"""What ``/metrics`` shows, as plain values (pure; rendered by
:mod:`pipeline.adapters.prometheus`).

Every name is an exposition name that ``promtool check metrics`` accepts: no ``:`` (those
are recording-rule names: ``tailguard rules export`` writes Sloth's ``slo:*`` rules from
the counters below), counters typed as counters with ``_total``, base units (seconds).
The mapping from the names of earlier releases is :data:`RENAMED` (docs/alerting.md).

Two kinds of figures, told apart by their names:

* **Counters and histograms every worker exposes** (its own partitions' final windows;
  :class:`WindowCounters`): what Prometheus rules aggregate across workers.

  ========================================  ===========================================
  ``tailguard_slo_requests_total``          requests an SLO counted (``slo``)
  ``tailguard_slo_good_requests_total``     of those, good (within the threshold)
  ``tailguard_request_latency_seconds``     histogram per model and boundary, native
                                            (exponential, :func:`native_schema`) and
                                            classic (the spec's thresholds among the
                                            buckets) in one family
  ``tailguard_worker_*_total``              the worker's own counts (events consumed ...)
  ========================================  ===========================================

  and per blended tier (label ``tier``) ``tailguard_slo_tier_secondary_good_requests_total``:
  of its primary SLO's requests, those bad for the primary and good for the secondary (its
  total and primary-good counts are the primary's counters).

* **Gauges of the controller's last evaluation** (the worker that runs it), per SLO (or
  blended tier) and ``scope``: ``tailguard_slo_burn_rate`` and
  ``tailguard_slo_compliance_ratio`` (label ``window``), ``tailguard_slo_objective_ratio``,
  ``tailguard_slo_period_seconds``, the **projected** period figures
  (``tailguard_slo_period_burn_rate_projected``,
  ``tailguard_slo_error_budget_remaining_projected_ratio``: the budget is projected to the
  whole period from the traffic seen, label ``allowance_basis``; Sloth's period burn rate is
  another figure), ``tailguard_slo_info``, ``tailguard_slo_alert_firing`` (the worker-side
  rules), ``tailguard_control_level``, the load signals, ``tailguard_admit_rps``,
  ``tailguard_latency_p99_seconds`` (the controller's input, over its latency window: not
  aggregatable; the histogram is) and
  ``tailguard_controller_last_evaluation_timestamp_seconds`` (the dead-man rule's input).

A window with no traffic has no gauge sample (not 0: no traffic is not compliance).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from pipeline.contract.summary import WindowSummary
from pipeline.core.budget import BudgetStatus, window_label
from pipeline.core.otel_names import BOUNDARY_NAMES, MODEL_ATTRIBUTE
from pipeline.core.sketch import bucket_value

FamilyKind = Literal["gauge", "counter", "histogram"]
Labels = tuple[tuple[str, str], ...]

SERVICE: Final = "tailguard"
MODEL_LABEL: Final = MODEL_ATTRIBUTE.replace(".", "_")  # gen_ai_request_model

# Old name -> new name (or what replaces it), for dashboards and alerts written against
# earlier releases; reproduced in docs/alerting.md. ``<w>``: a window label (5m ... 30d).
RENAMED: Final[dict[str, str]] = {
    "slo:sli_error:ratio_rate<w>": "recording rule of `tailguard rules export` (Sloth's "
    "meaning, from the counters); the store's figure: 1 - tailguard_slo_compliance_ratio"
    "{window=<w>}",
    "slo:objective:ratio": "tailguard_slo_objective_ratio (and the exported rule)",
    "slo:error_budget:ratio": "recording rule of `tailguard rules export`",
    "slo:time_period:days": "tailguard_slo_period_seconds (and the exported rule, in days)",
    "slo:current_burn_rate:ratio": 'tailguard_slo_burn_rate{window="5m"}',
    "slo:period_burn_rate:ratio": "tailguard_slo_period_burn_rate_projected",
    "slo:period_error_budget_remaining:ratio": (
        "tailguard_slo_error_budget_remaining_projected_ratio"
    ),
    "sloth_slo_info": "tailguard_slo_info",
    "labels sloth_id, sloth_service, sloth_slo": "label slo (the exported rules add Sloth's)",
    "tailguard_worker_events_consumed": "tailguard_worker_events_consumed_total (counter)",
    "tailguard_worker_rows_written": "tailguard_worker_rows_written_total (counter)",
    "tailguard_worker_store_write_retries": "tailguard_worker_store_write_retries_total",
    "tailguard_worker_store_rejected_rows": "tailguard_worker_store_rejected_rows_total",
    "tailguard_worker_generation_finished_<x>": "tailguard_worker_generation_finished_<x>_total",
}

# The worker's health figures that only grow (exposed as counters, ``_total``).
HEALTH_COUNTERS: Final = frozenset(
    {
        "events_consumed",
        "rows_written",
        "store_write_retries",
        "store_rejected_rows",
        "generation_finished_requests",
        "generation_finished_windows",
        "generation_finished_partials",
        "stalled_partitions_read_again",
        "redelivered_messages_dropped",
        "join_duplicates",
        "join_duplicate_ids_changed",
    }
)

# Classic histogram buckets (ms): 10 per decade from 1 ms to 300 s (the next bound at most
# 1.33x the last: histogram_quantile interpolates within a bucket, so its error is a
# fraction of the bucket's width), plus each SLO's threshold on that boundary (so the
# count of good requests is a bucket, exact to the sketch's accuracy).
_STEPS: Final = (1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0)
LADDER_MS: Final = (
    *(m * 10.0**e for e in range(5) for m in _STEPS),
    100_000.0, 120_000.0, 150_000.0, 200_000.0, 250_000.0, 300_000.0,
)  # fmt: skip


# Native histograms: the zero bucket's width (client_golang's default, 2^-128 s: only
# observations of 0 fall there) and the finest schema Prometheus takes.
NATIVE_ZERO_THRESHOLD_S: Final = 2.0**-128
NATIVE_SCHEMA_MAX: Final = 8
NATIVE_SCHEMA_MIN: Final = -4


def native_schema(relative_accuracy: float) -> int:
    """The coarsest native-histogram schema whose buckets grow by at most half the
    sketch's ``relative_accuracy`` (schema ``s``: bucket bounds ``2^(i / 2^s)``, each
    ``2^(2^-s)`` times the last), so ``histogram_quantile`` (exponential interpolation
    within the bucket holding the rank) adds at most half the sketch's error to the
    sketch's own; capped at :data:`NATIVE_SCHEMA_MAX`. At 1 %: schema 8 (0.27 %), where
    schema 7 grows by 0.54 % and 6 by 1.09 %. Finer costs nothing here: every sketch bin
    lands in one native bucket whatever the schema (the sketch's bins are wider), so a
    histogram has at most as many buckets as the sketches have bins."""
    for schema in range(NATIVE_SCHEMA_MIN, NATIVE_SCHEMA_MAX + 1):
        if 2.0 ** (2.0**-schema) - 1.0 <= relative_accuracy / 2:
            return schema
    return NATIVE_SCHEMA_MAX


def _exponential_fractions(schema: int) -> tuple[float, ...]:
    return tuple(0.5 * 2.0 ** (j / 2**schema) for j in range(2**schema))


def native_index(value: float, schema: int) -> int:
    """The index ``i`` of the native bucket ``(2^((i-1)/2^s), 2^(i/2^s)]`` holding
    ``value`` > 0 (Prometheus' and client_golang's ``frexp`` computation)."""
    frac, exp = math.frexp(value)
    if schema > 0:
        fractions = _FRACTIONS.get(schema)
        if fractions is None:
            fractions = _FRACTIONS[schema] = _exponential_fractions(schema)
        return bisect.bisect_left(fractions, frac) + (exp - 1) * len(fractions)
    key = exp - 1 if frac == 0.5 else exp
    return (key + (1 << -schema) - 1) >> -schema


def native_upper_bound(index: int, schema: int) -> float:
    """The upper bound of native bucket ``index`` (``2^(index / 2^schema)``)."""
    return float(2.0 ** (index / 2.0**schema))


_FRACTIONS: dict[int, tuple[float, ...]] = {}


@dataclass(frozen=True, slots=True)
class Sample:
    """``start_s``: when a counter began counting from 0 (unix seconds; None: unknown)."""

    labels: Labels
    value: float
    start_s: float | None = None


@dataclass(frozen=True, slots=True)
class NativeBuckets:
    """A native histogram's buckets: ``schema`` (bucket ``i`` holds
    ``(2^((i-1)/2^schema), 2^(i/2^schema)]`` seconds), the zero bucket
    (``[0, zero_threshold_s]``) and the populated positive buckets ``(i, count)``,
    ascending ``i``."""

    schema: int
    zero_threshold_s: float
    zero_count: int
    positive: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class HistogramSample:
    """One histogram: classic cumulative ``buckets`` ``(le seconds, count)`` ending with
    ``+Inf`` (the count), the sum of the observations in seconds, and the same
    observations in native buckets (None: classic only). ``start_s`` as for
    :class:`Sample`."""

    labels: Labels
    buckets: tuple[tuple[float, float], ...]
    sum: float
    native: NativeBuckets | None = None
    start_s: float | None = None


@dataclass(frozen=True, slots=True)
class Family:
    """``name`` is the exposed name without the ``_total`` a counter gets."""

    name: str
    help: str
    kind: FamilyKind
    samples: tuple[Sample | HistogramSample, ...]


class _Builder:
    def __init__(self) -> None:
        self.help: dict[str, tuple[str, FamilyKind]] = {}
        self.samples: dict[str, list[Sample | HistogramSample]] = {}

    def add(
        self, name: str, help_: str, labels: Labels, value: float | None,
        kind: FamilyKind = "gauge", *, start_s: float | None = None,
    ) -> None:  # fmt: skip
        self.help.setdefault(name, (help_, kind))
        if value is not None:
            self.samples.setdefault(name, []).append(Sample(labels, float(value), start_s))

    def histogram(self, name: str, help_: str, sample: HistogramSample) -> None:
        self.help.setdefault(name, (help_, "histogram"))
        self.samples.setdefault(name, []).append(sample)

    def families(self) -> list[Family]:
        return [
            Family(name, h, k, tuple(self.samples.get(name, ())))
            for name, (h, k) in self.help.items()
            if self.samples.get(name)
        ]


def slo_labels(slo: str, scope: str) -> Labels:
    return (("slo", slo), ("scope", scope))


def _period_label(st: BudgetStatus) -> str | None:
    """``30d`` for a rolling SLO window; None for calendar."""
    if not st.window.startswith("rolling"):
        return None
    return window_label(st.period_end_ms - st.period_start_ms)


def budget_families(budgets: Iterable[BudgetStatus]) -> list[Family]:
    b = _Builder()
    for st in budgets:
        base = slo_labels(st.slo, st.scope)
        share = 1.0 - st.objective
        windows = dict(st.burn_rates)
        period = _period_label(st)
        if period is not None and period not in windows and st.compliance is not None:
            windows[period] = (1.0 - st.compliance) / share if share > 0 else None
        for label, burn in windows.items():
            b.add(
                "tailguard_slo_burn_rate",
                "Burn rate over the window: error ratio / (1 - objective), from the store's "
                "counts at the controller's last evaluation",
                (*base, ("window", label)),
                burn,
            )
            b.add(
                "tailguard_slo_compliance_ratio",
                "Good / total requests over the window (the controller's last evaluation)",
                (*base, ("window", label)),
                None if burn is None else 1.0 - burn * share,
            )
        b.add("tailguard_slo_objective_ratio", "SLO objective (good / total)", base, st.objective)
        b.add(
            "tailguard_slo_period_seconds",
            "SLO period length",
            base,
            (st.period_end_ms - st.period_start_ms) / 1000.0,
        )
        projected = (*base, ("allowance_basis", st.allowance_basis))
        b.add(
            "tailguard_slo_period_burn_rate_projected",
            "Bad requests so far / the period's allowed bad requests, the allowance PROJECTED "
            "to the whole period from the traffic seen (not Sloth's period burn rate, the "
            "error ratio over the period / (1 - objective))",
            projected,
            st.consumed / st.allowed if st.total and st.allowed > 0 else None,
        )
        b.add(
            "tailguard_slo_error_budget_remaining_projected_ratio",
            "Error budget remaining in the SLO period (1 = untouched, < 0 = overspent), of "
            "the allowance PROJECTED to the whole period from the traffic seen",
            projected,
            st.remaining_fraction,
        )
        b.add(
            "tailguard_slo_info",
            "SLO metadata (value 1)",
            (*base, ("objective", f"{st.objective:g}"), ("window", st.window)),
            1.0,
        )
        for alert in st.alerts:
            b.add(
                "tailguard_slo_alert_firing",
                "A worker-side burn or budget rule firing now (the controller's evaluation)",
                (*base, ("rule", alert.rule), ("severity", alert.severity)),
                1.0,
            )
    return b.families()


def control_families(levels: Mapping[str, int]) -> list[Family]:
    """``tailguard_control_level`` per scope (the level last decided)."""
    b = _Builder()
    for scope, level in sorted(levels.items()):
        b.add("tailguard_control_level", "Control level (0 .. 3)", (("scope", scope),), level)
    return b.families()


def latency_families(p99_ms: Mapping[str, Mapping[str, float | None]]) -> list[Family]:
    """``tailguard_latency_p99_seconds`` from ``model -> {"p99.<boundary>": ms}``
    (:meth:`pipeline.core.control.Controller.signals`); labelled with the OTel name."""
    b = _Builder()
    for model in sorted(p99_ms):
        figures = p99_ms[model]
        for boundary, otel in BOUNDARY_NAMES.items():
            ms = figures.get(f"p99.{boundary}")
            b.add(
                "tailguard_latency_p99_seconds",
                "P99 latency over the controller's latency window (its control input; aggregate "
                "tailguard_request_latency_seconds instead)",
                (
                    (MODEL_LABEL, model),
                    ("boundary", boundary),
                    ("otel_name", otel.name),
                ),
                None if ms is None else ms / 1000.0,
            )
    return b.families()


LOAD_GAUGES: Final = (
    ("load.caused", "tailguard_load_caused", "1 while the model's burn is load-caused (queueing)"),
    (
        "load.queue_share",
        "tailguard_load_queue_share_ratio",
        "Share of the bad requests' time spent queued (last minute)",
    ),
    (
        "queue.depth_ratio",
        "tailguard_queue_depth_ratio",
        "Requests waiting in the engines' queues over their batch",
    ),
    (
        "load.demand_ratio",
        "tailguard_load_demand_ratio",
        "Requests received per second over what the engines have shown they serve",
    ),
)


def load_families(
    signals: Mapping[str, Mapping[str, Any]],
    admit_rps: Mapping[str, float | None],
    not_load_caused: Iterable[tuple[str, str]] = (),
) -> list[Family]:
    """Per model: the load signals (is the burn load-caused?), the admission rate in
    force (``tailguard_admit_rps``, absent while admission is off) and, per (model, SLO),
    ``tailguard_burn_not_load_caused`` = 1 for a fast burn that is not load-caused."""
    b = _Builder()
    label = MODEL_LABEL
    for model in sorted(signals):
        sig = signals[model]
        for key, name, help_text in LOAD_GAUGES:
            v = sig.get(key)
            value = float(v) if isinstance(v, bool | int | float) else None
            b.add(name, help_text, ((label, model),), value)
    for model, rate in sorted(admit_rps.items()):
        if rate is not None:
            b.add("tailguard_admit_rps", "Admission rate in force (requests/s)",
                  ((label, model),), rate)  # fmt: skip
    for model, slo in sorted(not_load_caused):
        b.add(
            "tailguard_burn_not_load_caused",
            "1: the SLO burns fast on the model, not load-caused (nothing shed)",
            ((label, model), ("slo", slo)),
            1.0,
        )
    return b.families()


def health_families(health: Mapping[str, float], prefix: str = "tailguard_worker_") -> list[Family]:
    """The worker's own health figures: counters (:data:`HEALTH_COUNTERS`) and gauges
    (``consumer_lag_messages`` ...)."""
    b = _Builder()
    for name in sorted(health):
        kind: FamilyKind = "counter" if name in HEALTH_COUNTERS else "gauge"
        b.add(prefix + name, f"worker health: {name}", (), health[name], kind)
    return b.families()


def evaluation_families(last_evaluation_s: float | None) -> list[Family]:
    """When the controller last evaluated (wall time): the dead-man rule's input."""
    b = _Builder()
    b.add(
        "tailguard_controller_last_evaluation_timestamp_seconds",
        "Wall time of the controller's last evaluation (unix seconds)",
        (),
        last_evaluation_s,
    )
    return b.families()


def all_families(
    budgets: Sequence[BudgetStatus],
    levels: Mapping[str, int],
    p99_ms: Mapping[str, Mapping[str, float | None]],
    health: Mapping[str, float],
    *,
    admit_rps: Mapping[str, float | None] | None = None,
    not_load_caused: Iterable[tuple[str, str]] = (),
    last_evaluation_s: float | None = None,
) -> list[Family]:
    return [
        *budget_families(budgets),
        *control_families(levels),
        *latency_families(p99_ms),
        *load_families(p99_ms, admit_rps or {}, not_load_caused),
        *health_families(health),
        *evaluation_families(last_evaluation_s),
    ]


# --------------------------------------------------------------------------- #
# Counters and histograms of the worker's own final windows
# --------------------------------------------------------------------------- #


def histogram_bounds_ms(thresholds_ms: Iterable[float] = ()) -> tuple[float, ...]:
    """:data:`LADDER_MS` with ``thresholds_ms`` among the bounds, ascending."""
    return tuple(sorted({*LADDER_MS, *(float(t) for t in thresholds_ms)}))


SEEN_WINDOWS: Final = 100_000  # ~ a day of 10 s windows on 12 partitions


@dataclass
class _Histogram:
    counts: list[int]  # per bound, then the overflow (not cumulative)
    sum_ms: float = 0.0
    zero: int = 0  # observations <= 0 (the native zero bucket)
    native: dict[int, int] = field(default_factory=dict)  # native bucket index -> count


class WindowCounters:
    """Cumulative counts of the final window summaries one worker stored.

    Per SLO, requests and good requests (:class:`~pipeline.contract.summary.SLOWindowCounts`
    of final windows, each (partition, start) once, and of corrections), per blended tier
    its secondary-only good requests (``WindowSummary.tiers``); per model and
    boundary, a histogram of the windows' sketches, classic and native (each sketch bin
    counted in the bucket holding the value the sketch reports for it: within the
    sketch's relative accuracy; native buckets at :func:`native_schema` of it). Counters
    never go down: a correction may take requests back (a partial record replaced), so
    each exposed counter is the running maximum of the exact sum (equal to it again as
    soon as new windows make up the correction, which is every window once traffic
    flows).

    Not thread-safe: :class:`pipeline.adapters.prometheus.MetricsState` holds a lock.
    """

    def __init__(
        self,
        thresholds_ms: Mapping[str, Iterable[float]] | None = None,
        relative_accuracy: float = 0.01,
    ) -> None:
        self.relative_accuracy = relative_accuracy
        self.schema = native_schema(relative_accuracy)
        self._bounds: dict[str, tuple[float, ...]] = {
            b: histogram_bounds_ms((thresholds_ms or {}).get(b, ())) for b in BOUNDARY_NAMES
        }
        # final windows counted, (partition, start): a repeat (at-least-once) is ignored,
        # as the controller ignores it; the oldest forgotten past SEEN_WINDOWS
        self._seen: dict[tuple[int, int], None] = {}
        self._exact: dict[str, list[int]] = {}  # slo -> [total, good]
        self._shown: dict[str, list[int]] = {}
        # blended tier -> [good_secondary_only] (exact, shown)
        self._tier_exact: dict[str, int] = {}
        self._tier_shown: dict[str, int] = {}
        self._hist: dict[tuple[str, str], _Histogram] = {}
        self._values: dict[int, tuple[float, int]] = {}  # sketch key -> (ms, native index)

    def add(self, summary: WindowSummary) -> None:
        """One final summary (a window or a correction); provisional ones are ignored."""
        if not summary.final:
            return
        if summary.correction_id is None:
            window = (summary.partition, summary.start_ms)
            if window in self._seen:
                return
            self._seen[window] = None
            if len(self._seen) > SEEN_WINDOWS:
                del self._seen[next(iter(self._seen))]
        for slo, c in summary.slos.items():
            exact = self._exact.setdefault(slo, [0, 0])
            shown = self._shown.setdefault(slo, [0, 0])
            exact[0] += c.total
            exact[1] += c.good
            shown[0] = max(shown[0], exact[0])
            shown[1] = max(shown[1], exact[1])
        for tier, n in summary.tiers.items():
            self._tier_exact[tier] = self._tier_exact.get(tier, 0) + n
            self._tier_shown[tier] = max(self._tier_shown.get(tier, 0), self._tier_exact[tier])
        if summary.correction_id is not None:
            return
        for model, mw in summary.models.items():
            if model == "*":
                continue  # PromQL sums the models
            for boundary, sk in mw.boundaries.items():
                bounds = self._bounds.get(boundary)
                if bounds is None or sk.count <= 0:
                    continue
                h = self._hist.get((model, boundary))
                if h is None:
                    h = self._hist[(model, boundary)] = _Histogram([0] * (len(bounds) + 1))
                zero = sk.zero_count + sum(sk.neg_counts)
                h.counts[0] += zero
                h.zero += zero
                for bin_key, n in zip(sk.pos_keys, sk.pos_counts, strict=True):
                    ms, index = self._value(bin_key)
                    h.counts[bisect.bisect_left(bounds, ms)] += n
                    h.native[index] = h.native.get(index, 0) + n
                h.sum_ms += sk.sum

    def _value(self, key: int) -> tuple[float, int]:
        """The value (ms) the sketch reports for bin ``key`` and its native bucket (s)."""
        v = self._values.get(key)
        if v is None:
            ms = bucket_value(1, key, self.relative_accuracy)
            v = self._values[key] = (ms, native_index(ms / 1000.0, self.schema))
        return v

    def families(self, start_s: float | None = None) -> list[Family]:
        """The counters and histograms; ``start_s``: when counting began (the counters
        were 0 then; unix seconds), exposed as their start (created) timestamp."""
        b = _Builder()
        for slo in sorted(self._shown):
            total, good = self._shown[slo]
            b.add(
                "tailguard_slo_requests",
                "Requests the SLO counted (final windows of this worker's partitions)",
                (("slo", slo),),
                total,
                "counter",
                start_s=start_s,
            )
            b.add(
                "tailguard_slo_good_requests",
                "Of the SLO's requests, those within its threshold",
                (("slo", slo),),
                good,
                "counter",
                start_s=start_s,
            )
        for tier in sorted(self._tier_shown):
            b.add(
                "tailguard_slo_tier_secondary_good_requests",
                "Of a blended tier's requests (its primary SLO's), those bad for the primary "
                "and good for the secondary (credited secondary_weight each)",
                (("tier", tier),),
                self._tier_shown[tier],
                "counter",
                start_s=start_s,
            )
        for (model, boundary), h in sorted(self._hist.items()):
            bounds = self._bounds[boundary]
            cumulative, running = [], 0
            for bound, n in zip((*bounds, float("inf")), h.counts, strict=True):
                running += n
                cumulative.append((bound / 1000.0, float(running)))
            b.histogram(
                "tailguard_request_latency_seconds",
                "Request latency per boundary (native buckets, and classic ones with the "
                "SLO thresholds among the bounds), from the final windows' sketches",
                HistogramSample(
                    (
                        (MODEL_LABEL, model),
                        ("boundary", boundary),
                        ("otel_name", BOUNDARY_NAMES[boundary].name),
                    ),
                    tuple(cumulative),
                    h.sum_ms / 1000.0,
                    NativeBuckets(
                        self.schema,
                        NATIVE_ZERO_THRESHOLD_S,
                        h.zero,
                        tuple(sorted(h.native.items())),
                    ),
                    start_s,
                ),
            )
        return b.families()


def thresholds_by_boundary(slos: Iterable[Any]) -> dict[str, list[float]]:
    """``boundary -> [threshold_ms ...]`` of a spec's SLOs (the histogram bounds they add)."""
    out: dict[str, list[float]] = {}
    for slo in slos:
        out.setdefault(slo.boundary, []).append(float(slo.threshold_ms))
    return out
