"""Why one request met or broke its SLOs (``tailguard explain``), as pure values.

Given the request's record, the SLO spec and the control directives issued
for its model, :func:`explain` returns

* its **timeline** per host clock: the gateway's instants (received, first
  byte, completed) as offsets from the gateway's receipt, and the engine's
  (arrival, scheduled, first token, last token) as offsets from the engine's
  arrival; the two clocks are never compared (no cross-host subtraction);
* its **breakdown** of the gateway total into queue, prefill, decode, other
  engine time and gateway overhead (each a duration from one host's clock;
  overhead = gateway total − engine end-to-end);
* per SLO, the **verdict** (``good``, ``bad``, ``skip``) with the boundary's
  value and the reason, and per blended tier the request's contribution;
* the **control level** in force for its model when it ended: the last
  directive whose event time is at or before the request's end time.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from pipeline.contract.boundaries import QUEUE_BOUNDARIES
from pipeline.core.record import RequestRecord
from pipeline.core.slo import SLOMatcher, Verdict
from pipeline.spec.slo import SLO, SLOSpec

_FAILED: Final = frozenset({"error", "timeout", "rejected"})


@dataclass(frozen=True, slots=True)
class Instant:
    clock: str  # "gateway" | "engine": the host whose clock measured it
    name: str
    offset_ms: float  # from that clock's first instant of the request
    unix_ms: float | None  # that host's wall clock, when known


@dataclass(frozen=True, slots=True)
class Segment:
    name: str  # queue | prefill | decode | engine_other | gateway_overhead
    ms: float
    share: float | None  # of gateway_total_ms (or of engine_e2e_ms without a gateway)


@dataclass(frozen=True, slots=True)
class SLOVerdict:
    slo: str
    boundary: str
    threshold_ms: float
    objective: float
    value_ms: float | None
    verdict: Verdict
    reason: str


@dataclass(frozen=True, slots=True)
class TierVerdict:
    tier: str
    primary: str
    secondary: str
    credit: float | None  # 1, secondary_weight, 0; None when the primary skips it
    reason: str


@dataclass(frozen=True, slots=True)
class AuditedDirective:
    """One control signal as audited (``control_signals``)."""

    scope: str
    seq: int
    level: int
    phase: str
    event_time_unix_ms: int
    reason: str


@dataclass(frozen=True, slots=True)
class Explanation:
    record: RequestRecord
    timeline: tuple[Instant, ...]
    breakdown: tuple[Segment, ...]
    verdicts: tuple[SLOVerdict, ...]
    tiers: tuple[TierVerdict, ...]
    control: AuditedDirective | None  # None: no directive for the model before it ended (level 0)


def timeline(r: RequestRecord) -> tuple[Instant, ...]:
    out: list[Instant] = []

    def wall(base_ns: int | None, offset_ms: float) -> float | None:
        return None if base_ns is None else base_ns / 1e6 + offset_ms

    if r.gateway_total_ms is not None or r.gateway_received_unix_ns is not None:
        g0 = r.gateway_received_unix_ns
        out.append(Instant("gateway", "received", 0.0, wall(g0, 0.0)))
        if r.gateway_ttfb_ms is not None:
            out.append(
                Instant("gateway", "first_byte", r.gateway_ttfb_ms, wall(g0, r.gateway_ttfb_ms))
            )
        if r.gateway_total_ms is not None:
            out.append(
                Instant("gateway", "completed", r.gateway_total_ms, wall(g0, r.gateway_total_ms))
            )
    if r.engine_e2e_ms is not None:
        e0 = r.engine_arrival_unix_ns
        out.append(Instant("engine", "arrival", 0.0, wall(e0, 0.0)))
        if r.queue_ms is not None:
            out.append(Instant("engine", "scheduled", r.queue_ms, wall(e0, r.queue_ms)))
            if r.prefill_ms is not None:
                t = r.queue_ms + r.prefill_ms
                out.append(Instant("engine", "first_token", t, wall(e0, t)))
        out.append(Instant("engine", "last_token", r.engine_e2e_ms, wall(e0, r.engine_e2e_ms)))
    return tuple(out)


def breakdown(r: RequestRecord) -> tuple[Segment, ...]:
    """Where the time went; shares of the gateway total (or of the engine's e2e)."""
    whole = r.gateway_total_ms if r.gateway_total_ms is not None else r.engine_e2e_ms
    parts: list[tuple[str, float]] = []
    for name, value in (("queue", r.queue_ms), ("prefill", r.prefill_ms), ("decode", r.decode_ms)):
        if value is not None:
            parts.append((name, value))
    if r.engine_e2e_ms is not None and parts:
        other = r.engine_e2e_ms - sum(v for _, v in parts)
        if other > 1e-9:
            parts.append(("engine_other", other))
    if r.gateway_overhead_ms is not None:
        parts.append(("gateway_overhead", r.gateway_overhead_ms))
    return tuple(Segment(name, ms, (ms / whole) if whole else None) for name, ms in parts)


def _reason(slo: SLO, r: RequestRecord, verdict: Verdict, value: float | None) -> str:
    thr = f"{slo.threshold_ms:g} ms"
    good_op, bad_op = ("<", ">=") if slo.threshold_strict else ("<=", ">")
    if verdict == "good":
        return f"{value:.1f} ms {good_op} {thr}" if value is not None else "good"
    if verdict == "bad":
        if r.outcome in _FAILED or r.outcome not in ("ok", "client_abort"):
            return f"outcome {r.outcome} counts as bad"
        if value is None:
            total = r.gateway_total_ms
            return f"no first byte, and the client waited {total or 0:.1f} ms > {thr}"
        return f"{value:.1f} ms {bad_op} {thr}{_load_cause(slo, r, value)}"
    # skip: say which rule took it out
    f = slo.filter
    if f is not None:
        checks: tuple[tuple[str, object, object], ...] = (
            ("model", f.model, r.model),
            ("priority", f.priority, r.priority),
            ("ctx_bucket", f.ctx_bucket, r.ctx_bucket),
            ("tenant", f.tenant, r.tenant),
        )
        for field, allowed, actual in checks:
            if allowed is not None and (actual is None or actual not in allowed):  # type: ignore[operator]
                return f"not selected: {field} {actual!r} not in {list(allowed)}"  # type: ignore[call-overload]
        if f.stream is not None and r.stream != f.stream:
            return f"not selected: stream {r.stream!r} != {f.stream}"
    ex = slo.exclude
    if (
        ex is not None
        and ex.prompt_tokens_over is not None
        and r.prompt_tokens is not None
        and r.prompt_tokens > ex.prompt_tokens_over
    ):
        return f"excluded: {r.prompt_tokens} prompt tokens > {ex.prompt_tokens_over}"
    if r.outcome == "client_abort" and slo.client_abort == "exclude":
        return "excluded: client abort"
    if r.outcome not in ("ok", "client_abort") and slo.errors == "exclude":
        return f"excluded: outcome {r.outcome} (errors: exclude)"
    if value is None:
        return "no value at this boundary (the layer that measures it did not see the request)"
    return "not counted"


def _load_cause(slo: SLO, r: RequestRecord, value: float) -> str:
    """How much of a bad request's time at the SLO's boundary was queueing: a burn made
    of such requests is load-caused (shedding helps) or not (the controller's rule,
    ``pipeline.core.control``: half of the bad requests' time queued)."""
    if slo.boundary not in QUEUE_BOUNDARIES:
        return "; not load-caused (the boundary excludes the queue)"
    if r.queue_ms is None or value <= 0:
        return ""
    share = min(1.0, r.queue_ms / value)
    if share >= 0.5:
        return f"; {100 * share:.0f} % of it queued: load-caused"
    return f"; {100 * (1 - share):.0f} % of it compute: not load-caused"


def verdicts(r: RequestRecord, spec: SLOSpec) -> tuple[SLOVerdict, ...]:
    out = []
    for slo in spec.slos:
        value = r.boundary(slo.boundary)
        v = SLOMatcher(slo).classify(r)
        out.append(
            SLOVerdict(
                slo.name, slo.boundary, slo.threshold_ms, slo.objective, value, v,
                _reason(slo, r, v, value),
            )
        )  # fmt: skip
    return tuple(out)


def tier_verdicts(spec: SLOSpec, per_slo: Iterable[SLOVerdict]) -> tuple[TierVerdict, ...]:
    by_name = {v.slo: v.verdict for v in per_slo}
    out = []
    for name, tier in spec.tiers.items():
        p, s = by_name.get(tier.primary, "skip"), by_name.get(tier.secondary, "skip")
        if p == "skip":
            out.append(TierVerdict(name, tier.primary, tier.secondary, None, "primary skips it"))
        elif p == "good":
            out.append(TierVerdict(name, tier.primary, tier.secondary, 1.0, "primary good"))
        elif s == "good":
            w = tier.secondary_weight
            out.append(
                TierVerdict(name, tier.primary, tier.secondary, w, f"secondary only: x{w:g}")
            )
        else:
            out.append(TierVerdict(name, tier.primary, tier.secondary, 0.0, "neither good"))
    return tuple(out)


def control_at(
    directives: Iterable[AuditedDirective], scope: str, t_unix_ms: int
) -> AuditedDirective | None:
    """The directive in force for ``scope`` at ``t_unix_ms`` (latest event time, then seq)."""
    best: AuditedDirective | None = None
    for d in directives:
        if d.scope != scope or d.event_time_unix_ms > t_unix_ms:
            continue
        if best is None or (d.event_time_unix_ms, d.seq) > (best.event_time_unix_ms, best.seq):
            best = d
    return best


def explain(r: RequestRecord, spec: SLOSpec, directives: Iterable[AuditedDirective]) -> Explanation:
    per_slo = verdicts(r, spec)
    return Explanation(
        record=r,
        timeline=timeline(r),
        breakdown=breakdown(r),
        verdicts=per_slo,
        tiers=tier_verdicts(spec, per_slo),
        control=control_at(directives, r.model, r.end_unix_ns // 1_000_000),
    )


def conflict_note(r: RequestRecord) -> str | None:
    """What ``explain`` says of a record whose terminal events conflicted (None: none)."""
    if not r.conflicts:
        return None
    n = r.conflicts
    return (
        f"{n} conflicting terminal event{'' if n == 1 else 's'} (this request, another event "
        "id, other outcome or values): the record holds the worse of each kind (a failure "
        "over a client abort over ok, then the longer latency), and the SLOs count that"
    )


def gateway_control_note(r: RequestRecord) -> str | None:
    """What the gateway's enforcement said of the request (issue 48), or None when it
    carried no control mode (off, or a gateway without control)."""
    mode, verdict = r.control_mode, r.control_verdict
    if mode is None:
        return None
    if mode == "shadow":
        if verdict is None:
            return "shadow: would have been admitted"
        return f"shadow: would have been refused ({verdict}); served as without control"
    if verdict is None:
        return f"{mode}: admitted"
    status = "" if r.http_status is None else f" {r.http_status}"
    return f"{mode}: refused{status} ({verdict})"


def client_attempt_note(r: RequestRecord) -> str | None:
    """Which try of a logical request this is, as the client said (issue 47), or None for
    a first try without a logical id (the common case)."""
    if r.client_attempt == 0 and r.logical_request_id is None:
        return None
    which = "first try" if r.client_attempt == 0 else f"retry {r.client_attempt}"
    if r.logical_request_id is None:
        return f"client: {which} (no logical request id: counted as a request of its own)"
    return f"client: {which} of logical request {r.logical_request_id}"
