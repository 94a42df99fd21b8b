"""Which stored table answers which part of a time range (issue 53: a report over 30 days).

The windows count every request once, by its end (``pipeline.core.windows``), in base
windows of ``window_ns``; the rollups merge them per minute and per hour. A range
``[since, until)`` of request ends is answered by the fewest rows: whole hours from the
hourly rollups, whole minutes from the minute rollups, whole base windows from the base
windows, and only the rest from ``requests`` itself: the part of a base window the range
cuts at either end (less than one window each), and what ended after the windows closed
so far (``closed_ns``: within a window and its grace period on a live store). Pure: the
adapters read each span from its table.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Final

MINUTE_NS: Final = 60_000_000_000
HOUR_NS: Final = 3_600_000_000_000

Span = tuple[int, int]  # [from, until) in unix ns
OpenSpan = tuple[int | None, int | None]  # None: unbounded on that side


@dataclass(frozen=True, slots=True)
class Cover:
    """A range of request ends split by the table that answers each part: ``hours``
    (hourly rollups), ``minutes`` (minute rollups), ``windows`` (base windows) and
    ``rest`` (``requests``). The parts are disjoint and together the range."""

    hours: tuple[Span, ...] = ()
    minutes: tuple[Span, ...] = ()
    windows: tuple[Span, ...] = ()
    rest: tuple[OpenSpan, ...] = ()

    @property
    def windowed(self) -> bool:
        """Whether any of the range is answered by the windows."""
        return bool(self.hours or self.minutes or self.windows)


def _ceil(t: int, size: int) -> int:
    return -(-t // size) * size


def _floor(t: int, size: int) -> int:
    return t // size * size


def _spans(*spans: Span) -> tuple[Span, ...]:
    return tuple(s for s in spans if s[0] < s[1])


def cover(
    since_ns: int | None,
    until_ns: int | None,
    *,
    closed_ns: int,
    window_ns: int,
    windowed: bool = True,
) -> Cover:
    """The :class:`Cover` of ``[since_ns, until_ns)`` (unix ns; None: unbounded) when
    the windows are closed up to ``closed_ns`` (exclusive) and ``window_ns`` long. ``windowed``
    False (the question is one the windows cannot answer, e.g. traffic selected by a
    tenant): all of it is ``rest``. A window size that does not divide a minute has no
    minute or hour rollup parts (a window would straddle two minutes)."""
    if window_ns <= 0:
        raise ValueError(f"window_ns must be > 0, got {window_ns}")
    lo = _ceil(since_ns, window_ns) if since_ns is not None else None
    end = closed_ns if until_ns is None else min(until_ns, closed_ns)
    hi = _floor(end, window_ns)
    if not windowed or closed_ns <= 0 or (lo is not None and hi <= lo):
        return Cover(rest=((since_ns, until_ns),))
    rest: list[OpenSpan] = []
    if since_ns is not None and lo is not None and since_ns < lo:
        rest.append((since_ns, lo))
    if until_ns is None or hi < until_ns:
        rest.append((hi, until_ns))
    if lo is None:  # from the first window: nothing is stored before 1970
        lo = 0
    if MINUTE_NS % window_ns:
        return Cover(windows=_spans((lo, hi)), rest=tuple(rest))
    m0, m1 = _ceil(lo, MINUTE_NS), _floor(hi, MINUTE_NS)
    if m1 <= m0:
        return Cover(windows=_spans((lo, hi)), rest=tuple(rest))
    windows = _spans((lo, m0), (m1, hi))
    h0, h1 = _ceil(m0, HOUR_NS), _floor(m1, HOUR_NS)
    if h1 <= h0:
        return Cover(minutes=((m0, m1),), windows=windows, rest=tuple(rest))
    return Cover(
        hours=((h0, h1),), minutes=_spans((m0, h0), (h1, m1)), windows=windows, rest=tuple(rest)
    )


def cover_from(
    since_ns: int | None,
    until_ns: int | None,
    *,
    from_ns: int,
    closed_ns: int,
    window_ns: int,
    windowed: bool = True,
) -> Cover:
    """:func:`cover` when the windows answer only from ``from_ns`` on (a window end: the
    windows before it were written without what is asked, ``sql/0018``): the part of
    the range before it is ``rest`` too. ``from_ns`` <= 0: :func:`cover` itself."""
    if from_ns <= 0 or (since_ns is not None and since_ns >= from_ns):
        return cover(since_ns, until_ns, closed_ns=closed_ns, window_ns=window_ns,
                     windowed=windowed)  # fmt: skip
    later = cover(from_ns, until_ns, closed_ns=closed_ns, window_ns=window_ns, windowed=windowed)
    if (until_ns is not None and until_ns <= from_ns) or not later.windowed:
        return Cover(rest=((since_ns, until_ns),))
    return replace(later, rest=((since_ns, from_ns), *later.rest))
