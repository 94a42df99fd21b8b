"""``tailguard demo`` stopped by SIGTERM in the middle of its run stops what it started
(the local broker and the worker, by PID) and exits 143: nothing is left running."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ceilings import ceiling, wait_for
from tests.paths import REPO

pytestmark = pytest.mark.integration


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_sigterm_stops_the_demo_and_everything_it_started(tmp_path: Path) -> None:
    log = tmp_path / "demo.log"
    with log.open("wb") as out:
        demo = subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "demo", "--speedup", "60",
             "--partitions", "2", "--limit", "20000", "--workdir", str(tmp_path / "demo")],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    pids: dict[str, int] = {}
    try:

        def started() -> bool:  # the broker, then the worker (the simulation under way)
            text = " ".join(log.read_text(errors="replace").split())
            broker = re.search(r"ready on \S+ \(pid (\d+)\)", text)
            worker = re.search(r"worker started \(pid (\d+)", text)
            if broker and worker and "simulating" in text:
                pids.update(broker=int(broker[1]), worker=int(worker[1]))
                return True
            assert demo.poll() is None, text[-2000:]
            return False

        wait_for(started, "the demo's broker and worker started", 180, poll_s=0.2)
        assert all(_alive(p) for p in pids.values())
        demo.send_signal(signal.SIGTERM)
        assert demo.wait(ceiling(120)) == 143, log.read_text(errors="replace")[-2000:]
        wait_for(lambda: not any(_alive(p) for p in pids.values()), f"{pids} stopped", 60)
    finally:
        for pid in [demo.pid, *pids.values()]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
