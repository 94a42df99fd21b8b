"""In-process CPU cost of the worker's core per event: the yardstick for hot-path work.

Runs what the worker's event loop runs per batch, without Kafka, Faust or ClickHouse:
``StreamProcessor.process`` (decode, join, windows, SLO counts; ``keep_events`` as the
worker's default) over batched messages of the simulated workload, plus the raw-event
row building of ``WorkerShell._collect`` and the record -> column conversion of the
ClickHouse writer. Reports CPU µs per event (``time.process_time``), the median of
``--repeat`` runs, per stage: ``decode_us`` (the processor's decoder alone, a separate
pass over the same messages), ``process_us`` (``StreamProcessor.process``: decode, clock,
join, records, windows, SLO counts), ``raw_rows_us``, ``columns_us``, ``store_us``.

    python -m bench.core_speed [--instances 4] [--repeat 3] [--profile]

The script runs against whatever ``pipeline`` package is first on the path, so the same
workload measures an older commit too (``./tg bench`` section ``core_speed``: before and
after, see :func:`run`).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from bench.data import Workload, events, messages
from bench.results import Figure, Section, register
from pipeline.adapters.store import request_columns
from pipeline.contract.codec import SourceRef
from pipeline.core.processor import StreamProcessor
from pipeline.settings import Settings
from producers.emit import BatchPolicy

if TYPE_CHECKING:
    from bench.context import Context

try:  # core takes a loaded spec (issue 18); older commits loaded it in core
    from pipeline.core.slo_windows import slo_factory as _factory_of_spec
    from pipeline.spec.slo import load_spec_file

    def _slo_factory(path: Path | None) -> Any:
        return _factory_of_spec(load_spec_file(path) if path is not None else None)

except ImportError:  # pragma: no cover - only when measuring an older commit
    from pipeline.core.slo_windows import (  # type: ignore[attr-defined,no-redef]
        load_slo_factory as _slo_factory,
    )

try:  # the writer builds raw-event columns from the kept events (issue 14)
    from pipeline.adapters.store import write_raw_events as _write_raw
except ImportError:  # pragma: no cover - only when measuring an older commit
    _write_raw = None  # type: ignore[assignment]
try:  # the processor keeps whole messages, the writer stores them as they are (issue 14)
    from pipeline.adapters.store import write_raw_messages as _write_messages
except ImportError:  # pragma: no cover - only when measuring an older commit
    _write_messages = None  # type: ignore[assignment]
# Requests reach the embedded store as JSON the engine converts (no columns in Python)
_JSON_REQUESTS = _write_raw is not None

try:  # the worker's decoder (issue 14); older commits decode with the reference one
    from pipeline.contract.wire import decode_fast as _decode
except ImportError:  # pragma: no cover - only when measuring an older commit
    from pipeline.contract.codec import decode_message as _decode  # type: ignore[assignment]

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


def _raw_row(item: tuple[Any, ...]) -> tuple[Any, ...]:
    """The worker's raw-event row (``WorkerShell._collect``): the payload as received, or
    (before issue 14, events without their bytes) re-encoded."""
    if len(item) == 4:
        p, off, ev, raw = item
        payload = str(raw, "utf-8")
    else:  # pragma: no cover - an older commit
        from pipeline.contract.codec import encode_event

        p, off, ev = item
        payload = encode_event(ev).decode()
    return (ev.event_id, ev.kind, ev.request_id, ev.ts_unix_ns, ev.host, ev.model,
            "t", p, off, payload)  # fmt: skip


def decode_only(msgs: list[tuple[int, int, bytes]]) -> float:
    """CPU seconds the processor's decoder takes over the messages alone."""
    t = time.process_time()
    for p, off, raw in msgs:
        _decode(raw, SourceRef("t", p, off))
    return time.process_time() - t


def run_once(
    msgs: list[tuple[int, int, bytes]], batch: int = 1000, store_dir: str | None = None
) -> dict[str, float]:
    s = Settings()
    store = None
    if store_dir is not None:
        from pipeline.adapters.store import open_for_writing

        # The workload's events are from November 2025: under the default 7-day TTL the
        # engine drops every lifecycle_events row at insert and the figures leave out
        # their storage (a TTL past 2106 overflows DateTime).
        update = {"store_dir": Path(store_dir), "raw_events_ttl_days": 3650}
        store = open_for_writing(s.model_copy(update=update)).store
    proc = StreamProcessor(
        s.lifecycle_topic, s.join_config(), max_message_bytes=s.max_message_bytes,
        window_config=s.window_config(), slo_factory=_slo_factory(s.slo_spec),
        keep_events=s.store_raw_events,
    )  # fmt: skip
    t_proc = t_rows = t_cols = t_store = t_store_thread = 0.0
    pending_records: list[Any] = []
    pending_rows: list[Any] = []
    pending_windows: list[Any] = []

    def write() -> tuple[float, float]:
        """What the worker's writer thread does per flush (records, raw events, windows):
        process CPU (every thread, chDB's own included) and the calling thread's CPU
        (the Python side, which holds the GIL; chDB releases it while a query runs)."""
        from pipeline.adapters.store import write_requests, write_windows

        t, tt = time.process_time(), time.thread_time()
        assert store is not None
        write_requests(store, pending_records)
        if _write_messages is not None:  # this tree: the kept messages as they are
            _write_messages(store, s.lifecycle_topic, pending_rows)
        elif _write_raw is not None:  # pragma: no cover - kept events, one by one
            _write_raw(store, s.lifecycle_topic, pending_rows)
        else:  # pragma: no cover - an older commit: rows built on the event loop
            from pipeline.adapters.store import write_events

            write_events(store, pending_rows)
        if pending_windows:
            write_windows(store, pending_windows, "t", 0.01, f"tok-{time.time_ns()}")
        pending_records.clear()
        pending_rows.clear()
        pending_windows.clear()
        return time.process_time() - t, time.thread_time() - tt

    for i in range(0, len(msgs), batch):
        chunk = msgs[i : i + batch]
        t0 = time.process_time()
        out = proc.process(chunk, None)
        t1 = time.process_time()
        # The event loop's share of storing raw events: nothing in this tree (the kept
        # events go to the writer as they are); a row per event in older commits.
        if _write_messages is not None:
            rows = out.kept
        elif _write_raw is not None:  # pragma: no cover - older commits
            rows = out.events
        else:  # pragma: no cover
            rows = [_raw_row(item) for item in out.events]
        t2 = time.process_time()
        if not _JSON_REQUESTS:  # pragma: no cover - older commits: columns for every store
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
                a, b = write()
                t_store += a
                t_store_thread += b
    t0 = time.process_time()
    out = proc.drain()
    if not _JSON_REQUESTS:  # pragma: no cover
        request_columns(out.records)
    t_proc += time.process_time() - t0
    if store is not None:
        pending_records.extend(out.records)
        pending_windows.extend(out.windows)
        a, b = write()
        t_store += a
        t_store_thread += b
        store.close()
    n = proc.counters.events
    t_decode = decode_only(msgs)
    return {
        "store_us": t_store / n * 1e6,
        "store_thread_us": t_store_thread / n * 1e6,
        "events": n,
        "decode_us": t_decode / n * 1e6,
        "process_us": t_proc / n * 1e6,
        "raw_rows_us": t_rows / n * 1e6,
        "columns_us": t_cols / n * 1e6,
        "total_us": (t_proc + t_rows + t_cols + t_store) / n * 1e6,
        "gil_us": (t_proc + t_rows + t_cols + t_store_thread) / n * 1e6,
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
    # The worker's garbage-collector settings, as the measured commit has them
    # (pipeline/adapters/faust_wiring.py tune_gc).
    try:
        from pipeline.adapters.faust_wiring import tune_gc
    except ImportError:  # pragma: no cover - a commit without it
        gc.collect()
        gc.freeze()
        gc.set_threshold(50_000, 20, 100)
    else:
        tune_gc()
    results: list[dict[str, float]] = []
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
    print(orjson.dumps(_median(results), option=orjson.OPT_INDENT_2).decode())


def _median(results: list[dict[str, float]]) -> dict[str, Any]:
    med: dict[str, Any] = {k: statistics.median(r[k] for r in results) for k in results[0]}
    med["events_per_cpu_s"] = 1e6 / med["total_us"]
    if med.get("gil_us"):
        med["events_per_gil_s"] = 1e6 / med["gil_us"]
    return med


# The commit before the issue-14 work (per-event pydantic objects): the "before" column.
BASE_COMMIT = os.environ.get("TG_CORE_SPEED_BASE", "b8534c5")
_STAGES = (
    ("decode_us", "decode (alone, separate pass)"),
    ("process_us", "StreamProcessor.process (decode, clock, join, records, windows, SLOs)"),
    ("raw_rows_us", "raw-event rows on the event loop (WorkerShell._collect)"),
    ("columns_us", "requests columns in Python (ClickHouse writer, embedded store)"),
    ("store_us", "store writes, process CPU (writer thread and chDB's own threads)"),
    ("store_thread_us", "store writes, writer thread CPU (holds the GIL; chDB's part does not)"),
    ("total_us", "total CPU"),
    ("gil_us", "CPU on threads that hold the GIL (event loop + writer's Python side)"),
)


def _measure(pythonpath: Path, instances: int, repeat: int) -> dict[str, Any]:
    script = Path(__file__).resolve()
    env = dict(os.environ, PYTHONPATH=str(pythonpath))
    out = subprocess.run(
        [sys.executable, str(script), "--instances", str(instances), "--repeat", str(repeat),
         "--store"],
        env=env, cwd=pythonpath, capture_output=True, text=True, check=True,
    )  # fmt: skip
    result: dict[str, Any] = orjson.loads(out.stdout[out.stdout.index("{") :])
    return result


@register("core_speed", "Core CPU cost per event, by stage: before and after issue 14", order=5)
def run(ctx: Context) -> Section:
    """``bench.core_speed`` on the base commit (a temporary git worktree) and on this tree,
    one after the other in this run, with the same workload and settings."""
    t0 = time.monotonic()
    repo = Path(__file__).resolve().parents[1]
    instances, repeat = (1, 1) if ctx.mode == "quick" else (2, 3)
    base_dir = Path(tempfile.mkdtemp(prefix="tg-core-base-"))
    wt = base_dir / "tree"
    subprocess.run(["git", "worktree", "add", "--detach", str(wt), BASE_COMMIT], cwd=repo,
                   capture_output=True, check=True)  # fmt: skip
    try:
        before = _measure(wt, instances, repeat)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(wt)], cwd=repo,
                       capture_output=True, check=False)  # fmt: skip
    after = _measure(repo, instances, repeat)
    s = Section("core_speed", "Core CPU cost per event, by stage: before and after issue 14")
    for key, label in _STAGES:
        b, a = before.get(key), after.get(key)
        s.figures.append(Figure(f"{label}: before ({BASE_COMMIT})", b, "µs/event"))
        s.figures.append(Figure(f"{label}: after (this tree)", a, "µs/event"))
    for label, r in (("before", before), ("after", after)):
        s.figures.append(
            Figure(f"events per CPU-second, {label}", r["events_per_cpu_s"], "events/s")
        )
        if r.get("events_per_gil_s"):
            s.figures.append(
                Figure(
                    f"events per second of GIL-holding CPU, {label} (one core's ceiling)",
                    r["events_per_gil_s"], "events/s",
                )
            )  # fmt: skip
    s.text.append(
        f"`python bench/core_speed.py --instances {instances} --repeat {repeat} --store` "
        f"({after['events']:,} events of the simulated workload in batched messages; CPU "
        f"time by `time.process_time`, median of {repeat}), run once with the base commit "
        f"{BASE_COMMIT} first on the path (a temporary git worktree) and once with this "
        "tree, one after the other. The decode stage is the processor's decoder alone "
        "(the base: pydantic `decode_message`; this tree: msgspec `decode_fast`); it is "
        "also inside `StreamProcessor.process`. Single-threaded in-process CPU time: other "
        "processes on the machine distort it less than wall-clock rates. Store writes "
        "are given twice: process CPU (every thread, chDB's own query threads included) "
        "and the writer thread's own CPU (`time.thread_time`), the Python side that holds "
        "the GIL; chDB releases the GIL while a query runs, so only the latter competes "
        "with the event loop for one core. In this tree the event loop builds no raw-event "
        "rows (the writer builds columns from the kept events) and the embedded store "
        "takes requests as JSON converted by the engine (no Python columns): those two "
        "stages are then 0 and their cost is inside the store figures."
    )
    s.commands.append(f"PYTHONPATH=<worktree of {BASE_COMMIT}> python bench/core_speed.py ...")
    s.commands.append("PYTHONPATH=. python bench/core_speed.py ...")
    s.seconds = time.monotonic() - t0
    return s


if __name__ == "__main__":
    main()
