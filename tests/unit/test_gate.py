"""Simulated gateways apply directives as the ASGI middleware does (closed loop)."""

from __future__ import annotations

import pytest

from producers.asgi_control import hash_admits
from producers.simulator.gate import GateActions, GatewayGate


def _decide(gate: GatewayGate, *, priority: int = 0, rid: str = "r1", session: str | None = None,
            prompt: int = 1000, t_ms: float = 0.0, gateway: str = "g0"):  # fmt: skip
    return gate.decide(
        model="m",
        priority=priority,
        request_id=rid,
        session_id=session or rid,
        gateway=gateway,
        prompt_tokens=prompt,
        t_ms=t_ms,
    )


CASES = [
    # (id, actions, request priority, expected rejection)
    ("normal-admits-all", GateActions(), 3, None),
    ("shed-at-or-above", GateActions(level=1, shed_priorities_at_or_above=2), 2, "shed_priority"),
    ("shed-below-passes", GateActions(level=1, shed_priorities_at_or_above=2), 1, None),
    ("priority-0-never-shed-at-l3", GateActions(level=3, shed_priorities_at_or_above=1), 0, None),
    ("level-0-ignores-actions", GateActions(level=0, shed_priorities_at_or_above=0), 3, None),
]


@pytest.mark.parametrize(("actions", "priority", "want"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_shed_by_priority(actions: GateActions, priority: int, want: str | None) -> None:
    gate = GatewayGate()
    gate.set("m", actions)
    v = _decide(gate, priority=priority)
    assert v.reject == want
    if want:
        assert gate.shed_by_priority() == {priority: 1}


def test_rejection_carries_retry_after() -> None:
    gate = GatewayGate()
    gate.set("m", GateActions(level=1, shed_priorities_at_or_above=3, retry_after_s=30))
    assert _decide(gate, priority=3).retry_after_s == 30


def test_cap_context_only_when_longer() -> None:
    gate = GatewayGate()
    gate.set("m", GateActions(level=1, cap_context_tokens=8192))
    assert _decide(gate, prompt=9000, priority=1).cap_context_tokens == 8192
    assert _decide(gate, prompt=100).cap_context_tokens is None
    assert dict(gate.capped) == {1: 1}


def test_half_open_admits_the_hashed_fraction() -> None:
    gate = GatewayGate()
    gate.set("m", GateActions(level=1, phase="half_open", shed_priorities_at_or_above=3,
                              admit_fraction=0.25))  # fmt: skip
    ids = [f"req-{i}" for i in range(2000)]
    admitted = [rid for rid in ids if _decide(gate, priority=3, rid=rid).reject is None]
    assert admitted == [rid for rid in ids if hash_admits(rid, 0.25)]
    assert 0.2 < len(admitted) / len(ids) < 0.3


def test_reject_new_sessions_spares_retries_of_a_session() -> None:
    gate = GatewayGate(new_session_fraction=1.0)
    gate.set("m", GateActions(level=2, reject_new_sessions=True))
    assert _decide(gate, rid="s1", priority=1).reject == "new_session"
    assert _decide(gate, rid="s1-r1", session="s1", priority=1).reject is None  # its session


def test_token_bucket_per_gateway() -> None:
    gate = GatewayGate()
    gate.set("m", GateActions(level=2, rate_limit_rps=5))
    got = [_decide(gate, rid=f"r{i}", t_ms=0.0, priority=2).reject for i in range(7)]
    assert got == [None] * 5 + ["rate_limit"] * 2  # a burst of one second's tokens
    assert _decide(gate, rid="other", gateway="g1", t_ms=0.0, priority=2).reject is None  # own
    assert _decide(gate, rid="later", t_ms=200.0, priority=2).reject is None  # refilled 1 token
    assert _decide(gate, rid="later2", t_ms=200.0, priority=2).reject == "rate_limit"


L2 = GateActions(level=2, shed_priorities_at_or_above=2, reject_new_sessions=True,
                 rate_limit_rps=2)  # fmt: skip


def test_priority_0_is_never_turned_away_but_by_an_explicit_shed() -> None:
    """Real-time traffic ("never evicted"): new sessions and an empty token bucket turn
    away priorities 1-3 only; priority 0 takes a token when there is one."""
    gate = GatewayGate(new_session_fraction=1.0)
    gate.set("m", L2)
    assert [_decide(gate, rid=f"p0-{i}", priority=0).reject for i in range(5)] == [None] * 5
    # the two tokens went to priority 0: priority 1 waits, in its session or not
    assert _decide(gate, rid="s", session="s0", priority=1).reject == "rate_limit"
    assert _decide(gate, rid="new", priority=1).reject == "new_session"
    assert gate.shed_by_priority() == {1: 2}
    gate.set("m", GateActions(level=3, shed_priorities_at_or_above=0))
    assert _decide(gate, rid="x", priority=0).reject == "shed_priority"  # explicit


def test_fallback_model_is_passed_on() -> None:
    gate = GatewayGate()
    gate.set("m", GateActions(level=1, fallback_model="small"))
    assert _decide(gate).fallback_model == "small"


def test_scope_star_applies_to_every_model() -> None:
    gate = GatewayGate()
    gate.set("*", GateActions(level=1, shed_priorities_at_or_above=3))
    assert _decide(gate, priority=3).reject == "shed_priority"
