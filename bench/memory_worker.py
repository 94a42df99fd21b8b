"""``python -m bench.memory_worker worker``: the tailguard CLI with a memory sampler.

A thread in the worker process writes one JSON line every ``TAILGUARD_MEM_PERIOD_S``
(60 s) to ``$TAILGUARD_MEM_SAMPLES``: RSS, glibc's ``mallinfo2``, chDB's own memory
figures (queried through the worker's store object), the lengths of every container
the worker's objects hold (the shell, the processor and each partition's join and
windows, telemetry, the controller, the producers), and with
``TAILGUARD_MEM_TRACEMALLOC=N`` (N frames) the Python allocations that grew most since
the snapshot taken at ``TAILGUARD_MEM_TRACE_BASE_S`` (180 s);
``TAILGUARD_MEM_COLLECT=1`` runs a full collection at each sample and reports the
cyclic garbage it found, by type; ``TAILGUARD_MEM_RESOLVED_TTL_MS`` shortens the join's
memory of resolved requests; ``TAILGUARD_MEM_KEEP_INSERT_CONTEXTS=1`` leaves the store's
insert contexts as clickhouse-connect leaves them (the growth before its fix). Used by
``bench/memory_live.py`` to split a live worker's RSS growth between Python objects,
glibc's free space and the engine.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import tempfile
import threading
import time
import tracemalloc
from collections import Counter, deque
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.memory_probe import chdb_metrics, join_sizes, rss_mib
from pipeline.adapters.malloc import malloc_stats

MiB = 1024 * 1024
_CONTAINERS = (dict, list, deque, set, frozenset, bytearray)


def _lengths(prefix: str, obj: Any, out: dict[str, int], depth: int = 3) -> None:
    """``out[path] = len(container)`` for every container reachable from ``obj`` through
    the attributes of the project's objects and the values of small containers."""
    if isinstance(obj, _CONTAINERS):
        out[prefix] = len(obj)
        if depth > 0 and len(obj) <= 64:
            items = obj.items() if isinstance(obj, dict) else enumerate(obj)
            try:
                for k, v in list(items):
                    _lengths(f"{prefix}[{k}]", v, out, depth - 1)
            except (RuntimeError, TypeError):
                pass
        return
    if depth <= 0 or not type(obj).__module__.startswith(("pipeline", "bench")):
        return
    names: list[str] = list(getattr(obj, "__dict__", {}))
    for cls in type(obj).__mro__:
        names += [n for n in getattr(cls, "__slots__", ()) if isinstance(n, str)]
    for name in names:
        try:
            v = getattr(obj, name)
        except AttributeError:
            continue
        _lengths(f"{prefix}.{name}", v, out, depth - 1)


def _tname(o: object) -> str:
    return f"{type(o).__module__}.{type(o).__qualname__}"


def _census() -> Counter[str]:
    """Objects the collector tracks (every generation, not the frozen ones), by type."""
    return Counter(_tname(o) for o in gc.get_objects())


def _garbage() -> dict[str, Any]:
    """A full collection that keeps what it finds (``DEBUG_SAVEALL``): the unreachable
    objects (cycles) by type, and how long the collection took."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        t = time.perf_counter()
        found = gc.collect()
        took_ms = (time.perf_counter() - t) * 1000
        by_type = Counter(_tname(o) for o in gc.garbage)
        examples = _cycle_examples(gc.garbage, [t for t, _ in by_type.most_common(2)])
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    return {
        "found": found,
        "took_ms": round(took_ms),
        "types": by_type.most_common(15),
        "examples": examples,
    }


def _cycle_examples(garbage: list[Any], types: list[str], n: int = 4) -> list[dict[str, Any]]:
    """For a few garbage objects of the given types: their repr, and the garbage objects
    they refer to and are referred to by (the cycle that kept them)."""
    ids = {id(o) for o in garbage}
    out = []
    for t in types:
        for o in [g for g in garbage if _tname(g) == t][-n:]:
            out.append(
                {
                    "type": t,
                    "repr": repr(o)[:240],
                    "refers_to": [
                        f"{_tname(r)}:{repr(r)[:80]}" for r in gc.get_referents(o) if id(r) in ids
                    ][:6],
                    "referred_by": [
                        f"{_tname(r)}:{repr(r)[:80]}"
                        for r in gc.get_referrers(o)
                        if id(r) in ids and r is not garbage
                    ][:6],
                }
            )
    return out


def _examples(type_name: str, n: int = 3) -> list[dict[str, Any]]:
    """A few of the newest tracked objects of a type: their repr and their referrers."""
    objs = [o for o in gc.get_objects() if _tname(o) == type_name]
    out = []
    for o in objs[-n:]:
        refs = [
            f"{_tname(r)}:{len(r) if hasattr(r, '__len__') else ''}"
            for r in gc.get_referrers(o)
            if r is not objs
        ]
        out.append({"repr": repr(o)[:300], "referrers": refs[:8]})
    del objs
    return out


def _rss_parts() -> dict[str, float]:
    """RssAnon / RssFile / RssShmem (MiB): anonymous memory vs mapped files."""
    out: dict[str, float] = {}
    with open("/proc/self/status", "rb") as fh:
        for line in fh:
            if line.startswith((b"RssAnon:", b"RssFile:", b"RssShmem:")):
                name, kib = line.split()[:2]
                out[name.decode().rstrip(":")] = int(kib) / 1024
    return out


_OBMALLOC_FIGURES = {
    b"# arenas allocated current": "arenas",
    b"# bytes in allocated blocks": "allocated_mib",
    b"# bytes in available blocks": "available_mib",
}


def _obmalloc() -> dict[str, float]:
    """pymalloc's arenas (``sys._debugmallocstats``, which writes to the C stderr: fd 2 is
    pointed at a file meanwhile, so a log line written in that moment lands there). Its
    arenas are mmapped outside glibc: blocks in use can stay flat while arenas, pinned by
    a few long-lived objects each, grow (``pymalloc_blocks`` alone cannot show that)."""
    out: dict[str, float] = {}
    with tempfile.TemporaryFile() as tmp:
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            os.dup2(tmp.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        text = tmp.read()
    for line in text.splitlines():
        head, _, value = line.partition(b"=")
        if b"unused pools *" in head:  # "N unused pools * 16384 bytes = ..."
            out["obmalloc_unused_pools"] = float(head.split()[0].replace(b",", b""))
            continue
        name = _OBMALLOC_FIGURES.get(head.strip())
        if name is not None:
            n = float(value.strip().replace(b",", b""))
            out[f"obmalloc_{name}"] = n / MiB if name.endswith("_mib") else n
    return out


def _sample(
    shell: Any, t0: float, base: tracemalloc.Snapshot | None, prev_census: Counter[str]
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "t_s": round(time.monotonic() - t0, 1),
        "rss_mib": rss_mib(),
        **_rss_parts(),
        "pymalloc_blocks": sys.getallocatedblocks(),
        **_obmalloc(),
    }
    m = malloc_stats()
    if m:
        row |= {f"glibc_{k}_mib": v / MiB for k, v in m.items()}
    if shell is None:
        return row
    lens: dict[str, int] = {}
    _lengths("shell", shell, lens, depth=5)
    row["lens"] = {k: v for k, v in lens.items() if v > 16}
    row["gc_counts"] = gc.get_count()
    row["gc_gen_sizes"] = [len(gc.get_objects(g)) for g in range(3)]
    if os.environ.get("TAILGUARD_MEM_COLLECT") == "1":
        row["rss_before_collect_mib"] = rss_mib()
        row["garbage"] = _garbage()
        row["rss_after_collect_mib"] = rss_mib()
    # after a full collection: the live objects only
    census = _census()
    row["tracked"] = sum(census.values())
    if prev_census:
        grown = (census - prev_census).most_common(12)
        row["census_growth"] = grown
        row["census_examples"] = {t: _examples(t) for t, _ in grown[:3]}
    prev_census.clear()
    prev_census.update(census)
    for _ in range(3):  # the main thread may add a partition meanwhile
        try:
            row["join"] = join_sizes(shell.processor)
            break
        except RuntimeError:
            continue
    if shell.ports is not None:
        try:
            row |= chdb_metrics(shell.ports.store)
        except Exception as exc:  # a sample, not the worker's job
            row["chdb_error"] = repr(exc)
    if tracemalloc.is_tracing():
        row["traced_mib"] = tracemalloc.get_traced_memory()[0] / MiB
        if base is not None:
            diff = tracemalloc.take_snapshot().compare_to(base, "traceback")
            row["top_growth"] = [
                {
                    "kib": round(d.size_diff / 1024),
                    "count": d.count_diff,
                    "at": [f"{f.filename}:{f.lineno}" for f in d.traceback],
                }
                for d in diff[:15]
            ]
    return row


def main() -> int:
    out = Path(os.environ["TAILGUARD_MEM_SAMPLES"])
    period_s = float(os.environ.get("TAILGUARD_MEM_PERIOD_S", "60"))
    base_s = float(os.environ.get("TAILGUARD_MEM_TRACE_BASE_S", "180"))
    frames = int(os.environ.get("TAILGUARD_MEM_TRACEMALLOC", "0"))
    import pipeline.adapters.worker as worker_mod

    shells: list[Any] = []
    opened = worker_mod.WorkerShell.open

    def open_and_keep(self: Any, ports: Any) -> None:
        shells.append(self)
        opened(self, ports)

    worker_mod.WorkerShell.open = open_and_keep  # type: ignore[method-assign]
    if os.environ.get("TAILGUARD_MEM_KEEP_INSERT_CONTEXTS") == "1":
        # the store as it was before it released clickhouse-connect's insert contexts
        # (for a before/after comparison in one tree)
        import pipeline.adapters.store.client as store_client

        store_client._release = lambda context: None  # type: ignore[assignment]
    if ttl := os.environ.get("TAILGUARD_MEM_RESOLVED_TTL_MS"):
        # a shorter memory of resolved requests: the warm-up ends sooner
        from pipeline.settings import Settings

        join_config = Settings.join_config

        def shorter(self: Settings) -> Any:
            return replace(join_config(self), resolved_ttl_ms=int(ttl))

        Settings.join_config = shorter  # type: ignore[method-assign]
    if frames:
        tracemalloc.start(frames)
    t0 = time.monotonic()

    def sampler() -> None:
        base: tracemalloc.Snapshot | None = None
        census: Counter[str] = Counter()
        with out.open("a") as fh:
            while True:
                time.sleep(period_s)
                if frames and base is None and time.monotonic() - t0 >= base_s:
                    base = tracemalloc.take_snapshot()
                row = _sample(shells[0] if shells else None, t0, base, census)
                fh.write(json.dumps(row) + "\n")
                fh.flush()

    threading.Thread(target=sampler, name="mem-sampler", daemon=True).start()
    from pipeline.cli import main as cli_main

    return cli_main()


if __name__ == "__main__":
    raise SystemExit(main())
