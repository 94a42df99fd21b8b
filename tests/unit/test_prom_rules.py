"""Prometheus rules from the spec (pipeline.core.prom_rules): which groups, windows, alerts
and labels each SLO gets, table-driven over specs and burn rules; the command's YAML.
(promtool and a real Prometheus judge them in tests/integration/test_prometheus_rules.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.app.rules import export_text
from pipeline.cli import main
from pipeline.core.prom_rules import (
    ALERTNAME,
    INHIBIT_RULES,
    RulesOptions,
    alertmanager_example,
    prometheus_rule,
    rule_groups,
)
from pipeline.shipped import DEFAULT_BURN_RULES, DEFAULT_SLO_SPEC
from pipeline.spec.burn_rules import load_burn_rules, load_burn_rules_file
from pipeline.spec.slo import load_spec, load_spec_file


def spec_of(**slo: Any) -> Any:
    base = {"name": "s", "boundary": "gateway_ttfb_ms", "threshold_ms": 1000,
            "objective": 0.99, **slo}  # fmt: skip
    return load_spec(
        yaml.safe_dump({"apiVersion": "tailguard/v1", "kind": "SLOSpec", "slos": [base]})
    )


def rules_of(*rules: dict[str, Any]) -> Any:
    doc = {"apiVersion": "tailguard/v1", "kind": "BurnRules", "rules": list(rules)}
    return load_burn_rules(yaml.safe_dump(doc))


PAGE = {"name": "p", "kind": "burn_rate", "severity": "page", "factor": 14.4, "long": "1h",
        "short": "5m", "min_requests": 200}  # fmt: skip
PAGE2 = {"name": "p2", "kind": "burn_rate", "severity": "page", "factor": 6, "long": "6h",
         "short": "30m"}  # fmt: skip
TICKET = {"name": "t", "kind": "burn_rate", "severity": "ticket", "factor": 1, "long": "3d",
          "short": "6h"}  # fmt: skip
FRACTION = {"name": "f", "kind": "budget_fraction", "severity": "page", "fraction": 0.2,
            "within": "1h", "of": "1d"}  # fmt: skip
BELOW = {"name": "c", "kind": "compliance_below", "severity": "page", "window": "5m",
         "below": 0.98, "for": "10m"}  # fmt: skip


def records(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        f"{r['record']}/{r['labels'].get('sloth_slo', '')}": r
        for g in doc["groups"]
        for r in g["rules"]
        if "record" in r
    }


def alerts(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for g in doc["groups"] for r in g["rules"] if r.get("alert") == ALERTNAME]


@pytest.mark.parametrize(
    ("slo", "rules", "want_windows", "want_guarded", "want_severities", "want_days"),
    [
        ({}, [PAGE, PAGE2, TICKET], ["5m", "30m", "1h", "6h", "3d"], ["5m"],
         ["page", "ticket"], 30),
        ({}, [PAGE], ["5m", "1h"], ["5m"], ["page"], 30),  # no ticket rule: one alert
        ({}, [TICKET], ["6h", "3d"], [], ["ticket"], 30),
        # budget_fraction: a spent-ratio recording, the page (its guard over `within`)
        ({}, [FRACTION], ["5m"], [], ["page"], 30),
        ({}, [{**FRACTION, "min_requests": 50}], ["5m"], ["1h"], ["page"], 30),
        # compliance_below: its window's ratio; folded into the page with the burn rules
        ({}, [PAGE, {**BELOW, "window": "10m", "min_requests": 20}], ["5m", "10m", "1h"],
         ["5m", "10m"], ["page"], 30),
        # ... skipped, as the evaluator skips it, for an objective below `below`
        ({"objective": 0.95}, [BELOW], ["5m"], [], [], 30),
        # every kind at once: still one page and one ticket
        ({}, [PAGE, PAGE2, FRACTION, BELOW, TICKET], ["5m", "30m", "1h", "6h", "3d"], ["5m"],
         ["page", "ticket"], 30),
        # a rule for another SLO only
        ({}, [{**PAGE, "slos": ["other"]}, TICKET], ["6h", "3d"], [], ["ticket"], 30),
        ({"window": {"calendar": "week"}}, [PAGE], ["5m", "1h"], ["5m"], ["page"], 7),
        ({"window": {"calendar": "month"}}, [PAGE], ["5m", "1h"], ["5m"], ["page"], 30),
        ({"window": {"rolling": "28d"}}, [PAGE], ["5m", "1h"], ["5m"], ["page"], 28),
    ],
    ids=["workbook", "page-only", "ticket-only", "fraction", "fraction-guarded",
         "compliance", "compliance-skipped", "every-kind", "other-slo", "week", "month", "28d"],
)  # fmt: skip
def test_groups_per_slo(  # noqa: PLR0917
    slo: dict[str, Any],
    rules: list[dict[str, Any]],
    want_windows: list[str],
    want_guarded: list[str],
    want_severities: list[str],
    want_days: float,
) -> None:
    doc = rule_groups(spec_of(**slo), rules_of(*rules))
    recs = records(doc)
    windows = [k.split("/")[0].removeprefix("slo:sli_error:ratio_rate") for k in recs
               if k.startswith("slo:sli_error:ratio_rate")]  # fmt: skip
    period = f"{want_days}d"
    assert windows == [*want_windows, *([period] if period not in want_windows else [])]
    guarded = [k.split("/")[0].removeprefix("tailguard:slo_requests:increase") for k in recs
               if k.startswith("tailguard:slo_requests:")]  # fmt: skip
    assert guarded == want_guarded
    assert recs["slo:time_period:days/s"]["expr"] == f"vector({want_days})"
    assert recs["slo:objective:ratio/s"]["expr"] == f"vector({slo.get('objective', 0.99)})"
    got = alerts(doc)
    assert [a["labels"]["severity"] for a in got] == want_severities
    assert len(got) <= 2
    for a in got:
        assert a["labels"]["slo"] == "s"
        assert a["annotations"]["boundary"].startswith("gateway_ttfb_ms <= 1000 ms for 99%")
        # every pair reads recordings this group writes
        for name in ("slo:sli_error:ratio_rate", "tailguard:slo_requests:increase"):
            for part in a["expr"].split(name)[1:]:
                assert f"{name}{part.split('{')[0]}/s" in recs


def tier_spec(**tier: Any) -> Any:
    slos = [
        {"name": "p", "boundary": "gateway_total_ms", "threshold_ms": 400, "objective": 0.99,
         "window": {"calendar": "week"}},
        {"name": "s", "boundary": "inference_ms", "threshold_ms": 250, "objective": 0.99},
    ]  # fmt: skip
    t = {"primary": "p", "secondary": "s", "secondary_weight": 0.7, "objective": 0.99, **tier}
    doc = {"apiVersion": "tailguard/v1", "kind": "SLOSpec", "slos": slos, "tiers": {"b": t}}
    return load_spec(yaml.safe_dump(doc))


@pytest.mark.parametrize(
    ("tier", "rules", "want"),
    [
        # every rule applies to the tier too: its conditions join p's page and ticket
        ({}, [PAGE, TICKET], {"p": ["page", "ticket"], "s": ["page", "ticket"]}),
        # a rule for the tier only: p's page is the tier's condition alone
        ({}, [{**PAGE, "slos": ["b"]}], {"p": ["page"]}),
        # a rule for p only: the tier has recordings, no condition
        ({}, [{**PAGE, "slos": ["p"]}], {"p": ["page"]}),
        # compliance_below skipped for a tier whose objective is below `below`
        ({"objective": 0.95}, [{**BELOW, "slos": ["b"]}], {}),
    ],
    ids=["all", "tier-only", "primary-only", "below-skipped"],
)
def test_a_tier_pages_as_its_primary(
    tier: dict[str, Any], rules: list[dict[str, Any]], want: dict[str, list[str]]
) -> None:
    doc = rule_groups(tier_spec(**tier), rules_of(*rules))
    got: dict[str, list[str]] = {}
    for a in alerts(doc):
        got.setdefault(a["labels"]["slo"], []).append(a["labels"]["severity"])
    assert got == want
    recs = records(doc)
    ratio = recs["slo:sli_error:ratio_rate5m/b"]["expr"]
    # the tier's good: its primary's good + weight x its secondary-only counter
    assert 'sum(rate(tailguard_slo_good_requests_total{slo="p"}[5m]))' in ratio
    assert (
        '0.7 * (sum(rate(tailguard_slo_tier_secondary_good_requests_total{tier="b"}[5m])) '
        "or vector(0))" in ratio
    )
    assert 'sum(rate(tailguard_slo_requests_total{slo="p"}[5m]))' in ratio
    assert recs["slo:objective:ratio/b"]["expr"] == f"vector({tier.get('objective', 0.99)})"
    assert recs["slo:time_period:days/b"]["expr"] == "vector(7)"  # the primary's window
    for a in alerts(doc):
        # each of the tier's conditions relabelled as the primary's: one series per alert
        sev, slo = a["labels"]["severity"], a["labels"]["slo"]
        mine = [r for r in rules if r.get("slos") in (None, ["b"]) and r["severity"] == sev]
        mine = mine if slo == "p" else []
        assert a["expr"].count('"sloth_slo", "p"') == len(mine)
        assert ("tier b (99%, secondary good at 0.7)" in a["annotations"]["summary"]) == bool(mine)


def test_burn_thresholds_are_factor_times_budget() -> None:
    (page,) = alerts(rule_groups(spec_of(objective=0.995), rules_of(PAGE)))
    assert page["expr"].count("> (14.4 * 0.005)") == 2
    assert "increase5m" in page["expr"]
    assert ">= 200" in page["expr"]


def test_strict_threshold_says_so() -> None:
    (page,) = alerts(rule_groups(spec_of(threshold_strict=True), rules_of(PAGE)))
    assert page["annotations"]["boundary"].startswith("gateway_ttfb_ms < 1000 ms")


def test_shipped_spec_and_deadman() -> None:
    spec = load_spec_file(DEFAULT_SLO_SPEC)
    opts = RulesOptions(runbook_url="https://runbooks.example/tailguard",
                        alert_labels=(("team", "serving"),))  # fmt: skip
    doc = rule_groups(spec, load_burn_rules_file(DEFAULT_BURN_RULES), opts)
    per_slo: dict[str, list[str]] = {}
    for a in alerts(doc):
        per_slo.setdefault(a["labels"]["slo"], []).append(a["labels"]["severity"])
        assert a["labels"]["team"] == "serving"
        assert a["annotations"]["runbook_url"] == "https://runbooks.example/tailguard"
    assert per_slo == {s.name: ["page", "ticket"] for s in spec.slos}
    (dead,) = [g for g in doc["groups"] if g["name"] == "tailguard-deadman"]
    assert [r["alert"] for r in dead["rules"]] == [
        "TailguardEvaluationsStopped", "TailguardWindowsStopped",
    ]  # fmt: skip
    assert all(":" not in r["expr"].split("(")[0] for r in dead["rules"])


def test_prometheusrule_and_alertmanager_documents() -> None:
    doc = rule_groups(spec_of(), rules_of(PAGE, TICKET))
    crd = prometheus_rule(doc)
    assert (crd["apiVersion"], crd["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert crd["spec"] == doc
    am = alertmanager_example("http://hooks.example/")
    assert am["inhibit_rules"] == INHIBIT_RULES
    (rule,) = INHIBIT_RULES
    assert 'severity="page"' in rule["source_matchers"]
    assert 'severity="ticket"' in rule["target_matchers"]
    assert rule["equal"] == ["sloth_id"]  # the same SLO


def test_command_writes_yaml(tmp_path: Path) -> None:
    out = tmp_path / "rules.yaml"
    assert main(["rules", "export", "-o", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("# Generated by `tailguard rules export` from slo-default.yaml")
    assert yaml.safe_load(text) == yaml.safe_load(export_text(DEFAULT_SLO_SPEC, DEFAULT_BURN_RULES))
    assert "expr: |-\n" in text  # multi-line expressions as literal blocks
    am = tmp_path / "am.yml"
    assert main(["rules", "alertmanager", "-o", str(am)]) == 0
    assert yaml.safe_load(am.read_text())["inhibit_rules"] == INHIBIT_RULES
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: tailguard/v1\nkind: SLOSpec\nslos: []\n")
    assert main(["rules", "export", "--slo", str(bad)]) == 1
