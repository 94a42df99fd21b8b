"""``boundary_table`` (one flat ``np.fromiter``) against the plain table it replaces:
``np.array`` over each record's boundary values, None as NaN."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from msgspec.structs import replace

from pipeline.core.record import BOUNDARIES, RequestRecord
from pipeline.core.slo import RecordColumns, boundary_table
from tests.slo_strategies import JOINED, records

# any float a record may hold, signed zeros, huge and tiny ones included, or None
_ANY = st.none() | st.floats(allow_nan=False) | st.sampled_from([0.0, -0.0, 5e-324, 1.7e308])


@st.composite
def any_boundaries(draw: st.DrawFn) -> RequestRecord:
    rec = draw(records(retries=True))
    return replace(rec, **{name: draw(_ANY) for name in BOUNDARIES})


def _reference(recs: list[RequestRecord]) -> np.ndarray:
    rows = [tuple(getattr(r, name) for name in BOUNDARIES) for r in recs]
    return np.array(rows, dtype=np.float64).reshape(len(rows), len(BOUNDARIES))


@given(st.lists(records(retries=True) | any_boundaries(), max_size=40))
def test_the_table_is_the_reference_table(recs: list[RequestRecord]) -> None:
    got, want = boundary_table(recs), _reference(recs)
    assert got.dtype == want.dtype == np.float64
    assert got.shape == want.shape == (len(recs), len(BOUNDARIES))
    # bit for bit (NaN where None, the sign of a zero kept)
    assert got.tobytes() == want.tobytes()
    assert np.array_equal(RecordColumns(recs).values, want, equal_nan=True)


def test_an_empty_batch_and_missing_values() -> None:
    assert boundary_table([]).shape == (0, len(BOUNDARIES))
    rec = replace(JOINED, gateway_total_ms=None)
    [row] = boundary_table([rec])
    assert np.isnan(row[BOUNDARIES.index("gateway_total_ms")])
    assert row[BOUNDARIES.index("gateway_ttfb_ms")] == rec.gateway_ttfb_ms == 20.0
