"""OpenSLO v1 <-> tailguard/v1 (``tailguard openslo import|export``). Pure: documents
are plain mappings (YAML parsing and writing happen in the CLI).

What maps
---------
=========================================  ==============================================
OpenSLO v1                                 tailguard/v1
=========================================  ==============================================
``SLO`` ``metadata.name``                  ``slos[].name``
``metadata.displayName``                   ``display_name``
``spec.description``                       ``description``
``spec.service``                           ``service`` (export: ``--service`` for an SLO
                                           naming none, marked ``x-tailguard/service:
                                           none`` so that it imports as none again)
``indicator`` / ``indicatorRef`` -> ``SLI``  ``boundary``: ``thresholdMetric.metricSource``
  ``thresholdMetric``                      ``{type: tailguard, spec: {boundary, unit}}``
                                           (or annotation ``x-tailguard/boundary``)
``objectives: [{op, value, target}]``      ``threshold_ms`` (``value``, in ms: see units),
  (exactly one; ``targetPercent`` too)     ``objective`` (``target``, or
                                           ``targetPercent`` / 100; a value on the other's
                                           scale, ``targetPercent: 0.99``, is refused with
                                           a hint); ``op: lte`` ->
                                           good iff value <= threshold, ``op: lt`` ->
                                           ``threshold_strict: true`` (good iff <)
``budgetingMethod: Occurrences``           (the only method: a request is good or bad)
``timeWindow: [{duration, isRolling}]``     ``window: {rolling: <duration>}``; calendar
                                           ``1M`` -> ``{calendar: month}``, ``1w`` ->
                                           ``{calendar: week}`` (UTC, from a Monday);
                                           ``calendar.startTime`` -> ``start``
``AlertPolicy`` + ``AlertCondition``       ``BurnRules``: a ``burn_rate`` rule per
  ``condition.kind: burnrate``             condition: ``threshold`` = ``factor``,
                                           ``lookbackWindow`` = ``long``, ``severity``
                                           (``page`` | ``ticket``); ``slos`` = the SLOs
                                           whose ``alertPolicies`` name the policy (all:
                                           none listed)
=========================================  ==============================================

Extensions (``metadata.annotations``, strings; JSON where structured), for what OpenSLO
has no field for; each is optional on import:

* on an ``SLO``: ``x-tailguard/filter`` (JSON of ``filter``), ``x-tailguard/exclude``
  (JSON of ``exclude``), ``x-tailguard/errors`` (``bad`` | ``exclude``),
  ``x-tailguard/client-abort`` (``measure`` | ``exclude``), ``x-tailguard/boundary`` (when
  the metric source is not tailguard's); on the first SLO also
  ``x-tailguard/spec-description`` and ``x-tailguard/tiers`` (JSON of ``tiers``);
* on an ``AlertCondition``: ``x-tailguard/short-window`` (the multiwindow rule's short
  window; default ``lookbackWindow`` / 12, the SRE workbook's ratio) and
  ``x-tailguard/min-requests``;
* on an ``AlertPolicy``: ``x-tailguard/rules`` (JSON list of the rules OpenSLO cannot
  express: ``budget_fraction``, ``compliance_below``), ``x-tailguard/budget-events``
  (JSON), ``x-tailguard/rules-description``.

Units of ``value``, from the source, never assumed: ``metricSource.spec.unit`` or the
SLO's annotation ``x-tailguard/unit`` (``ms``, ``s``, ``us`` and their long names), else
for ``type: tailguard`` ``ms`` (what export writes), else for ``type: Prometheus`` the
base-unit suffix of the metric the query names (``..._seconds_bucket`` -> s,
``..._milliseconds`` / ``..._ms`` -> ms: Prometheus's naming convention). A unit that is
unknown, missing or contradicted by the metric's name is refused with its field path.
The conversion is decimal (``value: 0.3`` s is exactly ``300`` ms, not 300.00000000000006,
which would move requests at 300 ms across the threshold).

Anything else that cannot be mapped is refused with the document's field path and the
reason (:class:`OpenSLOError`): ratio or raw metrics, ``Timeslices`` budgeting, several
objectives, ``op: gt | gte`` (good when *slower* than the value: a tailguard latency SLO
is good below its threshold), ``alertAfter``, a calendar other than a month or a week,
rolling months/quarters/years, unknown kinds.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any, Final

from pydantic import ValidationError

from pipeline.spec.burn_rules import BurnRateRule, BurnRules
from pipeline.spec.durations import format_ms, parse_duration_ms
from pipeline.spec.loader import SpecIssue
from pipeline.spec.slo import SLO, SLOSpec, calendar_start_issue

API: Final = "openslo/v1"
X: Final = "x-tailguard/"
SOURCE_TYPE: Final = "tailguard"
POLICY_NAME: Final = "tailguard-burn-rules"
SEVERITIES: Final = ("page", "ticket")
_OPENSLO_DURATION: Final = re.compile(r"^([1-9][0-9]*)([mhdwMQY])$")
CALENDAR_START: Final = "2024-01-01 00:00:00"  # a Monday, 1st of a month: both calendars
# An objective's ``value`` unit -> milliseconds per unit (decimal: the conversion is exact).
UNIT_MS: Final[Mapping[str, Decimal]] = {
    "ms": Decimal(1), "millisecond": Decimal(1), "milliseconds": Decimal(1),
    "s": Decimal(1000), "second": Decimal(1000), "seconds": Decimal(1000),
    "us": Decimal("0.001"), "microsecond": Decimal("0.001"), "microseconds": Decimal("0.001"),
}  # fmt: skip
# ``op`` of a thresholdMetric objective -> threshold_strict (good iff value < / <= threshold).
OPS_STRICT: Final[Mapping[str, bool]] = {"lte": False, "lt": True}
# A Prometheus metric name's base-unit suffix (the naming convention), histogram parts too.
_PROM_UNIT: Final = re.compile(
    r"[A-Za-z_:][A-Za-z0-9_:]*?_(seconds|milliseconds|ms|microseconds)"
    r"(?:_bucket|_sum|_count|_total)?(?![A-Za-z0-9_:])"
)


class OpenSLOError(ValueError):
    """Documents that cannot be mapped; ``issues`` name each field path and why."""

    def __init__(self, source: str, issues: list[SpecIssue]) -> None:
        self.source = source
        self.issues = issues
        super().__init__("\n".join(i.render(source) for i in issues))


# --------------------------------------------------------------------------- #
# export
# --------------------------------------------------------------------------- #


def _duration_out(text: str) -> str:
    """A tailguard duration as OpenSLO's ``<n><m|h|d|w>``."""
    if _OPENSLO_DURATION.match(text) and text[-1] in "mhdw":
        return text
    out = format_ms(parse_duration_ms(text))
    if not _OPENSLO_DURATION.match(out):
        raise ValueError(f"duration {text!r} is not a whole number of minutes")
    return out


def _window_out(slo: SLO) -> dict[str, Any]:
    w = slo.window
    if w.rolling is not None:
        return {"duration": _duration_out(w.rolling), "isRolling": True}
    return {
        "duration": "1M" if w.calendar == "month" else "1w",
        "isRolling": False,
        "calendar": {"startTime": w.start or CALENDAR_START, "timeZone": "UTC"},
    }


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def export_openslo(
    spec: SLOSpec, rules: BurnRules | None = None, *, service: str = "tailguard"
) -> list[dict[str, Any]]:
    """The spec (and its burn rules) as OpenSLO v1 documents; ``service`` for the SLOs
    whose spec names none."""
    docs: list[dict[str, Any]] = []
    for i, s in enumerate(spec.slos):
        ann: dict[str, str] = {}
        if s.filter is not None:
            ann[X + "filter"] = _json(s.filter.model_dump(exclude_none=True))
        if s.exclude is not None:
            ann[X + "exclude"] = _json(s.exclude.model_dump(exclude_none=True))
        if s.errors != "bad":
            ann[X + "errors"] = s.errors
        if s.client_abort != "measure":
            ann[X + "client-abort"] = s.client_abort
        if s.service is None:  # OpenSLO needs one: the export's, not the SLO's
            ann[X + "service"] = "none"
        if i == 0:
            if spec.description is not None:
                ann[X + "spec-description"] = spec.description
            if spec.tiers:
                ann[X + "tiers"] = _json(
                    {n: t.model_dump(exclude_none=True) for n, t in spec.tiers.items()}
                )
        body: dict[str, Any] = {
            "service": s.service or service,
            "indicator": {
                "metadata": {"name": f"{s.name}-sli"},
                "spec": {
                    "thresholdMetric": {
                        "metricSource": {
                            "type": SOURCE_TYPE,
                            "spec": {"boundary": s.boundary, "unit": "ms"},
                        }
                    }
                },
            },
            "timeWindow": [_window_out(s)],
            "budgetingMethod": "Occurrences",
            "objectives": [
                {
                    "op": "lt" if s.threshold_strict else "lte",
                    "value": s.threshold_ms,
                    "target": s.objective,
                }
            ],
        }
        if s.description is not None:
            body = {"description": s.description, **body}
        if rules is not None and rules.rules:
            body["alertPolicies"] = [POLICY_NAME]
        meta: dict[str, Any] = {"name": s.name}
        if s.display_name is not None:
            meta["displayName"] = s.display_name
        if ann:
            meta["annotations"] = ann
        docs.append({"apiVersion": API, "kind": "SLO", "metadata": meta, "spec": body})
    if rules is not None and rules.rules:
        docs.extend(_export_rules(rules))
    return docs


def _export_rules(rules: BurnRules) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    others: list[dict[str, Any]] = []
    conditions: list[dict[str, str]] = []
    for r in rules.rules:
        if not isinstance(r, BurnRateRule):
            others.append(r.model_dump(by_alias=True, exclude_none=True))
            continue
        ann = {X + "short-window": r.short}
        if r.min_requests:
            ann[X + "min-requests"] = str(r.min_requests)
        if r.slos is not None:
            ann[X + "slos"] = _json(r.slos)
        cond: dict[str, Any] = {
            "severity": r.severity,
            "condition": {
                "kind": "burnrate",
                "op": "gt",
                "threshold": r.factor,
                "lookbackWindow": _duration_out(r.long),
            },
        }
        if r.description is not None:
            cond = {"description": r.description, **cond}
        docs.append(
            {
                "apiVersion": API,
                "kind": "AlertCondition",
                "metadata": {"name": r.name, "annotations": ann},
                "spec": cond,
            }
        )
        conditions.append({"conditionRef": r.name})
    ann = {X + "budget-events": _json(rules.budget_events.model_dump())}
    if others:
        ann[X + "rules"] = _json(others)
    if rules.description is not None:
        ann[X + "rules-description"] = rules.description
    policy = {
        "apiVersion": API,
        "kind": "AlertPolicy",
        "metadata": {"name": POLICY_NAME, "annotations": ann},
        "spec": {"alertWhenBreaching": True, "conditions": conditions},
    }
    return [policy, *docs]


# --------------------------------------------------------------------------- #
# import
# --------------------------------------------------------------------------- #


class _Issues:
    def __init__(self) -> None:
        self.items: list[SpecIssue] = []

    def add(self, path: str, message: str) -> None:
        self.items.append(SpecIssue(path, message))


def _get(doc: Any, key: str) -> Any:
    return doc.get(key) if isinstance(doc, Mapping) else None


def _annotations(doc: Any) -> dict[str, str]:
    ann = _get(_get(doc, "metadata"), "annotations")
    return {str(k): str(v) for k, v in ann.items()} if isinstance(ann, Mapping) else {}


def _json_ann(ann: Mapping[str, str], key: str, path: str, issues: _Issues) -> Any:
    if X + key not in ann:
        return None
    try:
        return json.loads(ann[X + key])
    except json.JSONDecodeError as e:
        issues.add(f"{path}.metadata.annotations.{X}{key}", f"not JSON: {e}")
        return None


def _duration_in(text: Any, path: str, issues: _Issues) -> str | None:
    m = _OPENSLO_DURATION.match(text) if isinstance(text, str) else None
    if m is None:
        issues.add(path, f"not an OpenSLO duration (e.g. 30d, 1h): {text!r}")
        return None
    if m.group(2) in "MQY":
        issues.add(
            path,
            f"{text}: months, quarters and years have no fixed length in a "
            "rolling window; use days (e.g. 30d) or a calendar window",
        )
        return None
    return str(text)


def _window_in(tw: Any, path: str, issues: _Issues) -> dict[str, str] | None:
    if not isinstance(tw, list) or len(tw) != 1:
        issues.add(path, "exactly one time window is needed")
        return None
    w, p = tw[0], f"{path}[0]"
    duration = _get(w, "duration")
    if _get(w, "isRolling") is True:
        d = _duration_in(duration, f"{p}.duration", issues)
        return None if d is None else {"rolling": d}
    cal = _get(w, "calendar")
    tz = _get(cal, "timeZone") or "UTC"
    if tz not in ("UTC", "Etc/UTC"):
        issues.add(f"{p}.calendar.timeZone", f"{tz}: tailguard's calendar windows are UTC")
        return None
    calendar = {"1M": "month", "1w": "week", "7d": "week"}.get(str(duration))
    if calendar is None:
        issues.add(f"{p}.duration", f"calendar window {duration!r}: only 1M (month) and 1w (week)")
        return None
    out = {"calendar": calendar}
    given = _get(cal, "startTime")
    if given is not None and str(given) != CALENDAR_START:  # export's own: not kept
        out["start"] = str(given)
    issue = calendar_start_issue(calendar, out.get("start", CALENDAR_START))
    if issue is not None:
        issues.add(f"{p}.calendar.startTime", issue)
        return None
    return out


def _indicator(doc: Any, path: str, slis: Mapping[str, Any], issues: _Issues) -> tuple[Any, str]:
    spec = _get(doc, "spec")
    inline = _get(spec, "indicator")
    if inline is not None:
        return inline, f"{path}.spec.indicator"
    ref = _get(spec, "indicatorRef")
    if isinstance(ref, str) and ref in slis:
        return slis[ref][0], slis[ref][1]
    issues.add(f"{path}.spec.indicatorRef", f"no SLI named {ref!r} in the documents")
    return None, ""


def _slo_in(doc: Any, path: str, slis: Mapping[str, Any], issues: _Issues) -> dict[str, Any]:
    ann = _annotations(doc)
    spec = _get(doc, "spec")
    out: dict[str, Any] = {"name": _get(_get(doc, "metadata"), "name")}
    for key, field, src in (
        ("description", "description", spec),
        ("display_name", "displayName", _get(doc, "metadata")),
        ("service", "service", spec),
    ):
        if _get(src, field) is not None:
            out[key] = _get(src, field)
    method = _get(spec, "budgetingMethod")
    if method != "Occurrences":
        issues.add(
            f"{path}.spec.budgetingMethod",
            f"{method!r}: only Occurrences maps "
            "(tailguard counts requests, good or bad; no time slices)",
        )
    sli, sli_path = _indicator(doc, path, slis, issues)
    unit: str | None = None
    if sli is not None:
        sli_spec = _get(sli, "spec")
        threshold = _get(sli_spec, "thresholdMetric")
        if threshold is None:
            kind = next((k for k in ("ratioMetric", "rawMetric") if _get(sli_spec, k)), "?")
            issues.add(
                f"{sli_path}.spec.{kind}",
                "only thresholdMetric (latency) SLIs map to a tailguard boundary",
            )
        else:
            source = _get(threshold, "metricSource")
            sp = f"{sli_path}.spec.thresholdMetric.metricSource"
            boundary = ann.get(X + "boundary")
            if _get(source, "type") == SOURCE_TYPE:
                boundary = _get(_get(source, "spec"), "boundary") or boundary
            unit = _source_unit(source, sp, ann, path, issues)
            if boundary is None:
                issues.add(
                    sp,
                    f"no tailguard boundary: use type: {SOURCE_TYPE} with "
                    f"spec.boundary, or annotation {X}boundary",
                )
            out["boundary"] = boundary
    objectives = _get(spec, "objectives")
    if not isinstance(objectives, list) or len(objectives) != 1:
        issues.add(
            f"{path}.spec.objectives",
            "exactly one objective is needed (one threshold "
            "per tailguard SLO: write one SLO per objective)",
        )
    else:
        o, op_path = objectives[0], f"{path}.spec.objectives[0]"
        op = _get(o, "op")
        if op in OPS_STRICT:
            if OPS_STRICT[op]:
                out["threshold_strict"] = True
        elif op in ("gt", "gte"):
            issues.add(
                f"{op_path}.op",
                f"{op!r}: good when the latency is above the value does not map "
                "(a tailguard latency SLO is good below its threshold: lt or lte)",
            )
        else:
            issues.add(f"{op_path}.op", f"{op!r}: one of lt, lte, gt, gte")
        value = _get(o, "value")
        if isinstance(value, int | float) and not isinstance(value, bool):
            if unit is not None:
                out["threshold_ms"] = float(Decimal(repr(value)) * UNIT_MS[unit])
        else:
            issues.add(f"{op_path}.value", "a number (the latency threshold) is needed")
        out["objective"] = _target_in(o, op_path, issues)
        if _get(o, "timeSliceTarget") is not None:
            issues.add(f"{op_path}.timeSliceTarget", "time slices do not map")
    window = _window_in(_get(spec, "timeWindow"), f"{path}.spec.timeWindow", issues)
    if window is not None:
        out["window"] = window
    for key, field in (("filter", "filter"), ("exclude", "exclude")):
        value = _json_ann(ann, key, path, issues)
        if value is not None:
            out[field] = value
    if X + "errors" in ann:
        out["errors"] = ann[X + "errors"]
    if X + "client-abort" in ann:
        out["client_abort"] = ann[X + "client-abort"]
    if ann.get(X + "service") == "none":
        out.pop("service", None)
    return out


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _target_in(o: Any, op_path: str, issues: _Issues) -> Any:
    """The objective as a fraction, from ``target`` (a fraction) or ``targetPercent`` (a
    percentage). A value on the other field's scale is refused with the field that fits it:
    ``targetPercent: 0.99`` (0.99 %, never a latency objective) or ``target: 99.9``."""
    target, percent = _get(o, "target"), _get(o, "targetPercent")
    if percent is not None:
        where = f"{op_path}.targetPercent"
        if not _number(percent):
            text = str(percent).strip().rstrip("%").strip()
            hint = f": write targetPercent: {text}" if _number(_float(text)) else ""
            issues.add(where, f"a number, a percentage (99.9 = 99.9 %), is needed{hint}")
            return None
        if 0 < percent <= 1:
            issues.add(
                where,
                f"targetPercent is a percentage (99.9 = 99.9 %): {percent} reads as {percent} %; "
                f"for a fraction write target: {percent} (= targetPercent: {percent * 100:g})",
            )
            return None
        if target is not None and _number(target) and abs(target * 100 - percent) > 1e-9:
            issues.add(where, f"target {target} and targetPercent {percent} disagree")
            return None
        if target is None:
            return percent / 100.0
    if _number(target) and 1 < target < 100:
        issues.add(
            f"{op_path}.target",
            f"target is a fraction (0.999 = 99.9 %): {target} reads as {target * 100:g} %; "
            f"for a percentage write targetPercent: {target} (= target: {target / 100:g})",
        )
        return None
    return target


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _source_unit(
    source: Any, sp: str, ann: Mapping[str, str], path: str, issues: _Issues
) -> str | None:
    """The unit of the objective's ``value`` (a key of :data:`UNIT_MS`), from the source
    (see the module's doc); None, with an issue naming the field, when it is unknown."""
    given: list[tuple[str, str]] = []  # (unit, field path)
    src_spec = _get(source, "spec")
    if _get(src_spec, "unit") is not None:
        given.append((str(_get(src_spec, "unit")), f"{sp}.spec.unit"))
    if X + "unit" in ann:
        given.append((ann[X + "unit"], f"{path}.metadata.annotations.{X}unit"))
    for unit, where in given:
        if unit not in UNIT_MS:
            issues.add(where, f"unknown unit {unit!r}: one of {', '.join(UNIT_MS)}")
            return None
    kind = str(_get(source, "type") or "")
    named: list[tuple[str, str]] = []
    if kind.lower() == "prometheus":
        for key in ("query", "promql"):
            query = _get(src_spec, key)
            if isinstance(query, str):
                suffixes = {m.group(1) for m in _PROM_UNIT.finditer(query)}
                named += [(u, f"{sp}.spec.{key}") for u in sorted(suffixes)]
    units = {UNIT_MS[u] for u, _ in given + named}
    if len(units) > 1:
        where = ", ".join(f"{u} ({w})" for u, w in given + named)
        issues.add(given[0][1] if given else named[0][1], f"units disagree: {where}")
        return None
    if given:
        return given[0][0]
    if named:
        return named[0][0]
    if kind == SOURCE_TYPE:
        return "ms"  # tailguard's own boundaries are in ms (what export writes)
    why = " (its query names no metric with a unit suffix, e.g. _seconds)"
    issues.add(
        f"{sp}.spec.unit",
        f"the unit of the objective's value is unknown for a {kind or 'typeless'} source"
        f"{why if kind.lower() == 'prometheus' else ''}: give spec.unit "
        f"({', '.join(UNIT_MS)}) or annotation {X}unit",
    )
    return None


def _condition_in(doc: Any, path: str, issues: _Issues) -> dict[str, Any] | None:
    ann = _annotations(doc)
    spec = _get(doc, "spec")
    cond = _get(spec, "condition")
    cp = f"{path}.spec.condition"
    if _get(cond, "kind") != "burnrate":
        issues.add(f"{cp}.kind", f"{_get(cond, 'kind')!r}: only burnrate maps")
        return None
    if _get(cond, "op") not in ("gt", "gte"):
        issues.add(f"{cp}.op", f"{_get(cond, 'op')!r}: a burn-rate alert fires above a rate")
    if _get(cond, "alertAfter") not in (None, "0m", "0s"):
        issues.add(
            f"{cp}.alertAfter",
            "does not map: a tailguard burn-rate rule fires when "
            "both its windows exceed the factor (the short window is the debounce)",
        )
    severity = _get(spec, "severity")
    if severity not in SEVERITIES:
        issues.add(f"{path}.spec.severity", f"{severity!r}: page or ticket")
    long = _duration_in(_get(cond, "lookbackWindow"), f"{cp}.lookbackWindow", issues)
    rule: dict[str, Any] = {
        "name": _get(_get(doc, "metadata"), "name"),
        "kind": "burn_rate",
        "severity": severity,
        "factor": _get(cond, "threshold"),
        "long": long,
    }
    if _get(spec, "description") is not None:
        rule["description"] = _get(spec, "description")
    short = ann.get(X + "short-window")
    if short is None and long is not None:
        short = format_ms(max(60_000, parse_duration_ms(long) // 12 // 60_000 * 60_000))
    rule["short"] = short
    if X + "min-requests" in ann:
        try:
            rule["min_requests"] = int(ann[X + "min-requests"])
        except ValueError:
            issues.add(f"{path}.metadata.annotations.{X}min-requests", "not an integer")
    slos = _json_ann(ann, "slos", path, issues)
    if slos is not None:
        rule["slos"] = slos
    return rule


def import_openslo(
    docs: Sequence[Any], source: str = "<openslo>"
) -> tuple[SLOSpec, BurnRules | None]:
    """OpenSLO v1 documents -> a tailguard spec (and burn rules when any alert policy is
    given); raises :class:`OpenSLOError` naming every field that does not map."""
    issues = _Issues()
    slis: dict[str, tuple[Any, str]] = {}
    slo_docs: list[tuple[Any, str]] = []
    policies: dict[str, tuple[Any, str]] = {}
    conditions: dict[str, tuple[Any, str]] = {}
    for i, doc in enumerate(docs):
        path = f"[{i}]"
        if not isinstance(doc, Mapping):
            issues.add(path, "not a mapping")
            continue
        if doc.get("apiVersion") != API:
            issues.add(f"{path}.apiVersion", f"{doc.get('apiVersion')!r}: only {API}")
            continue
        kind, name = doc.get("kind"), _get(doc.get("metadata"), "name")
        if kind == "SLO":
            slo_docs.append((doc, path))
        elif kind == "SLI":
            slis[str(name)] = (doc, path)
        elif kind == "AlertPolicy":
            policies[str(name)] = (doc, path)
        elif kind == "AlertCondition":
            conditions[str(name)] = (doc, path)
        elif kind in ("Service", "DataSource", "AlertNotificationTarget"):
            continue  # nothing of tailguard's: notification targets are the receivers' config
        else:
            issues.add(f"{path}.kind", f"{kind!r}: SLO, SLI, AlertPolicy, AlertCondition map")
    if not slo_docs:
        issues.add("", "no SLO document")
    slos = [_slo_in(doc, path, slis, issues) for doc, path in slo_docs]
    spec_doc: dict[str, Any] = {"apiVersion": "tailguard/v1", "kind": "SLOSpec", "slos": slos}
    if slo_docs:
        ann = _annotations(slo_docs[0][0])
        if X + "spec-description" in ann:
            spec_doc["description"] = ann[X + "spec-description"]
        tiers = _json_ann(ann, "tiers", slo_docs[0][1], issues)
        if tiers is not None:
            spec_doc["tiers"] = tiers
    rules_doc = _rules_in(slo_docs, slos, policies, conditions, issues)
    if issues.items:
        raise OpenSLOError(source, issues.items)
    spec = _validate(lambda: SLOSpec.model_validate(spec_doc), source, "slos")
    rules = None
    if rules_doc is not None:
        rules = _validate(lambda: BurnRules.model_validate(rules_doc), source, "rules")
    return spec, rules


def _rules_in(
    slo_docs: list[tuple[Any, str]],
    slos: list[dict[str, Any]],
    policies: Mapping[str, tuple[Any, str]],
    conditions: Mapping[str, tuple[Any, str]],
    issues: _Issues,
) -> dict[str, Any] | None:
    if not policies:
        for doc, path in slo_docs:
            for j, ref in enumerate(_get(_get(doc, "spec"), "alertPolicies") or []):
                issues.add(f"{path}.spec.alertPolicies[{j}]", f"no AlertPolicy named {ref!r}")
        return None
    users: dict[str, list[str]] = {name: [] for name in policies}
    for (doc, path), slo in zip(slo_docs, slos, strict=True):
        for j, ref in enumerate(_get(_get(doc, "spec"), "alertPolicies") or []):
            name = _get(_get(ref, "metadata"), "name") if isinstance(ref, Mapping) else ref
            if name not in users:
                issues.add(f"{path}.spec.alertPolicies[{j}]", f"no AlertPolicy named {name!r}")
                continue
            users[str(name)].append(str(slo.get("name")))
    all_slos = [str(s.get("name")) for s in slos]
    rules: list[dict[str, Any]] = []
    doc_out: dict[str, Any] = {"apiVersion": "tailguard/v1", "kind": "BurnRules"}
    for pname, (pdoc, ppath) in policies.items():
        ann = _annotations(pdoc)
        for j, c in enumerate(_get(_get(pdoc, "spec"), "conditions") or []):
            cpath = f"{ppath}.spec.conditions[{j}]"
            if isinstance(c, Mapping) and "conditionRef" in c:
                ref = c["conditionRef"]
                if ref not in conditions:
                    issues.add(f"{cpath}.conditionRef", f"no AlertCondition named {ref!r}")
                    continue
                rule = _condition_in(conditions[ref][0], conditions[ref][1], issues)
            else:
                rule = _condition_in(c, cpath, issues)
            if rule is None:
                continue
            used = users[pname]
            if "slos" not in rule and used and sorted(set(used)) != sorted(all_slos):
                rule["slos"] = used
            rules.append(rule)
        extra = _json_ann(ann, "rules", ppath, issues)
        if isinstance(extra, list):
            rules.extend(extra)
        events = _json_ann(ann, "budget-events", ppath, issues)
        if events is not None:
            doc_out["budget_events"] = events
        if X + "rules-description" in ann:
            doc_out["description"] = ann[X + "rules-description"]
    doc_out["rules"] = rules
    return doc_out


def _validate(fn: Any, source: str, root: str) -> Any:
    try:
        return fn()
    except ValidationError as e:
        raise OpenSLOError(
            source,
            [
                SpecIssue(
                    f"{root}." + ".".join(str(p) for p in err["loc"]),
                    f"{err['msg']} (after mapping to tailguard/v1)",
                )
                for err in e.errors()
            ],
        ) from None


def spec_document(spec: SLOSpec) -> dict[str, Any]:
    """A spec as the plain document of its YAML file (loads back equal)."""
    doc: dict[str, Any] = spec.model_dump(by_alias=True, exclude_none=True, mode="json")
    if not doc.get("tiers"):
        doc.pop("tiers", None)
    for slo in doc["slos"]:
        if slo.get("threshold_strict") is False:
            del slo["threshold_strict"]  # the default (<=): written only when strict
    return doc


def rules_document(rules: BurnRules) -> dict[str, Any]:
    doc: dict[str, Any] = rules.model_dump(by_alias=True, exclude_none=True, mode="json")
    return doc
