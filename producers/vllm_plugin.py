"""tailguard's vLLM stat-logger plugin (the only tailguard module that imports vLLM).

Installed with ``pip install 'tailguard[vllm]'``, it is registered under the
entry-point group ``vllm.stat_logger_plugins`` (name ``tailguard``), so
``vllm serve`` loads it with no code change; ``VLLM_PLUGINS`` (a comma list
of plugin names, when set) must include ``tailguard``. vLLM builds one logger
per engine index (``PerEngineStatLoggerAdapter``) with
``(vllm_config, engine_index)`` and calls ``record(...)`` after each batch of
engine outputs in the front-end process; a custom logger turns vLLM's stats
on even with ``--disable-log-stats``. Supported: vLLM >= 0.20, the first
release whose ``FinishedRequestStats`` carries the request id.

Per call of ``record``: one ``engine.finished`` per finished request and, at
most every ``TAILGUARD_ENGINE_STATS_INTERVAL_MS``, one ``engine.stats`` — see
:mod:`producers.vllm_stats` for the field mapping and the clocks. Events go
to the process's one :class:`producers.emit.KafkaSink` (a bounded buffer
drained by a background thread: ``record`` never blocks on Kafka and never
raises); settings come from the ``TAILGUARD_*`` environment
(:class:`pipeline.kafka_settings.EmitterSettings`).
"""

from __future__ import annotations

import atexit
import logging
import socket
import threading
from typing import Any

from vllm.v1.metrics.loggers import StatLoggerBase

from pipeline.kafka_settings import EmitterSettings
from producers.emit import EventSink, KafkaSink, open_kafka_sink
from producers.vllm_stats import EngineRecorder

log = logging.getLogger(__name__)

SERVICE = "vllm"

_sink_lock = threading.Lock()
_sinks: dict[tuple[str, ...], KafkaSink] = {}


def shared_sink(settings: EmitterSettings) -> KafkaSink:
    """The process's one Kafka sink for these settings (closed, with a flush, at exit)."""
    key = (settings.bootstrap_servers, settings.lifecycle_topic, settings.engine_stats_topic)
    with _sink_lock:
        sink = _sinks.get(key)
        if sink is None:
            sink = _sinks[key] = open_kafka_sink(settings, service=SERVICE)
            atexit.register(sink.close)
        return sink


def close_shared_sinks(timeout_s: float = 10.0) -> None:
    """Flush and close every shared sink (tests, embedding; vLLM itself relies on atexit)."""
    with _sink_lock:
        sinks = list(_sinks.values())
        _sinks.clear()
    for sink in sinks:
        sink.close(timeout_s)


def served_model_name(vllm_config: Any) -> str:
    """The name clients use (``--served-model-name``, first of several), else the model path."""
    mc = getattr(vllm_config, "model_config", None)
    name = getattr(mc, "served_model_name", None)
    if isinstance(name, (list, tuple)):
        name = name[0] if name else None
    if not name:
        name = getattr(mc, "model", None)
    return str(name)[:256] if name else "unknown"


class TailguardStatLogger(StatLoggerBase):  # type: ignore[misc]  # Any without vLLM
    """Emits tailguard contract v1 engine events from vLLM's stats.

    ``sink`` and ``settings`` are for tests and embedding; vLLM passes neither
    (then settings come from the environment and the sink is :func:`shared_sink`).
    """

    def __init__(
        self,
        vllm_config: Any,
        engine_index: int = 0,
        *,
        sink: EventSink | None = None,
        settings: EmitterSettings | None = None,
    ) -> None:
        self.settings = settings if settings is not None else EmitterSettings()
        self.engine_index = engine_index
        self.model = served_model_name(vllm_config)
        self.base_host = self.settings.engine_host or socket.gethostname()
        self.sink: EventSink = sink if sink is not None else shared_sink(self.settings)
        self._recorders: dict[int, EngineRecorder] = {}
        self._reported: tuple[int, ...] = ()
        self.recorder(engine_index)

    def recorder(self, engine_idx: int) -> EngineRecorder:
        rec = self._recorders.get(engine_idx)
        if rec is None:
            rec = self._recorders[engine_idx] = EngineRecorder(
                self.sink,
                model=self.model,
                host=f"{self.base_host}/engine{engine_idx}",
                stats_interval_ms=self.settings.engine_stats_interval_ms,
                cold_start_window_ms=self.settings.cold_start_window_ms,
            )
        return rec

    def record(
        self,
        scheduler_stats: Any,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        try:
            self.recorder(engine_idx).record(scheduler_stats, iteration_stats)
        except Exception:  # never raise into vLLM
            log.exception("tailguard: record() failed")

    def log_engine_initialized(self) -> None:
        log.info(
            "tailguard: engine %d of model %r emits to %s (topics %s, %s) as %s",
            self.engine_index,
            self.model,
            self.settings.bootstrap_servers,
            self.settings.lifecycle_topic,
            self.settings.engine_stats_topic,
            self.recorder(self.engine_index).host,
        )

    def log(self) -> None:
        """Called by vLLM every few seconds: warn when events were lost since the last call."""
        try:
            lost = self.lost()
            if any(lost) and lost != self._reported:
                log.warning(
                    "tailguard: events lost so far: %d dropped by the producer, "
                    "%d failed delivery, %d invalid, %d without request id, %d record errors",
                    *lost,
                )
            self._reported = lost
        except Exception:
            log.exception("tailguard: log() failed")

    def lost(self) -> tuple[int, int, int, int, int]:
        sc = getattr(self.sink, "counters", None)
        rs = [r.counters for r in self._recorders.values()]
        return (
            int(getattr(sc, "events_dropped", 0)),
            int(getattr(sc, "events_failed", 0)),
            sum(c.invalid for c in rs),
            sum(c.without_request_id for c in rs),
            sum(c.errors for c in rs),
        )
