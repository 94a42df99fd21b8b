"""Memory: bytes per request held in the join state, and worker RSS under constant load.

* Join state (:class:`pipeline.core.join.Joiner`): ``tracemalloc`` measures what
  the state retains after N requests' events went through the worker's codec
  and join (the bytes held, over N): requests in flight (``gateway.received``
  only: the common state), requests with one terminal event waiting for their
  partner, and resolved requests remembered for late duplicates.
* RSS: one ``tailguard worker`` consuming a live stream at a constant rate
  (event times = now); RSS sampled every 5 s; after a warm-up in which the join's
  memory of resolved requests fills, a Theil-Sen line through the samples gives the
  growth per 10 minutes.
"""

from __future__ import annotations

import gc
import statistics
import threading
import time
import tracemalloc
from collections.abc import Callable, Sequence

import orjson
from confluent_kafka import Producer

from bench.common import (
    PARTITIONS,
    Worker,
    cpu_seconds,
    new_settings,
    producer_config,
    rss_bytes,
    send,
)
from bench.context import Context
from bench.data import DictBatcher, Partitioner, Workload, events, template
from bench.results import Figure, Section, at_most, register
from pipeline.adapters.kafka_admin import group_progress
from pipeline.contract.codec import SourceRef, decode_message
from pipeline.core.join import JoinConfig, Joiner
from pipeline.settings import Settings
from producers.emit import BatchPolicy

TARGET_BYTES_PER_INFLIGHT = 200
RSS_GROWTH_LIMIT_PCT = 5.0
RSS_SAMPLE_S = 5.0
MiB = 1024 * 1024


def _requests(n: int) -> list[list[bytes]]:
    """Per request, its events as single-event messages, in the template's order."""
    t = template(0)
    by_rid: dict[str, list[dict[str, object]]] = {}
    for e in t.events:
        by_rid.setdefault(str(e["request_id"]), []).append(e)
    full = [evs for evs in by_rid.values() if len(evs) == 3]
    out = []
    for i in range(n):
        evs = full[i % len(full)]
        rid = f"{evs[0]['request_id']}.{i}"
        out.append(
            [orjson.dumps(dict(e, request_id=rid, event_id=f"{rid}:{e['kind']}")) for e in evs]
        )
    return out


def _retained(n: int, feed: Callable[[Joiner, list[list[bytes]]], None]) -> float:
    reqs = _requests(n)
    joiner = Joiner(JoinConfig())
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    feed(joiner, reqs)
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    held = sum(s.size_diff for s in after.compare_to(before, "filename"))
    del joiner
    return held / n


def _decode(raw: bytes, off: int) -> object:
    return decode_message(raw, SourceRef("bench", 0, off)).events[0]


def _feed(upto: int) -> Callable[[Joiner, list[list[bytes]]], None]:
    """Feed each request's first ``upto`` events (received, completed, finished order)."""

    def feed(j: Joiner, reqs: list[list[bytes]]) -> None:
        off = 0
        for evs in reqs:
            ordered = sorted(
                evs, key=lambda b: (b"gateway.received" not in b, b"engine.finished" in b)
            )
            for raw in ordered[:upto]:
                j.add_emitted(_decode(raw, off), off, 1_000)  # type: ignore[arg-type]
                off += 1

    return feed


def theil_sen(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """(slope, intercept) of the Theil-Sen line: the median of the pairwise slopes, and
    the median of ``y - slope * x``; robust to outliers (a collection, a flush)."""
    slopes = sorted(
        (ys[j] - ys[i]) / (xs[j] - xs[i])
        for i in range(len(xs))
        for j in range(i + 1, len(xs))
        if xs[j] != xs[i]
    )
    if not slopes:
        raise ValueError("a line needs two distinct x values")
    slope = statistics.median(slopes)
    return slope, statistics.median(y - slope * x for x, y in zip(xs, ys, strict=True))


def least_squares(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """(slope, intercept) of the ordinary least-squares line."""
    slope, intercept = statistics.linear_regression(xs, ys)
    return slope, intercept


def growth_pct(slope: float, intercept: float, x0: float, per: float) -> float:
    """Growth over ``per`` (x units) along the line, relative to its level at ``x0``."""
    return slope * per / (slope * x0 + intercept) * 100.0


def _min(seconds: float) -> str:
    return f"{round(seconds / 60, 1):g}"


def produce_live(s: Settings, rate_ev_s: float, stop: threading.Event, produced: list[int]) -> None:
    """Produce the workload live (event time = now) at ``rate_ev_s`` until ``stop``;
    ``produced[0]`` counts the events sent."""
    w = Workload(instances=10**6, rate_ev_s=rate_ev_s)
    p = Producer(producer_config(s) | {"linger.ms": 5})
    part = Partitioner(PARTITIONS)
    batcher = DictBatcher(BatchPolicy())
    start_ns = time.time_ns()
    # ids of one length (see bench.data.events): at 10,000 events/s instance 100 starts
    # at minute ~9.7, just before the fitted minutes
    for rid, ts, ev in events(w, start_ns, id_width=len(str(w.instances - 1))):
        if stop.is_set():
            break
        while ts > time.time_ns():
            time.sleep(0.005)
        for pt, value, n in batcher.add(part(rid), ev, ts / 1e6):
            send(p, s.lifecycle_topic, pt, value)
            produced[0] += n
    p.flush(30)


def _rss_run(ctx: Context, sec: Section) -> None:
    s = new_settings(ctx.bootstrap(), ctx.workdir, "rss")
    rate = ctx.sizes.rss_rate_ev_s
    warmup, fitted = ctx.sizes.rss_warmup_s, ctx.sizes.rss_s
    duration = warmup + fitted
    stop = threading.Event()
    produced = [0]
    worker = Worker(s, ctx.workdir / f"{s.group_id}.log")
    samples: list[tuple[float, int]] = []
    thread = threading.Thread(target=produce_live, args=(s, rate, stop, produced), daemon=True)
    t0 = time.monotonic()
    lag_end = None
    try:
        thread.start()
        while (el := time.monotonic() - t0) < duration:
            if not worker.alive():
                raise RuntimeError(f"worker exited:\n{worker.log_tail()}")
            r = rss_bytes(worker.proc.pid)
            if r:
                samples.append((el, r))
            time.sleep(RSS_SAMPLE_S)
        cpu = cpu_seconds(worker.proc.pid) or 0.0
        lag_end = group_progress(s, s.lifecycle_topic).lag
    finally:
        stop.set()
        thread.join(60)
        worker.stop()
    fit = [(t, r / MiB) for t, r in samples if t >= warmup]
    xs, ys = [t for t, _ in fit], [m for _, m in fit]
    ts_slope, ts_icpt = theil_sen(xs, ys)
    ls_slope, ls_icpt = least_squares(xs, ys)
    growth = growth_pct(ts_slope, ts_icpt, warmup, 600.0)
    span = f"minutes {_min(warmup)}–{_min(duration)}"
    sec.figures += [
        at_most(
            f"worker RSS growth per 10 min at {rate:,.0f} events/s (slope over the last "
            f"{_min(fitted)} min of a {_min(duration)}-min run)",
            growth,
            "%",
            RSS_GROWTH_LIMIT_PCT,
            f"Theil-Sen line through the {len(fit)} samples of {span} (every "
            f"{RSS_SAMPLE_S:.0f} s), relative to its level at minute {_min(warmup)}",
        ),
        Figure(
            "... its slope (Theil-Sen)",
            ts_slope * 60,
            "MiB/min",
            note=f"level at minute {_min(warmup)}: {ts_slope * warmup + ts_icpt:.0f} MiB",
        ),
        Figure(
            "... least-squares slope over the same samples (for comparison)",
            ls_slope * 60,
            "MiB/min",
            note=f"{growth_pct(ls_slope, ls_icpt, warmup, 600.0):.2f} % per 10 min",
        ),
        Figure(
            "worker RSS at the end",
            samples[-1][1] / MiB,
            "MiB",
            note=f"peak {max(r for _, r in samples) / MiB:.0f} MiB",
        ),
        Figure(
            "events produced",
            produced[0],
            "events",
            note=f"worker CPU {cpu:.0f} s over {duration:.0f} s; commit lag at the end "
            f"{lag_end} messages (commits trail by the window grace)",
        ),
    ]
    sec.text.append(
        f"RSS run: one `tailguard worker` consuming a live stream at {rate:,.0f} events/s "
        "(event time = now, the producers' batching) for "
        f"{_min(duration)} minutes, RSS sampled every {RSS_SAMPLE_S:.0f} s. The first "
        f"{_min(warmup)} minutes are a warm-up, not fitted: the join remembers resolved "
        f"requests for {JoinConfig().resolved_ttl_ms / 60_000:.0f} minutes of event time "
        "(late duplicates), so RSS grows by design until that memory is full. The figure "
        f"is the slope of a Theil-Sen line (median of pairwise slopes) through the last "
        f"{_min(fitted)} minutes' samples, as growth per 10 minutes relative to the "
        "line's level where the fit starts; the least-squares slope is beside it."
    )
    sec.profiles.append(
        (
            f"RSS samples (elapsed s: MiB), every {RSS_SAMPLE_S:.0f} s; fitted from "
            f"{warmup:.0f} s: RSS ≈ {ts_icpt:.1f} MiB + {ts_slope * 60:.3f} MiB/min × t",
            "\n".join(
                "  ".join(f"{t:6.0f}: {r / MiB:6.0f}" for t, r in samples[i : i + 8])
                for i in range(0, len(samples), 8)
            ),
        )
    )
    if duration < 600 + JoinConfig().resolved_ttl_ms / 1000:
        sec.text.append(
            f"Quick mode: a {duration:.0f} s run, not the warm-up and 10 minutes the target "
            "asks for."
        )


@register("memory", "Memory: join state per request, worker RSS under constant load", order=40)
def memory(ctx: Context) -> Section:
    sec = Section("memory", "Memory: join state per request, worker RSS under constant load")
    n = ctx.sizes.inflight_requests
    inflight = _retained(n, _feed(1))
    waiting = _retained(n, _feed(2))
    resolved = _retained(n, _feed(3))
    sec.figures += [
        at_most(
            "join state per in-flight request (gateway.received held)",
            inflight,
            "B",
            TARGET_BYTES_PER_INFLIGHT,
            f"{n:,} requests, tracemalloc",
        ),
        Figure(
            "join state per request waiting for its partner (received + completed)", waiting, "B"
        ),
        Figure(
            "join state per resolved request (remembered for late duplicates, "
            f"{JoinConfig().resolved_ttl_ms / 1000:.0f} s)",
            resolved,
            "B",
        ),
    ]
    _rss_run(ctx, sec)
    return sec
