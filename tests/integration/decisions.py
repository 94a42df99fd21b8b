"""The decision-speed tests' shared run: ``tailguard demo`` on the shared trace, its directives.

Used by test_decision_speed.py (60x, as fast as possible, replay) and
test_decision_speed_1x.py (1x, its own short case): two modules, so that xdist runs them
side by side.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from pipeline.app.demo import run_demo
from pipeline.cli import DEFAULT_TRACE
from producers.simulator.model import OverloadEpisode, SimConfig

START_NS = 1_800_000_000_000_000_000
CONFIG = SimConfig(start_unix_ns=START_NS, seed=3, overload=OverloadEpisode(120, 300, 2.5))
LIMIT = 4000  # ~12 min of traffic


def event_ms(event_time: str) -> int:
    t = datetime.fromisoformat(event_time)
    t = t if t.tzinfo is not None else t.replace(tzinfo=UTC)
    return round(t.timestamp() * 1000)


def demo_directives(
    kafka, tmp: Path, name: str, speedup: float | None, tee: Path | None = None, **short: Any
) -> list:
    report = tmp / f"{name}.json"
    rc = run_demo(
        trace=DEFAULT_TRACE,
        sim_config=short.pop("sim_config", CONFIG),
        speedup=speedup,
        partitions=2,
        workdir=tmp / name,
        bootstrap=kafka.bootstrap_servers,
        limit=short.pop("limit", LIMIT),
        tee_jsonl=tee,
        json_out=report,
        closed_loop=False,
        settings_overrides=short or None,
    )
    assert rc == 0
    control = orjson.loads(report.read_bytes())["control"]
    return [(c["scope"], c["level"], c["phase"], event_ms(c["event_time"])) for c in control]
