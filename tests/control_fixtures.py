"""A policy tuned to the simulator (its LLM latencies are seconds, not the
source documents' 300 ms), and a simulated ×3 overload episode."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import orjson
import pytest

from pipeline.adapters.controller import ControllerSettings, ControllerShell
from pipeline.app.demo import kafka_sink
from pipeline.cli import DEFAULT_TRACE
from pipeline.contract.codec import event_to_dict
from pipeline.settings import Settings
from producers.simulator.model import OverloadEpisode, SimConfig, Simulator
from producers.simulator.trace import read_trace
from tests.measurement_fixtures import START_NS, simulate_and_replay

OVERLOAD_START_S = 600
OVERLOAD_END_S = 1200  # arrival rate x3 for 10 simulated minutes
TRACE_LIMIT = 13_000  # about 40 simulated minutes of the shared trace

TEST_POLICY = """
apiVersion: tailguard/v1
kind: ControlPolicy
levels:
  - level: 1
    enter: [{signal: p99.queue_ms, op: ">", value: 5000, for: 1m}]
    exit: [{signal: p99.queue_ms, op: "<", value: 2000, for: 1m}]
    max_duration: 2h
    notify_customer: true
    actions: {shed_priorities_at_or_above: 3, cap_context_tokens: 8192, fallback_model: null,
              reject_new_sessions: false, retry_after_s: 30, rate_limit_rps: null}
  - level: 2
    enter: [{signal: queue_saturation, op: ">", value: 50, for: 5m}]
    exit: [{signal: queue_saturation, op: "<", value: 40, for: 5m}]
    max_duration: 2h
    notify_customer: true
    actions: {shed_priorities_at_or_above: 2, cap_context_tokens: 4096, fallback_model: null,
              reject_new_sessions: true, retry_after_s: 60, rate_limit_rps: null}
  - level: 3
    enter: [{signal: gpu_memory_fraction, op: ">", value: 0.999, for: 1m}]
    exit: [{signal: gpu_memory_fraction, op: "<", value: 0.99, for: 1m}]
    max_duration: 2h
    notify_customer: false
    actions: {shed_priorities_at_or_above: 1, cap_context_tokens: 4096, fallback_model: null,
              reject_new_sessions: true, retry_after_s: 120, rate_limit_rps: null}
dynamics:
  min_dwell: 2m
  step_down: one
  half_open: {duration: 1m, admit_fraction: 0.25}
"""


def write_control_keys(path: Path, key_id: str = "k1") -> Path:
    """A keys file with one fresh random signing key, active."""
    key = base64.b64encode(os.urandom(32)).decode()
    path.write_text(orjson.dumps({"active": key_id, "keys": {key_id: key}}).decode())
    return path


def overload_simulator() -> Simulator:
    return Simulator(
        read_trace(DEFAULT_TRACE)[:TRACE_LIMIT],
        SimConfig(
            start_unix_ns=START_NS,
            seed=21,
            overload=OverloadEpisode(OVERLOAD_START_S, OVERLOAD_END_S, factor=3.0),
        ),
    )


def replayed_controller(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], *, seed: int, limit: int
) -> tuple[dict[str, Any], Settings, ControllerShell]:
    """Simulated events replayed into a store (see ``simulate_and_replay``), and a controller
    shell on that store with a fresh signing key: the replay's summary, settings, shell."""
    _, store_dir, replayed = simulate_and_replay(tmp_path, capsys, seed=seed, limit=limit)
    keys = write_control_keys(tmp_path / "keys.json", "k")
    settings = Settings(store_dir=store_dir, control_enabled=True, control_keys_file=keys)
    return replayed, settings, ControllerShell(ControllerSettings.of(settings))


def emit_overload(settings: Settings) -> None:
    """The overload episode's events onto ``settings``' lifecycle topic (the real broker)."""
    sink = kafka_sink(settings)
    for ev in overload_simulator().events():
        sink.emit(ev)
    sink.flush()


def write_overload_jsonl(path: Path) -> None:
    with path.open("wb") as fh:
        for ev in overload_simulator().events():
            fh.write(orjson.dumps(event_to_dict(ev)) + b"\n")
