"""``report``: the SLO report from the store, as text, JSON or HTML."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson

from pipeline.app.commands.common import Command, add_store, load_spec
from pipeline.app.commands.settings import worker_settings


def _report_time(text: str) -> float:
    """``--since/--until``: ISO 8601 (UTC unless it says otherwise) or unix seconds."""
    import datetime as dt

    try:
        return float(text)
    except ValueError:
        pass
    try:
        t = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a time: {text!r} (ISO 8601, e.g. 2026-12-01T20:06:00, or unix seconds)"
        ) from None
    return (t if t.tzinfo else t.replace(tzinfo=dt.UTC)).timestamp()


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
    s.add_argument("--since", type=_report_time, help="from this time (ISO 8601 or unix s)")
    s.add_argument("--until", type=_report_time, help="before this time (ISO 8601 or unix s)")
    s.add_argument(
        "--model",
        help="only this model: its requests, latency, SLOs (recounted over its requests), "
        "budget events of the SLOs that select it, its control scope",
    )
    s.add_argument("--slo", action="append", help="only this SLO (repeatable)")


REPORT = Command("report", "print the SLO report from the store", _arguments, cmd_report)
