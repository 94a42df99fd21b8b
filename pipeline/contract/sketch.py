"""A quantile sketch as plain values: the one form it takes on every wire and row.

:class:`SketchColumns` is what a closed window holds per boundary, what a window
summary carries (named fields, :func:`sketch_record`), what a ``windows`` row stores
(``pipeline.adapters.sketch_sql.SKETCH_COLUMNS``, in the same field order) and what
:meth:`pipeline.core.sketch.QuantileSketch.from_columns` rebuilds a sketch from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Final


@dataclass(frozen=True, slots=True)
class SketchColumns:
    """A sketch as flat columns: one ClickHouse row (see ``sketch_sql.SKETCH_COLUMNS``).

    Keys are ascending, counts positive; ``count == zero_count + sum(pos_counts) +
    sum(neg_counts)``. ``neg_keys`` are the keys of ``|v|`` for negative ``v``.
    """

    count: int
    sum: float
    min: float
    max: float
    zero_count: int
    pos_keys: list[int]
    pos_counts: list[int]
    neg_keys: list[int]
    neg_counts: list[int]


# The field names, in order: the keys of a sketch on the wire (and the positions of the
# old positional form, summary v1).
SKETCH_FIELDS: Final = tuple(f.name for f in fields(SketchColumns))


def sketch_record(c: SketchColumns) -> dict[str, object]:
    """The sketch as a JSON-ready object with named fields."""
    return {name: getattr(c, name) for name in SKETCH_FIELDS}


def sketch_of_record(d: Mapping[str, object]) -> SketchColumns:
    """Inverse of :func:`sketch_record`; KeyError/TypeError/ValueError when malformed."""
    return _typed([d[name] for name in SKETCH_FIELDS])


def sketch_of_positional(v: Sequence[object]) -> SketchColumns:
    """A sketch in the old positional form (``[count, sum, min, max, zero_count,
    pos_keys, pos_counts, neg_keys, neg_counts]``, summary v1)."""
    if len(v) != len(SKETCH_FIELDS):
        raise ValueError(f"a positional sketch has {len(SKETCH_FIELDS)} items, got {len(v)}")
    return _typed(list(v))


def _typed(v: list[object]) -> SketchColumns:
    count, total, lo, hi, zero, pos_k, pos_c, neg_k, neg_c = v
    return SketchColumns(
        _int(count), _float(total), _float(lo), _float(hi), _int(zero),
        _ints(pos_k), _ints(pos_c), _ints(neg_k), _ints(neg_c),
    )  # fmt: skip


def _int(x: object) -> int:
    if not isinstance(x, int | float | str):
        raise TypeError(f"expected a number, got {type(x).__name__}")
    return int(x)


def _float(x: object) -> float:
    if not isinstance(x, int | float | str):
        raise TypeError(f"expected a number, got {type(x).__name__}")
    return float(x)


def _ints(x: object) -> list[int]:
    if not isinstance(x, list):
        raise TypeError(f"expected a list, got {type(x).__name__}")
    return list(x)
