"""The worker's lifecycle input as the Kafka client has it: how far behind each partition
is (lags), and the back pressure of a store outage (the fetch paused in the client)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from faust.types import TP

log = logging.getLogger("tailguard.worker")


def lagging_of(lags: Mapping[int, int | None]) -> frozenset[int]:
    """Partitions with input still waiting (or not known to be caught up)."""
    return frozenset(p for p, lag in lags.items() if lag is None or lag > 0)


class LifecycleInput:
    """The lifecycle ``topic``'s partitions on the Faust ``app``'s consumer.

    Back pressure: ``store_up`` is set while ClickHouse takes writes; while it fails, the
    lifecycle partitions are paused and no new batch is processed."""

    def __init__(self, topic: str, app: Any) -> None:
        self.topic = topic
        self.app = app
        self.store_up = asyncio.Event()
        self.store_up.set()
        # The fetch pause wanted (store down) and the one the Kafka client has: applied
        # in order by one task (see pause)
        self._paused_want = False
        self._paused_have = False
        self._task: asyncio.Future[None] | None = None

    def lags(self, next_offsets: Mapping[int, int]) -> dict[int, int | None]:
        """Per partition: messages between our position and the high watermark (None: unknown)."""
        consumer = getattr(self.app, "_consumer", None)
        out: dict[int, int | None] = {}
        for p, nxt in next_offsets.items():
            hw = None
            if consumer is not None:
                try:
                    hw = consumer.highwater(TP(self.topic, p))
                except Exception:  # not assigned any more, or not known yet
                    hw = None
            out[p] = None if hw is None else max(0, hw - nxt)
        return out

    def lag(self, next_offsets: Mapping[int, int]) -> int:
        """Messages waiting on every partition (those unknown: none)."""
        return sum(v or 0 for v in self.lags(next_offsets).values())

    def tps(self) -> set[TP]:
        return {tp for tp in self.app.consumer.assignment() if tp.topic == self.topic}

    def pause(self) -> None:
        """Store down: stop fetching the lifecycle partitions and hold new batches, so that
        memory stays at what was in flight; the offsets stay at what was written.

        The fetch is paused in the Kafka client (aiokafka's ``pause``), not in Faust's set
        of active partitions: Faust drops the records of a partition it no longer counts
        active from a fetch it is handing over, after the client has moved its position
        past them, so a pause and resume in quick succession lost messages whose offsets
        a later commit covered (a store failing on and off: 5,276 of 45,000 requests), or
        left the input stalled. The client's pause returns nothing more of a paused
        partition and refetches from its position on resume."""
        if not self.store_up.is_set():
            return
        self.store_up.clear()
        self._want_paused(True)
        log.warning("ClickHouse writes failing: lifecycle input paused until a write succeeds")

    def resume(self) -> None:
        if self.store_up.is_set():
            return
        self._want_paused(False)
        self.store_up.set()
        log.warning("ClickHouse writes succeed again: lifecycle input resumed")

    def _want_paused(self, paused: bool) -> None:
        self._paused_want = paused
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._apply())
            self._task.add_done_callback(_log_pause_failure)

    async def _apply(self) -> None:
        """Bring the Kafka client's pause to what is wanted, in order (one task)."""
        thread = getattr(self.app.consumer, "_thread", None)
        while self._paused_have != self._paused_want:
            want = self._paused_want
            tps = self.tps()
            if thread is not None:

                async def apply(pause: bool = want, tps: set[TP] = tps) -> None:
                    from aiokafka.structs import TopicPartition

                    client = thread._ensure_consumer()
                    if pause:
                        owned = client.assignment()
                        parts = [TopicPartition(tp.topic, tp.partition) for tp in tps]
                        client.pause(*[p for p in parts if p in owned])
                    else:  # every paused one: an assignment may have changed meanwhile
                        client.resume(*client.paused())

                await thread.call_thread(apply)
            self._paused_have = want


def _log_pause_failure(task: asyncio.Future[None]) -> None:
    """The Kafka client could not be paused or resumed (the consumer stopping): logged;
    the next pause or resume tries again."""
    if not task.cancelled() and task.exception() is not None:
        log.warning("lifecycle fetch pause/resume failed: %r", task.exception())
