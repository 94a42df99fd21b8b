"""LifecycleMiddleware under Starlette and FastAPI (in-process ASGI, no sockets), with
fake clocks: events, request ids, tracing, outcomes, and that it never breaks a request."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from opentelemetry.sdk.trace import TracerProvider
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from producers.gateway import LifecycleMiddleware, outcome_of, usable_request_id
from tests.gateway_fixtures import MemorySink

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


class Clock:
    """Monotonic ns advancing by ``step_ns`` per read."""

    def __init__(self, step_ns: int = 1_000_000) -> None:
        self.t = 0
        self.step = step_ns

    def __call__(self) -> int:
        self.t += self.step
        return self.t


async def _seen_status(request: Request, seen: dict[str, Any]) -> int:
    """Record the request in ``seen``; the status it asks for (``?boom=1``: the app fails)."""
    seen["headers"] = dict(request.headers)
    seen["body"] = await request.json()
    if request.query_params.get("boom"):
        raise RuntimeError("app failure")
    return int(request.query_params.get("status", "200"))


def starlette_app(seen: dict[str, Any]) -> Starlette:
    async def chat(request: Request) -> Response:
        status = await _seen_status(request, seen)
        if seen["body"].get("stream"):

            async def gen() -> AsyncIterator[bytes]:
                for i in range(3):
                    yield f"data: {i}\n\n".encode()

            return StreamingResponse(gen(), media_type="text/event-stream")
        return JSONResponse({"ok": True}, status_code=status)

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


def fastapi_app(seen: dict[str, Any]) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        status = await _seen_status(request, seen)
        return JSONResponse({"ok": True}, status_code=status)

    return app


APPS: list[Callable[[dict[str, Any]], Any]] = [starlette_app, fastapi_app]


def run(app: Any, sink: MemorySink, **req: Any) -> tuple[httpx.Response, dict[str, Any]]:
    mw = LifecycleMiddleware(app, sink, host="gw-1", monotonic_ns=Clock(), wall_ns=Clock(10**9))

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=mw, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            return await client.post("/v1/chat/completions", **req)

    r = asyncio.run(go())
    return r, {e.kind: e for e in sink.events if e.request_id == r.headers.get("x-request-id")}


@pytest.mark.parametrize("make_app", APPS, ids=["starlette", "fastapi"])
def test_events_and_headers(make_app: Callable[[dict[str, Any]], Any]) -> None:
    seen: dict[str, Any] = {}
    sink = MemorySink()
    r, ev = run(
        make_app(seen),
        sink,
        json={"model": "llama", "messages": []},
        headers={
            "x-vllm-priority": "9",  # clamped to the contract's 0..3
            "x-tenant-id": "t1",
            "traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-01",
        },
    )
    assert r.status_code == 200
    rid = r.headers["x-request-id"]
    assert seen["headers"]["x-request-id"] == rid
    assert seen["headers"]["traceparent"] == f"00-{TRACE_ID}-00f067aa0ba902b7-01"  # no SDK: as is
    rec, done = ev["gateway.received"], ev["gateway.completed"]
    assert (rec.model, rec.priority, rec.tenant, rec.host) == ("llama", 3, "t1", "gw-1")
    assert rec.ts_unix_ns == 10**9  # the wall clock read at arrival
    assert (done.outcome, done.http_status) == ("ok", 200)
    assert done.ttfb_ms is not None
    assert 0 < done.ttfb_ms <= done.total_ms


@pytest.mark.parametrize("make_app", APPS, ids=["starlette", "fastapi"])
@pytest.mark.parametrize(
    ("status", "outcome"), [(429, "rejected"), (504, "timeout"), (400, "error")]
)
def test_status_outcomes(
    make_app: Callable[[dict[str, Any]], Any], status: int, outcome: str
) -> None:
    sink = MemorySink()
    r, ev = run(make_app({}), sink, json={"model": "m"}, params={"status": str(status)})
    assert r.status_code == status
    assert (ev["gateway.completed"].outcome, ev["gateway.completed"].http_status) == (
        outcome,
        status,
    )


@pytest.mark.parametrize("make_app", APPS, ids=["starlette", "fastapi"])
def test_app_exception_is_an_error_event(make_app: Callable[[dict[str, Any]], Any]) -> None:
    sink = MemorySink()
    r, _ = run(make_app({}), sink, json={"model": "m"}, params={"boom": "1"})
    assert r.status_code == 500
    done = [e for e in sink.events if e.kind == "gateway.completed"]
    assert len(done) == 1
    assert done[0].outcome == "error"
    assert done[0].http_status == 500


def test_streaming_response_under_starlette() -> None:
    sink = MemorySink()
    r, ev = run(starlette_app({}), sink, json={"model": "m", "stream": True})
    assert r.text == "data: 0\n\ndata: 1\n\ndata: 2\n\n"
    assert ev["gateway.received"].stream is True
    assert ev["gateway.completed"].outcome == "ok"


def test_sdk_tracer_starts_a_child_span_of_the_incoming_trace() -> None:
    seen: dict[str, Any] = {}
    sink = MemorySink()
    tracer = TracerProvider().get_tracer("t")
    mw = LifecycleMiddleware(starlette_app(seen), sink, host="gw", tracer=tracer)

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=mw)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            return await client.post(
                "/v1/chat/completions",
                json={"model": "m"},
                headers={"traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-01"},
            )

    asyncio.run(go())
    _v, trace_id, span_id, _f = seen["headers"]["traceparent"].split("-")
    assert trace_id == TRACE_ID
    assert span_id != "00f067aa0ba902b7"


class ExplodingSink(MemorySink):
    def emit(self, event: Any) -> None:
        raise RuntimeError("sink broke")


def test_a_broken_sink_never_breaks_the_request() -> None:
    sink = ExplodingSink()
    mw = LifecycleMiddleware(starlette_app({}), sink, host="gw")

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=mw)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            return await client.post("/v1/chat/completions", json={"model": "m"})

    assert asyncio.run(go()).status_code == 200
    assert mw.counters["errors"] == 2  # received and completed both failed, both counted


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("abc-123", "abc-123"),
        ("  padded  ", "padded"),
        ("", None),
        (None, None),
        ("has space", None),
        ("x" * 129, None),
        ("tab\there", None),
        ("ünïcode", None),
    ],
)
def test_usable_request_id(value: str | None, expected: str | None) -> None:
    assert usable_request_id(value) == expected


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (200, "ok"),
        (204, "ok"),
        (302, "ok"),
        (400, "error"),
        (408, "timeout"),
        (429, "rejected"),
        (500, "error"),
        (503, "error"),
        (504, "timeout"),
    ],
)
def test_outcome_of(status: int, outcome: str) -> None:
    assert outcome_of(status) == outcome
