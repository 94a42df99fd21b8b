"""Simulated gateways apply directives through the one enforcement (closed loop)."""

from __future__ import annotations

import pytest

from pipeline.contract.control_signal import Actions
from producers.admission import MIN_BURST_TOKENS
from producers.asgi_control import hash_admits
from producers.control_client import Directive
from producers.enforcement import spread_retry_after_s, unit_of
from producers.simulator.gate import Arrival, GatewayGate, directive_of


def _d(level: int = 0, phase: str = "degraded", **actions: object) -> Directive:
    """A directive as the control loop issues it (the gate reads nothing else)."""
    return directive_of(level, phase, actions)


def _decide(gate: GatewayGate, *, priority: int = 0, rid: str = "r1", session: str | None = None,
            prompt: int = 1000, t_ms: float = 0.0, gateway: str = "g0"):  # fmt: skip
    return gate.decide(Arrival("m", priority, rid, session or rid, gateway, prompt, t_ms))


CASES = [
    # (id, actions, request priority, expected rejection)
    ("normal-admits-all", _d(), 3, None),
    ("shed-at-or-above", _d(level=1, shed_priorities_at_or_above=2), 2, "shed_priority"),
    ("shed-below-passes", _d(level=1, shed_priorities_at_or_above=2), 1, None),
    ("priority-0-never-shed-at-l3", _d(level=3, shed_priorities_at_or_above=1), 0, None),
    ("level-0-ignores-actions", _d(level=0, shed_priorities_at_or_above=0), 3, None),
]


@pytest.mark.parametrize(("actions", "priority", "want"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_shed_by_priority(actions: Directive, priority: int, want: str | None) -> None:
    gate = GatewayGate()
    gate.set("m", actions)
    v = _decide(gate, priority=priority)
    assert v.reason == want
    if want:
        assert gate.shed_by_priority() == {priority: 1}


def test_rejection_carries_retry_after() -> None:
    gate = GatewayGate()
    gate.set("m", _d(level=1, shed_priorities_at_or_above=3, retry_after_s=30))
    # the directive's 30 s, spread per request over its second half (never later)
    assert _decide(gate, priority=3).retry_after_s == spread_retry_after_s(
        30, unit_of("retry-after:r1")
    )
    spread = {_decide(gate, priority=3, rid=f"q{i}").retry_after_s for i in range(200)}
    assert spread == set(range(16, 31))  # ceil(30·(1 - u/2)), u < 1


def test_cap_context_only_when_longer() -> None:
    gate = GatewayGate()
    gate.set("m", _d(level=1, cap_context_tokens=8192))
    assert _decide(gate, prompt=9000, priority=1).cap_context_tokens == 8192
    # a gateway reads headers, not the prompt: the cap goes with every admitted request
    # (the engine truncates only a longer prompt); counted where it cut one
    assert _decide(gate, prompt=100).cap_context_tokens == 8192
    assert dict(gate.capped) == {1: 1}


def test_half_open_admits_the_hashed_fraction() -> None:
    gate = GatewayGate()
    gate.set("m", _d(level=1, phase="half_open", shed_priorities_at_or_above=3,
                              admit_fraction=0.25))  # fmt: skip
    ids = [f"req-{i}" for i in range(2000)]
    admitted = [rid for rid in ids if _decide(gate, priority=3, rid=rid).reason is None]
    assert admitted == [rid for rid in ids if hash_admits(rid, 0.25)]
    assert 0.2 < len(admitted) / len(ids) < 0.3


def test_reject_new_sessions_spares_retries_of_a_session() -> None:
    gate = GatewayGate(new_session_fraction=1.0)
    gate.set("m", _d(level=2, reject_new_sessions=True))
    assert _decide(gate, rid="s1", priority=1).reason == "new_session"
    assert _decide(gate, rid="s1-r1", session="s1", priority=1).reason is None  # its session


def test_token_bucket_per_gateway() -> None:
    gate = GatewayGate()
    gate.set("m", _d(level=2, rate_limit_rps=5))
    got = [_decide(gate, rid=f"r{i}", t_ms=0.0, priority=2).reason for i in range(7)]
    assert got == [None] * 5 + ["rate_limit"] * 2  # a burst of one second's tokens
    assert _decide(gate, rid="other", gateway="g1", t_ms=0.0, priority=2).reason is None  # own
    assert _decide(gate, rid="later", t_ms=200.0, priority=2).reason is None  # refilled 1 token
    assert _decide(gate, rid="later2", t_ms=200.0, priority=2).reason == "rate_limit"


L2 = _d(level=2, shed_priorities_at_or_above=2, reject_new_sessions=True,
                 rate_limit_rps=2)  # fmt: skip


def test_priority_0_is_never_turned_away_but_by_an_explicit_shed() -> None:
    """Real-time traffic ("never evicted"): new sessions and an empty token bucket turn
    away priorities 1-3 only; priority 0 takes a token when there is one."""
    gate = GatewayGate(new_session_fraction=1.0)
    gate.set("m", L2)
    assert [_decide(gate, rid=f"p0-{i}", priority=0).reason for i in range(5)] == [None] * 5
    # the two tokens went to priority 0: priority 1 waits, in its session or not
    assert _decide(gate, rid="s", session="s0", priority=1).reason == "rate_limit"
    assert _decide(gate, rid="new", priority=1).reason == "new_session"
    assert gate.shed_by_priority() == {1: 2}
    gate.set("m", _d(level=3, shed_priorities_at_or_above=0))
    assert _decide(gate, rid="x", priority=0).reason == "shed_priority"  # explicit


def test_fallback_model_is_passed_on() -> None:
    gate = GatewayGate()
    gate.set("m", _d(level=1, fallback_model="small"))
    assert _decide(gate).fallback_model == "small"


def test_scope_star_applies_to_every_model() -> None:
    gate = GatewayGate()
    gate.set("*", _d(level=1, shed_priorities_at_or_above=3))
    assert _decide(gate, priority=3).reason == "shed_priority"


# --- capacity-aware admission (issue 35) ----------------------------------------------------

ADMISSION_CASES = [
    # (id, admit_rps, admit_gateways, want admitted per second at each gateway)
    ("whole-rate-one-gateway", 6.0, None, 6.0),
    ("split-over-two-gateways", 6.0, 2, 3.0),
    ("split-over-three", 6.0, 3, 2.0),
    ("zero-rate-admits-nothing", 0.0, 1, 0.0),
]


@pytest.mark.parametrize(
    ("admit_rps", "gateways", "want_rps"),
    [c[1:] for c in ADMISSION_CASES],
    ids=[c[0] for c in ADMISSION_CASES],
)
def test_admission_splits_the_rate_over_the_gateways(
    admit_rps: float, gateways: int | None, want_rps: float
) -> None:
    """10 req/s of priority 3 at each of two gateways for 60 s: each admits its share."""
    gate = GatewayGate()
    gate.set("m", _d(level=1, retry_after_s=20, admit_rps=admit_rps,
                              admit_gateways=gateways))  # fmt: skip
    admitted = {"g0": 0, "g1": 0}
    for i in range(600):
        t_ms = i * 100.0
        for g in admitted:
            v = _decide(gate, rid=f"{g}-{i}", gateway=g, priority=3, t_ms=t_ms)
            admitted[g] += v.reason is None and t_ms >= 20_000.0  # past the first burst
    for g, n in admitted.items():  # each gateway instance has its own share
        assert n == pytest.approx(want_rps * 40, abs=2), (g, admitted)
    assert gate.rejected[(3, "admission")] >= 2 * (10.0 - want_rps) * 40


def test_admission_rejection_carries_the_admissions_retry_after() -> None:
    gate = GatewayGate()
    gate.set("m", _d(level=1, retry_after_s=20, admit_rps=4.0))
    for i in range(int(MIN_BURST_TOKENS)):  # the first burst (one second of 4 rps or more)
        assert _decide(gate, rid=f"r{i}", priority=2).reason is None
    v = _decide(gate, rid="r5", priority=2)
    assert (v.reason, v.retry_after_s) == ("admission", 1)  # a token in 0.25 s, not 20 s
    assert _decide(gate, rid="p0", priority=0).reason is None  # never evicted
    gate.set("m", _d(level=1, retry_after_s=20, admit_rps=0.0))
    no_share = _decide(gate, rid="r6", priority=2, t_ms=10.0).retry_after_s  # the max, spread
    assert no_share == spread_retry_after_s(20, unit_of("retry-after:r6"))


def test_admission_prefers_higher_priorities_over_a_long_run() -> None:
    """10 rps admitted; priority 1 asks 6 rps, priority 3 asks 10: 1 gets all, 3 the rest."""
    gate = GatewayGate()
    gate.set("m", _d(level=1, retry_after_s=30, admit_rps=10.0))
    admitted = {1: 0, 3: 0}
    events = sorted([(i * 1000.0 / 6, 1) for i in range(6 * 90)]
                    + [(5.0 + i * 100.0, 3) for i in range(10 * 90)])  # fmt: skip
    for k, (t_ms, prio) in enumerate(events):
        v = _decide(gate, rid=f"r{k}", priority=prio, t_ms=t_ms)
        if v.reason is None and t_ms >= 30_000:  # once priority 1's bucket is full
            admitted[prio] += 1
    assert admitted[1] == pytest.approx(6 * 60, rel=0.02)
    assert admitted[3] == pytest.approx(4 * 60, rel=0.05)


def test_admission_comes_after_the_other_rules_and_is_off_without_admit_rps() -> None:
    gate = GatewayGate()
    gate.set("m", _d(level=1, shed_priorities_at_or_above=3, admit_rps=1.0))
    assert _decide(gate, rid="a", priority=3).reason == "shed_priority"
    burst = int(MIN_BURST_TOKENS)
    assert all(_decide(gate, rid=f"b{i}", priority=2).reason is None for i in range(burst))
    assert _decide(gate, rid="c", priority=2).reason == "admission"
    gate.set("m", _d(level=1))
    assert all(_decide(gate, rid=f"d{i}", priority=3).reason is None for i in range(20))


def test_directive_of_reads_admission_from_a_directive() -> None:
    a = directive_of(1, "degraded", Actions(admit_rps=12.5, admit_gateways=4)).actions
    assert (a.admit_rps, a.admit_gateways) == (12.5, 4)
    b = directive_of(1, "degraded", {"admit_rps": None}).actions
    assert (b.admit_rps, b.admit_gateways) == (None, None)
