"""Simulated gateways applying control directives, as the ASGI middleware does.

:class:`GatewayGate` holds the directive in force per scope (a model, or
``"*"``) and decides, per request arriving at a simulated gateway:

* ``shed_priorities_at_or_above = p`` and priority >= p -> **429** with
  ``Retry-After`` (recorded ``outcome="rejected"``, ``http_status=429``);
* priority 0 (real-time, "never evicted") is never turned away by
  ``reject_new_sessions``, the rate limit or the admission, only by an explicit
  ``shed_priorities_at_or_above: 0`` (as the ASGI middleware);
* ``reject_new_sessions`` and the request opens a new session -> the same 429
  (a request is a new session when ``blake2b(request id)`` falls in
  ``new_session_fraction``: deterministic, no draw from the simulator's RNG;
  a client's retry continues its session);
* half-open: of the requests either rule would reject, ``admit_fraction`` is
  admitted (``hash_admits`` on the request id, as the middleware does);
* ``rate_limit_rps``: a token bucket per gateway instance and scope (burst =
  one second of tokens); an empty bucket -> 429 (priority 0 takes a token when
  there is one and passes either way);
* ``admit_rps`` (capacity-aware admission, issue 35): what the scope's gateways
  admit together, split equally among ``admit_gateways`` (None: 1); each gateway
  instance runs a :class:`producers.admission.PriorityAdmission` per model (per model
  even under a ``"*"`` directive; the middleware keys it by the directive's scope) at
  ``admit_rps / admit_gateways`` -- strict priority (0 first, then 1, 2, 3 fill what
  is left; priority 0 is never turned away), applied after the rules above to the
  requests they let through -> 429 ``"admission"`` with a ``Retry-After`` that follows
  the priority's bucket (at least 1 s, at most the directive's ``retry_after_s``);
* admitted requests get ``cap_context_tokens`` (prompt truncated: shorter
  prefill) and ``fallback_model`` (routed to that model's engines when the
  simulation serves it).

Directives come either from the real :class:`producers.control_client.ControlClient`
(signatures checked; :meth:`GatewayGate.from_directive`) or, in a backtest, straight
from the in-process control loop (:meth:`GatewayGate.set`). Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from producers.admission import PriorityAdmission
from producers.asgi_control import hash_admits

ALL_SCOPES: Final = "*"

Reject = Literal["shed_priority", "new_session", "rate_limit", "admission"]


@dataclass(frozen=True, slots=True)
class GateActions:
    level: int = 0
    phase: str = "normal"
    shed_priorities_at_or_above: int | None = None
    cap_context_tokens: int | None = None
    fallback_model: str | None = None
    reject_new_sessions: bool = False
    retry_after_s: int = 0
    rate_limit_rps: float | None = None
    admit_fraction: float | None = None
    admit_rps: float | None = None  # what the scope's gateways admit together
    admit_gateways: int | None = None  # admit_rps split equally among them; None: 1
    # per priority 0..3: still queued after this long -> 503 (priority 0: never)
    queue_timeout_ms: tuple[float | None, ...] | None = None

    @classmethod
    def of(cls, level: int, phase: str, actions: Any) -> GateActions:
        """From a policy ``Actions``, a signal's actions model or a mapping."""
        a = actions if isinstance(actions, dict) else _fields(actions)
        return cls(
            level=level,
            phase=phase,
            shed_priorities_at_or_above=a.get("shed_priorities_at_or_above"),
            cap_context_tokens=a.get("cap_context_tokens"),
            fallback_model=a.get("fallback_model"),
            reject_new_sessions=bool(a.get("reject_new_sessions")),
            retry_after_s=int(a.get("retry_after_s") or 0),
            rate_limit_rps=a.get("rate_limit_rps"),
            admit_fraction=a.get("admit_fraction"),
            admit_rps=a.get("admit_rps"),
            admit_gateways=a.get("admit_gateways"),
            queue_timeout_ms=(
                None if a.get("queue_timeout_ms") is None else tuple(a["queue_timeout_ms"])
            ),
        )


def _fields(obj: Any) -> dict[str, Any]:
    if hasattr(obj, "to_json"):
        return dict(obj.to_json())
    if hasattr(obj, "model_dump"):
        return dict(obj.model_dump())
    raise TypeError(f"cannot read actions from {obj!r}")


NORMAL: Final = GateActions()


@dataclass(frozen=True, slots=True)
class Verdict:
    reject: Reject | None = None
    retry_after_s: int = 0
    cap_context_tokens: int | None = None
    fallback_model: str | None = None
    # Admitted under a queue cut-off: still waiting for the engine after this long -> 503
    # with retry_after_s (priority 0 never gets one).
    queue_timeout_ms: float | None = None


ADMIT: Final = Verdict()


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


@dataclass
class GatewayGate:
    new_session_fraction: float = 0.3
    scopes: dict[str, GateActions] = field(default_factory=dict)
    # (gateway, scope) -> (tokens, last refill ms)
    _buckets: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)
    # (gateway, scope) -> its share of the scope's admission rate
    _admissions: dict[tuple[str, str], PriorityAdmission] = field(default_factory=dict)
    rejected: Counter[tuple[int, str]] = field(default_factory=Counter)  # (priority, why)
    capped: Counter[int] = field(default_factory=Counter)  # priority -> requests capped
    half_open_admitted: int = 0
    fallbacks: int = 0

    def set(self, scope: str, actions: GateActions) -> None:
        """Apply a directive to ``scope`` (in-process: a backtest's control loop)."""
        self.scopes[scope] = actions

    def from_directive(self, scope: str, directive: Any) -> None:
        """Apply a :class:`producers.control_client.Directive` (verified signal)."""
        self.set(scope, GateActions.of(directive.level, directive.phase, directive.actions))

    def actions(self, model: str) -> GateActions:
        return self.scopes.get(model) or self.scopes.get(ALL_SCOPES) or NORMAL

    def decide(self, arrival: Arrival) -> Verdict:
        priority, request_id, gateway, t_ms = (
            arrival.priority, arrival.request_id, arrival.gateway, arrival.t_ms
        )  # fmt: skip
        a = self.actions(arrival.model)
        if a.level <= 0:
            return ADMIT
        reject: Reject | None = None
        if a.shed_priorities_at_or_above is not None and priority >= a.shed_priorities_at_or_above:
            reject = "shed_priority"
        elif (
            a.reject_new_sessions
            and priority > 0  # priority 0 (real-time) is never turned away by a directive
            and arrival.session_id == request_id
            and hash_admits(f"session:{arrival.session_id}", self.new_session_fraction)
        ):
            reject = "new_session"
        if (
            reject is not None
            and a.phase == "half_open"
            and a.admit_fraction
            and hash_admits(request_id, a.admit_fraction)
        ):
            self.half_open_admitted += 1
            reject = None
        if (
            reject is None
            and a.rate_limit_rps is not None
            and not self._take_token(gateway, arrival.model, a.rate_limit_rps, t_ms)
            and priority > 0  # priority 0 takes a token when there is one, never waits
        ):
            reject = "rate_limit"
        retry_after_s = a.retry_after_s
        if reject is None and a.admit_rps is not None:
            key = (gateway, arrival.model)
            admission = self._admissions.get(key)
            if admission is None:
                admission = self._admissions[key] = PriorityAdmission()
            admit = admission.decide(
                priority, a.admit_rps / (a.admit_gateways or 1), t_ms, a.retry_after_s
            )
            if not admit.admitted:
                reject, retry_after_s = "admission", admit.retry_after_s
        if reject is not None:
            self.rejected[(priority, reject)] += 1
            return Verdict(reject=reject, retry_after_s=retry_after_s)
        cap = a.cap_context_tokens
        if cap is not None and arrival.prompt_tokens > cap:
            self.capped[priority] += 1
        else:
            cap = None
        if a.fallback_model is not None:
            self.fallbacks += 1
        cuts = a.queue_timeout_ms
        cutoff = cuts[priority] if cuts is not None and 0 < priority < len(cuts) else None
        if cutoff is None and cap is None and a.fallback_model is None:
            return ADMIT
        return Verdict(
            retry_after_s=a.retry_after_s if cutoff is not None else 0,
            cap_context_tokens=cap,
            fallback_model=a.fallback_model,
            queue_timeout_ms=cutoff,
        )

    def on_complete(self, done: Completion) -> None:
        """The simulator reports a request this gate admitted (``decide`` returned no
        reject) once, when its ``gateway.completed`` is emitted. Directives need no
        feedback: a no-op here; adaptive baselines override it."""
        return

    def _take_token(self, gateway: str, scope: str, rps: float, t_ms: float) -> bool:
        key = (gateway, scope)
        tokens, last = self._buckets.get(key, (rps, t_ms))
        tokens = min(rps, tokens + (t_ms - last) / 1000.0 * rps)
        if tokens >= 1.0:
            self._buckets[key] = (tokens - 1.0, t_ms)
            return True
        self._buckets[key] = (tokens, t_ms)
        return False

    def shed_by_priority(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for (prio, _why), n in self.rejected.items():
            out[prio] = out.get(prio, 0) + n
        return dict(sorted(out.items()))


class ControlClientGate(GatewayGate):
    """A gate that reads the directives through a real
    :class:`producers.control_client.ControlClient` (signed, sequenced, expiring:
    the serving layer's own path), looked up per request like the ASGI middleware:
    the model's directive, else the ``"*"`` one."""

    def __init__(self, client: Any, new_session_fraction: float = 0.3) -> None:
        super().__init__(new_session_fraction=new_session_fraction)
        self.client = client
        self._cache: dict[tuple[Any, ...], GateActions] = {}

    def actions(self, model: str) -> GateActions:
        d = self.client.directive(model)
        if d.level <= 0:
            d = self.client.directive(ALL_SCOPES)
        if d.level <= 0:
            return NORMAL
        key = (d.scope, d.seq, d.phase)
        got = self._cache.get(key)
        if got is None:
            if len(self._cache) > 1024:
                self._cache.clear()
            got = self._cache[key] = GateActions.of(d.level, d.phase, d.actions)
        return got
