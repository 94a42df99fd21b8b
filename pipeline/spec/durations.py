"""Durations in tailguard/v1 files: ``"30s"``, ``"5m"``, ``"30d"`` <-> integer milliseconds."""

from __future__ import annotations

import re
from typing import Final

_DURATION_RE: Final = re.compile(r"^(-?)([0-9]+)(ms|s|m|h|d|w)$")
UNIT_MS: Final = {
    "ms": 1,
    "s": 1_000,
    "m": 60_000,
    "h": 3_600_000,
    "d": 86_400_000,
    "w": 7 * 86_400_000,
}


def parse_duration_ms(text: str, *, allow_zero: bool = False) -> int:
    """``"5m"`` -> 300000. Units ms, s, m, h, d, w; negative (and, unless allowed,
    zero) durations are errors."""
    m = _DURATION_RE.match(text)
    if m is None:
        raise ValueError(
            f"invalid duration {text!r}: use an integer and a unit (ms, s, m, h, d, w), "
            "e.g. 30s, 5m, 1h, 30d"
        )
    if m.group(1):
        raise ValueError(f"invalid duration: negative duration {text!r} (durations are >= 0)")
    ms = int(m.group(2)) * UNIT_MS[m.group(3)]
    if ms == 0 and not allow_zero:
        raise ValueError(f"invalid duration: duration {text!r} must be positive")
    return ms


def format_ms(ms: int) -> str:
    """300000 -> ``"5m"``; the largest unit that divides evenly."""
    if ms == 0:
        return "0s"
    for unit in ("w", "d", "h", "m", "s"):
        if ms % UNIT_MS[unit] == 0:
            return f"{ms // UNIT_MS[unit]}{unit}"
    return f"{ms}ms"


def unit_required(v: object) -> object:
    """Pydantic before-validator: a bare number is not a duration (``30`` what?)."""
    if isinstance(v, int | float) and not isinstance(v, bool):
        # ValueError, not TypeError: pydantic turns only ValueError into a field error
        raise ValueError(f"duration {v} has no unit: write e.g. {v}s, {v}m, {v}h or {v}d")  # noqa: TRY004
    return v
