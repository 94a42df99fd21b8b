"""``tailguard statement``: a tenant's contract statement read from the store.

The store's side of :mod:`pipeline.core.statement`: reads the tenant's ``requests``
rows of the period (one row per request attempt, its last version, as columns:
:mod:`pipeline.adapters.queries.statement_rows`), the
control audit (``control_signals``) and the budget events, names what it read
(row counts, digests, event-time range, the contract's and spec's digests) and
renders the statement as text, JSON or a self-contained HTML page. The contract and
the SLO spec are recorded by digest and content; ``verify`` recomputes a statement
from the store with those recorded ones, lists what differs, and says whether files
an operator names are the recorded ones.
"""

from __future__ import annotations

import datetime as dt
import html
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import orjson

from pipeline.adapters.queries import budget as budget_queries
from pipeline.adapters.queries import control as control_queries
from pipeline.adapters.queries import statement_engine, statement_rows
from pipeline.adapters.store import Store
from pipeline.core.statement import (
    STATEMENT_VERSION,
    BudgetEventRow,
    LevelChange,
    Statement,
    StatementRows,
    StatementSource,
    compute_statement,
    records_digest,
    rows_digest,
)
from pipeline.core.timefmt import iso_time
from pipeline.spec.contract import LoadedContract, digest, load_recorded, period_bounds_ns

_NOT_COMPARED = frozenset({"generated_at"})
log = logging.getLogger("tailguard.statement")


def _iso_ns(ns: int | None) -> str | None:
    if ns is None:
        return None
    return iso_time(ns / 1e9)


def build_statement(
    store: Store,
    loaded: LoadedContract,
    tenant: str,
    period: str,
    *,
    version: int = STATEMENT_VERSION,
) -> Statement:
    """The statement of ``tenant`` for ``period`` (``YYYY-MM``) from the store, as
    statement ``version`` makes it (``--verify`` recomputes an older one as it was made:
    version 2 digests every field of the records)."""
    contract = loaded.contract
    p_start, p_end = period_bounds_ns(period, contract.billing.timezone)
    rows: StatementRows | list[Any]
    if version >= 4:
        for attempt in range(1, ENGINE_READS + 1):
            engine = statement_engine.EngineSource(
                store, contract, loaded.spec, tenant=tenant, from_unix_ns=p_start,
                until_unix_ns=p_end,
            )  # fmt: skip
            read = {"requests_rows": engine.requests, "requests_digest": engine.digest}
            span = (engine.first_end_ns, engine.last_end_ns)
            try:
                statement = _compute(
                    store, loaded, tenant=tenant, period=period, version=version,
                    rows=engine, span=span, read=read,
                )  # fmt: skip
                engine.check_unchanged()
            except statement_engine.StoreChangedError as exc:
                if attempt == ENGINE_READS:
                    raise
                log.warning("statement: read again (%s)", exc)
            else:
                return statement
    if version == 3:
        rows = statement_rows.read_rows(store, tenant, p_start, p_end)
        span = _first_last(rows.ints("end_unix_ns"))
        read = {"requests_rows": len(rows), "requests_digest": rows.digest()}
    else:
        rows = statement_rows.read_records(store, tenant, p_start, p_end)
        span = _first_last(np.asarray([r.end_unix_ns for r in rows], dtype=np.int64))
        read = {"requests_rows": len(rows), "requests_digest": records_digest(rows)}
    return _compute(
        store, loaded, tenant=tenant, period=period, version=version, rows=rows, span=span,
        read=read,
    )  # fmt: skip


# Version 4 reads its tenant's period in several reads; a store written between them
# (a live one) is read again, at most this many times in all.
ENGINE_READS: Final = 3


def _compute(
    store: Store,
    loaded: LoadedContract,
    *,
    tenant: str,
    period: str,
    version: int,
    rows: StatementRows | list[Any] | StatementSource,
    span: tuple[int | None, int | None],
    read: dict[str, Any],
) -> Statement:
    """The statement of what was read (``rows``; the ends' ``span`` and ``read``, what
    names it) with the store's audit and budget events of the period."""
    contract = loaded.contract
    p_start, p_end = period_bounds_ns(period, contract.billing.timezone)
    first, last = span
    until_ns = statement_rows.last_end(store, p_start, p_end)
    a_ms, b_ms = p_start // 1_000_000, p_end // 1_000_000
    control = control_queries.levels_before(store, b_ms)
    events = budget_queries.events_between(store, a_ms, b_ms)
    level_changes = [LevelChange(str(s), int(t), int(q), int(lv)) for s, t, q, lv in control]
    budget = [BudgetEventRow(str(s), str(e), int(t)) for s, e, t in events]
    in_period = [c.at_ms for c in level_changes if c.at_ms >= a_ms]
    if in_period:
        last_ns = max(in_period) * 1_000_000
        until_ns = last_ns if until_ns is None else max(until_ns, last_ns)
    inputs = {
        "store_database": store.database,
        **read,
        "event_time_range": {
            "from_unix_ns": first,
            "to_unix_ns": last,
            "from": _iso_ns(first),
            "to": _iso_ns(last),
        },
        "observed_until_unix_ns": until_ns,
        "control_rows": len(control),
        "control_digest": rows_digest(control),
        "budget_event_rows": len(events),
        "budget_events_digest": rows_digest(events),
        # by digest and content: --verify recomputes with these, whatever the files say now
        "contract": {
            "file": str(loaded.path),
            "digest": loaded.contract_digest,
            "content": loaded.contract_text,
        },
        "slo_spec": {
            "file": str(loaded.spec_path),
            "digest": loaded.spec_digest,
            "content": loaded.spec_text,
        },
    }
    return compute_statement(
        tenant=tenant,
        period=period,
        contract=contract,
        spec=loaded.spec,
        records=rows,
        level_changes=level_changes,
        budget_events=budget,
        observed_until_ns=until_ns,
        inputs=inputs,
        version=version,
    )


def _first_last(ends: Any) -> tuple[int | None, int | None]:
    return (int(ends.min()), int(ends.max())) if len(ends) else (None, None)


def _normal(doc: Any) -> Any:
    """As it reads back from JSON (tuples are lists, keys strings)."""
    return orjson.loads(orjson.dumps(doc))


def _diff(a: Any, b: Any, path: str, out: list[str], limit: int = 20) -> None:
    if len(out) >= limit:
        return
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k in _NOT_COMPARED and not path:
                continue
            sub = f"{path}.{k}" if path else k
            if k not in a or k not in b:
                out.append(f"{sub}: only in the {'file' if k in a else 'recomputation'}")
            else:
                _diff(a[k], b[k], sub, out, limit)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            out.append(f"{path}: {len(a)} entries in the file, {len(b)} recomputed")
            return
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _diff(x, y, f"{path}[{i}]", out, limit)
    elif a != b:
        out.append(f"{path}: file {a!r}, recomputed {b!r}")


@dataclass(frozen=True, slots=True)
class Verification:
    """What ``verify`` found: ``problems`` (the statement does not match the store under
    the contract and SLO spec it records) and ``files_differ`` (a contract or SLO spec
    file given to compare with is not the one the statement records)."""

    problems: list[str]
    files_differ: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems and not self.files_differ


def recorded_contract(doc: dict[str, Any]) -> tuple[LoadedContract, list[str]]:
    """The contract and SLO spec a statement records (by digest and content), and what
    is wrong with them (a content that is not its digest: the statement was edited)."""
    named = doc["inputs"]
    problems = []
    texts = {}
    for key in ("contract", "slo_spec"):
        entry = named.get(key)
        if not isinstance(entry, dict) or not isinstance(entry.get("content"), str):
            raise TypeError(
                f"inputs.{key} records no content (a statement made before version 2: "
                "verify it with the tailguard that made it)"
            )
        texts[key] = entry["content"]
        if digest(entry["content"].encode("utf-8")) != entry.get("digest"):
            problems.append(
                f"inputs.{key}: the recorded content is not the recorded digest "
                f"{entry.get('digest')} (the statement was edited)"
            )
    loaded = load_recorded(
        texts["contract"],
        texts["slo_spec"],
        contract_file=str(named["contract"].get("file", "<recorded contract>")),
        spec_file=str(named["slo_spec"].get("file", "<recorded SLO spec>")),
    )
    return loaded, problems


def verify(
    store: Store,
    doc: dict[str, Any],
    *,
    given: Sequence[tuple[str, str, str]] = (),
) -> Verification:
    """Recompute a statement from the store with the contract and SLO spec it records and
    list what differs. ``given``: files an operator named to compare with, as ``(what,
    path, digest)`` with what ``contract`` or ``slo_spec``; each that is not the one the
    statement records (by digest) is in ``files_differ``."""
    if not (
        isinstance(doc.get("tenant"), str)
        and isinstance(doc.get("period"), str)
        and isinstance(doc.get("inputs"), dict)
    ):
        raise TypeError("no tenant, period or inputs")
    recorded, problems = recorded_contract(doc)
    differ: list[str] = []
    want = {"contract": recorded.contract_digest, "slo_spec": recorded.spec_digest}
    for what, path, got in given:
        if got != want[what]:
            differ.append(
                f"{what}: {path} is {got}, not the {what} the statement was made with "
                f"({want[what]}); the statement is checked with the recorded one"
            )
    made = doc.get("statement_version")
    if not isinstance(made, int) or not 2 <= made <= STATEMENT_VERSION:
        raise TypeError(
            f"statement_version {made!r}: this tailguard verifies 2 to {STATEMENT_VERSION}"
        )
    again = build_statement(store, recorded, str(doc["tenant"]), str(doc["period"]), version=made)
    mine, theirs = _normal(doc), _normal(again.to_json())
    # file names may differ between the two sides; the digests and contents decide
    for side in (mine, theirs):
        for key in ("contract", "slo_spec"):
            side.get("inputs", {}).get(key, {}).pop("file", None)
    out: list[str] = []
    _diff(mine, theirs, "", out)
    return Verification(problems + out, differ)


# --------------------------------------------------------------------------- #
# Rendering
# --------------------------------------------------------------------------- #


def _pct(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{100 * x:.{digits}f} %"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:,.1f} ms"


def _dur(ms: int) -> str:
    s = ms // 1000
    return f"{s // 3600}h{s % 3600 // 60:02d}m{s % 60:02d}s"


def render_text(st: Statement) -> str:
    sections = (_slo_lines, _breach_lines, _control_lines, _incident_lines, _input_lines)
    return "\n".join(line for section in sections for line in section(st))


def _met_text(met: bool | None) -> str:
    return "-" if met is None else ("yes" if met else "NO")


def _slo_lines(st: Statement) -> list[str]:
    """The title, the counts and the SLO table (tiers after the SLOs)."""
    lines = [
        f"Statement  tenant {st.tenant}  period {st.period} ({st.timezone}: "
        f"{st.period_start} .. {st.period_end})",
        f"requests {st.requests:,}  counted {st.counted:,}  "
        f"exempted {len(st.exempted):,}"
        + "".join(f", {k} {v:,}" for k, v in st.exempted_by_reason.items()),
        "",
        "SLOs                 boundary           target      total       good   compliance"
        "   objective  met   P99 (period)",
    ]
    for name, s in st.slos.items():
        p = st.percentiles[name].period
        met = _met_text(s.met)
        lines.append(
            f"  {name:<18} {s.boundary:<18} {s.threshold_ms:>6.0f} ms {s.total:>10,} "
            f"{s.good:>10,} {_pct(s.compliance):>12} {_pct(s.objective, 1):>11}  "
            f"{met:<4} {_ms(p)}"
        )
    for name, t in st.tiers.items():
        met = _met_text(t.met)
        lines.append(
            f"  {name:<18} {t.primary} + {t.secondary_weight:g} x {t.secondary} only"
            f"{'':>3}{t.total:>10,} {_pct(t.compliance):>23} "
            f"{_pct(t.objective, 1):>11}  {met}"
        )
    return lines


def _breach_lines(st: Statement) -> list[str]:
    """The breach rule's verdict, then each breach."""
    rule = st.breach_rule
    verdict = "within the contract" if rule.within else "BREACHED"
    return [
        "",
        f"Breaches (daily P{rule.percentile:g} above target; severe above "
        f"{rule.severe_above:g} x): {rule.breaches} of at most {rule.max_breaches}, "
        f"{rule.severe} severe -> {verdict}",
    ] + [
        f"  {b.day}  {b.slo:<18} P{rule.percentile:g} {_ms(b.p_ms)} vs "
        f"{b.target_ms:.0f} ms ({b.ratio:.2f} x){'  SEVERE' if b.severe else ''}"
        for b in st.breaches
    ]


def _control_lines(st: Statement) -> list[str]:
    """Time at each control level, the levels' timeline, billing pauses, the credit and
    the cold starts."""
    lv = st.levels
    cr = st.credit
    lines = [
        "",
        f"Control levels while this tenant had traffic in the scope (observed until "
        f"{lv.observed_until}): "
        + ", ".join(f"L{k} {_dur(v)}" for k, v in lv.ms_at_level.items() if k != 0)
        + "  (the service's: "
        + ", ".join(f"L{k} {_dur(v)}" for k, v in lv.ms_at_level_service.items() if k != 0)
        + ")",
    ]
    for t in lv.timeline:
        note = "customer notified" if t.notify_customer else "not notified"
        lines.append(f"  L{t.level} {t.from_} .. {t.to}  {', '.join(t.scopes)}  ({note})")
    lines += [f"  billing paused {p.from_} .. {p.to}" for p in st.billing_pauses]
    lines += [
        f"Credit: {st.credit_percent:.6f} % of the period's fee  "
        f"(paused {_dur(cr.paused_ms)}; "
        + ", ".join(f"L{c.level} {c.fee_change_percent:g} % x {_dur(c.ms)}" for c in cr.levels)
        + f"; period {_dur(cr.period_ms)})",
        f"  formula: credit_percent = {cr.formula}",
        "",
        f"Cold starts: {len(st.cold_starts)}",
    ]
    for c in st.cold_starts:
        lines.append(
            f"  {c.started} {c.engine_host}: {c.requests} requests, "
            + (
                f"exempted ({c.nth_of_day} of the day)"
                if c.exempted
                else f"NOT exempted ({c.nth_of_day} of the day: over the cap)"
            )
        )
    return lines


def _incident_lines(st: Statement) -> list[str]:
    """Budget exhaustions: those not this tenant's, then each of its incidents with its
    worst requests."""
    lines = [f"Incidents (budget exhausted): {len(st.incidents)}"]
    others = st.budget_exhausted_not_this_tenant
    if others:
        named = ", ".join(str(o.slo) + " " + str(o.at) for o in others[:5])
        lines.append(
            f"  not this tenant's (no bad request of it before them): {len(others)} "
            f"({named}{', ...' if len(others) > 5 else ''})"
        )
    for i in st.incidents:
        lines.append(
            f"  {i.at}  {i.slo} ({i.boundary}): {i.bad_requests} bad requests of this "
            f"tenant before it; queue {_pct(i.queue_share, 1)}, compute "
            f"{_pct(i.compute_share, 1)}"
        )
        lines += [
            f"    {w.request_id:<22} {_ms(w.value_ms):>14}  queue {_ms(w.queue_ms)}  -> {w.explain}"
            for w in i.worst
        ]
    return lines


def _input_lines(st: Statement) -> list[str]:
    """What the statement was computed from, and how to check it."""
    inp = st.inputs
    rng = inp["event_time_range"]
    return [
        "",
        f"Inputs: {inp['requests_rows']:,} request rows {inp['requests_digest'][:19]}..., "
        f"event time {rng['from']} .. {rng['to']}; {inp['control_rows']} control rows, "
        f"{inp['budget_event_rows']} budget events",
        f"  contract {inp['contract']['digest'][:19]}...  spec {inp['slo_spec']['digest'][:19]}...",
        "  check it: tailguard statement --verify STATEMENT.json",
    ]


_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1040px}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:22px 0 6px}
table{border-collapse:collapse;margin:4px 0} td,th{padding:3px 10px;border-bottom:1px solid #ddd;
text-align:right} th{background:#f3f3f3} td:first-child,th:first-child{text-align:left}
.bad{color:#b00020;font-weight:600} .ok{color:#1b7f3b;font-weight:600} .muted{color:#777}
code{font-size:12px}
"""
_LEVEL_COLOURS = {1: "#f5c542", 2: "#f08a24", 3: "#d62728"}


def _e(x: object) -> str:
    return html.escape(str(x))


def _timeline_svg(st: Statement, lo_ms: int, hi_ms: int, label: str) -> str:
    """[lo_ms, hi_ms] as a bar: level intervals coloured, billing pauses dark below."""
    w, h = 1000, 34
    span = max(1, hi_ms - lo_ms)

    def x(ms: int) -> float:
        return (min(max(ms, lo_ms), hi_ms) - lo_ms) / span * w

    parts = [f'<rect x="0" y="6" width="{w}" height="18" fill="#e8f3ea"/>']
    for t in st.levels.timeline:
        width = max(1.0, x(t.to_ms) - x(t.from_ms))
        parts.append(
            f'<rect class="mark" x="{x(t.from_ms):.2f}" y="6" width="{width:.2f}" '
            f'height="18" fill="{_LEVEL_COLOURS[t.level]}"><title>L{t.level} '
            f"{_e(t.from_)} .. {_e(t.to)}</title></rect>"
        )
    for p in st.billing_pauses:
        width = max(1.0, x(p.to_ms) - x(p.from_ms))
        parts.append(
            f'<rect class="mark" x="{x(p.from_ms):.2f}" y="26" width="{width:.2f}" '
            f'height="6" fill="#555"><title>billing paused {_e(p.from_)} .. {_e(p.to)}'
            "</title></rect>"
        )
    return (
        f'<p class="muted">{_e(label)}</p><svg class="timeline" width="{w}" height="{h}" '
        f'viewBox="0 0 {w} {h}" xmlns="http://www.w3.org/2000/svg">{"".join(parts)}</svg>'
    )


def _timelines(st: Statement) -> str:
    """The whole period, and the event-time range the data covers (zoomed)."""
    p0 = _period_start_ms(st)
    out = [
        _timeline_svg(
            st, p0, p0 + int(st.credit.period_ms), "period: levels (L1 yellow, L2 orange, "
            "L3 red) and billing pauses (dark)",
        )
    ]  # fmt: skip
    rng = st.inputs.get("event_time_range", {})
    if rng.get("from_unix_ns") is not None:
        lo = int(rng["from_unix_ns"]) // 1_000_000
        hi = int(st.inputs["observed_until_unix_ns"]) // 1_000_000 + 1
        out.append(_timeline_svg(st, lo, hi, f"zoomed: {rng['from']} .. {rng['to']} (the data)"))
    return "".join(out)


def _period_start_ms(st: Statement) -> int:
    t = dt.datetime.fromisoformat(st.period_start)
    return int(t.timestamp() * 1000)


def _met_cell(met: bool | None) -> str:
    """An objective's verdict as a table cell: met, missed, or ``-`` (no traffic)."""
    cls, text = ("muted", "-") if met is None else (("ok", "met") if met else ("bad", "missed"))
    return f"<td class='{cls}'>{text}</td>"


def render_html(st: Statement) -> str:
    """One self-contained page (inline CSS and SVG, no scripts, no external links)."""
    rule = st.breach_rule
    rows = []
    for name, s in st.slos.items():
        rows.append(
            f"<tr><td>{_e(name)}</td><td>{_e(s.boundary)}</td><td>{s.threshold_ms:.0f} ms"
            f"</td><td>{s.total:,}</td><td>{s.good:,}</td><td>{_pct(s.compliance)}</td>"
            f"<td>{_pct(s.objective, 1)}</td>{_met_cell(s.met)}"
            f"<td>{_ms(st.percentiles[name].period)}</td></tr>"
        )
    for name, t in st.tiers.items():
        rows.append(
            f"<tr><td>{_e(name)}</td><td colspan='2'>blended: {_e(t.primary)} + "
            f"{t.secondary_weight:g} x {_e(t.secondary)} only</td><td>{t.total:,}</td>"
            f"<td>{t.good_primary:,} + {t.good_secondary_only:,}</td>"
            f"<td>{_pct(t.compliance)}</td><td>{_pct(t.objective, 1)}</td>"
            f"{_met_cell(t.met)}<td></td></tr>"
        )
    days = sorted({d for p in st.percentiles.values() for d in p.days})
    day_rows = []
    for d in days:
        cells = []
        for name, p in st.percentiles.items():
            v = p.days.get(d)
            thr = st.slos[name].threshold_ms
            cls = "bad" if v and v.p > thr else ""
            cells.append(f"<td class='{cls}'>{_ms(v.p) if v else '-'}</td>")
        day_rows.append(f"<tr><td>{_e(d)}</td>{''.join(cells)}</tr>")
    breach_rows = "".join(
        f"<tr><td>{_e(b.day)}</td><td>{_e(b.slo)}</td><td>{_ms(b.p_ms)}</td>"
        f"<td>{b.target_ms:.0f} ms</td><td class='{'bad' if b.severe else ''}'>"
        f"{b.ratio:.2f} x{' severe' if b.severe else ''}</td></tr>"
        for b in st.breaches
    )
    level_rows = "".join(
        f"<tr><td>L{t.level}</td><td>{_e(t.from_)}</td><td>{_e(t.to)}</td>"
        f"<td>{_e(', '.join(t.scopes))}</td><td>{'yes' if t.notify_customer else 'no'}"
        "</td></tr>"
        for t in st.levels.timeline
    )
    credit_rows = "".join(
        f"<tr><td>L{c.level}</td><td>{c.fee_change_percent:g} %</td><td>{_dur(c.ms)}"
        f"</td><td>{c.credit_percent:.6f} %</td></tr>"
        for c in st.credit.levels
    )
    cold_rows = "".join(
        f"<tr><td>{_e(c.started)}</td><td>{_e(c.engine_host)}</td><td>{c.requests}</td>"
        f"<td>{c.nth_of_day}</td><td class='{'ok' if c.exempted else 'bad'}'>"
        f"{'exempted' if c.exempted else 'over the cap'}</td></tr>"
        for c in st.cold_starts
    )
    incidents = []
    for i in st.incidents:
        worst = "".join(
            f"<tr><td><code>{_e(w.request_id)}</code></td><td>{_ms(w.value_ms)}</td>"
            f"<td>{_ms(w.queue_ms)}</td><td>{_ms(w.inference_ms)}</td>"
            f"<td><code>{_e(w.explain)}</code></td></tr>"
            for w in i.worst
        )
        incidents.append(
            f"<h3>{_e(i.at)}: {_e(i.slo)} ({_e(i.boundary)}) budget exhausted</h3>"
            f"<p>{i.bad_requests} bad requests of this tenant before it; queue "
            f"{_pct(i.queue_share, 1)}, compute {_pct(i.compute_share, 1)}.</p>"
            "<table><tr><th>worst requests</th><th>value</th><th>queue</th><th>compute</th>"
            f"<th>explain</th></tr>{worst}</table>"
        )
    inp = st.inputs
    verdict = (
        "<span class='ok'>within the contract</span>"
        if rule.within
        else "<span class='bad'>breached</span>"
    )
    head = "".join(f"<th>{_e(n)}</th>" for n in st.percentiles)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>Statement {_e(st.tenant)} {_e(st.period)}</title>
<style>{_CSS}</style></head><body>
<h1>Statement: {_e(st.tenant)}, {_e(st.period)}</h1>
<p class="muted">{_e(st.period_start)} .. {_e(st.period_end)} ({_e(st.timezone)});
{st.requests:,} requests, {st.counted:,} counted, {len(st.exempted):,} exempted.</p>
<h2>Credit: {st.credit_percent:.6f} % of the period's fee</h2>
{_timelines(st)}
<table><tr><th>level</th><th>fee change</th><th>time (outside pauses)</th><th>credit</th></tr>
{credit_rows}<tr><td>billing paused</td><td>-100 %</td><td>{_dur(st.credit.paused_ms)}</td>
<td>{st.credit.paused_percent:.6f} %</td></tr></table>
<p class="muted"><code>credit_percent = {_e(st.credit.formula)}</code></p>
<h2>SLOs</h2>
<table><tr><th>SLO</th><th>boundary</th><th>target</th><th>total</th><th>good</th>
<th>compliance</th><th>objective</th><th></th><th>P{rule.percentile:g} period</th></tr>
{"".join(rows)}</table>
<h2>Breaches: {rule.breaches} of at most {rule.max_breaches},
{rule.severe} severe: {verdict}</h2>
<table><tr><th>day</th><th>SLO</th><th>P{rule.percentile:g}</th><th>target</th><th>ratio</th></tr>
{breach_rows}</table>
<h2>Daily P{rule.percentile:g}</h2>
<table><tr><th>day</th>{head}</tr>{"".join(day_rows)}</table>
<h2>Control levels</h2>
<p class="muted">{_e(st.levels.rule)}</p>
<table><tr><th>level</th><th>from</th><th>to</th><th>scopes</th><th>customer notified</th></tr>
{level_rows}</table>
<h2>Cold starts and exemptions</h2>
<table><tr><th>started</th><th>engine</th><th>requests</th><th>n-th of day</th><th></th></tr>
{cold_rows}</table>
<p>Exempted by reason: {
        _e(", ".join(f"{k} {v:,}" for k, v in st.exempted_by_reason.items()) or "none")
    }</p>
<h2>Incidents</h2>
{"".join(incidents) or "<p>none</p>"}
<p class="muted">Budget exhaustions not this tenant's (no bad request of it before them):
{len(st.budget_exhausted_not_this_tenant)}</p>
<h2>Inputs</h2>
<p class="muted"><code>{inp["requests_rows"]:,} request rows {_e(inp["requests_digest"])}<br>
event time {_e(inp["event_time_range"]["from"])} .. {_e(inp["event_time_range"]["to"])}<br>
{inp["control_rows"]} control rows, {inp["budget_event_rows"]} budget events<br>
contract {_e(inp["contract"]["digest"])}<br>spec {_e(inp["slo_spec"]["digest"])}</code></p>
<p class="muted">Check it: <code>tailguard statement --verify STATEMENT.json</code></p>
</body></html>
"""
