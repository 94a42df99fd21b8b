"""The control loop's delay (issue 47 item 6): measured once per decision on the
gateway's clock against the decision's evidence (``as_of_unix_ms``), and in a backtest a
directive reaches the simulated gateways no earlier than ``--loop-delay`` after its
evidence, at the first arrival after."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.app.backtest import run_loop
from pipeline.cli import BACKTEST_START_UNIX_NS, DEFAULT_TRACE
from pipeline.contract.control_signal import Decision, Keyring, SignalIssuer, encode
from pipeline.settings import DEFAULT_SLO_SPEC
from pipeline.spec.policy import DEFAULT_POLICY_PATH, load_policy_file
from pipeline.spec.slo import load_spec_file
from producers.control_client import ControlClient, DirectiveStore
from producers.gateway_proxy import control_metrics
from producers.loop_delay import LoopDelay, quantile
from producers.simulator.gate import ControlClientGate, GatewayGate, directive_of
from producers.simulator.model import OverloadEpisode, SimConfig, Simulator
from producers.simulator.trace import read_trace

KR = Keyring({"k1": b"k" * 32}, "k1")
START_MS = BACKTEST_START_UNIX_NS // 1_000_000
SHED_ALL = {"shed_priorities_at_or_above": 0, "retry_after_s": 1}


# (scope, as_of, now) -> the delay counted, or None (not a new decision)
APPLIED = [
    ("first decision of a scope", [("m", 1_000, 4_000)], [3_000.0]),
    ("a heartbeat repeats its as_of", [("m", 1_000, 4_000), ("m", 1_000, 14_000)], [3_000.0, None]),
    ("an older decision comes late", [("m", 2_000, 5_000), ("m", 1_000, 6_000)], [3_000.0, None]),
    ("scopes count apart", [("a", 1_000, 2_000), ("b", 1_000, 3_500)], [1_000.0, 2_500.0]),
    ("next decision", [("m", 1_000, 2_000), ("m", 11_000, 30_000)], [1_000.0, 19_000.0]),
    ("no as_of: unknown, not counted", [("m", None, 2_000)], [None]),
]


@pytest.mark.parametrize(("case", "calls", "want"), APPLIED, ids=[c[0] for c in APPLIED])
def test_loop_delay_counts_each_decision_once(
    case: str, calls: list[tuple[str, int | None, int]], want: list[float | None]
) -> None:
    ld = LoopDelay()
    assert [ld.applied(*c) for c in calls] == want, case
    assert ld.count == sum(w is not None for w in want)
    assert ld.unknown == sum(c[1] is None for c in calls)


QUANTILES = [
    ([], 0.5, None),
    ([7.0], 0.99, 7.0),
    ([1.0, 2.0, 3.0, 4.0], 0.5, 2.0),
    ([float(i) for i in range(1, 101)], 0.99, 99.0),
    ([float(i) for i in range(1, 101)], 0.5, 50.0),
    ([float(i) for i in range(1, 11)], 0.99, 10.0),
]


@pytest.mark.parametrize(("values", "q", "want"), QUANTILES)
def test_quantile_nearest_rank(values: list[float], q: float, want: float | None) -> None:
    assert quantile(values, q) == want


def test_metrics_histogram() -> None:
    ld = LoopDelay()
    for as_of, now in ((0, 800), (10_000, 22_000), (20_000, 400_000)):
        ld.applied("m", as_of, now)
    text = control_metrics(None, ld)
    want = [
        'tailguard_gateway_control_loop_delay_seconds_bucket{le="1"} 1',
        'tailguard_gateway_control_loop_delay_seconds_bucket{le="10"} 1',
        'tailguard_gateway_control_loop_delay_seconds_bucket{le="15"} 2',
        'tailguard_gateway_control_loop_delay_seconds_bucket{le="300"} 2',
        'tailguard_gateway_control_loop_delay_seconds_bucket{le="+Inf"} 3',
        "tailguard_gateway_control_loop_delay_seconds_count 3",
        "tailguard_gateway_control_loop_delay_seconds_sum 392.800",
    ]
    for line in want:
        assert line in text.splitlines(), line
    assert "loop_delay" not in control_metrics(None)


def test_signal_carries_as_of_and_heartbeats_keep_it() -> None:
    iss = SignalIssuer(KR)
    d = Decision(level=1, phase="degraded")
    s = iss.issue("m", d, 5_000, as_of_ms=1_000)
    assert s.as_of_unix_ms == 1_000
    (hb,) = iss.due_heartbeats(5_000 + iss.heartbeat_ms)
    assert (hb.seq, hb.as_of_unix_ms) == (s.seq + 1, 1_000)
    assert iss.issue("m", d, 6_000).as_of_unix_ms is None


class _Clock:
    def __init__(self, ms: int) -> None:
        self.ms = ms

    def __call__(self) -> float:
        return self.ms / 1000


def test_control_client_measures_on_its_own_clock() -> None:
    """A real gateway: accepted at its wall clock (the clock of its own events)."""
    clock = _Clock(100_000)
    client = ControlClient({}, keyring=KR, clock=clock)
    iss = SignalIssuer(KR)
    d = Decision(level=1, phase="degraded")
    client.apply_raw(encode(iss.issue("m", d, 99_000, as_of_ms=90_000)))
    clock.ms = 110_000
    client.apply_raw(encode(iss.due_heartbeats(110_000)[0]))  # same decision: not counted
    assert client.loop_delay.samples() == [10_000.0]


def _shed_from(trace: Any, deliver: Any) -> tuple[list[tuple[int, int]], GatewayGate]:
    """Run the simulator with ``deliver(gate)`` done up front: (arrival ms, http status)
    of each first attempt, in arrival order."""
    gate = GatewayGate()
    deliver(gate)
    sim = Simulator(trace, SimConfig(start_unix_ns=BACKTEST_START_UNIX_NS, seed=3), gate)
    events = list(sim.events())
    received = {
        e.request_id: e.ts_unix_ns // 1_000_000 for e in events if e.kind == "gateway.received"
    }
    done = [
        (received[e.request_id], e.http_status)
        for e in events
        if e.kind == "gateway.completed" and "-r" not in e.request_id
    ]
    return sorted(done), gate


# decided at T (trace offset), delay: the gates get it at the first arrival >= T + delay
DELIVERIES = [(10_000, 0), (10_000, 5_000), (20_000, 30_000), (0, 45_000)]


@pytest.mark.parametrize(("decided_ms", "delay_ms"), DELIVERIES)
def test_directive_is_applied_at_the_first_arrival_after_its_delay(
    decided_ms: int, delay_ms: int
) -> None:
    trace = read_trace(DEFAULT_TRACE)[:600]
    as_of = START_MS + decided_ms
    at = as_of + delay_ms
    arrivals, gate = _shed_from(
        trace,
        lambda g: g.deliver("*", directive_of(1, "degraded", SHED_ALL, "*", as_of), at),
    )
    before = [s for t, s in arrivals if t < at]
    after = [(t, s) for t, s in arrivals if t >= at]
    assert before
    assert after
    assert 429 not in before  # never before T + delay
    assert {s for _, s in after} == {429}  # from the first arrival at or after it
    first = after[0][0]
    assert gate.loop_delay.samples() == [pytest.approx(first - as_of, abs=1)]


def test_control_client_gate_applies_on_the_simulator_clock() -> None:
    """The demo's gates: a signal the client accepted (its wall clock) is in force from
    the next arrival, and its delay is that arrival's simulated time minus as_of; a
    heartbeat is not a new decision."""
    store = DirectiveStore(KR)
    clock = _Clock(1_000_000)

    class Client:
        def __init__(self) -> None:
            self.store = store

        def now_ms(self) -> int:
            return clock.ms

        def directive(self, model: str) -> Any:
            return store.current(model, clock.ms)

    gate = ControlClientGate(Client())
    iss = SignalIssuer(KR)
    assert gate.advance(START_MS + 5_000) == []
    store.apply(
        encode(iss.issue("*", Decision(level=1, phase="degraded"), clock.ms, 1_000)), clock.ms
    )
    (got,) = gate.advance(START_MS + 7_500)
    assert got[0] == "*"
    store.apply(encode(iss.due_heartbeats(clock.ms + iss.heartbeat_ms)[0]), clock.ms)
    assert gate.advance(START_MS + 9_000) == []
    assert gate.loop_delay.samples() == [START_MS + 7_500 - 1_000]


def test_backtest_loop_delay_holds_directives_back() -> None:
    """The same loop decides; with a delay every decision reaches the gates no earlier
    than its evidence + the delay, and priority 0 pays for it during the episode."""
    trace = read_trace(DEFAULT_TRACE)[:6000]
    config = SimConfig(
        start_unix_ns=BACKTEST_START_UNIX_NS, seed=1, overload=OverloadEpisode(120, 420, 4.0)
    )
    spec = load_spec_file(DEFAULT_SLO_SPEC)
    policy = load_policy_file(DEFAULT_POLICY_PATH)
    runs = {
        d: run_loop(trace, config, spec, policy, loop="tailguard", loop_delay_ms=d)
        for d in (0, 60_000)
    }
    for d, run in runs.items():
        ld = run["loop_delay"]
        assert ld["set_ms"] == d
        assert ld["decisions"] > 0
    assert runs[0]["loop_delay"]["p50_ms"] < 60_000
    assert runs[60_000]["loop_delay"]["min_ms"] >= 60_000
    ep = {d: r["by_priority"]["0"]["episode_slos"]["ttft-stream"] for d, r in runs.items()}
    assert ep[60_000] < ep[0]


# (as_of, at) deliveries to one scope, the clock -> the as_of in force after it
OUT_OF_ORDER = [
    ("in order", [(1_000, 5_000), (2_000, 6_000)], 7_000, 2_000),
    ("an older decision arriving later is dropped", [(2_000, 5_000), (1_000, 6_000)], 7_000, 2_000),
    ("not yet arrived", [(1_000, 5_000), (2_000, 9_000)], 7_000, 1_000),
]


@pytest.mark.parametrize(
    ("case", "deliveries", "now", "want"), OUT_OF_ORDER, ids=[c[0] for c in OUT_OF_ORDER]
)
def test_a_late_older_delivery_does_not_replace_a_newer_one(
    case: str, deliveries: list[tuple[int, int]], now: int, want: int
) -> None:
    gate = GatewayGate()
    for as_of, at in deliveries:
        gate.deliver("m", directive_of(1, "degraded", {}, "m", as_of), at)
    gate.advance(now)
    assert gate.scopes["m"].as_of_unix_ms == want, case  # type: ignore[attr-defined]
