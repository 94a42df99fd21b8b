"""Child processes: stopped by their own PID, and whether a PID is still running.

The one copy of each (the demo, the query port's discovery, tools/dev's local Kafka and
the benchmarks use them).
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any


def stop_process(proc: subprocess.Popen[Any], timeout_s: float = 60.0) -> int:
    """SIGTERM by PID, then SIGKILL after ``timeout_s``; returns the exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (one of another user's counts: it exists)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # An exited but unreaped process (a zombie: its parent, e.g. a container's PID 1, has
    # not waited for it) has exited. But a zombie *thread-group leader* with live threads
    # (the JVM's main thread returns during shutdown) is still running.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rpartition(")")[2].split()[0] != "Z":
            return True
        return len(os.listdir(f"/proc/{pid}/task")) > 1
    except (OSError, IndexError):
        return True
