"""Where the worker's memory grows under constant load: an in-process probe in simulated time.

``bench.memory`` measures one live worker's RSS for 21 minutes of wall time. This probe
runs what that worker runs per batch, in one process, without Kafka or Faust, as fast as
the CPU allows: the simulator's workload at ``--rate`` events/s *of event time* (event
time = the processing clock, as for a live worker reading a live stream), batched by
``--batch-ms`` of event time, through :class:`StreamProcessor` (the worker's settings:
join, windows, SLO spec, raw events kept), and with ``--store`` the worker's writes into
a real embedded ClickHouse (chDB) every ``flush_interval_ms`` of event time or
``flush_max_rows`` records: requests, raw events, windows, checkpoints (as
``FlushWriter.write``, less the Kafka topics). The worker's GC tuning applies.

Every ``--sample-s`` of event time it records, per sample: RSS; Python's allocated
blocks (``sys.getallocatedblocks``); glibc malloc's arena (``mallinfo2``: in use, free,
mmapped); with ``--store`` chDB's ``MemoryTracking`` and caches (``system.metrics``) and
its jemalloc (``system.jemalloc_stats``: allocated, active, resident, retained); and the
length of every join and window structure, summed over partitions. At the end, the
Theil-Sen slope of each series over ``--fit-from`` .. the end (the method of
``bench.memory``), in units per minute of event time. ``--trace-from M`` starts
``tracemalloc`` at minute M (only what is allocated from then on is traced) and diffs
snapshots taken at ``--fit-from`` and at the end, by source line.

    python -m bench.memory_probe [--minutes 21] [--rate 10000] [--store] \
        [--trace-from 10] [--out DIR]

Minutes here are minutes of event time: what the join's and windows' memory depends on.
What runs on wall time (chDB's background merges, jemalloc's decay) sees the same rows
in less wall time than a live worker does.
"""

from __future__ import annotations

import argparse
import gc
import json
import re
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench.common import PARTITIONS
from bench.data import DictBatcher, Workload, events
from bench.memory import theil_sen
from pipeline.adapters.malloc import malloc_stats, tune_malloc
from pipeline.adapters.store import (
    Checkpoint,
    ClickHouseStore,
    open_for_writing,
    write_checkpoints,
    write_raw_messages,
    write_requests,
    write_windows,
)
from pipeline.contract.partitioning import partition_for
from pipeline.core.join import Joiner
from pipeline.core.processor import Output, StreamProcessor
from pipeline.core.slo_windows import slo_factory
from pipeline.settings import Settings
from pipeline.spec.slo import load_spec_file
from producers.emit import BatchPolicy

START_NS = 1_763_000_000_000_000_000
MiB = 1024 * 1024
_NS_PER_MS = 1_000_000
_JEMALLOC_LINE = re.compile(
    rb"Allocated: (\d+), active: (\d+), metadata: (\d+).*?resident: (\d+), mapped: (\d+), "
    rb"retained: (\d+)"
)


def rss_mib() -> float:
    with open("/proc/self/status", "rb") as fh:
        for line in fh:
            if line.startswith(b"VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def join_sizes(proc: StreamProcessor) -> dict[str, float]:
    """Lengths of the join's and windows' structures, summed over partitions."""
    out: dict[str, float] = {}

    def add(name: str, n: int) -> None:
        out[name] = out.get(name, 0) + n

    for st in proc._parts.values():
        _join_sizes(st.joiner, add)
        w = st.windows
        add("open_windows", len(w._open))
        add("open_ledger", sum(len(x.ledger) for x in w._open.values()))
        add("corrections", len(w._corrections))
        add("takeover_ledger", len(st.ledger))
        add("boot", len(st.boot))
        add("ahead", len(st.ahead))
    return out


def _join_sizes(j: Joiner, add: Callable[[str, int], None]) -> None:
    """The joiner's structure lengths (see :func:`join_sizes`)."""
    add("pending", len(j._pending))
    add("pending_dict_kib", sys.getsizeof(j._pending) // 1024)
    add("resolved", len(j._resolved))
    gens = j._resolved._gens  # (generation dicts, see pipeline.core.join_state.ResolvedMemory)
    add("resolved_dict_kib", sum(sys.getsizeof(g) for g in gens) // 1024)
    add("resolved_generations", len(gens))
    t = j._timers  # (see pipeline.core.join_timers.JoinTimers)
    add("deadlines", len(t.deadlines))
    add("wall_waits", len(t.wall_waits))
    add("terminals", len(t.terminals))
    add("bucket_items", t._inflight.items)
    add("buckets", len(t._inflight.by_key))
    add("attempts", len(j._attempts))
    add("strings", len(j._codec.strings))


def chdb_metrics(store: ClickHouseStore) -> dict[str, float]:
    out: dict[str, float] = {}
    rows = store.query_rows(
        "SELECT metric, value FROM system.metrics WHERE metric IN ('MemoryTracking', "
        "'MarkCacheBytes', 'PrimaryIndexCacheBytes', 'UncompressedCacheBytes', "
        "'PageCacheBytes', 'MergesMutationsMemoryTracking', 'QueryCacheBytes')"
    )
    for name, value in rows:
        out[f"ch_{name}_mib"] = float(value) / MiB
    parts = store.query_rows(
        "SELECT count(), sum(primary_key_bytes_in_memory_allocated) FROM system.parts WHERE active"
    )
    out["ch_active_parts"] = float(parts[0][0])
    out["ch_primary_keys_mib"] = float(parts[0][1] or 0) / MiB
    text = store.query_rows("SELECT stats FROM system.jemalloc_stats")[0][0]
    m = _JEMALLOC_LINE.search(text.encode() if isinstance(text, str) else text)
    if m:
        for name, v in zip(
            ("allocated", "active", "metadata", "resident", "mapped", "retained"),
            m.groups(),
            strict=True,
        ):
            out[f"je_{name}_mib"] = int(v) / MiB
    return out


@dataclass
class Probe:
    minutes: float
    rate_ev_s: float
    batch_ms: int
    sample_s: float
    fit_from_min: float
    store_dir: Path | None
    trace_from_min: float | None
    out_dir: Path
    ttl_s: float | None = None  # the join's memory (in-flight and resolved); None: settings

    def _open(self) -> tuple[Settings, StreamProcessor, ClickHouseStore | None]:
        """The worker's settings, its stream processor and (with a store) its store."""
        s = Settings()
        if self.store_dir is not None:
            s = s.model_copy(update={"store_dir": self.store_dir})
        spec = load_spec_file(s.slo_spec) if s.slo_spec is not None else None
        join = s.join_config()
        if self.ttl_s is not None:
            ttl_ms = int(self.ttl_s * 1000)
            join = replace(join, inflight_ttl_ms=ttl_ms, resolved_ttl_ms=ttl_ms)
        proc = StreamProcessor(
            s.lifecycle_topic, join, max_message_bytes=s.max_message_bytes,
            window_config=s.window_config(), clock_config=s.clock_config(),
            slo_factory=slo_factory(spec), keep_events=s.store_raw_events,
            max_pending=s.max_pending,
        )  # fmt: skip
        store = None
        if self.store_dir is not None:
            store = open_for_writing(s).store
        return s, proc, store

    def run(self) -> dict[str, Any]:
        s, proc, store = self._open()
        writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="probe-writer")
        from pipeline.adapters.faust_wiring import tune_gc

        tune_gc()  # the worker's garbage-collector settings

        records: list[Any] = []
        windows: list[Any] = []
        kept: list[Any] = []
        acc = s.window_config().relative_accuracy
        flush_n = [0]

        def collect(out: Output) -> None:
            records.extend(out.records)
            windows.extend(out.windows)
            kept.extend(out.kept)

        def flush(wall_ms: int) -> None:
            collect(proc.tick(wall_ms))
            offsets = proc.safe_offsets()
            through = proc.next_offsets()
            horizons, marks = proc.horizons(), proc.watermarks()
            late = proc.lateness_by_partition()
            checkpoints = [
                Checkpoint(p, horizons[p], marks.get(p, 0), o, *late.get(p, (0, 0, 0)))
                for p, o in offsets.items()
            ]
            if store is not None:
                flush_n[0] += 1
                token = f"probe/{flush_n[0]}"

                def write(st: ClickHouseStore = store) -> None:
                    write_requests(st, records)
                    write_raw_messages(st, s.lifecycle_topic, kept)
                    if windows:
                        write_windows(
                            st, windows, s.lifecycle_topic, acc, token, through_offsets=through
                        )
                    write_checkpoints(st, "probe", s.lifecycle_topic, checkpoints)

                # on a writer thread, as the worker's (its own malloc arena), awaited
                writer.submit(write).result()
            records.clear()
            windows.clear()
            kept.clear()

        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / "samples.jsonl").write_text("")
        w = Workload(instances=10**6, rate_ev_s=self.rate_ev_s)
        end_ns = START_NS + int(self.minutes * 60e9)
        batcher = DictBatcher(BatchPolicy())
        offsets: dict[int, int] = {}
        batch: list[tuple[int, int, bytes]] = []
        batch_end_ms = START_NS // _NS_PER_MS + self.batch_ms
        next_flush_ms = START_NS // _NS_PER_MS + s.flush_interval_ms
        next_sample_ms = START_NS // _NS_PER_MS
        samples: list[dict[str, float]] = []
        snaps: dict[str, tracemalloc.Snapshot] = {}
        t_wall0, t_cpu0 = time.monotonic(), time.process_time()
        n_events = 0

        def sample(now_ms: int) -> None:
            self._sample(
                now_ms, proc=proc, store=store, n_events=n_events, t0=(t_wall0, t_cpu0),
                samples=samples, snaps=snaps,
            )  # fmt: skip

        # No memoised partitioner (bench.data.Partitioner): its cache of every request id
        # (up to 1M) would grow this process by ~200k blocks a minute, not the worker.
        for rid, ts, ev in events(w, START_NS):
            if ts >= end_ns:
                break
            now_ms = ts // _NS_PER_MS
            for p, value, n in batcher.add(partition_for(rid, PARTITIONS), ev, ts / _NS_PER_MS):
                off = offsets.get(p, 0)
                offsets[p] = off + 1
                batch.append((p, off, value))
                n_events += n
            if now_ms >= batch_end_ms:
                collect(proc.process(batch, now_ms))
                batch = []
                batch_end_ms = now_ms + self.batch_ms
                if now_ms >= next_flush_ms or len(records) >= s.flush_max_rows:
                    flush(now_ms)
                    next_flush_ms = now_ms + s.flush_interval_ms
                if now_ms >= next_sample_ms:
                    sample(now_ms)
                    next_sample_ms += int(self.sample_s * 1000)
        result = self._finish(samples, snaps)
        result["wall_s"] = time.monotonic() - t_wall0
        result["cpu_s"] = time.process_time() - t_cpu0
        result["events"] = n_events
        result["store"] = store is not None
        writer.shutdown()
        if store is not None:
            store.close()
        return result

    def _finish(
        self, samples: list[dict[str, float]], snaps: dict[str, tracemalloc.Snapshot]
    ) -> dict[str, Any]:
        """The last snapshot, then the summary and what a full collection frees."""
        if tracemalloc.is_tracing():
            gc.collect()
            snaps["end"] = tracemalloc.take_snapshot()
        blocks, rss = sys.getallocatedblocks(), rss_mib()
        found = gc.collect()
        result = self._summary(samples, snaps)
        result["full_collection_at_end"] = {
            "unreachable_objects": found,
            "blocks_freed_k": (blocks - sys.getallocatedblocks()) / 1000,
            "rss_mib_before": rss,
            "rss_mib_after": rss_mib(),
        }
        return result

    def _sample(
        self,
        now_ms: int,
        *,
        proc: StreamProcessor,
        store: ClickHouseStore | None,
        n_events: int,
        t0: tuple[float, float],
        samples: list[dict[str, float]],
        snaps: dict[str, tracemalloc.Snapshot],
    ) -> None:
        """One sample: the process's memory, the allocators', chDB's and the join's sizes
        (appended to ``samples`` and samples.jsonl); tracemalloc started and snapshotted
        at their minutes. ``t0``: the run's (wall, CPU) start."""
        minute = (now_ms - START_NS // _NS_PER_MS) / 60_000
        row: dict[str, float] = {
            "minute": minute,
            "wall_s": time.monotonic() - t0[0],
            "cpu_s": time.process_time() - t0[1],
            "events": n_events,
            "rss_mib": rss_mib(),
            "py_blocks_k": sys.getallocatedblocks() / 1000,
        }
        if (m := malloc_stats()) is not None:
            row |= {f"glibc_{k}_mib": v / MiB for k, v in m.items()}
        stats = gc.get_stats()
        row["gc_gen2_collections"] = stats[2]["collections"]
        row["gc_collected"] = sum(g["collected"] for g in stats)
        if tracemalloc.is_tracing():
            row["traced_mib"] = tracemalloc.get_traced_memory()[0] / MiB
        if store is not None:
            row |= chdb_metrics(store)
        row |= join_sizes(proc)
        samples.append(row)
        with (self.out_dir / "samples.jsonl").open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        if self.trace_from_min is not None:
            if not tracemalloc.is_tracing() and minute >= self.trace_from_min:
                tracemalloc.start(1)
            if "fit" not in snaps and minute >= self.fit_from_min and tracemalloc.is_tracing():
                gc.collect()
                snaps["fit"] = tracemalloc.take_snapshot()
        print(
            f"min {minute:5.1f}  wall {row['wall_s']:6.0f}s  rss {row['rss_mib']:7.0f} MiB  "
            f"py {row['py_blocks_k']:8.0f}k blocks  je {row.get('je_allocated_mib', 0):6.0f}"
            f"  resolved {row['resolved']:9.0f}  pending {row['pending']:8.0f}",
            file=sys.stderr,
            flush=True,
        )

    def _summary(
        self, samples: list[dict[str, float]], snaps: dict[str, tracemalloc.Snapshot]
    ) -> dict[str, Any]:
        fit = [r for r in samples if r["minute"] >= self.fit_from_min]
        slopes: dict[str, dict[str, float]] = {}
        if len(fit) >= 2:
            xs = [r["minute"] for r in fit]
            for name in sorted({k for r in fit for k in r}):
                if name in {"minute", "wall_s", "cpu_s", "events"}:
                    continue
                ys = [r.get(name, 0.0) for r in fit]
                slope, icpt = theil_sen(xs, ys)
                level = slope * xs[0] + icpt
                slopes[name] = {
                    "per_min": slope,
                    "level_at_fit_start": level,
                    "pct_per_10_min": slope * 10 / level * 100 if level else 0.0,
                }
        out: dict[str, Any] = {"fit_from_min": self.fit_from_min, "slopes": slopes}
        if "fit" in snaps and "end" in snaps:
            diff = snaps["end"].compare_to(snaps["fit"], "lineno")
            out["tracemalloc_top"] = [
                {
                    "where": str(d.traceback[0]),
                    "size_diff_kib": d.size_diff / 1024,
                    "count_diff": d.count_diff,
                    "size_kib": d.size / 1024,
                }
                for d in diff[:30]
            ]
        (self.out_dir / "summary.json").write_text(json.dumps(out, indent=1))
        return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=21.0, help="minutes of event time")
    ap.add_argument("--rate", type=float, default=10_000.0, help="events/s of event time")
    ap.add_argument("--batch-ms", type=int, default=100, help="event time per batch")
    ap.add_argument("--sample-s", type=float, default=5.0, help="event time between samples")
    ap.add_argument("--fit-from", type=float, default=11.0, help="minute the fit starts")
    ap.add_argument("--store", action="store_true", help="write to an embedded chDB store")
    ap.add_argument("--store-dir", type=Path, help="its directory (default: a temporary one)")
    ap.add_argument("--trace-from", type=float, help="start tracemalloc at this minute")
    ap.add_argument("--out", type=Path, default=Path("bench-memory-probe"))
    ap.add_argument(
        "--tune-malloc", action="store_true", help="the worker's glibc malloc tuning first"
    )
    ap.add_argument(
        "--ttl-s", type=float, help="the join's in-flight and resolved TTL (default: settings)"
    )
    a = ap.parse_args(argv)
    if a.tune_malloc:
        tune_malloc()
    with tempfile.TemporaryDirectory(prefix="tailguard-memprobe-") as tmp:
        store_dir = (a.store_dir or Path(tmp) / "store") if a.store else None
        probe = Probe(
            a.minutes, a.rate, a.batch_ms, a.sample_s, a.fit_from, store_dir, a.trace_from,
            a.out, a.ttl_s,
        )  # fmt: skip
        result = probe.run()
    slopes = result.pop("slopes")
    top = result.pop("tracemalloc_top", None)
    print(json.dumps(result))
    for name, v in sorted(slopes.items()):
        print(
            f"{name:28s} level {v['level_at_fit_start']:12.1f}  slope/min {v['per_min']:10.3f}"
            f"  {v['pct_per_10_min']:7.2f} %/10 min"
        )
    for d in top or []:
        print(f"{d['size_diff_kib']:10.0f} KiB {d['count_diff']:9d}  {d['where']}")


if __name__ == "__main__":
    main()
