"""SLO counts per window: the glue between :mod:`pipeline.core.slo` and the windows."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from pipeline.core.slo import BoolArray, IntArray, RecordColumns, SLOEvaluator

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


@dataclass(frozen=True, slots=True)
class SLOBadRow:
    """An SLO's measured bad requests of one model in a window
    (:meth:`pipeline.core.slo.SLOMatcher.measured_bad`): how many, and their queue time
    and boundary time summed (signed in a correction): is the burn load-caused?"""

    slo: str
    model: str
    bad_measured: int
    bad_queue_ms: float
    bad_ms: float


class WindowSLOCounts(SLOEvaluator):
    """Per-window accumulator (satisfies ``pipeline.core.windows.WindowSLOs``): an
    evaluator with rows, and per SLO and model its measured bad requests (:meth:`bad_rows`).

    Counts may be negative in a correction (a partial record taken back when its
    upgrade lands in another window); they add up exactly with the window's rows.
    """

    __slots__ = ("_bad",)

    def __init__(self, spec: SLOSpec) -> None:
        super().__init__(spec)
        # (SLO index, model) -> [bad_measured, bad_queue_ms, bad_ms]
        self._bad: dict[tuple[int, str], list[float]] = {}

    def _count_bad(self, i: int, model: str, sign: int, queue_ms: float, value_ms: float) -> None:
        acc = self._bad.get((i, model))
        if acc is None:
            acc = self._bad[(i, model)] = [0, 0.0, 0.0]
        acc[0] += sign
        acc[1] += sign * queue_ms
        acc[2] += sign * value_ms

    def add(self, record: RequestRecord, sign: int = 1) -> None:
        super().add(record, sign)
        queue_ms = record.queue_ms
        for i, matcher in enumerate(self._matchers):
            value = matcher.get(record)
            if value is not None and queue_ms is not None and matcher.measured_bad(record):
                self._count_bad(i, record.model, sign, queue_ms, value)

    def add_batch(self, cols: RecordColumns, rows: IntArray, signs: IntArray) -> None:
        """:meth:`add` of each of the records ``rows`` with its sign, in order (the sums
        in the same order: the same floats)."""
        super().add_batch(cols, rows, signs)
        if not len(rows):
            return
        models: list[str] = cols.column("model")
        queue = cols.boundary("queue_ms")
        for i, matcher in enumerate(self._matchers):
            bad = self._measured_bad(cols, i)[rows]
            if not bad.any():
                continue
            value = cols.boundary(matcher.boundary)
            for j, s in zip(rows[bad].tolist(), signs[bad].tolist(), strict=True):
                self._count_bad(i, models[j], s, float(queue[j]), float(value[j]))

    def _measured_bad(self, cols: RecordColumns, i: int) -> BoolArray:
        """SLO ``i``'s ``measured_bad_many`` of the batch, computed once per batch (from
        its classification, shared with the SLO counts)."""
        matcher = self._matchers[i]

        def make() -> BoolArray:
            classified = partial(matcher.classify_many, cols)
            return matcher.measured_bad_many(cols, cols.memo(("slo", id(self.spec), i), classified))

        mask: BoolArray = cols.memo(("measured_bad", id(self.spec), i), make)
        return mask

    def bad_rows(self) -> list[SLOBadRow]:
        """Per SLO and model with measured bad requests (or a sum left by take-backs)."""
        names = [s.name for s in self.spec.slos]
        return [
            SLOBadRow(names[i], model, int(n), q, x)
            for (i, model), (n, q, x) in sorted(self._bad.items())
            if n or q or x
        ]

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
