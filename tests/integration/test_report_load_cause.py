"""``tailguard report``'s load cause per SLO (issue 35): how much of the bad requests'
time was queueing, by SQL over ``requests`` on the real embedded engine, equals the
core's exact attribution (``SLOEvaluator.attribution``) over the same records."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.adapters.queries.filters import ReportFilter
from pipeline.adapters.queries.requests import bad_time_split
from pipeline.adapters.store import migrate, open_store, write_requests
from pipeline.app.replay import replay_file
from pipeline.contract.codec import encode_event
from pipeline.core.join import JoinConfig
from pipeline.core.slo import SLOEvaluator
from pipeline.settings import DEFAULT_SLO_SPEC, Settings
from pipeline.shipped import DEFAULT_TRACE
from pipeline.spec.slo import SLOSpec, load_spec_file
from producers.simulator.model import OverloadEpisode, SimConfig, Simulator
from producers.simulator.trace import read_trace

pytestmark = pytest.mark.integration

CHAT = SLOSpec.model_validate(
    {
        "apiVersion": "tailguard/v1",
        "kind": "SLOSpec",
        "slos": [
            {"name": "chat-total-400", "boundary": "gateway_total_ms", "threshold_ms": 400,
             "objective": 0.99, "filter": {"stream": True, "priority": [0, 1, 2]},
             "exclude": {"prompt_tokens_over": 4000}, "attempts": "last"},
            {"name": "decode", "boundary": "decode_ms", "threshold_ms": 500, "objective": 0.9},
        ],
    }
)  # fmt: skip


def test_bad_time_split_equals_the_core_attribution(tmp_path: Path) -> None:
    config = SimConfig(
        start_unix_ns=1_800_000_000_000_000_000,
        seed=5,
        overload=OverloadEpisode(60, 240, 4.0),
    )
    events = list(Simulator(read_trace(DEFAULT_TRACE)[:1500], config).events())
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"".join(encode_event(e) + b"\n" for e in events))
    result = replay_file(path, JoinConfig(timeout_ms=5_000))
    records = list(result.records.values())
    assert records
    store = open_store(Settings(store_dir=tmp_path / "store"))
    try:
        migrate(store)
        write_requests(store, records)
        # a threshold exactly at a measured value: strict (op: lt) counts that request bad
        at = next(
            r.gateway_total_ms for r in records
            if r.outcome == "ok" and r.gateway_total_ms and r.queue_ms is not None
        )  # fmt: skip
        at_value = [
            SLOSpec.model_validate(
                {"apiVersion": "tailguard/v1", "kind": "SLOSpec", "slos": [
                    {"name": "at", "boundary": "gateway_total_ms", "threshold_ms": at,
                     "objective": 0.99, "threshold_strict": strict}]}
            )
            for strict in (False, True)
        ]  # fmt: skip
        lte_n = bad_time_split(store, ReportFilter(), at_value[0].slos[0])[0]
        lt_n = bad_time_split(store, ReportFilter(), at_value[1].slos[0])[0]
        assert lt_n > lte_n
        for spec in (load_spec_file(DEFAULT_SLO_SPEC), CHAT, *at_value):
            ev = SLOEvaluator(spec)
            for r in records:
                ev.add(r)
            want = ev.attribution()
            for slo in spec.slos:
                n, queue_ms, bad_ms = bad_time_split(store, ReportFilter(), slo)
                if want[slo.name] == (0.0, 0.0):
                    # a boundary without the queue: the core sums nothing
                    assert slo.boundary in ("tpot_ms", "decode_ms") or n == 0, slo.name
                    continue
                assert n > 0, slo.name
                assert queue_ms == pytest.approx(want[slo.name][0], rel=1e-9), slo.name
                assert bad_ms == pytest.approx(want[slo.name][1], rel=1e-9), slo.name
    finally:
        store.close()
