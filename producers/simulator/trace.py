"""Reading request traces in the Azure LLM inference trace format.

The format (Azure Public Dataset, ``AzureLLMInferenceTrace_*.csv``) is a CSV
file with a header and the columns ``TIMESTAMP`` (``2023-11-16 18:15:46.6805900``:
a naive UTC date-time with up to 9, usually 7, fractional digits),
``ContextTokens`` and ``GeneratedTokens``. Extra columns are ignored.

Timestamps are parsed to integer nanoseconds (the whole seconds through
:mod:`datetime`, the fraction as an integer), so no digit of the 7-digit
fraction is lost before offsets are taken.

Trace shapes, for judging control on traffic it was not tuned on (pure,
deterministic for a seed; ``tools/dev/make_trace.py`` writes them out):

* :func:`code_shape` — code completions: prompts x4 (capped at 16,000 tokens),
  outputs /8 (at least 1; the fraction rounded up with its probability);
* :func:`rate_shape` — the trace overlaid ``times`` times on its own hour, copy
  k rotated by k/times of the period: ``times`` x the rate, the same hour;
* :func:`burst_shape` — the trace plus, for ``duration_ms`` from ``at_ms``,
  ``factor - 1`` extra copies of each request arriving then, each at a uniform
  random instant of the window: ``factor`` x the rate for that window.
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

__all__ = [
    "TRACE_COLUMNS",
    "TraceRequest",
    "burst_shape",
    "code_shape",
    "format_timestamp_ns",
    "parse_timestamp_ns",
    "rate_shape",
    "read_trace",
    "write_trace",
]

_COLUMNS: Final = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
TRACE_COLUMNS: Final = _COLUMNS
_NS_PER_S: Final = 1_000_000_000
_NS_PER_MS: Final = 1_000_000


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace.

    ``arrival_offset_ms`` is relative to the earliest request of the trace
    (which is the first row of a time-sorted trace file).
    """

    arrival_offset_ms: float
    context_tokens: int
    generated_tokens: int


def parse_timestamp_ns(text: str) -> int:
    """``"2023-11-16 18:15:46.6805900"`` -> ns since the Unix epoch (the text is taken as UTC).

    Raises ValueError on anything else (up to 9 fractional digits are accepted).
    """
    whole, dot, frac = text.strip().partition(".")
    if dot and not (1 <= len(frac) <= 9 and frac.isascii() and frac.isdigit()):
        raise ValueError(f"bad fractional seconds in timestamp {text!r}")
    try:
        base = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
    except ValueError:
        raise ValueError(f"bad timestamp {text!r} (want 'YYYY-MM-DD HH:MM:SS.fffffff')") from None
    frac_ns = int(frac.ljust(9, "0")) if dot else 0
    return int(base.timestamp()) * _NS_PER_S + frac_ns


def _token_count(text: str, column: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError(f"{column} is not an integer: {text!r}") from None
    if value < 0:
        raise ValueError(f"{column} is negative: {value}")
    return value


def read_trace(path: str | Path) -> list[TraceRequest]:
    """Read an Azure-format trace; requests sorted by arrival (stable for ties).

    Raises ValueError naming the file and line for a malformed header or row.
    A file with a header and no rows gives an empty list.
    """
    p = Path(path)
    rows: list[tuple[int, int, int]] = []
    with p.open(newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{p}:1: empty trace file (want header {','.join(_COLUMNS)})")
        names = [h.strip().lstrip("\ufeff") for h in header]
        missing = [c for c in _COLUMNS if c not in names]
        if missing:
            raise ValueError(f"{p}:1: header lacks column(s) {', '.join(missing)}")
        idx = [names.index(c) for c in _COLUMNS]
        width = max(idx) + 1
        for row in reader:
            if not row or all(not cell.strip() for cell in row):
                continue  # blank line
            line = reader.line_num
            if len(row) < width:
                raise ValueError(f"{p}:{line}: expected {len(names)} columns, got {len(row)}")
            try:
                ts_ns = parse_timestamp_ns(row[idx[0]])
                context = _token_count(row[idx[1]], _COLUMNS[1])
                generated = _token_count(row[idx[2]], _COLUMNS[2])
            except ValueError as err:
                raise ValueError(f"{p}:{line}: {err}") from None
            rows.append((ts_ns, context, generated))
    if not rows:
        return []
    rows.sort(key=lambda r: r[0])  # stable: ties keep file order
    first_ns = rows[0][0]
    return [TraceRequest((ts - first_ns) / _NS_PER_MS, c, g) for ts, c, g in rows]


def format_timestamp_ns(ns: int) -> str:
    """ns since the Unix epoch -> ``"2023-11-16 18:15:46.6805900"`` (UTC, 7 fractional
    digits, rounded to 100 ns): the inverse of :func:`parse_timestamp_ns`."""
    ticks = round(ns / 100)  # 100 ns units
    whole_s, frac = divmod(ticks, 10_000_000)
    base = datetime.fromtimestamp(whole_s, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")
    return f"{base}.{frac:07d}"


def write_trace(path: str | Path, trace: Sequence[TraceRequest], start_unix_ns: int) -> None:
    """Write ``trace`` as an Azure-format CSV, offset 0 at ``start_unix_ns``."""
    with Path(path).open("w", newline="", encoding="utf-8") as fh:
        out = csv.writer(fh, lineterminator="\n")
        out.writerow(_COLUMNS)
        for tr in trace:
            ts = format_timestamp_ns(start_unix_ns + round(tr.arrival_offset_ms * _NS_PER_MS))
            out.writerow((ts, tr.context_tokens, tr.generated_tokens))


def _sorted(rows: list[TraceRequest]) -> list[TraceRequest]:
    rows.sort(key=lambda r: r.arrival_offset_ms)  # stable
    return rows


def _stochastic_round(x: float, rng: random.Random) -> int:
    whole = math.floor(x)
    return whole + (1 if rng.random() < x - whole else 0)


def code_shape(
    trace: Sequence[TraceRequest],
    *,
    seed: int = 0,
    context_factor: float = 4.0,
    context_cap_tokens: int = 16_000,
    generated_divisor: float = 8.0,
) -> list[TraceRequest]:
    """Code completions: long prompts, short outputs. Arrivals unchanged."""
    rng = random.Random(f"tailguard-trace-code:{seed}")
    return [
        TraceRequest(
            tr.arrival_offset_ms,
            min(context_cap_tokens, round(tr.context_tokens * context_factor)),
            max(1, _stochastic_round(tr.generated_tokens / generated_divisor, rng)),
        )
        for tr in trace
    ]


def _period_ms(trace: Sequence[TraceRequest]) -> float:
    """The trace's span plus one mean gap: rotating by it keeps the spacing at the seam."""
    span = max(tr.arrival_offset_ms for tr in trace)
    return span + span / max(1, len(trace) - 1) if span > 0 else 1.0


def rate_shape(trace: Sequence[TraceRequest], *, times: int = 3) -> list[TraceRequest]:
    """``times`` x the rate over the same hour: copy k (0 = the trace itself) is the
    trace rotated by k/times of its period, so the copies interleave."""
    if times < 1:
        raise ValueError("rate_shape: times must be >= 1")
    if not trace:
        return []
    period = _period_ms(trace)
    rows = [
        TraceRequest(
            (tr.arrival_offset_ms + k * period / times) % period,
            tr.context_tokens,
            tr.generated_tokens,
        )
        for k in range(times)
        for tr in trace
    ]
    return _sorted(rows)


def burst_shape(
    trace: Sequence[TraceRequest],
    *,
    seed: int = 0,
    at_ms: float = 25 * 60_000.0,
    duration_ms: float = 60_000.0,
    factor: float = 5.0,
) -> list[TraceRequest]:
    """The trace plus a burst: in [at_ms, at_ms + duration_ms) each request is sent
    ``factor`` times (a fractional factor: the extra copy with that probability), the
    copies at uniform random instants of the window."""
    if not (math.isfinite(factor) and factor >= 1):
        raise ValueError("burst_shape: factor must be finite and >= 1")
    if not (math.isfinite(duration_ms) and duration_ms > 0 and math.isfinite(at_ms)):
        raise ValueError("burst_shape: at_ms must be finite and duration_ms > 0")
    rng = random.Random(f"tailguard-trace-burst:{seed}")
    end_ms = at_ms + duration_ms
    rows = list(trace)
    for tr in trace:
        if not at_ms <= tr.arrival_offset_ms < end_ms:
            continue
        copies = _stochastic_round(factor - 1.0, rng)
        for _ in range(copies):
            t = at_ms + rng.random() * duration_ms
            rows.append(TraceRequest(t, tr.context_tokens, tr.generated_tokens))
    return _sorted(rows)
