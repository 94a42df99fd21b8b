"""``replay``: the core over a JSON Lines file of messages."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson

from pipeline.app.commands.common import (
    Command,
    add_spec_and_policy,
    add_store,
    load_control,
    load_spec,
    need_file,
)
from pipeline.app.commands.settings import worker_settings


def cmd_replay(args: argparse.Namespace) -> int:
    from pipeline.app.replay import run_replay

    need_file(args.events)
    settings = worker_settings(args)
    spec = load_spec(args.slo or settings.slo_spec)
    policy, rules = load_control(args.policy or settings.policy_file, settings.burn_rules_file)
    dlq_path: Path = args.dlq or args.events.with_suffix(".dlq.jsonl")
    summary = run_replay(
        args.events, settings, spec=spec, policy=policy, burn_rules=rules, dlq_path=dlq_path,
        store=not args.no_store,
    )  # fmt: skip
    if args.json:
        sys.stdout.write(orjson.dumps(summary).decode() + "\n")
    else:
        from pipeline.app.replay_text import render_summary
        from pipeline.app.report import print_wide

        print_wide(render_summary(summary))
    return 0


def _arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("events", type=Path)
    add_store(s)
    s.add_argument("--no-store", action="store_true", help="do not write to the store")
    add_spec_and_policy(s)
    s.add_argument("--dlq", type=Path, help="dead letters out (default EVENTS.dlq.jsonl)")
    s.add_argument("--json", action="store_true", help="the whole summary as one-line JSON")


REPLAY = Command(
    "replay", "run the core over a JSON Lines file of messages", _arguments, cmd_replay
)
