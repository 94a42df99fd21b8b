"""Memory: bytes per request held in the join state, and worker RSS under constant load.

* Join state (:class:`pipeline.core.join.Joiner`): ``tracemalloc`` measures what
  the state retains after N requests' events went through the worker's codec
  and join (the bytes held, over N): requests in flight (``gateway.received``
  only: the common state), requests with one terminal event waiting for their
  partner, and resolved requests remembered for late duplicates.
* RSS: one ``tailguard worker`` consuming a live stream at a constant rate
  (event times = now) for the run's length; RSS sampled every 5 s.
"""

from __future__ import annotations

import gc
import statistics
import threading
import time
import tracemalloc
from collections.abc import Callable

import orjson
from confluent_kafka import Producer

from bench.common import (
    PARTITIONS,
    Worker,
    cpu_seconds,
    new_settings,
    producer_config,
    rss_bytes,
)
from bench.context import Context
from bench.data import DictBatcher, Partitioner, Workload, events, template
from bench.results import Figure, Section, at_most, register
from pipeline.adapters.kafka_admin import group_progress
from pipeline.contract.codec import SourceRef, decode_message
from pipeline.core.join import JoinConfig, Joiner
from producers.emit import BatchPolicy

TARGET_BYTES_PER_INFLIGHT = 200
RSS_GROWTH_LIMIT_PCT = 5.0
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


def _rss_run(ctx: Context, sec: Section) -> None:
    s = new_settings(ctx.bootstrap(), ctx.workdir, "rss")
    rate = ctx.sizes.rss_rate_ev_s
    duration = ctx.sizes.rss_s
    w = Workload(instances=10**6, rate_ev_s=rate)
    stop = threading.Event()
    produced = [0]

    def produce() -> None:
        p = Producer(producer_config(s) | {"linger.ms": 5})
        part = Partitioner(PARTITIONS)
        batcher = DictBatcher(BatchPolicy())
        start_ns = time.time_ns()
        for rid, ts, ev in events(w, start_ns):
            if stop.is_set():
                break
            while ts > time.time_ns():
                time.sleep(0.005)
            for pt, value, n in batcher.add(part(rid), ev, ts / 1e6):
                p.produce(s.lifecycle_topic, value, partition=pt)
                produced[0] += n
            p.poll(0)
        p.flush(30)

    worker = Worker(s, ctx.workdir / f"{s.group_id}.log")
    samples: list[tuple[float, int]] = []
    thread = threading.Thread(target=produce, daemon=True)
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
            time.sleep(5)
        cpu = cpu_seconds(worker.proc.pid) or 0.0
        lag_end = group_progress(s, s.lifecycle_topic).lag
    finally:
        stop.set()
        thread.join(60)
        worker.stop()
    warm = [r for t, r in samples if duration * 0.3 <= t < duration * 0.4]
    last = [r for t, r in samples if t >= duration * 0.8]
    growth = (statistics.median(last) - statistics.median(warm)) / statistics.median(warm) * 100
    sec.figures += [
        at_most(
            f"worker RSS growth, {duration / 60:.0f}-min run at {rate:,.0f} events/s",
            growth,
            "%",
            RSS_GROWTH_LIMIT_PCT,
            "median RSS of the last 20 % of the run vs minutes "
            f"{duration * 0.3 / 60:.1f}–{duration * 0.4 / 60:.1f} (after the join's "
            "120 s memory of resolved requests filled up)",
        ),
        Figure(
            "worker RSS at the end",
            last[-1] / MiB,
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
    curve = ", ".join(
        f"{t / 60:.1f} min {r / MiB:.0f}" for t, r in samples[:: max(1, len(samples) // 12)]
    )
    sec.text.append(f"RSS (MiB) over the run: {curve}.")
    if duration < 600:
        sec.text.append(
            f"Quick mode: a {duration:.0f} s run, not the 10-minute one the target asks for."
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
