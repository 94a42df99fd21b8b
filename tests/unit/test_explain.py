"""explain's pure core: timeline per host clock, breakdown, verdicts with reasons, control level."""

from __future__ import annotations

import pytest
from msgspec.structs import replace  # records are msgspec Structs

from pipeline.core.explain import AuditedDirective, breakdown, control_at, explain, timeline
from pipeline.core.record import build_record
from pipeline.settings import EXAMPLE_SLO_SPEC
from pipeline.spec.slo import load_spec_file
from tests.factories import T0_NS, completed, finished, received

SPEC = load_spec_file(EXAMPLE_SLO_SPEC)


def _joined(total_ms: float = 500.0, queue_ms: float = 300.0, **kw: object):
    # engine e2e = queue + prefill 8 + decode 70; the gateway adds 12 ms
    return build_record(
        "r1",
        received("r1", 0.0, priority=1),
        completed("r1", total_ms, total_ms=total_ms, ttfb_ms=queue_ms + 20.0),
        finished("r1", total_ms - 6.0, queue_ms=queue_ms),
    )


def test_timeline_keeps_each_hosts_clock_and_never_mixes_them() -> None:
    r = _joined()
    tl = {(i.clock, i.name): i for i in timeline(r)}
    assert [k for k in tl if k[0] == "gateway"] == [
        ("gateway", "received"), ("gateway", "first_byte"), ("gateway", "completed"),
    ]  # fmt: skip
    assert tl["gateway", "completed"].offset_ms == 500.0
    assert tl["engine", "arrival"].offset_ms == 0.0
    assert tl["engine", "scheduled"].offset_ms == 300.0
    assert tl["engine", "first_token"].offset_ms == 308.0
    assert tl["engine", "last_token"].offset_ms == pytest.approx(378.0)
    # wall clocks: each from its own host's stamp plus that host's durations
    assert tl["gateway", "received"].unix_ms == T0_NS / 1e6
    assert tl["engine", "scheduled"].unix_ms == pytest.approx(r.engine_arrival_unix_ns / 1e6 + 300)


def test_breakdown_sums_to_the_gateway_total() -> None:
    r = _joined()
    parts = {s.name: s for s in breakdown(r)}
    assert list(parts) == ["queue", "prefill", "decode", "gateway_overhead"]
    assert parts["gateway_overhead"].ms == pytest.approx(500.0 - 378.0)
    assert sum(s.ms for s in parts.values()) == pytest.approx(500.0)
    assert parts["queue"].share == pytest.approx(300.0 / 500.0)


def test_engine_only_record_has_no_gateway_segments() -> None:
    r = build_record("e", None, None, finished("e", queue_ms=5.0))
    assert {i.clock for i in timeline(r)} == {"engine"}
    assert [s.name for s in breakdown(r)] == ["queue", "prefill", "decode"]
    assert sum(s.share or 0 for s in breakdown(r)) == pytest.approx(1.0)


def test_verdicts_say_which_boundary_broke_and_why() -> None:
    # 500 ms at the gateway (> 400: tier1 bad), 78 ms compute (<= 250: tier2 good),
    # queue 300 ms (> 100: queue-95 bad), priority 1 -> gold, not silver
    e = explain(_joined(), SPEC, [])
    v = {x.slo: x for x in e.verdicts}
    assert v["tier1-gateway"].verdict == "bad"
    # queue 300 of 500 ms: a request of a load-caused burn (shedding would help)
    assert v["tier1-gateway"].reason == "500.0 ms > 400 ms; 60 % of it queued: load-caused"
    assert v["tier2-compute"].verdict == "good"
    assert v["queue-95"].verdict == "bad"
    assert v["silver-ttfb"].verdict == "skip"
    assert v["silver-ttfb"].reason.startswith("not selected: priority 1")
    assert v["gold-ttfb"].verdict == "bad"  # ttfb 320 > 300
    tier = {t.tier: t for t in e.tiers}["blended"]
    assert tier.credit == pytest.approx(0.7)  # bad on tier1, good on tier2 only
    assert e.control is None


def test_a_slow_decode_is_not_load_caused() -> None:
    r = _joined(queue_ms=1.0)
    v = {x.slo: x for x in explain(r, SPEC, []).verdicts}
    assert v["tier1-gateway"].verdict == "bad"
    assert v["tier1-gateway"].reason.endswith("% of it compute: not load-caused")


def test_failed_request_is_bad_whatever_its_latency() -> None:
    r = replace(_joined(total_ms=50.0, queue_ms=1.0), outcome="rejected")
    v = {x.slo: x for x in explain(r, SPEC, []).verdicts}
    assert v["tier1-gateway"].verdict == "bad"
    assert v["tier1-gateway"].reason == "outcome rejected counts as bad"
    assert v["queue-95"].verdict == "skip"  # errors: exclude
    assert "errors: exclude" in v["queue-95"].reason


def test_control_level_in_force_is_the_last_directive_at_or_before_the_end() -> None:
    end_ms = T0_NS // 1_000_000 + 500
    ds = [
        AuditedDirective("m", 1, 1, "degraded", end_ms - 60_000, "L1"),
        AuditedDirective("m", 2, 2, "degraded", end_ms - 1_000, "L2"),
        AuditedDirective("m", 3, 0, "normal", end_ms + 1, "recovered after the request"),
        AuditedDirective("other", 9, 3, "degraded", end_ms - 10, "another model"),
    ]
    assert control_at(ds, "m", end_ms) == ds[1]
    assert control_at(ds, "m", end_ms - 120_000) is None
    assert explain(_joined(), SPEC, ds).control == ds[1]
    # same event time: the higher sequence number is the later directive
    tie = [*ds, AuditedDirective("m", 4, 1, "half_open", end_ms - 1_000, "half-open")]
    assert control_at(tie, "m", end_ms) == tie[-1]
