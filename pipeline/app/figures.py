"""The text of a figure in the user commands' tables and reports: one formatter, with
``-`` for a figure that is missing (None)."""

from __future__ import annotations


def figure(x: float | None, spec: str, unit: str = "") -> str:
    """``x`` in the format ``spec``, then ``unit`` (``figure(1234.5, ",.0f", " ms")`` is
    ``1,234 ms``); ``-`` when ``x`` is None."""
    return "-" if x is None else f"{x:{spec}}{unit}"


def percent(x: float | None, spec: str = ".1f", unit: str = "%") -> str:
    """A fraction as a percentage: ``percent(0.9912)`` is ``99.1%``; ``-`` when None."""
    return figure(None if x is None else 100 * x, spec, unit)
