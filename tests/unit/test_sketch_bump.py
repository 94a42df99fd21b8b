"""``add_many`` / ``remove_many`` in any sequence of batches against one ``add`` (or bin
decrement) per value: a fresh sketch's first batch takes a shortcut (one dict update)
that later batches into a non-empty store do not."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from pipeline.core.sketch import QuantileSketch

_VALUES = st.lists(
    st.floats(-1e9, 1e9, allow_nan=False, allow_infinity=False)
    | st.sampled_from([0.0, 1.0, -1.0, 250.0, 400.0]),
    max_size=60,
)


@given(st.lists(_VALUES, max_size=4))
def test_batches_give_the_bins_of_one_add_per_value(batches: list[list[float]]) -> None:
    one, batched = QuantileSketch(), QuantileSketch()
    for batch in batches:
        for v in batch:
            one.add(v)
        batched.add_many(np.asarray(batch, dtype=np.float64))
        assert batched.to_columns() == one.to_columns()
        assert (batched._pos, batched._neg) == (one._pos, one._neg)  # as dicts, too


@given(_VALUES, st.data())
def test_removing_after_a_first_batch(first: list[float], data: st.DataObject) -> None:
    """What a window takes back (a partial replaced): out of a store the first batch
    filled through the shortcut, bins dropped at 0 as before."""
    out = data.draw(st.lists(st.booleans(), min_size=len(first), max_size=len(first)))
    taken = [v for v, o in zip(first, out, strict=True) if o]
    rest = [v for v, o in zip(first, out, strict=True) if not o]
    sk, want = QuantileSketch(), QuantileSketch()
    sk.add_many(np.asarray(first, dtype=np.float64))
    sk.remove_many(np.asarray(taken, dtype=np.float64))
    want.add_many(np.asarray(rest, dtype=np.float64))
    assert (sk._pos, sk._neg, sk.count, sk.zero_count) == (
        want._pos, want._neg, want.count, want.zero_count,
    )  # fmt: skip


@given(st.lists(_VALUES, max_size=4), st.lists(st.booleans(), max_size=4))
def test_columns_are_the_sorted_bins(batches: list[list[float]], removes: list[bool]) -> None:
    sk = QuantileSketch()
    for batch, remove in zip(batches, removes + [False] * len(batches), strict=False):
        sk.add_many(np.asarray(batch, dtype=np.float64))
        if remove:  # bins in any insertion order, some dropped
            sk.remove_many(np.asarray(batch[::2], dtype=np.float64))
    cols = sk.to_columns()
    pos, neg = sorted(sk._pos.items()), sorted(sk._neg.items())
    assert (cols.pos_keys, cols.pos_counts) == ([k for k, _ in pos], [c for _, c in pos])
    assert (cols.neg_keys, cols.neg_counts) == ([k for k, _ in neg], [c for _, c in neg])
    assert (cols.count, cols.zero_count) == (sk.count, sk.zero_count)
