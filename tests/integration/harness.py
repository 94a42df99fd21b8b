"""Run real workers against the real broker and embedded ClickHouse, per test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pipeline.adapters.kafka_admin import ensure_topics, group_progress_probe
from pipeline.settings import EXAMPLE_SLO_SPEC, Settings
from tests.ceilings import ceiling
from tests.control_fixtures import TEST_POLICY, write_control_keys
from tests.paths import REPO
from tools.dev import fault_checks


def make_settings(bootstrap: str, tmp: Path, **over: object) -> Settings:
    run = uuid.uuid4().hex[:8]
    base: dict[str, object] = {
        "bootstrap_servers": bootstrap,
        "store_dir": tmp / "store",
        "group_id": f"test-{run}",
        "lifecycle_topic": f"lc-{run}",
        "engine_stats_topic": f"stats-{run}",
        "dlq_topic": f"dlq-{run}",
        "summaries_topic": f"summaries-{run}",
        "ledger_topic": f"ledger-{run}",
        "control_topic": f"control-{run}",
        "topic_partitions": 4,
        "join_timeout_ms": 2000,
        "window_grace_ms": 2000,
        "flush_interval_ms": 200,
        # the integration tests' figures are written against the contract tiers
        "slo_spec": EXAMPLE_SLO_SPEC,
    }
    base.update(over)
    s = Settings(**base)  # type: ignore[arg-type]
    ensure_topics(s)
    return s


def control_settings(bootstrap: str, tmp: Path, **over: object) -> tuple[Settings, Path]:
    """:func:`make_settings` of a worker whose controller runs ``TEST_POLICY`` (heartbeats
    every second), signing with a fresh keys file; and that file."""
    keys = write_control_keys(tmp / "keys.json")
    policy_file = tmp / "policy.yaml"
    policy_file.write_text(TEST_POLICY)
    settings = make_settings(
        bootstrap, tmp, control_enabled=True, control_keys_file=keys, policy_file=policy_file,
        control_heartbeat_ms=1000, **over,
    )  # fmt: skip
    return settings, keys


def settings_env(s: Settings) -> dict[str, str]:
    return dict(os.environ) | s.to_env()


class WorkerProcess:
    def __init__(self, settings: Settings, log_path: Path) -> None:
        self.settings = settings
        self.log_path = log_path
        self._log = log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "worker"],
            cwd=REPO,
            env=settings_env(settings),
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_caught_up(self, timeout_s: float = 120.0) -> None:
        """Until the group's committed offsets reach the topic's end (all written); the
        ceiling is ``timeout_s`` scaled (tests/ceilings.py)."""
        deadline = time.monotonic() + ceiling(timeout_s)
        with group_progress_probe(self.settings) as progress:  # one consumer for the wait
            while True:
                assert self.alive(), f"worker died:\n{self.log_tail()}"
                prog = progress(self.settings.lifecycle_topic)
                if prog.end > 0 and prog.lag == 0:
                    return
                assert time.monotonic() < deadline, f"not caught up: {prog}\n{self.log_tail()}"
                time.sleep(0.2)

    def log_tail(self, n: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-n:]

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


@contextmanager
def caught_up_worker(
    settings: Settings, log_path: Path, timeout_s: float = 120.0
) -> Iterator[WorkerProcess]:
    """A worker for the ``with`` body; on leaving it, waited on until caught up, then
    stopped (SIGTERM) and asserted to have exited 0."""
    worker = WorkerProcess(settings, log_path)
    try:
        yield worker
        worker.wait_caught_up(timeout_s=timeout_s)
    finally:
        rc = worker.stop()
    assert rc == 0, worker.log_tail(3000)


@contextmanager
def running_caught_up(
    settings: Settings, log_path: Path, timeout_s: float = 120.0
) -> Iterator[WorkerProcess]:
    """A worker, caught up with what is on the topics, for the ``with`` body; stopped
    (SIGTERM) on leaving it, its exit status left to the test."""
    worker = WorkerProcess(settings, log_path)
    try:
        worker.wait_caught_up(timeout_s=timeout_s)
        yield worker
    finally:
        worker.stop()


def run_until_caught_up(settings: Settings, log_path: Path, timeout_s: float = 120.0) -> str:
    """Run a worker over what is on the topics (see :func:`caught_up_worker`); its log."""
    with caught_up_worker(settings, log_path, timeout_s):
        pass
    return log_path.read_text(errors="replace")


def tailguard(*args: str, timeout_s: float = 300.0) -> subprocess.CompletedProcess[str]:
    """``tailguard ARGS`` in a subprocess from the repository root, output captured."""
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args],
        check=False,
        cwd=REPO,
        # COLUMNS: rich's width when not on a terminal; the figures assume the contract tiers
        env=dict(os.environ, COLUMNS="200", TAILGUARD_SLO_SPEC=str(EXAMPLE_SLO_SPEC)),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def read_all(settings: Settings, topic: str, timeout_s: float = 30.0) -> list[Any]:
    """Every message currently on ``topic`` (up to the end offsets at call time); the
    ceiling is ``timeout_s`` scaled (:func:`tools.dev.fault_checks.read_all`)."""
    return fault_checks.read_all(settings, topic, ceiling(timeout_s))
