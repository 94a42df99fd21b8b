"""``tailguard`` command line: the top parser, built from the table of commands
(:data:`pipeline.app.commands.COMMANDS`: each command's module registers its flags and
handler and builds the settings, once), and the dispatch with its exit statuses."""

from __future__ import annotations

import argparse
import logging
import sys

from pipeline.app.commands import COMMANDS
from pipeline.app.commands.backtest import BACKTEST_START_UNIX_NS
from pipeline.app.commands.common import DEFAULT_OVERLOAD, CommandParser
from pipeline.app.commands.statement import DEFAULT_CONTRACT
from pipeline.shipped import DEFAULT_TRACE

__all__ = [
    "BACKTEST_START_UNIX_NS",
    "DEFAULT_CONTRACT",
    "DEFAULT_OVERLOAD",
    "DEFAULT_TRACE",
    "build_parser",
    "main",
]

# What `tailguard --help` says first.
DESCRIPTION = "``tailguard`` command line. The settings object is built here, once."


def build_parser() -> argparse.ArgumentParser:
    """``tailguard [-v] <command> ...``: one subcommand per row of the table."""
    p = argparse.ArgumentParser(prog="tailguard", description=DESCRIPTION)
    p.add_argument("-v", "--verbose", action="store_true")
    sub = p.add_subparsers(dest="command", required=True, parser_class=CommandParser)
    for command in COMMANDS:
        s = sub.add_parser(
            command.name,
            help=command.help,
            description=command.help,
            dash_values=command.dash_values,
        )
        command.add_arguments(s)
        s.set_defaults(func=command.run)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return _run_command(args)


def _run_command(args: argparse.Namespace) -> int:
    """Run the command; a missing input (file, store) is one line on stderr and exit 1,
    a closed stdout (``| head``) ends the command quietly (exit 141, as SIGPIPE would).
    ``-v`` shows the traceback instead."""
    import os

    from pipeline.adapters.store import StoreError

    name = f"tailguard {args.command}"
    try:
        result: int = args.func(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # the reader went away: nothing more to say, and nothing to flush at exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except (StoreError, OSError) as exc:
        if args.verbose or (isinstance(exc, OSError) and exc.filename is None):
            raise
        if isinstance(exc, OSError):
            print(f"{name}: {exc.strerror}: {exc.filename}", file=sys.stderr)
        else:
            print(f"{name}: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    return result


if __name__ == "__main__":
    sys.exit(main())
