"""Capacity-aware admission by strict priority (issue 35): producers/admission.py."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from producers.admission import (
    MIN_BURST_TOKENS,
    PRIORITIES,
    WARMUP_MS,
    Admit,
    PriorityAdmission,
    drain_retry_after_s,
)

MAX_RETRY_S = 30


def arrivals(demand_rps: tuple[float, ...], duration_s: float) -> list[tuple[float, int]]:
    """Constant arrivals per priority (evenly spaced, staggered phases), merged by time."""
    phases = (0.0, 0.13, 0.37, 0.71)
    out: list[tuple[float, int]] = []
    for p, rps in enumerate(demand_rps):
        if rps <= 0:
            continue
        step_ms = 1000.0 / rps
        t = phases[p] * step_ms
        while t < duration_s * 1000.0:
            out.append((t, p))
            t += step_ms
    out.sort()
    return out


def strict_priority(rate_rps: float, demand_rps: tuple[float, ...]) -> list[float]:
    """What strict priority admits per priority: 0 all of it, the others what is left."""
    want: list[float] = []
    left = rate_rps
    for p, rps in enumerate(demand_rps):
        got = rps if p == 0 else min(rps, max(0.0, left))
        want.append(got)
        left -= got
    return want


def run(
    rate_rps: float, demand_rps: tuple[float, ...], duration_s: float = 60.0, skip_s: float = 10.0
) -> tuple[list[float], list[Admit]]:
    """Admitted rate per priority after ``skip_s``, and every rejection."""
    adm = PriorityAdmission()
    admitted = [0] * PRIORITIES
    rejections: list[Admit] = []
    for t_ms, p in arrivals(demand_rps, duration_s):
        got = adm.decide(p, rate_rps, t_ms, MAX_RETRY_S)
        if not got.admitted:
            rejections.append(got)
            assert p > 0, "priority 0 is never rejected"
        elif t_ms >= skip_s * 1000.0:
            admitted[p] += 1
    return [n / (duration_s - skip_s) for n in admitted], rejections


# --- long runs at constant demand --------------------------------------------------------

LONG_RUNS = [
    # (id, rate, demand per priority 0..3)
    ("under-capacity-all-admitted", 10.0, (0.0, 3.0, 3.0, 3.5)),
    ("low-rates", 5.0, (0.0, 1.0, 1.0, 1.0)),
    ("lowest-priority-is-cut", 10.0, (0.0, 5.0, 5.0, 5.0)),
    ("middle-priority-is-cut", 50.0, (10.0, 30.0, 30.0, 30.0)),
    ("priority-0-above-the-rate-takes-all", 10.0, (15.0, 5.0, 5.0, 5.0)),
    ("a-gap-in-the-priorities", 10.0, (2.0, 0.0, 0.0, 20.0)),
    ("fallback-gets-the-rest", 3.0, (0.5, 0.5, 0.5, 10.0)),
    ("one-trickle", 20.0, (0.0, 0.0, 0.0, 0.3)),
]


@pytest.mark.parametrize(
    ("rate", "demand"), [c[1:] for c in LONG_RUNS], ids=[c[0] for c in LONG_RUNS]
)
def test_long_run_admits_by_strict_priority(rate: float, demand: tuple[float, ...]) -> None:
    # Measured once every bucket is full: until then a priority whose demand is met keeps
    # its headroom (10 % of its demand) in its bucket, up to MIN_BURST_TOKENS, instead of
    # handing it down (0.05 req/s for ~200 s in "fallback-gets-the-rest").
    got, rejections = run(rate, demand, duration_s=360.0, skip_s=240.0)
    want = strict_priority(rate, demand)
    for p in range(PRIORITIES):
        assert got[p] == pytest.approx(want[p], rel=0.03, abs=0.1), (p, got, want)
    assert all(1 <= r.retry_after_s <= MAX_RETRY_S for r in rejections)


# --- single decisions ---------------------------------------------------------------------


def test_warm_up_is_one_shared_bucket_with_priority_0_exempt() -> None:
    adm = PriorityAdmission()
    got = [adm.decide(3, 5.0, 0.0, MAX_RETRY_S) for _ in range(12)]
    # one second of tokens, and never fewer than MIN_BURST_TOKENS
    assert [g.admitted for g in got] == [True] * 10 + [False] * 2
    assert got[-1].retry_after_s == 1  # the next token in 0.2 s
    assert adm.decide(0, 5.0, 0.0, MAX_RETRY_S).admitted  # never evicted
    assert not adm.decide(1, 5.0, 100.0, MAX_RETRY_S).admitted  # 0.5 tokens
    assert adm.decide(1, 5.0, 200.0, MAX_RETRY_S).admitted
    assert adm.allocation_rps() == (0.0,) * PRIORITIES  # not warm yet


RETRY_CASES = [
    # (id, rate, max_retry_after_s, priority, want admitted, want retry_after_s)
    ("rate-0-priority-3-waits-the-most", 0.0, 30, 3, False, 30),
    ("rate-0-priority-0-passes", 0.0, 30, 0, True, 0),
    ("max-below-1-still-says-1", 0.0, 0, 2, False, 1),
    ("slow-refill-capped-at-max", 0.01, 5, 3, False, 5),
    ("priority-above-3-is-3", 0.0, 30, 7, False, 30),
    ("negative-priority-is-0", 0.0, 30, -1, True, 0),
]


@pytest.mark.parametrize(
    ("rate", "max_retry", "priority", "admitted", "retry"),
    [c[1:] for c in RETRY_CASES],
    ids=[c[0] for c in RETRY_CASES],
)
def test_retry_after_follows_the_bucket(
    rate: float, max_retry: int, priority: int, admitted: bool, retry: int
) -> None:
    adm = PriorityAdmission()
    if rate > 0:  # drain the warm-up bucket (one second of tokens, at least MIN_BURST_TOKENS)
        for _ in range(int(max(MIN_BURST_TOKENS, rate))):
            assert adm.decide(3, rate, 0.0, max_retry).admitted
    assert adm.decide(priority, rate, 1.0, max_retry) == Admit(admitted, retry)


def test_after_warm_up_a_saturating_priority_leaves_nothing_below() -> None:
    adm = PriorityAdmission()
    rate = 10.0
    for t_ms, p in arrivals((0.0, 20.0), 5.0):  # priority 1 asks for twice the rate
        adm.decide(p, rate, t_ms, MAX_RETRY_S)
    alloc = adm.allocation_rps()
    assert alloc[1] == pytest.approx(rate)
    assert alloc[2:] == (0.0, 0.0)
    got = adm.decide(3, rate, 5_000.0, MAX_RETRY_S)
    assert got == Admit(False, MAX_RETRY_S)  # a_3 == 0: come back as late as allowed
    assert adm.demand_rps(5_000.0)[1] == pytest.approx(20.0, rel=0.1)


def test_a_new_directive_rate_applies_at_the_next_request() -> None:
    adm = PriorityAdmission()
    for t_ms, p in arrivals((0.0, 0.0, 0.0, 20.0), 5.0):
        adm.decide(p, 20.0, t_ms, MAX_RETRY_S)
    admitted = sum(
        adm.decide(p, 2.0, 5_000.0 + t_ms, MAX_RETRY_S).admitted
        for t_ms, p in arrivals((0.0, 0.0, 0.0, 20.0), 10.0)
    )
    assert admitted <= 2.0 * 10 + 20 + 1  # the new rate, plus at most the old burst


def test_idle_capacity_goes_to_a_new_burst_at_once() -> None:
    """Work-conserving: after an idle spell the estimate knows no demand, but the
    unreserved rate still reaches the priority that now asks for it."""
    adm = PriorityAdmission()
    for t_ms, p in arrivals((0.0, 1.0), 10.0):
        adm.decide(p, 50.0, t_ms, MAX_RETRY_S)
    admitted = sum(
        adm.decide(p, 50.0, 10_000.0 + t_ms, MAX_RETRY_S).admitted
        for t_ms, p in arrivals((0.0, 0.0, 0.0, 100.0), 2.0)
    )
    assert admitted >= 0.9 * 50 * 2


NOISE_CASES = [
    # (id, rate per gateway, Poisson demand of priority 1 as a share of the rate)
    ("slow-model-share", 1.5, 0.9),
    ("mid", 3.0, 0.9),
    ("fast-model-share", 8.0, 0.9),
    ("well-under-the-rate", 2.0, 0.6),
]


@pytest.mark.parametrize(
    ("rate", "share"), [c[1:] for c in NOISE_CASES], ids=[c[0] for c in NOISE_CASES]
)
def test_uneven_arrivals_under_the_rate_are_admitted(rate: float, share: float) -> None:
    """Requests that arrive unevenly (Poisson) at less than the rate pass: a bucket of a
    couple of tokens turned away a fifth to a third of them (2026-12-05: the closed loop
    then refused requests the engines had room for, and lost all-traffic SLOs against
    no control under a mild overload); MIN_BURST_TOKENS keeps it to a few %."""
    rng = random.Random(7)
    adm = PriorityAdmission()
    t_ms, refused, n = 0.0, 0, 0
    while t_ms < 600_000.0:
        t_ms += rng.expovariate(share * rate) * 1000.0
        got = adm.decide(1, rate, t_ms, MAX_RETRY_S)
        if t_ms >= 20_000.0:
            n += 1
            refused += not got.admitted
    assert refused / n < 0.08, (refused, n)


def test_time_going_backwards_is_harmless() -> None:
    adm = PriorityAdmission()
    for i in range(50):
        adm.decide(1, 10.0, 1_000.0 + 100.0 * i, MAX_RETRY_S)
    assert adm.decide(1, 10.0, 0.0, MAX_RETRY_S).retry_after_s >= 0
    assert adm.decide(0, 10.0, 0.0, MAX_RETRY_S).admitted


# --- the property --------------------------------------------------------------------------

demand_st = st.floats(min_value=0.0, max_value=30.0).map(lambda x: round(x, 1))


@settings(max_examples=40, deadline=None)
@example(rate=3.0, demand=(0.0, 2.0, 0.0, 1.0), max_retry=30)  # demand = rate, p2 idle
@example(rate=6.4, demand=(6.1, 0.0, 0.0, 10.4), max_retry=30)  # three buckets to fill
@given(
    rate=st.floats(min_value=1.0, max_value=40.0).map(lambda x: round(x, 1)),
    demand=st.tuples(demand_st, demand_st, demand_st, demand_st),
    max_retry=st.integers(min_value=0, max_value=120),
)
def test_property_admitted_rate_is_min_of_rate_and_demand(
    rate: float, demand: tuple[float, ...], max_retry: int
) -> None:
    """Over a long run at constant demand: the admitted rate is min(rate, demand) (priority
    0 exempt) within a few %; priority 0 is never rejected; a priority gets nothing while
    the priorities above it ask for more than the rate; Retry-After is in [1, max]."""
    # Skip the buckets' filling: at a demand equal to the rate, the headroom a higher
    # priority does not use reaches a lower one only once the buckets between them are
    # full (<= 10 tokens each at >= 0.2 tokens/s where the shortfall exceeds the
    # tolerance); over 20 s of 80 hypothesis found rate 3, demand (0, 2, 0, 1) 0.2 short.
    duration_s, skip_s = 220.0, 120.0
    adm = PriorityAdmission()
    admitted = [0] * PRIORITIES
    for t_ms, p in arrivals(demand, duration_s):
        got = adm.decide(p, rate, t_ms, max_retry)
        if got.admitted:
            admitted[p] += t_ms >= skip_s * 1000.0
            continue
        assert p > 0
        assert 1 <= got.retry_after_s <= max(1, max_retry)
    got_rps = [n / (duration_s - skip_s) for n in admitted]
    total = sum(demand)
    want_total = max(demand[0], min(rate, total))
    assert sum(got_rps) == pytest.approx(want_total, rel=0.04, abs=0.2)
    assert got_rps[0] == pytest.approx(demand[0], abs=0.05)
    above = 0.0
    for p in range(1, PRIORITIES):
        above += demand[p - 1]
        if above >= 1.1 * rate:
            assert got_rps[p] == 0.0, (p, got_rps)
    assert skip_s * 1000.0 > WARMUP_MS


# --- strict tiers (issue 47) -------------------------------------------------------------

STRICT_CASES = [
    # (id, rate, demand per priority 0..3, burst: priority and count at t = 30 s)
    ("a-p2-burst-borrows-from-p3", 10.0, (0.0, 2.0, 2.0, 4.0), (2, 25)),
    ("a-p1-burst-borrows-from-p3-then-p2", 10.0, (0.0, 2.0, 2.0, 4.0), (1, 40)),
    ("a-p0-burst-is-paid-by-p3-first", 10.0, (1.0, 2.0, 2.0, 4.0), (0, 30)),
]


@pytest.mark.parametrize(
    ("rate", "demand", "burst"), [c[1:] for c in STRICT_CASES], ids=[c[0] for c in STRICT_CASES]
)
def test_a_priority_is_refused_only_when_every_lower_one_is(
    rate: float, demand: tuple[float, ...], burst: tuple[int, int]
) -> None:
    """At every refusal of priority p, a request of any lower priority q > p arriving at
    the same instant is refused too (probed on a copy, so the probe changes nothing)."""
    import copy

    adm = PriorityAdmission()
    events = arrivals(demand, 60.0)
    events += [(30_000.0 + i, burst[0]) for i in range(burst[1])]
    events.sort()
    refused = [0] * PRIORITIES
    for t_ms, p in events:
        got = adm.decide(p, rate, t_ms, MAX_RETRY_S)
        if got.admitted:
            continue
        refused[p] += 1
        for q in range(p + 1, PRIORITIES):
            probe = copy.deepcopy(adm)
            assert not probe.decide(q, rate, t_ms, MAX_RETRY_S).admitted, (t_ms, p, q)
    assert refused[0] == 0


def test_borrowing_keeps_the_admitted_total_at_the_rate() -> None:
    """Strict tiers move tokens between priorities; they never add any."""
    got, _ = run(10.0, (0.0, 6.0, 6.0, 6.0), duration_s=360.0, skip_s=240.0)
    assert sum(got) == pytest.approx(10.0, rel=0.03)
    assert got[1] == pytest.approx(6.0, rel=0.03)
    assert got[2] == pytest.approx(4.0, rel=0.05, abs=0.1)
    assert got[3] < 0.2


# --- Retry-After: the expected drain (issue 47) ------------------------------------------

DRAIN_CASES = [
    # (id, tokens, a_p, max, λ_p, A_p, want): drain = (1 - tokens)/a_p + τ·max(0, λ_p - A_p)/A_p
    ("demand-fits-next-token", 0.5, 2.0, 30, 1.0, 4.0, 1),  # 0.25 s -> at least 1
    ("slow-token-no-excess", 0.0, 0.25, 30, 0.2, 0.25, 4),  # 4 s for the token
    ("twice-what-it-reaches", 0.0, 2.0, 30, 8.0, 4.0, 6),  # 0.5 + 5·4/4 = 5.5
    ("four-times", 0.9, 1.0, 30, 16.0, 4.0, 16),  # 0.1 + 5·12/4 = 15.1
    ("capped-by-the-directive", 0.0, 1.0, 10, 40.0, 1.0, 10),  # 1 + 195
    ("borrows-only-from-below", 0.0, 0.0, 30, 6.0, 3.0, 5),  # own a_p 0: 5·3/3
    ("nothing-reachable", 0.0, 0.0, 30, 6.0, 0.0, 30),
    ("max-0-still-1", 0.0, 0.0, 0, 6.0, 0.0, 1),
]


@pytest.mark.parametrize("case", [c[1:] for c in DRAIN_CASES], ids=[c[0] for c in DRAIN_CASES])
def test_retry_after_is_the_expected_drain(case: tuple[Any, ...]) -> None:
    tokens, alloc, max_retry, demand, reach, want = case
    got = drain_retry_after_s(tokens, alloc, max_retry, demand_rps=demand, reachable_rps=reach)
    assert got == want


def test_retry_after_grows_with_the_excess_in_an_overload() -> None:
    """Priority 3 asks for ~2x and ~4x the rate (nothing above it): its Retry-After is
    the drain of 5 s of excess, not the next token's second."""
    got: dict[float, int] = {}
    for factor in (2.0, 4.0):
        adm = PriorityAdmission()
        answer = None
        for t_ms, p in arrivals((0.0, 0.0, 0.0, 10.0 * factor), 30.0):
            a = adm.decide(p, 10.0, t_ms, 60)
            if not a.admitted:
                answer = a.retry_after_s
        assert answer is not None
        got[factor] = answer
    # τ·(λ - A)/A: 5 s at x2, 15 s at x4 (A = 1.1·λ capped at the rate = 10/s)
    assert got[2.0] == pytest.approx(6, abs=2)
    assert got[4.0] == pytest.approx(16, abs=3)
