"""Contracts (kind: Contract) and statements (pipeline/core/statement.py): table-driven,
hand-set records, hypothesis for the exemption cap; cold-start marks at their sources."""

from __future__ import annotations

import datetime as dt
import shutil
import zoneinfo
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgspec
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.contract.events import EngineFinished
from pipeline.core.record import RequestRecord, build_record
from pipeline.core.statement import (
    BudgetEventRow,
    LevelChange,
    Statement,
    compute_statement,
    nearest_rank,
    records_digest,
)
from pipeline.spec.contract import (
    Contract,
    load_contract,
    load_contract_file,
    period_bounds_ns,
    validate_contract_file,
)
from pipeline.spec.loader import SpecError
from pipeline.spec.slo import SLOSpec, load_spec
from producers.simulator.model import SimConfig, Simulator
from producers.simulator.trace import TraceRequest
from tests.factories import completed, finished, received
from tests.paths import SPECS

UTC_NOV_NS = int(dt.datetime(2026, 11, 1, tzinfo=dt.UTC).timestamp()) * 1_000_000_000
HOUR_NS = 3_600 * 1_000_000_000
DAY_NS = 24 * HOUR_NS
NOV_MS = 30 * 24 * 3_600_000

SPEC = load_spec(
    """
apiVersion: tailguard/v1
kind: SLOSpec
slos:
  - {name: total, boundary: gateway_total_ms, threshold_ms: 400, objective: 0.9}
  - {name: compute, boundary: inference_ms, threshold_ms: 250, objective: 0.5}
tiers:
  blended: {primary: total, secondary: compute, secondary_weight: 0.7, objective: 0.6}
"""
)


def contract(**over: Any) -> Contract:
    doc: dict[str, Any] = {
        "apiVersion": "tailguard/v1",
        "kind": "Contract",
        "tenants": ["acme", "other"],
        "slo_spec": "spec.yaml",
        "slos": ["total", "compute"],
        "billing": {"period": "month", "timezone": "UTC"},
        "breach": {"percentile": 99.0, "per": "day", "severe_above": 1.2, "max_breaches": 3},
        "levels": [
            {"level": 1, "fee_change_percent": -20.0, "notify_customer": True},
            {"level": 2, "fee_change_percent": -40.0, "notify_customer": True},
            {"level": 3, "fee_change_percent": -60.0, "notify_customer": False},
        ],
        "exemptions": {"cold_starts": {"max_per_day": 2}},
    }
    doc.update(over)
    return Contract.model_validate(doc)


# A joined request of tenant acme on engine m-0 of model m: 100 ms at the gateway, 78 ms of
# inference after 10 ms queued, no cold start.
_BASE = msgspec.structs.replace(
    build_record("x", received("x"), completed("x"), finished("x")),
    tenant="acme", model="m", engine_host="m-0", gateway_total_ms=100.0, inference_ms=78.0,
    queue_ms=10.0, cold_start_unix_ns=None,
)  # fmt: skip


def rec(rid: str, t_ns: int, *, took_ms: int = 1, **fields: Any) -> RequestRecord:
    """Request ``rid`` of :data:`_BASE`, ended at ``t_ns`` after ``took_ms``; ``fields``:
    the record's fields that differ."""
    return msgspec.structs.replace(
        _BASE, request_id=rid, ts_unix_ns=t_ns - took_ms * 1_000_000, end_unix_ns=t_ns, **fields
    )


def statement(
    records: list[RequestRecord],
    c: Contract | None = None,
    changes: list[LevelChange] | None = None,
    events: list[BudgetEventRow] | None = None,
    until_ns: int | None = None,
) -> Statement:
    return compute_statement(
        tenant="acme",
        period="2026-11",
        contract=c or contract(),
        spec=SPEC,
        records=records,
        level_changes=changes or [],
        budget_events=events or [],
        observed_until_ns=until_ns,
        inputs={},
    )


# --------------------------------------------------------------------------- #
# The contract spec
# --------------------------------------------------------------------------- #


def test_the_example_contract_validates_against_its_slo_spec() -> None:
    ok, message = validate_contract_file(SPECS / "contract-example.yaml")
    assert ok, message
    loaded = load_contract_file(SPECS / "contract-example.yaml")
    c = loaded.contract
    assert [t.fee_change_percent for t in c.levels] == [-20, -40, -60]  # the documents'
    assert [t.notify_customer for t in c.levels] == [True, True, False]
    assert c.breach.max_breaches == 3
    assert c.breach.severe_above == 1.2
    assert c.exemptions.cold_starts is not None
    assert c.exemptions.cold_starts.max_per_day == 2
    assert c.budget_exhausted.pause_billing
    assert c.budget_exhausted.incident_report
    assert loaded.spec_path.name == "slo-example.yaml"
    assert loaded.contract_digest.startswith("sha256:")
    assert loaded.spec_digest.startswith("sha256:")


BAD = [
    ("tenants: [acme, acme]", "tenants[1]", "duplicate 'acme'", 5),
    ("slos: [total, nope]", "slos[1]", "unknown SLO 'nope'", 7),
    ("billing: {timezone: Mars/Base}", "billing.timezone", "unknown time zone", 8),
    ("levels: [{level: 1, fee_change_percent: 20}]", "levels[0].fee_change_percent", "", 8),
    ("levels: [{level: 4, fee_change_percent: -20}]", "levels[0].level", "", 8),
    (
        "levels: [{level: 1, fee_change_percent: -20}, {level: 1, fee_change_percent: -30}]",
        "levels[1].level",
        "given twice",
        8,
    ),
    ("breach: {severe_above: 0.5}", "breach.severe_above", "", 8),
    ("breach: {per: week}", "breach.per", "", 8),
    ("exemptions: {cold_starts: {max_per_day: -1}}", "exemptions.cold_starts.max_per_day", "", 8),
    (
        "exemptions: {maintenance: [{start: 2026-11-02T00:00:00Z, end: 2026-11-01T00:00:00Z,"
        " reason: x}]}",
        "exemptions.maintenance[0].end",
        "after start",
        8,
    ),
    (
        "exemptions: {maintenance: [{start: '2026-11-02 00:00', end: '2026-11-03 00:00',"
        " reason: x}]}",
        "exemptions.maintenance[0].start",
        "time zone offset",
        8,
    ),
    ("budget_exhausted: {pause_for: soon}", "budget_exhausted.pause_for", "", 8),
    ("refunds: yes", "refunds", "unknown field", 8),
]


@pytest.mark.parametrize(("extra", "path", "words", "line"), BAD)
def test_a_bad_contract_names_the_field_and_its_line(
    tmp_path: Path, extra: str, path: str, words: str, line: int
) -> None:
    head = [
        "apiVersion: tailguard/v1",
        "kind: Contract",
        "slo_spec: spec.yaml",
        "description: test",
        "tenants: [acme]",
        "",
        "slos: [total]",
    ]
    key = extra.split(":", 1)[0]
    lines = [ln for ln in head if not ln.startswith(f"{key}:")]
    if key in ("tenants", "slos"):
        lines.insert(4 if key == "tenants" else 6, extra)
    else:
        lines.append(extra)
    text = "\n".join(lines) + "\n"
    with pytest.raises(SpecError) as err:
        load_contract(text, "c.yaml", SPEC)
    issues = {i.path: i for i in err.value.errors}
    assert path in issues, str(err.value)
    assert words in issues[path].message
    assert issues[path].line == line, str(err.value)
    # and through the file loader, which resolves slo_spec next to the contract
    (tmp_path / "c.yaml").write_text(text)
    (tmp_path / "spec.yaml").write_text(
        (SPECS / "slo-example.yaml").read_text().replace("tier1-gateway", "total")
    )
    ok, message = validate_contract_file(tmp_path / "c.yaml")
    assert not ok
    assert path in message


def test_a_missing_slo_spec_file_is_a_spec_error(tmp_path: Path) -> None:
    shutil.copy(SPECS / "contract-example.yaml", tmp_path / "c.yaml")
    ok, message = validate_contract_file(tmp_path / "c.yaml")
    assert not ok
    assert "slo-example.yaml" in message
    assert "cannot read" in message


@pytest.mark.parametrize(
    ("period", "tz", "hours"),
    [
        ("2026-11", "UTC", 720),
        ("2026-10", "Europe/Berlin", 745),  # the clocks go back on 25 October
        ("2026-03", "Europe/Berlin", 743),  # and forward on 29 March
        ("2026-12", "America/New_York", 744),  # across the year end
    ],
)
def test_a_period_is_a_calendar_month_in_the_contracts_zone(
    period: str, tz: str, hours: int
) -> None:
    a, b = period_bounds_ns(period, tz)
    assert (b - a) == hours * HOUR_NS
    start = dt.datetime.fromtimestamp(a / 1e9, tz=zoneinfo.ZoneInfo(tz))
    assert (start.day, start.hour, start.minute) == (1, 0, 0)


@pytest.mark.parametrize("bad", ["2026-13", "2026-1", "26-11", "2026/11", ""])
def test_a_bad_period_is_an_error(bad: str) -> None:
    with pytest.raises(ValueError, match="YYYY-MM"):
        period_bounds_ns(bad, "UTC")


@pytest.mark.parametrize(
    ("values", "p", "expected"),
    [
        ([], 99, None),
        ([5.0], 99, 5.0),
        ([float(i) for i in range(1, 101)], 99, 99.0),  # ceil(0.99 * 100) = 99th
        ([float(i) for i in range(1, 201)], 99, 198.0),
        ([float(i) for i in range(1, 102)], 99, 100.0),  # ceil(99.99) = 100th
        ([3.0, 1.0, 2.0], 50, 2.0),
    ],
)
def test_nearest_rank(values: list[float], p: float, expected: float | None) -> None:
    assert nearest_rank(values, p) == expected


# --------------------------------------------------------------------------- #
# Counts, breaches
# --------------------------------------------------------------------------- #


def test_counts_are_per_tenant_and_period_and_met_follows_the_objective() -> None:
    day = UTC_NOV_NS + 2 * DAY_NS
    records = [
        rec("a", day, gateway_total_ms=100),
        rec("b", day, gateway_total_ms=500, inference_ms=300),
        rec("c", day, gateway_total_ms=400, inference_ms=250),  # equality is good
        rec("d", day, tenant="other", gateway_total_ms=900),  # another tenant
        rec("e", UTC_NOV_NS - 1, gateway_total_ms=900),  # October
        rec("f", UTC_NOV_NS + 30 * DAY_NS, gateway_total_ms=900),  # December
    ]
    s = statement(records)
    assert s.requests == 3
    assert (s.slos["total"].total, s.slos["total"].good) == (3, 2)
    assert s.slos["total"].met is False  # 2/3 < 0.9
    assert (s.slos["compute"].total, s.slos["compute"].good) == (3, 2)
    assert s.slos["compute"].met is True  # 2/3 >= 0.5


def test_a_blended_tier_credits_the_secondary_by_its_weight() -> None:
    day = UTC_NOV_NS + 2 * DAY_NS
    records = [
        rec("a", day, gateway_total_ms=100),  # primary good
        rec("b", day, gateway_total_ms=500, inference_ms=200),  # secondary only: 0.7
        rec("c", day, gateway_total_ms=500, inference_ms=300),  # neither
    ]
    t = statement(records).tiers["blended"]
    assert (t.total, t.good_primary, t.good_secondary_only) == (3, 1, 1)
    assert t.compliance == pytest.approx((1 + 0.7) / 3)
    assert t.met is False  # 0.567 < 0.6
    # a tier whose secondary the contract does not bind is left out
    assert statement(records, contract(slos=["total"])).tiers == {}


def test_empty_period_is_not_met_nor_missed() -> None:
    s = statement([])
    assert s.slos["total"] == replace(s.slos["total"], total=0, compliance=None, met=None)
    assert s.breaches == ()
    assert s.breach_rule.within is True


@pytest.mark.parametrize(
    ("p99_by_day", "breaches", "severe", "within"),
    [
        ({1: 300.0, 2: 390.0}, 0, 0, True),
        ({1: 401.0, 2: 480.0, 3: 300.0}, 2, 0, True),  # 480 = 1.2 x 400: not above
        ({1: 401.0, 2: 420.0, 3: 430.0, 4: 440.0}, 4, 0, False),  # more than 3
        ({1: 481.0}, 1, 1, False),  # severe
    ],
)
def test_breaches_are_days_whose_p99_is_above_target(
    p99_by_day: dict[int, float], breaches: int, severe: int, within: bool
) -> None:
    records = []
    for day, p99 in p99_by_day.items():
        t = UTC_NOV_NS + day * DAY_NS
        records += [rec(f"{day}-{i}", t + i, gateway_total_ms=100.0) for i in range(98)]
        # nearest rank: of 100 values the 99th smallest is the P99
        records += [rec(f"{day}-x{i}", t + 99 + i, gateway_total_ms=p99) for i in range(2)]
    s = statement(records)
    got = [b for b in s.breaches if b.slo == "total"]
    assert len(got) == breaches
    assert sum(b.severe for b in got) == severe
    assert s.breach_rule.within is within
    for b in got:
        assert b.p_ms == p99_by_day[int(b.day[-2:]) - 1]


# --------------------------------------------------------------------------- #
# Exemptions
# --------------------------------------------------------------------------- #


def test_cold_starts_beyond_the_daily_cap_are_not_exempted() -> None:
    day = UTC_NOV_NS + 4 * DAY_NS
    starts = [day + HOUR_NS, day + 2 * HOUR_NS, day + 3 * HOUR_NS, day + DAY_NS + HOUR_NS]
    records = []
    for k, s0 in enumerate(starts):
        records += [
            rec(f"c{k}-{i}", s0 + i * 1000, gateway_total_ms=9000, cold_start_unix_ns=s0)
            for i in range(3)
        ]
    records.append(rec("warm", day, gateway_total_ms=100))
    s = statement(records)
    assert [c.exempted for c in s.cold_starts] == [True, True, False, True]
    assert [c.nth_of_day for c in s.cold_starts] == [1, 2, 3, 1]
    assert len(s.exempted) == 9
    assert s.counted == 4  # the third cold start of day 5 and the warm request
    assert s.slos["total"].total == 4
    assert s.slos["total"].good == 1
    assert all(x.reason.startswith("cold start:") for x in s.exempted)
    assert s.exempted_by_reason == {"cold start": 9}


def test_maintenance_windows_exempt_and_take_precedence_over_cold_starts() -> None:
    day = UTC_NOV_NS + 9 * DAY_NS
    c = contract(
        exemptions={
            "cold_starts": {"max_per_day": 1},
            "maintenance": [
                {
                    "start": dt.datetime.fromtimestamp(day / 1e9, tz=dt.UTC),
                    "end": dt.datetime.fromtimestamp((day + HOUR_NS) / 1e9, tz=dt.UTC),
                    "reason": "driver upgrade",
                }
            ],
        }
    )
    records = [
        rec("in", day + 10, gateway_total_ms=5000),
        rec("edge", day + HOUR_NS, gateway_total_ms=5000),  # end is exclusive
        rec("cold", day + 20, gateway_total_ms=5000, cold_start_unix_ns=day),
    ]
    s = statement(records, c)
    assert {x.request_id: x.reason for x in s.exempted} == {
        "in": "maintenance: driver upgrade",
        "cold": "maintenance: driver upgrade",
    }
    assert s.cold_starts[0].exempted_requests == 0


@settings(max_examples=60, deadline=None)
@given(
    cap=st.integers(min_value=0, max_value=3),
    starts=st.lists(
        st.tuples(st.integers(0, 4), st.integers(0, 86_399), st.sampled_from(["e0", "e1"])),
        max_size=12,
    ),
    sizes=st.lists(st.integers(1, 4), min_size=12, max_size=12),
)
def test_exemptions_never_exceed_the_cap(
    cap: int, starts: list[tuple[int, int, str]], sizes: list[int]
) -> None:
    records = []
    expected_days: dict[int, list[tuple[int, str]]] = {}
    for k, (day, sec, host) in enumerate(starts):
        at = UTC_NOV_NS + day * DAY_NS + sec * 1_000_000_000
        for i in range(sizes[k]):
            records.append(rec(f"{k}-{i}", at + i, cold_start_unix_ns=at, engine_host=host))
        expected_days.setdefault(day, []).append((at, host))
    s = statement(records, contract(exemptions={"cold_starts": {"max_per_day": cap}}))
    per_day: dict[str, int] = {}
    for c in s.cold_starts:
        per_day[c.day] = per_day.get(c.day, 0) + c.exempted
    assert all(n <= cap for n in per_day.values())
    distinct = {(at, host) for d in expected_days.values() for at, host in d}
    want = sum(
        min(cap, len({x for x in distinct if (x[0] - UTC_NOV_NS) // DAY_NS == d}))
        for d in expected_days
    )
    assert sum(c.exempted for c in s.cold_starts) == want
    exempted_ids = {x.request_id for x in s.exempted}
    assert len(exempted_ids) == sum(c.exempted_requests for c in s.cold_starts)
    assert s.counted + len(exempted_ids) == len(records)


# --------------------------------------------------------------------------- #
# Levels, pauses, credit
# --------------------------------------------------------------------------- #


def _ms(day: int, minute: int) -> int:
    return UTC_NOV_NS // 1_000_000 + day * 86_400_000 + minute * 60_000


def busy(model: str, from_ms: int, to_ms: int, tenant: str = "acme") -> list[RequestRecord]:
    """One request of ``tenant`` on ``model`` ending in each minute of [from, to)."""
    return [
        rec(f"{tenant}-{model}-{t}", (t + 30_000) * 1_000_000, model=model, tenant=tenant)
        for t in range(from_ms, to_ms, 60_000)
    ]


def test_credit_is_fee_change_times_time_at_the_highest_level_of_the_scopes() -> None:
    changes = [
        LevelChange("m1", _ms(1, 0), 1, 1),  # m1 L1 for 60 min
        LevelChange("m1", _ms(1, 60), 2, 0),
        LevelChange("m2", _ms(1, 30), 1, 2),  # m2 L2 from minute 30 to 90
        LevelChange("m2", _ms(1, 90), 2, 0),
        LevelChange("m1", _ms(0, 0) - 86_400_000, 0, 3),  # October, then back to 0 ...
        LevelChange("m1", _ms(0, 0) - 1000, 0, 0),  # ... before the period: level 0
    ]
    traffic = busy("m1", _ms(1, 0), _ms(1, 120)) + busy("m2", _ms(1, 0), _ms(1, 120))
    s = statement(traffic, changes=changes, until_ns=None)
    at = s.levels.ms_at_level
    assert (at[1], at[2], at[3]) == (30 * 60_000, 60 * 60_000, 0)
    assert s.levels.ms_at_level_service == at
    want = (20 * 30 * 60_000 + 40 * 60 * 60_000) / NOV_MS
    assert s.credit_percent == pytest.approx(want, rel=1e-12)
    assert [(t.level, t.scopes) for t in s.levels.timeline] == [
        (1, ("m1",)),
        (2, ("m2",)),
    ]


def test_a_level_held_into_the_period_counts_from_its_start_until_observed() -> None:
    changes = [LevelChange("m1", _ms(0, 0) - 60_000, 1, 3)]  # L3 since before the period
    until = (_ms(0, 0) + 10 * 60_000) * 1_000_000
    s = statement(busy("m1", _ms(0, 0), _ms(0, 11)), changes=changes, until_ns=until)
    assert s.levels.ms_at_level[3] == 10 * 60_000 + 1  # observed_until is inclusive
    assert s.levels.timeline[0].notify_customer is False  # L3: not notified


def test_only_the_contracts_models_count() -> None:
    changes = [LevelChange("m1", _ms(2, 0), 1, 1), LevelChange("m2", _ms(2, 0), 1, 3)]
    traffic = busy("m1", _ms(2, 0), _ms(2, 11)) + busy("m2", _ms(2, 0), _ms(2, 11))
    s = statement(
        traffic, contract(models=["m1"]), changes=changes, until_ns=_ms(2, 10) * 1_000_000
    )
    assert s.levels.ms_at_level[3] == 0
    assert s.levels.ms_at_level[1] == 10 * 60_000 + 1


@pytest.mark.parametrize(("pause_for", "paused_min"), [("period", None), ("2h", 120)])
def test_budget_exhaustion_pauses_billing_and_opens_an_incident(
    pause_for: str, paused_min: int | None
) -> None:
    at = _ms(3, 0)
    c = contract(budget_exhausted={"pause_for": pause_for, "worst_requests": 2})
    t = at * 1_000_000
    records = [
        rec("slow", t - 10 * 60 * 10**9, gateway_total_ms=900, queue_ms=700, inference_ms=150),
        rec("slower", t - 5 * 60 * 10**9, gateway_total_ms=1900, queue_ms=1500, inference_ms=350),
        rec("fine", t - 60 * 10**9, gateway_total_ms=100),
        rec("old", t - 2 * HOUR_NS, gateway_total_ms=5000),  # before the 1 h lookback
        *busy("m1", at - HOUR_NS // 1_000_000, at + HOUR_NS // 1_000_000),  # fine ones
    ]
    changes = [LevelChange("m1", at - 30 * 60_000, 1, 1), LevelChange("m1", at + 30 * 60_000, 2, 0)]
    events = [
        BudgetEventRow("total", "budget_exhausted", at),
        BudgetEventRow("total", "budget_80pct_consumed", at - 60_000),
        BudgetEventRow("unbound", "budget_exhausted", at),  # not an SLO of the contract
    ]
    s = statement(records, c, changes, events, until_ns=(at + HOUR_NS // 1_000_000) * 1_000_000)
    [pause] = s.billing_pauses
    end_ms = at + (paused_min * 60_000 if paused_min else 0)
    assert pause.from_ms == at
    assert pause.to_ms == (end_ms if paused_min else _ms(30, 0))
    paused = pause.to_ms - at
    # L1 for 60 min, of which the last 30 are paused (billing paused: the whole fee)
    want = 100 * paused / NOV_MS + 20 * 30 * 60_000 / NOV_MS
    assert s.credit_percent == pytest.approx(want, rel=1e-12)
    [inc] = s.incidents
    assert (inc.slo, inc.boundary, inc.bad_requests) == ("total", "gateway_total_ms", 2)
    assert inc.queue_share == pytest.approx(2200 / (2200 + 500))
    assert [w.request_id for w in inc.worst] == ["slower", "slow"]
    assert inc.worst[0].explain == "tailguard explain slower"


# The statement's JSON form (``statement --json``, what ``--verify`` reads back): its keys
# in this order, each nested value as written below.
STATEMENT_KEYS = [
    "statement_version", "tenant", "period", "timezone", "period_start", "period_end",
    "requests", "counted", "slos", "tiers", "percentiles", "breaches", "breach_rule",
    "levels", "billing_pauses", "credit", "credit_percent", "cold_starts", "exempted",
    "exempted_by_reason", "incidents", "budget_exhausted_not_this_tenant", "inputs",
]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "want"),
    [
        # L1 on m1 for an hour around the exhaustion; the tenant's traffic on m1 in three
        # minutes of it (the last one billing paused); observed until an hour after it
        (("levels", "ms_at_level"),
         {"0": _ms(3, 60) + 1 - _ms(0, 0) - 180_000, "1": 180_000, "2": 0, "3": 0}),
        (("levels", "timeline", 0, "from"), "2026-11-03T23:50:00.000+00:00"),
        (("levels", "timeline", 0, "to_ms"), _ms(3, -9)),
        (("levels", "timeline", 2, "scopes"), ["m1"]),
        (("billing_pauses",), [{"from": "2026-11-04T00:00:00.000+00:00",
                                "to": "2026-11-04T02:00:00.000+00:00",
                                "from_ms": _ms(3, 0), "to_ms": _ms(3, 120)}]),
        (("credit", "levels", 0), {"level": 1, "fee_change_percent": -20.0, "ms": 120_000,
                                   "credit_percent": 20 * 120_000 / NOV_MS}),
        (("incidents", 0, "worst", 1, "request_id"), "slow"),
        (("percentiles", "total", "days"), {"2026-11-03": {"p": 1900.0, "n": 2},
                                            "2026-11-04": {"p": 100.0, "n": 1}}),
        (("breaches", 0, "day"), "2026-11-03"),
        (("breach_rule", "within"), False),  # that breach is severe
        (("inputs",), {"store_database": "x"}),
    ],
)  # fmt: skip
def test_the_json_form_names_every_field_as_the_statement_did(
    path: tuple[str | int, ...], want: Any
) -> None:
    at = _ms(3, 0)
    t = at * 1_000_000
    records = [
        rec("slow", t - 570 * 10**9, model="m1", gateway_total_ms=900, queue_ms=700),
        rec("slower", t - 270 * 10**9, model="m1", gateway_total_ms=1900, queue_ms=1500),
        rec("later", t + 90 * 10**9, model="m1", gateway_total_ms=100),
    ]
    changes = [LevelChange("m1", at - 30 * 60_000, 1, 1), LevelChange("m1", at + 30 * 60_000, 2, 0)]
    st_ = compute_statement(
        tenant="acme", period="2026-11", records=records, level_changes=changes,
        contract=contract(budget_exhausted={"pause_for": "2h"}),
        spec=SPEC, budget_events=[BudgetEventRow("total", "budget_exhausted", at)],
        observed_until_ns=t + HOUR_NS, inputs={"store_database": "x"},
    ).to_json()  # fmt: skip
    assert list(st_) == STATEMENT_KEYS
    assert orjson.loads(orjson.dumps(st_)) == st_  # lists, string keys: as read back
    got: Any = st_
    for step in path:
        got = got[step]
    assert got == want


def test_unknown_tenant_is_an_error() -> None:
    with pytest.raises(ValueError, match="not covered"):
        compute_statement(
            tenant="nobody", period="2026-11", contract=contract(), spec=SPEC, records=[],
            level_changes=[], budget_events=[], observed_until_ns=None, inputs={},
        )  # fmt: skip


def test_records_digest_changes_with_any_field() -> None:
    a = [rec("a", UTC_NOV_NS), rec("b", UTC_NOV_NS)]
    assert records_digest(a) == records_digest(list(reversed(a)))
    b = [a[0], msgspec.structs.replace(a[1], queue_ms=10.000001)]
    assert records_digest(a) != records_digest(b)


# --------------------------------------------------------------------------- #
# Cold starts at their sources
# --------------------------------------------------------------------------- #


def test_the_record_carries_the_engines_cold_start_mark() -> None:
    fin = finished("r").model_copy(update={"cold_start_unix_ns": 123})
    assert build_record("r", received("r"), completed("r"), fin).cold_start_unix_ns == 123
    assert build_record("r", received("r"), completed("r"), None).cold_start_unix_ns is None


def _sim(restarts: tuple[tuple[str, float], ...]) -> list[EngineFinished]:
    trace = [TraceRequest(float(i * 100), 200, 20) for i in range(600)]  # 60 s, 10 req/s
    cfg = SimConfig(
        start_unix_ns=UTC_NOV_NS,
        engine_restarts=restarts,
        engine_skew_max_ms=0.0,
        cold_start_load_ms=8_000.0,
        cold_start_window_ms=5_000.0,
    )
    return [e for e in Simulator(trace, cfg).events() if isinstance(e, EngineFinished)]


def test_simulator_marks_requests_of_a_restarted_engine_during_its_cold_start() -> None:
    assert all(e.cold_start_unix_ns is None for e in _sim(()))
    evs = _sim((("llama-3-8b-0", 20_000.0),))
    cold = [e for e in evs if e.cold_start_unix_ns is not None]
    assert cold, "requests routed to the loading engine are marked"
    assert {e.host for e in cold} == {"llama-3-8b-0"}
    assert {e.cold_start_unix_ns for e in cold} == {UTC_NOV_NS + 20_000 * 1_000_000}
    for e in cold:  # reached it after the restart and before the load + window ended
        assert UTC_NOV_NS + 20_000 * 10**6 <= e.arrival_unix_ns < UTC_NOV_NS + 33_000 * 10**6
    # nothing was admitted while the weights loaded
    loaded_at = UTC_NOV_NS + 28_000 * 1_000_000
    for e in cold:
        scheduled = e.arrival_unix_ns + int(e.queue_ms * 1e6)
        assert scheduled >= loaded_at - 1
    warm = [e for e in evs if e.host == "llama-3-8b-0" and e.cold_start_unix_ns is None]
    assert any(e.arrival_unix_ns >= UTC_NOV_NS + 33_000 * 10**6 for e in warm)


def test_simulator_rejects_a_restart_of_an_unknown_engine() -> None:
    with pytest.raises(ValueError, match="unknown engine host"):
        SimConfig(start_unix_ns=UTC_NOV_NS, engine_restarts=(("gpu-9", 1.0),))


def test_the_vllm_recorder_marks_requests_in_the_engines_first_seconds() -> None:
    from producers.vllm_stats import EngineRecorder
    from tests.gateway_fixtures import MemorySink
    from tests.unit.test_vllm_stats import WALL, Clock, Finished, FinishReason, Iteration

    sink = MemorySink()
    start_ns = int((WALL - 10.0) * 1e9)
    rec_ = EngineRecorder(
        sink, model="m", host="gpu/engine0", wall_clock_s=Clock(WALL), monotonic_s=Clock(1.0),
        cold_start_window_ms=10_000, started_unix_ns=start_ns,
    )  # fmt: skip
    # Finished's request arrived 0.5 s before WALL: 9.5 s after the start -> cold
    rec_.record(None, Iteration(finished_requests=[Finished(FinishReason.STOP)]))
    late = EngineRecorder(
        sink, model="m", host="gpu/engine0", wall_clock_s=Clock(WALL), monotonic_s=Clock(1.0),
        cold_start_window_ms=9_000, started_unix_ns=start_ns,
    )  # fmt: skip
    late.record(None, Iteration(finished_requests=[Finished(FinishReason.STOP)]))
    off = EngineRecorder(sink, model="m", host="gpu/engine0", wall_clock_s=Clock(WALL))
    off.record(None, Iteration(finished_requests=[Finished(FinishReason.STOP)]))
    marks = [e.cold_start_unix_ns for e in sink.events if isinstance(e, EngineFinished)]
    assert marks == [start_ns, None, None]


def test_spec_is_an_slospec() -> None:
    assert isinstance(SPEC, SLOSpec)


def test_validate_command_knows_the_contract_kind(tmp_path: Path) -> None:
    from pipeline.cli import main

    assert main(["validate", str(SPECS / "contract-example.yaml")]) == 0
    broken = tmp_path / "c.yaml"
    broken.write_text(
        (SPECS / "contract-example.yaml")
        .read_text()
        .replace("slo_spec: slo-example.yaml", f"slo_spec: {SPECS / 'slo-example.yaml'}")
        .replace("max_breaches: 3", "max_breaches: many")
    )
    assert main(["validate", str(broken)]) == 1


@settings(max_examples=80, deadline=None)
@given(
    changes=st.lists(
        st.tuples(st.sampled_from(["m1", "m2", "m3"]), st.integers(-5, 40), st.integers(0, 3)),
        max_size=15,
    ),
    until=st.integers(1, 45),
)
def test_time_at_each_level_equals_a_minute_by_minute_count(
    changes: list[tuple[str, int, int]], until: int
) -> None:
    rows = [LevelChange(s, _ms(0, m), i, lv) for i, (s, m, lv) in enumerate(changes)]
    st_ = statement([], changes=rows, until_ns=_ms(0, until) * 1_000_000 - 1_000_000)
    want = dict.fromkeys(range(4), 0)
    for minute in range(until):  # the level in force at each minute's start
        levels: dict[str, int] = {}
        for s_, m, lv in sorted(changes, key=lambda c: c[1]):  # stable: seq order
            if m <= minute:
                levels[s_] = lv
        want[max(levels.values(), default=0)] += 60_000
    got = dict(st_.levels.ms_at_level_service)
    assert got == want
    # the tenant had no traffic: none of it is the tenant's
    assert st_.levels.ms_at_level == {0: until * 60_000, 1: 0, 2: 0, 3: 0}
    assert st_.credit_percent == 0.0


@pytest.mark.parametrize(("lookback", "bad"), [("1h", 1), ("3h", 2), ("period", 3)])
def test_an_incident_looks_back_as_the_contract_says(lookback: str, bad: int) -> None:
    at = _ms(3, 0)
    t = at * 1_000_000
    records = [
        rec("a", t - 30 * 60 * 10**9, gateway_total_ms=900),
        rec("b", t - 2 * HOUR_NS, gateway_total_ms=900),
        rec("c", t - DAY_NS, gateway_total_ms=900),
        rec("d", t + 1, gateway_total_ms=900),  # after: not the incident's
    ]
    c = contract(budget_exhausted={"lookback": lookback})
    s = statement(records, c, events=[BudgetEventRow("total", "budget_exhausted", at)])
    assert s.incidents[0].bad_requests == bad


# --------------------------------------------------------------------------- #
# Levels count for a tenant only while it had traffic in the scope
# --------------------------------------------------------------------------- #

_L1_M1_L3_M2 = [  # minutes 0..60 of Nov 2: m1 at L1, m2 at L3
    LevelChange("m1", _ms(1, 0), 1, 1),
    LevelChange("m1", _ms(1, 60), 2, 0),
    LevelChange("m2", _ms(1, 0), 1, 3),
    LevelChange("m2", _ms(1, 60), 2, 0),
]


@pytest.mark.parametrize(
    ("records", "changes", "want_ms"),
    [
        pytest.param(busy("m1", _ms(1, 0), _ms(1, 60)), _L1_M1_L3_M2, {1: 60, 3: 0},
                     id="traffic only on m1: m2's L3 is not the tenant's"),
        pytest.param(busy("m1", _ms(1, 0), _ms(1, 60)) + busy("m2", _ms(1, 10), _ms(1, 20)),
                     _L1_M1_L3_M2, {1: 50, 3: 10}, id="m2 for ten minutes: L3 for ten"),
        pytest.param(busy("m1", _ms(1, 0), _ms(1, 60)) + busy("m2", _ms(1, 0), _ms(1, 60), "other"),
                     _L1_M1_L3_M2, {1: 60, 3: 0}, id="another tenant's traffic is not its"),
        pytest.param([], _L1_M1_L3_M2, {1: 0, 3: 0}, id="no traffic: no level"),
        pytest.param(busy("m9", _ms(1, 0), _ms(1, 30)),
                     [LevelChange("*", _ms(1, 0), 1, 2), LevelChange("*", _ms(1, 60), 2, 0)],
                     {2: 30}, id="a fleet scope holds for any model"),
        pytest.param([rec("long", (_ms(1, 5) + 10_000) * 1_000_000, model="m2", took_ms=190_000)],
                     _L1_M1_L3_M2, {3: 4}, id="a request in flight over 4 minutes: 4 minutes"),
        pytest.param([rec("skewed", (_ms(1, 5) + 10_000) * 1_000_000, model="m2",
                          took_ms=2 * 3_600_000)],
                     _L1_M1_L3_M2, {3: 1}, id="clocks 2 h apart: only the end's minute"),
    ],
)  # fmt: skip
def test_a_level_counts_only_while_the_tenant_had_traffic_in_its_scope(
    records: list[RequestRecord], changes: list[LevelChange], want_ms: dict[int, int]
) -> None:
    s = statement(records, changes=changes, until_ns=_ms(2, 0) * 1_000_000)
    got = {lvl: s.levels.ms_at_level[lvl] // 60_000 for lvl in want_ms}
    assert got == want_ms
    fees = {1: 20, 2: 40, 3: 60}
    want_credit = sum(fees[lv] * m * 60_000 for lv, m in want_ms.items()) / NOV_MS
    assert s.credit_percent == pytest.approx(want_credit, rel=1e-12, abs=1e-15)
    # the service's own levels are reported beside the tenant's, whatever its traffic
    assert s.levels.ms_at_level_service[3] == (
        60 * 60_000 if any(c.level == 3 for c in changes) else 0
    )


@settings(max_examples=80, deadline=None)
@given(
    changes=st.lists(
        st.tuples(st.sampled_from(["m1", "m2", "*"]), st.integers(-5, 40), st.integers(0, 3)),
        max_size=12,
    ),
    active=st.lists(st.tuples(st.sampled_from(["m1", "m2", "m3"]), st.integers(-3, 44)),
                    max_size=30),
)  # fmt: skip
def test_the_tenants_level_time_equals_a_minute_by_minute_count(
    changes: list[tuple[str, int, int]], active: list[tuple[str, int]]
) -> None:
    until = 40
    rows = [LevelChange(s, _ms(1, m), i, lv) for i, (s, m, lv) in enumerate(changes)]
    records = [
        rec(f"r{i}", (_ms(1, m) + 20_000) * 1_000_000, model=model)
        for i, (model, m) in enumerate(active)
    ]
    st_ = statement(records, changes=rows, until_ns=_ms(1, until) * 1_000_000 - 1_000_000)
    want = dict.fromkeys(range(4), 0)
    start = (_ms(1, 0) - _ms(0, 0)) // 60_000
    for minute in range(start + until):  # from the period's start
        m_rel = minute - start
        levels: dict[str, int] = {}
        for s_, m, lv in sorted(changes, key=lambda c: c[1]):
            if m <= m_rel:
                levels[s_] = lv
        live = {model for model, m in active if m == m_rel}
        mine = [lv for s_, lv in levels.items() if (s_ == "*" and live) or s_ in live]
        want[max(mine, default=0)] += 60_000
    assert st_.levels.ms_at_level == want


def test_an_exhaustion_without_bad_requests_of_the_tenant_is_not_its_incident() -> None:
    at = _ms(3, 0)
    t = at * 1_000_000
    records = [
        rec("fine", t - 60 * 10**9, gateway_total_ms=100),  # the tenant's: good
        rec("theirs", t - 60 * 10**9, gateway_total_ms=5000, tenant="other"),  # bad, not its
        rec("mine", t + HOUR_NS, gateway_total_ms=5000),  # bad, after the second exhaustion
    ]
    events = [
        BudgetEventRow("total", "budget_exhausted", at),
        BudgetEventRow("total", "budget_exhausted", at + HOUR_NS // 1_000_000 + 60_000),
    ]
    s = statement(records, events=events, until_ns=t + 2 * HOUR_NS)
    [inc] = s.incidents
    assert inc.at_ms == at + HOUR_NS // 1_000_000 + 60_000
    assert inc.bad_requests == 1
    assert [p.from_ms for p in s.billing_pauses] == [inc.at_ms]
    [other] = s.budget_exhausted_not_this_tenant
    assert (other.at_ms, other.slo) == (at, "total")
    assert "no counted bad request of this tenant" in other.why
    # and for the other tenant it is the other way round
    theirs = compute_statement(
        tenant="other", period="2026-11", contract=contract(), spec=SPEC, records=records,
        level_changes=[], budget_events=events, observed_until_ns=t + 2 * HOUR_NS, inputs={},
    )  # fmt: skip
    assert [i.at_ms for i in theirs.incidents] == [at]
    assert all(i.bad_requests > 0 for i in s.incidents + theirs.incidents)


# --------------------------------------------------------------------------- #
# The contract a statement records
# --------------------------------------------------------------------------- #


def test_the_recorded_contract_loads_as_the_files_did() -> None:
    from pipeline.spec.contract import load_recorded

    files = load_contract_file(SPECS / "contract-example.yaml")
    again = load_recorded(files.contract_text, files.spec_text)
    assert (again.contract_digest, again.spec_digest) == (files.contract_digest, files.spec_digest)
    assert again.contract == files.contract
    assert again.spec == files.spec


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (None, None),
        ("contract", "inputs.contract: the recorded content is not the recorded digest"),
        ("slo_spec", "inputs.slo_spec: the recorded content is not the recorded digest"),
    ],
)
def test_a_recorded_content_that_is_not_its_digest_is_named(
    edit: str | None, problem: str | None
) -> None:
    from pipeline.app.statement import recorded_contract

    files = load_contract_file(SPECS / "contract-example.yaml")
    inputs: dict[str, Any] = {
        "contract": {"digest": files.contract_digest, "content": files.contract_text},
        "slo_spec": {"digest": files.spec_digest, "content": files.spec_text},
    }
    if edit is not None:
        inputs[edit]["content"] += "\n# edited\n"
    loaded, problems = recorded_contract({"inputs": inputs})
    assert problems == (
        []
        if problem is None
        else [problem + f" {inputs[edit]['digest']} (the statement was edited)"]
    )  # type: ignore[index]
    assert loaded.contract == files.contract


def test_a_statement_without_recorded_content_is_refused() -> None:
    from pipeline.app.statement import recorded_contract

    with pytest.raises(TypeError, match="records no content"):
        recorded_contract({"inputs": {"contract": {"digest": "sha256:x"}, "slo_spec": {}}})
