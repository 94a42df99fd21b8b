"""Write a reshaped copy of an Azure-format trace, for judging control on traffic it
was not tuned on (``python -m tools.dev.make_trace --shape code --out FILE``).

Shapes (:mod:`producers.simulator.trace`): ``code`` (prompts x4 capped at 16,000
tokens, outputs /8), ``rate3`` (3x the rate over the same hour, the trace overlaid
on itself), ``burst`` (a 60 s burst x5 at minute 25). The output has the shipped
trace's header and starts at the source's first timestamp; the same source, shape
and seed always give the same file.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

from pipeline.shipped import DEFAULT_TRACE
from producers.simulator.trace import (
    TRACE_COLUMNS,
    TraceRequest,
    burst_shape,
    code_shape,
    parse_timestamp_ns,
    rate_shape,
    read_trace,
    write_trace,
)

SHAPES: Final[dict[str, Callable[[Sequence[TraceRequest], int], list[TraceRequest]]]] = {
    "code": lambda trace, seed: code_shape(trace, seed=seed),
    "rate3": lambda trace, _seed: rate_shape(trace, times=3),
    "burst": lambda trace, seed: burst_shape(trace, seed=seed),
}


def first_timestamp_ns(path: Path) -> int:
    """The earliest TIMESTAMP of an Azure-format trace (offset 0 of :func:`read_trace`)."""
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        header = [h.strip().lstrip("\ufeff") for h in next(reader)]
        col = header.index(TRACE_COLUMNS[0])
        return min(parse_timestamp_ns(row[col]) for row in reader if row and row[col].strip())


def make_trace(source: Path, shape: str, out: Path, seed: int = 0) -> int:
    """Write ``shape`` of ``source`` to ``out``; the number of requests written."""
    trace = read_trace(source)
    if not trace:
        raise ValueError(f"{source}: no requests")
    shaped = SHAPES[shape](trace, seed)
    write_trace(out, shaped, first_timestamp_ns(source))
    return len(shaped)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tools.dev.make_trace", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--out", type=Path, required=True, help="Azure-format CSV to write")
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="source trace")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    n = make_trace(args.trace, args.shape, args.out, args.seed)
    sys.stderr.write(f"{args.out}: {n} requests ({args.shape} of {args.trace})\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
