"""Client retries reusing a request id are attempts (issue 12 item 10): the join records
each attempt, routes terminal events to the right one, marks a failed attempt the client
retried as superseded, and SLOs count every attempt or the last as their spec says."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pipeline.contract.codec import encode_event
from pipeline.contract.events import LifecycleEvent
from pipeline.core.join import JoinConfig, Joiner
from pipeline.core.processor import StreamProcessor
from pipeline.core.record import RequestRecord
from pipeline.core.slo import SLOEvaluator
from pipeline.core.windows import WindowConfig
from pipeline.spec.slo import load_spec
from tests.factories import completed, finished, received

R = "req-1"


def r(n: int, t: float) -> LifecycleEvent:
    return received(R, t, eid=f"r{n}")


def c(n: int, t: float, *, total: float = 100.0, status: int = 200) -> LifecycleEvent:
    outcome = "ok" if status == 200 else ("client_abort" if status == 0 else "error")
    return completed(R, t, total_ms=total, http_status=status, outcome=outcome, eid=f"c{n}")


def f(n: int, t: float, *, decode: float = 70.0) -> LifecycleEvent:
    return finished(R, t, decode_ms=decode, eid=f"f{n}")


def run(events: list[LifecycleEvent]) -> tuple[list[RequestRecord], Joiner]:
    """Every record the join emits (upgrades included), after draining."""
    j = Joiner(JoinConfig(timeout_ms=15_000))
    out = []
    for i, ev in enumerate(events):
        e = j.add_emitted(ev, i)
        if e is not None:
            out.append(e.record)
    out.extend(e.record for e in j.drain_emitted())
    return out, j


def final(records: list[RequestRecord]) -> dict[int, tuple[str, str, bool]]:
    """Attempt -> (source, outcome, superseded) of its last version."""
    best: dict[int, RequestRecord] = {}
    for rec in records:
        if rec.attempt not in best or rec.version >= best[rec.attempt].version:
            best[rec.attempt] = rec
    return {a: (x.source, x.outcome, x.superseded) for a, x in sorted(best.items())}


@dataclass(frozen=True)
class Case:
    name: str
    events: list[LifecycleEvent]
    want: dict[int, tuple[str, str, bool]]
    attempts: int  # counter: retries seen
    duplicates: int = 0


CASES = [
    Case(
        "502 then 200: both attempts joined, the failed one superseded",
        [r(1, 0), f(1, 5, decode=1), c(1, 20, total=20, status=502),
         r(2, 500), f(2, 1400), c(2, 1500, total=1000)],
        {1: ("joined", "error", True), 2: ("joined", "ok", False)},
        attempts=1,
    ),
    Case(
        "no retry: one attempt as before",
        [r(1, 0), f(1, 98), c(1, 100)],
        {1: ("joined", "ok", False)},
        attempts=0,
    ),
    Case(
        "a repeated received is a duplicate, not an attempt (before and after a retry)",
        [r(1, 0), r(1, 0), f(1, 5, decode=1), c(1, 20, total=20, status=502),
         r(2, 500), r(1, 0), r(2, 500), f(2, 1400), c(2, 1500, total=1000)],
        {1: ("joined", "error", True), 2: ("joined", "ok", False)},
        attempts=1,
        duplicates=3,
    ),
    Case(
        "a fast 502 never reached the engine: the engine run goes to the retry",
        [r(1, 0), c(1, 3, total=3, status=502), r(2, 400), f(2, 1300), c(2, 1400, total=1000)],
        {1: ("gateway_only", "error", True), 2: ("joined", "ok", False)},
        attempts=1,
    ),
    Case(
        "client gave up; its engine run reports after the retry started",
        [r(1, 0), c(1, 500, total=500, status=0), r(2, 600), f(1, 505, decode=400),
         f(2, 1500), c(2, 1600, total=1000)],
        {1: ("joined", "client_abort", True), 2: ("joined", "ok", False)},
        attempts=1,
    ),
    Case(
        "a success retried anyway is not superseded (only failures are)",
        [r(1, 0), f(1, 98), c(1, 100), r(2, 500), f(2, 598), c(2, 600)],
        {1: ("joined", "ok", False), 2: ("joined", "ok", False)},
        attempts=1,
    ),
    Case(
        "three attempts: two failures then a success",
        [r(1, 0), c(1, 3, total=3, status=503), r(2, 100), c(2, 103, total=3, status=503),
         r(3, 300), f(3, 1200), c(3, 1300, total=1000)],
        {1: ("gateway_only", "error", True), 2: ("gateway_only", "error", True),
         3: ("joined", "ok", False)},
        attempts=2,
    ),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_attempts(case: Case) -> None:
    records, j = run(case.events)
    assert final(records) == case.want
    assert {rec.request_id for rec in records} == {R}
    assert j.counters.attempts == case.attempts
    assert j.counters.duplicates == case.duplicates
    assert j.counters.conflicts == 0


def test_a_retry_supersedes_a_failed_attempt_already_windowed() -> None:
    """Attempt 1 joined and emitted; the retry re-emits it superseded, replacing it."""
    j = Joiner(JoinConfig())
    for i, ev in enumerate([r(1, 0), f(1, 5, decode=1), c(1, 20, total=20, status=502)]):
        first = j.add_emitted(ev, i)
    assert first is not None
    assert not first.record.superseded
    again = j.add_emitted(r(2, 500), 3)
    assert again is not None
    assert again.upgrade
    assert again.previous == first.record
    assert (again.record.superseded, again.record.attempt) == (True, 1)
    assert again.record.version > first.record.version
    assert j.counters.superseded == 1


SPEC = load_spec(
    """
apiVersion: tailguard/v1
kind: SLOSpec
slos:
  - {name: every, boundary: gateway_total_ms, threshold_ms: 2000, objective: 0.9}
  - {name: last, boundary: gateway_total_ms, threshold_ms: 2000, objective: 0.9,
     attempts: last}
"""
)


def test_slo_counts_every_attempt_or_the_last() -> None:
    records, _ = run(CASES[0].events)
    finals = {}
    for rec in records:
        if rec.attempt not in finals or rec.version >= finals[rec.attempt].version:
            finals[rec.attempt] = rec
    ev = SLOEvaluator(SPEC)
    for rec in finals.values():
        ev.add(rec)
    counts = {name: (c.total, c.good) for name, c in ev.counts().items()}
    assert counts == {"every": (2, 1), "last": (1, 1)}


def test_windows_count_the_superseded_attempt_out_of_last_attempt_slos() -> None:
    """Through the processor (join, windows, corrections): what the windows say for each
    SLO equals an exact count over the final records, whichever order attempts resolve."""
    events = [
        *CASES[0].events,
        # a second request: attempt 1 resolves (timeout) after the retry joined
        received("req-2", 0, eid="x1"),
        completed("req-2", 3, total_ms=3, http_status=502, outcome="error", eid="y1"),
        received("req-2", 100, eid="x2"),
        finished("req-2", 1000, eid="z2"),
        completed("req-2", 1100, total_ms=1000, eid="y2"),
    ]
    events.sort(key=lambda e: e.ts_unix_ns)
    proc = StreamProcessor(
        "t",
        JoinConfig(timeout_ms=15_000),
        window_config=WindowConfig(size_ms=10_000, grace_ms=0),
        slo_factory=lambda: SLOEvaluator(SPEC),
    )
    out = proc.process([(0, i, encode_event(ev)) for i, ev in enumerate(events)], None)
    rest = proc.drain()
    windows = out.windows + rest.windows
    got: dict[str, list[int]] = {"every": [0, 0], "last": [0, 0]}
    for w in windows:
        assert w.slos is not None
        for name, cnt in w.slos.counts().items():
            got[name][0] += cnt.total
            got[name][1] += cnt.good
    recs: dict[tuple[str, int], RequestRecord] = {}
    for rec in out.records + rest.records:
        k = (rec.request_id, rec.attempt)
        if k not in recs or rec.version >= recs[k].version:
            recs[k] = rec
    exact = SLOEvaluator(SPEC)
    for rec in recs.values():
        exact.add(rec)
    assert {n: (cc.total, cc.good) for n, cc in exact.counts().items()} == {
        n: tuple(v) for n, v in got.items()
    }
    assert got == {"every": [4, 2], "last": [2, 2]}
