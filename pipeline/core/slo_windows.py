"""SLO counts per window: the glue between :mod:`pipeline.core.slo` and the windows."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipeline.core.slo import SLOEvaluator

if TYPE_CHECKING:
    from pipeline.core.record import RequestRecord
    from pipeline.spec.slo import SLOSpec


@dataclass(frozen=True, slots=True)
class SLOWindowRow:
    slo: str
    kind: str  # "slo" | "blended"
    boundary: str
    threshold_ms: float
    objective: float
    total: int
    good: int  # for a blended tier: good on the primary
    good_secondary_only: int
    secondary_weight: float
    bad_queue_ms: float = 0.0  # SLOEvaluator.attribution: a control signal, not stored
    bad_ms: float = 0.0


class WindowSLOCounts(SLOEvaluator):
    """Per-window accumulator (satisfies ``pipeline.core.windows.WindowSLOs``): an
    evaluator (its ``add`` called per record, without a forwarding call) with rows.

    Counts may be negative in a correction (a partial record taken back when its
    upgrade lands in another window); they add up exactly with the window's rows.
    """

    __slots__ = ()

    def rows(self) -> list[SLOWindowRow]:
        spec = self.spec
        slos, tiers = self.delta_counts()
        attrib = self.attribution()
        out = [
            SLOWindowRow(
                s.name, "slo", s.boundary, s.threshold_ms, s.objective,
                slos[s.name][0], slos[s.name][1], 0, 0.0, *attrib[s.name],
            )
            for s in spec.slos
        ]  # fmt: skip
        for name, (total, good, good2) in tiers.items():
            tier = spec.tiers[name]
            out.append(
                SLOWindowRow(
                    name, "blended", "", 0.0, tier.objective,
                    total, good, good2, tier.secondary_weight,
                )
            )  # fmt: skip
        return out


def slo_factory(spec: SLOSpec | None) -> Callable[[], WindowSLOCounts] | None:
    """Per-window SLO counts of a loaded spec (the caller loads and validates it once, at
    start-up: a bad spec fails there); None without a spec."""
    if spec is None:
        return None
    return lambda: WindowSLOCounts(spec)


def covers_model(spec: SLOSpec, name: str, model: str) -> bool:
    """Whether the SLO (or blended tier, by its primary) ``name`` selects ``model``'s
    traffic (no ``filter.model``: every model); False for a name the spec lacks."""
    tier = spec.tiers.get(name)
    target = tier.primary if tier is not None else name
    try:
        slo = spec.slo(target)
    except KeyError:
        return False
    models = slo.filter.model if slo.filter is not None else None
    return models is None or model in models


def minute_rows(
    records: Iterable[RequestRecord], spec: SLOSpec, *, minute_ms: int = 60_000
) -> list[tuple[int, SLOWindowRow]]:
    """``(minute start, unix ms; row)``: the rows a window of each minute of the records'
    ends (``end_unix_ns``, the window time) holds, counted by the stream's own
    evaluator, in (minute, spec) order. An exact recount over stored records (the
    report's per-model SLO table)."""
    by_minute: dict[int, WindowSLOCounts] = {}
    for r in records:
        t = r.end_unix_ns // 1_000_000
        start = t - t % minute_ms
        acc = by_minute.get(start)
        if acc is None:
            acc = by_minute[start] = WindowSLOCounts(spec)
        acc.add(r)
    return [(t, row) for t in sorted(by_minute) for row in by_minute[t].rows()]
