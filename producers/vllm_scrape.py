"""Scrape unmodified vLLM engines' ``/metrics`` and emit ``engine.stats`` (thin adapter).

``tailguard vllm-scrape --url http://engine:8000/metrics [--url ...] --interval-s 1``:
every interval, a GET of each endpoint (no ``Accept``: vLLM answers in the Prometheus text
format), :func:`producers.vllm_metrics.parse_exposition`, and
:class:`producers.vllm_metrics.ScrapeStats` turn it into the events our stat-logger plugin
would send; they go to the lifecycle topic (or a JSON Lines file) through an
:class:`~producers.emit.EventSink`. A failed scrape (refused, timed out, not vLLM's text)
is counted and logged once a minute per endpoint; the loop goes on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx

from producers.emit import EventSink
from producers.vllm_metrics import ExpositionError, ScrapeStats, parse_exposition

log = logging.getLogger("tailguard.vllm_scrape")

LOG_EVERY_S = 60.0


@dataclass
class Endpoint:
    url: str
    stats: ScrapeStats
    failures: int = 0
    scrapes: int = 0
    _logged_at: float = field(default=-LOG_EVERY_S)


def default_host(url: str) -> str:
    """``engine-1:8000`` for ``http://engine-1:8000/metrics``."""
    return urlsplit(url).netloc or url


class VllmScraper:
    """Scrapes ``urls`` into ``sink``; :meth:`scrape_once` is one round, :meth:`run` loops."""

    def __init__(
        self,
        urls: Sequence[str],
        sink: EventSink,
        *,
        hosts: Sequence[str] | None = None,
        model: str | None = None,
        timeout_s: float = 2.0,
        get: Callable[[str], str] | None = None,
        wall_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        names = list(hosts) if hosts else [default_host(u) for u in urls]
        if len(names) != len(urls):
            raise ValueError("give one host name per --url (or none)")
        self.endpoints = [
            Endpoint(u, ScrapeStats(h, model)) for u, h in zip(urls, names, strict=True)
        ]
        self.sink = sink
        self._client = httpx.Client(timeout=timeout_s) if get is None else None
        self._get = get or self._http_get
        self._wall_ns = wall_ns
        self.emitted = 0

    def _http_get(self, url: str) -> str:
        assert self._client is not None
        r = self._client.get(url)
        r.raise_for_status()
        return r.text

    def scrape_once(self) -> int:
        """One GET per endpoint; the events emitted."""
        n = 0
        for ep in self.endpoints:
            ep.scrapes += 1
            try:
                engines = parse_exposition(self._get(ep.url))
            except (httpx.HTTPError, ExpositionError) as exc:
                ep.failures += 1
                now = time.monotonic()
                if now - ep._logged_at >= LOG_EVERY_S:
                    ep._logged_at = now
                    log.warning("%s: scrape failed (%d so far): %s", ep.url, ep.failures, exc)
                continue
            for ev in ep.stats.events(engines, self._wall_ns()):
                self.sink.emit(ev)
                n += 1
        self.emitted += n
        return n

    def run(self, stop: threading.Event, interval_s: float = 1.0) -> None:
        """Scrape every ``interval_s`` until ``stop`` is set (then flush the sink)."""
        while not stop.is_set():
            started = time.monotonic()
            self.scrape_once()
            stop.wait(max(interval_s - (time.monotonic() - started), 0.0))
        self.sink.flush()

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
