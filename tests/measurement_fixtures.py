"""Simulated events from the shared trace, written as the worker would read them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import orjson
import pytest

from pipeline.cli import DEFAULT_TRACE, main
from pipeline.contract.codec import encode_event, event_to_dict
from pipeline.contract.events import Event
from producers.simulator.model import SimConfig, Simulator
from producers.simulator.trace import read_trace

T = TypeVar("T")

START_NS = 1_763_316_946_680_590_000  # the trace's own first timestamp


def simulate_jsonl(path: Path, *, seed: int = 3, limit: int | None = None) -> dict[str, float]:
    """One event per line, in emission order; returns the simulator's engine skews (ms)."""
    trace = read_trace(DEFAULT_TRACE)
    sim = Simulator(trace[:limit] if limit else trace, SimConfig(start_unix_ns=START_NS, seed=seed))
    with path.open("wb") as fh:
        for ev in sim.events():
            fh.write(orjson.dumps(event_to_dict(ev)) + b"\n")
    return dict(sim.engine_skew_ms)


def replay_into(
    store_dir: Path, events: Path, capsys: pytest.CaptureFixture[str]
) -> dict[str, Any]:
    """``tailguard replay EVENTS --store STORE_DIR --json`` in process; its summary."""
    assert main(["replay", str(events), "--store", str(store_dir), "--json"]) == 0
    out: dict[str, Any] = orjson.loads(capsys.readouterr().out)
    return out


def gathered(made: Iterable[tuple[T, Sequence[Event]]]) -> tuple[list[T], list[Event]]:
    """What each of ``made`` (what a made-up request should give, its events) expects,
    in order, and all their events, in order."""
    wants: list[T] = []
    events: list[Event] = []
    for want, evs in made:
        wants.append(want)
        events += evs
    return wants, events


def replay_events(tmp: Path, events: Sequence[Event]) -> Path:
    """``events`` written to ``TMP/events.jsonl`` (one a line, in this order) and replayed
    into ``TMP/store`` in process (``tailguard replay --json``): the store's folder."""
    path = tmp / "events.jsonl"
    path.write_bytes(b"".join(encode_event(e) + b"\n" for e in events))
    store_dir = tmp / "store"
    assert main(["replay", str(path), "--store", str(store_dir), "--json"]) == 0
    return store_dir


def simulate_and_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], *, seed: int, limit: int
) -> tuple[Path, Path, dict[str, Any]]:
    """Simulated events (``events.jsonl``) replayed into ``store``: both paths, the summary."""
    events = tmp_path / "events.jsonl"
    simulate_jsonl(events, seed=seed, limit=limit)
    store_dir = tmp_path / "store"
    return events, store_dir, replay_into(store_dir, events, capsys)


def hourly_spec(source: Path) -> str:
    """The SLO spec ``source`` with one-hour budget windows (for its 30-day and its monthly
    SLOs alike): minutes of replayed traffic then fill budgets, and an overload overspends
    them."""
    return (
        source.read_text()
        .replace("window: {rolling: 30d}", "window: {rolling: 1h}")
        .replace("window: {calendar: month}", "window: {rolling: 1h}")
    )


def load_events(path: Path) -> list[dict]:
    out = []
    for line in path.read_bytes().splitlines():
        msg = orjson.loads(line)
        out.extend(msg if isinstance(msg, list) else [msg])
    return out
