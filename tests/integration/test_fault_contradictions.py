"""Issue 12 item 11 on the real broker: contradictory events are stored, flagged and
counted, and change no other request."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.adapters.store import open_store
from tests.integration.faults import lifecycle_events, produce_batches
from tests.integration.harness import make_settings, run_until_caught_up

pytestmark = [pytest.mark.integration, pytest.mark.long(40)]


def test_contradictory_events_are_flagged_and_counted(kafka, tmp_path: Path) -> None:
    s = make_settings(kafka.bootstrap_servers, tmp_path)
    events = lifecycle_events(300, seed=51)
    bad: dict[str, str] = {}
    out = []
    for original in events:
        ev = original
        rid = ev.request_id
        n = int(rid.rsplit("-", 1)[1])
        if ev.kind == "gateway.completed" and n % 50 == 7 and ev.ttfb_ms is not None:
            ev = ev.model_copy(update={"ttfb_ms": ev.total_ms + 5.0})
            bad[rid] = "ttfb_gt_total"
        elif ev.kind == "engine.finished" and n % 50 == 9:
            ev = ev.model_copy(update={"e2e_ms": ev.inference_ms / 2})
            bad[rid] = "e2e_lt_inference"
        out.append(ev)
    assert len(bad) >= 8
    produce_batches(s, out)
    log_text = run_until_caught_up(s, tmp_path / "worker.log")
    assert f"flagged={len(bad)}" in log_text[-20_000:]
    store = open_store(s)
    try:
        rows = store.query_rows(f"SELECT request_id, flags FROM {s.database}.requests FINAL")
    finally:
        store.close()
    assert len(rows) == 300  # kept, not dropped
    flagged = {rid: flags for rid, flags in rows if flags}
    assert {rid: flags[0] for rid, flags in flagged.items()} == bad
