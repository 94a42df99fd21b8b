"""Pure ASGI middleware that enforces control directives (no framework needed).

``ControlMiddleware(app, directives)`` wraps any ASGI 3 app. Per HTTP request
it looks up the effective :class:`~producers.control_client.Directive` for the
request's model (``directives(model or "*")``, e.g. ``ControlClient.directive``)
and, in this order:

1. level 0 -> the request passes **untouched** (same scope object);
2. ``shed_priorities_at_or_above = p`` and the request's priority >= p ->
   ``503`` with ``Retry-After: retry_after_s`` and a small JSON body;
3. ``reject_new_sessions`` and the request starts a new session -> the same 503,
   except at priority 0: real-time traffic ("never evicted") is turned away only
   by an explicit ``shed_priorities_at_or_above = 0``;
4. ``admit_rps`` (capacity-aware admission, issue 35) and the request got this far ->
   a :class:`producers.admission.PriorityAdmission` per directive scope decides at
   ``admit_rps / admit_gateways`` (None: 1) requests/s, by strict priority (priority 0
   is never turned away); rejected -> ``429`` with ``Retry-After`` from the admission
   (the time until the priority's bucket holds a token: at least 1 s, at most
   ``retry_after_s``) and the same JSON body, ``"reason": "admission"``;
5. otherwise the request passes, with ``x-tailguard-max-context-tokens: N``
   (``cap_context_tokens``) and ``x-tailguard-fallback-model: name``
   (``fallback_model``) added to the headers the app sees (client-sent copies
   of those two headers are replaced);
6. ``queue_timeout_ms`` (queue cut-off per priority, issue 35) set for the request's priority
   -> the app runs as a task; its ``http.response.start`` is held until its first
   non-empty ``http.response.body`` chunk (or its final body message) arrives, then both
   are sent and the response streams on untouched. No body within ``queue_timeout_ms``
   of the call (the event loop's clock: a duration on this gateway) -> the app task is
   cancelled (the reference proxy then closes its upstream request: vLLM aborts a
   request whose client went away) and the answer is the 503 of 2 with
   ``"reason": "queue_timeout"``; ``scope["state"][REJECTED_STATE_KEY]`` is set to
   that reason, so the lifecycle middleware in front records it as ``rejected``. Once a
   body chunk went out the request is never cut off. Priority 0 is never cut off, and
   without a cut-off the app is called directly as in 5 (no task, no buffering).

Half-open (``phase == "half_open"``): of the requests that 2 or 3 would
reject, a deterministic ``admit_fraction`` is admitted instead: with an
``x-request-id`` header, those whose ``blake2b(request id)`` falls below the
fraction (the same id always gets the same answer); without one, an exact
running spread (request *k* is admitted when ``floor(k*f)`` increases).

Request attributes (injectable callables; defaults read headers only, never
the body): model from ``x-tailguard-model`` (absent -> only ``"*"`` applies);
priority from ``x-vllm-priority`` (0 highest ... 3; absent or not an integer
-> ``DEFAULT_PRIORITY``, 2, as the gateway records it); a request **without**
``x-tailguard-session`` is a new session.

Enforced here: ``shed_priorities_at_or_above``, ``reject_new_sessions``,
``admit_fraction`` (half-open), ``admit_rps``/``admit_gateways`` and
``queue_timeout_ms``; passed on as
headers: ``cap_context_tokens`` and ``fallback_model``. ``actions.rate_limit_rps`` is
advisory and not enforced here (``admit_rps`` is the enforced rate). Each middleware
instance is one gateway instance for ``admit_gateways``: a server running several
worker processes counts each of them. The admission's clock is ``clock_ms`` (default
``time.monotonic`` in milliseconds; injectable for tests).

The control machinery never fails a request: any exception while deciding is
counted (``counters["errors"]``) and the request passes through untouched.
Exceptions of the wrapped app propagate as they would without the middleware (under a
queue cut-off, a response start the app sent before raising is not sent).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any, Final

import orjson

from pipeline.contract.control_signal import ALL_SCOPES
from pipeline.contract.events import DEFAULT_PRIORITY
from producers.admission import PriorityAdmission
from producers.control_client import Directive

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

MODEL_HEADER: Final = b"x-tailguard-model"
PRIORITY_HEADER: Final = b"x-vllm-priority"
SESSION_HEADER: Final = b"x-tailguard-session"
REQUEST_ID_HEADER: Final = b"x-request-id"
MAX_CONTEXT_HEADER: Final = b"x-tailguard-max-context-tokens"
FALLBACK_MODEL_HEADER: Final = b"x-tailguard-fallback-model"
_INJECTED: Final = frozenset({MAX_CONTEXT_HEADER, FALLBACK_MODEL_HEADER})
# scope["state"] key: why this middleware turned away a request it had let through
# (the queue cut-off: "queue_timeout"); read by producers.gateway.LifecycleMiddleware.
REJECTED_STATE_KEY: Final = "tailguard.rejected"


def header(scope: Scope, name: bytes) -> str | None:
    """First value of a request header (ASGI names are lower-case bytes)."""
    for k, v in scope.get("headers") or ():
        if bytes(k).lower() == name:
            return bytes(v).decode("latin-1")
    return None


def default_model_of(scope: Scope) -> str | None:
    value = header(scope, MODEL_HEADER)
    if value is None:
        return None
    return value.strip() or None


def int_header(scope: Scope, name: bytes) -> int | None:
    """A request header's value as an integer (None: absent or not an integer)."""
    value = header(scope, name)
    if value is None:
        return None
    try:
        return int(value.strip())
    except ValueError:
        return None


def default_priority_of(scope: Scope) -> int:
    value = int_header(scope, PRIORITY_HEADER)
    return DEFAULT_PRIORITY if value is None else value


def default_is_new_session(scope: Scope) -> bool:
    return header(scope, SESSION_HEADER) is None


def default_request_key(scope: Scope) -> str | None:
    return header(scope, REQUEST_ID_HEADER)


def hash_admits(key: str, fraction: float) -> bool:
    """Deterministic: is ``key`` in the admitted ``fraction`` of the key space?"""
    h = int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "big")
    return h < fraction * 2.0**64


def spread_admits(k: int, fraction: float) -> bool:
    """Deterministic without keys: admit the ``k``-th candidate (0-based) when
    ``floor((k+1)*f) > floor(k*f)`` -- exactly ``floor(n*f)`` of ``n`` admitted."""
    return math.floor((k + 1) * fraction) > math.floor(k * fraction)


def monotonic_ms() -> float:
    return time.monotonic() * 1000.0


@dataclass(frozen=True, slots=True)
class Verdict:
    # when rejected: "shed_priority" | "new_session" | "admission" | "queue_timeout"
    reject: str | None = None
    headers: tuple[tuple[bytes, bytes], ...] = ()
    half_open_admitted: bool = False
    status: int = 503  # of a rejection
    retry_after_s: int | None = None  # of a rejection; None: the directive's retry_after_s
    queue_timeout_ms: float | None = None  # admitted under a queue cut-off (priority >= 1)


PASS: Final = Verdict()


class ControlMiddleware:
    """See the module docstring. ``counters``: passed, shed_priority, new_session,
    admission, half_open_admitted, headers_injected, queue_timeout, errors."""

    def __init__(
        self,
        app: ASGIApp,
        directives: Callable[[str], Directive],
        model_of: Callable[[Scope], str | None] = default_model_of,
        *,
        priority_of: Callable[[Scope], int] = default_priority_of,
        is_new_session: Callable[[Scope], bool] = default_is_new_session,
        request_key: Callable[[Scope], str | None] = default_request_key,
        clock_ms: Callable[[], float] = monotonic_ms,
    ) -> None:
        self.app = app
        self.directives = directives
        self.model_of = model_of
        self.priority_of = priority_of
        self.is_new_session = is_new_session
        self.request_key = request_key
        self.clock_ms = clock_ms
        self._admissions: dict[str, PriorityAdmission] = {}  # directive scope -> its share
        self.counters: dict[str, int] = dict.fromkeys(
            (
                "passed",
                "shed_priority",
                "new_session",
                "admission",
                "half_open_admitted",
                "headers_injected",
                "queue_timeout",
                "errors",
            ),
            0,
        )
        self._spread_k = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        try:
            directive, verdict = self.decide(scope)
            response = _rejection(directive, verdict) if verdict.reject else None
            downstream = _with_headers(scope, verdict.headers) if verdict.headers else scope
        except Exception:
            self.counters["errors"] += 1
            log.exception("control middleware failed; passing the request through")
            await self.app(scope, receive, send)
            return
        if response is not None and verdict.reject is not None:
            self.counters[verdict.reject] += 1
            body, headers = response
            await send(
                {"type": "http.response.start", "status": verdict.status, "headers": headers}
            )
            await send({"type": "http.response.body", "body": body, "more_body": False})
            return
        self.counters["passed"] += 1
        if verdict.queue_timeout_ms is None:
            await self.app(downstream, receive, send)
            return
        await self._with_cutoff(directive, verdict.queue_timeout_ms, downstream, receive, send)

    async def _with_cutoff(
        self, d: Directive, cutoff_ms: float, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """Run the app as a task; its response start waits for its first body bytes, and
        with none after ``cutoff_ms`` the task is cancelled and a 503 is the answer."""
        held: list[Message] = []  # the response start, until the body begins
        released = asyncio.Event()  # set (before anything is sent) by the first body
        cut = False  # cut off: whatever the app still sends while it unwinds is dropped

        async def held_send(msg: Message) -> None:
            if cut:
                return
            if released.is_set():
                await send(msg)
                return
            kind = msg.get("type")
            if kind == "http.response.start":
                held.append(msg)
                return
            if kind == "http.response.body" and not msg.get("body") and msg.get("more_body"):
                return  # an empty chunk before the first bytes: nothing to send yet
            released.set()  # from here on the request is never cut off
            for start in held:
                await send(start)
            held.clear()
            await send(msg)

        task = asyncio.ensure_future(self.app(scope, receive, held_send))
        first = asyncio.ensure_future(released.wait())
        try:
            await asyncio.wait(
                {task, first}, timeout=cutoff_ms / 1000.0, return_when=asyncio.FIRST_COMPLETED
            )
        except BaseException:  # this request was cancelled: so is the app
            task.cancel()
            raise
        finally:
            first.cancel()
        if not released.is_set() and not task.done():
            cut = True
            task.cancel()
            self.counters["queue_timeout"] += 1
            state = scope.get("state")
            if isinstance(state, dict):
                state[REJECTED_STATE_KEY] = "queue_timeout"
            body, headers = _rejection(d, Verdict(reject="queue_timeout"))
            try:
                await send({"type": "http.response.start", "status": 503, "headers": headers})
                await send({"type": "http.response.body", "body": body, "more_body": False})
            finally:
                await asyncio.wait({task})  # the app unwinds (closes its upstream call)
            if not task.cancelled() and task.exception() is not None:
                log.warning("app failed when cut off at the queue timeout: %r", task.exception())
            return
        await task  # streams on (or has ended); its exceptions propagate
        if held and not released.is_set():  # the app ended without a body: as it sent it
            for start in held:
                await send(start)

    def decide(self, scope: Scope) -> tuple[Directive, Verdict]:
        """The directive that applies to this request and what to do (may raise)."""
        model = self.model_of(scope)
        d = self.directives(model or ALL_SCOPES)
        if d.level <= 0:
            return d, PASS
        a = d.actions
        reject: str | None = None
        priority = self.priority_of(scope)
        if a.shed_priorities_at_or_above is not None and (
            priority >= a.shed_priorities_at_or_above
        ):
            reject = "shed_priority"
        elif a.reject_new_sessions and priority > 0 and self.is_new_session(scope):
            reject = "new_session"  # priority 0 (real-time) keeps opening sessions
        admitted = False
        if reject is not None and d.phase == "half_open" and a.admit_fraction:
            key = self.request_key(scope)
            if key is not None:
                admitted = hash_admits(key, a.admit_fraction)
            else:
                admitted = spread_admits(self._spread_k, a.admit_fraction)
                self._spread_k += 1
            if admitted:
                self.counters["half_open_admitted"] += 1
                reject = None
        if reject is not None:
            return d, Verdict(reject=reject)
        if a.admit_rps is not None:
            key = d.scope if d.scope is not None else (model or ALL_SCOPES)
            admission = self._admissions.get(key)
            if admission is None:
                admission = self._admissions[key] = PriorityAdmission()
            rate_rps = a.admit_rps / (a.admit_gateways or 1)
            admit = admission.decide(priority, rate_rps, self.clock_ms(), a.retry_after_s)
            if not admit.admitted:
                return d, Verdict(reject="admission", status=429, retry_after_s=admit.retry_after_s)
        extra: list[tuple[bytes, bytes]] = []
        if a.cap_context_tokens is not None:
            extra.append((MAX_CONTEXT_HEADER, str(a.cap_context_tokens).encode("ascii")))
        if a.fallback_model is not None:
            extra.append((FALLBACK_MODEL_HEADER, a.fallback_model.encode("utf-8")))
        if extra:
            self.counters["headers_injected"] += 1
        cutoff = a.queue_timeout_for(priority)  # per priority; priority 0: never cut off
        return d, Verdict(
            headers=tuple(extra), half_open_admitted=admitted, queue_timeout_ms=cutoff
        )


def _with_headers(scope: Scope, extra: tuple[tuple[bytes, bytes], ...]) -> Scope:
    kept = [
        (bytes(k), bytes(v))
        for k, v in scope.get("headers") or ()
        if bytes(k).lower() not in _INJECTED
    ]
    new = dict(scope)
    new["headers"] = kept + list(extra)
    return new


def _rejection(d: Directive, v: Verdict) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    retry = max(0, int(d.actions.retry_after_s if v.retry_after_s is None else v.retry_after_s))
    body = orjson.dumps(
        {"error": "overloaded", "reason": v.reject, "level": d.level, "retry_after_s": retry}
    )
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode("ascii")),
        (b"retry-after", str(retry).encode("ascii")),
        (b"x-tailguard-level", str(d.level).encode("ascii")),
    ]
    return body, headers
