"""ClickHouse SQL that reads sketch rows the way :class:`QuantileSketch` reads itself.

The worker stores one row per (window, key, boundary, partition) holding a
:class:`~pipeline.core.sketch.SketchColumns` (:data:`SKETCH_COLUMNS`). The builders
here return SQL *text* (no client needed):

* :func:`quantile_sql` -- an aggregate expression: merges the rows of each group
  with ``sumMap`` over (keys, counts), ``sum(zero_count)``, then walks the merged
  bins exactly as ``QuantileSketch.quantile`` (i.e. ddsketch's
  ``get_quantile_value``) does::

      SELECT boundary, {quantile_sql(0.99)} AS p99
      FROM tailguard.latency_sketches FINAL
      WHERE window_start >= ... GROUP BY boundary

* :func:`quantile_key_sql` -- the same walk, returning the selected bucket as
  ``(sign, key)`` (``Tuple(Int8, Int32)``, NULL for no data); with
  :func:`pipeline.core.sketch.bucket_value` it gives the Python float bit for bit;
* ``*_from_merged_sql`` -- the same over already merged state (e.g. a
  ``sumMap`` in a subquery or ``sumMapMerge`` of an ``AggregatingMergeTree``).

Exactness. The bucket selection is exact: ranks are the same IEEE-754 double
operations in the same order (``q * (count - 1)``, ``count_neg - rank - 1``,
``rank - zero_count - count_neg``), and running counts are exact integers, so the
SQL picks the same key as Python for the same merged data, whatever the order in
which rows are merged (integer sums commute). The *value* of the key,
``pow(2, (key - offset) / multiplier) * (2 / (1 + gamma))``, uses the mapping's
constants from ddsketch printed with ``repr`` (they round-trip exactly), but
ClickHouse's ``pow`` is not the C library's ``pow`` that CPython calls: on chDB
26.9 vs glibc, for about 0.5 % of all keys (11 of the 1,151 keys covering
1e-3..1e7 at 1 %) the SQL value is 1-2 ulp away (relative difference
<= 2.3e-16; checked for every key at 1 % and 2 %). So :func:`quantile_sql` equals
the Python float exactly for most buckets, and always to 12 significant digits;
where bit equality matters, use :func:`quantile_key_sql` and ``bucket_value``.

Rows written twice (a replayed window) must not be counted twice: keep the table
a ``ReplacingMergeTree`` ordered by the row's identity and read it ``FINAL``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any, Final

from pipeline.core.sketch import DEFAULT_RELATIVE_ACCURACY, SketchColumns, mapping_constants

# Columns of one stored sketch, in SketchColumns field order, with ClickHouse types.
# Only zero_count and the four arrays are needed for quantiles; count/sum/min/max
# serve means, totals and extremes (sum(count), sum(sum), min(min), max(max)).
SKETCH_COLUMNS: Final[tuple[tuple[str, str], ...]] = (
    ("count", "Int64"),
    ("sum", "Float64"),
    ("min", "Float64"),
    ("max", "Float64"),
    ("zero_count", "Int64"),
    ("pos_keys", "Array(Int32)"),
    ("pos_counts", "Array(Int64)"),
    ("neg_keys", "Array(Int32)"),
    ("neg_counts", "Array(Int64)"),
)

SKETCH_TABLE_DDL_EXAMPLE: Final = """\
-- One row per window x key x boundary x partition; placeholders as in sql/0001.
CREATE TABLE IF NOT EXISTS ${db}.latency_sketches ${on_cluster}
(
    window_start     DateTime('UTC'),
    window_seconds   UInt32,
    model            LowCardinality(String),
    boundary         LowCardinality(String),
    partition        UInt16,
    relative_accuracy Float64,               -- 0.01; never merge rows that differ
    count            UInt64,
    sum              Float64,
    min              Float64,                -- +inf when count = 0
    max              Float64,                -- -inf when count = 0
    zero_count       UInt64,
    pos_keys         Array(Int32),           -- ascending, unique
    pos_counts       Array(UInt64),          -- > 0, same length as pos_keys
    neg_keys         Array(Int32),           -- keys of |v| for v < 0
    neg_counts       Array(UInt64),
    written_at       DateTime64(3) DEFAULT now64(3)
)
ENGINE = ${replicated}ReplacingMergeTree(${replica_args}written_at)
ORDER BY (boundary, model, window_seconds, window_start, partition)
"""

_PREFIX_RE: Final = re.compile(r"^(?:[A-Za-z_][A-Za-z0-9_]*\.)?[A-Za-z0-9_]*$")


def sketch_column_defs(prefix: str = "", indent: str = "    ") -> str:
    """``name Type`` lines (comma-separated) for the sketch payload of a CREATE TABLE."""
    _check_prefix(prefix)
    return ",\n".join(f"{indent}{prefix}{name} {typ}" for name, typ in SKETCH_COLUMNS)


def sketch_insert_columns(
    sketches: Sequence[SketchColumns], prefix: str = ""
) -> tuple[list[str], list[str], list[list[Any]]]:
    """``(names, types, columns)`` for a column-oriented clickhouse-connect insert."""
    _check_prefix(prefix)
    names = [f"{prefix}{n}" for n, _ in SKETCH_COLUMNS]
    types = [t for _, t in SKETCH_COLUMNS]
    columns = [[getattr(s, n) for s in sketches] for n, _ in SKETCH_COLUMNS]
    return names, types, columns


# --- literals and the mapping ------------------------------------------------


def float_literal(x: float) -> str:
    """A Float64 literal that ClickHouse parses back to exactly ``x`` (``repr``)."""
    x = float(x)
    if not math.isfinite(x):
        raise ValueError(f"not a finite float: {x!r}")
    text = repr(x)
    return f"({text})" if text.startswith("-") else text


def value_of_key_sql(key: str, relative_accuracy: float = DEFAULT_RELATIVE_ACCURACY) -> str:
    """SQL for ``LogarithmicMapping.value(key)`` of an integer expression ``key``.

    Same constants and operation order as ddsketch; ClickHouse's ``pow`` may round
    one ulp away from the C library's (see the module doc).
    """
    c = mapping_constants(relative_accuracy)
    return (
        f"(pow(2., (toFloat64({key}) - {float_literal(c.offset)}) / "
        f"{float_literal(c.multiplier)}) * {float_literal(c.value_factor)})"
    )


# --- merged state ------------------------------------------------------------


def merged_state_sql(prefix: str = "") -> tuple[str, str, str]:
    """Aggregate expressions ``(pos_map, neg_map, zero_count)`` merging a group's rows.

    ``pos_map``/``neg_map`` are ``Tuple(Array(Int32), Array(UInt64))`` with ascending
    keys and summed counts (``sumMap``); ``zero_count`` is ``UInt64``.
    """
    _check_prefix(prefix)
    return (
        f"sumMap({prefix}pos_keys, {prefix}pos_counts)",
        f"sumMap({prefix}neg_keys, {prefix}neg_counts)",
        f"sum({prefix}zero_count)",
    )


def _walk(q: float, pos_map: str, neg_map: str, zero: str) -> dict[str, str]:
    """Pieces of ``QuantileSketch.quantile_bucket`` over merged state expressions."""
    if not (0.0 <= float(q) <= 1.0):
        raise ValueError(f"quantile must be in [0, 1], got {q!r}")
    n_neg = f"arraySum(({neg_map}).2)"
    n_pos = f"arraySum(({pos_map}).2)"
    count = f"(toUInt64({zero}) + {n_pos} + {n_neg})"
    # rank = q * (count - 1)          (count - 1 is exact below 2**53)
    rank = f"({float_literal(q)} * (toFloat64({count}) - 1.))"
    # negative store: key_at_rank(count_neg - rank - 1, lower=False)
    rev_plus_1 = f"(((toFloat64({n_neg}) - {rank}) - 1.) + 1.)"
    neg_idx = f"arrayFirstIndex(c -> toFloat64(c) >= {rev_plus_1}, arrayCumSum(({neg_map}).2))"
    neg_key = _key_at(neg_map, neg_idx)
    # positive store: key_at_rank(rank - zero_count - count_neg, lower=True)
    pos_rank = f"(({rank} - toFloat64({zero})) - toFloat64({n_neg}))"
    pos_idx = f"arrayFirstIndex(c -> toFloat64(c) > {pos_rank}, arrayCumSum(({pos_map}).2))"
    pos_key = _key_at(pos_map, pos_idx)
    return {
        "empty": f"{count} = 0",
        "in_neg": f"{rank} < toFloat64({n_neg})",
        "in_zero": f"{rank} < toFloat64(toUInt64({zero}) + {n_neg})",
        "neg_key": neg_key,
        "pos_key": pos_key,
    }


def _key_at(store_map: str, idx: str) -> str:
    """``keys[idx]``, or the largest key when no running count passed the rank (idx 0)."""
    keys = f"({store_map}).1"
    return f"if({idx} = 0, arrayElement({keys}, -1), arrayElement({keys}, {idx}))"


def quantile_from_merged_sql(
    q: float,
    pos_map: str,
    neg_map: str,
    zero_count: str,
    relative_accuracy: float = DEFAULT_RELATIVE_ACCURACY,
) -> str:
    """``Nullable(Float64)`` quantile over merged state (see :func:`merged_state_sql`)."""
    w = _walk(q, pos_map, neg_map, zero_count)
    return (
        f"multiIf({w['empty']}, NULL, "
        f"{w['in_neg']}, -{value_of_key_sql(w['neg_key'], relative_accuracy)}, "
        f"{w['in_zero']}, 0., "
        f"{value_of_key_sql(w['pos_key'], relative_accuracy)})"
    )


def quantile_key_from_merged_sql(q: float, pos_map: str, neg_map: str, zero_count: str) -> str:
    """``Nullable(Tuple(Int8, Int32))`` ``(sign, key)`` over merged state."""
    w = _walk(q, pos_map, neg_map, zero_count)
    return (
        f"multiIf({w['empty']}, NULL, "
        f"{w['in_neg']}, tuple(toInt8(-1), toInt32({w['neg_key']})), "
        f"{w['in_zero']}, tuple(toInt8(0), toInt32(0)), "
        f"tuple(toInt8(1), toInt32({w['pos_key']})))"
    )


# --- over raw rows -------------------------------------------------------------


def quantile_sql(
    q: float, relative_accuracy: float = DEFAULT_RELATIVE_ACCURACY, prefix: str = ""
) -> str:
    """Aggregate expression: the ``q`` quantile of the merged sketches of each group.

    ``prefix`` is put before every column name (a table alias such as ``"s."`` or a
    column-name prefix). Returns ``Nullable(Float64)``: NULL for a group with no
    values. Every row merged must have been written with ``relative_accuracy``.
    """
    return quantile_from_merged_sql(q, *merged_state_sql(prefix), relative_accuracy)


def quantile_key_sql(q: float, prefix: str = "") -> str:
    """Aggregate expression: ``(sign, key)`` of the bucket :func:`quantile_sql` reads.

    ``sign`` is -1 (negative store), 0 (zero bucket, key 0) or 1;
    ``bucket_value(sign, key, relative_accuracy)`` is the Python sketch's value.
    """
    return quantile_key_from_merged_sql(q, *merged_state_sql(prefix))


def count_sql(prefix: str = "") -> str:
    """Aggregate expression: number of values in the group's sketches (``UInt64``)."""
    _check_prefix(prefix)
    return f"sum({prefix}count)"


def _check_prefix(prefix: str) -> None:
    if not _PREFIX_RE.match(prefix):
        raise ValueError(f"prefix must be an identifier prefix or 'alias.', got {prefix!r}")
