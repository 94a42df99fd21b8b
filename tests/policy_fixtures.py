"""Shared by the policy engine's tests: time units in ms and a full set of healthy signals."""

from __future__ import annotations

from typing import Any

S = 1_000
M = 60 * S
H = 60 * M
TICK = 10 * S  # the worker's evaluation cadence
P99 = "p99.gateway_total_ms"

# Every signal a worker provides, each well inside its healthy range.
HEALTHY: dict[str, Any] = {
    P99: 200.0,
    "burn.page": False,
    "burn.ticket": False,
    "budget_exhausted": False,
    "kv_cache_hit_rate": 0.95,
    "queue_saturation": 0.2,
    "gpu_memory_fraction": 0.5,
    "queue_compute_ratio": 0.8,
}
