"""A flush makes way for a window that closed while it was written.

The controller's decision on the window ending now waits for the window closing now to
be stored (``DecisionClock``), and a flush spends most of its time on raw events. So the
writer writes them in chunks (``raw_chunks``), and once the event loop has set ``hurry``
(a batch closed a window) it leaves the rest of them and its checkpoints to the next
flush, which writes its own rows and windows first, then the raw events left to it and
its own, then checkpoints, and commits for both (``FlushWriter.write``,
``WorkerShell.flush_and_commit``). Never twice in a row, so raw events and commits cannot be put
off for ever by windows that keep closing."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from pipeline.adapters import flush as flush_module
from pipeline.adapters.flush import Flush, FlushBehind, FlushWriter, raw_chunks
from pipeline.adapters.worker import WorkerShell
from pipeline.core.join_state import JoinCounters
from pipeline.core.processor import KeptMessage
from pipeline.core.windows import WindowCounters
from tests.flush_fakes import fake_shell, fake_writer


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


# --- the writer thread: FlushWriter.write -----------------------------------------------


def _writer() -> FlushWriter:
    return fake_writer(told=SimpleNamespace(windows_stored=lambda *_a: None, flush=lambda _s: None))


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
    monkeypatch.setattr(flush_module, "RAW_CHUNK_EVENTS", 10)
    events = _msgs(5, 5, 5, 5, 5)
    hurry = threading.Event()
    calls: list[Any] = []

    def raw(_store: Any, _topic: str, kept: list[KeptMessage], **_k: Any) -> Any:
        calls.append((kept[0].offset, kept[-1].offset + 1))
        if hurry_after_chunks is not None and len(calls) >= hurry_after_chunks:
            hurry.set()
        return 0, []

    monkeypatch.setattr(flush_module, "write_raw_isolating", raw)
    monkeypatch.setattr(flush_module, "write_checkpoints", lambda *_a: calls.append("checkpoints"))
    if hurry_after_chunks == 0:
        hurry.set()
    _retries, left = _writer().write(Flush([], [], events), hurry=hurry)
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
    monkeypatch.setattr(flush_module, "RAW_CHUNK_EVENTS", 10)
    calls: list[Any] = []
    monkeypatch.setattr(
        flush_module, "write_raw_isolating", lambda *_a, **_k: (calls.append("raw"), (0, []))[1]
    )
    monkeypatch.setattr(flush_module, "write_checkpoints", lambda *_a: calls.append("checkpoints"))
    _retries, left = _writer().write(Flush([], [], _msgs(5, 5, 5)), hurry=None)
    assert left == []
    assert calls == ["raw", "checkpoints"]


# --- the event loop: flush_and_commit ---------------------------------------------------


class _Processor:
    """The processor's side of a flush: offsets advance by what was buffered; ``tick``
    hands over the raw events given to it (``kept``), as the real one's output does."""

    def __init__(self) -> None:
        self.offset = 0
        self.kept: list[KeptMessage] = []
        self.partitions = [0]
        self.counters = SimpleNamespace(quarantined=0, replayed=0, beyond_memory=0, events=0)

    def tick(self, *_a: Any) -> Any:
        kept, self.kept = self.kept, []
        return SimpleNamespace(records=[], windows=[], kept=kept, dead=[])

    def next_offsets(self) -> dict[int, int]:
        return dict.fromkeys(self.partitions, self.offset)

    def safe_offsets(self) -> dict[int, int]:
        return dict.fromkeys(self.partitions, self.offset)

    def horizons(self) -> dict[int, int]:
        return dict.fromkeys(self.partitions, 0)

    def watermarks(self) -> dict[int, int]:
        return {}

    def lateness_by_partition(self) -> dict[int, tuple[int, int, int]]:
        return {}

    def join_counters(self) -> JoinCounters:
        return JoinCounters()

    def window_counters(self) -> WindowCounters:
        return WindowCounters()


class _Input:
    """The lifecycle input: the consumer's lags per partition (None: unknown), the store up."""

    def __init__(self, lags: dict[int, int | None]) -> None:
        self.lags_now = lags
        self.store_up = asyncio.Event()
        self.store_up.set()

    def lags(self, _next_offsets: Any) -> dict[int, int | None]:
        return dict(self.lags_now)

    def resume(self) -> None:
        pass

    def pause(self) -> None:
        raise AssertionError("no write fails here")


class _Commits:
    """Commits noted, of the generation the shell was assigned."""

    def __init__(self, made: list[dict[int, int]]) -> None:
        self.made = made
        self.committed: dict[int, int] = {}

    def floored(self, offsets: dict[int, int]) -> dict[int, int]:
        return offsets

    def changed(self, offsets: dict[int, int]) -> dict[int, int]:
        return {p: o for p, o in offsets.items() if self.committed.get(p) != o}

    async def commit(self, offsets: dict[int, int], generation: str | None, *_a: Any) -> None:
        assert generation == "generation-1"
        self.made.append(dict(offsets))
        self.committed.update(offsets)


def _loop_shell(
    write: Any, commits: list[dict[int, int]], lags: dict[int, int | None] | None = None
) -> tuple[WorkerShell, _Processor]:
    """A shell built through its constructor, its adapters fakes; opened on fake ports."""
    lags = {0: 0} if lags is None else lags
    processor = _Processor()
    processor.partitions = sorted(lags)

    def no_ids() -> str | None:
        raise AssertionError("the topic id is not read here")

    sh = fake_shell(
        processor, write, topic_ids=no_ids, lifecycle_input=_Input(lags), commits=_Commits(commits)
    )
    return sh, processor


def test_a_flush_that_made_way_commits_nothing_and_the_next_writes_its_events_first() -> None:
    seen: list[tuple[list[KeptMessage], bool]] = []
    commits: list[dict[int, int]] = []

    def write(flush: Flush, *, hurry: Any) -> Any:
        events = list(flush.events)
        seen.append((events, hurry is not None))
        if len(seen) == 1:
            return 0, events[1:]  # a window closed after the first chunk
        return 0, []

    async def go() -> None:
        sh, proc = _loop_shell(write, commits)
        first, second = _msgs(1, 1, 1), [KeptMessage(0, 9, [], b"[]")]
        proc.kept, proc.offset = list(first), 3
        await sh.flush_and_commit()
        assert commits == []  # its raw events are not all stored
        proc.kept, proc.offset = list(second), 10
        await sh.flush_and_commit()
        assert seen[1] == (first[1:] + second, False)  # never twice in a row
        assert commits == [{0: 10}]
        proc.kept = _msgs(1)
        await sh.flush_and_commit()
        assert seen[2][1]  # it may make way again

    asyncio.run(asyncio.wait_for(go(), 10))


def _hurry_given(lags: dict[int, int | None], *, may_yield: bool = True) -> bool:
    """Whether one flush of a shell with these consumer lags was given ``hurry``."""
    seen: list[bool] = []

    def write(_flush: Flush, *, hurry: Any) -> Any:
        seen.append(hurry is not None)
        return 0, []

    async def go() -> None:
        sh, proc = _loop_shell(write, [], lags)
        proc.kept = _msgs(1)
        await sh.flush_and_commit(may_yield=may_yield)

    asyncio.run(asyncio.wait_for(go(), 10))
    assert len(seen) == 1
    return seen[0]


def test_a_flush_before_a_revocation_never_makes_way() -> None:
    assert _hurry_given({0: 0})  # live, any other flush would be given it
    assert not _hurry_given({0: 0}, may_yield=False)


def test_a_batch_closing_a_window_sets_hurry() -> None:
    async def go() -> None:
        gate = asyncio.Event()

        async def flush() -> None:
            await gate.wait()

        chain = FlushBehind(flush, lambda: 0, 10)
        await chain.after_batch(closed=False)
        assert not chain.hurry.is_set()
        await chain.after_batch(closed=True)
        assert chain.hurry.is_set()
        gate.set()
        if chain.running is not None:
            await chain.running

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
