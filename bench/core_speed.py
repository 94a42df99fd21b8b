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
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from bench.data import Workload, events, messages
from pipeline.adapters.store import request_columns
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


def run_once(
    msgs: list[tuple[int, int, bytes]], batch: int = 1000, store_dir: str | None = None
) -> dict[str, float]:
    s = Settings()
    store = None
    if store_dir is not None:
        from pipeline.adapters.store import migrate, open_store

        store = open_store(s.model_copy(update={"store_dir": Path(store_dir)}))
        migrate(store)
    proc = StreamProcessor(
        s.lifecycle_topic, s.join_config(), max_message_bytes=s.max_message_bytes,
        window_config=s.window_config(), slo_factory=load_slo_factory(s.slo_spec),
        keep_events=s.store_raw_events,
    )  # fmt: skip
    t_proc = t_rows = t_cols = t_store = 0.0
    pending_records: list[Any] = []
    pending_rows: list[Any] = []
    pending_windows: list[Any] = []

    def write() -> float:
        """What the worker's writer thread does per flush (records, raw events, windows)."""
        from pipeline.adapters.store import write_events, write_requests, write_windows

        t = time.process_time()
        assert store is not None
        write_requests(store, pending_records)
        write_events(store, pending_rows)
        if pending_windows:
            write_windows(store, pending_windows, "t", 0.01, f"tok-{time.time_ns()}")
        pending_records.clear()
        pending_rows.clear()
        pending_windows.clear()
        return time.process_time() - t

    for i in range(0, len(msgs), batch):
        chunk = msgs[i : i + batch]
        t0 = time.process_time()
        out = proc.process(chunk, None)
        t1 = time.process_time()
        rows = [
            (ev.event_id, ev.kind, ev.request_id, ev.ts_unix_ns, ev.host, ev.model,
             "t", p, off, str(raw, "utf-8"))
            for p, off, ev, raw in out.events
        ]  # fmt: skip
        t2 = time.process_time()
        request_columns(out.records)
        t3 = time.process_time()
        t_proc += t1 - t0
        t_rows += t2 - t1
        t_cols += t3 - t2
        if store is not None:
            pending_records.extend(out.records)
            pending_rows.extend(rows)
            pending_windows.extend(out.windows)
            if len(pending_records) >= 20_000:  # the worker's flush_max_rows
                t_store += write()
    t0 = time.process_time()
    out = proc.drain()
    request_columns(out.records)
    t_proc += time.process_time() - t0
    if store is not None:
        pending_records.extend(out.records)
        pending_windows.extend(out.windows)
        t_store += write()
        store.close()
    n = proc.counters.events
    return {
        "store_us": t_store / n * 1e6,
        "events": n,
        "process_us": t_proc / n * 1e6,
        "raw_rows_us": t_rows / n * 1e6,
        "columns_us": t_cols / n * 1e6,
        "total_us": (t_proc + t_rows + t_cols + t_store) / n * 1e6,
    }


_STORE_DIR: list[str] = []


def _store_dir(on: bool) -> str | None:
    """One directory per process (chDB opens one data directory per process)."""
    if not on:
        return None
    if not _STORE_DIR:
        _STORE_DIR.append(tempfile.mkdtemp(prefix="tg-core-speed-"))
    return _STORE_DIR[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--instances", type=int, default=4, help="x ~58k events")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="pyinstrument the last run")
    ap.add_argument(
        "--store", action="store_true", help="also write to an embedded ClickHouse (chDB) store"
    )
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
            results.append(run_once(msgs, store_dir=_store_dir(args.store)))
            prof.stop()
            print(prof.output_text(unicode=False, color=False, show_all=False))
        else:
            results.append(run_once(msgs, store_dir=_store_dir(args.store)))
    med: dict[str, Any] = {k: statistics.median(r[k] for r in results) for k in results[0]}
    med["events_per_cpu_s"] = 1e6 / med["total_us"]
    print(orjson.dumps(med, option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()
