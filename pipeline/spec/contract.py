"""Contracts (``apiVersion: tailguard/v1``, ``kind: Contract``): what a provider owes a tenant.

The file format, its validation and loading (the contract and the SLO spec it
binds, with the digests of both files). A contract binds SLOs of an SLO spec
(by name) to tenants, over a billing period, and says what follows from the
measurements: which daily percentile above target is a *breach* (and above which
ceiling a *severe* one), how many breaches a period allows, the fee change at each
control level, what is exempted (cold starts up to N per day, declared maintenance
windows) and what an exhausted error budget triggers. ``specs/contract-example.yaml``
is the source documents' contract; ``pipeline/core/statement.py`` computes a tenant's
statement from it; ``specs/README.md`` documents the format.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
import zoneinfo
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Final, Literal

from annotated_types import MinLen
from pydantic import AfterValidator, Field

from pipeline.spec.durations import parse_duration_ms
from pipeline.spec.loader import (
    SpecError,
    SpecIssue,
    SpecModel,
    load_document,
    parse_yaml_mapping,
    read_bytes,
    validation_report,
)
from pipeline.spec.registry import SpecKind
from pipeline.spec.slo import SLOSpec, load_spec, load_spec_file

KIND: Final = "Contract"
_PERIOD_RE: Final = re.compile(r"^(\d{4})-(0[1-9]|1[0-2])$")


def _check_tz(v: str) -> str:
    try:
        zoneinfo.ZoneInfo(v)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"unknown time zone {v!r} (an IANA name, e.g. Europe/Berlin or UTC)"
        ) from None
    return v


def _check_duration_or_period(v: str) -> str:
    if v != "period":
        parse_duration_ms(v)
    return v


def _check_aware(v: dt.datetime) -> dt.datetime:
    if v.tzinfo is None:
        raise ValueError("give a time zone offset, e.g. 2026-11-14T02:00:00+01:00")
    return v


NonEmptyStr = Annotated[str, MinLen(1)]
# ISO 8601 with an offset; YAML gives a datetime, a quoted one is a string
AwareTime = Annotated[dt.datetime, Field(strict=False), AfterValidator(_check_aware)]


class Billing(SpecModel):
    """A calendar month in a time zone (the only period for now)."""

    period: Literal["month"] = "month"
    timezone: Annotated[str, AfterValidator(_check_tz)] = "UTC"


class BreachRule(SpecModel):
    """A day whose ``percentile`` of an SLO's boundary is above the SLO's threshold is a
    breach; above ``severe_above`` x threshold a severe one; a period allows
    ``max_breaches`` breaches and no severe one."""

    percentile: Annotated[float, Field(gt=0, lt=100, allow_inf_nan=False)] = 99.0
    per: Literal["day"] = "day"
    severe_above: Annotated[float, Field(ge=1, allow_inf_nan=False)] = 1.2
    max_breaches: Annotated[int, Field(ge=0)] = 3


class LevelTerms(SpecModel):
    """The fee change while the service runs at a control level (negative: a discount)."""

    level: Annotated[int, Field(ge=1, le=3)]
    fee_change_percent: Annotated[float, Field(ge=-100, le=0, allow_inf_nan=False)]
    notify_customer: bool = True


class ColdStarts(SpecModel):
    """Requests served during an engine's cold start are exempted, for at most
    ``max_per_day`` cold starts per day (the first ones of that day)."""

    max_per_day: Annotated[int, Field(ge=0)]


class Maintenance(SpecModel):
    """A declared maintenance window: requests ending in [start, end) are exempted."""

    start: AwareTime
    end: AwareTime
    reason: NonEmptyStr


class Exemptions(SpecModel):
    cold_starts: ColdStarts | None = None
    maintenance: list[Maintenance] = Field(default_factory=list)


class BudgetExhausted(SpecModel):
    """What an exhausted error budget of a bound SLO triggers."""

    pause_billing: bool = True
    # how long billing pauses: a duration (24h) or "period" (until the period ends)
    pause_for: Annotated[str, AfterValidator(_check_duration_or_period)] = "period"
    incident_report: bool = True
    worst_requests: Annotated[int, Field(ge=0, le=100)] = 5
    lookback: Annotated[str, AfterValidator(_check_duration_or_period)] = "1h"


class Contract(SpecModel):
    api_version: Literal["tailguard/v1"] = Field(alias="apiVersion")
    kind: Literal["Contract"]
    description: str | None = None
    tenants: Annotated[list[NonEmptyStr], MinLen(1)]
    slo_spec: NonEmptyStr  # path, relative to the contract file
    slos: Annotated[list[NonEmptyStr], MinLen(1)]  # names in that spec
    # control scopes (models) whose levels count; None = every scope
    models: Annotated[list[NonEmptyStr], MinLen(1)] | None = None
    billing: Billing = Field(default_factory=Billing)
    breach: BreachRule = Field(default_factory=BreachRule)
    levels: list[LevelTerms] = Field(default_factory=list)
    exemptions: Exemptions = Field(default_factory=Exemptions)
    budget_exhausted: BudgetExhausted = Field(default_factory=BudgetExhausted)

    def level_terms(self, level: int) -> LevelTerms | None:
        for t in self.levels:
            if t.level == level:
                return t
        return None

    def summary(self) -> str:
        n = len(self.tenants)
        return (
            f"{n} tenant{'' if n == 1 else 's'}, {len(self.slos)} SLOs, "
            f"{len(self.levels)} fee levels, billing month in {self.billing.timezone}"
        )


def _cross_issues(data: object, spec: SLOSpec | None) -> list[SpecIssue]:
    issues: list[SpecIssue] = []
    if not isinstance(data, dict):
        return issues
    for key in ("tenants", "slos"):
        items = data.get(key)
        if isinstance(items, list):
            seen: dict[object, int] = {}
            for i, item in enumerate(items):
                if isinstance(item, str) and item in seen:
                    issues.append(SpecIssue(f"{key}[{i}]", f"duplicate {item!r}"))
                seen.setdefault(item, i)
    slos = data.get("slos")
    if spec is not None and isinstance(slos, list):
        known = [s.name for s in spec.slos]
        for i, name in enumerate(slos):
            if isinstance(name, str) and name not in known:
                issues.append(
                    SpecIssue(
                        f"slos[{i}]",
                        f"unknown SLO {name!r} in the SLO spec; defined: {', '.join(known)}",
                    )
                )
    levels = data.get("levels")
    if isinstance(levels, list):
        seen_l: dict[object, int] = {}
        for i, item in enumerate(levels):
            lvl = item.get("level") if isinstance(item, dict) else None
            if isinstance(lvl, int) and lvl in seen_l:
                issues.append(SpecIssue(f"levels[{i}].level", f"level {lvl} given twice"))
            seen_l.setdefault(lvl, i)
    windows = (data.get("exemptions") or {}) if isinstance(data.get("exemptions"), dict) else {}
    maint = windows.get("maintenance")
    if isinstance(maint, list):
        for i, w in enumerate(maint):
            if not isinstance(w, dict):
                continue
            s, e = w.get("start"), w.get("end")
            if (
                isinstance(s, dt.datetime)
                and isinstance(e, dt.datetime)
                and s.tzinfo is not None
                and e.tzinfo is not None
                and e <= s
            ):
                issues.append(SpecIssue(f"exemptions.maintenance[{i}].end", "must be after start"))
    return issues


def load_contract(text: str, source: str = "<contract>", spec: SLOSpec | None = None) -> Contract:
    """Parse and validate a contract (against ``spec`` when given: the bound SLO names);
    raises :class:`SpecError` listing every problem with its field path and line."""
    return load_document(
        Contract, text, source, "a contract", lambda data: _cross_issues(data, spec)
    )


def digest(data: bytes) -> str:
    """The digest a statement names its inputs by: ``sha256:<hex>``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True, slots=True)
class LoadedContract:
    """A contract with the SLO spec it binds, and the digests of both files."""

    contract: Contract
    spec: SLOSpec
    path: Path
    spec_path: Path
    contract_digest: str
    spec_digest: str
    # the files' text, as a statement records it (``verify`` recomputes with it)
    contract_text: str
    spec_text: str


def load_recorded(
    contract_text: str,
    spec_text: str,
    *,
    contract_file: str = "<recorded contract>",
    spec_file: str = "<recorded SLO spec>",
) -> LoadedContract:
    """A contract and its SLO spec from their recorded text (what a statement holds);
    every problem is a :class:`SpecError`."""
    spec = load_spec(spec_text, spec_file)
    contract = load_contract(contract_text, contract_file, spec)
    return LoadedContract(
        contract,
        spec,
        Path(contract_file),
        Path(spec_file),
        digest(contract_text.encode("utf-8")),
        digest(spec_text.encode("utf-8")),
        contract_text,
        spec_text,
    )


def load_contract_file(path: str | Path, spec_path: str | Path | None = None) -> LoadedContract:
    """A contract file and its SLO spec (``slo_spec`` relative to the contract, unless
    ``spec_path`` overrides it); every problem is a :class:`SpecError`."""
    path = Path(path)
    raw = read_bytes(path, "contract")
    text = raw.decode("utf-8")
    data, _node = parse_yaml_mapping(text, str(path), "a contract")
    named = data.get("slo_spec")
    if spec_path is None and not (isinstance(named, str) and named):
        load_contract(text, str(path))  # reports slo_spec (and any other problem)
        raise SpecError(str(path), [SpecIssue("slo_spec", "missing")])  # pragma: no cover
    sp = Path(spec_path) if spec_path is not None else path.parent / str(named)
    spec = load_spec_file(sp)
    contract = load_contract(text, str(path), spec)
    spec_raw = read_bytes(sp, "spec")
    return LoadedContract(
        contract, spec, path, sp, digest(raw), digest(spec_raw), text, spec_raw.decode("utf-8")
    )


def validate_contract_file(path: str | Path) -> tuple[bool, str]:
    """For ``tailguard validate``: ``(True, "ok: ...")`` or ``(False, every problem)``."""
    return validation_report(
        path, load_contract_file, lambda loaded: f"contract, {loaded.contract.summary()}"
    )


def period_bounds_ns(period: str, timezone: str) -> tuple[int, int]:
    """``2026-11`` in a time zone -> [start, end) in Unix ns (DST-aware)."""
    m = _PERIOD_RE.match(period)
    if not m:
        raise ValueError(f"period must look like YYYY-MM (e.g. 2026-11), got {period!r}")
    year, month = int(m.group(1)), int(m.group(2))
    tz = zoneinfo.ZoneInfo(timezone)
    start = dt.datetime(year, month, 1, tzinfo=tz)
    end = dt.datetime(year + (month == 12), month % 12 + 1, 1, tzinfo=tz)
    return _ns(start), _ns(end)


def _ns(t: dt.datetime) -> int:
    return int(t.timestamp()) * 1_000_000_000 + t.microsecond * 1000


SPEC_KIND: Final = SpecKind(KIND, validate_contract_file)
