"""``tailguard replay`` without ``--json``: the summary for a person (rich renderables).

Counts (requests, outcomes, dead letters, join), late and corrected records, P50/P99
per boundary, the SLO table (compliance, budget left, burn rates; worst first), and
the control timeline. ``--json`` prints the whole summary as one JSON object instead.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from pipeline.app.figures import figure
from pipeline.core.timefmt import iso_time


def _t(ns: int | float | None) -> str:
    if ns is None:
        return "-"
    return iso_time(ns / 1e9, timespec="seconds", sep=" ", offset=False)


_ms = partial(figure, spec=".1f")


def render_summary(summary: dict[str, Any]) -> Any:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    parts: list[Any] = []
    join = summary.get("join", {})
    windows = summary.get("windows", {})
    outcomes = ", ".join(f"{k} {v:,}" for k, v in summary.get("outcomes", {}).items())
    lines = [
        f"{summary['requests']:,} requests ({outcomes or 'none'}); "
        f"{summary['dead_letters']:,} dead letters -> {summary.get('dlq_file', '-')}",
        f"join: {join.get('events', 0):,} events, {join.get('joined', 0):,} joined, "
        f"{join.get('gateway_only', 0):,} gateway only, {join.get('engine_only', 0):,} engine "
        f"only, {join.get('duplicates', 0):,} duplicates "
        f"({join.get('duplicate_ids_changed', 0):,} an event id repeated with other content), "
        f"{join.get('conflicts', 0):,} "
        f"conflicts ({join.get('conflicts_corrected', 0):,} corrected a record emitted)",
        f"windows: {windows.get('closed', 0):,} closed, {windows.get('corrections', 0):,} "
        f"corrections ({windows.get('corrected_records', 0):,} late records corrected, "
        f"{windows.get('retracted_records', 0):,} retracted), "
        f"{windows.get('quarantined_events', 0):,} events quarantined, "
        f"{windows.get('counted_before_records', 0):,} repeats found counted after the join "
        "forgot them",
    ]
    if summary.get("store"):
        lines.append(f"written to the store {summary['store']}")
    if summary.get("store_rejected"):
        lines.append(f"{summary['store_rejected']:,} records refused by the store (in the DLQ)")
    parts.append(Text("\n".join(lines)))

    b = Table(title="latency per boundary (DDSketch)")
    b.add_column("boundary", no_wrap=True)
    for col in ("count", "P50 ms", "P99 ms"):
        b.add_column(col, justify="right")
    for name, st in summary.get("boundaries", {}).items():
        b.add_row(name, f"{st['count']:,}", _ms(st.get("p50")), _ms(st.get("p99")))
    parts.append(b)

    details = summary.get("slo_details", {}).get("slos", {})
    budgets = summary.get("budgets", {})
    if details:
        s = Table(title="SLOs (worst first)")
        s.add_column("slo", no_wrap=True)
        for col in ("objective", "total", "good", "compliance", "met", "budget left", "burn 5m",
                    "burn 1h"):  # fmt: skip
            s.add_column(col, justify="right")

        def badness(item: tuple[str, dict[str, Any]]) -> tuple[Any, ...]:
            name, d = item
            rem = budgets.get(name, {}).get("remaining_fraction")
            return (d.get("met") is not False, rem if rem is not None else float("inf"), name)

        for name, d in sorted(details.items(), key=badness):
            bud = budgets.get(name, {})
            rem, burn = bud.get("remaining_fraction"), bud.get("burn_rates", {})
            comp = d.get("compliance")
            s.add_row(
                name, f"{d.get('objective', 0):g}", f"{d.get('total', 0):,}",
                f"{d.get('good', 0):,}", "-" if comp is None else f"{comp:.4f}",
                "-" if d.get("met") is None else ("yes" if d["met"] else "NO"),
                "-" if rem is None else f"{100 * rem:.1f}%",
                "-" if burn.get("5m") is None else f"{burn['5m']:.2f}x",
                "-" if burn.get("1h") is None else f"{burn['1h']:.2f}x",
                style="bold red" if d.get("met") is False else None,
            )  # fmt: skip
        parts.append(s)

    if "control" in summary:
        c = Table(title="control timeline (event time, UTC)")
        for col in ("time", "scope", "level", "phase"):
            c.add_column(col, no_wrap=True)
        c.add_column("reason", overflow="fold")
        for d in summary.get("directives", summary["control"]):
            c.add_row(_t(d["ts_unix_ns"]), d["scope"], f"L{d['level']}", d["phase"], d["reason"])
        if not summary["control"]:
            parts.append(Text("control: no level change"))
        parts.append(c)
        events = summary.get("budget_events", [])
        if events:
            e = Table(title="budget events")
            for col in ("time", "slo", "event"):
                e.add_column(col, no_wrap=True)
            for ev in events:
                e.add_row(_t(ev["at_ms"] * 1_000_000), ev["slo"], ev["kind"])
            parts.append(e)
    parts.append(Text("(--json: the whole summary as one JSON object)", style="dim"))
    return Group(*parts)
