"""Pure ASGI middleware that emits the gateway's lifecycle events (works under any ASGI 3 app).

``LifecycleMiddleware(app, sink, host=...)`` wraps an app (FastAPI, Starlette, the
reference proxy in :mod:`producers.gateway_proxy`). Per HTTP request:

* **Request id.** ``X-Request-Id`` is kept when the client sent a usable one, otherwise
  created (32 hex chars); the app sees it in the request headers (so a proxy forwards it:
  vLLM adopts it as its request id) and the client sees it in the response headers. A
  client's retry (``x-stainless-retry-count`` k > 0) that reuses its id gets
  ``<id>~retry<k>`` (:func:`producers.client_retry.attempt_request_id`).
* **Attempts.** ``gateway.received`` carries ``client_attempt`` and
  ``logical_request_id`` as :mod:`producers.client_retry` reads them from the SDKs'
  headers (issue 47).
* **Which requests.** Only HTTP requests whose path is in ``record_paths`` (by default
  the inference routes, :data:`INFERENCE_ROUTES`) are recorded; any other path (``GET
  /v1/models``, health checks, metrics) passes through untouched and unrecorded.
* **Arrival.** ``gateway.received`` with the wall clock at arrival, the model (the JSON
  body's ``model``, else the ``x-tailguard-model`` header, else ``default_model``),
  priority (:class:`PriorityRules`: ``X-Vllm-Priority``, else llm-d's priority header,
  else the body's OpenAI ``service_tier``, else the configured default, a middle tier),
  tenant (``tenant_header``), and ``stream``. To read them the middleware buffers a JSON
  request body of at most ``max_body_bytes`` before calling the app, then replays it to
  the app unchanged. The resolved priority is left in ``scope["state"]`` under
  :data:`PRIORITY_STATE_KEY` for the control middleware behind it.
* **End.** ``gateway.completed`` with ``total_ms`` (arrival -> last body byte handed to the
  server) and ``ttfb_ms`` (arrival -> first non-empty body chunk), both from this host's
  monotonic clock, the HTTP status and the outcome: a client that disconnects before the
  response is complete -> ``client_abort`` with ``http_status`` 0; 429 -> ``rejected``;
  so is the control middleware's queue cut-off (its 503, marked in ``scope["state"]``
  under :data:`~producers.asgi_control.REJECTED_STATE_KEY`); 408/504 -> ``timeout``;
  the control middleware's mode and verdict (its mark under
  :data:`~producers.asgi_control.CONTROL_STATE_KEY`) -> ``control_mode`` /
  ``control_verdict``;
  other >= 400 or an exception in the app -> ``error``; else ``ok``.
  A disconnect is seen when the app reads ``receive`` (Starlette's streaming responses and
  the reference proxy listen for it) or when ``send`` raises.
* **Tokens.** ``prompt_tokens`` and ``output_tokens`` of ``gateway.completed`` come from
  the response's OpenAI ``usage`` object: in a JSON body (``prompt_tokens`` /
  ``completion_tokens``, or the Responses API's ``input_tokens`` / ``output_tokens``), or
  in the last server-sent event that carries one (a stream with
  ``stream_options.include_usage``; the Responses API's ``response.completed``). The
  JSON body is buffered up to ``max_body_bytes``; of a stream only the last
  :data:`SSE_TAIL_BYTES` are kept. A compressed or unparsable body gives no tokens.
* **Per-request SLOs.** llm-d's ``x-llm-d-slo-ttft-ms`` and ``x-llm-d-slo-tpot-ms``
  request headers (positive numbers) are recorded on ``gateway.completed`` as
  ``slo_ttft_ms`` / ``slo_tpot_ms``.
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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

import orjson
from opentelemetry import propagate, trace

from pipeline.contract.events import (
    DEFAULT_PRIORITY,
    GatewayCompleted,
    GatewayReceived,
    Outcome,
)
from producers.asgi_control import (
    CONTROL_STATE_KEY,
    MODEL_HEADER,
    PRIORITY_HEADER,
    REJECTED_STATE_KEY,
    REQUEST_ID_HEADER,
    SLO_TPOT_HEADER,
    SLO_TTFT_HEADER,
    TENANT_HEADER,
    ASGIApp,
    Message,
    Receive,
    Scope,
    Send,
    header,
    int_header,
    positive_ms,
)
from producers.client_retry import (
    ClientAttempt,
    attempt_request_id,
    client_attempt,
    logical_request_id,
)
from producers.emit import EventSink

log = logging.getLogger(__name__)

MAX_REQUEST_ID_LEN: Final = 128
_TRACE_HEADERS: Final = frozenset({b"traceparent", b"tracestate"})

# The OpenAI-compatible inference routes: the only ones recorded by default.
INFERENCE_ROUTES: Final = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"}
)
LLMD_PRIORITY_HEADER: Final = b"x-llm-d-priority"
PRIORITY_STATE_KEY: Final = "tailguard.priority"
SSE_TAIL_BYTES: Final = 64 * 1024
LOWEST_PRIORITY: Final = 3
# OpenAI's ``service_tier`` request field -> tailguard priority (None: the default tier).
SERVICE_TIERS: Final[Mapping[str, int | None]] = MappingProxyType(
    {"priority": 0, "scale": 1, "default": None, "auto": None, "flex": 3}
)


@dataclass(frozen=True, slots=True)
class PriorityRules:
    """How a request's priority (0 = highest ... 3) is read, first match wins:

    1. ``vllm_header`` (``X-Vllm-Priority``): an integer, clamped to 0..3;
    2. ``llmd_header``: llm-d's signed priority (an InferenceObjective's): ``< 0`` is
       sheddable -> 3 (the lowest tier), ``0`` -> ``default``, ``> 0`` -> 1;
    3. the JSON body's OpenAI ``service_tier`` (:data:`SERVICE_TIERS`; an unknown tier ->
       ``default``);
    4. ``default`` (a middle tier unless configured).

    A value that is not an integer falls through to the next rule.
    """

    default: int = DEFAULT_PRIORITY
    vllm_header: bytes = PRIORITY_HEADER
    llmd_header: bytes = LLMD_PRIORITY_HEADER
    service_tiers: Mapping[str, int | None] = field(default_factory=lambda: SERVICE_TIERS)

    def __post_init__(self) -> None:
        if not 0 <= self.default <= LOWEST_PRIORITY:
            raise ValueError(f"default priority must be 0..3, got {self.default}")
        for tier, p in self.service_tiers.items():
            if p is not None and not 0 <= p <= LOWEST_PRIORITY:
                raise ValueError(f"service_tier {tier!r} maps to {p}, not 0..3")

    def resolve(self, scope: Scope, body: Mapping[str, Any] | None = None) -> int:
        value = int_header(scope, self.vllm_header)
        if value is not None:
            return min(LOWEST_PRIORITY, max(0, value))
        value = int_header(scope, self.llmd_header)
        if value is not None:
            return LOWEST_PRIORITY if value < 0 else (self.default if value == 0 else 1)
        tier = body.get("service_tier") if body is not None else None
        if isinstance(tier, str):
            mapped = self.service_tiers.get(tier)
            return self.default if mapped is None else mapped
        return self.default


def _positive_ms(scope: Scope, name: bytes) -> float | None:
    return positive_ms(header(scope, name))


def priority_from_state(scope: Scope) -> int:
    """The priority :class:`LifecycleMiddleware` resolved (for the control middleware);
    for a request it did not see, the default :class:`PriorityRules` on its headers."""
    state = scope.get("state")
    if isinstance(state, dict):
        value = state.get(PRIORITY_STATE_KEY)
        if isinstance(value, int):
            return value
    return PriorityRules().resolve(scope)


_UINT32_MAX: Final = 2**32 - 1


def _count(value: object) -> int | None:
    if type(value) is int and 0 <= value <= _UINT32_MAX:
        return value
    return None


def usage_tokens(doc: object) -> tuple[int | None, int | None] | None:
    """``(prompt_tokens, output_tokens)`` from an OpenAI response object's ``usage``
    (chat/completions/embeddings names, or the Responses API's, also nested in
    ``response``); None when it has none."""
    if not isinstance(doc, dict):
        return None
    usage = doc.get("usage")
    if not isinstance(usage, dict):
        inner = doc.get("response")
        usage = inner.get("usage") if isinstance(inner, dict) else None
    if not isinstance(usage, dict):
        return None
    prompt = _count(usage.get("prompt_tokens", usage.get("input_tokens")))
    output = _count(usage.get("completion_tokens", usage.get("output_tokens")))
    if prompt is None and output is None:
        return None
    return prompt, output


def sse_usage(tail: bytes) -> tuple[int | None, int | None] | None:
    """The usage of the last ``data:`` event in ``tail`` that has one."""
    for raw in reversed(tail.split(b"\n")):
        line = raw.strip()
        if not line.startswith(b"data:") or b"usage" not in line:
            continue
        try:
            doc = orjson.loads(line[5:])
        except orjson.JSONDecodeError:
            continue
        found = usage_tokens(doc)
        if found is not None:
            return found
    return None


def outcome_of(status: int) -> Outcome:
    if status == 429:
        return "rejected"
    if status in (408, 504):
        return "timeout"
    if status >= 400:
        return "error"
    return "ok"


def terminal_status(
    status: int | None, *, disconnected: bool, done: bool, failed: bool, rejected: bool
) -> tuple[int, Outcome]:
    """``gateway.completed``'s ``(http_status, outcome)`` from what a gateway saw: the
    client gone before the response was complete -> ``(0, "client_abort")``; no response
    started -> ``(500, "error")``; the app failed or the response never completed ->
    ``error`` with its status; turned away by the control (``rejected``, e.g. its queue
    cut-off's 503) -> ``rejected``; else :func:`outcome_of` the status. Shared by every
    gateway that emits the event (this middleware, :mod:`producers.litellm_hook`)."""
    if disconnected and not done:
        return 0, "client_abort"
    if status is None:
        return 500, "error"
    if failed or not done:
        return status, "error"
    if rejected:
        return status, "rejected"
    return status, outcome_of(status)


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
    rejected: bool = False  # turned away by the control middleware behind (its state mark)
    model: str | None = None
    body_chunks: list[Message] = field(default_factory=list)
    # the response, kept to read its usage: "json" (whole body), "sse" (a tail), or None
    response_kind: str | None = None
    response: bytearray = field(default_factory=bytearray)
    response_overflow: bool = False
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    # the control middleware's (mode, reason) for this request (its state mark), if any
    control_mode: Any = None
    control_verdict: Any = None


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
        record_paths: frozenset[str] | None = INFERENCE_ROUTES,
        priority: PriorityRules | None = None,
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
        self.record_paths = record_paths  # None: every path
        self.priority = priority or PriorityRules()
        self._mono = monotonic_ns
        self._wall = wall_ns
        self._tracer = tracer or trace.get_tracer("tailguard.gateway")
        self.counters: dict[str, int] = {
            "requests": 0, "events": 0, "errors": 0, "not_recorded": 0, "usage_read": 0,
        }  # fmt: skip

    def records(self, path: str) -> bool:
        if path in self.skip_paths:
            return False
        return self.record_paths is None or path.rstrip("/") in self.record_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or not self.records(str(scope.get("path", ""))):
            if scope.get("type") == "http":
                self.counters["not_recorded"] += 1
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
            client = client_attempt(lambda name: header(scope, name.encode()))
            adopted = usable_request_id(header(scope, REQUEST_ID_HEADER))
            # a retry that reuses the client's id gets its own (client_retry.attempt_request_id)
            request_id = (
                attempt_request_id(adopted, client) if adopted is not None else uuid.uuid4().hex
            )
            span, trace_headers = self._start_span(scope, request_id)
            downstream = _with_headers(
                scope, [(REQUEST_ID_HEADER, request_id.encode()), *trace_headers]
            )
            received = self._received(
                scope, request_id, ts0, body, x, client, logical_request_id(client, adopted)
            )
            state = downstream.setdefault("state", {})
            if isinstance(state, dict):  # for the control middleware behind this one
                state[PRIORITY_STATE_KEY] = received.priority
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
                x.response_kind = _response_kind(headers)
                msg = {**msg, "headers": [*headers, rid_header]}
            elif kind == "http.response.body":
                chunk = msg.get("body", b"")
                if x.first_byte_ns is None and chunk:
                    x.first_byte_ns = self._mono()
                if chunk and x.response_kind is not None:
                    self._keep(x, chunk)
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
                state = downstream.get("state")
                x.rejected = isinstance(state, dict) and REJECTED_STATE_KEY in state
                control = state.get(CONTROL_STATE_KEY) if isinstance(state, dict) else None
                if control is not None:
                    x.control_mode, x.control_verdict = control
                self._emit(self._completed(scope, request_id, x, failed))
                if span is not None:
                    if x.status is not None:
                        span.set_attribute("http.response.status_code", x.status)
                    span.end()
            except Exception:
                self.counters["errors"] += 1
                log.exception("gateway middleware: could not build gateway.completed")

    def _keep(self, x: _Exchange, chunk: bytes) -> None:
        if x.response_kind == "sse":
            x.response += chunk
            if len(x.response) > SSE_TAIL_BYTES:
                del x.response[: len(x.response) - SSE_TAIL_BYTES]
        elif not x.response_overflow:
            if len(x.response) + len(chunk) > self.max_body_bytes:
                x.response_overflow = True
                x.response.clear()
            else:
                x.response += chunk

    def _usage(self, x: _Exchange) -> tuple[int | None, int | None] | None:
        if not x.response:
            return None
        if x.response_kind == "sse":
            found = sse_usage(bytes(x.response))
        else:
            try:
                found = usage_tokens(orjson.loads(x.response))
            except orjson.JSONDecodeError:
                found = None
        if found is not None:
            self.counters["usage_read"] += 1
        return found

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

    def _received(  # noqa: PLR0917
        self, scope: Scope, request_id: str, ts0: int, body: bytes, x: _Exchange,
        client: ClientAttempt, logical_id: str | None,
    ) -> GatewayReceived:  # fmt: skip
        model: str | None = None
        stream = False
        doc: Any = None
        if body:
            try:
                doc = orjson.loads(body)
            except orjson.JSONDecodeError:
                doc = None
            if isinstance(doc, dict):
                if isinstance(doc.get("model"), str) and doc["model"]:
                    model = doc["model"][:256]
                stream = doc.get("stream") is True
        priority = self.priority.resolve(scope, doc if isinstance(doc, dict) else None)
        x.slo_ttft_ms = _positive_ms(scope, SLO_TTFT_HEADER)
        x.slo_tpot_ms = _positive_ms(scope, SLO_TPOT_HEADER)
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
            priority=priority,
            tenant=tenant[:256] if tenant else None,
            stream=stream,
            client_attempt=client.attempt,
            logical_request_id=logical_id,
        )

    def _completed(
        self, scope: Scope, request_id: str, x: _Exchange, failed: bool
    ) -> GatewayCompleted:
        end_ns = x.done_ns if x.done_ns is not None else self._mono()
        status, outcome = terminal_status(
            x.status,
            disconnected=x.disconnected,
            done=x.done_ns is not None,
            failed=failed,
            rejected=x.rejected,
        )
        ttfb_ms = None if x.first_byte_ns is None else (x.first_byte_ns - x.t0_ns) / 1e6
        model = x.model or (header(scope, MODEL_HEADER) or "").strip()[:256] or self.default_model
        usage = self._usage(x) if status and status < 400 else None
        prompt_tokens, output_tokens = usage if usage is not None else (None, None)
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
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            slo_ttft_ms=x.slo_ttft_ms,
            slo_tpot_ms=x.slo_tpot_ms,
            control_mode=x.control_mode,
            control_verdict=x.control_verdict,
        )


def _response_kind(headers: list[tuple[Any, Any]]) -> str | None:
    """Which response bodies are read for ``usage``: uncompressed JSON and SSE."""
    ctype = ""
    for k, v in headers:
        name = bytes(k).lower()
        if name == b"content-encoding" and bytes(v).strip().lower() not in (b"", b"identity"):
            return None
        if name == b"content-type":
            ctype = bytes(v).decode("latin-1").lower()
    if "text/event-stream" in ctype:
        return "sse"
    if "json" in ctype:
        return "json"
    return None


def _with_headers(scope: Scope, replace: list[tuple[bytes, bytes]]) -> Scope:
    names = {k for k, _ in replace}
    kept = [
        (bytes(k), bytes(v)) for k, v in scope.get("headers") or () if bytes(k).lower() not in names
    ]
    new = dict(scope)
    new["headers"] = kept + replace
    return new
