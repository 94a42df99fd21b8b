"""Pure ASGI middleware that emits the gateway's lifecycle events (works under any ASGI 3 app).

``LifecycleMiddleware(app, sink, host=...)`` wraps an app (FastAPI, Starlette, the
reference proxy in :mod:`producers.gateway_proxy`). Per HTTP request:

* **Request id.** ``X-Request-Id`` is kept when the client sent a usable one, otherwise
  created (32 hex chars); the app sees it in the request headers (so a proxy forwards it:
  vLLM adopts it as its request id) and the client sees it in the response headers.
* **Arrival.** ``gateway.received`` with the wall clock at arrival, the model (the JSON
  body's ``model``, else the ``x-tailguard-model`` header, else ``default_model``),
  priority (``X-Vllm-Priority``, 0 = highest ... 3, clamped; absent -> 0, as the control
  middleware reads it), tenant (``tenant_header``), and ``stream``. To read the model the
  middleware buffers a JSON request body of at most ``max_body_bytes`` before calling the
  app, then replays it to the app unchanged.
* **End.** ``gateway.completed`` with ``total_ms`` (arrival -> last body byte handed to the
  server) and ``ttfb_ms`` (arrival -> first non-empty body chunk), both from this host's
  monotonic clock, the HTTP status and the outcome: a client that disconnects before the
  response is complete -> ``client_abort`` with ``http_status`` 0; 429 -> ``rejected``;
  408/504 -> ``timeout``; other >= 400 or an exception in the app -> ``error``; else ``ok``.
  A disconnect is seen when the app reads ``receive`` (Starlette's streaming responses and
  the reference proxy listen for it) or when ``send`` raises.
* **Tracing.** The W3C ``traceparent``/``tracestate`` of the request is extracted with
  OpenTelemetry's global propagator, a server span is started (a no-op unless the process
  configured a tracer provider: then the incoming context simply passes through), and the
  resulting context is injected into the headers the app sees, so a proxy forwards it.

The request path never depends on Kafka: events go to an :class:`~producers.emit.EventSink`
whose ``emit`` never blocks or raises; any error while building an event is counted
(``counters["errors"]``) and the request goes on. Exceptions of the wrapped app propagate
as they would without the middleware.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import orjson
from opentelemetry import propagate, trace

from pipeline.contract.events import GatewayCompleted, GatewayReceived, Outcome
from producers.asgi_control import (
    MODEL_HEADER,
    REQUEST_ID_HEADER,
    ASGIApp,
    Message,
    Receive,
    Scope,
    Send,
    default_priority_of,
    header,
)
from producers.emit import EventSink

log = logging.getLogger(__name__)

TENANT_HEADER: Final = b"x-tenant-id"
MAX_REQUEST_ID_LEN: Final = 128
_TRACE_HEADERS: Final = frozenset({b"traceparent", b"tracestate"})


def outcome_of(status: int) -> Outcome:
    if status == 429:
        return "rejected"
    if status in (408, 504):
        return "timeout"
    if status >= 400:
        return "error"
    return "ok"


def usable_request_id(value: str | None) -> str | None:
    """A client's ``X-Request-Id`` if it can serve as ours (printable ASCII, no spaces)."""
    if not value:
        return None
    value = value.strip()
    if not value or len(value) > MAX_REQUEST_ID_LEN:
        return None
    if not all(33 <= ord(c) < 127 for c in value):
        return None
    return value


@dataclass(slots=True)
class _Exchange:
    """What the middleware learns about one request while it runs."""

    t0_ns: int
    status: int | None = None
    first_byte_ns: int | None = None
    done_ns: int | None = None
    disconnected: bool = False
    model: str | None = None
    body_chunks: list[Message] = field(default_factory=list)


def _is_json(scope: Scope) -> bool:
    ctype = header(scope, b"content-type") or ""
    return "json" in ctype.lower()


class LifecycleMiddleware:
    """See the module docstring. ``counters``: requests, events, errors."""

    def __init__(
        self,
        app: ASGIApp,
        sink: EventSink,
        *,
        host: str,
        default_model: str = "unknown",
        tenant_header: bytes = TENANT_HEADER,
        max_body_bytes: int = 1 << 20,
        skip_paths: frozenset[str] = frozenset(),
        monotonic_ns: Callable[[], int] = time.monotonic_ns,
        wall_ns: Callable[[], int] = time.time_ns,
        tracer: trace.Tracer | None = None,
    ) -> None:
        self.app = app
        self.sink = sink
        self.host = host
        self.default_model = default_model
        self.tenant_header = tenant_header.lower()
        self.max_body_bytes = max_body_bytes
        self.skip_paths = skip_paths
        self._mono = monotonic_ns
        self._wall = wall_ns
        self._tracer = tracer or trace.get_tracer("tailguard.gateway")
        self.counters: dict[str, int] = {"requests": 0, "events": 0, "errors": 0}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or scope.get("path") in self.skip_paths:
            await self.app(scope, receive, send)
            return
        x = _Exchange(t0_ns=self._mono())
        ts0 = self._wall()
        self.counters["requests"] += 1

        # Buffer a small JSON body to learn the model; the app gets the same messages.
        body = b""
        if scope.get("method") in ("POST", "PUT") and _is_json(scope):
            size = 0
            while True:
                msg = await receive()
                x.body_chunks.append(msg)
                if msg.get("type") != "http.request":
                    if msg.get("type") == "http.disconnect":
                        x.disconnected = True
                    break
                size += len(msg.get("body", b""))
                if not msg.get("more_body", False) or size > self.max_body_bytes:
                    break
            if size <= self.max_body_bytes:
                body = b"".join(m.get("body", b"") for m in x.body_chunks)

        request_id, downstream, span = scope.get("path", ""), scope, None
        try:
            request_id = usable_request_id(header(scope, REQUEST_ID_HEADER)) or uuid.uuid4().hex
            span, trace_headers = self._start_span(scope, request_id)
            downstream = _with_headers(
                scope, [(REQUEST_ID_HEADER, request_id.encode()), *trace_headers]
            )
            received = self._received(scope, request_id, ts0, body)
            x.model = received.model
            self._emit(received)
        except Exception:
            self.counters["errors"] += 1
            log.exception("gateway middleware: could not build gateway.received")

        pending = x.body_chunks

        async def wrapped_receive() -> Message:
            msg = pending.pop(0) if pending else await receive()
            if msg.get("type") == "http.disconnect" and x.done_ns is None:
                x.disconnected = True
            return msg

        rid_header = (REQUEST_ID_HEADER, request_id.encode("latin-1", "replace"))

        async def wrapped_send(msg: Message) -> None:
            kind = msg.get("type")
            if kind == "http.response.start":
                x.status = int(msg.get("status", 0))
                headers = [
                    (k, v)
                    for k, v in msg.get("headers") or ()
                    if bytes(k).lower() != REQUEST_ID_HEADER
                ]
                msg = {**msg, "headers": [*headers, rid_header]}
            elif kind == "http.response.body":
                if x.first_byte_ns is None and msg.get("body"):
                    x.first_byte_ns = self._mono()
                if not msg.get("more_body", False):
                    x.done_ns = self._mono()
            try:
                await send(msg)
            except Exception:
                if x.done_ns is None or kind == "http.response.body":
                    x.disconnected = True
                raise

        failed = False
        try:
            await self.app(downstream, wrapped_receive, wrapped_send)
        except BaseException:
            failed = True
            raise
        finally:
            try:
                self._emit(self._completed(scope, request_id, x, failed))
                if span is not None:
                    if x.status is not None:
                        span.set_attribute("http.response.status_code", x.status)
                    span.end()
            except Exception:
                self.counters["errors"] += 1
                log.exception("gateway middleware: could not build gateway.completed")

    def _emit(self, event: GatewayReceived | GatewayCompleted) -> None:
        self.sink.emit(event)
        self.counters["events"] += 1

    def _start_span(self, scope: Scope, request_id: str) -> tuple[Any, list[tuple[bytes, bytes]]]:
        carrier = {
            bytes(k).decode("latin-1").lower(): bytes(v).decode("latin-1")
            for k, v in scope.get("headers") or ()
            if bytes(k).lower() in _TRACE_HEADERS
        }
        parent = propagate.extract(carrier)
        span = self._tracer.start_span(
            f"{scope.get('method', 'GET')} {scope.get('path', '')}",
            context=parent,
            kind=trace.SpanKind.SERVER,
            attributes={
                "http.request.method": scope.get("method", ""),
                "tailguard.request_id": request_id,
            },
        )
        out: dict[str, str] = {}
        propagate.inject(out, context=trace.set_span_in_context(span, parent))
        return span, [(k.encode("latin-1"), v.encode("latin-1")) for k, v in out.items()]

    def _received(self, scope: Scope, request_id: str, ts0: int, body: bytes) -> GatewayReceived:
        model: str | None = None
        stream = False
        if body:
            try:
                doc = orjson.loads(body)
            except orjson.JSONDecodeError:
                doc = None
            if isinstance(doc, dict):
                if isinstance(doc.get("model"), str) and doc["model"]:
                    model = doc["model"][:256]
                stream = doc.get("stream") is True
        if model is None:
            model = (header(scope, MODEL_HEADER) or "").strip()[:256] or self.default_model
        tenant = header(scope, self.tenant_header)
        return GatewayReceived(
            v=1,
            kind="gateway.received",
            event_id=uuid.uuid4().hex,
            ts_unix_ns=ts0,
            host=self.host,
            model=model,
            request_id=request_id,
            priority=min(3, max(0, default_priority_of(scope))),
            tenant=tenant[:256] if tenant else None,
            stream=stream,
        )

    def _completed(
        self, scope: Scope, request_id: str, x: _Exchange, failed: bool
    ) -> GatewayCompleted:
        end_ns = x.done_ns if x.done_ns is not None else self._mono()
        status: int
        outcome: Outcome
        if x.disconnected and x.done_ns is None:
            status, outcome = 0, "client_abort"
        elif x.status is None:
            status, outcome = 500, "error"
        elif failed or x.done_ns is None:
            status, outcome = x.status, "error"
        else:
            status, outcome = x.status, outcome_of(x.status)
        ttfb_ms = None if x.first_byte_ns is None else (x.first_byte_ns - x.t0_ns) / 1e6
        model = x.model or (header(scope, MODEL_HEADER) or "").strip()[:256] or self.default_model
        return GatewayCompleted(
            v=1,
            kind="gateway.completed",
            event_id=uuid.uuid4().hex,
            ts_unix_ns=self._wall(),
            host=self.host,
            model=model,
            request_id=request_id,
            total_ms=max(0.0, (end_ns - x.t0_ns) / 1e6),
            ttfb_ms=None if ttfb_ms is None else max(0.0, ttfb_ms),
            http_status=status,
            outcome=outcome,
        )


def _with_headers(scope: Scope, replace: list[tuple[bytes, bytes]]) -> Scope:
    names = {k for k, _ in replace}
    kept = [
        (bytes(k), bytes(v)) for k, v in scope.get("headers") or () if bytes(k).lower() not in names
    ]
    new = dict(scope)
    new["headers"] = kept + replace
    return new
