"""What the commands share: the table's row (:class:`Command`), the flags several
commands take, and the input checks that fail in one line before anything is created.

Imports here stay light (no core, no Faust, no ClickHouse): ``tailguard --help`` and the
emitters' commands run on the base install.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.shipped import DEFAULT_TRACE

if TYPE_CHECKING:
    from pipeline.kafka_settings import EmitterSettings

# The demo's and the backtest's overload episode (`--overload none` for none): arrivals
# x2 from minute 20 to 30 of the trace's hour.
DEFAULT_OVERLOAD = "1200:1800:2"


@dataclass(frozen=True, slots=True)
class Command:
    """One ``tailguard <name>``: its one-line help, its flags, and what runs it (the exit
    status)."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    # its options whose value may begin with "-" (``report --since -1h``): see CommandParser
    dash_values: tuple[str, ...] = ()


class CommandParser(argparse.ArgumentParser):
    """A command's parser. argparse takes an argument that begins with "-" for an option,
    so ``--since -1h`` would leave ``--since`` without its value: each option of
    ``dash_values`` (or a prefix argparse accepts for it) followed by an argument that
    begins with one "-" is read as ``--since=-1h``, which argparse takes as it is."""

    def __init__(self, *args: Any, dash_values: tuple[str, ...] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.dash_values = dash_values

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if args is not None and self.dash_values:
            args = _joined(list(args), self.dash_values)
        return super().parse_known_args(args, namespace)


def _joined(args: list[str], options: tuple[str, ...]) -> list[str]:
    """``[opt, "-v"]`` as ``[opt + "=-v"]`` for each of ``options`` (``--`` ends it)."""
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return out + args[i:]
        takes = len(arg) > 2 and any(o.startswith(arg) for o in options)
        nxt = args[i + 1] if i + 1 < len(args) else ""
        if takes and nxt.startswith("-") and not nxt.startswith("--"):
            out.append(f"{arg}={nxt}")
            i += 2
        else:
            out.append(arg)
            i += 1
    return out


def no_arguments(p: argparse.ArgumentParser) -> None:
    """A command without flags of its own."""


def need_file(path: Path | None) -> None:
    """A missing input fails before anything is created (one line, via main)."""
    import errno
    import os

    if path is not None and str(path) != "-" and not path.is_file():
        code = errno.EISDIR if path.is_dir() else errno.ENOENT
        raise FileNotFoundError(code, os.strerror(code), str(path))


def add_kafka(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootstrap", help="Kafka bootstrap servers (env TAILGUARD_BOOTSTRAP_SERVERS)")
    p.add_argument("--partitions", type=int, help="partitions for created topics")


def add_store(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--store", type=Path, help="embedded ClickHouse directory (env TAILGUARD_STORE_DIR)"
    )


def add_spec_and_policy(p: argparse.ArgumentParser) -> None:
    default = "(default: TAILGUARD_{} or the shipped one)"
    p.add_argument("--slo", type=Path, help=f"SLO spec {default.format('SLO_SPEC')}")
    p.add_argument("--policy", type=Path, help=f"control policy {default.format('POLICY_FILE')}")


def add_sim(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="Azure-format trace CSV")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--rate-scale", type=float, default=1.0, help="multiply the arrival rate")
    p.add_argument(
        "--overload",
        metavar="[SHAPE:]START_S:END_S:FACTOR",
        help="overload episode, e.g. 600:1200:3 (a step), ramp:600:1200:3 (x1 rising to x3), "
        "burst:600:1200:3 (replicas at the same instant), or none",
    )
    p.add_argument(
        "--scheduling",
        choices=("fcfs", "priority"),
        default="fcfs",
        help="engine admission order: fcfs, or priority as vLLM's --scheduling-policy "
        "priority (lower priority number first, no preemption)",
    )
    p.add_argument("--limit", type=int, help="only the first N trace requests")
    p.add_argument(
        "--restart",
        action="append",
        metavar="ENGINE_HOST:OFFSET_S",
        help="restart an engine at this trace offset (a cold start; repeatable)",
    )


def load_spec(path: Path | None) -> Any:
    from pipeline.spec.loader import SpecError
    from pipeline.spec.slo import load_spec_file

    if path is None:
        return None
    need_file(path)
    try:
        return load_spec_file(path)
    except SpecError as exc:
        raise SystemExit(f"tailguard: invalid SLO spec:\n{exc}") from None


def load_control(policy_path: Path | None, rules_path: Path) -> tuple[Any, Any]:
    from pipeline.spec.burn_rules import load_burn_rules_file
    from pipeline.spec.loader import SpecError
    from pipeline.spec.policy import load_policy_file

    if policy_path is None:
        return None, None
    need_file(policy_path)
    need_file(rules_path)
    try:
        return load_policy_file(policy_path), load_burn_rules_file(rules_path)
    except SpecError as exc:
        raise SystemExit(f"tailguard: invalid control configuration:\n{exc}") from None


def meter_provider(settings: EmitterSettings, service: str) -> Any:
    from pipeline.adapters.telemetry import meter_provider as build

    provider, _reader = build(
        service, settings.metrics_exporter, settings.metrics_interval_ms, settings.metrics_file
    )
    return provider
