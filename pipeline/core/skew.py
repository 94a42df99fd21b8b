"""Clock skew between gateway and engine hosts, estimated from the data.

For a joined request, ``a = engine_arrival_unix_ns - gateway_received_unix_ns``
mixes the engine's and the gateway's wall clocks. With the NTP assumption
(the gateway's time before the engine equals its time after), the engine
clock's offset from the gateway clock is ``a - gateway_overhead_ms / 2``.
This is the one place tailguard subtracts timestamps of two hosts, and only
to *report* the skew: no measurement is corrected with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.core.record import RequestRecord
from pipeline.core.sketch import QuantileSketch


@dataclass(slots=True)
class SkewEstimator:
    _pairs: dict[tuple[str, str], QuantileSketch] = field(default_factory=dict)

    def add(self, rec: RequestRecord) -> None:
        if (
            rec.gateway_received_unix_ns is None
            or rec.engine_arrival_unix_ns is None
            or rec.gateway_overhead_ms is None
            or rec.gateway_host is None
            or rec.engine_host is None
        ):
            return
        arrival_gap_ms = (rec.engine_arrival_unix_ns - rec.gateway_received_unix_ns) / 1e6
        offset_ms = arrival_gap_ms - rec.gateway_overhead_ms / 2
        pair = (rec.gateway_host, rec.engine_host)
        sk = self._pairs.get(pair)
        if sk is None:
            sk = self._pairs[pair] = QuantileSketch()
        sk.add(offset_ms)

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
