"""Capacity-aware admission by strict priority (issue 35): one gateway's share of a scope.

A directive's ``admit_rps`` is what a scope's (a model's) gateways admit together;
each of ``admit_gateways`` instances enforces ``admit_rps / admit_gateways``. One
:class:`PriorityAdmission` per (gateway, scope) decides each request arriving there:
priority 0 (real-time) first, then 1, 2 and 3 fill what is left.

Pure and clock-free: the caller passes the time (``t_ms``, any monotonic origin) and
the rate in force (so a new directive applies at the next request). Memory is O(number
of priorities): four counters, four buckets, four allocations.

How it decides
--------------
* **Demand.** Each priority's arrival rate ``λ_p`` (requests reaching admission,
  admitted or not) is an exponentially decaying count with time constant
  :data:`TAU_MS` = 5 s, divided by ``τ · (1 - exp(-h/τ))`` where ``h`` is the time
  since the first request (the bias correction for a short history, so the estimate
  is usable after a second rather than after several τ).
* **Allocation (strict priority).** ``a_0 = min((1+H)·λ_0, max(rate, λ_0))`` and
  ``a_p = min((1+H)·λ_p, max(0, rate - Σ_{q<p} a_q))`` with the headroom
  :data:`HEADROOM` H = 10 %, so a priority whose demand is met is not starved by the
  estimate's noise. The rest, ``spare = max(0, rate - Σ a_p)``, is not lost (below).
* **Buckets.** Priority ``p`` has a token bucket refilled at ``a_p`` with a burst of
  ``max(10, a_p · 1 s)`` tokens (:data:`MIN_BURST_TOKENS`): a bucket of a few tokens
  turns away a share of arrivals that merely come unevenly at the rate it is refilled.
  The spare rate enters at priority 0's bucket, and what a full bucket cannot hold
  overflows into the next priority's; what overflows the last one is lost. The inflow
  is therefore ``max(rate, a_0)``: a priority whose demand the estimate has not caught
  up with yet (a new burst after an idle spell) still gets the unreserved capacity,
  highest priority first, so admission is work-conserving without admitting more than
  ``rate`` (priority 0 aside). While priority 0 alone asks for the rate or more, its
  bucket's overflow is only the estimate's noise and is dropped.
* **Decision (strict tiers).** A request takes a token from its own priority's
  bucket; when that is empty, from the lowest priority's bucket below it that holds
  one (priority 3's first, then 2's, ...). So a priority is turned away only when
  every lower priority's bucket is empty too: every lower priority is already being
  turned away at this gateway and scope. Priority 0 is never evicted: it passes
  whether or not it found a token. Priority ``p >= 1`` is admitted iff its bucket or
  a lower priority's holds a token. (A bucket refilled at its allocation empties when
  its priority asks for more than it was allocated; without borrowing, priority 2 was
  refused as often as priority 3 in a x4 overload while priority 3's bucket still
  held tokens: issue 47.)
* **Warm-up.** Until the estimator has :data:`WARMUP_MS` = 1 s of history, one shared
  bucket at ``rate`` (burst one second, at least :data:`MIN_BURST_TOKENS`) admits first
  come, first served, priority 0 exempt. At the switch its tokens are handed to the
  priority buckets in priority order.
* **Retry-After: the expected drain** (issue 47: refused clients came back within a
  second or two, all together, and stormed). A rejected priority ``p`` can be served
  from its own allocation and from every lower priority's (it borrows from them first),
  ``A_p = Σ_{q>=p} a_q``; what it asks beyond that, ``E_p = max(0, λ_p - A_p)``, is its
  excess. The excess of one estimator horizon (``E_p · τ`` requests) is drained at
  ``A_p``, and the bucket needs ``(1 - tokens_p) / a_p`` for its next token::

      drain_s = (1 - tokens_p) / a_p  +  τ · E_p / A_p

  The answer is ``ceil(drain_s)``, at least 1 s and at most ``max_retry_after_s`` (the
  directive's ``retry_after_s``, taken as at least 1: a rejection never says "retry at
  once"); ``max_retry_after_s`` when ``A_p == 0`` (higher priorities take the whole
  rate: capacity is not expected back while the directive holds). A priority whose
  demand fits (``E_p = 0``, refused on a burst) hears "in a second or two"; one asking
  twice what it can get, ``τ`` = 5 s more. :mod:`producers.enforcement` spreads the
  answer per request (so the clients refused together do not return together).

Fair shares across tenants (issue 52)
-------------------------------------
Blind to tenants, the tenant that sends most takes most, and with strict tiers one
tenant's flood at priority 1 takes what priority 2 had of every tenant's. With several
tenants at priorities >= 1 (the directive's ``fair_share``: each request names its
tenant) the allocation is worked out per tenant first:

* **Shares.** Each tenant's demand at priorities 1-3, ``D_t = (1+H_f)·Σ_p λ_{p,t}``
  (a decaying count per (priority, tenant), :data:`TENANT_TAU_MS` = 20 s, bias-corrected
  as above; :data:`FAIR_HEADROOM` H_f = 50 %), shares what priority 0 leaves,
  ``rate - a_0``, max-min fairly (:func:`max_min_shares`: weighted water-filling,
  weights from the directive's ``tenant_weights``, 1 for a tenant it does not name). A
  tenant whose share is below its demand is *held*.
* **Strict tiers within a share.** Each tenant's share is filled by its own priorities
  in order (its priority 1 first): ``e_{p,t}``, and ``a_p = Σ_t e_{p,t}``. Priority 0 is
  as above. With one tenant this is the strict allocation above.
* **Buckets.** Each (priority, tenant) has a token bucket refilled at ``e_{p,t}`` (burst
  as a priority's). A request of a tenant not held, or held with a token in its own
  bucket, is *within its share*: it takes its priority's token, else the top half of a
  lower priority's bucket (lowest first), else it is refused with its priority's
  drain. A held tenant with its own bucket empty is *above its share*: it takes only the
  top half of its own or a lower priority's bucket (what the traffic within its shares
  left unused: work-conserving), else it is refused first, with its own drain
  (``drain_s`` over its share) as ``Retry-After``.

Priorities stay strict within each tenant's share and among what tenants leave
unused; what a tenant sends beyond its share is turned away before any other tenant's
traffic within its share, whatever its priority (a flood at priority 1 no longer takes
the other tenants' priority 2: docs/admission.md). Why the longer horizon and the
headroom: a light tenant's requests come in bursts; judged over 5 s at 1.1 x demand, a
burst held it and its bucket ran dry. A tenant that falls idle stops counting (its
demand decays) and what its bucket does not use goes to the others. Requests without a
tenant are one tenant (``""``). At most :data:`MAX_TENANTS` tenants are tracked per
priority; the least active is forgotten first.

A request held at the gateway for a token (:mod:`producers.enforcement`, hold before
refusal) asks again with ``count=False``: its arrival is counted once. A request that
must wait behind held ones is counted without deciding (:meth:`PriorityAdmission.arrive`).

Priorities outside 0..3 are clamped into that range (as the event contract's).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

PRIORITIES: Final = 4  # 0 (real-time, never evicted) ... 3 (fallback)
TAU_MS: Final = 5_000.0  # time constant of the arrival-rate estimate
# Fair shares (module docstring): a tenant's demand over a longer horizon than a
# priority's, and its share worked out for 1.5 x its demand (what it leaves unused stays
# in the top half of a bucket, where a tenant above its share may take it). Chosen on the
# flood scenario (bench/ADMISSION-HISTORY.md, with the neighbours measured).
TENANT_TAU_MS: Final = 20_000.0
FAIR_HEADROOM: Final = 0.5
WARMUP_MS: Final = 1_000.0  # history before the per-priority allocation is trusted
BURST_S: Final = 1.0  # a bucket holds this many seconds of its refill (or MIN_BURST_TOKENS)
# A bucket holds at least this many tokens. Arrivals are uneven even at a steady rate,
# and a bucket refuses what comes while it is empty: with Poisson arrivals at its
# refill rate less the 10 % headroom, a bucket of B tokens refuses about
# (1 - r) r^B / (1 - r^(B+1)) of them (r = 1 / 1.1, the M/M/1/B loss): 30 % with B = 2
# (before 2026-12-05), 5 % with B = 10. Each gateway's share of a slow model's rate is
# 1-3 req/s, so with 2 the closed loop refused requests the engines had room for (the
# backtests before and after: docs/control.md, section 2). It keeps the property two
# tokens were for: whatever its inflow, a bucket cannot overflow between two arrivals of
# its own priority while its demand exceeds that inflow. What a larger burst lets
# through queues in the engines, where the queue cut-off bounds the wait it adds ahead
# of priority 0.
MIN_BURST_TOKENS: Final = 10.0
HEADROOM: Final = 0.1  # a served priority is allocated (1 + HEADROOM) x its demand
MAX_TENANTS: Final = 256  # tenants tracked per priority (the least active forgotten first)
NO_TENANT: Final = ""  # the tenant of requests that name none


def max_min_shares(
    capacity: float, demands: Mapping[str, float], weights: Mapping[str, float] | None = None
) -> dict[str, float]:
    """Weighted max-min fair shares of ``capacity`` among ``demands`` (water-filling):
    no tenant gets more than its demand; a tenant below its demand gets at least as much
    per unit of weight as any other; the shares add up to ``min(capacity, sum of
    demands)``. A weight not given (or not > 0) is 1."""

    def w(t: str) -> float:
        x = 1.0 if weights is None else weights.get(t, 1.0)
        return x if math.isfinite(x) and x > 0.0 else 1.0

    shares = dict.fromkeys(demands, 0.0)
    active = sorted((t for t, d in demands.items() if d > 0.0), key=lambda t: demands[t] / w(t))
    left = max(0.0, capacity)
    weight_left = sum(w(t) for t in active)
    for i, t in enumerate(active):  # by demand per unit of weight, smallest first
        fair = left * w(t) / weight_left if weight_left > 0.0 else 0.0
        if demands[t] <= fair:
            shares[t] = demands[t]
        else:  # this tenant and every later one are cut to the same level per weight
            for u in active[i:]:
                shares[u] = left * w(u) / weight_left
            break
        left -= demands[t]
        weight_left -= w(t)
    return shares


class _Tenant:
    """One tenant at one priority: its decayed arrival count, bucket and share."""

    __slots__ = ("count", "held", "last_ms", "share_rps", "tokens")

    def __init__(self, t_ms: float) -> None:
        self.count = 0.0
        self.held = False  # its share is below its demand (it is cut by the water-filling)
        self.last_ms = t_ms
        self.tokens = MIN_BURST_TOKENS
        self.share_rps = 0.0

    def decayed(self, t_ms: float) -> float:
        return self.count * math.exp(-max(0.0, t_ms - self.last_ms) / TENANT_TAU_MS)


@dataclass(frozen=True, slots=True)
class Admit:
    """The answer for one request; ``retry_after_s`` is 0 when admitted."""

    admitted: bool
    retry_after_s: int = 0


ADMITTED: Final = Admit(admitted=True)


def _burst(rate_rps: float) -> float:
    return max(MIN_BURST_TOKENS, rate_rps * BURST_S)


def _priority_burst(alloc_rps: float) -> float:
    return max(MIN_BURST_TOKENS, alloc_rps * BURST_S)


def drain_retry_after_s(
    tokens: float,
    refill_rps: float,
    max_retry_after_s: int,
    demand_rps: float = 0.0,
    reachable_rps: float | None = None,
) -> int:
    """The expected drain (module docstring): the next token at ``refill_rps`` plus the
    excess of one horizon (``demand_rps`` over ``reachable_rps``, the refill of this
    priority and every lower one) drained at ``reachable_rps``; in ``[1, max]``."""
    ceiling = max(1, max_retry_after_s)
    reach = refill_rps if reachable_rps is None else reachable_rps
    if refill_rps <= 0.0 and reach <= 0.0:
        return ceiling
    token_s = max(0.0, 1.0 - tokens) / refill_rps if refill_rps > 0.0 else 0.0
    excess_rps = max(0.0, demand_rps - reach)
    wait_s = token_s + TAU_MS / 1000.0 * excess_rps / reach
    if not math.isfinite(wait_s):
        return ceiling
    return min(ceiling, max(1, math.ceil(wait_s)))


class PriorityAdmission:
    """Strict-priority admission at a given rate for one (gateway, scope); see the
    module docstring. Not thread-safe: one caller at a time (an event loop, a
    simulator)."""

    __slots__ = (
        "_alloc_rps",
        "_counts",
        "_fair",
        "_first_ms",
        "_last_ms",
        "_p0_overflows",
        "_shared",
        "_spare_rps",
        "_tenants",
        "_tokens",
        "_warm",
    )

    def __init__(self) -> None:
        self._counts = [0.0] * PRIORITIES  # decayed arrival counts
        self._tokens = [0.0] * PRIORITIES
        self._alloc_rps = [0.0] * PRIORITIES
        self._spare_rps = 0.0
        self._p0_overflows = True  # priority 0's demand is below the rate
        self._shared = 0.0  # the warm-up bucket
        self._first_ms: float | None = None
        self._last_ms = 0.0
        self._warm = False
        self._fair = False  # several tenants at priorities >= 1 (fair shares)
        self._tenants: list[dict[str, _Tenant]] = [{} for _ in range(PRIORITIES)]

    def demand_rps(self, t_ms: float) -> tuple[float, ...]:
        """The estimated arrival rate per priority as of the last request (``t_ms``
        sets the history length; no decay is applied)."""
        if self._first_ms is None:
            return (0.0,) * PRIORITIES
        h_ms = max(0.0, t_ms - self._first_ms)
        norm_s = TAU_MS / 1000.0 * -math.expm1(-h_ms / TAU_MS)
        if norm_s <= 0.0:
            return (0.0,) * PRIORITIES
        return tuple(c / norm_s for c in self._counts)

    def allocation_rps(self) -> tuple[float, ...]:
        """Each priority's refill rate as last computed (zeros during warm-up)."""
        return tuple(self._alloc_rps)

    def tenant_shares_rps(self, priority: int) -> dict[str, float]:
        """Each tracked tenant's fair share of ``priority``'s allocation, as last
        computed (requests/s)."""
        return {t: x.share_rps for t, x in self._tenants[priority].items()}

    def decide(
        self,
        priority: int,
        rate_rps: float,
        t_ms: float,
        max_retry_after_s: int,
        *,
        tenant: str | None = None,
        weights: Mapping[str, float] | None = None,
        count: bool = True,
    ) -> Admit:
        """Admit or reject one request of ``priority`` (from ``tenant``; None: the
        one anonymous tenant) arriving at ``t_ms`` when this gateway may admit
        ``rate_rps`` in all; ``weights``: the tenants' weights in the fair shares.
        ``count`` False: a request already counted asks again (one held at the gateway,
        :mod:`producers.enforcement`): its arrival is not counted twice."""
        p = min(max(priority, 0), PRIORITIES - 1)
        rate = max(0.0, rate_rps)
        own = self._arrive(p, rate, t_ms, tenant, weights, count=count)
        if not self._warm:
            return self._decide_warming(p, rate, max_retry_after_s)
        if p > 0 and self._fair:
            return self._decide_fair(p, own, max_retry_after_s)
        if self._tokens[p] >= 1.0:
            self._tokens[p] -= 1.0
            own.tokens = max(0.0, own.tokens - 1.0)
            return ADMITTED
        lender = self._lender(p)
        if lender is not None:  # strict tiers: a lower priority pays first
            self._tokens[lender] -= 1.0
            own.tokens = max(0.0, own.tokens - 1.0)
            return ADMITTED
        if p == 0:
            return ADMITTED  # never evicted
        return self._refused(p, max_retry_after_s)

    def arrive(
        self,
        priority: int,
        rate_rps: float,
        t_ms: float,
        *,
        tenant: str | None = None,
        weights: Mapping[str, float] | None = None,
    ) -> None:
        """Count one arrival of ``priority`` at ``t_ms`` without deciding it (a request
        that must wait behind held ones of its priority or higher takes no token)."""
        p = min(max(priority, 0), PRIORITIES - 1)
        self._arrive(p, max(0.0, rate_rps), t_ms, tenant, weights, count=True)

    def _arrive(
        self,
        p: int,
        rate: float,
        t_ms: float,
        tenant: str | None,
        weights: Mapping[str, float] | None,
        *,
        count: bool,
    ) -> _Tenant:
        """Refill to ``t_ms``, count the arrival (``count``), allocate: the request's
        tenant record."""
        if self._first_ms is None:
            self._first_ms = self._last_ms = t_ms
            self._shared = _burst(rate) if rate > 0.0 else 0.0
        dt_ms = max(0.0, t_ms - self._last_ms)
        self._last_ms = max(self._last_ms, t_ms)
        self._refill(dt_ms / 1000.0, rate)
        decay = math.exp(-dt_ms / TAU_MS)
        for q in range(PRIORITIES):
            self._counts[q] *= decay
        if count:
            self._counts[p] += 1.0
        name = NO_TENANT if tenant is None else tenant
        own = self._tenant(p, name, t_ms, count=count)
        if not self._warm and self._last_ms - self._first_ms >= WARMUP_MS:
            self._warm = True
            self._allocate(rate, weights)
            left = self._shared
            for q in range(PRIORITIES):
                self._tokens[q] = min(_priority_burst(self._alloc_rps[q]), left)
                left -= self._tokens[q]
        if self._warm:
            self._allocate(rate, weights)
        return own

    def _decide_fair(self, p: int, own: _Tenant, max_retry_after_s: int) -> Admit:
        """Priority ``p >= 1`` among several tenants (module docstring): within its
        tenant's share, by strict tiers; above it, only the top half of a bucket (what
        the traffic within its shares left unused), else refused first."""
        within = not own.held or own.tokens >= 1.0  # within its tenant's share
        if within and self._tokens[p] >= 1.0:
            self._tokens[p] -= 1.0
            own.tokens = max(0.0, own.tokens - 1.0)
            return ADMITTED
        # what the traffic within its shares left unused: the top half of a bucket, a
        # lower priority's first (its own priority's only for a tenant above its share)
        for q in range(PRIORITIES - 1, p if within else p - 1, -1):
            if self._tokens[q] >= 1.0 + _priority_burst(self._alloc_rps[q]) / 2.0:
                self._tokens[q] -= 1.0
                own.tokens = max(0.0, own.tokens - 1.0)
                return ADMITTED
        if within:
            return self._refused(p, max_retry_after_s)
        return Admit(
            admitted=False,
            retry_after_s=drain_retry_after_s(
                own.tokens,
                own.share_rps,
                max_retry_after_s,
                demand_rps=own.count / self._norm_s(TENANT_TAU_MS),
                reachable_rps=own.share_rps,
            ),
        )

    def refusal(self, priority: int, max_retry_after_s: int) -> Admit:
        """The refusal of a request of ``priority`` now, with its drain as
        ``Retry-After`` (as :meth:`decide` refuses: no state changes)."""
        p = min(max(priority, 1), PRIORITIES - 1)
        if not self._warm:
            rate = sum(self._alloc_rps) + self._spare_rps
            return Admit(
                admitted=False,
                retry_after_s=drain_retry_after_s(self._shared, rate, max_retry_after_s),
            )
        return self._refused(p, max_retry_after_s)

    def _refused(self, p: int, max_retry_after_s: int) -> Admit:
        return Admit(
            admitted=False,
            retry_after_s=drain_retry_after_s(
                self._tokens[p],
                self._alloc_rps[p],
                max_retry_after_s,
                demand_rps=self.demand_rps(self._last_ms)[p],
                reachable_rps=sum(self._alloc_rps[p:]),
            ),
        )

    def _norm_s(self, tau_ms: float = TAU_MS) -> float:
        """The bias-corrected horizon (s) a decayed count is divided by for a rate."""
        if self._first_ms is None:
            return 0.0
        h_ms = max(0.0, self._last_ms - self._first_ms)
        return max(1e-9, tau_ms / 1000.0 * -math.expm1(-h_ms / tau_ms))

    def _tenant(self, p: int, name: str, t_ms: float, *, count: bool = True) -> _Tenant:
        """Count one arrival of tenant ``name`` at priority ``p`` (tracked, or added;
        ``count`` False: refilled only)."""
        tenants = self._tenants[p]
        x = tenants.get(name)
        if x is None:
            if len(tenants) >= MAX_TENANTS:  # forget the least active
                del tenants[min(tenants, key=lambda t: tenants[t].decayed(t_ms))]
            x = tenants[name] = _Tenant(t_ms)
        dt_ms = max(0.0, t_ms - x.last_ms)
        x.count = x.count * math.exp(-dt_ms / TENANT_TAU_MS) + (1.0 if count else 0.0)
        burst = _priority_burst(x.share_rps)
        x.tokens = min(burst, x.tokens + x.share_rps * dt_ms / 1000.0)
        x.last_ms = max(x.last_ms, t_ms)
        return x

    def _lender(self, p: int) -> int | None:
        """The lowest priority below ``p`` whose bucket holds a token, if any."""
        for q in range(PRIORITIES - 1, p, -1):
            if self._tokens[q] >= 1.0:
                return q
        return None

    def _decide_warming(self, p: int, rate: float, max_retry_after_s: int) -> Admit:
        if self._shared >= 1.0:
            self._shared -= 1.0
            return ADMITTED
        if p == 0:
            return ADMITTED
        return Admit(
            admitted=False, retry_after_s=drain_retry_after_s(self._shared, rate, max_retry_after_s)
        )

    def _refill(self, dt_s: float, rate: float) -> None:
        if dt_s <= 0.0:
            return
        if not self._warm:
            self._shared = min(_burst(rate), self._shared + rate * dt_s) if rate > 0.0 else 0.0
            return
        overflow = self._spare_rps * dt_s
        for q in range(PRIORITIES):
            a = self._alloc_rps[q]
            cap = _priority_burst(a)
            level = self._tokens[q] + a * dt_s + overflow
            overflow = max(0.0, level - cap) if q > 0 or self._p0_overflows else 0.0
            self._tokens[q] = min(level, cap)

    def _allocate(self, rate: float, weights: Mapping[str, float] | None) -> None:
        demand = self.demand_rps(self._last_ms)
        self._p0_overflows = demand[0] < rate
        # priority 0 takes what it needs, its headroom only up to the rate
        self._alloc_rps[0] = min((1.0 + HEADROOM) * demand[0], max(rate, demand[0]))
        left = max(0.0, rate - self._alloc_rps[0])
        names = {t for q in range(1, PRIORITIES) for t in self._tenants[q]}
        self._fair = len(names) > 1
        if not self._fair:  # one tenant: strict tiers
            for q in range(1, PRIORITIES):
                a = min((1.0 + HEADROOM) * demand[q], left)
                self._alloc_rps[q] = a
                left = max(0.0, left - a)
            self._spare_rps = left
            return
        # each tenant's max-min share of what priority 0 leaves, over its demand at
        # priorities 1-3, filled by its own priorities in order (module docstring)
        norm_s = self._norm_s(TENANT_TAU_MS)
        t_ms = self._last_ms
        scale = (1.0 + FAIR_HEADROOM) / norm_s
        wants = [
            {t: scale * x.decayed(t_ms) for t, x in self._tenants[q].items()}
            for q in range(PRIORITIES)
        ]
        totals = {t: sum(wants[q].get(t, 0.0) for q in range(1, PRIORITIES)) for t in names}
        for q in range(1, PRIORITIES):
            self._alloc_rps[q] = 0.0
        for t, share_rps in max_min_shares(left, totals, weights).items():
            rest = share_rps
            held = share_rps < totals[t] * (1.0 - 1e-9)
            for q in range(1, PRIORITIES):
                x = self._tenants[q].get(t)
                if x is None:
                    continue
                x.held = held
                x.share_rps = min(wants[q][t], max(0.0, rest))
                rest -= x.share_rps
                self._alloc_rps[q] += x.share_rps
        self._spare_rps = max(0.0, left - sum(self._alloc_rps[1:]))
