"""What one benchmark run hands every section: its mode, sizes, work folder and broker.

Kept apart from :mod:`bench.run` (the command) and :mod:`bench.results` (sections and
the results file), which both use it, so neither imports the other for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class Sizes:
    """What each mode measures."""

    batched_instances: int  # request instances of the batched workload (~58k events each)
    single_instances: int  # ... of the one-event-per-message workload
    profile_s: float  # profiled worker run (pyinstrument), seconds after its first batch
    accuracy_instances: int
    inflight_requests: int  # join state measured with this many open requests
    rss_warmup_s: float  # constant-load RSS run: not fitted (the join's memory fills)
    rss_s: float  # ... then this long, fitted
    rss_rate_ev_s: float
    detection_runs: int  # detection at the target rate, each on its own broker


# The RSS run's warm-up is the join's memory of resolved requests (600 s of event time,
# JoinConfig.resolved_ttl_ms) plus a minute: until then RSS grows by design.
QUICK = Sizes(5, 2, 15, 3, 50_000, 30, 60, 10_000, 1)
FULL = Sizes(52, 6, 40, 12, 200_000, 660, 600, 10_000, 3)


@dataclass(slots=True)
class Context:
    mode: str
    sizes: Sizes
    workdir: Path
    shared: dict[str, Any] = field(default_factory=dict)  # results sections reuse
    _kafka: Any = None

    def bootstrap(self) -> str:
        if self._kafka is None:
            from tools.dev.kafka_local import LocalKafka

            # Production brokers wait 3 s before the first rebalance of a new group
            # (the local default for tests is 0): two workers started together then
            # share the first generation.
            self._kafka = LocalKafka(
                self.workdir / "kafka",
                heap="2g",
                extra_config={"group.initial.rebalance.delay.ms": "3000"},
            ).start()
        return str(self._kafka.bootstrap_servers)

    def close(self) -> None:
        if self._kafka is not None:
            self._kafka.stop()
            self._kafka = None
