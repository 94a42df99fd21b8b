"""The ClickHouse writer's cost per event, this tree against another commit, interleaved.

One flush of the worker's writer thread (``write_requests``, ``write_raw_events``,
``write_windows``) over the simulated workload's records, kept events and windows, into
one embedded engine (chDB): this tree's store module into the database ``tailguard``
(its ``sql/``), and the store module of ``--base`` (``git archive``; its other imports
come from this tree) into ``tailguard_base`` (the base's ``sql/``). Flushes alternate
between the two (the order swapped every round), every table is emptied before each, and
the median of ``--repeat`` flushes is reported per step, in µs per event: process CPU
(the writer thread and the engine's own threads) and the calling thread's CPU (its Python,
which holds the GIL, plus the engine's work on that thread, which does not).

    PYTHONPATH=$PWD python bench/store_speed.py [--base main] [--instances 1] [--repeat 9]

Not part of ``./tg bench``: a yardstick for changes to ``pipeline/adapters/store/``
and ``sql/``. Another process's load moves both sides alike, not equally: run it on a
quiet machine for figures to quote.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from bench.core_speed import _slo_factory, load
from pipeline.adapters import store as this
from pipeline.core.processor import StreamProcessor
from pipeline.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
# what one flush writes, and the tables it fills (emptied before each flush)
STEPS = ("requests", "raw_events", "windows")
TABLES = ("requests", "lifecycle_events", "window_sketches", "slo_windows", "latency_1m",
          "latency_1h", "slo_1m", "slo_1h")  # fmt: skip


def base_tree(ref: str, into: Path) -> Path:
    """``pipeline/`` and ``sql/`` of ``ref``, extracted under ``into``."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", ref, "pipeline", "sql"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def load_store_module(tree: Path) -> ModuleType:
    """The store of ``tree``: the package ``pipeline/adapters/store/`` (its modules import
    each other relatively, so they come from ``tree`` too), or an older tree's module."""
    package = tree / "pipeline" / "adapters" / "store"
    if (package / "__init__.py").is_file():
        spec = importlib.util.spec_from_file_location(
            "tailguard_base_store",
            package / "__init__.py",
            submodule_search_locations=[str(package)],
        )
    else:
        spec = importlib.util.spec_from_file_location(
            "tailguard_base_store", tree / "pipeline" / "adapters" / "store.py"
        )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def workload(instances: int) -> tuple[list[Any], list[Any], list[Any], int]:
    """Records, kept events and windows of the workload, as the processor emits them."""
    msgs, _ = load(instances)
    s = Settings()
    proc = StreamProcessor(
        s.lifecycle_topic, s.join_config(), max_message_bytes=s.max_message_bytes,
        window_config=s.window_config(), slo_factory=_slo_factory(s.slo_spec),
        keep_events=s.store_raw_events,
    )  # fmt: skip
    records: list[Any] = []
    kept: list[Any] = []
    windows: list[Any] = []
    for i in range(0, len(msgs), 1000):
        out = proc.process(msgs[i : i + 1000], None)
        records += out.records
        kept += out.kept
        windows += out.windows
    out = proc.drain()
    return records + out.records, kept, windows + out.windows, proc.counters.events


def flush(mod: ModuleType, store: Any, data: tuple[list[Any], list[Any], list[Any]], token: str,
          topic: str) -> list[tuple[float, float]]:  # fmt: skip
    """(process CPU, thread CPU) seconds of each step of one flush."""
    records, kept, windows = data
    if hasattr(mod, "write_raw_messages"):  # the processor's kept messages, as the worker
        raw: Callable[[], None] = lambda: mod.write_raw_messages(store, topic, kept)  # noqa: E731
    else:  # an older store module: event by event
        events = this.kept_events(kept)
        raw = lambda: mod.write_raw_events(store, topic, events)  # noqa: E731
    steps: tuple[Callable[[], None], ...] = (
        lambda: mod.write_requests(store, records),
        raw,
        lambda: mod.write_windows(store, windows, "t", 0.01, token, through_offsets={}),
    )
    out = []
    for step in steps:
        t, tt = time.process_time(), time.thread_time()
        step()
        out.append((time.process_time() - t, time.thread_time() - tt))
    return out


def _worker_gc() -> None:
    """The worker's garbage-collector settings where this tree has them (``tune_gc``,
    issue 14), else the workload frozen out of the collector's way."""
    try:
        from pipeline.adapters.faust_wiring import tune_gc
    except ImportError:
        gc.collect()
        gc.freeze()
    else:
        tune_gc()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="main", help="git ref to compare with (default: main)")
    ap.add_argument("--instances", type=int, default=1, help="x ~58k events per flush")
    ap.add_argument("--repeat", type=int, default=9)
    args = ap.parse_args(argv)
    records, kept, windows, n = workload(args.instances)
    _worker_gc()
    s = Settings()
    tmp = Path(tempfile.mkdtemp(prefix="tailguard-store-speed-"))
    try:
        base = load_store_module(base_tree(args.base, tmp))
        # the workload's events are from 2025: a retention that keeps them
        update = {"store_dir": tmp / "store", "raw_events_ttl_days": 3650}
        store = this.open_for_writing(s.model_copy(update=update)).store
        if hasattr(base, "EmbeddedStore"):
            base_store = base.EmbeddedStore(store._client, "tailguard_base")
        else:  # an older store module: one class, a flag
            base_store = base.ClickHouseStore(store._client, "tailguard_base", embedded=True)
        base_store._lock = store.lock  # one engine, one lock
        base.migrate(base_store, sql_dir=tmp / "sql", raw_ttl_days=3650)
        sides = {"base": (base, base_store), "this": (this, store)}
        times: dict[str, list[list[tuple[float, float]]]] = {"base": [], "this": []}
        data = (records, kept, windows)
        for r in range(args.repeat):
            for name in ("base", "this") if r % 2 == 0 else ("this", "base"):
                mod, st = sides[name]
                for table in TABLES:
                    st.command(f"TRUNCATE TABLE {st.database}.{table}")
                times[name].append(flush(mod, st, data, f"tok-{name}-{r}", s.lifecycle_topic))
        store.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"{n} events, {len(records)} records, {len(windows)} windows per flush; --base "
        f"{args.base}; µs per event, median of {args.repeat} interleaved flushes, "
        "process CPU / calling thread CPU"
    )
    for name, runs in times.items():
        cells = []
        for i, step in enumerate((*STEPS, "flush")):
            per_run = [
                run[i] if i < len(STEPS) else tuple(map(sum, zip(*run, strict=True)))
                for run in runs
            ]
            proc = statistics.median(p for p, _ in per_run) / n * 1e6
            thread = statistics.median(t for _, t in per_run) / n * 1e6
            cells.append(f"{step} {proc:5.2f} / {thread:5.2f}")
        print(f"{name:5s} " + "   ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
