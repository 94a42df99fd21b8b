"""The one enforcement: what a gateway does with a request under a control directive.

Every gateway we ship asks :class:`Enforcement` and nothing else decides: the ASGI
middleware (:mod:`producers.asgi_control`, so the reference proxy ``tailguard gateway``),
the LiteLLM proxy hook (:mod:`producers.litellm_hook`) and the simulator's gateways
(:mod:`producers.simulator.gate`, so ``tailguard backtest`` and the demo). What the
backtest proves is therefore what the shipped gateways do (tests/integration/
test_enforcement_differential.py sends the same arrivals through all of them).

Pure and clock-free: the caller passes the directive in force (a
:class:`producers.control_client.Directive`, or anything with its ``level``, ``phase``,
``scope`` and ``actions``), what it knows of the request (:class:`RequestFacts`: read
from headers, never from the body) and the time (``now_ms``, any monotonic origin on
this gateway). One :class:`Enforcement` is one gateway instance (``admit_gateways``
counts instances); not thread-safe: one caller at a time (an event loop, a simulator).

The rules, in order (a directive at level 0 admits everything untouched)
-------------------------------------------------------------------------
1. ``shed_priorities_at_or_above = p`` and priority >= p -> refuse ``shed_priority``.
2. ``reject_new_sessions`` and the request opens a new session and priority >= 1 ->
   refuse ``new_session`` (priority 0, real-time, is turned away only by an explicit
   ``shed_priorities_at_or_above: 0``).
3. Half-open (``phase == "half_open"``): of the requests 1 or 2 would refuse,
   ``admit_fraction`` is admitted instead: with a request key (``x-request-id``, the
   simulator's request id), those whose ``blake2b(key)`` falls below the fraction (the
   same key always gets the same answer); without one, an exact running spread (the
   *k*-th such request is admitted when ``floor((k+1)·f) > floor(k·f)``).
4. ``rate_limit_rps`` (a fixed per-instance cap, e.g. static levels): a token bucket
   per gateway instance and directive scope, burst one second (at least one token);
   empty -> refuse ``rate_limit`` (priority 0 takes a token when there is one and
   passes either way).
5. Deadline (issue 52): a request of priority >= 1 that carries its own first-token SLO
   (``slo_ttft_ms``: ``x-llm-d-slo-ttft-ms``) under a directive with a first-token
   prediction and a ``deadline_margin`` (the policy level's; none: never) is refused at
   once -> ``deadline`` rather than admitted to miss, when the prediction exceeds its SLO
   by more than the margin, or its predicted queue wait exceeds its priority's queue
   cut-off by more than the margin (it would be cut off there: 503, late whatever its
   SLO); ``Retry-After`` the predicted excess (at least 1 s, at most ``retry_after_s``).
   The prediction is the queue wait plus the directive's ``ttft_service_ms`` (the
   unqueued first-token time); the queue wait is what this gateway sees now
   (:class:`producers.gateway_queue.GatewayQueue`, ``Enforcement.queue``: the gateway
   reports each forwarded request's first byte), else the directive's ``ttft_queue_ms``
   (what the controller measured, a loop behind). An admitted request's verdict carries
   the prediction (``predicted_ttft_ms``); the gateway reports the first byte it saw with
   ``Enforcement.queue.observe_ttft``, and ``Enforcement.queue.prediction_error()`` gives
   the P50/P90 of predicted - actual.
6. ``admit_rps`` (capacity-aware admission): a :class:`producers.admission.
   PriorityAdmission` per directive scope at ``admit_rps / admit_gateways`` requests/s,
   by strict priority and, with ``fair_share`` (the policy level's), max-min fair among
   tenants first (``tenant``, weighted by ``tenant_weights``; strict tiers within each
   tenant's share, what a tenant sends beyond it turned away first); refused ->
   ``admission`` with its own ``Retry-After`` (when the priority's, or the tenant's,
   bucket next holds a token: at least 1 s, at most ``retry_after_s``).
   **Hold before refusal** (issue 47; the policy level's ``hold_fraction``, none: never;
   not with ``fair_share``): in ``enforce``, at a gateway that can wait (``decide(...,
   can_hold=True)``: the ASGI middleware, so the reference proxy, and the simulator's
   gateways; the LiteLLM hook refuses at once), a request of priority >= 1 with slack
   (:attr:`RequestFacts.slack_ms`: ``budget_ms``, a non-streaming request's SLO
   threshold, else its own ``slo_ttft_ms``) is *held* instead (:attr:`Verdict.held`:
   neither forwarded nor refused) for up to ``hold_fraction`` of its slack, at most
   :data:`HOLD_MAX_MS`, at most :data:`MAX_HELD_PER_SCOPE` per (gateway, scope). The
   gateway asks again at ``recheck_at_ms`` (every :data:`HOLD_RECHECK_MS` at most) with
   :meth:`Enforcement.resume`: held requests take the tokens as they come in priority
   order, then arrival (a held lower priority never takes a token a higher priority
   waits for, and a new arrival takes none while a higher priority is held); admitted
   with the rest of rule 7, or refused -> ``admission`` once its wait has run out.
   Measured off by default: docs/admission.md.
7. Admitted: ``cap_context_tokens`` (when the prompt is longer, or its length unknown),
   ``fallback_model``, and the queue cut-off of its priority (``queue_timeout_ms``;
   priority 0 never): a request with no first byte that long after it was forwarded is
   cancelled -> ``queue_timeout``. The gateway runs the timer; it reports a cut-off it
   made (or, in shadow, would have made) with :meth:`Enforcement.count_cutoff`.

One status per reason (:data:`STATUS`)
--------------------------------------
Every deliberate refusal is ``429 Too Many Requests`` with ``Retry-After``: the client is
fine, the service chose not to serve it now, and every common SDK (OpenAI's, LiteLLM's,
Anthropic's) retries a 429 after the ``Retry-After`` it names. An SRE's error-rate SLO
does not count it as a server error: the gateways record it as ``rejected``. The queue
cut-off alone is ``503 Service Unavailable`` + ``Retry-After``: the request was accepted,
forwarded and then given up on because the engines could not start it in time, which is
what 503 means; the gateways mark it ``rejected`` too (the reason travels in
``scope["state"]``), so neither is an error in the store.

Three modes (:class:`Modes`)
----------------------------
``off`` (the directive is not even read), ``shadow`` (decide and count, never act: the
request is served as without control, no header injected, no cut-off) and ``enforce``.
A gateway sets one mode, optionally per scope (a model), and may enforce only priorities
at or above a tier (``enforce_from_priority = 3``: priority 3 enforced, 0-2 shadowed), the
rollout's middle step. Shadow runs the same rules on the same state as enforce (the
admission's buckets see every arrival either way), so on the same arrivals the shadow
counters equal what enforce turns away. Counted per (mode, model, priority, reason) in
:attr:`Enforcement.refusals`: ``enforce`` rows are refusals, ``shadow`` rows are
would-have refusals.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter, OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, get_args

from pipeline.contract.events import ControlVerdict
from producers.admission import PRIORITIES, PriorityAdmission
from producers.client_retry import SHOULD_RETRY_HEADER
from producers.gateway_queue import GatewayQueue

if TYPE_CHECKING:
    from pipeline.kafka_settings import EmitterSettings

Mode = Literal["off", "shadow", "enforce"]
MODES: Final[tuple[Mode, ...]] = ("off", "shadow", "enforce")
Reason = ControlVerdict  # the contract's: the reasons gateway.completed records
REASONS: Final[tuple[Reason, ...]] = get_args(ControlVerdict)
# One status per reason (see the module docstring for why).
STATUS: Final[Mapping[Reason, int]] = {
    "shed_priority": 429,
    "new_session": 429,
    "rate_limit": 429,
    "admission": 429,
    "queue_timeout": 503,
    "retry_budget": 429,
    "deadline": 429,
}
# The margin docs/admission.md measures with (a policy level's deadline_margin: a request
# is refused as late when its predicted first-token time exceeds its own SLO by more).
DEADLINE_MARGIN: Final = 0.25

ALL_SCOPES: Final = "*"  # the scope of a directive for all traffic (as the control topic's)


class _ActionsLike(Protocol):
    shed_priorities_at_or_above: int | None
    cap_context_tokens: int | None
    fallback_model: str | None
    reject_new_sessions: bool
    retry_after_s: int
    rate_limit_rps: float | None
    admit_fraction: float | None
    admit_rps: float | None
    admit_gateways: int | None
    fair_share: bool
    tenant_weights: Mapping[str, float] | None
    deadline_margin: float | None
    ttft_queue_ms: float | None
    ttft_service_ms: float | None
    hold_fraction: float | None

    def queue_timeout_for(self, priority: int) -> float | None: ...


class DirectiveLike(Protocol):
    """What the enforcement reads of a directive (:class:`producers.control_client.
    Directive` has it)."""

    @property
    def level(self) -> int: ...
    @property
    def phase(self) -> str: ...
    @property
    def scope(self) -> str | None: ...
    @property
    def actions(self) -> Any: ...  # an _ActionsLike (the contract's Actions)


def stricter(own: DirectiveLike | None, every: DirectiveLike | None) -> DirectiveLike | None:
    """The directive that governs a model, from its own and the ``"*"`` one: the higher
    level wins, the model's own on a tie (never merged field by field: a merge would be a
    directive nobody issued)."""
    if own is None:
        return every
    if every is None or own.level >= every.level:
        return own
    return every


@dataclass(frozen=True, slots=True)
class RequestFacts:
    """What a gateway knows of a request before it forwards it (headers, not body).

    ``model`` None: unknown (only a ``"*"`` directive applies); ``priority`` 0 (highest)
    .. 3, clamped; ``new_session``: the request opens a session (the middleware: no
    ``x-tailguard-session`` header); ``request_key``: a stable id of the logical
    request (``x-request-id``), for the half-open hash; ``prompt_tokens`` None: unknown;
    ``attempt`` and ``logical_id``: what the client's retry headers say
    (:func:`producers.client_retry.client_attempt`: 0 = a first try; the id every attempt
    of one logical request shares, if sent), for the retry budget; ``tenant`` (None:
    unknown) for the fair shares across tenants; ``slo_ttft_ms``: the request's own
    first-token SLO (None: none), for the deadline; ``budget_ms``: the latency its SLO
    leaves it (None: unknown; a non-streaming request's is the SLO spec's threshold for
    its boundary, :func:`producers.simulator.gate.nonstream_budget_ms`), for the hold
    before refusal (a request with its own ``slo_ttft_ms`` has that as its budget).
    """

    model: str | None
    priority: int
    new_session: bool = False
    request_key: str | None = None
    prompt_tokens: int | None = None
    tenant: str | None = None
    attempt: int = 0
    logical_id: str | None = None
    slo_ttft_ms: float | None = None
    budget_ms: float | None = None

    @property
    def slack_ms(self) -> float | None:
        """The budget a hold at the gateway may take a share of (None: none)."""
        return self.budget_ms if self.budget_ms is not None else self.slo_ttft_ms


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the directive asks for one request. ``reason`` None: admit."""

    reason: Reason | None = None
    retry_after_s: int = 0  # of a refusal; of an admission under a cut-off, the cut-off's
    cap_context_tokens: int | None = None
    fallback_model: str | None = None
    queue_timeout_ms: float | None = None  # admitted under a queue cut-off (priority >= 1)
    half_open_admitted: bool = False
    # a refusal's x-should-retry: False (do not retry: a retry over budget, or a refusal
    # whose retry would be); None: no header (the client's own rules)
    should_retry: bool | None = None
    # admitted under a first-token prediction: what it predicted (for its error)
    predicted_ttft_ms: float | None = None
    # held at the gateway for an admission token (rule 6): ask again with
    # Enforcement.resume(hold_ticket, ...) at recheck_at_ms (neither forward nor refuse)
    hold_ticket: int | None = None
    recheck_at_ms: float | None = None

    @property
    def held(self) -> bool:
        return self.hold_ticket is not None

    @property
    def status(self) -> int:
        """The HTTP status of a refusal (:data:`STATUS`); 0 when admitted."""
        return 0 if self.reason is None else STATUS[self.reason]

    def refusal_headers(self, level: int) -> list[tuple[str, str]]:
        """The headers of this refusal, the same at every gateway: ``retry-after``,
        ``x-tailguard-level`` and, for a retry over budget, ``x-should-retry: false``."""
        headers = [
            ("retry-after", str(max(0, int(self.retry_after_s)))),
            ("x-tailguard-level", str(int(level))),
        ]
        if self.should_retry is False:
            headers.append((SHOULD_RETRY_HEADER, "false"))
        return headers


ADMIT: Final = Verdict()


@dataclass(frozen=True, slots=True)
class Decision:
    """A verdict and whether it is acted on. ``act`` is what the gateway does: the
    verdict in ``enforce``, :data:`ADMIT` otherwise (``shadow`` only counts it)."""

    verdict: Verdict
    mode: Mode
    level: int = 0
    scope: str | None = None

    @property
    def act(self) -> Verdict:
        return self.verdict if self.mode == "enforce" else ADMIT

    @property
    def refused(self) -> bool:
        return self.mode == "enforce" and self.verdict.reason is not None

    @property
    def would_refuse(self) -> Reason | None:
        """The reason shadow would have refused this request for (None: it would not)."""
        return self.verdict.reason if self.mode == "shadow" else None


PASS_OFF: Final = Decision(ADMIT, "off")


# The retry budget's defaults (EmitterSettings' TAILGUARD_CONTROL_RETRY_BUDGET_RATIO and
# _MIN_RETRIES default to these; the simulator's gates use them too).
DEFAULT_RETRY_BUDGET_RATIO: Final = 0.2  # Envoy's retry_budget.budget_percent: 20 %
DEFAULT_RETRY_BUDGET_MIN_RETRIES: Final = 3  # Envoy's min_retry_concurrency: 3
RETRY_BUDGET_WINDOW_S: Final = 10  # the sliding window, in one-second slots
# A logical id is remembered this long (the SDKs honour a Retry-After up to 120 s) and at
# most this many per (gateway, scope), oldest forgotten first.
LOGICAL_ID_MEMORY_MS: Final = 130_000.0
MAX_LOGICAL_IDS: Final = 65_536
# Hold before refusal (rule 6): a held request asks again at least this often, waits at
# most this long whatever its budget, and at most this many are held per (gateway, scope).
HOLD_RECHECK_MS: Final = 100.0
HOLD_MAX_MS: Final = 3_000.0
MAX_HELD_PER_SCOPE: Final = 64
RETRY_AFTER_SPREAD: Final = 0.5  # a refusal's Retry-After is spread over [(1 - s)·R, R]
_GOLDEN: Final = 0.6180339887498949


@dataclass(frozen=True, slots=True)
class Modes:
    """A gateway's control settings. Which mode applies to a request: ``mode`` for every
    scope unless ``scopes`` names the model's own; in ``enforce``, priorities below
    ``enforce_from_priority`` are shadowed (0: all enforced). The retry budget: retries
    admitted per (gateway, scope) over the last :data:`RETRY_BUDGET_WINDOW_S` at most
    ``max(retry_budget_min_retries, retry_budget_ratio x first attempts)``. Built from
    flags or environment by :meth:`parse`."""

    mode: Mode = "enforce"
    enforce_from_priority: int = 0
    scopes: tuple[tuple[str, Mode], ...] = ()
    retry_budget_ratio: float = DEFAULT_RETRY_BUDGET_RATIO
    retry_budget_min_retries: int = DEFAULT_RETRY_BUDGET_MIN_RETRIES

    def __post_init__(self) -> None:
        for m in (self.mode, *(m for _, m in self.scopes)):
            if m not in MODES:
                raise ValueError(f"control mode must be one of {', '.join(MODES)}, got {m!r}")
        if not 0 <= self.enforce_from_priority < PRIORITIES:
            raise ValueError(
                f"enforce_from_priority must be 0..{PRIORITIES - 1}, "
                f"got {self.enforce_from_priority}"
            )
        ratio = self.retry_budget_ratio
        if not (isinstance(ratio, int | float) and math.isfinite(ratio) and 0.0 <= ratio <= 100.0):
            raise ValueError(f"retry_budget_ratio must be 0..100 (0.2 = 20 %), got {ratio!r}")
        floor = self.retry_budget_min_retries
        if isinstance(floor, bool) or not isinstance(floor, int) or floor < 0:
            raise ValueError(f"retry_budget_min_retries must be an integer >= 0, got {floor!r}")

    def of(self, model: str | None, priority: int) -> Mode:
        mode = self.mode
        if model is not None:
            for scope, m in self.scopes:
                if scope == model:
                    mode = m
                    break
        if mode == "enforce" and priority < self.enforce_from_priority:
            return "shadow"
        return mode

    @classmethod
    def parse(
        cls,
        mode: str,
        *,
        enforce_from_priority: int = 0,
        scopes: str | None = None,
        retry_budget_ratio: float = DEFAULT_RETRY_BUDGET_RATIO,
        retry_budget_min_retries: int = DEFAULT_RETRY_BUDGET_MIN_RETRIES,
    ) -> Modes:
        """``mode``: off|shadow|enforce; ``scopes``: ``"model-a=shadow,model-b=off"``."""
        pairs: list[tuple[str, Mode]] = []
        for raw in (scopes or "").split(","):
            part = raw.strip()
            if not part:
                continue
            name, sep, m = part.rpartition("=")
            if not sep or not name.strip():
                raise ValueError(f"per-scope control mode must be MODEL=MODE, got {part!r}")
            pairs.append((name.strip(), m.strip()))  # type: ignore[arg-type]  # checked
        return cls(
            mode.strip(),  # type: ignore[arg-type]  # checked
            enforce_from_priority,
            tuple(pairs),
            retry_budget_ratio,
            retry_budget_min_retries,
        )

    @classmethod
    def of_settings(cls, settings: EmitterSettings) -> Modes:
        """The gateway's modes from its ``TAILGUARD_CONTROL_*`` settings (a gateway's
        flags, or the LiteLLM hook's environment)."""
        return cls.parse(
            settings.control_mode,
            enforce_from_priority=settings.control_enforce_from_priority,
            scopes=settings.control_mode_scopes,
            retry_budget_ratio=settings.control_retry_budget_ratio,
            retry_budget_min_retries=settings.control_retry_budget_min_retries,
        )


def predicted_ttft_ms(actions: Any, queue_ms: float | None = None) -> float | None:
    """The first-token time a directive predicts for a request arriving now (None: it
    carries no prediction): the queue wait (``queue_ms``, what the gateway sees, else the
    directive's ``ttft_queue_ms``) plus ``ttft_service_ms``."""
    directive_queue = getattr(actions, "ttft_queue_ms", None)
    if directive_queue is None:
        return None
    wait = float(directive_queue) if queue_ms is None else queue_ms
    return wait + float(getattr(actions, "ttft_service_ms", None) or 0.0)


def late_by_ms(
    predicted_ms: float | None,
    slo_ttft_ms: float | None,
    margin: float | None,
    *,
    queue_ms: float | None = None,
    cutoff_ms: float | None = None,
) -> float | None:
    """How much later than its SLO a request is predicted to get its first token when
    that is beyond ``margin``, or how much longer than its queue cut-off it is predicted
    to wait when that is (``queue_ms`` over ``cutoff_ms``: it would be cut off); None:
    not late, nothing to compare, or no margin set."""
    if predicted_ms is None or slo_ttft_ms is None or margin is None:
        return None
    if predicted_ms > slo_ttft_ms * (1.0 + margin):
        return predicted_ms - slo_ttft_ms
    if queue_ms is not None and cutoff_ms is not None and queue_ms > cutoff_ms * (1.0 + margin):
        return queue_ms - cutoff_ms
    return None


def hash_admits(key: str, fraction: float) -> bool:
    """Deterministic: is ``key`` in the admitted ``fraction`` of the key space?"""
    h = int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "big")
    return h < fraction * 2.0**64


def spread_admits(k: int, fraction: float) -> bool:
    """Deterministic without keys: admit the ``k``-th candidate (0-based) when
    ``floor((k+1)*f) > floor(k*f)`` -- exactly ``floor(n*f)`` of ``n`` admitted."""
    return math.floor((k + 1) * fraction) > math.floor(k * fraction)


def unit_of(key: str) -> float:
    """A deterministic uniform draw in [0, 1) from ``key``."""
    h = int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "big")
    return h / 2.0**64


def spread_retry_after_s(retry_after_s: int, u: float) -> int:
    """``retry_after_s`` spread over its last half by ``u`` in [0, 1):
    ``max(1, ceil(R·(1 - RETRY_AFTER_SPREAD·u)))`` (0 stays 0), so never later than
    ``R`` and never "at once" unless ``R`` says so."""
    if retry_after_s <= 0:
        return 0
    return max(1, math.ceil(retry_after_s * (1.0 - RETRY_AFTER_SPREAD * u)))


FIRST: Final = 1  # RetryWindow slot fields: first attempts, retries, invitations
RETRY: Final = 2
INVITE: Final = 3


class RetryWindow:
    """One (gateway, scope)'s retry budget: first attempts, retries admitted through the
    budget and refusals that invited a retry, over the last :data:`RETRY_BUDGET_WINDOW_S`
    one-second slots, and the logical ids seen (a repeated one is a retry). Pure: time
    passed in."""

    __slots__ = ("_ids", "_slots")

    def __init__(self) -> None:
        # per slot: [second, first attempts, retries, invitations]
        self._slots = [[-1, 0, 0, 0] for _ in range(RETRY_BUDGET_WINDOW_S)]
        self._ids: OrderedDict[str, float] = OrderedDict()

    def counts(self, now_ms: float) -> tuple[int, int, int]:
        """(first attempts, retries, invitations) in the window ending at ``now_ms``."""
        sec = math.floor(now_ms / 1000.0)
        firsts = retries = invites = 0
        for slot_sec, f, r, i in self._slots:
            if sec - RETRY_BUDGET_WINDOW_S < slot_sec <= sec:
                firsts += f
                retries += r
                invites += i
        return firsts, retries, invites

    def add(self, now_ms: float, *, kind: int) -> None:
        sec = math.floor(now_ms / 1000.0)
        slot = self._slots[sec % RETRY_BUDGET_WINDOW_S]
        if slot[0] != sec:
            slot[0], slot[1], slot[2], slot[3] = sec, 0, 0, 0
        slot[kind] += 1

    def seen(self, logical_id: str, now_ms: float) -> bool:
        """Was ``logical_id`` seen in the last :data:`LOGICAL_ID_MEMORY_MS`? (Records it.)"""
        ids = self._ids
        last = ids.pop(logical_id, None)
        ids[logical_id] = now_ms
        while ids:
            oldest_id, oldest_ms = next(iter(ids.items()))
            if len(ids) <= MAX_LOGICAL_IDS and now_ms - oldest_ms <= LOGICAL_ID_MEMORY_MS:
                break
            del ids[oldest_id]
        return last is not None and now_ms - last <= LOGICAL_ID_MEMORY_MS


@dataclass(slots=True, eq=False)
class _Held:
    """A request held at the gateway for an admission token (rule 6)."""

    ticket: int
    scope: str
    priority: int
    until_ms: float
    request: RequestFacts
    granted: bool = False


def hold_ms(actions: Any, request: RequestFacts, priority: int) -> float:
    """How long a request refused by admission may wait at the gateway for a token:
    ``hold_fraction`` of its slack (:attr:`RequestFacts.slack_ms`), at most
    :data:`HOLD_MAX_MS`; 0: not at all (no fraction, no slack, priority 0)."""
    fraction = getattr(actions, "hold_fraction", None)
    slack = request.slack_ms
    if not fraction or slack is None or priority <= 0:
        return 0.0
    return max(0.0, min(HOLD_MAX_MS, float(fraction) * slack))


class HeldRequests:
    """One gateway's requests held for an admission token (rule 6), per scope in
    (priority, arrival) order, by ticket. Pure: time passed in."""

    __slots__ = ("_by_scope", "_k", "tickets")

    def __init__(self) -> None:
        self._by_scope: dict[str, list[_Held]] = {}
        self.tickets: dict[int, _Held] = {}
        self._k = 0

    def count(self, scope: str) -> int:
        return len(self._by_scope.get(scope, ()))

    def hold(self, scope: str, r: RequestFacts, priority: int, until_ms: float) -> _Held:
        """Hold ``r`` until ``until_ms`` at most: its place is behind its priority and
        every higher one."""
        self._k += 1
        h = _Held(self._k, scope, priority, until_ms, r)
        held = self._by_scope.setdefault(scope, [])
        i = len(held)
        while i > 0 and held[i - 1].priority > priority:
            i -= 1
        held.insert(i, h)
        self.tickets[h.ticket] = h
        return h

    def grant(
        self,
        scope: str,
        admission: PriorityAdmission,
        rate_rps: float,
        now_ms: float,
        *,
        above: int = PRIORITIES,
    ) -> None:
        """Tokens to the held requests of ``scope`` in order (priority, then arrival),
        each taken as a request asking again (its arrival counted once); the first that
        finds none stops it: none behind it may take a token it waits for. ``above``:
        only those of a higher priority than that (before a new arrival of it decides)."""
        for h in self._by_scope.get(scope, ()):
            if h.priority >= above:
                return
            if h.granted:
                continue
            if h.until_ms <= now_ms:
                continue  # its hold ran out: refused when it asks again
            if not admission.decide(h.priority, rate_rps, now_ms, 0, count=False).admitted:
                return
            h.granted = True

    def waiting_ahead(self, scope: str, priority: int, now_ms: float) -> bool:
        """Is a request of a higher priority than ``priority`` held in ``scope``, still
        waiting for a token?"""
        return any(
            not h.granted and h.priority < priority and h.until_ms > now_ms
            for h in self._by_scope.get(scope, ())
        )

    def release(self, h: _Held) -> None:
        self.tickets.pop(h.ticket, None)
        held = self._by_scope.get(h.scope)
        if held is not None and h in held:
            held.remove(h)


@dataclass
class Enforcement:
    """One gateway instance's enforcement; see the module docstring."""

    modes: Modes = field(default_factory=Modes)
    # (mode, model, priority, reason) -> requests refused (enforce) / would-have (shadow)
    refusals: Counter[tuple[Mode, str, int, Reason]] = field(default_factory=Counter)
    # admitted, half_open_admitted, capped, fallback: requests acted on (enforce only)
    applied: Counter[str] = field(default_factory=Counter)
    _admissions: dict[str, PriorityAdmission] = field(default_factory=dict)
    _buckets: dict[str, tuple[float, float]] = field(default_factory=dict)  # tokens, last ms
    _retries: dict[str, RetryWindow] = field(default_factory=dict)
    _spread_k: int = 0
    _jitter_k: int = 0
    _holds: HeldRequests = field(default_factory=HeldRequests)
    # the first bytes this gateway sees: rule 5's queue wait, the prediction's error
    queue: GatewayQueue = field(default_factory=GatewayQueue)

    def decide(
        self,
        directive: DirectiveLike | None,
        request: RequestFacts,
        now_ms: float,
        *,
        can_hold: bool = False,
    ) -> Decision:
        """What to do with ``request`` under ``directive`` (the effective one for its
        model, e.g. ``ControlClient.directive(model)``) at ``now_ms``; counted.
        ``can_hold``: the caller can wait (rule 6): a verdict may then be
        :attr:`Verdict.held`, to be asked again with :meth:`resume`."""
        priority = min(max(request.priority, 0), PRIORITIES - 1)
        mode = self.modes.of(request.model, priority)
        if mode == "off":
            return PASS_OFF
        if directive is None or directive.level <= 0:
            return Decision(ADMIT, mode)
        verdict = self._verdict(
            directive, request, priority, now_ms, can_hold=can_hold and mode == "enforce"
        )
        return self._counted(directive, request, priority, mode, verdict, now_ms=now_ms)

    def resume(
        self, directive: DirectiveLike | None, ticket: int, now_ms: float
    ) -> tuple[RequestFacts, Decision]:
        """A held request (``ticket``, from :attr:`Verdict.hold_ticket`) asks again at
        ``now_ms`` under the directive in force now: admitted once a token is its (held
        requests take tokens in priority order, then arrival: a held lower priority never
        takes one a higher priority waits for), refused (``admission``) once its hold
        ran out, else held again (a new :attr:`Verdict.recheck_at_ms`). Without a
        directive that admits by rate any more, it is admitted."""
        h = self._holds.tickets[ticket]
        r = h.request
        priority = h.priority
        mode = self.modes.of(r.model, priority)
        if directive is None or directive.level <= 0:
            self._holds.release(h)
            return r, self._counted(directive, r, priority, mode, ADMIT, now_ms=now_ms)
        a = directive.actions
        if a.admit_rps is None:
            self._holds.release(h)
            verdict = self._admitted(
                a,
                r,
                priority,
                self._unit(r),
                half_open=False,
                predicted=self._predicted_ms(a, r, now_ms),
            )
            return r, self._counted(directive, r, priority, mode, verdict, now_ms=now_ms)
        admission = self._admissions[h.scope]
        self._holds.grant(h.scope, admission, self._rate_rps(a), now_ms)
        if h.granted:
            self._holds.release(h)
            self.applied["held_admitted"] += 1
            verdict = self._admitted(
                a,
                r,
                priority,
                self._unit(r),
                half_open=False,
                predicted=self._predicted_ms(a, r, now_ms),
            )
        elif now_ms >= h.until_ms:
            self._holds.release(h)
            refusal = admission.refusal(priority, a.retry_after_s)
            verdict = Verdict(
                reason="admission",
                retry_after_s=spread_retry_after_s(refusal.retry_after_s, self._unit(r)),
            )
        else:
            recheck_ms = min(h.until_ms, now_ms + HOLD_RECHECK_MS)
            return r, Decision(
                Verdict(hold_ticket=ticket, recheck_at_ms=recheck_ms),
                mode,
                directive.level,
                directive.scope,
            )
        return r, self._counted(directive, r, priority, mode, verdict, now_ms=now_ms)

    def cancel(self, ticket: int) -> None:
        """A held request is gone (its client left): it waits for nothing any more."""
        h = self._holds.tickets.get(ticket)
        if h is not None:
            self._holds.release(h)

    @property
    def held_now(self) -> int:
        """Requests held at this gateway now."""
        return len(self._holds.tickets)

    def _counted(
        self,
        directive: DirectiveLike | None,
        request: RequestFacts,
        priority: int,
        mode: Mode,
        verdict: Verdict,
        *,
        now_ms: float,
    ) -> Decision:
        """The decision of ``verdict``, its refusal's invitation to retry settled, and
        counted."""
        if directive is None:
            return Decision(verdict, mode)
        if verdict.reason is not None and verdict.should_retry is None and priority > 0:
            scope = (
                directive.scope if directive.scope is not None else (request.model or ALL_SCOPES)
            )
            if not self._invite(scope, now_ms):
                verdict = replace(verdict, should_retry=False)
        decision = Decision(verdict, mode, directive.level, directive.scope)
        model = request.model or ALL_SCOPES
        if verdict.reason is not None:
            self.refusals[(mode, model, priority, verdict.reason)] += 1
        elif verdict.held:
            self.applied["held"] += 1
        elif mode == "enforce":
            self.applied["admitted"] += 1
            if verdict.half_open_admitted:
                self.applied["half_open_admitted"] += 1
            if verdict.cap_context_tokens is not None:
                self.applied["capped"] += 1
            if verdict.fallback_model is not None:
                self.applied["fallback"] += 1
        return decision

    def count_cutoff(self, decision: Decision, request: RequestFacts) -> None:
        """The gateway cut ``request`` off at its queue timeout (enforce), or in shadow
        saw no first byte within it: counted as ``queue_timeout``."""
        priority = min(max(request.priority, 0), PRIORITIES - 1)
        self.refusals[(decision.mode, request.model or ALL_SCOPES, priority, "queue_timeout")] += 1

    def later_cutoff(
        self, directive: DirectiveLike | None, request: RequestFacts
    ) -> tuple[float, int] | None:
        """A directive that came into force after ``request`` was admitted (with no
        cut-off): the queue cut-off it sets for the request's priority and the Retry-After
        of a cut, spread as every refusal's; None: none (priority 0 never)."""
        priority = min(max(request.priority, 0), PRIORITIES - 1)
        if directive is None or directive.level <= 0 or priority == 0:
            return None
        cutoff = directive.actions.queue_timeout_for(priority)
        if cutoff is None:
            return None
        return cutoff, spread_retry_after_s(
            int(directive.actions.retry_after_s), self._unit(request)
        )

    # -- the rules
    def _verdict(
        self, d: DirectiveLike, r: RequestFacts, priority: int, now_ms: float, *, can_hold: bool
    ) -> Verdict:
        a: _ActionsLike = d.actions
        scope = d.scope if d.scope is not None else (r.model or ALL_SCOPES)
        u = self._unit(r)
        if self._over_retry_budget(scope, r, priority, now_ms):
            return Verdict(
                reason="retry_budget",
                retry_after_s=spread_retry_after_s(a.retry_after_s, u),
                should_retry=False,
            )
        reason: Reason | None = None
        if a.shed_priorities_at_or_above is not None and priority >= a.shed_priorities_at_or_above:
            reason = "shed_priority"
        elif a.reject_new_sessions and priority > 0 and r.new_session:
            reason = "new_session"
        half_open = False
        if reason is not None and d.phase == "half_open" and a.admit_fraction:
            if r.request_key is not None:
                half_open = hash_admits(r.request_key, a.admit_fraction)
            else:
                half_open = spread_admits(self._spread_k, a.admit_fraction)
                self._spread_k += 1
            if half_open:
                reason = None
        retry_after_s = spread_retry_after_s(int(a.retry_after_s), u)
        if reason is not None:
            return Verdict(reason=reason, retry_after_s=retry_after_s)
        wait_ms = self._queue_wait_ms(a, r, now_ms)
        predicted = predicted_ttft_ms(a, wait_ms)
        late = late_by_ms(
            predicted,
            r.slo_ttft_ms,
            getattr(a, "deadline_margin", None),
            queue_ms=wait_ms,
            cutoff_ms=a.queue_timeout_for(priority),
        )
        if late is not None and priority > 0:  # refused at once rather than admitted to miss
            ceiling = max(1, int(a.retry_after_s))
            return Verdict(
                reason="deadline",
                retry_after_s=spread_retry_after_s(min(ceiling, max(1, math.ceil(late / 1000))), u),
            )
        if (
            a.rate_limit_rps is not None
            and not self._take_token(scope, a.rate_limit_rps, now_ms)
            and priority > 0  # priority 0 takes a token when there is one, never waits
        ):
            return Verdict(reason="rate_limit", retry_after_s=retry_after_s)
        if a.admit_rps is not None:
            admission = self._admissions.get(scope)
            if admission is None:
                admission = self._admissions[scope] = PriorityAdmission()
            tenant = r.tenant if getattr(a, "fair_share", False) else None
            weights = getattr(a, "tenant_weights", None)
            holds = self._holds
            holds.grant(scope, admission, self._rate_rps(a), now_ms, above=priority)
            if holds.waiting_ahead(scope, priority, now_ms):  # held ones of its priority or higher
                admission.arrive(priority, self._rate_rps(a), now_ms, tenant=tenant)
                admit = admission.refusal(priority, a.retry_after_s)
            else:
                admit = admission.decide(
                    priority,
                    self._rate_rps(a),
                    now_ms,
                    a.retry_after_s,
                    tenant=tenant,
                    weights=weights,
                )
            if not admit.admitted:
                wait_ms = hold_ms(a, r, priority) if can_hold and tenant is None else 0.0
                if wait_ms > 0.0 and holds.count(scope) < MAX_HELD_PER_SCOPE:
                    h = holds.hold(scope, r, priority, now_ms + wait_ms)
                    recheck_ms = min(h.until_ms, now_ms + HOLD_RECHECK_MS)
                    return Verdict(hold_ticket=h.ticket, recheck_at_ms=recheck_ms)
                return Verdict(
                    reason="admission", retry_after_s=spread_retry_after_s(admit.retry_after_s, u)
                )
        return self._admitted(a, r, priority, u, half_open=half_open, predicted=predicted)

    def _admitted(
        self,
        a: _ActionsLike,
        r: RequestFacts,
        priority: int,
        u: float,
        *,
        half_open: bool,
        predicted: float | None,
    ) -> Verdict:
        """An admitted request's verdict: its context cap, fallback, queue cut-off (with
        the Retry-After of a cut, spread by ``u``) and first-token prediction."""
        retry_after_s = spread_retry_after_s(int(a.retry_after_s), u)
        cap = a.cap_context_tokens
        if cap is not None and r.prompt_tokens is not None and r.prompt_tokens <= cap:
            cap = None  # shorter already: nothing to cap
        cutoff = a.queue_timeout_for(priority)
        if (
            cutoff is None
            and cap is None
            and a.fallback_model is None
            and not half_open
            and predicted is None
        ):
            return ADMIT
        return Verdict(
            retry_after_s=retry_after_s if cutoff is not None else 0,
            cap_context_tokens=cap,
            fallback_model=a.fallback_model,
            queue_timeout_ms=cutoff,
            half_open_admitted=half_open,
            predicted_ttft_ms=predicted,
        )

    def _queue_wait_ms(self, a: _ActionsLike, r: RequestFacts, now_ms: float) -> float | None:
        """Rule 5's queue wait: what this gateway sees now, else the directive's (None:
        the directive predicts nothing)."""
        directive_ms = getattr(a, "ttft_queue_ms", None)
        if directive_ms is None:
            return None
        seen_ms = self.queue.wait_ms(r.model, now_ms)
        return float(directive_ms) if seen_ms is None else seen_ms

    def _predicted_ms(self, a: _ActionsLike, r: RequestFacts, now_ms: float) -> float | None:
        return predicted_ttft_ms(a, self._queue_wait_ms(a, r, now_ms))

    @staticmethod
    def _rate_rps(a: _ActionsLike) -> float:
        """This gateway's share of the scope's admitted rate."""
        return float(a.admit_rps or 0.0) / (a.admit_gateways or 1)

    def _unit(self, r: RequestFacts) -> float:
        """The request's draw for spreading its Retry-After: from its key (the same key,
        the same answer), else the next of a golden-ratio sequence (evenly spread)."""
        key = r.request_key or r.logical_id
        if key is not None:
            return unit_of("retry-after:" + key)
        self._jitter_k += 1
        return (self._jitter_k * _GOLDEN) % 1.0

    def _over_retry_budget(self, scope: str, r: RequestFacts, priority: int, now_ms: float) -> bool:
        """Count the request in its scope's retry budget; True: a retry over it (never
        priority 0). A retry: ``attempt > 0`` or a logical id seen lately."""
        window = self._retries.get(scope)
        if window is None:
            window = self._retries[scope] = RetryWindow()
        retry = r.attempt > 0
        if r.logical_id is not None:
            retry = window.seen(r.logical_id, now_ms) or retry
        if retry and priority > 0:
            firsts, retries, _invites = window.counts(now_ms)
            if retries >= self._allowed_retries(firsts):
                return True
        window.add(now_ms, kind=RETRY if retry else FIRST)
        return False

    def _allowed_retries(self, firsts: int) -> float:
        return max(
            float(self.modes.retry_budget_min_retries), self.modes.retry_budget_ratio * firsts
        )

    def _invite(self, scope: str, now_ms: float) -> bool:
        """May this refusal invite a retry? Yes (counted) while the window's invitations
        are under the retry budget's allowance; no once its retry would come over it."""
        window = self._retries[scope]  # made by _over_retry_budget for every request
        firsts, _retries, invites = window.counts(now_ms)
        if invites >= self._allowed_retries(firsts):
            return False
        window.add(now_ms, kind=INVITE)
        return True

    def _take_token(self, scope: str, rps: float, now_ms: float) -> bool:
        burst = max(1.0, rps)
        tokens, last = self._buckets.get(scope, (burst, now_ms))
        tokens = min(burst, tokens + max(0.0, now_ms - last) / 1000.0 * rps)
        if tokens >= 1.0:
            self._buckets[scope] = (tokens - 1.0, now_ms)
            return True
        self._buckets[scope] = (tokens, now_ms)
        return False
