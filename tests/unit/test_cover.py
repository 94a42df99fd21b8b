"""pipeline.core.cover: which table answers which part of a report's range."""

from __future__ import annotations

import itertools

import pytest

from pipeline.core.cover import HOUR_NS, MINUTE_NS, Cover, cover

S = 1_000_000_000  # ns per second
W = 10 * S  # a base window
T0 = 1_796_400_000 * S  # a whole hour


def _ends(c: Cover) -> list[tuple[int | None, int | None]]:
    return sorted(
        [*c.hours, *c.minutes, *c.windows, *c.rest],
        key=lambda s: -1 if s[0] is None else s[0],
    )


# (name, since, until, closed, window, the cover)
CASES = [
    ("whole hours inside the closed windows", T0, T0 + 2 * HOUR_NS, T0 + 3 * HOUR_NS, W,
     Cover(hours=((T0, T0 + 2 * HOUR_NS),))),
    ("minutes and windows at both ends of the hours", T0 - MINUTE_NS - W,
     T0 + HOUR_NS + MINUTE_NS + W, T0 + 2 * HOUR_NS, W,
     Cover(hours=((T0, T0 + HOUR_NS),),
           minutes=((T0 - MINUTE_NS, T0), (T0 + HOUR_NS, T0 + HOUR_NS + MINUTE_NS)),
           windows=((T0 - MINUTE_NS - W, T0 - MINUTE_NS),
                    (T0 + HOUR_NS + MINUTE_NS, T0 + HOUR_NS + MINUTE_NS + W)))),
    ("cut windows at both ends from requests", T0 + 3 * S, T0 + 2 * MINUTE_NS + 7 * S,
     T0 + HOUR_NS, W,
     Cover(minutes=((T0 + MINUTE_NS, T0 + 2 * MINUTE_NS),),
           windows=((T0 + W, T0 + MINUTE_NS),),
           rest=((T0 + 3 * S, T0 + W), (T0 + 2 * MINUTE_NS, T0 + 2 * MINUTE_NS + 7 * S)))),
    ("what ended after the windows closed from requests", T0, T0 + HOUR_NS,
     T0 + 30 * MINUTE_NS + 2 * W, W,
     Cover(minutes=((T0, T0 + 30 * MINUTE_NS),), windows=((T0 + 30 * MINUTE_NS,
           T0 + 30 * MINUTE_NS + 2 * W),), rest=((T0 + 30 * MINUTE_NS + 2 * W, T0 + HOUR_NS),))),
    ("unbounded: from the first window, and on after the closed ones", None, None,
     T0 + HOUR_NS + W, W,
     Cover(hours=((0, T0 + HOUR_NS),), windows=((T0 + HOUR_NS, T0 + HOUR_NS + W),),
           rest=((T0 + HOUR_NS + W, None),))),
    ("within one window: all from requests", T0 + S, T0 + 9 * S, T0 + HOUR_NS, W,
     Cover(rest=((T0 + S, T0 + 9 * S),))),
    ("no window closed: all from requests", T0, T0 + HOUR_NS, 0, W,
     Cover(rest=((T0, T0 + HOUR_NS),))),
    ("the range after every closed window", T0 + HOUR_NS, None, T0, W,
     Cover(rest=((T0 + HOUR_NS, None),))),
    ("windows that straddle minutes: no rollup", T0, T0 + HOUR_NS, T0 + HOUR_NS, 7 * S,
     Cover(windows=((T0 + 4 * S, T0 + HOUR_NS - 5 * S),),  # (T0 is 3 s past a 7 s edge)
           rest=((T0, T0 + 4 * S), (T0 + HOUR_NS - 5 * S, T0 + HOUR_NS)))),
]  # fmt: skip


@pytest.mark.parametrize(
    ("since", "until", "closed", "window", "want"),
    [pytest.param(*c[1:], id=c[0]) for c in CASES],
)
def test_cover_splits_the_range_by_the_table_that_answers_it(
    since: int | None, until: int | None, closed: int, window: int, want: Cover
) -> None:
    got = cover(since, until, closed_ns=closed, window_ns=window)
    assert got == want
    # the parts are disjoint and together the range
    ends = _ends(got)
    assert ends[0][0] == (since if since is not None else (0 if got.windowed else None))
    assert ends[-1][1] == until
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ends))


@pytest.mark.parametrize(("since", "until"), [(T0, T0 + HOUR_NS), (None, None), (T0 + S, None)])
def test_a_question_the_windows_cannot_answer_is_all_requests(
    since: int | None, until: int | None
) -> None:
    got = cover(since, until, closed_ns=T0 + 2 * HOUR_NS, window_ns=W, windowed=False)
    assert got == Cover(rest=((since, until),))
    assert not got.windowed


def test_a_window_of_no_length_is_refused() -> None:
    with pytest.raises(ValueError, match="window_ns"):
        cover(T0, T0 + HOUR_NS, closed_ns=T0, window_ns=0)
