"""``tailguard replay`` without ``--json``: the summary a person reads (pure)."""

from __future__ import annotations

from rich.console import Console

from pipeline.app.replay_text import render_summary

SUMMARY = {
    "requests": 127,
    "dead_letters": 3,
    "dlq_file": "events.dlq.jsonl",
    "outcomes": {"ok": 120, "client_abort": 7},
    "join": {"events": 380, "joined": 120, "gateway_only": 7, "engine_only": 0,
             "duplicates": 2, "conflicts": 0},
    "windows": {"closed": 9, "corrections": 2, "corrected_records": 5, "retracted_records": 1,
                "quarantined_events": 0},
    "boundaries": {"gateway_total_ms": {"count": 127, "p50": 800.0, "p99": 2400.0}},
    "slo_details": {"slos": {
        "tier1-gateway": {"objective": 0.99, "total": 120, "good": 100, "compliance": 0.833,
                          "met": False},
        "tpot": {"objective": 0.99, "total": 120, "good": 120, "compliance": 1.0, "met": True},
    }},
    "budgets": {"tier1-gateway": {"remaining_fraction": -15.7,
                                  "burn_rates": {"5m": 20.0, "1h": 16.7}}},
    "control": [{"ts_unix_ns": 1_800_000_000_000_000_000, "scope": "llama", "level": 1,
                 "phase": "degraded", "reason": "L1 entry holds"}],
    "budget_events": [{"at_ms": 1_800_000_000_000, "slo": "tier1-gateway",
                       "kind": "budget_exhausted"}],
}  # fmt: skip


def test_replay_summary_reads_as_text_not_json() -> None:
    console = Console(width=160, record=True)
    console.print(render_summary(SUMMARY))
    text = console.export_text()
    assert "{" not in text
    assert "127 requests" in text
    assert "3 dead letters -> events.dlq.jsonl" in text
    assert "5 late records corrected" in text
    assert "-1570.0%" in text
    assert "20.00x" in text
    assert "L1 entry holds" in text
    assert "budget_exhausted" in text
    # worst SLO first
    assert text.index("tier1-gateway") < text.index("tpot")
