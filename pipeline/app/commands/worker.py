"""``worker``: run a pipeline worker."""

from __future__ import annotations

import argparse

from pipeline.app.commands.common import Command, add_kafka, add_store
from pipeline.app.commands.settings import worker_settings


def cmd_worker(args: argparse.Namespace) -> int:
    from pipeline.adapters.faust_wiring import run_worker

    settings = worker_settings(args)
    run_worker(settings, loglevel=args.loglevel)
    return 0


def _arguments(s: argparse.ArgumentParser) -> None:
    add_kafka(s)
    add_store(s)
    s.add_argument("--group", help="consumer group id")
    s.add_argument("--loglevel", default="info")


WORKER = Command("worker", "run a pipeline worker (Faust)", _arguments, cmd_worker)
