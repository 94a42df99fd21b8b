"""Window summaries: what every worker tells the one controller (topic ``tailguard.summaries``).

Each worker owns some partitions, so no worker sees a model's whole traffic. When a
(partition, window) closes, the worker publishes a compact summary of it -- per model
and boundary the sketch, per SLO the counts -- and forwards the engine.stats samples it
consumes, all on one single-partition topic. Exactly one worker of the group owns that
partition and runs the controller over the merged picture. The same values flow in
``replay``, without Kafka. (:func:`pipeline.core.summary.summarize` builds a
:class:`WindowSummary` from a closed window.)

Wire format (summary v2)
------------------------
One JSON object per message, ``"v": 2`` and a ``"type"``:

* ``window``: ``partition``, ``start_ms``, ``size_ms``;
  ``models``: ``{model: {"records": n, "boundaries": {boundary: sketch}}}`` (``"*"`` =
  all traffic), plus ``"retries"``: of those records, the clients' retries
  (``client_attempt > 0``), and ``"answered"``: of those records, the ones with
  outcome ok (each omitted when 0, read as 0 when absent; a reader before ``answered``
  ignores it), a sketch being an object with the fields of
  :class:`~pipeline.contract.sketch.SketchColumns`;
  ``slos``: ``{slo: {"total": n, "good": n, "objective": x}}``, plus ``"bad_queue_ms"``
  and ``"bad_ms"`` when the window has bad requests that reached an engine (the bad
  requests' queue time and their time at the SLO's boundary, summed: how much of the
  burn was queueing; omitted when 0, read as 0 when absent);
  ``tiers``: ``{tier: {"good_secondary_only": n}}`` per blended tier of the spec, the
  requests bad for its primary and good for its secondary (the tier's total and primary
  good are its primary's ``slos`` counts; omitted when empty, read as empty when absent: a
  reader before ``tiers`` ignores it);
  ``final`` (omitted when true), ``correction_id`` (omitted when none);
* ``stats``: the fields of :class:`StatsSample`;
* ``progress``: ``partition``, ``horizon_ms``, ``clock_ms`` (omitted when none).

v1, written by earlier releases and possibly still on the topic, differs only in a
window's sketches and SLO counts, which were positional arrays (``"b": {boundary:
[count, sum, min, max, zero_count, pos_keys, pos_counts, neg_keys, neg_counts]}``,
``slos: {slo: [total, good, objective]}``); :func:`decode_summary` reads both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import orjson

from pipeline.contract.sketch import (
    SketchColumns,
    sketch_of_positional,
    sketch_of_record,
    sketch_record,
)
from pipeline.contract.wire import AnyStats

SUMMARY_VERSION: Final = 2
READABLE_VERSIONS: Final = frozenset({1, SUMMARY_VERSION})

SummaryType = Literal["window", "stats", "progress"]


@dataclass(frozen=True, slots=True)
class ModelWindow:
    records: int
    boundaries: dict[str, SketchColumns]
    retries: int = 0  # of ``records``, the clients' retries (client_attempt > 0)
    # of ``records``, those answered (outcome ok): what was served, counted where the
    # gateway (or, without one, the engine) saw it end -- known without engine events
    answered: int = 0


@dataclass(frozen=True, slots=True)
class SLOWindowCounts:
    total: int
    good: int
    objective: float
    # Bad requests that reached an engine: their queue time and their time at the SLO's
    # boundary, summed (0 for a boundary that excludes the queue). A control signal (is
    # the burn load-caused?), not a stored count.
    bad_queue_ms: float = 0.0
    bad_ms: float = 0.0


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
    # per blended tier, good_secondary_only (what its primary's counts lack); final only
    tiers: dict[str, int] = field(default_factory=dict)


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


Summary = WindowSummary | StatsSample | Progress


def encode_summary(s: Summary) -> bytes:
    """One message value, summary v2."""
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
                    **({"retries": mw.retries} if mw.retries else {}),
                    **({"answered": mw.answered} if mw.answered else {}),
                    "boundaries": {b: sketch_record(c) for b, c in mw.boundaries.items()},
                }
                for m, mw in s.models.items()
            },
            "slos": {n: _slo_record(c) for n, c in s.slos.items()},
            **(
                {"tiers": {n: {"good_secondary_only": g} for n, g in s.tiers.items()}}
                if s.tiers
                else {}
            ),
            **({} if s.final else {"final": False}),
            **({} if s.correction_id is None else {"correction_id": s.correction_id}),
        }
    )


def decode_summary(raw: bytes) -> Summary:
    """v2 or v1 bytes -> a summary. Raises ValueError/KeyError/TypeError on a malformed
    one (an internal topic: the caller counts and skips it)."""
    d = orjson.loads(raw)
    if not isinstance(d, dict):
        raise TypeError("a summary is a JSON object")
    v = d.get("v")
    if isinstance(v, bool) or v not in READABLE_VERSIONS:
        raise ValueError(f"unsupported summary version {v!r}")
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
    models = {m: _model_window(mw, v) for m, mw in d["models"].items()}
    slos = {n: _slo_counts(c, v) for n, c in d["slos"].items()}
    return WindowSummary(
        int(d["partition"]), int(d["start_ms"]), int(d["size_ms"]), models, slos,
        final=bool(d.get("final", True)),
        correction_id=None if d.get("correction_id") is None else str(d["correction_id"]),
        tiers={n: int(t["good_secondary_only"]) for n, t in d.get("tiers", {}).items()},
    )  # fmt: skip


def _model_window(mw: Mapping[str, Any], v: int) -> ModelWindow:
    if v == 1:
        sketches = {b: sketch_of_positional(c) for b, c in mw["b"].items()}
    else:
        sketches = {b: sketch_of_record(c) for b, c in mw["boundaries"].items()}
    return ModelWindow(
        int(mw["records"]), sketches, int(mw.get("retries", 0)), int(mw.get("answered", 0))
    )


def _slo_record(c: SLOWindowCounts) -> dict[str, Any]:
    out: dict[str, Any] = {"total": c.total, "good": c.good, "objective": c.objective}
    if c.bad_queue_ms or c.bad_ms:
        out["bad_queue_ms"] = c.bad_queue_ms
        out["bad_ms"] = c.bad_ms
    return out


def _slo_counts(c: Any, v: int) -> SLOWindowCounts:
    if v == 1:
        total, good, objective = c
        return SLOWindowCounts(int(total), int(good), float(objective))
    return SLOWindowCounts(
        int(c["total"]), int(c["good"]), float(c["objective"]),
        float(c.get("bad_queue_ms", 0.0)), float(c.get("bad_ms", 0.0)),
    )  # fmt: skip
