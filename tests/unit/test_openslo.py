"""OpenSLO v1 import/export: the shipped specs and burn rules round-trip; what cannot be
mapped is refused with the field path and the reason."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from msgspec.structs import replace  # records are msgspec Structs

from pipeline.cli import main
from pipeline.core.record import RequestRecord
from pipeline.core.slo import RecordColumns, SLOCounts, SLOEvaluator
from pipeline.spec.burn_rules import load_burn_rules_file
from pipeline.spec.openslo import OpenSLOError, export_openslo, import_openslo, spec_document
from pipeline.spec.slo import SLOSpec, load_spec, load_spec_file, validate_file
from tests.slo_strategies import JOINED

SPECS = ["specs/slo-default.yaml", "specs/slo-example.yaml"]


@pytest.mark.parametrize("path", SPECS)
def test_shipped_spec_round_trips(path: str) -> None:
    spec = load_spec_file(path)
    rules = load_burn_rules_file("specs/burn-rules.yaml")
    docs = export_openslo(spec, rules)
    # through YAML text, as a user would
    docs = list(yaml.safe_load_all(yaml.safe_dump_all(docs)))
    back, back_rules = import_openslo(docs)
    assert back == spec
    assert back_rules == rules
    # the tailguard YAML written by `import` loads back equal
    assert load_spec(yaml.safe_dump(spec_document(back))) == spec


def test_export_shape() -> None:
    docs = export_openslo(load_spec_file("specs/slo-default.yaml"),
                          load_burn_rules_file("specs/burn-rules.yaml"))  # fmt: skip
    kinds = [d["kind"] for d in docs]
    assert kinds.count("SLO") == 5
    assert kinds.count("AlertPolicy") == 1
    assert kinds.count("AlertCondition") == 4  # the burn_rate rules
    ttft = next(d for d in docs if d["metadata"]["name"] == "ttft-stream")
    spec = ttft["spec"]
    assert spec["budgetingMethod"] == "Occurrences"
    assert spec["objectives"] == [{"op": "lte", "value": 2000.0, "target": 0.99}]
    assert spec["timeWindow"] == [{"duration": "30d", "isRolling": True}]
    source = spec["indicator"]["spec"]["thresholdMetric"]["metricSource"]
    assert source == {"type": "tailguard", "spec": {"boundary": "gateway_ttfb_ms", "unit": "ms"}}
    assert ttft["metadata"]["annotations"]["x-tailguard/filter"] == (
        '{"priority":[0,1,2],"stream":true}'
    )
    gold = next(d for d in docs if d["metadata"]["name"] == "gold-ttft")
    assert gold["spec"]["timeWindow"][0]["duration"] == "1M"
    fast = next(d for d in docs if d["metadata"]["name"] == "page-fast-burn")
    assert fast["spec"]["condition"] == {
        "kind": "burnrate", "op": "gt", "threshold": 14.4, "lookbackWindow": "1h",
    }  # fmt: skip
    assert fast["metadata"]["annotations"]["x-tailguard/short-window"] == "5m"


def _slo(**over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "apiVersion": "openslo/v1",
        "kind": "SLO",
        "metadata": {"name": "lat"},
        "spec": {
            "service": "svc",
            "indicator": {
                "metadata": {"name": "lat-sli"},
                "spec": {"thresholdMetric": {"metricSource": {
                    "type": "tailguard", "spec": {"boundary": "ttft_engine_ms"}}}},
            },
            "timeWindow": [{"duration": "28d", "isRolling": True}],
            "budgetingMethod": "Occurrences",
            "objectives": [{"op": "lte", "value": 0.5, "targetPercent": 99.5}],
        },
    }  # fmt: skip
    for dotted, value in over.items():
        node = doc
        *parents, last = dotted.split("__")
        for p in parents:
            node = node[int(p)] if p.isdigit() else node[p]
        if value is None:
            del node[last]
        else:
            node[last] = value
    return doc


def test_plain_openslo_imports() -> None:
    """A document written for OpenSLO, not exported by tailguard: targetPercent, seconds,
    an SLI by reference, a burn-rate policy with no short-window annotation."""
    slo = _slo()
    slo["spec"]["indicator"]["spec"]["thresholdMetric"]["metricSource"]["spec"]["unit"] = "s"
    sli = {"apiVersion": "openslo/v1", "kind": "SLI", "metadata": {"name": "lat-sli"},
           "spec": slo["spec"].pop("indicator")["spec"]}  # fmt: skip
    slo["spec"]["indicatorRef"] = "lat-sli"
    slo["spec"]["alertPolicies"] = ["fast"]
    policy = {
        "apiVersion": "openslo/v1", "kind": "AlertPolicy", "metadata": {"name": "fast"},
        "spec": {"conditions": [{"kind": "AlertCondition", "metadata": {"name": "burn-2h"},
                 "spec": {"severity": "page", "condition": {
                     "kind": "burnrate", "op": "gte", "threshold": 10,
                     "lookbackWindow": "2h"}}}]},
    }  # fmt: skip
    service = {"apiVersion": "openslo/v1", "kind": "Service", "metadata": {"name": "svc"}}
    spec, rules = import_openslo([service, sli, slo, policy])
    (s,) = spec.slos
    assert (s.boundary, s.threshold_ms, s.objective, s.window.rolling) == (
        "ttft_engine_ms", 500.0, 0.995, "28d",
    )  # fmt: skip
    assert rules is not None
    (r,) = rules.rules
    assert (r.name, r.kind, r.factor, r.long, r.short, r.severity) == (
        "burn-2h", "burn_rate", 10, "2h", "10m", "page",
    )  # fmt: skip


UNIT = "[0].spec.indicator.spec.thresholdMetric.metricSource.spec.unit"
OBJECTIVE = "[0].spec.objectives[0]"


def _objective(**target: Any) -> dict[str, Any]:
    """A change to the objective's target (``target`` and/or ``targetPercent``)."""
    return {"spec__objectives": [{"op": "lte", "value": 0.5, **target}]}


def _source(kind: str, query: str, **spec: str) -> dict[str, Any]:
    """A change to a gateway_total_ms SLO whose metric is ``query`` on a ``kind`` source."""
    return {
        "metadata__annotations": {"x-tailguard/boundary": "gateway_total_ms"},
        "spec__indicator__spec__thresholdMetric__metricSource": {
            "type": kind,
            "spec": {"query": query, **spec},
        },
    }


@pytest.mark.parametrize(
    ("change", "path", "reason"),
    [
        ({"spec__budgetingMethod": "Timeslices"}, "[0].spec.budgetingMethod", "Occurrences"),
        (
            {
                "spec__objectives": [
                    {"op": "lte", "value": 1, "target": 0.9},
                    {"op": "lte", "value": 2, "target": 0.99},
                ]
            },
            "[0].spec.objectives",
            "exactly one objective",
        ),
        (
            {"spec__objectives": [{"op": "gt", "value": 1, "target": 0.9}]},
            "[0].spec.objectives[0].op",
            "good below its threshold",
        ),
        (
            {"spec__objectives": [{"op": "gte", "value": 1, "target": 0.9}]},
            "[0].spec.objectives[0].op",
            "good below its threshold",
        ),
        (
            {"spec__objectives": [{"op": "le", "value": 1, "target": 0.9}]},
            "[0].spec.objectives[0].op",
            "one of lt, lte, gt, gte",
        ),
        (
            {"spec__indicator__spec__thresholdMetric__metricSource__spec__unit": "minutes"},
            UNIT,
            "unknown unit 'minutes'",
        ),
        (
            _source("Prometheus", "sum(rate(http_request_latency_bucket[5m]))"),
            UNIT,
            "no metric with a unit suffix",
        ),
        (
            _source("Datadog", "avg:trace.http.request.duration{*}"),
            UNIT,
            "unknown for a Datadog source",
        ),
        (
            _source("Prometheus", "http_request_duration_seconds_bucket", unit="ms"),
            UNIT,
            "units disagree",
        ),
        (
            {"spec__timeWindow": [{"duration": "1M", "isRolling": True}]},
            "[0].spec.timeWindow[0].duration",
            "no fixed length",
        ),
        (
            {
                "spec__timeWindow": [
                    {
                        "duration": "1Q",
                        "isRolling": False,
                        "calendar": {"startTime": "2024-01-01 00:00:00", "timeZone": "UTC"},
                    }
                ]
            },
            "[0].spec.timeWindow[0].duration",
            "only 1M",
        ),
        (
            {
                "spec__timeWindow": [
                    {
                        "duration": "1w",
                        "isRolling": False,
                        "calendar": {"startTime": "2024-01-03 00:00:00", "timeZone": "UTC"},
                    }
                ]
            },
            "[0].spec.timeWindow[0].calendar.startTime",
            "Monday",
        ),
        (
            {
                "spec__timeWindow": [
                    {
                        "duration": "1M",
                        "isRolling": False,
                        "calendar": {
                            "startTime": "2024-01-01 00:00:00",
                            "timeZone": "Europe/Paris",
                        },
                    }
                ]
            },
            "[0].spec.timeWindow[0].calendar.timeZone",
            "UTC",
        ),
        (
            {"spec__indicator__spec": {"ratioMetric": {"counter": True}}},
            "[0].spec.indicator.spec.ratioMetric",
            "only thresholdMetric",
        ),
        (
            {
                "spec__indicator__spec__thresholdMetric__metricSource": {
                    "type": "Prometheus",
                    "spec": {"query": "x"},
                }
            },
            "[0].spec.indicator.spec.thresholdMetric.metricSource",
            "no tailguard boundary",
        ),
        ({"spec__alertPolicies": ["missing"]}, "[0].spec.alertPolicies[0]", "no AlertPolicy"),
        # targetPercent is a percentage, target a fraction: a value on the other's scale is
        # refused with the field that fits it (issue 51: 0.99 was read as 0.99 %)
        (_objective(targetPercent=0.99), f"{OBJECTIVE}.targetPercent", "targetPercent: 99"),
        (_objective(targetPercent=1), f"{OBJECTIVE}.targetPercent", "target: 1"),
        (_objective(targetPercent="99.9%"), f"{OBJECTIVE}.targetPercent", "targetPercent: 99.9"),
        (_objective(target=99.9), f"{OBJECTIVE}.target", "targetPercent: 99.9"),
        (_objective(target=0.99, targetPercent=99.9), f"{OBJECTIVE}.targetPercent", "disagree"),
        ({"apiVersion": "openslo/v2alpha"}, "[0].apiVersion", "only openslo/v1"),
        ({"kind": "Budget"}, "[0].kind", "SLO, SLI"),
    ],
)
def test_refusals_name_the_field_and_why(change: dict[str, Any], path: str, reason: str) -> None:
    with pytest.raises(OpenSLOError) as info:
        import_openslo([_slo(**change)], "f.yaml")
    paths = {i.path: i.message for i in info.value.issues}
    assert path in paths, paths
    assert reason in paths[path]
    assert f"f.yaml: {path}: " in str(info.value)


def test_refused_alert_conditions() -> None:
    slo = _slo(spec__alertPolicies=["p"])
    cond = {"severity": "critical", "condition": {"kind": "burnrate", "op": "gt",
            "threshold": 2, "lookbackWindow": "1h", "alertAfter": "5m"}}  # fmt: skip
    policy = {"apiVersion": "openslo/v1", "kind": "AlertPolicy", "metadata": {"name": "p"},
              "spec": {"conditions": [{"conditionRef": "c"}]}}  # fmt: skip
    condition = {"apiVersion": "openslo/v1", "kind": "AlertCondition",
                 "metadata": {"name": "c"}, "spec": cond}  # fmt: skip
    with pytest.raises(OpenSLOError) as info:
        import_openslo([slo, policy, condition])
    paths = {i.path for i in info.value.issues}
    assert {"[2].spec.severity", "[2].spec.condition.alertAfter"} <= paths


def test_values_tailguard_rejects_are_refused_after_mapping() -> None:
    with pytest.raises(OpenSLOError, match=r"slos\.0\.boundary.*after mapping"):
        import_openslo(
            [_slo(spec__indicator__spec__thresholdMetric__metricSource__spec={"boundary": "x"})]
        )


def test_cli_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "openslo.yaml"
    assert main(["openslo", "export", "specs/slo-default.yaml", "--rules",
                 "specs/burn-rules.yaml", "-o", str(out)]) == 0  # fmt: skip
    spec_out, rules_out = tmp_path / "spec.yaml", tmp_path / "rules.yaml"
    assert main(["openslo", "import", str(out), "-o", str(spec_out),
                 "--rules-out", str(rules_out)]) == 0  # fmt: skip
    assert load_spec_file(spec_out) == load_spec_file("specs/slo-default.yaml")
    assert load_burn_rules_file(rules_out) == load_burn_rules_file("specs/burn-rules.yaml")
    bad = tmp_path / "bad.yaml"
    doc = copy.deepcopy(_slo(spec__budgetingMethod="Timeslices"))
    bad.write_text(yaml.safe_dump(doc))
    assert main(["openslo", "import", str(bad)]) == 1
    assert "[0].spec.budgetingMethod" in capsys.readouterr().err


# --------------------------------------------------------------------------- #
# op: lt | lte, exactly; units from the source
# --------------------------------------------------------------------------- #

# gateway_total_ms straddling 400 ms: just under, exactly at, just over, well under
STRADDLE = [replace(JOINED, gateway_total_ms=v) for v in (399.999, 400.0, 400.001, 100.0)]


def _counts(spec: SLOSpec, recs: list[RequestRecord]) -> tuple[SLOCounts, SLOCounts]:
    """(per-record, columnar) counts of the spec's only SLO."""
    (s,) = spec.slos
    one = SLOEvaluator(spec)
    for r in recs:
        one.add(r)
    batch = SLOEvaluator(spec)
    n = len(recs)
    batch.add_batch(RecordColumns(recs), np.arange(n, dtype=np.int64), np.ones(n, np.int64))
    return one.counts()[s.name], batch.counts()[s.name]


def _tailguard(strict: bool) -> SLOSpec:
    return load_spec(
        "apiVersion: tailguard/v1\nkind: SLOSpec\nslos:\n  - name: lat\n    service: svc\n"
        "    boundary: gateway_total_ms\n    threshold_ms: 400\n    objective: 0.995\n"
        f"    threshold_strict: {str(strict).lower()}\n    window: {{rolling: 28d}}\n"
    )


@pytest.mark.parametrize(
    ("op", "strict", "good"), [("lt", True, 2), ("lte", False, 3)], ids=["lt", "lte"]
)
def test_op_imports_validates_and_counts_like_the_tailguard_spec(
    op: str, strict: bool, good: int, tmp_path: Path
) -> None:
    doc = _slo(
        spec__indicator__spec__thresholdMetric__metricSource__spec={
            "boundary": "gateway_total_ms", "unit": "s"},
        spec__objectives=[{"op": op, "value": 0.4, "targetPercent": 99.5}],
    )  # fmt: skip
    spec, _ = import_openslo([doc])
    twin = _tailguard(strict)
    assert spec == twin
    assert spec.slos[0].threshold_ms == 400.0  # 0.4 s, exactly (not 400.00000000000006)
    out = tmp_path / "spec.yaml"
    out.write_text(yaml.safe_dump(spec_document(spec)))
    assert validate_file(out)[0]
    expected = SLOCounts(total=4, good=good)  # 400.0 is bad under lt, good under lte
    assert _counts(spec, STRADDLE) == _counts(twin, STRADDLE) == (expected, expected)
    # and back: export writes the op it imported
    (back,) = export_openslo(spec)
    assert back["spec"]["objectives"][0]["op"] == op
    assert import_openslo([back])[0] == spec


def _prometheus(query: str, value: float, **source_spec: Any) -> dict[str, Any]:
    return _slo(
        metadata__annotations={"x-tailguard/boundary": "gateway_total_ms"},
        spec__indicator__spec__thresholdMetric__metricSource={
            "type": "Prometheus", "spec": {"query": query, **source_spec}},
        spec__objectives=[{"op": "lt", "value": value, "target": 0.99}],
    )  # fmt: skip


@pytest.mark.parametrize(
    ("query", "value", "source_spec", "threshold_ms"),
    [
        ('sum(rate(http_request_duration_seconds_bucket{le="8"}[5m]))', 8, {}, 8000.0),
        ("histogram_quantile(0.99, rate(llm_ttft_seconds_bucket[5m]))", 0.3, {}, 300.0),
        ("rate(gateway_latency_seconds_sum[5m]) / rate(gateway_latency_seconds_count[5m])",
         2.5, {}, 2500.0),
        ("rate(request_duration_milliseconds_bucket[1m])", 250, {}, 250.0),
        ("rate(request_duration_ms_bucket[1m])", 250, {}, 250.0),
        ("rate(request_latency_bucket[1m])", 8, {"unit": "s"}, 8000.0),
        ("rate(request_latency_bucket[1m])", 8, {"unit": "seconds"}, 8000.0),
        ("rate(request_duration_seconds_bucket[1m])", 8, {"unit": "s"}, 8000.0),
        ("rate(request_latency_bucket[1m])", 1500, {"unit": "us"}, 1.5),
    ],
)  # fmt: skip
def test_units_come_from_the_source(
    query: str, value: float, source_spec: dict[str, Any], threshold_ms: float
) -> None:
    spec, _ = import_openslo([_prometheus(query, value, **source_spec)])
    (s,) = spec.slos
    assert (s.threshold_ms, s.threshold_strict) == (threshold_ms, True)


def test_unit_from_the_annotation() -> None:
    doc = _prometheus("rate(request_latency_bucket[1m])", 8)
    doc["metadata"]["annotations"]["x-tailguard/unit"] = "s"
    assert import_openslo([doc])[0].slos[0].threshold_ms == 8000.0
    doc["metadata"]["annotations"]["x-tailguard/unit"] = "h"
    with pytest.raises(OpenSLOError) as info:
        import_openslo([doc])
    assert [i.path for i in info.value.issues] == ["[0].metadata.annotations.x-tailguard/unit"]


# --------------------------------------------------------------------------- #
# OpenSLO -> tailguard -> OpenSLO keeps what the SLO document says (issue 51)
# --------------------------------------------------------------------------- #


def _calendar(duration: str, start: str) -> list[dict[str, Any]]:
    return [{"duration": duration, "isRolling": False,
             "calendar": {"startTime": start, "timeZone": "UTC"}}]  # fmt: skip


@pytest.mark.parametrize(
    ("change", "kept"),
    [
        ({"spec__service": "checkout"}, ("spec", "service")),
        ({"metadata__displayName": "Latency (p99.5)"}, ("metadata", "displayName")),
        ({"spec__timeWindow": _calendar("1M", "2025-03-01 00:00:00")}, ("spec", "timeWindow")),
        ({"spec__timeWindow": _calendar("1w", "2025-03-03 00:00:00")}, ("spec", "timeWindow")),
    ],
    ids=["service", "display-name", "month-start", "week-start"],
)
def test_openslo_round_trip_keeps_the_document(
    change: dict[str, Any], kept: tuple[str, str]
) -> None:
    """Import, write the tailguard YAML, load it, export: the field comes back as given."""
    doc = _slo(**change)
    spec, _ = import_openslo([doc])
    back = load_spec(yaml.safe_dump(spec_document(spec)))
    (out,) = export_openslo(back)
    part, key = kept
    assert out[part][key] == doc[part][key]
    assert import_openslo([out])[0] == back
