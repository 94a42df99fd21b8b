"""SLO specs (``apiVersion: tailguard/v1``, ``kind: SLOSpec``) and compliance maths.

Pure: pydantic, PyYAML and the standard library only (no Kafka, Faust or
ClickHouse). A spec names, per SLO, one boundary of
:class:`~pipeline.core.record.RequestRecord` (``gateway_total_ms``,
``inference_ms``, ...), a threshold and an objective; ``specs/README.md`` shows
the file format, ``specs/slo-example.yaml`` a full example.

What counts
-----------
For one SLO and one record, :meth:`SLO.classify` says ``"good"``, ``"bad"`` or
``"skip"`` (skipped records are in neither numerator nor denominator):

1. **Traffic selection.** Each ``filter`` list (``model``, ``priority``,
   ``ctx_bucket``, ``tenant``; ``stream``: true/false) must contain the
   record's value; a record without that value (``None``) does not match.
   ``exclude.prompt_tokens_over: N`` skips records with more than N prompt
   tokens (unknown prompt size is not excluded). Out of selection -> skip.
2. **Failures** (outcome ``error``, ``timeout``, ``rejected``; any unknown
   outcome is treated the same). ``errors: bad`` (default): bad whatever the
   latency -- a fast 503 is not a fast success -- *if the request reached the
   layer that measures the boundary*: gateway boundaries need the gateway's
   ``completed`` event, engine boundaries the engine's ``finished`` event,
   ``gateway_overhead_ms`` both. So a request the gateway rejected (never sent
   to an engine) is bad for a gateway SLO and absent from a pure-compute SLO.
   ``errors: exclude``: skip.
   **Retries.** A client retrying with the same request id makes attempts of one
   request (``RequestRecord.attempt``). ``attempts: every`` (default) counts each;
   ``attempts: last`` skips a failed attempt the client retried (``superseded``).
3. **Client aborts** (``client_abort``). ``client_abort: measure`` (default):
   judged like a success, by the time the client waited at that boundary.
   vLLM does not report aborts, so engine boundaries usually have no value and
   the abort is skipped there. ``client_abort: exclude``: skip.
4. **Latency.** Good iff ``value <= threshold_ms`` (equality is good). No value
   at the boundary -> skip. One refinement: ``gateway_ttfb_ms`` is missing when
   no byte was ever sent; the client then waited ``gateway_total_ms`` without
   a first byte, so if *that* exceeds the threshold the first byte was
   certainly late -> bad (otherwise unknown -> skip). Without this, the worst
   time-to-first-byte cases (gave up waiting) would vanish from TTFB SLOs.

Compliance of an SLO is ``good / total`` over the non-skipped records
(:class:`SLOCounts`; ``None`` when nothing counted).

Blended tiers
-------------
``tiers: {name: {primary, secondary, secondary_weight: w, objective}}``. Over
the records the *primary* SLO counts (its denominator)::

    compliance = (good_primary + w * good_secondary_only) / total

where ``good_secondary_only`` are records bad for the primary but good for the
secondary (a secondary ``skip`` earns nothing). A tier uses its primary's window.

Counts are plain integers, so per-window or per-partition partials merge
exactly by addition (:meth:`SLOCounts.merge`, :meth:`BlendedCounts.merge`,
:meth:`SLOEvaluator.merge`). The evaluator counts every record it is given:
feed it one record per request (the final revision), not partial + upgrade.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import Annotated, Any, Final, Literal

import yaml
from annotated_types import MinLen
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    model_validator,
)

from pipeline.core.durations import parse_duration_ms, unit_required
from pipeline.core.record import BOUNDARIES, CTX_BUCKETS, RequestRecord

API_VERSION: Final = "tailguard/v1"
KIND: Final = "SLOSpec"
DEFAULT_BLENDED: Final = "blended"

Verdict = Literal["good", "bad", "skip"]

# Which record sources observed a boundary's layer (for rule 2 above).
_GATEWAY_SOURCES: Final = frozenset({"joined", "gateway_only"})
_ENGINE_SOURCES: Final = frozenset({"joined", "engine_only"})
_BOTH_SOURCES: Final = frozenset({"joined"})
_GATEWAY_BOUNDARIES: Final = frozenset({"gateway_total_ms", "gateway_ttfb_ms"})
_BOTH_BOUNDARIES: Final = frozenset({"gateway_overhead_ms"})
# A missing value at KEY means "never happened, waited at least VALUE" (rule 4).
_LOWER_BOUND: Final = {"gateway_ttfb_ms": "gateway_total_ms"}

_NAME_RE: Final = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
_DEFER_CROSS_CHECKS: Final = "tailguard.slo.defer_cross_checks"


# --------------------------------------------------------------------------- #
# Field types
# --------------------------------------------------------------------------- #


def _check_duration(v: str) -> str:
    parse_duration_ms(v)
    return v


def _check_name(v: str) -> str:
    if not _NAME_RE.match(v):
        raise ValueError(
            f"invalid name {v!r}: use lowercase letters, digits and dashes "
            "(at most 63, not starting or ending with a dash), e.g. tier1-gateway"
        )
    return v


def _check_boundary(v: str) -> str:
    if v not in BOUNDARIES:
        raise ValueError(f"unknown boundary {v!r}; known: {', '.join(BOUNDARIES)}")
    return v


def _check_bucket(v: str) -> str:
    if v not in CTX_BUCKETS:
        raise ValueError(f"unknown ctx_bucket {v!r}; known: {', '.join(CTX_BUCKETS)}")
    return v


def _check_objective(v: float) -> float:
    if not (0.0 < v < 1.0):
        raise ValueError(
            f"objective must be a fraction strictly between 0 and 1 (0.99 = 99%), got {v}"
        )
    return v


def _one_or_many(v: object) -> object:
    """Let a filter say ``priority: 0`` as well as ``priority: [0, 1]``."""
    return v if v is None or isinstance(v, list) else [v]


Name = Annotated[str, AfterValidator(_check_name)]
Objective = Annotated[float, Field(allow_inf_nan=False), AfterValidator(_check_objective)]
NonEmptyStr = Annotated[str, MinLen(1)]
Priority = Annotated[int, Field(ge=0, le=3)]
CtxBucket = Annotated[str, AfterValidator(_check_bucket)]
StrList = Annotated[list[NonEmptyStr], BeforeValidator(_one_or_many), MinLen(1)]
PriorityList = Annotated[list[Priority], BeforeValidator(_one_or_many), MinLen(1)]
BucketList = Annotated[list[CtxBucket], BeforeValidator(_one_or_many), MinLen(1)]


class _Model(BaseModel):
    # strict: YAML gives real types, so "400" (a string) or `true` for a number is a mistake.
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


# --------------------------------------------------------------------------- #
# Spec models
# --------------------------------------------------------------------------- #


class Window(_Model):
    """Either ``{rolling: 30d}`` or ``{calendar: month}`` (or ``week``; UTC, weeks start Monday)."""

    rolling: (
        Annotated[str, BeforeValidator(unit_required), AfterValidator(_check_duration)] | None
    ) = None
    calendar: Literal["month", "week"] | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> Window:
        if (self.rolling is None) == (self.calendar is None):
            raise ValueError("give exactly one of rolling (e.g. 30d) or calendar (month or week)")
        return self

    @property
    def rolling_ms(self) -> int | None:
        return None if self.rolling is None else parse_duration_ms(self.rolling)

    def start_unix_ns(self, now_unix_ns: int) -> int:
        """Start of the window that ends at ``now_unix_ns``."""
        if self.rolling is not None:
            return now_unix_ns - parse_duration_ms(self.rolling) * 1_000_000
        now = dt.datetime.fromtimestamp(now_unix_ns // 1_000_000_000, tz=dt.UTC)
        day = now.replace(hour=0, minute=0, second=0, microsecond=0)
        if self.calendar == "month":
            start = day.replace(day=1)
        else:
            start = day - dt.timedelta(days=day.weekday())
        return int(start.timestamp()) * 1_000_000_000

    def describe(self) -> str:
        return (
            f"rolling {self.rolling}" if self.rolling is not None else f"calendar {self.calendar}"
        )


class Filter(_Model):
    """Traffic an SLO covers; each key optional, a record must match every key given."""

    model: StrList | None = None
    priority: PriorityList | None = None
    ctx_bucket: BucketList | None = None
    tenant: StrList | None = None
    stream: bool | None = None


class Exclude(_Model):
    """Traffic taken out of an SLO (e.g. long prompts served asynchronously)."""

    prompt_tokens_over: Annotated[int, Field(ge=0)] | None = None


class SLO(_Model):
    """One latency SLO: ``objective`` of the selected requests have ``boundary <= threshold_ms``."""

    name: Name
    description: str | None = None
    boundary: Annotated[str, AfterValidator(_check_boundary)]
    threshold_ms: Annotated[float, Field(gt=0, allow_inf_nan=False)]
    objective: Objective
    window: Window = Field(default_factory=lambda: Window(rolling="30d"))
    filter: Filter | None = None
    exclude: Exclude | None = None
    errors: Literal["bad", "exclude"] = "bad"
    client_abort: Literal["measure", "exclude"] = "measure"
    # Client retries reusing a request id (attempts, see pipeline/core/join.py): count
    # every attempt, or only each request's last (a failed attempt the client retried
    # is skipped).
    attempts: Literal["every", "last"] = "every"

    _matcher: _Matcher = PrivateAttr()

    def model_post_init(self, context: Any, /) -> None:
        self._matcher = _Matcher(self)

    def classify(self, record: RequestRecord) -> Verdict:
        """``good``, ``bad`` or ``skip`` (see the module docstring)."""
        return self._matcher.classify(record)

    def applies(self, record: RequestRecord) -> bool:
        """True when the record is in this SLO's denominator."""
        return self._matcher.classify(record) != "skip"

    def is_good(self, record: RequestRecord) -> bool:
        return self._matcher.classify(record) == "good"

    @property
    def classifier(self) -> Callable[[RequestRecord], Verdict]:
        """The precompiled per-record function (what the evaluator calls)."""
        return self._matcher.classify


class BlendedTier(_Model):
    """Primary good -> 1, else secondary good -> ``secondary_weight``; per primary record."""

    description: str | None = None
    primary: NonEmptyStr  # must name an SLO of the spec (checked across entries)
    secondary: NonEmptyStr
    secondary_weight: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
    objective: Objective


class SLOSpec(_Model):
    """A versioned set of SLOs and blended tiers (``apiVersion: tailguard/v1``)."""

    api_version: Literal["tailguard/v1"] = Field(alias="apiVersion")
    kind: Literal["SLOSpec"]
    description: str | None = None
    slos: Annotated[list[SLO], MinLen(1)]
    tiers: dict[Name, BlendedTier] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _cross_checks(self, info: ValidationInfo) -> SLOSpec:
        if isinstance(info.context, Mapping) and info.context.get(_DEFER_CROSS_CHECKS):
            return self  # load_spec runs them on the raw document, next to the field errors
        issues = _cross_issues(
            {
                "slos": [{"name": s.name} for s in self.slos],
                "tiers": {
                    n: {"primary": t.primary, "secondary": t.secondary}
                    for n, t in self.tiers.items()
                },
            }
        )
        if issues:
            raise ValueError("; ".join(f"{i.path}: {i.message}" for i in issues))
        return self

    def slo(self, name: str) -> SLO:
        for s in self.slos:
            if s.name == name:
                return s
        raise KeyError(name)

    @property
    def default_tier(self) -> str | None:
        """The tier reported as ``blended``: the one named ``blended``, else the first."""
        if DEFAULT_BLENDED in self.tiers:
            return DEFAULT_BLENDED
        return next(iter(self.tiers), None)

    def summary(self) -> str:
        n, t = len(self.slos), len(self.tiers)
        return f"{n} SLO{'' if n == 1 else 's'}, {t} blended tier{'' if t == 1 else 's'}"


def _cross_issues(data: object) -> list[SpecIssue]:
    """Checks across entries (unique names, tier references) on a plain document.

    Tolerant of a malformed document: it only looks at the parts that have the
    right shape, so it can run next to pydantic's field errors.
    """
    issues: list[SpecIssue] = []
    if not isinstance(data, Mapping):
        return issues
    slos = data.get("slos")
    if not isinstance(slos, list):
        return issues
    first: dict[str, int] = {}
    for i, item in enumerate(slos):
        name = item.get("name") if isinstance(item, Mapping) else None
        if not isinstance(name, str):
            continue
        if name in first:
            issues.append(
                SpecIssue(
                    f"slos[{i}].name", f"duplicate SLO name {name!r} (first at slos[{first[name]}])"
                )
            )
        else:
            first[name] = i
    tiers = data.get("tiers")
    if not isinstance(tiers, Mapping):
        return issues
    for tier_name, tier in tiers.items():
        if not isinstance(tier, Mapping):
            continue
        for key in ("primary", "secondary"):
            ref = tier.get(key)
            if isinstance(ref, str) and ref not in first:
                issues.append(
                    SpecIssue(
                        f"tiers.{tier_name}.{key}",
                        f"unknown SLO {ref!r}; defined: {', '.join(first) or '(none)'}",
                    )
                )
        if isinstance(tier.get("primary"), str) and tier.get("primary") == tier.get("secondary"):
            issues.append(SpecIssue(f"tiers.{tier_name}.secondary", "must differ from primary"))
    return issues


# --------------------------------------------------------------------------- #
# Per-record classification (the hot path)
# --------------------------------------------------------------------------- #


class _Matcher:
    """An SLO compiled for the per-record path: frozensets, attrgetters, no allocation."""

    __slots__ = (
        "aborts_measured",
        "boundary",
        "buckets",
        "errors_bad",
        "get",
        "last_attempt_only",
        "lower_bound",
        "max_prompt",
        "models",
        "observed",
        "priorities",
        "stream",
        "tenants",
        "threshold",
    )

    def __init__(self, slo: SLO) -> None:
        f = slo.filter or Filter()
        self.models: frozenset[str] | None = None if f.model is None else frozenset(f.model)
        self.priorities: frozenset[int] | None = (
            None if f.priority is None else frozenset(f.priority)
        )
        self.buckets: frozenset[str] | None = (
            None if f.ctx_bucket is None else frozenset(f.ctx_bucket)
        )
        self.tenants: frozenset[str] | None = None if f.tenant is None else frozenset(f.tenant)
        self.stream: bool | None = f.stream
        self.max_prompt: int | None = slo.exclude.prompt_tokens_over if slo.exclude else None
        self.errors_bad = slo.errors == "bad"
        self.aborts_measured = slo.client_abort == "measure"
        self.last_attempt_only = slo.attempts == "last"
        self.threshold = slo.threshold_ms
        self.boundary = slo.boundary
        self.get: Callable[[RequestRecord], float | None] = attrgetter(slo.boundary)
        lower = _LOWER_BOUND.get(slo.boundary)
        self.lower_bound: Callable[[RequestRecord], float | None] | None = (
            None if lower is None else attrgetter(lower)
        )
        if slo.boundary in _GATEWAY_BOUNDARIES:
            self.observed = _GATEWAY_SOURCES
        elif slo.boundary in _BOTH_BOUNDARIES:
            self.observed = _BOTH_SOURCES
        else:
            self.observed = _ENGINE_SOURCES

    def _key(self) -> tuple[object, ...]:
        return (
            self.boundary,
            self.threshold,
            self.models,
            self.priorities,
            self.buckets,
            self.tenants,
            self.stream,
            self.max_prompt,
            self.errors_bad,
            self.aborts_measured,
            self.last_attempt_only,
        )

    # pydantic compares private attributes too: equal SLOs must have equal matchers.
    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Matcher) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def classify(self, r: RequestRecord) -> Verdict:
        # 1. traffic selection
        if r.superseded and self.last_attempt_only:
            return "skip"
        if self.models is not None and r.model not in self.models:
            return "skip"
        if self.priorities is not None and r.priority not in self.priorities:
            return "skip"
        if self.buckets is not None and r.ctx_bucket not in self.buckets:
            return "skip"
        if self.tenants is not None and r.tenant not in self.tenants:
            return "skip"
        if self.stream is not None and r.stream is not self.stream:
            return "skip"
        if self.max_prompt is not None:
            pt = r.prompt_tokens
            if pt is not None and pt > self.max_prompt:
                return "skip"
        # 2./3. outcome
        outcome = r.outcome
        if outcome != "ok":
            if outcome == "client_abort":
                if not self.aborts_measured:
                    return "skip"
            elif self.errors_bad:
                return "bad" if r.source in self.observed else "skip"
            else:
                return "skip"
        # 4. latency
        value = self.get(r)
        if value is None:
            if self.lower_bound is not None:
                waited = self.lower_bound(r)
                if waited is not None and waited > self.threshold:
                    return "bad"
            return "skip"
        return "good" if value <= self.threshold else "bad"


# --------------------------------------------------------------------------- #
# Counts (mergeable)
# --------------------------------------------------------------------------- #


@dataclass(frozen=True, slots=True)
class SLOCounts:
    """Records counted by one SLO and how many were good; partials add up exactly."""

    total: int = 0
    good: int = 0

    def __post_init__(self) -> None:
        if not (0 <= self.good <= self.total):
            raise ValueError(f"need 0 <= good <= total, got good={self.good} total={self.total}")

    @property
    def bad(self) -> int:
        return self.total - self.good

    @property
    def compliance(self) -> float | None:
        return None if self.total == 0 else self.good / self.total

    def merge(self, other: SLOCounts) -> SLOCounts:
        return SLOCounts(self.total + other.total, self.good + other.good)

    __add__ = merge

    def error_budget_remaining(self, objective: float) -> float | None:
        """Share of the error budget left: 1 = none used, 0 = exhausted, < 0 = overspent."""
        if self.total == 0:
            return None
        allowed = (1.0 - objective) * self.total
        return 1.0 - self.bad / allowed


@dataclass(frozen=True, slots=True)
class BlendedCounts:
    """``(good_primary + w * good_secondary_only) / total`` over the primary's records."""

    secondary_weight: float
    total: int = 0
    good_primary: int = 0
    good_secondary_only: int = 0

    def __post_init__(self) -> None:
        if self.good_primary < 0 or self.good_secondary_only < 0:
            raise ValueError("counts must be >= 0")
        if self.good_primary + self.good_secondary_only > self.total:
            raise ValueError("good_primary + good_secondary_only must be <= total")

    @property
    def compliance(self) -> float | None:
        if self.total == 0:
            return None
        return (self.good_primary + self.secondary_weight * self.good_secondary_only) / self.total

    def merge(self, other: BlendedCounts) -> BlendedCounts:
        if not math.isclose(self.secondary_weight, other.secondary_weight):
            raise ValueError("cannot merge blended counts with different secondary weights")
        return BlendedCounts(
            self.secondary_weight,
            self.total + other.total,
            self.good_primary + other.good_primary,
            self.good_secondary_only + other.good_secondary_only,
        )

    __add__ = merge


class _TierAcc:
    __slots__ = ("good_primary", "good_secondary_only", "primary", "secondary", "total")

    def __init__(self, primary: int, secondary: int) -> None:
        self.primary = primary
        self.secondary = secondary
        self.total = 0
        self.good_primary = 0
        self.good_secondary_only = 0


class SLOEvaluator:
    """Accumulates :class:`SLOCounts` per SLO and :class:`BlendedCounts` per tier.

    Satisfies :class:`pipeline.core.windows.WindowSLOs` (``add(record)``), so
    ``lambda: SLOEvaluator(spec)`` is a per-window factory; partial evaluators
    of one spec combine with :meth:`merge`.
    """

    __slots__ = ("_classifiers", "_good", "_tiers", "_total", "_verdicts", "records", "spec")

    def __init__(self, spec: SLOSpec) -> None:
        self.spec = spec
        self.records = 0
        self._classifiers = [s.classifier for s in spec.slos]
        n = len(self._classifiers)
        self._total = [0] * n
        self._good = [0] * n
        self._verdicts: list[Verdict] = ["skip"] * n
        index = {s.name: i for i, s in enumerate(spec.slos)}
        self._tiers = {
            name: _TierAcc(index[t.primary], index[t.secondary]) for name, t in spec.tiers.items()
        }

    def add(self, record: RequestRecord, sign: int = 1) -> None:
        """Count one record; ``sign`` -1 takes back a record counted before (a partial
        replaced by its upgrade), so counts of a correction may be negative."""
        self.records += sign
        verdicts, total, good = self._verdicts, self._total, self._good
        for i, classify in enumerate(self._classifiers):
            v = classify(record)
            verdicts[i] = v
            if v != "skip":
                total[i] += sign
                if v == "good":
                    good[i] += sign
        for acc in self._tiers.values():
            pv = verdicts[acc.primary]
            if pv == "skip":
                continue
            acc.total += sign
            if pv == "good":
                acc.good_primary += sign
            elif verdicts[acc.secondary] == "good":
                acc.good_secondary_only += sign

    def add_many(self, records: Iterable[RequestRecord]) -> None:
        add = self.add
        for r in records:
            add(r)

    def merge(self, other: SLOEvaluator) -> None:
        """Add another evaluator's counts (same spec) into this one."""
        if other.spec != self.spec:
            raise ValueError("cannot merge evaluators of different specs")
        self.records += other.records
        for i in range(len(self._total)):
            self._total[i] += other._total[i]
            self._good[i] += other._good[i]
        for name, acc in self._tiers.items():
            o = other._tiers[name]
            acc.total += o.total
            acc.good_primary += o.good_primary
            acc.good_secondary_only += o.good_secondary_only

    def delta_counts(self) -> tuple[dict[str, tuple[int, int]], dict[str, tuple[int, int, int]]]:
        """Raw counts, which may be negative for a correction (see :meth:`add`):
        per SLO ``(total, good)``, per tier ``(total, good_primary, good_secondary_only)``."""
        slos = {s.name: (self._total[i], self._good[i]) for i, s in enumerate(self.spec.slos)}
        tiers = {
            name: (acc.total, acc.good_primary, acc.good_secondary_only)
            for name, acc in self._tiers.items()
        }
        return slos, tiers

    def counts(self) -> dict[str, SLOCounts]:
        return {
            s.name: SLOCounts(self._total[i], self._good[i]) for i, s in enumerate(self.spec.slos)
        }

    def blended_counts(self) -> dict[str, BlendedCounts]:
        return {
            name: BlendedCounts(
                self.spec.tiers[name].secondary_weight,
                acc.total,
                acc.good_primary,
                acc.good_secondary_only,
            )
            for name, acc in self._tiers.items()
        }

    def to_json(self) -> dict[str, Any]:
        return compliance_report(self.spec, self.counts(), self.blended_counts())


def compliance_report(
    spec: SLOSpec,
    counts: Mapping[str, SLOCounts],
    blended: Mapping[str, BlendedCounts],
) -> dict[str, Any]:
    """JSON-ready report of (possibly merged) counts.

    ``{"slos": {name: {total, good, compliance, objective, met, ...}},
    "blended": {...} | None, "tiers": {name: {...}}}``; ``blended`` is the tier
    named ``blended``, else the first tier. ``met`` is None when nothing counted.
    """
    slos: dict[str, Any] = {}
    for s in spec.slos:
        c = counts.get(s.name, SLOCounts())
        comp = c.compliance
        slos[s.name] = {
            "boundary": s.boundary,
            "threshold_ms": s.threshold_ms,
            "objective": s.objective,
            "window": s.window.describe(),
            "total": c.total,
            "good": c.good,
            "compliance": comp,
            "met": None if comp is None else comp >= s.objective,
            "error_budget_remaining": c.error_budget_remaining(s.objective),
        }
    tiers: dict[str, Any] = {}
    for name, t in spec.tiers.items():
        b = blended.get(name, BlendedCounts(t.secondary_weight))
        comp = b.compliance
        tiers[name] = {
            "primary": t.primary,
            "secondary": t.secondary,
            "secondary_weight": t.secondary_weight,
            "objective": t.objective,
            "total": b.total,
            "good_primary": b.good_primary,
            "good_secondary_only": b.good_secondary_only,
            "compliance": comp,
            "met": None if comp is None else comp >= t.objective,
        }
    default = spec.default_tier
    return {
        "slos": slos,
        "blended": None if default is None else tiers[default],
        "tiers": tiers,
    }


# --------------------------------------------------------------------------- #
# Loading and errors
# --------------------------------------------------------------------------- #


@dataclass(frozen=True, slots=True)
class SpecIssue:
    """One problem in a spec: ``path`` in the YAML's own names (``slos[1].window.rolling``)."""

    path: str
    message: str
    line: int | None = None  # 1-based, when known
    column: int | None = None  # 1-based, for YAML syntax errors

    def render(self, source: str) -> str:
        where = f"{source}: {self.path}: " if self.path else f"{source}: "
        at = ""
        if self.line is not None:
            at = f" (line {self.line}" + (f", column {self.column})" if self.column else ")")
        return f"{where}{self.message}{at}"


class SpecError(ValueError):
    """A spec that does not load; ``str()`` lists every problem, one per line."""

    def __init__(self, source: str, errors: list[SpecIssue]) -> None:
        self.source = source
        self.errors = errors
        super().__init__("\n".join(e.render(source) for e in errors))


class _SpecLoader(yaml.SafeLoader):
    """Safe YAML that rejects duplicate keys (silently last-wins otherwise)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, list | dict):
                continue  # unhashable; SafeLoader reports it
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"duplicate key {key!r}",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part == "[key]":
            continue  # a dict key failed; the path already ends in that key
        else:
            out += f".{part}" if out else part
    return out


def _line(node: yaml.Node | None, loc: tuple[int | str, ...]) -> int | None:
    """1-based line of the deepest YAML node on ``loc`` (best effort)."""
    if node is None:
        return None
    line = node.start_mark.line + 1
    for part in loc:
        child: yaml.Node | None = None
        if isinstance(node, yaml.MappingNode) and isinstance(part, str):
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode) and k.value == part:
                    child = v
                    break
        elif (
            isinstance(node, yaml.SequenceNode)
            and isinstance(part, int)
            and 0 <= part < len(node.value)
        ):
            child = node.value[part]
        if child is None:
            break
        node = child
        line = node.start_mark.line + 1
    return line


def _message(err: Mapping[str, Any]) -> str:
    if err["type"] == "value_error":
        return str(err["ctx"]["error"])
    if err["type"] == "extra_forbidden":
        return "unknown field (not part of tailguard/v1; a typo?)"
    return str(err["msg"])


def parse_yaml_mapping(text: str, source: str, what: str) -> tuple[dict[str, Any], yaml.Node]:
    """YAML text -> (mapping, node tree for error line numbers); problems raise SpecError.

    Shared by every tailguard/v1 file (SLO specs, control policies, burn rules).
    """
    loader = _SpecLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        problem = ": ".join(p for p in (e.context, e.problem) if p)
        line, column = (mark.line + 1, mark.column + 1) if mark else (None, None)
        raise SpecError(source, [SpecIssue("", f"YAML error: {problem}", line, column)]) from None
    except yaml.YAMLError as e:
        raise SpecError(source, [SpecIssue("", f"YAML error: {e}")]) from None
    finally:
        loader.dispose()
    if not isinstance(data, dict) or node is None:
        kind = "empty" if data is None else f"a {type(data).__name__}"
        raise SpecError(source, [SpecIssue("", f"{what} must be a YAML mapping, got {kind}")])
    return data, node


def load_spec(text: str, source: str = "<spec>") -> SLOSpec:
    """Parse and validate a spec; raises :class:`SpecError` listing every problem."""
    data, node = parse_yaml_mapping(text, source, "a spec")
    issues: list[SpecIssue] = []
    spec: SLOSpec | None = None
    try:
        spec = SLOSpec.model_validate(data, context={_DEFER_CROSS_CHECKS: True})
    except ValidationError as e:
        for err in e.errors():
            loc = tuple(err["loc"])
            issues.append(SpecIssue(_path(loc), _message(err), _line(node, loc)))
    for issue in _cross_issues(data):
        loc = tuple(int(p) if p.isdigit() else p for p in re.findall(r"[^.\[\]]+", issue.path))
        issues.append(SpecIssue(issue.path, issue.message, _line(node, loc)))
    if issues or spec is None:
        raise SpecError(source, sorted(issues, key=lambda i: i.line or 0))
    return spec


def load_spec_file(path: str | Path) -> SLOSpec:
    """:func:`load_spec` on a file; an unreadable file is a :class:`SpecError` too."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(str(path), [SpecIssue("", f"cannot read spec: {e}")]) from None
    return load_spec(text, str(path))


def validate_file(path: str | Path) -> tuple[bool, str]:
    """For the CLI: ``(True, "ok: 7 SLOs, 1 blended tier (FILE)")`` or ``(False, errors)``."""
    try:
        spec = load_spec_file(path)
    except SpecError as e:
        n = len(e.errors)
        return False, f"{e}\n{n} problem{'' if n == 1 else 's'} in {path}"
    return True, f"ok: {spec.summary()} ({path})"
