"""Unit tests of the gateway-local adaptive limiters (producers.simulator.baselines)."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.contract.events import GatewayCompleted
from producers.simulator.baselines import CONCURRENCY, AIMDGate
from producers.simulator.gate import Arrival, Completion, directive_of
from producers.simulator.model import SimConfig, Simulator
from producers.simulator.trace import read_trace
from tests.paths import SHARED_TRACE

START_NS = 1_700_000_000_000_000_000


def _admit(gate: AIMDGate, rid: str, gateway: str = "g0", model: str = "m", prio: int = 2) -> Any:
    return gate.decide(Arrival(model, prio, rid, rid, gateway, prompt_tokens=100, t_ms=0.0))


def _done(
    gate: AIMDGate,
    rid: str,
    *,
    ttfb_ms: float | None = 100.0,
    total_ms: float = 500.0,
    outcome: str = "ok",
    gateway: str = "g0",
    model: str = "m",
) -> None:
    gate.on_complete(Completion(model, gateway, 2, rid, 1_000.0, ttfb_ms, total_ms, outcome))


@pytest.mark.parametrize(
    ("limit", "in_flight", "completion", "new_limit"),
    [
        # fast ok with the request's sample >= limit / 2: additive increase
        (20, 10, {}, 21),
        (20, 20, {}, 21),
        # fast ok while lightly loaded (sample 9 < 20 / 2): unchanged
        (20, 9, {}, 20),
        # a slow first byte: multiplicative decrease (floor, at least one less)
        (20, 10, {"ttfb_ms": 2_500.0}, 18),
        (21, 1, {"ttfb_ms": 2_000.1}, 18),
        (5, 1, {"ttfb_ms": 9_000.0}, 4),
        # exactly at the timeout is not a drop
        (20, 10, {"ttfb_ms": 2_000.0}, 21),
        # no first byte: the total is the latency
        (20, 10, {"ttfb_ms": None, "total_ms": 3_000.0, "outcome": "ok"}, 18),
        # any other outcome is a drop, however fast
        (20, 10, {"outcome": "client_abort", "ttfb_ms": None, "total_ms": 50.0}, 18),
        (20, 10, {"outcome": "rejected", "ttfb_ms": 40.0}, 18),
        # clamps
        (1, 1, {"ttfb_ms": 9_000.0}, 1),
        (200, 200, {}, 200),
    ],
)
def test_aimd_limit_update(
    limit: int, in_flight: int, completion: dict[str, Any], new_limit: int
) -> None:
    gate = AIMDGate()
    gate.limits[("g0", "m")] = limit
    for i in range(in_flight):
        assert _admit(gate, f"r{i}").reason is None
    _done(gate, f"r{in_flight - 1}", **completion)  # the last admitted: its sample = in_flight
    assert gate.limit("g0", "m") == new_limit
    assert gate.in_flight[("g0", "m")] == in_flight - 1


def test_aimd_scripted_sequence() -> None:
    gate = AIMDGate(initial_limit=4)
    assert [_admit(gate, f"r{i}").reason for i in range(4)] == [None] * 4
    # at the limit: 429 with Retry-After 1 s, counted as a concurrency rejection
    v = _admit(gate, "r4", prio=0)  # priority-agnostic: priority 0 too
    assert (v.reason, v.retry_after_s) == ("rate_limit", 1)
    assert gate.rejected == {(0, CONCURRENCY): 1}
    # the other gateway and the other model have their own limits
    assert _admit(gate, "o1", gateway="g1").reason is None
    assert _admit(gate, "o2", model="m2").reason is None
    # a fast completion admitted at full load (its sample 4 >= 4 / 2) grows the limit:
    # two more fit; one admitted lightly loaded (r0: sample 1) would not
    _done(gate, "r3")
    assert gate.limit("g0", "m") == 5
    assert [_admit(gate, f"s{i}").reason for i in range(3)] == [None, None, "rate_limit"]
    # a slow one shrinks it (5 -> 4), and the in-flight count (5 -> 4) is at it
    _done(gate, "r1", ttfb_ms=2_500.0)
    assert gate.limit("g0", "m") == 4
    assert _admit(gate, "s9").reason == "rate_limit"
    # completions of requests it never admitted are ignored
    _done(gate, "r4")
    _done(gate, "nobody")
    assert gate.in_flight[("g0", "m")] == 4
    for rid in ("r0", "r2", "s0", "s1"):
        _done(gate, rid)
    _done(gate, "o1", gateway="g1")
    _done(gate, "o2", model="m2")
    assert gate.in_flight_total() == 0
    assert gate.drops == 1


def test_aimd_ignores_directives() -> None:
    gate = AIMDGate()
    gate.set("*", directive_of(3, "active", {"shed_priorities_at_or_above": 0}))
    assert _admit(gate, "r0", prio=3).reason is None


@pytest.mark.parametrize(
    "changes",
    [
        {"initial_limit": 0},
        {"min_limit": 30},
        {"max_limit": 10},
        {"backoff_ratio": 1.0},
        {"backoff_ratio": 0.4},
        {"timeout_ms": 0.0},
        {"retry_after_s": -1},
    ],
)
def test_aimd_validation(changes: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="AIMDGate"):
        AIMDGate(**changes)


def test_aimd_gate_in_a_saturated_simulation() -> None:
    trace = read_trace(SHARED_TRACE)[:2_000]
    gate = AIMDGate()
    config = SimConfig(start_unix_ns=START_NS, seed=1, rate_scale=4.0)
    sim = Simulator(trace, config, gate)
    events = list(sim.events())
    rejected_429 = sum(
        1 for e in events if isinstance(e, GatewayCompleted) and e.http_status == 429
    )
    assert rejected_429 > 0
    assert rejected_429 == sum(gate.rejected.values())
    assert sim.retries > 0  # rejected clients come back
    assert gate.in_flight_total() == 0  # every admitted request was reported complete
    assert any(limit < gate.initial_limit for limit in gate.limits.values())
