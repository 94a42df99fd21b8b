"""Prometheus recording and alerting rules from the SLO spec and the burn rules (pure).

What ``tailguard rules export`` writes (:mod:`pipeline.app.rules` renders it as YAML). The
rules read only the counters every worker exposes
(:mod:`pipeline.core.slo_exposition`: ``tailguard_slo_requests_total`` and
``tailguard_slo_good_requests_total``, label ``slo``), so any Prometheus, or an HA pair,
evaluates them across workers and keeps paging when one worker, or the controller, dies.

Per SLO, Sloth's shape and names (labels ``sloth_id``, ``sloth_service``, ``sloth_slo``),
with Sloth's meaning:

* **SLI recordings** ``slo:sli_error:ratio_rate<w>`` for every window of the
  ``burn_rate`` and ``compliance_below`` rules that apply to the SLO: ``1 - rate(good[w])
  / rate(total[w])`` summed over the workers; the SLO period's (``30d``) as the average
  of the shortest window's ratios over the period (Sloth's: a 30-day range over the raw
  counters is costly); and
  ``tailguard:slo_requests:increase<w>`` for the short windows of rules with a low-traffic
  guard (``min_requests``); ``tailguard:slo_error_budget_spent:ratio`` per
  ``budget_fraction`` rule's (``within``, ``of``).
* **Metadata recordings**: ``slo:objective:ratio``, ``slo:error_budget:ratio``,
  ``slo:time_period:days``, ``slo:current_burn_rate:ratio`` (the shortest window),
  ``slo:period_burn_rate:ratio``, ``slo:period_error_budget_remaining:ratio``,
  ``sloth_slo_info``.
* **Two alerts**, one ``page`` and one ``ticket`` (alertname ``TailguardSLOBurn``, label
  ``severity``): every rule of that severity that applies to the SLO, OR-ed, each a
  condition with the SLO's labels:

  - ``burn_rate``: "error ratio over ``long`` AND over ``short`` > factor x (1 -
    objective)";
  - ``budget_fraction``: ``tailguard:slo_error_budget_spent:ratio`` (bad over ``within`` /
    the allowed bad over ``of``, the allowance projected over a young history as the
    evaluator does) >= ``fraction``;
  - ``compliance_below``: the ratio over ``window`` > 1 - ``below`` at every recorded
    evaluation of the last ``for`` and at the one ``for`` ago (``min_over_time`` and
    ``offset``: the clock started at least ``for`` ago);

  AND, with ``min_requests``, at least that many requests over the rule's short window.
  Annotations: summary (every condition in words), the SLO's boundary and threshold, the
  runbook, what ``tailguard`` command to run.
* **Blended tiers** (the spec's ``tiers:``): Sloth's recordings under the tier's name, its
  good requests ``good(primary) + secondary_weight x
  tailguard_slo_tier_secondary_good_requests_total{tier}`` over its primary's requests,
  its objective, its primary's period. The rules that apply to the tier (as the evaluator
  picks them) add their conditions to the **primary's** page and ticket, relabelled as the
  primary's: one page and one ticket per SLO, its tiers included.

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
TIER_SECONDARY: Final = "tailguard_slo_tier_secondary_good_requests_total"
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


@dataclass(frozen=True, slots=True)
class Objective:
    """What one SLO's or blended tier's rules read: its objective, period and counters.

    ``total`` and ``good``: counter selectors (a tier: its primary's); ``credit``: a
    tier's ``(secondary_weight, its secondary-only counter)``, added to the good
    requests."""

    name: str
    objective: float
    period_ms: int
    total: str
    good: str
    credit: tuple[float, str] | None = None

    @classmethod
    def of_slo(cls, slo: SLO) -> Objective:
        sel = f'{{slo="{slo.name}"}}'
        return cls(slo.name, slo.objective, period_ms(slo), REQUESTS + sel, GOOD + sel)

    @classmethod
    def of_tier(cls, spec: SLOSpec, name: str) -> Objective:
        tier = spec.tiers[name]
        sel = f'{{slo="{tier.primary}"}}'
        credit = (tier.secondary_weight, f'{TIER_SECONDARY}{{tier="{name}"}}')
        return cls(
            name, tier.objective, period_ms(spec.slo(tier.primary)), REQUESTS + sel,
            GOOD + sel, credit,
        )  # fmt: skip

    def good_sum(self, fn: str, w: str) -> str:
        """``sum(fn(good[w]))`` (+ a tier's weighted credit, read as 0 while no worker
        exposes its counter: a worker of an earlier release)."""
        good = f"sum({fn}({self.good}[{w}]))"
        if self.credit is None:
            return good
        weight, sel = self.credit
        return f"({good} + {_num(weight)} * (sum({fn}({sel}[{w}])) or vector(0)))"


def rules_for(name: str, objective: float, rules: BurnRules) -> list[AnyRule]:
    """The rules that apply to an SLO or tier, as the evaluator picks them
    (``applies_to``: ``slos:``, and a ``compliance_below`` only where ``below <=
    objective``)."""
    return [r for r in rules.rules if r.applies_to(name, objective)]


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


@dataclass(frozen=True, slots=True)
class _Built:
    recordings: list[dict[str, Any]]
    meta: list[dict[str, Any]]
    # severity -> the rules' conditions, vectors with this objective's labels
    terms: dict[str, list[str]]
    # severity -> the rules in words (the alert's summary)
    words: dict[str, list[str]]


def _build(o: Objective, rules: BurnRules, opts: RulesOptions) -> _Built:
    """The recordings of one SLO or tier and its rules' conditions per severity."""
    base = _labels(o.name, opts.service)
    sel = _selector(base)
    mine = rules_for(o.name, o.objective, rules)
    windows = _ratio_windows(mine)
    shortest = windows[0] if windows else 300_000
    windows = sorted({*windows, shortest})
    sli = [
        _window_record(
            f"slo:sli_error:ratio_rate{w}",
            f"1 - ({o.good_sum('rate', w)}\n/ sum(rate({o.total}[{w}])))",
            base,
            w,
        )
        for w in map(window_label, windows)
    ]
    guarded = sorted({_guard_window_ms(r) for r in mine if r.min_requests > 0})
    sli += [
        _window_record(
            f"tailguard:slo_requests:increase{w}", f"sum(increase({o.total}[{w}]))", base, w
        )
        for w in map(window_label, guarded)
    ]
    budget = 1.0 - o.objective
    pairs = sorted({(r.within_ms, r.of_ms) for r in mine if isinstance(r, BudgetFractionRule)})
    for within_ms, of_ms in pairs:
        sli.append(_spent_record(o, within_ms, of_ms, base))
    period = window_label(o.period_ms)
    short = window_label(shortest)
    if o.period_ms not in windows:
        ratio = f"slo:sli_error:ratio_rate{short}{sel}"
        sli.append(
            _window_record(
                f"slo:sli_error:ratio_rate{period}",
                f"sum_over_time({ratio}[{period}])\n"
                f"/ ignoring (sloth_window)\ncount_over_time({ratio}[{period}])",
                base,
                period,
            )
        )
    on = "on (sloth_id, sloth_slo, sloth_service) group_left"
    meta = [
        {"record": "slo:objective:ratio", "expr": f"vector({_num(o.objective)})", "labels": base},
        {"record": "slo:error_budget:ratio", "expr": f"vector(1 - {_num(o.objective)})",
         "labels": base},
        {"record": "slo:time_period:days", "expr": f"vector({_num(o.period_ms / DAY_MS)})",
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
                    "sloth_objective": _num(o.objective * 100)}},
    ]  # fmt: skip
    terms: dict[str, list[str]] = {}
    words: dict[str, list[str]] = {}
    for r in mine:
        terms.setdefault(r.severity, []).append(_term(r, sel, budget))
        words.setdefault(r.severity, []).append(f"{r.name}: {describe_rule(r)}")
    return _Built(sli, meta, terms, words)


def _as_primary(term: str, primary: dict[str, str]) -> str:
    """A tier's condition relabelled as its primary SLO's (one alert per SLO and severity:
    ``or`` keeps one series per label set)."""
    out = term
    for k in ("sloth_id", "sloth_slo"):
        out = f'label_replace(\n{out},\n"{k}", "{primary[k]}", "", "")'
    return out


def slo_groups(
    slo: SLO, rules: BurnRules, opts: RulesOptions, tiers: Sequence[Objective] = ()
) -> list[dict[str, Any]]:
    """The recording, metadata and alert groups of one SLO and of the blended ``tiers``
    whose primary it is (their conditions in its page and ticket)."""
    base = _labels(slo.name, opts.service)
    own = _build(Objective.of_slo(slo), rules, opts)
    groups = [
        {"name": f"tailguard-slo-sli-recordings-{slo.name}", "rules": own.recordings},
        {"name": f"tailguard-slo-meta-recordings-{slo.name}", "rules": own.meta},
    ]
    terms = {k: list(v) for k, v in own.terms.items()}
    words = {k: list(v) for k, v in own.words.items()}
    for tier in tiers:
        t = _build(tier, rules, opts)
        groups += [
            {"name": f"tailguard-tier-sli-recordings-{tier.name}", "rules": t.recordings},
            {"name": f"tailguard-tier-meta-recordings-{tier.name}", "rules": t.meta},
        ]
        weight = tier.credit[0] if tier.credit is not None else 0.0
        what = f"tier {tier.name} ({_num(tier.objective * 100)}%, secondary good at {_num(weight)})"
        for severity, ts in t.terms.items():
            terms.setdefault(severity, []).extend(_as_primary(x, base) for x in ts)
            words.setdefault(severity, []).extend(f"{what} {w}" for w in t.words[severity])
    alerts = [_alert(slo, terms[s], words[s], s, opts) for s in SEVERITIES if terms.get(s)]
    if alerts:
        groups.append({"name": f"tailguard-slo-alerts-{slo.name}", "rules": alerts})
    return groups


def _spent_record(o: Objective, within_ms: int, of_ms: int, base: dict[str, str]) -> dict[str, Any]:
    """``tailguard:slo_error_budget_spent:ratio``: bad over ``within`` / allowed bad over
    ``of``, a ``budget_fraction`` rule's figure (:mod:`pipeline.core.budget`).

    The allowance is ``(1 - objective) x`` the requests over ``of``, projected as the
    evaluator does while less than ``of`` has been seen: requests seen x ``of`` /
    max(history, ``within``). ``rate()`` divides by the range, not by the history, so
    the history of each worker's series is measured in samples: ``count_over_time`` over
    ``of`` x ``within`` / its count over ``within`` (the scrape interval cancels out)."""
    within, of = window_label(within_ms), window_label(of_ms)
    w_s, of_s = within_ms // 1000, of_ms // 1000
    req = o.total
    history = (
        f"clamp(count_over_time({req}[{of}]) * {w_s} / count_over_time({req}[{within}]), "
        f"{w_s}, {of_s})"
    )
    return _window_record(
        "tailguard:slo_error_budget_spent:ratio",
        f"(sum(increase({req}[{within}])) - {o.good_sum('increase', within)})\n"
        f"/ ({_num(1.0 - o.objective)} * sum(increase({req}[{of}]) * {of_s}\n/ {history}))",
        base,
        within,
        tailguard_budget_of=of,
    )


def _window_record(
    record: str, expr: str, base: dict[str, str], window: str, **more: str
) -> dict[str, Any]:
    """A recording over one window: the objective's labels and ``sloth_window``."""
    return {"record": record, "expr": expr, "labels": {**base, "sloth_window": window, **more}}


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


def _alert(
    slo: SLO, terms: Sequence[str], words: Sequence[str], severity: str, opts: RulesOptions
) -> dict[str, Any]:
    op = "<" if slo.threshold_strict else "<="
    return {
        "alert": ALERTNAME,
        "expr": "\nor\n".join(terms),
        "labels": {
            "severity": severity,
            "slo": slo.name,
            "service": opts.service,
            "source": "prometheus",
            **dict(opts.alert_labels),
        },
        "annotations": {
            "summary": f"SLO {slo.name}: error budget burning fast ({severity}: "
            f"{'; '.join(words)})",
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
        tiers = [Objective.of_tier(spec, n) for n, t in spec.tiers.items() if t.primary == slo.name]
        groups.extend(slo_groups(slo, rules, o, tiers))
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
