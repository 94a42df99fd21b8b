"""The vLLM plugin's translation, on fakes shaped like vLLM's stats dataclasses (no vLLM).

The same code runs on vLLM's real classes in tests/integration/test_vllm_plugin.py
(``./tg vllm-test``); these fakes copy the field names of vLLM 0.33's
``FinishedRequestStats``, ``IterationStats``, ``SchedulerStats`` and ``PrefixCacheStats``.
"""

from __future__ import annotations

import enum
import importlib
import logging
import subprocess
import sys
import tomllib
import types
from dataclasses import dataclass, field
from typing import Any

import pytest

from pipeline.contract.events import EngineFinished, EngineStats
from pipeline.settings import Settings
from producers.vllm_stats import EngineRecorder, event_id_for, gateway_request_id
from tests.gateway_fixtures import MemorySink
from tests.paths import REPO

WALL = 1_800_000_000.0  # seconds since epoch, the fake wall clock


class FinishReason(enum.IntEnum):  # vllm.v1.engine.FinishReason
    STOP = 0
    LENGTH = 1
    ABORT = 2
    ERROR = 3
    REPETITION = 4
    MYSTERY = 9

    def __str__(self) -> str:
        return self.name.lower()


@dataclass
class Finished:  # vllm.v1.metrics.stats.FinishedRequestStats (0.33)
    finish_reason: Any
    request_id: str | None = "chatcmpl-r1"
    e2e_latency: float = 0.5
    num_prompt_tokens: int = 100
    num_preemptions: int = 0
    num_generation_tokens: int = 20
    max_tokens_param: int | None = None
    queued_time: float = 0.1
    prefill_time: float = 0.05
    inference_time: float = 0.35
    decode_time: float = 0.3
    mean_time_per_output_token: float = 0.0
    is_corrupted: bool = False
    num_cached_tokens: int = 64


@dataclass
class Finished019:  # vLLM 0.19: no request_id, no num_preemptions
    finish_reason: Any
    e2e_latency: float = 0.5
    num_prompt_tokens: int = 100
    num_generation_tokens: int = 20
    queued_time: float = 0.1
    prefill_time: float = 0.05
    inference_time: float = 0.35
    decode_time: float = 0.3
    num_cached_tokens: int = 0


@dataclass
class Iteration:  # IterationStats
    iteration_timestamp: float = WALL
    finished_requests: list[Any] = field(default_factory=list)
    num_preempted_reqs: int = 0


@dataclass
class OldIteration:  # IterationStats without num_preempted_reqs
    iteration_timestamp: float = WALL
    finished_requests: list[Any] = field(default_factory=list)


@dataclass
class PrefixCache:  # PrefixCacheStats
    reset: bool = False
    requests: int = 0
    queries: int = 0
    hits: int = 0


@dataclass
class Scheduler:  # SchedulerStats
    num_running_reqs: int = 3
    num_waiting_reqs: int = 2
    num_skipped_waiting_reqs: int = 1
    kv_cache_usage: float = 0.4
    prefix_cache_stats: PrefixCache = field(default_factory=PrefixCache)


@dataclass
class OldScheduler:  # v1 before the rename
    num_running_reqs: int = 1
    num_waiting_reqs: int = 0
    gpu_cache_usage: float = 0.7


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def finished_of(sink: MemorySink) -> list[EngineFinished]:
    return [e for e in sink.events if isinstance(e, EngineFinished)]


def stats_of(sink: MemorySink) -> list[EngineStats]:
    return [e for e in sink.events if isinstance(e, EngineStats)]


def recorder(
    sink: Any, *, interval_ms: int = 1000, wall: float = WALL + 0.002, mono: Clock | None = None
) -> EngineRecorder:
    return EngineRecorder(
        sink,
        model="llama-70b",
        host="gpu-1/engine0",
        stats_interval_ms=interval_ms,
        wall_clock_s=Clock(wall),
        monotonic_s=mono or Clock(100.0),
    )


@pytest.mark.parametrize(
    ("vllm_id", "gateway_id"),
    [
        ("chatcmpl-abc123", "abc123"),
        ("chatcmpl-1b4e28ba-2fa1-11d2-883f-0016d3cca427", "1b4e28ba-2fa1-11d2-883f-0016d3cca427"),
        ("cmpl-abc123-0", "abc123"),
        ("cmpl-1b4e28ba-2fa1-11d2-883f-0016d3cca427-0", "1b4e28ba-2fa1-11d2-883f-0016d3cca427"),
        ("cmpl-abc-12-3", "abc-12"),  # only the prompt index vLLM appended is removed
        ("cmpl-abc", "abc"),
        ("cmpl-abc-x", "abc-x"),
        ("plain-id", "plain-id"),
        ("chatcmpl-", "chatcmpl-"),
        ("cmpl-", "cmpl-"),
        ("cmpl--0", "-0"),
    ],
)
def test_gateway_request_id_strips_vllm_prefixes(vllm_id: str, gateway_id: str) -> None:
    assert gateway_request_id(vllm_id) == gateway_id


def test_finished_request_becomes_engine_finished_with_wall_clock_arrival() -> None:
    sink = MemorySink()
    rec = recorder(sink)
    rec.record(None, Iteration(finished_requests=[Finished(FinishReason.LENGTH)]))
    [ev] = finished_of(sink)
    assert isinstance(ev, EngineFinished)
    assert ev.request_id == "r1"
    assert ev.host == "gpu-1/engine0"
    assert ev.model == "llama-70b"
    assert ev.ts_unix_ns == int(WALL * 1e9)  # the iteration's wall clock, not record()'s
    assert ev.arrival_unix_ns == int(WALL * 1e9) - 500_000_000
    assert (ev.queue_ms, ev.prefill_ms, ev.decode_ms, ev.inference_ms) == pytest.approx(
        (100.0, 50.0, 300.0, 350.0)
    )
    assert ev.e2e_ms == pytest.approx(500.0)
    assert (ev.prompt_tokens, ev.output_tokens, ev.cached_tokens) == (100, 20, 64)
    assert ev.finish_reason == "length"
    assert ev.preemptions == 0
    assert ev.priority is None
    assert rec.counters.finished_emitted == 1


def test_event_id_is_deterministic_so_a_resend_is_a_duplicate() -> None:
    a, b = MemorySink(), MemorySink()
    recorder(a).record(None, Iteration(finished_requests=[Finished(FinishReason.STOP)]))
    recorder(b, wall=WALL + 5).record(
        None, Iteration(finished_requests=[Finished(FinishReason.STOP)])
    )
    assert (
        a.events[0].event_id == b.events[0].event_id == "gpu-1/engine0:chatcmpl-r1:engine.finished"
    )
    # another engine finishing the same gateway request is a different event (a conflict)
    c = MemorySink()
    EngineRecorder(c, model="m", host="gpu-2/engine0").record(
        None, Iteration(finished_requests=[Finished(FinishReason.STOP)])
    )
    assert c.events[0].event_id != a.events[0].event_id


def test_long_ids_are_hashed_within_the_contract_limit() -> None:
    long = "x" * 200
    eid = event_id_for("gpu-1/engine0", long, "engine.finished")
    assert len(eid) <= 128
    assert eid == event_id_for("gpu-1/engine0", long, "engine.finished")
    assert eid != event_id_for("gpu-1/engine0", long + "y", "engine.finished")


def test_monotonic_iteration_timestamp_falls_back_to_the_wall_clock_at_record() -> None:
    sink = MemorySink()
    rec = recorder(sink, wall=WALL + 7.0)
    rec.record(
        None,
        Iteration(iteration_timestamp=12_345.6, finished_requests=[Finished(FinishReason.STOP)]),
    )
    [ev] = finished_of(sink)
    assert ev.ts_unix_ns == int((WALL + 7.0) * 1e9)
    assert ev.arrival_unix_ns == ev.ts_unix_ns - 500_000_000


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        (FinishReason.STOP, "stop"),
        (FinishReason.LENGTH, "length"),
        (FinishReason.ABORT, "abort"),
        (FinishReason.ERROR, "error"),
        (FinishReason.REPETITION, "stop"),
        ("length", "length"),
    ],
)
def test_finish_reasons(reason: Any, expected: str) -> None:
    sink = MemorySink()
    recorder(sink).record(None, Iteration(finished_requests=[Finished(reason)]))
    assert finished_of(sink)[0].finish_reason == expected


def test_unknown_finish_reason_is_counted_not_raised() -> None:
    sink = MemorySink()
    rec = recorder(sink)
    rec.record(None, Iteration(finished_requests=[Finished(FinishReason.MYSTERY)]))
    assert sink.events == []
    assert rec.counters.invalid == 1


def test_abort_while_queued_is_all_queue_and_no_compute() -> None:
    # What vLLM really reports for it (see tests/integration/test_vllm_plugin.py):
    # scheduled_ts and first_token_ts unset -> negative queue, prefill = engine uptime.
    fr = Finished(
        FinishReason.ABORT,
        e2e_latency=0.8,
        queued_time=-8_000.2,
        prefill_time=8_000.3,
        inference_time=8_000.3,
        decode_time=0.0,
        num_generation_tokens=0,
    )
    sink = MemorySink()
    recorder(sink).record(None, Iteration(finished_requests=[fr]))
    [ev] = finished_of(sink)
    assert ev.queue_ms == pytest.approx(800.0)
    assert (ev.prefill_ms, ev.decode_ms, ev.inference_ms) == (0.0, 0.0, 0.0)
    assert ev.finish_reason == "abort"


def test_span_longer_than_the_request_is_an_unset_timestamp() -> None:
    fr = Finished(FinishReason.ABORT, e2e_latency=0.5, queued_time=0.1, prefill_time=9_000.0)
    sink = MemorySink()
    recorder(sink).record(None, Iteration(finished_requests=[fr]))
    assert finished_of(sink)[0].prefill_ms == 0.0
    assert finished_of(sink)[0].queue_ms == pytest.approx(100.0)


def test_vllm_before_0_20_has_no_request_id_nothing_to_join() -> None:
    sink = MemorySink()
    rec = recorder(sink)
    rec.record(None, Iteration(finished_requests=[Finished019(FinishReason.STOP)]))
    rec.record(None, Iteration(finished_requests=[Finished(FinishReason.STOP, request_id=None)]))
    assert sink.events == []
    assert rec.counters.without_request_id == 2


def test_invalid_event_is_counted_and_the_rest_of_the_iteration_still_emitted() -> None:
    sink = MemorySink()
    rec = recorder(sink)
    too_long = Finished(FinishReason.STOP, request_id="chatcmpl-" + "x" * 300)
    ok = Finished(FinishReason.STOP, request_id="chatcmpl-ok")
    rec.record(None, Iteration(finished_requests=[too_long, ok]))
    assert [e.request_id for e in sink.events] == ["ok"]
    assert rec.counters.invalid == 1


class ExplodingSink(MemorySink):
    def emit(self, event: Any) -> None:
        raise RuntimeError("boom")


def test_record_never_raises_into_vllm(caplog: pytest.LogCaptureFixture) -> None:
    rec = recorder(ExplodingSink())
    with caplog.at_level(logging.WARNING):
        rec.record(Scheduler(), Iteration(finished_requests=[Finished(FinishReason.STOP)]))
        rec.record(Scheduler(), Iteration(finished_requests=5))  # type: ignore[arg-type]
    assert rec.counters.errors == 2
    assert "record() failed" in caplog.text


def test_engine_stats_at_most_every_interval() -> None:
    sink = MemorySink()
    mono = Clock(100.0)
    rec = recorder(sink, interval_ms=1000, mono=mono)
    times = [100.0, 100.4, 100.99, 101.0, 101.5, 102.2, 102.3]
    for t in times:
        mono.t = t
        rec.record(Scheduler(), None)
    stats = stats_of(sink)
    assert len(stats) == 3  # at 100.0, 101.0, 102.2
    s = stats[0]
    assert (s.num_running, s.num_waiting, s.kv_cache_usage) == (3, 3, 0.4)
    assert s.host == "gpu-1/engine0"
    assert s.request_id == ""
    assert rec.counters.stats_emitted == 3


def test_engine_stats_event_ids_differ_over_time() -> None:
    sink = MemorySink()
    mono, wall = Clock(0.0), Clock(WALL)
    rec = EngineRecorder(
        sink, model="m", host="h/engine0", stats_interval_ms=10, wall_clock_s=wall, monotonic_s=mono
    )
    for i in range(3):
        mono.t = wall.t = WALL + i
        rec.record(Scheduler(), None)
    assert len({e.event_id for e in sink.events}) == 3


def test_prefix_cache_hit_rate_over_the_steps_since_the_last_stats() -> None:
    sink = MemorySink()
    mono = Clock(0.0)
    rec = recorder(sink, interval_ms=1000, mono=mono)
    rec.record(Scheduler(prefix_cache_stats=PrefixCache(requests=1, queries=100, hits=50)), None)
    mono.t = 0.5
    rec.record(Scheduler(prefix_cache_stats=PrefixCache(requests=1, queries=100, hits=100)), None)
    mono.t = 0.7
    rec.record(Scheduler(prefix_cache_stats=PrefixCache(requests=1, queries=200, hits=0)), None)
    mono.t = 1.0
    rec.record(Scheduler(), None)  # no lookups in this step
    mono.t = 2.0
    rec.record(Scheduler(), None)
    mono.t = 2.5
    rec.record(Scheduler(prefix_cache_stats=PrefixCache(reset=True, queries=10, hits=10)), None)
    mono.t = 3.0
    rec.record(Scheduler(prefix_cache_stats=PrefixCache(queries=10, hits=0)), None)
    rates = [e.prefix_cache_hit_rate for e in stats_of(sink)]
    assert rates == [0.5, pytest.approx(100 / 300), None, 0.5]


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        # (time, preempted in the step or None for an IterationStats without the field,
        #  whether the scheduler stats come with the step); engine.stats at 0, 1, 2, 3
        pytest.param(
            [(0.0, 2, True), (0.5, 3, False), (0.9, 0, False), (1.0, 1, True),
             (2.0, 0, True), (3.0, 4, True)],
            [2, 4, 0, 4], id="summed-between-stats",
        ),
        pytest.param(
            [(0.0, None, True), (1.0, None, True)], [None, None], id="vllm-without-the-field"
        ),
        pytest.param(
            [(0.0, None, True), (0.5, 5, False), (1.0, 0, True), (2.0, 0, True)],
            [None, 5, 0], id="known-from-the-first-report",
        ),
    ],
)  # fmt: skip
def test_engine_stats_count_the_preemptions_since_the_last_stats(
    steps: list[tuple[float, int | None, bool]], expected: list[int | None]
) -> None:
    sink = MemorySink()
    mono = Clock(0.0)
    rec = recorder(sink, interval_ms=1000, mono=mono)
    for t, preempted, with_stats in steps:
        mono.t = t
        it = OldIteration() if preempted is None else Iteration(num_preempted_reqs=preempted)
        rec.record(Scheduler() if with_stats else None, it)
    assert [e.preemptions for e in stats_of(sink)] == expected


def test_old_kv_cache_usage_name_and_clamping() -> None:
    sink = MemorySink()
    mono = Clock(0.0)
    rec = recorder(sink, interval_ms=1, mono=mono)
    rec.record(OldScheduler(), None)
    mono.t = 1.0
    rec.record(Scheduler(kv_cache_usage=1.0000001), None)
    assert [e.kv_cache_usage for e in stats_of(sink)] == [0.7, 1.0]
    assert stats_of(sink)[0].num_waiting == 0


def test_stats_interval_zero_means_no_engine_stats() -> None:
    sink = MemorySink()
    rec = recorder(sink, interval_ms=0)
    rec.record(Scheduler(), Iteration(finished_requests=[Finished(FinishReason.STOP)]))
    assert [e.kind for e in sink.events] == ["engine.finished"]


def test_settings_for_the_plugin_come_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TAILGUARD_ENGINE_STATS_INTERVAL_MS", "250")
    monkeypatch.setenv("TAILGUARD_ENGINE_HOST", "node-7")
    s = Settings()
    assert (s.engine_stats_interval_ms, s.engine_host) == (250, "node-7")


# --- the plugin module, with a stand-in for vLLM's StatLoggerBase (the real one:
# --- tests/integration/test_vllm_plugin.py) ------------------------------------------------


@pytest.fixture
def plugin_module(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    class StatLoggerBase:  # the abstract base in vllm.v1.metrics.loggers
        pass

    for name in ("vllm", "vllm.v1", "vllm.v1.metrics"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    loggers = types.ModuleType("vllm.v1.metrics.loggers")
    loggers.StatLoggerBase = StatLoggerBase  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm.v1.metrics.loggers", loggers)
    monkeypatch.delitem(sys.modules, "producers.vllm_plugin", raising=False)
    module = importlib.import_module("producers.vllm_plugin")
    monkeypatch.delitem(sys.modules, "producers.vllm_plugin")
    return module


def _config(served: Any, model: str = "/models/llama") -> Any:
    return types.SimpleNamespace(
        model_config=types.SimpleNamespace(served_model_name=served, model=model)
    )


def test_plugin_names_the_model_and_engine_and_dispatches_by_engine_index(
    plugin_module: types.ModuleType,
) -> None:
    sink = MemorySink()
    settings = Settings(engine_host="node-1", engine_stats_interval_ms=0)
    logger = plugin_module.TailguardStatLogger(
        _config(["llama-70b", "alias"]), 1, sink=sink, settings=settings
    )
    logger.record(None, Iteration(finished_requests=[Finished(FinishReason.STOP)]), None, 1)
    logger.record(None, Iteration(finished_requests=[Finished(FinishReason.STOP)]), engine_idx=2)
    assert [(e.model, e.host) for e in sink.events] == [
        ("llama-70b", "node-1/engine1"),
        ("llama-70b", "node-1/engine2"),
    ]
    assert plugin_module.served_model_name(_config(None)) == "/models/llama"
    assert plugin_module.served_model_name(types.SimpleNamespace(model_config=None)) == "unknown"


def test_plugin_passes_the_cold_start_window_to_each_engine_recorder(
    plugin_module: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TAILGUARD_COLD_START_WINDOW_MS", "30000")
    settings = Settings(engine_host="node-1", engine_stats_interval_ms=0)
    logger = plugin_module.TailguardStatLogger(
        _config("llama-70b"), 0, sink=MemorySink(), settings=settings
    )
    for idx in (0, 3):
        rec = logger.recorder(idx)
        assert rec.cold_start_window_ns == 30_000 * 1_000_000
        assert rec.started_unix_ns > 0  # the engine's start: the recorder's creation


def test_plugin_log_warns_once_per_change_of_losses(
    plugin_module: types.ModuleType, caplog: pytest.LogCaptureFixture
) -> None:
    sink = MemorySink()
    logger = plugin_module.TailguardStatLogger(
        _config("m"), 0, sink=sink, settings=Settings(engine_host="n")
    )
    with caplog.at_level(logging.WARNING, logger="producers.vllm_plugin"):
        logger.log()
        assert caplog.records == []
        sink.counters.events_dropped = 3
        logger.log()
        logger.log()
    assert len(caplog.records) == 1
    assert "3 dropped by the producer" in caplog.text
    logger.log_engine_initialized()


def test_entry_point_and_extra_are_declared() -> None:
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    target = meta["entry-points"]["vllm.stat_logger_plugins"]["tailguard"]
    assert target == "producers.vllm_plugin:TailguardStatLogger"
    assert any(r.startswith("vllm") for r in meta["optional-dependencies"]["vllm"])


def test_tailguard_never_imports_vllm_outside_the_plugin() -> None:
    code = (
        "import sys, pipeline.cli, producers.emit, producers.vllm_stats; "
        "assert not [m for m in sys.modules if m == 'vllm' or m.startswith('vllm.')], 'vllm'"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)
    offenders = [
        p.relative_to(REPO)
        for d in ("pipeline", "producers")
        for p in (REPO / d).rglob("*.py")
        if p.name != "vllm_plugin.py"
        and any(
            line.startswith(("import vllm", "from vllm")) for line in p.read_text().splitlines()
        )
    ]
    assert offenders == []
