"""Capacity-aware admission: how many requests per second a model's gateways admit.

Pure: plain values in (what the engines served, how many wait, the batch they run),
time passed in, no I/O. The controller calls :meth:`AdmissionControl.step` once per
evaluation and model; a level whose actions say ``admission: true`` carries the
result in its directive (``Actions.admit_rps``), and the gateways admit that many
requests per second by strict priority (``producers/admission.py``).

What the engines can serve
--------------------------
*Capacity* is measured, not configured: the requests per second a model's engines
completed while they were saturated (a queue at least ``saturated_queue`` of a
batch deep: every finished request was replaced at once, so completions are the
engines' throughput, not the arrival rate). It is an exponentially weighted mean
of those windows (weight ``capacity_weight``), remembered across healthy periods,
and never below what the engines served over the last minute with nothing queued
(they serve at least that much).
Before any window has been seen, the capacity is the last window's served rate (a
low estimate: admission then starts tight and grows additively).

The rate while admission is on (one step per evaluation)
--------------------------------------------------------
With ``C`` the capacity, ``K`` the engines' batch (the largest ``num_running``
they reported), ``W`` the requests waiting in their queues and ``E = max(0, W - A)``
the excess queue, where the healthy queue ``A`` is ``queue_allowance * K`` or, when
the controller knows the SLOs, what the engines serve in a quarter of the tightest
first-byte threshold covering priority 0 (``ModelLoad.healthy_queue``: a request
joining it still gets its first token in time):

* **entry** (first step): ``R = C - E / drain_s`` -- serve at capacity, less what
  drains the excess queue within ``drain_s`` (Little's law: the queue a new
  request waits behind is what delays its first token);
* **queue growing** (``E`` larger than at the previous step): multiplicative
  decrease, ``R = min(C - E / drain_s, decrease * R)`` (AIMD's backoff); but when that
  is below the floor (a queue larger than the engines drain within ``drain_s`` even
  admitting nothing), ``R = decrease * S``, ``S`` what the engines served in the last
  window: one decrease below what they measurably serve, not the floor. Such a queue
  was read a window back and filled before the previous rate was in force; the queue
  cut-off (in force at every level that admits) drops what waits past it, so it is the
  cut-off's to clear, not the rate's. On the burst trace llama-3-8b's first decrease
  (136 waiting, 10.2 req/s served) set the floor while the cut-off had already emptied
  the queue: its engines served 1.4-3.2 req/s for the 15 s it was in force (issue 47).
  A backoff above the floor is left as it is: raising it to ``decrease * S`` too cost
  priority 0 (``bench/CONTROL-HISTORY.md``);
* **queue over the allowance but shrinking** (drain): ``R = min(R, C - E / drain_s)``,
  held at the rate that made it shrink; but when that rate is the floor (the entry,
  or a decrease with next to nothing served, faced a queue larger than the engines
  drain within ``drain_s``: a burst), ``R = min(C - E / drain_s, max(R, decrease *
  C))``: what drains the rest within ``drain_s``, no less than one decrease below
  capacity. Held at the floor while the queue drains, the gateways would turn
  requests away for minutes after it has gone while the engines idle (additive
  increase from the floor takes ``1 / increase`` steps to reach capacity);
* **healthy** (``E == 0``): additive increase, ``R = R + increase * C``, up to
  ``max_over_capacity * C`` (the level's exit, not the rate, ends admission); when
  the previous rate was the floor (the burst's queue went from over the floor's reach
  to healthy between two steps), no less than one decrease below capacity, as in the
  drain: on the burst trace llama-3-70b's queue was empty from the step after the
  floor, and additive increase took ~200 s back to capacity while its engines idled.

``R`` never goes below ``min_fraction * C``. Priority 0 is admitted whatever
``R`` is (gateways count it against the rate first), so a rate below priority 0's
demand turns away everything else, never priority 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

__all__ = [
    "TTFT_SERVICE_BOUNDARIES",
    "AdmissionConfig",
    "AdmissionControl",
    "AdmissionStep",
    "ModelLoad",
    "ttft_prediction",
]

# The unqueued first-token time: these boundaries' medians, added (issue 52).
TTFT_SERVICE_BOUNDARIES: Final = ("prefill_ms", "gateway_overhead_ms")


def ttft_prediction(
    load: ModelLoad, capacity_rps: float | None, medians_ms: dict[str, float]
) -> dict[str, float]:
    """Deadline-aware admission (issue 52): the first-token time a request arriving now
    is predicted to take, as a directive's ``ttft_queue_ms`` (the queue ahead of it, the
    engines' waiting requests, over their service rate: the measured capacity, else what
    they served) and ``ttft_service_ms`` (the unqueued first-token time: the medians of
    :data:`TTFT_SERVICE_BOUNDARIES` over the latency window, added). Empty while either
    is unknown (nothing is refused as late)."""
    rate_rps = capacity_rps if capacity_rps else load.served_rps
    if not rate_rps or "prefill_ms" not in medians_ms:
        return {}
    return {
        "ttft_queue_ms": round(1000.0 * load.waiting / rate_rps, 3),
        "ttft_service_ms": round(sum(medians_ms.get(b, 0.0) for b in TTFT_SERVICE_BOUNDARIES), 3),
    }


_MIN_RATE_RPS: Final = 0.1


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    drain_s: float = 10.0  # drain an excess queue within this many seconds
    queue_allowance: float = 0.5  # a queue up to this share of a batch is healthy
    saturated_queue: float = 1.0  # a queue this deep (share of a batch): engines saturated
    capacity_weight: float = 0.5  # EWMA weight of a new saturated window's served rate
    decrease: float = 0.8  # multiplicative decrease while the queue grows
    increase: float = 0.05  # additive increase per step, as a share of capacity
    min_fraction: float = 0.05  # floor of the rate, as a share of capacity
    max_over_capacity: float = 2.0  # ceiling of the rate, as a multiple of capacity

    def __post_init__(self) -> None:
        for name in ("drain_s", "capacity_weight", "decrease", "increase", "min_fraction"):
            v = getattr(self, name)
            if not v > 0:
                raise ValueError(f"AdmissionConfig.{name} must be > 0, got {v!r}")
        if not (self.decrease < 1 and self.capacity_weight <= 1 and self.min_fraction < 1):
            raise ValueError("AdmissionConfig: decrease and min_fraction < 1, weight <= 1")
        if self.max_over_capacity < 1:
            raise ValueError("AdmissionConfig.max_over_capacity must be >= 1")


@dataclass(frozen=True, slots=True)
class ModelLoad:
    """One model at one evaluation: what its engines did in the last window."""

    served_rps: float  # requests its engines finished per second (last window)
    waiting: int  # requests waiting in its engines' queues (latest stats)
    batch: int  # its engines' batch: the largest num_running they reported, summed
    demand_rps: float  # requests its gateways received per second (rejections included)
    # The queue (requests) that is healthy: what the engines serve in a fraction of the
    # tightest first-byte threshold (see Controller); None: queue_allowance of a batch.
    healthy_queue: float | None = None
    # What its engines finished per second over the last minute (None: not known). The
    # capacity's floor reads it: a 10 s window's count is noisy, and a max over noisy
    # windows only ratchets up (issue 47: at x4 the estimate rose 34 % while the queue
    # stayed short and let the demand ratio fall under the exit's 0.9 mid-episode).
    served_minute_rps: float | None = None


@dataclass(frozen=True, slots=True)
class AdmissionStep:
    rate_rps: float | None  # None: admission off
    capacity_rps: float | None
    excess_queue: float
    rule: str  # "entry" | "decrease" | "drain" | "increase" | "off"

    def describe(self) -> str:
        if self.rate_rps is None:
            return "admission off"
        cap = "unknown" if self.capacity_rps is None else f"{self.capacity_rps:.1f}"
        return (
            f"admit {self.rate_rps:.1f} req/s ({self.rule}; capacity {cap} req/s, "
            f"excess queue {self.excess_queue:.0f})"
        )


@dataclass
class _State:
    capacity_rps: float | None = None  # max(saturated_rps, floor_rps)
    saturated_rps: float | None = None  # EWMA of the windows served with a batch queued
    floor_rps: float | None = None  # the most served in a window with nothing queued
    rate_rps: float | None = None
    excess: float = 0.0
    rule: str = "off"
    floored: bool = False  # the last rate was raised to the floor


@dataclass
class AdmissionControl:
    config: AdmissionConfig = field(default_factory=AdmissionConfig)
    _models: dict[str, _State] = field(default_factory=dict)

    def capacity_rps(self, model: str) -> float | None:
        st = self._models.get(model)
        return None if st is None else st.capacity_rps

    def proven_rps(self, model: str) -> float | None:
        """What the engines have shown they serve: the measured capacity (saturated
        windows, never below what they served over a minute with nothing queued).

        Not the admission rate: while admission keeps the queue short the rate grows
        additively up to ``max_over_capacity`` times capacity whether or not that much
        arrives or is served, so as a denominator it let the demand ratio fall under an
        exit threshold while arrivals were still x4 (issue 47)."""
        st = self._models.get(model)
        return None if st is None else st.capacity_rps

    def observe(self, model: str, load: ModelLoad) -> None:
        """Learn capacity from a saturated window (call every evaluation)."""
        cfg = self.config
        st = self._models.setdefault(model, _State())
        saturated = load.batch > 0 and load.waiting >= cfg.saturated_queue * load.batch
        if saturated and load.served_rps > 0:
            if st.saturated_rps is None:
                st.saturated_rps = load.served_rps
            else:
                w = cfg.capacity_weight
                st.saturated_rps = (1 - w) * st.saturated_rps + w * load.served_rps
        elif load.waiting == 0 and load.served_rps > 0:
            # served with nothing queued: the engines serve at least that much (over a
            # minute where known, not one noisy window)
            served = load.served_rps if load.served_minute_rps is None else load.served_minute_rps
            st.floor_rps = max(st.floor_rps or 0.0, served)
        known = [x for x in (st.saturated_rps, st.floor_rps) if x is not None]
        st.capacity_rps = max(known) if known else None

    def step(self, model: str, load: ModelLoad, *, active: bool) -> AdmissionStep:
        """The admission rate for ``model`` now (None while ``active`` is false)."""
        cfg = self.config
        st = self._models.setdefault(model, _State())
        allowance = cfg.queue_allowance * load.batch
        if load.healthy_queue is not None:
            allowance = min(allowance, load.healthy_queue)
        excess = max(0.0, load.waiting - allowance)
        if not active:
            st.rate_rps, st.excess, st.rule = None, excess, "off"
            return AdmissionStep(None, st.capacity_rps, excess, "off")
        cap = st.capacity_rps if st.capacity_rps is not None else load.served_rps
        cap = max(cap, _MIN_RATE_RPS)
        floor = max(cfg.min_fraction * cap, _MIN_RATE_RPS)
        target = cap - excess / cfg.drain_s
        prev = st.rate_rps
        if prev is None:
            rate, rule = target, "entry"
        elif excess > st.excess and excess > 0:
            rate, rule = min(target, cfg.decrease * prev), "decrease"
            if rate < floor:  # a stale burst's queue: the cut-off's to clear (issue 47)
                rate = max(rate, cfg.decrease * load.served_rps)
        elif excess > 0:
            # shrinking: held at the rate that made it shrink, unless that rate is the
            # floor (a queue the engines could not drain within drain_s): then what
            # drains the rest within drain_s, no less than one decrease below capacity
            held = max(prev, cfg.decrease * cap) if st.floored else prev
            rate, rule = min(target, held), "drain"
        else:
            up = prev + cfg.increase * cap
            if st.floored:  # the queue went from over the floor's reach to healthy at once
                up = max(up, cfg.decrease * cap)
            rate, rule = min(up, cfg.max_over_capacity * cap), "increase"
        st.floored = rate < floor
        rate = max(rate, floor)
        st.rate_rps, st.excess, st.rule = rate, excess, rule
        return AdmissionStep(rate, st.capacity_rps, excess, rule)
