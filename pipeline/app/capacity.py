"""``tailguard capacity``: the store's side of :mod:`pipeline.core.capacity`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Unpack

from pipeline.adapters.queries import requests
from pipeline.adapters.store import Store
from pipeline.core.capacity import FitOptions, ModelCapacity, Sample, fit


def read_samples(store: Store, boundary: str, model: str | None = None) -> list[Sample]:
    """Finished requests the engine measured (joined or engine-only)."""
    rows = requests.engine_samples(store, boundary, model)
    return [
        Sample(str(m), str(h), float(a), float(e), float(c), float(v)) for m, h, a, e, c, v in rows
    ]


def capacity(
    store: Store,
    *,
    target_p99_ms: float,
    boundary: str,
    model: str | None = None,
    **options: Unpack[FitOptions],
) -> list[ModelCapacity]:
    return fit(read_samples(store, boundary, model), target_p99_ms, **options)


def to_json(models: Sequence[ModelCapacity], boundary: str) -> dict[str, Any]:
    return {
        "boundary": boundary,
        "models": [
            {
                "model": m.model,
                "instances_observed": m.instances_observed,
                "target_p99_ms": m.target_p99_ms,
                "utilisation": m.utilisation,
                "peak_qps": m.peak_qps,
                "chosen_concurrency": None if m.chosen is None else m.chosen.concurrency,
                "per_instance_rps": m.per_instance_rps,
                "instances_needed": [
                    {"qps": q, "instances": n} for q, n in m.instances_needed.items()
                ],
                "levels": [
                    {
                        "concurrency": lv.concurrency,
                        "mean_concurrency": lv.mean_concurrency,
                        "buckets": lv.buckets,
                        "requests": lv.requests,
                        "p99_ms": lv.p99_ms,
                        "p99_ci95_ms": [lv.p99_ci_low_ms, lv.p99_ci_high_ms],
                        "thin": lv.thin,
                        "p99_compute_ms": lv.p99_compute_ms,
                        "mean_compute_ms": lv.mean_compute_ms,
                        "throughput_rps": lv.throughput_rps,
                        "littles_law_rps": lv.littles_law_rps,
                        "holds_target": lv.holds_target,
                    }
                    for lv in m.levels
                ],
            }
            for m in models
        ],
    }


def _ci(low: float | None, high: float | None) -> str:
    lo = "…" if low is None else f"{low:.0f}"
    hi = "…" if high is None else f"{high:.0f}"
    return f"{lo}-{hi} ms"


def render(models: Sequence[ModelCapacity], boundary: str) -> Any:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    parts: list[Any] = []
    if not models:
        parts.append(Text("no engine-measured requests in the store"))
    for m in models:
        t = Table(
            title=f"{m.model}: {m.instances_observed} instances observed, "
            f"target P99 {boundary} <= {m.target_p99_ms:g} ms"
        )
        for col in (
            "concurrency", "mean", "requests", f"P99 {boundary}", "P99 95% CI", "P99 compute",
            "mean compute", "req/s per instance", "Little's law req/s", "holds",
        ):  # fmt: skip
            t.add_column(col, justify="right", overflow="fold")
        for lv in m.levels:
            chosen = m.chosen is not None and lv.concurrency == m.chosen.concurrency
            t.add_row(
                str(lv.concurrency),
                f"{lv.mean_concurrency:.1f}",
                str(lv.requests),
                f"{lv.p99_ms:.0f} ms",
                _ci(lv.p99_ci_low_ms, lv.p99_ci_high_ms),
                f"{lv.p99_compute_ms:.0f} ms",
                f"{lv.mean_compute_ms:.0f} ms",
                f"{lv.throughput_rps:.2f}",
                f"{lv.littles_law_rps:.2f}",
                ("yes" if lv.holds_target else "no")
                + (" (thin)" if lv.thin else "")
                + (" <- chosen" if chosen else ""),
                style="bold" if chosen else ("dim" if lv.thin else None),
            )
        parts.append(t)
        if any(lv.thin for lv in m.levels):
            parts.append(
                Text(
                    "thin: fewer requests than --min-requests; never chosen. A P99 needs "
                    "about 370 requests before its 95% CI has an upper bound (open: '…').",
                    style="dim",
                )
            )
        if m.chosen is None:
            parts.append(
                Text(
                    f"no concurrency level with at least the minimum requests holds "
                    f"P99 <= {m.target_p99_ms:g} ms: no sizing",
                    style="bold red",
                )
            )
            continue
        if m.chosen.p99_ci_high_ms is None:
            parts.append(
                Text(
                    f"caution: the chosen level's P99 rests on {m.chosen.requests} requests; "
                    "its 95% CI has no upper bound (measure longer for a firmer sizing)",
                    style="yellow",
                )
            )
        lines = [
            f"per instance: {m.chosen.throughput_rps:.2f} req/s at concurrency "
            f"{m.chosen.concurrency} (P99 {m.chosen.p99_ms:.0f} ms); observed peak "
            f"{m.peak_qps:.2f} req/s"
        ]
        for q, n in m.instances_needed.items():
            lines.append(
                f"{q:g} req/s at <= {100 * m.utilisation:.0f}% utilisation: {n} instances "
                f"(= ceil({q:g} / ({m.chosen.throughput_rps:.2f} x {m.utilisation:g})))"
            )
        parts.append(Text("\n".join(lines)))
    return Group(*parts)
