"""Run issue 35's scenario matrix through ``tailguard backtest`` and print, per
scenario, a compact table of every loop side by side and the done-when checks.

    python -m tools.dev.control_matrix                  # every scenario, sequentially
    python -m tools.dev.control_matrix --only code-x4 burst
    python -m tools.dev.control_matrix --cached         # re-print var/bt/*.json

Scenarios: the shared trace at normal load, x2 and x4 for 10 minutes and a ramp from
x1 to x4 over those 10 minutes; the code shape
(long prompts, short outputs) at normal load and x4; the rate3 shape (3x the rate all
hour); the burst shape (60 s x5 at minute 25, measured as the episode with
``--window``). The shaped traces are built under ``var/traces/`` when missing
(``tools.dev.make_trace``). Each backtest's JSON is kept in ``var/bt/NAME.json``.

Per scenario: each SLO's compliance over the run and during the episode (all traffic
and priority 0), goodput over the run and during the episode, requests of priority 0-2
turned away, the first level after the episode starts, the time every scope is back at
L0 after it and the levels raised before it; then the checks of issue 35 that apply,
and issue 47's: no scope reaches half-open or L0 inside the episode once it entered a
level (``exits_inside``), and every scope is back at L0 <= 10 min after it.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, Final

import orjson

from pipeline.app.figures import figure, percent
from tools.dev import backtest_matrix

BT_DIR: Final = Path("var/bt")
TRACE_DIR: Final = Path("var/traces")
FIRST_BYTE_SLO: Final = "ttft-stream"
# Priority 0's first-token SLOs of the shipped spec (the "p0" checks: >= 97 %, >= open + 10)
FIRST_BYTE_SLOS: Final = ("ttft-stream", "gold-ttft")
BASELINES: Final = ("open", "static", "aimd")
# A priority turned away at least this share of its attempts in the episode: the engines
# serve less than it and the higher ones ask, so every lower one is turned away (strict).
STRICT_SHORT: Final = 0.05


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    args: tuple[str, ...]
    shape: str | None = None  # make_trace shape the trace is built with
    checks: tuple[str, ...] = field(default=())


SCENARIOS: Final = (
    Scenario("normal", ("--overload", "none"), checks=("normal",)),
    Scenario("x2", ("--overload", "1200:1800:2"), checks=("episode", "p0", "exits")),
    Scenario("x4", ("--overload", "1200:1800:4"), checks=("episode", "p0", "exits")),
    # x1 rising to x4 over the episode: acting at the first seconds is not expected
    Scenario("ramp", ("--overload", "ramp:1200:1800:4"), checks=("exits",)),
    Scenario("code-normal", ("--overload", "none"), shape="code", checks=("normal",)),
    Scenario(
        "code-x4",
        ("--overload", "1200:1800:4"),
        shape="code",
        checks=("episode", "p0", "exits"),
    ),
    Scenario("rate3", ("--overload", "none"), shape="rate3", checks=("baselines", "exits-all")),
    Scenario(
        "burst",
        ("--overload", "none", "--window", "1500:1560"),
        shape="burst",
        checks=("episode", "baselines", "exits"),
    ),
    # beside the matrix: engines scheduling by priority, a spec the policy was not
    # written for, and mild overloads all hour (figures, no done-when)
    Scenario("x4-priority", ("--overload", "1200:1800:4", "--scheduling", "priority")),
    Scenario("chat400", ("--overload", "none", "--slo", "var/chat400.yaml")),
    Scenario("r1.15", ("--rate-scale", "1.15", "--overload", "none")),
    Scenario("r1.3", ("--rate-scale", "1.3", "--overload", "none")),
    Scenario("r1.5", ("--rate-scale", "1.5", "--overload", "none")),
)

# Two SLOs the shipped policy was not written for: every request's total within 400 ms
# and every stream's first byte within 2 s, 99 % each (the "chat400" scenario).
CHAT400: Final = """apiVersion: tailguard/v1
kind: SLOSpec
description: chat400 (docs/control-figures.md), a spec the shipped policy was not tuned to.
slos:
  - name: total-400
    boundary: gateway_total_ms
    threshold_ms: 400
    objective: 0.99
    window: {rolling: 30d}
  - name: ttfb-stream-2s
    boundary: gateway_ttfb_ms
    threshold_ms: 2000
    objective: 0.99
    window: {rolling: 30d}
    filter: {stream: true}
"""


def _trace(shape: str) -> Path:
    path = TRACE_DIR / f"{shape}.csv"
    if not path.exists():
        TRACE_DIR.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "tools.dev.make_trace", "--shape", shape, "--out", str(path)],
            check=True,
        )
    return path


def run(sc: Scenario, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    if "var/chat400.yaml" in sc.args:
        Path("var").mkdir(exist_ok=True)
        Path("var/chat400.yaml").write_text(CHAT400)
    cmd = [sys.executable, "-m", "pipeline.cli", "backtest", *sc.args, *extra, "--json"]
    if sc.shape is not None:
        cmd += ["--trace", str(_trace(sc.shape))]
    t0 = time.monotonic()
    out = subprocess.run(cmd, check=True, capture_output=True).stdout
    BT_DIR.mkdir(parents=True, exist_ok=True)
    (BT_DIR / f"{sc.name}.json").write_bytes(out)
    sys.stderr.write(f"{sc.name}: {' '.join(cmd[2:])} ({time.monotonic() - t0:.0f} s)\n")
    doc: dict[str, Any] = orjson.loads(out)
    return doc


_pct = partial(percent, spec=".2f", unit="")
_s = partial(figure, spec=".0f", unit=" s")
_rps = partial(figure, spec=".2f")


def table(name: str, doc: dict[str, Any]) -> list[str]:
    runs: dict[str, dict[str, Any]] = doc["runs"]
    loops = list(runs)
    first = runs[loops[0]]
    ep = first.get("episode")
    out = [f"## {name}", "", "| | " + " | ".join(loops) + " |", "|---|" + "---:|" * len(loops)]

    def row(label: str, cells: list[str]) -> None:
        out.append(f"| {label} | " + " | ".join(cells) + " |")

    for slo in first["slos"]:
        row(f"{slo} run %", [_pct(r["slos"][slo]["compliance"]) for r in runs.values()])
        if ep is not None:
            row(f"{slo} episode %", [_pct(r["episode"]["slos"].get(slo)) for r in runs.values()])
    p0 = [r["by_priority"]["0"] for r in runs.values()]
    row(f"p0 {FIRST_BYTE_SLO} run %", [_pct(p["slos"].get(FIRST_BYTE_SLO)) for p in p0])
    if ep is not None:
        row(
            f"p0 {FIRST_BYTE_SLO} episode %",
            [_pct(p.get("episode_slos", {}).get(FIRST_BYTE_SLO)) for p in p0],
        )
    row("goodput run /s", [_rps(r.get("goodput_rps")) for r in runs.values()])
    if ep is not None:
        row("goodput episode /s", [_rps(r["episode"]["goodput_rps"]) for r in runs.values()])
    row(
        "turned away p0-2",
        [str(sum(r["shed"].get(p, 0) for p in "012")) for r in runs.values()],
    )
    if ep is not None:
        row("first action", [_s(r["episode"]["first_action_s"]) for r in runs.values()])
        row("back at L0", [_s(r["episode"]["back_at_l0_s"]) for r in runs.values()])
        row("levels before", [str(r["episode"]["levels_before"]) for r in runs.values()])
    else:
        row("levels raised", [str(r.get("levels_raised", 0)) for r in runs.values()])
    return out


# The backtest's fixed start (pipeline.cli.BACKTEST_START_UNIX_NS): transitions' times
# are read as trace offsets from it.
START_NS: Final = 1_800_000_000_000_000_000
TRACE_S: Final = 3600.0  # the shaped traces span an hour


def exits_inside(
    transitions: list[dict[str, Any]], start_s: float, end_s: float, start_ns: int = START_NS
) -> list[str]:
    """Issue 47: the transitions of a scope that had entered a level to half-open or L0
    inside the episode [start_s, end_s) (trace offsets), as "scope half_open at +170 s"
    (seconds into the episode). A scope that never entered a level is not listed."""
    out = []
    raised: set[str] = set()
    for t in sorted(transitions, key=lambda x: x["ts_unix_ns"]):
        at_s = (t["ts_unix_ns"] - start_ns) / 1e9
        if t["level"] >= 1 and t["phase"] == "degraded":
            raised.add(t["scope"])
        elif start_s <= at_s < end_s and t["scope"] in raised:
            out.append(f"{t['scope']} {t['phase']} at +{at_s - start_s:.0f} s")
    return out


def checks(sc: Scenario, doc: dict[str, Any]) -> list[tuple[str, bool]]:
    """Issue 35's done-when items that apply to ``sc``: (what, met)."""
    runs: dict[str, dict[str, Any]] = doc["runs"]
    tg = runs.get("tailguard")
    if tg is None:
        return []
    out: list[tuple[str, bool]] = []
    base = [runs[b] for b in BASELINES if b in runs]
    slos = [s for s, v in tg["slos"].items() if v["compliance"] is not None]
    if "normal" in sc.checks and "open" in runs:
        op = runs["open"]
        worst = min(
            (tg["slos"][s]["compliance"] - op["slos"][s]["compliance"] for s in slos),
            default=0.0,
        )
        out.append(
            (f"never worse than open by > 0.5 points (worst {100 * worst:+.2f})", worst >= -0.005)
        )
        shed = sum(tg["shed"].get(p, 0) for p in "012")
        out.append((f"no priority 0-2 turned away ({shed})", shed == 0))
    if "p0" in sc.checks and "open" in runs:
        for slo in FIRST_BYTE_SLOS:
            p0 = tg["by_priority"]["0"]["slos"].get(slo)
            op0 = runs["open"]["by_priority"]["0"]["slos"].get(slo)
            if p0 is None or op0 is None:
                continue
            out.append((f"p0 {slo} >= 97 % ({100 * p0:.2f})", p0 >= 0.97))
            if op0 > 0.90:
                # open + 10 points is above 100 %: nothing to check (the code shape at x4)
                out.append((f"p0 {slo} >= open + 10: n/a, open is {100 * op0:.2f}", True))
            else:
                out.append(
                    (
                        f"p0 {slo} >= open + 10 ({100 * p0:.2f} vs {100 * op0:.2f})",
                        p0 >= op0 + 0.10,
                    )
                )
    if "episode" in sc.checks and "episode" in tg:
        e = tg["episode"]
        fa, back = e["first_action_s"], e["back_at_l0_s"]
        out.append((f"first action <= 30 s ({_s(fa)})", fa is not None and fa <= 30))
        out.append((f"no level before the episode ({e['levels_before']})", e["levels_before"] == 0))
        out.append((f"back at L0 <= 600 s ({_s(back)})", back is not None and back <= 600))
        best = max((b["episode"]["goodput_rps"] for b in base), default=0.0)
        g = e["goodput_rps"]
        out.append((f"episode goodput >= best baseline ({g:.2f} vs {best:.2f})", g >= best))
    if "episode" in sc.checks and "episode" in tg and "open" in runs:
        out += _issue_47_checks(tg, runs["open"])
    if "exits" in sc.checks and "episode" in tg:
        e = tg["episode"]
        if "episode" not in sc.checks:
            back = e["back_at_l0_s"]
            out.append((f"back at L0 <= 600 s ({_s(back)})", back is not None and back <= 600))
        gaps = exits_inside(tg.get("control", []), e["start_s"], e["end_s"])
        shown = ", ".join(gaps) if gaps else "none"
        out.append((f"no half-open or L0 inside the episode ({shown})", not gaps))
    if "exits-all" in sc.checks:
        # overloaded all run (rate3): no half-open or L0 once a level is entered
        gaps = exits_inside(tg.get("control", []), 0.0, TRACE_S)
        shown = ", ".join(gaps) if gaps else "none"
        out.append((f"no half-open or L0 during the run ({shown})", not gaps))
    if "baselines" in sc.checks:
        for s in slos:
            best = max(b["slos"][s]["compliance"] or 0.0 for b in base)
            c = tg["slos"][s]["compliance"]
            out.append((f"{s} >= best baseline ({100 * c:.2f} vs {100 * best:.2f})", c >= best))
        best_g = max(b["goodput_rps"] or 0.0 for b in base)
        g = tg["goodput_rps"] or 0.0
        out.append((f"goodput >= best baseline ({g:.2f} vs {best_g:.2f})", g >= best_g))
    return out


def _issue_47_checks(tg: dict[str, Any], op: dict[str, Any]) -> list[tuple[str, bool]]:
    """Issue 47's overload checks: strict tiers during the episode (each priority's
    turned-away share of its attempts at most half the next lower priority's), client
    attempts at most 1.3x no control's, every all-traffic SLO per logical request at
    least no control's - 1 point."""
    out: list[tuple[str, bool]] = []
    bp = tg["by_priority"]
    share: dict[int, float] = {}
    for p in range(4):
        n = bp[str(p)].get("episode_attempts")
        if n:
            share[p] = bp[str(p)]["episode_turned_away"] / n
    for p in (1, 2):
        if p in share and p + 1 in share:
            lo, hi = share[p], share[p + 1]
            met = lo <= 0.5 * hi or lo == 0.0
            why = ""
            if not met and share.get(p - 1, 0.0) >= STRICT_SHORT:
                # strict tiers: a higher priority turned away means every lower one's tokens
                # were gone; p's share then exceeds half of p+1's <= 100 % (issue 47)
                why = (
                    f"; cannot hold with strict tiers while priority {p - 1} is itself "
                    f"turned away ({100 * share[p - 1]:.1f} %): the engines serve less than "
                    f"priorities 0-{p - 1} ask (bench/CONTROL-HISTORY.md, 'Strict tiers: "
                    "why the half rule fails')"
                )
            out.append(
                (
                    f"p{p} turned away <= 1/2 p{p + 1}'s in the episode "
                    f"({100 * lo:.1f} % vs {100 * hi:.1f} %{why})",
                    met,
                )
            )
    ratio = tg["requests"] / op["requests"] if op["requests"] else 0.0
    out.append((f"client attempts <= 1.3 x no control's ({ratio:.2f} x)", ratio <= 1.3))
    lg, lo_ = tg.get("logical", {}).get("all", {}), op.get("logical", {}).get("all", {})
    deltas = [
        (lg["slos"][s]["compliance"] - lo_["slos"][s]["compliance"], s)
        for s in lg.get("slos", {})
        if lg["slos"][s].get("compliance") is not None
        and lo_.get("slos", {}).get(s, {}).get("compliance") is not None
    ]
    if deltas:
        d, s = min(deltas)
        out.append(
            (f"per logical request every SLO >= open - 1 (worst {100 * d:+.2f}, {s})", d >= -0.01)
        )
    return out


SUMMARY_BEGIN: Final = "<!-- control-summary:begin (generated by tools.dev.control_matrix) -->"
SUMMARY_END: Final = "<!-- control-summary:end -->"


def _worst_logical(tg: dict[str, Any], op: dict[str, Any]) -> str:
    """The all-traffic SLO per logical request furthest below no control's, in points."""
    lg, lo = tg.get("logical", {}).get("all", {}), op.get("logical", {}).get("all", {})
    deltas = [
        (v["compliance"] - lo["slos"][s]["compliance"], s)
        for s, v in lg.get("slos", {}).items()
        if v.get("compliance") is not None
        and lo.get("slos", {}).get(s, {}).get("compliance") is not None
    ]
    if not deltas:
        return "n/a"
    d, s = min(deltas)
    return f"{100 * d:+.1f} ({s})"


def summary_row(name: str, doc: dict[str, Any]) -> str:
    """One scenario in the summary table: tailguard beside no control (and the best
    baseline's episode goodput)."""
    runs: dict[str, dict[str, Any]] = doc["runs"]
    tg, op = runs["tailguard"], runs["open"]
    p0 = [
        f"{_pct(tg['by_priority']['0']['slos'].get(slo))} / "
        f"{_pct(op['by_priority']['0']['slos'].get(slo))}"
        for slo in FIRST_BYTE_SLOS
    ]
    ep = tg.get("episode")
    if ep is None:
        best = max(runs[b].get("goodput_rps") or 0.0 for b in BASELINES if b in runs)
        goodput = f"{_rps(tg.get('goodput_rps'))} / {_rps(best)} (run)"
        back = "n/a"
    else:
        best = max(runs[b]["episode"]["goodput_rps"] for b in BASELINES if b in runs)
        goodput = f"{_rps(ep['goodput_rps'])} / {_rps(best)}"
        back = _s(ep["back_at_l0_s"])
    ratio = tg["requests"] / op["requests"] if op["requests"] else 0.0
    away = sum(tg["shed"].get(p, 0) for p in "012")
    cells = [*p0, _worst_logical(tg, op), goodput, f"{ratio:.2f}x", str(away), back]
    return f"| {name} | " + " | ".join(cells) + " |"


def summary(rows: list[str], head: str) -> list[str]:
    """The one table docs/control.md carries: every scenario, tailguard against no control."""
    return [
        SUMMARY_BEGIN,
        "",
        head,
        "",
        "| scenario | p0 ttft-stream, run: tailguard / none | p0 gold-ttft, run: tailguard / "
        "none | worst SLO per user request vs none (points) | goodput (episode, else run): "
        "tailguard / best baseline | attempts vs none | p0-2 turned away | "
        "back at L0 after the episode |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        SUMMARY_END,
    ]


def write_summary(path: Path, block: list[str]) -> None:
    """Replace the generated block between the markers in ``path`` (a manual page)."""
    text = path.read_text()
    start, end = text.index(SUMMARY_BEGIN), text.index(SUMMARY_END) + len(SUMMARY_END)
    path.write_text(text[:start] + "\n".join(block) + text[end:])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    names = [s.name for s in SCENARIOS]
    ap.add_argument("--only", nargs="+", choices=names, default=names)
    ap.add_argument("--cached", action="store_true", help="print var/bt/NAME.json, run nothing")
    ap.add_argument("--loop-delay", type=int, default=None, help="backtest --loop-delay MS")
    ap.add_argument("--write", type=Path, help="write the figures page (generated) here")
    ap.add_argument(
        "--summary-into",
        type=Path,
        help="rewrite the summary table between the control-summary markers of this page",
    )
    args = ap.parse_args(argv)
    extra = () if args.loop_delay is None else ("--loop-delay", str(args.loop_delay))
    missed = 0
    page: list[str] = []
    rows: list[str] = []
    for sc in SCENARIOS:
        if sc.name not in args.only:
            continue
        path = BT_DIR / f"{sc.name}.json"
        doc = orjson.loads(path.read_bytes()) if args.cached else run(sc, extra)
        print("\n".join(table(sc.name, doc)))
        print()
        cmd = "tailguard backtest " + " ".join((*sc.args, *extra))
        if sc.shape is not None:
            cmd += f" --trace var/traces/{sc.shape}.csv"
        page += [backtest_matrix.table(sc.name, doc), "", f"`{cmd} --json`", ""]
        if "tailguard" in doc["runs"] and "open" in doc["runs"]:
            rows.append(summary_row(sc.name, doc))
        for what, ok in checks(sc, doc):
            missed += not ok
            print(f"- [{'x' if ok else ' '}] {what}")
            page.append(f"- [{'x' if ok else ' '}] {what}")
        page.append("")
        print(flush=True)
    print(f"{missed} check(s) missed")
    if args.write is not None:
        args.write.write_text(_page(page, missed, args))
        print(f"wrote {args.write}")
    if args.summary_into is not None:
        where = args.write.name if args.write is not None else "control-figures.md"
        head = (
            f"{_provenance(args)} Every scenario's full table, command and checks: "
            f"[{where}]({where}); the command: `python -m tools.dev.control_matrix --write "
            f"docs/{where} --summary-into {args.summary_into}`."
        )
        write_summary(args.summary_into, summary(rows, head))
        print(f"wrote the summary into {args.summary_into}")
    return 1 if missed else 0


def _git(*a: str) -> str:
    return subprocess.run(["git", *a], capture_output=True, text=True, check=False).stdout.strip()


def _provenance(args: argparse.Namespace) -> str:
    """When, at which commit, on what machine and with which loop delay."""
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    dirty = " (uncommitted changes)" if _git("status", "--porcelain", "-uno") else ""
    delay = "the default" if args.loop_delay is None else f"{args.loop_delay} ms"
    load = "/".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"Generated {datetime.now(UTC):%Y-%m-%d %H:%M} UTC at commit "
        f"{_git('rev-parse', '--short', 'HEAD')}{dirty} on {platform.machine()}, "
        f"{os.cpu_count()} cores ({cpu}), load average {load} at the end; loop delay: "
        f"{delay}. The simulator is deterministic: the same commit, seed and command give "
        "the same figures on any machine."
    )


def _page(body: list[str], missed: int, args: argparse.Namespace) -> str:
    """The generated figures page: how it was made, then each scenario's table, the
    command that made it and its checks."""
    head = [
        "# Control figures (generated)",
        "",
        f"<!-- generated by `python -m tools.dev.control_matrix --write {args.write}` -->",
        "",
        f"{_provenance(args)} What the figures mean and how to judge a "
        "policy: [docs/control.md](control.md). Per scenario: the table (`python -m "
        "tools.dev.backtest_matrix`), the command, and the done-when checks of issues 35 "
        f'and 47 that apply ({missed} missed in all). "turned away" counts every 429 '
        'and cut-off 503, retries included; "per request" rows count a client\'s '
        "request once with its retries, by its final attempt (`pipeline/core/logical.py`).",
        "",
    ]
    return "\n".join(head + body).rstrip() + "\n"


if __name__ == "__main__":
    sys.exit(main())
