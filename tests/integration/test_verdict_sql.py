"""An SLO's verdict as SQL (``verdict_sql``: what ``tailguard report`` counts in the
engine, issue 53) equals the core's :meth:`SLOMatcher.classify` record by record, on the
real embedded engine: simulated records, each varied on what the rules read (outcome,
source, a missing value, tenant, stream, priority, prompt size, superseded), counted by
each SLO of a table that takes every branch of the rules."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import msgspec
import pytest

from pipeline.adapters.queries.filters import verdict_sql
from pipeline.adapters.store import migrate, open_store, write_requests
from pipeline.app.replay import replay_file
from pipeline.contract.codec import encode_event
from pipeline.core.join import JoinConfig
from pipeline.core.record import RequestRecord
from pipeline.core.slo import SLOMatcher
from pipeline.settings import Settings
from pipeline.shipped import DEFAULT_TRACE
from pipeline.spec.slo import SLOSpec
from producers.simulator.model import OverloadEpisode, SimConfig, Simulator
from producers.simulator.trace import read_trace

pytestmark = pytest.mark.integration

# (name, SLO fields beyond name/objective): every branch of pipeline.core.slo's rules
SLOS: list[tuple[str, dict[str, Any]]] = [
    ("total", {"boundary": "gateway_total_ms", "threshold_ms": 400}),
    ("total-strict", {"boundary": "gateway_total_ms", "threshold_ms": 400,
                      "threshold_strict": True}),
    ("ttfb-lower-bound", {"boundary": "gateway_ttfb_ms", "threshold_ms": 150}),
    ("overhead-both", {"boundary": "gateway_overhead_ms", "threshold_ms": 5}),
    ("inference-engine", {"boundary": "inference_ms", "threshold_ms": 300}),
    ("errors-excluded", {"boundary": "gateway_total_ms", "threshold_ms": 400,
                         "errors": "exclude"}),
    ("aborts-excluded", {"boundary": "gateway_total_ms", "threshold_ms": 400,
                         "client_abort": "exclude"}),
    ("last-attempt", {"boundary": "gateway_total_ms", "threshold_ms": 400,
                      "attempts": "last"}),
    ("selected", {"boundary": "gateway_ttfb_ms", "threshold_ms": 200,
                  "filter": {"priority": [0, 1], "tenant": ["acme"], "stream": True},
                  "exclude": {"prompt_tokens_over": 2000}}),
    ("not-stream", {"boundary": "queue_ms", "threshold_ms": 50,
                    "filter": {"stream": False, "ctx_bucket": ["<512", "512-4k"]}}),
]  # fmt: skip


def _vary(r: RequestRecord, rng: random.Random) -> RequestRecord:
    """The record with what the rules read varied (a value at a time)."""
    change: dict[str, Any] = {}
    roll = rng.random()
    if roll < 0.15:
        change["outcome"] = rng.choice(["error", "timeout", "rejected", "client_abort", "odd"])
    if rng.random() < 0.2:
        change["source"] = rng.choice(["joined", "gateway_only", "engine_only"])
    if rng.random() < 0.15:
        change[rng.choice(["gateway_ttfb_ms", "gateway_total_ms", "inference_ms"])] = None
    change["tenant"] = rng.choice(["acme", "globex", None])
    change["stream"] = rng.choice([True, False, None])
    if rng.random() < 0.2:
        change["priority"] = rng.choice([None, 0, 3])
    if rng.random() < 0.2:
        change["prompt_tokens"] = rng.choice([None, 1999, 2000, 2001])
    change["superseded"] = rng.random() < 0.1
    return msgspec.structs.replace(r, **change)


def test_verdict_sql_equals_the_core_classify(tmp_path: Path) -> None:
    config = SimConfig(
        start_unix_ns=1_800_000_000_000_000_000, seed=7, overload=OverloadEpisode(60, 240, 4.0)
    )
    events = list(Simulator(read_trace(DEFAULT_TRACE)[:1500], config).events())
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"".join(encode_event(e) + b"\n" for e in events))
    rng = random.Random(11)
    records = [
        _vary(r, rng) for r in replay_file(path, JoinConfig(timeout_ms=5_000)).records.values()
    ]
    spec = SLOSpec.model_validate({
        "apiVersion": "tailguard/v1", "kind": "SLOSpec",
        "slos": [{"name": n, "objective": 0.99, **fields} for n, fields in SLOS],
    })  # fmt: skip
    store = open_store(Settings(store_dir=tmp_path / "store"))
    try:
        migrate(store)
        write_requests(store, records)
        for slo in spec.slos:
            classify = SLOMatcher(slo).classify
            verdicts = [classify(r) for r in records]
            want = (sum(v != "skip" for v in verdicts), verdicts.count("good"))
            counted, good, bound = verdict_sql(slo, "t_")
            ((got_counted, got_good),) = store.query_rows(
                f"SELECT countIf({counted}), countIf({good}) FROM tailguard.requests FINAL",
                bound,
            )
            assert (int(got_counted), int(got_good)) == want, slo.name
            # the table reaches the branch it names: something counted, something not
            assert 0 < want[0] < len(records), slo.name
    finally:
        store.close()


@pytest.fixture(scope="module")
def retried(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store of the simulator's retrying clients (priorities 2-3 shed, retried)."""
    from pipeline.cli import BACKTEST_START_UNIX_NS
    from producers.simulator.gate import GatewayGate, directive_of
    from tests.measurement_fixtures import replay_events

    gate = GatewayGate()
    gate.set("*", directive_of(1, "degraded",
                               {"shed_priorities_at_or_above": 2, "retry_after_s": 1}))  # fmt: skip
    sim = Simulator(read_trace(DEFAULT_TRACE)[:400],
                    SimConfig(start_unix_ns=BACKTEST_START_UNIX_NS, seed=5), gate)  # fmt: skip
    return replay_events(tmp_path_factory.mktemp("retried"), list(sim.events()))


@pytest.mark.parametrize("part", [(0.0, 1.0), (0.3, 0.6), (0.5, 1.0)])
def test_logical_counts_equal_the_core_over_every_row(
    retried: Path, part: tuple[float, float]
) -> None:
    """``read_logical`` (the one-attempt requests counted in the engine, the others by the
    core) equals the core's rule over every stored row, over the whole data and a part
    of it (chains cut by the range's edges)."""
    from pipeline.adapters.queries.filters import ReportFilter
    from pipeline.adapters.store import REQUEST_COLUMNS, record_from_row
    from pipeline.app.report import read_logical
    from pipeline.core.logical import counts, logical_requests
    from pipeline.settings import DEFAULT_SLO_SPEC
    from pipeline.spec.slo import load_spec_file

    spec = load_spec_file(DEFAULT_SLO_SPEC)
    store = open_store(Settings(store_dir=retried))
    try:
        names = ", ".join(n for n, _ in REQUEST_COLUMNS)
        rows = store.query_rows(f"SELECT {names} FROM tailguard.requests FINAL")
        ((lo_ns, hi_ns),) = store.query_rows(
            "SELECT min(end_unix_ns), max(end_unix_ns) + 1 FROM tailguard.requests"
        )
        a_ns = int(lo_ns + part[0] * (hi_ns - lo_ns))
        b_ns = int(lo_ns + part[1] * (hi_ns - lo_ns))
        kept = [
            lr
            for lr in logical_requests(record_from_row(r) for r in rows)
            if a_ns <= lr.record.end_unix_ns < b_ns
        ]
        want = counts(spec, kept)
        got = read_logical(store, ReportFilter(a_ns / 1e9, b_ns / 1e9), spec)
    finally:
        store.close()
    assert want["retried"] > 0
    assert got == want
