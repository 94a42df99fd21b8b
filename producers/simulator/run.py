"""The simulator's shell: read a trace, simulate, pace the events into a sink.

Pacing: with ``speedup=s`` an event stamped ``d`` seconds after the first
event is handed to the sink ``d / s`` seconds (``time.monotonic``) after the
run started; waits are slept in chunks of at most 50 ms, calling the sink's
``tick()`` (if it has one) between chunks so that batches age out. With
``speedup=None`` events go out as fast as the sink takes them (their
timestamps are the same either way).

``python -m producers.simulator.run --out events.jsonl`` writes the replay
format (JSON Lines, one message per line) for the shared trace.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from producers.emit import EventSink, JsonlSink
from producers.simulator.gate import GatewayGate
from producers.simulator.model import OverloadEpisode, SimConfig, Simulator
from producers.simulator.trace import read_trace

__all__ = ["RunSummary", "main", "run_simulation"]

DEFAULT_TRACE: Final = Path("data/azure-llm-2023/conv.csv")
_SLEEP_CHUNK_S: Final = 0.05
_PROGRESS_EVERY_S: Final = 0.2


@dataclass(frozen=True, slots=True)
class RunSummary:
    requests: int
    ok: int
    client_aborts: int
    rejected: int
    events_sent: int
    events_by_kind: dict[str, int]
    simulated_s: float  # event time covered (first to last event)
    wall_s: float
    undelivered: int  # what the sink's final flush reported as still undelivered


def _wait_until(deadline: float, tick: Callable[[], None] | None) -> None:
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        time.sleep(min(remaining, _SLEEP_CHUNK_S))
        if tick is not None:
            tick()


def run_simulation(
    trace_path: str | Path,
    config: SimConfig,
    sink: EventSink,
    *,
    speedup: float | None = None,
    progress: bool = False,
    limit: int | None = None,
    gate: GatewayGate | None = None,
    pace: Callable[[int], None] | None = None,
) -> RunSummary:
    """Simulate ``trace_path`` under ``config`` and send every event to ``sink``.

    The sink is flushed at the end but not closed (the caller owns it).
    ``limit`` keeps only the first N requests of the trace.
    """
    if speedup is not None and not (math.isfinite(speedup) and speedup > 0):
        raise ValueError("speedup must be > 0 (or None for as fast as possible)")
    trace = read_trace(trace_path)
    if limit is not None:
        trace = trace[:limit]
    sim = Simulator(trace, config, gate)  # gate: the gateways apply control directives
    tick_attr = getattr(sink, "tick", None)
    tick: Callable[[], None] | None = tick_attr if callable(tick_attr) else None
    horizon_s = (trace[-1].arrival_offset_ms / config.rate_scale / 1000.0) if trace else 0.0
    console = Console(stderr=True)
    bar = Progress(
        TextColumn("[bold]simulating[/]"),
        BarColumn(),
        TextColumn("{task.completed:,.0f}/{task.total:,.0f} sim s"),
        TextColumn("{task.fields[events]:,} events"),
        TimeElapsedColumn(),
        console=console,
        disable=not progress,
    )
    wall_start = time.monotonic()
    first_ns: int | None = None
    last_ns = 0
    sent = 0
    next_update = wall_start
    with bar:
        task = bar.add_task("sim", total=max(horizon_s, 1e-9), events=0)
        for event in sim.events():
            ts = event.ts_unix_ns
            if first_ns is None:
                first_ns = ts
            if speedup is not None:
                _wait_until(wall_start + (ts - first_ns) / 1e9 / speedup, tick)
            sink.emit(event)
            sent += 1
            if pace is not None:  # closed loop: let the pipeline keep up, in simulated time
                paused_at = time.monotonic()
                pace(ts)
                # Resume at the same speed: no burst through the time spent waiting (a
                # burst would outrun the pacer's next look, in simulated time).
                wall_start += time.monotonic() - paused_at
            last_ns = ts
            if progress and time.monotonic() >= next_update:
                next_update = time.monotonic() + _PROGRESS_EVERY_S
                sim_s = (ts - config.start_unix_ns) / 1e9
                bar.update(task, completed=min(max(sim_s, 0.0), horizon_s), events=sent)
        bar.update(task, completed=horizon_s, events=sent)
    undelivered = sink.flush()
    s = sim.summary
    return RunSummary(
        requests=s.requests,
        ok=s.ok,
        client_aborts=s.client_aborts,
        rejected=s.rejected,
        events_sent=sent,
        events_by_kind=s.events_by_kind,
        simulated_s=(last_ns - first_ns) / 1e9 if first_ns is not None else 0.0,
        wall_s=time.monotonic() - wall_start,
        undelivered=undelivered,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Write the simulated events of a trace to a JSON Lines file."""
    ap = argparse.ArgumentParser(prog="python -m producers.simulator.run", description=__doc__)
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--out", type=Path, required=True, help="JSON Lines output file")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rate-scale", type=float, default=1.0)
    ap.add_argument("--speedup", type=float, default=None, help="default: as fast as possible")
    ap.add_argument("--max-queue-ms", type=float, default=None)
    ap.add_argument(
        "--overload",
        type=float,
        nargs=3,
        metavar=("START_S", "END_S", "FACTOR"),
        default=None,
    )
    ap.add_argument(
        "--start-unix-ns", type=int, default=None, help="wall time of trace offset 0 (default: now)"
    )
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    config = SimConfig(
        start_unix_ns=args.start_unix_ns if args.start_unix_ns is not None else time.time_ns(),
        seed=args.seed,
        rate_scale=args.rate_scale,
        max_queue_ms=args.max_queue_ms,
        overload=OverloadEpisode(*args.overload) if args.overload else None,
    )
    sink = JsonlSink(args.out)
    try:
        summary = run_simulation(
            args.trace, config, sink, speedup=args.speedup, progress=not args.no_progress
        )
    finally:
        sink.close()
    Console(stderr=True).print(summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
