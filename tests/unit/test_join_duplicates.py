"""A repeated ``event_id`` is a duplicate (ignored); when its content differs from the
event the join holds under that id (a producer reusing ids, or a payload changed on the
way) it is counted as such too: ``JoinCounters.duplicate_ids_changed`` (issue 51: it
was a silent duplicate). Where the join no longer holds the event (a fully joined
request past ``conflict_ttl_ms``) nothing tells: a plain duplicate."""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from pipeline.adapters.telemetry import WorkerTelemetry
from pipeline.adapters.worker_counts import WorkerCounts
from pipeline.contract.codec import encode_batch
from pipeline.core.join import JoinConfig, Joiner
from pipeline.core.processor import StreamProcessor
from pipeline.core.slo_exposition import health_families
from tests.factories import T0_NS, completed, finished, received

GONE_MS = 60_000  # past conflict_ttl_ms: a fully joined request's events are no longer kept

REC = received("r")
REC_OTHER = received("r", priority=3, model="other")  # same id "r:r", other content
OK = completed("r")
OK_OTHER = completed("r", total_ms=900.0)  # same id "r:c", other content
FIN = finished("r")
FIN_OTHER = finished("r", decode_ms=700.0)  # same id "r:f", other content


class _General(Joiner):
    _fast = False


# (case, events ("advance" steps the clock GONE_MS), duplicates, of them with changed content)
CASES: list[tuple[str, list[Any], int, int]] = [
    ("same-completed", [REC, OK, OK], 1, 0),
    ("changed-completed-pending", [REC, OK, OK_OTHER], 1, 1),
    ("changed-finished-pending", [REC, FIN, FIN_OTHER], 1, 1),
    ("same-received-in-flight", [REC, REC], 1, 0),
    ("changed-received-in-flight", [REC, REC_OTHER], 1, 1),
    ("changed-received-pending", [REC, OK, REC_OTHER], 1, 1),
    ("changed-received-joined-kept", [REC, OK, FIN, REC_OTHER], 1, 1),
    ("changed-completed-joined-kept", [REC, OK, FIN, OK_OTHER], 1, 1),
    ("same-completed-joined-kept", [REC, OK, FIN, OK], 1, 0),
    ("changed-finished-joined-kept", [REC, OK, FIN, FIN_OTHER], 1, 1),
    ("changed-completed-partial", [REC, OK, "advance", OK_OTHER], 1, 1),
    ("changed-completed-forgotten", [REC, OK, FIN, "advance", OK_OTHER], 1, 0),
    ("other-id-other-content-is-a-conflict", [REC, OK, completed("r", 90.0, eid="x")], 0, 0),
]


@pytest.mark.parametrize("joiner", [Joiner, _General], ids=["fast", "general"])
@pytest.mark.parametrize(
    ("events", "duplicates", "changed"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_repeated_event_id_with_other_content_is_counted(
    events: list[Any], duplicates: int, changed: int, joiner: type[Joiner]
) -> None:
    j = joiner(JoinConfig(timeout_ms=1_000))
    now_ms = T0_NS // 1_000_000
    for i, ev in enumerate(events):
        if ev == "advance":
            now_ms += GONE_MS
            j.advance_emitted(now_ms)
            continue
        j.add_emitted(ev, i, now_ms=now_ms)
    c = j.counters
    assert (c.duplicates, c.duplicate_ids_changed) == (duplicates, changed)


def _worker_counts() -> tuple[WorkerCounts, WorkerTelemetry]:
    """A worker's counts after one request, its gateway.completed repeated under its id
    twice: once with other content, once the same."""
    processor = StreamProcessor("t", JoinConfig(timeout_ms=60_000))
    processor.init_partition(0)
    batches = [[REC, OK], [OK_OTHER], [OK]]
    processor.process(
        [(0, i, encode_batch(b)) for i, b in enumerate(batches)], wall_ms=T0_NS // 1_000_000
    )
    telemetry = WorkerTelemetry("test")
    counts = WorkerCounts(processor, telemetry)
    counts.count()
    return counts, telemetry


def _health(counts: WorkerCounts) -> dict[str, float]:
    store_up = threading.Event()
    store_up.set()
    return dict(counts.health(0, SimpleNamespace(store_up=store_up)))


def _exposed(counts: WorkerCounts) -> dict[str, float]:
    """/metrics: the counters of the worker's health (name with ``_total``: value)."""
    return {
        f"{f.name}_total": s.value  # type: ignore[union-attr]
        for f in health_families(_health(counts))
        if f.kind == "counter" and "duplicate" in f.name
        for s in f.samples
    }


def _otel(telemetry: WorkerTelemetry) -> dict[str, float]:
    data = telemetry.reader.get_metrics_data()  # type: ignore[attr-defined]
    return {
        f"content={p.attributes['content']}": p.value
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == "tailguard.join.duplicates"
        for p in m.data.data_points
    }


# (where the worker shows it, what it shows)
WORKER: list[tuple[str, Callable[[WorkerCounts, WorkerTelemetry], dict[str, float]], Any]] = [
    ("join-counters", lambda c, _t: {
        "duplicates": c.processor.join_counters().duplicates,
        "changed": c.processor.join_counters().duplicate_ids_changed}, {
        "duplicates": 2, "changed": 1}),
    ("health", lambda c, _t: {k: v for k, v in _health(c).items() if "duplicate" in k}, {
        "join_duplicates": 2, "join_duplicate_ids_changed": 1}),
    ("metrics", lambda c, _t: _exposed(c), {
        "tailguard_worker_join_duplicates_total": 2,
        "tailguard_worker_join_duplicate_ids_changed_total": 1}),
    ("otel", lambda _c, t: _otel(t), {"content=changed": 1, "content=same": 1}),
]  # fmt: skip


@pytest.mark.parametrize(("read", "want"), [w[1:] for w in WORKER], ids=[w[0] for w in WORKER])
def test_the_worker_counts_changed_ids_in_its_metrics(
    read: Callable[[WorkerCounts, WorkerTelemetry], dict[str, float]], want: dict[str, float]
) -> None:
    counts, telemetry = _worker_counts()
    try:
        assert read(counts, telemetry) == want
    finally:
        telemetry.shutdown()
