"""Envoy JSON access logs -> ``gateway.received`` + ``gateway.completed`` events.

For gateways that are Envoy (or Envoy-based: Istio, Envoy Gateway, Contour) rather
than an ASGI app. Configure the access log with :data:`JSON_FORMAT` (the YAML snippet
is ``producers/envoy-access-log.yaml``), then feed the file or a pipe to
``tailguard envoy FILE|-``. Each line becomes two events of the v1 contract:

* ``gateway.received`` at ``start_time`` (Envoy's wall clock at the first downstream
  byte) with the model, priority and tenant taken from request headers (Envoy does
  not read request bodies: clients or a filter set ``x-tailguard-model``);
* ``gateway.completed`` with ``total_ms`` = first request byte -> last response byte
  sent downstream and ``ttfb_ms`` = first request byte -> first response byte sent
  downstream, both Envoy's own durations (``%COMMON_DURATION(...:us)%``, Envoy >= 1.29;
  older Envoys: ``%DURATION%`` and ``%RESPONSE_DURATION%``, whole milliseconds, the
  latter up to the first *upstream* byte).

Outcome: ``%RESPONSE_CODE%`` 0 or the ``DC`` response flag (downstream connection
termination) -> ``client_abort`` with ``http_status`` 0; the ``UT`` flag (upstream
request timeout) or 408/504 -> ``timeout``; 429 -> ``rejected``; other >= 400 ->
``error``. A line that is not JSON, lacks the request id, start time or a duration,
or has values of the wrong type is dead-lettered with the reason (and counted);
ingestion goes on. Event ids derive from the request id and start time, so ingesting
the same file twice produces the same events (the worker drops repeats).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any, Final

import orjson
from pydantic import ValidationError

from pipeline.contract.events import GatewayCompleted, GatewayReceived, Outcome
from producers.emit import EventSink
from producers.gateway import outcome_of, usable_request_id

# The access log format to configure (``log_format: {json_format: ...}``).
JSON_FORMAT: Final[dict[str, str]] = {
    "request_id": "%REQ(X-REQUEST-ID)%",
    "start_time": "%START_TIME(%s.%6f)%",
    "total_us": "%COMMON_DURATION(DS_RX_BEG:DS_TX_END:us)%",
    "ttfb_us": "%COMMON_DURATION(DS_RX_BEG:DS_TX_BEG:us)%",
    "duration_ms": "%DURATION%",
    "response_duration_ms": "%RESPONSE_DURATION%",
    "response_code": "%RESPONSE_CODE%",
    "response_flags": "%RESPONSE_FLAGS%",
    "model": "%REQ(X-TAILGUARD-MODEL)%",
    "priority": "%REQ(X-VLLM-PRIORITY)%",
    "tenant": "%REQ(X-TENANT-ID)%",
    "stream": "%REQ(X-TAILGUARD-STREAM)%",
    "bytes_sent": "%BYTES_SENT%",
    "hostname": "%HOSTNAME%",
}

_MISSING: Final = (None, "", "-")


class LineError(ValueError):
    """Why a log line cannot become events (the dead-letter reason)."""


def _present(doc: dict[str, Any], key: str) -> Any:
    value = doc.get(key)
    return None if value in _MISSING else value


def _number(doc: dict[str, Any], key: str) -> float | None:
    value = _present(doc, key)
    if value is None:
        return None
    if isinstance(value, bool):
        raise LineError(f"{key}: not a number")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            raise LineError(f"{key}: not a number: {value[:40]!r}") from None
    raise LineError(f"{key}: not a number")


def _text(doc: dict[str, Any], key: str) -> str | None:
    value = _present(doc, key)
    if value is None:
        return None
    if not isinstance(value, str):
        value = str(value)
    return value.strip()[:256] or None


def _unix_ns(doc: dict[str, Any], key: str) -> int | None:
    """Epoch seconds with a fraction (``"1700000000.250000"``) -> exact integer ns."""
    value = _present(doc, key)
    if value is None or isinstance(value, bool):
        return None
    try:
        ns = int(Decimal(str(value)) * 1_000_000_000)
    except (InvalidOperation, ValueError):
        raise LineError(f"{key}: not a timestamp: {str(value)[:40]!r}") from None
    return ns if ns > 0 else None


def _event_id(request_id: str, start: str, suffix: str) -> str:
    digest = hashlib.blake2b(f"{request_id}\0{start}".encode(), digest_size=12).hexdigest()
    return f"envoy-{digest}-{suffix}"


def parse_line(
    raw: bytes, *, host: str, default_model: str
) -> tuple[GatewayReceived, GatewayCompleted]:
    """One access-log line -> its two events (pure; raises :class:`LineError`)."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise LineError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise LineError("not a JSON object")
    request_id = usable_request_id(_text(doc, "request_id"))
    if request_id is None:
        raise LineError("request_id: missing or unusable (log %REQ(X-REQUEST-ID)%)")
    start_ns = _unix_ns(doc, "start_time")
    if start_ns is None:
        raise LineError("start_time: missing (log %START_TIME(%s.%6f)%)")
    total_us = _number(doc, "total_us")
    total_ms = total_us / 1000 if total_us is not None else _number(doc, "duration_ms")
    if total_ms is None or total_ms < 0:
        raise LineError("total_us/duration_ms: missing or negative")
    ttfb_us = _number(doc, "ttfb_us")
    ttfb_ms = ttfb_us / 1000 if ttfb_us is not None else _number(doc, "response_duration_ms")
    if ttfb_ms is not None and ttfb_ms < 0:
        raise LineError("ttfb: negative")
    code = _number(doc, "response_code")
    flags = set((_text(doc, "response_flags") or "").split(","))
    status = int(code) if code is not None else 0
    outcome: Outcome
    if status == 0 or "DC" in flags:
        status, outcome = 0, "client_abort"
    elif "UT" in flags:
        outcome = "timeout"
    else:
        outcome = outcome_of(status)
    priority_raw = _number(doc, "priority")
    priority = 0 if priority_raw is None else min(3, max(0, int(priority_raw)))
    model = _text(doc, "model") or default_model
    start_key = str(doc.get("start_time"))
    try:
        received = GatewayReceived(
            v=1,
            kind="gateway.received",
            event_id=_event_id(request_id, start_key, "r"),
            ts_unix_ns=start_ns,
            host=_text(doc, "hostname") or host,
            model=model,
            request_id=request_id,
            priority=priority,
            tenant=_text(doc, "tenant"),
            stream=(_text(doc, "stream") or "").lower() in ("1", "true", "yes"),
        )
        completed = GatewayCompleted(
            v=1,
            kind="gateway.completed",
            event_id=_event_id(request_id, start_key, "c"),
            ts_unix_ns=start_ns + round(total_ms * 1e6),
            host=received.host,
            model=model,
            request_id=request_id,
            total_ms=total_ms,
            ttfb_ms=ttfb_ms,
            http_status=min(status, 599),
            outcome=outcome,
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise LineError(f"{where}: {first['msg']}") from None
    return received, completed


@dataclass
class IngestStats:
    lines: int = 0
    requests: int = 0
    dead: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    outcomes: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "lines": self.lines,
            "requests": self.requests,
            "dead": self.dead,
            "reasons": self.reasons,
            "outcomes": self.outcomes,
        }


DeadLetterFn = Callable[[bytes, str, int], None]


def ingest(
    lines: Iterable[bytes],
    sink: EventSink,
    *,
    host: str = "envoy",
    default_model: str = "unknown",
    dead: DeadLetterFn | None = None,
) -> IngestStats:
    """Access-log lines -> events on ``sink``; bad lines -> ``dead(raw, reason, line_no)``."""
    stats = IngestStats()
    for line_no, line in enumerate(lines, start=1):
        raw = line.strip()
        if not raw:
            continue
        stats.lines += 1
        try:
            received, completed = parse_line(raw, host=host, default_model=default_model)
        except LineError as exc:
            reason = str(exc)
            stats.dead += 1
            key = reason.split(":", 1)[0]
            stats.reasons[key] = stats.reasons.get(key, 0) + 1
            if dead is not None:
                dead(raw, reason, line_no)
            continue
        sink.emit(received)
        sink.emit(completed)
        stats.requests += 1
        stats.outcomes[completed.outcome] = stats.outcomes.get(completed.outcome, 0) + 1
    return stats
