"""The one formatter of instants as text labels (ISO 8601 by default). Pure: stdlib only, so
any layer may import it (contract, core, adapters, tools, producers)."""

from __future__ import annotations

import datetime as dt
from typing import Literal

TimeSpec = Literal["seconds", "milliseconds", "microseconds"]


def iso_time(
    unix_s: float,
    *,
    timespec: TimeSpec = "milliseconds",
    tz: dt.tzinfo = dt.UTC,
    sep: str = "T",
    offset: bool = True,
) -> str:
    """``unix_s`` (seconds since the epoch) in ``tz``: ``2025-01-02T03:04:05.678+00:00``;
    ``sep=" ", offset=False`` gives the plain ``2025-01-02 03:04:05.678`` of tables."""
    at = dt.datetime.fromtimestamp(unix_s, tz=tz)
    return (at if offset else at.replace(tzinfo=None)).isoformat(sep=sep, timespec=timespec)
