"""What a worker tells the controller, on the summaries topic: the final summary of each
window it stored, each partition's close horizon (``Progress``), provisional snapshots of
ended, still-open windows with each partition's clock, and the engines' stats samples.
The controller itself runs in :mod:`pipeline.adapters.controller`."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

from pipeline.adapters.store import Checkpoint
from pipeline.contract.codec import DeadLetter, SourceRef, decode_message
from pipeline.contract.events import EngineStats
from pipeline.contract.summary import Progress, StatsSample, WindowSummary, encode_summary
from pipeline.core.summary import summarize
from pipeline.core.windows import ClosedWindow


class SummariesPort(Protocol):
    """The summaries topic's producer (:class:`pipeline.adapters.reliable.ReliableProducer`)."""

    def send(self, value: bytes) -> None: ...

    def flush(self, stop: threading.Event | None = None) -> None: ...


class ControlFeed:
    """The summaries a worker sends (from the event loop and the writer thread)."""

    def __init__(
        self,
        summaries: SummariesPort,
        relative_accuracy: float,
        on_stored: Callable[[Sequence[WindowSummary]], None] | None = None,
    ) -> None:
        self.summaries = summaries
        self.relative_accuracy = relative_accuracy
        # the final summaries sent, also given here (the worker's /metrics counters)
        self.on_stored = on_stored
        self._progress_sent: dict[int, int] = {}  # per partition: the last horizon sent

    def windows_stored(
        self, windows: Sequence[ClosedWindow], checkpoints: Sequence[Checkpoint]
    ) -> None:
        """Windows stored (their final summaries) and the horizons the flush checkpoints
        (sent once per change); on the writer thread, before the flush's commit."""
        sent: list[WindowSummary] = []
        for win in windows:
            cid = uuid.uuid4().hex[:16] if win.correction else None
            summary = summarize(win, self.relative_accuracy, correction_id=cid)
            self.summaries.send(encode_summary(summary))
            sent.append(summary)
        if self.on_stored is not None and sent:
            self.on_stored(sent)
        for c in checkpoints:
            if self._progress_sent.get(c.partition) != c.close_horizon_ms:
                self.summaries.send(encode_summary(Progress(c.partition, c.close_horizon_ms)))
                self._progress_sent[c.partition] = c.close_horizon_ms

    def flush(self, stop: threading.Event | None = None) -> None:
        """Wait for the broker to acknowledge what was sent (gives up at ``stop``)."""
        self.summaries.flush(stop)

    def provisional(
        self,
        snapshots: Iterable[ClosedWindow],
        clocks: Mapping[int, int],
        unwritten: Iterable[ClosedWindow],
    ) -> None:
        """Snapshots of ended, still-open windows + each partition's clock.

        Lets the controller decide a few hundred ms after a window ends instead of after
        the grace period (``control_provisional_ms``). A partition's clock is capped at
        the start of its earliest window (or correction) that is closed but ``unwritten``
        (including those of the write in progress: its summary follows the write), so
        the controller never decides past a window or a correction it lacks."""
        acc = self.relative_accuracy
        for win in snapshots:
            self.summaries.send(encode_summary(summarize(win, acc, final=False)))
        cap: dict[int, int] = {}
        for win in unwritten:
            cap[win.partition] = min(cap.get(win.partition, win.start_ms), win.start_ms)
        for p, clock in clocks.items():
            capped = min(clock, cap.get(p, clock))
            self.summaries.send(encode_summary(Progress(p, self._progress_sent.get(p, 0), capped)))

    def stats(
        self, messages: Iterable[tuple[int, int, bytes]], topic: str, max_bytes: int
    ) -> list[DeadLetter]:
        """Messages of the engine stats ``topic`` (partition, offset, value), forwarded as
        stats samples (one topic for all the controller needs); the dead letters of those
        that are not valid."""
        dead: list[DeadLetter] = []
        for p, off, raw in messages:
            decoded = decode_message(raw, SourceRef(topic, p, off), max_bytes=max_bytes)
            for ev in decoded.events:
                if isinstance(ev, EngineStats):
                    self.summaries.send(encode_summary(StatsSample.of(ev)))
            dead.extend(decoded.dead)
        return dead
