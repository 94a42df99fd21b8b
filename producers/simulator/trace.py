"""Reading request traces in the Azure LLM inference trace format.

The format (Azure Public Dataset, ``AzureLLMInferenceTrace_*.csv``) is a CSV
file with a header and the columns ``TIMESTAMP`` (``2023-11-16 18:15:46.6805900``:
a naive UTC date-time with up to 9, usually 7, fractional digits),
``ContextTokens`` and ``GeneratedTokens``. Extra columns are ignored.

Timestamps are parsed to integer nanoseconds (the whole seconds through
:mod:`datetime`, the fraction as an integer), so no digit of the 7-digit
fraction is lost before offsets are taken.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

__all__ = ["TraceRequest", "parse_timestamp_ns", "read_trace"]

_COLUMNS: Final = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
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
