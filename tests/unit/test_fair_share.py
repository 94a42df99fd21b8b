"""Fair shares across tenants (issue 52): producers/admission.py's max-min shares and
the tenant buckets of PriorityAdmission (strict tiers within each tenant's share)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from producers.admission import MAX_TENANTS, PriorityAdmission, max_min_shares

MAX_RETRY_S = 30
EPS = 1e-6


@pytest.mark.parametrize(
    ("capacity", "demands", "weights", "want"),
    [
        # enough for everyone: each gets its demand
        (10.0, {"a": 2.0, "b": 3.0}, None, {"a": 2.0, "b": 3.0}),
        # equal split when both want more than half
        (10.0, {"a": 8.0, "b": 9.0}, None, {"a": 5.0, "b": 5.0}),
        # the light tenant is served in full; the heavy one gets the rest
        (10.0, {"light": 1.0, "heavy": 100.0}, None, {"light": 1.0, "heavy": 9.0}),
        # three light, one heavy: the light ones whole, the heavy one the rest
        (
            10.0,
            {"a": 1.0, "b": 1.5, "c": 0.5, "heavy": 50.0},
            None,
            {"a": 1.0, "b": 1.5, "c": 0.5, "heavy": 7.0},
        ),
        # weights: 3:1 of a short capacity
        (8.0, {"gold": 100.0, "std": 100.0}, {"gold": 3.0}, {"gold": 6.0, "std": 2.0}),
        # a weighted tenant that wants less gives the rest back
        (8.0, {"gold": 1.0, "std": 100.0}, {"gold": 3.0}, {"gold": 1.0, "std": 7.0}),
        # an idle tenant (demand 0) takes nothing: its share goes to the others
        (6.0, {"idle": 0.0, "a": 10.0, "b": 10.0}, None, {"idle": 0.0, "a": 3.0, "b": 3.0}),
        # a weight that is not > 0 counts as 1
        (4.0, {"a": 10.0, "b": 10.0}, {"a": 0.0, "b": -2.0}, {"a": 2.0, "b": 2.0}),
        # nothing to share
        (0.0, {"a": 1.0}, None, {"a": 0.0}),
        (5.0, {}, None, {}),
    ],
)
def test_max_min_shares_table(
    capacity: float,
    demands: dict[str, float],
    weights: dict[str, float] | None,
    want: dict[str, float],
) -> None:
    got = max_min_shares(capacity, demands, weights)
    assert got.keys() == want.keys()
    for t, x in want.items():
        assert got[t] == pytest.approx(x)


demand_maps = st.dictionaries(
    st.sampled_from([f"t{i}" for i in range(8)]),
    st.floats(min_value=0.0, max_value=1e4, allow_nan=False),
    max_size=8,
)
weight_maps = st.dictionaries(
    st.sampled_from([f"t{i}" for i in range(8)]),
    st.floats(min_value=0.01, max_value=100.0, allow_nan=False),
    max_size=8,
)


@settings(max_examples=300, deadline=None)
@given(
    capacity=st.floats(min_value=0.0, max_value=1e4, allow_nan=False),
    demands=demand_maps,
    weights=st.none() | weight_maps,
)
def test_max_min_invariants(
    capacity: float, demands: dict[str, float], weights: dict[str, float] | None
) -> None:
    """No tenant gets more than its demand; the shares add up to min(capacity, total
    demand); no tenant is below its demand while another gets more per unit of weight."""
    shares = max_min_shares(capacity, demands, weights)

    def w(t: str) -> float:
        return 1.0 if weights is None else weights.get(t, 1.0)

    tol = 1e-6 * max(1.0, capacity)
    for t, d in demands.items():
        assert -tol <= shares[t] <= d + tol
    assert math.isclose(
        sum(shares.values()), min(capacity, sum(demands.values())), rel_tol=1e-9, abs_tol=tol
    )
    for t, d in demands.items():
        if shares[t] < d - tol:  # t is held below its demand: nobody gets more per weight
            for u in demands:
                assert shares[u] / w(u) <= shares[t] / w(t) + tol


def feed(
    adm: PriorityAdmission,
    tenants_rps: dict[str, float],
    rate_rps: float,
    *,
    priority: int = 1,
    duration_s: float = 120.0,
    skip_s: float = 30.0,
    weights: dict[str, float] | None = None,
) -> tuple[dict[str, float], dict[str, list[int]]]:
    """Evenly spaced arrivals per tenant at ``priority``: the admitted rate per tenant
    after ``skip_s``, and each tenant's Retry-After of its refusals."""
    arrivals: list[tuple[float, str]] = []
    for i, (t, rps) in enumerate(sorted(tenants_rps.items())):
        step_ms = 1000.0 / rps
        at = (i * 0.137 % 1.0) * step_ms
        while at < duration_s * 1000.0:
            arrivals.append((at, t))
            at += step_ms
    arrivals.sort()
    admitted = dict.fromkeys(tenants_rps, 0)
    retry: dict[str, list[int]] = {t: [] for t in tenants_rps}
    for at, t in arrivals:
        got = adm.decide(priority, rate_rps, at, MAX_RETRY_S, tenant=t, weights=weights)
        if at >= skip_s * 1000.0:
            if got.admitted:
                admitted[t] += 1
            else:
                retry[t].append(got.retry_after_s)
    span_s = duration_s - skip_s
    return {t: n / span_s for t, n in admitted.items()}, retry


@pytest.mark.parametrize(
    ("tenants_rps", "rate_rps", "weights", "want_rps"),
    [
        # one heavy tenant beside three light ones: the light ones are served in full
        ({"heavy": 40.0, "l1": 2.0, "l2": 2.0, "l3": 2.0}, 20.0, None,
         {"heavy": 14.0, "l1": 2.0, "l2": 2.0, "l3": 2.0}),
        # two heavy tenants split what the light one leaves
        ({"h1": 30.0, "h2": 30.0, "light": 2.0}, 20.0, None,
         {"h1": 9.0, "h2": 9.0, "light": 2.0}),
        # weights 3:1 between two heavy tenants
        ({"gold": 30.0, "std": 30.0}, 20.0, {"gold": 3.0}, {"gold": 15.0, "std": 5.0}),
        # under the rate: nobody is refused
        ({"a": 5.0, "b": 3.0}, 20.0, None, {"a": 5.0, "b": 3.0}),
    ],
)  # fmt: skip
def test_admitted_rate_per_tenant_is_the_fair_share(
    tenants_rps: dict[str, float],
    rate_rps: float,
    weights: dict[str, float] | None,
    want_rps: dict[str, float],
) -> None:
    got, _ = feed(PriorityAdmission(), tenants_rps, rate_rps, weights=weights)
    for t, want in want_rps.items():
        assert got[t] == pytest.approx(want, rel=0.12, abs=0.3), (t, got)


def test_without_tenants_the_heavy_sender_takes_most() -> None:
    """The same arrivals with no tenant named: one anonymous tenant, as before issue 52
    (the light senders lose in proportion to what they send)."""
    adm = PriorityAdmission()
    rates = {"heavy": 40.0, "l1": 2.0, "l2": 2.0}
    admitted = dict.fromkeys(rates, 0)
    arrivals = sorted(
        (i * 1000.0 / rps + k * 0.3, t)
        for k, (t, rps) in enumerate(rates.items())
        for i in range(int(rps * 120))
    )
    for at, t in arrivals:
        if adm.decide(1, 20.0, at, MAX_RETRY_S).admitted and at >= 30_000:
            admitted[t] += 1
    light_share = admitted["l1"] / (2.0 * 90)
    assert light_share < 0.6  # the light tenants are refused as often as the heavy one


def test_the_heavy_tenant_absorbs_the_refusals_and_hears_a_later_retry() -> None:
    _, retry = feed(PriorityAdmission(), {"heavy": 40.0, "light": 2.0}, 20.0)
    assert len(retry["heavy"]) > 100
    assert retry["light"] == []
    assert all(1 <= r <= MAX_RETRY_S for r in retry["heavy"])


def test_an_idle_tenant_gives_its_share_back() -> None:
    """A tenant that stops sending stops counting: the remaining heavy one gets the
    whole rate once its demand estimate has decayed."""
    adm = PriorityAdmission()
    feed(adm, {"a": 20.0, "b": 20.0}, 20.0, duration_s=60.0)
    admitted = 0
    for i in range(int(30 * 40.0)):  # b goes idle; a sends 40/s from 60 s to 90 s
        at = 60_000.0 + i * 25.0
        if adm.decide(1, 20.0, at, MAX_RETRY_S, tenant="a").admitted and at >= 80_000:
            admitted += 1
    assert admitted / 10.0 == pytest.approx(20.0, rel=0.1)


def test_priorities_stay_strict_with_tenants() -> None:
    """A flooding tenant at priority 1 takes priority 1's allocation, never priority 0's."""
    adm = PriorityAdmission()
    admitted = {0: 0, 1: 0}
    for i in range(12_000):  # 120 s: p0 at 5/s (tenant x), p1 at 95/s (tenant flood)
        at = i * 10.0
        p, t = (0, "x") if i % 20 == 0 else (1, "flood")
        if adm.decide(p, 20.0, at, MAX_RETRY_S, tenant=t).admitted and at >= 30_000:
            admitted[p] += 1
    assert admitted[0] == 450  # every priority-0 request (5/s over 90 s)
    assert admitted[1] / 90 == pytest.approx(15.0, rel=0.1)


def test_the_tenants_tracked_are_bounded() -> None:
    adm = PriorityAdmission()
    for i in range(MAX_TENANTS * 3):
        adm.decide(2, 5.0, i * 10.0, MAX_RETRY_S, tenant=f"t{i}")
    assert len(adm.tenant_shares_rps(2)) <= MAX_TENANTS


def feed_streams(
    adm: PriorityAdmission,
    streams: dict[tuple[str, int], float],
    rate_rps: float,
    *,
    named: bool = True,
    duration_s: float = 120.0,
    skip_s: float = 30.0,
) -> dict[tuple[str, int], float]:
    """Evenly spaced arrivals per (tenant, priority) (``named``: the tenant passed, else
    none, as with ``fair_share`` off): the admitted rate of each after ``skip_s``."""
    arrivals: list[tuple[float, str, int]] = []
    for i, ((t, p), rps) in enumerate(sorted(streams.items())):
        step_ms = 1000.0 / rps
        at = (i * 0.137 % 1.0) * step_ms
        while at < duration_s * 1000.0:
            arrivals.append((at, t, p))
            at += step_ms
    arrivals.sort()
    admitted = dict.fromkeys(streams, 0)
    for at, t, p in arrivals:
        got = adm.decide(p, rate_rps, at, MAX_RETRY_S, tenant=t if named else None)
        if got.admitted and at >= skip_s * 1000.0:
            admitted[(t, p)] += 1
    return {k: n / (duration_s - skip_s) for k, n in admitted.items()}


@pytest.mark.parametrize(
    ("streams", "named", "want_rps"),
    [
        # one tenant floods priority 1: the others' priority 2 is within their shares
        # and served in full; the flooding tenant gets what they leave
        ({("flood", 1): 40.0, ("b", 2): 3.0, ("c", 2): 3.0, ("c", 1): 1.0}, True,
         {("flood", 1): 13.0, ("b", 2): 3.0, ("c", 2): 3.0, ("c", 1): 1.0}),
        # blind to tenants (fair_share off): strict tiers, priority 1 takes it all
        ({("flood", 1): 40.0, ("b", 2): 3.0, ("c", 2): 3.0, ("c", 1): 1.0}, False,
         {("flood", 1): 19.5, ("b", 2): 0.0, ("c", 2): 0.0}),
        # within a tenant's share its own priorities are strict: the held tenant's
        # priority 1 is served before its priority 3
        ({("heavy", 1): 12.0, ("heavy", 3): 12.0, ("light", 2): 4.0}, True,
         {("heavy", 1): 12.0, ("heavy", 3): 4.0, ("light", 2): 4.0}),
        # two tenants above their shares split what the light one leaves, whatever
        # their priorities
        ({("h1", 1): 30.0, ("h2", 2): 30.0, ("light", 3): 2.0}, True,
         {("h1", 1): 9.0, ("h2", 2): 9.0, ("light", 3): 2.0}),
    ],
)  # fmt: skip
def test_a_flood_at_one_priority_leaves_the_other_tenants_their_shares(
    streams: dict[tuple[str, int], float],
    named: bool,
    want_rps: dict[tuple[str, int], float],
) -> None:
    got = feed_streams(PriorityAdmission(), streams, 20.0, named=named)
    for k, want in want_rps.items():
        assert got[k] == pytest.approx(want, rel=0.12, abs=0.3), (k, got)


def test_a_light_tenants_burst_is_served() -> None:
    """A light tenant sending 5 requests at once every 20 s (0.25/s on average) beside a
    flooding one: its bursts come out of the bottom half of its priority's bucket, which
    a tenant above its share may not take (from its second burst on: the first finds
    nothing set aside for a tenant not seen yet)."""
    adm = PriorityAdmission()
    admitted = refused = 0
    for i in range(12_000):  # 120 s: the flood at 100/s on priority 1
        at = i * 10.0
        adm.decide(1, 20.0, at, MAX_RETRY_S, tenant="flood")
        if i % 2_000 == 1_000:  # at 10 s, 30 s, ... 110 s
            for k in range(5):
                got = adm.decide(2, 20.0, at + k * 0.1, MAX_RETRY_S, tenant="light")
                if at >= 30_000:  # the first burst left out
                    admitted += got.admitted
                    refused += not got.admitted
    assert (admitted, refused) == (25, 0)
