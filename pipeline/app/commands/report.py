"""``report``: the SLO report from the store, as text, JSON or HTML."""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import Final

import orjson

from pipeline.app.commands.common import Command, add_store, load_spec
from pipeline.app.commands.settings import worker_settings
from pipeline.spec.durations import UNIT_MS, parse_duration_ms

clock = time.time  # the now of relative times (a test sets its own)
# ``<n> <unit> ago``: the unit words a person writes, in tailguard's duration units
_AGO: Final = re.compile(r"^([0-9]+) ?([a-z]+) ago$")
_AGO_UNITS: Final = {
    **{u: u for u in UNIT_MS},
    **dict.fromkeys(("sec", "secs", "second", "seconds"), "s"),
    **dict.fromkeys(("min", "mins", "minute", "minutes"), "m"),
    **dict.fromkeys(("hr", "hrs", "hour", "hours"), "h"),
    **dict.fromkeys(("day", "days"), "d"),
    **dict.fromkeys(("week", "weeks"), "w"),
}


def report_time(text: str, now_unix_s: float) -> float:
    """``--since/--until`` as unix seconds: ISO 8601 (UTC unless it says otherwise), unix
    seconds, or relative to ``now_unix_s``: ``now``, ``-1h`` (a duration: ms s m h d w),
    ``1 hour ago`` (seconds, minutes, hours, days, weeks; ``1h ago`` too)."""
    import datetime as dt

    t = text.strip().lower()
    ago: str | None = None
    if t == "now":
        return now_unix_s
    if t.startswith("-") and t[1:2].isdigit() and not t[-1:].isdigit():
        ago = t[1:]
    elif m := _AGO.match(t):
        unit = _AGO_UNITS.get(m.group(2))
        ago = None if unit is None else f"{m.group(1)}{unit}"
    if ago is not None:
        try:
            return now_unix_s - parse_duration_ms(ago) / 1000
        except ValueError:
            pass
    else:
        try:
            return float(text)
        except ValueError:
            pass
        try:
            at = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
        except ValueError:
            pass
        else:
            return (at if at.tzinfo else at.replace(tzinfo=dt.UTC)).timestamp()
    raise argparse.ArgumentTypeError(
        f"not a time: {text!r} (ISO 8601, e.g. 2026-12-01T20:06:00; unix seconds; or "
        "relative to now: -1h, 1 hour ago, 30m ago, now)"
    )


def _report_time(text: str) -> float:
    return report_time(text, clock())


def cmd_report(args: argparse.Namespace) -> int:
    from pipeline.adapters.queries.filters import ReportFilter
    from pipeline.adapters.query_server import open_reader
    from pipeline.app.report import print_wide, read_report, render

    flt = ReportFilter(args.since, args.until, args.model, tuple(args.slo or ()))
    settings = worker_settings(args)
    spec = load_spec(settings.slo_spec)
    store = open_reader(settings)  # through a live worker's port if one owns it
    try:
        report = read_report(store, flt, spec)
        html_data = None
        if args.html is not None or args.json:
            from pipeline.app.report_html import read_html_data

            html_data = read_html_data(store, flt, spec)
        if args.html is not None:
            from pipeline.app.report_html import render_html

            args.html.write_text(render_html(report, html_data), encoding="utf-8")
            print(f"HTML report: {args.html}", file=sys.stderr)
    finally:
        store.close()
    if args.json:
        from pipeline.app.report_html import series_json

        print(orjson.dumps(report.to_json() | {"series": series_json(html_data)}).decode())
    else:
        print_wide(render(report))
    return 0


def _arguments(s: argparse.ArgumentParser) -> None:
    add_store(s)
    s.add_argument("--json", action="store_true", help="everything, as one JSON object")
    s.add_argument("--html", type=Path, help="also write a self-contained HTML report with charts")
    when = "ISO 8601, unix s, or relative: -1h, '1 hour ago'"
    s.add_argument("--since", type=_report_time, help=f"from this time ({when})")
    s.add_argument("--until", type=_report_time, help=f"before this time ({when})")
    s.add_argument(
        "--model",
        help="only this model: its requests, latency, SLOs (recounted over its requests), "
        "budget events of the SLOs that select it, its control scope",
    )
    s.add_argument("--slo", action="append", help="only this SLO (repeatable)")


REPORT = Command(
    "report",
    "print the SLO report from the store",
    _arguments,
    cmd_report,
    dash_values=("--since", "--until"),  # "--since -1h": -1h is the option's value
)
