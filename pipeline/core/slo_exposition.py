"""What the controller's ``/metrics`` shows, as plain values (pure; rendered by
:mod:`pipeline.adapters.prometheus`).

Per SLO (or blended tier) and scope, from one evaluation's
:class:`~pipeline.core.budget.BudgetStatus`, under Sloth's recording-rule names so that
Sloth/Pyrra dashboards and alerts work unchanged (labels ``sloth_id``, ``sloth_service``,
``sloth_slo``, plus tailguard's ``scope``):

=============================================  ==============================================
``slo:sli_error:ratio_rate<w>``                error ratio over window ``w`` (5m ... 3d, every
                                               rule window; and the SLO period when rolling)
``slo:objective:ratio``                        the objective
``slo:error_budget:ratio``                     ``1 - objective``
``slo:time_period:days``                       the SLO period's length
``slo:current_burn_rate:ratio``                burn rate over 5m
``slo:period_burn_rate:ratio``                 burn rate over the period so far
``slo:period_error_budget_remaining:ratio``    budget left (1 = untouched, < 0 = overspent)
``sloth_slo_info``                             1, with the objective and window as labels
``tailguard_slo_compliance_ratio``             ``1 - error ratio``, label ``window``
``tailguard_slo_alert_firing``                 1 per firing rule (``rule``, ``severity``)
``tailguard_control_level``                    the control level (0-3) per scope
``tailguard_load_caused``, ``..._queue_share_ratio``, ``tailguard_queue_depth_ratio``,
``tailguard_load_demand_ratio``               load signals per model (is a burn load-caused?)
``tailguard_admit_rps``                        the admission rate in force per model
``tailguard_burn_not_load_caused``             1 per (model, SLO) burning, not load-caused
``tailguard_latency_p99_seconds``              P99 per model and boundary over the latency
                                               window, with the boundary's OTel name
=============================================  ==============================================

A window with no traffic has no sample (not 0: no traffic is not compliance).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from pipeline.core.budget import DAY_MS, BudgetStatus, window_label
from pipeline.core.otel_names import BOUNDARY_NAMES, MODEL_ATTRIBUTE

FamilyKind = Literal["gauge", "counter"]
Labels = tuple[tuple[str, str], ...]

SERVICE: Final = "tailguard"


@dataclass(frozen=True, slots=True)
class Sample:
    labels: Labels
    value: float


@dataclass(frozen=True, slots=True)
class Family:
    name: str
    help: str
    kind: FamilyKind
    samples: tuple[Sample, ...]


class _Builder:
    def __init__(self) -> None:
        self.help: dict[str, tuple[str, FamilyKind]] = {}
        self.samples: dict[str, list[Sample]] = {}

    def add(
        self, name: str, help_: str, labels: Labels, value: float | None,
        kind: FamilyKind = "gauge",
    ) -> None:  # fmt: skip
        self.help.setdefault(name, (help_, kind))
        if value is not None:
            self.samples.setdefault(name, []).append(Sample(labels, float(value)))

    def families(self) -> list[Family]:
        return [
            Family(name, h, k, tuple(self.samples.get(name, ())))
            for name, (h, k) in self.help.items()
            if self.samples.get(name)
        ]


def sloth_labels(slo: str, scope: str, service: str = SERVICE) -> Labels:
    return (
        ("sloth_id", f"{service}-{slo}"),
        ("sloth_service", service),
        ("sloth_slo", slo),
        ("scope", scope),
    )


def _period_label(st: BudgetStatus) -> str | None:
    """``30d`` for a rolling SLO window (Sloth's ``ratio_rate30d``); None for calendar."""
    if not st.window.startswith("rolling"):
        return None
    return window_label(st.period_end_ms - st.period_start_ms)


def budget_families(budgets: Iterable[BudgetStatus], service: str = SERVICE) -> list[Family]:
    b = _Builder()
    for st in budgets:
        base = sloth_labels(st.slo, st.scope, service)
        share = 1.0 - st.objective
        for label, burn in st.burn_rates.items():
            err = None if burn is None else burn * share
            b.add(
                f"slo:sli_error:ratio_rate{label}",
                f"SLI error ratio over the last {label}",
                (*base, ("sloth_window", label)),
                err,
            )
            b.add(
                "tailguard_slo_compliance_ratio",
                "Good / total requests over the window",
                (*base, ("window", label)),
                None if err is None else 1.0 - err,
            )
        period = _period_label(st)
        period_err = None if st.compliance is None else 1.0 - st.compliance
        if period is not None and period not in st.burn_rates:
            b.add(
                f"slo:sli_error:ratio_rate{period}",
                f"SLI error ratio over the last {period}",
                (*base, ("sloth_window", period)),
                period_err,
            )
        b.add("slo:objective:ratio", "SLO objective", base, st.objective)
        b.add("slo:error_budget:ratio", "Error budget: 1 - objective", base, share)
        b.add(
            "slo:time_period:days",
            "SLO period length in days",
            base,
            (st.period_end_ms - st.period_start_ms) / DAY_MS,
        )
        b.add(
            "slo:current_burn_rate:ratio",
            "Burn rate over the last 5m",
            base,
            st.burn_rates.get("5m"),
        )
        b.add(
            "slo:period_burn_rate:ratio",
            "Burn rate over the SLO period so far",
            base,
            st.consumed / st.allowed if st.total and st.allowed > 0 else None,
        )
        b.add(
            "slo:period_error_budget_remaining:ratio",
            "Error budget remaining in the SLO period (1 = untouched, < 0 = overspent)",
            base,
            st.remaining_fraction,
        )
        b.add(
            "sloth_slo_info",
            "SLO metadata",
            (*base, ("sloth_objective", f"{st.objective * 100:g}"), ("window", st.window)),
            1.0,
        )
        for alert in st.alerts:
            b.add(
                "tailguard_slo_alert_firing",
                "A burn or budget rule firing now",
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
                "P99 latency over the controller's latency window",
                (
                    (MODEL_ATTRIBUTE.replace(".", "_"), model),
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
    label = MODEL_ATTRIBUTE.replace(".", "_")
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
    """The worker's own health figures (``consumer_lag_messages`` ...), one gauge each."""
    b = _Builder()
    for name in sorted(health):
        b.add(prefix + name, f"worker health: {name}", (), health[name])
    return b.families()


def all_families(
    budgets: Sequence[BudgetStatus],
    levels: Mapping[str, int],
    p99_ms: Mapping[str, Mapping[str, float | None]],
    health: Mapping[str, float],
    *,
    admit_rps: Mapping[str, float | None] | None = None,
    not_load_caused: Iterable[tuple[str, str]] = (),
) -> list[Family]:
    return [
        *budget_families(budgets),
        *control_families(levels),
        *latency_families(p99_ms),
        *load_families(p99_ms, admit_rps or {}, not_load_caused),
        *health_families(health),
    ]
