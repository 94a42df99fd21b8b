"""``tailguard gateway``: a reference OpenAI-compatible pass-through proxy with lifecycle events.

:class:`UpstreamProxy` is a plain ASGI app that forwards every HTTP request to one
upstream base URL (vLLM's OpenAI-compatible server, or any other) with ``httpx``:
method, path, query, body and headers go upstream unchanged except the hop-by-hop
headers and ``Host``; the response status, headers and body come back unchanged,
streamed chunk by chunk as the upstream sends them (server-sent events for
``"stream": true``). When the client disconnects mid-stream the upstream request is
closed at once (vLLM then aborts the request) and nothing more is sent.
Upstream unreachable -> ``502``; upstream timeout -> ``504``.

:func:`build_gateway` puts :class:`~producers.gateway.LifecycleMiddleware` around it
(and, optionally, the control middleware between the two, so its answers are recorded:
a directive's shedding as ``503`` (``error``), the capacity-aware admission's
``429`` with ``Retry-After`` (``admit_rps``, issue 35) and the queue cut-off's ``503``
(``queue_timeout_ms``: a request of priority >= 1 with no first byte from upstream in
time is cancelled, closing its upstream request) as ``rejected``; it decides on
the priority the lifecycle middleware resolved, and its admission clock is
``control_clock_ms``);
only the inference routes are recorded unless ``record_paths`` says otherwise (the
proxy forwards every path); ``GET /tailguard/health`` answers with the producer's
counters and is not recorded. :func:`serve_gateway` runs it under uvicorn.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, Final

import httpx
import orjson

from producers.asgi_control import ASGIApp, ControlMiddleware, Receive, Scope, Send, monotonic_ms
from producers.emit import EventSink, KafkaSink
from producers.enforcement import ALL_SCOPES, Enforcement, Modes
from producers.gateway import LifecycleMiddleware, priority_from_state
from producers.loop_delay import LoopDelay

log = logging.getLogger(__name__)

HEALTH_PATH: Final = "/tailguard/health"
METRICS_PATH: Final = "/tailguard/metrics"  # not /metrics: the upstream (vLLM) serves its own
# RFC 9110 §7.6.1 connection-specific fields, plus Host (httpx sets it for the upstream).
HOP_BY_HOP: Final = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"content-length",
    }
)


def _forwardable(headers: Any) -> list[tuple[bytes, bytes]]:
    return [(bytes(k), bytes(v)) for k, v in headers if bytes(k).lower() not in HOP_BY_HOP]


class UpstreamProxy:
    """ASGI pass-through to ``upstream`` (e.g. ``http://127.0.0.1:8000``)."""

    def __init__(
        self,
        upstream: str,
        *,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 5.0,
        max_connections: int = 1000,
        on_shutdown: list[Callable[[], None]] | None = None,
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.on_shutdown = list(on_shutdown or [])
        self._timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s)
        self._limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        )
        self._client: httpx.AsyncClient | None = None

    def _get_client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=self._timeout, limits=self._limits, follow_redirects=False
            )
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        chunks: list[bytes] = []
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body", False):
                break
        path = scope.get("raw_path") or scope["path"].encode()
        url = self.upstream + bytes(path).decode("latin-1")
        if scope.get("query_string"):
            url += "?" + bytes(scope["query_string"]).decode("latin-1")
        client = self._get_client()
        request = client.build_request(
            scope["method"], url, headers=_forwardable(scope["headers"]), content=b"".join(chunks)
        )
        try:
            response = await client.send(request, stream=True)
        except httpx.TimeoutException as exc:
            await _error(send, 504, f"upstream timeout: {type(exc).__name__}")
            return
        except httpx.HTTPError as exc:
            await _error(send, 502, f"upstream unreachable: {type(exc).__name__}")
            return
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": response.status_code,
                    "headers": _forwardable(response.headers.raw),
                }
            )
            gone = await _stream(response.aiter_raw(), receive, send)
            if not gone:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except httpx.HTTPError as exc:  # upstream broke mid-response: end it (truncated)
            log.warning("upstream failed mid-response: %s", exc)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await response.aclose()

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await self.aclose()
                for fn in self.on_shutdown:  # e.g. flush the producer before the process exits
                    await asyncio.to_thread(fn)
                await send({"type": "lifespan.shutdown.complete"})
                return


async def _stream(body: AsyncIterator[bytes], receive: Receive, send: Send) -> bool:
    """Relay ``body`` to the client; return True when the client went away first."""

    async def disconnected() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    nxt: asyncio.Future[bytes] | None = None
    try:
        it = body.__aiter__()
        while True:
            nxt = asyncio.ensure_future(it.__anext__())
            await asyncio.wait({nxt, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if not nxt.done():  # the client is gone: stop reading upstream
                nxt.cancel()
                with suppress(asyncio.CancelledError, StopAsyncIteration, httpx.HTTPError):
                    await nxt
                return True
            try:
                chunk = nxt.result()
            except StopAsyncIteration:
                return False
            if chunk:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            if watcher.done():
                return True
    finally:
        watcher.cancel()
        with suppress(asyncio.CancelledError):
            await watcher
        if nxt is not None and not nxt.done():  # this request was cancelled (queue cut-off)
            nxt.cancel()
            with suppress(asyncio.CancelledError, StopAsyncIteration, httpx.HTTPError):
                await nxt


async def _error(send: Send, status: int, why: str) -> None:
    body = orjson.dumps({"error": {"message": why, "type": "tailguard_gateway_error"}})
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


@dataclass
class Health:
    """``GET /tailguard/health``: the gateway's own counters, outside the recorded traffic;
    ``GET /tailguard/metrics``: the control counters in Prometheus' text format."""

    app: ASGIApp
    sink: EventSink
    middleware: LifecycleMiddleware
    control: ControlMiddleware | None = None
    in_force: Callable[[], Mapping[str, Any]] | None = None  # scope -> Directive
    loop_delay: LoopDelay | None = None  # the control client's (producers.loop_delay)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path") if scope.get("type") == "http" else None
        if path == HEALTH_PATH:
            counters: dict[str, Any] = dict(vars(getattr(self.sink, "counters", {})) or {})
            if isinstance(self.sink, KafkaSink):
                counters["buffered"] = self.sink.buffered
                counters["partitions_known"] = self.sink.partitions_known
            doc: dict[str, Any] = {
                "status": "ok",
                "producer": counters,
                "middleware": self.middleware.counters,
            }
            if self.control is not None:
                fleet = self.control.directives(ALL_SCOPES)  # the "*" directive in force
                doc["control"] = {
                    "mode": self.control.enforcement.modes.mode,
                    "enforce_from_priority": self.control.enforcement.modes.enforce_from_priority,
                    "fleet_directive": {
                        "level": fleet.level,
                        "phase": fleet.phase,
                        "seq": fleet.seq,
                    },
                    "directives": {
                        scope: {"level": d.level, "phase": d.phase, "seq": d.seq}
                        for scope, d in sorted((self.in_force() if self.in_force else {}).items())
                    },
                    "counters": self.control.counters,
                }
            await _answer(send, orjson.dumps(doc), b"application/json")
            return
        if path == METRICS_PATH:
            text = control_metrics(
                self.control.enforcement if self.control else None, self.loop_delay
            )
            await _answer(send, text.encode(), b"text/plain; version=0.0.4; charset=utf-8")
            return
        await self.app(scope, receive, send)


async def _answer(send: Send, body: bytes, content_type: bytes) -> None:
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-type", content_type)]}
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _label(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def control_metrics(enforcement: Enforcement | None, loop_delay: LoopDelay | None = None) -> str:
    """The enforcement's counters as Prometheus text: refusals per mode (``enforce``:
    refused, ``shadow``: would have refused), model, priority and reason, and what it
    applied to admitted requests; with ``loop_delay``, the control loop's delay as a
    histogram (evidence to directive applied here: :mod:`producers.loop_delay`)."""
    lines = [
        "# HELP tailguard_gateway_control_refusals_total Requests the enforcement refused "
        "(mode=enforce) or would have refused (mode=shadow), by model, priority and reason.",
        "# TYPE tailguard_gateway_control_refusals_total counter",
    ]
    if enforcement is not None:
        for (mode, model, prio, why), n in sorted(enforcement.refusals.items()):
            lines.append(
                f'tailguard_gateway_control_refusals_total{{mode="{mode}",model="{_label(model)}",'
                f'priority="{prio}",reason="{why}"}} {n}'
            )
    lines += [
        "# HELP tailguard_gateway_control_applied_total Admitted requests the enforcement "
        "acted on (enforce): admitted under a directive, half-open, capped, fallback.",
        "# TYPE tailguard_gateway_control_applied_total counter",
    ]
    if enforcement is not None:
        for what, n in sorted(enforcement.applied.items()):
            lines.append(f'tailguard_gateway_control_applied_total{{what="{what}"}} {n}')
    lines += [
        "# HELP tailguard_gateway_ttft_prediction_error_ms Predicted - actual first-byte "
        "time of the last admitted requests with a first-token prediction (issue 52).",
        "# TYPE tailguard_gateway_ttft_prediction_error_ms summary",
    ]
    if enforcement is not None:
        err = enforcement.queue.prediction_error()
        for q, key in (("0.5", "p50_ms"), ("0.9", "p90_ms")):
            if err[key] is not None:
                lines.append(f'tailguard_gateway_ttft_prediction_error_ms{{quantile="{q}"}} '
                             f"{err[key]}")  # fmt: skip
        lines.append(f"tailguard_gateway_ttft_prediction_error_ms_count {err['n']}")
    text = "\n".join(lines) + "\n"
    return text + loop_delay.prometheus() if loop_delay is not None else text


def build_gateway(
    upstream: str,
    sink: EventSink,
    *,
    host: str | None = None,
    control: Any | None = None,
    control_modes: Modes | None = None,
    control_clock_ms: Callable[[], float] | None = None,
    control_in_force: Callable[[], Mapping[str, Any]] | None = None,
    control_loop_delay: LoopDelay | None = None,
    on_shutdown: list[Callable[[], None]] | None = None,
    **middleware_options: Any,
) -> tuple[ASGIApp, UpstreamProxy, LifecycleMiddleware]:
    """The gateway app: health -> lifecycle events -> [control] -> proxy.

    ``control``: the directive lookup (e.g. ``ControlClient.directive``);
    ``control_modes``: off, shadow or enforce (:class:`producers.enforcement.Modes`;
    default enforce); ``control_clock_ms``: the admission's monotonic clock in ms (default
    ``time.monotonic``); ``control_in_force``: every scope's live directive, for the health
    page (e.g. ``ControlClient.in_force``); ``control_loop_delay``: the control client's
    :attr:`~producers.control_client.ControlClient.loop_delay`, shown on
    ``/tailguard/metrics``. ``on_shutdown`` runs (in a thread) at the ASGI lifespan
    shutdown, after the last request: close the sink there, so its buffer is flushed
    however the server stops.
    """
    proxy = UpstreamProxy(upstream, on_shutdown=on_shutdown)
    inner: ASGIApp = proxy
    control_mw: ControlMiddleware | None = None
    if control is not None:
        inner = control_mw = ControlMiddleware(
            inner,
            control,
            priority_of=priority_from_state,
            clock_ms=control_clock_ms or monotonic_ms,
            modes=control_modes,
        )
    mw = LifecycleMiddleware(
        inner,
        sink,
        host=host or f"gateway/{socket.gethostname()}",
        skip_paths=frozenset({HEALTH_PATH}),
        **middleware_options,
    )
    return Health(mw, sink, mw, control_mw, control_in_force, control_loop_delay), proxy, mw


def quiet_logs(verbose: bool = False) -> None:
    """No log line per request: httpx logs every upstream request at INFO (issue 16
    reported +4.8 ms at the gateway's P50 for it), so it is held at WARNING unless
    ``verbose``."""
    level = logging.INFO if verbose else logging.WARNING
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(level)


def serve_gateway(
    app: ASGIApp,
    listen_host: str,
    port: int,
    *,
    sock: socket.socket | None = None,
    verbose: bool = False,
) -> None:
    """Run ``app`` under uvicorn until SIGINT/SIGTERM (blocking); quiet unless ``verbose``."""
    import uvicorn

    quiet_logs(verbose)
    config = uvicorn.Config(
        app,
        host=listen_host,
        port=port,
        lifespan="on",
        log_level="info" if verbose else "warning",
        access_log=False,
        timeout_graceful_shutdown=10,
    )
    server = uvicorn.Server(config)
    server.run(sockets=[sock] if sock is not None else None)
