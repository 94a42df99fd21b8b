"""vLLM's per-iteration stats -> contract v1 engine events (no vLLM import here).

:class:`EngineRecorder` does everything the vLLM stat-logger plugin
(:mod:`producers.vllm_plugin`) does in ``record()``, on duck-typed stats
objects, so that it runs — and is unit-tested — without vLLM installed. The
plugin module is the only place that imports vLLM.

What vLLM hands a stat logger (checked against vLLM 0.20 … 0.33)
-----------------------------------------------------------------
``IterationStats.finished_requests`` holds one ``FinishedRequestStats`` per
request that finished in the iteration: ``request_id`` (the *external* id,
since vLLM 0.20; older releases have no id and nothing can be joined),
``finish_reason``, ``e2e_latency``, ``queued_time``, ``prefill_time``,
``decode_time``, ``inference_time`` (seconds), ``num_prompt_tokens``,
``num_generation_tokens``, ``num_cached_tokens`` and, in newer releases,
``num_preemptions``.

Clocks. ``IterationStats.iteration_timestamp`` is ``time.time()`` of the
front-end process and ``e2e_latency = iteration_timestamp - arrival_time``,
where ``arrival_time`` is also ``time.time()`` taken when the request
arrived. The per-request engine-core timestamps behind ``queued_time`` …
``inference_time`` (QUEUED / SCHEDULED events, first and last token) are
``time.monotonic()`` of the engine-core process: vLLM only ever subtracts
them, and so do we — we use the four durations as vLLM computed them and
never a monotonic instant. The finish wall clock is ``iteration_timestamp``
when it is plausibly a wall clock (within a day of ``time.time()`` at
``record()``; a monotonic value never is), otherwise ``time.time()`` at
``record()``; the arrival wall clock is that minus ``e2e_latency``.

Request ids. vLLM's OpenAI server names a request ``chatcmpl-<X-Request-Id>``
(chat) or ``cmpl-<X-Request-Id>-<prompt index>`` (completions); the
gateway's id is recovered by :func:`gateway_request_id`. A completion request
with several prompts gives several engine requests with the same gateway id:
the worker joins the first and counts the rest as conflicts.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from pydantic import ValidationError

from pipeline.contract.events import EngineFinished, EngineStats, FinishReason
from producers.emit import EventSink

log = logging.getLogger(__name__)

_NS: Final = 1_000_000_000
_MAX_EVENT_ID: Final = 128
_WALL_CLOCK_TOLERANCE_S: Final = 86_400.0
_SPAN_SLACK_MS: Final = 1000.0
_FINISH_REASONS: Final[dict[str, FinishReason]] = {
    "stop": "stop",
    "length": "length",
    "abort": "abort",
    "error": "error",
    # vLLM >= 0.30: generation stopped on a detected repetition loop. It is a
    # normal end of generation for latency purposes (not a server error).
    "repetition": "stop",
}


class FinishedStats(Protocol):
    """The fields of vLLM's ``FinishedRequestStats`` this module reads (others via getattr)."""

    finish_reason: Any
    e2e_latency: float
    num_prompt_tokens: int
    num_generation_tokens: int
    queued_time: float
    prefill_time: float
    decode_time: float
    inference_time: float


class IterationStatsLike(Protocol):
    iteration_timestamp: float
    finished_requests: Sequence[FinishedStats]


def gateway_request_id(vllm_request_id: str) -> str:
    """The gateway's X-Request-Id inside vLLM's external request id.

    ``chatcmpl-<id>`` -> ``<id>``; ``cmpl-<id>-<n>`` -> ``<id>`` (vLLM always
    appends the prompt index to completion ids); anything else unchanged.
    """
    if vllm_request_id.startswith("chatcmpl-") and len(vllm_request_id) > 9:
        return vllm_request_id[9:]
    if vllm_request_id.startswith("cmpl-") and len(vllm_request_id) > 5:
        base = vllm_request_id[5:]
        head, sep, tail = base.rpartition("-")
        if sep and head and tail.isdigit():
            return head
        return base
    return vllm_request_id


def finish_reason_of(value: object) -> FinishReason | None:
    """vLLM's ``FinishReason`` (an IntEnum whose ``str`` is the name) or a string."""
    name = getattr(value, "name", None)
    key = (name if isinstance(name, str) else str(value)).strip().lower()
    return _FINISH_REASONS.get(key)


def event_id_for(*parts: str) -> str:
    """``a:b:c`` — or a digest of it when longer than the contract allows (deterministic)."""
    eid = ":".join(parts)
    if len(eid) <= _MAX_EVENT_ID:
        return eid
    return "h:" + hashlib.blake2b(eid.encode("utf-8"), digest_size=32).hexdigest()


def _ms(seconds: object) -> float:
    """Seconds -> non-negative finite milliseconds."""
    return max(_seconds(seconds), 0.0) * 1000.0


# engine.finished's spans and counts, and the FinishedRequestStats attribute of each
_SPANS = {
    "queue_ms": "queued_time",
    "prefill_ms": "prefill_time",
    "decode_ms": "decode_time",
    "inference_ms": "inference_time",
}
_COUNTS = {
    "prompt_tokens": "num_prompt_tokens",
    "output_tokens": "num_generation_tokens",
    "cached_tokens": "num_cached_tokens",
    "preemptions": "num_preemptions",
}


def engine_spans_ms(fr: object, e2e_ms: float) -> dict[str, float]:
    """``{queue_ms, prefill_ms, decode_ms, inference_ms}``, with vLLM's unset-timestamp
    artefacts removed.

    vLLM computes each span from engine-core timestamps that stay 0.0 until the
    event happens. A request aborted while queued has ``scheduled_ts == 0``:
    ``queued_time`` comes out negative and ``prefill_time`` /
    ``inference_time`` equal the engine's monotonic uptime. Such a request
    spent its engine life waiting, so it is reported as all queue
    (``queue_ms = e2e_ms``) and no compute. Any other span longer than the
    request itself (beyond 1 s of slack between the two processes' clocks)
    comes from an unset timestamp and is reported as 0.
    """
    if _seconds(getattr(fr, "queued_time", 0.0)) < 0.0:
        return dict.fromkeys(_SPANS, 0.0) | {"queue_ms": e2e_ms}
    limit = e2e_ms + _SPAN_SLACK_MS
    spans = {name: _ms(getattr(fr, attr, 0.0)) for name, attr in _SPANS.items()}
    return {name: v if v <= limit else 0.0 for name, v in spans.items()}


def _seconds(value: object) -> float:
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0
    return v if math.isfinite(v) else 0.0


def _count(value: object) -> int:
    try:
        n: int = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return 0
    return max(n, 0)


def _fraction(value: object) -> float | None:
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    if not math.isfinite(v):
        return None
    return min(max(v, 0.0), 1.0)


@dataclass
class RecorderCounters:
    """What the plugin did; the sink's own counters say what reached Kafka."""

    finished_emitted: int = 0
    stats_emitted: int = 0
    without_request_id: int = 0  # vLLM < 0.20: FinishedRequestStats has no request_id
    invalid: int = 0  # could not be made a valid contract event (dropped)
    errors: int = 0  # unexpected exceptions swallowed in record()


class EngineRecorder:
    """One engine's stats -> ``engine.finished`` / ``engine.stats`` events on a sink.

    ``record`` never raises (everything unexpected is logged, rate-limited, and
    counted in ``counters.errors``) and never blocks (the sink only buffers).
    ``wall_clock_s`` and ``monotonic_s`` are injectable for tests.
    """

    def __init__(
        self,
        sink: EventSink,
        *,
        model: str,
        host: str,
        stats_interval_ms: int = 1000,
        wall_clock_s: Callable[[], float] = time.time,
        monotonic_s: Callable[[], float] = time.monotonic,
        cold_start_window_ms: int = 0,
        started_unix_ns: int | None = None,
    ) -> None:
        self.sink = sink
        self.model = model
        self.host = host
        self.stats_interval_s = stats_interval_ms / 1000.0
        self._stats_enabled = stats_interval_ms > 0
        self._wall = wall_clock_s
        self._mono = monotonic_s
        self._last_stats_s: float | None = None
        self._pc_queries = 0  # prefix-cache token queries / hits since the last engine.stats
        self._pc_hits = 0
        # requests preempted since the last engine.stats (IterationStats.num_preempted_reqs
        # summed); None until an iteration has reported it (a vLLM without the field)
        self._preempted: int | None = None
        self._last_error_log = -math.inf
        self.counters = RecorderCounters()
        # Cold starts: a request that reached the engine within cold_start_window_ms of the
        # engine's start is marked (engine.finished cold_start_unix_ns = the start). vLLM
        # builds its stat loggers right after the engine core loaded the weights, so the
        # default start is this recorder's creation: the engine's first seconds of serving.
        self.cold_start_window_ns = cold_start_window_ms * 1_000_000
        self.started_unix_ns = (
            started_unix_ns if started_unix_ns is not None else int(self._wall() * _NS)
        )

    # --- the StatLoggerBase.record body ----------------------------------------------------

    def record(self, scheduler_stats: object | None, iteration_stats: object | None) -> None:
        try:
            if iteration_stats is not None:
                self._count_preempted(iteration_stats)
                self._record_finished(iteration_stats)
            if scheduler_stats is not None and self._stats_enabled:
                self._record_scheduler(scheduler_stats)
        except Exception:  # never raise into vLLM's output loop
            self.counters.errors += 1
            self._log_rate_limited("tailguard: record() failed; continuing", exc_info=True)

    def _count_preempted(self, iteration_stats: object) -> None:
        n = getattr(iteration_stats, "num_preempted_reqs", None)
        if n is not None:
            self._preempted = (self._preempted or 0) + _count(n)

    # --- engine.finished -------------------------------------------------------------------

    def _finish_wall_s(self, iteration_stats: object) -> float:
        now = self._wall()
        ts = getattr(iteration_stats, "iteration_timestamp", None)
        if isinstance(ts, (int, float)) and abs(float(ts) - now) <= _WALL_CLOCK_TOLERANCE_S:
            return float(ts)
        return now

    def _record_finished(self, iteration_stats: object) -> None:
        finished = getattr(iteration_stats, "finished_requests", None)
        if not finished:
            return
        finish_s = self._finish_wall_s(iteration_stats)
        for fr in finished:
            event = self.finished_event(fr, finish_s)
            if event is not None:
                self.sink.emit(event)
                self.counters.finished_emitted += 1

    def finished_event(self, fr: object, finish_wall_s: float) -> EngineFinished | None:
        """One ``engine.finished`` from one ``FinishedRequestStats`` (None: counted, dropped)."""
        vllm_id = getattr(fr, "request_id", None)
        if not isinstance(vllm_id, str) or not vllm_id:
            self.counters.without_request_id += 1
            self._log_rate_limited(
                "tailguard: FinishedRequestStats without request_id (vLLM < 0.20?); "
                "engine.finished is not emitted"
            )
            return None
        reason = finish_reason_of(getattr(fr, "finish_reason", None))
        if reason is None:
            self.counters.invalid += 1
            self._log_rate_limited(
                "tailguard: unknown finish_reason %r; dropped", getattr(fr, "finish_reason", None)
            )
            return None
        e2e_ms = _ms(getattr(fr, "e2e_latency", 0.0))
        finish_ns = int(finish_wall_s * _NS)
        # the spans and counts (validated with the event, below)
        measured: dict[str, Any] = engine_spans_ms(fr, e2e_ms) | {
            name: _count(getattr(fr, attr, 0)) for name, attr in _COUNTS.items()
        }
        arrival_ns = finish_ns - round(e2e_ms * 1_000_000)
        cold = None
        if (
            self.cold_start_window_ns
            and arrival_ns < self.started_unix_ns + self.cold_start_window_ns
        ):
            cold = self.started_unix_ns
        try:
            return EngineFinished(
                v=1,
                event_id=event_id_for(self.host, vllm_id, "engine.finished"),
                kind="engine.finished",
                request_id=gateway_request_id(vllm_id),
                ts_unix_ns=finish_ns,
                host=self.host,
                model=self.model,
                arrival_unix_ns=arrival_ns,
                e2e_ms=e2e_ms,
                finish_reason=reason,
                priority=None,  # vLLM's scheduling priority is not in its stats
                cold_start_unix_ns=cold,
                **measured,
            )
        except ValidationError as exc:
            self.counters.invalid += 1
            self._log_rate_limited("tailguard: invalid engine.finished dropped: %s", exc)
            return None

    # --- engine.stats ----------------------------------------------------------------------

    def _record_scheduler(self, scheduler_stats: object) -> None:
        self._observe_prefix_cache(scheduler_stats)
        now = self._mono()
        if self._last_stats_s is not None and now - self._last_stats_s < self.stats_interval_s:
            return
        event = self.stats_event(scheduler_stats)
        self._last_stats_s = now
        if event is not None:
            self.sink.emit(event)
            self.counters.stats_emitted += 1

    def _observe_prefix_cache(self, scheduler_stats: object) -> None:
        # Each SchedulerStats carries the prefix-cache lookups of its own step.
        pcs = getattr(scheduler_stats, "prefix_cache_stats", None)
        if pcs is None:
            pcs = getattr(scheduler_stats, "gpu_prefix_cache_stats", None)  # older v1 name
        if pcs is None:
            return
        if getattr(pcs, "reset", False):
            self._pc_queries = self._pc_hits = 0
        self._pc_queries += _count(getattr(pcs, "queries", 0))
        self._pc_hits += _count(getattr(pcs, "hits", 0))

    def stats_event(self, scheduler_stats: object) -> EngineStats | None:
        """``engine.stats`` from one ``SchedulerStats`` (prefix-cache hit rate over the
        lookups since the previous ``engine.stats``; None when there were none)."""
        usage = getattr(scheduler_stats, "kv_cache_usage", None)
        if usage is None:
            usage = getattr(scheduler_stats, "gpu_cache_usage", None)  # vLLM < 0.10
        hit_rate = self._pc_hits / self._pc_queries if self._pc_queries > 0 else None
        self._pc_queries = self._pc_hits = 0
        preempted, self._preempted = self._preempted, None if self._preempted is None else 0
        ts_ns = int(self._wall() * _NS)
        waiting = _count(getattr(scheduler_stats, "num_waiting_reqs", 0)) + _count(
            getattr(scheduler_stats, "num_skipped_waiting_reqs", 0)
        )
        try:
            return EngineStats(
                v=1,
                event_id=event_id_for(self.host, "engine.stats", str(ts_ns)),
                kind="engine.stats",
                ts_unix_ns=ts_ns,
                host=self.host,
                model=self.model,
                num_running=_count(getattr(scheduler_stats, "num_running_reqs", 0)),
                num_waiting=waiting,
                kv_cache_usage=_fraction(usage) or 0.0,
                prefix_cache_hit_rate=None if hit_rate is None else _fraction(hit_rate),
                gpu_memory_used_fraction=None,  # not in SchedulerStats
                preemptions=preempted,
            )
        except ValidationError as exc:
            self.counters.invalid += 1
            self._log_rate_limited("tailguard: invalid engine.stats dropped: %s", exc)
            return None

    # --- logging ---------------------------------------------------------------------------

    def _log_rate_limited(self, msg: str, *args: object, exc_info: bool = False) -> None:
        now = self._mono()
        if now - self._last_error_log >= 30.0:
            self._last_error_log = now
            log.warning(msg, *args, exc_info=exc_info)
