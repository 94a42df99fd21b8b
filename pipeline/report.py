"""The SLO report read back from ClickHouse (the demo prints it).

Quantiles here are exact (``quantilesExact``: the element at index
``floor(p * n)`` of the sorted values), so that they can be checked against an
exact computation over the events; the streaming sketches come with the
measurement core.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipeline.adapters.store import Store
from pipeline.core.record import BOUNDARIES

QUANTILES = (0.5, 0.99)


@dataclass(frozen=True, slots=True)
class BoundaryStats:
    count: int
    p50: float | None
    p99: float | None


@dataclass(frozen=True, slots=True)
class Report:
    requests: int
    by_source: dict[str, int]
    by_outcome: dict[str, int]
    boundaries: dict[str, BoundaryStats]
    slos: dict[str, dict[str, Any]]  # from the stream's windows (slo_1h)
    control: list[dict[str, Any]]  # directives issued (not heartbeats), from control_signals
    # per gateway -> engine host pair: joined requests and the engine clock's offset from
    # the gateway's (NTP-style estimate, pipeline/core/skew.py), P50 in ms
    clock_skew: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "by_source": self.by_source,
            "by_outcome": self.by_outcome,
            "boundaries": {
                k: {"count": v.count, "p50": v.p50, "p99": v.p99}
                for k, v in self.boundaries.items()
            },
            "slos": self.slos,
            "control": self.control,
            "clock_skew": self.clock_skew,
        }


def exact_quantile(sorted_values: list[float], q: float) -> float:
    """ClickHouse ``quantileExact`` semantics: element ``floor(q * n)`` (clamped)."""
    n = len(sorted_values)
    return sorted_values[min(int(q * n), n - 1)]


def read_report(store: Store) -> Report:
    db = store.database
    parts = []
    for b in BOUNDARIES:
        parts.append(f"count({b})")
        parts.append(f"quantilesExact({', '.join(map(str, QUANTILES))})({b})")
    row = store.query_rows(f"SELECT count(), {', '.join(parts)} FROM {db}.requests FINAL")[0]
    boundaries = {}
    for i, b in enumerate(BOUNDARIES):
        n = int(row[1 + 2 * i])
        qs = row[2 + 2 * i]
        boundaries[b] = BoundaryStats(n, float(qs[0]) if n else None, float(qs[1]) if n else None)
    by_source = dict(
        store.query_rows(
            f"SELECT source, count() FROM {db}.requests FINAL GROUP BY source ORDER BY source"
        )
    )
    by_outcome = dict(
        store.query_rows(
            f"SELECT outcome, count() FROM {db}.requests FINAL GROUP BY outcome ORDER BY outcome"
        )
    )
    slos: dict[str, dict[str, Any]] = {}
    for name, kind, objective, weight, total, good, secondary in store.query_rows(
        "SELECT slo, kind, any(objective), any(secondary_weight), sum(total), sum(good), "
        f"sum(good_secondary_only) FROM {db}.slo_1h GROUP BY slo, kind ORDER BY kind DESC, slo"
    ):
        good_w = good + weight * secondary if kind == "blended" else good
        compliance = good_w / total if total else None
        slos[name] = {
            "kind": kind,
            "objective": objective,
            "total": int(total),
            "good": int(good),
            "compliance": compliance,
            "met": None if compliance is None else compliance >= objective,
        }
    control = [
        {"scope": scope, "seq": int(seq), "level": int(level), "phase": phase,
         "event_time": str(t), "reason": reason}
        for scope, seq, level, phase, t, reason in store.query_rows(
            "SELECT scope, seq, level, phase, event_time, reason "
            f"FROM {db}.control_signals FINAL WHERE NOT heartbeat ORDER BY event_time, scope, seq"
        )
    ]  # fmt: skip
    # The skew estimate of pipeline.core.skew over the stored joined requests (reported,
    # never used to correct a measurement).
    clock_skew = {
        f"{g}->{e}": {"samples": int(n), "offset_p50_ms": float(p50)}
        for g, e, n, p50 in store.query_rows(
            "SELECT gateway_host, engine_host, count(), quantileExact(0.5)("
            "(engine_arrival_unix_ns - gateway_received_unix_ns) / 1e6 - gateway_overhead_ms / 2) "
            f"FROM {db}.requests FINAL WHERE source = 'joined' "
            "AND gateway_received_unix_ns IS NOT NULL AND engine_arrival_unix_ns IS NOT NULL "
            "AND gateway_overhead_ms IS NOT NULL "
            "GROUP BY gateway_host, engine_host ORDER BY gateway_host, engine_host"
        )
    }
    return Report(int(row[0]), by_source, by_outcome, boundaries, slos, control, clock_skew)


def render(report: Report) -> Any:
    """A rich renderable."""
    from rich.console import Group
    from rich.table import Table

    t = Table(title=f"tailguard SLO report — {report.requests} requests")
    t.add_column("boundary")
    t.add_column("count", justify="right")
    t.add_column("P50 ms", justify="right")
    t.add_column("P99 ms", justify="right")
    for name, b in report.boundaries.items():
        t.add_row(
            name,
            str(b.count),
            "-" if b.p50 is None else f"{b.p50:.1f}",
            "-" if b.p99 is None else f"{b.p99:.1f}",
        )
    s = Table(title="records")
    s.add_column("by source")
    s.add_column("n", justify="right")
    for k, v in report.by_source.items():
        s.add_row(k, str(v))
    o = Table(title="outcomes")
    o.add_column("outcome")
    o.add_column("n", justify="right")
    for k, v in report.by_outcome.items():
        o.add_row(k, str(v))
    c = Table(title="SLO compliance (stream windows)")
    for col in ("slo", "objective", "total", "good", "compliance", "met"):
        c.add_column(col, justify="left" if col == "slo" else "right")
    for name, slo in report.slos.items():
        comp = "-" if slo["compliance"] is None else f"{slo['compliance']:.4f}"
        met = "-" if slo["met"] is None else ("yes" if slo["met"] else "NO")
        c.add_row(name, f"{slo['objective']:g}", str(slo["total"]), str(slo["good"]), comp, met)
    ctl = Table(title="control directives (event time)")
    for col in ("event time", "scope", "level", "phase", "reason"):
        ctl.add_column(col)
    for d in report.control:
        ctl.add_row(d["event_time"], d["scope"], f"L{d['level']}", d["phase"], d["reason"])
    skew = Table(title="clock skew, engine vs gateway (reported, never corrected)")
    for col in ("gateway -> engine", "joined", "offset P50 ms"):
        skew.add_column(col, justify="left" if col.startswith("gateway") else "right")
    for pair, est in report.clock_skew.items():
        skew.add_row(pair, str(est["samples"]), f"{est['offset_p50_ms']:+.1f}")
    return Group(t, c, ctl, s, o, skew)
