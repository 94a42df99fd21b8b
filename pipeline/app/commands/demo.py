"""``demo``: local Kafka + simulator + worker + report, end to end."""

from __future__ import annotations

import argparse
import signal
from pathlib import Path
from types import FrameType

from pipeline.app.commands.common import DEFAULT_OVERLOAD, Command, add_sim, need_file

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _stop(signum: int, _frame: FrameType | None) -> None:
    """The first stop signal unwinds the demo; later ones are ignored, so they cannot cut
    the stopping of what it started short (nor end the process once its handlers are
    gone: a CI run under load saw the demo die of a SIGINT while it stopped its broker)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    raise KeyboardInterrupt(signal.Signals(signum).name)


def cmd_demo(args: argparse.Namespace) -> int:
    """SIGTERM stops it as Ctrl-C does: what it started (broker, worker) is stopped by
    PID as its stack unwinds; exit 143 (130 for Ctrl-C). A second signal changes nothing."""
    from pipeline.app.demo import run_demo, sim_config_from_args

    need_file(args.trace)
    for sig in STOP_SIGNALS:
        signal.signal(sig, _stop)
    try:
        return run_demo(
            trace=args.trace,
            sim_config=sim_config_from_args(args),
            speedup=args.speedup,
            partitions=args.partitions or 8,
            workdir=args.workdir,
            bootstrap=args.bootstrap,
            limit=args.limit,
            tee_jsonl=args.tee,
            json_out=args.json,
            closed_loop=not args.open_loop,
        )
    except KeyboardInterrupt as stopped:
        return 143 if str(stopped) == "SIGTERM" else 130


def _arguments(s: argparse.ArgumentParser) -> None:
    add_sim(s)
    s.add_argument(
        "--speedup",
        type=float,
        default=20.0,
        help="event time / wall time (0 = max); closed loop: the worker must keep up",
    )
    s.add_argument("--partitions", type=int)
    s.add_argument("--bootstrap", help="use this Kafka instead of starting a local one")
    s.add_argument("--workdir", type=Path, default=Path("var/demo"))
    s.add_argument("--tee", type=Path, help="also write the simulated events to this JSONL file")
    s.add_argument("--json", type=Path, help="also write the report as JSON to this file")
    s.add_argument(
        "--open-loop", action="store_true", help="gateways ignore the directives (default: apply)"
    )
    s.set_defaults(overload=DEFAULT_OVERLOAD)


DEMO = Command(
    "demo", "local Kafka + simulator + worker + report, end to end", _arguments, cmd_demo
)
