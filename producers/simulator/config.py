"""The simulator's settings: served models, overload episodes and :class:`SimConfig`
(see :mod:`producers.simulator.model` for the model they drive)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal


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
DEFAULT_MODELS: Final[tuple[ModelConfig, ...]] = tuple(
    ModelConfig(*row, kv_capacity_tokens=32_768)
    for row in (
        # name, weight, engines, max_concurrency, prefill_ms_per_token, decode_base_ms,
        # decode_ms_per_seq
        ("llama-3-8b", 0.75, 2, 8, 0.05, 6.0, 0.5),
        ("llama-3-70b", 0.25, 2, 4, 0.2, 9.0, 1.2),
    )
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


@dataclass(frozen=True, slots=True)
class TenantFlood:
    """One tenant floods at one priority (issue 52): its requests at ``priority`` that
    arrive in [start_offset_s, end_offset_s) of simulated time are each sent ``factor``
    times (fractional: the extra copy with that probability), the copies within a second
    after the original. Copies and their draws come from the request id, not the run's
    generator, so the rest of the run is drawn as without the flood."""

    tenant: str
    priority: int
    start_offset_s: float
    end_offset_s: float
    factor: float = 10.0

    def __post_init__(self) -> None:
        if not self.tenant:
            raise ValueError("TenantFlood.tenant must be non-empty")
        if not 0 <= self.priority <= 3:
            raise ValueError("TenantFlood.priority must be 0..3")
        if not (math.isfinite(self.start_offset_s) and self.start_offset_s >= 0):
            raise ValueError("TenantFlood.start_offset_s must be finite and >= 0")
        if not (math.isfinite(self.end_offset_s) and self.end_offset_s > self.start_offset_s):
            raise ValueError("TenantFlood.end_offset_s must be finite and > start_offset_s")
        if not (math.isfinite(self.factor) and self.factor >= 1):
            raise ValueError("TenantFlood.factor must be finite and >= 1")

    def copies(self, tenant: str, priority: int, offset_ms: float, u: float) -> int:
        """The extra copies of a request of ``tenant`` at ``priority`` arriving at
        ``offset_ms`` (``u`` uniform in [0, 1): the fractional copy's draw)."""
        if tenant != self.tenant or priority != self.priority:
            return 0
        if not self.start_offset_s * 1000.0 <= offset_ms < self.end_offset_s * 1000.0:
            return 0
        extra = self.factor - 1.0
        return int(extra) + (1 if u < extra - int(extra) else 0)


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
    # Per-request first-token SLOs (issue 52): (ms, weight) pairs; each stream carries
    # one drawn from its request id (as x-llm-d-slo-ttft-ms). Empty: none.
    slo_ttft_mix: tuple[tuple[float, float], ...] = ()
    tenant_floods: tuple[TenantFlood, ...] = ()  # tenants flooding at a priority

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
        if not all(
            math.isfinite(ms) and ms > 0 and math.isfinite(w) and w > 0
            for ms, w in self.slo_ttft_mix
        ):
            raise ValueError("SimConfig.slo_ttft_mix must be (ms > 0, weight > 0) pairs")
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
