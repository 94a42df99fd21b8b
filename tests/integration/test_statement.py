"""``tailguard statement`` on a replayed month: three tenants, an overload, three cold starts.

The store is built as an operator would: the simulator's events written to JSON Lines
and ``tailguard replay``ed into an embedded store (the replay writes the control audit
and the budget events). The month is three sessions of the shared trace, scaled down
(minutes, not hours), days apart, each with its own tenants:

* 2026-11-03 09:00 UTC, 15 min: tenants a, b, c; three engine restarts (cold starts);
* 2026-11-12 14:00 UTC, 15 min: tenants a and b only; arrivals x3 from minute 3 to 10;
* 2026-11-20 10:00 UTC, 10 min: tenants a and c.

The SLO spec is the example's with one-hour budget windows (so that the overload
exhausts budgets whatever the 30-day windows do). Each tenant's statement is then
checked against an exact computation over the events themselves (records built per
request id, no join): the counts, the credit against the formula over the replay's own
level transitions counted only in the minutes the tenant had traffic in the scope, the
incidents (the tenant's bad requests, never none), the exemptions against the cap, and
``--verify`` against the store, an edited statement, and an edited contract file.
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
from tests.measurement_fixtures import hourly_spec

pytestmark = [pytest.mark.integration, pytest.mark.long(45)]

DAY_NS = 86_400 * 1_000_000_000
TENANTS = ("tenant-a", "tenant-b", "tenant-c")
RESTARTS = (
    ("llama-3-8b-0", 120_000.0),
    ("llama-3-70b-1", 360_000.0),
    ("llama-3-8b-1", 600_000.0),
)
EXAMPLE = REPO / "specs" / "contract-example.yaml"


def _utc_ns(day: int, hour: int) -> int:
    return int(dt.datetime(2026, 11, day, hour, tzinfo=dt.UTC).timestamp()) * 1_000_000_000


# (start, minutes of the trace, tenants, restarts, overload)
SESSIONS = (
    (_utc_ns(3, 9), 15, (("tenant-a", 4.0), ("tenant-b", 2.0), ("tenant-c", 1.0)), RESTARTS,
     None),
    (_utc_ns(12, 14), 15, (("tenant-a", 4.0), ("tenant-b", 2.0)), (),
     OverloadEpisode(start_offset_s=180, end_offset_s=600, factor=3)),
    (_utc_ns(20, 10), 10, (("tenant-a", 4.0), ("tenant-c", 2.0)), (), None),
)  # fmt: skip
OVERLOAD_NS = (SESSIONS[1][0], SESSIONS[1][0] + 15 * 60 * 1_000_000_000)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("statement")
    events = tmp / "events.jsonl"
    trace = read_trace(DEFAULT_TRACE)
    with events.open("wb") as fh:
        for i, (start_ns, minutes, tenants, restarts, overload) in enumerate(SESSIONS):
            cfg = SimConfig(
                start_unix_ns=start_ns,
                seed=7 + i,
                tenants=tenants,
                engine_restarts=restarts,
                overload=overload,
                request_id_prefix=f"s{i}-",
            )
            part = [r for r in trace if r.arrival_offset_ms < minutes * 60_000]
            for e in Simulator(part, cfg).events():
                fh.write(encode_event(e) + b"\n")
    # the example spec with one-hour budget windows, and the example contract bound to it
    spec = tmp / "slo-1h.yaml"
    spec.write_text(hourly_spec(REPO / "specs" / "slo-example.yaml"))
    contract = tmp / "contract.yaml"
    contract.write_text(
        EXAMPLE.read_text().replace("slo_spec: slo-example.yaml", f"slo_spec: {spec}")
    )
    store = tmp / "store"
    replay = json.loads(
        tg("replay", str(events), "--store", str(store), "--slo", str(spec), "--json").stdout
    )
    assert replay["control"], "the overload should move the control level"
    assert any(e["kind"] == "budget_exhausted" for e in replay["budget_events"])
    # the same contract without billing pauses: the credit is the levels' alone
    no_pause = tmp / "contract-no-pause.yaml"
    no_pause.write_text(contract.read_text().replace("pause_billing: true", "pause_billing: false"))
    return {
        "tmp": tmp, "events": events, "store": store, "replay": replay, "contract": contract,
        "no_pause": no_pause, "records": exact_records(events),
    }  # fmt: skip


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


_STATEMENTS: dict[tuple[str, str, str], dict[str, Any]] = {}


def statement(store: Path, tenant: str, contract: Path) -> dict[str, Any]:
    """The tenant's November statement under the contract (one subprocess per triple)."""
    key = (str(store), tenant, str(contract))
    if key not in _STATEMENTS:
        out = tg(
            "statement", "--store", str(store), "--tenant", tenant, "--period", "2026-11",
            "--contract", str(contract), "--json",
        ).stdout  # fmt: skip
        _STATEMENTS[key] = orjson.loads(out)
    return _STATEMENTS[key]


def nearest_rank(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[math.ceil(p / 100 * len(ordered)) - 1]


def counted_records(
    records: list[RequestRecord], tenant: str, contract: Path
) -> tuple[list[RequestRecord], list[RequestRecord], list[tuple[int, str | None]]]:
    """The tenant's records split into (counted, exempted) by the documented cold-start
    rule (the first ``max_per_day`` cold starts a day, contract time zone), and its cold
    starts."""
    c = load_contract_file(contract).contract
    tz = zoneinfo.ZoneInfo(c.billing.timezone)
    cap = c.exemptions.cold_starts.max_per_day  # type: ignore[union-attr]
    mine = [r for r in records if r.tenant == tenant]
    episodes = sorted(
        {(r.cold_start_unix_ns, r.engine_host) for r in mine if r.cold_start_unix_ns},
        key=lambda e: (e[0], e[1] or ""),
    )
    by_day: dict[dt.date, int] = defaultdict(int)
    exempt_eps = set()
    for at, host in episodes:
        day = dt.datetime.fromtimestamp(at / 1e9, tz=tz).date()
        by_day[day] += 1
        if by_day[day] <= cap:
            exempt_eps.add((at, host))
    exempt = [r for r in mine if (r.cold_start_unix_ns, r.engine_host) in exempt_eps]
    counted = [r for r in mine if (r.cold_start_unix_ns, r.engine_host) not in exempt_eps]
    return counted, exempt, episodes  # type: ignore[return-value]


def test_counts_equal_an_exact_computation_over_the_events(built: dict[str, Any]) -> None:
    loaded = load_contract_file(built["contract"])
    spec, c = loaded.spec, loaded.contract
    tz = zoneinfo.ZoneInfo(c.billing.timezone)
    cap = c.exemptions.cold_starts.max_per_day  # type: ignore[union-attr]
    records = built["records"]
    starts_seen: set[Any] = set()
    over_cap = 0
    for tenant in TENANTS:
        st = statement(built["store"], tenant, built["contract"])
        mine = [r for r in records if r.tenant == tenant]
        assert st["requests"] == len(mine) > 1000
        counted, exempt, episodes = counted_records(records, tenant, built["contract"])
        starts_seen |= set(episodes)
        assert len(st["exempted"]) == len(exempt)
        assert {(x["request_id"], x["attempt"]) for x in st["exempted"]} == {
            (r.request_id, 1) for r in exempt
        }
        assert st["counted"] == len(counted)
        by_day: dict[str, int] = defaultdict(int)
        for at, _host in episodes:
            by_day[dt.datetime.fromtimestamp(at / 1e9, tz=tz).date().isoformat()] += 1
        for day, n_day in by_day.items():  # never more exempted cold starts a day than the cap
            n = sum(x["exempted"] for x in st["cold_starts"] if x["day"] == day)
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


def _tenant_exhaustions(
    built: dict[str, Any], tenant: str, contract: Path
) -> tuple[list[tuple[int, str, list[RequestRecord]]], list[tuple[int, str]]]:
    """The bound SLOs' exhaustions in November split by the documented rule: the
    tenant's (with its counted bad records in the hour before) and the others."""
    loaded = load_contract_file(contract)
    counted, _, _ = counted_records(built["records"], tenant, contract)
    a_ns, b_ns = period_bounds_ns("2026-11", loaded.contract.billing.timezone)
    mine, others = [], []
    for e in built["replay"]["budget_events"]:
        if e["kind"] != "budget_exhausted" or e["slo"] not in loaded.contract.slos:
            continue
        if not a_ns // 1_000_000 <= e["at_ms"] < b_ns // 1_000_000:
            continue
        classify = SLOMatcher(loaded.spec.slo(e["slo"])).classify
        hi = e["at_ms"] * 1_000_000
        bad = [
            r for r in counted if hi - 3_600 * 10**9 <= r.end_unix_ns <= hi and classify(r) == "bad"
        ]
        if bad:
            mine.append((e["at_ms"], e["slo"], bad))
        else:
            others.append((e["at_ms"], e["slo"]))
    return sorted(mine, key=lambda x: x[:2]), sorted(others)


def _credit(
    transitions: list[dict[str, Any]],
    *,
    active: set[tuple[str, int]],
    pauses: list[tuple[int, int]],
    fees: dict[int, float],
    start_ms: int,
    end_ms: int,
    until_ms: int,
) -> tuple[float, dict[int, int]]:
    """The documented formula by brute force over every transition instant and minute
    edge: a scope's level counts in a minute in which the tenant had a request of the
    scope's model in flight (``active``: (model, minute)); ``*`` / ``fleet``: any model."""
    minutes = {m for _, m in active}
    points = sorted(
        {start_ms, until_ms}
        | {t["at_ms"] for t in transitions if start_ms < t["at_ms"] < until_ms}
        | {x for m in minutes for x in (m * 60_000, (m + 1) * 60_000) if start_ms < x < until_ms}
    )
    ms_at: dict[int, int] = defaultdict(int)
    credit = 100.0 * sum(b - a for a, b in pauses) / (end_ms - start_ms)
    for a, b in itertools.pairwise(points):
        levels: dict[str, int] = {}
        for t in transitions:  # in order: the latest at or before a wins per scope
            if t["at_ms"] <= a:
                levels[t["scope"]] = t["level"]
        minute = a // 60_000
        live = [
            lv
            for scope, lv in levels.items()
            if (scope in ("*", "fleet") and minute in minutes) or (scope, minute) in active
        ]
        level = max(live, default=0)
        paused = sum(max(0, min(b, y) - max(a, x)) for x, y in pauses)
        ms_at[level] += b - a
        credit += -fees.get(level, 0.0) * (b - a - paused) / (end_ms - start_ms)
    return credit, ms_at


@pytest.mark.parametrize(
    ("tenant", "paused"),
    [("tenant-a", False), ("tenant-b", True), ("tenant-c", False), ("tenant-c", True)],
)
def test_credit_counts_levels_only_while_the_tenant_had_traffic_in_the_scope(
    built: dict[str, Any], tenant: str, paused: bool
) -> None:
    contract = built["contract"] if paused else built["no_pause"]
    c = load_contract_file(contract).contract
    st = statement(built["store"], tenant, contract)
    a_ns, b_ns = period_bounds_ns("2026-11", c.billing.timezone)
    start_ms, end_ms = a_ns // 1_000_000, b_ns // 1_000_000
    transitions = [
        {"at_ms": t["ts_unix_ns"] // 1_000_000, "scope": t["scope"], "level": t["level"]}
        for t in built["replay"]["control"]
    ]
    transitions.sort(key=lambda t: t["at_ms"])
    # observed until: the last request end of any tenant in the period (or audit row)
    all_ends = [r.end_unix_ns for r in built["records"]]
    until_ms = max(max(all_ends) // 1_000_000, *(t["at_ms"] for t in transitions)) + 1
    assert st["inputs"]["observed_until_unix_ns"] // 1_000_000 + 1 == until_ms
    # the tenant's traffic: (model, minute) of every minute one of its requests was in flight
    active = set()
    for r in built["records"]:
        if r.tenant == tenant:
            lo, hi = r.ts_unix_ns // 60_000_000_000, r.end_unix_ns // 60_000_000_000
            active |= {(r.model, m) for m in range(min(lo, hi), hi + 1)}
    pauses: list[tuple[int, int]] = []
    if paused:
        mine, _ = _tenant_exhaustions(built, tenant, contract)
        for at_ms, _slo, _bad in mine:
            pauses.append((at_ms, min(end_ms, at_ms + 24 * 3_600_000)))
        merged: list[tuple[int, int]] = []
        for x, y in sorted(pauses):
            if merged and x <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], y))
            else:
                merged.append((x, y))
        pauses = merged
        assert [(p["from_ms"], p["to_ms"]) for p in st["billing_pauses"]] == pauses
    fees = {t.level: t.fee_change_percent for t in c.levels}
    want, ms_at = _credit(
        transitions, active=active, pauses=pauses, fees=fees, start_ms=start_ms,
        end_ms=end_ms, until_ms=until_ms,
    )  # fmt: skip
    got = {int(k): v for k, v in st["levels"]["ms_at_level"].items()}
    assert {k: v for k, v in got.items() if v} == {k: v for k, v in ms_at.items() if v}
    assert st["credit_percent"] == pytest.approx(want, rel=1e-12, abs=1e-15)
    # the service's levels (traffic or not) are reported beside, and are more
    service = {int(k): v for k, v in st["levels"]["ms_at_level_service"].items()}
    assert sum(service[k] for k in (1, 2, 3)) > sum(got[k] for k in (1, 2, 3))
    # no level time of this tenant lies outside its traffic: none in the overload
    # session for tenant-c, which sent nothing then; some for tenant-a
    in_overload = sum(
        min(t["to_ms"], OVERLOAD_NS[1] // 10**6) - max(t["from_ms"], OVERLOAD_NS[0] // 10**6)
        for t in st["levels"]["timeline"]
        if t["from_ms"] < OVERLOAD_NS[1] // 10**6 and t["to_ms"] > OVERLOAD_NS[0] // 10**6
    )
    if tenant == "tenant-c":
        assert in_overload == 0
        lo, hi = OVERLOAD_NS[0] // 10**6, OVERLOAD_NS[1] // 10**6
        assert not [p for p in st["billing_pauses"] if lo <= p["from_ms"] < hi]
    else:
        assert in_overload > 0
    print(tenant, "credit", st["credit_percent"], "ms at level", dict(ms_at), "service",
          service, "pauses", pauses)  # fmt: skip


def test_incidents_are_the_tenants_own_bad_requests(built: dict[str, Any]) -> None:
    contract = built["contract"]
    n_incidents = 0
    for tenant in TENANTS:
        st = statement(built["store"], tenant, contract)
        mine, others = _tenant_exhaustions(built, tenant, contract)
        assert [(i["at_ms"], i["slo"]) for i in st["incidents"]] == [(a, s) for a, s, _ in mine]
        assert [(o["at_ms"], o["slo"]) for o in st["budget_exhausted_not_this_tenant"]] == [*others]
        for inc, (_, _, bad) in zip(st["incidents"], mine, strict=True):
            assert inc["bad_requests"] == len(bad) > 0
            assert {w["request_id"] for w in inc["worst"]} <= {r.request_id for r in bad}
            values = [w["value_ms"] for w in inc["worst"]]
            assert values == sorted(values, reverse=True)
            if inc["queue_share"] is not None:
                assert 0 <= inc["queue_share"] <= 1
                assert inc["queue_share"] + inc["compute_share"] == pytest.approx(1.0)
            assert (
                inc["worst"][0]["explain"] == f"tailguard explain {inc['worst'][0]['request_id']}"
            )
        n_incidents += len(st["incidents"])
        if tenant == "tenant-c":  # it sent nothing during the overload
            assert all(not OVERLOAD_NS[0] // 10**6 <= i["at_ms"] < OVERLOAD_NS[1] // 10**6
                       for i in st["incidents"])  # fmt: skip
            assert st["budget_exhausted_not_this_tenant"]
    assert n_incidents > 0
    st = statement(built["store"], "tenant-a", contract)
    text = tg(
        "statement", "--store", str(built["store"]), "--tenant", "tenant-a", "--period",
        "2026-11", "--contract", str(contract),
    ).stdout  # fmt: skip
    print(text)
    assert "Incidents (budget exhausted)" in text
    assert "Credit:" in text
    assert " 0 bad requests" not in text
    # the explain command an incident links to; a cold-start request says it was one
    worst = st["incidents"][0]["worst"][0]["request_id"]
    out = json.loads(tg("explain", worst, "--store", str(built["store"]), "--json").stdout)
    assert out["request_id"] == worst
    cold = st["exempted"][0]["request_id"]
    out = json.loads(tg("explain", cold, "--store", str(built["store"]), "--json").stdout)
    assert out["cold_start"] is not None
    assert out["cold_start"]["engine_host"] in {h for h, _ in RESTARTS}


def test_verify_uses_the_recorded_contract_and_fails_on_any_edit(
    built: dict[str, Any], tmp_path: Path
) -> None:
    # made with a contract of its own (not the shipped example): verify needs no file
    st = statement(built["store"], "tenant-c", built["contract"])
    recorded = st["inputs"]["contract"]
    assert recorded["content"] == built["contract"].read_text()
    assert st["inputs"]["slo_spec"]["content"].count("rolling: 1h") >= 7
    saved = tmp_path / "statement.json"
    saved.write_bytes(orjson.dumps(st))
    ok = tg("statement", "--store", str(built["store"]), "--verify", str(saved))
    assert ok.stdout.startswith("ok:"), ok.stdout + ok.stderr
    assert "the contract and SLO spec it records" in ok.stdout
    # with the same files named: still ok
    ok = tg(
        "statement", "--store", str(built["store"]), "--verify", str(saved),
        "--contract", str(built["contract"]),
    )  # fmt: skip
    assert ok.stdout.startswith("ok:"), ok.stdout + ok.stderr
    # the contract file edited after the fact: verified with the recorded one (the
    # statement matches), and the file is named as not the one it was made with
    edited = tmp_path / "contract.yaml"
    edited.write_text(
        built["contract"].read_text().replace("fee_change_percent: -20", "fee_change_percent: -25")
    )
    bad = tg(
        "statement", "--store", str(built["store"]), "--verify", str(saved),
        "--contract", str(edited), check=False,
    )  # fmt: skip
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert bad.stdout.startswith("ok:"), bad.stdout
    assert "MISMATCH" not in bad.stderr
    assert "DIFFERS" in bad.stderr
    [line] = [x for x in bad.stderr.splitlines() if x.strip().startswith("contract:")]
    assert str(edited) in line
    assert recorded["digest"] in line
    assert not [x for x in bad.stderr.splitlines() if x.strip().startswith("slo_spec:")]
    # the other side of the dispute replays the raw events into a store of its own
    theirs = tmp_path / "theirs"
    spec = st["inputs"]["slo_spec"]["file"]
    tg("replay", str(built["events"]), "--store", str(theirs), "--slo", spec, "--json")
    ok = tg("statement", "--store", str(theirs), "--verify", str(saved))
    assert ok.stdout.startswith("ok:"), ok.stdout + ok.stderr
    # a copy of the store in which one of the tenant's request rows is altered (in a
    # process of its own: chDB hosts one engine path per process)
    altered = tmp_path / "altered"
    shutil.copytree(built["store"], altered, symlinks=True)  # the store links relatively
    rid = (
        st["exempted"][0]["request_id"]
        if st["exempted"]
        else st["incidents"][0]["worst"][0]["request_id"]
    )
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
    # a statement edited by hand fails on the original store
    for forged, where in (
        (dict(st, credit_percent=st["credit_percent"] + 1), "credit_percent"),
        (dict(st, incidents=st["incidents"][1:]), "incidents"),
    ):
        saved.write_bytes(orjson.dumps(forged))
        bad = tg("statement", "--store", str(built["store"]), "--verify", str(saved), check=False)
        assert bad.returncode == 1
        assert where in bad.stderr
    # and one whose recorded contract was edited (content no longer its digest)
    inputs = dict(st["inputs"])
    inputs["contract"] = dict(recorded, content=edited.read_text())
    saved.write_bytes(orjson.dumps(dict(st, inputs=inputs)))
    bad = tg("statement", "--store", str(built["store"]), "--verify", str(saved), check=False)
    assert bad.returncode == 1
    assert "inputs.contract: the recorded content is not the recorded digest" in bad.stderr


def test_versions_2_3_and_4_say_the_same_and_each_verifies(
    built: dict[str, Any], tmp_path: Path
) -> None:
    """Version 4 (counted in the engine), version 3 (columns read without records,
    digested as columns) and version 2 (the records, every field digested) of the same
    statement: the same numbers, each its own digest; a version 2 or 3 statement (issued
    before version 4) still verifies."""
    out = tmp_path / "all.json"
    script = (
        "import orjson\n"
        "from pipeline.adapters.store import open_store\n"
        "from pipeline.app.statement import build_statement\n"
        "from pipeline.settings import Settings\n"
        "from pipeline.spec.contract import load_contract_file\n"
        f"s = open_store(Settings(store_dir={str(built['store'])!r}))\n"
        f"c = load_contract_file({str(built['contract'])!r})\n"
        "docs = [build_statement(s, c, 'tenant-c', '2026-11', version=v).to_json()\n"
        "        for v in (2, 3, 4)]\n"
        f"open({str(out)!r}, 'wb').write(orjson.dumps(docs))\n"
        "s.close()\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, cwd=REPO, timeout=600)
    v2, v3, v4 = orjson.loads(out.read_bytes())
    assert (v2["statement_version"], v3["statement_version"], v4["statement_version"]) == (2, 3, 4)
    assert len({d["inputs"]["requests_digest"] for d in (v2, v3, v4)}) == 3
    cli = dict(statement(built["store"], "tenant-c", built["contract"]))
    cli.pop("generated_at")  # (the command's, not the statement's)
    assert v4 == cli, sorted(k for k in v4.keys() | cli.keys() if v4.get(k) != cli.get(k))
    for doc in (v2, v3, v4):
        doc.pop("statement_version")
        doc["inputs"].pop("requests_digest")
    assert v2 == v3 == v4
    assert v4["requests"] > 0
    assert v4["incidents"] or v4["exempted"]  # something beyond the counts to agree on
    for k in (0, 1):  # the version 2 and 3 statements, as issued
        saved = tmp_path / f"v{k + 2}.json"
        saved.write_bytes(orjson.dumps(orjson.loads(out.read_bytes())[k]))
        ok = tg("statement", "--store", str(built["store"]), "--verify", str(saved))
        assert ok.stdout.startswith("ok:"), ok.stdout + ok.stderr


def test_html_statement_is_self_contained_and_renders(
    built: dict[str, Any], tmp_path: Path
) -> None:
    page = tmp_path / "statement.html"
    tg(
        "statement", "--store", str(built["store"]), "--tenant", "tenant-a", "--period",
        "2026-11", "--contract", str(built["contract"]), "--html", str(page),
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
