"""One quantile sketch everywhere: DDSketch maths, our own bins, a flat serialisation.

The worker keeps a :class:`QuantileSketch` per (window, key, boundary), writes its
bins to ClickHouse (:meth:`QuantileSketch.to_columns`), and SQL built by
:mod:`pipeline.adapters.sketch_sql` merges the bins of many rows and selects the
same bucket this class selects for the merged data.

The maths is the ``ddsketch`` library's, not a re-derivation:

* keys and representative values come from ``ddsketch.mapping.LogarithmicMapping``
  (``key(v) = ceil(log(v)/log(2) * multiplier) + offset``,
  ``value(k) = 2 ** ((k - offset) / multiplier) * 2 / (1 + gamma)``);
* :meth:`QuantileSketch.quantile` reproduces ``BaseDDSketch.get_quantile_value``
  step by step (``rank = q * (count - 1)``; negative store read with
  ``key_at_rank(count_neg - rank - 1, lower=False)``; a zero bucket for
  ``|v| <= mapping.min_possible``; positive store read with
  ``key_at_rank(rank - zero_count - count_neg)``), in the same floating-point
  operation order, so on the same data it returns *exactly* the float that
  ``ddsketch.DDSketch(relative_accuracy).get_quantile_value(q)`` returns.

Differences from ``ddsketch.DDSketch``, all deliberate:

* bins are ``dict[int, int]`` (sparse, integer counts, no weights) and
  :meth:`QuantileSketch.add_many` maps a whole numpy batch at once;
* NaN, +/-inf and finite values with ``|v| > mapping.max_possible`` (about
  ``1.76e308`` at 1 %) raise :class:`ValueError` -- callers validate their
  measurements first; ddsketch would store them in a bin whose value is
  meaningless (or overflows);
* ``quantile`` raises :class:`ValueError` for ``q`` outside ``[0, 1]`` (ddsketch
  returns ``None``); it returns ``None`` only for an empty sketch;
* an empty sketch reports ``min = +inf`` and ``max = -inf`` (as ddsketch does).

Accuracy: for every ``q``, ``quantile(q)`` is within ``relative_accuracy`` (relative
to its magnitude) of :func:`exact_quantile_lower` of the same data -- the element
at sorted index ``floor(q * (n - 1))`` -- because the sketch returns the
representative value of the bucket that holds exactly that element. (Values with
``|v| <= min_possible``, about ``2.3e-308``, are reported as ``0.0``.)

Pure: no Kafka, Faust or ClickHouse imports.
"""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Self

import numpy as np
from ddsketch.mapping import LogarithmicMapping
from numpy.typing import NDArray

from pipeline.contract.sketch import SketchColumns as SketchColumns  # noqa: PLC0414

DEFAULT_RELATIVE_ACCURACY: Final = 0.01
_INT32_MIN: Final = -(2**31)
_INT32_MAX: Final = 2**31 - 1
_LN2: Final = math.log(2.0)  # what math.log(v, 2) divides by

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


# --- mapping -----------------------------------------------------------------


@functools.lru_cache(maxsize=16)
def _mapping(relative_accuracy: float) -> LogarithmicMapping:
    if not (0.0 < relative_accuracy < 1.0):  # also rejects NaN
        raise ValueError(f"relative_accuracy must be in (0, 1), got {relative_accuracy!r}")
    mapping = LogarithmicMapping(relative_accuracy)
    lo, hi = mapping.key(mapping.min_possible), mapping.key(mapping.max_possible)
    if lo < _INT32_MIN or hi > _INT32_MAX:
        raise ValueError(
            f"relative_accuracy {relative_accuracy!r} needs keys in [{lo}, {hi}], "
            "beyond Int32 (the storage type of bin keys)"
        )
    return mapping


@dataclass(frozen=True, slots=True)
class MappingConstants:
    """The ``LogarithmicMapping`` constants, read from ddsketch, shared with SQL.

    ``value(key) = 2.0 ** ((key - offset) / multiplier) * value_factor``.
    """

    relative_accuracy: float
    gamma: float
    multiplier: float
    offset: float
    value_factor: float  # 2.0 / (1 + gamma), as ddsketch computes it
    min_indexable: float  # |v| <= this goes to the zero bucket
    max_indexable: float  # |v| > this is rejected
    min_key: int  # key(min_indexable)
    max_key: int  # key(max_indexable)


@functools.lru_cache(maxsize=16)
def mapping_constants(relative_accuracy: float = DEFAULT_RELATIVE_ACCURACY) -> MappingConstants:
    m = _mapping(relative_accuracy)
    return MappingConstants(
        relative_accuracy=m.relative_accuracy,
        gamma=m.gamma,
        multiplier=m._multiplier,
        offset=float(m._offset),
        value_factor=2.0 / (1 + m.gamma),
        min_indexable=m.min_possible,
        max_indexable=m.max_possible,
        min_key=m.key(m.min_possible),
        max_key=m.key(m.max_possible),
    )


def bucket_value(
    sign: int, key: int, relative_accuracy: float = DEFAULT_RELATIVE_ACCURACY
) -> float:
    """The value the sketch reports for a bucket: ``sign`` is -1, 0 (zero bucket) or 1.

    Turns the ``(sign, key)`` pair selected by :meth:`QuantileSketch.quantile_bucket`
    (or by SQL's ``quantile_key_sql``) into the exact float ``quantile`` returns.
    """
    if sign == 0:
        return 0.0
    value = _mapping(relative_accuracy).value(key)
    if sign == 1:
        return value
    if sign == -1:
        return -value
    raise ValueError(f"sign must be -1, 0 or 1, got {sign!r}")


# --- exact reference ---------------------------------------------------------


def exact_quantile_lower(sorted_values: Sequence[float] | FloatArray, q: float) -> float:
    """The element at index ``floor(q * (n - 1))`` of ascending ``sorted_values``.

    The rank convention of DDSketch: :meth:`QuantileSketch.quantile` returns a value
    within ``relative_accuracy`` of this one (see the module doc). Raises
    :class:`ValueError` for an empty input or ``q`` outside ``[0, 1]``.
    """
    _check_q(q)
    n = len(sorted_values)
    if n == 0:
        raise ValueError("exact_quantile_lower of an empty sequence")
    return float(sorted_values[math.floor(q * (n - 1))])


def _check_q(q: float) -> None:
    if not (0.0 <= q <= 1.0):  # also rejects NaN
        raise ValueError(f"quantile must be in [0, 1], got {q!r}")


# --- storage form ------------------------------------------------------------


# to_bytes layout (little-endian): header, then pos keys (i4), pos counts,
# neg keys (i4), neg counts; counts are u4 when they all fit, else u8 (flag bit 0).
_MAGIC: Final = b"TGQS"
_VERSION: Final = 1
_HEADER: Final = struct.Struct("<4sBBdqqdddII")
_FLAG_WIDE_COUNTS: Final = 1


def _encode(c: SketchColumns, relative_accuracy: float) -> bytes:
    """The checkpoint bytes of a sketch's columns (see ``QuantileSketch.to_bytes``)."""
    wide = any(n > 0xFFFFFFFF for n in (*c.pos_counts, *c.neg_counts))
    count_dtype = "<u8" if wide else "<u4"
    header = _HEADER.pack(
        _MAGIC, _VERSION, _FLAG_WIDE_COUNTS if wide else 0, relative_accuracy, c.count,
        c.zero_count, c.sum, c.min, c.max, len(c.pos_keys), len(c.neg_keys),
    )  # fmt: skip
    return b"".join(
        (
            header,
            np.asarray(c.pos_keys, dtype="<i4").tobytes(),
            np.asarray(c.pos_counts, dtype=count_dtype).tobytes(),
            np.asarray(c.neg_keys, dtype="<i4").tobytes(),
            np.asarray(c.neg_counts, dtype=count_dtype).tobytes(),
        )
    )


def _decode(data: bytes) -> tuple[SketchColumns, float]:
    """The columns and relative accuracy of checkpoint bytes; :class:`ValueError` on
    anything malformed (the columns themselves are checked by ``from_columns``)."""
    if len(data) < _HEADER.size:
        raise ValueError("sketch bytes too short")
    (magic, version, flags, rel_acc, count, zero, total, lo, hi, n_pos, n_neg) = (
        _HEADER.unpack_from(data)
    )
    if magic != _MAGIC or version != _VERSION:
        raise ValueError(f"not a version-{_VERSION} sketch (magic {magic!r}, v{version})")
    width = 8 if flags & _FLAG_WIDE_COUNTS else 4
    count_dtype = "<u8" if width == 8 else "<u4"
    if len(data) != _HEADER.size + (n_pos + n_neg) * (4 + width):
        raise ValueError("sketch bytes have the wrong length")
    off = _HEADER.size
    arrays: list[list[int]] = []
    for n, dtype, size in (
        (n_pos, "<i4", 4),
        (n_pos, count_dtype, width),
        (n_neg, "<i4", 4),
        (n_neg, count_dtype, width),
    ):
        arrays.append(np.frombuffer(data, dtype=dtype, count=n, offset=off).tolist())
        off += n * size
    return SketchColumns(count, total, lo, hi, zero, *arrays), rel_acc


def _stores(
    cols: SketchColumns, relative_accuracy: float, *, delta: bool
) -> tuple[dict[int, int], dict[int, int]]:
    """The positive and negative stores of a sketch's columns; :class:`ValueError` if
    the columns are inconsistent (``delta``: counts may be negative, not 0)."""
    consts = mapping_constants(relative_accuracy)
    lo, hi = consts.min_key, consts.max_key
    stores = []
    for name, keys, counts in (
        ("pos", cols.pos_keys, cols.pos_counts),
        ("neg", cols.neg_keys, cols.neg_counts),
    ):
        if len(keys) != len(counts):
            raise ValueError(f"{name}_keys and {name}_counts differ in length")
        store = {int(k): int(c) for k, c in zip(keys, counts, strict=True)}
        if len(store) != len(keys):
            raise ValueError(f"duplicate {name}_keys")
        if store and (min(store) < lo or max(store) > hi):
            raise ValueError(f"{name}_keys outside [{lo}, {hi}]")
        if any(c <= 0 for c in store.values()) and not (
            delta and all(c != 0 for c in store.values())
        ):
            raise ValueError(f"{name}_counts must be positive")
        stores.append(store)
    zero, count = int(cols.zero_count), int(cols.count)
    if (zero < 0 and not delta) or count != zero + sum(stores[0].values()) + sum(
        stores[1].values()
    ):
        raise ValueError("count must equal zero_count + sum(pos_counts) + sum(neg_counts)")
    return stores[0], stores[1]


# --- the sketch --------------------------------------------------------------


class QuantileSketch:
    """Mergeable quantile sketch with ``relative_accuracy`` (DDSketch, unbounded bins).

    Mutable (the worker's hot path); :meth:`copy`, :meth:`to_columns` and
    :meth:`to_bytes` give value snapshots.
    """

    __slots__ = (
        "_count",
        "_mapping",
        "_max",
        "_min",
        "_neg",
        "_pos",
        "_sum",
        "_zero",
    )

    def __init__(self, relative_accuracy: float = DEFAULT_RELATIVE_ACCURACY) -> None:
        self._mapping = _mapping(relative_accuracy)
        self._pos: dict[int, int] = {}
        self._neg: dict[int, int] = {}
        self._zero = 0
        self._count = 0
        self._sum = 0.0
        self._min = math.inf
        self._max = -math.inf

    # -- properties --

    @property
    def relative_accuracy(self) -> float:
        return float(self._mapping.relative_accuracy)

    @property
    def count(self) -> int:
        return self._count

    @property
    def sum(self) -> float:
        """Sum of the values in the order they were added (as ddsketch sums them)."""
        return self._sum

    @property
    def min(self) -> float:
        return self._min

    @property
    def max(self) -> float:
        return self._max

    @property
    def zero_count(self) -> int:
        return self._zero

    @property
    def num_bins(self) -> int:
        return len(self._pos) + len(self._neg)

    def __repr__(self) -> str:
        return (
            f"QuantileSketch(relative_accuracy={self.relative_accuracy!r}, count={self._count}, "
            f"bins={self.num_bins}, min={self._min!r}, max={self._max!r})"
        )

    # -- adding --

    def add(self, value: float) -> None:
        """Add one finite value (:class:`ValueError` for NaN, inf or beyond the mapping)."""
        v = float(value)
        m = self._mapping
        if not abs(v) <= m.max_possible:  # NaN fails too
            raise ValueError(f"cannot add {v!r} to a sketch: not finite or beyond the mapping")
        if v > m.min_possible:
            k = m.key(v)
            self._pos[k] = self._pos.get(k, 0) + 1
        elif v < -m.min_possible:
            k = m.key(-v)
            self._neg[k] = self._neg.get(k, 0) + 1
        else:
            self._zero += 1
        self._count += 1
        self._sum += v
        self._min = min(self._min, v)
        self._max = max(self._max, v)

    def add_many(self, values: Sequence[float] | FloatArray) -> None:
        """Add a batch; same bins, count, sum, min and max as ``add`` on each value in order.

        All-or-nothing: if any value is invalid, :class:`ValueError` and nothing is added.
        """
        checked = _checked(values, self._mapping, "add", "to")
        if checked is None:
            return
        arr, mags = checked
        self._zero += arr.size - self._bump_signed(arr, mags, 1)
        self._count += int(arr.size)
        self._sum = _fold(self._sum, arr)
        lo, hi = float(arr.min()), float(arr.max())
        self._min = min(self._min, lo)
        self._max = max(self._max, hi)

    def remove_many(self, values: Sequence[float] | FloatArray) -> None:
        """Take back values added before (a retraction: a partial record replaced by its
        upgrade). Bins, zero count, count and sum decrease; a bin that reaches 0 is
        dropped. On a *delta* sketch (a correction) counts may go negative: such a
        sketch is only ever merged into the one holding the values, never read alone.
        ``min``/``max`` cannot be taken back: they stay bounds of what was added.
        """
        checked = _checked(values, self._mapping, "remove", "from")
        if checked is None:
            return
        arr, mags = checked
        self._zero -= arr.size - self._bump_signed(arr, mags, -1)
        self._count -= int(arr.size)
        self._sum = _fold(self._sum, -arr)

    def _bump_signed(self, arr: FloatArray, mags: FloatArray, sign: int) -> int:
        """Count (``sign`` -1: take out) the non-zero values of ``arr`` (``mags``: their
        magnitudes) into the stores; returns how many there were."""
        m = self._mapping
        pos = arr > m.min_possible
        neg = arr < -m.min_possible
        n_pos, n_neg = int(np.count_nonzero(pos)), int(np.count_nonzero(neg))
        if n_pos:
            _bump(self._pos, self._keys(arr[pos] if n_pos < arr.size else arr), sign)
        if n_neg:
            _bump(self._neg, self._keys(mags[neg] if n_neg < arr.size else mags), sign)
        return n_pos + n_neg

    def _keys(self, mags: FloatArray) -> IntArray:
        """``mapping.key`` of each (positive, indexable) magnitude, vectorised.

        ``mapping.key(v)`` is ``int(ceil(math.log(v, 2) * multiplier) + offset)``, and
        ``math.log(v, 2)`` is ``log(v) / log(2)`` with the C library's ``log``. numpy's
        ``log`` may differ from it by an ulp, which can move ``ceil`` only when the
        scaled log lies within rounding distance of an integer; those few values are
        recomputed with the library's scalar ``key``, so the keys are always the
        library's.
        """
        m = self._mapping
        scaled = np.log(mags) / _LN2 * m._multiplier
        ceil = np.ceil(scaled)
        near = np.abs(scaled - np.rint(scaled)) <= 1e-9 + 1e-12 * np.abs(scaled)
        keys = (ceil + m._offset).astype(np.int64)
        if near.any():
            for i in np.flatnonzero(near).tolist():
                keys[i] = m.key(float(mags[i]))
        return keys

    # -- merging and copying --

    def merge(self, other: QuantileSketch) -> None:
        """Add ``other``'s data to this sketch (same relative accuracy required)."""
        if other._mapping.gamma != self._mapping.gamma:
            raise ValueError(
                "cannot merge sketches with different relative accuracy: "
                f"{self.relative_accuracy!r} and {other.relative_accuracy!r}"
            )
        if other._count == 0 and not (other._pos or other._neg or other._zero):
            return
        for store, theirs in ((self._pos, other._pos), (self._neg, other._neg)):
            get = store.get
            for k, c in theirs.items():
                n = get(k, 0) + c
                if n:
                    store[k] = n
                else:
                    store.pop(k, None)
        self._zero += other._zero
        self._count += other._count
        self._sum += other._sum
        self._min = min(self._min, other._min)
        self._max = max(self._max, other._max)

    def copy(self) -> Self:
        new = type(self).__new__(type(self))
        new._mapping = self._mapping
        new._pos = dict(self._pos)
        new._neg = dict(self._neg)
        new._zero = self._zero
        new._count = self._count
        new._sum = self._sum
        new._min = self._min
        new._max = self._max
        return new

    # -- reading --

    def quantile_bucket(self, q: float) -> tuple[int, int] | None:
        """``(sign, key)`` of the bucket ``quantile(q)`` reads; ``None`` when empty.

        ``sign`` is -1 (negative store, ``key`` of ``|v|``), 0 (zero bucket, key 0)
        or 1. Follows ``BaseDDSketch.get_quantile_value`` operation by operation.
        """
        _check_q(q)
        if self._count == 0:
            return None
        rank = q * (self._count - 1)
        neg_count = sum(self._neg.values())
        if rank < neg_count:
            reversed_rank = neg_count - rank - 1
            return -1, _key_at_rank(self._neg, reversed_rank, lower=False)
        if rank < self._zero + neg_count:
            return 0, 0
        return 1, _key_at_rank(self._pos, rank - self._zero - neg_count, lower=True)

    def quantile(self, q: float) -> float | None:
        """Value at quantile ``q`` in ``[0, 1]``; ``None`` for an empty sketch.

        Equal (``==`` on floats) to ``ddsketch.DDSketch.get_quantile_value(q)`` on the
        same data, and within ``relative_accuracy`` of :func:`exact_quantile_lower`.
        """
        bucket = self.quantile_bucket(q)
        if bucket is None:
            return None
        sign, key = bucket
        if sign == 0:
            return 0.0
        value: float = self._mapping.value(key)
        return value if sign > 0 else -value

    # -- serialisation --

    def to_columns(self) -> SketchColumns:
        # keys sorted as ints (not (key, count) tuples), counts looked up in C
        pos_keys, neg_keys = sorted(self._pos), sorted(self._neg)
        return SketchColumns(
            count=self._count,
            sum=self._sum,
            min=self._min,
            max=self._max,
            zero_count=self._zero,
            pos_keys=pos_keys,
            pos_counts=list(map(self._pos.__getitem__, pos_keys)),
            neg_keys=neg_keys,
            neg_counts=list(map(self._neg.__getitem__, neg_keys)),
        )

    @classmethod
    def from_columns(
        cls,
        cols: SketchColumns,
        relative_accuracy: float = DEFAULT_RELATIVE_ACCURACY,
        *,
        delta: bool = False,
    ) -> Self:
        """Rebuild a sketch; :class:`ValueError` if the columns are inconsistent.

        ``delta``: the columns of a correction, whose counts may be negative (not 0).
        """
        pos, neg = _stores(cols, relative_accuracy, delta=delta)
        sketch = cls(relative_accuracy)
        sketch._pos, sketch._neg = pos, neg
        sketch._zero = int(cols.zero_count)
        sketch._count = int(cols.count)
        sketch._sum = float(cols.sum)
        sketch._min = float(cols.min)
        sketch._max = float(cols.max)
        return sketch

    def to_bytes(self) -> bytes:
        """Compact checkpoint form (keys as int32, counts as uint32 or uint64)."""
        return _encode(self.to_columns(), self.relative_accuracy)

    @classmethod
    def from_bytes(cls, data: bytes) -> Self:
        """Inverse of :meth:`to_bytes`; :class:`ValueError` on anything malformed."""
        return cls.from_columns(*_decode(data))


def _checked(
    values: Sequence[float] | FloatArray, m: LogarithmicMapping, verb: str, prep: str
) -> tuple[FloatArray, FloatArray] | None:
    """``values`` as a flat float64 array and their magnitudes (None: empty);
    :class:`ValueError` when one is NaN, infinite or beyond the mapping."""
    arr = np.asarray(values, dtype=np.float64).ravel()
    if arr.size == 0:
        return None
    mags = np.abs(arr)
    if not bool((mags <= m.max_possible).all()):  # NaN compares False
        bad = arr[~(mags <= m.max_possible)][0]
        raise ValueError(f"cannot {verb} {bad!r} {prep} a sketch: not finite or beyond the mapping")
    return arr, mags


def _fold(total: float, arr: FloatArray) -> float:
    """``total`` plus each value of ``arr`` in order (add.accumulate is a left fold: the
    same additions, in the same order, as ``add`` one by one)."""
    acc = np.empty(arr.size + 1, dtype=np.float64)
    acc[0] = total
    acc[1:] = arr
    return float(np.add.accumulate(acc)[-1])


def _bump(store: dict[int, int], keys: IntArray, sign: int = 1) -> None:
    """Count each key of ``keys`` into ``store`` (``sign`` -1: take them out; a bin
    that reaches 0 is dropped)."""
    lo, hi = int(keys.min()), int(keys.max())
    if hi - lo <= 4 * keys.size + 4096:
        counts = np.bincount(keys - lo)
        present = np.flatnonzero(counts)
        uniq, cnts = (present + lo).tolist(), counts[present].tolist()
    else:
        u, c = np.unique(keys, return_counts=True)
        uniq, cnts = u.tolist(), c.tolist()
    if sign > 0 and not store:
        # a fresh store (a window's sketch at its first flush, the common case): every
        # count is positive, the keys ascending and distinct; one C call
        store.update(zip(uniq, cnts, strict=True))
        return
    get = store.get
    for k, c in zip(uniq, cnts, strict=True):
        n = get(k, 0) + sign * c
        if n:
            store[k] = n
        else:
            store.pop(k, None)


def _key_at_rank(store: dict[int, int], rank: float, *, lower: bool) -> int:
    """``DenseStore.key_at_rank``: first key (ascending) whose running count passes rank."""
    running = 0
    keys = sorted(store)
    for k in keys:
        running += store[k]
        if (lower and running > rank) or (not lower and running >= rank + 1):
            return k
    if not keys:  # unreachable: quantile() only reads a store whose count covers the rank
        raise RuntimeError("key_at_rank on an empty store")
    return keys[-1]
