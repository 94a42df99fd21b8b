"""The ``window_sketches`` table (the materialized views' base: rollups, SLO counts, the
ledger): the rows of closed windows and corrections, and their writer.

One named row format per table, next to the column list it fills: rows are built by field
name (keyword arguments, attributes), never as positional tuples elsewhere.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pipeline.adapters.sketch_sql import SKETCH_COLUMNS
from pipeline.core.sketch import SketchColumns
from pipeline.core.window_counts import ClockSkewRow, RequestCountRow
from pipeline.core.windows import ClosedWindow, WindowKey

from .inserts import _insert_columns
from .protocol import Store

# The named fields of one SLO's counts in a window's ``__slo__`` row (a Map value).
SLO_COUNT_FIELDS: tuple[tuple[str, str], ...] = (
    ("kind", "String"),
    ("boundary", "String"),
    ("threshold_ms", "Float64"),
    ("objective", "Float64"),
    ("total", "Int64"),
    ("good", "Int64"),
    ("good_secondary_only", "Int64"),
    ("secondary_weight", "Float64"),
)
_SLO_COUNT_TYPE = ", ".join(f"{n} {t}" for n, t in SLO_COUNT_FIELDS)
# The named fields of the report's counts on a window's ``__slo__`` row (sql/0018): one
# tuple per RequestCountRow, SLOBadRow and ClockSkewRow (their fields, by name; "" for a
# missing priority, control mode or verdict: the rollups' keys hold no NULL).
REQUEST_COUNT_FIELDS: tuple[tuple[str, str], ...] = (
    ("source", "String"),
    ("outcome", "String"),
    ("model", "String"),
    ("priority", "String"),
    ("control_mode", "String"),
    ("control_verdict", "String"),
    ("requests", "Int64"),
)
SLO_BAD_FIELDS: tuple[tuple[str, str], ...] = (
    ("slo", "String"),
    ("model", "String"),
    ("bad_measured", "Int64"),
    ("bad_queue_ms", "Float64"),
    ("bad_ms", "Float64"),
)
CLOCK_SKEW_FIELDS: tuple[tuple[str, str], ...] = (
    ("model", "String"),
    ("gateway_host", "String"),
    ("engine_host", "String"),
    ("offset_buckets", "Array(Int64)"),  # pipeline.core.skew.offset_bucket: 0.1 ms
    ("counts", "Array(Int64)"),
)


def _array_of(fields: tuple[tuple[str, str], ...]) -> str:
    return f"Array(Tuple({', '.join(f'{n} {t}' for n, t in fields)}))"


WINDOW_COLUMNS: tuple[tuple[str, str], ...] = (
    ("window_start", "DateTime64(3, 'UTC')"),
    ("window_ms", "UInt32"),
    ("source_topic", "LowCardinality(String)"),
    ("partition", "UInt16"),
    ("correction", "UInt8"),
    ("model", "LowCardinality(String)"),
    ("priority", "LowCardinality(String)"),
    ("ctx_bucket", "LowCardinality(String)"),
    ("boundary", "LowCardinality(String)"),
    ("relative_accuracy", "Float64"),
    ("records", "Int64"),
    *SKETCH_COLUMNS,  # the sketch's own columns, in their order (WindowRow.sketch)
    ("slo_counts", f"Map(String, Tuple({_SLO_COUNT_TYPE}))"),
    ("through_offset", "Int64"),
    ("ledger_ids", "Array(String)"),
    ("ledger_versions", "Array(UInt8)"),
    ("counts_kept", "UInt8"),
    ("request_counts", _array_of(REQUEST_COUNT_FIELDS)),
    ("slo_bad", _array_of(SLO_BAD_FIELDS)),
    ("clock_skew", _array_of(CLOCK_SKEW_FIELDS)),
)
SLO_ROW_BOUNDARY = "__slo__"
_SKETCH_NAMES = frozenset(n for n, _ in SKETCH_COLUMNS)
_NO_SKETCH = SketchColumns(0, 0.0, math.inf, -math.inf, 0, [], [], [], [])


@dataclass(frozen=True, slots=True)
class WindowRow:
    """One ``window_sketches`` row (:data:`WINDOW_COLUMNS`): the sketch of one (key,
    boundary) of a window or correction, or the window's ``__slo__`` row (no sketch; its
    SLO counts, ledger and ``through_offset``)."""

    window_start: datetime
    window_ms: int
    source_topic: str
    partition: int
    correction: int  # 0: the window as it closed, 1: a correction of it
    model: str
    priority: str
    ctx_bucket: str
    boundary: str
    relative_accuracy: float
    records: int
    sketch: SketchColumns  # the SKETCH_COLUMNS, read by name
    slo_counts: dict[str, tuple[Any, ...]]  # SLO name -> SLO_COUNT_FIELDS values
    through_offset: int
    ledger_ids: list[str]
    ledger_versions: list[int]
    counts_kept: int  # 1: the next three are the window's ('__slo__' rows; 0: not counted)
    request_counts: list[tuple[Any, ...]]  # REQUEST_COUNT_FIELDS values
    slo_bad: list[tuple[Any, ...]]  # SLO_BAD_FIELDS values
    clock_skew: list[tuple[Any, ...]]  # CLOCK_SKEW_FIELDS values


def _stored(v: Any) -> Any:
    """A count key's value as stored: "" for None, a priority as its digits."""
    return "" if v is None else str(v) if isinstance(v, int) else v


def _count_tuple(r: RequestCountRow) -> tuple[Any, ...]:
    return tuple(_stored(getattr(r, n)) for n, _ in REQUEST_COUNT_FIELDS)


def _skew_tuple(r: ClockSkewRow) -> tuple[Any, ...]:
    return tuple(getattr(r, n) for n, _ in CLOCK_SKEW_FIELDS)


def _row_constants(win: ClosedWindow, topic: str, relative_accuracy: float) -> dict[str, Any]:
    """The fields every row of ``win`` shares, by name."""
    return {
        "window_start": datetime.fromtimestamp(win.start_ms / 1000, tz=UTC),
        "window_ms": win.size_ms,
        "source_topic": topic,
        "partition": win.partition,
        "correction": 1 if win.correction else 0,  # 0: the window as it closed
        "relative_accuracy": relative_accuracy,
    }


def _stored_cells(win: ClosedWindow) -> list[tuple[tuple[WindowKey, str], SketchColumns]]:
    """The (key, boundary) sketches of ``win`` that get a row, in row order."""
    return [
        (kb, c)
        for kb, c in sorted(win.sketches.items())
        # a cell whose additions and retractions cancelled out has nothing to store
        if c.count or c.pos_keys or c.neg_keys or c.zero_count
    ]


def _slo_row_fields(win: ClosedWindow, through_offset: int) -> dict[str, Any]:
    """The fields of the ``__slo__`` row of ``win`` that are not :func:`_row_constants`."""
    counts = win.slos.rows() if win.slos is not None else []
    return {
        "model": "*",
        "priority": "*",
        "ctx_bucket": "*",
        "boundary": SLO_ROW_BOUNDARY,
        "records": win.records.get(("*", "*", "*"), 0),
        "sketch": _NO_SKETCH,
        "slo_counts": {r.slo: tuple(getattr(r, n) for n, _ in SLO_COUNT_FIELDS) for r in counts},
        "through_offset": through_offset,
        "ledger_ids": list(win.ledger),
        "ledger_versions": list(win.ledger.values()),  # in the same (insertion) order
        "counts_kept": 0 if win.counts is None else 1,
        "request_counts": [] if win.counts is None
        else [_count_tuple(r) for r in win.counts.count_rows()],
        "slo_bad": [tuple(getattr(r, n) for n, _ in SLO_BAD_FIELDS) for r in win.slos.bad_rows()]
        if win.slos is not None
        else [],
        "clock_skew": [] if win.counts is None
        else [_skew_tuple(r) for r in win.counts.skew_rows()],
    }  # fmt: skip


def window_rows(
    win: ClosedWindow, topic: str, relative_accuracy: float, through_offset: int = 0
) -> list[WindowRow]:
    """Rows of one window or correction: one per (key, boundary), plus its ``__slo__``
    row (SLO counts, and the ledger of the requests counted, with ``through_offset``:
    the partition's input below it is accounted for by this insert and earlier ones)."""
    const = _row_constants(win, topic, relative_accuracy)
    rows = [
        WindowRow(
            **const,
            model=key[0],
            priority=key[1],
            ctx_bucket=key[2],
            boundary=boundary,
            records=win.records.get(key, 0),
            sketch=c,
            slo_counts={},
            through_offset=0,
            ledger_ids=[],
            ledger_versions=[],
            counts_kept=0,
            request_counts=[],
            slo_bad=[],
            clock_skew=[],
        )
        for (key, boundary), c in _stored_cells(win)
    ]
    rows.append(WindowRow(**const, **_slo_row_fields(win, through_offset)))
    return rows


def window_columns(rows: Sequence[WindowRow]) -> list[list[Any]]:
    """The :data:`WINDOW_COLUMNS` of ``rows``, by name (the sketch's from ``row.sketch``)."""
    sketches = [r.sketch for r in rows]
    return [
        list(map(operator.attrgetter(n), sketches if n in _SKETCH_NAMES else rows))
        for n, _ in WINDOW_COLUMNS
    ]


def windows_columns(
    windows: Sequence[ClosedWindow],
    topic: str,
    relative_accuracy: float,
    through_offsets: dict[int, int],
) -> list[list[Any]]:
    """``window_columns`` of the :func:`window_rows` of ``windows`` (``through_offsets``
    per partition), built column by column without a :class:`WindowRow` per row (a frozen
    dataclass costs ~5 µs to build; a test keeps the two equal)."""
    out: dict[str, list[Any]] = {n: [] for n, _ in WINDOW_COLUMNS}
    for win in windows:
        cells = _stored_cells(win)
        slo = _slo_row_fields(win, through_offsets.get(win.partition, 0))
        n = len(cells) + 1
        for name, value in _row_constants(win, topic, relative_accuracy).items():
            out[name] += [value] * n
        keys = [key for (key, _), _ in cells]
        by_cell: dict[str, list[Any]] = {
            "model": [k[0] for k in keys],
            "priority": [k[1] for k in keys],
            "ctx_bucket": [k[2] for k in keys],
            "boundary": [b for (_, b), _ in cells],
            "records": [win.records.get(k, 0) for k in keys],
            # one empty value shared by the cells' rows (the driver only reads them)
            "slo_counts": [{}] * len(cells),
            "through_offset": [0] * len(cells),
            "ledger_ids": [[]] * len(cells),
            "ledger_versions": [[]] * len(cells),
            "counts_kept": [0] * len(cells),
            "request_counts": [[]] * len(cells),
            "slo_bad": [[]] * len(cells),
            "clock_skew": [[]] * len(cells),
        }
        for name, values in by_cell.items():
            out[name] += values
            out[name].append(slo[name])
        sketches = [c for _, c in cells]
        sketches.append(slo["sketch"])
        for name in _SKETCH_NAMES:
            out[name] += map(operator.attrgetter(name), sketches)
    return [out[n] for n, _ in WINDOW_COLUMNS]


def write_windows(
    store: Store,
    windows: Sequence[ClosedWindow],
    topic: str,
    relative_accuracy: float,
    token: str,
    *,
    through_offsets: dict[int, int] | None = None,
) -> None:
    """Windows and corrections as one insert (atomic: sketches, SLO counts and the
    ledger together). ``through_offsets``: per partition, the next input offset at
    the time the batch was cut (see :func:`read_ledger`).

    ``token`` makes a retry of the same batch a no-op (insert deduplication,
    also for the materialized views fed by this table).
    """
    if windows:
        columns = windows_columns(windows, topic, relative_accuracy, through_offsets or {})
        _insert_columns(store, "window_sketches", WINDOW_COLUMNS, columns, token)
