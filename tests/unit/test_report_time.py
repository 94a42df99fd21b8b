"""``report --since/--until``: absolute times (ISO 8601, unix seconds) and times relative
to now (``-1h``, ``1 hour ago``: issue 51 found them refused), parsed by the CLI."""

from __future__ import annotations

import argparse
import datetime as dt

import pytest

from pipeline.app.commands import report as report_cmd
from pipeline.app.commands.report import report_time
from pipeline.cli import build_parser

NOW = dt.datetime(2026, 12, 6, 12, 0, tzinfo=dt.UTC).timestamp()
H = 3600.0


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("2026-12-06T11:00:00Z", NOW - H),
        ("2026-12-06T11:00:00", NOW - H),  # UTC unless it says otherwise
        ("2026-12-06T12:00:00+01:00", NOW - H),
        (str(NOW - H), NOW - H),  # unix seconds
        ("now", NOW),
        ("-1h", NOW - H),
        ("-90m", NOW - 1.5 * H),
        ("-2d", NOW - 48 * H),
        ("-30s", NOW - 30),
        ("-1w", NOW - 7 * 24 * H),
        ("1 hour ago", NOW - H),
        ("3 hours ago", NOW - 3 * H),
        ("15 minutes ago", NOW - 900),
        ("15 min ago", NOW - 900),
        ("2 days ago", NOW - 48 * H),
        ("1 week ago", NOW - 7 * 24 * H),
        ("45 seconds ago", NOW - 45),
        ("1h ago", NOW - H),
        (" 1 Hour Ago ", NOW - H),
    ],
)
def test_report_times(text: str, want: float) -> None:
    assert report_time(text, NOW) == pytest.approx(want)


@pytest.mark.parametrize(
    "text", ["yesterday", "1 fortnight ago", "-h", "1 hour", "+1h", "hour ago", "0h ago"]
)
def test_not_a_time_is_refused_with_examples(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"not a time.*-1h.*1 hour ago"):
        report_time(text, NOW)


@pytest.mark.parametrize(
    ("argv", "ago_s"),
    [
        (["--since", "-1h"], H),
        (["--since=-1h"], H),
        (["--since", "1 hour ago"], H),
        (["--since", "-30m", "--until", "-10m"], 1800),
        (["--sin", "-1h"], H),  # a prefix argparse accepts for --since
        (["--since", "-1h", "--slo", "ttft"], H),
    ],
)
def test_cli_takes_relative_times(
    argv: list[str], ago_s: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--since -1h`` reaches the option (argparse would take ``-1h`` for an option)."""
    monkeypatch.setattr(report_cmd, "clock", lambda: NOW)
    args = build_parser().parse_args(["report", *argv])
    assert args.since == NOW - ago_s


@pytest.mark.parametrize(
    "argv",
    [
        ["--since"],
        ["--since", "--json"],  # an option, not a value: --since has none
        ["--since", "yesterday"],
    ],
)
def test_cli_refuses_a_missing_or_bad_time(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["report", *argv])
