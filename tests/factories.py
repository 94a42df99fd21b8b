"""Small event factories for tests (not the simulator: exact, hand-set values)."""

from __future__ import annotations

from typing import Any

from pipeline.contract.events import EngineFinished, GatewayCompleted, GatewayReceived
from pipeline.contract.wire import from_model
from pipeline.core.join import JoinConfig, Joiner
from pipeline.core.record import RequestRecord

T0_NS = 1_700_000_000_000_000_000


def _envelope(
    rid: str, kind: str, event_id: str, t_ms: float, *, host: str, model: str
) -> dict[str, Any]:
    """The fields every lifecycle event carries, at ``t_ms`` after ``T0_NS``."""
    return {
        "v": 1,
        "event_id": event_id,
        "kind": kind,
        "request_id": rid,
        "ts_unix_ns": T0_NS + int(t_ms * 1e6),
        "host": host,
        "model": model,
    }


def received(
    rid: str,
    t_ms: float = 0.0,
    *,
    priority: int = 1,
    prompt_tokens: int | None = 100,
    tenant: str | None = "t1",
    model: str = "m",
    eid: str | None = None,
) -> GatewayReceived:
    return GatewayReceived(
        **_envelope(rid, "gateway.received", eid or f"{rid}:r", t_ms, host="gw-0", model=model),
        priority=priority,
        tenant=tenant,
        prompt_tokens=prompt_tokens,
        stream=True,
    )


def completed(
    rid: str,
    t_ms: float = 100.0,
    *,
    total_ms: float = 100.0,
    ttfb_ms: float | None = 20.0,
    outcome: str = "ok",
    http_status: int = 200,
    model: str = "m",
    eid: str | None = None,
    control_mode: str | None = None,
    control_verdict: str | None = None,
) -> GatewayCompleted:
    return GatewayCompleted(
        **_envelope(rid, "gateway.completed", eid or f"{rid}:c", t_ms, host="gw-0", model=model),
        total_ms=total_ms,
        ttfb_ms=ttfb_ms,
        http_status=http_status,
        outcome=outcome,  # type: ignore[arg-type]
        control_mode=control_mode,  # type: ignore[arg-type]
        control_verdict=control_verdict,  # type: ignore[arg-type]
    )


def finished(
    rid: str,
    t_ms: float = 98.0,
    *,
    queue_ms: float = 10.0,
    prefill_ms: float = 8.0,
    decode_ms: float = 70.0,
    output_tokens: int = 8,
    prompt_tokens: int = 100,
    model: str = "m",
    eid: str | None = None,
) -> EngineFinished:
    inference = prefill_ms + decode_ms
    return EngineFinished(
        **_envelope(rid, "engine.finished", eid or f"{rid}:f", t_ms, host="m-0", model=model),
        arrival_unix_ns=T0_NS + int((t_ms - queue_ms - inference) * 1e6),
        queue_ms=queue_ms,
        prefill_ms=prefill_ms,
        decode_ms=decode_ms,
        inference_ms=inference,
        e2e_ms=queue_ms + inference,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        cached_tokens=0,
        finish_reason="stop",
        preemptions=0,
        priority=1,
    )


def joined(events: list[Any]) -> list[RequestRecord]:
    """The records the join makes of ``events`` (in order), timeouts drained."""
    j = Joiner(JoinConfig(timeout_ms=1_000))
    out = [j.add(from_model(e), i) for i, e in enumerate(events)]
    return [r for r in out if r is not None] + j.drain()
