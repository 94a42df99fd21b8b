"""In-process CPU cost of the worker's core per event: the yardstick for hot-path work.

Runs what the worker's event loop runs per batch, without Kafka, Faust or ClickHouse:
``StreamProcessor.process`` (decode, join, windows, SLO counts; ``keep_events`` as the
worker's default) over batched messages of the simulated workload, plus the raw-event
row building of ``WorkerShell._collect`` and the record -> column conversion of the
ClickHouse writer. Reports CPU µs per event (``time.process_time``), the median of
``--repeat`` runs, per stage.

    python -m bench.core_speed [--instances 4] [--repeat 3] [--profile]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from typing import Any

import orjson

from bench.data import Workload, events, messages
from pipeline.adapters.store import request_columns
from pipeline.contract.codec import encode_event
from pipeline.core.processor import StreamProcessor
from pipeline.core.slo_windows import load_slo_factory
from pipeline.settings import Settings
from producers.emit import BatchPolicy

START_NS = 1_763_000_000_000_000_000


def load(instances: int) -> tuple[list[tuple[int, int, bytes]], int]:
    msgs: list[tuple[int, int, bytes]] = []
    offsets: dict[int, int] = {}
    n = 0
    for part, value, k in messages(events(Workload(instances), START_NS), 8, BatchPolicy()):
        off = offsets.get(part, 0)
        offsets[part] = off + 1
        msgs.append((part, off, value))
        n += k
    return msgs, n


def run_once(msgs: list[tuple[int, int, bytes]], batch: int = 1000) -> dict[str, float]:
    s = Settings()
    proc = StreamProcessor(
        s.lifecycle_topic, s.join_config(), max_message_bytes=s.max_message_bytes,
        window_config=s.window_config(), slo_factory=load_slo_factory(s.slo_spec),
        keep_events=s.store_raw_events,
    )  # fmt: skip
    t_proc = t_rows = t_cols = 0.0
    for i in range(0, len(msgs), batch):
        chunk = msgs[i : i + batch]
        t0 = time.process_time()
        out = proc.process(chunk, None)
        t1 = time.process_time()
        _rows = [
            (ev.event_id, ev.kind, ev.request_id, ev.ts_unix_ns, ev.host, ev.model,
             "t", p, off, encode_event(ev).decode())
            for p, off, ev in out.events
        ]  # fmt: skip
        t2 = time.process_time()
        request_columns(out.records)
        t3 = time.process_time()
        t_proc += t1 - t0
        t_rows += t2 - t1
        t_cols += t3 - t2
    t0 = time.process_time()
    out = proc.drain()
    request_columns(out.records)
    t_proc += time.process_time() - t0
    n = proc.counters.events
    return {
        "events": n,
        "process_us": t_proc / n * 1e6,
        "raw_rows_us": t_rows / n * 1e6,
        "columns_us": t_cols / n * 1e6,
        "total_us": (t_proc + t_rows + t_cols) / n * 1e6,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--instances", type=int, default=4, help="x ~58k events")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="pyinstrument the last run")
    args = ap.parse_args()
    msgs, _n = load(args.instances)
    # The worker's garbage-collector settings (pipeline/adapters/worker.py run_worker).
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
    results = []
    for i in range(args.repeat):
        if args.profile and i == args.repeat - 1:
            from pyinstrument import Profiler

            prof = Profiler(interval=0.0005)
            prof.start()
            results.append(run_once(msgs))
            prof.stop()
            print(prof.output_text(unicode=False, color=False, show_all=False))
        else:
            results.append(run_once(msgs))
    med: dict[str, Any] = {k: statistics.median(r[k] for r in results) for k in results[0]}
    med["events_per_cpu_s"] = 1e6 / med["total_us"]
    print(orjson.dumps(med, option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()
