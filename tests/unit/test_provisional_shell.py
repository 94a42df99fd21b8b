"""What ``WorkerShell.send_provisional`` tells the controller about windows that closed
but are not yet written: a closed window goes out at once as a snapshot, ahead of the
clocks, so a decision on the window ending now does not wait for the write of the window
closing at the same moment (grace a multiple of the size); a correction not yet written
still holds its partition's clock at its start (corrections go out after their write)."""

from __future__ import annotations

import asyncio
import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest

from pipeline.adapters.worker import WorkerShell
from pipeline.contract.codec import encode_event
from pipeline.contract.summary import Progress, WindowSummary, decode_summary
from pipeline.core.processor import StreamProcessor
from pipeline.core.windows import ClosedWindow, WindowConfig
from pipeline.settings import Settings
from tests.factories import T0_NS, completed, finished, received

SIZE = 10_000
T0_MS = T0_NS // 1_000_000


def _closed() -> ClosedWindow:
    proc = StreamProcessor("t", window_config=WindowConfig(size_ms=SIZE, grace_ms=0))
    evs = [received("r1", 0.0), finished("r1", 90.0), completed("r1", 95.0)]
    proc.process([(0, i, encode_event(e)) for i, e in enumerate(evs)], wall_ms=None)
    (win,) = [w for w in proc.drain().windows if w.partition == 0]
    return win


def _shell(clock_ms: int, sent: list[Any]) -> WorkerShell:
    sh = object.__new__(WorkerShell)
    sh.settings = Settings()
    sh._windows = []
    sh._writing = []
    sh._progress_sent = {}
    sh._closing_sent = set()
    sh.processor = SimpleNamespace(provisional=lambda: ([], {0: clock_ms}))  # type: ignore[assignment]
    sh.summaries = SimpleNamespace(send=lambda raw: sent.append(decode_summary(raw)))  # type: ignore[assignment]
    return sh


@pytest.mark.parametrize("where", ["_windows", "_writing"])
def test_a_closed_unwritten_window_goes_out_once_before_an_uncapped_clock(where: str) -> None:
    win = _closed()
    clock = win.start_ms + 3 * SIZE
    sent: list[Any] = []
    sh = _shell(clock, sent)
    getattr(sh, where).append(win)
    asyncio.run(sh.send_provisional())
    snap, progress = sent
    assert isinstance(snap, WindowSummary)
    assert (snap.partition, snap.start_ms, snap.final) == (0, win.start_ms, False)
    assert progress == Progress(0, 0, clock)  # not held at the closed window's start
    sent.clear()
    asyncio.run(sh.send_provisional())  # still unwritten: the snapshot is not repeated
    assert sent == [Progress(0, 0, clock)]


def test_a_correction_not_yet_written_holds_its_partitions_clock() -> None:
    win = dataclasses.replace(_closed(), correction=True)
    clock = win.start_ms + 3 * SIZE
    sent: list[Any] = []
    sh = _shell(clock, sent)
    sh._writing.append(win)
    asyncio.run(sh.send_provisional())
    assert sent == [Progress(0, 0, win.start_ms)]


def test_the_window_written_the_clock_alone_goes_on() -> None:
    win = _closed()
    sent: list[Any] = []
    sh = _shell(T0_MS + 3 * SIZE, sent)
    sh._windows.append(win)
    asyncio.run(sh.send_provisional())
    sh._windows.clear()  # written: its final summary went out with the write
    sent.clear()
    asyncio.run(sh.send_provisional())
    assert sent == [Progress(0, 0, T0_MS + 3 * SIZE)]
    assert sh._closing_sent == set()
