"""SLO spec loading/validation and the compliance maths of pipeline.core.slo."""

from __future__ import annotations

import datetime as dt
import functools
import itertools
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec.structs import replace  # records are msgspec Structs
from pydantic import ValidationError

from pipeline.core.record import BOUNDARIES, RequestRecord, build_record
from pipeline.core.slo import (
    BlendedCounts,
    RecordColumns,
    SLOCounts,
    SLOEvaluator,
    SLOMatcher,
    compliance_report,
)
from pipeline.spec.loader import SpecError
from pipeline.spec.slo import (
    SLO,
    SLOSpec,
    Window,
    load_spec,
    load_spec_file,
    parse_duration_ms,
    validate_file,
)
from tests.factories import completed, finished, received
from tests.paths import REPO, UNIT_TESTDATA
from tests.slo_strategies import JOINED, records, slo_data, specs

TESTDATA = UNIT_TESTDATA / "slo"
EXAMPLE = REPO / "specs" / "slo-example.yaml"

# --------------------------------------------------------------------------- #
# Golden spec files
# --------------------------------------------------------------------------- #

BAD_FILES = sorted(TESTDATA.glob("bad_*.yaml"))
GOOD_FILES = sorted(TESTDATA.glob("good_*.yaml"))


def _expectations(path: Path) -> tuple[list[tuple[str, str]], int | None]:
    """``# expect: PATH | MESSAGE-PART`` lines (``<root>`` = no path); ``# expect-line: N``."""
    expects: list[tuple[str, str]] = []
    line: int | None = None
    for text in path.read_text().splitlines():
        if m := re.match(r"# expect: (\S+) \| (.+)$", text):
            field = "" if m.group(1) == "<root>" else m.group(1)
            expects.append((field, m.group(2)))
        elif m := re.match(r"# expect-line: (\d+)$", text):
            line = int(m.group(1))
    return expects, line


def test_golden_files_exist() -> None:
    assert len(BAD_FILES) >= 15
    assert len(GOOD_FILES) >= 3
    for path in BAD_FILES:
        assert _expectations(path)[0], f"{path.name} has no '# expect:' line"


@pytest.mark.parametrize("path", BAD_FILES, ids=lambda p: p.stem)
def test_bad_spec_reports_exactly_the_expected_problems(path: Path) -> None:
    expects, line = _expectations(path)
    with pytest.raises(SpecError) as info:
        load_spec_file(path)
    err = info.value
    assert err.source == str(path)
    # exactly the expected field paths: nothing missed, nothing spurious
    assert sorted(i.path for i in err.errors) == sorted(p for p, _ in expects), str(err)
    rendered = str(err).splitlines()
    for field, part in expects:
        prefix = f"{path}: {field}: " if field else f"{path}: "
        assert any(r.startswith(prefix) and part in r for r in rendered), (field, part, rendered)
    if line is not None:
        assert [i.line for i in err.errors] == [line]
    ok, message = validate_file(path)
    assert not ok
    assert message.startswith(str(err))
    assert f"{len(err.errors)} problem" in message.splitlines()[-1]


@pytest.mark.parametrize("path", GOOD_FILES, ids=lambda p: p.stem)
def test_good_spec_validates(path: Path) -> None:
    spec = load_spec_file(path)
    ok, message = validate_file(path)
    assert ok, message
    assert message.startswith(f"ok: {spec.summary()}")


def test_error_message_format_names_file_field_and_line() -> None:
    text = (TESTDATA / "bad_negative_threshold.yaml").read_text()
    with pytest.raises(SpecError) as info:
        load_spec(text, "prod.yaml")
    assert str(info.value) == (
        "prod.yaml: slos[1].threshold_ms: Input should be greater than 0 (line 11)"
    )


def test_issues_are_listed_in_file_order() -> None:
    with pytest.raises(SpecError) as info:
        load_spec_file(TESTDATA / "bad_many_problems.yaml")
    lines = [i.line or 0 for i in info.value.errors]
    assert lines == sorted(lines)
    assert len(lines) == 4


def test_shipped_example_validates_and_encodes_the_documents() -> None:
    ok, message = validate_file(EXAMPLE)
    assert ok, message
    assert message.startswith("ok: 7 SLOs, 1 blended tier")
    spec = load_spec_file(EXAMPLE)
    want = {
        "tier1-gateway": ("gateway_total_ms", 400, 0.99),
        "tier2-compute": ("inference_ms", 250, 0.99),
        "tier3-ttft": ("gateway_ttfb_ms", 600, 0.99),
        "gold-ttfb": ("gateway_ttfb_ms", 300, 0.99),
        "silver-ttfb": ("gateway_ttfb_ms", 300, 0.95),
        "queue-95": ("queue_ms", 100, 0.95),
    }
    for name, (boundary, threshold, objective) in want.items():
        s = spec.slo(name)
        assert (s.boundary, s.threshold_ms, s.objective) == (boundary, threshold, objective)
    for s in spec.slos:  # > 16k prompt tokens go async: no synchronous latency SLO
        assert s.exclude is not None
        assert s.exclude.prompt_tokens_over == 16384
    assert {s.window.calendar for s in spec.slos} == {None, "month"}
    tier = spec.tiers["blended"]
    assert (tier.primary, tier.secondary, tier.secondary_weight, tier.objective) == (
        "tier1-gateway",
        "tier2-compute",
        0.7,
        0.99,
    )


def test_unreadable_file_is_a_spec_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read spec"):
        load_spec_file(tmp_path / "missing.yaml")
    ok, message = validate_file(tmp_path / "missing.yaml")
    assert not ok
    assert "missing.yaml" in message


def test_empty_document_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match="got empty"):
        load_spec("# nothing\n")


def test_direct_construction_runs_the_cross_checks_too() -> None:
    data = {
        "apiVersion": "tailguard/v1",
        "kind": "SLOSpec",
        "slos": [slo_data(name="a"), slo_data(name="a")],
    }
    with pytest.raises(ValidationError, match=r"slos\[1\]\.name: duplicate SLO name"):
        SLOSpec.model_validate(data)


def test_equal_specs_compare_equal() -> None:
    assert load_spec_file(EXAMPLE) == load_spec_file(EXAMPLE)
    spec = load_spec_file(EXAMPLE)
    assert spec.slos[0] != spec.slos[1]


# --------------------------------------------------------------------------- #
# Durations and windows
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("30d", 30 * 86_400_000),
        ("28d", 28 * 86_400_000),
        ("7d", 7 * 86_400_000),
        ("1h", 3_600_000),
        ("90m", 5_400_000),
        ("15s", 15_000),
        ("500ms", 500),
        ("2w", 14 * 86_400_000),
    ],
)
def test_duration_parses_to_ms(text: str, ms: int) -> None:
    assert parse_duration_ms(text) == ms
    assert Window(rolling=text).rolling_ms == ms


@pytest.mark.parametrize("text", ["30x", "0d", "d", "30", "-1d", "1.5h", "30 d", "30D", ""])
def test_bad_duration_is_rejected(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration_ms(text)


def _ns(year: int, month: int, day: int, hour: int = 0) -> int:
    return int(dt.datetime(year, month, day, hour, tzinfo=dt.UTC).timestamp()) * 10**9


@pytest.mark.parametrize(
    ("window", "now", "start"),
    [
        (Window(rolling="30d"), _ns(2024, 3, 31, 12), _ns(2024, 3, 1, 12)),
        (Window(rolling="1h"), _ns(2024, 3, 31, 12), _ns(2024, 3, 31, 11)),
        (Window(calendar="month"), _ns(2024, 3, 15, 12) + 123, _ns(2024, 3, 1)),
        (Window(calendar="month"), _ns(2024, 3, 1), _ns(2024, 3, 1)),
        (Window(calendar="week"), _ns(2024, 3, 13, 12), _ns(2024, 3, 11)),  # Wed -> Mon
        (Window(calendar="week"), _ns(2024, 3, 11, 0), _ns(2024, 3, 11)),
    ],
)
def test_window_start(window: Window, now: int, start: int) -> None:
    assert window.start_unix_ns(now) == start


# --------------------------------------------------------------------------- #
# Classification
# --------------------------------------------------------------------------- #


def _slo(**kw: Any) -> SLO:
    return SLO.model_validate(slo_data(**kw))


# JOINED: total 100, ttfb 20; queue 10, prefill 8, decode 70 -> inference 78, e2e 88, ttft 18


def _joined(**kw: Any) -> RequestRecord:
    return replace(JOINED, **kw)


def _gateway_only(**kw: Any) -> RequestRecord:
    return build_record("g", received("g"), completed("g", **kw), None)


def _engine_only(**kw: Any) -> RequestRecord:
    rec = build_record("e", None, None, finished("e"))
    return replace(rec, **kw)


REJECTED_503 = _gateway_only(total_ms=3.0, ttfb_ms=3.0, outcome="rejected", http_status=503)
ABORT_FAST = _gateway_only(total_ms=150.0, ttfb_ms=40.0, outcome="client_abort", http_status=0)
ABORT_SLOW = _gateway_only(total_ms=900.0, ttfb_ms=500.0, outcome="client_abort", http_status=0)
ABORT_NO_BYTE_SLOW = _gateway_only(
    total_ms=900.0, ttfb_ms=None, outcome="client_abort", http_status=0
)
ABORT_NO_BYTE_FAST = _gateway_only(
    total_ms=300.0, ttfb_ms=None, outcome="client_abort", http_status=0
)
ENGINE_ERROR = _engine_only(outcome="error", finish_reason="error")
TTFB = {"boundary": "gateway_ttfb_ms", "threshold_ms": 600}
COMPUTE = {"boundary": "inference_ms", "threshold_ms": 250}
ASYNC = {"exclude": {"prompt_tokens_over": 16000}}

CASES: list[tuple[str, dict[str, Any], RequestRecord, str]] = [
    # latency
    ("fast-ok", {}, JOINED, "good"),
    ("equal-threshold-is-good", {}, _joined(gateway_total_ms=400.0), "good"),
    ("just-over-is-bad", {}, _joined(gateway_total_ms=400.001), "bad"),
    (
        "strict-equal-threshold-is-bad",
        {"threshold_strict": True},
        _joined(gateway_total_ms=400.0),
        "bad",
    ),
    (
        "strict-just-under-is-good",
        {"threshold_strict": True},
        _joined(gateway_total_ms=399.999),
        "good",
    ),
    (
        "strict-no-first-byte-waited-long",
        {**TTFB, "threshold_strict": True},
        _joined(gateway_ttfb_ms=None, gateway_total_ms=700.0),
        "bad",
    ),
    ("compute-boundary", COMPUTE, _joined(gateway_total_ms=5000.0), "good"),
    ("compute-boundary-bad", COMPUTE, _joined(inference_ms=250.5), "bad"),
    # filters
    ("model-match", {"filter": {"model": ["m", "x"]}}, JOINED, "good"),
    ("model-miss", {"filter": {"model": ["x"]}}, JOINED, "skip"),
    ("priority-match", {"filter": {"priority": [1, 2]}}, JOINED, "good"),
    ("priority-miss", {"filter": {"priority": [0]}}, JOINED, "skip"),
    ("priority-scalar", {"filter": {"priority": 1}}, JOINED, "good"),
    ("priority-unknown", {"filter": {"priority": [0, 1, 2, 3]}}, _joined(priority=None), "skip"),
    ("bucket-match", {"filter": {"ctx_bucket": ["<512"]}}, JOINED, "good"),
    ("bucket-miss", {"filter": {"ctx_bucket": ["8k-16k"]}}, JOINED, "skip"),
    ("tenant-match", {"filter": {"tenant": ["t1"]}}, JOINED, "good"),
    ("tenant-miss", {"filter": {"tenant": ["t2"]}}, JOINED, "skip"),
    ("tenant-unknown", {"filter": {"tenant": ["t1"]}}, _joined(tenant=None), "skip"),
    ("stream-match", {"filter": {"stream": True}}, JOINED, "good"),
    ("stream-miss", {"filter": {"stream": False}}, JOINED, "skip"),
    (
        "all-filters",
        {"filter": {"model": ["m"], "priority": [1], "tenant": ["t1"]}},
        JOINED,
        "good",
    ),
    ("filter-then-bad", {"filter": {"model": ["m"]}}, _joined(gateway_total_ms=401.0), "bad"),
    # exclusions
    ("long-prompt-excluded", ASYNC, _joined(prompt_tokens=16001), "skip"),
    ("at-limit-counted", ASYNC, _joined(prompt_tokens=16000), "good"),
    ("unknown-prompt-counted", ASYNC, _joined(prompt_tokens=None), "good"),
    (
        "excluded-error-skipped",
        {"exclude": {"prompt_tokens_over": 10}},
        _joined(outcome="error"),
        "skip",
    ),
    # failures: errors=bad (default) whatever the latency, where the layer saw the request
    ("fast-error-bad", {}, _joined(outcome="error", gateway_total_ms=5.0), "bad"),
    ("timeout-bad", {}, _joined(outcome="timeout"), "bad"),
    ("fast-503-bad-at-gateway", {}, REJECTED_503, "bad"),
    ("503-not-in-compute-slo", COMPUTE, REJECTED_503, "skip"),
    ("engine-error-bad-for-compute", COMPUTE, ENGINE_ERROR, "bad"),
    ("engine-error-not-seen-by-gateway", {}, ENGINE_ERROR, "skip"),
    ("overhead-needs-both-sides", {"boundary": "gateway_overhead_ms"}, REJECTED_503, "skip"),
    ("overhead-joined-error", {"boundary": "gateway_overhead_ms"}, _joined(outcome="error"), "bad"),
    ("error-without-ttfb-bad", TTFB, _joined(outcome="timeout", gateway_ttfb_ms=None), "bad"),
    ("unknown-outcome-is-failure", {}, _joined(outcome="mystery"), "bad"),
    ("errors-exclude", {"errors": "exclude"}, _joined(outcome="error"), "skip"),
    ("errors-exclude-503", {"errors": "exclude"}, REJECTED_503, "skip"),
    ("errors-exclude-ok-counted", {"errors": "exclude"}, JOINED, "good"),
    # client aborts: measured by the time the client waited
    ("abort-fast-good", {}, ABORT_FAST, "good"),
    ("abort-slow-bad", {}, ABORT_SLOW, "bad"),
    ("abort-ttfb-measured", TTFB, ABORT_FAST, "good"),
    ("abort-no-engine-value", COMPUTE, ABORT_SLOW, "skip"),
    ("abort-no-first-byte-waited-long", TTFB, ABORT_NO_BYTE_SLOW, "bad"),
    ("abort-no-first-byte-short-wait", TTFB, ABORT_NO_BYTE_FAST, "skip"),
    ("abort-exclude", {"client_abort": "exclude"}, ABORT_SLOW, "skip"),
    ("abort-exclude-fast", {"client_abort": "exclude"}, ABORT_FAST, "skip"),
    # no value at the boundary: skipped
    ("engine-only-at-gateway", {}, _engine_only(), "skip"),
    ("gateway-only-at-engine", COMPUTE, _gateway_only(), "skip"),
    ("no-tpot", {"boundary": "tpot_ms"}, _joined(tpot_ms=None), "skip"),
    ("ok-without-ttfb-fast", TTFB, _joined(gateway_ttfb_ms=None), "skip"),
    (
        "ok-without-ttfb-waited-long",
        TTFB,
        _joined(gateway_ttfb_ms=None, gateway_total_ms=700.0),
        "bad",
    ),
]


@pytest.mark.parametrize(
    ("slo_kw", "record", "verdict"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_classify(slo_kw: dict[str, Any], record: RequestRecord, verdict: str) -> None:
    slo = SLOMatcher(_slo(**slo_kw))
    assert slo.classify(record) == verdict
    assert slo.applies(record) == (verdict != "skip")
    assert slo.is_good(record) == (verdict == "good")


def test_fixture_records_are_what_the_cases_assume() -> None:
    assert (JOINED.source, JOINED.outcome, JOINED.model, JOINED.priority) == (
        "joined",
        "ok",
        "m",
        1,
    )
    assert (JOINED.gateway_total_ms, JOINED.inference_ms, JOINED.ctx_bucket) == (
        100.0,
        78.0,
        "<512",
    )
    assert JOINED.stream is True
    assert (REJECTED_503.source, REJECTED_503.inference_ms) == ("gateway_only", None)
    assert (ENGINE_ERROR.source, ENGINE_ERROR.gateway_total_ms) == ("engine_only", None)
    assert ABORT_SLOW.outcome == "client_abort"


# --------------------------------------------------------------------------- #
# Blended tiers and the evaluator
# --------------------------------------------------------------------------- #

TWO_TIERS = """
apiVersion: tailguard/v1
kind: SLOSpec
slos:
  - {name: tier1-gateway, boundary: gateway_total_ms, threshold_ms: 400, objective: 0.99}
  - {name: tier2-compute, boundary: inference_ms, threshold_ms: 250, objective: 0.99}
tiers:
  blended:
    {primary: tier1-gateway, secondary: tier2-compute, secondary_weight: 0.7, objective: 0.99}
"""


def test_blended_formula_on_a_hand_made_set() -> None:
    records = (
        [_joined(gateway_total_ms=100.0, inference_ms=78.0)] * 8  # tier 1 good
        + [_joined(gateway_total_ms=900.0, inference_ms=78.0)]  # only tier 2 good
        + [_joined(gateway_total_ms=900.0, inference_ms=400.0)]  # neither
    )
    ev = SLOEvaluator(load_spec(TWO_TIERS))
    ev.add_many(records)
    b = ev.blended_counts()["blended"]
    assert (b.total, b.good_primary, b.good_secondary_only) == (10, 8, 1)
    assert b.compliance == pytest.approx((8 + 0.7) / 10)
    assert ev.counts() == {
        "tier1-gateway": SLOCounts(10, 8),
        "tier2-compute": SLOCounts(10, 9),
    }
    out = ev.to_json()
    assert out["blended"]["compliance"] == pytest.approx(0.87)
    assert out["blended"]["met"] is False
    assert (
        out["slos"]["tier1-gateway"].items() >= {"total": 10, "good": 8, "compliance": 0.8}.items()
    )
    assert out["slos"]["tier2-compute"]["compliance"] == pytest.approx(0.9)


def test_blended_denominator_is_the_primarys_records() -> None:
    ev = SLOEvaluator(load_spec(TWO_TIERS))
    ev.add(_engine_only())  # tier 1 skips it: not in the blended denominator
    ev.add(REJECTED_503)  # tier 1 bad, tier 2 skips: earns nothing
    ev.add(_joined(gateway_total_ms=500.0))  # tier 1 bad, tier 2 good: 0.7
    b = ev.blended_counts()["blended"]
    assert (b.total, b.good_primary, b.good_secondary_only) == (2, 0, 1)
    assert b.compliance == pytest.approx(0.35)
    assert ev.counts()["tier2-compute"] == SLOCounts(2, 2)
    assert ev.records == 3


def test_report_with_nothing_counted() -> None:
    ev = SLOEvaluator(load_spec(TWO_TIERS))
    out = ev.to_json()
    assert out["slos"]["tier1-gateway"]["compliance"] is None
    assert out["slos"]["tier1-gateway"]["met"] is None
    assert out["blended"]["compliance"] is None
    minimal = load_spec_file(TESTDATA / "good_minimal.yaml")
    assert SLOEvaluator(minimal).to_json()["blended"] is None


def test_report_picks_the_tier_named_blended_else_the_first() -> None:
    spec = load_spec_file(TESTDATA / "good_options.yaml")
    assert spec.default_tier == "blended"
    assert SLOEvaluator(spec).to_json()["blended"]["primary"] == "compute"
    spec2 = load_spec(TWO_TIERS.replace("  blended:", "  gold:"))
    assert spec2.default_tier == "gold"


def test_slo_counts_rules() -> None:
    assert SLOCounts().compliance is None
    assert SLOCounts(4, 3).compliance == 0.75
    assert SLOCounts(4, 3).bad == 1
    assert SLOCounts(4, 3) + SLOCounts(6, 6) == SLOCounts(10, 9)
    # objective 0.9 over 100 records allows 10 bad: 4 bad uses 40%
    assert SLOCounts(100, 96).error_budget_remaining(0.9) == pytest.approx(0.6)
    assert SLOCounts(100, 80).error_budget_remaining(0.9) == pytest.approx(-1.0)
    assert SLOCounts().error_budget_remaining(0.9) is None
    with pytest.raises(ValueError, match="good <= total"):
        SLOCounts(1, 2)
    with pytest.raises(ValueError, match="different secondary weights"):
        BlendedCounts(0.7, 1, 1, 0).merge(BlendedCounts(0.5, 1, 1, 0))
    with pytest.raises(ValueError, match="<= total"):
        BlendedCounts(0.7, 1, 1, 1)


def test_evaluators_of_different_specs_do_not_merge() -> None:
    a = SLOEvaluator(load_spec(TWO_TIERS))
    b = SLOEvaluator(load_spec_file(EXAMPLE))
    with pytest.raises(ValueError, match="different specs"):
        a.merge(b)


def test_example_spec_over_built_records() -> None:
    spec = load_spec_file(EXAMPLE)
    ev = SLOEvaluator(spec)
    ev.add(JOINED)
    ev.add(_joined(prompt_tokens=20000, ctx_bucket=">16k", gateway_total_ms=9000.0))  # async
    ev.add(_joined(priority=0, gateway_ttfb_ms=350.0))  # gold: bad
    out = ev.to_json()
    assert out["slos"]["tier1-gateway"]["total"] == 2
    assert out["slos"]["gold-ttfb"].items() >= {"total": 2, "good": 1}.items()
    assert out["slos"]["silver-ttfb"]["total"] == 0
    assert out["blended"]["compliance"] == 1.0


# --------------------------------------------------------------------------- #
# Properties: merging and an independent recount
# --------------------------------------------------------------------------- #

_GATEWAY_SIDE = {"gateway_total_ms", "gateway_ttfb_ms"}


def reference_verdict(slo: SLO, r: RequestRecord) -> str:
    """The rules of the module docstring, written out plainly."""
    f = slo.filter
    if f is not None:
        for allowed, actual in (
            (f.model, r.model),
            (f.priority, r.priority),
            (f.ctx_bucket, r.ctx_bucket),
            (f.tenant, r.tenant),
        ):
            if allowed is not None and actual not in allowed:
                return "skip"
        if f.stream is not None and r.stream != f.stream:
            return "skip"
    limit = slo.exclude.prompt_tokens_over if slo.exclude is not None else None
    if limit is not None and r.prompt_tokens is not None and r.prompt_tokens > limit:
        return "skip"
    if r.outcome not in ("ok", "client_abort"):
        if slo.errors == "exclude":
            return "skip"
        if slo.boundary in _GATEWAY_SIDE:
            reached = r.source != "engine_only"
        elif slo.boundary == "gateway_overhead_ms":
            reached = r.source == "joined"
        else:
            reached = r.source != "gateway_only"
        return "bad" if reached else "skip"
    if r.outcome == "client_abort" and slo.client_abort == "exclude":
        return "skip"
    value = r.boundary(slo.boundary)
    if value is None:
        waited = r.gateway_total_ms
        if slo.boundary == "gateway_ttfb_ms" and waited is not None and waited > slo.threshold_ms:
            return "bad"
        return "skip"
    if slo.threshold_strict:
        return "good" if value < slo.threshold_ms else "bad"
    return "good" if value <= slo.threshold_ms else "bad"


@settings(max_examples=200, deadline=None)
@given(specs(), st.lists(records(), max_size=60))
def test_counts_equal_a_straightforward_recount(spec: SLOSpec, recs: list[RequestRecord]) -> None:
    ev = SLOEvaluator(spec)
    ev.add_many(recs)
    verdicts = {s.name: [reference_verdict(s, r) for r in recs] for s in spec.slos}
    for s in spec.slos:
        v = verdicts[s.name]
        assert ev.counts()[s.name] == SLOCounts(
            total=sum(x != "skip" for x in v), good=sum(x == "good" for x in v)
        )
    for name, tier in spec.tiers.items():
        p, q = verdicts[tier.primary], verdicts[tier.secondary]
        total = sum(x != "skip" for x in p)
        gp = sum(x == "good" for x in p)
        gs = sum(a == "bad" and b == "good" for a, b in zip(p, q, strict=True))
        assert ev.blended_counts()[name] == BlendedCounts(tier.secondary_weight, total, gp, gs)
        if total:
            assert ev.blended_counts()[name].compliance == pytest.approx(
                (gp + tier.secondary_weight * gs) / total
            )


@settings(max_examples=150, deadline=None)
@given(specs(), st.lists(records(), max_size=40), st.lists(st.integers(0, 40), max_size=4))
def test_merged_partials_equal_counts_of_the_union(
    spec: SLOSpec, recs: list[RequestRecord], cuts: list[int]
) -> None:
    whole = SLOEvaluator(spec)
    whole.add_many(recs)
    bounds = [0, *sorted(min(c, len(recs)) for c in cuts), len(recs)]
    parts = []
    for lo, hi in itertools.pairwise(bounds):
        ev = SLOEvaluator(spec)
        ev.add_many(recs[lo:hi])
        parts.append(ev)
    for name in whole.counts():
        merged = functools.reduce(SLOCounts.merge, (p.counts()[name] for p in parts))
        assert merged == whole.counts()[name]
    for name in whole.blended_counts():
        merged_b = functools.reduce(BlendedCounts.merge, (p.blended_counts()[name] for p in parts))
        assert merged_b == whole.blended_counts()[name]
    # evaluator-level merge, and the report rendered from merged counts
    acc = SLOEvaluator(spec)
    for p in parts:
        acc.merge(p)
    assert acc.counts() == whole.counts()
    assert acc.blended_counts() == whole.blended_counts()
    assert acc.records == len(recs)
    assert compliance_report(spec, acc.counts(), acc.blended_counts()) == whole.to_json()


@given(
    st.lists(
        st.integers(0, 50).flatmap(lambda t: st.tuples(st.just(t), st.integers(0, t))),
        min_size=1,
        max_size=6,
    )
)
def test_slo_counts_merge_is_order_independent(pairs: list[tuple[int, int]]) -> None:
    counts = [SLOCounts(t, g) for t, g in pairs]
    forward = functools.reduce(SLOCounts.merge, counts)
    backward = functools.reduce(SLOCounts.merge, reversed(counts))
    assert forward == backward == SLOCounts(sum(t for t, _ in pairs), sum(g for _, g in pairs))


# --------------------------------------------------------------------------- #
# Purity
# --------------------------------------------------------------------------- #


def test_core_module_imports_no_kafka_faust_or_clickhouse() -> None:
    code = (
        "import sys, pipeline.core.slo\n"
        "banned = ('faust', 'confluent_kafka', 'aiokafka', 'clickhouse_connect', 'chdb')\n"
        "bad = [m for m in sys.modules\n"
        "       if m.split('.')[0] in banned or m.startswith('pipeline.adapters')]\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=False, cwd=REPO, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_boundary_can_be_named() -> None:
    for b in BOUNDARIES:
        assert _slo(boundary=b).boundary == b


@pytest.mark.parametrize(
    ("change", "path", "message"),
    [
        ("boundary: gateway_total_ms", "slos[0].boundry", "did you mean 'boundary'?"),
        ("threshold_ms: 400", "slos[0].threshold_ms", "write 400 instead of '400ms'"),
        ("threshold_ms: 400", "slos[0].threshold_ms", "write 1500 instead of '1.5s'"),
        ("window: {rolling: 30d}", "slos[0].window", "a mapping (key: value), got '30d'"),
    ],
)
def test_validation_messages_speak_to_operators(change: str, path: str, message: str) -> None:
    """A "did you mean" for a misspelt field, a unit hint, never an internal class name."""
    bad = {
        "slos[0].boundry": "boundry: gateway_total_ms",
        "slos[0].threshold_ms": "threshold_ms: 400ms" if "400" in message else "threshold_ms: 1.5s",
        "slos[0].window": "window: 30d",
    }[path]
    text = (
        "apiVersion: tailguard/v1\nkind: SLOSpec\nslos:\n  - name: a\n"
        "    boundary: gateway_total_ms\n    threshold_ms: 400\n    objective: 0.99\n"
        "    window: {rolling: 30d}\n"
    ).replace(f"    {change}\n", f"    {bad}\n")
    with pytest.raises(SpecError) as exc:
        load_spec(text)
    messages = {e.path: e.message for e in exc.value.errors}
    assert message in messages[path], messages
    assert "instance of" not in str(exc.value)
    assert "Window" not in str(exc.value)


@settings(max_examples=200, deadline=None)
@given(specs(retries=True), st.lists(records(retries=True), max_size=60), st.data())
def test_vectorised_classification_agrees_with_classify(
    spec: SLOSpec, recs: list[RequestRecord], data: st.DataObject
) -> None:
    """classify_many (numpy masks over a batch's columns) says what classify says, record by
    record; add_batch counts what add counts, with take-backs (sign -1) among the adds."""
    cols = RecordColumns(recs)
    for s in spec.slos:
        matcher = SLOMatcher(s)
        counted, good = matcher.classify_many(cols)
        pairs = zip(counted.tolist(), good.tolist(), strict=True)
        verdicts = ["good" if g else "bad" if c else "skip" for c, g in pairs]
        assert verdicts == [matcher.classify(r) for r in recs]
    signs = data.draw(st.lists(st.sampled_from([1, 1, -1]), min_size=len(recs), max_size=len(recs)))
    rows = data.draw(st.permutations(range(len(recs))))  # any order: counts are sums
    one_by_one, batched = SLOEvaluator(spec), SLOEvaluator(spec)
    for r, sign in zip(recs, signs, strict=True):
        one_by_one.add(r, sign)
    batched.add_batch(cols, np.array(rows, dtype=np.int64), np.array(signs, dtype=np.int64)[rows])
    assert batched.records == one_by_one.records
    assert batched.delta_counts() == one_by_one.delta_counts()
