"""``tailguard report --html FILE``: a self-contained HTML report with charts.

No network: the charts are inline SVG drawn here, the page has no external
resource. Four charts, each an ``<svg class="chart" data-chart=NAME>`` whose
marks (lines, bars, steps) carry ``class="mark"``:

* ``latency``: P99 per minute per boundary (``latency_1m``, all traffic,
  quantiles from the merged DDSketch buckets);
* ``breakdown``: mean queue / prefill / decode / gateway overhead per minute
  (``latency_1m`` sums and counts), stacked;
* ``budget``: error budget remaining per SLO (cumulative over the data, from
  ``slo_1m``: 1 − bad / allowed, allowed = Σ (1 − objective) × total) and the
  burn rate over the last 5 minutes ((bad / total) / (1 − objective));
  budget events as markers;
* ``control``: the control level per scope over event time (``control_signals``).

A small inline script records, once the page is laid out, how many marks of
each chart have a non-empty rendered box (``#render-check``): what the
headless-browser test reads back.
"""

from __future__ import annotations

import datetime as dt
import html
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.adapters.sketch_sql import quantile_from_merged_sql
from pipeline.adapters.store import Store
from pipeline.report import Report

LATENCY_BOUNDARIES = (
    "gateway_total_ms",
    "gateway_ttfb_ms",
    "engine_e2e_ms",
    "ttft_engine_ms",
    "queue_ms",
    "inference_ms",
)
SEGMENTS = ("queue_ms", "prefill_ms", "decode_ms", "gateway_overhead_ms")
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
BURN_WINDOW_MIN = 5

Series = list[tuple[float, float]]  # (unix seconds, value)


@dataclass(frozen=True, slots=True)
class HtmlData:
    latency_p99: dict[str, Series]
    breakdown: dict[str, Series]  # segment -> mean ms per minute
    budget_remaining: dict[str, Series]  # slo -> fraction
    burn_rate: dict[str, Series]  # slo -> burn over BURN_WINDOW_MIN
    budget_events: list[tuple[float, str, str]]  # (t, slo, event)
    control: dict[str, list[tuple[float, int, str, str]]]  # scope -> (t, level, phase, reason)


def _ts(v: Any) -> float:
    if isinstance(v, dt.datetime):
        return (v if v.tzinfo else v.replace(tzinfo=dt.UTC)).timestamp()
    return float(v)


def read_html_data(store: Store) -> HtmlData:
    db = store.database
    q99 = quantile_from_merged_sql(0.99, "sumMapMerge(pos)", "sumMapMerge(neg)", "sum(zero_count)")
    bset = ", ".join(f"'{b}'" for b in (*LATENCY_BOUNDARIES, *SEGMENTS))
    rows = store.query_rows(
        f"SELECT toUnixTimestamp(window_start), boundary, {q99}, sum(sum), sum(count) "
        f"FROM {db}.latency_1m WHERE model = '*' AND priority = '*' AND ctx_bucket = '*' "
        f"AND boundary IN ({bset}) GROUP BY window_start, boundary ORDER BY window_start"
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
    for t, slo, objective, total, good in store.query_rows(
        "SELECT toUnixTimestamp(window_start), slo, any(objective), sum(total), sum(good) "
        f"FROM {db}.slo_1m WHERE kind = 'slo' GROUP BY window_start, slo "
        "ORDER BY window_start, slo"
    ):
        bad, allowed = float(total) - float(good), (1.0 - float(objective)) * float(total)
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
        (_ts(t), str(slo), str(ev))
        for t, slo, ev in store.query_rows(
            f"SELECT event_time, slo, event FROM {db}.budget_events FINAL ORDER BY event_time"
        )
    ]
    control: dict[str, list[tuple[float, int, str, str]]] = defaultdict(list)
    for scope, t, level, phase, reason in store.query_rows(
        "SELECT scope, event_time, level, phase, reason FROM "
        f"{db}.control_signals FINAL WHERE NOT heartbeat ORDER BY event_time, seq"
    ):
        control[str(scope)].append((_ts(t), int(level), str(phase), str(reason)))
    return HtmlData(
        {b: latency[b] for b in LATENCY_BOUNDARIES if b in latency},
        {b: breakdown[b] for b in SEGMENTS if b in breakdown},
        dict(sorted(remaining.items())),
        dict(sorted(burn.items())),
        events,
        dict(sorted(control.items())),
    )


# --- SVG --------------------------------------------------------------------------

W, H = 860, 280
ML, MR, MT, MB = 64, 170, 16, 36


def _esc(s: object) -> str:
    return html.escape(str(s), quote=True)


def _fmt_time(t: float) -> str:
    return dt.datetime.fromtimestamp(t, tz=dt.UTC).strftime("%H:%M")


def _nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    step = 10 ** math.floor(math.log10((hi - lo) / n))
    for m in (1, 2, 5, 10):
        if (hi - lo) / (step * m) <= n:
            step *= m
            break
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 1)]


class _Frame:
    """Axes for time on x and a linear (or log10) y."""

    def __init__(self, t0: float, t1: float, y0: float, y1: float, log: bool = False) -> None:
        self.t0, self.t1 = t0, (t1 if t1 > t0 else t0 + 60)
        self.log = log
        if log:
            y0, y1 = math.log10(max(y0, 1e-3)), math.log10(max(y1, 1e-3))
        self.y0, self.y1 = y0, (y1 if y1 > y0 else y0 + 1)

    def x(self, t: float) -> float:
        return ML + (t - self.t0) / (self.t1 - self.t0) * (W - ML - MR)

    def y(self, v: float) -> float:
        if self.log:
            v = math.log10(max(v, 1e-3))
        return MT + (1 - (v - self.y0) / (self.y1 - self.y0)) * (H - MT - MB)

    def axes(self, unit: str) -> str:
        out = [
            f'<line x1="{ML}" y1="{H - MB}" x2="{W - MR}" y2="{H - MB}" stroke="#444"/>',
            f'<line x1="{ML}" y1="{MT}" x2="{ML}" y2="{H - MB}" stroke="#444"/>',
        ]
        for t in _nice_ticks(self.t0, self.t1, 6):
            x = self.x(t)
            out.append(
                f'<text x="{x:.1f}" y="{H - MB + 16}" font-size="11" '
                f'text-anchor="middle">{_fmt_time(t)}</text>'
            )
        if self.log:
            ticks = [10**e for e in range(math.floor(self.y0), math.ceil(self.y1) + 1)]
        else:
            ticks = _nice_ticks(self.y0, self.y1, 5)
        for v in ticks:
            y = self.y(v)
            if MT - 1 <= y <= H - MB + 1:
                out.append(
                    f'<line x1="{ML}" y1="{y:.1f}" x2="{W - MR}" y2="{y:.1f}" stroke="#eee"/>'
                    f'<text x="{ML - 6}" y="{y + 4:.1f}" font-size="11" '
                    f'text-anchor="end">{v:g}</text>'
                )
        out.append(
            f'<text x="14" y="{MT + (H - MT - MB) / 2}" font-size="11" text-anchor="middle" '
            f'transform="rotate(-90 14 {MT + (H - MT - MB) / 2})">{_esc(unit)}</text>'
        )
        return "".join(out)


def _legend(names: Sequence[str]) -> str:
    out = []
    for i, name in enumerate(names):
        y = MT + 8 + i * 16
        color = PALETTE[i % len(PALETTE)]
        out.append(
            f'<rect x="{W - MR + 12}" y="{y - 8}" width="10" height="10" fill="{color}"/>'
            f'<text x="{W - MR + 28}" y="{y + 1}" font-size="11">{_esc(name)}</text>'
        )
    return "".join(out)


def _svg(name: str, title: str, body: str) -> str:
    return (
        f"<figure><figcaption>{_esc(title)}</figcaption>"
        f'<svg class="chart" data-chart="{name}" xmlns="http://www.w3.org/2000/svg" '
        f'width="{W}" height="{H}" viewBox="0 0 {W} {H}" role="img">{body}</svg></figure>'
    )


def _empty(name: str, title: str, why: str) -> str:
    return _svg(
        name, title, f'<text x="{W / 2}" y="{H / 2}" text-anchor="middle">{_esc(why)}</text>'
    )


def _span(series: Sequence[Series]) -> tuple[float, float, float, float]:
    pts = [p for s in series for p in s]
    return (
        min(p[0] for p in pts),
        max(p[0] for p in pts),
        min(p[1] for p in pts),
        max(p[1] for p in pts),
    )


def line_chart(
    name: str, title: str, series: dict[str, Series], unit: str, *, log: bool = False,
    y_min: float | None = None, markers: Sequence[tuple[float, str]] = (),
) -> str:  # fmt: skip
    series = {k: v for k, v in series.items() if v}
    if not series:
        return _empty(name, title, "no data")
    t0, t1, lo, hi = _span(list(series.values()))
    f = _Frame(t0, t1, lo if y_min is None else min(y_min, lo), hi, log)
    body = [f.axes(unit)]
    for i, (label, pts) in enumerate(series.items()):
        d = " ".join(
            f"{'M' if j == 0 else 'L'}{f.x(t):.1f},{f.y(v):.1f}" for j, (t, v) in enumerate(pts)
        )
        if len(pts) == 1:  # one point: a visible tick instead of a zero-length path
            x, y = f.x(pts[0][0]), f.y(pts[0][1])
            d = f"M{x - 3:.1f},{y:.1f} L{x + 3:.1f},{y:.1f}"
        body.append(
            f'<path class="mark" d="{d}" fill="none" stroke="{PALETTE[i % len(PALETTE)]}" '
            f'stroke-width="1.6"><title>{_esc(label)}</title></path>'
        )
    for t, label in markers:
        x = f.x(t)
        body.append(
            f'<line class="marker" x1="{x:.1f}" y1="{MT}" x2="{x:.1f}" y2="{H - MB}" '
            f'stroke="#999" stroke-dasharray="3,3"><title>{_esc(label)}</title></line>'
        )
    body.append(_legend(list(series)))
    return _svg(name, title, "".join(body))


def stacked_bars(name: str, title: str, series: dict[str, Series], unit: str) -> str:
    series = {k: v for k, v in series.items() if v}
    if not series:
        return _empty(name, title, "no data")
    times = sorted({t for s in series.values() for t, _ in s})
    values = {k: dict(v) for k, v in series.items()}
    tops = [sum(max(0.0, values[k].get(t, 0.0)) for k in series) for t in times]
    f = _Frame(times[0], times[-1] + 60, 0.0, max(tops) * 1.05)
    bw = max(1.0, (f.x(times[0] + 60) - f.x(times[0])) * 0.8)
    body = [f.axes(unit)]
    for t in times:
        base = 0.0
        for i, k in enumerate(series):
            v = max(0.0, values[k].get(t, 0.0))
            if v <= 0:
                continue
            y_top, y_bot = f.y(base + v), f.y(base)
            body.append(
                f'<rect class="mark" x="{f.x(t):.1f}" y="{y_top:.1f}" width="{bw:.1f}" '
                f'height="{max(0.5, y_bot - y_top):.1f}" fill="{PALETTE[i % len(PALETTE)]}">'
                f"<title>{_esc(k)} {_fmt_time(t)}: {v:.1f} {unit}</title></rect>"
            )
            base += v
    body.append(_legend(list(series)))
    return _svg(name, title, "".join(body))


def step_chart(
    name: str, title: str, levels: dict[str, list[tuple[float, int, str, str]]],
    t_end: float | None,
) -> str:  # fmt: skip
    levels = {k: v for k, v in levels.items() if v}
    if not levels:
        return _empty(name, title, "no control directives")
    t0 = min(v[0][0] for v in levels.values())
    t1 = max([v[-1][0] for v in levels.values()] + [t_end or 0.0])
    t1 = t1 if t1 > t0 else t0 + 60
    f = _Frame(t0, t1, 0.0, 3.2)
    body = [f.axes("control level")]
    for i, (scope, pts) in enumerate(levels.items()):
        color = PALETTE[i % len(PALETTE)]
        d, prev = [], None
        for t, level, _phase, _reason in pts:
            x, y = f.x(t), f.y(level + 0.06 * i)  # a small offset keeps scopes apart
            d.append(f"M{x:.1f},{y:.1f}" if prev is None else f"H{x:.1f} V{y:.1f}")
            prev = y
        d.append(f"H{f.x(t1):.1f}")
        body.append(
            f'<path class="mark" d="{" ".join(d)}" fill="none" stroke="{color}" '
            f'stroke-width="2"><title>{_esc(scope)}</title></path>'
        )
        for t, level, phase, reason in pts:
            body.append(
                f'<circle class="mark" cx="{f.x(t):.1f}" cy="{f.y(level + 0.06 * i):.1f}" r="3" '
                f'fill="{color}"><title>{_esc(scope)} L{level} {_esc(phase)}: '
                f"{_esc(reason)}</title></circle>"
            )
    body.append(_legend(list(levels)))
    return _svg(name, title, "".join(body))


# --- page ---------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1100px}
h1{font-size:22px} h2{font-size:17px;margin-top:28px}
table{border-collapse:collapse;margin:8px 0;font-size:13px}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
td:first-child,th:first-child{text-align:left}
figure{margin:8px 0} figcaption{font-weight:600;font-size:14px;margin-bottom:4px}
.bad{color:#b00;font-weight:600} #render-check{font-size:11px;color:#888}
"""

_CHECK_JS = """
window.addEventListener('load', function () {
  var out = {};
  document.querySelectorAll('svg.chart').forEach(function (svg) {
    var drawn = 0;
    svg.querySelectorAll('.mark').forEach(function (m) {
      var r = m.getBoundingClientRect();
      if (r.width > 0 || r.height > 0) { drawn += 1; }
    });
    out[svg.getAttribute('data-chart')] = drawn;
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


def render_html(report: Report, data: HtmlData, *, title: str = "tailguard SLO report") -> str:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    boundaries = _table(
        ("boundary", "count", "P50 ms", "P99 ms"),
        [(k, b.count, ms(b.p50), ms(b.p99)) for k, b in report.boundaries.items()],
    )
    slos = _table(
        ("SLO", "objective", "total", "good", "compliance", "met"),
        [
            (
                name,
                f"{s['objective']:g}",
                s["total"],
                s["good"],
                "-" if s["compliance"] is None else f"{s['compliance']:.4f}",
                "-" if s["met"] is None else ("yes" if s["met"] else '<span class="bad">NO</span>'),
            )
            for name, s in report.slos.items()
        ],
    )
    t_end = max((p[0] for s in data.latency_p99.values() for p in s), default=None)
    charts = [
        line_chart(
            "latency", "P99 per minute by boundary (ms, log scale; all traffic)",
            data.latency_p99, "ms", log=True,
        ),
        stacked_bars(
            "breakdown", "Where the time goes: mean per minute (queue, prefill, decode, gateway)",
            data.breakdown, "ms",
        ),
        line_chart(
            "budget", "Error budget remaining (fraction, cumulative over the data)",
            data.budget_remaining, "budget remaining", y_min=0.0,
            markers=[(t, f"{slo}: {ev}") for t, slo, ev in data.budget_events],
        ),
        line_chart(
            "burn", f"Burn rate over {BURN_WINDOW_MIN} min (1 = spending the budget exactly)",
            data.burn_rate, "burn rate", y_min=0.0,
        ),
        step_chart("control", "Control level per scope (event time)", data.control, t_end),
    ]  # fmt: skip
    control_rows = [
        (d["event_time"], d["scope"], f"L{d['level']}", d["phase"], d["reason"])
        for d in report.control
    ]
    events_rows = [
        (dt.datetime.fromtimestamp(t, tz=dt.UTC).isoformat(timespec="seconds"), slo, ev)
        for t, slo, ev in data.budget_events
    ]
    generated = dt.datetime.now(tz=dt.UTC).isoformat(timespec="seconds")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{_esc(title)}</title>
<style>{_CSS}</style></head><body>
<h1>{_esc(title)}</h1>
<p>{report.requests} requests; by source {_esc(report.by_source)};
outcomes {_esc(report.by_outcome)}.
Generated {generated}.</p>
<h2>Latency per boundary</h2>{charts[0]}{boundaries}
<h2>Breakdown</h2>{charts[1]}
<h2>SLOs, error budget and burn rate</h2>{slos}{charts[2]}{charts[3]}
{_table(("time", "SLO", "event"), events_rows) if events_rows else ""}
<h2>Control</h2>{charts[4]}
{_table(("event time", "scope", "level", "phase", "reason"), control_rows) if control_rows else ""}
<pre id="render-check">not rendered</pre>
<script>{_CHECK_JS}</script>
</body></html>
"""
