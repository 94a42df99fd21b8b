"""Prometheus recording and alerting rules from the SLO spec and the burn rules (pure).

What ``tailguard rules export`` writes (:mod:`pipeline.app.rules` renders it as YAML). The
rules read only the counters every worker exposes
(:mod:`pipeline.core.slo_exposition`: ``tailguard_slo_requests_total`` and
``tailguard_slo_good_requests_total``, label ``slo``), so any Prometheus, or an HA pair,
evaluates them across workers and keeps paging when one worker, or the controller, dies.

Per SLO, Sloth's shape and names (labels ``sloth_id``, ``sloth_service``, ``sloth_slo``),
with Sloth's meaning:

* **SLI recordings** ``slo:sli_error:ratio_rate<w>`` for every window of the burn-rate
  rules that apply to the SLO: ``1 - rate(good[w]) / rate(total[w])`` summed over the
  workers; the SLO period's (``30d``) as the average of the shortest window's ratios over
  the period (Sloth's: a 30-day range over the raw counters is costly); and
  ``tailguard:slo_requests:increase<w>`` for the short windows of rules with a low-traffic
  guard (``min_requests``).
* **Metadata recordings**: ``slo:objective:ratio``, ``slo:error_budget:ratio``,
  ``slo:time_period:days``, ``slo:current_burn_rate:ratio`` (the shortest window),
  ``slo:period_burn_rate:ratio``, ``slo:period_error_budget_remaining:ratio``,
  ``sloth_slo_info``.
* **Two alerts**, one ``page`` and one ``ticket`` (alertname ``TailguardSLOBurn``, label
  ``severity``): the ``burn_rate`` rules of that severity, OR-ed; each is "error ratio over
  ``long`` AND over ``short`` > factor x (1 - objective)", AND, with ``min_requests``, at
  least that many requests over ``short``. Annotations: summary, the SLO's boundary and
  threshold, the runbook, what ``tailguard`` command to run.

The other rule kinds (``budget_fraction``, ``compliance_below``) stay worker-side (the
controller's evaluation, :mod:`pipeline.core.budget`): at most two alerts per SLO here, as
Sloth does. Blended tiers have no counters of their own and are not exported.

A **dead-man group**: ``TailguardEvaluationsStopped`` (the controller's last evaluation is
older than 5 minutes, or no worker exposes it) and ``TailguardWindowsStopped`` (workers
consume events but count no SLO window for 15 minutes).

:data:`INHIBIT_RULES` is the Alertmanager snippet: a page inhibits the ticket of the same
SLO.

Calendar SLOs: Prometheus has no calendar ranges; the period is 30 days (``month``) or 7
(``week``), rolling.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from pipeline.core.budget import DAY_MS, window_label
from pipeline.spec.burn_rules import (
    BudgetFractionRule,
    BurnRateRule,
    BurnRules,
    ComplianceBelowRule,
)
from pipeline.spec.slo import SLO, SLOSpec

AnyRule = BurnRateRule | BudgetFractionRule | ComplianceBelowRule

SERVICE: Final = "tailguard"
REQUESTS: Final = "tailguard_slo_requests_total"
GOOD: Final = "tailguard_slo_good_requests_total"
ALERTNAME: Final = "TailguardSLOBurn"
SEVERITIES: Final = ("page", "ticket")
RUNBOOK: Final = "docs/alerting.md#runbook"  # --runbook-url: where yours is published
CALENDAR_DAYS: Final = {"month": 30, "week": 7}
EVALUATIONS_STALE_S: Final = 300
WINDOWS_STOPPED: Final = "15m"

INHIBIT_RULES: Final[list[dict[str, Any]]] = [
    {
        # the page of an SLO says what its ticket would: one notification, not two
        "source_matchers": [f'alertname="{ALERTNAME}"', 'severity="page"'],
        "target_matchers": [f'alertname="{ALERTNAME}"', 'severity="ticket"'],
        "equal": ["sloth_id"],
    }
]


@dataclass(frozen=True, slots=True)
class RulesOptions:
    service: str = SERVICE
    runbook_url: str = RUNBOOK
    # extra labels on every alert (routing: team, tier ...)
    alert_labels: tuple[tuple[str, str], ...] = ()


def period_ms(slo: SLO) -> int:
    rolling = slo.window.rolling_ms
    if rolling is not None:
        return rolling
    w = slo.window
    return CALENDAR_DAYS[str(w.calendar)] * DAY_MS


def _labels(slo: str, service: str) -> dict[str, str]:
    return {"sloth_id": f"{service}-{slo}", "sloth_service": service, "sloth_slo": slo}


def _selector(labels: dict[str, str]) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def _num(x: float) -> str:
    return f"{x:.10g}"


def burn_rules_for(slo: SLO, rules: BurnRules) -> list[BurnRateRule]:
    return [r for r in rules_for(slo, rules) if isinstance(r, BurnRateRule)]


def rules_for(slo: SLO, rules: BurnRules) -> list[AnyRule]:
    """The rules that apply to ``slo``, as the evaluator picks them (``applies_to``:
    ``slos:``, and a ``compliance_below`` only where ``below <= objective``)."""
    return [r for r in rules.rules if r.applies_to(slo.name, slo.objective)]


def _ratio_windows(mine: Sequence[AnyRule]) -> list[int]:
    """Windows whose error ratio is recorded: burn-rate pairs and compliance windows."""
    out: set[int] = set()
    for r in mine:
        if isinstance(r, BurnRateRule):
            out.update((r.long_ms, r.short_ms))
        elif isinstance(r, ComplianceBelowRule):
            out.add(r.window_ms)
    return sorted(out)


def _guard_window_ms(r: AnyRule) -> int:
    """The window ``min_requests`` is counted over (the evaluator's "short" window)."""
    if isinstance(r, BurnRateRule):
        return r.short_ms
    if isinstance(r, BudgetFractionRule):
        return r.within_ms
    return r.window_ms


def slo_groups(slo: SLO, rules: BurnRules, opts: RulesOptions) -> list[dict[str, Any]]:
    """The recording, metadata and alert groups of one SLO."""
    base = _labels(slo.name, opts.service)
    sel = _selector(base)
    mine = rules_for(slo, rules)
    windows = _ratio_windows(mine)
    shortest = windows[0] if windows else 300_000
    windows = sorted({*windows, shortest})
    counted = f'{{slo="{slo.name}"}}'
    sli: list[dict[str, Any]] = []
    for ms in windows:
        w = window_label(ms)
        sli.append(
            {
                "record": f"slo:sli_error:ratio_rate{w}",
                "expr": f"1 - (sum(rate({GOOD}{counted}[{w}]))\n"
                f"/ sum(rate({REQUESTS}{counted}[{w}])))",
                "labels": {**base, "sloth_window": w},
            }
        )
    guarded = sorted({_guard_window_ms(r) for r in mine if r.min_requests > 0})
    for ms in guarded:
        w = window_label(ms)
        sli.append(
            {
                "record": f"tailguard:slo_requests:increase{w}",
                "expr": f"sum(increase({REQUESTS}{counted}[{w}]))",
                "labels": {**base, "sloth_window": w},
            }
        )
    budget = 1.0 - slo.objective
    pairs = sorted({(r.within_ms, r.of_ms) for r in mine if isinstance(r, BudgetFractionRule)})
    for within_ms, of_ms in pairs:
        sli.append(_spent_record(slo.name, within_ms, of_ms, budget, base))
    period = window_label(period_ms(slo))
    short = window_label(shortest)
    if period_ms(slo) not in windows:
        ratio = f"slo:sli_error:ratio_rate{short}{sel}"
        sli.append(
            {
                "record": f"slo:sli_error:ratio_rate{period}",
                "expr": f"sum_over_time({ratio}[{period}])\n"
                f"/ ignoring (sloth_window)\ncount_over_time({ratio}[{period}])",
                "labels": {**base, "sloth_window": period},
            }
        )
    on = "on (sloth_id, sloth_slo, sloth_service) group_left"
    meta = [
        {"record": "slo:objective:ratio", "expr": f"vector({_num(slo.objective)})", "labels": base},
        {"record": "slo:error_budget:ratio", "expr": f"vector(1 - {_num(slo.objective)})",
         "labels": base},
        {"record": "slo:time_period:days", "expr": f"vector({_num(period_ms(slo) / DAY_MS)})",
         "labels": base},
        {"record": "slo:current_burn_rate:ratio",
         "expr": f"slo:sli_error:ratio_rate{short}{sel}\n/ {on}\nslo:error_budget:ratio{sel}",
         "labels": base},
        {"record": "slo:period_burn_rate:ratio",
         "expr": f"slo:sli_error:ratio_rate{period}{sel}\n/ {on}\nslo:error_budget:ratio{sel}",
         "labels": base},
        {"record": "slo:period_error_budget_remaining:ratio",
         "expr": f"1 - slo:period_burn_rate:ratio{sel}", "labels": base},
        {"record": "sloth_slo_info", "expr": "vector(1)",
         "labels": {**base, "sloth_mode": "tailguard", "sloth_spec": "tailguard/v1",
                    "sloth_objective": _num(slo.objective * 100)}},
    ]  # fmt: skip
    alerts: list[dict[str, Any]] = []
    for severity in SEVERITIES:
        of = [r for r in mine if r.severity == severity]
        if not of:
            continue
        alerts.append(_alert(slo, of, severity, base, sel, budget, opts))
    name = slo.name
    groups = [
        {"name": f"tailguard-slo-sli-recordings-{name}", "rules": sli},
        {"name": f"tailguard-slo-meta-recordings-{name}", "rules": meta},
    ]
    if alerts:
        groups.append({"name": f"tailguard-slo-alerts-{name}", "rules": alerts})
    return groups


def _spent_record(
    slo: str, within_ms: int, of_ms: int, budget: float, base: dict[str, str]
) -> dict[str, Any]:
    """``tailguard:slo_error_budget_spent:ratio``: bad over ``within`` / allowed bad over
    ``of``, a ``budget_fraction`` rule's figure (:mod:`pipeline.core.budget`).

    The allowance is ``(1 - objective) x`` the requests over ``of``, projected as the
    evaluator does while less than ``of`` has been seen: requests seen x ``of`` /
    max(history, ``within``). ``rate()`` divides by the range, not by the history, so
    the history of each worker's series is measured in samples: ``count_over_time`` over
    ``of`` x ``within`` / its count over ``within`` (the scrape interval cancels out)."""
    within, of = window_label(within_ms), window_label(of_ms)
    w_s, of_s = within_ms // 1000, of_ms // 1000
    req = f'{REQUESTS}{{slo="{slo}"}}'
    good = f'{GOOD}{{slo="{slo}"}}'
    history = (
        f"clamp(count_over_time({req}[{of}]) * {w_s} / count_over_time({req}[{within}]), "
        f"{w_s}, {of_s})"
    )
    return {
        "record": "tailguard:slo_error_budget_spent:ratio",
        "expr": f"(sum(increase({req}[{within}])) - sum(increase({good}[{within}])))\n"
        f"/ ({_num(budget)} * sum(increase({req}[{of}]) * {of_s}\n/ {history}))",
        "labels": {**base, "sloth_window": within, "tailguard_budget_of": of},
    }


def _term(r: AnyRule, sel: str, budget: float) -> str:
    """One rule's condition, a vector with the SLO's labels (no window label)."""
    parts: list[str]
    if isinstance(r, BurnRateRule):
        long, short = window_label(r.long_ms), window_label(r.short_ms)
        limit = f"({_num(r.factor)} * {_num(budget)})"
        parts = [
            f"max(slo:sli_error:ratio_rate{short}{sel} > {limit}) without (sloth_window)",
            f"max(slo:sli_error:ratio_rate{long}{sel} > {limit}) without (sloth_window)",
        ]
    elif isinstance(r, BudgetFractionRule):
        within, of = window_label(r.within_ms), window_label(r.of_ms)
        spent = (
            "tailguard:slo_error_budget_spent:ratio"
            + sel[:-1]
            + f', sloth_window="{within}", tailguard_budget_of="{of}"}}'
        )
        parts = [f"max({spent} >= {_num(r.fraction)}) without (sloth_window, tailguard_budget_of)"]
    else:
        # below at every evaluation for `for`: every recorded ratio of the last `for`
        # and the one `for` ago (the clock started at least `for` ago)
        w, held = window_label(r.window_ms), window_label(r.for_ms)
        ratio = f"slo:sli_error:ratio_rate{w}{sel}"
        limit = f"(1 - {_num(r.below)})"
        parts = [
            f"max(min_over_time({ratio}[{held}]) > {limit}) without (sloth_window)",
            f"max({ratio} offset {held} > {limit}) without (sloth_window)",
        ]
    if r.min_requests > 0:
        parts.append(
            f"max(tailguard:slo_requests:increase{window_label(_guard_window_ms(r))}{sel}"
            f" >= {r.min_requests}) without (sloth_window)"
        )
    return "(\n    " + "\n    and\n    ".join(parts) + "\n)"


def describe_rule(r: AnyRule) -> str:
    """A rule's condition in words (the alert's summary)."""
    if isinstance(r, BurnRateRule):
        return f"{_num(r.factor)}x over {window_label(r.long_ms)} and {window_label(r.short_ms)}"
    if isinstance(r, BudgetFractionRule):
        return (
            f"{_num(r.fraction * 100)}% of the {window_label(r.of_ms)} budget within "
            f"{window_label(r.within_ms)}"
        )
    return (
        f"compliance over {window_label(r.window_ms)} < {_num(r.below * 100)}% for "
        f"{window_label(r.for_ms)}"
    )


def _alert(  # noqa: PLR0917
    slo: SLO,
    rules: Sequence[AnyRule],
    severity: str,
    base: dict[str, str],
    sel: str,
    budget: float,
    opts: RulesOptions,
) -> dict[str, Any]:
    expr = "\nor\n".join(_term(r, sel, budget) for r in rules)
    what = "; ".join(f"{r.name}: {describe_rule(r)}" for r in rules)
    op = "<" if slo.threshold_strict else "<="
    return {
        "alert": ALERTNAME,
        "expr": expr,
        "labels": {
            "severity": severity,
            "slo": slo.name,
            "service": opts.service,
            "source": "prometheus",
            **dict(opts.alert_labels),
        },
        "annotations": {
            "summary": f"SLO {slo.name}: error budget burning fast ({severity}: {what})",
            "title": f"({{{{ $labels.sloth_service }}}} {slo.name}) {severity}: error "
            "budget burn rate",
            "boundary": f"{slo.boundary} {op} {_num(slo.threshold_ms)} ms for "
            f"{_num(slo.objective * 100)}% ({slo.description or slo.name})",
            "runbook_url": opts.runbook_url,
            "explain": "tailguard report --since <the alert's start, ISO 8601> (the burning "
            "minutes, per model); then tailguard explain <request_id> of a slow request "
            "(where its time went)",
        },
    }


def deadman_group() -> dict[str, Any]:
    """Alerts that fire when tailguard itself stops: no alert above can fire then."""
    stamp = "tailguard_controller_last_evaluation_timestamp_seconds"
    return {
        "name": "tailguard-deadman",
        "rules": [
            {
                "alert": "TailguardEvaluationsStopped",
                "expr": f"(time() - max({stamp}) > {EVALUATIONS_STALE_S})\nor\nabsent({stamp})",
                "for": "5m",
                "labels": {"severity": "page", "service": SERVICE, "source": "prometheus"},
                "annotations": {
                    "summary": "tailguard's controller has not evaluated the SLOs for 5 "
                    "minutes (or no worker exposes it): no control, no worker-side alert",
                    "runbook_url": RUNBOOK,
                },
            },
            {
                "alert": "TailguardWindowsStopped",
                "expr": f"sum(rate({REQUESTS}[{WINDOWS_STOPPED}])) == 0\n"
                f"and\nsum(rate(tailguard_worker_events_consumed_total[{WINDOWS_STOPPED}])) > 0",
                "for": "5m",
                "labels": {"severity": "page", "service": SERVICE, "source": "prometheus"},
                "annotations": {
                    "summary": f"tailguard's workers consume events but counted no SLO window "
                    f"for {WINDOWS_STOPPED}: the burn-rate alerts are blind",
                    "runbook_url": RUNBOOK,
                },
            },
        ],
    }


def rule_groups(
    spec: SLOSpec, rules: BurnRules, opts: RulesOptions | None = None
) -> dict[str, Any]:
    """The rule file (``{"groups": [...]}``) for every SLO of ``spec`` + the dead-man group."""
    o = opts or RulesOptions()
    groups: list[dict[str, Any]] = []
    for slo in spec.slos:
        groups.extend(slo_groups(slo, rules, o))
    groups.append(deadman_group())
    return {"groups": groups}


def prometheus_rule(doc: dict[str, Any], name: str = "tailguard-slos") -> dict[str, Any]:
    """The same groups as a Prometheus Operator ``PrometheusRule``."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": SERVICE}},
        "spec": doc,
    }


def alertmanager_example(receiver_url: str = "http://127.0.0.1:5001/") -> dict[str, Any]:
    """An Alertmanager configuration: pages and tickets to receivers, the page inhibiting
    the ticket of the same SLO."""
    return {
        "route": {
            "receiver": "tickets",
            "group_by": ["alertname", "sloth_id"],
            "group_wait": "30s",
            "routes": [{"matchers": ['severity="page"'], "receiver": "pages"}],
        },
        "receivers": [
            {"name": "pages", "webhook_configs": [{"url": receiver_url}]},
            {"name": "tickets", "webhook_configs": [{"url": receiver_url}]},
        ],
        "inhibit_rules": INHIBIT_RULES,
    }
