"""Issue 52's scenarios: fair shares across tenants and deadline-aware admission, each
beside the loops it is judged against (docs/admission.md sums it up;
bench/ADMISSION-HISTORY.md has the tables).

    .venv/bin/python -m tools.dev.admission_scenarios [flood|deadline|normal ...] [--json F]
        [--seed N] [--run NAME ...]

``--seed`` sets the simulator's seed (the figures in bench/ADMISSION-HISTORY.md: seeds 0, 1, 2);
``--run`` runs only the named runs of a scenario (e.g. ``--run "tailguard, no flood"
--run "tailguard fair"``: the flood check's two).

* ``flood``: the shared trace; tenant-a's priority-1 requests x10 from 1200 s to 1800 s
  (10 minutes). Runs: tailguard without the flood (the reference), then with it: no
  control, static levels, AIMD, tailguard blind to tenants (admission as before issue 52)
  and tailguard with fair shares. Per tenant: its compliance over the run and its
  priority-1 requests turned away during the flood.
* ``deadline``: every stream carries its own first-token SLO drawn from 300 ms, 1 s and
  5 s (equal weights); x4 from 1200 s to 1800 s. Runs: no control, static levels, AIMD,
  tailguard without deadlines (today's policy) and with them (the same policy with
  ``deadline_margin: 0.25`` at every level that admits). Goodput counted against each
  request's own SLO, the share of admitted requests that miss it, refused as late, and
  the prediction's error (P50/P90 of predicted - actual first-token time, admitted).
* ``normal``: the same SLO mix, no overload: nothing should be refused as late and
  nothing of priority 0-2 turned away.

Every run is :func:`pipeline.app.backtest.run_loop` (the backtest's own loop, the shipped
SLO spec and policy, default loop delay) on the same seed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import orjson

from pipeline.app.backtest import run_loop
from pipeline.cli import BACKTEST_START_UNIX_NS
from pipeline.shipped import DEFAULT_BURN_RULES, DEFAULT_POLICY, DEFAULT_SLO_SPEC, STATIC_POLICY
from pipeline.spec.burn_rules import load_burn_rules_file
from pipeline.spec.policy import ControlPolicy, load_policy_file
from pipeline.spec.slo import load_spec_file
from producers.enforcement import DEADLINE_MARGIN
from producers.simulator.model import OverloadEpisode, SimConfig, TenantFlood
from producers.simulator.trace import read_trace
from tests.paths import SHARED_TRACE

FLOOD = TenantFlood("tenant-a", 1, 1200.0, 1800.0, 10.0)
NO_FLOOD = TenantFlood("tenant-a", 1, 1200.0, 1800.0, 1.0)
SLO_MIX = ((300.0, 1.0), (1000.0, 1.0), (5000.0, 1.0))
OVERLOAD_X4 = OverloadEpisode(1200.0, 1800.0, factor=4.0)

# scenario -> [(run name, loop, SimConfig overrides, run_loop options)]
SCENARIOS: dict[str, list[tuple[str, str, dict[str, Any], dict[str, Any]]]] = {
    "flood": [
        # x1: no copies, measured over the same window
        ("tailguard, no flood", "tailguard", {"tenant_floods": (NO_FLOOD,)}, {}),
        ("no control", "open", {"tenant_floods": (FLOOD,)}, {}),
        ("static levels", "static", {"tenant_floods": (FLOOD,)}, {}),
        ("AIMD", "aimd", {"tenant_floods": (FLOOD,)}, {}),
        ("tailguard blind", "tailguard", {"tenant_floods": (FLOOD,)}, {}),
        ("tailguard fair", "tailguard", {"tenant_floods": (FLOOD,)}, {"fair_share": True}),
    ],
    "deadline": [
        (name, loop, {"slo_ttft_mix": SLO_MIX, "overload": OVERLOAD_X4}, opts)
        for name, loop, opts in (
            ("no control", "open", {}),
            ("static levels", "static", {}),
            ("AIMD", "aimd", {}),
            ("tailguard today", "tailguard", {}),
            ("tailguard deadline", "tailguard", {"deadline_margin": DEADLINE_MARGIN}),
        )
    ],
    "normal": [
        (
            "tailguard deadline",
            "tailguard",
            {"slo_ttft_mix": SLO_MIX},
            {"deadline_margin": DEADLINE_MARGIN},
        )
    ],
}


def with_actions(policy: ControlPolicy, **actions: Any) -> ControlPolicy:
    """``policy`` with ``actions`` set at every level that admits."""
    levels = [
        lv.model_copy(update={"actions": lv.actions.model_copy(update=actions)})
        if lv.actions.admission
        else lv
        for lv in policy.levels
    ]
    return policy.model_copy(update={"levels": levels})


def run(scenario: str, seed: int = 0, only: set[str] | None = None) -> dict[str, dict[str, Any]]:
    trace = read_trace(SHARED_TRACE)
    spec = load_spec_file(DEFAULT_SLO_SPEC)
    rules = load_burn_rules_file(DEFAULT_BURN_RULES)
    policies = {"static": load_policy_file(STATIC_POLICY)}
    default = load_policy_file(DEFAULT_POLICY)
    out: dict[str, dict[str, Any]] = {}
    for name, loop, overrides, opts in SCENARIOS[scenario]:
        if only is not None and name not in only:
            continue
        config = SimConfig(start_unix_ns=BACKTEST_START_UNIX_NS, seed=seed, **overrides)
        policy = policies.get(loop, default)
        if opts:
            policy = with_actions(policy, **opts)
        out[name] = run_loop(trace, config, spec, policy, rules, loop=loop)
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f} %"


def render(scenario: str, runs: dict[str, dict[str, Any]]) -> str:
    names = list(runs)
    rows: list[list[str]] = [["", *names]]
    first = next(iter(runs.values()))
    if scenario == "flood":
        tenants = sorted(first.get("by_tenant") or next(
            r["by_tenant"] for r in runs.values() if "by_tenant" in r))  # fmt: skip
        for slo in ("ttft-stream", "gold-ttft"):
            rows.append([f"{slo} compliance, run, per tenant", *("" for _ in names)])
            for t in tenants:
                rows.append([f"  {t}", *(
                    _pct(r.get("by_tenant", {}).get(t, {}).get("slos", {}).get(slo))
                    if "by_tenant" in r else _pct(r["slos"][slo]["compliance"]) + " (all)"
                    for r in runs.values())])  # fmt: skip
        rows.append(["priority-1 requests turned away in the flood", *("" for _ in names)])
        for t in tenants:
            rows.append([f"  {t}", *(
                f"{r['by_tenant'][t]['flood_turned_away']:,} / "
                f"{r['by_tenant'][t]['flood_requests']:,}" if "by_tenant" in r else "-"
                for r in runs.values())])  # fmt: skip
        p0 = [_pct(r["by_priority"]["0"]["slos"].get("ttft-stream")) for r in runs.values()]
        rows.append(["priority 0 ttft-stream, run", *p0])
    else:
        own = [r.get("own_slo", {}) for r in runs.values()]
        part = "episode" if scenario == "deadline" else "run"
        rows.append([f"own first-token SLO ({part})", *("" for _ in names)])
        for key in ("requests", "admitted", "good", "late_admitted", "refused_as_late"):
            rows.append([f"  {key}", *(f"{o.get(part, {}).get(key, 0):,}" for o in own)])
        rows.append(["  late share of admitted", *(
            _pct(o.get(part, {}).get("late_share")) for o in own)])  # fmt: skip
        rows.append([f"  goodput against own SLO ({part})", *(
            f"{o[part]['goodput_rps']:.3f}/s" if o else "-" for o in own)])  # fmt: skip
        rows.append(["prediction error P50 / P90 (pred - actual)", *(
            f"{r['ttft_prediction']['p50_ms']:,.0f} / {r['ttft_prediction']['p90_ms']:,.0f} ms"
            if "ttft_prediction" in r else "-" for r in runs.values())])  # fmt: skip
        rows.append(["turned away, priority 0 / 1 / 2 / 3", *(
            " / ".join(f"{r['shed'].get(str(p), 0):,}" for p in range(4))
            for r in runs.values())])  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [
            f"{row[0]:<{widths[0]}}",
            *(f"{c:>{w}}" for c, w in zip(row[1:], widths[1:], strict=True)),
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenarios", nargs="*", help=f"of {', '.join(SCENARIOS)} (default: all)")
    ap.add_argument("--json", type=Path, help="also write every run's backtest JSON here")
    ap.add_argument("--seed", type=int, default=0, help="the simulator's seed (default 0)")
    ap.add_argument(
        "--run",
        action="append",
        dest="runs",
        help="run only this run of a scenario (by name; repeat for several; default: all)",
    )
    args = ap.parse_args(argv)
    unknown = set(args.scenarios) - set(SCENARIOS)
    if unknown:
        ap.error(f"unknown scenarios {sorted(unknown)}: of {', '.join(SCENARIOS)}")
    chosen = args.scenarios or list(SCENARIOS)
    known = {name for s in chosen for name, *_ in SCENARIOS[s]}
    if args.runs is not None and set(args.runs) - known:
        ap.error(f"unknown runs {sorted(set(args.runs) - known)}: of {sorted(known)}")
    docs: dict[str, Any] = {}
    for scenario in chosen:
        only = None if args.runs is None else set(args.runs)
        runs = run(scenario, args.seed, only)
        if not runs:
            continue
        docs[scenario] = runs
        print(f"## {scenario}\n{render(scenario, runs)}\n", flush=True)
    if args.json is not None:
        args.json.write_bytes(orjson.dumps(docs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
