"""Summarise ``tailguard backtest --json`` outputs as Markdown tables (docs/control.md).

    python -m tools.dev.backtest_matrix var/bt/*.json > var/bt/matrix.md

One table per file (its name is the run's name): per loop, priority 0's first-token
compliance over the run, the worst SLO against no control, goodput over the run and
during the episode, requests turned away per priority group, and the episode's
control timing; then per logical request (what users saw: a request and its retries
once): logical requests, those never served, each SLO over the run and the episode, the
worst SLO against no control. Figures only; how they were produced is the caller's to say.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path
from typing import Any

import orjson

from pipeline.app.figures import figure, percent

FIRST_TOKEN = ("ttft-stream", "gold-ttft")


_pct = partial(percent, spec=".2f", unit=" %")
_rps = partial(figure, spec=",.2f", unit="/s")


def _secs(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f} s"


def table(name: str, doc: dict[str, Any]) -> str:
    runs: dict[str, dict[str, Any]] = doc["runs"]
    base = runs.get("open")
    loops = list(runs)
    out = [f"#### {name} (engines {doc.get('scheduling', 'fcfs').upper()})", ""]
    out.append("| | " + " | ".join(loops) + " |")
    out.append("|---|" + "---:|" * len(loops))

    def row(label: str, cells: list[str]) -> None:
        out.append(f"| {label} | " + " | ".join(cells) + " |")

    for slo in FIRST_TOKEN:
        if slo in runs[loops[0]]["by_priority"]["0"]["slos"]:
            row(
                f"priority 0 {slo}, run",
                [_pct(r["by_priority"]["0"]["slos"].get(slo)) for r in runs.values()],
            )
    for slo in runs[loops[0]]["slos"]:
        row(f"{slo}, run", [_pct(r["slos"][slo]["compliance"]) for r in runs.values()])
    if base is not None:

        def worst(r: dict[str, Any]) -> str:
            deltas = [
                (r["slos"][s]["compliance"] - base["slos"][s]["compliance"], s)
                for s in base["slos"]
                if r["slos"].get(s, {}).get("compliance") is not None
                and base["slos"][s]["compliance"] is not None
            ]
            if not deltas:
                return "-"
            d, s = min(deltas)
            return f"{100 * d:+.2f} ({s})"

        row("worst SLO vs no control (points)", [worst(r) for r in runs.values()])
    row("goodput, run", [_rps(r.get("goodput_rps")) for r in runs.values()])
    row(
        "turned away, priority 0-2",
        [f"{sum(r['shed'].get(p, 0) for p in '012'):,}" for r in runs.values()],
    )
    row("turned away, priority 3", [f"{r['shed'].get('3', 0):,}" for r in runs.values()])
    row("client retries", [f"{r['retries']:,}" for r in runs.values()])
    if base is not None and base.get("requests"):
        row(
            "client attempts / no control's",
            [f"{r['requests'] / base['requests']:.2f} x" for r in runs.values()],
        )

    def episode_shares(r: dict[str, Any]) -> str:
        bp = r["by_priority"]
        cells = []
        for p in "123":
            n = bp[p].get("episode_attempts")
            cells.append("-" if not n else f"{100 * bp[p]['episode_turned_away'] / n:.0f}")
        return " / ".join(cells) + " %"

    if all("episode_attempts" in r["by_priority"]["1"] for r in runs.values()):
        row("turned away in the episode, p1 / p2 / p3", [episode_shares(r) for r in runs.values()])
    if all("logical" in r for r in runs.values()):
        _logical_rows(row, runs, base)
    if "episode" in runs[loops[0]]:
        row("goodput, episode", [_rps(r["episode"]["goodput_rps"]) for r in runs.values()])
        row(
            "first level after the episode starts",
            [_secs(r["episode"]["first_action_s"]) for r in runs.values()],
        )
        row(
            "every scope at L0 after it ends",
            [_secs(r["episode"]["back_at_l0_s"]) for r in runs.values()],
        )
        row("levels raised before it", [str(r["episode"]["levels_before"]) for r in runs.values()])
    else:
        row("levels raised", [str(r.get("levels_raised", 0)) for r in runs.values()])
    row("notices (not load-caused)", [str(len(r.get("notices", []))) for r in runs.values()])
    return "\n".join(out)


def _logical_rows(row: Any, runs: dict[str, dict[str, Any]], base: dict[str, Any] | None) -> None:
    """Per logical request (a request and its retries once, by its final attempt: the
    backtest's ``logical``, pipeline/core/logical.py): what users saw."""
    lg = {k: r["logical"] for k, r in runs.items()}
    row("logical requests (users' requests)", [f"{x['all']['requests']:,}" for x in lg.values()])
    row("never served (final attempt refused/failed)",
        [f"{x['all']['never_served']:,}" for x in lg.values()])  # fmt: skip
    first = next(iter(lg.values()))
    for slo in first["all"]["slos"]:
        row(f"{slo}, run, per logical request",
            [_pct(x["all"]["slos"][slo]["compliance"]) for x in lg.values()])  # fmt: skip
    if base is not None:
        ref = base["logical"]["all"]["slos"]

        def worst(x: dict[str, Any]) -> str:
            deltas = [
                (x["all"]["slos"][s]["compliance"] - ref[s]["compliance"], s)
                for s in ref
                if x["all"]["slos"][s]["compliance"] is not None
                and ref[s]["compliance"] is not None
            ]
            if not deltas:
                return "-"
            d, s = min(deltas)
            return f"{100 * d:+.2f} ({s})"

        row("worst SLO vs no control, per logical request (points)",
            [worst(x) for x in lg.values()])  # fmt: skip
    if "episode" in first:
        row("never served, episode", [f"{x['episode']['never_served']:,}" for x in lg.values()])
        for slo in first["episode"]["slos"]:
            row(f"{slo}, episode, per logical request",
                [_pct(x["episode"]["slos"][slo]["compliance"]) for x in lg.values()])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    args = ap.parse_args(argv)
    for f in args.files:
        doc = orjson.loads(f.read_bytes())
        print(table(f.stem, doc))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
