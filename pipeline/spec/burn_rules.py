"""Burn-rate alert rules (``apiVersion: tailguard/v1``, ``kind: BurnRules``) as data.

The file format (``specs/burn-rules.yaml``) and its validation; what the rules
mean, and the tracker that evaluates them, is :mod:`pipeline.core.budget`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, Final, Literal

from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field

from pipeline.shipped import DEFAULT_BURN_RULES
from pipeline.spec.durations import parse_duration_ms, unit_required
from pipeline.spec.fields import DurationMs, check_name, duration_or_none
from pipeline.spec.loader import (
    API_VERSION,
    Loc,
    SpecError,
    SpecFormat,
    SpecIssue,
    SpecModel,
    error_message,
)
from pipeline.spec.registry import SpecKind

KIND: Final = "BurnRules"
DEFAULT_BURN_RULES_PATH: Final = DEFAULT_BURN_RULES  # package data (pipeline.shipped)
_MAX_RULE_WINDOW_MS: Final = 90 * 86_400_000

Severity = Literal["page", "ticket"]


def _check_window(v: str) -> str:
    ms = parse_duration_ms(v)
    if ms > _MAX_RULE_WINDOW_MS:
        raise ValueError(f"window {v} is longer than the supported 90d")
    return v


def _check_rule_name(v: str) -> str:
    return check_name(v, "page-fast-burn")


Duration = Annotated[str, BeforeValidator(unit_required), AfterValidator(_check_window)]
RuleName = Annotated[str, AfterValidator(_check_rule_name)]
Fraction = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]


class _Rule(SpecModel):
    name: RuleName
    severity: Severity
    description: str | None = None
    slos: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)] | None = None
    # No alert from fewer requests than this in the rule's short window (burn_rate:
    # short; budget_fraction: within; compliance_below: window; 0: any): one slow
    # request among the first dozen is a "burn rate" of 8x, not evidence.
    min_requests: Annotated[int, Field(ge=0)] = 0

    def applies_to(self, slo: str, objective: float) -> bool:
        return self.slos is None or slo in self.slos

    def windows_ms(self) -> tuple[int, ...]:
        raise NotImplementedError


class BurnRateRule(_Rule):
    """Burn rate over ``long`` and over ``short`` both > ``factor``."""

    kind: Literal["burn_rate"]
    factor: Annotated[float, Field(gt=0, allow_inf_nan=False)]
    long: Duration
    short: Duration

    long_ms: ClassVar[DurationMs] = DurationMs("long")
    short_ms: ClassVar[DurationMs] = DurationMs("short")

    def windows_ms(self) -> tuple[int, ...]:
        return (self.long_ms, self.short_ms)


class BudgetFractionRule(_Rule):
    """Bad over ``within`` >= ``fraction`` x allowed bad over ``of``."""

    kind: Literal["budget_fraction"]
    fraction: Fraction
    within: Duration
    of: Duration

    within_ms: ClassVar[DurationMs] = DurationMs("within")
    of_ms: ClassVar[DurationMs] = DurationMs("of")

    @property
    def equivalent_burn_rate(self) -> float:
        """The burn rate over ``within`` that spends ``fraction`` of ``of`` (steady traffic)."""
        return self.fraction * self.of_ms / self.within_ms

    def windows_ms(self) -> tuple[int, ...]:
        return (self.within_ms, self.of_ms)


class ComplianceBelowRule(_Rule):
    """Compliance over ``window`` < ``below`` at every evaluation for ``for``."""

    model_config = ConfigDict(populate_by_name=True)

    kind: Literal["compliance_below"]
    window: Duration
    below: Fraction
    for_: Duration = Field(alias="for")

    window_ms: ClassVar[DurationMs] = DurationMs("window")
    for_ms: ClassVar[DurationMs] = DurationMs("for_")

    def applies_to(self, slo: str, objective: float) -> bool:
        return super().applies_to(slo, objective) and self.below <= objective

    def windows_ms(self) -> tuple[int, ...]:
        return (self.window_ms,)


Rule = Annotated[
    BurnRateRule | BudgetFractionRule | ComplianceBelowRule, Field(discriminator="kind")
]
RULE_KINDS: Final = ("burn_rate", "budget_fraction", "compliance_below")


class BudgetEventsConfig(SpecModel):
    """Budget events and allowances (see :mod:`pipeline.core.budget`): re-arming, the
    requests needed before an event, and the least observed span an allowance is
    projected from (``min_observed``; a twelfth of the window when that is shorter)."""

    rearm_margin: Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)] = 0.05
    min_requests: Annotated[int, Field(ge=0)] = 0
    min_observed: Duration = "1h"

    min_observed_ms: ClassVar[DurationMs] = DurationMs("min_observed")


class BurnRules(SpecModel):
    """A versioned set of alert rules (``apiVersion: tailguard/v1``, ``kind: BurnRules``)."""

    api_version: Literal["tailguard/v1"] = Field(alias="apiVersion")
    kind: Literal["BurnRules"]
    description: str | None = None
    rules: list[Rule] = Field(default_factory=list)
    budget_events: BudgetEventsConfig = Field(default_factory=BudgetEventsConfig)

    def cross_issues(self) -> list[SpecIssue]:
        return _cross_issues({"rules": [r.model_dump(by_alias=True) for r in self.rules]})

    @classmethod
    def empty(cls) -> BurnRules:
        return cls.model_validate({"apiVersion": API_VERSION, "kind": KIND})

    def rule(self, name: str) -> BurnRateRule | BudgetFractionRule | ComplianceBelowRule:
        for r in self.rules:
            if r.name == name:
                return r
        raise KeyError(name)


def _cross_issues(data: object) -> list[SpecIssue]:
    """Checks across fields on a plain document (tolerant of a malformed one)."""
    issues: list[SpecIssue] = []
    if not isinstance(data, Mapping):
        return issues
    rules = data.get("rules")
    if not isinstance(rules, list):
        return issues
    first: dict[str, int] = {}
    for i, rule in enumerate(rules):
        if not isinstance(rule, Mapping):
            continue
        name = rule.get("name")
        if isinstance(name, str):
            if name in first:
                issues.append(
                    SpecIssue(
                        f"rules[{i}].name",
                        f"duplicate rule name {name!r} (first at rules[{first[name]}])",
                    )
                )
            else:
                first[name] = i
        kind = rule.get("kind")
        if kind == "burn_rate":
            long, short = duration_or_none(rule.get("long")), duration_or_none(rule.get("short"))
            if long is not None and short is not None and short >= long:
                issues.append(
                    SpecIssue(
                        f"rules[{i}].short",
                        f"must be shorter than long ({rule.get('long')}); "
                        "the SRE workbook uses long / 12",
                    )
                )
        elif kind == "budget_fraction":
            within, of = duration_or_none(rule.get("within")), duration_or_none(rule.get("of"))
            if within is not None and of is not None and within > of:
                issues.append(
                    SpecIssue(
                        f"rules[{i}].within", f"must not be longer than of ({rule.get('of')})"
                    )
                )
    return issues


def _rule_loc(loc: Loc, err_type: str) -> Loc:
    """Drop the discriminator tag pydantic puts in the path (``rules.0.burn_rate.factor``)."""
    out = list(loc)
    if len(out) >= 3 and out[0] == "rules" and isinstance(out[1], int) and out[2] in RULE_KINDS:
        del out[2]
    if err_type in ("union_tag_invalid", "union_tag_not_found"):
        out.append("kind")
    return tuple(out)


def _rule_message(err: Mapping[str, Any]) -> str:
    if err["type"] == "union_tag_not_found":
        return f"missing kind: one of {', '.join(RULE_KINDS)}"
    if err["type"] == "union_tag_invalid":
        return f"unknown kind {err['ctx']['tag']!r}; known: {', '.join(RULE_KINDS)}"
    return error_message(err)


RULES_FORMAT: Final = SpecFormat(
    KIND,
    BurnRules,
    "a rules file",
    "rules",
    "<burn-rules>",
    _cross_issues,
    describe=lambda _rules: "burn rules",
    fix_loc=_rule_loc,
    message=_rule_message,
)
# Parse and validate a rules file; raise SpecError listing every problem.
load_burn_rules: Final = RULES_FORMAT.load


def load_burn_rules_file(path: str | Path = DEFAULT_BURN_RULES_PATH) -> BurnRules:
    """:func:`load_burn_rules` on a file (the shipped rules by default)."""
    return RULES_FORMAT.load_file(path)


def validate_burn_rules_file(path: str | Path) -> tuple[bool, str]:
    """For ``tailguard validate``: ``(True, "ok: burn rules (FILE)")`` or ``(False, errors)``."""
    try:
        load_burn_rules_file(path)
    except SpecError as exc:
        return False, str(exc)
    return True, f"ok: burn rules ({path})"


SPEC_KIND: Final = SpecKind(KIND, validate_burn_rules_file)
