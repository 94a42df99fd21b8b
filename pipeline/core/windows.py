"""Event-time tumbling windows of request records, per key and boundary.

Pure window maths on integer milliseconds (time passed in), in the manner of
quix-streams' ``get_window_ranges``:

* A record belongs to the window ``[start, start + size_ms)`` that holds its
  window time (``end_unix_ns``: the request's end on the engine's clock when the
  engine side is known, else on the gateway's).
* A record enters window state once, in final form (joined, or partial after its
  partner's timeout). When a partial is later upgraded, the partial is taken back
  (``sign`` -1) and the upgrade added: counts and sketch bins subtract exactly.
* A window closes, and is emitted once, when the partition's clock
  (:mod:`pipeline.core.eventtime`) reaches ``start + size_ms + grace_ms``. A record
  for a closed window is *late*: it goes into a **correction** of that window,
  emitted at the next flush; correction rows add to the window's rows (sketches
  merge, counts add), so what is stored always equals an exact count over the
  records. Whether a record is late depends on the order of events only.
* Every window and correction carries the ledger of the requests it counted
  (request id -> version): a worker that takes a partition over reads it back and
  never counts a request twice (see ``pipeline.core.processor``).
* Keys: ``(model, priority, ctx_bucket)`` plus the all-traffic key
  ``("*", "*", "*")``. At most ``max_keys`` distinct keys per window; further
  keys fold into ``("__other__", "*", "*")`` (counted).
* A record's boundary values are buffered per key as one row (a tuple, from one
  C call) and added to the key's sketches in vectorised batches, in record order
  per key (and over all keys for the all-traffic key).

Longer windows (1 min, 5 min, 1 h) are merges of these base windows
(:func:`rollup_start`), in the stream and in ClickHouse alike.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Final, Protocol

import numpy as np

from pipeline.core.ledger import RETRACTED, code_order
from pipeline.core.record import BOUNDARIES, RequestRecord, attempt_key
from pipeline.core.sketch import QuantileSketch, SketchColumns

ALL: Final = "*"
OTHER_MODEL: Final = "__other__"
ALL_KEY: Final = (ALL, ALL, ALL)
OTHER_KEY: Final = (OTHER_MODEL, ALL, ALL)
_FLUSH_ROWS: Final = 2048
_BOUNDARY_VALUES: Final = attrgetter(*BOUNDARIES)  # a record's row: one value per boundary

WindowKey = tuple[str, str, str]  # (model, priority, ctx_bucket)


@dataclass(frozen=True, slots=True)
class WindowConfig:
    size_ms: int = 10_000
    grace_ms: int = 30_000
    max_keys: int = 1_000
    relative_accuracy: float = 0.01

    def __post_init__(self) -> None:
        if self.size_ms <= 0:
            raise ValueError(f"windows.size_ms must be > 0, got {self.size_ms}")
        if self.grace_ms < 0:
            raise ValueError(f"windows.grace_ms must be >= 0, got {self.grace_ms}")
        if self.max_keys < 1:
            raise ValueError(f"windows.max_keys must be >= 1, got {self.max_keys}")
        if not 0.0 < self.relative_accuracy < 1.0:
            raise ValueError("windows.relative_accuracy must be in (0, 1)")


def window_start(ts_ms: int, size_ms: int) -> int:
    """Start of the tumbling window of ``size_ms`` holding ``ts_ms`` (floor, also for negatives)."""
    return ts_ms - ts_ms % size_ms


def rollup_start(start_ms: int, rollup_ms: int) -> int:
    """Start of the longer window (a multiple of the base size) a base window merges into."""
    return window_start(start_ms, rollup_ms)


_PRIORITY_LABELS: Final = tuple(str(p) for p in range(16))  # str() per record, cached


def record_key(rec: RequestRecord) -> WindowKey:
    p = rec.priority
    if p is None:
        label = "unknown"
    elif 0 <= p < 16:
        label = _PRIORITY_LABELS[p]
    else:
        label = str(p)
    return (rec.model, label, rec.ctx_bucket)


class WindowSLOs(Protocol):
    """Per-window SLO accumulator (see :mod:`pipeline.core.slo_windows`)."""

    def add(self, record: RequestRecord, sign: int = 1) -> None: ...

    def rows(self) -> list[Any]: ...


Row = tuple[float | None, ...]  # a record's boundary values, in BOUNDARIES order


@dataclass(slots=True)
class _Rows:
    """Rows of one key of one window not yet in its sketches: records added, and
    records taken back (a partial record replaced by its upgrade)."""

    added: list[Row] = field(default_factory=list)
    removed: list[Row] = field(default_factory=list)


@dataclass(slots=True)
class _Window:
    start_ms: int
    min_offset: int
    records: dict[WindowKey, int] = field(default_factory=dict)
    cells: dict[tuple[WindowKey, str], QuantileSketch] = field(default_factory=dict)
    rows: dict[WindowKey, _Rows] = field(default_factory=dict)
    slos: WindowSLOs | None = None
    dirty: bool = True  # changed since its last provisional snapshot
    # request_id -> ledger code (see ledger_code) of each record added: what a restarted
    # worker reads back so that it never counts a request twice
    ledger: dict[str, int] = field(default_factory=dict)


def ledger_code(rec: RequestRecord) -> int:
    """The version of a request that a window counted: its revision, plus 4 for an
    engine-only partial (a gateway-only one is 0/1), plus 8 once superseded by a retry
    (see ``Emitted.version``, ``pipeline.core.ledger.code_order``)."""
    return rec.revision + (4 if rec.source == "engine_only" else 0) + (8 if rec.superseded else 0)


def ledger_key(rec: RequestRecord) -> str:
    """A record's key in the ledger: its request id, with its attempt after a retry."""
    return attempt_key(rec.request_id, rec.attempt)


@dataclass(frozen=True, slots=True)
class ClosedWindow:
    """What a window emits (one partition's share of it).

    ``correction``: records that arrived after the window closed (and records taken
    back: counts and sketch bins may be negative); its rows add to the window's.
    """

    partition: int
    start_ms: int
    size_ms: int
    records: dict[WindowKey, int]
    sketches: dict[tuple[WindowKey, str], SketchColumns]
    slos: WindowSLOs | None
    correction: bool = False
    ledger: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class WindowCounters:
    records: int = 0  # records counted in a window before it closed
    corrected: int = 0  # records counted by a correction (they arrived after the close)
    retracted: int = 0  # records taken back (a partial replaced by its upgrade)
    folded_keys: int = 0
    windows_closed: int = 0
    corrections: int = 0  # correction windows emitted


class WindowAggregator:
    """Tumbling windows of one partition, plus corrections of closed ones."""

    def __init__(
        self,
        partition: int,
        config: WindowConfig | None = None,
        slo_factory: Callable[[], WindowSLOs] | None = None,
        horizon_ms: int = 0,
    ) -> None:
        self.partition = partition
        self.config = config or WindowConfig()
        self.slo_factory = slo_factory
        self.horizon_ms = horizon_ms  # windows ending at or before it are closed
        self.counters = WindowCounters()
        self._open: dict[int, _Window] = {}
        self._corrections: dict[int, _Window] = {}
        self._next_due = 0  # no open window ends before this (close guard; 0 = unknown)

    def add(self, rec: RequestRecord, lower_offset: int, sign: int = 1) -> bool:
        """Add one record (``sign`` -1: take back one added before); ``lower_offset``
        bounds the offsets its events came from.

        Returns False when the record's window is already closed: it then goes to a
        correction of that window (emitted by :meth:`take_corrections`).
        """
        size = self.config.size_ms
        start = window_start(rec.end_unix_ns // 1_000_000, size)
        late = start + size <= self.horizon_ms
        if late:
            win = self._corrections.get(start)
            if win is None:
                win = self._corrections[start] = self._new_window(start, lower_offset)
            if sign > 0:
                self.counters.corrected += 1
        else:
            win = self._open.get(start)
            if win is None:
                win = self._open[start] = self._new_window(start, lower_offset)
                if start + size < self._next_due or not self._next_due:
                    self._next_due = start + size
            elif lower_offset >= 0 and lower_offset < win.min_offset:
                win.min_offset = lower_offset
            if sign > 0:
                self.counters.records += 1
        if sign < 0:
            self.counters.retracted += 1
        key = record_key(rec)
        if key not in win.records and len(win.records) >= self.config.max_keys + 1:
            self.counters.folded_keys += 1
            key = OTHER_KEY
        records = win.records
        records[key] = records.get(key, 0) + sign
        records[ALL_KEY] = records.get(ALL_KEY, 0) + sign
        row = _BOUNDARY_VALUES(rec)
        rows = win.rows
        for k in (key, ALL_KEY):
            pending = rows.get(k)
            if pending is None:
                pending = rows[k] = _Rows()
            if sign > 0:
                pending.added.append(row)
                if len(pending.added) >= _FLUSH_ROWS:
                    self._flush(win, k, pending)
            else:
                pending.removed.append(row)
        if win.slos is not None:
            win.slos.add(rec, sign)
        # The ledger of this window: what the store counts of the request once it is
        # written. A take-back is recorded too (its version, marked RETRACTED): the add
        # that replaces it may land in another window, written later; a worker resuming
        # in between must not take the old version back a second time.
        lk = rec.request_id if rec.attempt == 1 else ledger_key(rec)
        code = ledger_code(rec) if sign > 0 else ledger_code(rec) | RETRACTED
        ledger = win.ledger
        have = ledger.get(lk)
        if have is None or code_order(code) > code_order(have):
            ledger[lk] = code
        win.dirty = True
        return not late

    def _flush(self, win: _Window, key: WindowKey, pending: _Rows) -> None:
        """Add a key's buffered rows to its sketches (one per boundary), in order."""
        for rows, sign in ((pending.added, 1), (pending.removed, -1)):
            if not rows:
                continue
            table = np.array(rows, dtype=np.float64)  # None -> NaN
            rows.clear()
            for j, name in enumerate(BOUNDARIES):
                column = table[:, j]
                values = column[~np.isnan(column)]
                if not values.size:
                    continue
                sketch = win.cells.get((key, name))
                if sketch is None:
                    sketch = win.cells[(key, name)] = QuantileSketch(self.config.relative_accuracy)
                if sign > 0:
                    sketch.add_many(values)
                else:
                    sketch.remove_many(values)

    def _new_window(self, start: int, lower_offset: int) -> _Window:
        win = _Window(start, lower_offset if lower_offset >= 0 else 1 << 62)
        if self.slo_factory is not None:
            win.slos = self.slo_factory()
        return win

    def add_many(self, records: Iterable[RequestRecord], lower_offset: int) -> None:
        for rec in records:
            self.add(rec, lower_offset)

    def close(self, watermark_ms: int, hold_ms: int | None = None) -> list[ClosedWindow]:
        """Close every window whose end + grace is at or before the watermark.

        ``hold_ms``: an event time a pending record may still end at (the oldest
        unresolved join); its window and later ones stay open whatever the watermark.
        Cheap when nothing is due (called after every event).
        """
        horizon = watermark_ms - self.config.grace_ms
        if horizon <= self.horizon_ms:
            return []
        if hold_ms is not None:
            horizon = min(horizon, window_start(hold_ms, self.config.size_ms))
            if horizon <= self.horizon_ms:
                return []
        self.horizon_ms = horizon
        if not self._open or horizon < self._next_due:
            return []
        size = self.config.size_ms
        due = sorted(s for s in self._open if s + size <= horizon)
        out = [self._emit(self._open.pop(s)) for s in due]
        self._next_due = min((s + size for s in self._open), default=0)
        return out

    def take_corrections(self) -> list[ClosedWindow]:
        """Corrections gathered since the last call (one per window start)."""
        if not self._corrections:
            return []
        out = []
        for s in sorted(self._corrections):
            win = self._corrections[s]
            self.counters.corrections += 1
            out.append(self._snapshot(win, correction=True))
        self._corrections = {}
        return out

    def provisional(self, watermark_ms: int) -> list[ClosedWindow]:
        """Snapshots of the open windows that have *ended* at ``watermark_ms`` (still in
        their grace period) and changed since their last snapshot; nothing is closed.

        For decisions that cannot wait for the grace period (the controller): a late
        record still goes into the window, and the final, closed window supersedes
        every snapshot of it.
        """
        size = self.config.size_ms
        out = []
        for start in sorted(self._open):
            win = self._open[start]
            if start + size <= watermark_ms and win.dirty:
                win.dirty = False
                out.append(self._snapshot(win, with_ledger=False))
        return out

    def drain(self) -> list[ClosedWindow]:
        """End of input: close everything (and emit pending corrections)."""
        out = [self._emit(self._open.pop(s)) for s in sorted(self._open)]
        if out:
            self.horizon_ms = max(self.horizon_ms, out[-1].start_ms + self.config.size_ms)
        self._next_due = 0
        return out + self.take_corrections()

    def _emit(self, win: _Window) -> ClosedWindow:
        self.counters.windows_closed += 1
        return self._snapshot(win)

    def _snapshot(
        self, win: _Window, *, correction: bool = False, with_ledger: bool = True
    ) -> ClosedWindow:
        for key, pending in win.rows.items():
            self._flush(win, key, pending)
        sketches = {ck: sketch.to_columns() for ck, sketch in win.cells.items()}
        return ClosedWindow(
            self.partition, win.start_ms, self.config.size_ms, dict(win.records), sketches,
            win.slos, correction, win.ledger if with_ledger else {},
        )  # fmt: skip

    def min_open_offset(self) -> int | None:
        """Smallest source offset that any open window (or pending correction) still
        depends on."""
        wins = [*self._open.values(), *self._corrections.values()]
        if not wins:
            return None
        return min(w.min_offset for w in wins)

    @property
    def open_windows(self) -> int:
        return len(self._open)
