"""The LiteLLM hook's pure part (producers/litellm_hook.py: TailguardGate), without LiteLLM:
LiteLLM's request dict -> RequestFacts and lifecycle events, and the enforcement's marks."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from pipeline.contract.control_signal import Actions
from pipeline.contract.events import GatewayCompleted, GatewayReceived
from producers.control_client import Directive
from producers.enforcement import Modes
from producers.gateway import PriorityRules
from producers.litellm_hook import (
    TailguardGate,
    request_id_of,
    resolve_priority,
    status_of,
    tenant_of,
)
from tests.gateway_fixtures import MemorySink
from tests.paths import REPO

SHED_2 = Directive(level=1, actions=Actions(shed_priorities_at_or_above=2, retry_after_s=7))


class Clock:
    def __init__(self) -> None:
        self.mono = 1_000_000_000
        self.wall = 1_800_000_000_000_000_000

    def advance_ms(self, ms: float) -> None:
        self.mono += int(ms * 1e6)
        self.wall += int(ms * 1e6)


def data(
    *,
    headers: dict[str, str] | None = None,
    model: str = "m",
    call_id: str = "call-1",
    stream: bool = False,
    metadata: dict[str, Any] | None = None,
    arrival_s: float | None = None,
) -> dict[str, Any]:
    psr: dict[str, Any] = {"headers": headers or {}}
    if arrival_s is not None:
        psr["arrival_time"] = arrival_s
    d: dict[str, Any] = {"model": model, "litellm_call_id": call_id, "proxy_server_request": psr}
    if stream:
        d["stream"] = True
    if metadata is not None:
        d["metadata"] = {"requester_metadata": metadata, "headers": headers or {}}
    return d


def evs(sink: MemorySink) -> list[Any]:
    """The events the gate emitted (as their concrete classes)."""
    return list(sink.events)


def gate(
    modes: Modes | None = None, directive: Directive | None = None
) -> tuple[TailguardGate, MemorySink, Clock]:
    sink, clock = MemorySink(), Clock()
    g = TailguardGate(
        sink,
        host="litellm-unit",
        modes=modes,
        directives=(lambda _m: directive) if directive is not None else None,
        monotonic_ns=lambda: clock.mono,
        wall_ns=lambda: clock.wall,
    )
    return g, sink, clock


def test_request_facts_from_litellm_data() -> None:
    rules = PriorityRules()
    assert resolve_priority(rules, {"x-vllm-priority": "1"}, {}) == 1
    assert resolve_priority(rules, {"x-vllm-priority": "9"}, {}) == 3  # clamped
    assert resolve_priority(rules, {}, {}) == 2  # the default tier
    # the request metadata's priority when the header is absent; the header wins
    meta = data(metadata={"priority": 0})
    assert resolve_priority(rules, {}, meta) == 0
    assert resolve_priority(rules, {"x-vllm-priority": "3"}, meta) == 3
    assert resolve_priority(rules, {}, {"service_tier": "flex"}) == 3
    assert resolve_priority(rules, {"x-llm-d-priority": "-1"}, {}) == 3
    # request id: the client's when usable, else LiteLLM's call id
    assert request_id_of(data(headers={"x-request-id": "client-7"})) == "client-7"
    assert request_id_of(data(headers={"x-request-id": "has space"})) == "call-1"
    # tenant: the key's team, else its alias, else its user; none for a bare master key
    assert tenant_of(SimpleNamespace(team_id="t1", key_alias="k", user_id="u")) == "t1"
    assert tenant_of(SimpleNamespace(team_id=None, key_alias="k", user_id="u")) == "k"
    assert tenant_of(SimpleNamespace(team_id=None, key_alias=None, user_id=None)) is None
    assert status_of(Exception()) == 500
    assert status_of(SimpleNamespace(status_code=429)) == 429  # type: ignore[arg-type]
    assert status_of(SimpleNamespace(code="404")) == 404  # type: ignore[arg-type]


def test_a_stream_gives_received_then_completed_with_first_byte_and_usage() -> None:
    g, sink, clock = gate()
    arrival = (clock.wall - 3_000_000) / 1e9  # LiteLLM stamped it 3 ms ago
    key = SimpleNamespace(team_id="team-a", key_alias=None, user_id=None)
    d = data(headers={"x-request-id": "r1", "x-vllm-priority": "1"}, stream=True, arrival_s=arrival)
    x = g.arrive(d, key)
    assert g.upstream_headers(x) == {"x-request-id": "r1"}
    clock.advance_ms(20)
    g.chunk("call-1")
    clock.advance_ms(30)
    g.chunk("call-1", SimpleNamespace(prompt_tokens=3, completion_tokens=5))
    g.finish("call-1", 200)
    g.finish("call-1", 200)  # once only
    rec, done = evs(sink)
    assert isinstance(rec, GatewayReceived)
    assert isinstance(done, GatewayCompleted)
    assert (rec.request_id, rec.model, rec.priority, rec.tenant, rec.stream) == (
        "r1", "m", 1, "team-a", True,
    )  # fmt: skip
    # the arrival (float seconds from LiteLLM: ~0.2 us), not the hook's call
    assert rec.ts_unix_ns == pytest.approx(clock.wall - 53_000_000, abs=1_000)
    assert done.ttfb_ms == pytest.approx(23.0, abs=0.01)
    assert done.total_ms == pytest.approx(53.0, abs=0.01)
    assert (done.http_status, done.outcome, done.prompt_tokens, done.output_tokens) == (
        200, "ok", 3, 5,
    )  # fmt: skip
    assert (done.control_mode, done.control_verdict) == (None, None)


@pytest.mark.parametrize(
    ("gap_ms", "step_ms", "ttfb_ms"),
    [
        (100.0, 0.0, 23.0),  # steady clocks: LiteLLM's stamp 3 ms before the hook counts
        (100.0, 2_500.0, 20.0),  # the wall clock stepped forward 2.5 s: the hook's own stamp
        (100.0, -2_500.0, 20.0),  # ... or back
        (100.0, 7.0, 20.0),  # a 7 ms step (a CI run's): the hook's own stamp
        (100.0, 1.0, 24.0),  # within 1 ms + 500 ppm of 100 ms: trusted, the 1 ms with it
        (60_000.0, 25.0, 48.0),  # an NTP slew over a minute (< 500 ppm): trusted
        (60_000.0, 40.0, 20.0),  # faster than any slew: a step
    ],
)
def test_a_wall_clock_step_is_not_counted_as_waiting(
    gap_ms: float, step_ms: float, ttfb_ms: float
) -> None:
    g, sink, clock = gate()
    g.arrive(data(call_id="c0"), None)  # an earlier arrival: the hook knows the clocks
    g.finish("c0", 200, at_once=True)
    clock.advance_ms(gap_ms)
    arrival = (clock.wall - 3_000_000) / 1e9  # LiteLLM stamped it 3 ms ago ...
    clock.wall += int(step_ms * 1e6)  # ... and then the wall clock moved (monotonic did not)
    g.arrive(data(call_id="c1", stream=True, arrival_s=arrival), None)
    clock.advance_ms(20)
    g.chunk("c1")
    g.finish("c1", 200)
    done = evs(sink)[-1]
    assert done.ttfb_ms == pytest.approx(ttfb_ms, abs=0.01)


def test_client_gone_mid_stream_and_a_failure() -> None:
    g, sink, _ = gate()
    g.arrive(data(call_id="c1", stream=True), None)
    g.chunk("c1")
    g.finish("c1", 200, disconnected=True)
    g.arrive(data(call_id="c2"), None)
    g.finish("c2", 502, at_once=True)
    g.finish("unknown", 200)  # a request the hook never saw: nothing
    a, b = evs(sink)[1], evs(sink)[3]
    assert (a.http_status, a.outcome, a.ttfb_ms is not None) == (0, "client_abort", True)
    assert (b.http_status, b.outcome) == (502, "error")
    assert len(evs(sink)) == 4


def test_enforce_refuses_with_429_and_records_the_reason() -> None:
    g, sink, _ = gate(Modes("enforce"), SHED_2)
    refused = g.arrive(data(call_id="c1", headers={"x-vllm-priority": "2"}), None)
    assert refused.decision.refused
    assert refused.decision.act.status == 429
    assert 4 <= refused.decision.act.retry_after_s <= 7  # the directive's 7 s, spread
    g.finish("c1", 429, at_once=True)
    admitted = g.arrive(data(call_id="c2", headers={"x-vllm-priority": "1"}), None)
    assert admitted.decision.act.reason is None
    g.finish("c2", 200, at_once=True)
    done = [e for e in evs(sink) if isinstance(e, GatewayCompleted)]
    assert [(e.http_status, e.outcome, e.control_mode, e.control_verdict) for e in done] == [
        (429, "rejected", "enforce", "shed_priority"),
        (200, "ok", "enforce", None),
    ]
    assert g.stats()["refusals"] == [["enforce", "m", 2, "shed_priority", 1]]


def test_a_retry_over_budget_is_refused_with_x_should_retry_false() -> None:
    """The hook reads the SDK's retry count (producers.client_retry) and the one
    enforcement's budget refuses the retry: 429, Retry-After, x-should-retry: false."""
    g, _sink, _ = gate(Modes("enforce", retry_budget_min_retries=0), SHED_2)
    headers = {"x-vllm-priority": "1", "x-stainless-retry-count": "1"}
    x = g.arrive(data(call_id="c1", headers=headers), None)
    assert (x.facts.attempt, x.decision.act.reason) == (1, "retry_budget")
    assert ("x-should-retry", "false") in x.decision.act.refusal_headers(x.decision.level)
    first = g.arrive(data(call_id="c2", headers={"x-vllm-priority": "1"}), None)
    assert (first.facts.attempt, first.decision.act.reason) == (0, None)


def test_shadow_serves_and_records_what_it_would_have_refused() -> None:
    g, sink, _ = gate(Modes("shadow"), SHED_2)
    x = g.arrive(data(headers={"x-vllm-priority": "3"}), None)
    assert x.decision.act.reason is None  # served
    g.finish("call-1", 200, at_once=True)
    done = evs(sink)[-1]
    assert (done.http_status, done.outcome, done.control_mode, done.control_verdict) == (
        200, "ok", "shadow", "shed_priority",
    )  # fmt: skip
    assert g.stats()["refusals"] == [["shadow", "m", 3, "shed_priority", 1]]


def test_shadow_counts_a_first_byte_later_than_the_queue_cutoff() -> None:
    d = Directive(level=1, actions=Actions(queue_timeout_ms=[None, None, 100.0, None]))
    g, sink, clock = gate(Modes("shadow"), d)
    g.arrive(data(stream=True), None)
    clock.advance_ms(150)
    g.chunk("call-1")
    g.finish("call-1", 200)
    assert evs(sink)[-1].control_verdict == "queue_timeout"
    assert g.stats()["refusals"] == [["shadow", "m", 2, "queue_timeout", 1]]


def test_off_reads_no_directive_and_a_broken_lookup_lets_requests_pass() -> None:
    calls: list[str] = []
    g, _sink, _ = gate(Modes("off"))
    g.directives = calls.append  # type: ignore[assignment,unused-ignore]
    g.arrive(data(), None)
    assert calls == []  # mode off: the directive is not even read
    assert g.enforcement.refusals == {}

    def broken(_m: str) -> Directive:
        raise RuntimeError("boom")

    g2, _, _ = gate(Modes("enforce"))
    g2.directives = broken
    x = g2.arrive(data(), None)
    assert x.decision.act.reason is None
    assert g2.counters["errors"] == 1


def test_upstream_headers_pass_on_cap_and_fallback_in_enforce() -> None:
    d = Directive(level=1, actions=Actions(cap_context_tokens=4096, fallback_model="small"))
    g, _, _ = gate(Modes("enforce"), d)
    x = g.arrive(data(headers={"x-request-id": "r"}), None)
    assert g.upstream_headers(x) == {
        "x-request-id": "r",
        "x-tailguard-max-context-tokens": "4096",
        "x-tailguard-fallback-model": "small",
    }


def test_importing_the_hook_imports_no_litellm() -> None:
    code = "import sys, producers.litellm_hook\nprint('litellm' in sys.modules)\n"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert out.stdout.strip() == "False"


def test_the_queue_the_hook_sees_counts_forwarded_requests_until_their_first_byte() -> None:
    """Issue 52: a request with its own first-token SLO counts in the queue the gateway
    sees (producers/gateway_queue.py) from its admission to its first streamed chunk, a
    whole answer, or its end; one without, or a refused one, never counts."""
    g, _sink, clock = gate(Modes("enforce"), SHED_2)
    slo = {"x-llm-d-slo-ttft-ms": "500", "x-vllm-priority": "1"}
    for k in range(6):  # 6 streams: 5 first bytes, one still waiting
        g.arrive(data(headers=slo, stream=True, call_id=f"s{k}"), None)
    g.arrive(data(headers={"x-vllm-priority": "1"}, call_id="no-slo"), None)  # not counted
    refused = g.arrive(data(headers={**slo, "x-vllm-priority": "2"}, call_id="shed"), None)
    assert refused.decision.refused
    assert refused.forwarded is None
    clock.advance_ms(1_000)
    for k in range(5):
        g.chunk(f"s{k}")
        g.chunk(f"s{k}")  # a later chunk: counted once
    now_ms = clock.mono / 1e6
    assert g.enforcement.queue.wait_ms("m", now_ms) == pytest.approx(1 * 1_000.0 / 5)
    g.finish("s5", 0, disconnected=True)  # gone without a first byte: waits no more
    assert g.enforcement.queue.wait_ms("m", now_ms) == 0.0
    g.arrive(data(headers=slo, call_id="json"), None)
    assert g.enforcement.queue.wait_ms("m", now_ms) == pytest.approx(1 * 1_000.0 / 5)
    g.finish("json", 200, at_once=True)  # a whole answer at once is its first byte
    assert g.enforcement.queue.wait_ms("m", now_ms) == 0.0


def test_stats_carry_the_first_token_prediction_error_of_admitted_requests() -> None:
    """Issue 52: the hook's stats (its stats file) report predicted - actual first byte
    of the admitted requests with a prediction, as the reference proxy's /metrics does."""
    predicting = Directive(
        level=1,
        actions=Actions(
            admission=True, admit_rps=1_000.0, ttft_queue_ms=200.0, ttft_service_ms=50.0
        ),
    )
    g, _sink, clock = gate(Modes("enforce"), predicting)
    assert g.stats()["ttft_prediction_error"] == {"n": 0, "p50_ms": None, "p90_ms": None}
    slo = {"x-llm-d-slo-ttft-ms": "5000", "x-vllm-priority": "1"}
    for k, took_ms in enumerate((100.0, 250.0, 400.0)):  # predicted 250 ms each
        g.arrive(data(headers=slo, stream=True, call_id=f"s{k}"), None)
        clock.advance_ms(took_ms)
        g.chunk(f"s{k}")
    err = g.stats()["ttft_prediction_error"]
    assert err == {"n": 3, "p50_ms": pytest.approx(0.0), "p90_ms": pytest.approx(150.0)}
    g.chunk("s0")  # a later chunk is not timed again
    assert g.stats()["ttft_prediction_error"]["n"] == 3
