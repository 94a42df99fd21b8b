"""What a report looks at, as SQL conditions and bound parameters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.core.timefmt import iso_time


@dataclass(frozen=True, slots=True)
class ReportFilter:
    """What ``tailguard report`` looks at: request end times / window starts in
    ``[since, until)`` (unix seconds), one model (requests and latency; SLO windows are
    per SLO, whose scope names its models), some SLOs (by name)."""

    since_unix_s: float | None = None
    until_unix_s: float | None = None
    model: str | None = None
    slos: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "since": iso(self.since_unix_s),
            "until": iso(self.until_unix_s),
            "model": self.model,
            "slos": list(self.slos),
        }


def iso(t: float | None) -> str | None:
    if t is None:
        return None
    return iso_time(t, timespec="seconds")


def time_where(
    column: str, f: ReportFilter, *, unit: str = "s", model_column: str | None = None
) -> str:
    """SQL conditions for the filter on ``column`` (``unit``: ``s`` a DateTime, ``ns``
    unix nanoseconds)."""
    conds = ["1"]
    for bound, op in ((f.since_unix_s, ">="), (f.until_unix_s, "<")):
        if bound is None:
            continue
        value = f"{int(bound * 1e9)}" if unit == "ns" else f"toDateTime64({bound!r}, 3, 'UTC')"
        conds.append(f"{column} {op} {value}")
    if f.model is not None and model_column is not None:
        conds.append(f"{model_column} = {{model:String}}")
    return " AND ".join(conds)


def slo_where(f: ReportFilter, column: str = "window_start") -> str:
    """The filter's time range on ``column`` and its SLOs."""
    cond = time_where(column, f)
    if f.slos:
        cond += " AND slo IN {slos:Array(String)}"
    return cond


def params(f: ReportFilter) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if f.model is not None:
        out["model"] = f.model
    if f.slos:
        out["slos"] = list(f.slos)
    return out
