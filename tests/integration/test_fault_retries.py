"""Issue 12 item 10 on the real broker: clients retrying with the same X-Request-Id
(502, then 200) make attempts of one request. Every attempt is stored, the failed ones
the client retried are superseded, and the store's SLO counts equal an exact count over
`requests` for an SLO counting every attempt and one counting only the last; duplicates
at random positions change nothing."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from pipeline.adapters.store import open_store
from pipeline.contract.codec import event_to_dict
from pipeline.spec.slo import load_spec
from tests.disorder import duplicate, slo_totals, store_mismatches
from tests.integration.faults import lifecycle_events
from tests.integration.harness import caught_up_worker, make_settings
from tests.integration.test_event_time_live import _produce
from tests.measurement_fixtures import START_NS

pytestmark = pytest.mark.integration

SPEC_TEXT = """
apiVersion: tailguard/v1
kind: SLOSpec
slos:
  - {name: every-attempt, boundary: gateway_total_ms, threshold_ms: 30000, objective: 0.9}
  - {name: last-attempt, boundary: gateway_total_ms, threshold_ms: 30000, objective: 0.9,
     attempts: last}
"""


def _with_retries(n: int, seed: int) -> tuple[list[dict], dict[str, int]]:
    """Simulated requests; for one in eight, the client first got a 502 (one or two
    failed attempts before the recorded one, with the same request id). Returns the
    events in broker order and request id -> failed attempts."""
    rng = random.Random(seed)
    evs = [event_to_dict(e) for e in lifecycle_events(n, seed=seed, start_ns=START_NS)]
    by_rid: dict[str, list[dict]] = {}
    for e in evs:
        by_rid.setdefault(e["request_id"], []).append(e)
    failed: dict[str, int] = {}
    out: list[dict] = []
    for rid, group in by_rid.items():
        if rng.random() < 0.125:
            rcv = next(e for e in group if e["kind"] == "gateway.received")
            k = rng.choice((1, 2))
            failed[rid] = k
            for a in range(k):
                t = rcv["ts_unix_ns"] - (k - a) * 400_000_000  # 400 ms backoff apart
                out.append(rcv | {"event_id": f"{rid}:try{a}", "ts_unix_ns": t})
                out.append({
                    "v": 1, "kind": "gateway.completed", "event_id": f"{rid}:try{a}:c",
                    "request_id": rid, "ts_unix_ns": t + 4_000_000, "host": rcv["host"],
                    "model": rcv["model"], "total_ms": 4.0, "ttfb_ms": None,
                    "http_status": 502, "outcome": "error",
                })  # fmt: skip
        out.extend(group)
    out.sort(key=lambda e: e["ts_unix_ns"])
    return duplicate(out, 0.02, seed=seed), failed


def test_retries_are_attempts_and_slos_count_every_or_last(kafka, tmp_path: Path) -> None:
    spec_file = tmp_path / "slo.yaml"
    spec_file.write_text(SPEC_TEXT)
    spec = load_spec(SPEC_TEXT)
    s = make_settings(kafka.bootstrap_servers, tmp_path, slo_spec=spec_file)
    events, failed = _with_retries(600, seed=5)
    assert len(failed) > 40
    with caught_up_worker(s, tmp_path / "worker.log", timeout_s=180):
        _produce(s, events)
    store = open_store(s)
    try:
        rows = store.query_rows(
            f"SELECT request_id, attempt, outcome, superseded FROM {s.database}.requests FINAL"
        )
        assert store_mismatches(store, spec) == []
        totals = slo_totals(store)
        # Exact counts over `requests`, in SQL, without the SLO code: the 502s are bad
        # whatever their latency; the rest are good within the threshold.
        good = "outcome = 'ok' AND gateway_total_ms <= 30000"
        exact_every, exact_last = (
            store.query_rows(f"SELECT count(), countIf({good}) FROM {s.database}.requests FINAL")[
                0
            ],
            store.query_rows(
                f"SELECT countIf(NOT superseded), countIf(NOT superseded AND {good}) "
                f"FROM {s.database}.requests FINAL"
            )[0],
        )
    finally:
        store.close()
    attempts: dict[str, list[tuple[int, str, bool]]] = {}
    for rid, attempt, outcome, superseded in rows:
        attempts.setdefault(rid, []).append((int(attempt), str(outcome), bool(superseded)))
    assert len(attempts) == 600
    for rid, got in attempts.items():
        k = failed.get(rid, 0)
        want = [(a + 1, "error", True) for a in range(k)]
        assert sorted(got)[:k] == want, rid
        assert [(a, sup) for a, _, sup in sorted(got)[k:]] == [(k + 1, False)], rid
    assert totals["every-attempt"] == tuple(exact_every)
    assert totals["last-attempt"] == tuple(exact_last)
    n_failed = sum(failed.values())
    assert (exact_every[0], exact_last[0]) == (600 + n_failed, 600)
