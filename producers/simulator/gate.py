"""Simulated gateways applying control directives through the one enforcement.

:class:`GatewayGate` holds the directive in force per scope (a model, or ``"*"``; a
model is governed by the stricter of its own and the ``"*"`` one, as
:class:`producers.control_client.DirectiveStore` rules) and one
:class:`producers.enforcement.Enforcement` per simulated gateway instance. It decides
nothing itself: every rule, status, ``Retry-After`` and mode is that module's, the same
code the ASGI middleware, the reference proxy and the LiteLLM hook run (tests/integration/
test_enforcement_differential.py holds them to it). What it adds is the simulated
client's side of :class:`producers.enforcement.RequestFacts`:

* a request opens a new session when it is not a retry of a session's request and
  ``blake2b("session:" + session id)`` falls in ``new_session_fraction`` (deterministic,
  no draw from the simulator's RNG; a client's retry continues its session);
* its request key (for the half-open hash) is its request id;
* its attempt is the client's retry count (what the OpenAI SDK sends as
  ``x-stainless-retry-count``), for the retry budget; the budget's ratio and floor are
  ``modes``' (:class:`producers.enforcement.Modes`, whose defaults the gateways'
  ``TAILGUARD_CONTROL_RETRY_BUDGET_*`` settings share).

Directives come either from the real :class:`producers.control_client.ControlClient`
(signatures checked: :class:`ControlClientGate`) or, in a backtest, straight from the
in-process control loop (:meth:`GatewayGate.set`). ``modes`` runs the gateways in
``shadow`` (a backtest of what enforce would have turned away, nothing turned away) or
``enforce`` (the default). Pure: no clock, no I/O.
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pipeline.contract.control_signal import Actions
from producers.control_client import Directive
from producers.enforcement import (
    ADMIT,
    ALL_SCOPES,
    Decision,
    DirectiveLike,
    Enforcement,
    Modes,
    RequestFacts,
    Verdict,
    hash_admits,
    stricter,
)
from producers.gateway_queue import Forwarded, error_percentiles
from producers.loop_delay import LoopDelay

__all__ = [
    "ADMIT",
    "ALL_SCOPES",
    "Arrival",
    "Completion",
    "ControlClientGate",
    "GatewayGate",
    "Verdict",
    "directive_of",
]


def directive_of(
    level: int,
    phase: str,
    actions: Any,
    scope: str | None = None,
    as_of_unix_ms: int | None = None,
) -> Directive:
    """A directive from a policy decision's or a signal's actions (or a mapping);
    ``as_of_unix_ms``: the decision's evaluation time (its evidence's event time)."""
    if not isinstance(actions, Actions):
        actions = Actions.model_validate(
            actions if isinstance(actions, dict) else actions.to_json()
        )
    return Directive(
        level=level,
        phase=phase,  # type: ignore[arg-type]
        actions=actions,
        scope=scope,
        as_of_unix_ms=as_of_unix_ms,
    )


@dataclass(frozen=True, slots=True)
class Arrival:
    """A request as the gateway asks a gate about it (:meth:`GatewayGate.decide`)."""

    model: str
    priority: int
    request_id: str
    session_id: str
    gateway: str
    prompt_tokens: int
    t_ms: float
    attempt: int = 0  # the client's retries so far (the SDK's x-stainless-retry-count)
    logical_id: str | None = None  # an idempotency key, if the client sends one
    tenant: str | None = None  # the x-tenant-id it carries
    slo_ttft_ms: float | None = None  # its own first-token SLO (x-llm-d-slo-ttft-ms)
    stream: bool | None = None  # None: unknown (a non-streaming one has a total budget)


@dataclass(frozen=True, slots=True)
class Completion:
    """A request a gate admitted, reported once when its ``gateway.completed`` is emitted
    (:meth:`GatewayGate.on_complete`): ``model`` as passed to ``decide`` (before any
    fallback), ``t_ms`` the completion time, ``ttfb_ms`` and ``total_ms`` as recorded
    (``ttfb_ms`` None when the client left before the first byte), ``outcome`` ok,
    client_abort or rejected (queue timeout)."""

    model: str
    gateway: str
    priority: int
    request_id: str
    t_ms: float
    ttfb_ms: float | None
    total_ms: float
    outcome: str


def nonstream_budget_ms(spec: Any) -> float | None:
    """A non-streaming request's latency budget from an SLO spec: the tightest threshold
    of the SLOs on the gateway's total time that select non-streaming requests (None:
    none does). What the hold before refusal takes a share of."""
    found = [
        float(slo.threshold_ms)
        for slo in getattr(spec, "slos", ())
        if slo.boundary == "gateway_total_ms"
        and slo.filter is not None
        and slo.filter.stream is False
    ]
    return min(found) if found else None


@dataclass
class GatewayGate:
    new_session_fraction: float = 0.3
    modes: Modes = field(default_factory=Modes)
    # a non-streaming request's budget (nonstream_budget_ms of the SLO spec), for holds
    nonstream_budget_ms: float | None = None
    holds: bool = True  # the simulated gateways wait on a held verdict (GatewayLoop)
    scopes: dict[str, DirectiveLike] = field(default_factory=dict)
    # simulated gateway instance -> its enforcement (admit_gateways counts instances)
    enforcements: dict[str, Enforcement] = field(default_factory=dict)
    rejected: Counter[tuple[int, str]] = field(default_factory=Counter)  # (priority, why)
    capped: Counter[int] = field(default_factory=Counter)  # priority -> requests capped
    half_open_admitted: int = 0
    fallbacks: int = 0
    loop_delay: LoopDelay = field(default_factory=LoopDelay)
    # admitted requests with a first-token prediction: request id -> (gateway, verdict)
    _predicted: dict[str, tuple[str, Verdict]] = field(default_factory=dict)
    # deliveries not yet in force: (at_unix_ms, order, scope, directive), a heap
    _pending: list[tuple[float, int, str, DirectiveLike]] = field(default_factory=list)
    _delivered: int = 0

    def set(self, scope: str, directive: DirectiveLike) -> None:
        """Apply a directive to ``scope`` now (:meth:`advance` reports it next)."""
        self.scopes[scope] = directive
        self.deliver(scope, directive, float("-inf"))

    def deliver(self, scope: str, directive: DirectiveLike, at_unix_ms: float) -> None:
        """``directive`` reaches the gateways of ``scope`` at event time ``at_unix_ms``:
        it governs the first arrival at or after it, not one before."""
        heapq.heappush(self._pending, (at_unix_ms, self._delivered, scope, directive))
        self._delivered += 1

    def advance(self, now_unix_ms: float) -> list[tuple[str, DirectiveLike]]:
        """The simulator's clock (event time, ms) before it decides an arrival: the
        decisions that took effect since the last call, in order, each once (a directive
        with no ``as_of_unix_ms`` counts every time it is delivered)."""
        out: list[tuple[str, DirectiveLike]] = []
        for scope, d in self._arrived(now_unix_ms):
            as_of = getattr(d, "as_of_unix_ms", None)
            if self.loop_delay.applied(scope, as_of, now_unix_ms) is not None or as_of is None:
                out.append((scope, d))
        return out

    def _arrived(self, now_unix_ms: float) -> list[tuple[str, DirectiveLike]]:
        """Directives in force by ``now_unix_ms`` that were not before (set ``scopes``).
        A delivery older than the scope's directive in force (an earlier ``as_of``, come
        late) is dropped, as the control client drops a stale ``seq``."""
        out: list[tuple[str, DirectiveLike]] = []
        pending = self._pending
        while pending and pending[0][0] <= now_unix_ms:
            _, _, scope, d = heapq.heappop(pending)
            cur = getattr(self.scopes.get(scope), "as_of_unix_ms", None)
            new = getattr(d, "as_of_unix_ms", None)
            if cur is not None and new is not None and new < cur:
                continue
            self.scopes[scope] = d
            out.append((scope, d))
        return out

    def directive(self, model: str) -> DirectiveLike | None:
        """The directive that governs ``model``: the stricter of its own and ``"*"``."""
        return stricter(self.scopes.get(model), self.scopes.get(ALL_SCOPES))

    def decide(self, arrival: Arrival) -> Verdict:
        """What the gateway does with this arrival (the verdict acted on)."""
        return self.decision(arrival).act

    def decision(self, arrival: Arrival) -> Decision:
        """The enforcement's decision (its verdict, mode and level) for this arrival; a
        held one (``holds``) is asked again with :meth:`resume`."""
        enforcement = self.enforcements.get(arrival.gateway)
        if enforcement is None:
            enforcement = self.enforcements[arrival.gateway] = Enforcement(self.modes)
        new_session = arrival.session_id == arrival.request_id and hash_admits(
            f"session:{arrival.session_id}", self.new_session_fraction
        )
        # What an HTTP gateway knows: headers, not the prompt's length (so the context cap
        # goes with every request it admits, as the middleware's header does).
        facts = RequestFacts(
            model=arrival.model,
            priority=arrival.priority,
            new_session=new_session,
            request_key=arrival.request_id,
            attempt=arrival.attempt,
            logical_id=arrival.logical_id,  # the simulated OpenAI SDK sends none
            tenant=arrival.tenant,
            slo_ttft_ms=arrival.slo_ttft_ms,
            budget_ms=self.nonstream_budget_ms if arrival.stream is False else None,
        )
        d = enforcement.decide(
            self.directive(arrival.model), facts, arrival.t_ms, can_hold=self.holds
        )
        return self._acted(arrival, d)

    def resume(self, arrival: Arrival, ticket: int, t_ms: float) -> Decision:
        """A held arrival asks again at ``t_ms`` (:meth:`producers.enforcement.
        Enforcement.resume`) under the directive in force now."""
        enforcement = self.enforcements[arrival.gateway]
        _facts, d = enforcement.resume(self.directive(arrival.model), ticket, t_ms)
        return self._acted(arrival, d)

    def cancel(self, arrival: Arrival, ticket: int) -> None:
        """A held arrival's client left."""
        self.enforcements[arrival.gateway].cancel(ticket)

    def _acted(self, arrival: Arrival, d: Decision) -> Decision:
        act = d.act
        if act.held:
            return d
        if act.reason is not None:
            self.rejected[(arrival.priority, act.reason)] += 1
        else:
            if act.half_open_admitted:
                self.half_open_admitted += 1
            if (
                act.cap_context_tokens is not None
                and arrival.prompt_tokens > act.cap_context_tokens
            ):
                self.capped[arrival.priority] += 1  # the prompt is cut
            if act.fallback_model is not None:
                self.fallbacks += 1
            if d.verdict.predicted_ttft_ms is not None:
                self._predicted[arrival.request_id] = (arrival.gateway, d.verdict)
        return d

    def on_complete(self, done: Completion) -> None:
        """The simulator reports a request this gate admitted (``decide`` returned no
        reject) once, when its ``gateway.completed`` is emitted: its first byte is the
        actual of its first-token prediction, if it had one (adaptive baselines
        override it)."""
        seen = self._predicted.pop(done.request_id, None)
        if seen is not None:
            self.enforcements[seen[0]].queue.observe_ttft(seen[1].predicted_ttft_ms, done.ttfb_ms)

    def forwarded(
        self, gateway: str, model: str, slo_ttft_ms: float | None, t_ms: float
    ) -> Forwarded | None:
        """``gateway`` forwards a request it admitted for ``model`` at ``t_ms``: counted
        in the queue that gateway sees (:class:`producers.gateway_queue.GatewayQueue`)
        until :meth:`answered`; None when nothing is counted."""
        enforcement = self.enforcements.get(gateway)
        if enforcement is None:
            return None
        return enforcement.queue.forwarded(model, slo_ttft_ms, t_ms)

    def answered(self, gateway: str, forwarded: Forwarded, first_byte_ms: float | None) -> None:
        """A forwarded request's first byte reached ``gateway`` at ``first_byte_ms``
        (None: it ended without one)."""
        queue = self.enforcements[gateway].queue
        if first_byte_ms is None:
            queue.ended(forwarded)
        else:
            queue.first_byte(forwarded, first_byte_ms)

    def prediction_error(self) -> dict[str, float | int | None]:
        """P50/P90 of predicted - actual first-token time over every gateway's admitted
        requests with a prediction (each gateway's :meth:`producers.gateway_queue.
        GatewayQueue.prediction_error`, pooled)."""
        return error_percentiles(
            [x for e in self.enforcements.values() for x in e.queue.ttft_errors_ms]
        )

    def shed_by_priority(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for (prio, _why), n in self.rejected.items():
            out[prio] = out.get(prio, 0) + n
        return dict(sorted(out.items()))


class ControlClientGate(GatewayGate):
    """A gate that reads the directives through a real
    :class:`producers.control_client.ControlClient` (signed, sequenced, expiring:
    the serving layer's own path), looked up per request like the ASGI middleware."""

    def __init__(self, client: Any, new_session_fraction: float = 0.3, **kw: Any) -> None:
        super().__init__(new_session_fraction=new_session_fraction, **kw)
        self.client = client
        self._seen: dict[str, int | None] = {}  # scope -> seq of the signal last seen

    def _arrived(self, now_unix_ms: float) -> list[tuple[str, DirectiveLike]]:
        """What the client accepted since the last look (a new ``seq`` per scope; the
        client's own wall clock rules expiry, as for a real gateway)."""
        out: list[tuple[str, DirectiveLike]] = []
        for scope, d in self.client.store.snapshot(self.client.now_ms()).items():
            if self._seen.get(scope, -1) != d.seq:
                self._seen[scope] = d.seq
                out.append((scope, d))
        return out

    def directive(self, model: str) -> DirectiveLike | None:
        return self.client.directive(model)  # type: ignore[no-any-return]
