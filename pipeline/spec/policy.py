"""Control policies (``apiVersion: tailguard/v1``, ``kind: ControlPolicy``) as data.

The file format, its signals and units, and every check a policy must pass
(levels 1..3 once each, hysteresis, dwell <= max_duration, the documented
transition bound). What a policy does -- the state machine -- is
:mod:`pipeline.core.policy`, whose docstring explains signals, conditions,
levels and the bound; ``specs/policy-default.yaml`` is the shipped policy.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping
from copy import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Final, Literal

from annotated_types import MinLen
from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Field,
    create_model,
    model_validator,
)

from pipeline.contract.boundaries import BOUNDARIES
from pipeline.contract.control_signal import Actions, marked_fields
from pipeline.shipped import DEFAULT_POLICY, EXAMPLE_POLICY
from pipeline.spec.durations import format_ms
from pipeline.spec.fields import Duration, DurationMs, HoldDuration, duration_or_none
from pipeline.spec.loader import SpecFormat, SpecIssue, SpecModel

DEFAULT_RETRY_AFTER_S: Final[int] = Actions.model_fields["retry_after_s"].default
KIND: Final = "ControlPolicy"
DEFAULT_POLICY_PATH: Final = DEFAULT_POLICY  # package data (pipeline.shipped)
# The source documents' circuit-breaker table as written (gateway P99 > 300 ms ...).
EXAMPLE_POLICY_PATH: Final = EXAMPLE_POLICY
HOUR_MS: Final = 3_600_000
LEVELS: Final = (1, 2, 3)

Op = Literal[">", ">=", "<", "<="]

BOOLEAN_SIGNALS: Final = frozenset(
    {"burn.page", "burn.ticket", "budget_exhausted", "load.burning", "load.caused", "slo.fast_burn"}
)
NUMERIC_SIGNALS: Final = frozenset(
    {"kv_cache_hit_rate", "queue_saturation", "gpu_memory_fraction", "queue_compute_ratio"}
    | {"queue.depth_ratio", "queue.wait_ms", "load.queue_share", "load.demand_ratio"}
    | {f"p99.{b}" for b in BOUNDARIES}
)
# The signal the load gate reads (pipeline.core.control: the burn is load-caused).
LOAD_SIGNAL: Final = "load.caused"
# Alert signals may open a level (``enter``) and notify; they never hold one: a
# slow-burn alert stays true long after the latency recovered (the 6h/30m page
# rule ~30 min), so it is not allowed in ``exit`` and does not keep a level.
ALERT_SIGNALS: Final = frozenset({"burn.page", "burn.ticket"})
# Signals measured before admission (every arrival at the gateways, those refused
# included): a level that turns traffic away cannot lower them by its own refusals.
# Its exit may not rest on evidence measured on admitted traffic alone (the queue, the
# burn of what was served): while such a signal's exit condition is unknown, the level
# leaves only once held for its max_duration (pipeline.core.policy, "Unknown signals").
PRE_ADMISSION_SIGNALS: Final = frozenset({"load.demand_ratio"})


@dataclass(frozen=True, slots=True)
class SignalUnit:
    """The unit and the range of a numeric signal (thresholds outside it are spec errors)."""

    unit: str  # "ms", "fraction", "ratio"
    lo: float
    hi: float | None  # None: unbounded above
    text: str

    def check(self, name: str, value: float) -> str | None:
        """A message when ``value`` cannot be a threshold of this signal, else None."""
        if value < self.lo or (self.hi is not None and value > self.hi):
            if self.unit == "fraction" and 2 <= value <= 100:
                return (
                    f"{num_text(value)} looks like a percent; {name} is a fraction 0..1 "
                    f"(write {num_text(value / 100)})"
                )
            if self.unit == "ms" and value < 0:
                return (
                    f"{name} is a latency in ms: a negative threshold "
                    f"({num_text(value)}) is a mistake"
                )
            hi = "" if self.hi is None else f"..{num_text(self.hi)}"
            return (
                f"{name} is {self.text}, {num_text(self.lo)}{hi}; {num_text(value)} is out of range"
            )
        return None


_MS: Final = SignalUnit("ms", 0.0, None, "a latency in ms")
_FRACTION: Final = SignalUnit("fraction", 0.0, 1.0, "a fraction")
SIGNAL_UNITS: Final[dict[str, SignalUnit]] = {
    "kv_cache_hit_rate": _FRACTION,
    "gpu_memory_fraction": _FRACTION,
    "queue_compute_ratio": _FRACTION,
    "queue_saturation": SignalUnit("ratio", 0.0, None, "waiting / capacity, a ratio >= 0"),
    "queue.depth_ratio": SignalUnit("ratio", 0.0, None, "waiting / the engines' batch, >= 0"),
    "queue.wait_ms": _MS,
    "load.queue_share": _FRACTION,
    "load.demand_ratio": SignalUnit("ratio", 0.0, None, "demand / measured capacity, >= 0"),
}


def signal_unit(name: str) -> SignalUnit | None:
    """Unit and range of a numeric signal (None for booleans and unknown names)."""
    if name in SIGNAL_UNITS:
        return SIGNAL_UNITS[name]
    if name.startswith("p99."):
        return _MS if name in NUMERIC_SIGNALS else None
    if _COMPLIANCE_RE.match(name):
        return _FRACTION
    return None


_COMPLIANCE_RE: Final = re.compile(r"^compliance_5m\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
BUDGET_SIGNAL: Final = "budget_exhausted"

OPS: Final[dict[str, Callable[[float, float], bool]]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
}
_HIGH_IS_BAD: Final = frozenset({">", ">="})


# --------------------------------------------------------------------------- #
# Field types
# --------------------------------------------------------------------------- #


def signal_kind(name: str) -> Literal["number", "boolean"] | None:
    """``"number"`` or ``"boolean"`` for a signal the worker provides, else None."""
    if name in BOOLEAN_SIGNALS:
        return "boolean"
    if name in NUMERIC_SIGNALS or _COMPLIANCE_RE.match(name):
        return "number"
    return None


def _check_signal(v: str) -> str:
    if v == BUDGET_SIGNAL:
        raise ValueError(
            "budget_exhausted is not a reason to degrade: it is passed through on every "
            "decision (Decision.budget_exhausted) and may not be used in a condition"
        )
    if signal_kind(v) is None:
        known = sorted((NUMERIC_SIGNALS | BOOLEAN_SIGNALS) - {BUDGET_SIGNAL})
        raise ValueError(
            f"unknown signal {v!r}; known: {', '.join(known)}, compliance_5m.<slo-name>"
        )
    return v


def _level_number(v: object) -> object:
    """``level: L2`` is accepted for ``level: 2``."""
    if isinstance(v, str) and (m := re.fullmatch(r"L([0-9]+)", v)):
        return int(m.group(1))
    return v


def _check_level(v: int) -> int:
    if v not in LEVELS:
        raise ValueError(f"unknown level {v}: a policy has levels 1 (L1), 2 (L2) and 3 (L3)")
    return v


def _check_fraction(v: float) -> float:
    if not (0.0 < v <= 1.0):
        raise ValueError(f"admit_fraction must be in (0, 1] (0.25 = 25%), got {v}")
    return v


class _Model(SpecModel):
    model_config = ConfigDict(populate_by_name=True)


# --------------------------------------------------------------------------- #
# Spec models
# --------------------------------------------------------------------------- #


class Condition(_Model):
    """``{signal, op, value, for}`` or ``{signal, is, for}`` (boolean signals)."""

    signal: Annotated[str, AfterValidator(_check_signal)]
    op: Op | None = None
    value: Annotated[float, Field(allow_inf_nan=False)] | None = None
    for_: HoldDuration = Field("0s", alias="for")
    is_: bool | None = Field(None, alias="is")

    @model_validator(mode="after")
    def _shape(self) -> Condition:
        if signal_kind(self.signal) == "boolean":
            if self.is_ is None or self.op is not None or self.value is not None:
                raise ValueError(
                    f"{self.signal} is a boolean signal: write `is: true` or `is: false` "
                    "(no op/value)"
                )
        elif self.is_ is not None or self.op is None or self.value is None:
            raise ValueError(
                f"{self.signal} is a numeric signal: give op (>, >=, <, <=) and value (no is)"
            )
        else:
            unit = signal_unit(self.signal)
            problem = unit.check(self.signal, self.value) if unit is not None else None
            if problem is not None:
                raise ValueError(problem)
        return self

    for_ms: ClassVar[DurationMs] = DurationMs("for_", allow_zero=True)

    def describe(self, *, with_for: bool = True) -> str:
        if self.is_ is not None:
            text = f"{self.signal} is {str(self.is_).lower()}"
        else:
            text = f"{self.signal} {self.op} {num_text(self.value)}"
        return text if self.for_ms == 0 or not with_for else f"{text} for {self.for_}"


class _ActionsSpecBase(_Model):
    """What the serving layer does at a level (every field optional; default = nothing).

    The fields are the directive's own (``pipeline.contract.control_signal.Actions``,
    those marked ``policy``: shed_priorities_at_or_above, cap_context_tokens,
    fallback_model, reject_new_sessions, retry_after_s, rate_limit_rps), with their
    types, bounds and defaults, so a field added there is a policy field too and reaches
    the gateway without a second definition; plus two the policy alone has:
    """

    # Capacity-aware admission: the directive carries admit_rps (pipeline.core.admission),
    # measured and corrected by feedback at every evaluation; gateways admit by priority.
    admission: bool = False
    # With admission: cancel requests of priority >= 1 still queued after 0.75 of the
    # tightest first-byte threshold of the SLOs covering priority 0 (Actions.
    # queue_timeout_ms, filled in by the controller, pipeline.core.load_cause
    # P0_QUEUE_SHARE): "return 503 after 2 s in queue", from the SLO spec.
    queue_cutoff: bool = False

    # the directive type these actions become (the one it was derived from)
    actions_type: ClassVar[type[Actions]] = Actions

    def to_actions(self, admit_fraction: float | None = None) -> Actions:
        """The directive's actions (the one type the wire signs and the serving side reads):
        the policy fields as they are, and the half-open ``admit_fraction`` (``admission``
        becomes ``admit_rps``, filled in by the controller)."""
        return self.actions_type(
            **self.model_dump(exclude={"admission", "queue_cutoff"}), admit_fraction=admit_fraction
        )

    def turns_away(self) -> bool:
        """Whether these actions turn requests away (admission, or a field marked
        ``turns_away`` set: shed, reject new sessions, rate-limit)."""
        return self.admission or any(
            getattr(self, name) not in (None, False)
            for name in marked_fields(self.actions_type, "turns_away")
        )


def derive_actions_spec(actions: type[Actions] = Actions) -> type[_ActionsSpecBase]:
    """The policy's actions model from the directive's: every field marked ``policy``,
    with its type, bounds, default and description."""
    fields: dict[str, Any] = {
        name: (actions.model_fields[name].annotation, copy(actions.model_fields[name]))
        for name in marked_fields(actions, "policy")
    }
    model = create_model("ActionsSpec", __base__=_ActionsSpecBase, __module__=__name__, **fields)
    model.__doc__ = _ActionsSpecBase.__doc__
    model.actions_type = actions
    return model


if TYPE_CHECKING:
    ActionsSpec = _ActionsSpecBase
else:
    ActionsSpec = derive_actions_spec()


class Level(_Model):
    """One degradation level: enter (any), exit (all), max_duration, notify, actions."""

    level: Annotated[int, BeforeValidator(_level_number), AfterValidator(_check_level)]
    description: str | None = None
    enter: Annotated[list[Condition], MinLen(1)]
    exit: Annotated[list[Condition], MinLen(1)]
    max_duration: Duration
    notify_customer: bool
    actions: ActionsSpec = Field(default_factory=ActionsSpec)

    @property
    def name(self) -> str:
        return f"L{self.level}"

    max_duration_ms: ClassVar[DurationMs] = DurationMs("max_duration")


class HalfOpen(_Model):
    """Leaving L1: ``duration`` at L1's actions, admitting ``admit_fraction`` of shed traffic."""

    duration: Duration
    admit_fraction: Annotated[float, Field(allow_inf_nan=False), AfterValidator(_check_fraction)]

    duration_ms: ClassVar[DurationMs] = DurationMs("duration")


class Dynamics(_Model):
    min_dwell: Duration
    step_down: Literal["one"] = "one"
    half_open: HalfOpen
    max_transitions_per_hour: Annotated[int, Field(ge=1)] | None = None
    # Load gate: a level whose actions turn traffic away is entered only while the burn
    # is load-caused (the signal load.caused); otherwise the entry is reported, not acted on.
    load_gate: bool = False

    min_dwell_ms: ClassVar[DurationMs] = DurationMs("min_dwell")


class ControlPolicy(_Model):
    """A versioned degradation policy (``apiVersion: tailguard/v1``, ``kind: ControlPolicy``)."""

    api_version: Literal["tailguard/v1"] = Field(alias="apiVersion")
    kind: Literal["ControlPolicy"]
    description: str | None = None
    levels: Annotated[list[Level], MinLen(1)]
    dynamics: Dynamics

    def cross_issues(self) -> list[SpecIssue]:
        return _cross_issues(self.model_dump(by_alias=True))

    def level(self, n: int) -> Level:
        for lv in self.levels:
            if lv.level == n:
                return lv
        raise KeyError(n)

    @property
    def min_gap_ms(self) -> int:
        """``D``: the least time between a transition and a following non-immediate one."""
        return min(self.dynamics.min_dwell_ms, self.dynamics.half_open.duration_ms)

    def transition_bound(self, window_ms: int = HOUR_MS) -> int:
        """At most this many transitions per scope in any window of ``window_ms``."""
        return _bound(window_ms, self.min_gap_ms)

    def summary(self) -> str:
        n_enter = sum(len(lv.enter) for lv in self.levels)
        n_exit = sum(len(lv.exit) for lv in self.levels)
        d = self.dynamics
        return (
            f"{len(self.levels)} levels, {n_enter} enter / {n_exit} exit conditions, "
            f"min_dwell {d.min_dwell}, half-open {d.half_open.duration} at "
            f"{d.half_open.admit_fraction:.0%}, at most {self.transition_bound()} transitions/hour"
        )


def _bound(window_ms: int, gap_ms: int) -> int:
    return 2 * -(-window_ms // gap_ms) + 4


def num_text(v: float | None) -> str:
    """A threshold or value as written (``300``, ``0.8``); ``?`` when unknown."""
    return "?" if v is None else f"{v:g}"


# --------------------------------------------------------------------------- #
# Checks across fields (on the plain document, tolerant of malformed parts)
# --------------------------------------------------------------------------- #


@dataclass(frozen=True, slots=True)
class _RawCond:
    index: int
    signal: str
    op: str | None
    value: float | None
    is_: bool | None

    def text(self) -> str:
        if self.is_ is not None:
            return f"{self.signal} is {str(self.is_).lower()}"
        return f"{self.signal} {self.op} {num_text(self.value)}"


def _raw_conds(items: object) -> list[_RawCond]:
    out: list[_RawCond] = []
    if not isinstance(items, list):
        return out
    for j, c in enumerate(items):
        if not isinstance(c, Mapping) or not isinstance(c.get("signal"), str):
            continue
        sig, op, value, is_ = c["signal"], c.get("op"), c.get("value"), c.get("is")
        if isinstance(is_, bool) and op is None:
            out.append(_RawCond(j, sig, None, None, is_))
        elif (
            op in OPS
            and isinstance(value, int | float)
            and not isinstance(value, bool)
            and is_ is None
        ):
            out.append(_RawCond(j, sig, op, float(value), None))
    return out


def _out_of_range(c: _RawCond) -> bool:
    unit = signal_unit(c.signal)
    return unit is not None and c.value is not None and unit.check(c.signal, c.value) is not None


def _hysteresis_issue(path: str, ex: _RawCond, en: _RawCond) -> SpecIssue | None:
    where = f"enter[{en.index}]: {en.text()}"
    if en.is_ is not None or ex.is_ is not None:
        if en.is_ is None or ex.is_ is None or ex.is_ != en.is_:
            return None  # a type mismatch is reported by the field checks
        return SpecIssue(
            f"{path}.is",
            f"no hysteresis: exit condition equals entry condition ({where}); "
            f"an exit on {ex.signal} needs `is: {str(not en.is_).lower()}`",
        )
    assert en.op is not None
    assert ex.op is not None
    assert en.value is not None
    assert ex.value is not None
    high_bad = en.op in _HIGH_IS_BAD
    if (ex.op in _HIGH_IS_BAD) == high_bad:
        want = "< or <=" if high_bad else "> or >="
        return SpecIssue(
            f"{path}.op",
            f"no hysteresis: exit condition points the same way as the entry condition "
            f"({where}); an exit on {ex.signal} must use {want}",
        )
    safe = ex.value < en.value if high_bad else ex.value > en.value
    if not safe:
        side = "below" if high_bad else "above"
        return SpecIssue(
            f"{path}.value",
            f"no hysteresis: exit threshold {num_text(ex.value)} must be strictly {side} the "
            f"entry threshold {num_text(en.value)} ({where})",
        )
    return None


def _cross_issues(data: object) -> list[SpecIssue]:
    """Levels 1..3 once each, hysteresis, dwell <= max_duration, the documented bound."""
    issues: list[SpecIssue] = []
    if not isinstance(data, Mapping):
        return issues
    dyn = data.get("dynamics")
    dyn = dyn if isinstance(dyn, Mapping) else {}
    dwell = duration_or_none(dyn.get("min_dwell"))
    levels = data.get("levels")
    if isinstance(levels, list):
        first: dict[int, int] = {}
        all_numbered = True
        for i, lv in enumerate(levels):
            if not isinstance(lv, Mapping):
                all_numbered = False
                continue
            n = _level_number(lv.get("level"))
            if isinstance(n, int) and not isinstance(n, bool) and n in LEVELS:
                if n in first:
                    issues.append(
                        SpecIssue(
                            f"levels[{i}].level",
                            f"duplicate level {n} (L{n}; first at levels[{first[n]}])",
                        )
                    )
                else:
                    first[n] = i
            else:
                all_numbered = False
            enter = _raw_conds(lv.get("enter"))
            for ex in _raw_conds(lv.get("exit")):
                if ex.signal in ALERT_SIGNALS:
                    issues.append(
                        SpecIssue(
                            f"levels[{i}].exit[{ex.index}].signal",
                            f"{ex.signal} is a burn-rate alert: it may open a level (enter) "
                            "and notify, but not hold one (a slow-burn alert stays true long "
                            "after latency recovered); leave it out of exit",
                        )
                    )
                    continue
                for en in enter:
                    if en.signal != ex.signal or _out_of_range(en) or _out_of_range(ex):
                        continue  # a value out of range is reported by the field checks
                    issue = _hysteresis_issue(f"levels[{i}].exit[{ex.index}]", ex, en)
                    if issue is not None:
                        issues.append(issue)
                        break
            max_d = duration_or_none(lv.get("max_duration"))
            if dwell is not None and max_d is not None and max_d < dwell:
                issues.append(
                    SpecIssue(
                        f"levels[{i}].max_duration",
                        f"max_duration {lv['max_duration']} is shorter than dynamics.min_dwell "
                        f"{dyn['min_dwell']}: the level would escalate before it may step down",
                    )
                )
        missing = [n for n in LEVELS if n not in first]
        if missing and (all_numbered or not first):
            names = ", ".join(f"L{n} (level: {n})" for n in missing)
            issues.append(SpecIssue("levels", f"missing {names}: a policy defines L1, L2 and L3"))
    ho = dyn.get("half_open")
    ho_d = duration_or_none(ho.get("duration")) if isinstance(ho, Mapping) else None
    promised = dyn.get("max_transitions_per_hour")
    if (
        dwell is not None
        and ho_d is not None
        and isinstance(promised, int)
        and not isinstance(promised, bool)
        and promised >= 1
    ):
        bound = _bound(HOUR_MS, min(dwell, ho_d))
        if promised < bound:
            issues.append(
                SpecIssue(
                    "dynamics.max_transitions_per_hour",
                    f"{promised} is below what min_dwell and half_open.duration guarantee: "
                    f"up to 2 * ceil(1h / {format_ms(min(dwell, ho_d))}) + 4 = {bound} "
                    "transitions per hour; raise it or lengthen the dwell",
                )
            )
    return issues


SPEC_KIND: Final = SpecFormat(
    KIND,
    ControlPolicy,
    "a policy",
    "policy",
    "<policy>",
    _cross_issues,
    describe=lambda p: p.summary(),
)
# Parse and validate a policy (text, or a file); raise SpecError listing every problem.
load_policy: Final = SPEC_KIND.load
load_policy_file: Final = SPEC_KIND.load_file
# For the CLI: (True, "ok: 3 levels, ... (FILE)") or (False, every problem).
validate_policy_file: Final = SPEC_KIND.validate
