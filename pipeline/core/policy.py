"""Control policies (``apiVersion: tailguard/v1``, ``kind: ControlPolicy``): when to degrade.

Pure: pydantic, PyYAML and the standard library only (no Kafka, Faust or
ClickHouse); time is passed in as integer milliseconds and nothing reads a
clock. The stream worker computes a flat mapping of *signals* per scope
(usually per model) every evaluation and asks :class:`PolicyEngine` for an
:class:`Evaluation`, whose :class:`~pipeline.contract.control_signal.Decision` (the
one decision type, signed as is onto the control topic) says the degradation
level (0 = normal, L1..L3), the actions the serving layer should apply, and
why. ``specs/policy-default.yaml`` adapts the source documents'
circuit-breaker table (``specs/policy-example.yaml``: L1 P99 > 300 ms for
5 min, L2 KV-cache hit rate < 80 %, L3 GPU memory > 95 %) to LLM serving.

Signals
-------
``Mapping[str, float | int | bool | None]``. Names a policy may use (anything
else is a spec error):

* ``p99.<boundary>`` for every boundary of
  :data:`pipeline.core.record.BOUNDARIES` (``p99.gateway_total_ms``,
  ``p99.queue_ms``, ...): the P99 over the last minute, in ms.
* ``compliance_5m.<slo-name>``: share of good requests of that SLO over the
  last 5 minutes (0..1).
* ``kv_cache_hit_rate`` (0..1), ``queue_saturation`` (waiting / capacity,
  0..1 and above), ``gpu_memory_fraction`` (0..1), ``queue_compute_ratio``
  (inference time / gateway total time; < 0.3 = queueing is the bottleneck).
* Booleans: ``burn.page`` / ``burn.ticket`` (a burn-rate alert of that
  severity fires for any SLO), ``budget_exhausted``.

``budget_exhausted`` may not appear in a condition: an exhausted error budget
is *not* a reason to degrade. It is passed through to every decision
(``Decision.budget_exhausted``, true only when the signal is ``True``),
without changing the level.

**Unknown signals.** A signal that is missing, ``None``, NaN/infinite, or of
the wrong type (a bool for a numeric signal, a number for a boolean one) is
*unknown*. A condition on an unknown signal does not hold, and it *resets*
that condition's continuous-hold clock: ``for: 5m`` means five minutes of
observations that all satisfied the comparison; a gap in the evidence is not
evidence. The consequences are the safe ones for recovery (an unknown signal
never lets an ``exit`` condition hold, so a degraded scope stays degraded) and
for false alarms (an unknown signal never triggers an ``enter`` condition and
never triggers a half-open relapse). A worker must therefore provide every
signal at every evaluation; a signal that keeps dropping out delays entry.

Conditions
----------
``{signal, op: > | >= | < | <=, value, for: 5m}`` (``for`` defaults to
``0s``) or, for a boolean signal, ``{signal, is: true|false, for}``. The
engine tracks per condition and scope since when the comparison has held on
every evaluation (the first evaluation that observed it true); the condition
*holds* at ``now`` when the comparison holds now and
``now - since >= for``. So with a 10 s cadence and ``for: 5m``, a comparison
first seen true at t = 0 holds from the evaluation at t = 300 s on, not before.
A false or unknown observation resets the clock.

Levels
------
Three levels, L1 < L2 < L3, each with:

* ``enter``: the level is entered when ANY of its conditions holds;
* ``exit``: it may be left only when ALL of its conditions hold. Hysteresis is
  validated: for every signal used in both lists, each exit condition must
  point the other way from each entry condition on that signal, with a
  threshold strictly on the safe side (entry ``> 300`` needs exit ``< T`` or
  ``<= T`` with ``T < 300``; entry ``is: true`` needs exit ``is: false``);
* ``max_duration``: held that long, the level escalates one level;
* ``notify_customer``; ``actions`` (see :class:`ActionsSpec`).

State machine (per scope)
-------------------------
A scope is in one of: level 0 / phase ``normal``; level 1..3 / phase
``degraded``; or level 1 / phase ``half_open`` (leaving L1: L1's actions stay
in force, except that ``admit_fraction`` of the traffic L1 would shed is
admitted). ``since_ms`` is when the current (level, phase) began. At every
evaluation, after updating the condition clocks, with ``entered`` = the highest
level whose ``enter`` holds (0 if none), exactly one rule applies:

1. **half_open**: if ``entered >= 1``, or any L1 ``enter`` comparison holds
   *right now* (ignoring its ``for``: a half-open phase is a probe, and a probe
   that sees the trouble again has failed) -> **relapse**: straight to
   ``max(1, entered)``, phase ``degraded`` (no dwell). Otherwise, once
   ``half_open.duration`` has passed since it began -> level 0, ``normal``.
   (L1's ``exit`` is not re-checked during half-open.)
2. **step up**: ``entered > level`` -> ``entered`` at once (higher levels win;
   stepping up is never delayed).
3. **step down** (degraded only): ``entered < level`` and every ``exit``
   condition of the current level holds and ``min_dwell`` has passed since
   ``since_ms`` -> one level down (``step_down: one``); from L1 that is
   ``half_open``, not 0.
4. **max duration** (degraded only): the level has been held (since
   ``since_ms``) for at least its ``max_duration`` -> one level up, with
   ``escalated_by_max_duration`` and ``notify_customer`` set for as long as
   the scope stays at the escalated level. At L3 there is no higher level:
   the scope stays at L3 with ``overdue`` and ``notify_customer`` set.
   Rule 3 is checked first: a level whose exit holds steps down rather than
   escalate. The max-duration clock restarts with every entry into a
   degraded level, a relapse included.
5. otherwise the state stays.

``notify_customer`` on a decision = the level's ``notify_customer`` (L1's in
half-open) or escalated or overdue. ``changed`` is true on the evaluation at
which (level, phase) changed.

Transitions per hour (flapping bound)
-------------------------------------
Order the states by severity: normal 0 < half_open 1 < L1 2 < L2 3 < L3 4.
Step-ups and relapses raise the severity and are immediate; every other
transition (a step down, the start or end of half-open, an escalation) needs
at least ``D = min(min_dwell, half_open.duration)`` since the previous
transition (``max_duration >= min_dwell`` is validated). Slow transitions are
therefore at least ``D`` apart: at most ``ceil(W / D)`` in any window of
length ``W``. Only the ``d`` step-downs lower the severity (by 1 each), it
ranges over 0..4, and each immediate transition raises it by at least 1, so
there are at most ``d + 4`` immediate ones::

    transitions in any window W  <=  2 * ceil(W / D) + 4

(:meth:`ControlPolicy.transition_bound`). The ``for`` durations of the
conditions only lengthen gaps (a relapse on a signal that also has an exit
condition resets that exit's clock), so the bound holds whatever they are;
the default policy (D = 5 min) gives at most 28 per hour. A policy may state
``dynamics.max_transitions_per_hour``; it is documentation checked against
this bound (it must not promise fewer), never enforced at run time.

Scopes
------
Per scope the state is fixed-size (one clock per condition and the current
level). At most ``max_scopes`` scopes are kept; beyond that, the least
recently evaluated scope at level 0 is forgotten (if every scope is degraded,
the least recently evaluated one). A forgotten scope starts again at level 0.
Evaluations of one scope must come in non-decreasing ``now_ms`` order.
"""

from __future__ import annotations

import math
import operator
import re
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Final, Literal

from annotated_types import MinLen
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    model_validator,
)

from pipeline.contract.control_signal import MAX_FIGURES, REASON_MAX_CHARS, Actions, Decision
from pipeline.core.durations import format_ms, parse_duration_ms, unit_required
from pipeline.core.record import BOUNDARIES
from pipeline.core.slo import (  # the spec YAML loader and error paths are shared
    SpecError,
    SpecIssue,
    _line,
    _message,
    _path,
    parse_yaml_mapping,
)

DEFAULT_RETRY_AFTER_S: Final[int] = Actions.model_fields["retry_after_s"].default
API_VERSION: Final = "tailguard/v1"
KIND: Final = "ControlPolicy"
DEFAULT_POLICY_PATH: Final = Path(__file__).resolve().parents[2] / "specs" / "policy-default.yaml"
# The source documents' circuit-breaker table as written (gateway P99 > 300 ms ...).
EXAMPLE_POLICY_PATH: Final = DEFAULT_POLICY_PATH.with_name("policy-example.yaml")
HOUR_MS: Final = 3_600_000
LEVELS: Final = (1, 2, 3)

Phase = Literal["normal", "degraded", "half_open"]
Op = Literal[">", ">=", "<", "<="]
SignalValue = float | int | bool | None
Signals = Mapping[str, SignalValue]

BOOLEAN_SIGNALS: Final = frozenset({"burn.page", "burn.ticket", "budget_exhausted"})
NUMERIC_SIGNALS: Final = frozenset(
    {"kv_cache_hit_rate", "queue_saturation", "gpu_memory_fraction", "queue_compute_ratio"}
    | {f"p99.{b}" for b in BOUNDARIES}
)
# Alert signals may open a level (``enter``) and notify; they never hold one: a
# slow-burn alert stays true long after the latency recovered (the 6h/30m page
# rule ~30 min), so it is not allowed in ``exit`` and does not keep a level.
ALERT_SIGNALS: Final = frozenset({"burn.page", "burn.ticket"})


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
                    f"{_num(value)} looks like a percent; {name} is a fraction 0..1 "
                    f"(write {_num(value / 100)})"
                )
            if self.unit == "ms" and value < 0:
                return (
                    f"{name} is a latency in ms: a negative threshold ({_num(value)}) is a mistake"
                )
            hi = "" if self.hi is None else f"..{_num(self.hi)}"
            return f"{name} is {self.text}, {_num(self.lo)}{hi}; {_num(value)} is out of range"
        return None


_MS: Final = SignalUnit("ms", 0.0, None, "a latency in ms")
_FRACTION: Final = SignalUnit("fraction", 0.0, 1.0, "a fraction")
SIGNAL_UNITS: Final[dict[str, SignalUnit]] = {
    "kv_cache_hit_rate": _FRACTION,
    "gpu_memory_fraction": _FRACTION,
    "queue_compute_ratio": _FRACTION,
    "queue_saturation": SignalUnit("ratio", 0.0, None, "waiting / capacity, a ratio >= 0"),
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
_BUDGET_SIGNAL: Final = "budget_exhausted"

_OPS: Final[dict[str, Callable[[float, float], bool]]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
}
_HIGH_IS_BAD: Final = frozenset({">", ">="})

_DEFER_CROSS_CHECKS: Final = "tailguard.policy.defer_cross_checks"


# --------------------------------------------------------------------------- #
# Field types
# --------------------------------------------------------------------------- #


def _check_positive_duration(v: str) -> str:
    parse_duration_ms(v)
    return v


def _check_hold_duration(v: str) -> str:
    parse_duration_ms(v, allow_zero=True)
    return v


def signal_kind(name: str) -> Literal["number", "boolean"] | None:
    """``"number"`` or ``"boolean"`` for a signal the worker provides, else None."""
    if name in BOOLEAN_SIGNALS:
        return "boolean"
    if name in NUMERIC_SIGNALS or _COMPLIANCE_RE.match(name):
        return "number"
    return None


def _check_signal(v: str) -> str:
    if v == _BUDGET_SIGNAL:
        raise ValueError(
            "budget_exhausted is not a reason to degrade: it is passed through on every "
            "decision (Decision.budget_exhausted) and may not be used in a condition"
        )
    if signal_kind(v) is None:
        known = sorted((NUMERIC_SIGNALS | BOOLEAN_SIGNALS) - {_BUDGET_SIGNAL})
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


Duration = Annotated[str, BeforeValidator(unit_required), AfterValidator(_check_positive_duration)]
HoldDuration = Annotated[str, BeforeValidator(unit_required), AfterValidator(_check_hold_duration)]


class _Model(BaseModel):
    # strict: YAML gives real types, so "0.8" (a string) or `true` for a number is a mistake.
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, populate_by_name=True)


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

    @property
    def for_ms(self) -> int:
        return parse_duration_ms(self.for_, allow_zero=True)

    def describe(self, *, with_for: bool = True) -> str:
        if self.is_ is not None:
            text = f"{self.signal} is {str(self.is_).lower()}"
        else:
            text = f"{self.signal} {self.op} {_num(self.value)}"
        return text if self.for_ms == 0 or not with_for else f"{text} for {self.for_}"


class ActionsSpec(_Model):
    """What the serving layer does at a level (every field optional; default = nothing)."""

    shed_priorities_at_or_above: Annotated[int, Field(ge=0, le=3)] | None = None
    cap_context_tokens: Annotated[int, Field(gt=0)] | None = None
    fallback_model: Annotated[str, MinLen(1)] | None = None
    reject_new_sessions: bool = False
    # The same default as the wire's Actions (one Actions type: control_signal.Actions).
    retry_after_s: Annotated[int, Field(ge=0)] = DEFAULT_RETRY_AFTER_S
    rate_limit_rps: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None

    def to_actions(self, admit_fraction: float | None = None) -> Actions:
        """The directive's actions (the one type the wire signs and the serving side reads)."""
        return Actions(
            shed_priorities_at_or_above=self.shed_priorities_at_or_above,
            cap_context_tokens=self.cap_context_tokens,
            fallback_model=self.fallback_model,
            reject_new_sessions=self.reject_new_sessions,
            retry_after_s=self.retry_after_s,
            rate_limit_rps=self.rate_limit_rps,
            admit_fraction=admit_fraction,
        )


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

    @property
    def max_duration_ms(self) -> int:
        return parse_duration_ms(self.max_duration)


class HalfOpen(_Model):
    """Leaving L1: ``duration`` at L1's actions, admitting ``admit_fraction`` of shed traffic."""

    duration: Duration
    admit_fraction: Annotated[float, Field(allow_inf_nan=False), AfterValidator(_check_fraction)]

    @property
    def duration_ms(self) -> int:
        return parse_duration_ms(self.duration)


class Dynamics(_Model):
    min_dwell: Duration
    step_down: Literal["one"] = "one"
    half_open: HalfOpen
    max_transitions_per_hour: Annotated[int, Field(ge=1)] | None = None

    @property
    def min_dwell_ms(self) -> int:
        return parse_duration_ms(self.min_dwell)


class ControlPolicy(_Model):
    """A versioned degradation policy (``apiVersion: tailguard/v1``, ``kind: ControlPolicy``)."""

    api_version: Literal["tailguard/v1"] = Field(alias="apiVersion")
    kind: Literal["ControlPolicy"]
    description: str | None = None
    levels: Annotated[list[Level], MinLen(1)]
    dynamics: Dynamics

    @model_validator(mode="after")
    def _cross_checks(self, info: ValidationInfo) -> ControlPolicy:
        if isinstance(info.context, Mapping) and info.context.get(_DEFER_CROSS_CHECKS):
            return self  # load_policy runs them on the raw document, next to the field errors
        issues = _cross_issues(self.model_dump(by_alias=True))
        if issues:
            raise ValueError("; ".join(f"{i.path}: {i.message}" for i in issues))
        return self

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


def _num(v: float | None) -> str:
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
        return f"{self.signal} {self.op} {_num(self.value)}"


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
            op in _OPS
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
            f"no hysteresis: exit threshold {_num(ex.value)} must be strictly {side} the "
            f"entry threshold {_num(en.value)} ({where})",
        )
    return None


def _duration_or_none(v: object) -> int | None:
    if not isinstance(v, str):
        return None
    try:
        return parse_duration_ms(v)
    except ValueError:
        return None


def _cross_issues(data: object) -> list[SpecIssue]:
    """Levels 1..3 once each, hysteresis, dwell <= max_duration, the documented bound."""
    issues: list[SpecIssue] = []
    if not isinstance(data, Mapping):
        return issues
    dyn = data.get("dynamics")
    dyn = dyn if isinstance(dyn, Mapping) else {}
    dwell = _duration_or_none(dyn.get("min_dwell"))
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
            max_d = _duration_or_none(lv.get("max_duration"))
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
    ho_d = _duration_or_none(ho.get("duration")) if isinstance(ho, Mapping) else None
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


# --------------------------------------------------------------------------- #
# Loading and errors (same format as SLO specs: pipeline.core.slo.SpecError)
# --------------------------------------------------------------------------- #


def _loc_of(path: str) -> tuple[int | str, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.findall(r"[^.\[\]]+", path))


def load_policy(text: str, source: str = "<policy>") -> ControlPolicy:
    """Parse and validate a policy; raises :class:`SpecError` listing every problem."""
    data, node = parse_yaml_mapping(text, source, "a policy")
    issues: list[SpecIssue] = []
    policy: ControlPolicy | None = None
    try:
        policy = ControlPolicy.model_validate(data, context={_DEFER_CROSS_CHECKS: True})
    except ValidationError as e:
        for err in e.errors():
            loc = tuple(err["loc"])
            issues.append(SpecIssue(_path(loc), _message(err), _line(node, loc)))
    for issue in _cross_issues(data):
        issues.append(SpecIssue(issue.path, issue.message, _line(node, _loc_of(issue.path))))
    if issues or policy is None:
        raise SpecError(source, sorted(issues, key=lambda i: i.line or 0))
    return policy


def load_policy_file(path: str | Path) -> ControlPolicy:
    """:func:`load_policy` on a file; an unreadable file is a :class:`SpecError` too."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(str(path), [SpecIssue("", f"cannot read policy: {e}")]) from None
    return load_policy(text, str(path))


def validate_policy_file(path: str | Path) -> tuple[bool, str]:
    """For the CLI: ``(True, "ok: 3 levels, ... (FILE)")`` or ``(False, every problem)``."""
    try:
        policy = load_policy_file(path)
    except SpecError as e:
        n = len(e.errors)
        return False, f"{e}\n{n} problem{'' if n == 1 else 's'} in {path}"
    return True, f"ok: {policy.summary()} ({path})"


# --------------------------------------------------------------------------- #
# Decisions
# --------------------------------------------------------------------------- #


NO_ACTIONS: Final = Actions()


@dataclass(frozen=True)  # not slotted: its read-through properties stay read-only
class Evaluation:
    """One evaluation of a scope: the :class:`~pipeline.contract.control_signal.Decision`
    (level, phase, actions, reason, figures, notify_customer, budget_exhausted: the
    one decision type, which a control signal carries as is) and the state
    machine's bookkeeping around it (see the module docstring for the rules).

    The decision's fields are readable here too (``e.level`` is ``e.decision.level``);
    they are defined once, on ``Decision``.
    """

    scope: str
    now_ms: int
    decision: Decision
    changed: bool  # (level, phase) changed at this evaluation
    since_ms: int  # when the current (level, phase) began
    escalated_by_max_duration: bool  # this level was reached by a max_duration escalation
    overdue: bool  # held past its max_duration without escalating (L3, or entry gone)
    previous_level: int
    previous_phase: Phase
    # On an evaluation that keeps a degraded or half-open state: what keeps it, e.g.
    # "p99.ttft_engine_ms 4120 >= 2500 (exit needs < 2500 for 3m)", "min_dwell (2m of 5m)".
    held_because: tuple[str, ...] = ()

    @property
    def level(self) -> int:
        return self.decision.level

    @property
    def phase(self) -> Phase:
        return self.decision.phase

    @property
    def actions(self) -> Actions:
        return self.decision.actions

    @property
    def reason(self) -> str:
        return self.decision.reason

    @property
    def figures(self) -> Mapping[str, float | bool | None]:
        return MappingProxyType(self.decision.figures)

    @property
    def notify_customer(self) -> bool:
        return self.decision.notify_customer

    @property
    def budget_exhausted(self) -> bool:
        """Passed through from the signals; never changes the level."""
        return self.decision.budget_exhausted

    def to_json(self) -> dict[str, Any]:
        return {
            "scope": self.scope,
            "now_ms": self.now_ms,
            "level": self.level,
            "phase": self.phase,
            "actions": self.actions.to_json(),
            "reason": self.reason,
            "figures": dict(self.figures),
            "changed": self.changed,
            "since_ms": self.since_ms,
            "notify_customer": self.notify_customer,
            "budget_exhausted": self.budget_exhausted,
            "escalated_by_max_duration": self.escalated_by_max_duration,
            "overdue": self.overdue,
            "previous_level": self.previous_level,
            "previous_phase": self.previous_phase,
            "held_because": list(self.held_because),
        }


@dataclass(frozen=True, slots=True)
class Transition:
    """One change of (level, phase) of a scope, for replay and audit."""

    ts_ms: int
    scope: str
    level: int
    phase: Phase
    reason: str
    figures: Mapping[str, float | bool | None]
    previous_level: int
    previous_phase: Phase
    notify_customer: bool
    escalated_by_max_duration: bool

    @classmethod
    def of(cls, d: Evaluation) -> Transition:
        return cls(
            d.now_ms,
            d.scope,
            d.level,
            d.phase,
            d.reason,
            d.figures,
            d.previous_level,
            d.previous_phase,
            d.notify_customer,
            d.escalated_by_max_duration,
        )


# --------------------------------------------------------------------------- #
# Engine
# --------------------------------------------------------------------------- #


@dataclass(frozen=True, slots=True)
class _Cond:
    """A condition compiled for evaluation: ``index`` is its clock's slot."""

    index: int
    signal: str
    boolean: bool
    compare: Callable[[float, float], bool] | None
    value: float
    is_value: bool
    for_ms: int
    text: str
    probe_text: str  # without `for`: what a half-open relapse checks
    alert: bool = False  # a burn-rate alert: opens a level, never holds one
    op: str = ""

    def observe(self, signals: Signals) -> bool | None:
        """Whether the comparison holds now; None when the signal is unknown."""
        v = signals.get(self.signal)
        if self.boolean:
            return (v is self.is_value) if isinstance(v, bool) else None
        if isinstance(v, bool) or not isinstance(v, int | float):
            return None
        x = float(v)
        if not math.isfinite(x):
            return None
        assert self.compare is not None
        return self.compare(x, self.value)


class _Scope:
    __slots__ = ("clocks", "escalated", "last", "level", "phase", "recovered_ms", "since_ms")

    def __init__(self, n_conditions: int, now_ms: int) -> None:
        self.level = 0
        self.phase: Phase = "normal"
        self.since_ms = now_ms
        self.escalated = False
        self.recovered_ms: int | None = None  # last step down (or half-open, or back to 0)
        self.clocks: list[int | None] = [None] * n_conditions
        self.last: Evaluation | None = None


class PolicyEngine:
    """The degradation state machine, one state per scope (e.g. per model). Deterministic."""

    def __init__(self, policy: ControlPolicy, *, max_scopes: int = 10_000) -> None:
        if max_scopes < 1:
            raise ValueError("max_scopes must be >= 1")
        self.policy = policy
        self.max_scopes = max_scopes
        self._conds: list[_Cond] = []
        self._enter: dict[int, list[_Cond]] = {}
        self._exit: dict[int, list[_Cond]] = {}
        self._levels: dict[int, Level] = {}
        for lv in sorted(policy.levels, key=lambda x: x.level):
            self._levels[lv.level] = lv
            self._enter[lv.level] = [self._compile(c) for c in lv.enter]
            self._exit[lv.level] = [self._compile(c) for c in lv.exit]
        d = policy.dynamics
        self._dwell_ms = d.min_dwell_ms
        self._ho_ms = d.half_open.duration_ms
        self._admit = d.half_open.admit_fraction
        self._max_ms = {n: lv.max_duration_ms for n, lv in self._levels.items()}
        self._actions = {n: lv.actions.to_actions() for n, lv in self._levels.items()}
        self._ho_actions = self._levels[1].actions.to_actions(self._admit)
        self._scopes: OrderedDict[str, _Scope] = OrderedDict()

    def _compile(self, c: Condition) -> _Cond:
        boolean = c.is_ is not None
        compiled = _Cond(
            index=len(self._conds),
            signal=c.signal,
            boolean=boolean,
            compare=None if boolean else _OPS[c.op or ">"],
            value=0.0 if c.value is None else c.value,
            is_value=bool(c.is_),
            for_ms=c.for_ms,
            text=c.describe(),
            probe_text=c.describe(with_for=False),
            alert=c.signal in ALERT_SIGNALS,
            op=c.op or "",
        )
        self._conds.append(compiled)
        return compiled

    # -- scopes ------------------------------------------------------------- #

    @property
    def scopes(self) -> list[str]:
        return list(self._scopes)

    def last_decision(self, scope: str) -> Evaluation | None:
        s = self._scopes.get(scope)
        return None if s is None else s.last

    def forget(self, scope: str) -> None:
        self._scopes.pop(scope, None)

    def _scope(self, scope: str, now_ms: int) -> _Scope:
        s = self._scopes.get(scope)
        if s is not None:
            self._scopes.move_to_end(scope)
            return s
        if len(self._scopes) >= self.max_scopes:
            victim = next((k for k, v in self._scopes.items() if v.level == 0), None)
            if victim is None:
                victim = next(iter(self._scopes))
            del self._scopes[victim]
        s = _Scope(len(self._conds), now_ms)
        self._scopes[scope] = s
        return s

    # -- evaluation ----------------------------------------------------------- #

    def evaluate(self, scope: str, now_ms: int, signals: Signals) -> Evaluation:
        """Advance ``scope`` to ``now_ms`` with these signals and say what to do."""
        if isinstance(now_ms, bool) or not isinstance(now_ms, int):
            raise TypeError(f"now_ms must be an integer (ms), got {now_ms!r}")
        s = self._scope(scope, now_ms)
        if s.last is not None and now_ms < s.last.now_ms:
            raise ValueError(
                f"scope {scope!r}: now_ms {now_ms} is before the previous evaluation "
                f"({s.last.now_ms}); evaluations of a scope must be in time order"
            )
        # 1. condition clocks
        observed: list[bool] = [False] * len(self._conds)
        holds: list[bool] = [False] * len(self._conds)
        clocks = s.clocks
        for c in self._conds:
            ok = c.observe(signals)
            if ok:
                start = clocks[c.index]
                if start is None:
                    start = clocks[c.index] = now_ms
                observed[c.index] = True
                holds[c.index] = now_ms - start >= c.for_ms
            else:
                clocks[c.index] = None
        # An alert opens a level only if it rose after the scope last stepped down: an
        # alert still firing from before a recovery does not re-open what it opened.
        opens = [
            holds[c.index]
            and (not c.alert or s.recovered_ms is None or (clocks[c.index] or 0) > s.recovered_ms)
            for c in self._conds
        ]
        entered = 0  # highest level whose entry holds: may step up
        justified = 0  # highest level whose entry holds on evidence other than alerts: keeps it
        for n in LEVELS:
            if any(opens[c.index] for c in self._enter[n]):
                entered = n
            if any(holds[c.index] and not c.alert for c in self._enter[n]):
                justified = n

        prev_level, prev_phase = s.level, s.phase
        held = now_ms - s.since_ms
        overdue = False
        held_because: list[str] = []
        reason: str
        figs: list[_Cond]

        def move(level: int, phase: Phase, *, escalated: bool = False) -> None:
            if level < s.level or phase == "half_open" or level == 0:
                s.recovered_ms = now_ms  # a step down
            s.level, s.phase, s.since_ms, s.escalated = level, phase, now_ms, escalated

        if s.phase == "half_open":
            probe = [c for c in self._enter[1] if observed[c.index] and not c.alert]
            if entered >= 1 or probe:
                target = max(1, entered)
                figs = self._holding(target, opens) if entered >= 1 else probe
                move(target, "degraded")
                texts = _texts(figs, signals, probe=entered == 0)
                reason = f"relapse during half-open -> L{target}: {texts}"
            elif held >= self._ho_ms:
                figs = []
                move(0, "normal")
                reason = f"half-open {format_ms(self._ho_ms)} passed without relapse -> normal"
            else:
                figs = []
                held_because.append(f"half-open ({format_ms(held)} of {format_ms(self._ho_ms)})")
                reason = (
                    f"half-open since {s.since_ms}: admitting {self._admit:.0%} of shed "
                    f"traffic until {s.since_ms + self._ho_ms}; relapse if "
                    + " or ".join(c.probe_text for c in self._enter[1] if not c.alert)
                )
        elif entered > s.level:
            figs = self._holding(entered, opens)
            move(entered, "degraded")
            reason = f"L{entered} entry holds: {_texts(figs, signals)}"
        elif s.level > 0:
            lv = s.level
            exits = self._exit[lv]
            exit_ok = all(holds[c.index] for c in exits)
            failing = [c for c in exits if not holds[c.index]]
            if justified >= lv:
                held_because.extend(
                    f"entry {_held_text(c, signals, now_ms, clocks[c.index])}"
                    for c in self._enter[lv]
                    if holds[c.index] and not c.alert
                )
            held_because.extend(_held_text(c, signals, now_ms, clocks[c.index]) for c in failing)
            if justified < lv and exit_ok and held >= self._dwell_ms:
                figs = exits
                held_because = []
                if lv == 1:
                    move(1, "half_open")
                    reason = (
                        f"L1 exit holds ({_texts(figs, signals)}) after "
                        f"{format_ms(held)} >= min_dwell {format_ms(self._dwell_ms)} -> "
                        f"half-open for {format_ms(self._ho_ms)}, admitting "
                        f"{self._admit:.0%} of shed traffic"
                    )
                else:
                    move(lv - 1, "degraded")
                    reason = (
                        f"L{lv} exit holds ({_texts(figs, signals)}) after "
                        f"{format_ms(held)} >= min_dwell {format_ms(self._dwell_ms)} "
                        f"-> L{lv - 1}"
                    )
            elif held >= self._max_ms[lv] and justified >= lv and lv < LEVELS[-1]:
                # Its own entry still holds after max_duration: its actions are not enough.
                figs = self._justifying(lv, holds)
                limit = format_ms(self._max_ms[lv])
                move(lv + 1, "degraded", escalated=True)
                held_because = []
                reason = (
                    f"L{lv} held {format_ms(held)} >= max_duration {limit} and its entry "
                    f"still holds ({_texts(figs, signals)}) -> escalated to L{lv + 1}, "
                    "notify customer"
                )
            else:
                if held < self._dwell_ms and not failing and justified < lv:
                    held_because.append(
                        f"min_dwell ({format_ms(held)} of {format_ms(self._dwell_ms)})"
                    )
                if held >= self._max_ms[lv]:
                    # Past max_duration: notified; it escalates only while its entry holds
                    # (L3 has nowhere to go) and otherwise steps down as usual.
                    overdue = True
                    limit = format_ms(self._max_ms[lv])
                    tail = (
                        "no higher level: notify customer"
                        if justified >= lv
                        else "entry no longer holds: not escalated, notify customer"
                    )
                    prefix = f"L{lv} held {format_ms(held)} past max_duration {limit}; {tail}"
                else:
                    prefix = ""
                if justified >= lv:
                    figs = self._justifying(lv, holds)
                    body = f"L{lv} entry holds: {_texts(figs, signals)}"
                elif not exit_ok:
                    figs = failing
                    body = f"L{lv} held, waiting for exit: {'; '.join(held_because)}"
                else:
                    figs = exits
                    body = (
                        f"L{lv}: exit holds, min_dwell {format_ms(self._dwell_ms)} "
                        f"until {s.since_ms + self._dwell_ms}"
                    )
                reason = f"{prefix}: {body}" if prefix else body
        else:
            figs = []
            reason = "normal: no entry condition holds"

        level, phase = s.level, s.phase
        if phase == "half_open":
            actions = self._ho_actions
        elif level == 0:
            actions = NO_ACTIONS
        else:
            actions = self._actions[level]
        notify = level > 0 and (self._levels[level].notify_customer or s.escalated or overdue)
        changed = (level, phase) != (prev_level, prev_phase)
        figures = {c.signal: v for c in figs if (v := _value(c, signals)) is not None}
        evaluation = Evaluation(
            scope=scope,
            now_ms=now_ms,
            decision=Decision(
                level=level,
                phase=phase,
                actions=actions,
                reason=_bounded(reason),
                figures=dict(list(figures.items())[:MAX_FIGURES]),
                notify_customer=notify,
                budget_exhausted=signals.get(_BUDGET_SIGNAL) is True,
            ),
            changed=changed,
            since_ms=s.since_ms,
            escalated_by_max_duration=s.escalated,
            overdue=overdue,
            previous_level=prev_level,
            previous_phase=prev_phase,
            held_because=() if changed or level == 0 else tuple(held_because),
        )
        s.last = evaluation
        return evaluation

    def _holding(self, level: int, holds: list[bool]) -> list[_Cond]:
        return [c for c in self._enter[level] if holds[c.index]]

    def _justifying(self, level: int, holds: list[bool]) -> list[_Cond]:
        return [c for c in self._enter[level] if holds[c.index] and not c.alert]


def _bounded(reason: str) -> str:
    """A reason fits a signal (``REASON_MAX_CHARS``): cut, and marked as cut."""
    if len(reason) <= REASON_MAX_CHARS:
        return reason
    return reason[: REASON_MAX_CHARS - 1] + "\u2026"


def _value(c: _Cond, signals: Signals) -> float | bool | None:
    """The signal's value as the condition reads it; None when unknown to it."""
    v = signals.get(c.signal)
    if c.observe(signals) is None:
        return None
    if isinstance(v, bool):
        return v
    assert isinstance(v, int | float)
    return float(v)


_NEGATED: Final = {">": "<=", ">=": "<", "<": ">=", "<=": ">"}


def _held_text(c: _Cond, signals: Signals, now_ms: int, since: int | None) -> str:
    """Why a condition is where it is: ``"p99.x 412 >= 250 (exit needs < 250 for 5m)"``,
    ``"p99.x 200 < 250 (3m of 5m)"``, ``"burn.page unknown (needs is false)"``."""
    v = _value(c, signals)
    if v is None:
        return f"{c.signal} unknown (needs {c.text.removeprefix(c.signal + ' ')})"
    shown = str(v).lower() if isinstance(v, bool) else _num(v)
    if since is None:  # the comparison does not hold now
        if c.boolean:
            return f"{c.signal} is {shown} (needs {c.text.removeprefix(c.signal + ' ')})"
        return (
            f"{c.signal} {shown} {_NEGATED[c.op]} {_num(c.value)} "
            f"(needs {c.text.removeprefix(c.signal + ' ')})"
        )
    cmp = f"is {shown}" if c.boolean else f"{shown} {c.op} {_num(c.value)}"
    return f"{c.signal} {cmp} ({format_ms(now_ms - since)} of {format_ms(c.for_ms)})"


def _texts(conds: Iterable[_Cond], signals: Signals, *, probe: bool = False) -> str:
    parts = []
    for c in conds:
        v = _value(c, signals)
        shown = "unknown" if v is None else str(v).lower() if isinstance(v, bool) else _num(v)
        parts.append(f"{c.probe_text if probe else c.text} (now {shown})")
    return "; ".join(parts)


# --------------------------------------------------------------------------- #
# Replay
# --------------------------------------------------------------------------- #


def transitions(
    policy: ControlPolicy | PolicyEngine,
    samples: Iterable[tuple[int, Signals]],
    *,
    scope: str = "default",
) -> list[Transition]:
    """Feed ``(now_ms, signals)`` samples of one scope in order; the changes of level/phase.

    Pass a :class:`PolicyEngine` to continue from (and update) its state.
    """
    engine = policy if isinstance(policy, PolicyEngine) else PolicyEngine(policy)
    out: list[Transition] = []
    for now_ms, signals in samples:
        d = engine.evaluate(scope, now_ms, signals)
        if d.changed:
            out.append(Transition.of(d))
    return out
