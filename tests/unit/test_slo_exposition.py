"""/metrics content (names promtool accepts, counters, histograms; parsed back with
prometheus_client's OpenMetrics parser),
burn-rate alerts as Alertmanager alerts (firing, resolved), and the webhook signature."""

from __future__ import annotations

import dataclasses
import math

import msgspec
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from pipeline.adapters.alerting import sign, verify_signature
from pipeline.adapters.prometheus import MetricsState, render
from pipeline.contract.summary import ModelWindow, SLOWindowCounts, WindowSummary
from pipeline.core.alerts import AlertTracker
from pipeline.core.budget import BudgetBook
from pipeline.core.otel_names import BOUNDARY_NAMES
from pipeline.core.record import BOUNDARIES, build_record
from pipeline.core.sketch import QuantileSketch
from pipeline.core.slo_exposition import (
    HistogramSample,
    WindowCounters,
    native_index,
    native_schema,
    native_upper_bound,
)
from pipeline.core.slo_windows import WindowSLOCounts
from pipeline.core.summary import summarize
from pipeline.core.windows import ClosedWindow
from pipeline.spec.burn_rules import load_burn_rules_file
from pipeline.spec.slo import load_spec_file
from tests.factories import completed, finished, received

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
STEP = 10_000


def book_with(good_fraction_by_step: list[float], total: int = 100) -> BudgetBook:
    spec = load_spec_file("specs/slo-default.yaml")
    book = BudgetBook(spec, load_burn_rules_file())
    slo = spec.slos[0].name
    for i, frac in enumerate(good_fraction_by_step):
        book.add_window(slo, T0 + i * STEP, STEP, total, total * frac)
    return book


def scrape(state: MetricsState) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    text = render(state.families()).decode()
    assert text.endswith("# EOF\n")
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def one(samples: dict[tuple[tuple[str, str], ...], float], **labels: str) -> float:
    hits = [v for k, v in samples.items() if all((n, x) in k for n, x in labels.items())]
    assert len(hits) == 1, (labels, samples)
    return hits[0]


def test_names_and_values_equal_the_trackers() -> None:
    # 6 h: 99.5 % good, then 30 min at 90 % (a burn)
    fractions = [0.995] * 2160 + [0.90] * 180
    book = book_with(fractions)
    now = T0 + len(fractions) * STEP
    statuses = book.evaluate(now)
    (st,) = statuses
    state = MetricsState(health=lambda: {"consumer_lag_messages": 7, "events_consumed": 12})
    state.publish(statuses, {"llama": 2, "*": 0}, {"llama": {"p99.ttft_engine_ms": 812.5}})
    got = scrape(state)

    tracker = book.tracker(st.slo)
    share = 1 - st.objective
    for label, ms in (("5m", 300_000), ("30m", 1_800_000), ("1h", 3_600_000), ("6h", 21_600_000)):
        c = tracker.counts(now - ms, now)
        want = c.bad / c.total
        burn = one(got["tailguard_slo_burn_rate"], slo=st.slo, scope="*", window=label)
        assert burn == pytest.approx(want / share, rel=1e-9, abs=1e-12)
        compliance = one(got["tailguard_slo_compliance_ratio"], window=label)
        assert compliance == pytest.approx(1 - want, rel=1e-9)
    assert one(got["tailguard_slo_compliance_ratio"], window="30d") == pytest.approx(st.compliance)
    assert one(got["tailguard_slo_objective_ratio"]) == st.objective
    assert one(got["tailguard_slo_period_seconds"]) == 30 * 86_400
    assert one(got["tailguard_slo_period_burn_rate_projected"]) == pytest.approx(
        st.consumed / st.allowed
    )
    assert one(got["tailguard_slo_error_budget_remaining_projected_ratio"]) == pytest.approx(
        st.remaining_fraction
    )
    assert one(got["tailguard_slo_info"], slo=st.slo, objective="0.99") == 1
    firing = {dict(k)["rule"]: dict(k)["severity"] for k in got["tailguard_slo_alert_firing"]}
    assert firing == {a.rule: a.severity for a in st.alerts}
    assert firing  # the burn fires something
    assert one(got["tailguard_control_level"], scope="llama") == 2
    assert one(got["tailguard_control_level"], scope="*") == 0
    p99 = one(got["tailguard_latency_p99_seconds"], boundary="ttft_engine_ms")
    assert p99 == pytest.approx(0.8125)
    assert one(got["tailguard_latency_p99_seconds"], otel_name="gen_ai.server.time_to_first_token")
    assert got["tailguard_worker_consumer_lag_messages"] == {(): 7.0}
    assert got["tailguard_worker_events_consumed_total"] == {(): 12.0}  # a counter
    assert one(got["tailguard_controller_last_evaluation_timestamp_seconds"]) > 0


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("tailguard_slo_requests", "counter"),
        ("tailguard_slo_good_requests", "counter"),
        ("tailguard_slo_tier_secondary_good_requests", "counter"),
        ("tailguard_request_latency_seconds", "histogram"),
        ("tailguard_worker_events_consumed", "counter"),
        ("tailguard_worker_rows_written", "counter"),
        ("tailguard_worker_store_write_retries", "counter"),
        ("tailguard_worker_store_rejected_rows", "counter"),
        ("tailguard_worker_stalled_partitions_read_again", "counter"),
        ("tailguard_worker_consumer_lag_messages", "gauge"),
        ("tailguard_slo_burn_rate", "gauge"),
        ("tailguard_slo_period_burn_rate_projected", "gauge"),
    ],
)
def test_types_and_no_recording_rule_names(name: str, kind: str) -> None:
    """Counters are counters (``_total``), latency a histogram, and no name has a ``:``
    (the recording rules' names; what ``promtool check metrics`` flags)."""
    state = MetricsState(
        health=lambda: dict.fromkeys(
            ("consumer_lag_messages", "events_consumed", "rows_written",
             "store_write_retries", "store_rejected_rows", "stalled_partitions_read_again"),
            3.0)
    )  # fmt: skip
    state.use_counters(WindowCounters({"gateway_ttfb_ms": [2000.0]}))
    state.windows_stored([window([100.0, 2500.0], total=2, good=1, tiers={"blended": 1})])
    state.publish(book_with([0.9] * 100).evaluate(T0 + 100 * STEP), {}, {})
    text = render(state.families()).decode()
    kinds = {f.name: f.type for f in text_string_to_metric_families(text)}
    assert kinds[name] == kind
    assert not [n for n in kinds if ":" in n]


def window(
    latencies_ms: list[float], *, total: int, good: int, correction: bool = False,
    slo: str = "ttft-stream", model: str = "llama", boundary: str = "gateway_ttfb_ms",
    tiers: dict[str, int] | None = None,
) -> WindowSummary:  # fmt: skip
    sk = QuantileSketch(0.01)
    sk.add_many(latencies_ms)
    mw = ModelWindow(len(latencies_ms), {boundary: sk.to_columns()})
    models = {} if correction else {model: mw}
    return WindowSummary(
        0, T0, STEP, models, {slo: SLOWindowCounts(total, good, 0.99)},
        correction_id="c1" if correction else None, tiers=tiers or {},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("steps", "want_total", "want_good"),
    [
        ([(10, 9)], 10, 9),
        ([(10, 9), (5, 5)], 15, 14),
        # a correction takes a request back: the counters hold, then catch up
        ([(10, 9), (-1, -1)], 10, 9),
        ([(10, 9), (-1, -1), (3, 3)], 12, 11),
        ([(0, 0)], 0, 0),
    ],
)
def test_slo_counters_never_go_down(
    steps: list[tuple[int, int]], want_total: int, want_good: int
) -> None:
    c = WindowCounters()
    for i, (total, good) in enumerate(steps):
        w = window([], total=total, good=good, correction=i > 0 and total < 0)
        c.add(dataclasses.replace(w, start_ms=T0 + i * STEP))
    by = {f.name: f for f in c.families()}
    assert by["tailguard_slo_requests"].samples[0].value == want_total  # type: ignore[union-attr]
    assert by["tailguard_slo_good_requests"].samples[0].value == want_good  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("steps", "want"),
    [
        ([4], 4),
        ([4, 3], 7),
        ([4, 4], 8),
        ([4, -1], 4),  # a correction takes one back: the counter holds
        ([4, -1, 2], 5),
    ],
)
def test_tier_counter_counts_summaries_once_and_never_goes_down(
    steps: list[int], want: int
) -> None:
    c = WindowCounters()
    for i, n in enumerate(steps):
        w = window([], total=abs(n), good=0, correction=n < 0, tiers={"blended": n})
        c.add(dataclasses.replace(w, start_ms=T0 + i * STEP))
        if n >= 0:
            c.add(dataclasses.replace(w, start_ms=T0 + i * STEP))  # at-least-once: a repeat
    by = {f.name: f for f in c.families()}
    (sample,) = by["tailguard_slo_tier_secondary_good_requests"].samples
    assert sample.labels == (("tier", "blended"),)  # type: ignore[union-attr]
    assert sample.value == want  # type: ignore[union-attr]


def test_summaries_carry_the_tier_count_the_counters_lack() -> None:
    """slo-example.yaml's blended tier: tier1-gateway (total <= 400 ms) first, tier2-compute
    (inference <= 250 ms) at 0.7: a request good on both, one good on tier 2 only, one bad
    on both. The summary's tier count is the middle one; with the primary's counters it
    gives the blended compliance (1 + 0.7 x 1) / 3."""
    spec = load_spec_file("specs/slo-example.yaml")
    acc = WindowSLOCounts(spec)
    for i, (total_ms, inference_ms) in enumerate([(300.0, 200.0), (600.0, 200.0),
                                                  (600.0, 300.0)]):  # fmt: skip
        r = build_record(f"r{i}", received(f"r{i}"), completed(f"r{i}"), finished(f"r{i}"))
        acc.add(msgspec.structs.replace(r, gateway_total_ms=total_ms, inference_ms=inference_ms))
    win = ClosedWindow(0, T0, STEP, {}, {}, acc)
    s = summarize(win)
    assert s.tiers == {"blended": 1}
    assert (s.slos["tier1-gateway"].total, s.slos["tier1-gateway"].good) == (3, 1)
    c = WindowCounters()
    c.add(s)
    by = {f.name: f for f in c.families()}
    (sample,) = by["tailguard_slo_tier_secondary_good_requests"].samples
    assert sample.value == 1  # type: ignore[union-attr]
    # a correction carries the tier's count too; a provisional summary none
    assert summarize(dataclasses.replace(win, correction=True), correction_id="x").tiers == {
        "blended": 1
    }
    assert summarize(win, final=False).tiers == {}


def test_a_repeated_final_window_is_counted_once() -> None:
    c = WindowCounters()
    w = window([5.0, 50.0], total=2, good=1)
    for _ in range(3):  # at-least-once: the flush's summaries sent again
        c.add(w)
    c.add(dataclasses.replace(w, start_ms=w.start_ms + STEP))  # the next window counts
    by = {f.name: f for f in c.families()}
    assert by["tailguard_slo_requests"].samples[0].value == 4  # type: ignore[union-attr]
    (h,) = by["tailguard_request_latency_seconds"].samples
    assert isinstance(h, HistogramSample)
    assert h.buckets[-1][1] == 4


def test_provisional_windows_are_not_counted() -> None:
    c = WindowCounters()
    c.add(dataclasses.replace(window([5.0], total=1, good=1), final=False))
    assert c.families() == []


@pytest.mark.parametrize(
    ("latencies_ms", "threshold_ms", "le_s", "want"),
    [
        # (values 2 % or more from a bound: a sketch bin holding the bound could count
        # either way, within the sketch's relative accuracy, 1 %)
        ([95.0, 250.0, 1950.0, 2500.0], 2000.0, 2.0, 3),
        ([95.0, 250.0, 1950.0, 2500.0], 2000.0, 0.1, 1),
        ([95.0, 250.0, 1950.0, 2500.0], 2000.0, math.inf, 4),
        ([0.0, 0.5], 50.0, 0.001, 2),  # zero and sub-millisecond: the first bucket
        ([700.0], 730.0, 0.73, 1),  # an odd threshold is a bucket bound (0.6: 0, 0.8: 1)
        ([700.0], 730.0, 0.6, 0),
    ],
)
def test_histogram_buckets_count_the_sketch(
    latencies_ms: list[float], threshold_ms: float, le_s: float, want: int
) -> None:
    c = WindowCounters({"gateway_ttfb_ms": [threshold_ms]})
    c.add(window(latencies_ms, total=len(latencies_ms), good=0))
    c.add(window([], total=0, good=0))  # no latencies: nothing added
    (h,) = [f for f in c.families() if f.kind == "histogram"]
    (sample,) = h.samples
    assert isinstance(sample, HistogramSample)
    assert dict(sample.labels)["gen_ai_request_model"] == "llama"
    buckets = dict(sample.buckets)
    assert threshold_ms / 1000 in buckets
    assert buckets[le_s] == want
    assert sample.sum == pytest.approx(sum(latencies_ms) / 1000, rel=0.01)
    assert [n for _, n in sample.buckets] == sorted(n for _, n in sample.buckets)


def test_no_traffic_is_no_sample() -> None:
    book = book_with([1.0] * 10)
    state = MetricsState()
    state.publish(book.evaluate(T0 + 7 * 86_400_000), {}, {})  # a week later: windows empty
    got = scrape(state)
    assert not [k for k in got.get("tailguard_slo_burn_rate", {}) if ("window", "5m") in k]
    assert "tailguard_slo_objective_ratio" in got
    assert all(not math.isnan(v) for fam in got.values() for v in fam.values())


def test_every_boundary_has_one_otel_name() -> None:
    assert set(BOUNDARY_NAMES) == set(BOUNDARIES)
    from opentelemetry.semconv._incubating.metrics import gen_ai_metrics
    from opentelemetry.semconv.metrics import http_metrics

    metrics = {o.name for o in BOUNDARY_NAMES.values() if o.kind == "metric"}
    assert metrics == {
        http_metrics.HTTP_SERVER_REQUEST_DURATION,
        gen_ai_metrics.GEN_AI_SERVER_REQUEST_DURATION,
        gen_ai_metrics.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN,
        gen_ai_metrics.GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN,
    }
    assert BOUNDARY_NAMES["ttft_engine_ms"].prometheus_name == (
        "gen_ai_server_time_to_first_token_seconds"
    )


# --- alerts ---------------------------------------------------------------------------


def test_alerts_fire_then_resolve_once() -> None:
    fractions = [0.995] * 2160 + [0.2] * 360
    book = book_with(fractions)
    tracker = AlertTracker()
    now = T0 + len(fractions) * STEP
    first = tracker.step(book.evaluate(now), now)
    assert first
    assert all(not m.resolved for m in first)
    labels = [dict(m.labels) for m in first]
    assert {lab["severity"] for lab in labels} <= {"page", "ticket"}
    assert all(lab["slo"] == "ttft-stream" for lab in labels)
    assert all(lab["burnrate_tier"] for lab in labels)
    assert "page-fast-burn" in {lab["burnrate_tier"] for lab in labels}
    # still firing: re-sent with the same start
    again = tracker.step(book.evaluate(now + STEP), now + STEP)
    same = {m.labels: m.starts_at_ms for m in again}
    assert all(same[m.labels] == now for m in first if m.labels in same)
    # a quiet week later nothing fires: each alert is resolved once, then nothing is sent
    later = now + 7 * 86_400_000
    resolved = tracker.step(book.evaluate(later), later)
    assert {m.labels for m in resolved} == {m.labels for m in again}
    assert all(m.resolved and m.ends_at_ms == later for m in resolved)
    doc = resolved[0].to_json()
    assert doc["endsAt"].endswith("+00:00")
    assert tracker.step(book.evaluate(later + STEP), later + STEP) == []


def test_webhook_signature() -> None:
    body = b'{"alerts": []}'
    sig = sign(b"k", 1_700_000_000, body)
    assert sig.startswith("sha256=")
    assert verify_signature(b"k", "1700000000", body, sig, now_s=1_700_000_010)
    assert not verify_signature(b"k", "1700000000", body + b" ", sig, now_s=1_700_000_010)
    assert not verify_signature(b"other", "1700000000", body, sig, now_s=1_700_000_010)
    assert not verify_signature(b"k", "1700000000", body, sig, now_s=1_700_001_000)  # stale
    assert not verify_signature(b"k", "soon", body, sig, now_s=1_700_000_000)


def test_load_families_expose_load_signals_admission_and_notices() -> None:
    from pipeline.core.slo_exposition import load_families

    fams = load_families(
        {"m": {"load.caused": True, "load.queue_share": 0.8, "queue.depth_ratio": 2.0}},
        {"m": 7.5, "n": None},
        [("m", "ttft")],
    )
    by = {f.name: f for f in fams}
    assert by["tailguard_load_caused"].samples[0].value == 1.0
    assert by["tailguard_load_queue_share_ratio"].samples[0].value == 0.8
    assert [s.value for s in by["tailguard_admit_rps"].samples] == [7.5]  # n: admission off
    (nlc,) = by["tailguard_burn_not_load_caused"].samples
    assert dict(nlc.labels)["slo"] == "ttft"
    assert "tailguard_load_demand_ratio" not in by  # unknown: no sample


def test_not_load_caused_alert_fires_and_resolves() -> None:
    from pipeline.core.alerts import AlertTracker
    from pipeline.core.control import LoadNotice

    t = AlertTracker()
    n = LoadNotice(60_000, "m", "chat-total", 0.05, "chat-total burning 90x on m, not load-caused")
    (a,) = t.step([], 60_000, [n])
    labels = dict(a.labels)
    assert labels["alertname"] == "TailguardBurnNotLoadCaused"
    assert (labels["slo"], labels["scope"], labels["severity"]) == ("chat-total", "m", "ticket")
    assert "not load-caused" in dict(a.annotations)["summary"]
    (r,) = t.step([], 70_000)
    assert r.resolved


@pytest.mark.parametrize(
    ("relative_accuracy", "schema"),
    # the coarsest schema whose buckets grow by at most half the sketch's error
    [(0.01, 8), (0.02, 7), (0.05, 5), (0.5, 2), (0.001, 8)],
)
def test_native_schema(relative_accuracy: float, schema: int) -> None:
    assert native_schema(relative_accuracy) == schema
    assert native_upper_bound(1, schema) - 1 <= relative_accuracy / 2 or schema == 8


@pytest.mark.parametrize(
    ("value", "schema", "index"),
    [
        # bucket i holds (2^((i-1)/2^s), 2^(i/2^s)]: a bound is in the bucket below it
        (1.0, 8, 0), (2.0, 8, 256), (0.5, 8, -256), (1.0027, 8, 1), (1.0028, 8, 2),
        (0.001, 8, -2551), (300.0, 8, 2107),
        (64.0, 0, 6), (65.0, 0, 7),
        (1.0, -1, 0), (2.0, -1, 1), (4.0, -1, 1), (5.0, -1, 2),
    ],
)  # fmt: skip
def test_native_index(value: float, schema: int, index: int) -> None:
    assert native_index(value, schema) == index
    assert native_upper_bound(index - 1, schema) < value <= native_upper_bound(index, schema)


def test_native_buckets_count_the_sketch() -> None:
    latencies = [0.0, 0.0, 3.0, 95.0, 95.5, 2500.0, 64_000.0]
    c = WindowCounters({"gateway_ttfb_ms": [2000.0]})
    c.add(window(latencies, total=len(latencies), good=0))
    (h,) = next(f for f in c.families() if f.kind == "histogram").samples
    assert isinstance(h, HistogramSample)
    assert h.native is not None
    assert (h.native.schema, h.native.zero_count) == (8, 2)
    # 95 and 95.5 ms: one sketch bin (2 % wide), so one native bucket
    assert [n for _, n in h.native.positive] == [1, 2, 1, 1]
    for (i, _), v_ms in zip(h.native.positive, [3.0, 95.0, 2500.0, 64_000.0], strict=True):
        # the bucket of the sketch's value: within the sketch's 1 % of the observation
        lo, hi = native_upper_bound(i - 1, 8), native_upper_bound(i, 8)
        assert lo < v_ms / 1000 * 1.01
        assert hi > v_ms / 1000 * 0.99
