"""P99 accuracy per 10 s window: the stream's sketch vs exact vs Prometheus histograms.

The simulator's events (``bench/data.py``, 5k events/s of event time) run
through the worker's core (:class:`pipeline.core.processor.StreamProcessor`,
one partition, so a window's all-traffic cell is the whole window). For every
closed 10 s window, every key (the all-traffic key and each
model × priority × context bucket) and each boundary below with at least 100
values:

* exact: the element at rank ``floor(0.99 · (n − 1))`` of the window's values
  (the rank convention the sketch guarantees; ``exact_quantile_lower``);
* stream: the P99 of the window's stored sketch (DDSketch, 1 %);
* Prometheus: ``histogram_quantile(0.99, …)`` over cumulative bucket counts of
  the same values, with vLLM's default buckets for that metric and with the
  source documents' buckets (0.1, 0.2, 0.3, 0.5, 1.0 s).

Relative error = ``|estimate − exact| / exact``.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from bench.context import Context
from bench.data import Workload, events, messages
from bench.results import Figure, Section, at_most, register
from pipeline.core.processor import StreamProcessor
from pipeline.core.record import RequestRecord
from pipeline.core.sketch import QuantileSketch, exact_quantile_lower
from pipeline.core.windows import ALL_KEY, WindowConfig, record_key, window_start
from producers.emit import BatchPolicy

Q = 0.99
MIN_SAMPLES = 100
TARGET_MAX_REL_ERR_PCT = 1.0

# vLLM's default buckets (seconds), vllm/v1/metrics/loggers.py (PrometheusStatLogger):
# vllm:time_to_first_token_seconds, and request_latency_buckets shared by
# vllm:e2e_request_latency_seconds, vllm:request_queue_time_seconds,
# ..._inference_time_, ..._prefill_time_, ..._decode_time_.
# fmt: off
VLLM_TTFT_BUCKETS_S = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)
VLLM_REQUEST_LATENCY_BUCKETS_S = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)
VLLM_TPOT_BUCKETS_S = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)
# fmt: on
SOURCE_DOC_BUCKETS_S = (0.1, 0.2, 0.3, 0.5, 1.0)

# boundary -> (vLLM metric it corresponds to, its buckets)
BOUNDARIES: dict[str, tuple[str, tuple[float, ...]]] = {
    "engine_e2e_ms": ("vllm:e2e_request_latency_seconds", VLLM_REQUEST_LATENCY_BUCKETS_S),
    "queue_ms": ("vllm:request_queue_time_seconds", VLLM_REQUEST_LATENCY_BUCKETS_S),
    "ttft_engine_ms": ("vllm:time_to_first_token_seconds", VLLM_TTFT_BUCKETS_S),
    "tpot_ms": ("vllm:time_per_output_token_seconds", VLLM_TPOT_BUCKETS_S),
    "gateway_total_ms": ("(no vLLM metric; e2e buckets)", VLLM_REQUEST_LATENCY_BUCKETS_S),
}


def bucket_quantile(q: float, upper_bounds: Sequence[float], counts: Sequence[float]) -> float:
    """Prometheus's classic ``histogram_quantile`` (``bucketQuantile`` in
    prometheus/promql/quantile.go): cumulative ``counts`` per ``upper_bounds``
    (``le``; must end with +Inf), linear interpolation inside the bucket that
    holds rank ``q · total`` (from 0 for the lowest bucket when its bound is
    positive), the highest finite bound when the rank falls in the +Inf bucket.
    """
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    pairs = sorted(zip(upper_bounds, counts, strict=True))
    if not pairs or not math.isinf(pairs[-1][0]):
        return math.nan
    buckets: list[list[float]] = []  # coalesce equal bounds
    for ub, c in pairs:
        if buckets and buckets[-1][0] == ub:
            buckets[-1][1] += c
        else:
            buckets.append([ub, c])
    # correctPrecisionErrors(…, 1e-12) and ensureMonotonic
    prev = buckets[0][1]
    for b in buckets[1:]:
        delta = abs(b[1] - prev)
        if delta == 0:
            continue
        if delta / b[1] <= 1e-12:
            b[1] = prev
        else:
            prev = b[1]
    top = buckets[0][1]
    for b in buckets[1:]:
        if b[1] > top:
            top = b[1]
        elif b[1] < top:
            b[1] = top
    if len(buckets) < 2:
        return math.nan
    observations = buckets[-1][1]
    if observations == 0:
        return math.nan
    rank = q * observations
    # sort.Search(len-1, counts[i] >= rank)
    idx = 0
    while idx < len(buckets) - 1 and not buckets[idx][1] >= rank:
        idx += 1
    if idx == len(buckets) - 1:
        return buckets[-2][0]
    if idx == 0 and buckets[0][0] <= 0:
        return buckets[0][0]
    start, end, count = 0.0, buckets[idx][0], buckets[idx][1]
    if idx > 0:
        start = buckets[idx - 1][0]
        count -= buckets[idx - 1][1]
        rank -= buckets[idx - 1][1]
    return start + (end - start) * (rank / count)


def histogram_p99_ms(values_ms: Sequence[float], bounds_s: Sequence[float]) -> float:
    """Observe ``values_ms`` (in seconds, as a Prometheus client would) and query P99, in ms."""
    ub = [*bounds_s, math.inf]
    per = [0] * len(ub)
    for v in values_ms:
        per[bisect.bisect_left(ub, v / 1000.0)] += 1  # le: v <= bound
    cum = list(np.cumsum(per))
    return bucket_quantile(Q, ub, cum) * 1000.0


def _records_and_windows(
    ctx: Context,
) -> tuple[list[RequestRecord], dict[tuple[int, tuple[str, str, str], str], QuantileSketch]]:
    w = Workload(instances=ctx.sizes.accuracy_instances, rate_ev_s=5_000)
    proc = StreamProcessor("bench", window_config=WindowConfig())
    items = []
    for i, (_p, value, _n) in enumerate(
        messages(events(w, 1_800_000_000_000_000_000), 1, BatchPolicy())
    ):
        items.append((0, i, value))
    records: list[RequestRecord] = []
    sketches: dict[tuple[int, tuple[str, str, str], str], QuantileSketch] = {}
    outs = [proc.process(items[i : i + 500], None) for i in range(0, len(items), 500)]
    outs.append(proc.drain())
    for out in outs:
        records += out.records
        for win in out.windows:
            for (key, boundary), cols in win.sketches.items():
                sketches[(win.start_ms, key, boundary)] = QuantileSketch.from_columns(cols)
    return records, sketches


def _rel_err_pct(est: float, exact: float) -> float:
    return abs(est - exact) / exact * 100.0 if exact else (0.0 if est == 0 else math.inf)


@register("accuracy", "Accuracy: P99 per 10 s window, stream vs exact vs Prometheus", order=30)
def accuracy(ctx: Context) -> Section:
    sec = Section("accuracy", "Accuracy: P99 per 10 s window, stream vs exact vs Prometheus")
    records, sketches = _records_and_windows(ctx)
    size = WindowConfig().size_ms
    values: dict[tuple[int, tuple[str, str, str], str], list[float]] = defaultdict(list)
    seen: set[str] = set()
    for rec in records:
        if rec.request_id in seen:
            continue  # an upgrade: windows take a request at its first emission only
        seen.add(rec.request_id)
        start = window_start(rec.end_unix_ns // 1_000_000, size)
        for b in BOUNDARIES:
            v = rec.boundary(b)
            if v is None:
                continue
            for k in (record_key(rec), ALL_KEY):
                values[(start, k, b)].append(v)
    errs: dict[str, dict[str, list[float]]] = {
        b: {"stream": [], "vllm": [], "docs": []} for b in BOUNDARIES
    }
    cells = 0
    for cell, vals in values.items():
        if len(vals) < MIN_SAMPLES or cell not in sketches:
            continue
        sk = sketches[cell]
        if sk.count != len(vals):
            continue  # a record the window did not take (late): not comparable
        vals.sort()
        exact = exact_quantile_lower(vals, Q)
        if exact <= 0:
            continue
        cells += 1
        buckets = BOUNDARIES[cell[2]][1]
        e = errs[cell[2]]
        e["stream"].append(_rel_err_pct(sk.quantile(Q) or 0.0, exact))
        e["vllm"].append(_rel_err_pct(histogram_p99_ms(vals, buckets), exact))
        e["docs"].append(_rel_err_pct(histogram_p99_ms(vals, SOURCE_DOC_BUCKETS_S), exact))
    all_stream = [x for e in errs.values() for x in e["stream"]]
    sec.figures.append(
        at_most(
            "stream sketch: max P99 relative error (all windows, keys, boundaries)",
            max(all_stream) if all_stream else math.nan,
            "%",
            TARGET_MAX_REL_ERR_PCT,
            f"{cells:,} window cells with ≥ {MIN_SAMPLES} values",
        )
    )
    rows = [
        "| boundary (vLLM metric) | cells | stream max / median | vLLM buckets max / median | "
        "source-doc buckets max / median |",
        "|---|---:|---|---|---|",
    ]
    for b, e in errs.items():
        if not e["stream"]:
            continue
        metric = BOUNDARIES[b][0]

        def mm(xs: list[float]) -> str:
            return f"{max(xs):.3f} % / {float(np.median(xs)):.3f} %"

        rows.append(
            f"| `{b}` ({metric}) | {len(e['stream'])} | {mm(e['stream'])} | "
            f"{mm(e['vllm'])} | {mm(e['docs'])} |"
        )
        sec.figures.append(
            Figure(
                f"`{b}`: Prometheus max P99 error, vLLM buckets",
                max(e["vllm"]),
                "%",
                note=f"source-doc buckets: {max(e['docs']):.1f} %",
            )
        )
    sec.text.append("\n".join(rows))
    sec.text.append(
        f"{len(records):,} request records from the simulator on the Azure trace "
        "(`bench/data.py`, 5k events/s of event time), through `StreamProcessor` (one "
        "partition). Exact = element at rank floor(0.99·(n−1)) of the window's values; "
        "Prometheus = `histogram_quantile(0.99)` implemented as `bucketQuantile` in "
        "prometheus/promql/quantile.go (linear interpolation within the bucket; a rank in "
        "the +Inf bucket returns the highest finite bound). vLLM buckets from "
        "vllm/v1/metrics/loggers.py (request_latency_buckets for e2e/queue, the TTFT and "
        "TPOT lists); source-document buckets 0.1, 0.2, 0.3, 0.5, 1.0 s."
    )
    return sec
