"""The source documents' capacity model, fitted to measured requests (pure).

The documents' model: an instance's throughput rises with its concurrency
and so does its P99 (their example: 8 concurrent -> P99 210 ms, 38 req/s;
16 -> 290 ms, 62 req/s; 32 -> 440 ms, 89 req/s; 64 -> 680 ms, 102 req/s), so
the usable throughput per instance is the one at the highest concurrency that
still holds the P99 target, and a fleet is sized to run at no more than 70 %
of it::

    instances = ceil(target QPS / (throughput per instance x 0.7))

Here the matrix is measured, not assumed. For every engine instance and every
``bucket_ms`` of its own clock:

* **concurrency** = time-average of requests in the engine (queued or
  running): the sum of each request's overlap with the bucket, from its
  arrival to its last token (``engine_arrival`` + ``engine_e2e_ms``, one host's
  clock), divided by the bucket length (Little's law);
* **throughput** = requests finished in the bucket per second;
* the latencies of the requests finished in the bucket (the boundary of the
  target, e.g. ``engine_e2e_ms``: queue included) and their compute time
  (``inference_ms``).

Buckets are grouped by concurrency level (powers of two: a bucket with mean
concurrency c goes to 2^round(log2 c); idle buckets, c < 0.5, are left out),
and per level: P99 (element ``floor(0.99 n)`` of the sorted values, exact),
mean compute time, throughput per instance. The first and last bucket of each
instance are left out (partly observed). Levels with fewer than
``min_requests`` requests are shown (``thin``) but never chosen.

How much data stands behind a level's P99: its request count and a
distribution-free 95 % confidence interval of the P99 (order statistics: the
number of requests below the true P99 is binomial(n, 0.99)). With fewer than
368 requests the interval has no upper bound: such a P99 says little.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Final, TypedDict, Unpack

UTILISATION: Final = 0.7


@dataclass(frozen=True, slots=True)
class Sample:
    """One finished request as the engine measured it."""

    model: str
    instance: str  # engine host
    arrival_ms: float  # engine wall clock
    e2e_ms: float  # arrival -> last token (queue included)
    compute_ms: float  # scheduled -> last token
    latency_ms: float  # the value at the target's boundary


@dataclass(frozen=True, slots=True)
class Level:
    concurrency: int  # the level (power of two)
    mean_concurrency: float  # measured, over the level's buckets
    buckets: int
    requests: int
    p99_ms: float
    p99_compute_ms: float
    mean_compute_ms: float
    mean_latency_ms: float
    throughput_rps: float  # per instance
    littles_law_rps: float  # mean concurrency / mean e2e: the theoretical maximum at that level
    holds_target: bool
    # 95 % confidence interval of the P99 (None: unbounded, too few requests)
    p99_ci_low_ms: float | None = None
    p99_ci_high_ms: float | None = None
    thin: bool = False  # fewer than min_requests: shown, never chosen


@dataclass(frozen=True, slots=True)
class ModelCapacity:
    model: str
    instances_observed: int
    target_p99_ms: float
    levels: tuple[Level, ...]
    chosen: Level | None  # highest-throughput level holding the target (None: none does)
    peak_qps: float  # highest total finish rate observed over the model's instances
    utilisation: float = UTILISATION
    instances_needed: dict[float, int] = field(default_factory=dict)  # target QPS -> instances

    @property
    def per_instance_rps(self) -> float | None:
        return None if self.chosen is None else self.chosen.throughput_rps


def exact_quantile(sorted_values: Sequence[float], q: float) -> float:
    """Element ``floor(q * n)`` (clamped): ClickHouse ``quantileExact``."""
    return sorted_values[min(int(q * len(sorted_values)), len(sorted_values) - 1)]


def quantile_ci_ranks(
    n: int, q: float = 0.99, confidence: float = 0.95
) -> tuple[int | None, int | None]:
    """1-based ranks ``(l, u)`` of the order statistics bounding the ``q`` quantile with
    at least ``confidence`` (``P(x_(l) <= ξ_q <= x_(u))``); None where no rank of ``n``
    values is far enough out (the bound is unbounded)."""
    if n <= 0:
        return None, None
    alpha = (1.0 - confidence) / 2
    # pmf of Binomial(n, q) by recurrence in log space, for the CDF
    log_q, log_p = math.log(q), math.log1p(-q)
    cdf = 0.0
    lower: int | None = None
    upper: int | None = None
    for k in range(n + 1):
        log_pmf = math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
        cdf += math.exp(log_pmf + k * log_q + (n - k) * log_p)
        # cdf = P(B <= k): rank k + 1 is a lower bound while P(B <= k) <= alpha
        if cdf <= alpha and k + 1 <= n:
            lower = k + 1
        if upper is None and cdf >= 1.0 - alpha and k + 1 <= n:
            upper = k + 1
            break
    return lower, upper


def p99_ci(sorted_values: Sequence[float]) -> tuple[float | None, float | None]:
    """The 95 % confidence interval of the P99 of ``sorted_values`` (order statistics)."""
    lo, hi = quantile_ci_ranks(len(sorted_values))
    return (
        None if lo is None else sorted_values[lo - 1],
        None if hi is None else sorted_values[hi - 1],
    )


def concurrency_level(mean_concurrency: float) -> int | None:
    if mean_concurrency < 0.5:
        return None
    return max(1, int(2 ** round(math.log2(mean_concurrency))))


def instances_needed(qps: float, per_instance_rps: float, utilisation: float = UTILISATION) -> int:
    """``ceil(qps / (per_instance_rps * utilisation))``; at least one instance."""
    if per_instance_rps <= 0 or not 0 < utilisation <= 1:
        raise ValueError("per-instance throughput must be > 0 and utilisation in (0, 1]")
    return max(1, math.ceil(qps / (per_instance_rps * utilisation) - 1e-9))


@dataclass
class _Bucket:
    busy_ms: float = 0.0
    finished: int = 0
    latencies: list[float] = field(default_factory=list)
    compute: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)


def _buckets(samples: Iterable[Sample], bucket_ms: float) -> dict[tuple[str, int], _Bucket]:
    out: dict[tuple[str, int], _Bucket] = defaultdict(_Bucket)
    for s in samples:
        start, end = s.arrival_ms, s.arrival_ms + s.e2e_ms
        b = int(start // bucket_ms)
        while b * bucket_ms < end:
            lo, hi = max(start, b * bucket_ms), min(end, (b + 1) * bucket_ms)
            if hi > lo:
                out[(s.instance, b)].busy_ms += hi - lo
            b += 1
        done = out[(s.instance, int(end // bucket_ms))]
        done.finished += 1
        done.latencies.append(s.latency_ms)
        done.compute.append(s.compute_ms)
        done.e2e.append(s.e2e_ms)
    return out


def fit_model(
    model: str,
    samples: Sequence[Sample],
    target_p99_ms: float,
    *,
    bucket_ms: float = 10_000.0,
    min_requests: int = 100,
    target_qps: Sequence[float] = (),
    utilisation: float = UTILISATION,
) -> ModelCapacity:
    """The capacity model of one model's instances (see the module docstring)."""
    buckets = _buckets(samples, bucket_ms)
    span: dict[str, tuple[int, int]] = {}
    for inst, b in buckets:
        lo, hi = span.get(inst, (b, b))
        span[inst] = (min(lo, b), max(hi, b))
    by_level: dict[int, list[_Bucket]] = defaultdict(list)
    finished_at: dict[int, int] = defaultdict(int)  # bucket -> finished over all instances
    for (inst, b), bucket in buckets.items():
        lo, hi = span[inst]
        if b in (lo, hi):
            continue
        finished_at[b] += bucket.finished
        level = concurrency_level(bucket.busy_ms / bucket_ms)
        if level is not None:
            by_level[level].append(bucket)
    levels = []
    for level in sorted(by_level):
        group = by_level[level]
        lat = sorted(v for g in group for v in g.latencies)
        if not lat:
            continue
        comp = sorted(v for g in group for v in g.compute)
        e2e = [v for g in group for v in g.e2e]
        mean_c = sum(g.busy_ms for g in group) / (bucket_ms * len(group))
        mean_e2e_s = sum(e2e) / len(e2e) / 1000
        p99 = exact_quantile(lat, 0.99)
        ci_low, ci_high = p99_ci(lat)
        levels.append(
            Level(
                concurrency=level,
                mean_concurrency=mean_c,
                buckets=len(group),
                requests=len(lat),
                p99_ms=p99,
                p99_compute_ms=exact_quantile(comp, 0.99),
                mean_compute_ms=sum(comp) / len(comp),
                mean_latency_ms=sum(lat) / len(lat),
                throughput_rps=sum(g.finished for g in group) / (len(group) * bucket_ms / 1000),
                littles_law_rps=mean_c / mean_e2e_s if mean_e2e_s > 0 else 0.0,
                holds_target=p99 <= target_p99_ms,
                p99_ci_low_ms=ci_low,
                p99_ci_high_ms=ci_high,
                thin=len(lat) < min_requests,
            )
        )
    eligible = [lv for lv in levels if lv.holds_target and lv.requests >= min_requests]
    chosen = max(eligible, key=lambda lv: lv.throughput_rps, default=None)
    peak = max(finished_at.values(), default=0) / (bucket_ms / 1000)
    needed = (
        {q: instances_needed(q, chosen.throughput_rps, utilisation) for q in target_qps}
        if chosen is not None
        else {}
    )
    return ModelCapacity(
        model=model,
        instances_observed=len(span),
        target_p99_ms=target_p99_ms,
        levels=tuple(levels),
        chosen=chosen,
        peak_qps=peak,
        utilisation=utilisation,
        instances_needed=needed,
    )


class FitOptions(TypedDict, total=False):
    """:func:`fit_model`'s keyword arguments, which :func:`fit` passes on (defaults there)."""

    bucket_ms: float
    min_requests: int
    target_qps: Sequence[float]
    utilisation: float


def fit(
    samples: Iterable[Sample], target_p99_ms: float, **options: Unpack[FitOptions]
) -> list[ModelCapacity]:
    """:func:`fit_model` per model. Without ``target_qps``, each model is sized
    for its own observed peak."""
    per_model: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        per_model[s.model].append(s)
    out = []
    for model in sorted(per_model):
        m = fit_model(model, per_model[model], target_p99_ms, **options)
        if not options.get("target_qps") and m.chosen is not None:
            need = instances_needed(m.peak_qps, m.chosen.throughput_rps, m.utilisation)
            peak = {m.peak_qps: need}
            m = replace(m, instances_needed=peak)
        out.append(m)
    return out
