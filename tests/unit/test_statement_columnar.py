"""The statement's columnar maths (pipeline/core/statement.py, issue 53) against the rules
applied record by record: SLO counts, tiers, percentiles per day and period, an
exhaustion's bad records, each record's day and the tenant's traffic slots, on messy
records (None and int values, ties, failures of every source, retries, time zones with
DST and odd offsets)."""

from __future__ import annotations

import datetime as dt
import zoneinfo
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.record import RequestRecord
from pipeline.core.slo import SLOMatcher
from pipeline.core.statement import (
    MAX_SPAN_MS,
    BudgetEventRow,
    _day,
    _scope_models,
    compute_statement,
    local_days,
    nearest_rank,
    traffic_intervals,
)
from pipeline.spec.contract import period_bounds_ns
from tests.unit.test_statement import SPEC, contract, rec

ZONES = ["UTC", "America/New_York", "Australia/Lord_Howe", "Asia/Kathmandu", "Pacific/Apia"]
# (also: a zone that fell back at 00:01 local, between two hours of UTC)
NOV_2026_NS = int(dt.datetime(2026, 11, 1, tzinfo=dt.UTC).timestamp()) * 1_000_000_000
MIN_NS = 60 * 1_000_000_000

_value = st.one_of(
    st.none(), st.sampled_from([0, 100, 250, 400, 401]), st.floats(0, 2_000, allow_nan=False)
)


@st.composite
def messy_record(draw: st.DrawFn, i: int) -> RequestRecord:
    # Oct 30 .. Dec 2 (UTC): some records fall outside the period in any zone
    end_ns = (
        NOV_2026_NS
        + draw(st.integers(-2 * 1440, 32 * 1440)) * MIN_NS
        + draw(st.integers(0, MIN_NS - 1))
    )
    return rec(
        f"r{draw(st.integers(0, 40))}",  # repeated ids: attempts of one request
        end_ns,
        took_ms=draw(st.sampled_from([0, 5, 59_000, 61_000, 3_600_001])),
        attempt=i,
        tenant=draw(st.sampled_from(["acme", "acme", "other", None])),
        model=draw(st.sampled_from(["m", "n"])),
        outcome=draw(st.sampled_from(["ok", "ok", "error", "timeout", "client_abort"])),
        source=draw(st.sampled_from(["joined", "gateway_only", "engine_only"])),
        superseded=draw(st.booleans()),
        gateway_total_ms=draw(_value),
        gateway_ttfb_ms=draw(_value),
        inference_ms=draw(_value),
        queue_ms=draw(_value),
    )


@st.composite
def messy_records(draw: st.DrawFn) -> list[RequestRecord]:
    n = draw(st.integers(0, 60))
    return [draw(messy_record(i)) for i in range(n)]


_SPEC_TEXT_SLOS = ("total", "compute")


@settings(max_examples=150, deadline=None)
@given(
    records=messy_records(), zone=st.sampled_from(ZONES), lookback=st.sampled_from(["2h", "period"])
)
def test_the_statements_counts_and_percentiles_are_the_per_record_rules(
    records: list[RequestRecord], zone: str, lookback: str
) -> None:
    """Classify each counted record with ``SLOMatcher.classify``, take its day with
    ``_day`` and the percentiles with ``nearest_rank``: the statement says the same."""
    tz = zoneinfo.ZoneInfo(zone)
    c = contract(
        billing={"period": "month", "timezone": zone},
        exemptions={},
        budget_exhausted={"lookback": lookback},
    )
    at_ms = (NOV_2026_NS + 20 * 1440 * MIN_NS) // 1_000_000
    events = [BudgetEventRow(name, "budget_exhausted", at_ms) for name in _SPEC_TEXT_SLOS]
    s = compute_statement(
        tenant="acme", period="2026-11", contract=c, spec=SPEC, records=records,
        level_changes=[], budget_events=events, observed_until_ns=None, inputs={},
    )  # fmt: skip
    lo, hi = period_bounds_ns("2026-11", zone)
    mine = [r for r in records if r.tenant == "acme" and lo <= r.end_unix_ns < hi]
    assert s.counted == len(mine)
    p = c.breach.percentile
    bad_before: dict[str, int] = {}
    for name in _SPEC_TEXT_SLOS:
        slo = SPEC.slo(name)
        verdicts = [SLOMatcher(slo).classify(r) for r in mine]
        assert s.slos[name].total == sum(v != "skip" for v in verdicts)
        assert s.slos[name].good == sum(v == "good" for v in verdicts)
        values: list[float] = []
        by_day: dict[str, list[float]] = defaultdict(list)
        for r, v in zip(mine, verdicts, strict=True):
            x = r.boundary(slo.boundary)
            if v != "skip" and x is not None:
                values.append(x)
                by_day[_day(r.end_unix_ns, tz)].append(x)
        got = s.percentiles[name]
        assert (got.period, got.n) == (nearest_rank(values, p), len(values))
        assert {d: (x.p, x.n) for d, x in got.days.items()} == {
            d: (nearest_rank(xs, p), len(xs)) for d, xs in by_day.items()
        }
        assert list(got.days) == sorted(by_day)
        start_ms = lo // 1_000_000 if lookback == "period" else at_ms - 7_200_000
        bad_before[name] = sum(
            v == "bad" and start_ms * 1_000_000 <= r.end_unix_ns <= at_ms * 1_000_000
            for r, v in zip(mine, verdicts, strict=True)
        )
    assert {i.slo: i.bad_requests for i in s.incidents} == {
        k: n for k, n in bad_before.items() if n
    }
    prim, sec = SLOMatcher(SPEC.slo("total")), SLOMatcher(SPEC.slo("compute"))
    tier = s.tiers["blended"]
    counted = [r for r in mine if prim.classify(r) != "skip"]
    assert tier.total == len(counted)
    assert tier.good_primary == sum(prim.classify(r) == "good" for r in counted)
    assert tier.good_secondary_only == sum(
        prim.classify(r) == "bad" and sec.classify(r) == "good" for r in counted
    )


@pytest.mark.parametrize("zone", [*ZONES, "America/Sao_Paulo", "America/St_Johns"])
@pytest.mark.parametrize(
    ("around", "span_s", "step_s"),
    [
        ("2026-11-01T06:00:00+00:00", 4 * 3600, 7),  # New York leaves DST
        ("2026-10-03T15:30:00+00:00", 4 * 3600, 11),  # Lord Howe: a 30 min change
        ("2010-11-07T02:31:00+00:00", 4 * 3600, 7),  # St John's: back at 00:01, mid-hour
        ("2018-11-04T03:00:00+00:00", 4 * 3600, 13),  # Sao Paulo: DST at midnight
        ("2011-12-30T10:00:00+00:00", 2 * 86_400, 97),  # Apia skipped a day
        ("1985-12-31T18:30:00+00:00", 2 * 86_400, 89),  # Kathmandu: +05:30 to +05:45
        ("1969-12-31T23:00:00+00:00", 2 * 3600, 1),  # before the epoch
    ],
)
def test_each_times_day_is_its_calendar_day_in_the_zone(
    zone: str, around: str, span_s: int, step_s: int
) -> None:
    tz = zoneinfo.ZoneInfo(zone)
    mid = int(dt.datetime.fromisoformat(around).timestamp())
    ns = np.arange(mid - span_s, mid + span_s, step_s, dtype=np.int64) * 1_000_000_000 + 123
    epoch = dt.date(1970, 1, 1)
    got = [(epoch + dt.timedelta(days=d)).isoformat() for d in local_days(ns, tz).tolist()]
    assert got == [_day(t, tz) for t in ns.tolist()]


def _slots_per_record(
    records: list[RequestRecord],
    scopes: list[str],
    models: list[str] | None,
    start_ms: int,
    end_ms: int,
    *,
    slot_ms: int,
) -> dict[str, list[tuple[int, int]]]:
    """The traffic rule record by record (the module docstring's)."""
    out: dict[str, list[tuple[int, int]]] = {}
    for scope in scopes:
        allowed = _scope_models(scope, models)
        ks: set[int] = set()
        for r in records:
            if allowed is not None and r.model not in allowed:
                continue
            b = r.end_unix_ns // 1_000_000
            a = min(r.ts_unix_ns // 1_000_000, b)
            a = b if b - a > MAX_SPAN_MS else a
            ks.update(range(a // slot_ms, b // slot_ms + 1))
        merged: list[tuple[int, int]] = []
        for k in sorted(ks):
            a, b = max(start_ms, k * slot_ms), min(end_ms, (k + 1) * slot_ms)
            if a >= b:
                continue
            if merged and merged[-1][1] == a:
                merged[-1] = (merged[-1][0], b)
            else:
                merged.append((a, b))
        out[scope] = merged
    return out


@settings(max_examples=150, deadline=None)
@given(
    ends=st.lists(st.tuples(st.integers(-5, 400), st.integers(-70_000, 4_000_000)), max_size=40),
    models=st.sampled_from([None, ["m"], ["m", "n"]]),
    window=st.tuples(st.integers(-3, 100), st.integers(0, 400)),
    slot_ms=st.sampled_from([60_000, 7_000]),
)
def test_the_tenants_traffic_slots_are_the_per_record_rule(
    ends: list[tuple[int, int]],
    models: list[str] | None,
    window: tuple[int, int],
    slot_ms: int,
) -> None:
    base_ms = NOV_2026_NS // 1_000_000
    records = [
        rec(f"r{i}", (base_ms + minute * 60_000 + 17) * 1_000_000, took_ms=took,
            model="mno"[i % 3])
        for i, (minute, took) in enumerate(ends)
    ]  # fmt: skip
    start_ms = base_ms + window[0] * 60_000 + 5
    end_ms = start_ms + window[1] * 60_000
    scopes = ["*", "fleet", "m", "n", "o", "x"]
    assert traffic_intervals(
        records, scopes, models, start_ms, end_ms, slot_ms=slot_ms
    ) == _slots_per_record(records, scopes, models, start_ms, end_ms, slot_ms=slot_ms)


@pytest.mark.parametrize(
    ("minutes", "expected"),
    [
        ([], []),
        ([5], [(5, 6)]),
        ([5, 6], [(5, 7)]),
        ([5, 7], [(5, 6), (7, 8)]),  # one empty slot between: two intervals
        ([7, 5, 5], [(5, 6), (7, 8)]),
        ([-1, 0, 179, 180], [(0, 1), (179, 180)]),  # clipped to the window, empty dropped
    ],
)
def test_traffic_slots_merge_only_touching_slots(
    minutes: list[int], expected: list[tuple[int, int]]
) -> None:
    base_ms = NOV_2026_NS // 1_000_000
    records = [
        rec(f"r{i}", NOV_2026_NS + m * MIN_NS + 17, took_ms=0) for i, m in enumerate(minutes)
    ]
    got = traffic_intervals(records, ["m"], None, base_ms, base_ms + 180 * 60_000)
    want = [(base_ms + a * 60_000, base_ms + b * 60_000) for a, b in expected]
    assert got == {"m": want}


def test_the_per_record_references_can_fail() -> None:
    """The references are not vacuous: a record's slot and a day differ when they should."""
    r = rec("a", NOV_2026_NS + 90 * MIN_NS, took_ms=0)
    base_ms = NOV_2026_NS // 1_000_000
    got = traffic_intervals([r], ["*"], None, base_ms, base_ms + 3 * 3_600_000)
    assert got == {"*": [(base_ms + 90 * 60_000, base_ms + 91 * 60_000)]}
    ny = zoneinfo.ZoneInfo("America/New_York")
    assert _day(NOV_2026_NS, ny) == "2026-10-31"
    oct_31 = (dt.date(2026, 10, 31) - dt.date(1970, 1, 1)).days
    assert local_days(np.array([NOV_2026_NS]), ny).tolist() == [oct_31]


def _window(start_min: int, end_min: int, reason: str) -> dict[str, object]:
    at = NOV_2026_NS / 1e9
    return {
        "start": dt.datetime.fromtimestamp(at + start_min * 60, tz=dt.UTC),
        "end": dt.datetime.fromtimestamp(at + end_min * 60, tz=dt.UTC),
        "reason": reason,
    }


@pytest.mark.parametrize(
    ("end_min", "reason"),
    [
        (5, "a"),  # in both windows: the first listed
        (15, "b"),  # in the second only
        (10, "b"),  # the first's end is exclusive
        (20, None),  # so is the second's
        (-1, None),  # (before the period)
    ],
)
def test_a_record_in_overlapping_maintenance_windows_takes_the_first_listed(
    end_min: int, reason: str | None
) -> None:
    c = contract(exemptions={"maintenance": [_window(0, 10, "a"), _window(2, 20, "b")]})
    s = compute_statement(
        tenant="acme", period="2026-11", contract=c, spec=SPEC,
        records=[rec("x", NOV_2026_NS + end_min * MIN_NS)],
        level_changes=[], budget_events=[], observed_until_ns=None, inputs={},
    )  # fmt: skip
    want = [] if reason is None else [f"maintenance: {reason}"]
    assert [x.reason for x in s.exempted] == want
