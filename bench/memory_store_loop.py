"""The store side of the worker's memory alone: a real chDB insert loop at the worker's rates.

Per simulated second (``--rate`` events/s, a third of them completing a request): one
flush as ``FlushWriter.write`` makes it (requests as JSON the engine parses, raw events
as columns, checkpoints) on a writer thread, the same prebuilt batch every time (the
engine deduplicates rows at merges; what the writer path allocates is the same). No
windows (their rows are a small share). Samples RSS, glibc malloc (``mallinfo2``) and
chDB's ``MemoryTracking`` and jemalloc every ``--sample-every`` flushes and prints the
Theil-Sen slope of each from ``--fit-from`` (a fraction of the run), per 100 flushes.

    python -m bench.memory_store_loop [--flushes 600] [--tune-malloc]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.memory import theil_sen
from bench.memory_probe import MiB, chdb_metrics, rss_mib
from pipeline.adapters.malloc import malloc_stats, tune_malloc
from pipeline.adapters.store import (
    Checkpoint,
    KeptEvent,
    open_for_writing,
    write_checkpoints,
    write_raw_events,
    write_requests,
)
from pipeline.contract.wire import event_bytes
from pipeline.core.record import RequestRecord, build_record
from pipeline.settings import Settings
from tests.factories import completed, finished, received


def batch(n_requests: int) -> tuple[list[RequestRecord], list[KeptEvent]]:
    records, kept = [], []
    for i in range(n_requests):
        rid = f"loop-{i:08d}"
        evs = (received(rid, 0.0), completed(rid, 100.0), finished(rid, 98.0))
        records.append(build_record(rid, *evs))  # type: ignore[arg-type]
        kept.extend((i % 8, 3 * i + k, ev, event_bytes(ev)) for k, ev in enumerate(evs))
    return records, kept


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--flushes", type=int, default=600)
    ap.add_argument("--rate", type=float, default=10_000.0)
    ap.add_argument("--sample-every", type=int, default=5)
    ap.add_argument("--fit-from", type=float, default=0.5)
    ap.add_argument("--tune-malloc", action="store_true")
    ap.add_argument("--only", choices=["requests", "events", "checkpoints"], help="one write")
    ap.add_argument("--trace", action="store_true", help="tracemalloc's traced total too")
    ap.add_argument("--out", type=Path, default=Path("bench-memory-store-loop.jsonl"))
    a = ap.parse_args(argv)
    if a.tune_malloc:
        tune_malloc()
    records, kept = batch(int(a.rate / 3))
    with tempfile.TemporaryDirectory(prefix="tailguard-storeloop-") as tmp:
        s = Settings(store_dir=Path(tmp) / "store")
        store = open_for_writing(s).store
        writer = ThreadPoolExecutor(max_workers=1)
        cps = [Checkpoint(p, 0, 0, 0) for p in range(8)]

        def write() -> None:
            if a.only in (None, "requests"):
                write_requests(store, records)
            if a.only in (None, "events"):
                write_raw_events(store, s.lifecycle_topic, kept)
            if a.only in (None, "checkpoints"):
                write_checkpoints(store, "loop", s.lifecycle_topic, cps)

        if a.trace:
            tracemalloc.start()

        rows = []
        t0 = time.monotonic()
        for i in range(a.flushes):
            writer.submit(write).result()
            if i % a.sample_every == 0:
                row = {"flush": i, "wall_s": time.monotonic() - t0, "rss_mib": rss_mib()}
                if (m := malloc_stats()) is not None:
                    row |= {f"glibc_{k}_mib": v / MiB for k, v in m.items()}
                row |= chdb_metrics(store)
                if a.trace:
                    row["traced_mib"] = tracemalloc.get_traced_memory()[0] / MiB
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
        writer.shutdown()
        store.close()
    a.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    fit = [r for r in rows if r["flush"] >= a.fit_from * a.flushes]
    xs = [r["flush"] / 100 for r in fit]
    for name in sorted(fit[0]):
        if name in {"flush", "wall_s"}:
            continue
        slope, icpt = theil_sen(xs, [r.get(name, 0.0) for r in fit])
        print(f"{name:32s} level {slope * xs[0] + icpt:10.1f}  slope per 100 flushes {slope:9.3f}")


if __name__ == "__main__":
    main()
