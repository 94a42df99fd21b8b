"""Drive vLLM's real front-end stats path on CPU, the way vLLM's own tests do.

vLLM's ``tests/v1/engine/test_output_processor.py`` feeds an
``OutputProcessor(tokenizer=None, log_stats=True)`` with synthetic
``EngineCoreOutput``s; :class:`VllmDriver` does the same and hands each
iteration's ``IterationStats`` and a ``SchedulerStats`` to vLLM's own
``StatLoggerManager``, built exactly as ``AsyncLLM`` builds it: with the stat
loggers that vLLM loads from the ``vllm.stat_logger_plugins`` entry points
(so the tailguard plugin is found, constructed with ``(vllm_config,
engine_index)`` and configured from ``TAILGUARD_*``, as under ``vllm serve``).

Only the engine core (the scheduler and the model) is synthetic: the engine
timestamps (QUEUED, SCHEDULED, each token) are chosen by the caller, so the
durations the plugin reports are known exactly. Needs ``vllm`` (``./tg
vllm-test``); importing this module imports vLLM.

Usage (e.g. from a fake OpenAI upstream behind the gateway proxy, one call per
HTTP request, with the X-Request-Id the proxy sent)::

    driver = VllmDriver(settings, served_model_name="tiny-chat")
    driver.run([DrivenRequest(f"chatcmpl-{x_request_id}", prompt_tokens=12,
                              output_tokens=5, queue_s=0.02, prefill_s=0.03,
                              tpot_s=0.01)])
    driver.flush()   # the plugin's Kafka sink
    driver.close()
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm.config import DeviceConfig, ModelConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.v1.engine import (
    EngineCoreEvent,
    EngineCoreEventType,
    EngineCoreOutput,
    EngineCoreRequest,
    FinishReason,
)
from vllm.v1.engine.output_processor import OutputProcessor
from vllm.v1.metrics.loggers import StatLoggerManager, load_stat_logger_plugin_factories
from vllm.v1.metrics.stats import IterationStats, PrefillStats, PrefixCacheStats, SchedulerStats

from pipeline.settings import Settings
from producers import vllm_plugin

# A model config vLLM can parse offline; no weights and no tokenizer are loaded.
_TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 1,
    "vocab_size": 256,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float32",
}


@dataclass(frozen=True)
class DrivenRequest:
    """One request as the engine core would run it (durations in seconds)."""

    vllm_request_id: str  # vLLM's external id: "chatcmpl-<X-Request-Id>" / "cmpl-<id>-0"
    prompt_tokens: int = 16
    output_tokens: int = 4  # 0: aborted while queued (never scheduled)
    queue_s: float = 0.010  # QUEUED -> SCHEDULED
    prefill_s: float = 0.020  # SCHEDULED -> first token
    tpot_s: float = 0.005  # between output tokens
    frontend_s: float = 0.001  # arrival in the front end -> QUEUED in the engine core
    cached_tokens: int = 0
    finish_reason: str = "length"  # a vLLM FinishReason name: stop, length, abort, ...

    @property
    def decode_s(self) -> float:
        return max(self.output_tokens - 1, 0) * self.tpot_s

    @property
    def e2e_s(self) -> float:
        """Arrival -> last token, as planned (vLLM measures it on the wall clock)."""
        if self.output_tokens == 0:
            return self.frontend_s + self.queue_s
        return self.frontend_s + self.queue_s + self.prefill_s + self.decode_s


@contextmanager
def _env(values: Mapping[str, str]) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def tiny_vllm_config(served_model_name: str, model_dir: Path) -> VllmConfig:
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(_TINY_LLAMA))
    mc = ModelConfig(
        model=str(model_dir),
        served_model_name=served_model_name,
        skip_tokenizer_init=True,
        dtype="float32",
    )
    return VllmConfig(model_config=mc, device_config=DeviceConfig(device="cpu"))


class VllmDriver:
    """vLLM's OutputProcessor + StatLoggerManager (with the entry-point plugins) on CPU."""

    def __init__(
        self,
        settings: Settings,
        *,
        served_model_name: str = "tiny-chat",
        engine_idx: int = 0,
        vllm_plugins: str = "tailguard",
    ) -> None:
        self.engine_idx = engine_idx
        self._tmp = tempfile.TemporaryDirectory(prefix="tg-vllm-")
        self.vllm_config = tiny_vllm_config(served_model_name, Path(self._tmp.name) / "model")
        # What `vllm serve` sees: TAILGUARD_* for the plugin, VLLM_PLUGINS to select it.
        with _env(settings.to_env() | {"VLLM_PLUGINS": vllm_plugins}):
            self.factories = load_stat_logger_plugin_factories()
            self.manager = StatLoggerManager(
                vllm_config=self.vllm_config,
                engine_idxs=[engine_idx],
                custom_stat_loggers=self.factories,
                enable_default_loggers=False,
            )
        self.manager.log_engine_initialized()
        self.processor = OutputProcessor(tokenizer=None, log_stats=True)
        self._lock = threading.Lock()
        self._seq = 0
        self.arrival_wall_s: dict[str, float] = {}  # vLLM external id -> arrival_time given

    @property
    def plugin(self) -> vllm_plugin.TailguardStatLogger:
        """The tailguard logger vLLM built for this engine."""
        for agg in self.manager.stat_loggers:
            per_engine: dict[int, Any] = getattr(agg, "per_engine_stat_loggers", {})
            logger = per_engine.get(self.engine_idx)
            if isinstance(logger, vllm_plugin.TailguardStatLogger):
                return logger
        raise LookupError("vLLM did not load the tailguard stat-logger plugin")

    def run(
        self,
        requests: Sequence[DrivenRequest],
        *,
        num_waiting: int = 0,
        kv_cache_usage: float = 0.25,
    ) -> None:
        """Run ``requests`` concurrently through the front-end stats path, to the end."""
        with self._lock:
            self._run(requests, num_waiting, kv_cache_usage)

    def _run(
        self, requests: Sequence[DrivenRequest], num_waiting: int, kv_cache_usage: float
    ) -> None:
        wall0, mono0 = time.time(), time.monotonic()
        span = max((r.e2e_s for r in requests), default=0.0)
        # (engine timestamp, internal id, output) for every engine-core output.
        steps: list[tuple[float, int, str, EngineCoreOutput]] = []
        prefills: dict[str, DrivenRequest] = {}
        for r in requests:
            self._seq += 1
            internal = f"{r.vllm_request_id}-{self._seq:08x}"  # vLLM appends a random suffix
            # Requests end "now": arrival and engine instants are placed before it.
            arrival = wall0 - r.e2e_s
            self.arrival_wall_s[r.vllm_request_id] = arrival
            t_queued = mono0 - span + r.frontend_s
            self.processor.add_request(
                EngineCoreRequest(
                    request_id=internal,
                    external_req_id=r.vllm_request_id,
                    prompt_token_ids=list(range(r.prompt_tokens)),
                    mm_features=None,
                    sampling_params=SamplingParams(
                        max_tokens=max(r.output_tokens, 1), detokenize=False
                    ),
                    pooling_params=None,
                    arrival_time=arrival,
                    lora_request=None,
                    cache_salt=None,
                    data_parallel_rank=None,
                ),
                prompt=None,
            )
            queued = EngineCoreEvent.new_event(EngineCoreEventType.QUEUED, t_queued)
            if r.output_tokens == 0:
                steps.append(
                    (
                        t_queued + r.queue_s,
                        0,
                        internal,
                        EngineCoreOutput(
                            request_id=internal,
                            new_token_ids=[],
                            finish_reason=FinishReason.ABORT,
                            events=[queued],
                        ),
                    )
                )
                continue
            t_sched = t_queued + r.queue_s
            t_first = t_sched + r.prefill_s
            prefill_stats = PrefillStats()
            prefill_stats.set(
                num_prompt_tokens=r.prompt_tokens,
                num_local_cached_tokens=r.cached_tokens,
                num_external_cached_tokens=0,
            )
            prefills[internal] = r
            for k in range(r.output_tokens):
                last = k == r.output_tokens - 1
                out = EngineCoreOutput(
                    request_id=internal,
                    new_token_ids=[k % 256],
                    finish_reason=FinishReason[r.finish_reason.upper()] if last else None,
                )
                if k == 0:
                    out.events = [
                        queued,
                        EngineCoreEvent.new_event(EngineCoreEventType.SCHEDULED, t_sched),
                    ]
                    out.prefill_stats = prefill_stats
                steps.append((t_first + k * r.tpot_s, k, internal, out))
        steps.sort(key=lambda s: (s[0], s[1], s[2]))
        running = {s[2] for s in steps}
        i = 0
        while i < len(steps):
            ts = steps[i][0]
            batch = []
            while i < len(steps) and steps[i][0] == ts:
                batch.append(steps[i][3])
                i += 1
            iteration = IterationStats()
            self.processor.process_outputs(batch, ts, iteration)
            pcs = PrefixCacheStats()
            for out in batch:
                pr = prefills.get(out.request_id)
                if pr is not None and out.prefill_stats is not None:
                    pcs.record(pr.prompt_tokens, pr.cached_tokens, preempted=False)
            sched = SchedulerStats(
                num_running_reqs=len(running),
                num_waiting_reqs=num_waiting,
                kv_cache_usage=kv_cache_usage,
                prefix_cache_stats=pcs,
            )
            self.processor.update_scheduler_stats(sched)
            self.manager.record(sched, iteration, engine_idx=self.engine_idx)
            running -= {o.request_id for o in batch if o.finish_reason is not None}

    def flush(self, timeout_s: float = 30.0) -> int:
        """Deliver what the plugin emitted; the number of events still undelivered."""
        return self.plugin.sink.flush(timeout_s)

    def close(self) -> None:
        vllm_plugin.close_shared_sinks()
        self._tmp.cleanup()
