"""``explain``, ``capacity``, ``sql``: the operator's questions to the store.

Each reads the store named by ``--store DIR`` (or ``TAILGUARD_STORE_DIR``, or
the server of ``TAILGUARD_CLICKHOUSE_URL``); with the embedded store and a
live worker owning the directory, through the worker's read-only query port
(:mod:`pipeline.adapters.query_server`).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

import orjson

from pipeline.app.commands.common import Command, add_store
from pipeline.app.commands.settings import worker_settings


def _fail(args: argparse.Namespace, message: str) -> int:
    print(f"tailguard {args.command}: {message}", file=sys.stderr)
    return 1


def cmd_explain(args: argparse.Namespace) -> int:
    from pipeline.adapters.query_server import open_reader
    from pipeline.adapters.store import StoreError
    from pipeline.app.explain import NotFoundError, explain_request, render, to_json
    from pipeline.app.report import print_wide
    from pipeline.spec.loader import SpecError
    from pipeline.spec.slo import load_spec_file

    settings = worker_settings(args)
    spec_path = args.slo or settings.slo_spec
    if spec_path is None:
        return _fail(args, "no SLO spec: pass --slo or set TAILGUARD_SLO_SPEC")
    if not Path(spec_path).is_file():
        return _fail(args, f"no SLO spec at {spec_path}")
    try:
        spec = load_spec_file(spec_path)
    except SpecError as exc:
        return _fail(args, f"invalid SLO spec:\n{exc}")
    try:
        store = open_reader(settings)
    except StoreError as exc:
        return _fail(args, str(exc))
    try:
        explanation, events = explain_request(store, args.request_id, spec)
    except NotFoundError:
        return _fail(args, f"no request {args.request_id!r} in the store")
    finally:
        store.close()
    if args.json:
        print(orjson.dumps(to_json(explanation, events)).decode())
    else:
        print_wide(render(explanation, events))
    return 0


def cmd_capacity(args: argparse.Namespace) -> int:
    from pipeline.adapters.query_server import open_reader
    from pipeline.adapters.store import StoreError
    from pipeline.app.capacity import capacity, render, to_json
    from pipeline.app.report import print_wide

    settings = worker_settings(args)
    try:
        store = open_reader(settings)
    except StoreError as exc:
        return _fail(args, str(exc))
    try:
        models = capacity(
            store,
            target_p99_ms=args.p99_ms,
            boundary=args.boundary,
            target_qps=args.qps or (),
            bucket_ms=args.bucket_s * 1000,
            min_requests=args.min_requests,
            utilisation=args.utilisation,
            model=args.model,
        )
    except ValueError as exc:
        return _fail(args, str(exc))
    finally:
        store.close()
    if args.json:
        print(orjson.dumps(to_json(models, args.boundary)).decode())
    else:
        print_wide(render(models, args.boundary))
    return 0


def cmd_sql(args: argparse.Namespace) -> int:
    from pipeline.adapters.query_server import read_only_client
    from pipeline.adapters.store import StoreError
    from pipeline.app.report import print_wide
    from pipeline.app.sql import clean_error, render, run, run_raw, to_json, to_tsv, user_format

    settings = worker_settings(args)
    own_format = user_format(args.query)
    try:
        with read_only_client(settings) as client:
            if own_format is not None:  # the query names its format: the engine's bytes
                raw = run_raw(client, args.query)
            else:
                names, rows = run(client, args.query)
    except StoreError as exc:
        return _fail(args, str(exc))
    except Exception as exc:  # the engine's refusal or error, as ClickHouse words it
        return _fail(args, clean_error(str(exc)))
    if own_format is not None:
        sys.stdout.buffer.write(raw)
        sys.stdout.flush()
    elif args.format == "json":
        print(orjson.dumps(to_json(names, rows)).decode())
    elif args.format == "tsv":
        sys.stdout.write(to_tsv(names, rows))
    else:
        print_wide(render(names, rows))
    return 0


def _number(lo: float, hi: float | None = None, *, lo_open: bool = True) -> Any:
    """An argparse type: a float in (lo, hi] (or [lo, hi] with ``lo_open=False``)."""

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        low_ok = v > lo if lo_open else v >= lo
        if not (low_ok and (hi is None or v <= hi)) or math.isnan(v):
            bound = f"{'>' if lo_open else '>='} {lo:g}" + ("" if hi is None else f" and <= {hi:g}")
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text}")
        return v

    return parse


def _count(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return v


def _explain_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("request_id")
    add_store(s)
    s.add_argument("--slo", type=Path, help="SLO spec (default: TAILGUARD_SLO_SPEC)")
    s.add_argument("--json", action="store_true")


def _capacity_arguments(s: argparse.ArgumentParser) -> None:
    add_store(s)
    s.add_argument(
        "--p99-ms", type=_number(0), default=300.0, help="P99 target (default 300, the documents')"
    )
    s.add_argument(
        "--boundary",
        default="ttft_engine_ms",
        help="boundary of the target (default ttft_engine_ms: queue + prefill)",
    )
    s.add_argument(
        "--qps",
        type=_number(0),
        action="append",
        help="target QPS (repeatable; default: peak seen)",
    )
    s.add_argument(
        "--utilisation",
        type=_number(0, 1),
        default=0.7,
        help="load ceiling in (0, 1] (default 0.7)",
    )
    s.add_argument(
        "--bucket-s", type=_number(0), default=10.0, help="measurement bucket (seconds, > 0)"
    )
    s.add_argument("--min-requests", type=_count, default=100, help="per level, to be chosen")
    s.add_argument("--model", help="only this model")
    s.add_argument("--json", action="store_true")


def _sql_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("query")
    add_store(s)
    s.add_argument(
        "--format",
        choices=("table", "tsv", "json"),
        default="table",
        help="output (a query ending in its own FORMAT X is printed as the engine writes it)",
    )


EXPLAIN = Command(
    "explain",
    "one request: timeline, breakdown, SLO verdicts, control level",
    _explain_arguments,
    cmd_explain,
)
CAPACITY = Command(
    "capacity",
    "throughput per instance at the concurrency that holds a P99, instances needed",
    _capacity_arguments,
    cmd_capacity,
)
SQL = Command("sql", "read-only SQL against the store", _sql_arguments, cmd_sql)
