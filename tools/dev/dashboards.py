"""Grafana dashboards for tailguard, generated here and committed under ``dashboards/json/``.

The panel SQL is built in Python from the query functions ``tailguard report`` reads
through (:mod:`pipeline.adapters.queries`: the latency rollups' quantiles and means, the
SLO counts, the budget events, the directives), each given the Grafana macros for its
time range and the dashboard's rollup for its interval; a panel only shapes their rows
(a test holds the panels and the report to the same numbers on one store). Writing the
quantile walk over the stored DDSketch buckets by hand in JSON would be unreadable and
drift.

    python -m tools.dev.dashboards           # (re)write dashboards/json/*.json
    python -m tools.dev.dashboards --check   # exit 1 if a committed file is stale

Panels read the rollups (``latency_1m``/``latency_1h``, ``slo_1m``/``slo_1h``) and
the control audit tables; only the two per-request panels (top slow requests,
per-tenant latency) read ``requests``, because no window is keyed by tenant or by
request. Queries use the official ClickHouse plugin's macros (``$__timeFilter``,
``$__fromTime``, ``$__toTime``, ``$__interval_s``, ``$__conditionalAll``) and
Grafana variables (``${model:singlequote}``); :mod:`tools.dev.grafana_sql`
expands them the way the plugin does, for the tests.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Final

from pipeline.adapters.queries.budget import COMPLIANCE_SQL, budget_events_sql, slo_counts_sql
from pipeline.adapters.queries.control import directives_sql
from pipeline.adapters.queries.windows import BINS_MERGE, latency_sql
from pipeline.adapters.sketch_sql import value_of_key_sql
from pipeline.core.record import BOUNDARIES

REPO: Final = Path(__file__).resolve().parents[2]
OUT_DIR: Final = REPO / "dashboards" / "json"

PLUGIN_ID: Final = "grafana-clickhouse-datasource"
DATASOURCE_UID: Final = "tailguard-clickhouse"  # dashboards/provisioning/datasources/
DS: Final = {"type": PLUGIN_ID, "uid": DATASOURCE_UID}
SCHEMA_VERSION: Final = 41
TAG: Final = "tailguard"

WITH_QUEUE: Final = ("gateway_total_ms", "gateway_ttfb_ms", "engine_e2e_ms", "ttft_engine_ms")
WITHOUT_QUEUE: Final = ("inference_ms", "prefill_ms", "decode_ms", "tpot_ms")
BREAKDOWN: Final = ("queue_ms", "prefill_ms", "decode_ms", "gateway_overhead_ms")
# every boundary but the gateway's overhead (a difference, often near 0)
HEATMAP_BOUNDARIES: Final = tuple(b for b in BOUNDARIES if b != "gateway_overhead_ms")
HEATMAP_BOUNDS_MS: Final = (
    10,
    25,
    50,
    100,
    200,
    300,
    400,
    500,
    750,
    1000,
    1500,
    2000,
    3000,
    5000,
    7500,
    10_000,
    15_000,
    20_000,
    30_000,
    60_000,
)
PRIORITIES: Final = ("0", "1", "2", "3", "unknown")
CTX_BUCKETS: Final = ("<512", "512-4k", "4k-8k", "8k-16k", ">16k")
BURN_WINDOWS: Final = (
    ("5m", 300),
    ("30m", 1800),
    ("1h", 3600),
    ("2h", 7200),
    ("6h", 21_600),
    ("1d", 86_400),
    ("3d", 259_200),
)
BUDGET_WINDOWS: Final = (("30d", 2_592_000), ("28d", 2_419_200), ("7d", 604_800), ("1d", 86_400))
# Burn-rate factors of specs/burn-rules.yaml (page 14.4x and 6x, ticket 3x and 1x).
BURN_FACTORS: Final = (1.0, 3.0, 6.0, 14.4)

# --- SQL pieces ----------------------------------------------------------------------

# From this interval on, panels read the hourly rollups, in buckets of at least an hour:
# the interval Grafana gives a panel over more than ~10 days (30 d: 30 min); over a month
# the minute rollups are 43,200 rows per key and boundary (issue 53: 2.4 s a panel).
HOURLY_FROM_S: Final = 1800
BUCKET: Final = (
    "toStartOfInterval(window_start, INTERVAL greatest($__interval_s, "
    f"if($__interval_s >= {HOURLY_FROM_S}, 3600, 60)) second)"
)


def rollup_source(table: str) -> str:
    """The minute rollup for intervals under :data:`HOURLY_FROM_S`, the hourly one from
    there (one is empty)."""
    return (
        f"(SELECT * FROM ${{db}}.{table}_1m "
        f"WHERE $__interval_s < {HOURLY_FROM_S} AND $__timeFilter(window_start) "
        f"UNION ALL SELECT * FROM ${{db}}.{table}_1h WHERE $__interval_s >= {HOURLY_FROM_S} "
        "AND window_start >= toStartOfHour($__fromTime) AND window_start <= $__toTime)"
    )


def _in(column: str, var: str) -> str:
    return f"$__conditionalAll({column} IN (${{{var}:singlequote}}), ${var})"


# The window keys: (model, priority, ctx_bucket) or the all-traffic key ('*', '*', '*');
# merging every non-'*' key equals the '*' key, so filters apply to keys alone, and with
# every key variable All a panel reads the '*' key's rows only (a range of the rollups'
# ordering key, not every key's sketches merged: issue 53).
_EVERY_KEY: Final = " AND ".join(
    f"$__conditionalAll(0, ${var})" for var in ("model", "priority", "ctx_bucket")
)
KEY_FILTER: Final = (
    f"(({_EVERY_KEY}) AND model = '*' AND priority = '*' AND ctx_bucket = '*' OR "
    f"NOT ({_EVERY_KEY}) AND model != '*' AND "
    + " AND ".join(
        [_in("model", "model"), _in("priority", "priority"), _in("ctx_bucket", "ctx_bucket")]
    )
    + ")"
)
# The variables' selection of the two panels reading ``requests`` (applied to the last
# version of each request in the range: LAST_VERSIONS).
REQUEST_SELECTION: Final = " AND ".join(
    [
        _in("model", "model"),
        _in("ifNull(toString(priority), 'unknown')", "priority"),
        _in("ctx_bucket", "ctx_bucket"),
        _in("tenant", "tenant"),
    ]
)


def _latency(boundaries: tuple[str, ...], quantiles: tuple[float, ...] = ()) -> str:
    """The report's latency read (:func:`~pipeline.adapters.queries.windows.latency_sql`)
    of the selected keys, per interval."""
    return latency_sql(
        rollup_source("latency"), KEY_FILTER, boundaries, bucket=BUCKET, quantiles=quantiles,
        merge=BINS_MERGE,
    )  # fmt: skip


def quantiles_sql(boundaries: tuple[str, ...]) -> str:
    """P50 and P99 per boundary and interval, one series per (boundary, quantile)."""
    return (
        "SELECT time, concat(boundary, ' ', q.1) AS series, q.2 AS latency_ms "
        f"FROM ({_latency(boundaries, (0.5, 0.99))}) "
        "ARRAY JOIN [('p50', p50), ('p99', p99)] AS q "
        "ORDER BY time, series"
    )


def breakdown_sql() -> str:
    return (
        "SELECT time, boundary AS component, sum_ms / n AS mean_ms "
        f"FROM ({_latency(BREAKDOWN)}) ORDER BY time, component"
    )


def ratio_sql() -> str:
    return (
        "SELECT time, sumIf(sum_ms, boundary = 'inference_ms') / "
        "nullIf(sumIf(sum_ms, boundary = 'gateway_total_ms'), 0) AS queue_compute_ratio "
        f"FROM ({_latency(('inference_ms', 'gateway_total_ms'))}) GROUP BY time ORDER BY time"
    )


def heatmap_sql() -> str:
    """Counts per latency range, from the merged sketch buckets (value of each bucket)."""
    cols = []
    lo: int | None = None
    for hi in HEATMAP_BOUNDS_MS:
        cond = f"v <= {hi}" if lo is None else f"v > {lo} AND v <= {hi}"
        cols.append(f'sumIf(c, {cond}) AS "{hi}"')
        lo = hi
    cols.append(f'sumIf(c, v > {lo}) AS "+Inf"')
    values = f"arrayMap(k -> {value_of_key_sql('k')}, m.1)"
    return (
        f"SELECT time, {', '.join(cols)} FROM ("
        f"SELECT {BUCKET} AS time, {BINS_MERGE}(pos) AS m, sum(zero_count) AS z "
        f"FROM {rollup_source('latency')} "
        f"WHERE boundary = '${{boundary}}' AND {KEY_FILTER} GROUP BY time) "
        f"ARRAY JOIN arrayConcat([0.], {values}) AS v, arrayConcat([z], m.2) AS c "
        "GROUP BY time ORDER BY time"
    )


# The two panels that read ``requests`` (one row per request, ordered by request id: a
# time range is pruned to whole day partitions, nothing finer) show the last
# REQUEST_PANEL_RANGE before now, whatever the dashboard's range (Grafana's "Relative
# time" query option, ``timeFrom``; the panel's header says "Last 1 hour"). Over the
# dashboard's 30 days they read every request of the month (51 M: seconds of both cores a
# refresh, issue 53); over the last hour, one day's partition at most.
REQUEST_PANEL_RANGE_S: Final = 3600
REQUEST_PANEL_RANGE: Final = f"{REQUEST_PANEL_RANGE_S // 3600}h"
# The tenants the $tenant variable lists (it filters those two panels only): those with a
# request started in the panels' range, the last REQUEST_PANEL_RANGE of the dashboard's
# (a dashboard's range ends now); over the whole range it read every request of a month.
TENANTS_SQL: Final = (
    "SELECT DISTINCT tenant FROM ${db}.requests WHERE "
    f"ts >= $__toTime - INTERVAL {REQUEST_PANEL_RANGE_S} SECOND AND ts <= $__toTime "
    "ORDER BY tenant"
)
# The columns those panels read (and the key and version their rows are merged by).
REQUEST_PANEL_COLUMNS: Final = (
    "request_id", "attempt", "revision", "ts", "model", "priority", "tenant", "ctx_bucket",
    "outcome", "source", "gateway_total_ms", "engine_e2e_ms", "queue_ms", "prefill_ms",
    "decode_ms", "inference_ms", "gateway_overhead_ms", "prompt_tokens", "output_tokens",
)  # fmt: skip
# Each request attempt's last version among its rows that started in the range (the
# highest store version, ``revision``, as ``FINAL`` keeps), the variables' selection
# applied after. ``FINAL`` would merge every row of the range's day partitions before the
# time filter (1.2-1.85 s against 0.14-0.74 s for an hour of the 2-day store, issue 53),
# and a setting that keeps it within each partition is refused by a read-only session
# (the query port, a read-only Grafana user). The same rows as ``FINAL`` over the range
# (tests/integration/test_dashboards_sql.py) except a request whose versions started on
# both sides of the range's edge (an engine-only record joined by a late gateway event
# starts at the gateway's clock): its version in the range is shown.
LAST_VERSIONS: Final = (
    f"(SELECT {', '.join(REQUEST_PANEL_COLUMNS)} FROM ${{db}}.requests "
    "WHERE $__timeFilter(ts) ORDER BY request_id, attempt, revision DESC "
    "LIMIT 1 BY request_id, attempt)"
)


def slow_requests_sql() -> str:
    return (
        "SELECT ts AS time, request_id, model, ifNull(toString(priority), 'unknown') AS priority, "
        "tenant, ctx_bucket, outcome, source, gateway_total_ms, engine_e2e_ms, queue_ms, "
        "prefill_ms, decode_ms, gateway_overhead_ms, queue_ms / gateway_total_ms AS queue_share, "
        "prompt_tokens, output_tokens "
        f"FROM {LAST_VERSIONS} WHERE {REQUEST_SELECTION} "
        "ORDER BY coalesce(gateway_total_ms, engine_e2e_ms) DESC LIMIT 50"
    )


def tenant_sql() -> str:
    return (
        "SELECT tenant, count() AS requests, "
        "quantileExact(0.5)(gateway_total_ms) AS p50_gateway_total_ms, "
        "quantileExact(0.99)(gateway_total_ms) AS p99_gateway_total_ms, "
        "quantileExact(0.99)(queue_ms) AS p99_queue_ms, "
        "quantileExact(0.99)(inference_ms) AS p99_inference_ms, "
        "countIf(outcome != 'ok') / count() AS not_ok_share "
        f"FROM {LAST_VERSIONS} WHERE {REQUEST_SELECTION} "
        "GROUP BY tenant ORDER BY p99_gateway_total_ms DESC"
    )


def _slo_counts(where: str = "1", bucket: str = BUCKET) -> str:
    """The report's SLO counts (:func:`~pipeline.adapters.queries.budget.slo_counts_sql`)
    per interval (a constant ``bucket``: over the range)."""
    return slo_counts_sql(rollup_source("slo"), where, bucket)


def compliance_over_time_sql() -> str:
    return (
        f"SELECT time, slo, {COMPLIANCE_SQL} AS compliance "
        f"FROM ({_slo_counts()}) ORDER BY time, slo"
    )


def compliance_table_sql() -> str:
    return (
        "SELECT slo, kind, d.boundary AS boundary, d.threshold_ms AS threshold_ms, "
        "objective, total, good, compliance, compliance >= objective AS met FROM ("
        f"SELECT slo, kind, objective, total, good, {COMPLIANCE_SQL} AS compliance "
        f"FROM ({_slo_counts(bucket='0')})) AS c "
        "LEFT JOIN (SELECT slo, any(boundary) AS boundary, any(threshold_ms) AS threshold_ms "
        "FROM ${db}.slo_windows WHERE $__timeFilter(window_start) GROUP BY slo) AS d "
        "ON c.slo = d.slo ORDER BY kind DESC, slo"
    )


def blended_sql() -> str:
    blended = _slo_counts("kind = 'blended'", bucket="0")
    return f"SELECT slo, {COMPLIANCE_SQL} AS compliance, objective FROM ({blended}) ORDER BY slo"


def _minutes(where: str, since: str) -> str:
    """Per-minute SLO counts from ``slo_1m`` after ``since`` up to the end of the range
    (the report's read: :func:`~pipeline.adapters.queries.budget.slo_counts_sql`)."""
    counts = slo_counts_sql(
        "${db}.slo_1m",
        f"kind = 'slo' AND {where}window_start > {since} AND window_start <= $__toTime",
    )
    return (
        "SELECT time AS t, slo, total AS n_total, total - good AS n_bad, "
        f"(1 - objective) * total AS n_allowed, objective AS obj FROM ({counts})"
    )


def _projected(allowed: str, observed_s: str) -> str:
    """The allowance of ``${budget_window}`` projected from ``observed_s`` seconds seen (the
    controller's, pipeline/core/budget.py: allowed x W / max(observed, min(1 h, W / 12)))."""
    w = "${budget_window}"
    return f"{allowed} * {w} / greatest(least({w}, {observed_s}), least(3600, intDiv({w}, 12)))"


def budget_remaining_sql() -> str:
    allowed = _projected(
        "sum(n_allowed) OVER w", "toUInt32(t) + 60 - min(toUInt32(t)) OVER (PARTITION BY slo)"
    )
    return (
        "SELECT toStartOfInterval(t, INTERVAL greatest($__interval_s, 60) second) AS time, slo, "
        "argMax(remaining, t) AS budget_remaining FROM ("
        f"SELECT t, slo, 1 - sum(n_bad) OVER w / nullIf({allowed}, 0) AS remaining "
        f"FROM ({_minutes('', '$__fromTime - ${budget_window}')}) "
        "WINDOW w AS (PARTITION BY slo ORDER BY toUInt32(t) "
        "RANGE BETWEEN ${budget_window} - 60 PRECEDING AND CURRENT ROW)) "
        "WHERE $__timeFilter(t) GROUP BY time, slo ORDER BY time, slo"
    )


def _burn(bad: str, total: str, objective: str) -> str:
    """The burn rate of ``bad`` of ``total`` requests: their share over the share the
    ``objective`` allows (1: the budget spent exactly as fast as the window allows)."""
    return f"{bad} / nullIf({total}, 0) / nullIf(1 - {objective}, 0)"


def burn_rate_sql() -> str:
    longest = BURN_WINDOWS[-1][1]
    rates = ", ".join(
        _burn(f"sum(n_bad) OVER w{name}", f"sum(n_total) OVER w{name}", "obj") + f" AS b{name}"
        for name, _ in BURN_WINDOWS
    )
    windows = ", ".join(
        f"w{name} AS (ORDER BY toUInt32(t) RANGE BETWEEN {seconds - 60} PRECEDING AND CURRENT ROW)"
        for name, seconds in BURN_WINDOWS
    )
    pairs = ", ".join(f"('{name}', b{name})" for name, _ in BURN_WINDOWS)
    minutes = _minutes("slo = '${slo}' AND ", f"$__fromTime - {longest}")
    return (
        "SELECT toStartOfInterval(t, INTERVAL greatest($__interval_s, 60) second) AS time, "
        "r.1 AS burn_window, argMax(r.2, t) AS burn_rate FROM ("
        f"SELECT t, {rates} FROM ({minutes}) "
        f"WINDOW {windows}) "
        f"ARRAY JOIN [{pairs}] AS r "
        "WHERE $__timeFilter(t) GROUP BY time, burn_window ORDER BY time, burn_window"
    )


def burn_table_sql() -> str:
    longest = BURN_WINDOWS[-1][1]
    rates = ", ".join(
        _burn(f"sumIf(n_bad, t > $__toTime - {s})", f"sumIf(n_total, t > $__toTime - {s})",
              "any(obj)") + f' AS "{name}"'
        for name, s in BURN_WINDOWS
    )  # fmt: skip
    since = f"$__toTime - greatest({longest}, ${{budget_window}})"
    return (
        f"SELECT slo, any(obj) AS objective, {rates}, "
        "1 - sumIf(n_bad, t > $__toTime - ${budget_window}) / nullIf("
        + _projected(
            "sumIf(n_allowed, t > $__toTime - ${budget_window})",
            "toUInt32($__toTime) - toUInt32(min(t))",
        )
        + ", 0) AS budget_remaining "
        f"FROM ({_minutes('', since)}) GROUP BY slo ORDER BY slo"
    )


def control_timeline_sql() -> str:
    return (
        "SELECT time, scope, level FROM ("
        "SELECT event_time AS time, scope, level "
        f"FROM ({directives_sql('${db}', '$__timeFilter(event_time)')}) "
        "UNION ALL SELECT toDateTime64($__fromTime, 3, 'UTC') AS time, scope, "
        "argMax(level, (event_time, seq)) AS level "
        f"FROM ({directives_sql('${db}', 'event_time < $__fromTime')}) GROUP BY scope) "
        "ORDER BY time, scope"
    )


def control_table_sql() -> str:
    return (
        "SELECT event_time AS time, scope, level, phase, reason, notify_customer, "
        "budget_exhausted, actions, figures "
        f"FROM ({directives_sql('${db}', '$__timeFilter(event_time)')}) "
        "ORDER BY time DESC, scope LIMIT 500"
    )


def events_table_sql() -> str:
    return (
        "SELECT event_time AS time, slo, event, "
        "JSONExtractFloat(details, 'consumed_fraction') AS consumed_fraction, details "
        f"FROM ({budget_events_sql('${db}', '$__timeFilter(event_time)')}) "
        "ORDER BY time DESC, slo LIMIT 500"
    )


# --- panels ----------------------------------------------------------------------------


def _target(sql: str, *, table: bool = False) -> dict[str, Any]:
    return {
        "datasource": DS,
        "editorType": "sql",
        "format": 1 if table else 0,  # sqlds: 0 time series, 1 table
        "queryType": "table" if table else "timeseries",
        "rawSql": sql,
        "refId": "A",
    }


def _thresholds(*steps: tuple[float | None, str]) -> dict[str, Any]:
    return {"mode": "absolute", "steps": [{"value": v, "color": c} for v, c in steps]}


_LEGEND: Final = {
    "displayMode": "table",
    "placement": "bottom",
    "showLegend": True,
    "calcs": ["mean", "max", "lastNotNull"],
}
_TOOLTIP: Final = {"mode": "multi", "sort": "desc"}


def timeseries(
    title: str,
    description: str,
    sql: str,
    grid: tuple[int, int, int, int],
    *,
    unit: str,
    custom: dict[str, Any] | None = None,
    thresholds: dict[str, Any] | None = None,
    interval: str | None = "1m",
    min_value: float | None = None,
) -> dict[str, Any]:
    defaults: dict[str, Any] = {
        "unit": unit,
        "custom": {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 0,
            "showPoints": "never",
            "spanNulls": False,
        }
        | (custom or {}),
    }
    if thresholds is not None:
        defaults["thresholds"] = thresholds
    if min_value is not None:
        defaults["min"] = min_value
    panel = _panel("timeseries", title, description, grid, [_target(sql)])
    panel["fieldConfig"] = {"defaults": defaults, "overrides": []}
    panel["options"] = {"legend": _LEGEND, "tooltip": _TOOLTIP}
    if interval is not None:
        panel["interval"] = interval
    return panel


def table(
    title: str,
    description: str,
    sql: str,
    grid: tuple[int, int, int, int],
    *,
    units: dict[str, str] | None = None,
    time_from: str | None = None,
) -> dict[str, Any]:
    panel = _panel("table", title, description, grid, [_target(sql, table=True)])
    if time_from is not None:  # the panel's own range: the last ``time_from`` before now
        panel["timeFrom"] = time_from
    panel["fieldConfig"] = {
        "defaults": {"custom": {"align": "auto", "filterable": True, "inspect": False}},
        "overrides": [
            {
                "matcher": {"id": "byName", "options": name},
                "properties": [{"id": "unit", "value": unit}],
            }
            for name, unit in (units or {}).items()
        ],
    }
    panel["options"] = {"showHeader": True, "frameIndex": 0, "cellHeight": "sm"}
    return panel


def _panel(
    kind: str,
    title: str,
    description: str,
    grid: tuple[int, int, int, int],
    targets: list[dict[str, Any]],
) -> dict[str, Any]:
    x, y, w, h = grid
    return {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DS,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "targets": targets,
    }


def _ms_units(*names: str) -> dict[str, str]:
    return dict.fromkeys(names, "ms")


def latency_panels() -> list[dict[str, Any]]:
    percent_area = {"fillOpacity": 70, "stacking": {"mode": "normal", "group": "A"}}
    heat = _panel(
        "heatmap",
        "Latency heatmap: ${boundary}",
        "Requests per latency range and interval for the boundary chosen in $boundary, "
        "from the merged DDSketch buckets of latency_1m / latency_1h (each bucket counted "
        "at its value, so a range edge is exact to the sketch's 1 %).",
        (0, 17, 24, 9),
        [_target(heatmap_sql())],
    )
    heat["interval"] = "1m"
    heat["options"] = {
        "calculate": False,
        "rowsFrame": {"layout": "le"},
        "color": {
            "mode": "scheme",
            "scheme": "Oranges",
            "scale": "exponential",
            "exponent": 0.5,
            "steps": 64,
            "fill": "dark",
            "reverse": False,
        },
        "cellGap": 1,
        "showValue": "never",
        "yAxis": {"axisPlacement": "left", "unit": "ms", "reverse": False},
        "legend": {"show": True},
        "tooltip": {"mode": "single", "yHistogram": True, "showColorScale": False},
        "exemplars": {"color": "rgba(255,0,255,0.7)"},
        "filterValues": {"le": 1e-9},
    }
    heat["fieldConfig"] = {
        "defaults": {
            "custom": {
                "hideFrom": {"legend": False, "tooltip": False, "viz": False},
                "scaleDistribution": {"type": "linear"},
            }
        },
        "overrides": [],
    }
    return [
        timeseries(
            "P50 / P99 including queue",
            "Boundaries that include the engine queue: gateway total, gateway time to first "
            "byte, engine end-to-end, engine TTFT (queue + prefill). Quantiles of the merged "
            "sketches of the selected keys (latency_1m, latency_1h above 1 h intervals).",
            quantiles_sql(WITH_QUEUE),
            (0, 0, 12, 9),
            unit="ms",
        ),
        timeseries(
            "P50 / P99 excluding queue",
            "Pure execution: inference (scheduled -> last token), prefill, decode, time per "
            "output token. Side by side with the panel on the left: the gap is queueing "
            "(and gateway/network time).",
            quantiles_sql(WITHOUT_QUEUE),
            (12, 0, 12, 9),
            unit="ms",
        ),
        timeseries(
            "Mean latency breakdown: queue / prefill / decode / gateway overhead",
            "Stacked means per interval (sum / count of each boundary). Each mean is over the "
            "requests that have the boundary (gateway overhead needs both sides), so the "
            "stack approximates the mean gateway total.",
            breakdown_sql(),
            (0, 9, 12, 8),
            unit="ms",
            custom=percent_area,
        ),
        timeseries(
            "Queue / compute ratio (inference / gateway total)",
            "Σ inference_ms / Σ gateway_total_ms per interval, each over the requests that "
            "have it. Below 0.3 (the red line) queueing, not compute, dominates latency.",
            ratio_sql(),
            (12, 9, 12, 8),
            unit="percentunit",
            min_value=0,
            custom={"thresholdsStyle": {"mode": "line"}},
            thresholds=_thresholds((None, "red"), (0.3, "green")),
        ),
        heat,
        table(
            "Top slow requests with their breakdown",
            f"The 50 slowest requests (gateway total, else engine end-to-end) of the last "
            f"{REQUEST_PANEL_RANGE} (this panel's own range, whatever the dashboard's: a "
            "read of requests over a month takes seconds), from requests (each request's "
            "last version), with every boundary and the share of the time spent queued. "
            "Honours all four variables, tenant included.",
            slow_requests_sql(),
            (0, 26, 24, 10),
            units=_ms_units(
                "gateway_total_ms",
                "engine_e2e_ms",
                "queue_ms",
                "prefill_ms",
                "decode_ms",
                "gateway_overhead_ms",
            )
            | {"queue_share": "percentunit"},
            time_from=REQUEST_PANEL_RANGE,
        ),
        table(
            "Latency per tenant (exact, from requests)",
            "Tenant is not a window key (tenants are unbounded; window keys are capped), so "
            f"this table reads requests (each request's last version) over the last "
            f"{REQUEST_PANEL_RANGE} (this panel's own range, whatever the dashboard's: a read "
            "of requests over a month takes seconds): exact quantiles (quantileExact), not "
            "sketches. The panels above read the rollups and ignore $tenant.",
            tenant_sql(),
            (0, 36, 24, 8),
            units=_ms_units(
                "p50_gateway_total_ms", "p99_gateway_total_ms", "p99_queue_ms", "p99_inference_ms"
            )
            | {"not_ok_share": "percentunit"},
            time_from=REQUEST_PANEL_RANGE,
        ),
    ]


def _blended_panel() -> dict[str, Any]:
    blended = _panel(
        "stat",
        "Blended compliance",
        "(good on primary + weight × good on secondary only) / total on primary, over the "
        "range (slo_1m / slo_1h, kind 'blended'), with the tier's objective.",
        (0, 0, 6, 8),
        [_target(blended_sql(), table=True)],
    )
    blended["fieldConfig"] = {
        "defaults": {
            "unit": "percentunit",
            "decimals": 3,
            "thresholds": _thresholds((None, "red"), (0.99, "green")),
        },
        "overrides": [],
    }
    blended["options"] = {
        "reduceOptions": {"values": True, "calcs": ["lastNotNull"], "fields": ""},
        "graphMode": "none",
        "colorMode": "value",
        "justifyMode": "auto",
        "textMode": "value_and_name",
        "wideLayout": True,
        "showPercentChange": False,
        "percentChangeColorMode": "standard",
        "orientation": "auto",
    }
    return blended


def _control_timeline_panel() -> dict[str, Any]:
    level_map = [
        {
            "type": "value",
            "options": {
                "0": {"text": "L0 normal", "color": "green", "index": 0},
                "1": {"text": "L1", "color": "yellow", "index": 1},
                "2": {"text": "L2", "color": "orange", "index": 2},
                "3": {"text": "L3", "color": "red", "index": 3},
            },
        }
    ]
    timeline = _panel(
        "state-timeline",
        "Control level per scope",
        "The level each scope (model) was held at, from control_signals (heartbeats "
        "left out), carried in from before the range. Reasons: the table below.",
        (0, 31, 24, 6),
        [_target(control_timeline_sql())],
    )
    timeline["fieldConfig"] = {
        "defaults": {
            "mappings": level_map,
            "min": 0,
            "max": 3,
            "thresholds": _thresholds((None, "green"), (1, "yellow"), (2, "orange"), (3, "red")),
            "color": {"mode": "thresholds"},
            "custom": {"fillOpacity": 80, "lineWidth": 0},
        },
        "overrides": [],
    }
    timeline["options"] = {
        "showValue": "auto",
        "rowHeight": 0.9,
        "mergeValues": True,
        "alignValue": "left",
        "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True, "calcs": []},
        "tooltip": {"mode": "single", "sort": "none"},
    }
    return timeline


def slo_panels() -> list[dict[str, Any]]:
    burn_steps = _thresholds(
        (None, "green"),
        (BURN_FACTORS[0], "yellow"),
        (BURN_FACTORS[1], "orange"),
        (BURN_FACTORS[2], "red"),
        (BURN_FACTORS[3], "dark-red"),
    )
    return [
        _blended_panel(),
        table(
            "Compliance per SLO and tier",
            "Over the range: total, good and compliance per SLO (kind 'slo') and per blended "
            "tier, against the objective in force; boundary and threshold from slo_windows.",
            compliance_table_sql(),
            (6, 0, 18, 8),
            units={"compliance": "percentunit", "objective": "percentunit", "threshold_ms": "ms"},
        ),
        timeseries(
            "Compliance per SLO over time",
            "good / total per interval for every SLO, and the blended figure of each tier.",
            compliance_over_time_sql(),
            (0, 8, 24, 8),
            unit="percentunit",
        ),
        timeseries(
            "Error budget remaining (rolling ${budget_window})",
            "1 − Σ bad / allowance over the rolling window chosen in $budget_window, at each "
            "minute (slo_1m); the allowance is Σ (1 − objective) × total, projected over the "
            "whole window while less of it has been stored (docs/budgets.md). Below 0: the "
            "budget is spent. An SLO "
            "with a calendar window is shown over the rolling window all the same; the "
            "controller's own figures are in budget_events.",
            budget_remaining_sql(),
            (0, 16, 12, 8),
            unit="percentunit",
            custom={"thresholdsStyle": {"mode": "line"}},
            thresholds=_thresholds((None, "red"), (0, "green")),
        ),
        timeseries(
            "Burn rate per window: ${slo}",
            "(bad / total) / (1 − objective) over 5 m … 3 d windows ending at each minute "
            "(slo_1m), for the SLO chosen in $slo. Lines: the burn-rule factors 1, 3, 6, 14.4.",
            burn_rate_sql(),
            (12, 16, 12, 8),
            unit="x",
            custom={"thresholdsStyle": {"mode": "line"}},
            thresholds=burn_steps,
        ),
        table(
            "Burn rates and budget at the end of the range",
            "Per SLO: burn rate over each window ending at the end of the dashboard range, "
            "and the budget remaining over $budget_window (allowance projected over the "
            "window while less of it has been stored, as the controller's: docs/budgets.md).",
            burn_table_sql(),
            (0, 24, 24, 7),
            units={"objective": "percentunit", "budget_remaining": "percentunit"}
            | {name: "x" for name, _ in BURN_WINDOWS},
        ),
        _control_timeline_panel(),
        table(
            "Control transitions with reasons",
            "Every level/phase change the controller issued (control_signals, heartbeats "
            "left out): reason, actions and the figures behind it.",
            control_table_sql(),
            (0, 37, 16, 9),
        ),
        table(
            "Budget events",
            "budget_80pct_consumed and budget_exhausted, once per SLO and budget period "
            "(budget_events).",
            events_table_sql(),
            (16, 37, 8, 9),
            units={"consumed_fraction": "percentunit"},
        ),
    ]


# --- variables and dashboards ---------------------------------------------------------


def _option(text: str, value: str, selected: bool = False) -> dict[str, Any]:
    return {"text": text, "value": value, "selected": selected}


def db_variable() -> dict[str, Any]:
    return {
        "type": "constant",
        "name": "db",
        "label": "database",
        "hide": 2,
        "query": "tailguard",
        "skipUrlSync": True,
        "current": _option("tailguard", "tailguard"),
        "options": [_option("tailguard", "tailguard", True)],
        "description": "ClickHouse database of tailguard's tables (TAILGUARD_DATABASE).",
    }


def query_variable(
    name: str, label: str, sql: str, *, multi: bool = True, refresh: int = 1
) -> dict[str, Any]:
    current = _option("All", "$__all") if multi else _option("", "")
    return {
        "type": "query",
        "name": name,
        "label": label,
        "datasource": DS,
        "definition": sql,
        "query": {"editorType": "sql", "rawSql": sql},
        "refresh": refresh,
        "sort": 1,
        "multi": multi,
        "includeAll": multi,
        "current": current,
        "options": [],
        "regex": "",
        "hide": 0,
    }


def custom_variable(
    name: str, label: str, options: tuple[tuple[str, str], ...], *, multi: bool
) -> dict[str, Any]:
    current = _option("All", "$__all") if multi else _option(*options[0])
    return {
        "type": "custom",
        "name": name,
        "label": label,
        "query": ",".join(t if t == v else f"{t} : {v}" for t, v in options),
        "multi": multi,
        "includeAll": multi,
        "current": current,
        "options": ([_option("All", "$__all", True)] if multi else [])
        + [_option(t, v, not multi and i == 0) for i, (t, v) in enumerate(options)],
        "hide": 0,
    }


def _links(other: str) -> list[dict[str, Any]]:
    return [
        {
            "title": other,
            "type": "dashboards",
            "tags": [TAG],
            "asDropdown": False,
            "icon": "external link",
            "tooltip": "",
            "targetBlank": False,
            "includeVars": False,
            "keepTime": True,
        }
    ]


def _dashboard(
    uid: str,
    title: str,
    *,
    description: str,
    panels: list[dict[str, Any]],
    variables: list[dict[str, Any]],
    other: str,
) -> dict[str, Any]:
    for i, p in enumerate(panels, start=1):
        p["id"] = i
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": [TAG],
        "timezone": "utc",
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "1m",
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "links": _links(other),
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "templating": {"list": variables},
        "panels": panels,
    }


def latency_dashboard() -> dict[str, Any]:
    return _dashboard(
        "tailguard-latency",
        "tailguard: latency per boundary",
        description="Per-boundary latency from the stream's sketches (latency_1m / "
        "latency_1h), the queue/prefill/decode/gateway breakdown, and the slowest requests.",
        panels=latency_panels(),
        variables=[
            db_variable(),
            query_variable(
                "model",
                "model",
                "SELECT DISTINCT model FROM ${db}.latency_1h WHERE model != '*' ORDER BY model",
            ),
            custom_variable("priority", "priority", tuple((p, p) for p in PRIORITIES), multi=True),
            custom_variable(
                "ctx_bucket", "context bucket", tuple((c, c) for c in CTX_BUCKETS), multi=True
            ),
            query_variable(
                "tenant",
                "tenant",
                TENANTS_SQL,
                refresh=2,
            ),
            custom_variable(
                "boundary",
                "heatmap boundary",
                tuple((b, b) for b in HEATMAP_BOUNDARIES),
                multi=False,
            ),
        ],
        other="tailguard: SLOs, budgets and control",
    )


def slo_dashboard() -> dict[str, Any]:
    return _dashboard(
        "tailguard-slo",
        "tailguard: SLOs, budgets and control",
        description="SLO compliance per SLO and blended tier (slo_1m / slo_1h), error budgets "
        "and burn rates per window, and the control levels with their reasons "
        "(control_signals).",
        panels=slo_panels(),
        variables=[
            db_variable(),
            query_variable(
                "slo",
                "SLO (burn rate)",
                "SELECT DISTINCT slo FROM ${db}.slo_1h WHERE kind = 'slo' ORDER BY slo",
                multi=False,
            ),
            custom_variable(
                "budget_window",
                "budget window",
                tuple((t, str(s)) for t, s in BUDGET_WINDOWS),
                multi=False,
            ),
        ],
        other="tailguard: latency per boundary",
    )


def dashboards() -> dict[str, dict[str, Any]]:
    """File name -> dashboard model."""
    return {
        "tailguard-latency.json": latency_dashboard(),
        "tailguard-slo.json": slo_dashboard(),
    }


def render(model: dict[str, Any]) -> str:
    return json.dumps(model, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a committed file differs")
    ap.add_argument("--out", type=Path, default=OUT_DIR)
    args = ap.parse_args(argv)
    stale = []
    for name, model in dashboards().items():
        path = args.out / name
        text = render(model)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print("stale (run python -m tools.dev.dashboards): " + ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
