"""Hold before refuse (issue 47): a request admission has no token for, whose deadline
leaves slack, waits at the gateway for one (producers/enforcement.py, rule 6), as tables.

Time is the test's (the enforcement is pure): a held request asks again at the
``recheck_at_ms`` its verdict names, as the gateways and the simulator do.
"""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.contract.control_signal import Actions
from producers.admission import PriorityAdmission
from producers.control_client import Directive
from producers.enforcement import (
    HOLD_MAX_MS,
    MAX_HELD_PER_SCOPE,
    Decision,
    Enforcement,
    Modes,
    RequestFacts,
    hold_ms,
)

BUDGET_MS = 10_000.0  # a non-streaming request's (the default spec's nonstream-total)


def _d(level: int = 1, **actions: Any) -> Directive:
    return Directive(level=level, phase="degraded", actions=Actions(**actions), scope="m")  # type: ignore[arg-type]


def _r(
    priority: int = 2, key: str = "k", budget: float | None = BUDGET_MS, slo: float | None = None
) -> RequestFacts:
    return RequestFacts(model="m", priority=priority, request_key=key, budget_ms=budget,
                        slo_ttft_ms=slo)  # fmt: skip


HOLD = {"admit_rps": 4.0, "hold_fraction": 0.3, "retry_after_s": 30}


def _drained(e: Enforcement, d: Directive, t_ms: float = 0.0) -> None:
    """Take every admission token at ``t_ms`` (priority 3, no budget: refused at once)."""
    for k in range(100):
        if e.decide(d, _r(3, key=f"drain{k}", budget=None), t_ms).verdict.reason is not None:
            return
    raise AssertionError("admission never ran out of tokens")


def _until_settled(
    e: Enforcement, d: Directive, tickets: dict[str, int], until_ms: float = 10_000.0
) -> dict[str, tuple[float, Decision]]:
    """Ask again every held request (in the order of ``tickets``) at each 100 ms step
    until each is admitted or refused: name -> (time, decision)."""
    out: dict[str, tuple[float, Decision]] = {}
    t = 0.0
    while len(out) < len(tickets) and t <= until_ms:
        t += 100.0
        for name, ticket in tickets.items():
            if name in out:
                continue
            _facts, dec = e.resume(d, ticket, t)
            if not dec.verdict.held:
                out[name] = (t, dec)
    return out


HOLD_MS = [
    # (id, actions, request, wait ms)
    ("nonstream-share-of-budget", {"hold_fraction": 0.2}, _r(2), 2_000.0),
    ("capped", {"hold_fraction": 1.0}, _r(2), HOLD_MAX_MS),
    ("own-slo-is-the-slack", {"hold_fraction": 0.5}, _r(1, budget=None, slo=800.0), 400.0),
    ("budget-before-own-slo", {"hold_fraction": 0.1}, _r(1, slo=800.0), 1_000.0),
    ("no-fraction-no-hold", {}, _r(2), 0.0),
    ("no-slack-no-hold", {"hold_fraction": 0.2}, _r(2, budget=None), 0.0),
    ("priority-0-never-waits", {"hold_fraction": 0.2}, _r(0), 0.0),
    ("zero-fraction", {"hold_fraction": 0.0}, _r(3), 0.0),
]


@pytest.mark.parametrize(("actions", "request_", "want_ms"), [c[1:] for c in HOLD_MS],
                         ids=[c[0] for c in HOLD_MS])  # fmt: skip
def test_hold_ms(actions: dict[str, Any], request_: RequestFacts, want_ms: float) -> None:
    assert hold_ms(Actions(**actions), request_, request_.priority) == want_ms


WHO_IS_HELD = [
    # (id, modes, can_hold, actions, request, held)
    ("held", Modes(), True, HOLD, _r(2), True),
    ("gateway-cannot-wait", Modes(), False, HOLD, _r(2), False),
    ("shadow-never-holds", Modes("shadow"), True, HOLD, _r(2), False),
    ("no-slack", Modes(), True, HOLD, _r(2, budget=None), False),
    ("policy-off", Modes(), True, {"admit_rps": 1.0}, _r(2), False),
    ("own-slo-held", Modes(), True, HOLD, _r(1, budget=None, slo=2_000.0), True),
]


@pytest.mark.parametrize(("modes", "can_hold", "actions", "request_", "held"),
                         [c[1:] for c in WHO_IS_HELD], ids=[c[0] for c in WHO_IS_HELD])  # fmt: skip
def test_who_is_held(
    modes: Modes, can_hold: bool, actions: dict[str, Any], request_: RequestFacts, held: bool
) -> None:
    e = Enforcement(modes)
    d = _d(**actions)
    _drained(e, d)
    dec = e.decide(d, request_, 0.0, can_hold=can_hold)
    assert dec.verdict.held is held
    if held:
        assert dec.act.reason is None
        assert dec.verdict.recheck_at_ms is not None
        assert 0.0 < dec.verdict.recheck_at_ms <= hold_ms(d.actions, request_, 2)
        assert e.held_now == 1
    else:
        assert dec.verdict.reason == "admission"
        assert e.held_now == 0


OUTCOMES = [
    # (id, admit_rps, outcome): at 4 req/s a token comes within the 3 s wait; at
    # 0.001 req/s none does and the request is refused when the wait runs out
    ("a-token-comes", 4.0, None),
    ("the-wait-runs-out", 0.001, "admission"),
]


@pytest.mark.parametrize(("rate", "reason"), [c[1:] for c in OUTCOMES],
                         ids=[c[0] for c in OUTCOMES])  # fmt: skip
def test_held_request_is_admitted_or_refused_when_the_wait_runs_out(
    rate: float, reason: str | None
) -> None:
    e = Enforcement()
    d = _d(**{**HOLD, "admit_rps": rate})
    _drained(e, d)
    ticket = e.decide(d, _r(2), 0.0, can_hold=True).verdict.hold_ticket
    assert ticket is not None
    (t_ms, dec), = _until_settled(e, d, {"p2": ticket}).values()  # fmt: skip
    assert dec.verdict.reason == reason
    wait_ms = hold_ms(d.actions, _r(2), 2)
    if reason is None:
        assert t_ms < wait_ms
        assert e.applied["held_admitted"] == 1
    else:
        assert t_ms == wait_ms  # refused exactly when its wait ran out, not before
        assert 1 <= dec.verdict.retry_after_s <= HOLD["retry_after_s"]
        assert e.refusals[("enforce", "m", 2, "admission")] == 1  # counted once, at the end
    assert e.held_now == 0


ORDER = [
    # (id, held in this order of arrival, asked again in this order): tokens go by
    # priority, then arrival, whoever asks first
    ("p1-before-p2-asking-later", ["p2", "p1"], ["p2", "p1"]),
    ("p1-before-p3", ["p3", "p1"], ["p3", "p1"]),
    ("same-priority-first-come", ["p2a", "p2b"], ["p2b", "p2a"]),
]


@pytest.mark.parametrize(("arrivals", "asks"), [c[1:] for c in ORDER],
                         ids=[c[0] for c in ORDER])  # fmt: skip
def test_held_requests_take_tokens_in_priority_order(arrivals: list[str], asks: list[str]) -> None:
    e = Enforcement()
    d = _d(**HOLD)
    _drained(e, d)
    tickets: dict[str, int] = {}
    for i, name in enumerate(arrivals):
        ticket = e.decide(d, _r(int(name[1]), key=name), float(i), can_hold=True).verdict
        assert ticket.hold_ticket is not None
        tickets[name] = ticket.hold_ticket
    settled = _until_settled(e, d, {n: tickets[n] for n in asks})
    want = sorted(arrivals, key=lambda n: (int(n[1]), arrivals.index(n)))
    admitted = sorted((t, want.index(n), n) for n, (t, dec) in settled.items()
                      if dec.verdict.reason is None)  # fmt: skip
    assert admitted, "no held request got a token"
    assert [n for _, _, n in admitted] == want[: len(admitted)]


def test_a_lower_priority_arrival_never_takes_a_token_a_held_one_waits_for() -> None:
    e = Enforcement()
    d = _d(**HOLD)
    _drained(e, d)
    ticket = e.decide(d, _r(1, key="held"), 0.0, can_hold=True).verdict.hold_ticket
    assert ticket is not None
    p1_at: float | None = None
    p3_admitted = 0
    t = 0.0
    while t < HOLD_MAX_MS:
        t += 50.0  # a priority 3 arrives first, then the held priority 1 asks again
        p3 = e.decide(d, _r(3, key=f"late{t}", budget=None), t)
        if p1_at is None:
            p1 = e.resume(d, ticket, t)[1].verdict
            if not p1.held:
                assert p1.reason is None
                p1_at = t
        if p3.verdict.reason is None:
            assert p1_at is not None  # priority 3 had a token only once priority 1 had
            p3_admitted += 1
    assert p1_at is not None
    assert p3_admitted > 0  # and then priority 3 was served again


def test_at_most_max_held_per_scope() -> None:
    e = Enforcement()
    d = _d(**{**HOLD, "admit_rps": 0.001})
    _drained(e, d)
    verdicts = [e.decide(d, _r(2, key=f"r{k}"), 0.0, can_hold=True).verdict
                for k in range(MAX_HELD_PER_SCOPE + 5)]  # fmt: skip
    assert sum(v.held for v in verdicts) == MAX_HELD_PER_SCOPE
    assert sum(v.reason == "admission" for v in verdicts) == 5


RELEASES = [
    # (id, directive in force when it asks again): no directive admitting by rate any
    # more -> admitted (nothing to wait for)
    ("level-0", _d(0)),
    ("no-admission", _d(1, cap_context_tokens=8192)),
]


@pytest.mark.parametrize("later", [c[1] for c in RELEASES], ids=[c[0] for c in RELEASES])
def test_held_request_is_admitted_when_admission_ends(later: Directive) -> None:
    e = Enforcement()
    d = _d(**{**HOLD, "admit_rps": 0.001})
    _drained(e, d)
    ticket = e.decide(d, _r(2), 0.0, can_hold=True).verdict.hold_ticket
    assert ticket is not None
    _facts, dec = e.resume(later, ticket, 100.0)
    assert dec.verdict.reason is None
    assert not dec.verdict.held
    assert e.held_now == 0


def test_cancel_forgets_a_held_request() -> None:
    e = Enforcement()
    d = _d(**{**HOLD, "admit_rps": 0.001})
    _drained(e, d)
    ticket = e.decide(d, _r(2), 0.0, can_hold=True).verdict.hold_ticket
    assert ticket is not None
    e.cancel(ticket)
    assert e.held_now == 0
    with pytest.raises(KeyError):
        e.resume(d, ticket, 100.0)


COUNTS = [
    # (id, count): a request asking again is not a second arrival
    ("counted", True),
    ("asked-again", False),
]


@pytest.mark.parametrize("count", [c[1] for c in COUNTS], ids=[c[0] for c in COUNTS])
def test_asking_again_is_not_counted_as_demand(count: bool) -> None:
    a = PriorityAdmission()
    a.decide(2, 1.0, 0.0, 30)
    before = a.demand_rps(500.0)[2]
    a.decide(2, 1.0, 500.0, 30, count=count)
    after = a.demand_rps(500.0)[2]
    assert (after > before) is count


GATEWAY = [
    # (id, admit_rps, status): the ASGI middleware waits on a held request
    ("admitted-after-the-wait", 4.0, 200),
    ("refused-when-the-wait-runs-out", 0.001, 429),
]


@pytest.mark.parametrize(("rate", "status"), [c[1:] for c in GATEWAY],
                         ids=[c[0] for c in GATEWAY])  # fmt: skip
def test_the_asgi_middleware_waits_on_a_held_request(rate: float, status: int) -> None:
    from producers.asgi_control import ControlMiddleware
    from tests.unit.test_control_client import _call, _http_scope

    d = _d(**{**HOLD, "admit_rps": rate})
    e = Enforcement()
    _drained(e, d)
    now = [0.0]

    def clock_ms() -> float:  # the test's clock: 50 ms later at every look
        now[0] += 50.0
        return now[0]

    mw = lambda app: ControlMiddleware(app, lambda _s: d, clock_ms=clock_ms, enforcement=e)  # noqa: E731
    headers = {"x-vllm-priority": "2", "x-tailguard-model": "m", "x-llm-d-slo-ttft-ms": "10000"}
    r = _call(mw, _http_scope(headers))
    assert r.status == status
    assert r.app_calls == (1 if status == 200 else 0)
    assert e.applied["held"] == 1
    assert e.held_now == 0


def test_nonstream_budget_from_the_spec() -> None:
    from pipeline.shipped import DEFAULT_SLO_SPEC
    from pipeline.spec.slo import load_spec_file
    from producers.simulator.gate import nonstream_budget_ms

    assert nonstream_budget_ms(load_spec_file(DEFAULT_SLO_SPEC)) == BUDGET_MS  # nonstream-total
    assert nonstream_budget_ms(load_spec_file("specs/slo-example.yaml")) in (None, BUDGET_MS)


SIMULATED = [
    # (id, hold_fraction): the simulator's gateways wait on a held request in event time
    ("refused-at-once", None),
    ("held", 0.3),
]


@pytest.mark.parametrize("fraction", [c[1] for c in SIMULATED], ids=[c[0] for c in SIMULATED])
def test_the_simulated_gateways_wait_on_a_held_request(fraction: float | None) -> None:
    from pipeline.contract.events import GatewayCompleted, GatewayReceived
    from producers.simulator.gate import GatewayGate, directive_of
    from producers.simulator.model import SimConfig, Simulator
    from producers.simulator.trace import read_trace
    from tests.paths import SHARED_TRACE

    gate = GatewayGate(nonstream_budget_ms=BUDGET_MS)
    gate.set("*", directive_of(1, "degraded", {"admit_rps": 3.0, "hold_fraction": fraction}))
    config = SimConfig(start_unix_ns=1_700_000_000_000_000_000, seed=5, rate_scale=3.0)
    events = list(Simulator(read_trace(SHARED_TRACE)[:1_500], config, gate).events())
    received = {e.request_id: e for e in events if isinstance(e, GatewayReceived)}
    completed = [e for e in events if isinstance(e, GatewayCompleted)]
    assert sorted(e.request_id for e in completed) == sorted(received)  # none lost held
    held = sum(e.applied["held"] for e in gate.enforcements.values())
    admitted_after = sum(e.applied["held_admitted"] for e in gate.enforcements.values())
    assert all(e.held_now == 0 for e in gate.enforcements.values())
    if fraction is None:
        assert held == 0
        return
    assert held > 0
    assert admitted_after > 0
    waited = [e for e in completed if e.http_status == 200 and not received[e.request_id].stream]
    assert waited  # non-streaming requests were served
    for e in completed:  # only non-streaming requests (with a budget) were held
        if e.http_status == 429 and received[e.request_id].stream:
            assert e.total_ms < 1_000.0  # a stream is refused at once, never held


def test_the_asgi_middleware_has_nothing_to_wait_for_when_not_held() -> None:
    """``_wait_held`` checks the hold ticket explicitly (not a runtime assert): a decision
    that holds nothing comes back as it is, at once."""
    import asyncio

    from producers.asgi_control import ControlMiddleware
    from producers.enforcement import ADMIT

    decision = Decision(ADMIT, "enforce")
    mw = ControlMiddleware(lambda *_a: None, lambda _s: _d(), clock_ms=lambda: 0.0)  # type: ignore[arg-type]
    assert not decision.act.held
    assert asyncio.run(mw._wait_held(_r(), decision)) is decision
