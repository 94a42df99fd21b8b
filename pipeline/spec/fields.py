"""Field types shared by the tailguard/v1 file models: names, durations, lists."""

from __future__ import annotations

import re
from typing import Annotated, Final, overload

from pydantic import AfterValidator, BeforeValidator

from pipeline.spec.durations import parse_duration_ms, unit_required

NAME_RE: Final = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")


def check_name(v: str, example: str) -> str:
    """A DNS-label-like name (``tier1-gateway``); ``example`` is shown when it is not."""
    if not NAME_RE.fullmatch(v):
        raise ValueError(
            f"invalid name {v!r}: use lowercase letters, digits and dashes "
            f"(at most 63, not starting or ending with a dash), e.g. {example}"
        )
    return v


def check_duration(v: str) -> str:
    """A positive duration (``30s``, ``5m``, ``30d``)."""
    parse_duration_ms(v)
    return v


def check_hold_duration(v: str) -> str:
    """A duration that may be zero (``for: 0s``)."""
    parse_duration_ms(v, allow_zero=True)
    return v


def duration_or_none(v: object) -> int | None:
    """Milliseconds of a valid duration, else None (for checks on a raw document)."""
    if not isinstance(v, str):
        return None
    try:
        return parse_duration_ms(v)
    except ValueError:
        return None


def one_or_many(v: object) -> object:
    """Let a filter say ``priority: 0`` as well as ``priority: [0, 1]``."""
    return v if v is None or isinstance(v, list) else [v]


# A positive duration with its unit (a bare number is refused: ``30`` what?).
Duration = Annotated[str, BeforeValidator(unit_required), AfterValidator(check_duration)]
HoldDuration = Annotated[str, BeforeValidator(unit_required), AfterValidator(check_hold_duration)]


class DurationMs:
    """A read-only ``<name>_ms`` attribute: the duration string in ``field`` as integer ms.

    ``long_ms = DurationMs("long")`` on a model with ``long: Duration``.
    """

    __slots__ = ("allow_zero", "field")

    def __init__(self, field: str, *, allow_zero: bool = False) -> None:
        self.field = field
        self.allow_zero = allow_zero

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> DurationMs: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> int: ...
    def __get__(self, obj: object | None, owner: type | None = None) -> DurationMs | int:
        if obj is None:
            return self
        return parse_duration_ms(getattr(obj, self.field), allow_zero=self.allow_zero)
