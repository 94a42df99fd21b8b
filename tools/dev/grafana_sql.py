"""What Grafana sends to ClickHouse for a dashboard panel: template variables and macros
expanded the way Grafana and the official ClickHouse data source plugin
(``grafana-clickhouse-datasource``) expand them, so that tests can run every panel's SQL.

A panel query goes through three steps, in this order:

1. ``$__conditionalAll(condition, $var)`` (plugin frontend,
   ``src/data/CHDatasource.ts``: ``applyConditionalAll`` and ``getMacroArgs``):
   ``1=1`` when the variable's current value is ``''`` or All (``$__all``), else the
   condition; the last occurrence is replaced first.
2. Template variables (Grafana's ``TemplateSrv.replace`` with the plugin's ``format``
   function, ``CHDatasource.ts``: an array becomes ``'a','b'``, a single value is
   inserted raw). An explicit ``${var:format}`` uses Grafana's format registry
   (``public/app/features/templating/formatRegistry.ts``: ``singlequote`` escapes
   ``'`` as ``\\'``, ``sqlstring`` doubles it, ``csv``, ``raw``). All without a custom
   ``allValue`` means every option's value; a custom ``allValue`` is inserted as is.
3. Backend macros (plugin ``pkg/macros/macros.go``, over grafana/macropro):
   ``$__timeFilter(c)`` -> ``c >= toDateTime(from_s) AND c <= toDateTime(to_s)``,
   ``$__timeFilter_ms``, ``$__fromTime``/``$__toTime`` (``toDateTime(s)``),
   ``$__fromTime_ms``/``$__toTime_ms`` (``fromUnixTimestamp64Milli(ms)``),
   ``$__dateFilter``, ``$__timeInterval(c)``, ``$__timeInterval_ms(c)``,
   ``$__interval_s`` (whole seconds, at least 1); arguments are trimmed and macros
   nested in arguments are expanded first. Macros inside string literals are not
   expanded. A macro this module does not know raises :class:`UnknownMacroError`
   (the plugin would leave it in the SQL and ClickHouse would fail).

Mirrored from grafana/clickhouse-datasource at commit
1d04063a31fb30f9582cd0b3aeaacb7d350b0dcf (2026-08) and Grafana's template service.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Final

ALL_VALUE: Final = "$__all"

# Grafana's variable reference syntax: $var, [[var]] / [[var:fmt]], ${var} / ${var:fmt}
# (public/app/features/variables/utils.ts: variableRegex).
VARIABLE_RE: Final = re.compile(
    r"\$(\w+)|\[\[(\w+?)(?::(\w+))?\]\]|\$\{(\w+)(?:\.([^:^\}]+))?(?::([^\}]+))?\}"
)


class UnknownMacroError(ValueError):
    """A ``$__name`` the expansion does not know (it would reach ClickHouse verbatim)."""


@dataclass(frozen=True, slots=True)
class Variable:
    """A dashboard template variable with its current selection.

    ``current`` is a string, or a list of strings for a multi-value variable; ``All``
    is :data:`ALL_VALUE` (or ``[ALL_VALUE]``). ``options`` are every option's value
    (what All expands to when ``all_value`` is unset).
    """

    name: str
    current: str | Sequence[str]
    options: Sequence[str] = ()
    all_value: str | None = None


@dataclass(frozen=True, slots=True)
class QueryContext:
    """The panel's time range and interval, as the plugin's backend receives them."""

    from_ms: int
    to_ms: int
    interval_ms: int = 60_000
    variables: Mapping[str, Variable] = field(default_factory=dict)


def _is_all(value: str | Sequence[str]) -> bool:
    if isinstance(value, str):
        return value == ALL_VALUE
    return len(value) > 0 and value[0] == ALL_VALUE


# --- step 1: $__conditionalAll (frontend) ----------------------------------------

_CONDITIONAL_ALL: Final = "$__conditionalAll("
_VAR_IN_ARG_RE: Final = re.compile(r"(?<=\$\{)[\w\d]+(?=\})|(?<=\$)[\w\d]+")


def _macro_args(query: str, args_index: int) -> list[str]:
    """``getMacroArgs``: split at depth-1 commas from the ``(`` at ``args_index``."""
    args: list[str] = []
    depth = 0
    last_end = 1
    sub = query[args_index:]
    for m in re.finditer(r"\(|\)|,", sub):
        tok = m.group(0)
        if tok == "(":
            depth += 1
        elif tok == ")":
            depth -= 1
        if tok == "," and depth == 1:
            args.append(sub[last_end : m.end() - 1])
            last_end = m.end()
        if depth == 0:
            args.append(sub[last_end : m.end() - 1])
            return args
    return []


def apply_conditional_all(raw: str, variables: Mapping[str, Variable]) -> str:
    """Replace each ``$__conditionalAll(cond, $var)`` as ``applyConditionalAll`` does."""
    idx = raw.rfind(_CONDITIONAL_ALL)
    while idx != -1:
        params = _macro_args(raw, idx + len(_CONDITIONAL_ALL) - 1)
        if len(params) != 2:
            return raw
        phrase = params[0]
        m = _VAR_IN_ARG_RE.search(params[1].strip())
        if m is not None:
            var = variables.get(m.group(0))
            current = var.current if var is not None else None
            text = (
                current
                if isinstance(current, str) or current is None
                else ",".join(current)  # JS Array.toString()
            )
            if text in ("", ALL_VALUE):
                phrase = "1=1"
        raw = raw.replace(f"{_CONDITIONAL_ALL}{params[0]},{params[1]})", phrase, 1)
        idx = raw.rfind(_CONDITIONAL_ALL)
    return raw


# --- step 2: template variables (Grafana TemplateSrv + the plugin's format) --------


def _plugin_format(value: str | list[str]) -> str:
    """``CHDatasource.format``: arrays become ``'a','b'``; a single value is raw."""
    if isinstance(value, list):
        return "'" + "','".join(value) + "'"
    return value


def _singlequote(v: str) -> str:
    return "'" + v.replace("'", "\\'") + "'"


def _sqlstring(v: str) -> str:
    return "'" + v.replace("'", "''") + "'"


_FORMATS: Final[dict[str, Callable[[str | list[str]], str]]] = {
    "singlequote": lambda v: (
        ",".join(_singlequote(x) for x in v) if isinstance(v, list) else _singlequote(v)
    ),
    "sqlstring": lambda v: (
        ",".join(_sqlstring(x) for x in v) if isinstance(v, list) else _sqlstring(v)
    ),
    "csv": lambda v: ",".join(v) if isinstance(v, list) else v,
    "raw": lambda v: ",".join(v) if isinstance(v, list) else v,
}


def replace_variables(raw: str, variables: Mapping[str, Variable]) -> str:
    """Grafana's ``templateSrv.replace(raw, scopedVars, pluginFormat)``.

    References to names that are not variables (``$__timeFilter``, ``$__interval_s``)
    are left for the backend macros, as Grafana leaves them.
    """

    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(4)
        fmt = m.group(3) or m.group(6)
        var = variables.get(name)
        if var is None:
            return m.group(0)
        value: str | list[str] = var.current if isinstance(var.current, str) else list(var.current)
        if _is_all(value):
            if var.all_value is not None:
                # Grafana skips formatting of a custom all value (but for text/percentencode).
                return var.all_value
            value = list(var.options)
        if fmt is None:
            return _plugin_format(value)
        try:
            return _FORMATS[fmt](value)
        except KeyError:
            raise ValueError(f"variable format {fmt!r} is not mirrored here") from None

    return VARIABLE_RE.sub(sub, raw)


# --- step 3: backend macros (pkg/macros/macros.go) -----------------------------------


def _dt(ms: int) -> str:
    return f"toDateTime({ms // 1000})"


def _dt64(ms: int) -> str:
    return f"fromUnixTimestamp64Milli({ms})"


def _date(ms: int) -> str:
    return f"toDate('{datetime.fromtimestamp(ms / 1000, tz=UTC).date().isoformat()}')"


def _interval_s(ctx: QueryContext) -> int:
    return int(max(ctx.interval_ms / 1000, 1))


def _one(name: str, args: list[str]) -> str:
    if len(args) != 1:
        raise ValueError(f"$__{name} expected 1 argument(s), received {len(args)}")
    return args[0]


_MACROS: Final[dict[str, Callable[[QueryContext, list[str]], str]]] = {
    "timeFilter": lambda c, a: (
        f"{_one('timeFilter', a)} >= {_dt(c.from_ms)} AND {a[0]} <= {_dt(c.to_ms)}"
    ),
    "timeFilter_ms": lambda c, a: (
        f"{_one('timeFilter_ms', a)} >= {_dt64(c.from_ms)} AND {a[0]} <= {_dt64(c.to_ms)}"
    ),
    "dateFilter": lambda c, a: (
        f"{_one('dateFilter', a)} >= {_date(c.from_ms)} AND {a[0]} <= {_date(c.to_ms)}"
    ),
    "timeFrom": lambda c, a: f"{_one('timeFrom', a)} >= {_dt(c.from_ms)}",
    "timeTo": lambda c, a: f"{_one('timeTo', a)} <= {_dt(c.to_ms)}",
    "fromTime": lambda c, a: _dt(c.from_ms),
    "toTime": lambda c, a: _dt(c.to_ms),
    "fromTime_ms": lambda c, a: _dt64(c.from_ms),
    "toTime_ms": lambda c, a: _dt64(c.to_ms),
    "timeInterval": lambda c, a: (
        f"toStartOfInterval(toDateTime({_one('timeInterval', a)}), "
        f"INTERVAL {_interval_s(c)} second)"
    ),
    "timeInterval_ms": lambda c, a: (
        f"toStartOfInterval(toDateTime64({_one('timeInterval_ms', a)}, 3), "
        f"INTERVAL {int(max(c.interval_ms, 1))} millisecond)"
    ),
    "interval_s": lambda c, a: str(_interval_s(c)),
}
_MACRO_NAME_RE: Final = re.compile(r"\$__([A-Za-z0-9_]+)")


def _split_args(text: str, open_idx: int) -> tuple[list[str], int]:
    """Arguments of the call whose ``(`` is at ``open_idx``; returns (args, index after ``)``)."""
    depth = 0
    args: list[str] = []
    start = open_idx + 1
    i = open_idx
    quote: str | None = None
    while i < len(text):
        ch = text[i]
        if quote is not None:
            if ch == "\\":
                i += 2
                continue
            if ch == quote:
                quote = None
        elif ch in "'`":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                args.append(text[start:i])
                return [a.strip() for a in args if a.strip() or len(args) > 1], i + 1
        elif ch == "," and depth == 1:
            args.append(text[start:i])
            start = i + 1
        i += 1
    raise ValueError(f"unbalanced parentheses after position {open_idx}")


def expand_macros(raw: str, ctx: QueryContext) -> str:
    """Expand the backend macros (``Interpolate``), innermost arguments first."""
    out: list[str] = []
    i = 0
    quote: str | None = None
    while i < len(raw):
        ch = raw[i]
        if quote is not None:
            out.append(ch)
            if ch == "\\" and i + 1 < len(raw):
                out.append(raw[i + 1])
                i += 2
                continue
            if ch == quote:
                quote = None
            i += 1
            continue
        if ch in "'`":
            quote = ch
            out.append(ch)
            i += 1
            continue
        m = _MACRO_NAME_RE.match(raw, i)
        if m is None:
            out.append(ch)
            i += 1
            continue
        name = m.group(1)
        handler = _MACROS.get(name)
        if handler is None:
            raise UnknownMacroError(f"$__{name} is not a macro of the ClickHouse plugin here")
        end = m.end()
        args: list[str] = []
        if end < len(raw) and raw[end] == "(":
            args, end = _split_args(raw, end)
            args = [expand_macros(a, ctx) for a in args]
        out.append(handler(ctx, args))
        i = end
    return "".join(out)


# A panel's relative time override (``timeFrom``): a count and a unit, as Grafana's
# rangeutil.describeTextRange reads "1h", "30m", "7d"
_RELATIVE_RE: Final = re.compile(r"(\d+)([smhdw])")
_UNIT_MS: Final = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}


def panel_context(ctx: QueryContext, panel: Mapping[str, Any]) -> QueryContext:
    """The context a panel's queries get from a dashboard's ``ctx``: the same, or, for a
    panel with a relative time override (``timeFrom``, Grafana's "Relative time" query
    option), the last ``timeFrom`` before the dashboard range's end, whatever its start
    (Grafana: before now; a dashboard range here ends now). The interval is kept (the
    overriding panels are tables: no interval in their SQL)."""
    time_from = panel.get("timeFrom")
    if not time_from:
        return ctx
    m = _RELATIVE_RE.fullmatch(str(time_from))
    if m is None:
        raise ValueError(f"timeFrom {time_from!r}: not a count and a unit (s, m, h, d, w)")
    span_ms = int(m.group(1)) * _UNIT_MS[m.group(2)]
    return replace(ctx, from_ms=ctx.to_ms - span_ms)


def interpolate(raw: str, ctx: QueryContext) -> str:
    """The SQL the plugin sends to ClickHouse for a panel query ``raw``."""
    sql = apply_conditional_all(raw, ctx.variables)
    sql = replace_variables(sql, ctx.variables)
    return expand_macros(sql, ctx)
