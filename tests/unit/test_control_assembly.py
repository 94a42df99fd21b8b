"""One assembly of the control loop (pipeline.core.control.build_control_loop): the
worker's controller and ``replay`` build the same controller from the same settings.
``replay`` used to leave out ``gateway_instances`` (admission split among one gateway
whatever TAILGUARD_GATEWAY_INSTANCES said)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipeline.adapters.controller import ControllerSettings, ControllerShell
from pipeline.app import replay as replay_mod
from pipeline.settings import Settings
from pipeline.spec.policy import load_policy_file
from tests.control_fixtures import write_control_keys

# (gateway_instances, queue_capacity, window_size_ms, window_grace_ms)
CASES = [
    (1, 64, 10_000, 30_000),
    (3, 64, 10_000, 30_000),
    (7, 16, 5_000, 0),
]


@pytest.mark.parametrize("case", CASES)
def test_replay_builds_the_workers_controller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: tuple[int, int, int, int]
) -> None:
    gateways, capacity, size_ms, grace_ms = case
    settings = Settings(
        store_dir=tmp_path / "store",
        control_enabled=True,
        control_keys_file=write_control_keys(tmp_path / "keys.json"),
        gateway_instances=gateways,
        queue_capacity=capacity,
        window_size_ms=size_ms,
        window_grace_ms=grace_ms,
    )
    worker = ControllerShell(ControllerSettings.of(settings))
    results: list[Any] = []
    real = replay_mod.replay_file

    def keep(*args: Any, **kw: Any) -> Any:
        results.append(real(*args, **kw))
        return results[-1]

    monkeypatch.setattr(replay_mod, "replay_file", keep)
    events = tmp_path / "events.jsonl"
    events.write_bytes(b"")
    assert settings.policy_file is not None
    replay_mod.run_replay(
        events,
        settings,
        spec=worker.spec,
        policy=load_policy_file(settings.policy_file),
        burn_rules=worker.rules,
        dlq_path=tmp_path / "dlq.jsonl",
        store=False,
    )
    replayed = results[0].control.loop
    assert replayed.controller.config == worker.controller.config
    assert replayed.controller.config.gateway_instances == gateways
    assert replayed.clock.size_ms == worker.loop.clock.size_ms == size_ms
    assert replayed.clock.final_lag_ms == worker.loop.clock.final_lag_ms
