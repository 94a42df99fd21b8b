"""SLO compliance maths: an :class:`~pipeline.spec.slo.SLOSpec` compiled for records.

Pure: plain values in, counts out (no files, no Kafka, Faust or ClickHouse). The
spec itself (file format, validation, loading) is :mod:`pipeline.spec.slo`; a
spec names, per SLO, one boundary of :class:`~pipeline.core.record.RequestRecord`
(``gateway_total_ms``, ``inference_ms``, ...), a threshold and an objective.

What counts
-----------
For one SLO and one record, :meth:`SLOMatcher.classify` says ``"good"``, ``"bad"`` or
``"skip"`` (skipped records are in neither numerator nor denominator):

1. **Traffic selection.** Each ``filter`` list (``model``, ``priority``,
   ``ctx_bucket``, ``tenant``; ``stream``: true/false) must contain the
   record's value; a record without that value (``None``) does not match.
   ``exclude.prompt_tokens_over: N`` skips records with more than N prompt
   tokens (unknown prompt size is not excluded). Out of selection -> skip.
2. **Failures** (outcome ``error``, ``timeout``, ``rejected``; any unknown
   outcome is treated the same). ``errors: bad`` (default): bad whatever the
   latency -- a fast 503 is not a fast success -- *if the request reached the
   layer that measures the boundary*: gateway boundaries need the gateway's
   ``completed`` event, engine boundaries the engine's ``finished`` event,
   ``gateway_overhead_ms`` both. So a request the gateway rejected (never sent
   to an engine) is bad for a gateway SLO and absent from a pure-compute SLO.
   ``errors: exclude``: skip.
   **Retries.** A client retrying with the same request id makes attempts of one
   request (``RequestRecord.attempt``). ``attempts: every`` (default) counts each;
   ``attempts: last`` skips a failed attempt the client retried (``superseded``).
3. **Client aborts** (``client_abort``). ``client_abort: measure`` (default):
   judged like a success, by the time the client waited at that boundary.
   vLLM does not report aborts, so engine boundaries usually have no value and
   the abort is skipped there. ``client_abort: exclude``: skip.
4. **Latency.** Good iff ``value <= threshold_ms`` (equality is good); with
   ``threshold_strict`` good iff ``value < threshold_ms`` (equality is bad). No value
   at the boundary -> skip. One refinement: ``gateway_ttfb_ms`` is missing when
   no byte was ever sent; the client then waited ``gateway_total_ms`` without
   a first byte, so if *that* exceeds the threshold the first byte was
   certainly late -> bad (otherwise unknown -> skip). Without this, the worst
   time-to-first-byte cases (gave up waiting) would vanish from TTFB SLOs.

Compliance of an SLO is ``good / total`` over the non-skipped records
(:class:`SLOCounts`; ``None`` when nothing counted).

Blended tiers
-------------
``tiers: {name: {primary, secondary, secondary_weight: w, objective}}``. Over
the records the *primary* SLO counts (its denominator)::

    compliance = (good_primary + w * good_secondary_only) / total

where ``good_secondary_only`` are records bad for the primary but good for the
secondary (a secondary ``skip`` earns nothing). A tier uses its primary's window.

Counts are plain integers, so per-window or per-partition partials merge
exactly by addition (:meth:`SLOCounts.merge`, :meth:`BlendedCounts.merge`,
:meth:`SLOEvaluator.merge`). The evaluator counts every record it is given:
feed it one record per request (the final revision), not partial + upgrade.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from operator import attrgetter
from typing import Any, Final, Literal

import numpy as np
from numpy.typing import NDArray

from pipeline.contract.boundaries import QUEUE_BOUNDARIES
from pipeline.core.record import BOUNDARIES, RequestRecord
from pipeline.spec.slo import SLO, Filter, SLOSpec

Verdict = Literal["good", "bad", "skip"]

# Which record sources observed a boundary's layer (for rule 2 above).
_GATEWAY_SOURCES: Final = frozenset({"joined", "gateway_only"})
_ENGINE_SOURCES: Final = frozenset({"joined", "engine_only"})
_BOTH_SOURCES: Final = frozenset({"joined"})
_GATEWAY_BOUNDARIES: Final = frozenset({"gateway_total_ms", "gateway_ttfb_ms"})
_BOTH_BOUNDARIES: Final = frozenset({"gateway_overhead_ms"})
# A missing value at KEY means "never happened, waited at least VALUE" (rule 4).
_LOWER_BOUND: Final = {"gateway_ttfb_ms": "gateway_total_ms"}
LOWER_BOUNDS: Final = _LOWER_BOUND  # (what a reader counting in the engine compares too)
_BOUNDARY_COLUMN: Final = {name: j for j, name in enumerate(BOUNDARIES)}
_BOUNDARY_ROW: Final = attrgetter(*BOUNDARIES)  # a record's boundary values, one C call

FloatArray = NDArray[np.float64]
BoolArray = NDArray[np.bool_]
IntArray = NDArray[np.int64]


def boundary_table(records: Sequence[RequestRecord]) -> FloatArray:
    """The records' boundary values as an ``(n, len(BOUNDARIES))`` table, in
    ``BOUNDARIES`` order; a missing value (None) is NaN. One flat ``np.fromiter`` over the
    rows' values (half the CPU of ``np.array`` over a list of tuples, same values)."""
    k = len(BOUNDARIES)
    flat = itertools.chain.from_iterable(map(_BOUNDARY_ROW, records))
    return np.fromiter(flat, np.float64, len(records) * k).reshape(len(records), k)


class Categorical(Sequence[Any]):
    """A column of few distinct values (a model, an outcome, ...): each row's code into
    ``categories``. A sequence of the values; masks over it test each category once."""

    __slots__ = ("categories", "codes")

    def __init__(self, codes: IntArray, categories: Sequence[Any]) -> None:
        self.codes = codes
        self.categories = tuple(categories)

    @classmethod
    def of(cls, values: Sequence[Any]) -> Categorical:
        """The values, coded (in their first appearance's order)."""
        if isinstance(values, Categorical):
            return values
        index: dict[Any, int] = {}
        codes = np.fromiter((index.setdefault(v, len(index)) for v in values), np.int64)
        return cls(codes, list(index))

    def __len__(self) -> int:
        return len(self.codes)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return self.tolist()[i]
        return self.categories[self.codes[i]]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.tolist())

    def tolist(self) -> list[Any]:
        lookup = np.empty(len(self.categories), dtype=object)
        lookup[:] = self.categories
        values: list[Any] = lookup[self.codes].tolist()
        return values

    def take(self, rows: IntArray) -> Categorical:
        return Categorical(self.codes[rows], self.categories)

    def where(self, test: Callable[[Any], bool]) -> BoolArray:
        """Mask of the rows whose value passes ``test`` (called once per category)."""
        hits = [i for i, v in enumerate(self.categories) if test(v)]
        return np.isin(self.codes, hits)


# The record fields classify_many reads besides the boundaries (a batch given as columns
# must hold these: RecordColumns.of_fields).
CLASSIFY_FIELDS: Final = (
    "source", "outcome", "superseded", "model", "priority", "ctx_bucket", "tenant", "stream",
    "prompt_tokens",
)  # fmt: skip


class RecordColumns:
    """A batch of records as columns, for :meth:`SLOMatcher.classify_many`: each column
    is built once, when first asked for, and shared by every SLO of the batch. Made from
    the records, or (:meth:`of_fields`) from columns a reader already holds."""

    __slots__ = ("_cache", "_n", "records", "values")

    def __init__(self, records: Sequence[RequestRecord], values: FloatArray | None = None) -> None:
        self.records = records
        self.values = boundary_table(records) if values is None else values  # NaN = None
        self._cache: dict[Any, Any] = {}
        self._n = len(records)

    @classmethod
    def of_fields(cls, fields: Mapping[str, Sequence[Any]], values: FloatArray) -> RecordColumns:
        """A batch given as columns: ``fields`` maps at least :data:`CLASSIFY_FIELDS` to
        one value per record (the record's: None when missing), ``values`` is its
        :func:`boundary_table`."""
        cols = cls((), values)
        cols._n = len(values)
        cols._cache.update((name, fields[name]) for name in fields)
        return cols

    def __len__(self) -> int:
        return self._n

    def boundary(self, name: str) -> FloatArray:
        return self.values[:, _BOUNDARY_COLUMN[name]]

    def memo(self, key: Any, make: Callable[[], Any]) -> Any:
        """``make()``, computed once per batch for ``key`` (masks shared by windows)."""
        value = self._cache.get(key)
        if value is None:
            value = self._cache[key] = make()
        return value

    def column(self, name: str) -> list[Any]:
        """One field of every record, as a list."""
        col: list[Any] | None = self._cache.get(name)
        if col is None:
            if len(self.records) != self._n:
                raise KeyError(f"a batch given as columns has no field {name!r}")
            col = self._cache[name] = list(map(attrgetter(name), self.records))
        return col

    def member(self, name: str, allowed: frozenset[Any]) -> BoolArray:
        """Mask of the records whose field ``name`` is in ``allowed`` (None never is)."""
        col = self.column(name)
        if isinstance(col, Categorical):
            return col.where(allowed.__contains__)
        return np.fromiter(map(allowed.__contains__, col), np.bool_, len(col))

    def equal(self, name: str, value: Any) -> BoolArray:
        """Mask of the records whose field ``name`` is ``value`` (identity for
        True/False/None, equality otherwise); cached."""
        ck = f"{name}={value!r}"
        mask: BoolArray | None = self._cache.get(ck)
        if mask is None:
            col = self.column(name)
            same = value is None or isinstance(value, bool)
            if isinstance(col, Categorical):
                mask = col.where((lambda v: v is value) if same else (lambda v: v == value))
            else:
                if same:
                    it: Iterable[bool] = (v is value for v in col)
                else:
                    it = map(operator.eq, col, itertools.repeat(value))
                mask = np.fromiter(it, np.bool_, len(col))
            self._cache[ck] = mask
        return mask

    def numbers(self, name: str) -> FloatArray:
        """An optional numeric field as floats (None = NaN); cached."""
        ck = f"{name}#"
        arr: FloatArray | None = self._cache.get(ck)
        if arr is None:
            arr = self._cache[ck] = np.array(self.column(name), dtype=np.float64)
        return arr


# --------------------------------------------------------------------------- #
# Per-record classification (the hot path)
# --------------------------------------------------------------------------- #


class SLOMatcher:
    """An SLO compiled for the per-record path: frozensets, attrgetters, no allocation.

    :meth:`classify` says ``good``, ``bad`` or ``skip`` (see the module docstring).
    """

    __slots__ = (
        "aborts_measured",
        "boundary",
        "buckets",
        "errors_bad",
        "get",
        "last_attempt_only",
        "lower_bound",
        "max_prompt",
        "models",
        "observed",
        "priorities",
        "stream",
        "strict",
        "tenants",
        "threshold",
    )

    def __init__(self, slo: SLO) -> None:
        f = slo.filter or Filter()
        self.models: frozenset[str] | None = None if f.model is None else frozenset(f.model)
        self.priorities: frozenset[int] | None = (
            None if f.priority is None else frozenset(f.priority)
        )
        self.buckets: frozenset[str] | None = (
            None if f.ctx_bucket is None else frozenset(f.ctx_bucket)
        )
        self.tenants: frozenset[str] | None = None if f.tenant is None else frozenset(f.tenant)
        self.stream: bool | None = f.stream
        self.max_prompt: int | None = slo.exclude.prompt_tokens_over if slo.exclude else None
        self.errors_bad = slo.errors == "bad"
        self.aborts_measured = slo.client_abort == "measure"
        self.last_attempt_only = slo.attempts == "last"
        self.threshold = slo.threshold_ms
        self.strict = slo.threshold_strict
        self.boundary = slo.boundary
        self.get: Callable[[RequestRecord], float | None] = attrgetter(slo.boundary)
        lower = _LOWER_BOUND.get(slo.boundary)
        self.lower_bound: Callable[[RequestRecord], float | None] | None = (
            None if lower is None else attrgetter(lower)
        )
        if slo.boundary in _GATEWAY_BOUNDARIES:
            self.observed = _GATEWAY_SOURCES
        elif slo.boundary in _BOTH_BOUNDARIES:
            self.observed = _BOTH_SOURCES
        else:
            self.observed = _ENGINE_SOURCES

    def classify(self, r: RequestRecord) -> Verdict:
        # 1. traffic selection
        if r.superseded and self.last_attempt_only:
            return "skip"
        if self.models is not None and r.model not in self.models:
            return "skip"
        if self.priorities is not None and r.priority not in self.priorities:
            return "skip"
        if self.buckets is not None and r.ctx_bucket not in self.buckets:
            return "skip"
        if self.tenants is not None and r.tenant not in self.tenants:
            return "skip"
        if self.stream is not None and r.stream is not self.stream:
            return "skip"
        if self.max_prompt is not None:
            pt = r.prompt_tokens
            if pt is not None and pt > self.max_prompt:
                return "skip"
        # 2./3. outcome
        outcome = r.outcome
        if outcome != "ok":
            if outcome == "client_abort":
                if not self.aborts_measured:
                    return "skip"
            elif self.errors_bad:
                return "bad" if r.source in self.observed else "skip"
            else:
                return "skip"
        # 4. latency
        value = self.get(r)
        if value is None:
            if self.lower_bound is not None:
                waited = self.lower_bound(r)
                if waited is not None and waited > self.threshold:
                    return "bad"
            return "skip"
        if self.strict:
            return "good" if value < self.threshold else "bad"
        return "good" if value <= self.threshold else "bad"

    def classify_many(self, cols: RecordColumns) -> tuple[BoolArray, BoolArray]:
        """:meth:`classify` of every record of a batch at once: masks ``(counted,
        good)``; counted = not ``skip``, good = ``good`` (so bad = counted & ~good).
        Agrees with :meth:`classify` record by record (a boundary value is None or a
        number, never NaN: the contract rejects NaN)."""
        n = len(cols)
        sel = np.ones(n, dtype=np.bool_)
        # 1. traffic selection
        if self.last_attempt_only:
            sel &= ~cols.equal("superseded", True)
        for name, allowed in (
            ("model", self.models), ("priority", self.priorities),
            ("ctx_bucket", self.buckets), ("tenant", self.tenants),
        ):  # fmt: skip
            if allowed is not None:
                sel &= cols.member(name, allowed)
        if self.stream is not None:
            sel &= cols.equal("stream", self.stream)
        if self.max_prompt is not None:
            sel &= ~(cols.numbers("prompt_tokens") > self.max_prompt)  # NaN: not excluded
        # 2./3. outcome
        ok = cols.equal("outcome", "ok")
        abort = cols.equal("outcome", "client_abort")
        measured = ok | abort if self.aborts_measured else ok
        # 4. latency
        value = cols.boundary(self.boundary)
        if self.strict:
            good = measured & (value < self.threshold)  # NaN compares False
            late = value >= self.threshold
        else:
            good = measured & (value <= self.threshold)
            late = value > self.threshold
        if self.lower_bound is not None:
            late |= np.isnan(value) & (cols.boundary(_LOWER_BOUND[self.boundary]) > self.threshold)
        bad = measured & late
        if self.errors_bad:
            observed = np.zeros(n, dtype=np.bool_)
            for source in self.observed:
                observed |= cols.equal("source", source)
            bad |= ~ok & ~abort & observed
        return sel & (good | bad), sel & good

    def _measured(self, outcome: str) -> bool:
        return outcome == "ok" or (outcome == "client_abort" and self.aborts_measured)

    def measured_bad(self, r: RequestRecord) -> bool:
        """Whether the record is one of the SLO's *measured* bad requests: bad by its
        latency (rule 4) with a value at the boundary and a queue time, what the report
        splits into queueing and compute (is the burn load-caused?). A failure (rule 2)
        and a first byte missing past the threshold (rule 4's lower bound) are bad
        without a measured time."""
        return (
            self._measured(r.outcome)
            and self.get(r) is not None
            and r.queue_ms is not None
            and self.classify(r) == "bad"
        )

    def measured_bad_many(
        self, cols: RecordColumns, masks: tuple[BoolArray, BoolArray] | None = None
    ) -> BoolArray:
        """:meth:`measured_bad` of every record of a batch (``masks``: its
        :meth:`classify_many`, when computed already)."""
        counted, good = masks if masks is not None else self.classify_many(cols)
        measured = cols.equal("outcome", "ok")
        if self.aborts_measured:
            measured = measured | cols.equal("outcome", "client_abort")
        has_values = ~np.isnan(cols.boundary(self.boundary)) & ~np.isnan(cols.boundary("queue_ms"))
        return counted & ~good & measured & has_values

    def applies(self, record: RequestRecord) -> bool:
        """True when the record is in this SLO's denominator."""
        return self.classify(record) != "skip"

    def is_good(self, record: RequestRecord) -> bool:
        return self.classify(record) == "good"


# --------------------------------------------------------------------------- #
# Counts (mergeable)
# --------------------------------------------------------------------------- #


@dataclass(frozen=True, slots=True)
class SLOCounts:
    """Records counted by one SLO and how many were good; partials add up exactly."""

    total: int = 0
    good: int = 0

    def __post_init__(self) -> None:
        if not (0 <= self.good <= self.total):
            raise ValueError(f"need 0 <= good <= total, got good={self.good} total={self.total}")

    @property
    def bad(self) -> int:
        return self.total - self.good

    @property
    def compliance(self) -> float | None:
        return None if self.total == 0 else self.good / self.total

    def merge(self, other: SLOCounts) -> SLOCounts:
        return SLOCounts(self.total + other.total, self.good + other.good)

    __add__ = merge

    def error_budget_remaining(self, objective: float) -> float | None:
        """Share of the error budget left: 1 = none used, 0 = exhausted, < 0 = overspent."""
        if self.total == 0:
            return None
        allowed = (1.0 - objective) * self.total
        return 1.0 - self.bad / allowed


@dataclass(frozen=True, slots=True)
class BlendedCounts:
    """``(good_primary + w * good_secondary_only) / total`` over the primary's records."""

    secondary_weight: float
    total: int = 0
    good_primary: int = 0
    good_secondary_only: int = 0

    def __post_init__(self) -> None:
        if self.good_primary < 0 or self.good_secondary_only < 0:
            raise ValueError("counts must be >= 0")
        if self.good_primary + self.good_secondary_only > self.total:
            raise ValueError("good_primary + good_secondary_only must be <= total")

    @property
    def compliance(self) -> float | None:
        if self.total == 0:
            return None
        return (self.good_primary + self.secondary_weight * self.good_secondary_only) / self.total

    def merge(self, other: BlendedCounts) -> BlendedCounts:
        if not math.isclose(self.secondary_weight, other.secondary_weight):
            raise ValueError("cannot merge blended counts with different secondary weights")
        return BlendedCounts(
            self.secondary_weight,
            self.total + other.total,
            self.good_primary + other.good_primary,
            self.good_secondary_only + other.good_secondary_only,
        )

    __add__ = merge


class _TierAcc:
    __slots__ = ("good_primary", "good_secondary_only", "primary", "secondary", "total")

    def __init__(self, primary: int, secondary: int) -> None:
        self.primary = primary
        self.secondary = secondary
        self.total = 0
        self.good_primary = 0
        self.good_secondary_only = 0


class SLOEvaluator:
    """Accumulates :class:`SLOCounts` per SLO and :class:`BlendedCounts` per tier.

    Satisfies :class:`pipeline.core.windows.WindowSLOs` (``add(record)``), so
    ``lambda: SLOEvaluator(spec)`` is a per-window factory; partial evaluators
    of one spec combine with :meth:`merge`.
    """

    __slots__ = (
        "_bad_ms", "_bad_queue_ms", "_boundaries", "_classifiers", "_good", "_matchers",
        "_tiers", "_total", "_verdicts", "records", "spec",
    )  # fmt: skip

    def __init__(self, spec: SLOSpec) -> None:
        self.spec = spec
        self.records = 0
        self._matchers = [SLOMatcher(s) for s in spec.slos]
        self._classifiers = [m.classify for m in self._matchers]
        n = len(self._classifiers)
        self._total = [0] * n
        self._good = [0] * n
        self._verdicts: list[Verdict] = ["skip"] * n
        # Bad requests that reached an engine: queue time and boundary time, summed (a
        # boundary that excludes the queue: None, nothing summed). See :meth:`attribution`.
        self._boundaries = [
            s.boundary if s.boundary in QUEUE_BOUNDARIES else None for s in spec.slos
        ]
        self._bad_queue_ms = [0.0] * n
        self._bad_ms = [0.0] * n
        index = {s.name: i for i, s in enumerate(spec.slos)}
        self._tiers = {
            name: _TierAcc(index[t.primary], index[t.secondary]) for name, t in spec.tiers.items()
        }

    def add(self, record: RequestRecord, sign: int = 1) -> None:
        """Count one record; ``sign`` -1 takes back a record counted before (a partial
        replaced by its upgrade), so counts of a correction may be negative."""
        self.records += sign
        verdicts, total, good = self._verdicts, self._total, self._good
        for i, classify in enumerate(self._classifiers):
            v = classify(record)
            verdicts[i] = v
            if v != "skip":
                total[i] += sign
                if v == "good":
                    good[i] += sign
                elif (b := self._boundaries[i]) is not None:
                    q, x = record.queue_ms, record.boundary(b)
                    if q is not None and x is not None:
                        self._bad_queue_ms[i] += sign * q
                        self._bad_ms[i] += sign * x
        for acc in self._tiers.values():
            pv = verdicts[acc.primary]
            if pv == "skip":
                continue
            acc.total += sign
            if pv == "good":
                acc.good_primary += sign
            elif verdicts[acc.secondary] == "good":
                acc.good_secondary_only += sign

    def add_batch(self, cols: RecordColumns, rows: IntArray, signs: IntArray) -> None:
        """:meth:`add` of the records ``rows`` (indexes into ``cols``, in any order) with
        their ``signs``, vectorised: the same counts as one :meth:`add` per record."""
        if not len(rows):
            return
        self.records += int(signs.sum())
        counted: list[BoolArray] = []
        good: list[BoolArray] = []
        for i, matcher in enumerate(self._matchers):
            # every window's evaluator has the same spec: classify the batch once
            masks = cols.memo(("slo", id(self.spec), i), partial(matcher.classify_many, cols))
            c, g = masks[0][rows], masks[1][rows]
            counted.append(c)
            good.append(g)
            self._total[i] += int(signs[c].sum())
            self._good[i] += int(signs[g].sum())
            b = self._boundaries[i]
            if b is not None:
                bad = c & ~g
                if bad.any():
                    q = cols.boundary("queue_ms")[rows][bad]
                    x = cols.boundary(b)[rows][bad]
                    both = ~(np.isnan(q) | np.isnan(x))
                    sg = signs[bad][both]
                    self._bad_queue_ms[i] += float((sg * q[both]).sum())
                    self._bad_ms[i] += float((sg * x[both]).sum())
        for acc in self._tiers.values():
            c, g = counted[acc.primary], good[acc.primary]
            acc.total += int(signs[c].sum())
            acc.good_primary += int(signs[g].sum())
            acc.good_secondary_only += int(signs[c & ~g & good[acc.secondary]].sum())

    def add_many(self, records: Iterable[RequestRecord]) -> None:
        add = self.add
        for r in records:
            add(r)

    def merge(self, other: SLOEvaluator) -> None:
        """Add another evaluator's counts (same spec) into this one."""
        if other.spec != self.spec:
            raise ValueError("cannot merge evaluators of different specs")
        self.records += other.records
        for i in range(len(self._total)):
            self._total[i] += other._total[i]
            self._good[i] += other._good[i]
            self._bad_queue_ms[i] += other._bad_queue_ms[i]
            self._bad_ms[i] += other._bad_ms[i]
        for name, acc in self._tiers.items():
            o = other._tiers[name]
            acc.total += o.total
            acc.good_primary += o.good_primary
            acc.good_secondary_only += o.good_secondary_only

    def delta_counts(self) -> tuple[dict[str, tuple[int, int]], dict[str, tuple[int, int, int]]]:
        """Raw counts, which may be negative for a correction (see :meth:`add`):
        per SLO ``(total, good)``, per tier ``(total, good_primary, good_secondary_only)``."""
        slos = {s.name: (self._total[i], self._good[i]) for i, s in enumerate(self.spec.slos)}
        tiers = {
            name: (acc.total, acc.good_primary, acc.good_secondary_only)
            for name, acc in self._tiers.items()
        }
        return slos, tiers

    def attribution(self) -> dict[str, tuple[float, float]]:
        """Per SLO, its bad requests that reached an engine: ``(queue ms, boundary ms)``
        summed. Their ratio is how much of the burn was queueing (load-caused); an SLO
        whose boundary excludes the queue has ``(0, 0)``."""
        return {
            s.name: (self._bad_queue_ms[i], self._bad_ms[i]) for i, s in enumerate(self.spec.slos)
        }

    def counts(self) -> dict[str, SLOCounts]:
        return {
            s.name: SLOCounts(self._total[i], self._good[i]) for i, s in enumerate(self.spec.slos)
        }

    def blended_counts(self) -> dict[str, BlendedCounts]:
        return {
            name: BlendedCounts(
                self.spec.tiers[name].secondary_weight,
                acc.total,
                acc.good_primary,
                acc.good_secondary_only,
            )
            for name, acc in self._tiers.items()
        }

    def to_json(self) -> dict[str, Any]:
        return compliance_report(self.spec, self.counts(), self.blended_counts())


def compliance_report(
    spec: SLOSpec,
    counts: Mapping[str, SLOCounts],
    blended: Mapping[str, BlendedCounts],
) -> dict[str, Any]:
    """JSON-ready report of (possibly merged) counts.

    ``{"slos": {name: {total, good, compliance, objective, met, ...}},
    "blended": {...} | None, "tiers": {name: {...}}}``; ``blended`` is the tier
    named ``blended``, else the first tier. ``met`` is None when nothing counted.
    """
    slos: dict[str, Any] = {}
    for s in spec.slos:
        c = counts.get(s.name, SLOCounts())
        comp = c.compliance
        slos[s.name] = {
            "boundary": s.boundary,
            "threshold_ms": s.threshold_ms,
            "objective": s.objective,
            "window": s.window.describe(),
            "total": c.total,
            "good": c.good,
            "compliance": comp,
            "met": None if comp is None else comp >= s.objective,
            "error_budget_remaining": c.error_budget_remaining(s.objective),
        }
    tiers: dict[str, Any] = {}
    for name, t in spec.tiers.items():
        b = blended.get(name, BlendedCounts(t.secondary_weight))
        comp = b.compliance
        tiers[name] = {
            "primary": t.primary,
            "secondary": t.secondary,
            "secondary_weight": t.secondary_weight,
            "objective": t.objective,
            "total": b.total,
            "good_primary": b.good_primary,
            "good_secondary_only": b.good_secondary_only,
            "compliance": comp,
            "met": None if comp is None else comp >= t.objective,
        }
    default = spec.default_tier
    return {
        "slos": slos,
        "blended": None if default is None else tiers[default],
        "tiers": tiers,
    }
