"""The worker's counters, as metrics (the processor's cumulative counts, added to the
telemetry's counters by what changed since the last flush) and as a periodic log line."""

from __future__ import annotations

import logging
import time
from typing import Any

from pipeline.adapters.telemetry import WorkerTelemetry
from pipeline.core.processor import StreamProcessor

log = logging.getLogger("tailguard.worker")

LOG_EVERY_S = 10.0


def not_handled(
    next_offsets: dict[int, int],
    messages: list[tuple[int, int, bytes]],
    rereading: set[int],
) -> list[tuple[int, int, bytes]]:
    """``messages`` without those, of a partition the stall guard read again
    (``rereading``, ``StallGuard.read_again``), at offsets the partition's state has
    handled already (``next_offsets``: the processor's): the late fetch the guard took
    for a dropped one, delivered besides the reading again (a slow fetch looks like a
    dropped one on a busy machine). Its valid events would be duplicates to the join,
    but a malformed message would be dead-lettered twice (``test_fault_malformed.py``
    under load). A partition leaves ``rereading`` (updated in place) with its first
    message past what its state handled: the duplicates are behind it.

    Only those partitions: a topic created again restarts its offsets below what the
    old generation's state handled, and its messages, fetched before the worker notices
    the new generation, must reach the processor (filtering every partition so can drop
    them: a CI run of ``test_fault_topic_cycles.py`` under load, session 36). A
    partition whose state was dropped (rebalance) or finished (new generation) starts
    again at 0."""
    if not rereading:
        return messages
    out = []
    for m in messages:
        p = m[0]
        if p in rereading:
            if m[1] < next_offsets.get(p, 0):
                continue
            rereading.discard(p)
        out.append(m)
    return out


class WorkerCounts:
    """Counts of ``processor`` into ``telemetry``, and the log line every ``LOG_EVERY_S``."""

    def __init__(
        self, processor: StreamProcessor, telemetry: WorkerTelemetry | Any, stall: Any = None
    ) -> None:
        self.processor = processor
        self.telemetry = telemetry
        self.stall = stall  # the worker's StallGuard (its partitions read again)
        self._seen: dict[tuple[str, str], int] = {}  # what count() counted, by label
        self._last_log = time.monotonic()
        self.rows_written = 0
        self.write_retries = 0
        self.store_rejected = 0  # rows the store refused, sent to the DLQ
        # What was finished of topic generations that went away (StreamProcessor.finish):
        # the requests the windows it closed count, those windows, and the partial
        # records of requests that waited for their partner.
        self.finished_requests = 0
        self.finished_windows = 0
        self.finished_partials = 0
        # lifecycle messages at offsets already handled, dropped (not_handled)
        self.redelivered = 0

    def written(self, rows: int, retries: int) -> None:
        self.rows_written += rows
        self.write_retries += retries

    def not_handled(self, messages: list[tuple[int, int, bytes]]) -> list[tuple[int, int, bytes]]:
        """:func:`not_handled` of the processor's partitions, counted."""
        rereading = self.stall.rereading if self.stall else set()
        fresh = not_handled(self.processor.next_offsets(), messages, rereading)
        self.redelivered += len(messages) - len(fresh)
        return fresh

    def health(self, lag: int, lifecycle_input: Any) -> dict[str, float]:
        """The worker's own health for /metrics (``tailguard_worker_<name>``)."""
        return {
            "consumer_lag_messages": lag,
            "join_pending_requests": self.processor.pending(),
            "events_consumed": self.processor.counters.events,
            "rows_written": self.rows_written,
            "store_write_retries": self.write_retries,
            "store_rejected_rows": self.store_rejected,
            "store_up": 1.0 if lifecycle_input.store_up.is_set() else 0.0,
            "generation_finished_requests": self.finished_requests,
            "generation_finished_windows": self.finished_windows,
            "generation_finished_partials": self.finished_partials,
            # lifecycle partitions read again after a fetch dropped on its way (StallGuard)
            "stalled_partitions_read_again": self.stall.read_again if self.stall else 0,
            "redelivered_messages_dropped": self.redelivered,
            **self._duplicates(),
        }

    def _duplicates(self) -> dict[str, float]:
        """The join's duplicates, and of them ids repeated with other content."""
        j = self.processor.join_counters()
        return {
            "join_duplicates": j.duplicates,
            "join_duplicate_ids_changed": j.duplicate_ids_changed,
        }

    def count(self) -> None:
        """Join timeouts, conflicts, duplicates and lateness counted since the last call, as
        metrics: each cumulative count adds to its counter, under its label, what it grew
        by since the last call."""
        t = self.telemetry
        j = self.processor.join_counters()
        w = self.processor.window_counters()
        c = self.processor.counters
        for counter, (key, name), value in (
            (t.join_timeouts, ("side", "gateway_only"), j.gateway_only),
            (t.join_timeouts, ("side", "engine_only"), j.engine_only),
            (t.join_conflicts, ("when", "before_record"), j.conflicts - j.conflicts_corrected),
            (t.join_conflicts, ("when", "after_record"), j.conflicts_corrected),
            (t.join_duplicates, ("content", "changed"), j.duplicate_ids_changed),
            (t.join_duplicates, ("content", "same"), j.duplicates - j.duplicate_ids_changed),
            (t.lateness, ("kind", "corrected"), w.corrected),
            (t.lateness, ("kind", "retracted"), w.retracted),
            (t.lateness, ("kind", "quarantined"), c.quarantined),
            (t.lateness, ("kind", "replayed"), c.replayed),
            (t.lateness, ("kind", "counted_before"), c.beyond_memory),
        ):
            seen = self._seen.get((key, name), 0)  # each counter's label key is its own
            if value > seen:
                counter.add(value - seen, {key: name})
                self._seen[(key, name)] = value

    def maybe_log(self, force: bool = False) -> None:
        now = time.monotonic()
        if now - self._last_log < LOG_EVERY_S and not force:
            return
        self._last_log = now
        proc = self.processor
        c = proc.counters
        j = proc.join_counters()
        w = proc.window_counters()
        log.info(
            "messages=%d events=%d records=%d rows_written=%d dead_letters=%d pending=%d "
            "joined=%d gateway_only=%d engine_only=%d duplicates=%d duplicate_ids_changed=%d "
            "conflicts=%d "
            "windows_closed=%d "
            "corrected=%d retracted=%d quarantined=%d replayed=%d counted_before=%d flagged=%d "
            "write_retries=%d",
            c.messages, c.events, c.records, self.rows_written, c.dead_letters,
            proc.pending(), j.joined, j.gateway_only, j.engine_only, j.duplicates,
            j.duplicate_ids_changed, j.conflicts, w.windows_closed, w.corrected, w.retracted,
            c.quarantined, c.replayed, c.beyond_memory, c.flagged, self.write_retries,
        )  # fmt: skip
        skew = {h: d for h, d in proc.host_skew_ms().items() if abs(d) >= 60_000}
        if skew:
            log.warning("hosts whose clocks stand apart from their partitions (ms): %s", skew)
