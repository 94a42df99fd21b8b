"""The simulator's internal state and its output: requests, engines, the event heap and
the clock (:class:`SimCore`); the gateway and engine behaviour build on it
(:mod:`producers.simulator.gateways`, :mod:`producers.simulator.engines`)."""

from __future__ import annotations

import hashlib
import heapq
import math
import random
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

from pipeline.contract.events import Event, GatewayCompleted, Outcome
from producers.gateway_queue import Forwarded
from producers.simulator.config import ModelConfig, SimConfig
from producers.simulator.gate import Completion, GatewayGate

_NS_PER_MS: Final = 1_000_000
_ROUND_MS: Final = 6  # durations are reported to the nanosecond

# ---------------------------------------------------------------------------
# Internal state
# ---------------------------------------------------------------------------

_PENDING: Final = 0  # between gateway and engine
_WAITING: Final = 1
_RUNNING: Final = 2
_DONE: Final = 3

# Happenings at the same instant run in this order.
_K_ARRIVE: Final = 0  # request reaches an engine
_K_WAKE: Final = 1  # engine iteration boundary
_K_PATIENCE: Final = 2  # client patience deadline
_K_QUEUE_TIMEOUT: Final = 3
_K_STATS: Final = 4
_K_RETRY: Final = 5  # a client retries a request the gateway rejected (closed loop)
_K_RESTART: Final = 6  # an engine restarts: weights load (cold start)
_K_READY: Final = 7  # the restarted engine admits again
_K_CUTOFF: Final = 8  # a directive's queue cut-off: still waiting -> 503, the client retries
_K_HOLD: Final = 9  # a request held at the gateway for an admission token asks again


@dataclass(slots=True, eq=False)
class _Req:
    request_id: str
    t_gateway_ms: float  # gateway arrival
    model_idx: int
    gateway: str
    prompt_tokens: int
    cached_tokens: int
    gen_tokens: int  # tokens the engine will generate if left alone
    stop_after: int  # client stops the stream after this many tokens (0 = never)
    priority: int
    tenant: str
    stream: bool
    pre_ms: float
    post_ms: float
    patience_ms: float | None
    state: int = _PENDING
    engine: int = -1
    t_engine_ms: float = 0.0
    t_sched_ms: float = 0.0
    t_first_ms: float = -1.0
    admit_iter: int = 0
    attempt: int = 0  # 0 = first try; k = k-th retry after a 429
    session: str = ""  # the first try's request id ("" = this request's own)
    gate_model: str = ""  # the model a gate admitted it for ("" = no gate admitted it)
    cutoff_ms: float | None = None  # a directive's queue cut-off for it (None: none)
    cutoff_retry_after_s: int = 0
    hold_ticket: int | None = None  # held at the gateway for an admission token
    # the gate's (mode, reason) for it, as gateway.completed's control fields (None: off)
    control: tuple[str, str | None] | None = None
    slo_ttft_ms: float | None = None  # its own first-token SLO (x-llm-d-slo-ttft-ms)
    # forwarded by a gateway that counts it in the queue it sees (producers.gateway_queue)
    forwarded: Forwarded | None = None


@dataclass(slots=True, eq=False)
class _Engine:
    host: str
    model: ModelConfig
    skew_ms: float
    # Waiting requests, FIFO per queue: one queue (fcfs) or one per priority level
    # (priority scheduling, admitted lowest level first). Entries no longer waiting
    # (aborted, timed out) are skipped when they reach the head.
    queues: tuple[deque[_Req], ...] = ()
    waiting_live: int = 0
    running: int = 0
    running_prompt_tokens: int = 0
    running_admit_iter_sum: int = 0
    finish_heap: list[tuple[int, int, _Req]] = field(default_factory=list)
    iter_idx: int = 0  # index of the next iteration to start (iterations before are done)
    active: bool = False  # a segment of iterations is in progress
    seg_start_ms: float = 0.0
    seg_iter: int = 0  # index of the segment's first iteration
    seg_first_ms: float = 0.0  # its length (includes prefill)
    seg_step_ms: float = 0.0  # length of the segment's later iterations
    wake_iter: int = -1  # boundary index of the scheduled wake; -1 none
    wake_version: int = 0
    hit_cached: float = 0.0  # decayed prefix-cache sums
    hit_prompt: float = 0.0
    last_change_ms: float = 0.0
    busy_ms: float = 0.0
    running_area: float = 0.0  # integral of running over time (seq * ms)
    restart_ms: float = -1.0  # last restart (true time); -1 never restarted
    ready_ms: float = -1.0  # admissions resume (restart + load)

    def boundary_ms(self, j: int) -> float:
        """End time of iteration j-1 = start time of iteration j (j > seg_iter)."""
        return self.seg_start_ms + self.seg_first_ms + (j - self.seg_iter - 1) * self.seg_step_ms

    def iterations_done(self, t_ms: float) -> int:
        """Iterations completed by time t (within the current segment)."""
        if not self.active:
            return self.iter_idx
        first_end = self.seg_start_ms + self.seg_first_ms
        if t_ms < first_end:
            return self.seg_iter
        return self.seg_iter + 1 + int((t_ms - first_end) // self.seg_step_ms)

    def next_boundary(self, t_ms: float) -> int:
        """Index of the first iteration boundary at or after t that is still to come."""
        first_end = self.seg_start_ms + self.seg_first_ms
        if t_ms <= first_end:
            return self.seg_iter + 1
        j = self.seg_iter + 1 + math.ceil((t_ms - first_end) / self.seg_step_ms)
        while self.boundary_ms(j) < t_ms:  # float rounding
            j += 1
        return j

    def account(self, now_ms: float) -> None:
        dt = now_ms - self.last_change_ms
        if dt > 0:
            if self.running > 0:
                self.busy_ms += dt
            self.running_area += self.running * dt
        self.last_change_ms = now_ms


def sdk_retry_delay_ms(
    cfg: SimConfig,
    *,
    retries_taken: int,
    http_status: int,
    retry_after_s: float | None,
    should_retry: bool | None,
    u: float,
) -> float | None:
    """When the OpenAI Python SDK 2.x retries a failed attempt (None: it does not), as
    ``SyncAPIClient.request`` / ``_should_retry`` / ``_calculate_retry_timeout`` do:

    * no retry once ``retries_taken >= max_retries`` (``client_max_retries``, 2);
    * no retry when ``Retry-After`` exceeds 120 s (``client_max_retry_after_ms``);
    * ``x-should-retry``: ``false`` -> no retry, ``true`` -> retry whatever the status;
    * otherwise retry 408, 409, 429 and >= 500 only;
    * the wait: ``Retry-After`` when 0 < it <= 120 s, else
      ``min(0.5 s · 2^retries_taken, 8 s) · (1 - 0.25·u)`` (``u``: the SDK's ``random()``).
    """
    if retries_taken >= cfg.client_max_retries:
        return None
    retry_after_ms = None if retry_after_s is None else retry_after_s * 1000.0
    if retry_after_ms is not None and retry_after_ms > cfg.client_max_retry_after_ms:
        return None
    if should_retry is False:
        return None
    if should_retry is None and http_status not in (408, 409, 429) and http_status < 500:
        return None
    if retry_after_ms is not None and 0.0 < retry_after_ms <= cfg.client_max_retry_after_ms:
        return retry_after_ms
    backoff_ms = min(
        cfg.client_backoff_ms * 2.0 ** min(retries_taken, 1000), cfg.client_max_backoff_ms
    )
    return max(0.0, backoff_ms * (1.0 - 0.25 * u))


def _unit_hash(key: str) -> float:
    """A deterministic number in [0, 1) from a string."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") / 2.0**64


def _verdict_of(req: _Req, http_status: int) -> str | None:
    """The control verdict recorded for ``req``: the gate's, or ``queue_timeout`` when an
    enforced cut-off answered it (its 503)."""
    if req.control is None:
        return None
    mode, reason = req.control
    if reason is None and mode == "enforce" and http_status == 503:
        return "queue_timeout"
    return reason


def _r(ms: float) -> float:
    """Round a duration for the wire and clamp float noise below zero."""
    return max(0.0, round(ms, _ROUND_MS))


class SimCore:
    """The state of one run, its clocks, its output and the end of a request."""

    def __init__(self, config: SimConfig, gate: GatewayGate | None = None) -> None:
        self._cfg = config
        self._gate = gate  # closed loop: gateways apply control directives
        self._model_idx = {m.name: i for i, m in enumerate(config.models)}
        self.retries = 0
        self.cutoffs = 0  # requests a directive's queue cut-off cancelled (503)
        self._rng = random.Random(config.seed)
        skew_rng = random.Random(f"tailguard-sim-skew:{config.seed}")
        overrides = dict(config.engine_skew_ms)
        self._by_priority = config.scheduling == "priority"
        n_queues = len(config.priority_weights) if self._by_priority else 1
        self._engines: list[_Engine] = []
        self._engines_of_model: list[list[int]] = []
        for model in config.models:
            ids: list[int] = []
            for i in range(model.engines):
                host = f"{model.name}-{i}"
                drawn = skew_rng.uniform(-config.engine_skew_max_ms, config.engine_skew_max_ms)
                skew = round(overrides.get(host, drawn), 3)
                ids.append(len(self._engines))
                queues = tuple(deque[_Req]() for _ in range(n_queues))
                self._engines.append(_Engine(host=host, model=model, skew_ms=skew, queues=queues))
            self._engines_of_model.append(ids)
        self._rr = [0] * len(config.models)
        self._min_skew_ms = min(0.0, *(e.skew_ms for e in self._engines))
        if config.start_unix_ns + math.floor(self._min_skew_ms * _NS_PER_MS) <= 0:
            raise ValueError("SimConfig.start_unix_ns is too small for the engine clock skews")
        self._heap: list[tuple[float, int, int, object, int]] = []
        self._order = 0
        # first bytes of forwarded requests the gateways count (producers.gateway_queue)
        self._first_bytes: list[tuple[float, int, _Req]] = []
        self._first_byte_order = 0
        self._out: list[tuple[int, int, Event]] = []
        self._out_order = 0
        self._open_requests = 0
        self._now_ms = 0.0
        self._counts: dict[str, int] = {
            "gateway.received": 0,
            "gateway.completed": 0,
            "engine.finished": 0,
            "engine.stats": 0,
        }
        self._ok = 0
        self._aborts = 0
        self._rejected = 0
        self._stats_seq = 0
        self._started = False

    # -- clocks and output --------------------------------------------------

    def _wall_ns(self, t_ms: float, skew_ms: float = 0.0) -> int:
        return self._cfg.start_unix_ns + round((t_ms + skew_ms) * _NS_PER_MS)

    def _watermark_ns(self) -> int:
        # Anything created from now on is stamped at or after this.
        return self._wall_ns(self._now_ms, self._min_skew_ms)

    def _emit(self, event: Event) -> None:
        self._counts[event.kind] += 1
        heapq.heappush(self._out, (event.ts_unix_ns, self._out_order, event))
        self._out_order += 1

    def _release(self, upto_ns: int | None) -> Iterator[Event]:
        out = self._out
        while out and (upto_ns is None or out[0][0] <= upto_ns):
            yield heapq.heappop(out)[2]

    def _first_byte_at(self, t_ms: float, req: _Req) -> None:
        """``req``'s first byte reaches its gateway at ``t_ms``: told to the gate before
        its gateway's next decision (:meth:`_first_bytes_until`), not as an event of its
        own, so that a run's other events are released as without it."""
        heapq.heappush(self._first_bytes, (t_ms, self._first_byte_order, req))
        self._first_byte_order += 1

    def _first_bytes_until(self, t_ms: float) -> None:
        """Tell the gate the first bytes that reached their gateways by ``t_ms``."""
        pending = self._first_bytes
        while pending and pending[0][0] <= t_ms:
            at_ms, _k, req = heapq.heappop(pending)
            self._answer(req, at_ms)

    def _answer(self, req: _Req, first_byte_ms: float | None) -> None:
        if req.forwarded is not None and self._gate is not None:
            self._gate.answered(req.gateway, req.forwarded, first_byte_ms)

    def _push(self, t_ms: float, kind: int, payload: object, version: int = 0) -> None:
        heapq.heappush(self._heap, (t_ms, kind, self._order, payload, version))
        self._order += 1

    def _advance(self, t_ms: float) -> None:
        if t_ms < self._now_ms:  # pragma: no cover - an invariant of the event loop
            raise AssertionError(f"time went backwards: {t_ms} < {self._now_ms}")
        self._now_ms = t_ms

    def _complete(
        self,
        req: _Req,
        t_done_ms: float,
        *,
        outcome: Outcome,
        http_status: int,
        ttfb_ms: float | None,
        output_tokens: int,
    ) -> None:
        """Emit gateway.completed at gateway time t_done_ms and close the request."""
        req.state = _DONE
        if req.forwarded is not None:
            if req.t_first_ms < 0:  # no first token: it waits no more
                self._answer(req, None)
            elif not req.stream:  # its first byte is its whole answer
                self._first_byte_at(t_done_ms, req)
        self._open_requests -= 1
        if outcome == "ok":
            self._ok += 1
        elif outcome == "client_abort":
            self._aborts += 1
        else:
            self._rejected += 1
        total = _r(t_done_ms - req.t_gateway_ms)
        ttfb = None if ttfb_ms is None else min(total, _r(ttfb_ms))
        self._emit(
            GatewayCompleted(
                v=1,
                event_id=f"{req.request_id}:gateway.completed",
                ts_unix_ns=self._wall_ns(t_done_ms),
                host=req.gateway,
                model=self._cfg.models[req.model_idx].name,
                request_id=req.request_id,
                kind="gateway.completed",
                total_ms=total,
                ttfb_ms=ttfb,
                http_status=http_status,
                outcome=outcome,
                output_tokens=output_tokens,
                control_mode=None if req.control is None else req.control[0],  # type: ignore[arg-type]
                control_verdict=_verdict_of(req, http_status),  # type: ignore[arg-type]
                slo_ttft_ms=req.slo_ttft_ms,
            )
        )
        if req.gate_model and self._gate is not None:
            self._gate.on_complete(
                Completion(
                    model=req.gate_model,
                    gateway=req.gateway,
                    priority=req.priority,
                    request_id=req.request_id,
                    t_ms=t_done_ms,
                    ttfb_ms=ttfb,
                    total_ms=total,
                    outcome=outcome,
                )
            )
