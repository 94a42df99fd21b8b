"""vLLM's own Prometheus metrics -> contract v1 ``engine.stats`` events (pure: text in,
events out; no HTTP, no vLLM import).

For engines that cannot load our stat-logger plugin (:mod:`producers.vllm_plugin`): the
scraper (:mod:`producers.vllm_scrape`) reads an unmodified vLLM's ``/metrics`` and this
module turns each scrape into the ``engine.stats`` events the plugin would send, so the
worker and the controller get the same queue signals (``queue_saturation``,
``queue.depth_ratio``, load-caused burns).

What is read (vLLM's V1 engine, 0.10 and later; labels ``model_name`` and ``engine``, the
data-parallel engine index; the V0 engine had no ``engine`` label):

==========================================  ============  ==================================
vLLM metric                                 type          ``engine.stats`` field
==========================================  ============  ==================================
``vllm:num_requests_running``               gauge         ``num_running``
``vllm:num_requests_waiting``               gauge         ``num_waiting``
``vllm:kv_cache_usage_perc`` (0..1; before  gauge         ``kv_cache_usage``
0.10 ``vllm:gpu_cache_usage_perc``)
``vllm:prefix_cache_hits_total`` /          counters      ``prefix_cache_hit_rate``: hits /
``vllm:prefix_cache_queries_total`` (before               queries since the previous scrape
0.10 ``vllm:gpu_prefix_cache_*``)                         (None: first scrape, no queries,
                                                          or a counter reset)
``vllm:num_preemptions_total``              counter       ``preemptions``: preempted since
                                                          the previous scrape (None: first
                                                          scrape, absent, or a counter
                                                          reset); their sum:
                                                          :attr:`ScrapeStats.preemptions`
==========================================  ============  ==================================

``gpu_memory_used_fraction`` is not among vLLM's metrics (None, as the plugin sends).
``host``: the name given to the scraper, with ``/<engine>`` when the endpoint serves more
than one engine. ``model``: vLLM's ``model_name`` label (its served model name) unless the
scraper is told another. The event's time is the scrape's (the wall clock of the scraping
host, as for any emitter).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Final

from pydantic import ValidationError

from pipeline.contract.events import EngineStats
from producers.vllm_stats import event_id_for

# sample name -> field; the first name present wins (newer names first)
RUNNING: Final = ("vllm:num_requests_running",)
WAITING: Final = ("vllm:num_requests_waiting",)
KV_CACHE: Final = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
PREFIX_QUERIES: Final = ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")
PREFIX_HITS: Final = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
PREEMPTIONS: Final = ("vllm:num_preemptions_total",)
_READ: Final = frozenset({*RUNNING, *WAITING, *KV_CACHE, *PREFIX_QUERIES, *PREFIX_HITS,
                          *PREEMPTIONS})  # fmt: skip


class ExpositionError(ValueError):
    """The scraped text is not Prometheus exposition, or has no vLLM scheduler gauges."""


@dataclass(frozen=True, slots=True)
class EngineGauges:
    """One engine's figures in one scrape."""

    model: str
    engine: str
    num_running: float
    num_waiting: float
    kv_cache_usage: float | None
    prefix_cache_queries: float | None
    prefix_cache_hits: float | None
    preemptions: float | None


def _first(values: dict[str, float], names: Sequence[str]) -> float | None:
    for n in names:
        if n in values:
            return values[n]
    return None


# One sample line of the text format: name, {labels}, value, optional timestamp.
_SAMPLE_LINE: Final = re.compile(
    r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?[ \t]+(\S+)(?:[ \t]+\S+)?[ \t]*$"
)
_LABEL: Final = re.compile(
    r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\]|\\.)*)"[ \t]*,?'
)
_UNESCAPE: Final = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def _labels(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    pos = 0
    while pos < len(text):
        m = _LABEL.match(text, pos)
        if m is None:
            raise ExpositionError(f"bad labels: {{{text}}}")
        out[m.group(1)] = re.sub(r"\\[\\\"n]", lambda e: _UNESCAPE[e.group(0)], m.group(2))
        pos = m.end()
    return out


def _samples(text: str) -> Iterator[tuple[str, dict[str, str], float]]:
    """The samples of the metrics this module reads (Prometheus text format 0.0.4; the
    OpenMetrics text reads the same for gauges and ``_total`` counters). Own parser: the
    emitters' base install has no prometheus_client."""
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue  # comments, other exporters' metrics, anything that is not ours
        m = _SAMPLE_LINE.match(line)
        if m is None or m.group(1) not in _READ:
            continue
        try:
            value = float(m.group(3))
        except ValueError as exc:
            raise ExpositionError(f"bad value in {line!r}") from exc
        yield m.group(1), _labels(m.group(2) or ""), value


def parse_exposition(text: str) -> list[EngineGauges]:
    """The engines of one vLLM ``/metrics`` text (Prometheus text format 0.0.4, what vLLM
    serves a scraper that asks for nothing else), sorted by (model, engine)."""
    by_engine: dict[tuple[str, str], dict[str, float]] = {}
    for name, labels, value in _samples(text):
        key = (labels.get("model_name", ""), labels.get("engine", "0"))
        by_engine.setdefault(key, {})[name] = value
    out = []
    for (model, engine), values in sorted(by_engine.items()):
        running, waiting = _first(values, RUNNING), _first(values, WAITING)
        if running is None or waiting is None:
            continue  # not a scheduler's engine (a metric of another kind with the labels)
        out.append(
            EngineGauges(
                model,
                engine,
                running,
                waiting,
                _first(values, KV_CACHE),
                _first(values, PREFIX_QUERIES),
                _first(values, PREFIX_HITS),
                _first(values, PREEMPTIONS),
            )
        )
    if not out:
        raise ExpositionError("no vllm:num_requests_running / vllm:num_requests_waiting")
    return out


def _count(x: float) -> int:
    return max(round(x), 0)


def _fraction(x: float | None) -> float:
    if x is None or math.isnan(x):
        return 0.0
    return min(max(x, 0.0), 1.0)


@dataclass
class ScrapeStats:
    """Scrapes of one endpoint -> ``engine.stats`` events; remembers each engine's
    counters of the previous scrape (prefix-cache hit rate, preemptions since)."""

    host: str
    model: str | None = None  # override vLLM's model_name label
    preemptions: int = 0  # preemptions sent since the scraper started (events' sum)
    invalid: int = 0  # figures the contract refused (counted, dropped)
    _last: dict[str, tuple[float | None, float | None, float | None]] = field(default_factory=dict)

    def events(self, engines: Iterable[EngineGauges], ts_unix_ns: int) -> list[EngineStats]:
        engines = list(engines)
        several = len({e.engine for e in engines}) > 1
        out: list[EngineStats] = []
        for e in engines:
            host = f"{self.host}/{e.engine}" if several else self.host
            before = self._last.get(host)
            self._last[host] = (e.prefix_cache_queries, e.prefix_cache_hits, e.preemptions)
            hit_rate, preempted = None, None
            if before is not None:
                q0, h0, p0 = before
                if None not in (q0, h0, e.prefix_cache_queries, e.prefix_cache_hits):
                    dq = e.prefix_cache_queries - q0  # type: ignore[operator]
                    dh = e.prefix_cache_hits - h0  # type: ignore[operator]
                    if dq > 0 and 0 <= dh <= dq:
                        hit_rate = dh / dq
                if p0 is not None and e.preemptions is not None and e.preemptions >= p0:
                    preempted = _count(e.preemptions - p0)
            try:
                out.append(
                    EngineStats(
                        v=1,
                        event_id=event_id_for(host, "engine.stats", str(ts_unix_ns)),
                        kind="engine.stats",
                        ts_unix_ns=ts_unix_ns,
                        host=host,
                        model=self.model or e.model or "unknown",
                        num_running=_count(e.num_running),
                        num_waiting=_count(e.num_waiting),
                        kv_cache_usage=_fraction(e.kv_cache_usage),
                        prefix_cache_hit_rate=hit_rate,
                        gpu_memory_used_fraction=None,
                        preemptions=preempted,
                    )
                )
            except ValidationError:
                self.invalid += 1
                continue
            self.preemptions += preempted or 0
        return out
