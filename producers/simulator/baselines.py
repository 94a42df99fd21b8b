"""Gateway-local adaptive limiters: baselines to judge directive-driven control against.

:class:`AIMDGate` is Netflix concurrency-limits' ``AIMDLimit`` behind its
``SimpleLimiter``, one limiter per (gateway, model):

* a request arrives: with ``in_flight >= limit`` it is turned away (429,
  ``Retry-After: retry_after_s``); otherwise it is admitted and ``in_flight``
  grows by one (the value after the increment is remembered as the request's
  sample, as the Java limiter's ``currentInflight``);
* it completes (:meth:`AIMDGate.on_complete`): ``in_flight`` shrinks by one and
  the limit takes one sample. A *drop* (outcome not ``ok``, or latency above
  ``timeout_ms``) multiplies the limit by ``backoff_ratio`` (rounded down, at
  least one less); otherwise, when the request's sample was at least half the
  limit, the limit grows by one. The limit stays in [min_limit, max_limit].

The latency is the first byte (``ttfb_ms``: the first token of a stream, the
whole body otherwise; the total when there is no first byte). Client aborts
count as drops (the Java limiter lets the caller choose: ``onDropped`` or
``onIgnore``); queue-timeout 503s are drops.

Like Netflix's plain limiter it is **priority-agnostic**: every priority shares
the one limit, real-time traffic included. It reads no directive (``set`` is
accepted and ignored): a baseline with only the gateway's own view.
Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Final

from producers.enforcement import Decision
from producers.simulator.gate import Arrival, Completion, GatewayGate, Verdict

__all__ = ["CONCURRENCY", "AIMDGate"]

# The reason AIMDGate's rejections are counted under in GatewayGate.rejected (the
# Verdict says "rate_limit": the enforcement's reasons have no concurrency limit).
CONCURRENCY: Final = "concurrency"

# A baseline is not tailguard's control: its decisions carry mode "off" (no control
# fields on the events), and its refusals are 429s recorded as rejected all the same.
_ADMIT: Final = Decision(Verdict(), "off")


@dataclass
class AIMDGate(GatewayGate):
    initial_limit: int = 20
    min_limit: int = 1
    max_limit: int = 200
    backoff_ratio: float = 0.9
    timeout_ms: float = 2_000.0  # a first byte later than this is a drop
    retry_after_s: int = 1
    # (gateway, model) -> limit / requests admitted and not yet completed
    limits: dict[tuple[str, str], int] = field(default_factory=dict)
    in_flight: dict[tuple[str, str], int] = field(default_factory=dict)
    _samples: dict[str, int] = field(default_factory=dict)  # request id -> in-flight at admit
    drops: int = 0
    limit_changes: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.min_limit <= self.initial_limit <= self.max_limit:
            raise ValueError("AIMDGate needs 1 <= min_limit <= initial_limit <= max_limit")
        if not 0.5 <= self.backoff_ratio < 1.0:
            raise ValueError("AIMDGate.backoff_ratio must be in [0.5, 1)")
        if not (math.isfinite(self.timeout_ms) and self.timeout_ms > 0):
            raise ValueError("AIMDGate.timeout_ms must be finite and > 0")
        if self.retry_after_s < 0:
            raise ValueError("AIMDGate.retry_after_s must be >= 0")

    def limit(self, gateway: str, model: str) -> int:
        return self.limits.get((gateway, model), self.initial_limit)

    def in_flight_total(self) -> int:
        return sum(self.in_flight.values())

    def decision(self, arrival: Arrival) -> Decision:
        key = (arrival.gateway, arrival.model)
        n = self.in_flight.get(key, 0)
        if n >= self.limits.get(key, self.initial_limit):
            self.rejected[(arrival.priority, CONCURRENCY)] += 1
            # as enforced (the verdict is acted on), outside tailguard's modes
            verdict = Verdict(reason="rate_limit", retry_after_s=self.retry_after_s)
            return Decision(verdict, "enforce")
        self.in_flight[key] = n + 1
        self._samples[arrival.request_id] = n + 1
        return _ADMIT

    def on_complete(self, done: Completion) -> None:
        key = (done.gateway, done.model)
        sample = self._samples.pop(done.request_id, None)
        if sample is None:
            return  # not admitted here
        self.in_flight[key] -= 1
        limit = self.limits.get(key, self.initial_limit)
        latency = done.total_ms if done.ttfb_ms is None else done.ttfb_ms
        if done.outcome != "ok" or latency > self.timeout_ms:
            self.drops += 1
            new = min(limit - 1, math.floor(limit * self.backoff_ratio))
        elif 2 * sample >= limit:
            new = limit + 1
        else:
            return
        new = max(self.min_limit, min(self.max_limit, new))
        if new != limit:
            self.limits[key] = new
            self.limit_changes += 1
