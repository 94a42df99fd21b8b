"""``tailguard report --html FILE``: a self-contained HTML report with charts.

No network: the charts are inline SVG drawn by matplotlib (time on x as UTC
clock time with ticks on whole minutes, a line broken where minutes have no
data, log axes floored at the smallest value drawn), the page has no external
resource. Five charts, each a ``<figure class="chart" data-chart=NAME>`` whose
marks (lines, bars, steps, points) are SVG groups with ids ``mark-...``:

* ``latency``: P99 per minute per boundary (``latency_1m``, all traffic,
  quantiles from the merged DDSketch buckets; per hour from ``latency_1h`` over ranges
  of ~3 weeks and more: :func:`series_bucket_s`);
* ``breakdown``: mean queue / prefill / decode / gateway overhead per minute (or hour)
  (``latency_1m`` sums and counts), stacked;
* ``budget``: error budget remaining per SLO (cumulative over the data, from
  ``slo_1m``: 1 − bad / allowed, allowed = Σ (1 − objective) × total) and the
  burn rate over the last 5 minutes ((bad / total) / (1 − objective));
  budget events as markers;
* ``control``: the control level per scope over event time (``control_signals``).

A small inline script records, once the page is laid out, how many marks of
each chart have a non-empty rendered box (``#render-check``, hidden): what the
headless-browser test reads back.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import html
import io
import math
import re
from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from pipeline.adapters.queries import budget, control, requests, windows
from pipeline.adapters.queries.filters import ReportFilter
from pipeline.adapters.store import Store
from pipeline.app.figures import figure, percent
from pipeline.app.report import (
    Report,
    slo_events,
    slo_minute_rows,
    verdict_cells,
    with_selection,
)
from pipeline.core.budget import period_at, scope_expected_requests, window_budget
from pipeline.core.timefmt import iso_time
from pipeline.spec.slo import SLOSpec

LATENCY_BOUNDARIES = (
    "gateway_total_ms",
    "gateway_ttfb_ms",
    "engine_e2e_ms",
    "ttft_engine_ms",
    "queue_ms",
    "inference_ms",
)
SEGMENTS = ("queue_ms", "prefill_ms", "decode_ms", "gateway_overhead_ms")
BURN_WINDOW_MIN = 5

Series = list[tuple[float, float]]  # (unix seconds, value)
_ms = partial(figure, spec=".1f")
_burn = partial(figure, spec=".2f", unit="x")


@dataclass(frozen=True, slots=True)
class HtmlData:
    latency_p99: dict[str, Series]
    breakdown: dict[str, Series]  # segment -> mean ms per minute
    budget_remaining: dict[str, Series]  # slo -> fraction
    burn_rate: dict[str, Series]  # slo -> burn over BURN_WINDOW_MIN
    budget_events: list[tuple[float, str, str]]  # (t, slo, event)
    control: dict[str, list[tuple[float, int, str, str]]]  # scope -> (t, level, phase, reason)
    bucket_s: int = 60  # every series' bucket (series_bucket_s): 60, or 3600 over long ranges


def _ts(v: Any) -> float:
    if isinstance(v, dt.datetime):
        return (v if v.tzinfo else v.replace(tzinfo=dt.UTC)).timestamp()
    return float(v)


def _slo_series(
    store: Store, f: ReportFilter, spec: SLOSpec | None, bucket_s: int = 60
) -> list[Any]:
    """``(start s, slo, objective, total, good)`` per minute (``bucket_s`` 3600: per hour)
    and SLO (kind ``slo``); with a model, recounted over its requests
    (:func:`pipeline.app.report.slo_minute_rows`), its minutes added up per bucket."""
    if f.model is None or spec is None:
        return budget.minute_slo_series(store, f, hourly=bucket_s == 3600)
    acc: dict[tuple[int, str], list[Any]] = {}
    for slo, kind, t, obj, _w, total, good, _s in slo_minute_rows(store, f, spec):
        if kind == "slo":
            a = acc.setdefault((int(t) // bucket_s * bucket_s, str(slo)), [obj, 0, 0])
            a[1] += int(total)
            a[2] += int(good)
    return [(t, slo, obj, total, good) for (t, slo), (obj, total, good) in sorted(acc.items())]


def _window_remaining(
    store: Store, f: ReportFilter, spec: SLOSpec, shown: list[Any], bucket_s: int = 60
) -> dict[str, Series]:
    """Per SLO and minute (bucket) shown, the budget left of the SLO's own window at the
    end of that minute (as the SLO table: :func:`pipeline.core.budget.window_budget`,
    projected until a whole window is seen; per hour, the window's counts of whole hours
    and its first hour's start); the counts from the window's start, before the range
    too."""
    if not shown:
        return {}
    bucket_ms = bucket_s * 1000
    first_s = min(float(r[0]) for r in shown)
    last_s = max(float(r[0]) for r in shown)
    slos = {x.name: x for x in spec.slos}
    starts = [period_at(x.window, int(first_s * 1000) + bucket_ms)[0] for x in slos.values()]
    wide = dataclasses.replace(
        f, since_unix_s=min(starts) / 1000, until_unix_s=last_s + bucket_s
    )  # the counts of every window the minutes shown fall in
    per: dict[str, list[tuple[int, float, float]]] = defaultdict(list)
    for t, slo, _obj, total, good in _slo_series(store, wide, spec, bucket_s):
        per[str(slo)].append((int(float(t)) * 1000, float(total), float(total) - float(good)))
    out: dict[str, Series] = {}
    for name, minutes in per.items():
        slo = slos.get(name)
        if slo is None:
            continue
        points: Series = []
        held: deque[tuple[int, float, float]] = deque()
        total = bad = 0.0
        for t_ms, n, b in minutes:
            held.append((t_ms, n, b))
            total, bad = total + n, bad + b
            if t_ms < first_s * 1000:  # before the range: counted, not shown (a window's
                continue  # start only moves on, so what it leaves is dropped at the next)
            now_ms = t_ms + bucket_ms
            start_ms = period_at(slo.window, now_ms)[0]
            while held and held[0][0] < start_ms:
                _, n0, b0 = held.popleft()
                total, bad = total - n0, bad - b0
            if not held:
                continue
            left, _ = window_budget(
                slo.objective, slo.window, total=round(total), bad=bad, first_ms=held[0][0],
                now_ms=now_ms,
                expected_requests=scope_expected_requests(slo.expected_requests, f.model or "*"),
            )  # fmt: skip
            if left is not None:
                points.append((t_ms / 1000, left))
        out[name] = points
    return out


# From a chart interval of this many seconds on (the range over ~1,000 points), the
# latency series are per hour, from the hourly rollup: the dashboards' rule for a panel
# ~1,000 pixels wide (tools/dev/dashboards.py HOURLY_FROM_S; over 30 days, 43,200 minutes
# of sketch states per boundary took minutes, issue 53). Traffic selected by ``--slo`` is
# read from requests, per minute.
HOURLY_FROM_S = 1800
CHART_POINTS = 1000


def series_bucket_s(store: Store, f: ReportFilter) -> int:
    """The series' bucket: 3600 when the filter's range (the store's hours where open) is
    over :data:`CHART_POINTS` x :data:`HOURLY_FROM_S`, else 60. Per hour, each SLO's burn
    rate is over the hour (not :data:`BURN_WINDOW_MIN`) and its budget left at each
    hour's end."""
    if f.selects:
        return 60
    lo, hi = f.since_unix_s, f.until_unix_s
    if lo is None or hi is None:
        extent = windows.extent_s(store)
        if extent is None:
            return 60
        lo = extent[0] if lo is None else lo
        hi = extent[1] + 3600 if hi is None else hi
    return 3600 if (hi - lo) / CHART_POINTS >= HOURLY_FROM_S else 60


def read_html_data(
    store: Store, f: ReportFilter | None = None, spec: SLOSpec | None = None
) -> HtmlData:
    """The charts' series under the filter; with the SLO ``spec`` a model filter also
    narrows the SLO series and budget events, and SLOs their traffic and scopes (as
    :func:`pipeline.app.report.read_report`)."""
    f = with_selection(f or ReportFilter(), spec)
    bucket_s = series_bucket_s(store, f)
    if f.selects:
        rows = requests.minute_p99_and_means(store, f, (*LATENCY_BOUNDARIES, *SEGMENTS))
    else:
        rows = windows.minute_p99_and_means(
            store,
            f,
            LATENCY_BOUNDARIES,
            means_only=tuple(b for b in SEGMENTS if b not in LATENCY_BOUNDARIES),
            hourly=bucket_s == 3600,
        )
    latency: dict[str, Series] = defaultdict(list)
    breakdown: dict[str, Series] = defaultdict(list)
    for t, b, p99, total, n in rows:
        if b in LATENCY_BOUNDARIES and p99 is not None:
            latency[b].append((float(t), float(p99)))
        if b in SEGMENTS and n:
            breakdown[b].append((float(t), float(total) / float(n)))
    remaining: dict[str, Series] = defaultdict(list)
    burn: dict[str, Series] = defaultdict(list)
    recent: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    cum: dict[str, tuple[float, float]] = defaultdict(lambda: (0.0, 0.0))
    series = _slo_series(store, f, spec, bucket_s)
    if spec is not None:
        remaining.update(_window_remaining(store, f, spec, series, bucket_s))
    for t, slo, objective, total, good in series:
        bad, allowed = float(total) - float(good), (1.0 - float(objective)) * float(total)
        if spec is None:  # no windows known: cumulative over the data shown
            cb, ca = cum[slo]
            cum[slo] = (cb + bad, ca + allowed)
            cb, ca = cum[slo]
            if ca > 0:
                remaining[slo].append((float(t), 1.0 - cb / ca))
        win = recent[slo]
        win.append((float(t), bad, float(total)))
        while win and win[0][0] <= float(t) - BURN_WINDOW_MIN * 60:
            win.pop(0)
        wt = sum(x[2] for x in win)
        if wt > 0 and objective < 1:
            burn[slo].append((float(t), sum(x[1] for x in win) / wt / (1.0 - float(objective))))
    events = [
        (_ts(t), str(slo), str(ev)) for t, slo, ev in slo_events(store, f, spec, "event_time")
    ]
    directives: dict[str, list[tuple[float, int, str, str]]] = defaultdict(list)
    for scope, t, level, phase, reason in control.directive_timeline(store, f):
        directives[str(scope)].append((_ts(t), int(level), str(phase), str(reason)))
    return HtmlData(
        {b: latency[b] for b in LATENCY_BOUNDARIES if b in latency},
        {b: breakdown[b] for b in SEGMENTS if b in breakdown},
        dict(sorted(remaining.items())),
        dict(sorted(burn.items())),
        events,
        dict(sorted(directives.items())),
        bucket_s,
    )


def series_json(data: HtmlData | None) -> dict[str, Any]:
    """The charts' data for ``report --json`` (times as ISO 8601 UTC)."""
    if data is None:
        return {}

    def pts(series: dict[str, Series]) -> dict[str, list[list[Any]]]:
        return {k: [[_iso(t), v] for t, v in s] for k, s in series.items()}

    return {
        # per minute, or per hour over long ranges (series_bucket_s)
        "bucket_s": data.bucket_s,
        "latency_p99_ms_per_minute": pts(data.latency_p99),
        "breakdown_mean_ms_per_minute": pts(data.breakdown),
        "budget_remaining_per_minute": pts(data.budget_remaining),
        f"burn_rate_{BURN_WINDOW_MIN}m_per_minute": pts(data.burn_rate),
        "control_timeline": {
            scope: [
                {"event_time": _iso(t), "level": level, "phase": phase, "reason": reason}
                for t, level, phase, reason in steps
            ]
            for scope, steps in data.control.items()
        },
    }


def _iso(t: float) -> str:
    return iso_time(t, timespec="seconds")


# --- charts (matplotlib, SVG) ------------------------------------------------------

MINUTE_S = 60.0
FIG_W_IN, FIG_H_IN = 9.6, 3.1


def _esc(s: object) -> str:
    return html.escape(str(s), quote=True)


def _dates(ts: Sequence[float]) -> Any:
    """Unix seconds as matplotlib's date numbers (days; the axis shows them in UTC)."""
    import matplotlib.dates as mdates

    return mdates.date2num([dt.datetime.fromtimestamp(t, tz=dt.UTC) for t in ts])  # type: ignore[no-untyped-call]


def with_gaps(points: Series, step_s: float = MINUTE_S) -> tuple[list[float], list[float]]:
    """Times and values with a NaN wherever more than one step has no data, so a line
    breaks across the gap instead of joining its ends."""
    ts: list[float] = []
    vs: list[float] = []
    for t, v in points:
        if ts and t - ts[-1] > step_s * 1.5:
            ts.append(ts[-1] + step_s)
            vs.append(math.nan)
        ts.append(t)
        vs.append(v)
    return ts, vs


def log_floor(values: Sequence[float]) -> float | None:
    """The bottom of a log axis: the decade at or below the smallest positive value
    (a zero is not drawn on a log axis; it never stretches the axis down)."""
    positive = [v for v in values if v > 0 and not math.isnan(v)]
    if not positive:
        return None
    return float(10 ** math.floor(math.log10(min(positive))))


class _Chart:
    """One matplotlib figure; ``svg()`` returns it as inline SVG with marks tagged."""

    def __init__(self, name: str, ylabel: str) -> None:
        from matplotlib.figure import Figure

        self.name = name
        self.fig = Figure(figsize=(FIG_W_IN, FIG_H_IN), dpi=100, layout="constrained")
        self.ax = self.fig.add_subplot()
        self.ax.set_ylabel(ylabel)
        self.ax.grid(True, which="major", color="#e5e5e5", linewidth=0.8)
        self.ax.set_axisbelow(True)
        self.marks = 0

    def mark(self, artist: Any) -> None:
        artist.set_gid(f"mark-{self.name}-{self.marks}")
        self.marks += 1

    def time_axis(self) -> None:
        import matplotlib.dates as mdates

        locator = mdates.AutoDateLocator(tz=dt.UTC, minticks=4, maxticks=10)  # type: ignore[no-untyped-call]
        self.ax.xaxis.set_major_locator(locator)
        fmt = mdates.ConciseDateFormatter(locator, tz=dt.UTC)  # type: ignore[no-untyped-call]
        self.ax.xaxis.set_major_formatter(fmt)
        self.ax.set_xlabel("event time (UTC)")

    def legend(self) -> None:
        if self.ax.get_legend_handles_labels()[0]:
            self.ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)

    def svg(self) -> str:
        buf = io.StringIO()
        self.fig.savefig(buf, format="svg", metadata={"Date": None})
        text = buf.getvalue()
        text = text[text.index("<svg") :]  # drop the XML prolog and doctype
        return re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)


def _figure(name: str, title: str, svg: str) -> str:
    return (
        f'<figure class="chart" data-chart="{name}"><figcaption>{_esc(title)}</figcaption>'
        f"{svg}</figure>"
    )


def _empty(name: str, title: str, why: str) -> str:
    return (
        f'<figure class="chart" data-chart="{name}"><figcaption>{_esc(title)}</figcaption>'
        f'<p class="empty">{_esc(why)}</p></figure>'
    )


def _rc() -> Any:
    import matplotlib

    return matplotlib.rc_context(
        {"svg.fonttype": "none", "font.size": 9, "axes.titlesize": 10, "svg.hashsalt": None}
    )


def line_chart(
    name: str, title: str, series: dict[str, Series], ylabel: str, *, log: bool = False,
    y_min: float | None = None, markers: Sequence[tuple[float, str]] = (),
    hline: tuple[float, str] | None = None,
) -> str:  # fmt: skip
    series = {k: v for k, v in series.items() if v}
    if not series:
        return _empty(name, title, "no data")
    with _rc():
        c = _Chart(name, ylabel)
        values: list[float] = []
        for label, pts in series.items():
            drawn = [(t, v) for t, v in pts if not (log and v <= 0)]
            ts, vs = with_gaps(drawn)
            values += [v for v in vs if not math.isnan(v)]
            (line,) = c.ax.plot(
                _dates(ts), vs, label=label, linewidth=1.5, marker="o" if len(drawn) == 1 else None
            )
            c.mark(line)
        if log:
            c.ax.set_yscale("log")
            floor = log_floor(values)
            if floor is not None:
                c.ax.set_ylim(bottom=floor)
        elif y_min is not None:
            c.ax.set_ylim(bottom=min(y_min, *values) if values else y_min)
        if hline is not None:
            c.ax.axhline(hline[0], color="#999", linestyle="--", linewidth=1, label=hline[1])
        for i, (t, label) in enumerate(markers):
            vl = c.ax.axvline(
                _dates([t])[0], color="#c44", linestyle=":", linewidth=1,
                label="budget events" if i == 0 else None,
            )  # fmt: skip
            vl.set_gid(f"marker-{name}-{i}-{label}"[:120])
        c.time_axis()
        c.legend()
        return _figure(name, title, c.svg())


def stacked_bars(name: str, title: str, series: dict[str, Series], ylabel: str) -> str:
    series = {k: v for k, v in series.items() if v}
    if not series:
        return _empty(name, title, "no data")
    times = sorted({t for s in series.values() for t, _ in s})
    values = {k: dict(v) for k, v in series.items()}
    with _rc():
        c = _Chart(name, ylabel)
        base = [0.0] * len(times)
        width = (MINUTE_S * 0.8) / 86400.0  # matplotlib dates are days
        for label in series:
            heights = [max(0.0, values[label].get(t, 0.0)) for t in times]
            bars = c.ax.bar(
                _dates([t + MINUTE_S / 2 for t in times]), heights, width=width, bottom=base,
                label=label, align="center",
            )  # fmt: skip
            for patch in bars:
                c.mark(patch)
            base = [b + h for b, h in zip(base, heights, strict=True)]
        c.ax.set_ylim(bottom=0)
        c.time_axis()
        c.legend()
        return _figure(name, title, c.svg())


def step_chart(
    name: str, title: str, levels: dict[str, list[tuple[float, int, str, str]]],
    t_end: float | None,
) -> str:  # fmt: skip
    levels = {k: v for k, v in levels.items() if v}
    if not levels:
        return _empty(name, title, "no control directives")
    t1 = max([v[-1][0] for v in levels.values()] + [t_end or 0.0])
    with _rc():
        c = _Chart(name, "control level")
        for i, (scope, pts) in enumerate(levels.items()):
            ts = [p[0] for p in pts] + [t1]
            ys = [p[1] + 0.04 * i for p in pts]  # a small offset keeps scopes apart
            ys.append(ys[-1])
            (line,) = c.ax.plot(_dates(ts), ys, drawstyle="steps-post", linewidth=2, label=scope)
            c.mark(line)
            pts_line = c.ax.scatter(
                _dates([p[0] for p in pts]), ys[:-1], s=14, color=line.get_color(), zorder=3
            )
            c.mark(pts_line)
        c.ax.set_yticks([0, 1, 2, 3], ["L0", "L1", "L2", "L3"])
        c.ax.set_ylim(-0.3, 3.4)
        c.time_axis()
        c.legend()
        return _figure(name, title, c.svg())


# --- page ---------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1100px}
h1{font-size:22px} h2{font-size:17px;margin-top:28px}
table{border-collapse:collapse;margin:8px 0;font-size:13px}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right;white-space:nowrap}
td:first-child,th:first-child{text-align:left}
figure{margin:8px 0} figcaption{font-weight:600;font-size:14px;margin-bottom:4px}
figure svg{max-width:100%;height:auto} .empty{color:#888}
.bad{color:#b00;font-weight:600} .note{color:#8a6d00}
"""

_CHECK_JS = """
window.addEventListener('load', function () {
  var out = {};
  document.querySelectorAll('figure.chart').forEach(function (fig) {
    var drawn = 0;
    fig.querySelectorAll('[id^="mark-"]').forEach(function (m) {
      var r = m.getBoundingClientRect();
      if (r.width > 0 || r.height > 0) { drawn += 1; }
    });
    out[fig.getAttribute('data-chart')] = drawn;
  });
  document.getElementById('render-check').textContent = JSON.stringify(out);
});
"""


def _table(head: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    h = "".join(f"<th>{_esc(c)}</th>" for c in head)
    body = "".join(
        "<tr>"
        + "".join(f"<td>{c if str(c).startswith('<') else _esc(c)}</td>" for c in r)
        + "</tr>"
        for r in rows
    )
    return f"<table><tr>{h}</tr>{body}</table>"


def _counts(d: dict[str, int]) -> str:
    return ", ".join(f"{_esc(k)} {v:,}" for k, v in d.items()) or "none"


def _logical_html(report: Report) -> str:
    """Per attempt beside per logical request (what users saw), or nothing."""
    if not report.logical:
        return ""
    from pipeline.app.report import logical_cells

    return "<h3>What users saw: per logical request (a request and its retries once)</h3>" + (
        _table(("", "per attempt", "per logical request"), logical_cells(report))
    )


def _verdicts_html(report: Report) -> str:
    """The gateways' enforcement per model and priority, or nothing when no request
    carried a control mode."""
    if not report.control_verdicts:
        return ""
    head = ("model", "priority", "modes", "requests", "served", "refused (enforce)",
            "would have refused (shadow)")  # fmt: skip
    return "<h3>Gateway control: refused and would-have-refused requests, by reason</h3>" + (
        _table(head, [verdict_cells(v) for v in report.control_verdicts])
    )


def render_html(
    report: Report, data: HtmlData | None, *, title: str = "tailguard SLO report"
) -> str:
    from pipeline.app.report import (
        QUANTILE_BASIS,
        describe_filter,
        open_windows_hint,
        windows_short_hint,
    )

    data = data or HtmlData({}, {}, {}, {}, [], {})
    boundaries = _table(
        ("boundary", "count", "P50 ms", "P99 ms"),
        [(k, b.count, _ms(b.p50), _ms(b.p99)) for k, b in report.boundaries.items()],
    )
    slos = _table(
        ("SLO", "objective", "total", "good", "compliance", "met", "budget left", "burn 5m",
         "burn 1h"),
        [
            (
                name,
                f"{s['objective']:g}",
                s["total"],
                s["good"],
                "-" if s["compliance"] is None else f"{s['compliance']:.4f}",
                "-" if s["met"] is None else ("yes" if s["met"] else '<span class="bad">NO</span>'),
                percent(s.get("budget_remaining")),
                _burn(s.get("burn_rate", {}).get("5m")),
                _burn(s.get("burn_rate", {}).get("1h")),
            )
            for name, s in report.slos.items()
        ],
    )  # fmt: skip
    t_end = max((p[0] for s in data.latency_p99.values() for p in s), default=None)
    per = "hour" if data.bucket_s == 3600 else "minute"
    charts = [
        line_chart(
            "latency", f"P99 per {per} by boundary (ms, log scale; all traffic)",
            data.latency_p99, "P99 (ms, log)", log=True,
        ),
        stacked_bars(
            "breakdown", f"Where the time goes: mean per {per} (queue, prefill, decode, gateway)",
            data.breakdown, "mean (ms)",
        ),
        line_chart(
            "budget",
            "Error budget remaining (fraction of each SLO window's budget, projected until a "
            "whole window is seen)",
            data.budget_remaining, "budget remaining", y_min=0.0,
            markers=[(t, f"{slo}: {ev}") for t, slo, ev in data.budget_events],
        ),
        line_chart(
            "burn", f"Burn rate over {'1 h' if per == 'hour' else f'{BURN_WINDOW_MIN} min'} "
            "(1 = spending the budget exactly)",
            data.burn_rate, "burn rate", y_min=0.0, hline=(1.0, "burn = 1"),
        ),
        step_chart("control", "Control level per scope (event time)", data.control, t_end),
    ]  # fmt: skip
    control_rows = [
        (d["event_time"], d["scope"], f"L{d['level']}", d["phase"], d["reason"])
        for d in report.control
    ]
    events_rows = [(_iso(t), slo, ev) for t, slo, ev in data.budget_events]
    hint = open_windows_hint(report)
    scope = describe_filter(report.filters)
    generated = dt.datetime.now(tz=dt.UTC).isoformat(timespec="seconds")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{_esc(title)}</title>
<style>{_CSS}</style></head><body>
<h1>{_esc(title)}</h1>
<p>{report.requests:,} requests. By source: {_counts(report.by_source)}.
Outcomes: {_counts(report.by_outcome)}. Generated {generated}.</p>
{f"<p>Showing {_esc(scope)}.</p>" if scope else ""}
{f'<p class="note">{_esc(hint)}</p>' if hint else ""}
{f'<p class="note">{_esc(short)}</p>' if (short := windows_short_hint(report)) else ""}
<h2>Latency per boundary</h2>{charts[0]}{boundaries}
<p class="note">P50 / P99: {_esc(QUANTILE_BASIS)}</p>
<h2>Breakdown</h2>{charts[1]}
<h2>SLOs, error budget and burn rate</h2>{slos}{charts[2]}{charts[3]}
{_table(("time", "SLO", "event"), events_rows) if events_rows else ""}
<h2>Control</h2>{charts[4]}
{_table(("event time", "scope", "level", "phase", "reason"), control_rows) if control_rows else ""}
{_logical_html(report)}
{_verdicts_html(report)}
<pre id="render-check" hidden>not rendered</pre>
<script>{_CHECK_JS}</script>
</body></html>
"""
