"""Pure discrete-event model of LLM gateways in front of vLLM-like engines.

Given a trace (:class:`~producers.simulator.trace.TraceRequest`) and a
:class:`SimConfig`, :func:`simulate` yields exactly the v1 events that real
gateways and engines would emit, in non-decreasing ``ts_unix_ns`` order.

The model
---------
* **Time.** The simulation runs on one true clock in float milliseconds
  (trace offset 0 = ``SimConfig.start_unix_ns``). Gateways stamp wall-clock
  times from the true clock; every engine's wall clock is off by a fixed skew
  (``engine_skew_max_ms`` / ``engine_skew_ms``). Durations are differences of
  true times taken on one host (gateway durations between gateway instants,
  engine durations between engine instants), so skew only moves ``*_unix_ns``
  stamps, as on real hosts with a synchronised-but-imperfect NTP.
* **Arrivals.** Trace offsets are divided by ``rate_scale``. Requests inside
  an overload episode (:class:`OverloadEpisode`) are replicated: ``step``
  sends each ``factor`` times, the replicas up to ``jitter_ms`` later;
  ``ramp`` raises the factor linearly from 1 at the episode's start to
  ``factor`` at its end (a fractional factor sends the extra copy with that
  probability); ``burst`` is a step whose replicas arrive at the same instant
  as the original (a thundering herd).
  Each request draws a model (by weight), tenant, priority, stream flag,
  gateway host, gateway overheads, client patience, an optional mid-stream
  stop and a prefix-cache hit from one ``random.Random(seed)``.
* **Gateway.** ``gateway.received`` at arrival; after ``pre`` ms the request
  reaches the least-loaded engine of its model (running + waiting, ties
  round-robin). The response leaves the gateway ``post`` ms after the engine
  produced it: ``total_ms = pre + engine e2e + post``.
* **Engine (continuous batching).** An engine runs iterations. At each
  iteration start it admits waiting requests while fewer than
  ``max_concurrency`` run, in the order of ``SimConfig.scheduling``:
  ``"fcfs"`` (default) by arrival at the engine; ``"priority"`` as vLLM's
  ``--scheduling-policy priority``, by (priority, arrival at the engine), lower
  priority number first (one FIFO queue per priority level). Running requests
  are never preempted. An iteration lasts
  ``decode_base_ms + decode_ms_per_seq * running + prefill_ms_per_token *
  (uncached prompt tokens admitted in it)``. An admitted request gets its first
  token at the end of its admission iteration and one token per iteration
  after that; it finishes when it has ``min(GeneratedTokens, max_output_tokens)``
  tokens (at least 1). An idle engine starts an iteration when a request
  arrives. Between changes of the running set all iterations have the same
  length, so the engine jumps straight to the next iteration boundary at
  which something happens (a finish, an admission, an abort): cost is per
  request, not per iteration or per running sequence.
* **Clients.** A client waits up to its patience (log-normal) for the first
  byte (the first token of a stream, the whole body otherwise) and then
  disconnects: ``gateway.completed`` with ``outcome="client_abort"``,
  ``http_status=0``; the engine drops the request and reports nothing (vLLM
  does not report aborts). A small share of stream clients stop a stream
  midway (after a uniform share of its tokens) the same way.
* **Queue timeout.** With ``max_queue_ms`` set, a request still waiting in an
  engine queue after that long is cancelled and the gateway answers 503
  (``outcome="rejected"``).
* **Engine restarts (cold starts).** ``engine_restarts`` lists (engine host, trace
  offset ms). At a restart the engine stops admitting for ``cold_start_load_ms``
  (weights load, ~8 s in the source documents); requests already running finish
  (a drained restart), requests routed to it meanwhile wait in its queue. A request
  that engine serves after the restart and that reached it before the load ended
  plus ``cold_start_window_ms`` (its first seconds) is marked: its
  ``engine.finished`` carries ``cold_start_unix_ns`` = the restart time on the
  engine's clock. One cold start per restart.
* **Logical requests.** A client's retry is a new request (``<first id>-r<k>``) whose
  ``gateway.received`` carries ``client_attempt`` k and ``logical_request_id`` = the first
  try's request id, as a gateway records a retry that reused its X-Request-Id
  (:func:`producers.client_retry.logical_request_id`); a first try carries attempt 0 and
  no logical id (its request id is its logical request's key).
* **Gates (closed loop).** With a :class:`~producers.simulator.gate.GatewayGate`
  the gateway asks ``gate.decide(...)`` per arriving request (429 + Retry-After,
  context cap, fallback model) and calls ``gate.on_complete(...)`` once for
  every request the gate admitted, when its ``gateway.completed`` is emitted
  (ok, client abort or queue-timeout 503). The hook runs when the simulator
  emits the event, which may be up to the gateway's ``post`` ms before its
  ``t_ms``; it never changes the events of a run by itself.
* **Clients' retries (closed loop).** A client refused by a gate (429, or the queue
  cut-off's 503) retries as the OpenAI Python SDK 2.x does (modelled on openai 2.54.0,
  ``_base_client.py`` and ``_constants.py``; :func:`sdk_retry_delay_ms`): at most 2
  retries; none when ``x-should-retry: false`` (the retry budget's refusal) or when
  ``Retry-After`` exceeds 120 s; after ``Retry-After`` when 0 < it <= 120 s, else after
  ``min(0.5 s · 2^n, 8 s) · (1 - 0.25 U)`` (n: retries taken). Each retry is a new
  request (``<first id>-r<n>``) that carries its retry count (the SDK's
  ``x-stainless-retry-count``) to the gate. ``U`` is drawn from the request id, not the
  run's generator: a run stays deterministic per seed.
* **Tenants and per-request SLOs (issue 52).** ``tenant_floods``: a tenant's requests
  at one priority inside a window are sent ``factor`` times (copies within a second);
  ``slo_ttft_mix``: each stream carries a first-token SLO (``x-llm-d-slo-ttft-ms``)
  drawn from the mix. Both are drawn from request ids, not the run's generator, so a
  run without them is what it was; the gate passes the tenant and the SLO to the
  enforcement, and ``gateway.completed`` records the SLO.
* **Engine stats.** Every ``stats_interval_ms`` each engine reports running
  and waiting counts, KV-cache usage (prompt + generated tokens of running
  sequences over ``kv_capacity_tokens``, capped at 1), a decayed prefix-cache
  hit rate and a GPU-memory fraction (static share + KV share).

Everything here is pure: no I/O, no wall clock, randomness only from
generators seeded by ``SimConfig.seed``. The same trace and config always
give the same events.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Iterator, Sequence

from pipeline.contract.events import Event
from producers.simulator.config import (
    DEFAULT_MODELS,
    DEFAULT_TENANTS,
    EPISODE_SHAPES,
    SCHEDULING_POLICIES,
    EpisodeShape,
    ModelConfig,
    OverloadEpisode,
    Scheduling,
    SimConfig,
    SimSummary,
    TenantFlood,
    engine_hosts,
)
from producers.simulator.gate import GatewayGate
from producers.simulator.gateways import GatewayLoop
from producers.simulator.state import (
    _K_ARRIVE,
    _K_CUTOFF,
    _K_HOLD,
    _K_PATIENCE,
    _K_READY,
    _K_RESTART,
    _K_RETRY,
    _K_STATS,
    _K_WAKE,
    _Engine,
    _Req,
    _unit_hash,
    sdk_retry_delay_ms,
)
from producers.simulator.trace import TraceRequest

__all__ = [
    "DEFAULT_MODELS",
    "DEFAULT_TENANTS",
    "EPISODE_SHAPES",
    "SCHEDULING_POLICIES",
    "EpisodeShape",
    "ModelConfig",
    "OverloadEpisode",
    "Scheduling",
    "SimConfig",
    "SimSummary",
    "Simulator",
    "TenantFlood",
    "engine_hosts",
    "sdk_retry_delay_ms",
    "simulate",
]


class Simulator(GatewayLoop):
    """One simulation run; iterate :meth:`events` once. :attr:`summary` is live."""

    def __init__(
        self, trace: Sequence[TraceRequest], config: SimConfig, gate: GatewayGate | None = None
    ) -> None:
        super().__init__(config, gate)
        self._arrivals = self._build_arrivals(trace)

    # -- public -------------------------------------------------------------

    @property
    def engine_skew_ms(self) -> dict[str, float]:
        """Each engine host's wall-clock skew (engine clock - true clock), ms."""
        return {e.host: e.skew_ms for e in self._engines}

    @property
    def summary(self) -> SimSummary:
        end = self._now_ms
        busy: dict[str, float] = {}
        mean_running: dict[str, float] = {}
        for e in self._engines:
            busy[e.host] = e.busy_ms / end if end > 0 else 0.0
            mean_running[e.host] = e.running_area / end if end > 0 else 0.0
        return SimSummary(
            requests=len(self._arrivals),
            ok=self._ok,
            client_aborts=self._aborts,
            rejected=self._rejected,
            events_by_kind=dict(self._counts),
            sim_end_ms=end,
            engine_skew_ms=self.engine_skew_ms,
            engine_busy_fraction=busy,
            engine_mean_running=mean_running,
        )

    def events(self) -> Iterator[Event]:
        """Run the simulation, yielding events in non-decreasing ``ts_unix_ns`` order."""
        if self._started:
            raise RuntimeError("a Simulator runs once; create a new one")
        self._started = True
        arrivals = self._arrivals
        n = len(arrivals)
        if n == 0:
            return
        self._open_requests = n
        self._push(0.0, _K_STATS, None)
        by_host = {e.host: e for e in self._engines}
        for host, at_ms in self._cfg.engine_restarts:
            self._push(at_ms, _K_RESTART, by_host[host])
        i = 0
        heap = self._heap
        while self._open_requests > 0:
            if i < n and (not heap or arrivals[i].t_gateway_ms <= heap[0][0]):
                req = arrivals[i]
                i += 1
                self._advance(req.t_gateway_ms)
                self._on_gateway_arrival(req)
            else:
                t, kind, _order, payload, version = heapq.heappop(heap)
                self._advance(t)
                self._dispatch(kind, payload, version)
            yield from self._release(self._watermark_ns())
        # What is left in the heap are no-ops (stale wakes, deadlines of finished requests).
        for e in self._engines:
            e.account(self._now_ms)
        yield from self._release(None)

    # -- setup --------------------------------------------------------------

    def _build_arrivals(self, trace: Sequence[TraceRequest]) -> list[_Req]:
        cfg = self._cfg
        rng = self._rng
        episode = cfg.overload
        raw: list[tuple[float, str, TraceRequest]] = []
        for idx, tr in enumerate(trace):
            t = tr.arrival_offset_ms / cfg.rate_scale
            rid = f"{cfg.request_id_prefix}{idx:09d}"
            raw.append((t, rid, tr))
            if episode is not None and episode.contains(t):
                factor = episode.factor_at(t)
                jitter = episode.replica_jitter_ms
                copies = int(factor) - 1
                if rng.random() < factor - int(factor):
                    copies += 1
                for r in range(1, copies + 1):
                    raw.append((t + rng.uniform(0.0, jitter), f"{rid}-x{r}", tr))
        raw.sort(key=lambda x: x[0])  # stable
        model_w = [m.weight for m in cfg.models]
        model_ids = list(range(len(cfg.models)))
        tenant_names = [t for t, _ in cfg.tenants]
        tenant_w = [w for _, w in cfg.tenants]
        prios = [0, 1, 2, 3]
        prio_w = list(cfg.priority_weights)
        out: list[_Req] = []
        for t, rid, tr in raw:
            model_idx = rng.choices(model_ids, model_w)[0]
            prompt = tr.context_tokens
            gen = max(1, min(tr.generated_tokens, cfg.max_output_tokens))
            cached = 0
            if prompt > 1 and rng.random() < cfg.prefix_hit_fraction:
                share = rng.uniform(*cfg.prefix_cached_share)
                blocks = int(prompt * share) // cfg.kv_block_tokens
                # the last prompt token is always computed
                max_blocks = (prompt - 1) // cfg.kv_block_tokens
                cached = min(blocks, max_blocks) * cfg.kv_block_tokens
            stream = rng.random() < cfg.stream_fraction
            stop_after = 0
            if stream and gen > 1 and rng.random() < cfg.stream_stop_fraction:
                stop_after = max(1, math.ceil(rng.random() * (gen - 1)))
            patience: float | None = None
            if cfg.patience_median_ms is not None:
                drawn = rng.lognormvariate(math.log(cfg.patience_median_ms), cfg.patience_sigma)
                patience = max(cfg.patience_min_ms, drawn)
            out.append(
                _Req(
                    request_id=rid,
                    t_gateway_ms=t,
                    model_idx=model_idx,
                    gateway=rng.choice(cfg.gateway_hosts),
                    prompt_tokens=prompt,
                    cached_tokens=cached,
                    gen_tokens=gen,
                    stop_after=stop_after,
                    priority=rng.choices(prios, prio_w)[0],
                    tenant=rng.choices(tenant_names, tenant_w)[0],
                    stream=stream,
                    pre_ms=rng.uniform(*cfg.gateway_pre_ms),
                    post_ms=rng.uniform(*cfg.gateway_post_ms),
                    patience_ms=patience,
                )
            )
        return self._own_arrivals(out)

    def _own_arrivals(self, out: list[_Req]) -> list[_Req]:
        """Each request's own first-token SLO (``slo_ttft_mix``) and the tenants'
        floods (``tenant_floods``), both drawn from request ids (no draw from the run's
        generator: without them the run is what it was)."""
        cfg = self._cfg
        if cfg.slo_ttft_mix:  # a first-token SLO is a stream's (a body has no first token)
            total = sum(w for _, w in cfg.slo_ttft_mix)
            for req in (r for r in out if r.stream):
                u = _unit_hash(f"slo:{req.request_id}") * total
                pick = cfg.slo_ttft_mix[-1][0]
                for ms, w in cfg.slo_ttft_mix:
                    if u < w:
                        pick = ms
                        break
                    u -= w
                req.slo_ttft_ms = pick
        if not cfg.tenant_floods:
            return out
        flooded: list[_Req] = []
        for req in out:
            flooded.append(req)
            for flood in cfg.tenant_floods:
                u = _unit_hash(f"flood:{req.request_id}")
                for k in range(1, flood.copies(req.tenant, req.priority, req.t_gateway_ms, u) + 1):
                    rid = f"{req.request_id}-f{k}"
                    at_ms = req.t_gateway_ms + 1000.0 * _unit_hash(f"flood-at:{rid}")
                    flooded.append(dataclasses.replace(req, request_id=rid, t_gateway_ms=at_ms))
        flooded.sort(key=lambda r: r.t_gateway_ms)  # stable
        return flooded

    def _dispatch(self, kind: int, payload: object, version: int) -> None:
        if kind == _K_STATS:
            self._on_stats()
            return
        if kind == _K_WAKE:
            assert isinstance(payload, _Engine)
            if version == payload.wake_version:
                self._on_wake(payload)
            return
        if kind == _K_RESTART:
            assert isinstance(payload, _Engine)
            payload.restart_ms = self._now_ms
            payload.ready_ms = self._now_ms + self._cfg.cold_start_load_ms
            self._push(payload.ready_ms, _K_READY, payload)
            return
        if kind == _K_READY:
            assert isinstance(payload, _Engine)
            self._on_ready(payload)
            return
        assert isinstance(payload, _Req)
        if kind == _K_RETRY:
            self._on_gateway_arrival(payload)
        elif kind == _K_CUTOFF:
            self._on_cutoff(payload)
        elif kind == _K_HOLD:
            self._on_hold(payload)
        elif kind == _K_ARRIVE:
            self._on_engine_arrival(payload)
        elif kind == _K_PATIENCE:
            self._on_patience(payload)
        else:
            self._on_queue_timeout(payload)


def simulate(trace: Sequence[TraceRequest], config: SimConfig) -> Iterator[Event]:
    """Yield the v1 events of ``trace`` under ``config`` in non-decreasing ``ts_unix_ns``."""
    return Simulator(trace, config).events()
