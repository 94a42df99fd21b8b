"""A flush makes way for a window that closed while it was written.

The controller's decision on the window ending now waits for the window closing now to
be stored (``DecisionClock``), and a flush spends most of its time on raw events. So the
writer writes them in chunks (``raw_chunks``), and once the event loop has set ``hurry``
(a batch closed a window) it leaves the rest of them and its checkpoints to the next
flush, which writes its own rows and windows first, then the raw events left to it and
its own, then checkpoints, and commits for both (``WorkerShell._write``,
``flush_and_commit``). Never twice in a row, so raw events and commits cannot be put
off for ever by windows that keep closing."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import pytest

from pipeline.adapters import worker as worker_module
from pipeline.adapters.worker import WorkerShell, raw_chunks
from pipeline.core.processor import KeptMessage


def _msgs(*sizes: int) -> list[KeptMessage]:
    return [KeptMessage(0, i, [object()] * n, b"[]") for i, n in enumerate(sizes)]  # type: ignore[list-item]


@pytest.mark.parametrize(
    ("sizes", "per_chunk", "want"),
    [
        ((), 10, []),
        ((3,), 10, [(0, 1)]),
        ((0,), 10, [(0, 1)]),  # a message without events is still written
        ((5, 5, 5), 10, [(0, 2), (2, 3)]),
        ((4, 4, 4), 10, [(0, 3)]),
        ((20, 1, 1), 10, [(0, 1), (1, 3)]),  # a large message is a chunk of its own
        ((10, 10), 10, [(0, 1), (1, 2)]),
        ((1, 1, 1), 1, [(0, 1), (1, 2), (2, 3)]),
    ],
)
def test_raw_chunks_cover_every_message_once_in_order(
    sizes: tuple[int, ...], per_chunk: int, want: list[tuple[int, int]]
) -> None:
    assert list(raw_chunks(_msgs(*sizes), per_chunk)) == want


# --- the writer thread: _write ----------------------------------------------------------


def _writer_shell() -> WorkerShell:
    sh = object.__new__(WorkerShell)
    sh.settings = SimpleNamespace(lifecycle_topic="t", group_id="g")  # type: ignore[assignment]
    sh.store = object()  # type: ignore[assignment]
    sh.stopping = threading.Event()
    sh._progress_sent = {}
    sh._writing = []
    sh.summaries = SimpleNamespace(send=lambda _raw: None, flush=lambda _s: None)  # type: ignore[assignment]
    sh._retry = lambda fn, what: (fn(), 0)[1]  # type: ignore[method-assign]
    sh._dead_rows = lambda dead: None  # type: ignore[method-assign]
    return sh


@pytest.mark.parametrize(
    ("hurry_after_chunks", "written", "left_from"),
    [
        (None, [(0, 2), (2, 4), (4, 5)], None),  # no window closed: everything, checkpoints
        (0, [], 0),  # closed before the raw events: all of them left
        (1, [(0, 2)], 2),
        (2, [(0, 2), (2, 4)], 4),
    ],
)
def test_hurry_leaves_the_remaining_raw_events_and_the_checkpoints(
    monkeypatch: pytest.MonkeyPatch,
    hurry_after_chunks: int | None,
    written: list[tuple[int, int]],
    left_from: int | None,
) -> None:
    monkeypatch.setattr(worker_module, "RAW_CHUNK_EVENTS", 10)
    events = _msgs(5, 5, 5, 5, 5)
    hurry = threading.Event()
    calls: list[Any] = []

    def raw(_store: Any, _topic: str, kept: list[KeptMessage], **_k: Any) -> Any:
        calls.append((kept[0].offset, kept[-1].offset + 1))
        if hurry_after_chunks is not None and len(calls) >= hurry_after_chunks:
            hurry.set()
        return 0, []

    monkeypatch.setattr(worker_module, "write_raw_isolating", raw)
    monkeypatch.setattr(worker_module, "write_checkpoints", lambda *_a: calls.append("checkpoints"))
    if hurry_after_chunks == 0:
        hurry.set()
    sh = _writer_shell()
    _retries, left = sh._write([], [], events, [], {}, hurry=hurry)
    if left_from is None:
        assert calls == [*written, "checkpoints"]
        assert left == []
    else:
        assert calls == written  # no checkpoint: its horizon would cover unwritten events
        assert left == events[left_from:]
    # Every message is either written or left, once.
    got = [e for a, b in written for e in events[a:b]] + left
    assert got == events


def test_without_hurry_the_raw_events_are_one_write(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_module, "RAW_CHUNK_EVENTS", 10)
    calls: list[Any] = []
    monkeypatch.setattr(
        worker_module, "write_raw_isolating", lambda *_a, **_k: (calls.append("raw"), (0, []))[1]
    )
    monkeypatch.setattr(worker_module, "write_checkpoints", lambda *_a: calls.append("checkpoints"))
    _retries, left = _writer_shell()._write([], [], _msgs(5, 5, 5), [], {}, hurry=None)
    assert left == []
    assert calls == ["raw", "checkpoints"]


# --- the event loop: flush_and_commit ---------------------------------------------------


class _Processor:
    """The processor's side of a flush: offsets advance by what was buffered."""

    def __init__(self) -> None:
        self.offset = 0

    def tick(self, *_a: Any) -> Any:
        return SimpleNamespace(records=[], windows=[], kept=[], dead=[])

    def next_offsets(self) -> dict[int, int]:
        return {0: self.offset}

    def safe_offsets(self) -> dict[int, int]:
        return {0: self.offset}

    def horizons(self) -> dict[int, int]:
        return {0: 0}

    def watermarks(self) -> dict[int, int]:
        return {}

    def lateness_by_partition(self) -> dict[int, tuple[int, int, int]]:
        return {}


def _loop_shell(write: Any, commits: list[dict[int, int]]) -> WorkerShell:
    sh = object.__new__(WorkerShell)
    sh.processor = _Processor()  # type: ignore[assignment]
    sh.settings = SimpleNamespace(lifecycle_topic="t", take_max_messages=2)  # type: ignore[assignment]
    sh._flush_lock = asyncio.Lock()
    sh._hurry = threading.Event()
    sh._yielded = False
    sh._records, sh._windows, sh._events, sh._writing = [], [], [], []
    sh._taken = asyncio.Event()
    sh._behind = None
    sh._committed, sh._commit_floor = {}, {}
    sh._executor = ThreadPoolExecutor(max_workers=1)
    sh._write = write  # type: ignore[method-assign]
    sh._resume_input = lambda: None  # type: ignore[method-assign]
    sh._count_timeouts = lambda: None  # type: ignore[method-assign]
    sh._maybe_log = lambda force=False: None  # type: ignore[method-assign]
    sh._lags = lambda offsets: dict.fromkeys(offsets, 0)  # type: ignore[method-assign]
    sh.stopping = threading.Event()
    sh.write_retries = sh.rows_written = 0
    noop = SimpleNamespace(record=lambda *_a: None, add=lambda *_a: None)
    sh.telemetry = SimpleNamespace(  # type: ignore[assignment]
        write_duration=noop, write_retries=noop, records=noop, windows_closed=noop,
        record_latencies=lambda _r: None,
    )  # fmt: skip
    sh.dlq = SimpleNamespace(flush=lambda _s: None)  # type: ignore[assignment]

    sh._assigned_gen = "generation-1"

    async def commit(offsets: dict[int, int], generation: str | None) -> None:
        assert generation == "generation-1"
        commits.append(dict(offsets))
        sh._committed.update(offsets)

    sh._commit = commit  # type: ignore[method-assign]
    return sh


def test_a_flush_that_made_way_commits_nothing_and_the_next_writes_its_events_first() -> None:
    seen: list[tuple[list[KeptMessage], bool]] = []
    commits: list[dict[int, int]] = []

    def write(_r: Any, _w: Any, events: list[KeptMessage], _c: Any, _t: Any, *, hurry: Any) -> Any:
        seen.append((list(events), hurry is not None))
        if len(seen) == 1:
            return 0, events[1:]  # a window closed after the first chunk
        return 0, []

    async def go() -> None:
        sh = _loop_shell(write, commits)
        first, second = _msgs(1, 1, 1), [KeptMessage(0, 9, [], b"[]")]
        sh._events = list(first)
        sh.processor.offset = 3  # type: ignore[attr-defined]
        await sh.flush_and_commit()
        assert commits == []  # its raw events are not all stored
        assert sh._events == first[1:]
        sh._events += second
        sh.processor.offset = 10  # type: ignore[attr-defined]
        await sh.flush_and_commit()
        assert seen[1] == (first[1:] + second, False)  # never twice in a row
        assert commits == [{0: 10}]
        sh._events = []
        await sh.flush_and_commit()
        assert seen[2][1]  # it may make way again

    asyncio.run(asyncio.wait_for(go(), 10))


def _hurry_given(lags: dict[int, int | None], *, may_yield: bool = True) -> bool:
    """Whether one flush of a shell with these consumer lags was given ``hurry``."""
    seen: list[bool] = []

    def write(*_a: Any, hurry: Any) -> Any:
        seen.append(hurry is not None)
        return 0, []

    async def go() -> None:
        sh = _loop_shell(write, [])
        sh._lags = lambda _o: lags  # type: ignore[method-assign]
        sh._events = _msgs(1)
        await sh.flush_and_commit(may_yield=may_yield)

    asyncio.run(asyncio.wait_for(go(), 10))
    assert len(seen) == 1
    return seen[0]


def test_a_flush_before_a_revocation_never_makes_way() -> None:
    assert _hurry_given({0: 0})  # live, any other flush would be given it
    assert not _hurry_given({0: 0}, may_yield=False)


def test_a_batch_closing_a_window_sets_hurry() -> None:
    async def go() -> None:
        sh = object.__new__(WorkerShell)
        sh.settings = SimpleNamespace(flush_max_rows=10)  # type: ignore[assignment]
        sh._records = []
        sh._behind = None
        sh._flush_again = False
        sh._taken = asyncio.Event()
        sh._hurry = threading.Event()
        gate = asyncio.Event()

        async def flush() -> None:
            await gate.wait()

        sh.flush_and_commit = flush  # type: ignore[method-assign]
        await sh._flush_behind(closed=False)
        assert not sh._hurry.is_set()
        await sh._flush_behind(closed=True)
        assert sh._hurry.is_set()
        gate.set()
        if sh._behind is not None:
            await sh._behind

    asyncio.run(asyncio.wait_for(go(), 10))


@pytest.mark.parametrize(
    ("lags", "may"),
    [
        ({0: 0}, True),
        ({0: 2}, True),  # within one batch (take_max_messages = 2) of the end: live
        ({0: 3}, False),  # catching up: windows close at most batches, one write is cheaper
        ({0: 1, 1: 2}, False),
        ({0: None}, False),  # not known to be caught up
    ],
)
def test_only_a_live_worker_makes_way(lags: dict[int, int | None], may: bool) -> None:
    assert _hurry_given(lags) == may
