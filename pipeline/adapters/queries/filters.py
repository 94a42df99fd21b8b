"""What a report looks at, as SQL conditions and bound parameters."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from pipeline.core.timefmt import iso_time
from pipeline.spec.slo import SLO


@dataclass(frozen=True, slots=True)
class ReportFilter:
    """What ``tailguard report`` looks at: request end times / window starts / event
    times in ``[since, until)`` (unix seconds), one model (its requests; SLOs recounted
    over them; its control scope), some SLOs (by name; with their definitions in
    ``selects``, the request tables keep the traffic they select and the control
    directives the scopes of their models)."""

    since_unix_s: float | None = None
    until_unix_s: float | None = None
    model: str | None = None
    slos: tuple[str, ...] = ()
    # the named SLOs' definitions (the spec's), for their traffic selection
    selects: tuple[SLO, ...] = field(default=(), compare=False)

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


def spans_sql(column: str, spans: Sequence[tuple[int | None, int | None]], unit: str) -> str:
    """SQL: ``column`` in any of the spans (``[from, until)`` in unix ns; None: unbounded),
    ``unit`` ``ns`` (unix nanoseconds) or ``ms`` (a DateTime64: whole milliseconds)."""
    if not spans:
        return "0"

    def value(t: int) -> str:
        return str(t) if unit == "ns" else f"fromUnixTimestamp64Milli({t // 1_000_000}, 'UTC')"

    ors = []
    for a, b in spans:
        conds = [f"{column} >= {value(a)}"] if a is not None else []
        conds += [f"{column} < {value(b)}"] if b is not None else []
        ors.append("(" + (" AND ".join(conds) or "1") + ")")
    return "(" + " OR ".join(ors) + ")"


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


def selection_sql(slos: Sequence[SLO], prefix: str = "sel") -> tuple[str, dict[str, Any]]:
    """The traffic the SLOs select (their ``filter``: models, priorities, context
    buckets, tenants, stream; the prompt exclusion; ``attempts: last``) as one SQL
    condition over ``requests`` (any of them), with its bound parameters."""
    if not slos:
        return "1", {}
    ors: list[str] = []
    p: dict[str, Any] = {}
    for i, slo in enumerate(slos):
        conds = ["1"]
        flt = slo.filter
        if flt is not None:
            for col, vals, typ in (
                ("model", flt.model, "String"),
                ("priority", flt.priority, "Int64"),
                ("ctx_bucket", flt.ctx_bucket, "String"),
                ("tenant", flt.tenant, "String"),
            ):
                if vals is not None:
                    name = f"{prefix}{i}_{col}"
                    conds.append(f"{col} IN {{{name}:Array({typ})}}")
                    p[name] = list(vals)
            if flt.stream is not None:
                conds.append("stream" if flt.stream else "NOT stream")
        if slo.exclude is not None and slo.exclude.prompt_tokens_over is not None:
            conds.append(
                f"(prompt_tokens IS NULL OR prompt_tokens <= {int(slo.exclude.prompt_tokens_over)})"
            )
        if slo.attempts == "last":
            conds.append("NOT superseded")
        ors.append("(" + " AND ".join(conds) + ")")
    return "(" + " OR ".join(ors) + ")", p


# pipeline.core.slo's source sets (rule 2: which sources observed a boundary's layer)
_OBSERVED_SQL: Final = {
    "gateway_total_ms": "('joined', 'gateway_only')",
    "gateway_ttfb_ms": "('joined', 'gateway_only')",
    "gateway_overhead_ms": "('joined')",
}
_ENGINE_OBSERVED_SQL: Final = "('joined', 'engine_only')"
# rule 4's lower bound: a missing value at KEY means "waited at least VALUE"
_LOWER_BOUND_SQL: Final = {"gateway_ttfb_ms": "gateway_total_ms"}


def verdict_sql(slo: SLO, prefix: str) -> tuple[str, str, dict[str, Any]]:
    """:meth:`pipeline.core.slo.SLOMatcher.classify` as SQL over a ``requests`` row:
    ``(counted, good)`` conditions (counted = not ``skip``; bad = counted and not good)
    and their bound parameters. The rules are the core's (its docstring, rules 1-4);
    ``tests/integration/test_verdict_sql.py`` holds the two equal record by record, as
    ``classify_many`` is held to ``classify``. Each condition is 0 or 1, never NULL."""
    selected, bound = selection_sql([slo], prefix=prefix)
    b = slo.boundary
    threshold = repr(float(slo.threshold_ms))
    good_cmp, late_cmp = ("<", ">=") if slo.threshold_strict else ("<=", ">")
    measured = "outcome = 'ok'"
    if slo.client_abort == "measure":
        measured = "outcome IN ('ok', 'client_abort')"
    late = f"{b} {late_cmp} {threshold}"
    lower = _LOWER_BOUND_SQL.get(b)
    if lower is not None:
        late = f"({late} OR ({b} IS NULL AND {lower} > {threshold}))"
    counted = f"({measured} AND ifNull({b} {good_cmp} {threshold} OR {late}, 0))"
    if slo.errors == "bad":
        observed = _OBSERVED_SQL.get(b, _ENGINE_OBSERVED_SQL)
        counted = f"({counted} OR (outcome NOT IN ('ok', 'client_abort') AND source IN {observed}))"
    sel = f"ifNull({selected}, 0)"
    return (
        f"({sel} AND {counted})",
        f"({sel} AND {measured} AND ifNull({b} {good_cmp} {threshold}, 0))",
        bound,
    )


def scope_models(f: ReportFilter) -> list[str] | None:
    """The models whose control scopes the filter keeps (None: every scope): its model,
    and of those the named SLOs select (an SLO without a model filter selects any)."""
    selected: set[str] | None = None  # None: any model
    if f.selects:
        selected = set()
        for slo in f.selects:
            models = slo.filter.model if slo.filter is not None else None
            if models is None:
                selected = None
                break
            selected |= set(models)
    if f.model is None:
        return None if selected is None else sorted(selected)
    return [f.model] if selected is None or f.model in selected else []
