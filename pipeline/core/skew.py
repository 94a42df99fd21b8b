"""Clock skew between gateway and engine hosts, estimated from the data.

For a joined request, ``a = engine_arrival_unix_ns - gateway_received_unix_ns``
mixes the engine's and the gateway's wall clocks. With the NTP assumption
(the gateway's time before the engine equals its time after), the engine
clock's offset from the gateway clock is ``a - gateway_overhead_ms / 2``.
This is the one place tailguard subtracts timestamps of two hosts, and only
to *report* the skew: no measurement is corrected with it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from pipeline.core.record import RequestRecord
from pipeline.core.sketch import QuantileSketch


def offset_ms(rec: RequestRecord) -> float | None:
    """The engine clock's offset from the gateway's (ms) that a joined record shows, None
    when it shows none (not joined, or a timestamp or the overhead missing). The one rule:
    the stream's estimate, the windows' per-window sketches of it
    (``pipeline.core.window_counts``) and the report's read of it (its SQL twin,
    ``pipeline.adapters.queries.requests._SKEW_MS``, held equal by a test)."""
    received, arrival, overhead = (
        rec.gateway_received_unix_ns, rec.engine_arrival_unix_ns, rec.gateway_overhead_ms
    )  # fmt: skip
    if rec.source != "joined" or received is None or arrival is None or overhead is None:
        return None
    return (arrival - received) / 1e6 - overhead / 2


# Offsets are kept per window as counts of 0.1 ms buckets (pipeline.core.window_counts):
# they add up over windows, and their median is the exact median's to 0.05 ms. Absolute,
# not relative: a skew is a difference of two clocks, read to 0.1 ms by the report (a
# sketch of 1 % relative error was 0.35 s off on a gateway 5 minutes slow, up to 3 s).
OFFSET_BUCKETS_PER_MS: Final = 10


def offset_bucket(offset: float) -> int:
    """The 0.1 ms bucket of an offset (ms): the nearest multiple of 0.1 ms, in tenths."""
    return math.floor(offset * OFFSET_BUCKETS_PER_MS + 0.5)


def median_offset_ms(buckets: Mapping[int, int]) -> float | None:
    """The median of bucketed offsets (``offset_bucket`` -> how many) as ClickHouse's
    ``quantileExact(0.5)`` picks it (the element at sorted index ``floor(n / 2)``), to
    its bucket: within 0.05 ms of the exact one. None when there is none."""
    n = sum(buckets.values())
    if n <= 0:
        return None
    seen = 0
    for key in sorted(buckets):
        seen += buckets[key]
        if seen > n // 2:
            return key / OFFSET_BUCKETS_PER_MS
    raise ValueError("bucket counts must not be negative")


@dataclass(slots=True)
class SkewEstimator:
    _pairs: dict[tuple[str, str], QuantileSketch] = field(default_factory=dict)

    def add(self, rec: RequestRecord) -> None:
        offset = offset_ms(rec)
        if offset is None or rec.gateway_host is None or rec.engine_host is None:
            return
        pair = (rec.gateway_host, rec.engine_host)
        sk = self._pairs.get(pair)
        if sk is None:
            sk = self._pairs[pair] = QuantileSketch()
        sk.add(offset)

    def report(self) -> dict[str, dict[str, float | int | None]]:
        """Per ``gateway->engine`` pair: samples and the offset's P10/P50/P90 (ms)."""
        return {
            f"{g}->{e}": {
                "samples": sk.count,
                "offset_p10_ms": sk.quantile(0.1),
                "offset_p50_ms": sk.quantile(0.5),
                "offset_p90_ms": sk.quantile(0.9),
            }
            for (g, e), sk in sorted(self._pairs.items())
        }
