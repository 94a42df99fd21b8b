"""Gateway-only deployments (issue 16 item 1): tokens from ``usage`` (JSON body and the
last SSE chunk), the priority rules and default tier, the route allow-list, llm-d's
per-request SLO headers, and quiet logs. In-process ASGI (Starlette), no sockets."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from pipeline.contract.control_signal import Actions
from pipeline.contract.events import GatewayCompleted, GatewayReceived
from producers.asgi_control import ControlMiddleware, default_priority_of, int_header
from producers.control_client import Directive
from producers.gateway import (
    DEFAULT_PRIORITY,
    LifecycleMiddleware,
    PriorityRules,
    priority_from_state,
    sse_usage,
    usage_tokens,
)
from producers.gateway_proxy import quiet_logs
from tests.gateway_fixtures import MemorySink

USAGE = {"prompt_tokens": 700, "completion_tokens": 41, "total_tokens": 741}


def _chunk(doc: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(doc) + b"\n\n"


def upstream() -> Starlette:
    """An OpenAI-shaped app: JSON or SSE answers with usage, embeddings, /v1/models 404."""

    async def chat(request: Request) -> Response:
        body = await request.json()
        if body.get("stream"):
            include = (body.get("stream_options") or {}).get("include_usage") is True

            async def gen() -> AsyncIterator[bytes]:
                for i in range(3):
                    yield _chunk({"choices": [{"delta": {"content": str(i)}}], "usage": None})
                if include:
                    yield _chunk({"choices": [], "usage": USAGE})
                yield b"data: [DONE]\n\n"

            return StreamingResponse(gen(), media_type="text/event-stream")
        return JSONResponse({"choices": [{"message": {"content": "x"}}], "usage": USAGE})

    async def responses(request: Request) -> Response:
        async def gen() -> AsyncIterator[bytes]:
            yield b"event: response.output_text.delta\n" + _chunk({"delta": "hi"})
            done = {
                "type": "response.completed",
                "response": {"usage": {"input_tokens": 9000, "output_tokens": 3}},
            }
            yield b"event: response.completed\n" + _chunk(done)

        return StreamingResponse(gen(), media_type="text/event-stream")

    async def embeddings(request: Request) -> Response:
        return JSONResponse({"data": [], "usage": {"prompt_tokens": 12, "total_tokens": 12}})

    async def models(request: Request) -> Response:
        return JSONResponse({"error": "not here"}, status_code=404)

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/responses", responses, methods=["POST"]),
            Route("/v1/embeddings", embeddings, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/health", models, methods=["GET"]),
        ]
    )


def call(
    method: str, path: str, mw_kwargs: dict[str, Any] | None = None, **req: Any
) -> tuple[httpx.Response, list[Any], LifecycleMiddleware]:
    sink = MemorySink()
    mw = LifecycleMiddleware(upstream(), sink, host="gw", **(mw_kwargs or {}))

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=mw)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            return await client.request(method, path, **req)

    return asyncio.run(go()), sink.events, mw


def completed(events: list[Any]) -> GatewayCompleted:
    (done,) = [e for e in events if e.kind == "gateway.completed"]
    assert isinstance(done, GatewayCompleted)
    return done


def received(events: list[Any]) -> GatewayReceived:
    (rec,) = [e for e in events if e.kind == "gateway.received"]
    assert isinstance(rec, GatewayReceived)
    return rec


# --- tokens from usage ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("doc", "want"),
    [
        ({"usage": USAGE}, (700, 41)),
        ({"usage": {"input_tokens": 5, "output_tokens": 2}}, (5, 2)),  # Responses API
        ({"response": {"usage": {"input_tokens": 5, "output_tokens": 2}}}, (5, 2)),
        ({"usage": {"prompt_tokens": 12, "total_tokens": 12}}, (12, None)),  # embeddings
        ({"usage": None}, None),
        ({"usage": {"prompt_tokens": -1, "completion_tokens": "3"}}, None),  # not counts
        ({"usage": {"prompt_tokens": True}}, None),
        ({"usage": {"prompt_tokens": 2**32}}, None),  # beyond the UInt32 column
        ([1, 2], None),
        ({}, None),
    ],
)
def test_usage_tokens(doc: Any, want: tuple[int | None, int | None] | None) -> None:
    assert usage_tokens(doc) == want


def test_sse_usage_takes_the_last_event_with_usage() -> None:
    tail = (
        _chunk({"usage": {"prompt_tokens": 1, "completion_tokens": 1}})
        + b"data: {broken\n\n"
        + _chunk({"usage": {"prompt_tokens": 1, "completion_tokens": 9}})
        + _chunk({"choices": [], "usage": None})
        + b"data: [DONE]\n\n"
    )
    assert sse_usage(tail) == (1, 9)
    assert sse_usage(b"data: [DONE]\n\n") is None


def test_json_body_usage() -> None:
    r, events, mw = call("POST", "/v1/chat/completions", json={"model": "m", "messages": []})
    assert r.status_code == 200
    done = completed(events)
    assert (done.prompt_tokens, done.output_tokens) == (700, 41)
    assert mw.counters["usage_read"] == 1


def test_stream_final_chunk_usage() -> None:
    body = {"model": "m", "stream": True, "stream_options": {"include_usage": True}}
    r, events, _ = call("POST", "/v1/chat/completions", json=body)
    assert r.status_code == 200
    assert r.text.endswith("data: [DONE]\n\n")  # the client gets the stream unchanged
    done = completed(events)
    assert (done.prompt_tokens, done.output_tokens) == (700, 41)
    assert received(events).stream is True
    assert done.ttfb_ms is not None
    assert done.ttfb_ms <= done.total_ms


def test_stream_without_usage_has_no_tokens() -> None:
    _, events, _ = call("POST", "/v1/chat/completions", json={"model": "m", "stream": True})
    done = completed(events)
    assert (done.prompt_tokens, done.output_tokens) == (None, None)


def test_responses_api_stream_and_embeddings() -> None:
    _, events, _ = call("POST", "/v1/responses", json={"model": "m", "stream": True})
    assert (completed(events).prompt_tokens, completed(events).output_tokens) == (9000, 3)
    _, events, _ = call("POST", "/v1/embeddings", json={"model": "e", "input": "x"})
    assert (completed(events).prompt_tokens, completed(events).output_tokens) == (12, None)


def test_oversized_json_body_gives_no_tokens() -> None:
    _, events, _ = call("POST", "/v1/chat/completions", {"max_body_bytes": 16}, json={"model": "m"})
    assert completed(events).prompt_tokens is None


# --- route allow-list -----------------------------------------------------------------


def test_non_inference_routes_are_not_recorded() -> None:
    r, events, mw = call("GET", "/v1/models")
    assert r.status_code == 404  # passed through to the app, untouched
    assert events == []
    assert mw.counters["not_recorded"] == 1
    assert mw.counters["requests"] == 0
    r, events, _ = call("GET", "/health")
    assert events == []


def test_every_path_when_asked() -> None:
    _, events, _ = call("GET", "/v1/models", {"record_paths": None})
    assert completed(events).outcome == "error"


# --- priority ----------------------------------------------------------------------


def _scope(headers: dict[str, str]) -> dict[str, Any]:
    return {"type": "http", "headers": [(k.encode(), v.encode()) for k, v in headers.items()]}


@pytest.mark.parametrize(
    ("headers", "body", "want"),
    [
        ({}, None, DEFAULT_PRIORITY),  # untagged: the middle tier, not gold
        ({}, {"model": "m"}, 2),
        ({"x-vllm-priority": "0"}, None, 0),
        ({"x-vllm-priority": "9"}, None, 3),  # clamped
        ({"x-vllm-priority": "-4"}, None, 0),
        ({"x-vllm-priority": "high"}, None, 2),  # not an integer: next rule
        ({"x-llm-d-priority": "-1"}, None, 3),  # llm-d sheddable
        ({"x-llm-d-priority": "0"}, None, 2),
        ({"x-llm-d-priority": "10"}, None, 1),
        ({"x-vllm-priority": "1", "x-llm-d-priority": "-1"}, None, 1),  # vLLM's header first
        ({}, {"service_tier": "priority"}, 0),
        ({}, {"service_tier": "scale"}, 1),
        ({}, {"service_tier": "default"}, 2),
        ({}, {"service_tier": "auto"}, 2),
        ({}, {"service_tier": "flex"}, 3),
        ({}, {"service_tier": "unheard-of"}, 2),
        ({"x-llm-d-priority": "-5"}, {"service_tier": "priority"}, 3),  # header first
    ],
)
def test_priority_rules(headers: dict[str, str], body: dict[str, Any] | None, want: int) -> None:
    assert PriorityRules().resolve(_scope(headers), body) == want


@pytest.mark.parametrize(
    ("headers", "want_int", "want_priority"),
    [
        ({}, None, DEFAULT_PRIORITY),
        ({"x-vllm-priority": "1"}, 1, 1),
        ({"x-vllm-priority": " 3 "}, 3, 3),
        ({"x-vllm-priority": "-4"}, -4, -4),  # the control gate's own rule: not clamped
        ({"x-vllm-priority": "high"}, None, DEFAULT_PRIORITY),
        ({"x-vllm-priority": ""}, None, DEFAULT_PRIORITY),
        ({"X-Vllm-Priority": "0"}, 0, 0),
    ],
)
def test_int_header_and_the_control_gates_default_priority(
    headers: dict[str, str], want_int: int | None, want_priority: int
) -> None:
    scope = _scope(headers)
    assert int_header(scope, b"x-vllm-priority") == want_int
    assert default_priority_of(scope) == want_priority


def test_priority_rules_are_configurable_and_checked() -> None:
    assert PriorityRules(default=1).resolve(_scope({})) == 1
    assert PriorityRules(llmd_header=b"x-prio").resolve(_scope({"x-prio": "-1"})) == 3
    with pytest.raises(ValueError, match="default priority"):
        PriorityRules(default=4)
    with pytest.raises(ValueError, match="service_tier"):
        PriorityRules(service_tiers={"x": 7})


def test_untagged_traffic_lands_in_the_default_tier() -> None:
    _, events, _ = call("POST", "/v1/chat/completions", json={"model": "m"})
    assert received(events).priority == DEFAULT_PRIORITY == 2
    _, events, _ = call(
        "POST", "/v1/chat/completions", {"priority": PriorityRules(default=3)}, json={"x": 1}
    )
    assert received(events).priority == 3
    _, events, _ = call("POST", "/v1/chat/completions", json={"service_tier": "flex"})
    assert received(events).priority == 3


def test_control_sheds_on_the_resolved_priority() -> None:
    """The control middleware behind the lifecycle middleware sheds by the same rules:
    a body's service_tier=flex is shed at "priorities >= 3", untagged traffic is not."""
    directive = Directive(
        level=2, phase="degraded", actions=Actions(shed_priorities_at_or_above=3), scope="*"
    )
    sink = MemorySink()
    app = LifecycleMiddleware(
        ControlMiddleware(upstream(), lambda _m: directive, priority_of=priority_from_state),
        sink,
        host="gw",
    )

    async def go(body: dict[str, Any]) -> int:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            return (await client.post("/v1/chat/completions", json=body)).status_code

    assert asyncio.run(go({"model": "m", "service_tier": "flex"})) == 429
    assert asyncio.run(go({"model": "m"})) == 200
    done = [e for e in sink.events if e.kind == "gateway.completed"]
    # a deliberate refusal is a 429 recorded as rejected (not an error), with its reason
    assert [(e.outcome, e.control_mode, e.control_verdict) for e in done] == [
        ("rejected", "enforce", "shed_priority"),
        ("ok", "enforce", None),
    ]


def test_priority_from_state_without_the_lifecycle_middleware() -> None:
    assert priority_from_state(_scope({})) == DEFAULT_PRIORITY
    assert priority_from_state(_scope({"x-vllm-priority": "0"})) == 0


# --- llm-d per-request SLO headers --------------------------------------------------------


@pytest.mark.parametrize(
    ("ttft", "tpot", "want"),
    [
        ("250", "30.5", (250.0, 30.5)),
        ("0", "-3", (None, None)),  # not a positive objective
        ("fast", "nan", (None, None)),
        (None, "12", (None, 12.0)),
    ],
)
def test_llmd_slo_headers_recorded(
    ttft: str | None, tpot: str | None, want: tuple[float | None, float | None]
) -> None:
    headers = {}
    if ttft is not None:
        headers["x-llm-d-slo-ttft-ms"] = ttft
    if tpot is not None:
        headers["x-llm-d-slo-tpot-ms"] = tpot
    _, events, _ = call("POST", "/v1/chat/completions", json={"model": "m"}, headers=headers)
    done = completed(events)
    assert (done.slo_ttft_ms, done.slo_tpot_ms) == want


# --- quiet logs ----------------------------------------------------------------------


def test_quiet_logs_hold_httpx_at_warning() -> None:
    quiet_logs(verbose=True)
    assert not logging.getLogger("httpx").isEnabledFor(logging.DEBUG)
    assert logging.getLogger("httpx").isEnabledFor(logging.INFO)
    quiet_logs()
    assert not logging.getLogger("httpx").isEnabledFor(logging.INFO)
    assert logging.getLogger("httpx").isEnabledFor(logging.WARNING)
