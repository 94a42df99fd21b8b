"""A month of traffic answered in a second (issue 53): what an SRE reads, timed on a store
of 30 days at 20 requests/s (~52 M requests).

    TG_MONTH_STORE=/work/month-store ./tg bench --only month

The store is built (or resumed, or reused as is) by :mod:`bench.month_store` in a
process of its own under ``nice -n 10`` (``TG_MONTH_BUILD_S``: stop the build between
hours after that many seconds and measure what is there; the section says how much).
Then, on the store as a worker leaves it (the embedded engine in this process, and its
read-only query port), each read is timed ``TG_MONTH_RUNS`` times (default 5) *cold*
(the engine's mark, uncompressed and query caches dropped before each run; the kernel's
page cache is not, on a shared machine) and as many times *warm* (right after), P50 and
P95 (of 5 runs: the slowest):

* every Grafana panel's SQL and variable query (``dashboards/json/*.json``, expanded as
  the plugin does, ``tools/dev/grafana_sql.py``; every multi-value variable All, the
  interval Grafana picks for a 1,000-pixel panel) over the last 1 h, 24 h and 30 d of
  the store;
* ``report`` over the same ranges: what ``tailguard report`` reads and renders (text),
  and what ``--json`` adds (``read_html_data``, ``series_json``);
* ``statement`` for one tenant and one calendar month;
* ``explain`` for requests of the first and of the last day;
* the budget queries (the controller's start-up read: newest window, base windows of the
  last hour, minute rollups of the last day, hour rollups of the month);
* the same reads through the query port, warm (the panels over 30 d, ``report`` over
  1 h, the rest as above).

A read's runs stop once they took ``TG_MONTH_READ_BUDGET_S`` (default 30) together, cold
and warm apart (the table says how many ran); a ``report`` range holding more than
``TG_MONTH_REPORT_MAX_ROWS`` requests (default 60 M: a month at 20 requests/s is run;
it was 5 M while the report read every figure from ``requests``) is not run (its reads
of ``requests`` for the figures no window holds still merge every version of the range,
``FINAL``). ``TG_MONTH_PARTS=reads``: the reads in this process only (no codec trial,
no reads through the port, no ingestion run); ``TG_MONTH_SKIP_READS`` (a regex of
``group / name``, e.g. ``'^(?!report)'``) leaves reads out.

Last, the ingestion rate with a dashboard refreshing (:func:`ingestion_with_dashboard`):
``TG_MONTH_INGEST_HOURS`` (default 12) hours of the recipe's traffic written through the
flush's writers into a scratch database of the same engine, alone, with every panel of
both dashboards over 30 d refreshed every 10 s through the query port, and alone again
(``TG_MONTH_INGEST_ROUNDS`` alternations, default 1). A phase must span several refresh
periods: the dashboard refreshes as its phase starts, so over 3 hours (a 7 s phase) it
refreshed once in 7 s, as if every 7 s (ratios 0.87-1.12 from run to run at f23282c and
before); 12 hours are ~1.2 M requests, ~52 s a phase here.

``TG_MONTH_PARTS`` (e.g. ``reads,ingest``) runs a subset of the section (:data:`PARTS`).

Also: rows and bytes on disk per table, per request it covers; the ``requests`` table's
largest columns; one day's partition of it with ZSTD(1) on every column against as
stored; the build's rate per pass and what the rest would take.
"""

from __future__ import annotations

import contextlib
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import orjson

from bench.context import Context
from bench.month_data import DAY_MS, HOUR_MS, generate_hour
from bench.month_store import DATABASE, Progress, default_dir, open_month, settings_for
from bench.results import Figure, Section, at_most, register

REPO: Final = Path(__file__).resolve().parents[1]
RANGES: Final = (("1 h", HOUR_MS), ("24 h", DAY_MS), ("30 d", 30 * DAY_MS))
PANEL_WIDTH_PX: Final = 1000  # Grafana's maxDataPoints for a panel about this wide
# Grafana's rangeutil.roundInterval: (upper bound, interval), in ms
_ROUND: Final = (
    (1_500, 1_000), (3_500, 2_000), (7_500, 5_000), (12_500, 10_000), (17_500, 15_000),
    (25_000, 20_000), (45_000, 30_000), (90_000, 60_000), (210_000, 120_000),
    (450_000, 300_000), (750_000, 600_000), (1_050_000, 900_000), (1_500_000, 1_200_000),
    (2_700_000, 1_800_000), (5_400_000, 3_600_000), (9_000_000, 7_200_000),
    (16_200_000, 10_800_000), (32_400_000, 21_600_000), (86_400_000, 43_200_000),
)  # fmt: skip
TABLES: Final = (
    "requests", "lifecycle_events", "window_sketches", "slo_windows", "latency_1m",
    "latency_1h", "slo_1m", "slo_1h",
)  # fmt: skip
# the targets ("Done when")
PANEL_30D_P95_S: Final = 1.0
REPORT_30D_S: Final = 2.0
STATEMENT_S: Final = 10.0
EXPLAIN_S: Final = 0.3


def grafana_interval_ms(range_ms: int) -> int:
    """The ``$__interval`` Grafana gives a panel of :data:`PANEL_WIDTH_PX` over ``range_ms``."""
    raw = range_ms / PANEL_WIDTH_PX
    for bound, interval in _ROUND:
        if raw <= bound:
            return interval
    return 86_400_000


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1) + 0.4999)))]


class Timer:
    """Runs reads cold and warm against one store, and keeps what each took."""

    def __init__(self, store: Any, runs: int, *, can_drop: bool = True) -> None:
        self.store = store
        self.runs = runs
        self.can_drop = can_drop
        self.rows: list[tuple[str, str, list[float], list[float], str]] = []
        # a read's runs stop once they took this long together (cold, then warm): on a
        # month, a slow read would otherwise take the section's hour
        self.budget_s = float(os.environ.get("TG_MONTH_READ_BUDGET_S", "30"))

    def drop_caches(self) -> None:
        if not self.can_drop:
            return
        for what in ("MARK CACHE", "UNCOMPRESSED CACHE", "QUERY CACHE"):
            # an engine without that cache: nothing to drop
            with contextlib.suppress(Exception):
                self.store.command(f"SYSTEM DROP {what}")

    def time(self, group: str, name: str, fn: Callable[[], Any], *, cold: bool = True) -> None:
        skip = os.environ.get("TG_MONTH_SKIP_READS")
        if skip and re.search(skip, f"{group} / {name}"):
            self.skip(group, name, f"not run (TG_MONTH_SKIP_READS {skip!r})")
            return
        colds: list[float] = []
        warms: list[float] = []
        note = ""
        try:
            for _ in range(self.runs if cold else 0):
                self.drop_caches()
                t = time.perf_counter()
                fn()
                colds.append(time.perf_counter() - t)
                if sum(colds) > self.budget_s:
                    break
            for _ in range(self.runs):
                t = time.perf_counter()
                fn()
                warms.append(time.perf_counter() - t)
                if sum(warms) > self.budget_s:
                    break
        except Exception as exc:
            note = "failed: " + str(exc).split("\n", 1)[0][:200]
        if len(colds) < (self.runs if cold else 0) or len(warms) < self.runs:
            note += f" ({len(colds)} cold, {len(warms)} warm runs: over {self.budget_s:g} s each)"
        self.rows.append((group, name, colds, warms, note))
        print(
            f"[month] {group} / {name}: cold {_fmt(colds)} warm {_fmt(warms)} {note}",
            file=sys.stderr,
            flush=True,
        )

    def skip(self, group: str, name: str, note: str) -> None:
        self.rows.append((group, name, [], [], note))
        print(f"[month] {group} / {name}: {note}", file=sys.stderr, flush=True)


def _fmt(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"{_ms(statistics.median(xs))} / {_ms(_pct(xs, 0.95))}"


def _ms(s: float) -> str:
    return f"{s * 1000:,.0f} ms" if s < 10 else f"{s:,.1f} s"


# --- what is read -----------------------------------------------------------------------


def dashboard_queries(end_ms: int, range_ms: int) -> list[tuple[str, str]]:
    """``(dashboard / panel, SQL)`` of every panel and variable query over the last
    ``range_ms`` before ``end_ms``, as the plugin sends them (multi-value variables All)."""
    from tools.dev.grafana_sql import (
        ALL_VALUE,
        QueryContext,
        Variable,
        interpolate,
        panel_context,
    )

    out = []
    for path in sorted((REPO / "dashboards" / "json").glob("*.json")):
        model = orjson.loads(path.read_bytes())
        variables = {}
        for v in model["templating"]["list"]:
            cur = v.get("current") or {}
            value = cur.get("value", "")
            if v.get("multi"):
                value = [ALL_VALUE]
            options = [o["value"] for o in v.get("options", []) if o["value"] != ALL_VALUE]
            variables[v["name"]] = Variable(v["name"], value, options, v.get("allValue"))
        if "slo" in variables:  # the SLO dashboard's single SLO: the shipped spec's first
            variables["slo"] = Variable("slo", "ttft-stream")
        ctx = QueryContext(end_ms - range_ms, end_ms, grafana_interval_ms(range_ms), variables)
        board = model.get("uid", path.stem)
        for v in model["templating"]["list"]:
            q = v.get("query")
            if isinstance(q, dict) and q.get("rawSql"):
                out.append((f"{board} / variable {v['name']}", interpolate(q["rawSql"], ctx)))
        for p in model["panels"]:
            for t in p.get("targets", []):
                sql = t.get("rawSql")
                if sql:  # (a panel with its own range, timeFrom: the last of it)
                    out.append((f"{board} / {p['title']}", interpolate(sql, panel_context(ctx, p))))
    return out


def _report_filter(end_ms: int, range_ms: int) -> Any:
    from pipeline.adapters.queries.filters import ReportFilter

    return ReportFilter((end_ms - range_ms) / 1000, end_ms / 1000)


def report_text(store: Any, f: Any, spec: Any) -> str:
    """What ``tailguard report`` does for text: read, render, print (to a string)."""
    import io

    from rich.console import Console

    from pipeline.app.report import read_report, render

    report = read_report(store, f, spec)
    buf = io.StringIO()
    Console(file=buf, width=200).print(render(report))
    return buf.getvalue()


def report_json(store: Any, f: Any, spec: Any) -> bytes:
    """What ``tailguard report --json`` does: the report and its series, as JSON."""
    from pipeline.app.report import read_report
    from pipeline.app.report_html import read_html_data, series_json

    report = read_report(store, f, spec)
    data = read_html_data(store, f, spec)
    return orjson.dumps(report.to_json() | {"series": series_json(data)})


def month_contract(workdir: Path, tenants: tuple[str, ...]) -> Path:
    """The shipped example contract, for the generated tenants."""
    from pipeline.shipped import EXAMPLE_CONTRACT

    text = EXAMPLE_CONTRACT.read_text()
    text = re.sub(r"(?m)^tenants: \[.*\]$", f"tenants: [{', '.join(tenants)}]", text)
    # the spec it names, relative to its own folder
    text = re.sub(
        r"(?m)^(slo_spec:\s*)(\S+)",
        lambda m: m.group(1) + str((EXAMPLE_CONTRACT.parent / m.group(2)).resolve()),
        text,
    )
    out = workdir / "contract-month.yaml"
    out.write_text(text)
    return out


def requests_in(store: Any, f: Any) -> int:
    """Requests ending in the filter's range."""
    ((n,),) = store.query_rows(
        f"SELECT count() FROM {store.database}.requests WHERE end_unix_ns >= "
        f"{int(f.since_unix_s * 1e9)} AND end_unix_ns < {int(f.until_unix_s * 1e9)}"
    )
    return int(n)


def covered_requests(store: Any) -> dict[str, int]:
    """Requests each table's rows are of: ``requests`` all; the windows and rollups those
    the written windows counted (their ``__slo__`` rows); raw events those with events."""
    db = store.database
    ((n_req,),) = store.query_rows(f"SELECT count() FROM {db}.requests")
    ((n_win,),) = store.query_rows(
        f"SELECT sum(records) FROM {db}.window_sketches WHERE boundary = '__slo__'"
    )
    ((n_raw,),) = store.query_rows(f"SELECT uniqExact(request_id) FROM {db}.lifecycle_events")
    out = {"requests": int(n_req), "lifecycle_events": int(n_raw)}
    for t in TABLES[2:]:
        out[t] = int(n_win or 0)
    return out


def codec_trial(store: Any, day_start_ms: int) -> tuple[int, int, int]:
    """One day of ``requests`` copied into a table of the same columns, each compressed
    with ZSTD(1) instead of the default (LZ4), merged to one part: ``(rows, bytes on disk
    as stored, bytes on disk with ZSTD(1))`` of that day's partition."""
    db = store.database
    ((ddl,),) = store.query_rows(f"SHOW CREATE TABLE {db}.requests")
    ddl = re.sub(r"CREATE TABLE \S+", f"CREATE TABLE {db}.requests_codec_trial", ddl, count=1)
    ddl = re.sub(
        r"(?m)^(\s+`\w+` [^,\n]+?)(,?)$",
        lambda m: m.group(0) if "CODEC" in m.group(1) or "MATERIALIZED" in m.group(1)
        else f"{m.group(1)} CODEC(ZSTD(1)){m.group(2)}",
        ddl,
    )  # fmt: skip
    day = time.strftime("%Y%m%d", time.gmtime(day_start_ms / 1000))
    store.command(f"DROP TABLE IF EXISTS {db}.requests_codec_trial")
    store.command(ddl)
    try:
        store.command(f"OPTIMIZE TABLE {db}.requests PARTITION {day} FINAL")
        store.command(
            f"INSERT INTO {db}.requests_codec_trial SELECT * FROM {db}.requests "
            f"WHERE toYYYYMMDD(ts) = {day}"
        )
        store.command(f"OPTIMIZE TABLE {db}.requests_codec_trial FINAL")
        sizes = {}
        for table in ("requests", "requests_codec_trial"):
            ((rows, on_disk),) = store.query_rows(
                "SELECT sum(rows), sum(bytes_on_disk) FROM system.parts WHERE active AND "
                f"database = '{db}' AND table = '{table}' AND partition = '{day}'"
            )
            sizes[table] = (int(rows), int(on_disk))
    finally:
        store.command(f"DROP TABLE IF EXISTS {db}.requests_codec_trial")
    return sizes["requests"][0], sizes["requests"][1], sizes["requests_codec_trial"][1]


def table_sizes(store: Any) -> dict[str, tuple[int, int, int]]:
    """``table -> (rows, bytes on disk, uncompressed bytes)`` of the active parts."""
    rows = store.query_rows(
        "SELECT table, sum(rows), sum(bytes_on_disk), sum(data_uncompressed_bytes) "
        "FROM system.parts WHERE database = {db:String} AND active GROUP BY table",
        {"db": store.database},
    )
    return {str(t): (int(r), int(b), int(u)) for t, r, b, u in rows}


def read_all(timer: Timer, prog: Progress, workdir: Path, *, port: bool = False) -> None:
    """Every read of the section, through ``timer``'s store."""
    from bench.month_data import TENANTS
    from pipeline.adapters.queries import budget
    from pipeline.app.explain import explain_request
    from pipeline.app.statement import build_statement
    from pipeline.spec.contract import load_contract_file
    from pipeline.spec.slo import load_spec_file

    store = timer.store
    s = settings_for(Path("."))
    spec = load_spec_file(s.slo_spec)
    end_ms = prog.recipe.end_ms
    cold = not port
    for label, range_ms in RANGES:
        if port and range_ms != RANGES[-1][1]:  # through the port: the month (the target)
            continue
        for name, sql in dashboard_queries(end_ms, range_ms):
            timer.time(f"panel {label}", name, lambda sql=sql: store.query_rows(sql), cold=cold)
    max_rows = int(os.environ.get("TG_MONTH_REPORT_MAX_ROWS", "60000000"))
    for label, range_ms in RANGES:
        f = _report_filter(end_ms, range_ms)
        n = requests_in(store, f)
        if port and range_ms > HOUR_MS:  # (the port adds transport, not reading: timed on 1 h)
            continue
        if n > max_rows:  # (each read of requests merges every version of the range)
            for what in ("text", "--json"):
                timer.skip(
                    f"report {label}", what,
                    f"not run: {n:,} requests in range > TG_MONTH_REPORT_MAX_ROWS {max_rows:,}",
                )  # fmt: skip
            continue
        timer.time(f"report {label}", "text", lambda f=f: report_text(store, f, spec), cold=cold)
        timer.time(f"report {label}", "--json", lambda f=f: report_json(store, f, spec), cold=cold)
    contract = load_contract_file(month_contract(workdir, TENANTS))
    # a month the store holds most of (the month's: 10 days before its end)
    back_ms = min(10 * DAY_MS, prog.recipe.days * DAY_MS // 2)
    period = time.strftime("%Y-%m", time.gmtime((end_ms - back_ms) / 1000))
    # the smallest tenant (5 % of the requests) and the largest (35 %, 14.6 M): both
    # under the target (statement version 4 counts in the engine; before, only the
    # smallest was timed against it)
    tenant = TENANTS[-1]
    timer.time(
        "statement", f"{tenant} {period}",
        lambda: build_statement(store, contract, tenant, period), cold=cold,
    )  # fmt: skip
    if not port:  # (the port adds transport: timed on the smallest tenant)
        largest = TENANTS[0]
        timer.time(
            "statement", f"{largest} {period}, the largest tenant",
            lambda: build_statement(store, contract, largest, period), cold=cold,
        )  # fmt: skip
    first = min(prog.hours_done)
    last = max(prog.hours_done)
    for label, index in (("first day", first), ("last day", last)):
        rid = generate_hour(prog.recipe, index).records[17].request_id
        timer.time(
            "explain", f"{label} ({rid})", lambda rid=rid: explain_request(store, rid, spec),
            cold=cold,
        )  # fmt: skip
    ref = budget.newest_window_start_ms(store) or end_ms
    timer.time("budget", "newest window", lambda: budget.newest_window_start_ms(store), cold=cold)
    timer.time(
        "budget", "base windows, last hour",
        lambda: budget.base_windows(store, ref - HOUR_MS), cold=cold,
    )  # fmt: skip
    timer.time(
        "budget", "slo_1m, last day",
        lambda: budget.rollup_windows(store, "slo_1m", ref - DAY_MS, ref - HOUR_MS), cold=cold,
    )  # fmt: skip
    timer.time(
        "budget", "slo_1h, month",
        lambda: budget.rollup_windows(store, "slo_1h", ref - 30 * DAY_MS, ref - DAY_MS),
        cold=cold,
    )  # fmt: skip


INGEST_REFRESH_S: Final = 10.0  # a dashboard's refresh period (Grafana's "10s")
INGEST_TARGET: Final = 0.9  # the issue's: with the dashboard >= 90 % of the rate without


def _ingest_hours(prog: Progress) -> list[Any]:
    """What the ingestion phases write: ``TG_MONTH_INGEST_HOURS`` (default 12) hours of the
    recipe's traffic (the latest), each as one flush as a worker leaves it: its requests,
    its closed windows and its raw events."""
    from bench.month_data import hour_messages, hour_windows
    from pipeline.adapters.flush import Flush
    from pipeline.core.slo_windows import slo_factory
    from pipeline.spec.slo import load_spec_file

    s = settings_for(Path("."))
    factory = slo_factory(load_spec_file(s.slo_spec))
    config = s.window_config()
    n = int(os.environ.get("TG_MONTH_INGEST_HOURS", "12"))
    flushes = []
    for index in sorted(prog.hours_done)[-n:]:
        hour = generate_hour(prog.recipe, index)
        p = prog.recipe.partitions
        flushes.append(
            Flush(hour.records, hour_windows(hour, p, config, factory), hour_messages(hour, p))
        )
    return flushes


def _write_phase(store: Any, database: str, flushes: list[Any]) -> tuple[int, float]:
    """The flushes written through the flush's writers into a fresh ``database`` of the
    month store's engine: ``(requests, seconds)``. The database is dropped after."""
    from bench.month_store import GROUP, _no_dead, _no_retry
    from pipeline.adapters.flush import FlushWriter
    from pipeline.adapters.store import EmbeddedStore, migrate

    s = settings_for(Path("."))
    scratch = EmbeddedStore(store._client, database)  # the same engine, its own lock
    scratch.command(f"DROP DATABASE IF EXISTS {database}")
    migrate(scratch, raw_ttl_days=3650)  # (the generated hours may be older than a week)
    writer = FlushWriter(
        scratch, GROUP, s.lifecycle_topic, s.window_config().relative_accuracy,
        retry=_no_retry, dead_rows=_no_dead,
    )  # fmt: skip
    try:
        t = time.perf_counter()
        for flush in flushes:
            writer.write(flush)
        took = time.perf_counter() - t
    finally:
        scratch.command(f"DROP DATABASE IF EXISTS {database}")
    return sum(len(f.records) for f in flushes), took


class DashboardRefresher:
    """A dashboard refreshing every panel (both dashboards, over the last 30 days) every
    :data:`INGEST_REFRESH_S`, through the query port as Grafana's plugin would: one panel
    after another; a refresh that takes longer starts the next at once."""

    def __init__(self, client: Any, queries: list[tuple[str, str]]) -> None:
        self.client = client
        self.queries = queries
        self.refreshes: list[float] = []
        self.error: str | None = None  # a query that failed (the refreshing stopped there)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dashboard", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.perf_counter()
            for name, sql in self.queries:
                if self._stop.is_set():
                    return
                try:
                    self.client.query_rows(sql)
                except Exception as exc:  # the phase would be measured without a dashboard
                    self.error = f"{name}: " + str(exc).split("\n", 1)[0][:300]
                    return
            took = time.perf_counter() - t
            self.refreshes.append(took)
            self._stop.wait(max(0.0, INGEST_REFRESH_S - took))

    def __enter__(self) -> DashboardRefresher:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def ingestion_with_dashboard(store: Any, client: Any, prog: Progress) -> dict[str, Any]:
    """The flush's write rate (requests/s: a worker's store side, every table and view
    it writes) alone, with a dashboard refreshing every panel every 10 s (the month's
    30 days, through the port), and alone again (``TG_MONTH_INGEST_ROUNDS`` times: with
    the dashboard, alone); the ratio: mean with / mean alone."""
    flushes = _ingest_hours(prog)
    queries = dashboard_queries(prog.recipe.end_ms, RANGES[-1][1])
    rates: dict[str, list[float]] = {"alone": [], "dashboard": []}
    refreshes: list[float] = []
    _write_phase(store, "tailguard_ingest", flushes[:1])  # warm-up, not counted
    # TG_MONTH_INGEST_ROUNDS (default 1): alone, then that many times (with the dashboard,
    # alone): on a shared machine whose load swings, one alternation is one sample
    rounds = int(os.environ.get("TG_MONTH_INGEST_ROUNDS", "1"))
    for phase in ("alone", *(("dashboard", "alone") * rounds)):
        if phase == "dashboard":
            with DashboardRefresher(client, queries) as dash:
                n, took = _write_phase(store, "tailguard_ingest", flushes)
            refreshes += dash.refreshes
            if dash.error is not None:
                raise RuntimeError(f"the dashboard's refresh failed: {dash.error}")
        else:
            n, took = _write_phase(store, "tailguard_ingest", flushes)
        rates[phase].append(n / took)
        print(f"[month] ingestion {phase}: {n:,} requests in {took:.1f} s", file=sys.stderr)
    alone = statistics.fmean(rates["alone"])
    return {
        "requests": sum(len(f.records) for f in flushes),
        "alone_per_s": rates["alone"],
        "dashboard_per_s": rates["dashboard"],
        "ratio": statistics.fmean(rates["dashboard"]) / alone,
        "refreshes_s": refreshes,
        "panels": len(queries),
    }


def build_store(ctx: Context, store_dir: Path) -> None:
    """Build (or resume) the store in a process of its own, niced; ``TG_MONTH_BUILD_S``
    stops it between hours after that long."""
    stop = store_dir.with_name(store_dir.name + ".stop")
    stop.unlink(missing_ok=True)
    log = ctx.workdir / "month-build.log"
    cmd = [
        "nice", "-n", "10", sys.executable, "-m", "bench.month_store", "--store",
        str(store_dir), "--stop-file", str(stop),
    ]  # fmt: skip
    if os.environ.get("TG_MONTH_PARTITIONS"):
        cmd += ["--partitions", os.environ["TG_MONTH_PARTITIONS"]]
    limit = os.environ.get("TG_MONTH_BUILD_S")
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        timer = None
        if limit:
            timer = threading.Timer(float(limit), stop.touch)
            timer.start()
        try:
            rc = proc.wait()
        finally:
            if timer is not None:
                timer.cancel()
    stop.unlink(missing_ok=True)
    if rc != 0:
        raise RuntimeError(f"the month build failed ({rc}): see {log}")


# What the section measures, each part on its own (TG_MONTH_PARTS, comma-separated: a
# subset, e.g. "ingest" or "reads,ingest"; default every part): the ZSTD(1) trial on a
# day of requests, the reads in process, the reads through the query port, the ingestion
# with a dashboard refreshing against without.
PARTS: Final = ("codec", "reads", "port", "ingest")


def parts_to_run() -> frozenset[str]:
    """The parts ``TG_MONTH_PARTS`` names (every part of :data:`PARTS` when unset)."""
    raw = os.environ.get("TG_MONTH_PARTS", "").strip()
    if not raw:
        return frozenset(PARTS)
    want = frozenset(p.strip() for p in raw.split(",") if p.strip())
    if not want <= set(PARTS):
        raise ValueError(f"TG_MONTH_PARTS {raw!r}: parts are {', '.join(PARTS)}")
    return want


TITLE: Final = "A month of traffic: dashboards, report, statement and explain on ~50 M requests"


@register("month", TITLE, order=95, opt_in=True)
def run(ctx: Context) -> Section:
    from pipeline.adapters.query_server import QueryServer
    from pipeline.adapters.query_server.reader import _http_client
    from pipeline.adapters.store import ClickHouseStore

    section = Section("month", TITLE)
    store_dir = default_dir()
    old = Progress.load(store_dir / "recipe.json")
    if os.environ.get("TG_MONTH_BUILD_S") != "0":
        build_store(ctx, store_dir)
    prog = Progress.load(store_dir / "recipe.json")
    assert prog is not None
    store, prog = open_month(store_dir, prog.recipe)
    runs = int(os.environ.get("TG_MONTH_RUNS", "5"))
    want = parts_to_run()
    trial = ingest = None
    try:
        sizes = table_sizes(store)
        counted = covered_requests(store)
        columns = store.query_rows(
            "SELECT name, data_compressed_bytes FROM system.columns WHERE database = "
            f"'{DATABASE}' AND table = 'requests' ORDER BY data_compressed_bytes DESC LIMIT 8"
        )
        if "codec" in want:
            # the day before the last (a whole day of requests)
            day = prog.recipe.end_ms - prog.recipe.end_ms % DAY_MS - DAY_MS
            trial = codec_trial(store, day)
        direct = Timer(store, runs)
        if "reads" in want:
            read_all(direct, prog, ctx.workdir)
        server = QueryServer(settings_for(store_dir).store_dir, store.lock, database=DATABASE)
        server.start(publish=False)
        client = ClickHouseStore(_http_client(server.port, server.token, DATABASE), DATABASE)
        try:
            via_port = Timer(client, runs, can_drop=False)
            if "port" in want:
                read_all(via_port, prog, ctx.workdir, port=True)
            if "ingest" in want:
                ingest = ingestion_with_dashboard(store, client, prog)
        finally:
            client.close()
            server.stop()
    finally:
        store.close()
    describe(section, prog, old, sizes, counted, direct=direct, via_port=via_port)
    if trial is not None:
        describe_bytes(section, counted, columns, trial)
    if ingest is not None:
        describe_ingestion(section, ingest)
    if want != frozenset(PARTS):
        section.text.append(f"Parts run (TG_MONTH_PARTS): {', '.join(sorted(want))}.")
    describe_build(section, prog, ctx.workdir / "month-build.log")
    return section


_LOGGED_HOUR = re.compile(r"\[month\] (requests|raw events|windows) of hour \d+ .*?, ([\d.]+) s;")


def describe_build(section: Section, prog: Progress, log: Path) -> None:
    """The build's rate per pass (from this run's build log) and, for a store not built
    to its end, how long the rest would take at that rate."""
    walls: dict[str, list[float]] = {}
    if log.exists():
        for m in _LOGGED_HOUR.finditer(log.read_text(errors="replace")):
            walls.setdefault(m.group(1), []).append(float(m.group(2)))
    r = prog.recipe
    left = {
        "requests": r.hours - len(prog.hours_done),
        "raw events": len(set(prog.raw_hours) - prog.raw_done),
        "windows": r.hours - len(prog.windows_done),
    }
    parts = []
    for what, n_left in left.items():
        w = walls.get(what)
        if w:
            mean = statistics.fmean(w)
            parts.append(
                f"{what}: {mean:.1f} s wall per hour of traffic in this run ({len(w)} hours), "
                f"{n_left} hours left, ~{n_left * mean / 3600:.1f} h at that rate"
            )
        else:
            parts.append(f"{what}: {n_left} hours left (none written by this run)")
    section.text.append("Build (niced, on the shared machine): " + "; ".join(parts) + ".")


def describe_ingestion(section: Section, ingest: dict[str, Any]) -> None:
    refreshes = ingest["refreshes_s"]
    section.figures.append(
        Figure(
            "ingestion with a dashboard refreshing every 10 s / without (the flush's write "
            "rate)",
            ingest["ratio"], "x", f"≥ {INGEST_TARGET:g}", ingest["ratio"] >= INGEST_TARGET,
            note=f"{ingest['requests']:,} requests (their windows and raw events) written "
            f"{', '.join(f'{r:,.0f}' for r in ingest['alone_per_s'])} requests/s alone, "
            f"{', '.join(f'{r:,.0f}' for r in ingest['dashboard_per_s'])} with the dashboard "
            f"({len(refreshes)} refreshes "
            f"of {ingest['panels']} panels over 30 d, "
            f"{_ms(statistics.median(refreshes)) if refreshes else '-'} each, P50)",
        )
    )  # fmt: skip


def describe_bytes(
    section: Section,
    counted: dict[str, int],
    columns: list[Any],
    trial: tuple[int, int, int] | None,
) -> None:
    """What a request's row costs, by column, and what ZSTD(1) would make of it (no
    ``trial``: not tried)."""
    n = counted["requests"] or 1
    if trial is not None:
        rows, lz4, zstd = trial
        trial_figure = Figure(
            "bytes on disk per request: requests, one day's partition merged, as stored "
            "(LZ4) -> every column ZSTD(1)",
            zstd / max(rows, 1), "B",
            note=f"{lz4 / max(rows, 1):.0f} B as stored ({rows:,} rows): "
            f"{100 * (1 - zstd / max(lz4, 1)):.0f} % less",
        )  # fmt: skip
        section.figures.append(trial_figure)
    cells = ", ".join(f"{name} {b / n:.1f} B" for name, b in columns)
    section.text.append(f"`requests`, compressed bytes per request, largest columns: {cells}.")


def describe(
    section: Section,
    prog: Progress,
    old: Progress | None,
    sizes: dict[str, tuple[int, int, int]],
    counted: dict[str, int],
    *,
    direct: Timer,
    via_port: Timer,
) -> None:
    r = prog.recipe
    n_req = prog.requests
    full = prog.complete
    built = (
        f"{len(prog.hours_done)} of {r.hours} hours of requests ({n_req:,} requests), "
        f"{len(prog.windows_done)} of {r.hours} hours of windows"
    )
    reused = old is not None and old.digest == prog.digest and old.complete
    section.figures.append(
        Figure("requests in the store", n_req, "requests", "≥ 50,000,000", n_req >= 50_000_000)
    )
    windows = Figure(
        "hours of windows (sketches, SLO counts, ledger, rollups) in the store",
        len(prog.windows_done), "hours", f"= {r.hours} hours", full,
    )  # fmt: skip
    section.figures.append(windows)
    for table in TABLES:
        rows, on_disk, raw = sizes.get(table, (0, 0, 0))
        # per request of what the table covers: windows and rollups, the hours written
        # so far; raw events, the retained days
        covered = counted.get(table, counted["requests"]) or 1
        note = (
            f"{rows:,} rows, {on_disk / 2**20:,.0f} MiB on disk, "
            f"{raw / 2**20:,.0f} MiB uncompressed; per {covered:,} requests it covers"
        )
        section.figures.append(
            Figure(f"bytes on disk per request: {table}", on_disk / covered, "B", note=note)
        )
    for group, name, colds, warms, note in direct.rows:
        p95 = _pct(warms, 0.95) if warms else float("nan")
        target = None
        if group == "panel 30 d":
            target = PANEL_30D_P95_S
        elif group == "report 30 d":
            target = REPORT_30D_S
        elif group == "statement":
            target = STATEMENT_S
        elif group == "explain":
            target = EXPLAIN_S
        label = f"{group}: {name}, P95 warm"
        cold = ""
        if warms:
            cold = f"cold P50/P95 {_fmt(colds)}; warm P50 {_ms(statistics.median(warms))}"
        if target is not None and warms:
            section.figures.append(at_most(label, p95, "s", target, note=cold + note))
        elif target is not None:  # not run, or failed: the target is not shown met
            section.figures.append(Figure(label, None, "s", f"≤ {target:g} s", False, note))
        # (the reads without a target: in the table below only)
    port_rows = {(g, n): w for g, n, _, w, _ in via_port.rows}
    lines = [
        "| read | cold P50 / P95 | warm P50 / P95 | port, warm P50 / P95 |",
        "|---|---:|---:|---:|",
    ]
    for group, name, colds, warms, note in direct.rows:
        pw = port_rows.get((group, name), [])
        lines.append(
            f"| {group}: {name} | {_fmt(colds)} | {_fmt(warms)} | {_fmt(pw)} |"
            + (f" {note}" if note else "")
        )
    section.text.append(
        f"Store: {built}; recipe {prog.digest} ({r.days} days ending "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(r.end_ms / 1000))}, "
        f"{r.rate_per_s:g} requests/s mean, {r.partitions} partition(s), seed {r.seed}); "
        f"{'reused as built before' if reused else 'built or resumed by this run'} "
        f"(build so far: {prog.build_cpu_s:,.0f} CPU-s, {prog.build_wall_s:,.0f} s wall). "
        f"Each read {direct.runs} times cold (engine caches dropped) then warm; "
        "through the port warm only."
    )
    section.text.append("\n".join(lines))
