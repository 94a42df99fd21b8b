"""The exported rules in a real Prometheus (built from its Go module by
``tools.dev.prometheus_local``): ``promtool check rules`` on the shipped and an unseen spec,
``promtool test rules`` fixtures that encode the burn-rate arithmetic, ``promtool check
metrics`` on ``/metrics``, and a Prometheus on 127.0.0.1 that scrapes two workers'
``/metrics`` through an overload: the page reaches the real Alertmanager (the ticket it
inhibits stays silent), then resolves when good traffic returns."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.adapters.prometheus import MetricsServer, MetricsState, render_for
from pipeline.app.rules import export_text, to_yaml
from pipeline.contract.summary import ModelWindow, SLOWindowCounts, WindowSummary
from pipeline.core.budget import BudgetBook
from pipeline.core.prom_rules import ALERTNAME, alertmanager_example
from pipeline.core.sketch import QuantileSketch
from pipeline.core.slo_exposition import WindowCounters
from pipeline.shipped import DEFAULT_BURN_RULES, DEFAULT_SLO_SPEC
from pipeline.spec.burn_rules import load_burn_rules_file
from pipeline.spec.slo import load_spec_file
from tests import ceilings
from tests.metrics_workers import served_workers
from tests.paths import SPECS
from tools.dev.alertmanager_local import LocalAlertmanager
from tools.dev.prometheus_local import LocalPrometheus, run_promtool

pytestmark = pytest.mark.integration

UNSEEN_SPEC = """
apiVersion: tailguard/v1
kind: SLOSpec
slos:
  - name: decode-weekly
    boundary: tpot_ms
    threshold_ms: 35
    objective: 0.995
    window: {calendar: week}
  - name: engine-e2e
    boundary: engine_e2e_ms
    threshold_ms: 12000
    threshold_strict: true
    objective: 0.9
    window: {rolling: 7d}
    errors: exclude
tiers:
  decode-or-e2e: {primary: engine-e2e, secondary: decode-weekly, secondary_weight: 0.25,
                  objective: 0.85}
"""

# Windows of seconds, so that a real Prometheus fires and resolves within a test.
FAST_RULES = """
apiVersion: tailguard/v1
kind: BurnRules
rules:
  - {name: page-fast, kind: burn_rate, severity: page, factor: 10, long: 20s, short: 4s,
     min_requests: 50}
  - {name: ticket-slow, kind: burn_rate, severity: ticket, factor: 2, long: 1m, short: 10s}
"""

FAST_SPEC = """
apiVersion: tailguard/v1
kind: SLOSpec
slos:
  - name: ttft
    boundary: gateway_ttfb_ms
    threshold_ms: 2000
    objective: 0.99
"""


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def promtool_ok(*args: str) -> str:
    out = run_promtool(*args)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout + out.stderr


@pytest.mark.parametrize("spec", ["shipped", "example", "unseen"])
@pytest.mark.parametrize("fmt", ["prometheus", "prometheusrule"])
def test_exported_rules_pass_promtool(tmp_path: Path, spec: str, fmt: str) -> None:
    """Every SLO has its page and its ticket, no more: its blended tiers', budget_fraction
    and compliance_below rules' conditions are in them."""
    spec_path = {
        "shipped": DEFAULT_SLO_SPEC,
        "example": SPECS / "slo-example.yaml",  # a blended tier
        "unseen": write(tmp_path / "s.yaml", UNSEEN_SPEC),  # a blended tier, a week
    }[spec]
    text = export_text(spec_path, DEFAULT_BURN_RULES, fmt)
    doc = yaml.safe_load(text)
    groups = doc["groups"] if fmt == "prometheus" else doc["spec"]["groups"]
    rules = write(tmp_path / "rules.yaml", to_yaml({"groups": groups}))
    assert "SUCCESS" in promtool_ok("check", "rules", str(rules))
    alerts = [r for g in groups for r in g["rules"] if "alert" in r]
    per_slo: dict[str, int] = {}
    for a in alerts:
        if a["alert"] == ALERTNAME:
            per_slo[a["labels"]["slo"]] = per_slo.get(a["labels"]["slo"], 0) + 1
    assert per_slo  # every SLO has its page and ticket, no more
    assert set(per_slo.values()) == {2}
    assert {a["alert"] for a in alerts} == {
        ALERTNAME, "TailguardEvaluationsStopped", "TailguardWindowsStopped",
    }  # fmt: skip


def test_alertmanager_example_loads_in_alertmanager(tmp_path: Path) -> None:
    """The example loads in the real Alertmanager (it refuses a bad config at start)."""
    config = to_yaml(alertmanager_example())
    with LocalAlertmanager(tmp_path / "am", config=config) as am:
        assert am.alerts() == []


# --- promtool test rules: the burn-rate arithmetic --------------------------------------


def _series(name: str, worker: str, values: str) -> dict[str, str]:
    return {"series": f'{name}{{slo="ttft-stream", instance="{worker}"}}', "values": values}


def _two_workers(requests: str, good: str) -> list[dict[str, str]]:
    """Workers w1 and w2 each count ttft-stream's requests and good requests so."""
    return [
        s
        for w in ("w1", "w2")
        for s in (
            _series("tailguard_slo_requests_total", w, requests),
            _series("tailguard_slo_good_requests_total", w, good),
        )
    ]


def _unit_tests(
    rules: Path,
    series: list[dict[str, str]],
    alerts: list[tuple[str, list[dict[str, Any]]]],
    exprs: list[dict[str, Any]],
) -> dict[str, Any]:
    """A ``promtool test rules`` file: one test of ``series`` at one sample a minute, the
    page/ticket alerts expected at each time of ``alerts``, and the PromQL checks."""
    return {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {"eval_time": t, "alertname": ALERTNAME, "exp_alerts": exp} for t, exp in alerts
                ],
                "promql_expr_test": exprs,
            }
        ],
    }


def _expected(rule: dict[str, Any]) -> dict[str, Any]:
    labels = {
        "sloth_id": "tailguard-ttft-stream", "sloth_service": "tailguard",
        "sloth_slo": "ttft-stream", **rule["labels"],
    }  # fmt: skip
    annotations = {
        k: v.replace("{{ $labels.sloth_service }}", "tailguard")
        for k, v in rule["annotations"].items()
    }
    return {"exp_labels": labels, "exp_annotations": annotations}


def test_promtool_unit_tests_of_the_burn_rate_arithmetic(tmp_path: Path) -> None:
    """Two workers, 50 requests/min each, 0.5 % bad for an hour, then 40 % bad (objective
    0.99, budget 0.01; the shipped rules). Ticket: 6h and 3d ratios > 1 x 0.01 from about
    1 min into the burn; page: 30m and 6h ratios > 6 x 0.01 once (0.4 k + 0.3) / (60 + k) >
    0.06, k > 9.7 min (the 1h/5m pair needs k > 21). So at 55 min nothing, at 65 min the
    ticket alone, at 80 min both. The page holds the shipped budget_fraction and
    compliance_below rules too; at 65 min neither fires (0.16 of the projected daily
    budget spent within the hour; the 5m compliance low for 4 minutes, not 10).
    (promtool's ``a+bxn`` is n + 1 samples: the burn's series starts one step on.)"""
    text = export_text(DEFAULT_SLO_SPEC, DEFAULT_BURN_RULES)
    rules = write(tmp_path / "rules.yaml", text)
    doc = yaml.safe_load(text)
    mine = {
        r["labels"]["severity"]: r
        for g in doc["groups"]
        for r in g["rules"]
        if r.get("alert") == ALERTNAME and r["labels"]["slo"] == "ttft-stream"
    }
    good = "0+49.75x60 3015+30x59"  # per worker: 0.5 % bad, then 40 % bad from minute 60
    series = _two_workers("0+50x120", good)
    cases = [
        ("55m", []),
        ("65m", [_expected(mine["ticket"])]),
        ("80m", [_expected(mine["page"]), _expected(mine["ticket"])]),
    ]
    exprs = [
        {  # Sloth's ratio over the workers: 40 % bad over the last 5 minutes
            "expr": 'slo:sli_error:ratio_rate5m{sloth_slo="ttft-stream"}',
            "eval_time": "80m",
            "exp_samples": [
                {
                    "labels": 'slo:sli_error:ratio_rate5m{sloth_id="tailguard-'
                    'ttft-stream", sloth_service="tailguard", '
                    'sloth_slo="ttft-stream", sloth_window="5m"}',
                    "value": 0.4,
                }
            ],
        }
    ]
    tests = _unit_tests(rules, series, cases, exprs)
    path = write(tmp_path / "tests.yaml", yaml.safe_dump(tests, sort_keys=False))
    assert "SUCCESS" in promtool_ok("test", "rules", str(path))

    # the fixture can fail: the page expected 15 minutes early is refused
    early = _unit_tests(rules, series, [("65m", cases[2][1])], exprs)
    bad = write(tmp_path / "bad.yaml", yaml.safe_dump(early, sort_keys=False))
    assert run_promtool("test", "rules", str(bad)).returncode != 0


ONE_SLO = """
apiVersion: tailguard/v1
kind: SLOSpec
slos:
  - {name: ttft-stream, boundary: gateway_ttfb_ms, threshold_ms: 2000, objective: 0.99}
"""

# budget_fraction: 20 % of the daily budget within an hour (the shipped rule). Two workers,
# 50 requests/min each, 0.5 % bad for 2 h, then 8 % bad. Allowed over 1d: 0.01 x 100/min x
# 1440 min = 1440 (rate() over the 2-3 h seen x 1d: the evaluator's projection of a young
# history); bad over 1h after k minutes of the burn: 8 k + 0.5 (60 - k) >= 288 from k =
# 34.4 (the 1h burn rate is then 4.8x = 0.2 x 24). 150 min: nothing; 160 min: the page,
# having spent (8 x 40 + 0.5 x 20) / 1440 = 0.23 (rate()'s 59 intervals: 0.233).
FRACTION_CASE = {
    "rules": "  - {name: daily-budget-20pct-in-1h, kind: budget_fraction, severity: page,\n"
    "     fraction: 0.2, within: 1h, of: 1d, min_requests: 200}\n",
    "good": "0+49.75x120 6016+46x59",
    "minutes": 180,
    "cases": [("150m", False), ("160m", True)],
    "refused": "150m",
    "expr": (
        'round(tailguard:slo_error_budget_spent:ratio{sloth_slo="ttft-stream"}, 0.01)',
        "160m",
        0.23,
    ),
}
# compliance_below: compliance over 5m < 98 % at every evaluation for 10m (the shipped
# rule). 0.5 % bad for 1 h, then 5 % bad from minute 60: the 5m ratio (4 one-minute
# intervals, left-open range) is 1.6 % at 61 min, 2.75 % at 62 min, the first low
# evaluation; the page fires 10 minutes later, at 72 min, not at 71.
BELOW_CASE = {
    "rules": "  - {name: slo-violation-imminent, kind: compliance_below, severity: page,\n"
    "     window: 5m, below: 0.98, for: 10m}\n",
    "good": "0+49.75x60 3032.5+47.5x59",
    "minutes": 120,
    "cases": [("61m", False), ("71m", False), ("72m", True), ("90m", True)],
    "refused": "71m",
    "expr": ('round(slo:sli_error:ratio_rate5m{sloth_slo="ttft-stream"}, 0.0001)', "62m", 0.0275),
}
TIER_SPEC = """
apiVersion: tailguard/v1
kind: SLOSpec
slos:
  - {name: ttft-stream, boundary: gateway_ttfb_ms, threshold_ms: 2000, objective: 0.99}
  - {name: engine, boundary: ttft_engine_ms, threshold_ms: 1500, objective: 0.99}
tiers:
  blended: {primary: ttft-stream, secondary: engine, secondary_weight: 0.5, objective: 0.99}
"""
# A blended tier (its rule only: `slos: [blended]`), paged as its primary. 0.5 % bad for
# 1 h, then 20 % bad for the primary of which 16 % good on the secondary: the tier's
# ratio is 0.20 - 0.5 x 0.16 = 0.12 (the weight counts: without it 0.20, the page at
# 77 min). 6x over 1h: the 1h ratio (59 intervals) passes 0.06 between 85 and 90 min.
TIER_CASE = {
    "spec": TIER_SPEC,
    "rules": "  - {name: tier-burn, kind: burn_rate, severity: page, factor: 6, long: 1h,\n"
    "     short: 5m, slos: [blended]}\n",
    "good": "0+49.75x60 3025+40x59",
    "tier": "0x60 8+8x59",
    "minutes": 120,
    "cases": [("85m", False), ("90m", True)],
    "refused": "85m",
    "expr": ('round(slo:sli_error:ratio_rate5m{sloth_slo="blended"}, 0.0001)', "95m", 0.12),
}


@pytest.mark.parametrize(
    "case", [FRACTION_CASE, BELOW_CASE, TIER_CASE], ids=["budget-fraction", "below", "tier"]
)
def test_promtool_unit_tests_of_the_other_rule_kinds(tmp_path: Path, case: dict[str, Any]) -> None:
    """budget_fraction and compliance_below, and a blended tier's burn rate, exported into
    the SLO's one page alert: when it fires, from the evaluator's arithmetic
    (pipeline.core.budget, pipeline.core.slo)."""
    burn = "apiVersion: tailguard/v1\nkind: BurnRules\nrules:\n" + case["rules"]
    spec = write(tmp_path / "s.yaml", case.get("spec", ONE_SLO))
    text = export_text(spec, write(tmp_path / "b.yaml", burn))
    rules = write(tmp_path / "rules.yaml", text)
    doc = yaml.safe_load(text)
    (page,) = [r for g in doc["groups"] for r in g["rules"] if r.get("alert") == ALERTNAME]
    assert page["labels"]["severity"] == "page"
    n = case["minutes"]
    series = _two_workers(f"0+50x{n}", case["good"])
    if "tier" in case:
        series += [
            {"series": f'tailguard_slo_tier_secondary_good_requests_total{{tier="blended", '
             f'instance="{w}"}}', "values": case["tier"]}
            for w in ("w1", "w2")
        ]  # fmt: skip
    expr, at, value = case["expr"]

    def tests(cases: list[tuple[str, bool]]) -> dict[str, Any]:
        alerts = [(t, [_expected(page)] if firing else []) for t, firing in cases]
        check = {
            "expr": f"sum({expr})",
            "eval_time": at,
            "exp_samples": [{"labels": "{}", "value": value}],
        }
        return _unit_tests(rules, series, alerts, [check])

    path = write(tmp_path / "tests.yaml", yaml.safe_dump(tests(case["cases"]), sort_keys=False))
    assert "SUCCESS" in promtool_ok("test", "rules", str(path))
    # the fixture can fail: the page expected one step early is refused
    bad = write(tmp_path / "bad.yaml", yaml.safe_dump(tests([(case["refused"], True)])))
    assert run_promtool("test", "rules", str(bad)).returncode != 0


def test_promtool_check_metrics_accepts_the_exposition() -> None:
    state = MetricsState(
        health=lambda: {"consumer_lag_messages": 0, "events_consumed": 10, "store_up": 1}
    )
    state.use_counters(WindowCounters({"gateway_ttfb_ms": [2000.0]}))
    state.windows_stored([_window(10, 9, [120.0, 2500.0])])
    spec = load_spec_file(DEFAULT_SLO_SPEC)
    book = BudgetBook(spec, load_burn_rules_file())
    t0, step = 1_767_225_600_000, 10_000
    for i, frac in enumerate([0.995] * 2160 + [0.9] * 180):  # 6 h fine, then a burn
        book.add_window(spec.slos[0].name, t0 + i * step, step, 100, 100 * frac)
    state.publish(book.evaluate(t0 + 2340 * step), {"*": 1}, {"m": {"p99.queue_ms": 120.0}})
    body, content_type = render_for(state.families(), "")  # what curl gets
    assert content_type.startswith("text/plain; version=0.0.4")
    out = run_promtool_stdin(body)
    assert out == ("", 0)


def run_promtool_stdin(body: bytes) -> tuple[str, int]:
    import subprocess

    from tools.dev.prometheus_local import promtool

    r = subprocess.run(
        [str(promtool()), "check", "metrics"], input=body, capture_output=True, check=False,
        timeout=60,
    )  # fmt: skip
    return (r.stdout + r.stderr).decode(), r.returncode


# --- a real Prometheus, two workers, an overload, the real Alertmanager -----------------


def _window(total: int, good: int, latencies_ms: list[float], start_ms: int = 0) -> WindowSummary:
    sk = QuantileSketch(0.01)
    sk.add_many(latencies_ms)
    return WindowSummary(
        0, start_ms, 10_000,
        {"m": ModelWindow(len(latencies_ms), {"gateway_ttfb_ms": sk.to_columns()})},
        {"ttft": SLOWindowCounts(total, good, 0.99)},
    )  # fmt: skip


class Feeder:
    """Windows into two workers' counters every ``period_s``, at the phase's good share."""

    def __init__(self, states: list[MetricsState], period_s: float = 0.2) -> None:
        self.states = states
        self.period_s = period_s
        self.good_per_100 = 100
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        i = 0
        while not self.stop.wait(self.period_s):
            good = self.good_per_100
            lat = [450.0] * good + [2800.0] * (100 - good)
            # each worker its own windows (a repeat would be counted once)
            self.states[i % 2].windows_stored([_window(100, good, lat, i * 10_000)])
            i += 1


def wait_for(fn: Callable[[], Any], what: str, timeout_s: float = 60.0) -> Any:
    """Poll Prometheus' and Alertmanager's APIs until ``fn()`` is truthy."""
    return ceilings.wait_for(fn, what, timeout_s, poll_s=0.2)


@pytest.fixture
def two_workers() -> Iterator[tuple[list[MetricsState], list[MetricsServer]]]:
    with served_workers(lambda: WindowCounters({"gateway_ttfb_ms": [2000.0]})) as workers:
        yield workers


def test_real_prometheus_pages_through_alertmanager_and_resolves(
    tmp_path: Path, two_workers: tuple[list[MetricsState], list[MetricsServer]]
) -> None:
    states, servers = two_workers
    text = export_text(
        write(tmp_path / "spec.yaml", FAST_SPEC), write(tmp_path / "burn.yaml", FAST_RULES)
    )
    rules = write(tmp_path / "rules.yaml", text)
    assert "SUCCESS" in promtool_ok("check", "rules", str(rules))
    feeder = Feeder(states)
    am_config = to_yaml(alertmanager_example("http://127.0.0.1:9/"))  # nobody listens: fine
    with LocalAlertmanager(tmp_path / "am", config=am_config) as am:
        targets = [f"{s.host}:{s.port}" for s in servers]
        am_target = am.url.removeprefix("http://")
        with LocalPrometheus(
            tmp_path / "prom", targets=targets, rule_files=[rules], alertmanager=am_target
        ) as prom:
            feeder.thread.start()
            try:
                ours = _ours(prom)
                # good traffic: the ratios are recorded from both workers, nothing fires
                wait_for(
                    lambda: (
                        _value(prom, 'tailguard:slo_requests:increase4s{sloth_slo="ttft"}') >= 50
                    ),
                    "the 4 s request count over both workers",
                )
                assert len(prom.query("tailguard_slo_requests_total")) == 2
                ratio = _value(prom, 'slo:sli_error:ratio_rate20s{sloth_slo="ttft"}')
                assert ratio == pytest.approx(0.0, abs=1e-9)
                assert ours() == []
                # the overload: 40 % bad; the page fires and reaches Alertmanager
                feeder.good_per_100 = 60
                began = time.monotonic()
                wait_for(lambda: "page" in ours(), "the page alert firing in Prometheus")
                page = wait_for(lambda: _am(am, "page"), "the page in Alertmanager")
                paged_s = time.monotonic() - began
                assert page["labels"]["sloth_slo"] == "ttft"
                assert page["labels"]["source"] == "prometheus"
                assert page["annotations"]["boundary"].startswith("gateway_ttfb_ms <= 2000 ms")
                # the ticket burns too, and the page inhibits it
                ticket = wait_for(lambda: _am(am, "ticket", active=None), "the ticket")
                assert ticket["status"]["inhibitedBy"], ticket["status"]
                # PromQL aggregates the two workers' histograms: the P99 lies in the bad
                # requests' bucket (2.8 s: (2.5, 3] s)
                p99 = _value(
                    prom,
                    "histogram_quantile(0.99, sum by (le) "
                    "(rate(tailguard_request_latency_seconds_bucket[20s])))",
                )
                assert 2.5 < p99 <= 3.0
                # good traffic again: the page resolves in Prometheus and in Alertmanager
                feeder.good_per_100 = 100
                ended = time.monotonic()
                wait_for(lambda: "page" not in ours(), "the page resolved in Prometheus")
                wait_for(lambda: not _am(am, "page"), "the page resolved in Alertmanager")
                # figures for the record (-s), not asserted: they are the machine's
                print(
                    f"page in Alertmanager {paged_s:.1f} s after the overload began "
                    f"(rules: 10x over 20s and 4s); resolved there "
                    f"{time.monotonic() - ended:.1f} s after it ended"
                )
            finally:
                feeder.stop.set()
                feeder.thread.join(10)


def _ours(prom: LocalPrometheus) -> Callable[[], list[str]]:
    def firing() -> list[str]:
        return sorted(
            a["labels"]["severity"]
            for a in prom.alerts()
            if a["labels"].get("alertname") == ALERTNAME and a["state"] == "firing"
        )

    return firing


def _value(prom: LocalPrometheus, expr: str) -> float:
    result = prom.query(expr)
    return float(result[0]["value"][1]) if result else float("nan")


def _am(am: LocalAlertmanager, severity: str, active: str | None = "true") -> Any:
    filters = {"active": active} if active else {}
    for a in am.alerts(**filters):
        labels = a["labels"]
        if labels.get("alertname") == ALERTNAME and labels.get("severity") == severity:
            return a
    return None
