"""Pure ASGI middleware that applies control directives (no framework needed).

``ControlMiddleware(app, directives)`` wraps any ASGI 3 app. Per HTTP request it looks
up the effective :class:`~producers.control_client.Directive` for the request's model
(``directives(model or "*")``, e.g. ``ControlClient.directive``) and asks the one
enforcement, :class:`producers.enforcement.Enforcement`, what to do: the rules, their
order, the status of each reason (429 + ``Retry-After`` for every deliberate refusal, 503
for the queue cut-off alone) and the three modes are that module's, not this one's. This
module only carries the answer out over ASGI:

* a refusal (``enforce``) -> the status with the enforcement's refusal headers
  (:meth:`producers.enforcement.Verdict.refusal_headers`: ``Retry-After``,
  ``x-tailguard-level`` and, for a retry over the retry budget, ``x-should-retry: false``)
  and a small JSON body ``{"error": "overloaded", "reason", "level", "retry_after_s"}``;
* admitted -> the app is called, with ``x-tailguard-max-context-tokens: N``
  (``cap_context_tokens``) and ``x-tailguard-fallback-model: name`` (``fallback_model``)
  added to the headers it sees (client-sent copies of those two headers are replaced);
  without either, with the same scope object;
* a queue cut-off for the request's priority (``queue_timeout_ms``) -> the app runs as a
  task; its ``http.response.start`` is held until its first non-empty
  ``http.response.body`` chunk (or its final body message) arrives, then both are sent
  and the response streams on untouched. No body within ``queue_timeout_ms`` of the call
  (the event loop's clock: a duration on this gateway) -> the app task is cancelled (the
  reference proxy then closes its upstream request: vLLM aborts a request whose client
  went away) and the answer is 503 + ``Retry-After`` with ``"reason": "queue_timeout"``.
  Once a body chunk went out the request is never cut off. Priority 0 is never cut off.
  In enforce, a request of priority >= 1 admitted with no cut-off runs so too (its start
  held until its body begins) and looks at the directive in force every
  :data:`LATE_CUTOFF_CHECK_S` until its first byte: a directive that comes into force
  while it waits and sets a cut-off for its priority cuts it as if that cut-off had been
  in force at its call (what the simulator's gateways do, so what the backtest proves);
* ``shadow`` -> the request is served exactly as without control (same scope, no header,
  no cut-off); what enforce would have done is counted, and a cut-off it would have made
  is seen when the first body chunk comes later than ``queue_timeout_ms`` (or never).

For the lifecycle middleware in front (:mod:`producers.gateway`), ``scope["state"]``
gets :data:`CONTROL_STATE_KEY` = ``(mode, reason or None)`` for every request decided in
shadow or enforce (``gateway.completed``'s ``control_mode`` / ``control_verdict``), and
:data:`REJECTED_STATE_KEY` = ``"queue_timeout"`` for an enforced cut-off (recorded as
``rejected``, like every 429).

Request attributes (injectable callables; defaults read headers only, never the body):
model from ``x-tailguard-model`` (absent -> only ``"*"`` applies); priority from
``x-vllm-priority`` (0 highest ... 3; absent or not an integer -> ``DEFAULT_PRIORITY``,
2, as the gateway records it); a request **without** ``x-tailguard-session`` is a new
session; the request key for half-open is ``x-request-id``; the client's attempt (retry
count, logical id) is read by :func:`producers.client_retry.client_attempt` from the SDKs'
own headers (``x-stainless-retry-count``, ``idempotency-key``, ``x-client-request-id``),
for the retry budget. Each middleware instance is
one gateway instance for ``admit_gateways``: a server running several worker processes
counts each of them. The clock is ``clock_ms`` (default ``time.monotonic`` in
milliseconds; injectable for tests). ``modes`` (:class:`producers.enforcement.Modes`):
off, shadow or enforce, per scope, enforced from a priority on.

The control machinery never fails a request: any exception while deciding is counted
(``counters["errors"]``) and the request passes through untouched. Exceptions of the
wrapped app propagate as they would without the middleware (under a queue cut-off, a
response start the app sent before raising is not sent).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final

import orjson

from pipeline.contract.control_signal import ALL_SCOPES
from pipeline.contract.events import DEFAULT_PRIORITY
from producers.client_retry import client_attempt
from producers.control_client import Directive
from producers.enforcement import (
    REASONS,
    Decision,
    Enforcement,
    Modes,
    RequestFacts,
    Verdict,
    hash_admits,
    spread_admits,
)
from producers.gateway_queue import Forwarded

__all__ = [
    "CONTROL_STATE_KEY",
    "REJECTED_STATE_KEY",
    "ControlMiddleware",
    "hash_admits",
    "spread_admits",
]

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
TENANT_HEADER: Final = b"x-tenant-id"  # who is asking (the fair shares across tenants)
# llm-d's per-request latency objectives (milliseconds): recorded as the client sent them
# (producers.gateway); the first-token one is the enforcement's deadline (issue 52).
SLO_TTFT_HEADER: Final = b"x-llm-d-slo-ttft-ms"
SLO_TPOT_HEADER: Final = b"x-llm-d-slo-tpot-ms"
# scope["state"] key: why this middleware turned away a request it had let through
# (the queue cut-off: "queue_timeout"); read by producers.gateway.LifecycleMiddleware.
REJECTED_STATE_KEY: Final = "tailguard.rejected"
# scope["state"] key: (mode, reason or None) of a request decided in shadow or enforce;
# read by producers.gateway.LifecycleMiddleware (gateway.completed's control fields).
CONTROL_STATE_KEY: Final = "tailguard.control"


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


def positive_ms(value: str | None) -> float | None:
    """A header's milliseconds: a finite number in (0, 2^53], else None."""
    if value is None:
        return None
    try:
        ms = float(value.strip())
    except ValueError:
        return None
    return ms if math.isfinite(ms) and 0 < ms <= 2.0**53 else None


def default_tenant_of(scope: Scope) -> str | None:
    value = header(scope, TENANT_HEADER)
    return value[:256] if value else None


def default_slo_ttft_of(scope: Scope) -> float | None:
    return positive_ms(header(scope, SLO_TTFT_HEADER))


def default_is_new_session(scope: Scope) -> bool:
    return header(scope, SESSION_HEADER) is None


def default_request_key(scope: Scope) -> str | None:
    return header(scope, REQUEST_ID_HEADER)


# How often a request admitted without a queue cut-off, still waiting for its first
# byte, looks again at the directive in force: a cut-off a later directive sets reaches
# it within this much of the time it is due.
LATE_CUTOFF_CHECK_S: Final = 0.25


def monotonic_ms() -> float:
    return time.monotonic() * 1000.0


COUNTERS: Final = (
    "passed",
    *REASONS,
    "half_open_admitted",
    "headers_injected",
    "shadow_would_refuse",
    "errors",
)


class ControlMiddleware:
    """See the module docstring. ``counters``: passed, one per refusal reason (enforced),
    half_open_admitted, headers_injected, shadow_would_refuse, errors; per model,
    priority and reason: ``enforcement.refusals``."""

    def __init__(
        self,
        app: ASGIApp,
        directives: Callable[[str], Directive],
        model_of: Callable[[Scope], str | None] = default_model_of,
        *,
        priority_of: Callable[[Scope], int] = default_priority_of,
        is_new_session: Callable[[Scope], bool] = default_is_new_session,
        request_key: Callable[[Scope], str | None] = default_request_key,
        tenant_of: Callable[[Scope], str | None] = default_tenant_of,
        slo_ttft_of: Callable[[Scope], float | None] = default_slo_ttft_of,
        clock_ms: Callable[[], float] = monotonic_ms,
        modes: Modes | None = None,
        enforcement: Enforcement | None = None,
    ) -> None:
        self.app = app
        self.directives = directives
        self.model_of = model_of
        self.priority_of = priority_of
        self.is_new_session = is_new_session
        self.request_key = request_key
        self.tenant_of = tenant_of
        self.slo_ttft_of = slo_ttft_of
        self.clock_ms = clock_ms
        self.enforcement = enforcement or Enforcement(modes or Modes())
        self.counters: dict[str, int] = dict.fromkeys(COUNTERS, 0)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        try:
            facts, decision = self.decide(scope)
            while decision.act.held:  # waits here for an admission token (or refusal)
                decision = await self._wait_held(facts, decision)
            act = decision.act
            extra = _headers_of(act)
            downstream = _with_headers(scope, extra) if extra else scope
            if decision.mode != "off":
                _mark(scope, CONTROL_STATE_KEY, (decision.mode, decision.verdict.reason))
        except Exception:
            self.counters["errors"] += 1
            log.exception("control middleware failed; passing the request through")
            await self.app(scope, receive, send)
            return
        reason = act.reason
        if reason is not None:
            self.counters[reason] += 1
            body, headers = _rejection(decision, act)
            await send({"type": "http.response.start", "status": act.status, "headers": headers})
            await send({"type": "http.response.body", "body": body, "more_body": False})
            return
        self.counters["passed"] += 1
        if decision.would_refuse is not None:
            self.counters["shadow_would_refuse"] += 1
        if act.half_open_admitted:
            self.counters["half_open_admitted"] += 1
        if extra:
            self.counters["headers_injected"] += 1
        queue = self.enforcement.queue
        forwarded = (
            None
            if decision.mode == "off"
            else queue.forwarded(facts.model, facts.slo_ttft_ms, self.clock_ms())
        )
        if decision.verdict.predicted_ttft_ms is not None or forwarded is not None:
            send = self._timing_first_byte(send, decision.verdict, forwarded)
        try:
            cut_now = act.queue_timeout_ms is not None
            if cut_now or (decision.mode == "enforce" and facts.priority >= 1):
                # under a cut-off now, or one a later directive may set while this request
                # waits for its first byte (as the simulator's gateways: the backtest proves
                # what this does)
                await self._with_cutoff(
                    downstream,
                    receive,
                    send,
                    decision=decision,
                    facts=facts,
                    cutoff_ms=act.queue_timeout_ms,
                )
                return
            shadow_cutoff = decision.verdict.queue_timeout_ms
            if decision.mode == "shadow" and decision.verdict.reason is None and shadow_cutoff:
                await self._watch_cutoff(
                    scope, receive, send, decision=decision, facts=facts, cutoff_ms=shadow_cutoff
                )
                return
            await self.app(downstream, receive, send)
        finally:
            queue.ended(forwarded)  # without a first byte (else it counted already)

    async def _wait_held(self, facts: RequestFacts, decision: Decision) -> Decision:
        """A request the enforcement holds for an admission token waits until its
        recheck, then asks again under the directive in force then
        (:meth:`Enforcement.resume`); a request cancelled meanwhile is forgotten."""
        ticket = decision.act.hold_ticket
        recheck_ms = decision.act.recheck_at_ms
        if ticket is None:  # not held: nothing to wait for
            return decision
        try:
            await asyncio.sleep(max(0.0, (recheck_ms or 0.0) - self.clock_ms()) / 1000.0)
            d = self.directives(facts.model or ALL_SCOPES)
            return self.enforcement.resume(d, ticket, self.clock_ms())[1]
        except BaseException:
            self.enforcement.cancel(ticket)
            raise

    def _timing_first_byte(self, send: Send, verdict: Verdict, forwarded: Forwarded | None) -> Send:
        """The first body bytes leave the queue this gateway sees
        (:class:`producers.gateway_queue.GatewayQueue`), and their time after the
        decision is the actual of the verdict's first-token prediction."""
        t0 = self.clock_ms()
        queue = self.enforcement.queue

        def first_byte(now_ms: float) -> None:
            queue.first_byte(forwarded, now_ms)
            queue.observe_ttft(verdict.predicted_ttft_ms, now_ms - t0)

        return _timing_first_body(send, self.clock_ms, first_byte)

    async def _watch_cutoff(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        *,
        decision: Decision,
        facts: RequestFacts,
        cutoff_ms: float,
    ) -> None:
        """Shadow: serve untouched; a first body chunk later than ``cutoff_ms`` after the
        call (or none by the time the app ends, that long after the call) is a cut-off
        enforce would have made, counted as such."""
        t0 = self.clock_ms()
        first_ms: list[float] = []
        try:
            await self.app(scope, receive, _timing_first_body(send, self.clock_ms, first_ms.append))
        finally:
            first = first_ms[0] if first_ms else self.clock_ms()
            late = first - t0 > cutoff_ms
            if late:
                self.enforcement.count_cutoff(decision, facts)
                self.counters["shadow_would_refuse"] += 1
                _mark(scope, CONTROL_STATE_KEY, (decision.mode, "queue_timeout"))

    async def _with_cutoff(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        *,
        decision: Decision,
        facts: RequestFacts,
        cutoff_ms: float | None,
    ) -> None:
        """Run the app as a task; its response start waits for its first body bytes, and
        with none after ``cutoff_ms`` the task is cancelled and a 503 is the answer. With
        no cut-off at admission (``None``), the directive in force is looked at again
        every :data:`LATE_CUTOFF_CHECK_S` until the first body bytes: a cut-off it sets
        for this priority counts from this request's call, as if in force then."""
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
            for message in held:
                await send(message)
            held.clear()
            await send(msg)

        task = asyncio.ensure_future(self.app(scope, receive, held_send))
        first = asyncio.ensure_future(released.wait())
        loop = asyncio.get_running_loop()
        start = loop.time()
        retry_after_s = decision.act.retry_after_s
        try:
            while True:
                if cutoff_ms is None:
                    timeout = LATE_CUTOFF_CHECK_S
                else:
                    timeout = cutoff_ms / 1000.0 - (loop.time() - start)
                    if timeout <= 0:
                        break
                done, _ = await asyncio.wait(
                    {task, first}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                if done or cutoff_ms is not None:
                    break
                later = self._later_cutoff(facts)
                if later is not None:
                    cutoff_ms, retry_after_s = later
        except BaseException:  # this request was cancelled: so is the app
            task.cancel()
            raise
        finally:
            first.cancel()
        if not released.is_set() and not task.done():
            cut = True
            task.cancel()
            self.counters["queue_timeout"] += 1
            self.enforcement.count_cutoff(decision, facts)
            _mark(scope, REJECTED_STATE_KEY, "queue_timeout")
            _mark(scope, CONTROL_STATE_KEY, (decision.mode, "queue_timeout"))
            cut_verdict = Verdict(reason="queue_timeout", retry_after_s=retry_after_s)
            body, headers = _rejection(decision, cut_verdict)
            try:
                await send(
                    {
                        "type": "http.response.start",
                        "status": cut_verdict.status,
                        "headers": headers,
                    }
                )
                await send({"type": "http.response.body", "body": body, "more_body": False})
            finally:
                await asyncio.wait({task})  # the app unwinds (closes its upstream call)
            if not task.cancelled() and task.exception() is not None:
                log.warning("app failed when cut off at the queue timeout: %r", task.exception())
            return
        await task  # streams on (or has ended); its exceptions propagate
        if held and not released.is_set():  # the app ended without a body: as it sent it
            for message in held:
                await send(message)

    def facts(self, scope: Scope) -> RequestFacts:
        """What the enforcement is told of this request (headers only)."""
        attempt = client_attempt(lambda name: header(scope, name.encode("latin-1")))
        return RequestFacts(
            model=self.model_of(scope),
            priority=self.priority_of(scope),
            new_session=self.is_new_session(scope),
            request_key=self.request_key(scope),
            attempt=attempt.attempt,
            logical_id=attempt.logical_id,
            tenant=self.tenant_of(scope),
            slo_ttft_ms=self.slo_ttft_of(scope),
        )

    def _later_cutoff(self, facts: RequestFacts) -> tuple[float, int] | None:
        """The queue cut-off of the directive in force now for this request's priority,
        and its Retry-After (spread as the enforcement spreads it); None: none (or the
        lookup failed: never cut on an error)."""
        try:
            return self.enforcement.later_cutoff(self.directives(facts.model or ALL_SCOPES), facts)
        except Exception:
            self.counters["errors"] += 1
            return None

    def decide(self, scope: Scope) -> tuple[RequestFacts, Decision]:
        """The request's facts and the enforcement's decision (may raise)."""
        facts = self.facts(scope)
        if self.enforcement.modes.of(facts.model, facts.priority) == "off":
            return facts, self.enforcement.decide(None, facts, 0.0)
        d = self.directives(facts.model or ALL_SCOPES)
        return facts, self.enforcement.decide(d, facts, self.clock_ms(), can_hold=True)


def _timing_first_body(
    send: Send, clock_ms: Callable[[], float], on_first: Callable[[float], object]
) -> Send:
    """``send``, calling ``on_first(clock_ms())`` once, when the first body bytes (or the
    final body message) go out."""
    seen: list[bool] = []

    async def timed_send(msg: Message) -> None:
        body = msg.get("type") == "http.response.body"
        if not seen and body and (msg.get("body") or not msg.get("more_body")):
            seen.append(True)
            on_first(clock_ms())
        await send(msg)

    return timed_send


def _mark(scope: Scope, key: str, value: object) -> None:
    state = scope.get("state")
    if isinstance(state, dict):
        state[key] = value


def _headers_of(v: Verdict) -> tuple[tuple[bytes, bytes], ...]:
    extra: list[tuple[bytes, bytes]] = []
    if v.cap_context_tokens is not None:
        extra.append((MAX_CONTEXT_HEADER, str(v.cap_context_tokens).encode("ascii")))
    if v.fallback_model is not None:
        extra.append((FALLBACK_MODEL_HEADER, v.fallback_model.encode("utf-8")))
    return tuple(extra)


def _with_headers(scope: Scope, extra: tuple[tuple[bytes, bytes], ...]) -> Scope:
    kept = [
        (bytes(k), bytes(v))
        for k, v in scope.get("headers") or ()
        if bytes(k).lower() not in _INJECTED
    ]
    new = dict(scope)
    new["headers"] = kept + list(extra)
    return new


def _rejection(d: Decision, v: Verdict) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    retry = max(0, int(v.retry_after_s))
    body = orjson.dumps(
        {"error": "overloaded", "reason": v.reason, "level": d.level, "retry_after_s": retry}
    )
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode("ascii")),
        *((k.encode("ascii"), val.encode("ascii")) for k, val in v.refusal_headers(d.level)),
    ]
    return body, headers
