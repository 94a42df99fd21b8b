"""The capacity model on synthetic instances whose latency grows with concurrency."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.capacity import (
    Sample,
    concurrency_level,
    exact_quantile,
    fit,
    fit_model,
    instances_needed,
    quantile_ci_ranks,
)


def _instance(
    inst: str, concurrency: int, latency_ms: float, seconds: int, t0_ms: float = 0.0
) -> list[Sample]:
    """``concurrency`` back-to-back request streams, each request taking ``latency_ms``."""
    out = []
    n = int(seconds * 1000 // latency_ms)
    for lane in range(concurrency):
        for k in range(n):
            a = t0_ms + k * latency_ms + lane * latency_ms / concurrency
            out.append(Sample("m", inst, a, latency_ms, latency_ms * 0.8, latency_ms))
    return out


@pytest.mark.parametrize(
    ("c", "level"), [(0.2, None), (0.6, 1), (1.0, 1), (2.9, 4), (5.0, 4), (6.0, 8), (45.0, 32)]
)
def test_concurrency_levels_are_powers_of_two(c: float, level: int | None) -> None:
    assert concurrency_level(c) == level


@pytest.mark.parametrize(
    ("qps", "per", "util", "n"),
    [(100.0, 62.0, 0.7, 3), (43.4, 62.0, 0.7, 1), (43.5, 62.0, 0.7, 2), (0.0, 10.0, 0.7, 1)],
)
def test_instances_needed(qps: float, per: float, util: float, n: int) -> None:
    assert instances_needed(qps, per, util) == n
    with pytest.raises(ValueError, match="utilisation"):
        instances_needed(qps, 0.0)


def test_exact_quantile_is_clickhouse_quantile_exact() -> None:
    assert exact_quantile(list(range(100)), 0.99) == 99
    assert exact_quantile(list(range(1000)), 0.99) == 990


def test_chooses_the_highest_throughput_level_that_holds_the_p99() -> None:
    # The documents' matrix: 8 -> 210 ms, 16 -> 290 ms, 32 -> 440 ms (per instance).
    samples = (
        _instance("a", 8, 210.0, 120)
        + _instance("b", 16, 290.0, 120)
        + _instance("c", 32, 440.0, 120)
    )
    m = fit_model("m", samples, 300.0, target_qps=(100.0,))
    levels = {lv.concurrency: lv for lv in m.levels}
    assert set(levels) == {8, 16, 32}
    assert levels[16].mean_concurrency == pytest.approx(16, rel=0.02)
    assert levels[16].throughput_rps == pytest.approx(16 / 0.29, rel=0.03)
    assert levels[16].littles_law_rps == pytest.approx(16 / 0.29, rel=0.03)
    assert levels[32].holds_target is False
    assert m.chosen is not None
    assert m.chosen.concurrency == 16
    assert m.instances_needed == {100.0: math.ceil(100.0 / (m.chosen.throughput_rps * 0.7))}
    assert m.instances_observed == 3


def test_no_level_holds_the_target_means_no_sizing() -> None:
    m = fit_model("m", _instance("a", 8, 900.0, 120), 300.0, target_qps=(10.0,))
    assert m.chosen is None
    assert m.instances_needed == {}


def test_levels_with_too_few_requests_are_never_chosen() -> None:
    m = fit_model("m", _instance("a", 2, 100.0, 40), 300.0, min_requests=10_000)
    assert m.levels
    assert m.chosen is None


def test_fit_sizes_each_model_for_its_own_peak_by_default() -> None:
    a = _instance("a", 4, 100.0, 60)
    b = [Sample("n", s.instance, s.arrival_ms, s.e2e_ms, s.compute_ms, s.latency_ms) for s in a]
    out = fit(a + b, 300.0)
    assert [m.model for m in out] == ["m", "n"]
    for m in out:
        assert m.chosen is not None
        ((qps, n),) = m.instances_needed.items()
        assert qps == m.peak_qps
        assert n == math.ceil(qps / (m.chosen.throughput_rps * 0.7))


@pytest.mark.parametrize(
    ("n", "ranks"),
    [
        (0, (None, None)),
        (27, (25, None)),  # the thin levels of the issue: no upper bound at all
        (367, (359, None)),
        (368, (360, 368)),  # from here 1 - 0.99^n >= 0.975
        (1000, (983, 997)),
    ],
)
def test_p99_confidence_interval_ranks(n: int, ranks: tuple[int | None, int | None]) -> None:
    assert quantile_ci_ranks(n) == ranks


@settings(max_examples=30, deadline=None)
@given(st.integers(min_value=1, max_value=3000))
def test_p99_ci_ranks_cover_at_least_95_percent(n: int) -> None:
    lo, hi = quantile_ci_ranks(n)
    # P(l <= B < u) for B ~ Binomial(n, 0.99), an unbounded side taken as the whole range
    lo_k, hi_k = (lo or 0), (hi or n + 1)

    def pmf(k: int) -> float:
        return math.exp(
            math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
            + k * math.log(0.99) + (n - k) * math.log(0.01)
        )  # fmt: skip

    assert sum(pmf(k) for k in range(lo_k, hi_k) if 0 <= k <= n) >= 0.95 - 1e-9


def test_levels_carry_their_p99_interval_and_thinness() -> None:
    samples = [Sample("m", "e0", 1000.0 * i, 900.0, 500.0, float(i % 50)) for i in range(400)]
    (m,) = fit(samples, 300.0, bucket_ms=10_000.0, min_requests=100)
    for lv in m.levels:
        assert lv.thin == (lv.requests < 100)
        assert lv.p99_ci_low_ms is not None
        assert lv.p99_ci_low_ms <= lv.p99_ms
        if lv.p99_ci_high_ms is not None:
            assert lv.p99_ms <= lv.p99_ci_high_ms
