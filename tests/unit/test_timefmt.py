"""The one time-label formatter: fixed examples, and the forms it replaced, for any instant."""

from __future__ import annotations

import datetime as dt
import zoneinfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.core.timefmt import TimeSpec, iso_time

T = 1_763_316_946.6805  # 2025-11-16T18:15:46.680 UTC
PARIS = zoneinfo.ZoneInfo("Europe/Paris")


@pytest.mark.parametrize(
    ("kwargs", "want"),
    [
        ({}, "2025-11-16T18:15:46.680+00:00"),
        ({"timespec": "seconds"}, "2025-11-16T18:15:46+00:00"),
        ({"timespec": "microseconds"}, "2025-11-16T18:15:46.680500+00:00"),
        ({"tz": PARIS}, "2025-11-16T19:15:46.680+01:00"),
        ({"timespec": "seconds", "sep": " ", "offset": False}, "2025-11-16 18:15:46"),
    ],
)
def test_examples(kwargs: dict[str, object], want: str) -> None:
    assert iso_time(T, **kwargs) == want  # type: ignore[arg-type]


@given(
    unix_s=st.floats(min_value=0, max_value=4_102_444_800, allow_nan=False),
    timespec=st.sampled_from(["seconds", "milliseconds", "microseconds"]),
    tz=st.sampled_from([dt.UTC, PARIS, zoneinfo.ZoneInfo("America/New_York")]),
)
def test_equals_the_forms_it_replaced(unix_s: float, timespec: TimeSpec, tz: dt.tzinfo) -> None:
    at = dt.datetime.fromtimestamp(unix_s, tz=tz)
    assert iso_time(unix_s, timespec=timespec, tz=tz) == at.isoformat(timespec=timespec)
    plain = iso_time(unix_s, timespec="seconds", tz=tz, sep=" ", offset=False)
    assert plain == at.strftime("%Y-%m-%d %H:%M:%S")
