"""Window summaries: what every worker tells the one controller.

Each worker owns some partitions, so no worker sees a model's whole traffic.
When a (partition, window) closes, the worker publishes a compact summary of
it — per model and boundary the sketch, per SLO the counts — and forwards the
engine.stats samples it consumes, all on one single-partition topic
(``tailguard.summaries``). Exactly one worker of the group owns that
partition and runs the controller over the merged picture. The same code runs
in ``replay``, without Kafka.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

import orjson

from pipeline.contract.wire import AnyStats
from pipeline.core.sketch import QuantileSketch, SketchColumns
from pipeline.core.windows import ALL, ClosedWindow

SUMMARY_VERSION: Final = 1
ALL_MODELS: Final = ALL


@dataclass(frozen=True, slots=True)
class ModelWindow:
    records: int
    boundaries: dict[str, SketchColumns]


@dataclass(frozen=True, slots=True)
class SLOWindowCounts:
    total: int
    good: int
    objective: float


@dataclass(frozen=True, slots=True)
class WindowSummary:
    partition: int
    start_ms: int
    size_ms: int
    models: dict[str, ModelWindow]  # "*" = all traffic
    slos: dict[str, SLOWindowCounts]
    # False: a snapshot of a window that has ended but is still in its grace period
    # (latency only; superseded by later snapshots and by the final summary).
    final: bool = True
    # A correction of a closed window (late records, partials taken back): SLO counts
    # only, which add to the window's (may be negative); unique per correction.
    correction_id: str | None = None


@dataclass(frozen=True, slots=True)
class StatsSample:
    host: str
    model: str
    ts_ms: int
    num_running: int
    num_waiting: int
    kv_cache_usage: float
    prefix_cache_hit_rate: float | None
    gpu_memory_used_fraction: float | None

    @classmethod
    def of(cls, ev: AnyStats) -> StatsSample:
        return cls(
            ev.host,
            ev.model,
            ev.ts_unix_ns // 1_000_000,
            ev.num_running,
            ev.num_waiting,
            ev.kv_cache_usage,
            ev.prefix_cache_hit_rate,
            ev.gpu_memory_used_fraction,
        )


@dataclass(frozen=True, slots=True)
class Progress:
    """A partition's close horizon: every window of it ending at or before is summarized.

    ``clock_ms`` (when the worker sends provisional snapshots): the partition's event-time
    clock; every window ending at or before it is summarized, finally or provisionally.
    """

    partition: int
    horizon_ms: int
    clock_ms: int | None = None


def summarize(
    win: ClosedWindow,
    relative_accuracy: float = 0.01,
    *,
    final: bool = True,
    correction_id: str | None = None,
) -> WindowSummary:
    """Merge a window's keys by model (priority and ctx bucket folded).

    A provisional summary (``final=False``) carries no SLO counts: budgets count
    closed windows only, once. A correction (``win.correction``; ``correction_id``
    names it, so a repeat is recognised) carries its SLO counts only.
    """
    if win.correction:
        slos_c: dict[str, SLOWindowCounts] = {}
        if win.slos is not None:
            for r in win.slos.rows():
                if r.kind == "slo" and (r.total or r.good):
                    slos_c[r.slo] = SLOWindowCounts(r.total, r.good, r.objective)
        cid = correction_id or f"{win.partition}/{win.start_ms}/{sorted(win.ledger)[:1]}"
        return WindowSummary(win.partition, win.start_ms, win.size_ms, {}, slos_c, True, cid)
    merged: dict[str, dict[str, QuantileSketch]] = {}
    records: dict[str, int] = {}
    for (model, prio, ctx), n in win.records.items():
        name = ALL_MODELS if (model, prio, ctx) == (ALL, ALL, ALL) else model
        if name == ALL_MODELS and (prio, ctx) != (ALL, ALL):
            continue
        records[name] = records.get(name, 0) + n
    for ((model, prio, ctx), boundary), cols in win.sketches.items():
        if (model, prio, ctx) == (ALL, ALL, ALL):
            name = ALL_MODELS
        elif model == ALL:
            continue
        else:
            name = model
        sk = QuantileSketch.from_columns(cols, relative_accuracy, delta=True)
        by_b = merged.setdefault(name, {})
        if boundary in by_b:
            by_b[boundary].merge(sk)
        else:
            by_b[boundary] = sk
    models = {
        name: ModelWindow(records.get(name, 0), {b: sk.to_columns() for b, sk in sks.items()})
        for name, sks in merged.items()
    }
    slos: dict[str, SLOWindowCounts] = {}
    if final and win.slos is not None:
        for r in win.slos.rows():
            if r.kind == "slo":
                slos[r.slo] = SLOWindowCounts(r.total, r.good, r.objective)
    return WindowSummary(win.partition, win.start_ms, win.size_ms, models, slos, final)


def _cols_json(c: SketchColumns) -> list[Any]:
    return [
        c.count, c.sum, c.min, c.max, c.zero_count,
        c.pos_keys, c.pos_counts, c.neg_keys, c.neg_counts,
    ]  # fmt: skip


def _cols_of(v: list[Any]) -> SketchColumns:
    return SketchColumns(
        int(v[0]), float(v[1]), float(v[2]), float(v[3]), int(v[4]),
        list(v[5]), list(v[6]), list(v[7]), list(v[8]),
    )  # fmt: skip


def encode_summary(s: WindowSummary | StatsSample | Progress) -> bytes:
    if isinstance(s, Progress):
        return orjson.dumps(
            {
                "v": SUMMARY_VERSION,
                "type": "progress",
                "partition": s.partition,
                "horizon_ms": s.horizon_ms,
                **({"clock_ms": s.clock_ms} if s.clock_ms is not None else {}),
            }
        )
    if isinstance(s, StatsSample):
        return orjson.dumps(
            {
                "v": SUMMARY_VERSION, "type": "stats", "host": s.host, "model": s.model,
                "ts_ms": s.ts_ms, "num_running": s.num_running, "num_waiting": s.num_waiting,
                "kv_cache_usage": s.kv_cache_usage,
                "prefix_cache_hit_rate": s.prefix_cache_hit_rate,
                "gpu_memory_used_fraction": s.gpu_memory_used_fraction,
            }
        )  # fmt: skip
    return orjson.dumps(
        {
            "v": SUMMARY_VERSION,
            "type": "window",
            "partition": s.partition,
            "start_ms": s.start_ms,
            "size_ms": s.size_ms,
            "models": {
                m: {
                    "records": mw.records,
                    "b": {b: _cols_json(c) for b, c in mw.boundaries.items()},
                }
                for m, mw in s.models.items()
            },
            "slos": {n: [c.total, c.good, c.objective] for n, c in s.slos.items()},
            **({} if s.final else {"final": False}),
            **({} if s.correction_id is None else {"correction_id": s.correction_id}),
        }
    )


SummaryType = Literal["window", "stats", "progress"]


def decode_summary(raw: bytes) -> WindowSummary | StatsSample | Progress:
    """Raises ValueError/KeyError/TypeError on a malformed summary (an internal topic)."""
    d = orjson.loads(raw)
    if d.get("v") != SUMMARY_VERSION:
        raise ValueError(f"unsupported summary version {d.get('v')!r}")
    if d["type"] == "progress":
        clock = d.get("clock_ms")
        return Progress(
            int(d["partition"]), int(d["horizon_ms"]), None if clock is None else int(clock)
        )
    if d["type"] == "stats":
        return StatsSample(
            str(d["host"]), str(d["model"]), int(d["ts_ms"]), int(d["num_running"]),
            int(d["num_waiting"]), float(d["kv_cache_usage"]), d.get("prefix_cache_hit_rate"),
            d.get("gpu_memory_used_fraction"),
        )  # fmt: skip
    if d["type"] != "window":
        raise ValueError(f"unknown summary type {d['type']!r}")
    models = {
        m: ModelWindow(int(v["records"]), {b: _cols_of(c) for b, c in v["b"].items()})
        for m, v in d["models"].items()
    }
    slos = {n: SLOWindowCounts(int(t), int(g), float(o)) for n, (t, g, o) in d["slos"].items()}
    return WindowSummary(
        int(d["partition"]), int(d["start_ms"]), int(d["size_ms"]), models, slos,
        final=bool(d.get("final", True)),
        correction_id=None if d.get("correction_id") is None else str(d["correction_id"]),
    )  # fmt: skip
