"""The local Kafka broker from the command line, and the checkout's paths for it.

The broker itself ships with the package: :mod:`pipeline.adapters.local_kafka`
(``tailguard demo`` starts one). Its names are re-exported here for the tests, the
benchmarks and the other tools (``from tools.dev.kafka_local import LocalKafka``).

Command line (``start`` leaves the broker running after it exits; ``stop`` finds it by
``<dir>/kafka.pid``)::

    python -m tools.dev.kafka_local fetch
    python -m tools.dev.kafka_local start [--dir DIR] [--port N]   # prints bootstrap
    python -m tools.dev.kafka_local status [--dir DIR]
    python -m tools.dev.kafka_local stop [--dir DIR]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from pipeline.adapters.local_kafka import (
    DEFAULT_READY_TIMEOUT_S,
    DEFAULT_STOP_TIMEOUT_S,
    HOST,
    KAFKA_VERSION,
    KafkaLocalError,
    LocalKafka,
    default_cache_dir,
    ensure_kafka_jars,
    free_port,
    start_kafka,
    stop_kafka,
)

__all__ = [
    "KAFKA_VERSION",
    "KafkaLocalError",
    "LocalKafka",
    "default_cache_dir",
    "default_run_dir",
    "ensure_kafka_jars",
    "env_or_repo_path",
    "free_port",
    "main",
    "repo_root",
    "start_kafka",
    "stop_kafka",
]

ENV_RUN_DIR = "TAILGUARD_KAFKA_DIR"

log = logging.getLogger(__name__)


def repo_root() -> Path:
    """The repository checkout this module lives in."""
    return Path(__file__).resolve().parents[2]


def env_or_repo_path(env: str, *default: str) -> Path:
    """The directory ``$env`` names, else ``<repo>/<default>``."""
    value = os.environ.get(env)
    return Path(value) if value else repo_root().joinpath(*default)


def default_run_dir() -> Path:
    """``$TAILGUARD_KAFKA_DIR`` or ``<repo>/var/kafka`` (git-ignored)."""
    return env_or_repo_path(ENV_RUN_DIR, "var", "kafka")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.dev.kafka_local",
        description=f"Local single-node Apache Kafka {KAFKA_VERSION} (KRaft) on {HOST}.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_fetch = sub.add_parser("fetch", help="fetch Kafka's jars with Maven (once)")
    p_fetch.add_argument("--cache-dir", type=Path, default=None, help="default: .cache/kafka")
    for name, text in (
        ("start", "start a detached broker and print its bootstrap address"),
        ("stop", "stop the broker recorded in DIR/kafka.pid"),
        ("status", "print the bootstrap address if running (exit 0), else exit 1"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("--dir", type=Path, default=None, help="run dir; default: var/kafka")
        if name == "start":
            p.add_argument("--port", type=int, default=0, help="0 = a free port (default)")
            p.add_argument("--cache-dir", type=Path, default=None)
            p.add_argument("--timeout", type=float, default=DEFAULT_READY_TIMEOUT_S)
        if name == "stop":
            p.add_argument("--timeout", type=float, default=DEFAULT_STOP_TIMEOUT_S)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        return _run(args, parser.prog)
    except KafkaLocalError as exc:
        log.error("error: %s", exc)  # noqa: TRY400 - the message is the diagnosis
        return 2


def _run(args: argparse.Namespace, prog: str) -> int:
    if args.command == "fetch":
        t0 = time.monotonic()
        libs = ensure_kafka_jars(args.cache_dir)
        print(libs)
        log.info("jars ready in %.1fs", time.monotonic() - t0)
        return 0
    run_dir = args.dir if args.dir is not None else default_run_dir()
    if args.command == "start":
        kafka = LocalKafka(
            run_dir, port=args.port, cache_dir=args.cache_dir, ready_timeout=args.timeout
        )
        if kafka.is_running():
            log.info("already running (pid %s) from %s", kafka.pid, kafka.run_dir)
        else:
            kafka.start()
            log.info("logs: %s; stop with: %s stop --dir %s", kafka.server_log, prog, kafka.run_dir)
        print(kafka.bootstrap_servers)
        return 0
    if args.command == "stop":
        state = "stopped the broker" if stop_kafka(run_dir, args.timeout) else "no broker running"
        log.info("%s in %s", state, Path(run_dir).resolve())
        return 0
    kafka = LocalKafka(run_dir)  # status
    if not kafka.is_running():
        log.info("not running (%s)", kafka.run_dir)
        return 1
    log.info("running: pid %s, data %s", kafka.pid, kafka.data_dir)
    print(kafka.bootstrap_servers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
