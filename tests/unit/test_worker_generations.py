"""The worker's pieces for a lifecycle topic deleted and created again (no broker): Faust's
read offsets are not tracked for it, and a partition being moved to the new topic's first
offset drops what was fetched from the old positions until that offset comes."""

from __future__ import annotations

from typing import Any

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
