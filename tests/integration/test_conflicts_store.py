"""Issue 36 item 5 on the real engine: conflicting terminal events (a second
``gateway.completed`` with another event id, error 500 where the first said ok) replayed
into a store. Conflicts before the record and after it (a late one corrects the record
emitted) end the same way: the request is stored with its error and flagged
(``requests.conflicts``), the SLOs count it bad, the store still equals an exact count
over ``requests``, the replay counts the conflicts, and ``explain`` shows them. A true
duplicate (the same event again) changes nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from pipeline.adapters.store import open_store
from pipeline.cli import main
from pipeline.settings import DEFAULT_SLO_SPEC, Settings
from pipeline.spec.slo import load_spec_file
from tests.disorder import assert_store_is_exact, write_layout
from tests.measurement_fixtures import load_events, simulate_jsonl

pytestmark = pytest.mark.integration
SPEC = load_spec_file(DEFAULT_SLO_SPEC)
SOON, LATE = 0, 150  # how many events after the original: before its record, after it


def _error_twin(ev: dict[str, Any]) -> dict[str, Any]:
    return ev | {"event_id": ev["event_id"] + "-conflict", "outcome": "error",
                 "http_status": 500, "ttfb_ms": None}  # fmt: skip


def _with_conflicts(events: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Every 25th ok gateway.completed gets an error twin: right after it, its
    engine.finished moved after both (SOON: the conflict comes before the record), or
    LATE events after it (the record was emitted: it is corrected, well within the 15 s
    the join keeps a joined request's events). Every 50th (another set) is repeated
    exactly (a duplicate). Returns the events and, per request with a conflict, SOON or
    LATE."""
    ok = [i for i, e in enumerate(events) if e["kind"] == "gateway.completed"
          and e["outcome"] == "ok" and i + LATE < len(events)]  # fmt: skip
    inserts: dict[int, list[dict[str, Any]]] = {}
    moved: set[int] = set()
    conflicted: dict[str, int] = {}
    for n, i in enumerate(ok):
        ev = events[i]
        rid = ev["request_id"]
        if n % 25 == 0:
            gap = SOON if (n // 25) % 2 else LATE
            inserts.setdefault(i + gap, []).append(_error_twin(ev))
            if gap == SOON:
                f = next(j for j, e in enumerate(events)
                         if e["request_id"] == rid and e["kind"] == "engine.finished")  # fmt: skip
                moved.add(f)
                inserts[i].append(events[f])
            conflicted[rid] = gap
        elif n % 50 == 1:
            inserts.setdefault(i + 5, []).append(dict(ev))
    out: list[dict[str, Any]] = []
    for i, ev in enumerate(events):
        if i not in moved:
            out.append(ev)
        out.extend(inserts.get(i, []))
    return out, conflicted


def test_conflicts_are_kept_counted_and_explained(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = tmp_path / "base.jsonl"
    simulate_jsonl(base, seed=5, limit=1200)
    events, conflicted = _with_conflicts(load_events(base))
    assert {SOON, LATE} == set(conflicted.values())
    path = tmp_path / "events.jsonl"
    write_layout(path, events, "arrays", seed=2)
    store_dir = tmp_path / "store"
    assert main(["replay", str(path), "--store", str(store_dir), "--json"]) == 0
    summary = orjson.loads(capsys.readouterr().out)
    join = summary["join"]
    assert join["conflicts"] == len(conflicted)
    late = sum(gap == LATE for gap in conflicted.values())
    assert join["conflicts_corrected"] == late  # the SOON ones came before their record
    assert join["duplicates"] > 0
    store = open_store(Settings(store_dir=store_dir))
    try:
        rows = store.query_rows(
            "SELECT request_id, outcome, http_status, conflicts FROM tailguard.requests FINAL "
            "WHERE conflicts > 0 OR request_id IN {r:Array(String)}",
            {"r": list(conflicted)},
        )
        assert {r[0]: r[1:] for r in rows} == dict.fromkeys(conflicted, ("error", 500, 1))
        assert_store_is_exact(store, SPEC, summary["slos"])
    finally:
        store.close()
    rid = next(r for r, gap in conflicted.items() if gap == LATE)
    assert main(["explain", rid, "--store", str(store_dir), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["outcome"] == "error"
    assert out["conflicts"] == 1
    assert "conflicting terminal event" in out["conflict_note"]
    bad = [s for s in out["slos"] if s["verdict"] == "bad"]
    assert bad
    assert all("outcome error" in s["reason"] for s in bad)
    assert main(["explain", rid, "--store", str(store_dir)]) == 0
    assert "1 conflicting terminal event" in capsys.readouterr().out
