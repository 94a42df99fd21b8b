"""Every dashboard panel's SQL, expanded the way the ClickHouse plugin expands it, runs
against a store filled by ``tailguard replay`` (with a control policy, so the control
audit tables have rows) and returns rows with the expected columns; key figures equal
the replay's own."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import orjson
import pytest

from pipeline.adapters.queries import budget, windows
from pipeline.adapters.queries.filters import ReportFilter
from pipeline.adapters.store import ClickHouseStore, open_store
from pipeline.app.replay import replay_file
from pipeline.app.report import read_report
from pipeline.app.report_html import read_html_data
from pipeline.cli import main
from pipeline.core.sketch import QuantileSketch
from pipeline.settings import EXAMPLE_SLO_SPEC, Settings
from tests.control_fixtures import TEST_POLICY, write_overload_jsonl
from tools.dev.dashboards import (
    BREAKDOWN,
    BURN_WINDOWS,
    CTX_BUCKETS,
    HEATMAP_BOUNDS_MS,
    LAST_VERSIONS,
    PRIORITIES,
    REQUEST_PANEL_COLUMNS,
    dashboards,
)
from tools.dev.grafana_sql import ALL_VALUE, QueryContext, Variable, interpolate, panel_context

pytestmark = pytest.mark.integration

# The columns each panel must return, by title (a new panel needs an entry here).
EXPECTED: dict[str, tuple[str, ...]] = {
    "P50 / P99 including queue": ("time", "series", "latency_ms"),
    "P50 / P99 excluding queue": ("time", "series", "latency_ms"),
    "Mean latency breakdown: queue / prefill / decode / gateway overhead": (
        "time", "component", "mean_ms",
    ),
    "Queue / compute ratio (inference / gateway total)": ("time", "queue_compute_ratio"),
    "Latency heatmap: ${boundary}": (
        "time", *(str(b) for b in HEATMAP_BOUNDS_MS), "+Inf",
    ),
    "Top slow requests with their breakdown": (
        "time", "request_id", "model", "priority", "tenant", "ctx_bucket", "outcome", "source",
        "gateway_total_ms", "engine_e2e_ms", "queue_ms", "prefill_ms", "decode_ms",
        "gateway_overhead_ms", "queue_share", "prompt_tokens", "output_tokens",
    ),
    "Latency per tenant (exact, from requests)": (
        "tenant", "requests", "p50_gateway_total_ms", "p99_gateway_total_ms", "p99_queue_ms",
        "p99_inference_ms", "not_ok_share",
    ),
    "Blended compliance": ("slo", "compliance", "objective"),
    "Compliance per SLO and tier": (
        "slo", "kind", "boundary", "threshold_ms", "objective", "total", "good", "compliance",
        "met",
    ),
    "Compliance per SLO over time": ("time", "slo", "compliance"),
    "Error budget remaining (rolling ${budget_window})": ("time", "slo", "budget_remaining"),
    "Burn rate per window: ${slo}": ("time", "burn_window", "burn_rate"),
    "Burn rates and budget at the end of the range": (
        "slo", "objective", *(name for name, _ in BURN_WINDOWS), "budget_remaining",
    ),
    "Control level per scope": ("time", "scope", "level"),
    "Control transitions with reasons": (
        "time", "scope", "level", "phase", "reason", "notify_customer", "budget_exhausted",
        "actions", "figures",
    ),
    "Budget events": ("time", "slo", "event", "consumed_fraction", "details"),
}  # fmt: skip


@dataclass
class Replayed:
    store: ClickHouseStore
    summary: dict[str, Any]
    events: Path
    from_ms: int
    to_ms: int


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replayed]:
    """One replayed store for the module (chDB opens one directory per process)."""
    d = tmp_path_factory.mktemp("dashboards")
    events = d / "events.jsonl"
    write_overload_jsonl(events)  # ~40 simulated minutes, x3 overload for 10 of them
    policy = d / "policy.yaml"
    policy.write_text(TEST_POLICY)
    # the contract-tier spec: it has a blended tier, which one dashboard panel shows; its
    # monthly SLO made hourly, so that 40 minutes can honestly spend a budget (a 30-day
    # or monthly one is projected over the whole window: docs/budgets.md) and the budget
    # events panel has rows
    spec = d / "slo.yaml"
    spec.write_text(
        EXAMPLE_SLO_SPEC.read_text().replace("window: {calendar: month}", "window: {rolling: 1h}")
    )
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["replay", str(events), "--store", str(d / "store"), "--policy", str(policy),
                   "--slo", str(spec), "--json"])  # fmt: skip
    assert rc == 0
    summary = orjson.loads(out.getvalue())
    assert summary["control"], "the overload must change the control level"
    assert {e["slo"] for e in summary["budget_events"]} == {"gold-ttfb"}
    store = open_store(Settings(store_dir=d / "store"))
    try:
        lo, hi = store.query_rows(
            "SELECT toUnixTimestamp64Milli(min(window_start)), "
            "toUnixTimestamp64Milli(max(window_start) + toIntervalMillisecond(any(window_ms))) "
            f"FROM {store.database}.window_sketches"
        )[0]
        yield Replayed(store, summary, events, int(lo), int(hi))
    finally:
        store.close()


def _variables(
    model: dict[str, Any],
    picks: dict[str, str | list[str]],
    listed: dict[str, list[str]] | None = None,
) -> dict[str, Variable]:
    """The variables' current values; a single-value query variable saved without a value
    takes its first option, as Grafana does on load."""
    out = {}
    for v in model["templating"]["list"]:
        options = (listed or {}).get(v["name"]) or [
            o["value"] for o in v.get("options", []) if o["value"] != ALL_VALUE
        ]
        current = picks.get(v["name"], v["current"]["value"])
        if current == "" and options:
            current = options[0]
        out[v["name"]] = Variable(v["name"], current, options)
    return out


def _run(store: ClickHouseStore, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    result = store._client.query(sql)
    return list(result.column_names), [tuple(r) for r in result.result_rows]


def _variable_values(r: Replayed, model: dict[str, Any]) -> dict[str, list[str]]:
    """Run the dashboard's query variables; their options as Grafana would list them."""
    base = _variables(model, {})
    ctx = QueryContext(r.from_ms, r.to_ms, 60_000, base)
    values = {}
    for v in model["templating"]["list"]:
        if v["type"] == "query":
            cols, rows = _run(r.store, interpolate(v["query"]["rawSql"], ctx))
            assert len(cols) == 1, v["name"]
            values[v["name"]] = [str(row[0]) for row in rows]
    return values


def test_variable_queries_list_what_the_store_holds(replayed: Replayed) -> None:
    latency = _variable_values(replayed, dashboards()["tailguard-latency.json"])
    records = replay_file(replayed.events)
    assert latency["model"] == sorted({rec.model for rec in records.records.values()})
    assert latency["tenant"] == sorted({rec.tenant or "" for rec in records.records.values()})
    slo = _variable_values(replayed, dashboards()["tailguard-slo.json"])
    assert slo["slo"] == sorted(replayed.summary["slos"])


SELECTIONS = ("all", "picked")


@pytest.mark.parametrize("interval_ms", [60_000, 3_600_000])
@pytest.mark.parametrize("selection", SELECTIONS)
@pytest.mark.parametrize("name", sorted(dashboards()))
def test_every_panel_returns_rows_with_the_expected_columns(
    replayed: Replayed, name: str, selection: str, interval_ms: int
) -> None:
    model = dashboards()[name]
    listed = _variable_values(replayed, model)
    picks: dict[str, str | list[str]] = {}
    if selection == "picked":
        picks = {"priority": ["0", "2"], "ctx_bucket": ["<512", "512-4k"]}
        if "model" in listed:
            picks["model"] = listed["model"][:1]
            picks["tenant"] = listed["tenant"][:2]
            picks["boundary"] = "queue_ms"
        if "slo" in listed:
            picks["slo"] = listed["slo"][-1]
            picks["budget_window"] = "86400"
    variables = _variables(model, picks, listed)
    ctx = QueryContext(replayed.from_ms, replayed.to_ms, interval_ms, variables)
    titles = {p["title"] for p in model["panels"]}
    assert titles <= set(EXPECTED), titles - set(EXPECTED)
    for panel in model["panels"]:
        (target,) = panel["targets"]
        sql = interpolate(target["rawSql"], panel_context(ctx, panel))
        cols, rows = _run(replayed.store, sql)
        where = f"{name}: {panel['title']} ({selection}, {interval_ms} ms)"
        assert cols == list(EXPECTED[panel["title"]]), where
        assert rows, f"{where}: no rows\n{sql}"
        if target["format"] == 0:  # time series: a time column first, ascending
            times = [row[0] for row in rows]
            assert all(isinstance(t, datetime) for t in times), where
            assert times == sorted(times), where


def test_selections_filter(replayed: Replayed) -> None:
    """A narrower selection gives fewer requests; All equals every option selected."""
    model = dashboards()["tailguard-latency.json"]
    panel = next(p for p in model["panels"] if p["title"].startswith("Latency per tenant"))
    listed = _variable_values(replayed, model)

    def total(picks: dict[str, str | list[str]]) -> int:
        variables = _variables(model, picks, listed)
        ctx = QueryContext(replayed.from_ms, replayed.to_ms, 60_000, variables)
        sql = interpolate(panel["targets"][0]["rawSql"], panel_context(ctx, panel))
        _, rows = _run(replayed.store, sql)
        return sum(int(r[1]) for r in rows)

    # the panel's own range (the last hour before the dashboard's end) covers the replay
    span = panel_context(QueryContext(replayed.from_ms, replayed.to_ms), panel)
    assert span.from_ms <= replayed.from_ms
    everything = total({})
    assert everything == replayed.summary["requests"]
    assert total({"model": listed["model"], "priority": list(PRIORITIES),
                  "ctx_bucket": list(CTX_BUCKETS), "tenant": listed["tenant"]}) == everything  # fmt: skip  # noqa: E501
    assert 0 < total({"model": listed["model"][:1]}) < everything
    assert 0 < total({"tenant": listed["tenant"][:1], "priority": ["0"]}) < everything
    # The rollup panels filter by window key: one model's breakdown is not everyone's.
    title = "Mean latency breakdown: queue / prefill / decode / gateway overhead"
    _, every = _panel_rows(replayed, "tailguard-latency.json", title)
    _, one = _panel_rows(replayed, "tailguard-latency.json", title,
                         picks={"model": listed["model"][:1]})  # fmt: skip
    assert every
    assert one
    assert one != every


@pytest.fixture
def rewritten(replayed: Replayed) -> Iterator[str]:
    """A copy of the replayed ``requests`` with a second, older version of every request
    written after it (a lower store version, 100 x slower): a table of requests written
    twice, as partial records and superseded attempts leave it."""
    db = replayed.store.database
    replayed.store.command(f"DROP TABLE IF EXISTS {db}.requests_rewritten")
    replayed.store.command(f"CREATE TABLE {db}.requests_rewritten AS {db}.requests")
    try:
        replayed.store.command(f"INSERT INTO {db}.requests_rewritten SELECT * FROM {db}.requests")
        replayed.store.command(
            f"INSERT INTO {db}.requests_rewritten SELECT * REPLACE (revision - 1 AS revision, "
            "gateway_total_ms * 100 AS gateway_total_ms, engine_e2e_ms * 100 AS engine_e2e_ms) "
            f"FROM {db}.requests WHERE revision > 0"
        )
        yield "requests_rewritten"
    finally:
        replayed.store.command(f"DROP TABLE IF EXISTS {db}.requests_rewritten")


@pytest.mark.parametrize(
    "title", ["Top slow requests with their breakdown", "Latency per tenant (exact, from requests)"]
)
@pytest.mark.parametrize("selection", SELECTIONS)
def test_the_panels_reading_requests_show_what_final_gives(
    replayed: Replayed, rewritten: str, title: str, selection: str
) -> None:
    """Each request's last version in the range (``LAST_VERSIONS``, no ``FINAL``) gives the
    rows ``requests FINAL`` over the same range gives, on a table of requests written twice
    (the older version 100 x slower: shown, it would change both panels)."""
    model = dashboards()["tailguard-latency.json"]
    panel = next(p for p in model["panels"] if p["title"] == title)
    listed = _variable_values(replayed, model)
    picks: dict[str, str | list[str]] = {}
    if selection == "picked":
        picks = {"model": listed["model"][:1], "tenant": listed["tenant"][:2]}
    ctx = panel_context(
        QueryContext(replayed.from_ms, replayed.to_ms, 60_000, _variables(model, picks, listed)),
        panel,
    )
    raw = panel["targets"][0]["rawSql"]
    assert LAST_VERSIONS in raw
    columns = ", ".join(REQUEST_PANEL_COLUMNS)
    final = f"(SELECT {columns} FROM ${{db}}.requests FINAL WHERE $__timeFilter(ts))"
    every_row = f"(SELECT {columns} FROM ${{db}}.{rewritten} WHERE $__timeFilter(ts))"
    last = LAST_VERSIONS.replace("${db}.requests ", f"${{db}}.{rewritten} ")
    assert last != LAST_VERSIONS

    def rows(source: str) -> list[tuple[Any, ...]]:
        return _run(replayed.store, interpolate(raw.replace(LAST_VERSIONS, source), ctx))[1]

    want = rows(final)
    assert want
    assert rows(last) == want
    assert rows(every_row) != want  # (the older versions, unmerged, would show)


def _panel_rows(
    r: Replayed, dashboard: str, title: str, *, from_ms: int | None = None,
    to_ms: int | None = None, interval_ms: int = 60_000,
    picks: dict[str, str | list[str]] | None = None,
) -> tuple[list[str], list[tuple[Any, ...]]]:  # fmt: skip
    model = dashboards()[dashboard]
    panel = next(p for p in model["panels"] if p["title"] == title)
    ctx = QueryContext(
        r.from_ms if from_ms is None else from_ms, r.to_ms if to_ms is None else to_ms,
        interval_ms, _variables(model, picks or {}, _variable_values(r, model)),
    )  # fmt: skip
    return _run(r.store, interpolate(panel["targets"][0]["rawSql"], panel_context(ctx, panel)))


def test_p99_over_the_range_equals_the_merged_stream_sketches(replayed: Replayed) -> None:
    """One hourly bucket covers the replay: its P99 is the merge of every window's sketch."""
    stream = replay_file(replayed.events)
    merged = {b: QuantileSketch() for b in ("gateway_total_ms", "inference_ms")}
    for w in stream.windows:
        for (key, boundary), cols in w.sketches.items():
            if key == ("*", "*", "*") and boundary in merged:
                merged[boundary].merge(QuantileSketch.from_columns(cols))
    hours = {
        int(row[0].timestamp()) // 3600
        for row in _panel_rows(replayed, "tailguard-latency.json", "P50 / P99 including queue",
                               interval_ms=3_600_000)[1]
    }  # fmt: skip
    assert len(hours) == 1, "the replay spans one clock hour"
    for title, boundary in (("P50 / P99 including queue", "gateway_total_ms"),
                            ("P50 / P99 excluding queue", "inference_ms")):  # fmt: skip
        _, rows = _panel_rows(replayed, "tailguard-latency.json", title, interval_ms=3_600_000)
        got = {series: value for _, series, value in rows}
        for q, name in ((0.5, "p50"), (0.99, "p99")):
            want = merged[boundary].quantile(q)
            assert got[f"{boundary} {name}"] == pytest.approx(want, rel=1e-12), (boundary, q)


def test_budget_and_long_burn_rates_equal_the_controllers(replayed: Replayed) -> None:
    cols, rows = _panel_rows(
        replayed, "tailguard-slo.json", "Burn rates and budget at the end of the range"
    )
    table = {row[0]: dict(zip(cols, row, strict=True)) for row in rows}
    budgets = replayed.summary["budgets"]
    assert set(table) == set(budgets)
    for slo, b in budgets.items():
        # Windows of 1 h and more cover the whole replay: same counts, same figure.
        for name, _ in BURN_WINDOWS[2:]:
            assert table[slo][name] == pytest.approx(b["burn_rates"][name], rel=1e-9), (slo, name)
        if b["window"] == "rolling 30d":  # the dashboard's default budget window
            assert table[slo]["budget_remaining"] == pytest.approx(
                b["remaining_fraction"], rel=1e-9
            ), slo


def test_control_and_budget_tables_match_the_replay(replayed: Replayed) -> None:
    want = [
        (t["scope"], t["level"], t["phase"], t["reason"]) for t in replayed.summary["directives"]
    ]
    cols, rows = _panel_rows(replayed, "tailguard-slo.json", "Control transitions with reasons")
    assert cols[:5] == ["time", "scope", "level", "phase", "reason"]
    assert sorted((r[1], r[2], r[3], r[4]) for r in rows) == sorted(want)
    _, events = _panel_rows(replayed, "tailguard-slo.json", "Budget events")
    assert sorted((r[1], r[2]) for r in events) == sorted(
        (e["slo"], e["kind"]) for e in replayed.summary["budget_events"]
    )
    for row in events:
        assert json.loads(row[4])["consumed_fraction"] == pytest.approx(row[3])


def test_control_timeline_carries_the_level_into_the_range(replayed: Replayed) -> None:
    """A range that starts while a scope is degraded still shows it degraded from the start."""
    first_l1 = min(
        t["ts_unix_ns"] // 1_000_000 for t in replayed.summary["control"] if t["level"] >= 1
    )
    start = first_l1 + 60_000
    _, rows = _panel_rows(replayed, "tailguard-slo.json", "Control level per scope", from_ms=start)
    at_start = {scope: level for t, scope, level in rows if int(t.timestamp() * 1000) == start}
    assert at_start, rows[:5]
    levels_then: dict[str, int] = {}
    for t in replayed.summary["control"]:
        if t["ts_unix_ns"] // 1_000_000 < start:
            levels_then[t["scope"]] = t["level"]
    assert at_start == levels_then
    assert max(at_start.values()) >= 1


def _ms(t: datetime | str) -> int:
    """Unix ms of a time the engine returned (naive: UTC), or of the report's text of it."""
    d = datetime.fromisoformat(t) if isinstance(t, str) else t
    return round((d if d.tzinfo else d.replace(tzinfo=UTC)).timestamp() * 1000)


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return a == pytest.approx(b, rel=1e-9)


def test_the_panels_and_the_report_agree_on_one_store(replayed: Replayed) -> None:
    """Panel by panel, the figures a dashboard shows over the whole store are the report's
    (``tailguard report`` and its charts): both read through pipeline.adapters.queries."""
    store = replayed.store
    report = read_report(store, ReportFilter())
    charts = read_html_data(store, ReportFilter())
    everything = {
        "from_ms": replayed.from_ms // 3_600_000 * 3_600_000,  # whole minutes and hours
        "to_ms": replayed.to_ms + 3_600_000,
    }
    rows = partial(_panel_rows, replayed, "tailguard-slo.json", **everything)
    latency_rows = partial(_panel_rows, replayed, "tailguard-latency.json", **everything)
    compared: list[str] = []

    # SLOs and tiers over the range: the report's table
    cols, table = rows("Compliance per SLO and tier")
    got = {r[0]: dict(zip(cols, r, strict=True)) for r in table}
    assert set(got) == set(report.slos)
    for slo, want in report.slos.items():
        row = got[slo]
        assert (row["kind"], int(row["total"]), int(row["good"])) == (
            want["kind"], want["total"], want["good"]
        ), slo  # fmt: skip
        assert _close(row["compliance"], want["compliance"]), slo
        assert _close(row["objective"], want["objective"]), slo
        assert bool(row["met"]) == want["met"], slo
    compared.append("Compliance per SLO and tier")
    blended = {r[0]: (r[1], r[2]) for r in rows("Blended compliance")[1]}
    tiers = {s: v for s, v in report.slos.items() if v["kind"] == "blended"}
    assert blended
    assert set(blended) == set(tiers)
    for slo, (compliance, objective) in blended.items():
        assert _close(compliance, tiers[slo]["compliance"]), slo
        assert _close(objective, tiers[slo]["objective"]), slo
    compared.append("Blended compliance")

    # per minute: the report's reads of the same SLO counts and latency rollups
    minutes = {
        (t * 1000, slo): (float(g) + float(w) * float(s) if kind == "blended" else float(g))
        / float(n)
        for slo, kind, t, _o, w, n, g, s in budget.minute_counts(store, ReportFilter())
        if n
    }
    over_time = {(_ms(t), slo): c for t, slo, c in rows("Compliance per SLO over time")[1]}
    assert over_time
    assert over_time.keys() == minutes.keys()
    assert all(_close(c, minutes[k]) for k, c in over_time.items())
    compared.append("Compliance per SLO over time")
    for title in ("P50 / P99 including queue", "P50 / P99 excluding queue"):
        series = {
            (s.split()[0], _ms(t)): v for t, s, v in latency_rows(title)[1] if s.endswith("p99")
        }
        shown = {b for b, _ in series} & set(charts.latency_p99)
        assert shown, title
        for b in shown:
            want = {round(t * 1000): v for t, v in charts.latency_p99[b]}
            got_b = {t: v for (bb, t), v in series.items() if bb == b}
            assert got_b.keys() == want.keys(), (title, b)
            assert all(_close(v, want[t]) for t, v in got_b.items()), (title, b)
        compared.append(title)
    title = "Mean latency breakdown: queue / prefill / decode / gateway overhead"
    means = {(c, _ms(t)): v for t, c, v in latency_rows(title)[1]}
    assert {c for c, _ in means} == set(BREAKDOWN) == set(charts.breakdown)
    for c, series_c in charts.breakdown.items():
        assert {t for cc, t in means if cc == c} == {round(t * 1000) for t, _ in series_c}, c
        assert all(_close(means[c, round(t * 1000)], v) for t, v in series_c), c
    compared.append(title)
    sums = {
        (int(t) * 1000, b): float(s)
        for t, b, _p, s, _n in windows.minute_p99_and_means(
            store, ReportFilter(), ("inference_ms", "gateway_total_ms")
        )
    }
    title = "Queue / compute ratio (inference / gateway total)"
    ratio = latency_rows(title)[1]
    assert ratio
    for t, r in ratio:
        want_r = sums.get((_ms(t), "inference_ms"), 0.0) / sums[_ms(t), "gateway_total_ms"]
        assert _close(r, want_r), t
    compared.append(title)

    # control and budget audit
    _, directives = rows("Control transitions with reasons")
    assert sorted((_ms(r[0]), r[1], r[2], r[3], r[4]) for r in directives) == sorted(
        (_ms(d["event_time"]), d["scope"], d["level"],
         d["phase"], d["reason"])
        for d in report.control
    )  # fmt: skip
    compared.append("Control transitions with reasons")
    _, levels = rows("Control level per scope")
    assert sorted((_ms(t), s, lv) for t, s, lv in levels) == sorted(
        (round(t * 1000), s, lv) for s, rows_s in charts.control.items() for t, lv, _p, _r in rows_s
    )
    compared.append("Control level per scope")
    _, events = rows("Budget events")
    assert sorted((_ms(r[0]), r[1], r[2]) for r in events) == sorted(
        (_ms(e["event_time"]), e["slo"], e["event"]) for e in report.budget_events
    )
    assert events
    compared.append("Budget events")

    # burn rates at the end of the data: the report's window ends with its last minute
    ((last,),) = store.query_rows(f"SELECT max(window_start) FROM {store.database}.slo_1m")
    _, burn = _panel_rows(
        replayed, "tailguard-slo.json", "Burn rates and budget at the end of the range",
        from_ms=everything["from_ms"], to_ms=_ms(last),
    )  # fmt: skip
    names = [name for name, _ in BURN_WINDOWS]
    for row in burn:
        want_burn = report.slos[row[0]]["burn_rate"]
        for window in ("5m", "1h"):
            assert _close(row[2 + names.index(window)], want_burn[window]), (row[0], window)
    assert burn
    compared.append("Burn rates and budget at the end of the range")
    # the 5-minute burn rate at each minute: the report's chart of it, per SLO
    title = "Burn rate per window: ${slo}"
    assert charts.burn_rate
    for slo, series_s in charts.burn_rate.items():
        _, five = _panel_rows(
            replayed, "tailguard-slo.json", title, picks={"slo": slo}, **everything
        )
        got_s = {_ms(t): r for t, w, r in five if w == "5m" and r is not None}
        assert got_s == pytest.approx({round(t * 1000): v for t, v in series_s}, rel=1e-9), slo
    compared.append(title)
    # Not in the report: the heatmap (sketch buckets), the slowest requests and the
    # per-tenant table (the report's request figures are over all tenants), and the budget
    # over a rolling window chosen on the dashboard (the report's: the SLO's own window).
    elsewhere = {
        "Latency heatmap: ${boundary}",
        "Top slow requests with their breakdown",
        "Latency per tenant (exact, from requests)",
        "Error budget remaining (rolling ${budget_window})",
    }
    titles = {p["title"] for m in dashboards().values() for p in m["panels"]}
    assert set(compared) == titles - elsewhere
