"""``tailguard statement`` on a replayed hour: three tenants, an overload, three cold starts.

The store is built as an operator would: the simulator's events (one hour of the shared
trace from 2026-11-03 09:00 UTC, arrivals x2 from minute 20 to 30, three engine
restarts) written to JSON Lines and ``tailguard replay``ed into an embedded store with
the example SLO spec (the replay writes the control audit and the budget events).
Each tenant's statement is then checked against an exact computation over the events
themselves (records built per request id, no join), the credit against the formula
over the replay's own level transitions, the exemptions against the cap, and
``--verify`` against the store before and after one request row is altered.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import math
import re
import shutil
import subprocess
import sys
import zoneinfo
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson
import pytest

from pipeline.cli import DEFAULT_TRACE
from pipeline.contract.codec import SourceRef, decode_message, encode_event
from pipeline.contract.events import EngineFinished, GatewayCompleted, GatewayReceived
from pipeline.core.record import RequestRecord, build_record
from pipeline.core.slo import SLOMatcher
from pipeline.spec.contract import load_contract_file, period_bounds_ns
from producers.simulator.model import OverloadEpisode, SimConfig, Simulator
from producers.simulator.trace import read_trace
from tests.integration.harness import REPO
from tests.integration.test_tools_cli import chromium, tg

pytestmark = [pytest.mark.integration, pytest.mark.long(65)]

START_NS = int(dt.datetime(2026, 11, 3, 9, 0, tzinfo=dt.UTC).timestamp()) * 1_000_000_000
TENANTS = ("tenant-a", "tenant-b", "tenant-c")
RESTARTS = (
    ("llama-3-8b-0", 300_000.0),
    ("llama-3-70b-1", 900_000.0),
    ("llama-3-8b-1", 1_500_000.0),
)
CONTRACT = REPO / "specs" / "contract-example.yaml"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("statement")
    events = tmp / "events.jsonl"
    cfg = SimConfig(
        start_unix_ns=START_NS,
        seed=7,
        tenants=(("tenant-a", 4.0), ("tenant-b", 2.0), ("tenant-c", 1.0)),
        engine_restarts=RESTARTS,
        overload=OverloadEpisode(start_offset_s=1200, end_offset_s=1800, factor=2),
    )
    with events.open("wb") as fh:
        for e in Simulator(read_trace(DEFAULT_TRACE), cfg).events():
            fh.write(encode_event(e) + b"\n")
    store = tmp / "store"
    # the example spec with hourly windows: a 30-day budget is projected over its whole
    # window (docs/budgets.md), so one fresh hour spends none; an hourly one the overload
    # spends, which the billing pauses and incidents below need
    hourly = tmp / "slo-hourly.yaml"
    hourly.write_text(
        (REPO / "specs" / "slo-example.yaml").read_text()
        .replace("window: {rolling: 30d}", "window: {rolling: 1h}")
        .replace("window: {calendar: month}", "window: {rolling: 1h}")
    )  # fmt: skip
    replay = json.loads(
        tg("replay", str(events), "--store", str(store), "--slo", str(hourly), "--json").stdout
    )
    assert replay["control"], "the overload should move the control level"
    assert any(e["kind"] == "budget_exhausted" for e in replay["budget_events"])
    # the same contract without billing pauses: the credit is the levels' alone
    no_pause = tmp / "contract-no-pause.yaml"
    no_pause.write_text(
        CONTRACT.read_text()
        .replace("pause_billing: true", "pause_billing: false")
        .replace("slo_spec: slo-example.yaml", f"slo_spec: {REPO / 'specs' / 'slo-example.yaml'}")
    )
    return {"tmp": tmp, "events": events, "store": store, "replay": replay, "no_pause": no_pause,
            "spec": hourly}  # fmt: skip


def exact_records(events: Path) -> list[RequestRecord]:
    """One record per request id straight from the events (the simulator never retries)."""
    parts: dict[str, list[Any]] = defaultdict(lambda: [None, None, None])
    with events.open("rb") as fh:
        for n, line in enumerate(fh):
            for e in decode_message(line, SourceRef("file", 0, n)).events:
                if isinstance(e, GatewayReceived):
                    parts[e.request_id][0] = e
                elif isinstance(e, GatewayCompleted):
                    parts[e.request_id][1] = e
                elif isinstance(e, EngineFinished):
                    parts[e.request_id][2] = e
    return [build_record(rid, *p) for rid, p in parts.items() if p[1] or p[2]]


def statement(store: Path, tenant: str, contract: Path = CONTRACT, *extra: str) -> dict[str, Any]:
    out = tg(
        "statement", "--store", str(store), "--tenant", tenant, "--period", "2026-11",
        "--contract", str(contract), "--json", *extra,
    ).stdout  # fmt: skip
    doc: dict[str, Any] = orjson.loads(out)
    return doc


def nearest_rank(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[math.ceil(p / 100 * len(ordered)) - 1]


def test_counts_equal_an_exact_computation_over_the_events(built: dict[str, Any]) -> None:
    loaded = load_contract_file(CONTRACT)
    spec, c = loaded.spec, loaded.contract
    tz = zoneinfo.ZoneInfo(c.billing.timezone)
    cap = c.exemptions.cold_starts.max_per_day  # type: ignore[union-attr]
    records = exact_records(built["events"])
    starts_seen = set()
    over_cap = 0
    for tenant in TENANTS:
        st = statement(built["store"], tenant)
        mine = [r for r in records if r.tenant == tenant]
        assert st["requests"] == len(mine) > 1000
        # cold starts: (engine, start) of this tenant's marked requests; first `cap` a day
        episodes = sorted(
            {(r.cold_start_unix_ns, r.engine_host) for r in mine if r.cold_start_unix_ns}
        )
        starts_seen |= set(episodes)
        by_day: dict[dt.date, int] = defaultdict(int)
        exempt_eps = set()
        for at, host in episodes:
            day = dt.datetime.fromtimestamp(at / 1e9, tz=tz).date()
            by_day[day] += 1
            if by_day[day] <= cap:
                exempt_eps.add((at, host))
        exempt = [r for r in mine if (r.cold_start_unix_ns, r.engine_host) in exempt_eps]
        counted = [r for r in mine if (r.cold_start_unix_ns, r.engine_host) not in exempt_eps]
        assert len(st["exempted"]) == len(exempt)
        assert {(x["request_id"], x["attempt"]) for x in st["exempted"]} == {
            (r.request_id, 1) for r in exempt
        }
        assert st["counted"] == len(counted)
        for day, n_day in by_day.items():  # never more exempted cold starts a day than the cap
            n = sum(x["exempted"] for x in st["cold_starts"] if x["day"] == day.isoformat())
            assert n == min(cap, n_day) <= cap
        over_cap += sum(not x["exempted"] for x in st["cold_starts"])
        for name in c.slos:
            slo = spec.slo(name)
            verdicts = [SLOMatcher(slo).classify(r) for r in counted]
            good, bad = verdicts.count("good"), verdicts.count("bad")
            got = st["slos"][name]
            assert (got["total"], got["good"]) == (good + bad, good), (tenant, name)
            assert got["met"] == (good / (good + bad) >= slo.objective)
            values = [
                v
                for r, v_ in zip(counted, verdicts, strict=True)
                if v_ != "skip" and (v := r.boundary(slo.boundary)) is not None
            ]
            assert st["percentiles"][name]["period"] == nearest_rank(values, 99.0)
            assert st["percentiles"][name]["n"] == len(values)
        tier = spec.tiers["blended"]
        prim, sec = SLOMatcher(spec.slo(tier.primary)), SLOMatcher(spec.slo(tier.secondary))
        in_prim = [r for r in counted if prim.classify(r) != "skip"]
        good_p = sum(prim.classify(r) == "good" for r in in_prim)
        good_s = sum(prim.classify(r) == "bad" and sec.classify(r) == "good" for r in in_prim)
        t = st["tiers"]["blended"]
        assert (t["total"], t["good_primary"], t["good_secondary_only"]) == (
            len(in_prim), good_p, good_s,
        )  # fmt: skip
        print(tenant, {n: (s["total"], s["good"]) for n, s in st["slos"].items()},
              "exempted", len(exempt), "cold starts", len(episodes))  # fmt: skip
    assert len(starts_seen) == len(RESTARTS), "every restart is one cold start"
    assert over_cap > 0, "the third cold start of the day is over the cap of 2"


def _credit(
    transitions: list[dict[str, Any]],
    *,
    pauses: list[tuple[int, int]],
    fees: dict[int, float],
    start_ms: int,
    end_ms: int,
    until_ms: int,
) -> tuple[float, dict[int, int]]:
    """The documented formula, by brute force over the transitions' instants."""
    points = sorted(
        {start_ms, until_ms, *(t["at_ms"] for t in transitions if t["at_ms"] < until_ms)}
    )
    ms_at: dict[int, int] = defaultdict(int)
    credit = 100.0 * sum(b - a for a, b in pauses) / (end_ms - start_ms)
    for a, b in itertools.pairwise(points):
        if a < start_ms:
            continue
        levels: dict[str, int] = {}
        for t in transitions:  # in order: the latest at or before a wins per scope
            if t["at_ms"] <= a:
                levels[t["scope"]] = t["level"]
        level = max(levels.values(), default=0)
        paused = sum(max(0, min(b, y) - max(a, x)) for x, y in pauses)
        ms_at[level] += b - a
        credit += -fees.get(level, 0.0) * (b - a - paused) / (end_ms - start_ms)
    return credit, ms_at


@pytest.mark.parametrize("paused", [False, True])
def test_credit_follows_the_formula_from_the_level_timeline(
    built: dict[str, Any], paused: bool
) -> None:
    contract = CONTRACT if paused else built["no_pause"]
    c = load_contract_file(contract).contract
    st = statement(built["store"], "tenant-b", contract)
    a_ns, b_ns = period_bounds_ns("2026-11", c.billing.timezone)
    start_ms, end_ms = a_ns // 1_000_000, b_ns // 1_000_000
    transitions = [
        {"at_ms": t["ts_unix_ns"] // 1_000_000, "scope": t["scope"], "level": t["level"]}
        for t in built["replay"]["control"]
    ]
    transitions.sort(key=lambda t: t["at_ms"])
    # observed until: the last request end of any tenant in the period (or audit row)
    all_ends = [r.end_unix_ns for r in exact_records(built["events"])]
    until_ms = max(max(all_ends) // 1_000_000, *(t["at_ms"] for t in transitions)) + 1
    assert st["inputs"]["observed_until_unix_ns"] // 1_000_000 + 1 == until_ms
    pauses: list[tuple[int, int]] = []
    if paused:
        for e in built["replay"]["budget_events"]:
            if e["kind"] == "budget_exhausted" and e["slo"] in c.slos:
                pauses.append((e["at_ms"], min(end_ms, e["at_ms"] + 24 * 3_600_000)))
        merged: list[tuple[int, int]] = []
        for x, y in sorted(pauses):
            if merged and x <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], y))
            else:
                merged.append((x, y))
        pauses = merged
        assert [(p["from_ms"], p["to_ms"]) for p in st["billing_pauses"]] == pauses
        assert pauses
    fees = {t.level: t.fee_change_percent for t in c.levels}
    want, ms_at = _credit(
        transitions, pauses=pauses, fees=fees, start_ms=start_ms, end_ms=end_ms, until_ms=until_ms
    )
    assert {int(k): v for k, v in st["levels"]["ms_at_level"].items() if v} == {
        k: v for k, v in ms_at.items() if v
    }
    assert st["credit_percent"] == pytest.approx(want, rel=1e-12, abs=1e-15)
    assert st["credit_percent"] > 0
    if not paused:
        assert sum(ms_at[k] for k in (1, 2, 3)) > 0, "the overload moved the level"
    print("credit", st["credit_percent"], "ms at level", dict(ms_at), "pauses", pauses)


def test_incidents_name_the_slo_the_shares_and_the_worst_requests(built: dict[str, Any]) -> None:
    st = statement(built["store"], "tenant-a")
    exhausted = [e for e in built["replay"]["budget_events"] if e["kind"] == "budget_exhausted"]
    bound = load_contract_file(CONTRACT).contract.slos
    assert len(st["incidents"]) == len([e for e in exhausted if e["slo"] in bound]) > 0
    for inc in st["incidents"]:
        assert inc["worst"], inc
        values = [w["value_ms"] for w in inc["worst"]]
        assert values == sorted(values, reverse=True)
        assert 0 <= inc["queue_share"] <= 1
        assert inc["queue_share"] + inc["compute_share"] == pytest.approx(1.0)
        assert inc["worst"][0]["explain"] == f"tailguard explain {inc['worst'][0]['request_id']}"
    text = tg(
        "statement", "--store", str(built["store"]), "--tenant", "tenant-a", "--period", "2026-11"
    ).stdout
    print(text)
    assert "Incidents (budget exhausted)" in text
    assert "Credit:" in text
    # the explain command an incident links to; a cold-start request says it was one
    worst = st["incidents"][0]["worst"][0]["request_id"]
    out = json.loads(tg("explain", worst, "--store", str(built["store"]), "--json").stdout)
    assert out["request_id"] == worst
    cold = st["exempted"][0]["request_id"]
    out = json.loads(tg("explain", cold, "--store", str(built["store"]), "--json").stdout)
    assert out["cold_start"] is not None
    assert out["cold_start"]["engine_host"] in {h for h, _ in RESTARTS}


def test_verify_passes_on_the_original_and_fails_when_one_row_is_altered(
    built: dict[str, Any], tmp_path: Path
) -> None:
    st = statement(built["store"], "tenant-c")
    saved = tmp_path / "statement.json"
    saved.write_bytes(orjson.dumps(st))
    ok = tg("statement", "--store", str(built["store"]), "--verify", str(saved))
    assert ok.stdout.startswith("ok:"), ok.stdout
    # the other side of the dispute replays the raw events into a store of its own
    theirs = tmp_path / "theirs"
    tg(
        "replay",
        str(built["events"]),
        "--store",
        str(theirs),
        "--slo",
        str(built["spec"]),
        "--json",
    )
    ok = tg("statement", "--store", str(theirs), "--verify", str(saved))
    assert ok.stdout.startswith("ok:"), ok.stdout
    # a copy of the store in which one of the tenant's request rows is altered (in a
    # process of its own: chDB hosts one engine path per process)
    altered = tmp_path / "altered"
    shutil.copytree(built["store"], altered, symlinks=True)  # the store links relatively
    rid = st["exempted"][0]["request_id"]  # exempted: no count changes, only the digest
    script = (
        "from pipeline.adapters.store import open_store\n"
        "from pipeline.settings import Settings\n"
        f"s = open_store(Settings(store_dir={str(altered)!r}))\n"
        's.command("ALTER TABLE tailguard.requests UPDATE queue_ms = queue_ms + 1 "\n'
        f"          \"WHERE request_id = '{rid}' SETTINGS mutations_sync = 2\")\n"
        "s.close()\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, cwd=REPO, timeout=300)
    bad = tg("statement", "--store", str(altered), "--verify", str(saved), check=False)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "MISMATCH" in bad.stderr
    assert "inputs.requests_digest" in bad.stderr
    # and a statement edited by hand fails on the original store
    forged = dict(st, credit_percent=st["credit_percent"] + 1)
    saved.write_bytes(orjson.dumps(forged))
    bad = tg("statement", "--store", str(built["store"]), "--verify", str(saved), check=False)
    assert bad.returncode == 1
    assert "credit_percent" in bad.stderr


def test_html_statement_is_self_contained_and_renders(
    built: dict[str, Any], tmp_path: Path
) -> None:
    page = tmp_path / "statement.html"
    tg(
        "statement", "--store", str(built["store"]), "--tenant", "tenant-a", "--period",
        "2026-11", "--html", str(page),
    )  # fmt: skip
    text = page.read_text()
    assert not re.search(r"""(src|href)=["']?https?:""", text), "the page must be self-contained"
    assert "<script" not in text
    url = page.resolve().as_uri()
    dom = chromium("--dump-dom", url, profile=tmp_path / "p1")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "Statement: tenant-a, 2026-11" in dom.stdout
    assert len(re.findall(r'<rect class="mark"', dom.stdout)) >= 1  # levels / pauses drawn
    shot = tmp_path / "statement.png"
    res = chromium(f"--screenshot={shot}", "--window-size=1100,1900", url, profile=tmp_path / "p2")
    assert res.returncode == 0, res.stderr[-2000:]
    assert shot.stat().st_size > 20_000
    print(f"screenshot: {shot}")
