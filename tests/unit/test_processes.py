"""The one stop_process and pid_alive (demo, query port discovery, tools/dev, bench)."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from pipeline.processes import pid_alive, stop_process

_CHILD = """
import signal, sys, time
if sys.argv[1] == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
elif sys.argv[1] == "exit3":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize(
    ("behaviour", "timeout_s", "status"),
    [
        # (a generous timeout: stop_process returns as soon as the child exits; 10 s
        # once ran out on a loaded CI machine and the handler's status came back -9)
        ("default", 60.0, -signal.SIGTERM),  # SIGTERM ends it
        ("exit3", 60.0, 3),  # its handler exits cleanly: its own status
        ("ignore", 0.3, -signal.SIGKILL),  # SIGTERM ignored: killed after the timeout
    ],
)
def test_stop_process_terms_then_kills_and_reaps(
    behaviour: str, timeout_s: float, status: int
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, behaviour], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"  # its handler is installed
        assert pid_alive(proc.pid)
        assert stop_process(proc, timeout_s) == status
        assert not pid_alive(proc.pid)  # reaped: gone
        assert stop_process(proc, timeout_s) == status  # again: a no-op
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_pid_alive_for_this_process_and_a_pid_that_cannot_exist() -> None:
    import os

    assert pid_alive(os.getpid())
    with open("/proc/sys/kernel/pid_max") as f:
        assert not pid_alive(int(f.read()) + 1)
