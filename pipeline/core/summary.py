"""Window summaries from closed windows: the pure step the worker and ``replay`` share.

The summary values and their wire format are :mod:`pipeline.contract.summary`'s.
"""

from __future__ import annotations

from typing import Final

from pipeline.contract.summary import ModelWindow, SLOWindowCounts, WindowSummary
from pipeline.core.sketch import QuantileSketch
from pipeline.core.windows import ALL, ClosedWindow

ALL_MODELS: Final = ALL


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
        tiers_c: dict[str, int] = {}
        if win.slos is not None:
            for r in win.slos.rows():
                if r.kind == "slo" and (r.total or r.good):
                    slos_c[r.slo] = SLOWindowCounts(
                        r.total, r.good, r.objective, r.bad_queue_ms, r.bad_ms
                    )
                elif r.kind == "blended" and r.good_secondary_only:
                    tiers_c[r.slo] = r.good_secondary_only
        cid = correction_id or f"{win.partition}/{win.start_ms}/{sorted(win.ledger)[:1]}"
        return WindowSummary(
            win.partition, win.start_ms, win.size_ms, {}, slos_c, True, cid, tiers_c
        )
    merged: dict[str, dict[str, QuantileSketch]] = {}
    records: dict[str, int] = {}
    retries: dict[str, int] = {}
    answered: dict[str, int] = {}
    for counts, into in ((win.records, records), (win.retries, retries), (win.answered, answered)):
        for (model, prio, ctx), n in counts.items():
            name = ALL_MODELS if (model, prio, ctx) == (ALL, ALL, ALL) else model
            if name == ALL_MODELS and (prio, ctx) != (ALL, ALL):
                continue
            into[name] = into.get(name, 0) + n
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
        name: ModelWindow(
            records.get(name, 0),
            {b: sk.to_columns() for b, sk in sks.items()},
            retries.get(name, 0),
            answered.get(name, 0),
        )
        for name, sks in merged.items()
    }
    slos: dict[str, SLOWindowCounts] = {}
    tiers: dict[str, int] = {}
    if final and win.slos is not None:
        for r in win.slos.rows():
            if r.kind == "slo":
                slos[r.slo] = SLOWindowCounts(
                    r.total, r.good, r.objective, r.bad_queue_ms, r.bad_ms
                )
            else:
                tiers[r.slo] = r.good_secondary_only
    return WindowSummary(win.partition, win.start_ms, win.size_ms, models, slos, final, tiers=tiers)
