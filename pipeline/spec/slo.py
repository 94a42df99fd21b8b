"""SLO specs (``apiVersion: tailguard/v1``, ``kind: SLOSpec``): the file format as data.

Plain validated values (pydantic): a spec names, per SLO, one boundary of
:class:`~pipeline.core.record.RequestRecord` (``gateway_total_ms``,
``inference_ms``, ...), a threshold and an objective; ``specs/README.md`` shows
the file format, ``specs/slo-example.yaml`` a full example. What counts as good,
bad or skipped is :mod:`pipeline.core.slo`, which compiles an :class:`SLO` into
its per-record classifier.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Annotated, Final, Literal

from annotated_types import MinLen
from pydantic import AfterValidator, BeforeValidator, Field, model_validator

from pipeline.contract.boundaries import BOUNDARIES, CTX_BUCKETS
from pipeline.spec.durations import parse_duration_ms
from pipeline.spec.fields import Duration, check_name, one_or_many
from pipeline.spec.loader import SpecFormat, SpecIssue, SpecModel

KIND: Final = "SLOSpec"
DEFAULT_BLENDED: Final = "blended"


# --------------------------------------------------------------------------- #
# Field types
# --------------------------------------------------------------------------- #


def _check_name(v: str) -> str:
    return check_name(v, "tier1-gateway")


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


def _percent_hint(v: object) -> object:
    """A percentage with its sign (``99.9%``, a string in YAML) is refused with the fraction
    to write; anything else goes on to the number checks."""
    if isinstance(v, str) and v.strip().endswith("%"):
        try:
            percent = float(v.strip()[:-1])
        except ValueError:
            percent = None
        if percent is not None and 0 < percent < 100:
            raise ValueError(
                f"objective is a fraction, not a percentage: for {v.strip()} write "
                f"objective: {round(percent / 100, 12):g}"
            )
        raise ValueError(
            f"objective is a fraction strictly between 0 and 1 (0.99 = 99%), got {v!r}"
        )
    return v


Name = Annotated[str, AfterValidator(_check_name)]
Objective = Annotated[
    float,
    Field(allow_inf_nan=False),
    BeforeValidator(_percent_hint),
    AfterValidator(_check_objective),
]
NonEmptyStr = Annotated[str, MinLen(1)]
Priority = Annotated[int, Field(ge=0, le=3)]
CtxBucket = Annotated[str, AfterValidator(_check_bucket)]
StrList = Annotated[list[NonEmptyStr], BeforeValidator(one_or_many), MinLen(1)]
PriorityList = Annotated[list[Priority], BeforeValidator(one_or_many), MinLen(1)]
BucketList = Annotated[list[CtxBucket], BeforeValidator(one_or_many), MinLen(1)]


# --------------------------------------------------------------------------- #
# Spec models
# --------------------------------------------------------------------------- #


def calendar_start_issue(calendar: str, start: str) -> str | None:
    """Why ``start`` (``YYYY-MM-DD[ HH:MM:SS]``, UTC) cannot be the start of a ``calendar``
    period (a month: a 1st at 00:00; a week: a Monday at 00:00); None when it can."""
    try:
        day = dt.date.fromisoformat(start[:10])
    except ValueError:
        return f"not a date: {start!r}"
    if start[10:].strip() not in ("", "00:00:00", "T00:00:00", "T00:00:00Z"):
        return f"a {calendar} window starts at 00:00: {start!r}"
    if calendar == "month" and day.day != 1:
        return f"a month window must start on a 1st: {start!r}"
    if calendar == "week" and day.weekday() != 0:
        return f"a week window must start on a Monday: {start!r}"
    return None


class Window(SpecModel):
    """Either ``{rolling: 30d}`` or ``{calendar: month}`` (or ``week``; UTC, weeks start Monday).

    ``start`` (calendar only, optional): a period's start, ``YYYY-MM-DD[ 00:00:00]`` on a
    1st (month) or a Monday (week); OpenSLO's ``calendar.startTime``, kept for the round
    trip. Periods are every calendar month or week (UTC) whatever it says."""

    rolling: Duration | None = None
    calendar: Literal["month", "week"] | None = None
    start: str | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> Window:
        if (self.rolling is None) == (self.calendar is None):
            raise ValueError("give exactly one of rolling (e.g. 30d) or calendar (month or week)")
        if self.start is not None:
            if self.calendar is None:
                raise ValueError("start is for calendar windows only")
            issue = calendar_start_issue(self.calendar, self.start)
            if issue is not None:
                raise ValueError(issue)
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


class Filter(SpecModel):
    """Traffic an SLO covers; each key optional, a record must match every key given."""

    model: StrList | None = None
    priority: PriorityList | None = None
    ctx_bucket: BucketList | None = None
    tenant: StrList | None = None
    stream: bool | None = None


class Exclude(SpecModel):
    """Traffic taken out of an SLO (e.g. long prompts served asynchronously)."""

    prompt_tokens_over: Annotated[int, Field(ge=0)] | None = None


class SLO(SpecModel):
    """One latency SLO: ``objective`` of the selected requests have ``boundary <= threshold_ms``
    (``boundary < threshold_ms`` with ``threshold_strict: true``)."""

    name: Name
    description: str | None = None
    # Labels for people and OpenSLO (``metadata.displayName``, ``spec.service``); what
    # counts does not depend on them.
    display_name: NonEmptyStr | None = None
    service: NonEmptyStr | None = None
    boundary: Annotated[str, AfterValidator(_check_boundary)]
    threshold_ms: Annotated[float, Field(gt=0, allow_inf_nan=False)]
    # A strict threshold: good iff the value is < threshold_ms (OpenSLO ``op: lt``); a
    # value exactly at the threshold is then bad. Default: good iff <= (``op: lte``).
    threshold_strict: bool = False
    objective: Objective
    window: Window = Field(default_factory=lambda: Window(rolling="30d"))
    # Requests expected per window (per 30 d for rolling 30d, per month for calendar
    # month): until a whole window has been seen the error budget is
    # (1 - objective) x this (or x the requests seen, if more) instead of a projection of
    # the traffic rate seen (pipeline/core/budget.py, docs/budgets.md).
    expected_requests: Annotated[int, Field(gt=0)] | None = None
    filter: Filter | None = None
    exclude: Exclude | None = None
    errors: Literal["bad", "exclude"] = "bad"
    client_abort: Literal["measure", "exclude"] = "measure"
    # Client retries reusing a request id (attempts, see pipeline/core/join.py): count
    # every attempt, or only each request's last (a failed attempt the client retried
    # is skipped).
    attempts: Literal["every", "last"] = "every"


class BlendedTier(SpecModel):
    """Primary good -> 1, else secondary good -> ``secondary_weight``; per primary record."""

    description: str | None = None
    primary: NonEmptyStr  # must name an SLO of the spec (checked across entries)
    secondary: NonEmptyStr
    secondary_weight: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
    objective: Objective


class SLOSpec(SpecModel):
    """A versioned set of SLOs and blended tiers (``apiVersion: tailguard/v1``)."""

    api_version: Literal["tailguard/v1"] = Field(alias="apiVersion")
    kind: Literal["SLOSpec"]
    description: str | None = None
    slos: Annotated[list[SLO], MinLen(1)]
    tiers: dict[Name, BlendedTier] = Field(default_factory=dict)

    def cross_issues(self) -> list[SpecIssue]:
        tiers = {n: {"primary": t.primary, "secondary": t.secondary} for n, t in self.tiers.items()}
        return _cross_issues({"slos": [{"name": s.name} for s in self.slos], "tiers": tiers})

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


SPEC_KIND: Final = SpecFormat(
    KIND, SLOSpec, "a spec", "spec", "<spec>", _cross_issues, describe=lambda spec: spec.summary()
)
# Parse and validate a spec (text, or a file); raise SpecError listing every problem.
load_spec: Final = SPEC_KIND.load
load_spec_file: Final = SPEC_KIND.load_file
# For the CLI: (True, "ok: 7 SLOs, 1 blended tier (FILE)") or (False, every problem).
validate_file: Final = SPEC_KIND.validate
