"""``tailguard replay``: the same core as the worker, over a JSON Lines file.

Each line is one message (an event object or an array of events), exactly as
it would sit on the lifecycle topic. Time is the events' own event time; at
the end of the input everything still pending is resolved as if its timeout
had passed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson

from pipeline.contract.codec import dead_letter_record
from pipeline.core.join import JoinConfig
from pipeline.core.processor import StreamProcessor
from pipeline.core.record import BOUNDARIES, RequestRecord
from pipeline.report import exact_quantile

REPLAY_QUANTILES = {"p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99, "p999": 0.999}


@dataclass
class ReplayResult:
    records: list[RequestRecord] = field(default_factory=list)
    dead_letters: int = 0
    counters: dict[str, int] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        boundaries: dict[str, Any] = {}
        for b in BOUNDARIES:
            vals = sorted(v for r in self.records if (v := r.boundary(b)) is not None)
            entry: dict[str, Any] = {"count": len(vals)}
            for k, q in REPLAY_QUANTILES.items():
                entry[k] = exact_quantile(vals, q) if vals else None
            boundaries[b] = entry
        outcomes: dict[str, int] = {}
        for r in self.records:
            outcomes[r.outcome] = outcomes.get(r.outcome, 0) + 1
        return {
            "requests": len(self.records),
            "dead_letters": self.dead_letters,
            "outcomes": dict(sorted(outcomes.items())),
            "boundaries": boundaries,
            "join": self.counters,
        }


def _lines(fh: IO[bytes]) -> Iterator[tuple[int, int, bytes]]:
    for lineno, line in enumerate(fh, start=1):
        raw = line.rstrip(b"\r\n")
        if raw.strip():
            yield (0, lineno, raw)


def replay_file(
    path: Path,
    join_config: JoinConfig | None = None,
    dlq_out: IO[bytes] | None = None,
    chunk: int = 1000,
) -> ReplayResult:
    proc = StreamProcessor(str(path), join_config)
    result = ReplayResult()
    with path.open("rb") as fh:
        batch: list[tuple[int, int, bytes]] = []
        for msg in _lines(fh):
            batch.append(msg)
            if len(batch) >= chunk:
                _feed(proc, batch, result, dlq_out)
                batch = []
        _feed(proc, batch, result, dlq_out)
    result.records.extend(proc.drain())
    j = proc.join_counters()
    result.counters = {name: getattr(j, name) for name in j.__slots__}
    return result


def _feed(
    proc: StreamProcessor,
    batch: list[tuple[int, int, bytes]],
    result: ReplayResult,
    dlq_out: IO[bytes] | None,
) -> None:
    out = proc.process(batch, wall_ms=None)  # event time only in a replay
    result.records.extend(out.records)
    result.dead_letters += len(out.dead)
    if dlq_out is not None:
        for d in out.dead:
            dlq_out.write(orjson.dumps(dead_letter_record(d)) + b"\n")
