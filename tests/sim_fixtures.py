"""What the simulator's unit tests share: their start time, a stats interval that leaves
one stats round only, and a configuration in which nothing random decides a request's
fate or times."""

from __future__ import annotations

from typing import Any

from producers.simulator.model import SimConfig

START_NS = 1_700_000_000_000_000_000
NO_STATS_MS = 1e12  # one stats round only: keeps low-rate runs cheap


def exact_config(**changes: Any) -> SimConfig:
    """A run whose timings follow the engine's formula exactly: clients wait for their
    answer however long it takes and never stop a stream early, engine clocks agree
    (``changes`` on top, e.g. a patience to test)."""
    fields: dict[str, Any] = {
        "start_unix_ns": START_NS,
        "patience_median_ms": None,
        "stream_stop_fraction": 0.0,
        "engine_skew_max_ms": 0.0,
    }
    return SimConfig(**(fields | changes))
