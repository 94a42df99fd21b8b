"""Statement version 4 judges a group of rows on one row standing for it
(``pipeline.core.statement.Cuts``): a value's interval among the SLOs' cuts, and the
stand-in of that interval, must be judged as the value itself by every comparison an SLO
makes (``<=``, ``<``, ``>`` a threshold; a prompt's size ``>`` an exclusion)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.adapters.queries.statement_engine import DIGEST_NULLABLE, _levels
from pipeline.adapters.queries.statement_rows import STATEMENT_COLUMNS
from pipeline.adapters.store import REQUEST_COLUMNS
from pipeline.core.statement import Cuts, nearest_rank

CUTS = st.lists(
    st.floats(min_value=-1e30, max_value=1e30, allow_nan=False), min_size=1, max_size=4, unique=True
).map(lambda xs: tuple(sorted(xs)))


@given(CUTS, st.one_of(st.none(), st.floats(min_value=-1e31, max_value=1e31, allow_nan=False)))
def test_a_stand_in_compares_with_every_cut_as_its_value(
    cuts: tuple[float, ...], value: float | None
) -> None:
    code = Cuts.interval(value, cuts)
    stand_in = Cuts.stand_in(code, cuts)
    if value is None:
        assert code == -1
        assert math.isnan(stand_in)
        return
    assert Cuts.interval(stand_in, cuts) == code
    for t in cuts:
        assert (stand_in <= t) == (value <= t)
        assert (stand_in < t) == (value < t)
        assert (stand_in > t) == (value > t)


@given(
    st.lists(st.integers(min_value=0, max_value=100_000), min_size=1, max_size=3, unique=True),
    st.one_of(st.none(), st.integers(min_value=0, max_value=200_000)),
)
def test_a_prompt_stand_in_is_over_the_same_exclusions(limits: list[int], size: int | None) -> None:
    cuts = Cuts({}, tuple(sorted(limits)))
    code = -1 if size is None else sum(size > t for t in cuts.prompt_tokens)
    stand_in = cuts.prompt_stand_in(code)
    if size is None:
        assert stand_in is None
        return
    assert stand_in is not None
    for t in cuts.prompt_tokens:
        assert (stand_in > t) == (size > t)


def test_the_intervals_are_named_as_the_engine_names_them() -> None:
    cuts = (400.0, 600.0)
    table = [(None, -1), (0.0, 0), (400.0, 1), (500.0, 2), (600.0, 3), (600.5, 4)]
    for value, code in table:
        assert Cuts.interval(value, cuts) == code


def test_the_digest_hashes_as_missing_exactly_the_columns_that_may_be_missing() -> None:
    """Version 4's digest definition names the statement's nullable columns; a schema
    change to one of them needs a digest version of its own."""
    types = dict(REQUEST_COLUMNS)
    nullable = {c for c in STATEMENT_COLUMNS if types[c].startswith("Nullable")}
    assert nullable == DIGEST_NULLABLE


@pytest.mark.parametrize(
    "percentile", [50.0, 75.0, 80.0, 90.0, 95.0, 97.5, 99.0, 99.5, 99.9, 99.95, 99.99, 99.999]
)
def test_one_selection_level_gives_the_cores_nearest_rank(percentile: float) -> None:
    """The engine selects a percentile at ``floor(level * n)`` of the values negated
    (quantileExact): for the usual percentiles one of its two levels gives the core's
    rank (``ceil(p/100 * n)``-th smallest, ``core.statement.nearest_rank``) for every n up
    to 200,000 (a day of a tenant's requests; the read checks each n it meets and sorts
    where neither does). One level alone misses: 1 - p/100 at p90, n = 10."""
    a, b = (float(x) for x in _levels(percentile))
    for n in range(1, 200_001):
        rank = n - max(1, math.ceil(percentile / 100.0 * n))  # from 0, values negated
        assert rank in (int(a * n), int(b * n)), n
    values = [float(v) for v in range(1, 101)]
    assert -sorted(-v for v in values)[int(a * 100)] == nearest_rank(values, percentile)
