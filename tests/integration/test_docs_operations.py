"""docs/operations.md works as written: its steps 1-7, run as one shell script.

The page's ```bash blocks up to "Your own Kafka and ClickHouse" are run in order in one
shell, from the repository root: a local broker from ``tools/dev/kafka_local.py``, the
topics, a worker in the background (its PID kept), ``simulate``, the report, and everything
stopped by its PID. Only what cannot be shared is changed: the run directory and the
broker's port (a temporary directory and a free port), and ``./tg`` / ``.venv/bin/python``
become this interpreter (``./tg`` would check the virtualenv's install first; the suite
runs inside it).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import REPO

pytestmark = [pytest.mark.integration, pytest.mark.long(50)]

PAGE = REPO / "docs" / "operations.md"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def page_script(ops: Path, port: int) -> str:
    text = PAGE.read_text()
    text = text[: text.index("## Your own Kafka and ClickHouse")]
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    assert len(blocks) >= 7, "one bash block per step"
    script = "\n".join(blocks)
    setup = "export OPS=var/ops PORT=19092"
    assert setup in script, "step 1 names the run directory and the port"
    script = script.replace(setup, f"export OPS={shlex.quote(str(ops))} PORT={port}")
    python = shlex.quote(sys.executable)
    script = re.sub(r"^\./tg help\b.*$", ":", script, flags=re.M)
    script = script.replace(".venv/bin/python", python)
    script = script.replace("./tg ", f"{python} -m pipeline.cli ")
    return "set -euo pipefail\n" + script


def test_the_walkthrough_runs_as_written(tmp_path: Path) -> None:
    ops = tmp_path / "ops"
    script = page_script(ops, _free_port())
    env = {k: v for k, v in os.environ.items() if not k.startswith("TAILGUARD_")}
    proc = subprocess.Popen(
        ["bash", "-c", script],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        # whatever the script left running (a failed step), stopped by its PID
        pid_file = ops / "worker.pid"
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
        subprocess.run(
            [sys.executable, "-m", "tools.dev.kafka_local", "stop", "--dir", str(ops / "kafka")],
            cwd=REPO,
            capture_output=True,
            check=False,
        )
    assert proc.returncode == 0, out[-4000:]
    assert "3000 requests stored" in out, out[-4000:]
    assert "tailguard SLO report — 3000 requests" in out
    assert "stopped the broker" in out
    worker_pid = int((ops / "worker.pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(worker_pid, 0)
