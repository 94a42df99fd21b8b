"""Workers' /metrics for the tests that scrape them with a real Prometheus: each state
counts windows with its own counters and is served on a port of its own until the end."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from pipeline.adapters.prometheus import MetricsServer, MetricsState
from pipeline.core.slo_exposition import WindowCounters


@contextmanager
def served_workers(
    counters: Callable[[], WindowCounters], n: int = 2
) -> Iterator[tuple[list[MetricsState], list[MetricsServer]]]:
    """``n`` workers' metrics states, each counting with a fresh ``counters()``, and their
    servers (closed at the end)."""
    states = [MetricsState() for _ in range(n)]
    for s in states:
        s.use_counters(counters())
    servers = [MetricsServer(s) for s in states]
    try:
        yield states, servers
    finally:
        for srv in servers:
            srv.close()
