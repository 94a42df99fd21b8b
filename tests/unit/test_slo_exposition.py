"""/metrics content (Sloth names, parsed back with prometheus_client's OpenMetrics parser),
burn-rate alerts as Alertmanager alerts (firing, resolved), and the webhook signature."""

from __future__ import annotations

import math

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from pipeline.adapters.alerting import sign, verify_signature
from pipeline.adapters.prometheus import MetricsState, render
from pipeline.core.alerts import AlertTracker
from pipeline.core.budget import BudgetBook
from pipeline.core.otel_names import BOUNDARY_NAMES
from pipeline.core.record import BOUNDARIES
from pipeline.spec.burn_rules import load_burn_rules_file
from pipeline.spec.slo import load_spec_file

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


def test_sloth_names_and_values_equal_the_trackers() -> None:
    # 6 h: 99.5 % good, then 30 min at 90 % (a burn)
    fractions = [0.995] * 2160 + [0.90] * 180
    book = book_with(fractions)
    now = T0 + len(fractions) * STEP
    statuses = book.evaluate(now)
    (st,) = statuses
    state = MetricsState(health=lambda: {"consumer_lag_messages": 7})
    state.publish(statuses, {"llama": 2, "*": 0}, {"llama": {"p99.ttft_engine_ms": 812.5}})
    got = scrape(state)

    tracker = book.tracker(st.slo)
    share = 1 - st.objective
    for label, ms in (("5m", 300_000), ("30m", 1_800_000), ("1h", 3_600_000), ("6h", 21_600_000)):
        c = tracker.counts(now - ms, now)
        want = c.bad / c.total
        value = one(got[f"slo:sli_error:ratio_rate{label}"], sloth_slo=st.slo, scope="*")
        assert value == pytest.approx(want, rel=1e-9, abs=1e-12)
        compliance = one(got["tailguard_slo_compliance_ratio"], window=label)
        assert compliance == pytest.approx(1 - want, rel=1e-9)
    assert one(got["slo:sli_error:ratio_rate30d"]) == pytest.approx(1 - st.compliance)
    assert one(got["slo:objective:ratio"]) == st.objective
    assert one(got["slo:error_budget:ratio"]) == pytest.approx(share)
    assert one(got["slo:time_period:days"]) == 30
    assert one(got["slo:current_burn_rate:ratio"]) == pytest.approx(st.burn_rates["5m"])
    assert one(got["slo:period_burn_rate:ratio"]) == pytest.approx(st.consumed / st.allowed)
    assert one(got["slo:period_error_budget_remaining:ratio"]) == pytest.approx(
        st.remaining_fraction
    )
    assert one(got["sloth_slo_info"], sloth_id=f"tailguard-{st.slo}") == 1
    firing = {dict(k)["rule"]: dict(k)["severity"] for k in got["tailguard_slo_alert_firing"]}
    assert firing == {a.rule: a.severity for a in st.alerts}
    assert firing  # the burn fires something
    assert one(got["tailguard_control_level"], scope="llama") == 2
    assert one(got["tailguard_control_level"], scope="*") == 0
    p99 = one(got["tailguard_latency_p99_seconds"], boundary="ttft_engine_ms")
    assert p99 == pytest.approx(0.8125)
    assert one(got["tailguard_latency_p99_seconds"], otel_name="gen_ai.server.time_to_first_token")
    assert got["tailguard_worker_consumer_lag_messages"] == {(): 7.0}


def test_no_traffic_is_no_sample() -> None:
    book = book_with([1.0] * 10)
    state = MetricsState()
    state.publish(book.evaluate(T0 + 7 * 86_400_000), {}, {})  # a week later: windows empty
    got = scrape(state)
    assert "slo:sli_error:ratio_rate5m" not in got
    assert "slo:objective:ratio" in got
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
