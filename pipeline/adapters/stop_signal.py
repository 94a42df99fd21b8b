"""A stop signal acted on the moment it arrives, even while the event loop is busy.

Faust (mode) takes SIGTERM/SIGINT through ``loop.add_signal_handler``: the callback runs
only when the event loop gets back to its selector. A batch that keeps the loop for
seconds (a loaded machine: 9-14 s were seen at load 12-19) delays the whole stop, and
the stop watchdog with it, by that long.

:class:`PromptStop` adds a plain ``signal.signal`` handler on top of the loop's. CPython
runs it in the main thread between two bytecodes, busy loop or not, and it only writes a
byte to a pipe (no lock is taken in a signal handler: the main thread may hold it). A
daemon thread reading that pipe runs ``on_signal`` at once and ``on_overdue`` after
``grace_s`` if the process is still there. The loop's own handler still runs: CPython's C
handler writes the signal to the loop's wakeup fd whatever the Python handler is.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class PromptStop:
    """Call :meth:`install` from the main thread, after the event loop's handlers."""

    def __init__(
        self, on_signal: Callable[[int], None], on_overdue: Callable[[], None], grace_s: float
    ) -> None:
        self._on_signal = on_signal
        self._on_overdue = on_overdue
        self._grace_s = grace_s
        self._read_fd, self._write_fd = os.pipe()
        self._previous: dict[int, Any] = {}
        self._thread = threading.Thread(target=self._watch, name="tailguard-stop", daemon=True)

    def install(self) -> None:
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.getsignal(sig)
            signal.signal(sig, self._handle)
        self._thread.start()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # Async-signal-safe work only; a full pipe (a signal storm) loses nothing needed.
        with contextlib.suppress(OSError):
            os.write(self._write_fd, bytes((signum,)))
        previous = self._previous.get(signum)
        if callable(previous):
            previous(signum, frame)  # the loop's no-op, or a handler installed before

    def _watch(self) -> None:
        try:
            first = os.read(self._read_fd, 1)
        except OSError:
            return
        if not first:
            return
        self._on_signal(first[0])
        time.sleep(self._grace_s)
        self._on_overdue()
