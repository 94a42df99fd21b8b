"""``simulate``: a trace through the serving simulator, to Kafka or a JSON Lines file."""

from __future__ import annotations

import argparse
from pathlib import Path

import orjson

from pipeline.app.commands.common import Command, add_kafka, add_sim, need_file
from pipeline.app.commands.settings import worker_settings


def cmd_simulate(args: argparse.Namespace) -> int:
    from pipeline.app.demo import sim_config_from_args, simulate_to

    need_file(args.trace)
    config = sim_config_from_args(args)
    if args.out is not None:
        summary = simulate_to(
            args.trace, config, jsonl=args.out, speedup=args.speedup, limit=args.limit
        )
    else:
        summary = simulate_to(
            args.trace,
            config,
            settings=worker_settings(args),
            speedup=args.speedup,
            limit=args.limit,
        )
    print(orjson.dumps(summary).decode())
    return 0


def _arguments(s: argparse.ArgumentParser) -> None:
    add_kafka(s)
    add_sim(s)
    s.add_argument("--speedup", type=float, default=None, help="event time / wall time; omit = max")
    s.add_argument("--out", type=Path, help="write JSON Lines here instead of Kafka")


SIMULATE = Command(
    "simulate", "replay a trace through the serving simulator", _arguments, cmd_simulate
)
