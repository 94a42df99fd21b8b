"""``backtest``: one trace through the simulator once per control loop, in process."""

from __future__ import annotations

import argparse
import dataclasses

import orjson

from pipeline.app.commands.common import (
    DEFAULT_OVERLOAD,
    Command,
    add_sim,
    add_spec_and_policy,
    load_control,
    load_spec,
    need_file,
)
from pipeline.app.commands.settings import worker_settings

BACKTEST_START_UNIX_NS = 1_800_000_000_000_000_000  # fixed: same seed, same output


def _window_s(text: str) -> tuple[float, float]:
    """``START_S:END_S`` (trace offsets, seconds) for ``backtest --window``."""
    try:
        lo, hi = (float(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected START_S:END_S") from None
    if not (0 <= lo < hi):
        raise argparse.ArgumentTypeError(f"{text!r}: need 0 <= START_S < END_S")
    return lo, hi


def cmd_backtest(args: argparse.Namespace) -> int:
    from pipeline.app.backtest import render_text, run_backtest
    from pipeline.app.demo import sim_config_from_args
    from producers.simulator.trace import read_trace

    need_file(args.trace)
    settings = worker_settings(args)
    spec = load_spec(args.slo or settings.slo_spec)
    policy, rules = load_control(args.policy or settings.policy_file, settings.burn_rules_file)
    if policy is None:
        raise SystemExit("tailguard backtest: no policy (pass --policy)")
    trace = read_trace(args.trace)
    if args.limit is not None:
        trace = trace[: args.limit]
    config = dataclasses.replace(sim_config_from_args(args), start_unix_ns=BACKTEST_START_UNIX_NS)
    loops = args.loops if "tailguard" in args.loops else [*args.loops, "tailguard"]
    from pipeline.app.backtest import DEFAULT_LOOP_DELAY_MS

    delay = DEFAULT_LOOP_DELAY_MS if args.loop_delay is None else args.loop_delay
    if delay < 0:
        raise SystemExit("tailguard backtest: --loop-delay must be >= 0")
    bt = run_backtest(
        trace, config, spec, policy, rules, loops=loops, window_s=args.window, loop_delay_ms=delay
    )
    if args.json:
        print(orjson.dumps(bt.to_json()).decode())
    else:
        print(render_text(bt))
    return 0


def _arguments(s: argparse.ArgumentParser) -> None:
    add_sim(s)
    s.set_defaults(overload=DEFAULT_OVERLOAD)
    add_spec_and_policy(s)
    s.add_argument(
        "--json",
        action="store_true",
        help='one object {"scheduling", "loops", "runs": {loop: run}, "open_loop", "closed_loop"}',
    )
    s.add_argument(
        "--loops",
        nargs="+",
        choices=("open", "static", "aimd", "tailguard"),
        default=["open", "static", "aimd", "tailguard"],
        help="which loops to run side by side (default: all four)",
    )
    s.add_argument(
        "--loop-delay",
        type=int,
        default=None,
        metavar="MS",
        help="directives reach the simulated gateways MS after their evidence (the end of "
        "the window the decision read), event time; default: the live loop's P99 from "
        "./tg bench (pipeline.app.backtest.DEFAULT_LOOP_DELAY_MS); 0: as soon as decided",
    )
    s.add_argument(
        "--window",
        type=_window_s,
        default=None,
        metavar="START_S:END_S",
        help="with --overload none: measure this span as the episode (one the trace "
        "already has, e.g. make_trace --shape burst's 1500:1560)",
    )


BACKTEST = Command(
    "backtest",
    "one trace through the simulator once per control loop (open, static, aimd, tailguard; "
    "--loops): would the policy help?",
    _arguments,
    cmd_backtest,
)
