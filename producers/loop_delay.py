"""The control loop's delay, as a gateway sees it: from the evidence a directive was
decided on to the directive being applied here.

``delay = applied_at - as_of``, both in event time (ms since the epoch):

* ``as_of`` is the signal's ``as_of_unix_ms``: the end of the latest window the
  decision read (the controller's evaluation time; see
  :mod:`pipeline.contract.control_signal`, "The loop's delay");
* ``applied_at`` is the gateway's own clock when the directive takes effect. A real
  gateway (:class:`producers.control_client.ControlClient`) reads its wall clock when it
  accepts the signal (the next request is decided under it): the clock it stamps its
  own ``gateway.*`` events with, so the subtraction stays on the event-time axis the
  windows are cut on (good to the skew between NTP-synchronised gateway hosts). A
  simulated gateway (:class:`producers.simulator.gate.GatewayGate`) reads the
  simulator's clock at the first arrival decided under the directive: the clock that
  stamped the evidence, whatever the speed factor.

Each decision counts once per scope, when it is first applied: heartbeats repeat a
decision with its ``as_of`` and are not counted again, and an ``as_of`` at or before the
last one counted for the scope is not a new decision. Pure: no clock, no I/O.
"""

from __future__ import annotations

import bisect
import math
import threading
from typing import Final

# Histogram buckets (ms) for /tailguard/metrics: a live loop takes a window (10 s) plus
# the grace and the trip through Kafka; the demo's at 20x some tens of seconds of event time.
BUCKETS_MS: Final = (1_000, 2_500, 5_000, 10_000, 15_000, 20_000, 30_000, 45_000, 60_000,
                     90_000, 120_000, 300_000)  # fmt: skip
MAX_SAMPLES: Final = 100_000  # kept for exact quantiles (a decision per scope per window)


def quantile(sorted_values: list[float], q: float) -> float | None:
    """Nearest rank: the smallest value with at least ``q`` of them at or below it."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q * len(sorted_values) - 1e-9))
    return sorted_values[min(rank, len(sorted_values)) - 1]


class LoopDelay:
    """Delays of the decisions applied here (see the module docstring). Thread-safe."""

    def __init__(self, max_samples: int = MAX_SAMPLES) -> None:
        self._last_as_of: dict[str, int] = {}
        self._samples: list[float] = []
        self._max_samples = max_samples
        self._buckets = [0] * (len(BUCKETS_MS) + 1)  # the last one: +Inf
        self._sum_ms = 0.0
        self.count = 0
        self.unknown = 0  # applied directives with no as_of (older issuers, hand-made)
        self._lock = threading.Lock()

    def applied(self, scope: str, as_of_ms: int | None, now_ms: float) -> float | None:
        """A directive for ``scope`` decided on evidence up to ``as_of_ms`` is in force at
        ``now_ms``: its delay, or None when it is not a new decision (or has no as_of)."""
        with self._lock:
            if as_of_ms is None:
                self.unknown += 1
                return None
            last = self._last_as_of.get(scope)
            if last is not None and as_of_ms <= last:
                return None
            self._last_as_of[scope] = as_of_ms
            delay = float(now_ms - as_of_ms)
            self.count += 1
            self._sum_ms += delay
            self._buckets[bisect.bisect_left(BUCKETS_MS, delay)] += 1
            if len(self._samples) < self._max_samples:
                self._samples.append(delay)
            return delay

    def samples(self) -> list[float]:
        with self._lock:
            return list(self._samples)

    def summary(self) -> dict[str, float | int | None]:
        """``{"decisions", "min_ms", "p50_ms", "p99_ms", "max_ms"}`` (None when nothing
        applied)."""
        s = sorted(self.samples())
        return {
            "decisions": self.count,
            "min_ms": s[0] if s else None,
            "p50_ms": quantile(s, 0.5),
            "p99_ms": quantile(s, 0.99),
            "max_ms": s[-1] if s else None,
        }

    def prometheus(self, name: str = "tailguard_gateway_control_loop_delay_seconds") -> str:
        """The delays as a Prometheus histogram (seconds)."""
        with self._lock:
            buckets, total, count = list(self._buckets), self._sum_ms, self.count
        lines = [
            f"# HELP {name} Evidence to directive applied at this gateway: the gateway's "
            "clock when it applied a decision minus the end of the latest window the "
            "decision read (event time), once per decision and scope.",
            f"# TYPE {name} histogram",
        ]
        cum = 0
        for le, n in zip(BUCKETS_MS, buckets, strict=False):
            cum += n
            lines.append(f'{name}_bucket{{le="{le / 1000:g}"}} {cum}')
        lines.append(f'{name}_bucket{{le="+Inf"}} {count}')
        lines.append(f"{name}_sum {total / 1000:.3f}")
        lines.append(f"{name}_count {count}")
        return "\n".join(lines) + "\n"
