"""What the backtest proves is what the shipped gateways do (issue 48).

The same 10,000 arrivals and the same directive sequence (every directive field, every
phase, half-open included, a model's own scope and ``"*"``) go through

* the ASGI middleware (lifecycle + control, as an app adds them) over real HTTP,
* the reference proxy (``tailguard gateway``'s app) over real HTTP, in front of an
  upstream that echoes the headers the gateway injected,
* the simulator's gate (what ``tailguard backtest`` runs),

and every request gets the same verdict, status, ``Retry-After``, ``x-should-retry``,
injected headers and recorded ``control_verdict`` from all three. A share of the arrivals
are clients' retries, as the SDKs mark them (``x-stainless-retry-count``, or a repeated
``idempotency-key``), so the retry budget is held to it too. The clocks are the test's:
each gateway's admission reads the arrival's time, so the comparison does not depend on
this machine's speed. Each arrival names a tenant (``x-tenant-id``: one sends most, some
none) and some carry their own first-token SLO (``x-llm-d-slo-ttft-ms``), so the fair
shares across tenants and the deadline refusal (issue 52) are held to it too; the
upstream answers at once, and the simulator's gate is told each admitted request's first
byte at that time, as the gateways see it (the queue each gateway sees,
``producers.gateway_queue``).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import orjson
import pytest

from pipeline.contract.control_signal import Actions
from producers.asgi_control import ControlMiddleware
from producers.client_retry import (
    IDEMPOTENCY_KEY_HEADER,
    RETRY_COUNT_HEADER,
    SHOULD_RETRY_HEADER,
    attempt_request_id,
    client_attempt,
)
from producers.control_client import NORMAL, Directive
from producers.enforcement import hash_admits, stricter
from producers.gateway import LifecycleMiddleware, priority_from_state
from producers.gateway_proxy import build_gateway
from producers.simulator.gate import Arrival, GatewayGate
from tests.gateway_fixtures import MemorySink, serve

pytestmark = [pytest.mark.integration, pytest.mark.long(40)]

N_ARRIVALS = 10_000
PER_DIRECTIVE = 500  # arrivals between two directive changes
STEP_MS = 7.0  # ~143 requests/s: the rate limit and the admission turn some away
NEW_SESSION_FRACTION = 0.3  # the simulator's: which first tries open a session
INJECTED = ("x-tailguard-max-context-tokens", "x-tailguard-fallback-model")


def _d(level: int, scope: str, phase: str = "degraded", **actions: Any) -> Directive:
    return Directive(level=level, phase=phase, actions=Actions(**actions), scope=scope)  # type: ignore[arg-type]


# (scope, directive): every field of Actions and every phase at least once
SEQUENCE: list[tuple[str, Directive]] = [
    ("m", _d(1, "m", shed_priorities_at_or_above=3, retry_after_s=5)),
    ("m", _d(1, "m", reject_new_sessions=True, retry_after_s=7)),
    ("m", _d(2, "m", "half_open", shed_priorities_at_or_above=2, admit_fraction=0.3)),
    ("*", _d(2, "*", rate_limit_rps=20.0, retry_after_s=4)),
    ("m", _d(0, "m", "normal")),  # the model's own L0 does not relax the fleet's L2
    ("*", _d(0, "*", "normal")),
    (
        "m",
        _d(
            2,
            "m",
            admit_rps=30.0,
            admit_gateways=2,
            retry_after_s=9,
            # cut-offs the echo upstream never reaches, however busy the machine: the
            # gateways run them on the real clock (a 300 ms one fired under CI load)
            queue_timeout_ms=[None, 90_000.0, 60_000.0, 30_000.0],
        ),
    ),
    ("m", _d(1, "m", cap_context_tokens=2048, fallback_model="small")),
    (
        "*",
        _d(
            3,
            "*",
            "half_open",
            shed_priorities_at_or_above=1,
            reject_new_sessions=True,
            admit_fraction=0.5,
            retry_after_s=11,
        ),
    ),
    ("*", _d(3, "*", shed_priorities_at_or_above=0, retry_after_s=2)),
    ("*", _d(0, "*", "normal")),
    ("m", _d(1, "m", admit_rps=12.5, rate_limit_rps=40.0, cap_context_tokens=512)),
    # fair shares (weighted) and the deadline: the echo answers at once, so the gateways
    # see no queue (the directive's 800 ms stand only until they have seen 5 first
    # bytes): 400 ms predicted against 300 ms-5 s SLOs
    (
        "m",
        _d(
            2,
            "m",
            admit_rps=40.0,
            admit_gateways=2,
            fair_share=True,
            tenant_weights={"t1": 3.0},
            ttft_queue_ms=800.0,
            ttft_service_ms=400.0,
            deadline_margin=0.25,
            retry_after_s=6,
        ),
    ),
]
TENANTS = ["t0"] * 6 + ["t1", "t2", None]  # t0 sends most; some requests name none
SLOS = [None, None, 300.0, 1000.0, 5000.0]  # the request's own first-token SLO


class Clock:
    """The arrival's time, read by every gateway's admission."""

    now_ms = 0.0

    def __call__(self) -> float:
        return self.now_ms


def _arrivals() -> Iterator[tuple[int, float, str, int, str, bool]]:
    rng = random.Random(48)
    for i in range(N_ARRIVALS):
        rid = f"req-{i:05d}"
        new = hash_admits(f"session:{rid}", NEW_SESSION_FRACTION)  # the simulator's rule
        yield i, i * STEP_MS, rng.choice(["m", "m", "other"]), rng.randrange(4), rid, new


def _retry_headers(i: int, rng: random.Random) -> dict[str, str]:
    """What the client's SDK says of this attempt: ~25 % retries by their count (OpenAI's
    x-stainless-retry-count 1 or 2), ~10 % an idempotency key from a small pool (a
    repeated one is a retry), the rest first attempts (count 0, or no header)."""
    x = rng.random()
    if x < 0.25:
        return {RETRY_COUNT_HEADER: str(rng.choice([1, 2]))}
    if x < 0.35:
        return {IDEMPOTENCY_KEY_HEADER: f"idem-{rng.randrange(200)}"}
    return {RETRY_COUNT_HEADER: "0"} if x < 0.6 else {}


def _expected(gate: GatewayGate, t_ms: float, model: str, prio: int, rid: str, *,
              retry: dict[str, str], tenant: str | None,
              slo: float | None) -> dict[str, Any]:  # fmt: skip
    attempt = client_attempt(retry.get)
    # the attempt's id, as the gateways record it and key it (a retry's is suffixed)
    key = attempt_request_id(rid, attempt)
    d = gate.decision(Arrival(model, prio, key, rid, "g", 100_000, t_ms, attempt.attempt,
                              attempt.logical_id, tenant=tenant, slo_ttft_ms=slo))  # fmt: skip
    v = d.act
    if v.reason is None and d.mode != "off":  # forwarded; the echo answers at once
        gate.answered("g", gate.forwarded("g", model, slo, t_ms), t_ms)
    if v.reason is not None:
        return {"status": v.status, "retry_after": str(v.retry_after_s), "reason": v.reason,
                "should_retry": None if v.should_retry is None else str(v.should_retry).lower(),
                "verdict": v.reason}  # fmt: skip
    headers = {}
    if v.cap_context_tokens is not None:
        headers[INJECTED[0]] = str(v.cap_context_tokens)
    if v.fallback_model is not None:
        headers[INJECTED[1]] = v.fallback_model
    return {"status": 200, "headers": headers, "verdict": None}


def _seen(r: httpx.Response) -> dict[str, Any]:
    if r.status_code != 200:
        body = orjson.loads(r.content)
        return {"status": r.status_code, "retry_after": r.headers.get("retry-after"),
                "reason": body["reason"],
                "should_retry": r.headers.get(SHOULD_RETRY_HEADER)}  # fmt: skip
    return {"status": 200, "headers": orjson.loads(r.content)}


async def _echo(scope: Any, receive: Any, send: Any) -> None:
    """An upstream that answers with the control headers it was sent."""
    if scope["type"] != "http":
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
        return
    while (await receive()).get("more_body"):
        pass
    seen = {k.decode(): v.decode() for k, v in scope["headers"] if k.decode() in INJECTED}
    body = orjson.dumps(seen)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})  # fmt: skip
    await send({"type": "http.response.body", "body": body, "more_body": False})


def test_middleware_proxy_and_simulator_decide_alike() -> None:
    scopes: dict[str, Directive] = {}

    def lookup(model: str) -> Directive:
        return stricter(scopes.get(model), scopes.get("*")) or NORMAL  # type: ignore[return-value]

    clock = Clock()
    gate = GatewayGate(new_session_fraction=NEW_SESSION_FRACTION)
    gate.scopes = scopes  # type: ignore[assignment]  # the same directives, in force alike
    mw_sink, proxy_sink = MemorySink(), MemorySink()
    middleware = LifecycleMiddleware(
        ControlMiddleware(_echo, lookup, priority_of=priority_from_state, clock_ms=clock),
        mw_sink,
        host="mw",
    )
    mismatches: list[str] = []
    expected_verdicts: dict[str, str | None] = {}
    refused = told_not_to_retry = 0
    with ExitStack() as stack:
        upstream = stack.enter_context(serve(_echo))
        proxy_app, _, _ = build_gateway(
            upstream, proxy_sink, host="proxy", control=lookup, control_clock_ms=clock
        )
        urls = {"middleware": stack.enter_context(serve(middleware)),
                "proxy": stack.enter_context(serve(proxy_app))}  # fmt: skip
        clients = {k: stack.enter_context(httpx.Client(base_url=u, timeout=30.0))
                   for k, u in urls.items()}  # fmt: skip
        retry_rng = random.Random(47)
        who_rng = random.Random(52)
        for i, t_ms, model, prio, rid, new in _arrivals():
            if i % PER_DIRECTIVE == 0:
                scope, directive = SEQUENCE[(i // PER_DIRECTIVE) % len(SEQUENCE)]
                scopes[scope] = directive
            clock.now_ms = t_ms
            retry = _retry_headers(i, retry_rng)
            tenant, slo = who_rng.choice(TENANTS), who_rng.choice(SLOS)
            want = _expected(gate, t_ms, model, prio, rid, retry=retry, tenant=tenant, slo=slo)
            key = attempt_request_id(rid, client_attempt(retry.get))
            expected_verdicts[key] = want.pop("verdict")
            refused += want["status"] != 200
            told_not_to_retry += want.get("should_retry") == "false"
            headers = {"x-request-id": rid, "x-vllm-priority": str(prio),
                       "x-tailguard-model": model, **retry}  # fmt: skip
            if not new or key != rid:  # a retry continues its session (the simulator's)
                headers["x-tailguard-session"] = rid
            if tenant is not None:
                headers["x-tenant-id"] = tenant
            if slo is not None:
                headers["x-llm-d-slo-ttft-ms"] = f"{slo:g}"
            body = {"model": model, "prompt": "hi", "max_tokens": 1}
            for name, client in clients.items():
                got = _seen(client.post("/v1/completions", json=body, headers=headers))
                if got != want:
                    mismatches.append(f"{name} {rid} at {t_ms} ms: {got} != {want}")
    assert not mismatches, f"{len(mismatches)} mismatches, first: {mismatches[:5]}"
    # every field and reason was exercised, and the directives turned a real share away
    reasons = {why for (_p, why) in gate.rejected}
    assert reasons == {
        "shed_priority", "new_session", "rate_limit", "admission", "retry_budget", "deadline"
    }  # fmt: skip
    assert 0 < told_not_to_retry < refused  # some refusals invite a retry, some do not
    assert gate.half_open_admitted > 0
    assert sum(gate.capped.values()) > 0
    assert gate.fallbacks > 0
    assert 1_000 < refused < 9_000
    # and each gateway recorded the same verdict on its gateway.completed
    for sink in (mw_sink, proxy_sink):
        done = {e.request_id: e for e in sink.events if e.kind == "gateway.completed"}
        assert len(done) == N_ARRIVALS
        recorded = {rid: e.control_verdict for rid, e in done.items()}
        assert recorded == expected_verdicts
        assert {e.control_mode for e in done.values()} == {"enforce"}
        assert all(
            (e.outcome == "rejected") == (expected_verdicts[rid] is not None)
            for rid, e in done.items()
        )
