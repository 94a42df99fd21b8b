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
* Adds are buffered and applied per batch, vectorised (see :class:`WindowAggregator`):
  a record's boundary values become one row of a numpy table, buffered per key and
  added to the key's sketches in batches, in record order per key (and over all keys
  for the all-traffic key); SLO counts are numpy masks over the batch's columns
  (:meth:`pipeline.core.slo.SLOMatcher.classify_many`).

Longer windows (1 min, 5 min, 1 h) are merges of these base windows
(:func:`rollup_start`), in the stream and in ClickHouse alike.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import numpy as np

from pipeline.core.ledger import RETRACTED, code_order
from pipeline.core.record import BOUNDARIES, RequestRecord, attempt_key
from pipeline.core.sketch import FloatArray, IntArray, QuantileSketch, SketchColumns
from pipeline.core.slo import BoolArray, RecordColumns
from pipeline.core.window_counts import RequestCounts

ALL: Final = "*"
OTHER_MODEL: Final = "__other__"
ALL_KEY: Final = (ALL, ALL, ALL)
OTHER_KEY: Final = (OTHER_MODEL, ALL, ALL)
_FLUSH_ROWS: Final = 2048
_NO_OFFSET: Final = 1 << 62

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

    def add_batch(self, cols: RecordColumns, rows: IntArray, signs: IntArray) -> None: ...

    def rows(self) -> list[Any]: ...

    def bad_rows(self) -> list[Any]: ...


@dataclass(slots=True)
class _Rows:
    """Boundary values of one key of one window not yet in its sketches: tables of
    records added, and of records taken back (a partial replaced by its upgrade), in
    record order."""

    added: list[FloatArray] = field(default_factory=list)
    removed: list[FloatArray] = field(default_factory=list)
    n_added: int = 0


@dataclass(slots=True)
class _Window:
    start_ms: int
    min_offset: int
    records: dict[WindowKey, int] = field(default_factory=dict)
    # of those, the clients' retries (client_attempt > 0): demand counts a request once
    retries: dict[WindowKey, int] = field(default_factory=dict)
    # of those, the ones answered (outcome ok): what was served, seen at the gateway
    answered: dict[WindowKey, int] = field(default_factory=dict)
    cells: dict[tuple[WindowKey, str], QuantileSketch] = field(default_factory=dict)
    rows: dict[WindowKey, _Rows] = field(default_factory=dict)
    slos: WindowSLOs | None = None
    # what a report counts besides latency and SLOs (pipeline.core.window_counts)
    counts: RequestCounts = field(default_factory=RequestCounts)
    dirty: bool = True  # changed since its last provisional snapshot
    # request_id -> ledger code (see ledger_code) of each record added: what a restarted
    # worker reads back so that it never counts a request twice
    ledger: dict[str, int] = field(default_factory=dict)


def _count_flagged(
    counts: dict[WindowKey, int],
    flagged: BoolArray,
    *,
    slots: IntArray,
    keys: list[WindowKey],
    signs: IntArray,
) -> None:
    """Add the records ``flagged`` (one flag per row of a window's batch) to the window's
    ``counts``, per key (``slots``: each row's index in ``keys``) and in all traffic: the
    clients' retries (``client_attempt > 0``), the records answered (outcome ok)."""
    if not flagged.any():
        return
    weights = signs * flagged
    per_key = np.bincount(slots, weights=weights, minlength=len(keys)).astype(np.int64)
    for k, cnt in zip(keys, per_key.tolist(), strict=True):
        if cnt:
            counts[k] = counts.get(k, 0) + cnt
    counts[ALL_KEY] = counts.get(ALL_KEY, 0) + int(weights.sum())


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
    # of ``records``, the clients' retries (``client_attempt > 0``), keys with none omitted
    retries: dict[WindowKey, int] = field(default_factory=dict)
    # of ``records``, those answered (outcome ok), keys with none omitted
    answered: dict[WindowKey, int] = field(default_factory=dict)
    # per source, outcome, ..., and host pair (None: not counted, a window built elsewhere)
    counts: RequestCounts | None = None


@dataclass(slots=True)
class WindowCounters:
    records: int = 0  # records counted in a window before it closed
    corrected: int = 0  # records counted by a correction (they arrived after the close)
    retracted: int = 0  # records taken back (a partial replaced by its upgrade)
    folded_keys: int = 0
    windows_closed: int = 0
    corrections: int = 0  # correction windows emitted


# An add not yet applied to its window: (record, window start, sign, lower offset, late)
_Pending = tuple[RequestRecord, int, int, int, bool]


@dataclass(frozen=True, slots=True)
class _Batch:
    """The buffered adds of one flush, as columns (index = position in the buffer)."""

    cols: RecordColumns
    signs: IntArray
    offsets: tuple[int, ...]  # lower offsets
    key_ids: IntArray  # index into labels
    labels: list[WindowKey]
    ledger_keys: list[str]
    codes: list[int]  # ledger codes (RETRACTED for a take-back)


def _ledger_codes(cols: RecordColumns, signs: IntArray) -> tuple[list[str], list[int]]:
    """Each record's ledger key and code (``ledger_code``; RETRACTED for a take-back)."""
    rids: list[str] = cols.column("request_id")
    attempts: list[int] = cols.column("attempt")
    if attempts.count(1) == len(attempts):
        keys = rids
    else:
        keys = [attempt_key(r, a) for r, a in zip(rids, attempts, strict=True)]
    codes = (
        np.array(cols.column("revision"), dtype=np.int64)
        + 4 * cols.equal("source", "engine_only")
        + 8 * cols.equal("superseded", True)
    )
    codes[signs < 0] |= RETRACTED
    return keys, codes.tolist()


class WindowAggregator:
    """Tumbling windows of one partition, plus corrections of closed ones.

    :meth:`add` only decides whether a record is late (``horizon_ms`` moves in
    :meth:`close` only, so the decision is final) and buffers it; the buffer is applied
    to the windows, per batch and vectorised (keys, counts, ledgers, SLO counts, sketch
    rows), before anything reads or closes a window. The windows are exactly those of
    applying each add at once, in order.
    """

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
        self._counters = WindowCounters()
        self._open: dict[int, _Window] = {}
        self._corrections: dict[int, _Window] = {}
        # no open window (nor buffered add to one) ends before this (close guard)
        self._next_due: int | None = None
        self._pending: list[_Pending] = []
        self._key_labels: dict[tuple[str, int | None, str], WindowKey] = {}

    @property
    def counters(self) -> WindowCounters:
        self._apply_pending()
        return self._counters

    def add(
        self, rec: RequestRecord, lower_offset: int, sign: int = 1, *, written: bool = False
    ) -> bool:
        """Add one record (``sign`` -1: take back one added before); ``lower_offset``
        bounds the offsets its events came from.

        Returns False when the record's window is already closed: it then goes to a
        correction of that window (emitted by :meth:`take_corrections`).

        ``written``: a take-back of a version an earlier owner of the partition counted
        (the store holds it, this aggregator does not). It always goes to a correction,
        emitted with the next :meth:`take_corrections`, even when its window is open
        here: held in an open window, it could be lost on a rebalance after the add
        replacing it (in an earlier window that closes first) was written, and the
        store would count both versions (the ledger then says only the add's).
        """
        size = self.config.size_ms
        end_ms = rec.end_unix_ns // 1_000_000
        end = end_ms - end_ms % size + size
        late = written or end <= self.horizon_ms
        if not late and (self._next_due is None or end < self._next_due):
            self._next_due = end
        self._pending.append((rec, end - size, sign, lower_offset, late))
        return not late

    def add_many(self, records: Iterable[RequestRecord], lower_offset: int) -> None:
        for rec in records:
            self.add(rec, lower_offset)

    def _apply_pending(self) -> None:
        """Apply the buffered adds to their windows (and corrections), per window."""
        pending = self._pending
        if not pending:
            return
        self._pending = []
        recs, starts, sign_list, offset_list, lates = zip(*pending, strict=True)
        n = len(recs)
        cols = RecordColumns(recs)
        signs = np.array(sign_list, dtype=np.int64)
        # window keys: one label per distinct (model, priority, ctx_bucket) of the batch
        raw = list(zip(cols.column("model"), cols.column("priority"),
                       cols.column("ctx_bucket"), strict=True))  # fmt: skip
        raw_ids = {k: i for i, k in enumerate(dict.fromkeys(raw))}
        labels = [self._label(k) for k in raw_ids]
        key_ids = np.fromiter(map(raw_ids.__getitem__, raw), np.int64, n)
        batch = _Batch(cols, signs, offset_list, key_ids, labels, *_ledger_codes(cols, signs))
        groups = list(zip(lates, starts, strict=True))
        group_ids = dict.fromkeys(groups)
        if len(group_ids) == 1:
            self._apply_window(groups[0], np.arange(n), batch)
            return
        ids = {g: i for i, g in enumerate(group_ids)}
        gid = np.fromiter(map(ids.__getitem__, groups), np.int64, n)
        order = np.argsort(gid, kind="stable")
        bounds = np.cumsum(np.bincount(gid, minlength=len(ids)))
        lo = 0
        for g, hi in zip(group_ids, bounds.tolist(), strict=True):
            self._apply_window(g, order[lo:hi], batch)
            lo = hi

    def _label(self, raw: tuple[str, int | None, str]) -> WindowKey:
        label = self._key_labels.get(raw)
        if label is None:
            model, p, bucket = raw
            prio = "unknown" if p is None else _PRIORITY_LABELS[p] if 0 <= p < 16 else str(p)
            label = self._key_labels[raw] = (model, prio, bucket)
        return label

    def _apply_window(self, group: tuple[bool, int], rows: IntArray, batch: _Batch) -> None:
        """Apply the adds ``rows`` (indexes into the batch, in record order) of one window."""
        late, start = group
        offsets = batch.offsets
        row_list: list[int] = rows.tolist()
        first_offset = offsets[row_list[0]]
        table = self._corrections if late else self._open
        win = table.get(start)
        if win is None:
            win = table[start] = self._new_window(start, first_offset)
        s = batch.signs[rows]
        added = int(np.count_nonzero(s > 0))
        c = self._counters
        if late:
            c.corrected += added
        else:
            c.records += added
            low = min((o for o in map(offsets.__getitem__, row_list) if o >= 0), default=None)
            if low is not None and low < win.min_offset:
                win.min_offset = low
        c.retracted += len(row_list) - added
        slots, keys = self._fold(win, batch.key_ids[rows], batch.labels)
        # counts per key, and every record in the all-traffic key
        per_slot = np.bincount(slots, weights=s, minlength=len(keys)).astype(np.int64).tolist()
        records = win.records
        for k, cnt in zip(keys, per_slot, strict=True):
            records[k] += cnt
        records[ALL_KEY] += int(s.sum())
        attempts = batch.cols.column("client_attempt")
        retried = np.fromiter((attempts[i] > 0 for i in row_list), np.bool_, len(row_list))
        _count_flagged(win.retries, retried, slots=slots, keys=keys, signs=s)
        ok = batch.cols.equal("outcome", "ok")[rows]
        _count_flagged(win.answered, ok, slots=slots, keys=keys, signs=s)
        # sketch rows per key, in record order
        values = batch.cols.values[rows]
        order = np.argsort(slots, kind="stable")
        bounds = np.cumsum(np.bincount(slots, minlength=len(keys))).tolist()
        lo = 0
        for k, hi in zip(keys, bounds, strict=True):
            if hi > lo:
                idx = order[lo:hi]
                self._buffer_rows(win, k, values[idx], s[idx])
            lo = hi
        self._buffer_rows(win, ALL_KEY, values, s)
        if win.slos is not None:
            win.slos.add_batch(batch.cols, rows, s)
        win.counts.add_batch(batch.cols, rows, s)
        self._ledger(win, row_list, batch.ledger_keys, batch.codes)
        win.dirty = True

    def _fold(
        self, win: _Window, key_ids: IntArray, labels: list[WindowKey]
    ) -> tuple[IntArray, list[WindowKey]]:
        """Each record's key in the window (a slot of the returned keys): a key is admitted
        while the window holds fewer than ``max_keys + 1`` keys (the all-traffic key
        counted), in the order records meet it; later new keys fold into OTHER_KEY."""
        records = win.records
        limit = self.config.max_keys + 1
        uniq, first = np.unique(key_ids, return_index=True)
        keys: list[WindowKey] = []
        slot_of: dict[WindowKey, int] = {}
        remap = np.zeros(len(labels), dtype=np.int64)
        folded = np.zeros(len(labels), dtype=np.bool_)
        for kid in uniq[np.argsort(first)].tolist():
            key = labels[kid]
            if key not in records:
                if len(records) >= limit:
                    folded[kid] = True
                    key = OTHER_KEY
                records.setdefault(key, 0)
                records.setdefault(ALL_KEY, 0)  # after the window's first key, as per record
            slot = slot_of.get(key)
            if slot is None:
                slot = slot_of[key] = len(keys)
                keys.append(key)
            remap[kid] = slot
        self._counters.folded_keys += int(np.count_nonzero(folded[key_ids]))
        return remap[key_ids], keys

    def _buffer_rows(self, win: _Window, key: WindowKey, values: FloatArray, s: IntArray) -> None:
        pending = win.rows.get(key)
        if pending is None:
            pending = win.rows[key] = _Rows()
        if bool((s > 0).all()):
            pending.added.append(values)
            pending.n_added += len(values)
        else:
            plus = s > 0
            if plus.any():
                pending.added.append(values[plus])
                pending.n_added += int(np.count_nonzero(plus))
            pending.removed.append(values[~plus])
        if pending.n_added >= _FLUSH_ROWS:
            self._flush(win, key, pending)

    @staticmethod
    def _ledger(win: _Window, rows: list[int], keys: list[str], codes: list[int]) -> None:
        """The ledger of this window: what the store counts of each request once it is
        written. A take-back is recorded too (its version, marked RETRACTED): the add
        that replaces it may land in another window, written later; a worker resuming
        in between must not take the old version back a second time."""
        if len(rows) < len(keys):
            keys = [keys[i] for i in rows]
            codes = [codes[i] for i in rows]
        ledger = win.ledger
        if len(set(keys)) == len(keys) and ledger.keys().isdisjoint(keys):
            ledger.update(zip(keys, codes, strict=True))
            return
        for lk, code in zip(keys, codes, strict=True):
            have = ledger.get(lk)
            if have is None or code_order(code) > code_order(have):
                ledger[lk] = code

    def _flush(self, win: _Window, key: WindowKey, pending: _Rows) -> None:
        """Add a key's buffered rows to its sketches (one per boundary), in order."""
        for chunks, sign in ((pending.added, 1), (pending.removed, -1)):
            if not chunks:
                continue
            table = chunks[0] if len(chunks) == 1 else np.concatenate(chunks)
            chunks.clear()
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
        pending.n_added = 0

    def _new_window(self, start: int, lower_offset: int) -> _Window:
        win = _Window(start, lower_offset if lower_offset >= 0 else _NO_OFFSET)
        if self.slo_factory is not None:
            win.slos = self.slo_factory()
        return win

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
        if self._next_due is None or horizon < self._next_due:
            return []
        self._apply_pending()
        size = self.config.size_ms
        due = sorted(s for s in self._open if s + size <= horizon)
        out = [self._emit(self._open.pop(s)) for s in due]
        self._next_due = min((s + size for s in self._open), default=None)
        return out

    def take_corrections(self) -> list[ClosedWindow]:
        """Corrections gathered since the last call (one per window start)."""
        self._apply_pending()
        if not self._corrections:
            return []
        out = []
        for s in sorted(self._corrections):
            win = self._corrections[s]
            self._counters.corrections += 1
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
        self._apply_pending()
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
        self._apply_pending()
        out = [self._emit(self._open.pop(s)) for s in sorted(self._open)]
        if out:
            self.horizon_ms = max(self.horizon_ms, out[-1].start_ms + self.config.size_ms)
        self._next_due = None
        return out + self.take_corrections()

    def _emit(self, win: _Window) -> ClosedWindow:
        self._counters.windows_closed += 1
        return self._snapshot(win)

    def _snapshot(
        self, win: _Window, *, correction: bool = False, with_ledger: bool = True
    ) -> ClosedWindow:
        for key, pending in win.rows.items():
            self._flush(win, key, pending)
        sketches = {ck: sketch.to_columns() for ck, sketch in win.cells.items()}
        return ClosedWindow(
            self.partition, win.start_ms, self.config.size_ms, dict(win.records), sketches,
            win.slos, correction, win.ledger if with_ledger else {}, dict(win.retries),
            dict(win.answered), win.counts,
        )  # fmt: skip

    def min_open_offset(self) -> int | None:
        """Smallest source offset that any open window (or pending correction) still
        depends on."""
        self._apply_pending()
        wins = [*self._open.values(), *self._corrections.values()]
        if not wins:
            return None
        return min(w.min_offset for w in wins)

    @property
    def open_windows(self) -> int:
        self._apply_pending()
        return len(self._open)
