"""Reading again what the consumer fetched and never handed over to the worker
(:mod:`pipeline.core.stall` decides; this reads the consumer's positions and seeks)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from faust.types import TP

from pipeline.adapters.generations import TopicWatch
from pipeline.core.stall import STALL_AFTER_MS, PartitionView, StallWatch

log = logging.getLogger("tailguard.worker")


class StallGuard:
    """Reads again what the consumer fetched and never handed over to the worker
    (:mod:`pipeline.core.stall`), checked with the topic: a lifecycle partition whose
    position stood past the next offset the worker expects (``next_offsets``; a
    partition not started yet: its resumed commit, else its first offset), while no
    batch was in progress, the store took writes (``store_up``), no rebalance was under
    way and the topic's generation was the assigned one, for ``STALL_AFTER_MS``."""

    def __init__(
        self,
        watch: TopicWatch,
        next_offsets: Callable[[], dict[int, int]],
        store_up: Callable[[], bool],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.watch = watch
        self._clock = clock
        self._next_offsets = next_offsets
        self._store_up = store_up
        self._stall = StallWatch()
        self._batches = 0
        self._first: dict[int, int] = {}  # first offsets read, for the assignment below
        self._first_of = -1  # the assignment (TopicWatch.assignments) they are of
        # partitions read again so (logged; /metrics: stalled_partitions_read_again_total)
        self.read_again = 0
        # those whose late fetch may still come: what their state handled is dropped
        # (worker_counts.not_handled, which takes them out)
        self.rereading: set[int] = set()

    @contextmanager
    def batching(self) -> Iterator[None]:
        """Around each batch the worker processes: it is busy, nothing is judged."""
        self._batches += 1
        try:
            yield
        finally:
            self._batches -= 1

    async def check(self) -> None:
        watch = self.watch
        try:
            seen = await watch.app.consumer._thread.positions(watch.topic)
        except Exception as exc:  # no consumer yet, or another Faust: nothing to judge
            log.debug("positions not read: %s", exc)
            return
        if watch.assignments != self._first_of:
            self._first, self._first_of = {}, watch.assignments
        nxt = self._next_offsets()
        views = {
            p: PartitionView(position, self._expected(p, nxt), paused)
            for p, (position, paused) in seen.items()
        }
        busy = (
            self._batches > 0
            or not self._store_up()
            or bool(getattr(watch.app, "rebalancing", False))  # Faust's flow is stopped
            or bool(watch.barrier)
            or watch.assigned_gen is None
            or watch.assigned_gen != watch.topic_id
        )
        back = self._stall.observe(int(self._clock() * 1000), views, busy)
        if back and set(back) - set(nxt):  # partitions not started: past their first offset?
            self._first.update(await self._first_offsets(sorted(set(back) - set(nxt))))
            back = {p: self._expected(p, nxt) for p in back}
            back = {p: o for p, o in back.items() if (views[p].position or 0) > o}
        if not back:
            return
        log.warning(
            "partitions %s: the consumer fetched up to %s but the worker got messages only "
            "up to %s for %.0f s (a fetch dropped on its way): reading them again from there",
            sorted(back), {p: views[p].position for p in back}, back, STALL_AFTER_MS / 1000,
        )  # fmt: skip
        moved = await watch.read_again(back)
        self.rereading |= moved
        self.read_again += len(moved)

    def _expected(self, p: int, nxt: dict[int, int]) -> int:
        if p in nxt:
            return nxt[p]
        return max(self.watch.commits.resume_at.get(p) or 0, self._first.get(p, 0))

    async def _first_offsets(self, parts: list[int]) -> dict[int, int]:
        tps = [TP(self.watch.topic, p) for p in parts]
        try:
            first = await self.watch.app.consumer.earliest_offsets(*tps)
        except Exception as exc:
            log.warning("could not read the first offsets of %s: %s", parts, exc)
            return {}
        return {tp.partition: int(first.get(tp) or 0) for tp in tps}
