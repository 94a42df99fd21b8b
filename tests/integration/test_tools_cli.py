"""report --html (in headless Chromium), explain, sql and capacity on a store no worker owns.

The store is built the way an operator would: simulate a trace with an
overload episode to JSON Lines, ``tailguard replay`` it into the store, and
add the controller's audit rows (control_signals, budget_events) for the
transitions and budget events the replay decided (a worker's controller
writes them in production).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from pipeline.adapters.store import BUDGET_EVENT_COLUMNS, CONTROL_COLUMNS, _insert, open_store
from pipeline.settings import EXAMPLE_SLO_SPEC, Settings
from tests.integration.harness import REPO, tailguard
from tests.integration.test_query_server import ESCAPES, ESCAPES_LEAK

pytestmark = [pytest.mark.integration, pytest.mark.long(60)]

CHROMIUM = Path("/usr/bin/chromium")
CHARTS = ("latency", "breakdown", "budget", "burn", "control")


def tg(*args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    p = tailguard(*args, timeout_s=timeout)
    if check:
        assert p.returncode == 0, f"tailguard {' '.join(args)}: {p.returncode}\n{p.stderr[-3000:]}"
    return p


def add_audit(store_dir: Path, replay: dict[str, Any]) -> None:
    """The control audit of the replay's decisions, unless replay wrote it already."""
    store = open_store(Settings(store_dir=store_dir))
    try:
        if store.query_rows("SELECT count() FROM tailguard.control_signals")[0][0]:
            return
        seq: dict[str, int] = {}
        rows = []
        for c in replay["control"]:
            t = datetime.fromtimestamp(c["ts_unix_ns"] / 1e9, tz=UTC)
            seq[c["scope"]] = seq.get(c["scope"], 0) + 1
            rows.append(
                (c["scope"], seq[c["scope"]], c["level"], c["phase"], t, t, t, c["reason"],
                 "{}", "[]", False, False, False, "k1", "{}")
            )  # fmt: skip
        events = [
            (e["slo"], e["kind"], datetime.fromtimestamp(e["at_ms"] / 1000, tz=UTC), json.dumps(e))
            for e in replay["budget_events"]
        ]
        _insert(store, "control_signals", CONTROL_COLUMNS, rows)
        _insert(store, "budget_events", BUDGET_EVENT_COLUMNS, events)
    finally:
        store.close()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("tools")
    events = tmp / "events.jsonl"
    tg("simulate", "--out", str(events), "--limit", "6000", "--overload", "300:600:3")
    store = tmp / "store"
    # the contract tiers with the monthly SLO made hourly: a 30-day or monthly budget is
    # projected over its whole window (docs/budgets.md), so a fresh 20 minutes spends
    # none; an hourly one is spent by the overload, and the report has budget events
    spec = tmp / "slo.yaml"
    spec.write_text(
        EXAMPLE_SLO_SPEC.read_text().replace("window: {calendar: month}", "window: {rolling: 1h}")
    )
    replay = json.loads(
        tg("replay", str(events), "--store", str(store), "--slo", str(spec), "--json").stdout
    )
    assert replay["control"], "the overload episode should have moved the control level"
    assert replay["budget_events"]
    add_audit(store, replay)
    return store, replay


def chromium(*args: str, profile: Path) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM.exists(), (
        "Debian's chromium is needed for the HTML report test: apt-get install -y chromium "
        "(./tg test installs it when run as root)"
    )
    return subprocess.run(
        [
            str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", f"--user-data-dir={profile}", "--window-size=1100,3400", *args,
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip


def test_html_report_renders_in_headless_chromium_with_every_chart_drawn(
    built: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    store, replay = built
    page = tmp_path / "report.html"
    tg("report", "--store", str(store), "--html", str(page))
    text = page.read_text()
    assert not re.search(r"""(src|href)=["']?https?:""", text), "the report must be self-contained"
    # the header reads as prose, not Python dicts; the render check is not shown
    header = text[text.index("<h1>") : text.index("<h2>")]
    assert "{" not in header
    assert "'" not in header
    assert '<pre id="render-check" hidden>' in text
    url = page.resolve().as_uri()
    dom = chromium("--virtual-time-budget=5000", "--dump-dom", url, profile=tmp_path / "p1")
    assert dom.returncode == 0, dom.stderr[-2000:]
    # what the browser laid out: marks with a non-empty box, per chart (the page's own check)
    check = re.search(r'<pre id="render-check" hidden="">([^<]*)</pre>', dom.stdout)
    assert check is not None
    drawn = json.loads(check.group(1))
    print("marks drawn per chart:", drawn)
    assert set(drawn) == set(CHARTS)
    for chart in CHARTS:
        assert drawn[chart] > 0, f"chart {chart} has nothing drawn"
    # a step line and a point set per scope
    assert drawn["control"] >= 2 * len({c["scope"] for c in replay["control"]})
    # in the DOM the browser parsed: an SVG with marks per chart, time ticks on whole minutes
    for chart in CHARTS:
        fig = re.search(
            rf'<figure class="chart" data-chart="{chart}">.*?</figure>', dom.stdout, re.S
        )
        assert fig is not None
        assert "<svg" in fig.group(0)
        assert re.search(r'<g id="mark-', fig.group(0)), chart
        ticks = re.findall(r">(\d\d:\d\d(?::\d\d)?)<", fig.group(0))
        assert ticks, f"{chart}: no HH:MM tick labels"
        assert all(len(t) == 5 for t in ticks), f"{chart}: ticks at odd seconds {ticks}"
    shot = tmp_path / "report.png"
    res = chromium(f"--screenshot={shot}", url, profile=tmp_path / "p2")
    assert res.returncode == 0, res.stderr[-2000:]
    assert shot.stat().st_size > 20_000
    print(f"screenshot: {shot}")


def test_explain_without_a_worker(built: tuple[Path, dict[str, Any]]) -> None:
    store, replay = built
    # a request that broke tier1 at the gateway, chosen by SQL
    rid = json.loads(
        tg(
            "sql", "SELECT request_id FROM tailguard.requests FINAL WHERE source = 'joined' "
            "AND gateway_total_ms > 400 AND outcome = 'ok' ORDER BY end_unix_ns DESC LIMIT 1",
            "--store", str(store), "--format", "json",
        ).stdout
    )[0]["request_id"]  # fmt: skip
    out = json.loads(tg("explain", rid, "--store", str(store), "--json").stdout)
    assert out["request_id"] == rid
    slos = {s["slo"]: s for s in out["slos"]}
    assert slos["tier1-gateway"]["verdict"] == "bad"
    assert slos["tier1-gateway"]["value_ms"] > 400
    parts = {b["segment"]: b["ms"] for b in out["breakdown"]}
    assert set(parts) >= {"queue", "prefill", "decode", "gateway_overhead"}
    total = next(i for i in out["timeline"] if i["clock"] == "gateway" and i["name"] == "completed")
    assert sum(parts.values()) == pytest.approx(total["offset_ms"], rel=1e-6)
    # control level: the replay's last transition for the model at or before the request's end
    end_ns = datetime.fromisoformat(out["end"]).timestamp() * 1e9
    before = [
        c for c in replay["control"] if c["scope"] == out["model"] and c["ts_unix_ns"] <= end_ns
    ]
    if before:
        assert out["control"]["level"] == before[-1]["level"]
    else:
        assert out["control"] is None
    # the terminal rendering works too
    text = tg("explain", rid, "--store", str(store)).stdout
    assert "tier1-gateway" in text
    assert "BAD" in text
    missing = tg("explain", "no-such-request", "--store", str(store), check=False)
    assert missing.returncode == 1
    assert "no request" in missing.stderr


def _sql_json(store: Path, sql: str) -> Any:
    return json.loads(tg("sql", sql, "--store", str(store), "--format", "json").stdout)


def test_sql_without_a_worker_is_read_only(built: tuple[Path, dict[str, Any]]) -> None:
    store, replay = built
    rows = _sql_json(store, "SELECT count() AS n FROM tailguard.requests FINAL")
    assert rows == [{"n": replay["requests"]}]
    tsv = tg("sql", "SELECT 1 AS a, 'x' AS b", "--store", str(store), "--format", "tsv").stdout
    assert tsv == "a\tb\n1\tx\n"
    for sql in (
        "DROP TABLE tailguard.requests",
        "INSERT INTO tailguard.requests (request_id) VALUES ('x')",
        "ALTER TABLE tailguard.requests DELETE WHERE 1",
    ):
        p = tg("sql", sql, "--store", str(store), check=False)
        assert p.returncode == 1
        assert "164" in p.stderr
    rows = _sql_json(store, "SELECT count() AS n FROM tailguard.requests FINAL")
    assert rows == [{"n": replay["requests"]}]


def test_capacity_without_a_worker(built: tuple[Path, dict[str, Any]]) -> None:
    store, _ = built
    out = json.loads(
        tg("capacity", "--store", str(store), "--p99-ms", "600", "--qps", "50", "--json").stdout
    )
    assert out["boundary"] == "ttft_engine_ms"
    assert out["models"]
    sized = [m for m in out["models"] if m["per_instance_rps"]]
    assert sized, out
    for m in sized:
        chosen = next(lv for lv in m["levels"] if lv["concurrency"] == m["chosen_concurrency"])
        assert chosen["holds_target"]
        assert chosen["p99_ms"] <= 600
        assert chosen["requests"] >= 100
        # nothing eligible has a higher throughput
        assert all(
            lv["throughput_rps"] <= chosen["throughput_rps"]
            for lv in m["levels"]
            if lv["holds_target"] and lv["requests"] >= 100
        )
        ((need,),) = [[x["instances"]] for x in m["instances_needed"]]
        assert need == -(-50 // (m["per_instance_rps"] * 0.7))
    text = tg("capacity", "--store", str(store), "--p99-ms", "600").stdout
    assert "instances" in text


ODD = "SELECT 'two\nlines' AS a, 'tab\there' AS b, 'back\\\\slash \\\\N' AS c, NULL AS d, '' AS e"


def test_sql_defaults_to_the_stores_database_and_speaks_plainly(
    built: tuple[Path, dict[str, Any]],
) -> None:
    store, replay = built
    rows = _sql_json(store, "SELECT count() AS n FROM requests FINAL")
    assert rows == [{"n": replay["requests"]}]
    # the user's own FORMAT: the engine's bytes in that format
    out = tg("sql", "SELECT count() AS n FROM requests FINAL FORMAT JSONEachRow", "--store",
             str(store)).stdout  # fmt: skip
    assert json.loads(out) == {"n": str(replay["requests"])} or json.loads(out) == {
        "n": replay["requests"]
    }
    # errors: one line, the engine's words, no client URL, no appended FORMAT
    for sql in ("SELEC 1", "SELECT nope FROM requests", "SELECT 1 FORMAT JSON FORMAT CSV"):
        p = tg("sql", sql, "--store", str(store), check=False)
        assert p.returncode == 1
        err = p.stderr.strip()
        assert err.startswith("tailguard sql: "), err
        for leak in ("\n", "127.0.0.1", "FORMAT Native", "formatQuerySingleLine", "Traceback"):
            assert leak not in err, err
    # TSV: odd values stay on their row and read back as the JSON output has them
    from pipeline.app.sql import parse_tsv

    tsv = tg("sql", ODD, "--store", str(store), "--format", "tsv").stdout
    assert tsv.count("\n") == 2
    as_json = _sql_json(store, ODD)
    names, rows = parse_tsv(tsv)
    assert [dict(zip(names, r, strict=True)) for r in rows] == as_json
    assert as_json[0]["a"] == "two\nlines"
    assert as_json[0]["c"] == "back\\slash \\N"


@pytest.mark.parametrize("sql", ESCAPES)
def test_sql_refuses_what_is_not_the_stores(built: tuple[Path, dict[str, Any]], sql: str) -> None:
    store, _ = built
    p = tg("sql", sql.replace("{port}", "9"), "--store", str(store), check=False)
    assert p.returncode == 1
    assert re.search(r"\(code (164|62)\)", p.stderr), p.stderr
    for leak in ESCAPES_LEAK:
        assert leak not in p.stdout + p.stderr


REPORT_KEYS = {
    "requests", "by_source", "by_outcome", "boundaries", "slos", "open_windows", "control",
    "budget_events", "clock_skew", "filters", "series", "logical", "sources",
}  # fmt: skip
SLO_KEYS = {
    "kind", "objective", "total", "good", "compliance", "met", "budget_bad", "budget_allowed",
    "budget_remaining", "budget_basis", "budget_window", "burn_rate",
}  # fmt: skip
# with the SLO spec the windows were counted with: is each SLO's burn load-caused?
LOAD_KEYS = {"bad_measured", "bad_queue_share", "load"}


def test_report_json_carries_what_the_text_and_html_show(
    built: tuple[Path, dict[str, Any]],
) -> None:
    store, replay = built
    out = json.loads(tg("report", "--store", str(store), "--json").stdout)
    assert set(out) == REPORT_KEYS
    assert out["requests"] == replay["requests"]
    assert out["slos"]
    for slo in out["slos"].values():
        assert set(slo) == SLO_KEYS | (LOAD_KEYS if slo["kind"] == "slo" else set())
        assert set(slo["burn_rate"]) == {"5m", "1h"}
    # worst first: unmet SLOs before met ones, least budget left first among them
    met = [s["met"] for s in out["slos"].values()]
    assert met == sorted(met, key=lambda m: {False: 0, True: 1, None: 2}[m])
    # the control timeline and directives, the budget events, the chart series
    assert len(out["control"]) >= len(replay["control"])
    assert out["budget_events"]
    series = out["series"]
    assert set(series) == {
        "latency_p99_ms_per_minute", "breakdown_mean_ms_per_minute",
        "budget_remaining_per_minute", "burn_rate_5m_per_minute", "control_timeline",
        "bucket_s",
    }  # fmt: skip
    assert series["bucket_s"] == 60  # minutes of traffic: per minute
    assert out["sources"]["boundaries_counted"] == out["requests"]
    assert series["latency_p99_ms_per_minute"]["gateway_total_ms"]
    assert set(series["control_timeline"]) == {c["scope"] for c in replay["control"]}
    assert out["open_windows"]["requests_after"] == 0  # a replay closes every window


def test_text_report_filters_budgets_and_never_cuts_names(
    built: tuple[Path, dict[str, Any]],
) -> None:
    store, _ = built
    full = json.loads(tg("report", "--store", str(store), "--json").stdout)
    # a narrow terminal: names stay whole (cells fold, names do not)
    p = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "report", "--store", str(store)],
        check=True, cwd=REPO, capture_output=True, text=True, timeout=300,
        env=dict(os.environ, COLUMNS="80", TAILGUARD_SLO_SPEC=str(EXAMPLE_SLO_SPEC)),
    )  # fmt: skip
    assert "…" not in p.stdout
    for name in full["slos"]:
        assert name in p.stdout
    assert "budget left" in p.stdout
    assert "burn 1h" in p.stdout
    # the SLO table is in badness order
    rows = [line for line in p.stdout.splitlines() if any(n in line for n in full["slos"])]
    order = [next(n for n in full["slos"] if f" {n} " in line) for line in rows]
    assert order[: len(full["slos"])] == list(full["slos"])
    # filters: one SLO, one model, a time range
    one = next(iter(full["slos"]))
    only = json.loads(tg("report", "--store", str(store), "--json", "--slo", one).stdout)
    assert list(only["slos"]) == [one]
    model = next(iter(full["series"]["control_timeline"]))
    per_model = json.loads(tg("report", "--store", str(store), "--json", "--model", model).stdout)
    assert 0 < per_model["requests"] < full["requests"]
    times = [t for t, _ in full["series"]["latency_p99_ms_per_minute"]["gateway_total_ms"]]
    mid = times[len(times) // 2]
    early = json.loads(tg("report", "--store", str(store), "--json", "--until", mid).stdout)
    late = json.loads(tg("report", "--store", str(store), "--json", "--since", mid).stdout)
    assert early["requests"] + late["requests"] == full["requests"]
    assert early["filters"]["until"] == mid.replace("Z", "+00:00")
    assert all(t < mid for t, _ in early["series"]["latency_p99_ms_per_minute"]["gateway_total_ms"])
    bad = tg("report", "--store", str(store), "--since", "yesterday", check=False)
    assert bad.returncode == 2
    assert "not a time" in bad.stderr
