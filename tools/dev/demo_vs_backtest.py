"""The live demo against the backtest of the same trace, seed and episode (issue 47
item 6): priority 0's compliance during the episode, counted by the same code.

    ./tg demo --speedup 20 --tee DIR/events.jsonl --json DIR/report.json
    python -m tools.dev.demo_vs_backtest DIR/events.jsonl --report DIR/report.json \\
        --loop-delay P99_MS [--loop-delay P50_MS] [--overload 1200:1800:2 --seed 1 --limit N]

(P99_MS: the demo's own ``loop_delay.p99_ms`` from ``--json``; the backtest's rule, as its
default is the bench's live P99.)

The demo's events (``--tee``) are replayed through the core (join, records) and the
backtest's own per-priority SLO count (:func:`pipeline.app.backtest._slo_doc`) runs over
priority 0's requests received during the episode; the backtest runs its ``tailguard``
loop once per ``--loop-delay`` (default: its default). The episode is placed on the
demo's events by its trace offsets from the demo's first ``gateway.received`` (the
trace's first request arrives at offset 0). With ``--report``, the demo's measured loop
delay (``"loop_delay"``) is printed beside it. Figures only.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

import orjson

from pipeline.app.backtest import (
    BACKTEST_JOIN,
    BACKTEST_WINDOW,
    DEFAULT_LOOP_DELAY_MS,
    _slo_doc,
    run_loop,
)
from pipeline.app.demo import parse_overload
from pipeline.app.replay import replay_file
from pipeline.cli import BACKTEST_START_UNIX_NS, DEFAULT_OVERLOAD, DEFAULT_TRACE
from pipeline.settings import DEFAULT_SLO_SPEC
from pipeline.spec.policy import DEFAULT_POLICY_PATH, load_policy_file
from pipeline.spec.slo import load_spec_file
from producers.simulator.model import SimConfig
from producers.simulator.trace import read_trace


def _first_received_ns(events: Path) -> int:
    first: int | None = None
    with events.open("rb") as fh:
        for line in fh:
            msg = orjson.loads(line)  # a message: a list of events (JsonlSink)
            for ev in msg if isinstance(msg, list) else [msg]:
                if ev.get("kind") == "gateway.received":
                    ts = int(ev["ts_unix_ns"])
                    first = ts if first is None else min(first, ts)
    if first is None:
        raise SystemExit(f"{events}: no gateway.received event")
    return first


def demo_priority_0(events: Path, spec: Any, lo_s: float, hi_s: float) -> dict[str, Any]:
    start = _first_received_ns(events)
    result = replay_file(events, BACKTEST_JOIN, spec=spec, window_config=BACKTEST_WINDOW)
    lo, hi = start + int(lo_s * 1e9), start + int(hi_s * 1e9)
    rs = [r for r in result.records.values() if r.priority == 0 and lo <= r.ts_unix_ns < hi]
    return {n: v["compliance"] for n, v in _slo_doc(spec, rs).items()} | {"requests": len(rs)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.dev.demo_vs_backtest", description=__doc__)
    ap.add_argument("events", type=Path, help="the demo's --tee file")
    ap.add_argument("--report", type=Path, help="the demo's --json file (its loop delay)")
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--overload", default=DEFAULT_OVERLOAD)
    ap.add_argument("--limit", type=int, help="only the first N trace requests (the demo's)")
    ap.add_argument("--loop-delay", type=int, action="append", metavar="MS")
    args = ap.parse_args(argv)
    ep = parse_overload(args.overload)
    if ep is None:
        raise SystemExit("needs an --overload episode")
    spec = load_spec_file(DEFAULT_SLO_SPEC)
    policy = load_policy_file(DEFAULT_POLICY_PATH)
    demo = demo_priority_0(args.events, spec, ep.start_offset_s, ep.end_offset_s)
    line = (
        f"demo       priority 0 during the episode: ttft-stream {demo['ttft-stream']:.2%}, "
        f"gold-ttft {demo['gold-ttft']:.2%} ({demo['requests']} attempts)"
    )
    if args.report is not None:
        ld = orjson.loads(args.report.read_bytes()).get("loop_delay") or {}
        if ld.get("decisions"):
            line += (
                f"; loop delay P50 {ld['p50_ms'] / 1000:.1f} s, P99 {ld['p99_ms'] / 1000:.1f} s"
                f" ({ld['decisions']} decisions, event time)"
            )
    print(line)
    config = dataclasses.replace(
        SimConfig(start_unix_ns=BACKTEST_START_UNIX_NS, seed=args.seed, overload=ep)
    )
    trace = read_trace(args.trace)
    if args.limit is not None:
        trace = trace[: args.limit]
    for delay in args.loop_delay or [DEFAULT_LOOP_DELAY_MS]:
        run = run_loop(trace, config, spec, policy, loop="tailguard", loop_delay_ms=delay)
        p0 = run["by_priority"]["0"]
        ep_slos, ld = p0["episode_slos"], run["loop_delay"]
        print(
            f"backtest   priority 0 during the episode: ttft-stream {ep_slos['ttft-stream']:.2%}, "
            f"gold-ttft {ep_slos['gold-ttft']:.2%}; --loop-delay {delay} (as applied P50 "
            f"{ld['p50_ms'] / 1000:.1f} s, P99 {ld['p99_ms'] / 1000:.1f} s)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
