"""``tailguard explain REQUEST_ID``: the store's side of :mod:`pipeline.core.explain`."""

from __future__ import annotations

from typing import Any

from pipeline.adapters.queries import control, events, requests
from pipeline.adapters.store import Store, record_from_row
from pipeline.core.explain import (
    AuditedDirective,
    Explanation,
    client_attempt_note,
    conflict_note,
    explain,
    gateway_control_note,
)
from pipeline.core.record import RequestRecord
from pipeline.core.timefmt import iso_time
from pipeline.spec.slo import SLOSpec


class NotFoundError(LookupError):
    """No stored request with that id."""


def read_record(store: Store, request_id: str) -> RequestRecord:
    """The request's record (its last attempt when the client retried with its id)."""
    row = requests.last_attempt(store, request_id)
    if row is None:
        raise NotFoundError(request_id)
    return record_from_row(row)


def read_directives(store: Store, scope: str, until_unix_ms: int) -> list[AuditedDirective]:
    """The latest directives of ``scope`` up to ``until_unix_ms`` (event time)."""
    rows = control.latest_of_scope(store, scope, until_unix_ms)
    return [
        AuditedDirective(str(s), int(q), int(lv), str(p), int(t), str(r))
        for s, q, lv, p, t, r in rows
    ]


def read_events(store: Store, request_id: str) -> list[dict[str, Any]]:
    """The raw lifecycle events kept for the request (may be gone: TTL, or not stored)."""
    rows = events.of_request(store, request_id)
    return [{"kind": k, "host": h, "ts_unix_ns": int(t)} for k, h, t in rows]


def explain_request(
    store: Store, request_id: str, spec: SLOSpec
) -> tuple[Explanation, list[dict[str, Any]]]:
    record = read_record(store, request_id)
    directives = read_directives(store, record.model, record.end_unix_ns // 1_000_000)
    return explain(record, spec, directives), read_events(store, request_id)


def _iso(unix_ms: float | None) -> str | None:
    if unix_ms is None:
        return None
    return iso_time(unix_ms / 1000)


def to_json(e: Explanation, events: list[dict[str, Any]]) -> dict[str, Any]:
    r = e.record
    c = e.control
    return {
        "request_id": r.request_id,
        "model": r.model,
        "source": r.source,
        "outcome": r.outcome,
        "priority": r.priority,
        "tenant": r.tenant,
        "ctx_bucket": r.ctx_bucket,
        "prompt_tokens": r.prompt_tokens,
        "output_tokens": r.output_tokens,
        "end": _iso(r.end_unix_ns / 1e6),
        # terminal events that conflicted (pipeline.core.join, "Conflicts"): 0 = none
        "conflicts": r.conflicts,
        "conflict_note": conflict_note(r),
        # served during a cold start of its engine (contracts may exempt it): the start
        "cold_start": None
        if r.cold_start_unix_ns is None
        else {"engine_host": r.engine_host, "started": _iso(r.cold_start_unix_ns / 1e6)},
        # what the gateway's enforcement said (issue 48); None: no control mode (off)
        "gateway_control": None
        if r.control_mode is None
        else {
            "mode": r.control_mode,
            "verdict": r.control_verdict,
            "note": gateway_control_note(r),
        },
        # which try of a logical request (issue 47): 0 = first; None = no logical id
        "client_attempt": r.client_attempt,
        "logical_request_id": r.logical_request_id,
        "client_note": client_attempt_note(r),
        "timeline": [
            {"clock": i.clock, "name": i.name, "offset_ms": i.offset_ms, "at": _iso(i.unix_ms)}
            for i in e.timeline
        ],
        "breakdown": [{"segment": s.name, "ms": s.ms, "share": s.share} for s in e.breakdown],
        "slos": [
            {
                "slo": v.slo,
                "boundary": v.boundary,
                "threshold_ms": v.threshold_ms,
                "value_ms": v.value_ms,
                "verdict": v.verdict,
                "reason": v.reason,
            }
            for v in e.verdicts
        ],
        "tiers": [{"tier": t.tier, "credit": t.credit, "reason": t.reason} for t in e.tiers],
        "control": None
        if c is None
        else {
            "scope": c.scope,
            "level": c.level,
            "phase": c.phase,
            "seq": c.seq,
            "since": _iso(c.event_time_unix_ms),
            "reason": c.reason,
        },
        "events": [dict(ev, at=_iso(ev["ts_unix_ns"] / 1e6)) for ev in events],
    }


def render(e: Explanation, events: list[dict[str, Any]]) -> Any:
    """A rich renderable."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    r = e.record
    head = Text.assemble(
        (f"request {r.request_id}", "bold"),
        f"  model {r.model}  priority {r.priority}  {r.source}  outcome {r.outcome}  "
        f"ctx {r.ctx_bucket} ({r.prompt_tokens} prompt / {r.output_tokens} output tokens)  "
        f"ended {_iso(r.end_unix_ns / 1e6)}",
    )
    tl = Table(title="timeline (each host's own clock; the two are never subtracted)")
    for col in ("clock", "instant", "offset ms", "wall clock (that host)"):
        tl.add_column(col, justify="right" if col == "offset ms" else "left")
    for i in e.timeline:
        tl.add_row(i.clock, i.name, f"{i.offset_ms:.1f}", _iso(i.unix_ms) or "-")
    bd = Table(title="breakdown")
    for col in ("segment", "ms", "share"):
        bd.add_column(col, justify="left" if col == "segment" else "right")
    for s in e.breakdown:
        share = "-" if s.share is None else f"{100 * s.share:.0f}%"
        bd.add_row(s.name, f"{s.ms:.1f}", share)
    sl = Table(title="SLOs")
    for col in ("slo", "boundary", "value ms", "threshold ms", "verdict", "why"):
        sl.add_column(col, justify="right" if "ms" in col else "left")
    style = {"good": "green", "bad": "bold red", "skip": "dim"}
    for v in e.verdicts:
        sl.add_row(
            v.slo,
            v.boundary,
            "-" if v.value_ms is None else f"{v.value_ms:.1f}",
            f"{v.threshold_ms:g}",
            Text(v.verdict.upper() if v.verdict == "bad" else v.verdict, style=style[v.verdict]),
            v.reason,
        )
    for t in e.tiers:
        credit = "-" if t.credit is None else f"{t.credit:g}"
        sl.add_row(f"tier {t.tier}", f"{t.primary} / {t.secondary}", "", "", credit, t.reason)
    c = e.control
    ctl = Text(
        f"control for {r.model} when it ended: level 0 (no directive issued before it)"
        if c is None
        else f"control for {c.scope} when it ended: L{c.level} {c.phase} "
        f"(since {_iso(c.event_time_unix_ms)}, seq {c.seq}): {c.reason}"
    )
    parts: list[Any] = [head, tl, bd, sl, ctl]
    gateway = gateway_control_note(r)
    if gateway is not None:
        refused = "bold yellow" if r.control_verdict is not None else ""
        parts.append(Text(f"gateway control: {gateway}", style=refused))
    client = client_attempt_note(r)
    if client is not None:
        parts.append(Text(client))
    note = conflict_note(r)
    if note is not None:
        parts.append(Text(note, style="bold yellow"))
    if r.cold_start_unix_ns is not None:
        parts.append(
            Text(
                f"served during a cold start of {r.engine_host} (started "
                f"{_iso(r.cold_start_unix_ns / 1e6)}, its clock): a contract may exempt it"
            )
        )
    if events:
        ev = Table(title="raw lifecycle events")
        for col in ("kind", "host", "wall clock (that host)"):
            ev.add_column(col)
        for x in events:
            ev.add_row(x["kind"], x["host"], _iso(x["ts_unix_ns"] / 1e6) or "-")
        parts.append(ev)
    return Group(*parts)
