"""Envoy JSON access logs -> ``gateway.received`` + ``gateway.completed`` events.

For gateways that are Envoy (or Envoy-based: Istio, Envoy Gateway, Contour) rather
than an ASGI app. Configure the access log with :data:`JSON_FORMAT` (the YAML snippet
is ``producers/envoy-access-log.yaml``), then feed the file or a pipe to
``tailguard envoy FILE|-``. Each line becomes two events of the v1 contract:

* ``gateway.received`` at ``start_time`` (Envoy's wall clock at the first downstream
  byte) with the model, priority and tenant taken from request headers (Envoy does
  not read request bodies: clients or a filter set ``x-tailguard-model``); a request
  without ``X-Vllm-Priority`` gets the default tier (2, as in the gateway middleware);
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
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import IO, Any, Final

import orjson
from pydantic import ValidationError

from pipeline.contract.events import DEFAULT_PRIORITY, GatewayCompleted, GatewayReceived, Outcome
from producers.client_retry import (
    CLIENT_REQUEST_ID_HEADER,
    IDEMPOTENCY_KEY_HEADER,
    RETRY_COUNT_HEADER,
    client_attempt,
)
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
    # the client's attempt (issue 47; producers/client_retry.py reads them)
    "retry_count": "%REQ(X-STAINLESS-RETRY-COUNT)%",
    "idempotency_key": "%REQ(IDEMPOTENCY-KEY)%",
    "client_request_id": "%REQ(X-CLIENT-REQUEST-ID)%",
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
    raw: bytes, *, host: str, default_model: str, default_priority: int = DEFAULT_PRIORITY
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
    # no X-Vllm-Priority: the default tier (a middle one), as the gateway middleware does
    priority = default_priority if priority_raw is None else min(3, max(0, int(priority_raw)))
    model = _text(doc, "model") or default_model
    start_key = str(doc.get("start_time"))
    # Envoy forwards the client's X-Request-Id as it came: a retry that reuses it is the
    # join's next attempt of that request id (pipeline/core/join.py, "Attempts"), and
    # that id is already its logical request's key (pipeline/core/logical.py)
    client = client_attempt(
        {
            RETRY_COUNT_HEADER: _text(doc, "retry_count"),
            IDEMPOTENCY_KEY_HEADER: _text(doc, "idempotency_key"),
            CLIENT_REQUEST_ID_HEADER: _text(doc, "client_request_id"),
        }.get
    )
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
            client_attempt=client.attempt,
            logical_request_id=client.logical_id,
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
    blank: int = 0

    def add(self, other: IngestStats) -> None:
        self.lines += other.lines
        self.requests += other.requests
        self.dead += other.dead
        self.blank += other.blank
        for mine, theirs in ((self.reasons, other.reasons), (self.outcomes, other.outcomes)):
            for k, v in theirs.items():
                mine[k] = mine.get(k, 0) + v

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
    first_line: int = 1,
    default_priority: int = DEFAULT_PRIORITY,
) -> IngestStats:
    """Access-log lines -> events on ``sink``; bad lines -> ``dead(raw, reason, line_no)``."""
    stats = IngestStats()
    for line_no, line in enumerate(lines, start=first_line):
        raw = line.strip()
        if not raw:
            stats.blank += 1
            continue
        stats.lines += 1
        try:
            received, completed = parse_line(
                raw, host=host, default_model=default_model, default_priority=default_priority
            )
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


# --- follow mode (tail -F) -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Position:
    """Where a followed file was read up to: its identity (device, inode) and byte offset."""

    dev: int
    ino: int
    offset: int

    def to_json(self) -> bytes:
        return orjson.dumps({"dev": self.dev, "ino": self.ino, "offset": self.offset})


def load_position(path: Path) -> Position | None:
    try:
        doc = orjson.loads(path.read_bytes())
        return Position(int(doc["dev"]), int(doc["ino"]), int(doc["offset"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save_position(path: Path, pos: Position) -> None:
    """Atomically (write a temporary file, fsync, rename)."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as fh:
        fh.write(pos.to_json())
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class Follower:
    """``tail -F`` over one file: yields complete lines as they are appended, across
    rotation (the path now names another file: the old one is read to its end first,
    then the new one from its start) and truncation (the file got shorter than what was
    read: read again from 0). A line without its newline yet is held back until it ends.

    ``start``: where to resume (a saved :class:`Position`); used only if it names the
    same file (device and inode) and is not past its end, else reading starts at 0.
    :meth:`position` is the offset after the last line yielded: save it once what those
    lines became is delivered, and a restart neither loses nor repeats a line.
    """

    def __init__(self, path: Path, start: Position | None = None, *, poll_s: float = 0.2) -> None:
        self.path = path
        self.poll_s = poll_s
        self._fh: IO[bytes] | None = None
        self._ident: tuple[int, int] | None = None
        self._offset = 0
        self._partial = b""
        self._start = start
        self.rotations = 0
        self.truncations = 0

    def position(self) -> Position | None:
        if self._ident is None:
            return None
        return Position(self._ident[0], self._ident[1], self._offset)

    def _open(self, resume: Position | None) -> bool:
        try:
            fh = self.path.open("rb")
        except FileNotFoundError:
            return False
        st = os.fstat(fh.fileno())
        self._fh, self._ident, self._offset, self._partial = fh, (st.st_dev, st.st_ino), 0, b""
        same = resume is not None and (resume.dev, resume.ino) == self._ident
        if same and resume is not None and resume.offset <= st.st_size:
            self._offset = resume.offset
            fh.seek(resume.offset)
        return True

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def read_available(self, max_lines: int = 10_000) -> list[bytes]:
        """The complete lines appended since the last call (at most ``max_lines``);
        handles rotation and truncation. Never blocks."""
        if self._fh is None:
            if not self._open(self._start):
                return []
            self._start = None
        out: list[bytes] = []
        while len(out) < max_lines:
            assert self._fh is not None
            chunk = self._fh.readline()
            if chunk:
                if not chunk.endswith(b"\n"):
                    self._partial += chunk
                    continue
                line = self._partial + chunk
                self._partial = b""
                self._offset += len(line)
                out.append(line)
                continue
            # at the end of what is there: rotated or truncated?
            try:
                st = os.stat(self.path)
            except FileNotFoundError:
                break  # rotated away, new file not there yet: keep the old one open
            if (st.st_dev, st.st_ino) != self._ident:
                # the old file was read to its end (a partial last line is kept as is)
                if self._partial:
                    self._offset += len(self._partial)
                    out.append(self._partial)
                    self._partial = b""
                self.close()
                self.rotations += 1
                if not self._open(None):
                    break
                continue
            if st.st_size < self._offset + len(self._partial):
                self.truncations += 1
                self._fh.seek(0)
                self._offset, self._partial = 0, b""
                continue
            break
        return out


def follow(
    follower: Follower,
    sink: EventSink,
    stop: threading.Event,
    *,
    host: str = "envoy",
    default_model: str = "unknown",
    dead: DeadLetterFn | None = None,
    on_delivered: Callable[[Position], None] | None = None,
    flush: Callable[[], None] | None = None,
    default_priority: int = DEFAULT_PRIORITY,
) -> IngestStats:
    """Follow the file until ``stop`` is set: each batch of new lines becomes events,
    the sink (and ``flush``, e.g. the DLQ) is flushed, then ``on_delivered(position)``
    records how far it got. Returns the totals."""
    stats = IngestStats()
    while True:
        lines = follower.read_available()
        if lines:
            part = ingest(
                lines, sink, host=host, default_model=default_model, dead=dead,
                first_line=stats.lines + stats.blank + 1, default_priority=default_priority,
            )  # fmt: skip
            stats.add(part)
            sink.flush()
            if flush is not None:
                flush()
            pos = follower.position()
            if on_delivered is not None and pos is not None:
                on_delivered(pos)
            continue
        if stop.wait(follower.poll_s):
            return stats
