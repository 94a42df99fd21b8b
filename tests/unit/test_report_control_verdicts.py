"""The gateway control section of ``tailguard report`` and the line of ``tailguard
explain`` (issue 48), from rows and records (no store: tests/integration/
test_store_control_verdicts.py runs them on the real engine)."""

from __future__ import annotations

import io
from typing import Any

import pytest
from msgspec.structs import replace

from pipeline.adapters.queries.filters import ReportFilter
from pipeline.app.report import Report, control_verdicts, reasons_cell, render, verdict_cells
from pipeline.app.report_html import render_html
from pipeline.core.explain import gateway_control_note
from pipeline.core.record import build_record
from tests.factories import completed, finished, received

# (rows as control_counts gives them, the report's rows)
CASES = [
    ([], []),
    (
        [("m", 0, "shadow", None, 5), ("m", 0, "shadow", "admission", 2),
         ("m", 0, "shadow", "rate_limit", 1)],
        [{"model": "m", "priority": 0, "modes": {"shadow": 8}, "requests": 8, "served": 8,
          "would_refuse": {"admission": 2, "rate_limit": 1}, "refused": {}}],
    ),
    (
        [("m", 1, "enforce", None, 4), ("m", 1, "enforce", "shed_priority", 3),
         ("m", 1, "shadow", "admission", 1)],
        [{"model": "m", "priority": 1, "modes": {"enforce": 7, "shadow": 1}, "requests": 8,
          "served": 5, "would_refuse": {"admission": 1}, "refused": {"shed_priority": 3}}],
    ),
    (  # sorted by model, then priority (no priority last)
        [("b", None, "enforce", "queue_timeout", 1), ("b", 2, "enforce", None, 1),
         ("a", 3, "shadow", "new_session", 2)],
        [{"model": "a", "priority": 3, "modes": {"shadow": 2}, "requests": 2, "served": 2,
          "would_refuse": {"new_session": 2}, "refused": {}},
         {"model": "b", "priority": 2, "modes": {"enforce": 1}, "requests": 1, "served": 1,
          "would_refuse": {}, "refused": {}},
         {"model": "b", "priority": None, "modes": {"enforce": 1}, "requests": 1, "served": 0,
          "would_refuse": {}, "refused": {"queue_timeout": 1}}],
    ),
]  # fmt: skip


@pytest.mark.parametrize(("rows", "want"), CASES)
def test_control_verdicts_per_model_and_priority(
    rows: list[tuple[Any, ...]], want: list[dict[str, Any]]
) -> None:
    assert control_verdicts(rows) == want


@pytest.mark.parametrize(
    ("by", "cell"),
    [({}, "-"), ({"admission": 1}, "admission 1"),
     ({"rate_limit": 1, "admission": 3, "new_session": 1},
      "admission 3, new_session 1, rate_limit 1")],
)  # fmt: skip
def test_reasons_cell(by: dict[str, int], cell: str) -> None:
    assert reasons_cell(by) == cell


def _report(verdicts: list[dict[str, Any]]) -> Report:
    return Report(1, {"joined": 1}, {"ok": 1}, {}, {}, [], filters=ReportFilter(),
                  control_verdicts=verdicts)  # fmt: skip


def _text(report: Report) -> str:
    from rich.console import Console

    out = io.StringIO()
    Console(file=out, width=250).print(render(report))
    return out.getvalue()


@pytest.mark.parametrize("with_modes", [False, True])
def test_the_section_only_when_a_request_carried_a_mode(with_modes: bool) -> None:
    verdicts = CASES[2][1] if with_modes else []
    report = _report(verdicts)
    text, html = _text(report), render_html(report, None)
    js = report.to_json()
    assert "tailguard SLO report" in text
    if not with_modes:
        assert "control_verdicts" not in js
        assert "would have refused" not in text
        assert "would have refused" not in html
        return
    assert js["control_verdicts"] == verdicts
    assert "would have refused (shadow)" in text
    row = " ".join(verdict_cells(verdicts[0]))
    assert row.split()[:4] == ["m", "1", "enforce", "7,"]
    assert "shed_priority 3" in text
    assert "admission 1" in text
    assert "<td>shed_priority 3</td>" in html


def _record(mode: str | None, verdict: str | None, outcome: str = "ok", status: int = 200) -> Any:
    c = completed("r", outcome=outcome, http_status=status).model_copy(
        update={"control_mode": mode, "control_verdict": verdict}
    )
    fin = finished("r") if outcome == "ok" else None
    return build_record("r", received("r"), c, fin)


@pytest.mark.parametrize(
    ("mode", "verdict", "outcome", "status", "note"),
    [
        (None, None, "ok", 200, None),
        ("shadow", None, "ok", 200, "shadow: would have been admitted"),
        ("shadow", "admission", "ok", 200,
         "shadow: would have been refused (admission); served as without control"),
        ("enforce", None, "ok", 200, "enforce: admitted"),
        ("enforce", "shed_priority", "rejected", 429, "enforce: refused 429 (shed_priority)"),
        ("enforce", "queue_timeout", "rejected", 503, "enforce: refused 503 (queue_timeout)"),
    ],
)  # fmt: skip
def test_explain_note(
    mode: str | None, verdict: str | None, outcome: str, status: int, note: str | None
) -> None:
    assert gateway_control_note(_record(mode, verdict, outcome, status)) == note


def test_explain_note_without_a_status() -> None:
    r = replace(_record("enforce", "rate_limit", "rejected", 429), http_status=None)
    assert gateway_control_note(r) == "enforce: refused (rate_limit)"
