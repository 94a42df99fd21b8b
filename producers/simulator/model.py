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
* **Engine stats.** Every ``stats_interval_ms`` each engine reports running
  and waiting counts, KV-cache usage (prompt + generated tokens of running
  sequences over ``kv_capacity_tokens``, capped at 1), a decayed prefix-cache
  hit rate and a GPU-memory fraction (static share + KV share).

Everything here is pure: no I/O, no wall clock, randomness only from
generators seeded by ``SimConfig.seed``. The same trace and config always
give the same events.
"""

from __future__ import annotations

import hashlib
import heapq
import math
import random
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from pipeline.contract.events import (
    EngineFinished,
    EngineStats,
    Event,
    GatewayCompleted,
    GatewayReceived,
    Outcome,
)
from producers.simulator.gate import Arrival, Completion, GatewayGate
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
    "engine_hosts",
    "simulate",
]

_NS_PER_MS: Final = 1_000_000
_ROUND_MS: Final = 6  # durations are reported to the nanosecond


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """One served model and the engines (vLLM instances) that serve it."""

    name: str
    weight: float  # share of the traffic (relative to the other models' weights)
    engines: int  # engine instances; hosts are named "<name>-<i>"
    max_concurrency: int  # max running sequences per engine (vLLM max_num_seqs)
    prefill_ms_per_token: float  # added to an iteration per uncached prompt token admitted
    decode_base_ms: float  # iteration (step) time with one running sequence, minus per-seq
    decode_ms_per_seq: float  # added to the step time per running sequence
    kv_capacity_tokens: int = 65_536  # KV-cache capacity of one engine, in tokens

    def __post_init__(self) -> None:
        if not self.name or not self.name.strip():
            raise ValueError("ModelConfig.name must be non-empty")
        if not (math.isfinite(self.weight) and self.weight > 0):
            raise ValueError(f"ModelConfig.weight must be > 0 (model {self.name})")
        if self.engines < 1:
            raise ValueError(f"ModelConfig.engines must be >= 1 (model {self.name})")
        if self.max_concurrency < 1:
            raise ValueError(f"ModelConfig.max_concurrency must be >= 1 (model {self.name})")
        for fname in ("prefill_ms_per_token", "decode_base_ms", "decode_ms_per_seq"):
            value = getattr(self, fname)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"ModelConfig.{fname} must be finite and >= 0 (model {self.name})")
        if self.decode_base_ms + self.decode_ms_per_seq <= 0:
            raise ValueError(
                f"ModelConfig.decode_base_ms + decode_ms_per_seq must be > 0 (model {self.name})"
            )
        if self.kv_capacity_tokens < 1:
            raise ValueError(f"ModelConfig.kv_capacity_tokens must be >= 1 (model {self.name})")

    def step_ms(self, running: int) -> float:
        """Length of a decode-only iteration with ``running`` sequences."""
        return self.decode_base_ms + self.decode_ms_per_seq * running

    def capacity_tokens_per_s(self) -> float:
        """Decode tokens per second of one engine at full batch (saturation throughput)."""
        return 1000.0 * self.max_concurrency / self.step_ms(self.max_concurrency)


# Defaults, tuned on the Azure conv trace (~5.4 req/s, mean 211 generated
# tokens): decode demand is ~55% (8B) and ~50% (70B) of the full-batch capacity
# of each model's engines, so the plain trace runs well below saturation with a
# gateway-total P99 of a few seconds; at 3x the rate both models are saturated
# and queues grow without bound. Unloaded decode: 6.5 ms/token (8B), 10.2 (70B).
DEFAULT_MODELS: Final[tuple[ModelConfig, ...]] = (
    ModelConfig(
        name="llama-3-8b",
        weight=0.75,
        engines=2,
        max_concurrency=8,
        prefill_ms_per_token=0.05,
        decode_base_ms=6.0,
        decode_ms_per_seq=0.5,
        kv_capacity_tokens=32_768,
    ),
    ModelConfig(
        name="llama-3-70b",
        weight=0.25,
        engines=2,
        max_concurrency=4,
        prefill_ms_per_token=0.2,
        decode_base_ms=9.0,
        decode_ms_per_seq=1.2,
        kv_capacity_tokens=32_768,
    ),
)

# Eight tenants with Zipf (s = 1) weights.
DEFAULT_TENANTS: Final[tuple[tuple[str, float], ...]] = tuple(
    (f"tenant-{chr(ord('a') + i)}", 1.0 / (i + 1)) for i in range(8)
)


EpisodeShape = Literal["step", "ramp", "burst"]
EPISODE_SHAPES: Final[tuple[EpisodeShape, ...]] = ("step", "ramp", "burst")
Scheduling = Literal["fcfs", "priority"]
SCHEDULING_POLICIES: Final[tuple[Scheduling, ...]] = ("fcfs", "priority")


@dataclass(frozen=True, slots=True)
class OverloadEpisode:
    """Arrivals in [start_offset_s, end_offset_s) of simulated time are replicated.

    Offsets are on the simulated timeline (after ``rate_scale``). A fractional
    factor sends the extra copy with probability equal to the fraction.

    * ``step``: every arrival is sent ``factor`` times, the replicas up to
      ``jitter_ms`` after the original;
    * ``ramp``: the factor grows linearly from 1 at the start to ``factor`` at
      the end (then x1 again), replicas jittered as a step's;
    * ``burst``: a step whose replicas arrive at the same instant as the
      original (jitter 0: a thundering herd).
    """

    start_offset_s: float
    end_offset_s: float
    factor: float = 3.0
    jitter_ms: float = 500.0
    shape: EpisodeShape = "step"

    def __post_init__(self) -> None:
        if not (math.isfinite(self.start_offset_s) and self.start_offset_s >= 0):
            raise ValueError("OverloadEpisode.start_offset_s must be finite and >= 0")
        if not (math.isfinite(self.end_offset_s) and self.end_offset_s > self.start_offset_s):
            raise ValueError("OverloadEpisode.end_offset_s must be finite and > start_offset_s")
        if not (math.isfinite(self.factor) and self.factor >= 1):
            raise ValueError("OverloadEpisode.factor must be finite and >= 1")
        if not (math.isfinite(self.jitter_ms) and self.jitter_ms >= 0):
            raise ValueError("OverloadEpisode.jitter_ms must be finite and >= 0")
        if self.shape not in EPISODE_SHAPES:
            raise ValueError(f"OverloadEpisode.shape must be one of {', '.join(EPISODE_SHAPES)}")

    def contains(self, offset_ms: float) -> bool:
        return self.start_offset_s * 1000.0 <= offset_ms < self.end_offset_s * 1000.0

    def factor_at(self, offset_ms: float) -> float:
        """The copies an arrival at ``offset_ms`` is sent as (1 outside the episode)."""
        if not self.contains(offset_ms):
            return 1.0
        if self.shape != "ramp":
            return self.factor
        start_ms = self.start_offset_s * 1000.0
        share = (offset_ms - start_ms) / (self.end_offset_s * 1000.0 - start_ms)
        return 1.0 + (self.factor - 1.0) * share

    @property
    def replica_jitter_ms(self) -> float:
        """Replicas arrive uniformly within this many ms after the original."""
        return 0.0 if self.shape == "burst" else self.jitter_ms


def _check_range(name: str, lo_hi: tuple[float, float], lo_min: float = 0.0) -> None:
    lo, hi = lo_hi
    if not (math.isfinite(lo) and math.isfinite(hi) and lo_min <= lo <= hi):
        raise ValueError(
            f"SimConfig.{name} must be a finite (low, high) with {lo_min} <= low <= high"
        )


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Settings of one simulation run (all times in simulated milliseconds unless named _s)."""

    start_unix_ns: int  # wall-clock time (ns) that trace offset 0 maps to; required
    models: tuple[ModelConfig, ...] = DEFAULT_MODELS
    priority_weights: tuple[float, float, float, float] = (0.05, 0.25, 0.5, 0.2)  # 0..3
    tenants: tuple[tuple[str, float], ...] = DEFAULT_TENANTS  # (name, weight)
    stream_fraction: float = 0.8
    gateway_hosts: tuple[str, ...] = ("gateway-0", "gateway-1")
    gateway_pre_ms: tuple[float, float] = (1.0, 4.0)  # uniform: received -> sent to engine
    gateway_post_ms: tuple[float, float] = (1.0, 4.0)  # uniform: engine output -> sent to client
    # Client patience for the first byte: log-normal with this median and sigma; None = never.
    patience_median_ms: float | None = 60_000.0
    patience_sigma: float = 0.75
    patience_min_ms: float = 1_000.0
    stream_stop_fraction: float = 0.01  # share of streams the client stops midway
    rate_scale: float = 1.0  # >1 compresses the trace's time (more requests per second)
    overload: OverloadEpisode | None = None
    seed: int = 0
    engine_skew_max_ms: float = 5.0  # each engine's wall clock is off by U(-max, +max) ms
    engine_skew_ms: tuple[tuple[str, float], ...] = ()  # (engine host, skew ms) overrides
    stats_interval_ms: float = 1_000.0
    max_queue_ms: float | None = None  # queue-timeout cut-off (503); None = wait forever
    max_output_tokens: int = 1_000  # a request reaching it finishes with "length"
    prefix_hit_fraction: float = 0.95  # share of requests whose prompt prefix is cached
    prefix_cached_share: tuple[float, float] = (0.8, 1.0)  # uniform share of a hit prompt
    kv_block_tokens: int = 16  # cached tokens are whole blocks
    gpu_memory_static_fraction: float = 0.5  # weights + activations
    gpu_memory_kv_fraction: float = 0.42  # reached at full KV cache
    # Closed loop (with a GatewayGate): a refused client retries as the OpenAI Python SDK
    # 2.x does (openai/_base_client.py, _constants.py; see "Clients' retries" above): at
    # most client_max_retries times (DEFAULT_MAX_RETRIES = 2), after Retry-After when
    # 0 < Retry-After <= client_max_retry_after_ms (MAX_RETRY_AFTER_DELAY, 120 s; above
    # it: no retry), else after min(backoff * 2^n, max_backoff) * (1 - 0.25 U)
    # (INITIAL_RETRY_DELAY 0.5 s, MAX_RETRY_DELAY 8 s); never after x-should-retry: false.
    client_max_retries: int = 2
    client_backoff_ms: float = 500.0
    client_max_backoff_ms: float = 8_000.0
    client_max_retry_after_ms: float = 120_000.0
    # Request ids are "<prefix><9-digit trace row>" (+ "-x<k>" for overload replicas) and
    # event ids derive from them: give each run sent into one pipeline its own prefix.
    request_id_prefix: str = "req-"
    # Engine restarts: (engine host, trace offset ms), each one cold start (see above).
    engine_restarts: tuple[tuple[str, float], ...] = ()
    cold_start_load_ms: float = 8_000.0  # weights load: no admissions meanwhile
    cold_start_window_ms: float = 10_000.0  # "its first seconds" after the load, still marked
    # Engine admission order: "fcfs" (arrival at the engine) or "priority" (vLLM's
    # --scheduling-policy priority: (priority, arrival), lower number first; no preemption).
    scheduling: Scheduling = "fcfs"

    def __post_init__(self) -> None:
        if not self.start_unix_ns > 0:
            raise ValueError("SimConfig.start_unix_ns must be > 0")
        if not self.models:
            raise ValueError("SimConfig.models must not be empty")
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError("SimConfig.models must have distinct names")
        if len(self.priority_weights) != 4 or not all(
            math.isfinite(w) and w >= 0 for w in self.priority_weights
        ):
            raise ValueError("SimConfig.priority_weights must be 4 finite weights >= 0")
        if sum(self.priority_weights) <= 0:
            raise ValueError("SimConfig.priority_weights must not all be 0")
        if not self.tenants or not all(t and math.isfinite(w) and w > 0 for t, w in self.tenants):
            raise ValueError("SimConfig.tenants must be non-empty (name, weight > 0) pairs")
        if not 0.0 <= self.stream_fraction <= 1.0:
            raise ValueError("SimConfig.stream_fraction must be in [0, 1]")
        if not self.gateway_hosts or not all(h.strip() for h in self.gateway_hosts):
            raise ValueError("SimConfig.gateway_hosts must be non-empty names")
        _check_range("gateway_pre_ms", self.gateway_pre_ms)
        _check_range("gateway_post_ms", self.gateway_post_ms)
        if self.patience_median_ms is not None and not (
            math.isfinite(self.patience_median_ms) and self.patience_median_ms > 0
        ):
            raise ValueError("SimConfig.patience_median_ms must be > 0 or None")
        if not (math.isfinite(self.patience_sigma) and self.patience_sigma >= 0):
            raise ValueError("SimConfig.patience_sigma must be finite and >= 0")
        if not (math.isfinite(self.patience_min_ms) and self.patience_min_ms >= 0):
            raise ValueError("SimConfig.patience_min_ms must be finite and >= 0")
        if not 0.0 <= self.stream_stop_fraction <= 1.0:
            raise ValueError("SimConfig.stream_stop_fraction must be in [0, 1]")
        if not (math.isfinite(self.rate_scale) and self.rate_scale > 0):
            raise ValueError("SimConfig.rate_scale must be finite and > 0")
        if not (math.isfinite(self.engine_skew_max_ms) and self.engine_skew_max_ms >= 0):
            raise ValueError("SimConfig.engine_skew_max_ms must be finite and >= 0")
        hosts = set(engine_hosts(self.models))
        for host, skew in self.engine_skew_ms:
            if host not in hosts:
                raise ValueError(f"SimConfig.engine_skew_ms names unknown engine host {host!r}")
            if not math.isfinite(skew):
                raise ValueError(f"SimConfig.engine_skew_ms must be finite (host {host})")
        if not (math.isfinite(self.stats_interval_ms) and self.stats_interval_ms > 0):
            raise ValueError("SimConfig.stats_interval_ms must be finite and > 0")
        if self.max_queue_ms is not None and not (
            math.isfinite(self.max_queue_ms) and self.max_queue_ms >= 0
        ):
            raise ValueError("SimConfig.max_queue_ms must be finite and >= 0, or None")
        if self.max_output_tokens < 1:
            raise ValueError("SimConfig.max_output_tokens must be >= 1")
        if not 0.0 <= self.prefix_hit_fraction <= 1.0:
            raise ValueError("SimConfig.prefix_hit_fraction must be in [0, 1]")
        _check_range("prefix_cached_share", self.prefix_cached_share)
        if self.prefix_cached_share[1] > 1.0:
            raise ValueError("SimConfig.prefix_cached_share must lie in [0, 1]")
        if self.kv_block_tokens < 1:
            raise ValueError("SimConfig.kv_block_tokens must be >= 1")
        for fname in ("gpu_memory_static_fraction", "gpu_memory_kv_fraction"):
            value = getattr(self, fname)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"SimConfig.{fname} must be in [0, 1]")
        if self.gpu_memory_static_fraction + self.gpu_memory_kv_fraction > 1.0:
            raise ValueError(
                "SimConfig.gpu_memory_static_fraction + gpu_memory_kv_fraction must be <= 1"
            )
        if self.client_max_retries < 0:
            raise ValueError("SimConfig.client_max_retries must be >= 0")
        for fname in ("client_backoff_ms", "client_max_backoff_ms", "client_max_retry_after_ms"):
            value = getattr(self, fname)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"SimConfig.{fname} must be finite and >= 0")
        if not self.request_id_prefix or len(self.request_id_prefix) > 200:
            raise ValueError("SimConfig.request_id_prefix must have 1..200 characters")
        for host, at_ms in self.engine_restarts:
            if host not in hosts:
                raise ValueError(f"SimConfig.engine_restarts names unknown engine host {host!r}")
            if not (math.isfinite(at_ms) and at_ms >= 0):
                raise ValueError(f"SimConfig.engine_restarts offset must be >= 0 (host {host})")
        for fname in ("cold_start_load_ms", "cold_start_window_ms"):
            value = getattr(self, fname)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"SimConfig.{fname} must be finite and >= 0")
        if self.scheduling not in SCHEDULING_POLICIES:
            raise ValueError(
                f"SimConfig.scheduling must be one of {', '.join(SCHEDULING_POLICIES)}"
            )


def engine_hosts(models: Sequence[ModelConfig]) -> list[str]:
    """Engine host names in simulation order: ``"<model>-<i>"``."""
    return [f"{m.name}-{i}" for m in models for i in range(m.engines)]


@dataclass(frozen=True, slots=True)
class SimSummary:
    """Counts and engine figures of a (finished or running) simulation."""

    requests: int  # requests of the run, overload replicas included
    ok: int
    client_aborts: int  # patience aborts + mid-stream stops
    rejected: int  # queue timeouts (503)
    events_by_kind: dict[str, int]
    sim_end_ms: float  # true time of the last simulated happening
    engine_skew_ms: dict[str, float]
    engine_busy_fraction: dict[str, float]  # share of [0, sim_end] with >= 1 running sequence
    engine_mean_running: dict[str, float]  # time-averaged running sequences


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
    # the gate's (mode, reason) for it, as gateway.completed's control fields (None: off)
    control: tuple[str, str | None] | None = None


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


class Simulator:
    """One simulation run; iterate :meth:`events` once. :attr:`summary` is live."""

    def __init__(
        self, trace: Sequence[TraceRequest], config: SimConfig, gate: GatewayGate | None = None
    ) -> None:
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
        self._arrivals = self._build_arrivals(trace)
        self._heap: list[tuple[float, int, int, object, int]] = []
        self._order = 0
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
        return out

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

    def _push(self, t_ms: float, kind: int, payload: object, version: int = 0) -> None:
        heapq.heappush(self._heap, (t_ms, kind, self._order, payload, version))
        self._order += 1

    def _advance(self, t_ms: float) -> None:
        if t_ms < self._now_ms:  # pragma: no cover - an invariant of the event loop
            raise AssertionError(f"time went backwards: {t_ms} < {self._now_ms}")
        self._now_ms = t_ms

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
        elif kind == _K_ARRIVE:
            self._on_engine_arrival(payload)
        elif kind == _K_PATIENCE:
            self._on_patience(payload)
        else:
            self._on_queue_timeout(payload)

    # -- gateway ------------------------------------------------------------

    def _on_gateway_arrival(self, req: _Req) -> None:
        cfg = self._cfg
        verdict = None
        if self._gate is not None:
            self._directives_arrive(req.t_gateway_ms)
            decision = self._gate.decision(
                Arrival(
                    model=cfg.models[req.model_idx].name,
                    priority=req.priority,
                    request_id=req.request_id,
                    session_id=req.session or req.request_id,
                    gateway=req.gateway,
                    prompt_tokens=req.prompt_tokens,
                    t_ms=req.t_gateway_ms,
                    attempt=req.attempt,  # the SDK's x-stainless-retry-count
                )
            )
            verdict = decision.act
            if decision.mode != "off":
                req.control = (decision.mode, decision.verdict.reason)
            if verdict.reason is None:
                req.gate_model = cfg.models[req.model_idx].name
                req.cutoff_ms = verdict.queue_timeout_ms
                req.cutoff_retry_after_s = verdict.retry_after_s
                fb = self._model_idx.get(verdict.fallback_model or "")
                if fb is not None:
                    req.model_idx = fb
        self._emit(
            GatewayReceived(
                v=1,
                event_id=f"{req.request_id}:gateway.received",
                ts_unix_ns=self._wall_ns(req.t_gateway_ms),
                host=req.gateway,
                model=cfg.models[req.model_idx].name,
                request_id=req.request_id,
                kind="gateway.received",
                priority=req.priority,
                tenant=req.tenant,
                prompt_tokens=req.prompt_tokens,
                stream=req.stream,
                # the client's retry count; a retry names its first try (the logical
                # request's key, pipeline/core/logical.py)
                client_attempt=req.attempt,
                logical_request_id=req.session or None,
            )
        )
        if verdict is not None and verdict.reason is not None:
            self._reject_at_gateway(
                req, verdict.status, verdict.retry_after_s, verdict.should_retry
            )
            return
        if verdict is not None and verdict.cap_context_tokens is not None:
            cap = verdict.cap_context_tokens
            req.prompt_tokens = min(req.prompt_tokens, cap)
            block = cfg.kv_block_tokens
            req.cached_tokens = min(req.cached_tokens, ((req.prompt_tokens - 1) // block) * block)
        self._push(req.t_gateway_ms + req.pre_ms, _K_ARRIVE, req)
        if req.patience_ms is not None:
            self._push(req.t_gateway_ms + req.patience_ms, _K_PATIENCE, req)

    def _reject_at_gateway(
        self, req: _Req, http_status: int, retry_after_s: int, should_retry: bool | None
    ) -> None:
        """The enforcement's refusal (429 + Retry-After [+ x-should-retry]) after the
        gateway's own overhead; the client may retry (:meth:`_refuse`), as a new request."""
        t_done = req.t_gateway_ms + req.pre_ms + req.post_ms
        req.state = _PENDING
        self._refuse(req, t_done, http_status, retry_after_s, should_retry)

    def _directives_arrive(self, t_ms: float) -> None:
        """The directives that reached the gateways by ``t_ms``
        (:meth:`GatewayGate.advance`, on the simulator's clock: the gate records each
        decision's delay from its evidence): a new decision's queue cut-off also applies
        to what the gateways already forwarded (:meth:`apply_queue_cutoff`). The one
        path for a backtest's in-process directives and the demo's control topic."""
        assert self._gate is not None
        for scope, d in self._gate.advance(self._wall_ns(t_ms) / _NS_PER_MS):
            actions = d.actions
            cutoff = getattr(actions, "queue_timeout_ms", None)
            if cutoff is None:
                continue
            models = [m.name for m in self._cfg.models] if scope == "*" else [scope]
            for m in models:
                self.apply_queue_cutoff(m, cutoff, actions.retry_after_s)

    def apply_queue_cutoff(
        self, model: str, cutoffs_ms: Sequence[float | None], retry_after_s: int
    ) -> int:
        """A directive's queue cut-off (per priority 0..3, priority 0's always None)
        reaches the gateways of ``model`` now: a request waiting in its engines' queues
        for its priority's cut-off or more is cancelled (503 + Retry-After; the client
        retries as after a 429), the others get the cut-off from when they reached the
        engine. Returns how many were cancelled."""
        idx = self._model_idx.get(model)
        if idx is None:
            return 0
        now = self._now_ms
        cancelled = 0
        for e in self._engines_of_model[idx]:
            eng = self._engines[e]
            for q in eng.queues:
                for req in list(q):
                    if req.state != _WAITING or req.cutoff_ms is not None:
                        continue
                    cutoff = cutoffs_ms[req.priority] if req.priority < len(cutoffs_ms) else None
                    if cutoff is None or req.priority == 0:
                        continue
                    req.cutoff_ms, req.cutoff_retry_after_s = cutoff, retry_after_s
                    due = req.t_engine_ms + cutoff
                    if due <= now:
                        self._on_cutoff(req)
                        cancelled += 1
                    else:
                        self._push(due, _K_CUTOFF, req)
        return cancelled

    def _on_cutoff(self, req: _Req) -> None:
        if req.state != _WAITING:
            return
        self._engines[req.engine].waiting_live -= 1
        self.cutoffs += 1
        self._refuse(req, self._now_ms + req.post_ms, 503, req.cutoff_retry_after_s)

    def _refuse(
        self,
        req: _Req,
        t_done: float,
        http_status: int,
        retry_after_s: int,
        should_retry: bool | None = None,
    ) -> None:
        """Answer ``http_status`` + Retry-After at ``t_done``; the client retries or not
        (:func:`sdk_retry_delay_ms`)."""
        cfg = self._cfg
        self._complete(
            req,
            t_done,
            outcome="rejected",
            http_status=http_status,
            ttfb_ms=t_done - req.t_gateway_ms,
            output_tokens=0,
        )
        session = req.session or req.request_id
        # The SDK's random() for its backoff jitter, drawn from the request id (no draw
        # from the run's RNG: the other events of a run do not move when retries change).
        wait = sdk_retry_delay_ms(
            cfg,
            retries_taken=req.attempt,
            http_status=http_status,
            retry_after_s=retry_after_s,
            should_retry=should_retry,
            u=_unit_hash(req.request_id),
        )
        if wait is None:
            return
        retry = _Req(
            request_id=f"{session}-r{req.attempt + 1}",
            t_gateway_ms=t_done + wait,
            model_idx=req.model_idx,
            gateway=req.gateway,
            prompt_tokens=req.prompt_tokens,
            cached_tokens=req.cached_tokens,
            gen_tokens=req.gen_tokens,
            stop_after=req.stop_after,
            priority=req.priority,
            tenant=req.tenant,
            stream=req.stream,
            pre_ms=req.pre_ms,
            post_ms=req.post_ms,
            patience_ms=req.patience_ms,
            attempt=req.attempt + 1,
            session=session,
        )
        self._open_requests += 1
        self.retries += 1
        self._push(retry.t_gateway_ms, _K_RETRY, retry)

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

    def _on_patience(self, req: _Req) -> None:
        if req.state == _DONE:
            return
        now = self._now_ms
        if req.stream and req.t_first_ms >= 0 and req.t_first_ms + req.post_ms <= now:
            return  # the first byte reached the client in time
        if req.state == _WAITING:
            self._engines[req.engine].waiting_live -= 1
        elif req.state == _RUNNING:
            self._drop_running(self._engines[req.engine], req, now)
        self._complete(
            req, now, outcome="client_abort", http_status=0, ttfb_ms=None, output_tokens=0
        )

    def _on_queue_timeout(self, req: _Req) -> None:
        if req.state != _WAITING:
            return
        self._engines[req.engine].waiting_live -= 1
        t_done = self._now_ms + req.post_ms
        self._complete(
            req,
            t_done,
            outcome="rejected",
            http_status=503,
            ttfb_ms=t_done - req.t_gateway_ms,
            output_tokens=0,
        )

    # -- engines ------------------------------------------------------------

    def _on_engine_arrival(self, req: _Req) -> None:
        if req.state != _PENDING:
            return  # the client left before the request reached the engine
        now = self._now_ms
        ids = self._engines_of_model[req.model_idx]
        start = self._rr[req.model_idx]
        self._rr[req.model_idx] = (start + 1) % len(ids)
        best = ids[start]
        best_load = self._engines[best].running + self._engines[best].waiting_live
        for k in range(1, len(ids)):
            cand = ids[(start + k) % len(ids)]
            e = self._engines[cand]
            load = e.running + e.waiting_live
            if load < best_load:
                best, best_load = cand, load
        eng = self._engines[best]
        req.engine = best
        req.t_engine_ms = now
        req.state = _WAITING
        eng.queues[req.priority if self._by_priority else 0].append(req)
        eng.waiting_live += 1
        if self._cfg.max_queue_ms is not None:
            self._push(now + self._cfg.max_queue_ms, _K_QUEUE_TIMEOUT, req)
        if req.cutoff_ms is not None and req.priority > 0:
            self._push(now + req.cutoff_ms, _K_CUTOFF, req)
        if not eng.active:
            self._schedule_wake(eng, eng.iter_idx, now)
        elif eng.running < eng.model.max_concurrency:
            j = eng.next_boundary(now)
            self._schedule_wake(eng, j, eng.boundary_ms(j))

    def _on_ready(self, eng: _Engine) -> None:
        """A restarted engine finished loading: admit what waited for it."""
        if not eng.waiting_live:
            return
        if not eng.active:
            self._schedule_wake(eng, eng.iter_idx, self._now_ms)
        elif eng.running < eng.model.max_concurrency:
            j = eng.next_boundary(self._now_ms)
            self._schedule_wake(eng, j, eng.boundary_ms(j))

    def _schedule_wake(self, eng: _Engine, j: int, t_ms: float) -> None:
        if eng.wake_iter != -1 and eng.wake_iter <= j:
            return
        eng.wake_version += 1
        eng.wake_iter = j
        self._push(t_ms, _K_WAKE, eng, eng.wake_version)

    def _drop_running(self, eng: _Engine, req: _Req, now: float) -> None:
        """Take a running request off its engine (finish-heap entry is deleted lazily)."""
        eng.account(now)
        eng.running -= 1
        eng.running_prompt_tokens -= req.prompt_tokens
        eng.running_admit_iter_sum -= req.admit_iter
        if eng.active:
            j = eng.next_boundary(now)
            self._schedule_wake(eng, j, eng.boundary_ms(j))

    def _on_wake(self, eng: _Engine) -> None:
        now = self._now_ms
        j = eng.wake_iter
        eng.wake_iter = -1
        eng.account(now)
        eng.iter_idx = j
        model = eng.model
        heap = eng.finish_heap
        while heap and heap[0][0] <= j - 1:
            _f, _o, req = heapq.heappop(heap)
            if req.state != _RUNNING:
                continue  # aborted while running (lazy deletion)
            eng.running -= 1
            eng.running_prompt_tokens -= req.prompt_tokens
            eng.running_admit_iter_sum -= req.admit_iter
            self._finish(eng, req, now)
        admitted: list[_Req] = []
        prefill_tokens = 0
        loading = now < eng.ready_ms  # restarted, weights loading: no admissions
        queues = eng.queues
        q = 0  # the queue admitted from: lowest priority level first (one queue in fcfs)
        while not loading and eng.running < model.max_concurrency:
            while q < len(queues) and not queues[q]:
                q += 1
            if q == len(queues):
                break
            req = queues[q].popleft()
            if req.state != _WAITING:
                continue
            eng.waiting_live -= 1
            req.state = _RUNNING
            req.t_sched_ms = now
            req.admit_iter = j
            eng.running += 1
            eng.running_prompt_tokens += req.prompt_tokens
            eng.running_admit_iter_sum += j
            prefill_tokens += req.prompt_tokens - req.cached_tokens
            eng.hit_cached += req.cached_tokens
            eng.hit_prompt += req.prompt_tokens
            admitted.append(req)
        if eng.running == 0:
            eng.active = False
            return
        eng.active = True
        eng.seg_start_ms = now
        eng.seg_iter = j
        eng.seg_step_ms = model.step_ms(eng.running)
        eng.seg_first_ms = eng.seg_step_ms + model.prefill_ms_per_token * prefill_tokens
        t_first = now + eng.seg_first_ms
        for req in admitted:
            req.t_first_ms = t_first
            last = req.stop_after if req.stop_after else req.gen_tokens
            heapq.heappush(heap, (j + last - 1, self._order, req))
            self._order += 1
        while heap and heap[0][2].state != _RUNNING:
            heapq.heappop(heap)
        if heap:
            nxt = heap[0][0] + 1
            self._schedule_wake(eng, nxt, eng.boundary_ms(nxt))

    def _finish(self, eng: _Engine, req: _Req, now: float) -> None:
        """A request left the engine at an iteration boundary: done, or stopped by its client."""
        ttfb = req.t_first_ms + req.post_ms - req.t_gateway_ms
        if req.stop_after:
            t_done = now + req.post_ms
            self._complete(
                req,
                t_done,
                outcome="client_abort",
                http_status=0,
                ttfb_ms=ttfb,
                output_tokens=req.stop_after,
            )
            return
        cfg = self._cfg
        queue = _r(req.t_sched_ms - req.t_engine_ms)
        prefill = _r(req.t_first_ms - req.t_sched_ms)
        decode = _r(now - req.t_first_ms)
        inference = prefill + decode
        cold: int | None = None
        if (
            eng.restart_ms >= 0
            and req.t_sched_ms >= eng.restart_ms
            and req.t_engine_ms < eng.ready_ms + cfg.cold_start_window_ms
        ):
            cold = self._wall_ns(eng.restart_ms, eng.skew_ms)
        self._emit(
            EngineFinished(
                v=1,
                event_id=f"{req.request_id}:engine.finished",
                ts_unix_ns=self._wall_ns(now, eng.skew_ms),
                host=eng.host,
                model=eng.model.name,
                request_id=req.request_id,
                kind="engine.finished",
                arrival_unix_ns=self._wall_ns(req.t_engine_ms, eng.skew_ms),
                queue_ms=queue,
                prefill_ms=prefill,
                decode_ms=decode,
                inference_ms=inference,
                e2e_ms=queue + inference,
                prompt_tokens=req.prompt_tokens,
                output_tokens=req.gen_tokens,
                cached_tokens=req.cached_tokens,
                finish_reason="length" if req.gen_tokens >= cfg.max_output_tokens else "stop",
                preemptions=0,
                priority=req.priority,
                cold_start_unix_ns=cold,
            )
        )
        t_done = now + req.post_ms
        first_byte = ttfb if req.stream else t_done - req.t_gateway_ms
        self._complete(
            req,
            t_done,
            outcome="ok",
            http_status=200,
            ttfb_ms=first_byte,
            output_tokens=req.gen_tokens,
        )

    # -- stats --------------------------------------------------------------

    def _on_stats(self) -> None:
        if self._open_requests <= 0:
            return
        cfg = self._cfg
        now = self._now_ms
        for eng in self._engines:
            done = eng.iterations_done(now)
            kv_tokens = eng.running_prompt_tokens + eng.running * done - eng.running_admit_iter_sum
            kv = min(1.0, max(0.0, kv_tokens / eng.model.kv_capacity_tokens))
            hit = eng.hit_cached / eng.hit_prompt if eng.hit_prompt > 0 else None
            self._emit(
                EngineStats(
                    v=1,
                    event_id=f"{eng.host}:engine.stats:{self._stats_seq:09d}",
                    ts_unix_ns=self._wall_ns(now, eng.skew_ms),
                    host=eng.host,
                    model=eng.model.name,
                    kind="engine.stats",
                    num_running=eng.running,
                    num_waiting=eng.waiting_live,
                    kv_cache_usage=round(kv, 6),
                    prefix_cache_hit_rate=None if hit is None else round(min(1.0, hit), 6),
                    gpu_memory_used_fraction=round(
                        cfg.gpu_memory_static_fraction + cfg.gpu_memory_kv_fraction * kv, 6
                    ),
                )
            )
            eng.hit_cached *= 0.9  # ~10-interval memory
            eng.hit_prompt *= 0.9
        self._stats_seq += 1
        self._push(now + cfg.stats_interval_ms, _K_STATS, None)


def simulate(trace: Sequence[TraceRequest], config: SimConfig) -> Iterator[Event]:
    """Yield the v1 events of ``trace`` under ``config`` in non-decreasing ``ts_unix_ns``."""
    return Simulator(trace, config).events()
