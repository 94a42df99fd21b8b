"""Issue 11 on files: the store equals an exact count over `requests`, whatever the disorder.

Each scenario takes simulated traffic from the shared trace, makes it messy on purpose,
replays it (the same core as the worker) into a real embedded ClickHouse store, and
compares every window, key, boundary and SLO of the store with an exact computation
over ``requests`` FINAL (``tests/disorder.py``). The same events in three file layouts
give the same store.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.adapters.store import open_store
from pipeline.app.replay import replay_file
from pipeline.app.report import read_report
from pipeline.settings import DEFAULT_SLO_SPEC, Settings
from pipeline.spec.slo import load_spec_file
from tests.disorder import (
    HOUR_NS,
    YEAR_NS,
    assert_store_is_exact,
    delay,
    duplicate,
    skew_host,
    stamp_request,
    write_layout,
)
from tests.measurement_fixtures import load_events, replay_into, simulate_jsonl

pytestmark = [pytest.mark.integration, pytest.mark.long(45)]
SPEC = load_spec_file(DEFAULT_SLO_SPEC)


@pytest.fixture(scope="module")
def base_events(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    path = tmp_path_factory.mktemp("base") / "events.jsonl"
    simulate_jsonl(path, seed=11, limit=3000)
    return load_events(path)


def _messy(events: list[dict]) -> list[dict]:
    """Delays first (they change the order events reach the stream, by true time), then
    wrong clocks (they change the stamps only), then duplicates."""
    rids = sorted({e["request_id"] for e in events if e["request_id"]})
    # partners up to the join timeout apart: 3 % of engine reports 14 s behind
    ev = delay(events, lambda e: e["kind"] == "engine.finished" and hash(e["request_id"]) % 33 == 0,
               14_000)  # fmt: skip
    # a producer holding one engine's events for 60 s
    ev = delay(ev, lambda e: e["host"] == "llama-3-8b-1" and e["kind"] != "engine.stats", 60_000)
    ev = stamp_request(ev, rids[len(rids) // 3], HOUR_NS)  # one request an hour ahead
    ev = stamp_request(ev, rids[len(rids) // 2], YEAR_NS)  # one a year ahead
    ev = skew_host(ev, "gateway-1", -300_000)  # one gateway 5 minutes slow
    ev = skew_host(ev, "gateway-0", 30_000)  # one 30 s fast
    return duplicate(ev, 0.01, seed=7)  # 1 % duplicates at random positions


@pytest.mark.parametrize("layout", ["lines", "arrays", "stats"])
def test_messy_traffic_store_equals_exact_count(
    layout: str, base_events: list[dict], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = tmp_path / f"messy-{layout}.jsonl"
    write_layout(events, _messy(base_events), layout, seed=3)
    out = replay_into(tmp_path / "store", events, capsys)
    # the two requests stamped ahead are quarantined, nothing else is dropped
    assert out["windows"]["quarantined_events"] == 6
    assert out["windows"]["corrected_records"] > 0  # the 5-minute-slow gateway's partials...
    store = open_store(Settings(store_dir=tmp_path / "store"))
    try:
        # replay --json, the store's rollups and the exact count agree per SLO
        assert_store_is_exact(store, SPEC, out["slos"])
        n = store.query_rows("SELECT count() FROM tailguard.requests FINAL")[0][0]
        assert n == out["requests"] == 2998
        # the report shows each engine's clock against each gateway's (never corrected):
        # gateway-1 5 min slow (engines ahead of it), gateway-0 30 s fast (engines behind)
        skew = read_report(store).clock_skew
        assert len(skew) == 8
        for pair, est in skew.items():
            want = {"gateway-1": 300_000, "gateway-0": -30_000}[pair.split("->")[0]]
            assert abs(est["offset_p50_ms"] - want) < 1_000, (pair, est)
    finally:
        store.close()


def test_layout_and_chunking_do_not_change_what_is_late(
    base_events: list[dict], tmp_path: Path
) -> None:
    messy = _messy(base_events)
    results = []
    for layout in ("lines", "arrays", "stats"):
        path = tmp_path / f"{layout}.jsonl"
        write_layout(path, messy, layout, seed=5)
        for chunk in (1, 1000):
            r = replay_file(path, spec=SPEC, chunk=chunk).summary()
            results.append((r["windows"], r["slos"], r["requests"]))
    first = results[0]
    for r in results[1:]:
        assert r[1] == first[1]
        assert r[2] == first[2]
        for k in ("corrected_records", "retracted_records", "quarantined_events"):
            assert r[0][k] == first[0][k], k


def test_a_time_gap_costs_nothing(tmp_path: Path, base_events: list[dict]) -> None:
    """Two stretches of traffic a year apart (every host): replay evaluates the control
    policy only around the data, not every 10 s window of the gap."""
    from pipeline.settings import DEFAULT_POLICY
    from pipeline.spec.policy import load_policy_file

    rids = {e["request_id"] for e in base_events if e["request_id"]}
    later = sorted(rids)[len(rids) // 2 :]
    ev = [e if e["request_id"] not in later else dict(e, request_id=e["request_id"])
          for e in base_events]  # fmt: skip
    shifted = [
        dict(e, ts_unix_ns=e["ts_unix_ns"] + YEAR_NS, event_id=e["event_id"] + "+1y") for e in ev
    ]
    for e in shifted:
        if "arrival_unix_ns" in e:
            e["arrival_unix_ns"] += YEAR_NS
        if e["request_id"]:
            e["request_id"] += "+1y"
    path = tmp_path / "gap.jsonl"
    write_layout(path, ev + shifted, "lines")
    r = replay_file(path, spec=SPEC, policy=load_policy_file(DEFAULT_POLICY))
    assert r.control is not None
    # ~2 x 430 s of data, plus at most the 2 h the clock evaluates across a gap
    assert r.control.evaluations < 2 * 60 + 2 * 720 + 10
    assert r.summary()["requests"] == 2 * len(rids)


def test_duplicates_far_down_the_stream_store_equals_exact_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """5 % of the events of ~15 minutes of traffic again, each anywhere after its
    original: many reach the stream after the join forgot their request (resolved_ttl,
    10 min); the store still equals the exact count (pipeline/core/counted.py). Before
    the archive the windows held 17 requests more than ``requests`` on such a replay."""
    src = tmp_path / "events.jsonl"
    simulate_jsonl(src, seed=13, limit=5000)
    base = load_events(src)
    events = tmp_path / "dup.jsonl"
    write_layout(events, duplicate(base, 0.05, seed=11), "arrays", seed=3)
    out = replay_into(tmp_path / "store", events, capsys)
    store = open_store(Settings(store_dir=tmp_path / "store"))
    try:
        assert_store_is_exact(store, SPEC, out["slos"])
    finally:
        store.close()
    assert out["windows"]["counted_before_records"] > 0  # repeats past the join's memory
