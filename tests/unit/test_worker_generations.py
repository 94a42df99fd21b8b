"""The worker's pieces for a lifecycle topic deleted and created again (no broker): Faust's
read offsets are not tracked for it, and a partition being moved to the new topic's first
offset drops what was fetched from the old positions until that offset comes."""

from __future__ import annotations

from typing import Any

import pytest
from faust.types import TP

from pipeline.adapters.faust_wiring import _ReadOffsets
from pipeline.adapters.generations import Commits, TopicWatch


def _watch(app: Any = None) -> TopicWatch:
    """A topic watch over ``app``'s consumer (no broker: its topic id is never read)."""

    def no_ids() -> str | None:
        raise AssertionError("the topic id is not read here")

    return TopicWatch(
        "lc", app, no_ids, Commits("lc", app, no_ids),
        partitions=list, drop_state=lambda _parts: None,
    )  # fmt: skip


def test_no_read_offset_is_known_for_the_lifecycle_topic() -> None:
    r = _ReadOffsets(frozenset({"lc"}))
    r[TP("lc", 0)] = 50  # a message of the old generation, delivered after a revocation
    r[TP("stats", 0)] = 7
    assert r[TP("lc", 0)] is None  # Faust drops nothing below it: the new topic's 0..49 pass
    assert r.get(TP("lc", 0)) is None
    assert r[TP("stats", 0)] == 7  # other topics as Faust keeps them
    assert r[TP("stats", 1)] is None  # (Faust's defaultdict(lambda: None))
    assert r.get(TP("stats", 1), 3) == 3


def test_messages_before_the_new_first_offset_are_dropped_until_it_comes() -> None:
    watch = _watch()
    watch.barrier.update({0: 0, 1: -1})  # partition 1: its first offset not known yet
    batch = [(0, 47, b"a"), (1, 12, b"b"), (0, 0, b"c"), (0, 1, b"d"), (2, 5, b"e")]
    assert watch.past_barrier(batch) == [(0, 0, b"c"), (0, 1, b"d"), (2, 5, b"e")]
    assert watch.barrier == {1: -1}
    assert watch.past_barrier([(0, 48, b"f"), (1, 0, b"g")]) == [(0, 48, b"f")]


def test_a_partition_started_past_where_reading_starts_is_read_again() -> None:
    import asyncio
    from types import SimpleNamespace

    seeks: list[dict[int, int]] = []

    async def earliest_offsets(*tps: Any) -> dict[Any, int]:
        return dict.fromkeys(tps, 0) | {TP("lc", 2): 5}  # partition 2: retention passed 0..4

    async def seek_wait(offsets: dict[Any, int]) -> None:
        seeks.append({tp.partition: o for tp, o in offsets.items()})

    watch = _watch(
        SimpleNamespace(
            consumer=SimpleNamespace(earliest_offsets=earliest_offsets, seek_wait=seek_wait)
        )
    )
    watch.commits.resume_at[1] = 40  # partition 1 resumed from its committed offset 40
    first = {0: 3, 1: 40, 2: 5, 3: 0}  # partition 0: the consumer skipped 0..2
    skipped = asyncio.run(watch.skipped_at_start(first))
    assert skipped == {0}
    assert seeks == [{0: 0}]
    assert watch.barrier == {0: 0}


class _SeekingConsumer:
    """aiokafka's consumer as the worker's seek sees it: the committed offsets it finds
    (``committed``, per partition; None: none) and the partitions sent to their first."""

    def __init__(self, committed: dict[Any, int | None]) -> None:
        self.committed = committed
        self.to_first: list[Any] = []

    async def seek_to_committed(self) -> dict[Any, int | None]:
        return dict(self.committed)

    async def seek_to_beginning(self, *tps: Any) -> bool:
        self.to_first.extend(tps)
        return True


# committed offsets found -> the partitions moved to their first offset
SEEK_TO_COMMITTED = {
    "lifecycle partitions without a commit": (
        {TP("lc", 0): None, TP("lc", 1): 7, TP("lc", 2): 0},
        [TP("lc", 0), TP("lc", 2)],
    ),
    "every lifecycle partition committed": ({TP("lc", 0): 3, TP("lc", 1): 7}, []),
    "other topics as aiokafka leaves them": ({TP("stats", 0): None, TP("stats", 1): 0}, []),
}


def test_the_seek_to_committed_sends_uncommitted_lifecycle_partitions_to_their_first() -> None:
    """Faust's seek to the committed offsets (after dropping a fetch made while its flow
    was stopped) leaves a partition without one where it is in aiokafka: past the
    dropped messages. The worker's consumer thread sends those of the lifecycle topic
    to their first offset (issue 49's stall)."""
    import asyncio

    from pipeline.adapters.faust_wiring import build_app
    from pipeline.settings import Settings

    app, _ = build_app(Settings(lifecycle_topic="lc", engine_stats_topic="stats"))
    for name, (committed, to_first) in SEEK_TO_COMMITTED.items():
        consumer = _SeekingConsumer(committed)

        async def seek(consumer: _SeekingConsumer = consumer) -> Any:
            thread = app.consumer._new_consumer_thread()  # type: ignore[attr-defined]
            thread._consumer = consumer

            async def call_thread(fn: Any, *args: Any) -> Any:  # (no thread here)
                return await fn(*args)

            thread.call_thread = call_thread
            return await thread.seek_to_committed()

        assert asyncio.run(seek()) == committed, name  # Faust's read offsets from it
        assert consumer.to_first == to_first, name


class _StallConsumer:
    """A consumer whose positions, first offsets and seeks are the test's."""

    def __init__(self, positions: dict[int, tuple[int | None, bool]], first: dict[int, int]):
        self._thread = self
        self.pos = positions
        self.first = first
        self.first_reads = 0
        self.seeks: list[dict[TP, int]] = []

    async def positions(self, topic: str) -> dict[int, tuple[int | None, bool]]:
        return dict(self.pos)

    async def earliest_offsets(self, *tps: TP) -> dict[TP, int]:
        self.first_reads += 1
        return {tp: self.first.get(tp.partition, 0) for tp in tps}

    async def seek_wait(self, partitions: dict[TP, int]) -> None:
        self.seeks.append(dict(partitions))


def _guard(
    consumer: _StallConsumer, started: dict[int, int], now: list[float], store_up: bool = True
) -> Any:
    from types import SimpleNamespace

    from pipeline.adapters.stall_guard import StallGuard

    watch = _watch(SimpleNamespace(consumer=consumer))
    watch.assigned_gen = watch.topic_id = "gen-1"
    return StallGuard(watch, lambda: dict(started), lambda: store_up, clock=lambda: now[0])


# Per case: the consumer's positions, first offsets, the worker's next offsets (started
# partitions), whether a batch is in progress at the checks, and the seeks expected after
# checks at 0 s, 5 s and 10 s.
STALL_CASES: dict[str, tuple[Any, ...]] = {
    "a started partition's fetch never handed over: read again from the next offset": (
        {0: (120, False)}, {}, {0: 100}, False, [{TP("lc", 0): 100}],
    ),
    "caught up: nothing": ({0: (100, False)}, {}, {0: 100}, False, []),
    "a batch in progress at every check: nothing": ({0: (120, False)}, {}, {0: 100}, True, []),
    "not started, no commit, past its first offset: read from the first offset": (
        {1: (40, False)}, {1: 0}, {}, False, [{TP("lc", 1): 0}],
    ),
    "not started, at its first offset after retention (nothing produced since): nothing": (
        {1: (130, False)}, {1: 130}, {}, False, [],
    ),
    "paused by Faust: nothing": ({0: (120, True)}, {}, {0: 100}, False, []),
}  # fmt: skip


def _checks(guard: Any, now: list[float], times: Any, busy: bool = False) -> None:
    """The guard's checks at ``times`` (s), each inside a batch when ``busy``."""
    import asyncio

    async def checks() -> None:
        for t in times:
            now[0] = t
            if busy:
                with guard.batching():
                    await guard.check()
            else:
                await guard.check()

    asyncio.run(checks())


@pytest.mark.parametrize("case", STALL_CASES, ids=list(STALL_CASES))
def test_a_fetch_never_handed_over_is_read_again(case: str) -> None:
    positions, first, started, busy, want = STALL_CASES[case]
    consumer = _StallConsumer(positions, first)
    now = [0.0]
    guard = _guard(consumer, started, now)
    _checks(guard, now, (0.0, 5.0, 10.0), busy)
    assert consumer.seeks == want
    assert guard.watch.barrier == {tp.partition: o for s in want for tp, o in s.items()}


def test_a_partition_at_its_first_offset_costs_one_read_of_it() -> None:
    consumer = _StallConsumer({1: (130, False)}, {1: 130})
    now = [0.0]
    guard = _guard(consumer, {}, now)
    _checks(guard, now, [5.0 * i for i in range(10)])
    assert consumer.seeks == []
    assert consumer.first_reads == 1


def test_the_store_down_holds_the_judgement() -> None:
    consumer = _StallConsumer({0: (120, False)}, {})
    now = [0.0]
    guard = _guard(consumer, {0: 100}, now, store_up=False)
    _checks(guard, now, (0.0, 10.0, 20.0))
    assert consumer.seeks == []


def test_a_rebalance_under_way_holds_the_judgement() -> None:
    consumer = _StallConsumer({0: (120, False)}, {})
    now = [0.0]
    guard = _guard(consumer, {0: 100}, now)
    guard.watch.app.rebalancing = True  # Faust's flow stopped: it seeks itself after
    _checks(guard, now, (0.0, 10.0, 20.0))
    assert consumer.seeks == []
    guard.watch.app.rebalancing = False
    _checks(guard, now, (0.0, 10.0, 20.0))  # (the clock starts again: judged from then on)
    assert consumer.seeks == [{TP("lc", 0): 100}]
