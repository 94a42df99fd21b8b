"""The client's attempt on gateway.received (issue 47), in every gateway that emits events:
the ASGI middleware (over in-process HTTP), the LiteLLM hook and Envoy's access log read
the SDKs' headers with producers/client_retry.py; a retry that reuses the client's
X-Request-Id gets a request id of its own, so both attempts are joined and counted as one
logical request (without it, vLLM's engine.finished of the retry repeats the first try's
event id and is dropped as a duplicate)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from pipeline.core.logical import logical_requests
from producers.envoy import parse_line
from producers.gateway import LifecycleMiddleware
from producers.litellm_hook import client_attempt_of, request_id_of
from producers.vllm_stats import event_id_for
from tests.factories import finished, joined
from tests.gateway_fixtures import MemorySink
from tests.unit.test_envoy import BASE

# (request headers, request id the app and the events see (None: generated), the
# received's client_attempt, its logical_request_id)
HEADERS: list[tuple[dict[str, str], str | None, int, str | None]] = [
    ({}, None, 0, None),
    ({"x-request-id": "c-1"}, "c-1", 0, None),
    ({"x-request-id": "c-1", "x-stainless-retry-count": "1"}, "c-1~retry1", 1, "c-1"),
    ({"x-request-id": "c-1", "x-stainless-retry-count": "2", "idempotency-key": "K"},
     "c-1~retry2", 2, "K"),
    ({"idempotency-key": "K", "x-stainless-retry-count": "1"}, None, 1, "K"),
    ({"x-client-request-id": "L"}, None, 0, "L"),
    ({"x-request-id": "c-1", "x-stainless-retry-count": "abc"}, "c-1", 0, None),
    ({"x-request-id": "has space", "x-stainless-retry-count": "1"}, None, 1, None),
]  # fmt: skip


def _app(status: list[int]) -> Starlette:
    async def chat(request: Request) -> Response:
        return JSONResponse({"ok": True, "seen_id": request.headers.get("x-request-id")},
                            status_code=status.pop(0) if status else 200)  # fmt: skip

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


def _post(sink: MemorySink, headers_list: list[dict[str, str]], status: list[int]) -> list[Any]:
    mw = LifecycleMiddleware(_app(status), sink, host="gw-1")

    async def go() -> list[Any]:
        transport = httpx.ASGITransport(app=mw, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            return [
                await client.post("/v1/chat/completions", json={"model": "m"}, headers=h)
                for h in headers_list
            ]

    return asyncio.run(go())


@pytest.mark.parametrize(("headers", "rid", "attempt", "logical"), HEADERS)
def test_middleware_records_the_attempt(
    headers: dict[str, str], rid: str | None, attempt: int, logical: str | None
) -> None:
    sink = MemorySink()
    (r,) = _post(sink, [headers], [])
    received, done = sink.events
    seen = r.json()["seen_id"]  # what the app behind (vLLM) was sent
    assert received.request_id == done.request_id == seen == r.headers["x-request-id"]
    if rid is not None:
        assert seen == rid
    else:
        assert len(seen) == 32  # generated
    assert (received.client_attempt, received.logical_request_id) == (attempt, logical)


@pytest.mark.parametrize(("headers", "rid", "attempt", "logical"), HEADERS)
def test_litellm_hook_reads_the_same(
    headers: dict[str, str], rid: str | None, attempt: int, logical: str | None
) -> None:
    data = {"model": "m", "litellm_call_id": "call-1", "proxy_server_request": {"headers": headers}}
    assert request_id_of(data) == (rid or "call-1")
    assert client_attempt_of(headers).attempt == attempt


def test_envoy_line_carries_the_attempt() -> None:
    doc = {**BASE, "retry_count": "2", "idempotency_key": "K"}
    received, _ = parse_line(orjson.dumps(doc), host="e", default_model="m")
    assert (received.client_attempt, received.logical_request_id) == (2, "K")
    received, _ = parse_line(orjson.dumps(BASE), host="e", default_model="m")
    assert (received.client_attempt, received.logical_request_id) == (0, None)


def _engine_finished(rid: str, t_ms: float) -> Any:
    """vLLM's engine.finished for the id it was sent (the plugin's event id: host and
    vLLM's request id, producers/vllm_stats.py)."""
    ev = finished(rid, t_ms)
    return ev.model_copy(update={"event_id": event_id_for("m-0", rid, "engine.finished")})


def test_a_retry_reusing_the_request_id_is_joined_and_counted_once() -> None:
    """The client sends X-Request-Id ``dup`` twice: the first try fails at the engine (a
    502 after vLLM ran it), the retry (x-stainless-retry-count 1) is served. Both attempts
    are recorded, each with its own engine.finished, and they are one logical request,
    served."""
    sink = MemorySink()
    first, retry = _post(
        sink,
        [{"x-request-id": "dup"}, {"x-request-id": "dup", "x-stainless-retry-count": "1"}],
        [502, 200],
    )
    assert (first.status_code, retry.status_code) == (502, 200)
    ids = [first.json()["seen_id"], retry.json()["seen_id"]]
    assert ids == ["dup", "dup~retry1"]  # what vLLM was sent: two ids
    events = [*sink.events, *(_engine_finished(rid, 1.0) for rid in ids)]
    records = joined(events)
    final = {r.request_id: r for r in records}  # the last record of each
    assert sorted(final) == ["dup", "dup~retry1"]
    assert all(r.source == "joined" for r in final.values())
    assert (final["dup"].outcome, final["dup~retry1"].outcome) == ("error", "ok")
    assert final["dup~retry1"].logical_request_id == "dup"
    (lr,) = logical_requests(final.values())
    assert (len(lr.attempts), lr.never_served, lr.final.request_id) == (2, False, "dup~retry1")
